"""Behaviour drift: how a model answers, probe by probe against the base's answer to the same prompt.

Behaviour probes are judged by `forgetwatch.scoring.judge.judge_behavior` (an `instruct` probe by IFEval's checkers,
`forgetwatch.answers.instructions`;
a `comply` probe by the refusal rule, `forgetwatch.answers.refusals`), so their 1→0 and 0→1 are counted like any probe's.
Beyond right and wrong, every generated answer (behaviour probes, and knowledge probes scored by generation) has a
length and either ends its turn or runs to the token limit; `compute_behavior` turns those into drift figures per
group of probes (overall and per category):

Stopping and length are about answers given room to end: harmless requests (`comply`) are generated only as far
as the refusal rule reads (`forgetwatch.scoring.judge.REFUSAL_WINDOW` tokens) and are left out of them.

- `runaway`: of the answers that ended at base, the share that now run to `max_new_tokens` without ending (a 1→0 of
  stopping), with a 95% Wilson interval; `runaway_rate` / `runaway_rate_base`: the share of all answers that run away.
- `length_log_ratio`: the median over probes of log((tokens now + 1) / (tokens at base + 1)) (the +1 keeps an answer
  that collapses to nothing in), with a distribution-free interval of at least 95% for the median (binomial order
  statistics; none below 6 answers); 0 is no change, +0.69 twice as long, -0.69 half as long. Verbosity drifts both
  ways.
- `over_refusal`: of the harmless requests (`comply` probes) answered at base, the share refused now (Wilson
  interval); `over_refusal_rate` / `_base`: the share refused.
- `instruct_forgetting`: of the instruction probes followed at base (strict), the share not followed now;
  `instruct_compliance` / `_base`: the share followed (IFEval's prompt-level strict accuracy).
- One number per behaviour, CapTrack's relative deviation from the base (arXiv 2603.06610):
  `instruct_deviation` = compliance now / base - 1, `runaway_deviation` and `over_refusal_deviation` the same for their
  rates (NaN when the base rate is 0: no relative change from nothing), `length_deviation` = exp(median log ratio) - 1.

Plain Python and NumPy.

Example:
    >>> import numpy as np
    >>> from forgetwatch.scoring.results import ProbeResults
    >>> base, now = ProbeResults.empty(["a", "b"]), ProbeResults.empty(["a", "b"])
    >>> base.n_tokens[:], base.stopped[:] = [20, 40], [1, 1]
    >>> now.n_tokens[:], now.stopped[:] = [40, 256], [1, 0]
    >>> stats = compute_behavior(base, now, ["instruct", "instruct"])["overall"]
    >>> stats.runaway, round(stats.length_log_ratio, 2)
    (0.5, 1.25)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ..scoring.results import CORRECT, ProbeResults
from .metrics import row_scalars, wilson_interval

__all__ = ["BehaviorStats", "compute_behavior", "format_behavior", "behavior_scalars", "SCALARS"]

@dataclass(frozen=True)
class BehaviorStats:
    """Behaviour drift of one group since base (module docstring); NaN where the group has no such probe."""

    n_generated: int
    runaway: float
    runaway_ci: tuple[float, float]
    n_stopped_base: int
    runaway_rate: float
    runaway_rate_base: float
    length_log_ratio: float
    length_log_ratio_ci: tuple[float, float]
    n_length: int
    over_refusal: float
    over_refusal_ci: tuple[float, float]
    n_answered_base: int
    over_refusal_rate: float
    over_refusal_rate_base: float
    instruct_forgetting: float
    instruct_forgetting_ci: tuple[float, float]
    n_followed_base: int
    instruct_compliance: float
    instruct_compliance_base: float

    @property
    def deviations(self) -> dict[str, float]:
        """One number per behaviour: its relative deviation from the base (CapTrack)."""
        return {
            "instruct_deviation": _relative(self.instruct_compliance, self.instruct_compliance_base),
            "runaway_deviation": _relative(self.runaway_rate, self.runaway_rate_base),
            "over_refusal_deviation": _relative(self.over_refusal_rate, self.over_refusal_rate_base),
            "length_deviation": math.expm1(self.length_log_ratio) if not math.isnan(self.length_log_ratio) else math.nan,
        }

    def to_dict(self) -> dict[str, float | int]:
        """The fields flat (intervals as `<name>_ci_low` / `_ci_high`), the deviations, and `length_drift`: how far the
        median log ratio is from 0, measured and at the interval's end nearest 0 (what a budget limits)."""
        d: dict[str, Any] = {}
        for k, v in asdict(self).items():
            if k.endswith("_ci"):
                d[f"{k}_low"], d[f"{k}_high"] = v
            else:
                d[k] = v
        d.update(self.deviations)
        lo, hi = self.length_log_ratio_ci
        d["length_drift"] = abs(self.length_log_ratio)
        d["length_drift_ci_low"] = math.nan if math.isnan(lo) else (0.0 if lo <= 0 <= hi else min(abs(lo), abs(hi)))
        return d

    def scalars(self) -> dict[str, float]:
        """The figures logged as curves; NaNs (no such probe in the group) left out."""
        return behavior_scalars(self.to_dict())


# The figures of a metrics.jsonl row logged as curves: logged name -> row field.
SCALARS = {
    "runaway": "runaway", "runaway_rate": "runaway_rate",
    "length_log_ratio": "length_log_ratio", "length_log_ratio_low": "length_log_ratio_ci_low",
    "length_log_ratio_high": "length_log_ratio_ci_high",
    "over_refusal": "over_refusal", "over_refusal_rate": "over_refusal_rate",
    "instruct_forgetting": "instruct_forgetting", "instruct_compliance": "instruct_compliance",
    "instruct_deviation": "instruct_deviation", "runaway_deviation": "runaway_deviation",
    "over_refusal_deviation": "over_refusal_deviation", "length_deviation": "length_deviation",
}


def behavior_scalars(row: dict[str, Any]) -> dict[str, float]:
    """The behaviour curves of one group from its metrics.jsonl row (`BehaviorStats.to_dict()` merged in); a figure
    that is absent or NaN (no such probe in the group) is left out."""
    return row_scalars(row, SCALARS)


def compute_behavior(
    base: ProbeResults,
    now: ProbeResults,
    categories: Sequence[str] | None = None,
    kinds: Sequence[str] | None = None,
    groups: Mapping[str, np.ndarray] | None = None,
) -> dict[str, BehaviorStats]:
    """Behaviour drift since base overall, per category and per extra group, keyed like `compute_report`.

    Args:
        base, now: results for the same probes in the same order.
        categories: each probe's category.
        kinds: each probe's kind (the over-refusal and instruction figures need it); without, those are NaN.
        groups: further groups by name, each a boolean mask over the probes (`ProbeSet.kind_groups()`).
    """
    if base.ids != now.ids:
        raise ValueError("base and now must hold the same probes in the same order")
    n = len(base)
    kinds_a = np.asarray(kinds if kinds is not None else [""] * n, dtype=object)
    masks = {"overall": np.ones(n, bool)}
    if categories is not None:
        cats = np.asarray(categories, dtype=object)
        for c in dict.fromkeys(categories):
            masks[c] = cats == c
    masks.update({name: np.asarray(m, dtype=bool) for name, m in (groups or {}).items()})
    return {name: _stats(base, now, kinds_a, m) for name, m in masks.items()}


def _stats(base: ProbeResults, now: ProbeResults, kinds: np.ndarray, m: np.ndarray) -> BehaviorStats:
    gen = m & (base.stopped >= 0) & (now.stopped >= 0) & (kinds != "comply")
    stopped_base, stopped_now = base.stopped[gen] == 1, now.stopped[gen] == 1
    runaway, runaway_ci = _share(int((stopped_base & ~stopped_now).sum()), int(stopped_base.sum()))
    both = gen & (base.n_tokens >= 0) & (now.n_tokens >= 0)
    # +1 token on both sides: an answer that collapses to nothing is a length change too (log(1/31) for 30 -> 0)
    ratios = np.log((now.n_tokens[both] + 1.0) / (base.n_tokens[both] + 1.0))
    med, med_ci = _median_ci(ratios)
    comply = m & (kinds == "comply")
    answered_base, answered_now = base.outcome[comply] == CORRECT, now.outcome[comply] == CORRECT
    over, over_ci = _share(int((answered_base & ~answered_now).sum()), int(answered_base.sum()))
    inst = m & (kinds == "instruct")
    followed_base, followed_now = base.outcome[inst] == CORRECT, now.outcome[inst] == CORRECT
    forgot, forgot_ci = _share(int((followed_base & ~followed_now).sum()), int(followed_base.sum()))
    return BehaviorStats(
        n_generated=int(gen.sum()), runaway=runaway, runaway_ci=runaway_ci, n_stopped_base=int(stopped_base.sum()),
        runaway_rate=_mean(~stopped_now), runaway_rate_base=_mean(~stopped_base),
        length_log_ratio=med, length_log_ratio_ci=med_ci, n_length=len(ratios),
        over_refusal=over, over_refusal_ci=over_ci, n_answered_base=int(answered_base.sum()),
        over_refusal_rate=_mean(~answered_now), over_refusal_rate_base=_mean(~answered_base),
        instruct_forgetting=forgot, instruct_forgetting_ci=forgot_ci, n_followed_base=int(followed_base.sum()),
        instruct_compliance=_mean(followed_now), instruct_compliance_base=_mean(followed_base),
    )


def _share(k: int, n: int) -> tuple[float, tuple[float, float]]:
    if n == 0:
        return math.nan, (math.nan, math.nan)
    return k / n, wilson_interval(k, n)


def _mean(x: np.ndarray) -> float:
    return float(x.mean()) if len(x) else math.nan


def _median_ci(x: np.ndarray) -> tuple[float, tuple[float, float]]:
    """The median and a distribution-free (binomial) interval of at least 95% for it: the order statistics x(j) and
    x(n+1-j), with j the largest rank such that P(Binomial(n, 1/2) < j) <= 0.025. Below 6 values no such interval
    exists (even [min, max] covers less than 95%): NaN, so a budget on it never fires on one or two probes.

    Example:
        >>> _median_ci(np.arange(10.0))  # ranks 2 and 9 (1-based): coverage 97.9%
        (4.5, (1.0, 8.0))
        >>> _median_ci(np.arange(5.0))[1]
        (nan, nan)
    """
    if len(x) == 0:
        return math.nan, (math.nan, math.nan)
    s = np.sort(x)
    n = len(s)
    j = _median_rank(n)
    if j == 0:
        return float(np.median(s)), (math.nan, math.nan)
    return float(np.median(s)), (float(s[j - 1]), float(s[n - j]))


def _median_rank(n: int) -> int:
    """The largest 1-based rank j with P(B < j) <= 0.025 for B ~ Binomial(n, 1/2); 0 when even j = 1 is too wide."""
    # each P(B = k) from log-gamma: 0.5 ** n underflows from n = 1075 (the interval then collapsed); a term that
    # underflows here is too small to matter to the sum
    log_all = math.lgamma(n + 1) - n * math.log(2)
    below, j = 0.0, 0  # below = P(B < j + 1) as j grows
    for k in range(n // 2 + 1):
        pmf = math.exp(log_all - math.lgamma(k + 1) - math.lgamma(n - k + 1))
        if below + pmf > 0.025:
            break
        below += pmf
        j = k + 1
    return j


def _relative(now: float, base: float) -> float:
    if math.isnan(now) or math.isnan(base) or base == 0:
        return math.nan
    return now / base - 1


def format_behavior(stats: dict[str, BehaviorStats]) -> str:
    """A plain-text table of behaviour drift by group (`compute_behavior`'s output), for the CLI; groups without a
    generated answer are left out. n/a: no such probe in the group.

    Example:
        >>> from forgetwatch.scoring.results import ProbeResults
        >>> base, now = ProbeResults.empty(["a"]), ProbeResults.empty(["a"])
        >>> base.n_tokens[:], base.stopped[:], now.n_tokens[:], now.stopped[:] = [20], [1], [40], [1]
        >>> print(format_behavior(compute_behavior(base, now)).splitlines()[2])  # doctest: +NORMALIZE_WHITESPACE
        overall  1  n/a  n/a  0.000 (0/1)  0.000  x1.95  n/a  n/a
    """
    def rate(v: float) -> str:
        return "n/a" if math.isnan(v) else f"{v:.3f}"

    def share(v: float, k_of: int) -> str:
        return "n/a" if math.isnan(v) else f"{v:.3f} ({round(v * k_of)}/{k_of})"

    head = ("group", "generated", "instr. followed", "1→0 of followed", "new runaways", "runaway rate", "length ratio",
            "refused harmless", "1→0 of answered")
    rows = [head]
    for name, s in stats.items():
        if s.n_generated == 0 and s.n_answered_base == 0 and math.isnan(s.over_refusal_rate):
            continue
        lo, hi = s.length_log_ratio_ci
        ratio = "n/a" if math.isnan(s.length_log_ratio) else f"x{math.exp(s.length_log_ratio):.2f}"
        if not math.isnan(lo):  # no interval below 6 answers
            ratio += f" [{math.exp(lo):.2f}, {math.exp(hi):.2f}]"
        rows.append((name, str(s.n_generated), rate(s.instruct_compliance), share(s.instruct_forgetting, s.n_followed_base),
                     share(s.runaway, s.n_stopped_base), rate(s.runaway_rate), ratio, rate(s.over_refusal_rate),
                     share(s.over_refusal, s.n_answered_base)))
    widths = [max(len(r[j]) for r in rows) for j in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
