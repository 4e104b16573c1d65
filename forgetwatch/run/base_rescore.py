"""One engine on both sides of every flip: the base scored again by vLLM when `forgetwatch watch --engine vllm` scores a
record whose base the training process scored with transformers.

vLLM and transformers compute in other kernels: a probe near a tie can come out right in one and wrong in the other
with no training at all (RESULTS: 500 of 500 multiple-choice predictions equal on SmolLM2 in fp32, option scores apart
by up to 1.3e-4). Counted as a flip, that would be forgetting nobody caused. So a cache key says which engine scored it
when that is vLLM (`ScoringConfig.key`: `runtime`), `compare` refuses a cache of the other engine, and the watcher
scores the base model with vLLM once, into `<record>/base-vllm.parquet` (the training process's `base.parquet` is left
as it is), before the first checkpoint. A record is scored by one engine: a watcher of the other engine is refused.

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

__all__ = ["VLLM_BASE", "base_for_engine", "vllm_key"]

logger = logging.getLogger(__name__)

VLLM_BASE = "base-vllm.parquet"


def vllm_key(key: dict[str, Any]) -> dict[str, Any]:
    """A cache key as vLLM scoring it would have it: `scoring.runtime` "vllm" (`ScoringConfig.key`)."""
    out = copy.deepcopy(key)
    out["scoring"]["runtime"] = "vllm"
    return out


def base_for_engine(record_dir: str | os.PathLike, cache: BaseCache, config: Any, precision: str, probes: Any,
                    plan: Any = None) -> BaseCache:
    """The base the record's evaluations are compared with, scored by the engine `config.engine` names: `cache` itself
    when it was scored by that engine; for vLLM on a record whose `cache` transformers scored, `base-vllm.parquet`
    (scored now from the base model's directory, or read back when an earlier watcher did). Refused with
    `SidecarError` when the record holds evaluations scored by the other engine."""
    root = Path(record_dir)
    vllm_base = root / VLLM_BASE
    scored = [s for s in RunRecord(root).committed_steps() if s > 0]
    engine = getattr(config, "engine", "hf")
    if engine != "vllm":
        if vllm_base.is_file() and scored:
            raise SidecarError(f"{root}: its {len(scored)} evaluation(s) were scored by vLLM (against {vllm_base}), and "
                               f"this watcher scores with --engine {engine}: flips between two engines are not forgetting. "
                               "Watch with --engine vllm, or score the run again into a new output_dir")
        return cache
    if "+autocast-" in precision:
        raise EngineUnavailableError(f"{root}: the run trains under autocast ({precision}), which `watch` scores in, and "
                                     "vLLM runs weights in their own dtype and cannot autocast: watch with --engine hf")
    if cache.key.get("scoring", {}).get("runtime") == "vllm":
        return cache  # the base cache the training process was given was scored by vLLM already
    want = vllm_key(cache.key)
    if vllm_base.is_file():
        return BaseCache.load(vllm_base, expect=want)
    if scored:
        raise SidecarError(f"{root}: its {len(scored)} evaluation(s) were scored by transformers, and this watcher scores "
                           "with --engine vllm: flips between two engines are not forgetting. Watch with --engine hf (or "
                           "the callback's engine), or score the run again into a new output_dir")
    base_dir = _base_directory(cache.key.get("model", {}))
    from ..scoring.engines.vllm import engine_for_checkpoint
    from ..scoring.score import score_probes

    print(f"forgetwatch watch: scoring the base model ({base_dir}) with vLLM too, so that both sides of every flip come "
          f"from one engine (the training process scored {root / 'base.parquet'} with transformers); into {vllm_base}",
          file=sys.stderr, flush=True)
    engine, tokenizer = engine_for_checkpoint(base_dir, precision.split("+")[0])
    results = score_probes(None, tokenizer, plan.scored() if plan is not None else probes, config, engine=engine,
                           desc="forgetwatch watch: the base model (vLLM)")
    variants = None
    if plan is not None:
        results, variants = plan.split(results)
    base = BaseCache(want, results, None, variants)
    base.save(vllm_base)
    return base


def _base_directory(model: dict[str, Any]) -> str:
    """The base model's directory from a cache key's model identity; refused when its weights are not those the cache
    was made from (other files at the same path), or it is not a directory."""
    from ..scoring.weights import compare_weights, weights_fingerprint

    name = str(model.get("name_or_path") or "")
    path = Path(name).expanduser()
    if not path.is_dir():
        if not name or name.startswith((".", "/", "~")):
            raise SidecarError(f"the base model {name!r} the record was started from is not a directory here: vLLM scores "
                               "the base from its directory. Restore it there, or watch with --engine hf")
        from huggingface_hub import snapshot_download  # a Hub id: its files, as vLLM would fetch them

        try:
            return snapshot_download(name, revision=model.get("revision"))
        except Exception as e:  # offline, a gated or deleted model: said with the id, not as a traceback
            raise SidecarError(f"the base model {name!r} the record was started from could not be fetched from the Hub "
                               f"({type(e).__name__}: {e}): vLLM scores the base from its files. Download it (e.g. "
                               "`huggingface-cli download` on a machine online), or watch with --engine hf") from e
    diff, _ = compare_weights(model.get("weights"), weights_fingerprint(path), name)
    if diff:
        raise SidecarError(f"{path}: the base model's weight files are not those the record's base cache was scored from "
                           f"({diff}): vLLM would score another base. Restore them, or watch with --engine hf")
    return str(path)
