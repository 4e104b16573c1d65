"""One engine on both sides of every flip: the base scored again by the watcher's engine when that engine runs other
kernels than transformers (`EngineSpec.runtime`: vLLM) and the training process scored the base with transformers.

vLLM and transformers compute in other kernels: a probe near a tie can come out right in one and wrong in the other
with no training at all (RESULTS: 500 of 500 multiple-choice predictions equal on SmolLM2 in fp32, option scores apart
by up to 1.3e-4). Counted as a flip, that would be forgetting nobody caused. So a cache key says which runtime scored
it when that is not transformers (`ScoringConfig.key`: `runtime`), `compare` refuses a cache of another runtime, and
the watcher scores the base model once with its engine, into `<record>/base-<runtime>.parquet` (`base-vllm.parquet`;
the training process's `base.parquet` is left as it is), before the first checkpoint. A record is scored by one
runtime: a watcher of another is refused.

Example:
    >>> cache = base_for_engine(record_dir, cache, config, precision, probes, plan)  # doctest: +SKIP
"""

from __future__ import annotations

import copy
import logging
import os
import sys
from pathlib import Path
from typing import Any

from ..errors import EngineUnavailableError, SidecarError
from ..record.cache import BaseCache
from ..record.store import RunRecord
from ..scoring.checkpoint import score_checkpoint
from ..scoring.engines import ENGINES, engine_spec
from ..scoring.weights import compare_weights, weights_fingerprint

__all__ = ["check_engine", "base_directory", "base_file", "base_for_engine", "runtime_key"]

logger = logging.getLogger(__name__)

# the runtimes an engine may bring (`EngineSpec.runtime`): each has its own base file in a record
RUNTIMES = sorted({spec.runtime for spec in ENGINES.values() if spec.runtime})


def base_file(runtime: str) -> str:
    """The record's file for its base scored by another runtime than transformers (`base-vllm.parquet`)."""
    return f"base-{runtime}.parquet"


def runtime_key(key: dict[str, Any], runtime: str) -> dict[str, Any]:
    """A cache key as scoring by `runtime` would have it: `scoring.runtime` set (`ScoringConfig.key`).

    Example:
        >>> runtime_key({"scoring": {"mcq_mode": "loglik"}}, "other-kernels")
        {'scoring': {'mcq_mode': 'loglik', 'runtime': 'other-kernels'}}
    """
    out = copy.deepcopy(key)
    out["scoring"]["runtime"] = runtime
    return out


def check_engine(record_dir: str | os.PathLike, cache: BaseCache, config: Any, precision: str) -> None:
    """Whether the record can be scored by the engine `config.engine` names, said before anything is set aside or
    scored: refused with `SidecarError` when its evaluations were scored by another runtime, with
    `EngineUnavailableError` when the engine cannot score in the run's precision (autocast)."""
    root = Path(record_dir)
    scored = [s for s in RunRecord(root).committed_steps() if s > 0]
    engine = getattr(config, "engine", "hf")
    spec = engine_spec(engine)
    if spec.runtime is None:
        for other in RUNTIMES:
            if (root / base_file(other)).is_file() and scored:
                theirs = next(name for name, s in ENGINES.items() if s.runtime == other)
                raise SidecarError(f"{root}: its {len(scored)} evaluation(s) were scored by --engine {theirs} (against "
                                   f"{root / base_file(other)}), and this watcher scores with --engine {engine}: flips "
                                   f"between two engines are not forgetting. Watch with --engine {theirs}, or score the "
                                   "run again into a new output_dir")
        return
    if "+autocast-" in precision and not spec.autocast:
        raise EngineUnavailableError(f"{root}: the run trains under autocast ({precision}), which `watch` scores in, and "
                                     f"--engine {engine} runs weights in their own dtype and cannot autocast: watch with "
                                     "--engine hf")
    theirs = cache.key.get("scoring", {}).get("runtime") == spec.runtime or (root / base_file(spec.runtime)).is_file()
    if scored and not theirs:
        raise SidecarError(f"{root}: its {len(scored)} evaluation(s) were scored by transformers, and this watcher scores "
                           f"with --engine {engine}: flips between two engines are not forgetting. Watch with --engine "
                           "hf (or the callback's engine), or score the run again into a new output_dir")


def base_for_engine(record_dir: str | os.PathLike, cache: BaseCache, config: Any, precision: str, probes: Any,
                    plan: Any = None) -> BaseCache:
    """The base the record's evaluations are compared with, scored by the engine `config.engine` names: `cache` itself
    when it was scored by that engine's runtime; for an engine of another runtime (vLLM) on a record whose `cache`
    transformers scored, `base-<runtime>.parquet` (scored now from the base model's directory, or read back when an
    earlier watcher did). Refused as `check_engine` says."""
    check_engine(record_dir, cache, config, precision)
    root = Path(record_dir)
    engine = getattr(config, "engine", "hf")
    spec = engine_spec(engine)
    if spec.runtime is None or cache.key.get("scoring", {}).get("runtime") == spec.runtime:
        return cache  # transformers; or the base cache the training process was given was scored by this runtime
    want = runtime_key(cache.key, spec.runtime)
    ours = root / base_file(spec.runtime)
    if ours.is_file():
        return BaseCache.load(ours, expect=want)
    base_dir = base_directory(cache.key.get("model", {}), engine)
    print(f"forgetwatch watch: scoring the base model ({base_dir}) with --engine {engine} too, so that both sides of "
          f"every flip come from one engine (the training process scored {root / 'base.parquet'} with transformers); "
          f"into {ours}", file=sys.stderr, flush=True)
    results = score_checkpoint(base_dir, plan.scored() if plan is not None else probes, config,
                               precision=precision.split("+")[0], desc=f"forgetwatch watch: the base model ({engine})")
    variants = None
    if plan is not None:
        results, variants = plan.split(results)
    base = BaseCache(want, results, None, variants)
    base.save(ours)
    return base


def base_directory(model: dict[str, Any], engine: str) -> str:
    """The base model's directory from a cache key's model identity, for `engine` to load; refused when its weights are
    not those the cache was made from (other files at the same path), or it is not a directory."""

    name = str(model.get("name_or_path") or "")
    path = Path(name).expanduser()
    if not path.is_dir():
        if not name or name.startswith((".", "/", "~")):
            raise SidecarError(f"the base model {name!r} the record was started from is not a directory here: --engine "
                               f"{engine} scores the base from its directory. Restore it there, or watch with --engine hf")
        from huggingface_hub import snapshot_download  # a Hub id: its files, as the engine would fetch them

        try:
            return snapshot_download(name, revision=model.get("revision"))
        except Exception as e:  # offline, a gated or deleted model: said with the id, not as a traceback
            raise SidecarError(f"the base model {name!r} the record was started from could not be fetched from the Hub "
                               f"({type(e).__name__}: {e}): --engine {engine} scores the base from its files. Download "
                               "it (e.g. `huggingface-cli download` on a machine online), or watch with --engine hf") from e
    diff, _ = compare_weights(model.get("weights"), weights_fingerprint(path), name)
    if diff:
        raise SidecarError(f"{path}: the base model's weight files are not those the record's base cache was scored from "
                           f"({diff}): --engine {engine} would score another base. Restore them, or watch with --engine hf")
    return str(path)
