"""Scoring probes with a causal LM: `score_probes`, which composes the scoring modes (`forgetwatch.scoring.modes`: requests
built from probes, results judged) with an engine that runs them (`forgetwatch.scoring.engines`, by default `HFEngine`, the
model in this process; the callback adds only the distributed glue).

Scoring is deterministic (no sampling), runs under inference mode, computes log-softmax in fp32 so results do not
move with batch size, sorts requests by length to keep padding low, halves the batch on out-of-memory, and leaves
the model as it found it: every module's train/eval flag, `requires_grad`, and the python / numpy / torch RNG
states. How each mode scores: `forgetwatch.scoring.modes`; how the model runs: `forgetwatch.scoring.engines.hf`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch

from ..probes.probe_set import Probe
from . import modes
from .engines import make_engine
from .engines.hf import HFEngine  # noqa: F401  (re-exported)
from .lengths import context_limit, screen_long
from .modes import (  # noqa: F401  (re-exported: the names modules and tests import from `forgetwatch.scoring.score`)
    BEHAVIOR_MAX_NEW_TOKENS,
    MAX_ALIASES,
    MCQ_MODES,
    SHORT_MATCHES,
    SHORT_MODES,
    ScoringConfig,
    answer_continuations,
)
from .requests import ProbeSetError  # noqa: F401  (re-exported, as above)
from .results import ProbeResults

if TYPE_CHECKING:
    from .engines import Engine

__all__ = ["ScoringConfig", "score_probes", "score_with_key", "describe_precision"]

# The order in which modes are scored: fixed, so that every rank takes them in the same order. Short answers that are
# generated are a mode of their own: their prompt (and chat template) is not the multiple-choice one.
_MODE_ORDER = (*MCQ_MODES, "generate_short", "greedy_match", "behavior")


def describe_precision(model: torch.nn.Module, autocast: str | None = None) -> str:
    """The numeric precision scoring runs in, e.g. "float32" or "float32+autocast-bfloat16"."""
    param = next(model.parameters())
    dtype = str(param.dtype).removeprefix("torch.")
    # autocast is per device type: the no-argument `torch.is_autocast_enabled()` only sees CUDA's
    if autocast is None and torch.is_autocast_enabled(param.device.type):
        autocast = str(torch.get_autocast_dtype(param.device.type)).removeprefix("torch.")
    return f"{dtype}+autocast-{autocast}" if autocast else dtype


def precision_context(model: torch.nn.Module, precision: str) -> contextlib.AbstractContextManager:
    """Autocast as a precision string from `describe_precision` says ("float32+autocast-bfloat16"), else nothing:
    how a process outside the trainer scores in the trainer's precision.

    Example:
        >>> with precision_context(model, "float32+autocast-bfloat16"):  # doctest: +SKIP
        ...     results = score_probes(model, tokenizer, probes)
    """
    if "+autocast-" not in precision:
        return contextlib.nullcontext()
    autocast = precision.split("+autocast-")[1]
    return torch.autocast(next(model.parameters()).device.type, dtype=getattr(torch, autocast))


@contextlib.contextmanager
def full_precision(model: torch.nn.Module) -> Iterator[bool]:
    """Run forwards of `model` in fp32 without autocast inside this block; yields False (changing nothing) when its
    weights are not all fp32, since no fp32 answer exists then without a copy of the model.

    Inside a Trainer with bf16 / fp16, accelerate wraps the model's `forward` in autocast (keeping the original as
    `_original_forward`); an outer `autocast(enabled=False)` cannot undo that, so the original forward is put back
    for the block and the wrapper restored after it.

    Example:
        >>> with full_precision(model) as ok:  # doctest: +SKIP
        ...     reference = score_probes(model, tokenizer, probes) if ok else None
    """
    if any(p.dtype != torch.float32 for p in model.parameters()):
        yield False
        return
    device_type = next(model.parameters()).device.type
    wrapped = model.__dict__.get("forward") if "_original_forward" in model.__dict__ else None
    if wrapped is not None:
        model.forward = model.__dict__["_original_forward"]
    try:
        with torch.autocast(device_type, enabled=False):
            yield True
    finally:
        if wrapped is not None:
            model.forward = wrapped


def _refuse_long_questions(model: Any, tokenizer: Any, probes: list[Probe]) -> None:
    """Refuse, as the engine would, the probes whose question alone is over the model's context by its first characters
    (`fit.screen_long`): a 5 MB probe is refused on its first characters, not after tokenizing it whole."""
    limit = context_limit(model)
    over = screen_long(tokenizer, probes, limit) if limit is not None else {}
    if over:
        listed = ", ".join(f"{pid} (over {n:,} tokens)" for pid, n in list(over.items())[:5])
        raise ProbeSetError(f"{len(over)} probe(s) do not fit the model's context of {limit} tokens with their question "
                            f"alone: {listed}{' ...' if len(over) > 5 else ''}. Remove them from the probe set, or shorten "
                            "their text")


def score_probes(
    model: torch.nn.Module,
    tokenizer: Any,
    probes: Sequence[Probe],
    config: ScoringConfig | None = None,
    *,
    progress: bool = False,
    desc: str = "scoring probes",
    sync_ranks: bool = False,
    engine: Engine | None = None,
) -> ProbeResults:
    """Score every probe with `model`; results come back in the order of `probes`.

    Args:
        model: any Hugging Face causal LM (`AutoModelForCausalLM`), in any mode; it is left exactly as found.
        tokenizer: its tokenizer (the trainer's `processing_class`).
        probes: a `ProbeSet` or a list of `Probe`s (e.g. one rank's shard).
        config: a `ScoringConfig`; defaults to log-likelihood scoring of options.
        progress: show a progress bar.
        sync_ranks: this is one rank's shard and every rank of the process group calls `score_probes` together
            (`forgetwatch.run.distributed.score_distributed` does): each rank then runs as many forwards as the busiest,
            padding with forwards whose results are dropped, and generation keeps stepping until all ranks finish
            (`synced_gpus`), so FSDP / ZeRO-3, whose forwards gather weights from every rank, never wait forever.
            The shards must hold the same scoring modes (`plan_shard` sees to it).
        engine: what runs the model (`forgetwatch.scoring.engines`); default the one `config.engine` names, on `model` with
            `config`'s `batch_size` and `pack_choices` and `sync_ranks`. A given engine brings its own batching and ranks.

    Example:
        >>> from forgetwatch import ProbeSet, score_probes
        >>> results = score_probes(model, tokenizer, ProbeSet.from_jsonl("probes.jsonl"))  # doctest: +SKIP
        >>> results.accuracy  # doctest: +SKIP
        0.52
    """
    if engine is not None and sync_ranks:
        raise ValueError("`sync_ranks` is for the default engine; a given `engine` scores across ranks as it was built to "
                         "(e.g. `HFEngine(..., sync_ranks=True)`)")
    config = config or ScoringConfig()
    probes = list(probes)
    results = ProbeResults.empty([p.id for p in probes])
    if not probes:
        return results
    by_mode: dict[str, list[int]] = {}
    for i, p in enumerate(probes):
        by_mode.setdefault(scoring_mode(p, config), []).append(i)
    # A fixed order of modes, whatever order the probes come in: ranks must take them in the same order.
    by_mode = {mode: by_mode[mode] for mode in _MODE_ORDER if mode in by_mode}

    from tqdm.auto import tqdm

    if engine is None and model is not None and not sync_ranks:  # with sync_ranks the engine decides for every rank
        _refuse_long_questions(model, tokenizer, probes)
    # One bar, drawn only on a terminal (tqdm's disable=None): written to a log file, a redrawn bar beside the
    # Trainer's leaves escape codes and half lines; gone once done, so the Trainer's bar is not pushed down
    bar = tqdm(total=len(probes), desc=desc, disable=None if progress else True, unit="probe", leave=False)
    if engine is None:
        engine = make_engine(config.engine, model, tokenizer, batch_size=config.batch_size,
                             pack_choices=config.pack_choices, sync_ranks=sync_ranks)
    with engine.running():
        for mode, idx in by_mode.items():
            subset = [probes[i] for i in idx]
            if mode in ("loglik", "loglik_norm"):
                part = modes.score_loglik(engine, tokenizer, subset, config, mode == "loglik_norm", bar)
            elif mode == "letter":
                part = modes.score_letter(engine, tokenizer, subset, config, bar)
            elif mode == "greedy_match":
                part = modes.score_greedy_match(engine, tokenizer, subset, config, bar)
            elif mode == "behavior":
                part = modes.score_behavior(engine, tokenizer, subset, config, bar)
            else:
                part = modes.score_generate(engine, tokenizer, subset, config, bar)
            _scatter(results, idx, part)
    bar.close()
    return results


def score_with_key(model: torch.nn.Module, tokenizer: Any, probes: Sequence[Probe], config: ScoringConfig,
                   autocast: str | None = None, desc: str = "scoring probes") -> tuple[ProbeResults, dict[str, Any]]:
    """`score_probes` with a progress bar, under `torch.autocast` in `autocast` ("bfloat16", "float16"; None: none),
    and the scoring part of the cache key (`ScoringConfig.key`) of what was scored: how a process outside a trainer
    (the command line, an interpolation sweep) scores a model for a base cache or against one.

    Example:
        >>> results, key = score_with_key(model, tokenizer, probes, ScoringConfig(), autocast="bfloat16")  # doctest: +SKIP
        >>> key["precision"]  # doctest: +SKIP
        'float32+autocast-bfloat16'
    """
    precision = describe_precision(model, autocast=autocast)
    with precision_context(model, precision):
        results = score_probes(model, tokenizer, probes, config, progress=True, desc=desc)
    return results, config.key(tokenizer, describe_precision(model, autocast=autocast))


def scoring_mode(probe: Probe, config: ScoringConfig) -> str:
    """How `probe` is scored under `config`: one of `_MODE_ORDER` (ranks shard probes mode by mode)."""
    if probe.is_behavior:
        return "behavior"
    if probe.kind == "mcq":
        return config.mcq_mode
    return {"generate": "generate_short"}.get(config.short_scoring, config.short_scoring)


def _scatter(results: ProbeResults, idx: list[int], part: ProbeResults) -> None:
    for j, i in enumerate(idx):
        results.set_row(i, part, j)
