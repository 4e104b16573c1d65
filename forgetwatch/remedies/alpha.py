"""The α rule: which point of the front θ(α) = θ_base + α (θ_final − θ_base) to step back to, stated once (`RULE`)
and applied by one function (`pick_alpha`) for `forgetwatch interpolate` and for rewind. Plain Python.

Example:
    >>> front = [{"alpha": a, "forgetting": f, "task": t, "within_budget": f <= 0.05}
    ...          for a, f, t in [(0.6, 0.03, 1.16), (0.8, 0.05, 1.15), (1.0, 0.07, 1.17)]]
    >>> pick_alpha(front, budgeted=True)
    Pick(alpha=0.8, case='lowest_task_loss', why='the lowest task loss within the budget')
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from ..errors import InterpolationError

__all__ = ["DEFAULT_ALPHAS", "MAX_ALPHAS", "RULE", "Pick", "alpha_grid", "pick_alpha", "pareto", "front_measure", "front_points"]

DEFAULT_ALPHAS = tuple(round(i / 10, 1) for i in range(11))

RULE = ("With a task loss: among the α within the run's forgetting budget (as the budget judges an evaluation: its "
        "bound, its limits; every α when there is no budget), the lowest task loss (ties: the smaller forgetting, then "
        "the larger α). With a budget that no α meets: the knee of the front of (task loss, forgetting) — of the α no "
        "other α beats on both, the one farthest from the straight line between the front's two ends, both axes scaled "
        "to the front's range (a front of one or two points: the one that forgets less). Without a task loss: the "
        "largest α within the budget, or, when none is, the α that forgets least. Without a task loss and without a "
        "budget there is nothing to pick by: refused. A task accuracy (`forgetwatch interpolate --task-probes`) is read "
        "as a loss with its sign turned: the highest accuracy where the rule says the lowest loss.")


MAX_ALPHAS = 101  # each α scores every probe (and the task measure) once: a grid of 0.01 steps is already 101 scorings


def alpha_grid(spec: str | Sequence[float] | None, extrapolate: bool = False, *, flag: str = "--alphas",
               beyond: str | None = "pass --extrapolate to go beyond them") -> list[float]:
    """The α values to score, sorted: `"0,0.25,0.5,1"`, `"0:1:0.1"` (start:stop:step, both ends included), or the default
    0, 0.1, …, 1. Outside [0, 1] only with `extrapolate`; at most `MAX_ALPHAS` values. `flag` names the setting in
    messages (a recipe's `forgetwatch_rewind_alphas`), `beyond` says how to go outside [0, 1] (None: no way).

    Example:
        >>> alpha_grid("0:1:0.25")
        [0.0, 0.25, 0.5, 0.75, 1.0]
        >>> alpha_grid("0.5,1.5")
        Traceback (most recent call last):
        forgetwatch.errors.InterpolationError: --alphas: 1.5 is outside [0, 1] (0 is the base, 1 the checkpoint); pass ...
    """
    if spec is None:
        return list(DEFAULT_ALPHAS)
    if isinstance(spec, str):
        text = spec.strip()
        try:
            if ":" in text:
                start, stop, step = (float(x) for x in text.split(":"))
                if not (step > 0 and stop >= start and math.isfinite(start) and math.isfinite(stop)):
                    raise ValueError
                n = int(math.floor((stop - start) / step + 1e-9))
                values = [round(start + i * step, 10) for i in range(n + 1)] if n < MAX_ALPHAS else []
            else:
                values = [float(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise InterpolationError(f"{flag} {spec!r}: give numbers separated by commas (0,0.5,1) or start:stop:step "
                                     "(0:1:0.1)") from None
        if ":" in text and n >= MAX_ALPHAS:  # counted before any list is made: 0:1:1e-9 would be a billion floats
            raise InterpolationError(f"{flag} {spec!r}: {n + 1} values of α, and each is a scoring of every probe: at "
                                     f"most {MAX_ALPHAS} (a larger step)")
    else:
        values = [float(x) for x in spec]
    if not values:
        raise InterpolationError(f"{flag} {spec!r}: no α to score")
    if len(set(values)) > MAX_ALPHAS:
        raise InterpolationError(f"{flag}: {len(set(values))} values of α, and each is a scoring of every probe: at most "
                                 f"{MAX_ALPHAS}")
    for a in values:
        if not math.isfinite(a):
            raise InterpolationError(f"{flag}: {a} is not a number")
        if not extrapolate and not 0 <= a <= 1:
            raise InterpolationError(f"{flag}: {a:g} is outside [0, 1] (0 is the base, 1 the checkpoint)"
                                     + (f"; {beyond}" if beyond else ""))
    return sorted(set(values))


class Pick(NamedTuple):
    """The α picked, which case of the rule picked it (`lowest_task_loss`, `knee`, `largest_within`, `least_forgetting`),
    and why, in words."""

    alpha: float
    case: str
    why: str


def pick_alpha(points: Sequence[Mapping[str, Any]], budgeted: bool, task_kind: str = "loss") -> Pick:
    """The α to step back to, by `RULE`, from one point per α: `alpha`, `forgetting`, `task` (a loss, lower is better,
    or with `task_kind="accuracy"` higher is better; None or NaN without a task measure) and `within_budget` (read
    only when `budgeted`).

    Example:
        >>> front = [{"alpha": a, "forgetting": f, "task": t, "within_budget": f <= 0.05}
        ...          for a, f, t in [(0.6, 0.03, 1.16), (0.8, 0.05, 1.15), (1.0, 0.07, 1.17)]]
        >>> pick_alpha(front, budgeted=True).alpha  # the lowest loss within budget
        0.8
        >>> pick_alpha(front, budgeted=False).alpha  # no budget: the lowest loss
        0.8
        >>> over = [dict(p, within_budget=False) for p in front]
        >>> pick_alpha(over, budgeted=True).case  # nothing within: the knee (1.0 is beaten by 0.8 on both axes)
        'knee'
        >>> pick_alpha([dict(p, task=None) for p in front], budgeted=True).alpha  # no task: the largest α within
        0.8
        >>> pick_alpha(front, budgeted=True, task_kind="accuracy")  # "task" read as an accuracy: higher is better
        Pick(alpha=0.6, case='lowest_task_loss', why='the highest task accuracy within the budget')
    """
    if task_kind not in ("loss", "accuracy"):
        raise ValueError(f"task_kind must be 'loss' or 'accuracy', got {task_kind!r}")
    if not points:
        raise InterpolationError("no α was scored")
    if task_kind == "accuracy":  # the rule reads a loss: an accuracy with its sign turned
        points = [dict(p, task=-p["task"]) if is_finite(p.get("task")) else p for p in points]
    task = "task loss" if task_kind == "loss" else "task accuracy"
    best_task = "the lowest task loss" if task_kind == "loss" else "the highest task accuracy"
    has_task = all(is_finite(p.get("task")) for p in points)
    if not has_task and not budgeted:
        raise InterpolationError("nothing to pick α by: no task loss (the trainer's eval set, or "
                                 "forgetwatch_rewind_data / --data) and no forgetwatch_budget (--budget); give one")
    within = [p for p in points if p.get("within_budget")] if budgeted else list(points)
    if has_task and within:
        best = min(within, key=lambda p: (p["task"], _num(p["forgetting"]), -p["alpha"]))
        where = "within the budget" if budgeted else "(no budget)"
        return Pick(best["alpha"], "lowest_task_loss", f"{best_task} {where}")
    if has_task:
        knee = _knee(points)
        if len(pareto(points)) == 1:  # one α beats every other on both: the front is that point
            return Pick(knee["alpha"], "knee", f"no α within the budget; α {knee['alpha']:g} has {best_task} and "
                        "the least forgetting of all")
        return Pick(knee["alpha"], "knee", f"no α within the budget: the knee of the ({task}, forgetting) front")
    if within:
        return Pick(max(p["alpha"] for p in within), "largest_within", f"no {task}: the largest α within the budget")
    least = min(points, key=lambda p: (_num(p["forgetting"]), -p["alpha"]))
    return Pick(least["alpha"], "least_forgetting", f"no {task} and no α within the budget: the α that forgets least")


def pareto(points: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The points no other point beats on both task loss and forgetting (lower is better on both), by task loss.

    Example:
        >>> [p["alpha"] for p in pareto([{"alpha": 1, "task": 1.0, "forgetting": 0.1},
        ...                              {"alpha": 0.5, "task": 1.2, "forgetting": 0.0},
        ...                              {"alpha": 0.7, "task": 1.3, "forgetting": 0.05}])]
        [1, 0.5]
    """
    def beaten(p, q) -> bool:
        return (q["task"] <= p["task"] and _num(q["forgetting"]) <= _num(p["forgetting"])
                and (q["task"], _num(q["forgetting"])) != (p["task"], _num(p["forgetting"])))

    front = [p for p in points if not any(beaten(p, q) for q in points)]
    return sorted(front, key=lambda p: (p["task"], _num(p["forgetting"])))


def _knee(points: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
    """The front's point farthest from the chord between its ends, each axis scaled to [0, 1] over the front (ties: the
    smaller forgetting, then the larger α); a front of one or two points has no bend: its least forgetting."""
    front = pareto(points)
    ts, fs = [p["task"] for p in front], [_num(p["forgetting"]) for p in front]
    span_t, span_f = (max(ts) - min(ts)) or 1.0, (max(fs) - min(fs)) or 1.0
    xy = [((t - min(ts)) / span_t, (f - min(fs)) / span_f) for t, f in zip(ts, fs, strict=True)]
    (x0, y0), (x1, y1) = xy[0], xy[-1]
    norm = math.hypot(x1 - x0, y1 - y0)
    distance = [abs((x1 - x0) * (y0 - y) - (x0 - x) * (y1 - y0)) / norm if norm else 0.0 for x, y in xy]
    return min(zip(front, distance, strict=True), key=lambda pd: (-round(pd[1], 12), _num(pd[0]["forgetting"]),
                                                                   -pd[0]["alpha"]))[0]


def is_finite(value: Any) -> bool:
    """A real number (not a bool), finite: a figure that can be compared."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _num(value: Any) -> float:
    """A figure for ordering: missing (None, NaN) sorts last."""
    return float(value) if is_finite(value) else math.inf


def front_measure(rows: Mapping[str, Mapping[str, Any]]) -> tuple[str, str]:
    """(group, metric) of the forgetting the front is drawn on: the knowledge probes' (all probes' when there are no
    behaviour probes), chance-adjusted where the group has a chance term; as `forgetwatch interpolate --plot` draws it."""
    group = "all_knowledge" if "all_knowledge" in rows else "overall"
    return group, "forgetting_adjusted" if rows[group].get("adjusted") else "forgetting"


def front_points(steps: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The points `pick_alpha` reads, from an interpolation sweep's steps (`InterpolationSweep.run`): each α's
    forgetting on `front_measure`'s group, its task measure, and whether it is within the budget.

    Example:
        >>> steps = [{"alpha": 1.0, "task": 1.2, "within_budget": None, "breaches": [],
        ...           "metrics": {"overall": {"forgetting": 0.1, "adjusted": False}}}]
        >>> front_points(steps)
        [{'alpha': 1.0, 'forgetting': 0.1, 'task': 1.2, 'within_budget': None, 'breaches': []}]
    """
    if not steps:
        return []
    group, metric = front_measure(steps[0]["metrics"])
    return [{"alpha": s["alpha"], "forgetting": s["metrics"][group].get(metric), "task": s["task"],
             "within_budget": s["within_budget"], "breaches": s.get("breaches", [])} for s in steps]
