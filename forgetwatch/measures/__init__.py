"""Measures: the figures computed from per-probe results against the base, in plain Python and NumPy.

`metrics.py` counts the flips (forgetting F, backward transfer BT, chance-adjusted, intervals); `drift.py` the
continuous drift that moves before probes flip (margins, KL over the options, at-risk probes); `behavior.py` the
behaviour drift (runaways, length, over-refusal, instruction compliance); `robustness.py` the figures over a probe's
variants; `noise.py` the precision noise floor; `budgets.py` which limits an evaluation trips; `partial.py` which probes
a time-budgeted evaluation scores and what its estimates are worth; `samples.py` the same comparison over other
harnesses' per-sample outputs. A new figure is a function here that takes results and returns numbers.

Example:
    >>> import numpy as np
    >>> from forgetwatch.measures import compute_metrics
    >>> m = compute_metrics(np.array([1, 1, 0, 0]), np.array([0, 1, 1, 0]), np.array([4, 4, 4, 4]))
    >>> m.forgetting, m.backward_transfer
    (0.25, 0.25)
"""

from .budgets import Budget
from .drift import DriftStats, RiskRule, compute_drift
from .metrics import ForgettingMetrics, compute_metrics, compute_report, wilson_interval
from .noise import NoiseFloor

__all__ = ["Budget", "DriftStats", "ForgettingMetrics", "NoiseFloor", "RiskRule", "compute_drift", "compute_metrics",
           "compute_report", "wilson_interval"]
