"""The base-model cache: each probe's result for the model before post-training, scored once, reused often.

A cache is one Parquet (or JSONL) file. Its key, stored inside the file, covers everything that decides
the results: the model's identity, the probe set's fingerprint, and the scoring config (mode, prompt
format and version, precision). Loading with an expected key refuses a cache whose key differs, and says
what differs. Writes go to a temporary file renamed into place under a file lock, so parallel ranks or jobs
never corrupt it and no reader ever sees half a file.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ._io import atomic_write, file_lock
from .results import ProbeResults

__all__ = ["BaseCache", "CacheMismatchError", "make_cache_key"]

# 2: every option's score (`option_scores`), which drift and KL need. Older caches are refused with how to rebuild.
CACHE_FORMAT = 2
_META_KEY = b"forgetwatch"


class CacheMismatchError(ValueError):
    """The cache was made for another model, probe set or scoring config."""


def make_cache_key(model: dict[str, Any], probes: Any, scoring: dict[str, Any]) -> dict[str, Any]:
    """The key of a base cache.

    Args:
        model: the model's identity (`forgetwatch.models.model_identity`).
        probes: the `ProbeSet` scored.
        scoring: `ScoringConfig.key(tokenizer, precision)`.
    """
    if not any(p.is_behavior for p in probes):
        # how behaviour probes are generated and judged changes nothing else: caches of knowledge probes keep their key
        scoring = {k: v for k, v in scoring.items() if k not in ("behavior_max_new_tokens", "behavior_rules")}
        if isinstance(scoring.get("chat"), dict):
            scoring["chat"] = {k: v for k, v in scoring["chat"].items() if k != "behavior"}
    return {
        "format": CACHE_FORMAT,
        "model": model,
        "probes": {"fingerprint": probes.fingerprint, "n": len(probes)},
        "scoring": scoring,
    }


def diff_keys(expected: dict[str, Any], found: dict[str, Any], prefix: str = "") -> list[str]:
    """Human-readable differences between two keys, e.g. "scoring.mcq_mode: cache has 'loglik', now 'letter'"."""
    out = []
    for k in sorted(set(expected) | set(found), key=str):
        name = f"{prefix}{k}"
        a, b = found.get(k, "<absent>"), expected.get(k, "<absent>")
        if isinstance(a, dict) and isinstance(b, dict):
            out += diff_keys(b, a, name + ".")
        elif a != b:
            out.append(f"{name}: cache has {a!r}, now {b!r}")
    return out


@dataclass
class BaseCache:
    """Base-model results for a probe set, with the key they were made under.

    Example:
        >>> cache = BaseCache(key, results); cache.save("base.parquet")  # doctest: +SKIP
        >>> BaseCache.load("base.parquet", expect=key).results.accuracy  # doctest: +SKIP
        0.52
    """

    key: dict[str, Any]
    results: ProbeResults
    # the base scored again in fp32 without autocast (outcome and margin), when the key's precision is another: the
    # probes whose correctness differs are the precision noise floor (`forgetwatch.noise`)
    reference: ProbeResults | None = None

    def save(self, path: str | os.PathLike) -> Path:
        path = Path(path)
        with file_lock(path), atomic_write(path, "wb") as f:
            if path.suffix == ".jsonl":
                f.write((json.dumps({"forgetwatch_cache": self.key}) + "\n").encode())
                cols = {**self.results.to_columns(), **self._reference_columns()}
                for i in range(len(self.results)):
                    row = {c: _plain(v[i]) for c, v in cols.items() if c != "id"}
                    f.write((json.dumps({"id": cols["id"][i], **row}, ensure_ascii=False) + "\n").encode())
            else:
                import pyarrow as pa
                import pyarrow.parquet as pq

                table = pa.table({**self.results.to_columns(), **self._reference_columns()})
                table = table.replace_schema_metadata({_META_KEY: json.dumps(self.key).encode()})
                pq.write_table(table, f)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike, expect: dict[str, Any] | None = None, ignore: tuple[str, ...] = ()) -> BaseCache:
        """Read a cache; with `expect`, refuse it unless its key matches (sections in `ignore` are not compared)."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no base cache here; make one with `forgetwatch cache --model <base> --probes <file> -o {path}`")
        try:
            key, results, extra = _read_jsonl(path) if path.suffix == ".jsonl" else _read_parquet(path)
            n = key.get("probes", {}).get("n") if isinstance(key.get("probes"), dict) else None
            if n is not None and n != len(results):  # e.g. a JSONL file cut at a line boundary
                raise ValueError(f"{len(results)} rows, but it was made for {n} probes: truncated?")
        except (OSError, ValueError, KeyError, json.JSONDecodeError) as e:
            raise ValueError(f"{path}: not a readable forgetwatch cache ({e}); delete it and run `forgetwatch cache` again") from e
        found = key.get("format")
        if found != CACHE_FORMAT:
            raise CacheMismatchError(
                f"{path}: cache format {found!r}, and this forgetwatch reads format {CACHE_FORMAT} (it keeps every option's "
                "score, for drift and KL). Rebuild it from the base model: `forgetwatch cache --model <base> --probes "
                f"<file> -o {path}` (the exact command is printed by `forgetwatch compare` or the callback when they refuse it)."
            )
        cache = cls(key, results, _reference(results, extra))
        if expect is not None:
            cache.check(expect, ignore=ignore, path=path)
        return cache

    def _reference_columns(self) -> dict[str, Any]:
        if self.reference is None:
            return {}
        if self.reference.ids != self.results.ids:
            raise ValueError("the fp32 reference must hold the same probes in the same order as the results")
        return {"reference_outcome": self.reference.outcome, "reference_margin": self.reference.margin}

    def check(self, expect: dict[str, Any], ignore: tuple[str, ...] = (), path: Any = "cache") -> None:
        """Raise `CacheMismatchError` listing every difference between this cache's key and `expect`."""
        a = {k: v for k, v in self.key.items() if k not in ignore}
        b = {k: v for k, v in expect.items() if k not in ignore}
        diffs = diff_keys(b, a)
        if diffs:
            raise CacheMismatchError(
                f"{path}: this base cache was made under another key:\n  " + "\n  ".join(diffs)
                + "\nScore the base model again with these settings (`forgetwatch cache ...`), or use matching settings."
            )


def _plain(x: Any) -> Any:
    return x.item() if hasattr(x, "item") else x


def _reference(results: ProbeResults, extra: dict[str, Any]) -> ProbeResults | None:
    if extra.get("reference_outcome") is None:
        return None
    ref = ProbeResults.empty(results.ids)
    ref.outcome = np.asarray(extra["reference_outcome"], np.int8)
    ref.margin = np.asarray([np.nan if m is None else m for m in extra["reference_margin"]], np.float32)
    return ref


def _read_parquet(path: Path) -> tuple[dict[str, Any], ProbeResults, dict[str, Any]]:
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    meta = table.schema.metadata or {}
    if _META_KEY not in meta:
        raise ValueError("no forgetwatch key in the file's metadata")
    cols = {name: table.column(name).to_numpy(zero_copy_only=False) for name in table.column_names}
    cols["id"] = table.column("id").to_pylist()
    cols["prediction"] = table.column("prediction").to_pylist()
    cols["generation"] = table.column("generation").to_pylist() if "generation" in table.column_names else None
    cols["option_scores"] = table.column("option_scores").to_pylist() if "option_scores" in table.column_names else None
    return json.loads(meta[_META_KEY]), ProbeResults.from_columns(cols), cols


def _read_jsonl(path: Path) -> tuple[dict[str, Any], ProbeResults, dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        header = json.loads(f.readline())
        if "forgetwatch_cache" not in header:
            raise ValueError("line 1 is not a forgetwatch cache header")
        rows = [json.loads(line) for line in f if line.strip()]
    cols = {c: [r.get(c) for r in rows] for c in (*ProbeResults.COLUMNS, "reference_outcome", "reference_margin")}
    if any(v is None for v in cols["reference_outcome"]):
        cols["reference_outcome"] = None
    cols["gold_logprob"] = [float("nan") if v is None else v for v in cols["gold_logprob"]]
    cols["margin"] = [float("nan") if v is None else v for v in cols["margin"]]
    return header["forgetwatch_cache"], ProbeResults.from_columns(cols), cols
