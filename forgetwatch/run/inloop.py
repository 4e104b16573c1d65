"""Scoring the model in training, across ranks: every probe with its robustness variants in one pass, the base again in
fp32 for the precision noise floor, and under `max_share` a partial pass (its design decided on the main process and the
same on every rank; whether it would trip a budget that saves or stops, which then gets a full pass; the chosen probes
scored kind by kind, timed for the sizing). The figures are `forgetwatch.measures.partial`'s and the schedule
`forgetwatch.measures.schedule`'s: this module only runs them against a live model.

Example:
    >>> from forgetwatch.run.inloop import score_all  # doctest: +SKIP
    >>> results, variants = score_all(model, tokenizer, probes, None, ScoringConfig(), False, "step 10")  # doctest: +SKIP
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np

from ..measures.partial import Design, ShareBudget
from ..measures.schedule import plan_evaluation
from ..record.cache import BaseCache
from ..scoring.results import ProbeResults
from ..scoring.score import full_precision
from .distributed import broadcast_from_main, score_distributed
from .hook_inputs import saves_at

__all__ = ["decide_design", "score_all", "score_base", "score_part", "score_reference", "would_trip"]

logger = logging.getLogger(__name__)


def score_all(model: Any, tokenizer: Any, probes: Any, plan: Any, config: Any, progress: bool,
              desc: str) -> tuple[ProbeResults, ProbeResults | None]:
    """The probes' results and, with robustness on (`plan`), their variants' rows, scored together in one pass (variants
    share the probes' batches)."""
    if plan is None:
        return score_distributed(model, tokenizer, probes, config, progress=progress, desc=desc), None
    return plan.split(score_distributed(model, tokenizer, plan.scored(), config, progress=progress, desc=desc))


def score_reference(model: Any, tokenizer: Any, probes: Any, config: Any, precision: str,
                    progress: bool) -> ProbeResults | None:
    """The base scored again in fp32 without autocast, for the noise floor; None when the training precision is fp32
    already (nothing to compare) or the weights are not fp32 (no fp32 answer without a copy)."""
    if precision == "float32":
        return None
    with full_precision(model) as ok:
        if not ok:
            logger.info("forgetwatch: the weights are %s, so the base has no fp32 reference and the precision noise floor "
                        "is unknown; a `forgetwatch cache` of the fp32 model has one", precision)
            return None
        return score_distributed(model, tokenizer, probes, config, progress=progress,
                                 desc="forgetwatch: the base in fp32 (noise floor)")


def score_base(model: Any, tokenizer: Any, probes: Any, plan: Any, config: Any, key: dict[str, Any], precision: str,
               progress: bool) -> tuple[BaseCache, dict[str, float]]:
    """The base scored at the start of training (the model before its first step), with its variants, and again in
    fp32 for the noise floor when training runs in lower precision; the cache, and the seconds of each pass ("base",
    "noise_floor": what the end-of-training cost line says)."""
    t0 = time.perf_counter()
    base, variants = score_all(model, tokenizer, probes, plan, config, progress, "forgetwatch: scoring the base model")
    t1 = time.perf_counter()
    logger.info("forgetwatch: scored the base model on %d probes in %.1fs", len(probes), t1 - t0)
    reference = score_reference(model, tokenizer, probes, config, precision, progress)
    seconds = {"base": t1 - t0, "noise_floor": time.perf_counter() - t1 if reference is not None else 0.0}
    return BaseCache(key, base, reference, variants), seconds


def decide_design(monitor: Any, share: ShareBudget, args: Any, state: Any, eval_steps: int, saving: bool, seed: int,
                  is_main: bool) -> Design | None:
    """The design of this evaluation, None for a full pass: decided on the main process (which holds the record's
    per-probe state and the clock) and broadcast, so every rank scores the same probes. A plan that fails gives a full
    pass, said: never end training over it."""
    def decide() -> Design | None:
        every = int(getattr(state, "save_steps", 0) or 0)
        plan = plan_evaluation(state.global_step, state.max_steps, eval_steps,
                               every if every and saves_at(args, state, every) else 0, saving, share,
                               monitor.must_score(), monitor.kinds())
        if plan.full:
            return None
        return monitor.partial_design(state.global_step, plan.fraction, seed, plan.steady)

    try:
        design = decide() if is_main else None
    except Exception:
        logger.exception("forgetwatch: could not plan a partial evaluation at step %d; scoring every probe", state.global_step)
        design = None
    return broadcast_from_main(design)


def would_trip(monitor: Any, budget: Any, scored: ProbeResults, design: Design, is_main: bool) -> bool:
    """With a budget that saves or stops: whether this partial evaluation would trip it (decided on the main process,
    where the record is, and the same on every rank)."""
    if budget is None or budget.on_budget not in ("save", "stop"):
        return False
    trip = None
    if is_main:
        try:
            trip = monitor.would_trip(monitor.merged(scored), design)
        except Exception:
            logger.exception("forgetwatch: could not judge the partial evaluation against the budget")
            trip = False
    return bool(broadcast_from_main(trip))


def score_part(model: Any, tokenizer: Any, probes: Any, config: Any, share: ShareBudget, design: Design, progress: bool,
               desc: str) -> ProbeResults:
    """The probes `design` scores, each kind in a call of its own, timed: the sizing's cost per probe of each kind."""
    parts = []
    for kind in dict.fromkeys(design.kinds.tolist()):
        chosen = np.flatnonzero(design.scored & (design.kinds == kind))
        if not len(chosen):
            continue
        t0 = time.perf_counter()
        parts.append(score_distributed(model, tokenizer, [probes[int(i)] for i in chosen], config, progress=progress,
                                       desc=f"{desc} ({kind}, partial)"))
        share.note_cost(kind, time.perf_counter() - t0, len(chosen))
    return ProbeResults.concat(parts)
