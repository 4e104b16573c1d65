"""Continuous drift since the base model, which moves before probes flip: margins, KL over the options, at-risk probes.

A multiple-choice probe flips when its margin (gold score minus the best wrong option's) crosses zero; the margin
moves long before. Per group of probes (overall and per category) this module computes:

- `margin_change`: the mean change of the margin since base, over multiple-choice probes scored with margins, with a
  95% normal interval (mean ± 1.96·sd/√n);
- `kl`: KL(base ‖ now) between the softmax over each probe's option scores at base and now (under the scoring
  mode's normalisation), averaged over probes;
- `gold_logprob_change`: for short answers scored with a gold log-probability (`short_mode="greedy_match"`), the
  mean change of the best accepted answer's log-probability;
- `at_risk`: probes correct at base and still correct now whose margin is below `margin_below` nats (2.0), or, when
  `drop_by` is set, has fallen by at least that many nats since base: the ones likely to be forgotten next.

Plain NumPy, no torch.

Example:
    >>> import numpy as np
    >>> from forgetwatch.scoring.results import ProbeResults
    >>> base, now = ProbeResults.empty(["a", "b"]), ProbeResults.empty(["a", "b"])
    >>> base.outcome[:] = now.outcome[:] = 1
    >>> base.margin[:], now.margin[:] = [2.0, 3.0], [0.2, 2.5]
    >>> d = compute_drift(base, now)["overall"]
    >>> round(d.margin_change, 2), d.at_risk
    (-1.15, 1)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from ..scoring.results import CORRECT, ProbeResults

__all__ = ["DriftStats", "RiskRule", "compute_drift", "option_kl", "at_risk_mask"]

_Z95 = 1.959963984540054


@dataclass(frozen=True)
class RiskRule:
    """When a probe that is still right counts as at risk: margin under `margin_below`, or (optionally) fallen by
    `drop_by` nats since base.

    The defaults were chosen on a calibration run and checked on others (benchmarks/RESULTS.md, "Early warning"): the
    current margin predicts a flip at the next evaluation (AUC about 0.8), its drop since base does not (about 0.5), so
    the drop rule is off unless asked for."""

    margin_below: float = 2.0
    drop_by: float | None = None

    def __post_init__(self) -> None:
        for name in ("margin_below", "drop_by"):
            v = getattr(self, name)
            if v is None and name == "drop_by":
                continue
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
                raise ValueError(f"`{name}` must be a non-negative number of nats, got {v!r}")


@dataclass(frozen=True)
class DriftStats:
    """Drift of one group of probes since base (see the module docstring); NaN where no probe provides the figure."""

    n_margin: int
    margin_change: float
    margin_change_ci: tuple[float, float]
    n_kl: int
    kl: float
    n_gold: int
    gold_logprob_change: float
    at_risk: int
    n_at_risk_eligible: int  # correct at base and now, with a margin: the probes the at-risk rule can mark

    def to_dict(self) -> dict[str, float | int]:
        """The fields flat, as `ForgettingMetrics.to_dict` (the interval as `margin_change_ci_low` / `_high`), plus
        `margin_drop` (minus the margin change: what a budget limits from above)."""
        d = asdict(self)
        d["margin_change_ci_low"], d["margin_change_ci_high"] = d.pop("margin_change_ci")
        d["margin_drop"] = -self.margin_change
        return d

    def scalars(self) -> dict[str, float]:
        """The figures logged as curves (NaNs left out: a group without margins logs none)."""
        out = {
            "margin_change": self.margin_change, "margin_change_low": self.margin_change_ci[0],
            "margin_change_high": self.margin_change_ci[1], "kl": self.kl,
            "gold_logprob_change": self.gold_logprob_change,
        }
        out = {k: float(v) for k, v in out.items() if not math.isnan(v)}
        if self.n_at_risk_eligible:
            out["at_risk"] = float(self.at_risk)
        return out


def option_kl(base_scores: Sequence[np.ndarray], now_scores: Sequence[np.ndarray]) -> np.ndarray:
    """KL(base ‖ now) per probe between the softmax distributions over its options; NaN without scores on either side.

    Example:
        >>> float(option_kl([np.array([0.0, 0.0])], [np.array([0.0, 0.0])])[0])
        0.0
    """
    out = np.full(len(base_scores), np.nan)
    for i, (b, n) in enumerate(zip(base_scores, now_scores, strict=True)):
        if len(b) < 2 or len(b) != len(n):
            continue
        log_p, log_q = _log_softmax(np.asarray(b, np.float64)), _log_softmax(np.asarray(n, np.float64))
        if not (np.all(np.isfinite(log_p)) and np.all(np.isfinite(log_q))):
            continue
        out[i] = max(float(np.sum(np.exp(log_p) * (log_p - log_q))), 0.0)  # >= 0; clip rounding below zero
    return out


def at_risk_mask(base: ProbeResults, now: ProbeResults, rule: RiskRule = RiskRule()) -> np.ndarray:
    """Probes right at base and now whose margin is under `rule.margin_below` or fell by `rule.drop_by` since base."""
    eligible = _eligible(base, now)
    with np.errstate(invalid="ignore"):
        risky = now.margin < rule.margin_below
        if rule.drop_by is not None:
            risky |= base.margin - now.margin >= rule.drop_by
    return eligible & risky


def compute_drift(base: ProbeResults, now: ProbeResults, categories: Sequence[str] | None = None,
                  rule: RiskRule = RiskRule(), groups: Mapping[str, np.ndarray] | None = None) -> dict[str, DriftStats]:
    """Drift since base overall, per category and per extra group (boolean masks by name), keyed like
    `compute_report`."""
    if base.ids != now.ids:
        raise ValueError("base and now must hold the same probes in the same order")
    dm = (now.margin.astype(np.float64) - base.margin.astype(np.float64))
    kl = option_kl(base.option_scores, now.option_scores)
    dg = now.gold_logprob.astype(np.float64) - base.gold_logprob.astype(np.float64)
    short = np.isnan(base.margin) & np.isnan(now.margin)  # short answers (and generated mcq) carry no margin
    dg[~short] = np.nan
    risk, eligible = at_risk_mask(base, now, rule), _eligible(base, now)
    masks = {"overall": np.ones(len(base), bool)}
    if categories is not None:
        cats = np.asarray(categories, dtype=object)
        for c in dict.fromkeys(categories):
            masks[c] = cats == c
    masks.update({name: np.asarray(m, dtype=bool) for name, m in (groups or {}).items()})
    return {name: _stats(dm[m], kl[m], dg[m], int(risk[m].sum()), int(eligible[m].sum())) for name, m in masks.items()}


def _eligible(base: ProbeResults, now: ProbeResults) -> np.ndarray:
    return (base.outcome == CORRECT) & (now.outcome == CORRECT) & ~np.isnan(now.margin) & ~np.isnan(base.margin)


def _stats(dm: np.ndarray, kl: np.ndarray, dg: np.ndarray, at_risk: int, eligible: int) -> DriftStats:
    dm, kl, dg = dm[np.isfinite(dm)], kl[np.isfinite(kl)], dg[np.isfinite(dg)]
    mean = float(dm.mean()) if len(dm) else math.nan
    if len(dm) >= 2:
        half = _Z95 * float(dm.std(ddof=1)) / math.sqrt(len(dm))
        ci = (mean - half, mean + half)
    else:
        ci = (mean, mean)
    return DriftStats(
        n_margin=len(dm), margin_change=mean, margin_change_ci=ci,
        n_kl=len(kl), kl=float(kl.mean()) if len(kl) else math.nan,
        n_gold=len(dg), gold_logprob_change=float(dg.mean()) if len(dg) else math.nan,
        at_risk=at_risk, n_at_risk_eligible=eligible,
    )


def _log_softmax(x: np.ndarray) -> np.ndarray:
    m = np.max(x)
    return x - m - np.log(np.sum(np.exp(x - m)))
