"""A saved checkpoint scored on probes, by whichever engine the scoring config names: one call for the watcher, the
base scored again for another engine, and the interpolation sweep's θ(α) written to disk.

An engine that loads directories (`EngineSpec.checkpoint`, vLLM) opens the checkpoint itself, and the model never
loads in this process; any other engine scores the checkpoint loaded with transformers (`load_checkpoint`: full
weights, a PEFT adapter on its base, or FSDP's sharded weights), under the precision it was trained in.

Example:
    >>> results = score_checkpoint("out/checkpoint-500", probes, ScoringConfig(), precision="float32")  # doctest: +SKIP
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from ..probes.probe_set import Probe
from .engines import engine_spec, open_checkpoint
from .models import free_memory, load_checkpoint
from .modes import ScoringConfig
from .results import ProbeResults

__all__ = ["score_checkpoint"]


def score_checkpoint(path: str | os.PathLike, probes: Sequence[Probe], config: ScoringConfig, *, precision: str,
                     device: str | None = None, model_files: str | os.PathLike | None = None,
                     desc: str | None = None, progress: bool = False) -> ProbeResults:
    """The `ProbeResults` of `probes` for the checkpoint at `path`.

    Args:
        path: the checkpoint's directory.
        probes: what to score (a `VariantPlan`'s `scored()` included).
        config: the scoring settings; `config.engine` runs them.
        precision: as `describe_precision` writes it ("float32", "float32+autocast-bfloat16"): the dtype the weights are
            loaded in, and the autocast they are scored under.
        device: where a transformers-loaded model goes (default: CUDA when available).
        model_files: where the config and tokenizer are when the checkpoint holds none (FSDP's sharded checkpoints).
        desc: the progress bar's label; `progress`: show the bar.
    """
    from .score import precision_context, score_probes  # torch, on first use

    dtype = precision.split("+")[0]
    if not engine_spec(config.engine).live_model:
        engine, tokenizer = open_checkpoint(config.engine, path, dtype, tokenizer_dir=model_files)
        return score_probes(None, tokenizer, list(probes), config, desc=desc, progress=progress, engine=engine)

    model: Any = None
    try:
        model, tokenizer = load_checkpoint(path, dtype=dtype, device=device, model_files=model_files)
        with precision_context(model, precision):
            return score_probes(model, tokenizer, list(probes), config, desc=desc, progress=progress)
    finally:
        del model
        free_memory()
