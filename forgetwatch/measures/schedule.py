"""When an evaluation under `max_share` is partial, and how large: the scheduler, a pure function of the step, the run's
length, the evaluation and save cadence, the probes' state and the time account (`ShareBudget`), tested without a model.

A full pass is due at step 0 (the base), at the last step, and wherever a checkpoint is saved (a checkpoint's figures
are exact, so that a budget's "last within" points at a model that was measured whole). Elsewhere the evaluation
scores the share of each kind's probes the account can afford, the probes that must be scored (at risk, flipped,
due) always included.

Example:
    >>> import numpy as np
    >>> share = ShareBudget(0.2)
    >>> plan = plan_evaluation(10, 100, 10, 0, False, share, np.zeros(4, bool), np.array(["knowledge"] * 4))
    >>> plan.full, plan.fraction  # nothing timed yet: a pilot that scores the certain probes and times each kind
    (False, 0.0)
    >>> plan_evaluation(100, 100, 10, 0, False, share, np.zeros(4, bool), np.array(["knowledge"] * 4)).full
    True
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .partial import ShareBudget

__all__ = ["EvaluationPlan", "plan_evaluation"]


@dataclass(frozen=True)
class EvaluationPlan:
    """A full pass (`full`), or a partial evaluation scoring `fraction` of each kind's probes (the certain ones always),
    with `steady` the share the partial evaluations can afford on average (None before anything is timed)."""

    full: bool
    fraction: float = 1.0
    steady: float | None = None


FULL = EvaluationPlan(True)


def plan_evaluation(step: int, max_steps: int, eval_steps: int, save_steps: int, saving: bool, share: ShareBudget,
                    must: np.ndarray, kinds: np.ndarray) -> EvaluationPlan:
    """The plan of the evaluation at `step`.

    Args:
        step: this evaluation's optimizer step; `max_steps`: the run's last.
        eval_steps: the evaluation cadence; `save_steps`: the checkpoint cadence when the trainer saves by steps, else 0.
        saving: a checkpoint is saved at this step (the trainer's `control.should_save`).
        share: the time account so far.
        must: per probe, whether it must be scored now (at risk, flipped, due); `kinds`: per probe, its kind.

    Example:
        >>> share = ShareBudget(0.2)
        >>> plan_evaluation(20, 100, 10, 20, False, share, np.zeros(2, bool), np.array(["knowledge"] * 2)).full
        True
    """
    if saving or step >= max_steps or step == 0 or (save_steps and step % save_steps == 0):
        return FULL
    # the evaluations still to come after this one (counted, not listed: max_steps may be large) and how many of them
    # are full passes: the last step, and those at a checkpoint
    first = step - step % eval_steps + eval_steps
    later = len(range(first, max_steps, eval_steps))
    saved = 0
    if save_steps:
        lcm = math.lcm(eval_steps, int(save_steps))
        saved = len(range(first + (-first) % lcm, max_steps, lcm))
    full_left = 1 + saved
    counts = {k: int((kinds == k).sum()) for k in dict.fromkeys(kinds.tolist())}
    partial_left = 1 + later + 1 - full_left
    certain = {k: int((must & (kinds == k)).sum()) for k in counts}
    fraction = share.fraction(step, max_steps, partial_left, full_left, certain, counts)
    if fraction >= 1.0:
        return FULL
    return EvaluationPlan(False, fraction, share.steady(step, max_steps, partial_left, full_left, counts))
