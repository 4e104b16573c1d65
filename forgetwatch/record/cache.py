"""The base-model cache: each probe's result for the model before post-training, scored once, reused often.

A cache is one Parquet (or JSONL) file. Its key, stored inside the file, covers everything that decides
the results: the model's identity, the probe set's fingerprint, and the scoring config (mode, prompt
format and version, precision). Loading with an expected key refuses a cache whose key differs, and says
what differs. Writes go to a temporary file renamed into place under a file lock, so parallel ranks or jobs
never corrupt it and no reader ever sees half a file.
"""

from __future__ import annotations

import json
import logging
import math
import numbers
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .._io import atomic_write, file_lock, read_jsonl
from ..commands import quote
from ..errors import CacheFormatError, CacheMismatchError
from ..probes.variants import SEP, is_variant, serves
from ..scoring.results import ProbeResults
from ..scoring.weights import compare_weights

__all__ = ["BaseCache", "CacheFormatError", "CacheMismatchError", "make_cache_key"]

# 2: every option's score (`option_scores`), which drift and KL need. Older caches are refused with how to rebuild.
CACHE_FORMAT = 2
_META_KEY = b"forgetwatch"

logger = logging.getLogger(__name__)


_REBUILD = "not a readable forgetwatch cache; delete it and run `forgetwatch cache` again"


def make_cache_key(model: dict[str, Any], probes: Any, scoring: dict[str, Any],
                   variants: dict[str, Any] | None = None) -> dict[str, Any]:
    """The key of a base cache.

    Args:
        model: the model's identity (`forgetwatch.scoring.models.model_identity`).
        probes: the `ProbeSet` scored.
        scoring: `ScoringConfig.key(tokenizer, precision)`.
        variants: with robustness on, `VariantPlan.key()`: which variants of which probes the cache holds.
    """
    if not any(p.is_behavior for p in probes):
        # how behaviour probes are generated and judged changes nothing else: caches of knowledge probes keep their key
        scoring = {k: v for k, v in scoring.items() if k not in ("behavior_max_new_tokens", "behavior_rules")}
        if isinstance(scoring.get("chat"), dict):
            scoring["chat"] = {k: v for k, v in scoring["chat"].items() if k != "behavior"}
    key = {
        "format": CACHE_FORMAT,
        "model": model,
        "probes": {"fingerprint": probes.fingerprint, "n": len(probes)},
        "scoring": scoring,
    }
    if variants is not None:
        key["variants"] = variants
    return key


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
    # probes whose correctness differs are the precision noise floor (`forgetwatch.measures.noise`)
    reference: ProbeResults | None = None
    # with robustness on (`forgetwatch.probes.variants`): the variants' rows (`<probe id>~v<j>`), after the probes' own in
    # the file; the key's `variants` says which they are
    variants: ProbeResults | None = None

    def _rows(self) -> ProbeResults:
        return self.results if self.variants is None else ProbeResults.concat([self.results, self.variants])

    def save(self, path: str | os.PathLike) -> Path:
        path = Path(path)
        rows = self._rows()
        with file_lock(path), atomic_write(path, "wb") as f:
            if path.suffix == ".jsonl":
                f.write((json.dumps({"forgetwatch_cache": self.key}) + "\n").encode())
                cols = {**rows.to_columns(), **self._reference_columns()}
                for i in range(len(rows)):
                    row = {c: _plain(v[i]) for c, v in cols.items() if c != "id"}
                    f.write((json.dumps({"id": cols["id"][i], **row}, ensure_ascii=False) + "\n").encode())
            else:
                import pyarrow as pa
                import pyarrow.parquet as pq

                table = pa.table({**rows.to_columns(), **self._reference_columns()})
                table = table.replace_schema_metadata({_META_KEY: json.dumps(self.key).encode()})
                pq.write_table(table, f)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike, expect: dict[str, Any] | None = None, ignore: tuple[str, ...] = ()) -> BaseCache:
        """Read a cache; with `expect`, refuse it unless its key matches (sections in `ignore` are not compared)."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(
                f"{path}: no base cache here; make one with `forgetwatch cache --model <base> --probes <file> -o {quote(path)}`"
            )
        try:
            key, cols, where = _read_jsonl(path) if path.suffix == ".jsonl" else _read_parquet(path)
            if not isinstance(key, dict):
                raise ValueError(f"its key (the file's forgetwatch metadata) is a JSON {_json_type(key)}, not an object")
        except CacheFormatError:
            raise
        except (OSError, ValueError, KeyError, json.JSONDecodeError) as e:
            raise CacheFormatError(
                f"{path}: not a readable forgetwatch cache ({e}); delete it and run `forgetwatch cache` again"
            ) from e
        found = key.get("format")
        if found != CACHE_FORMAT:
            raise CacheMismatchError(
                f"{path}: cache format {found!r}, and this forgetwatch reads format {CACHE_FORMAT} (it keeps every option's "
                "score, for drift and KL). Rebuild it from the base model: `forgetwatch cache --model <base> --probes "
                f"<file> -o {quote(path)}` (the exact command is printed by `forgetwatch compare` or the callback when they "
                "refuse it)."
            )
        _check_key(path, key)
        # every value a figure is computed from is checked before it becomes a number: NaN cast to int8 reads as 0
        results, reference = _validated(path, cols, where)
        n = key["probes"]["n"]
        variants = None
        if isinstance(key.get("variants"), dict):
            # only a key that says so holds variants: without robustness a probe's own id may hold "~v" (ids are the
            # user's), and with it no probe's may (`plan_variants` refuses them), so these rows are the variants
            mine = [i for i, pid in enumerate(results.ids) if is_variant(pid)]
            rows = key["variants"].get("rows")
            if rows != len(mine):
                raise CacheFormatError(f"{path}: {len(mine)} rows of variants (ids with {SEP!r}), but its key says "
                                       f"{rows!r}: {_REBUILD}")
            own = [i for i, pid in enumerate(results.ids) if not is_variant(pid)]
            variants = results.take(mine)
            reference = reference.take(own) if reference is not None else None
            results = results.take(own)
        if n != len(results):  # e.g. a JSONL file cut at a line boundary
            raise CacheFormatError(f"{path}: {len(results)} rows, but it was made for {n} probes: truncated? {_REBUILD}")
        cache = cls(key, results, reference, variants)
        if expect is not None:
            for note in cache.check(expect, ignore=ignore, path=path):
                logger.warning("forgetwatch: %s", note)
        return cache

    def _reference_columns(self) -> dict[str, Any]:
        if self.reference is None:
            return {}
        if self.reference.ids != self.results.ids:
            raise ValueError("the fp32 reference must hold the same probes in the same order as the results")
        pad = 0 if self.variants is None else len(self.variants)  # the variants have no fp32 reference
        return {"reference_outcome": np.concatenate([self.reference.outcome, np.full(pad, -1, np.int8)]),
                "reference_margin": np.concatenate([self.reference.margin, np.full(pad, np.nan, np.float32)])}

    def check(self, expect: dict[str, Any], ignore: tuple[str, ...] = (), path: Any = "cache") -> list[str]:
        """Raise `CacheMismatchError` listing every difference between this cache's key and `expect`; else return the
        notes worth saying (weight files written again with the same bytes, a cache without a weights fingerprint).

        A cache that holds variants serves a run that wants none (its probes' own rows are the same), or fewer of them on
        the same probes (`robustness.serves`): `variants` is compared only when `expect` has it. The model's weights
        fingerprint (`forgetwatch.scoring.weights`) refuses other bytes at the same path and only notes new file times; a side
        without one (a cache of an earlier version, a Hub id) is not compared on it, and `weights_sha256` is compared
        only when `expect` has it (`forgetwatch cache --hash-weights`)."""
        if "variants" not in expect or serves(self.key.get("variants"), expect["variants"]):
            ignore = (*ignore, "variants")
        a = {k: v for k, v in self.key.items() if k not in ignore}
        b = {k: v for k, v in expect.items() if k not in ignore}
        notes: list[str] = []
        weights_diff = None
        if isinstance(a.get("model"), dict) and isinstance(b.get("model"), dict):
            am, bm = dict(a["model"]), dict(b["model"])
            cached, now = am.pop("weights", None), bm.pop("weights", None)
            weights_diff, note = compare_weights(cached, now, str(bm.get("name_or_path") or ""))
            if note:
                notes.append(f"{path}: {note}")
            elif cached is None and now is not None:
                notes.append(f"{path} was made without the weight files' fingerprint (by a forgetwatch before it existed): "
                             "other weights saved at the same path cannot be told from these; `forgetwatch cache ... "
                             f"-o {quote(path)} --force` makes it again with one")
            if "weights_sha256" not in bm:
                am.pop("weights_sha256", None)
            a, b = {**a, "model": am}, {**b, "model": bm}
        diffs = diff_keys(b, a) + ([weights_diff] if weights_diff else [])
        if diffs:
            hint = ""
            if any(d.startswith("variants") for d in diffs):
                want = expect.get("variants")
                hint = (
                    "\nIts robustness variants differ: score the base with the same variants (`forgetwatch cache ... "
                    f"--robustness {want['k']}`"
                    + (f" --robust-per-suite {want['per_suite']}" if want.get("per_suite") else "")
                    + ")"
                    if isinstance(want, dict)
                    else ""
                )
            if any(d.startswith("scoring.runtime") for d in diffs):
                hint += ("\nOne side was scored by vLLM and the other by transformers: their kernels differ in the last "
                         "bits, and a near-tie that comes out otherwise would count as a flip. Score both with one engine: "
                         "the base again with `forgetwatch cache ... --engine vllm` (or --engine hf), or this side with "
                         "the cache's engine")
            raise CacheMismatchError(
                f"{path}: this base cache was made under another key:\n  " + "\n  ".join(diffs) + hint
                + "\nScore the base model again with these settings (`forgetwatch cache ...`), or use matching settings."
            )
        return notes

    def for_probes(self, ids: Sequence[str], path: Any = "cache") -> BaseCache:
        """This cache's rows for the probes `ids`, in that order (the reference too); refused with `CacheMismatchError`
        naming the first few missing and extra ids unless the cache holds exactly these probes.

        A key's probe fingerprint can match while the rows do not (a file edited or merged by hand): the rows are
        what the figures are computed from, so they are checked too.

        Example:
            >>> base = BaseCache.load("base.parquet").for_probes(probes.ids, "base.parquet")  # doctest: +SKIP
        """
        have, want = set(self.results.ids), set(ids)
        if have != want:
            missing = [i for i in ids if i not in have]
            extra = [i for i in self.results.ids if i not in want]
            said = [f"{len(found)} {what} ({', '.join(map(repr, found[:5]))}{', ...' if len(found) > 5 else ''})"
                    for what, found in (("probe(s) without a row", missing), ("row(s) of no probe", extra)) if found]
            raise CacheMismatchError(f"{path}: the cache's rows are not the probes': {'; '.join(said)}. A cache holds one row "
                                     "per probe of the set it was made for (a file edited or merged by hand may not): "
                                     "delete it and run `forgetwatch cache` again")
        ref = self.reference.select(ids) if self.reference is not None else None
        return BaseCache(self.key, self.results.select(ids), ref, self.variants)


def _plain(x: Any) -> Any:
    return x.item() if hasattr(x, "item") else x


def _json_type(v: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(v), "number" if isinstance(v, (int, float)) else type(v).__name__)


def _check_key(path: Path, key: dict[str, Any]) -> None:
    """The key's sections have the types forgetwatch writes (a hand-edited or foreign key would fail later, obscurely)."""
    for section in ("model", "probes", "scoring"):
        if not isinstance(key.get(section), dict):
            found = "absent" if section not in key else f"a JSON {_json_type(key[section])}"
            raise CacheFormatError(f"{path}: the cache key's `{section}` is {found}, not an object: {_REBUILD}")
    probes = key["probes"]
    if not isinstance(probes.get("fingerprint"), str):
        raise CacheFormatError(f"{path}: the cache key's `probes.fingerprint` is {probes.get('fingerprint')!r}, not a "
                               f"string: {_REBUILD}")
    n = probes.get("n")
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise CacheFormatError(f"{path}: the cache key's `probes.n` is {n!r}, not a count of probes: {_REBUILD}")


# columns of whole numbers and the values they may take (None: any whole number >= -1, -1 meaning "none")
_CODES = {"outcome": (-1, 0, 1), "reference_outcome": (-1, 0, 1), "stopped": (-1, 0, 1), "pred_index": None, "n_tokens": None}
_MEANING = {(-1, 0, 1): "-1, 0 or 1", None: "a whole number >= -1"}
# columns of scores: NaN means "not scored that way", an infinity is an overflow that must not become a figure
_SCORES = ("gold_logprob", "margin", "reference_margin")


def _validated(path: Path, cols: dict[str, Any], where: Callable[[int], str]) -> tuple[ProbeResults, ProbeResults | None]:
    """The cache's columns as results (and the fp32 reference), after checking every value: a CacheFormatError names the
    file, the row (`where(i)`: a line or row number and the probe id) and the column."""

    def bad(i: int, column: str, what: str) -> CacheFormatError:
        return CacheFormatError(f"{path} {where(i)}: column `{column}` {what}: {_REBUILD}")

    ids = cols["id"]
    seen: dict[str, int] = {}
    for i, pid in enumerate(ids):
        if not isinstance(pid, (str, int)) or isinstance(pid, bool) or pid == "":
            raise bad(i, "id", f"is {pid!r}, not a probe id")
        if str(pid) in seen:
            raise bad(i, "id", f"repeats probe {str(pid)!r} (first at {where(seen[str(pid)])})")
        seen[str(pid)] = i
    n = len(ids)
    for name in ("prediction", "generation", "detail"):
        values = cols.get(name)
        if values is not None:
            cols[name] = ["" if v is None else v for v in values]
            for i, v in enumerate(cols[name]):
                if not isinstance(v, str):
                    raise bad(i, name, f"is {v!r}, not text")
    for name, allowed in _CODES.items():
        values = cols.get(name)
        if values is None:
            continue
        if name in ("n_tokens", "stopped", "reference_outcome") and all(v is None for v in _iter(values)):
            cols[name] = None  # written before the column existed (or without an fp32 reference): none of it
            continue
        x = _numbers(values, lambda i, v, name=name: bad(i, name, f"is {_raw(v)}, not a number"))
        wrong = ~np.isfinite(x) | (x != np.round(np.nan_to_num(x)))
        wrong |= ~np.isin(x, allowed) if allowed else (np.nan_to_num(x) < -1) | (np.nan_to_num(x) > np.iinfo(np.int32).max)
        if wrong.any():
            i = int(np.argmax(wrong))
            raise bad(i, name, f"is {_show(x[i], values[i])}, and it must be {_MEANING[allowed]}")
        cols[name] = x.astype(np.int32)
    # rows scoring flagged as NaN / inf (an overflow, kept as it was so that its figures are reported missing): their
    # scores may be anything; every other row's must be numbers
    flags = cols.get("nonfinite")
    if flags is not None and all(v is None for v in _iter(flags)):
        flags = cols["nonfinite"] = None  # written before the column existed
    if flags is not None:
        x = _numbers(flags, lambda i, v: bad(i, "nonfinite", f"is {_raw(v)}, not 0 or 1"), null=0.0)
        if not np.isin(x, (0, 1)).all():
            i = int(np.argmax(~np.isin(x, (0, 1))))
            raise bad(i, "nonfinite", f"is {_show(x[i], flags[i])}, and it must be 0 or 1")
        cols["nonfinite"] = flags = x.astype(bool)
    flagged = flags if flags is not None else np.zeros(n, bool)
    for name in _SCORES:
        values = cols.get(name)
        if values is None:
            continue
        x = _float32(_numbers(values, lambda i, v, name=name: bad(i, name, f"is {_raw(v)}, not a number"), null=float("nan")))
        if (np.isinf(x) & ~flagged).any():
            i = int(np.argmax(np.isinf(x) & ~flagged))
            raise bad(i, name, f"is {values[i]!r} (an overflow, not a score; NaN or null means not scored that way)")
        cols[name] = x
    scores = cols.get("option_scores")
    if scores is not None:
        for i, row in enumerate(scores):
            if row is None:
                continue
            if isinstance(row, (str, bytes, dict)) or not isinstance(row, (Sequence, np.ndarray)):
                raise bad(i, "option_scores", f"is {row!r}, not a list of numbers")
            x = _float32(_numbers(row, lambda _, v, i=i: bad(i, "option_scores", f"holds {_raw(v)}, not a number"),
                                  null=float("nan") if flagged[i] else None))
            if not np.isfinite(x).all() and not flagged[i]:
                j = int(np.argmax(~np.isfinite(x)))
                raise bad(i, "option_scores", f"holds {x[j]} at option {j} (every option has a finite score)")
            # a NaN margin means "not scored that way" (a generated answer has no options to rank), but a row with its
            # options' scores was scored that way: its margin is the gold option's score minus the best other's, so NaN
            # there is damage (read as "no margin", it would leave the probe out of margin_drop unseen)
            margin = cols.get("margin")
            if len(x) >= 2 and not flagged[i] and margin is not None and np.isnan(margin[i]):
                raise bad(i, "margin", f"is NaN, but the row holds {len(x)} option scores, from which forgetwatch always "
                                       "computes a margin (the gold option's score minus the best other's)")
    if cols.get("outcome") is None or cols.get("pred_index") is None:
        raise CacheFormatError(f"{path}: no `outcome` or `pred_index` column: {_REBUILD}")
    for name in ("gold_logprob", "margin"):
        if cols.get(name) is None:
            cols[name] = np.full(n, np.nan)
    results = ProbeResults.from_columns(cols)
    reference = None
    if cols.get("reference_outcome") is not None:
        reference = ProbeResults.empty(results.ids)
        reference.outcome = cols["reference_outcome"].astype(np.int8)
        margin = cols.get("reference_margin")
        reference.margin = (np.full(n, np.nan) if margin is None else margin).astype(np.float32)
    return results, reference


def _float32(x: np.ndarray) -> np.ndarray:
    """As the results keep it: a float64 beyond float32's range becomes an infinity here, and is refused."""
    with np.errstate(over="ignore"):
        return x.astype(np.float32)


def _iter(values: Any) -> list:
    return values.tolist() if isinstance(values, np.ndarray) else list(values)


def _numbers(values: Any, error: Callable[[int, Any], Exception], null: float | None = None) -> np.ndarray:
    """Values as float64; None becomes `null` (refused when None); text, booleans and other types are refused."""
    if isinstance(values, np.ndarray) and values.dtype.kind in "iuf":
        return values.astype(np.float64)
    out = np.empty(len(values), np.float64)
    for i, v in enumerate(_iter(values)):
        if v is None and null is not None:
            out[i] = null
        elif v is None or isinstance(v, bool) or not isinstance(v, numbers.Real):
            raise error(i, v)
        else:
            out[i] = float(v)
    return out


def _raw(v: Any) -> str:
    return "null" if v is None else repr(v)


def _show(x: float, raw: Any) -> str:
    return "NaN" if math.isnan(x) else str(raw) if isinstance(raw, (int, float, str)) else str(x)


def read_key(path: str | os.PathLike) -> dict[str, Any] | None:
    """The key of the cache at `path`, read without its rows; None when there is no readable one."""
    path = Path(path)
    try:
        if path.suffix == ".jsonl":
            with open(path, encoding="utf-8") as f:
                key = json.loads(f.readline()).get("forgetwatch_cache")
        else:
            import pyarrow.parquet as pq

            key = json.loads((pq.read_schema(path).metadata or {})[_META_KEY])
    except (OSError, ValueError, KeyError, AttributeError):
        return None
    return key if isinstance(key, dict) else None


def _read_parquet(path: Path) -> tuple[dict[str, Any], dict[str, Any], Callable[[int], str]]:
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    meta = table.schema.metadata or {}
    if _META_KEY not in meta:
        raise ValueError("no forgetwatch key in the file's metadata")
    missing = [c for c in ("id", "outcome", "pred_index", "prediction") if c not in table.column_names]
    if missing:
        raise ValueError(f"no column {', '.join(missing)}")
    # as Python values, so that a null stays a null (to_numpy turns an int column with nulls into floats)
    cols: dict[str, Any] = {name: table.column(name).to_pylist() for name in table.column_names}
    ids = cols["id"]
    return json.loads(meta[_META_KEY]), cols, lambda i: f"row {i} (probe {ids[i]!r})"


def _read_jsonl(path: Path) -> tuple[dict[str, Any], dict[str, Any], Callable[[int], str]]:
    rows, lines, header = [], [], None
    # the one reader: a bad byte or line is named by its line, not a position in a string
    for lineno, row in read_jsonl(path, ValueError, objects=True):
        if header is None:
            if "forgetwatch_cache" not in row:
                raise ValueError(f"line {lineno} is not a forgetwatch cache header")
            header = row
            continue
        if "id" not in row or "outcome" not in row:
            raise ValueError(f"line {lineno} is not a cache row (an object with `id` and `outcome`)")
        rows.append(row)
        lines.append(lineno)
    if header is None:
        raise ValueError("empty: no forgetwatch cache header")
    cols = {c: [r.get(c) for r in rows] for c in (*ProbeResults.COLUMNS, "reference_outcome", "reference_margin")}
    ids = cols["id"]
    return header["forgetwatch_cache"], cols, lambda i: f"line {lines[i]} (probe {ids[i]!r})"
