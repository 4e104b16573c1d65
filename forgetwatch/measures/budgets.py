"""Forgetting budgets: upper limits on what an evaluation measured, and what to do when one is exceeded.

A budget maps metric names, as `metrics.jsonl` names them, to upper limits: `forgetting`, `forgetting_adjusted`
(rates in [0, 1]), `margin_drop` (minus the mean margin change, nats) and `kl` (nats), and for behaviour probes
`runaway`, `over_refusal`, `instruct_forgetting` (rates) and `length_drift` (|median log length ratio|), with
robustness on `robust_forgetting` (a rate, with a Wilson interval) and `consistency_drop` (minus the change in the
share of variants right; no interval), each overall or for one category as `<category>/<metric>`. With `bound="lower"` (the
default) a limit counts as exceeded only when the lower
end of the 95% interval is above it, so that noise pages nobody: the Wilson lower bound of F; for the adjusted figure
that bound minus the chance term, clipped at 0; for `margin_drop` minus the interval's upper end. `kl` has no
interval and is compared as measured. `bound="point"` compares the measured values.

Plain Python; the callback acts on the verdicts (alerts, checkpoint, stop).

Example:
    >>> budget = Budget({"forgetting_adjusted": 0.05, "science/forgetting": 0.10}, on_budget="stop")
    >>> budget.limits[1]
    Limit(key='science/forgetting', group='science', metric='forgetting', limit=0.1)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import options

__all__ = ["ROBUST_BUDGETS", "Budget", "BudgetState", "Breach", "Limit", "BUDGET_METRICS", "ON_BUDGET",
           "check_options", "parse_budget"]

# metric -> whether it is a rate (limit in [0, 1]) or a figure in nats (limit >= 0)
BUDGET_METRICS = {"forgetting": "rate", "forgetting_adjusted": "rate", "margin_drop": "nats", "kl": "nats",
                  # behaviour probes (forgetwatch.measures.behavior): new runaways, new refusals of harmless requests,
                  # instructions no longer followed, and |median log length ratio|
                  "runaway": "rate", "over_refusal": "rate", "instruct_forgetting": "rate", "length_drift": "nats",
                  # robustness on (forgetwatch.measures.robustness): probes robust at base no longer robust, and the fall in
                  # the share of variants answered right
                  "robust_forgetting": "rate", "consistency_drop": "rate"}
ROBUST_BUDGETS = ("robust_forgetting", "consistency_drop")  # need robustness on
ON_BUDGET, BOUNDS = options.ON_BUDGET, options.BUDGET_BOUNDS  # declared with the options


@dataclass(frozen=True)
class Limit:
    key: str  # as the user wrote it
    group: str  # "overall" or a category
    metric: str
    limit: float


@dataclass(frozen=True)
class Breach:
    """A limit exceeded at one evaluation: `value` is what was compared (the interval's lower end by default)."""

    key: str
    value: float
    measured: float
    limit: float
    bound: str

    def describe(self) -> str:
        how = "" if self.bound == "point" else f" (lower 95% bound {self.value:.4f})"
        return f"{self.key} = {self.measured:.4f}{how} > budget {self.limit:g}"


@dataclass
class Budget:
    """Upper limits (`limits`), the action when one is exceeded (`on_budget`), and the compared bound (`bound`).

    Args:
        limits: `{"forgetting_adjusted": 0.05, "mmlu_stem/forgetting": 0.10}`.
        on_budget: "alert" (W&B / trackio alert, a logged warning and an event in the record), "save" (also save a
            checkpoint at that step) or "stop" (also stop training there).
        bound: "lower" (the interval's lower end must exceed the limit) or "point" (the measured value).
        categories: the probe set's categories; with them, a key naming another category is refused.
    """

    limits: list[Limit]
    on_budget: str = "alert"
    bound: str = "lower"

    def __init__(self, limits: Mapping[str, float], on_budget: str = "alert", bound: str = "lower",
                 categories: Sequence[str] | None = None):
        if not isinstance(limits, Mapping) or not limits:
            raise ValueError(f"`budget` must be a non-empty dict of metric -> upper limit, e.g. "
                             f"{{'forgetting_adjusted': 0.05}}; got {limits!r}")
        check_options(on_budget, bound)
        self.on_budget, self.bound = on_budget, bound
        self.limits = [_parse(key, value, categories) for key, value in limits.items()]

    def to_dict(self) -> dict[str, Any]:
        return {"limits": {lim.key: lim.limit for lim in self.limits}, "on_budget": self.on_budget, "bound": self.bound}

    def check(self, metrics: Mapping[str, Mapping[str, Any]]) -> list[Breach]:
        """The limits exceeded by one evaluation's figures: `{group: {field: value}}` as a `metrics.jsonl` row holds
        them (`ForgettingMetrics.to_dict()` merged with `DriftStats.to_dict()`). A figure that is absent or NaN (a
        category without margins) exceeds nothing."""
        out = []
        for lim in self.limits:
            row = metrics.get(lim.group)
            if row is None:
                continue
            measured, compared = _figure(row, lim.metric, self.bound)
            if not math.isnan(compared) and compared > lim.limit:
                out.append(Breach(lim.key, compared, measured, lim.limit, self.bound))
        return out


@dataclass
class BudgetState:
    """What the budget saw so far in a run: which limits are over now, and the last evaluation within budget.

    `update` returns the breaches that are new at this evaluation (a limit that stays over trips once; one that
    recovers and is exceeded again trips again). Keys in `unjudged` had no figure at this evaluation (probes scored
    NaN / inf): a limit over before stays over, and the step is not within budget, since nobody can say it was."""

    over: set[str] = field(default_factory=set)
    last_within: int | None = None

    def update(self, step: int, breaches: Sequence[Breach], unjudged: Sequence[str] = ()) -> list[Breach]:
        keys = {b.key for b in breaches} | (self.over & set(unjudged))
        new = [b for b in breaches if b.key not in self.over]
        self.over = keys
        if not keys and not unjudged:
            self.last_within = step
        return new


def check_options(on_budget: str, bound: str) -> None:
    """Refuse an unknown `on_budget` or `budget_bound` (also when no budget is set: a typo must not pass silently)."""
    if on_budget not in ON_BUDGET:
        raise ValueError(f"`on_budget` must be one of {', '.join(ON_BUDGET)}; got {on_budget!r}")
    if bound not in BOUNDS:
        raise ValueError(f"`budget_bound` must be one of {', '.join(BOUNDS)}; got {bound!r}")


def _parse(key: Any, value: Any, categories: Sequence[str] | None) -> Limit:
    valid_metrics = ", ".join(BUDGET_METRICS)
    if not isinstance(key, str) or not key:
        raise ValueError(f"budget key {key!r}: expected a metric name ({valid_metrics}) or '<category>/<metric>'")
    group, _, metric = key.rpartition("/")
    group = group or "overall"
    if metric not in BUDGET_METRICS:
        raise ValueError(f"budget key {key!r}: {metric!r} is not a budget metric; use one of {valid_metrics}, "
                         "overall or as '<category>/<metric>'")
    if categories is not None and group != "overall" and group not in categories:
        raise ValueError(f"budget key {key!r}: no category {group!r} in the probe set; its categories are "
                         f"{', '.join(sorted(categories))}")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"budget {key!r}: the limit must be a number, got {value!r}")
    if value < 0 or (BUDGET_METRICS[metric] == "rate" and value > 1):
        allowed = "between 0 and 1" if BUDGET_METRICS[metric] == "rate" else "0 or more (nats)"
        raise ValueError(f"budget {key!r}: the limit must be {allowed}, got {value!r}")
    return Limit(key, group, metric, float(value))


def _figure(row: Mapping[str, Any], metric: str, bound: str) -> tuple[float, float]:
    """(measured, compared) for one metric of one group."""
    nan = math.nan
    if metric == "forgetting":
        measured = float(row.get("forgetting", nan))
        low = float(row.get("forgetting_ci_low", nan))
        return measured, measured if bound == "point" else low
    if metric == "forgetting_adjusted":
        measured = float(row.get("forgetting_adjusted", nan))
        low = max(float(row.get("forgetting_ci_low", nan)) - float(row.get("chance", 0.0)), 0.0)
        return measured, measured if bound == "point" else low
    if metric == "margin_drop":
        measured = -float(row.get("margin_change", nan))
        low = -float(row.get("margin_change_ci_high", nan))
        return measured, measured if bound == "point" else low
    if metric == "robust_forgetting":
        measured = float(row.get(metric, nan))
        return measured, measured if bound == "point" else float(row.get("robust_forgetting_ci_low", nan))
    if metric == "consistency_drop":  # no interval: compared as measured
        measured = -float(row.get("consistency_change", nan))
        return measured, measured
    # the lower end: Wilson for rates; for length_drift the median interval's end nearest 0
    if metric in ("runaway", "over_refusal", "instruct_forgetting", "length_drift"):
        measured = float(row.get(metric, nan))
        return measured, measured if bound == "point" else float(row.get(f"{metric}_ci_low", nan))
    measured = float(row.get(metric, nan))  # kl: no interval
    return measured, measured


def parse_budget(spec: Mapping[str, float] | str | None) -> dict[str, float] | None:
    """A budget from a dict, a JSON object, or `"forgetting_adjusted=0.05,mmlu_stem/forgetting=0.1"` (the CLI form).

    Example:
        >>> parse_budget("forgetting_adjusted=0.05,science/forgetting=0.1")
        {'forgetting_adjusted': 0.05, 'science/forgetting': 0.1}
    """
    if spec is None or isinstance(spec, Mapping):
        return dict(spec) if spec is not None else None
    if not isinstance(spec, str):
        raise ValueError(f"`budget` must be a dict, a JSON object or 'metric=limit,...'; got {spec!r}")
    text = spec.strip()
    if text.startswith("{"):
        import json

        def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
            seen = [k for i, (k, _) in enumerate(items) if k in dict(items[:i])]
            if seen:
                raise ValueError(f"`budget` {spec!r}: {seen[0]!r} is given twice; the limit would be the last one, "
                                 "silently: keep the one you mean")
            return dict(items)

        try:
            out = json.loads(text, object_pairs_hook=pairs)
        except json.JSONDecodeError as e:
            raise ValueError(f"`budget` {spec!r} is not valid JSON ({e})") from None
        if not isinstance(out, dict):
            raise ValueError(f"`budget` {spec!r}: expected a JSON object of metric -> limit")
        return out
    out: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if key.strip() in out:
            raise ValueError(f"`budget` {spec!r}: {key.strip()!r} is given twice; the limit would be the last one, "
                             "silently: keep the one you mean")
        try:
            if not sep:
                raise ValueError
            out[key.strip()] = float(value)
        except ValueError:
            raise ValueError(f"`budget` {spec!r}: {part!r} is not 'metric=limit' (e.g. 'forgetting_adjusted=0.05')") from None
    return out
