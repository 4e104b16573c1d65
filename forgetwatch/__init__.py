"""forgetwatch: see what your model forgets, live, while you post-train it.

Example:
    >>> from forgetwatch import ProbeSet, score_probes, compute_report
    >>> probes = load_probes("arc_easy,mmlu", per_suite=100)  # doctest: +SKIP
"""

from .budgets import Budget
from .cache import BaseCache, make_cache_key
from .drift import DriftStats, RiskRule, compute_drift
from .errors import (
    CacheFormatError,
    CacheMismatchError,
    ConfigKeyError,
    EngineUnavailableError,
    ForgetWatchError,
    InstructionFormatError,
    InterpolationError,
    ProbeFormatError,
    ProbeSetChangedError,
    ProbeSetError,
    RecordError,
    RecordInUseError,
    RecordUnwritableError,
    RecordWriteError,
    RobustnessError,
    SamplesFormatError,
    SidecarError,
)
from .metrics import ForgettingMetrics, compute_metrics, compute_report
from .noise import NoiseFloor
from .options import ForgetWatchArguments
from .probes import Probe, ProbeSet
from .record import load_record
from .results import ProbeResults
from .suites import load_probes

__version__ = "0.1.0"

__all__ = [
    "BaseCache",
    "Budget",
    "CacheFormatError",
    "CacheMismatchError",
    "ConfigKeyError",
    "EngineUnavailableError",
    "DriftStats",
    "ForgetWatchArguments",
    "ForgetWatchCallback",
    "ForgetWatchError",
    "ForgettingMetrics",
    "InstructionFormatError",
    "InterpolationError",
    "NoiseFloor",
    "Probe",
    "ProbeFormatError",
    "ProbeResults",
    "ProbeSet",
    "ProbeSetChangedError",
    "ProbeSetError",
    "RecordError",
    "RecordInUseError",
    "RecordUnwritableError",
    "RecordWriteError",
    "RiskRule",
    "RobustnessError",
    "SamplesFormatError",
    "ScoringConfig",
    "SidecarError",
    "compute_drift",
    "compute_metrics",
    "compute_report",
    "load_probes",
    "load_record",
    "make_cache_key",
    "score_probes",
]

# torch-backed names load on first use, so `import forgetwatch` stays light (no torch, no trl, no wandb).
_LAZY = {
    "ForgetWatchCallback": ".callback",
    "ScoringConfig": ".scoring",
    "score_probes": ".scoring",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module 'forgetwatch' has no attribute {name!r}")
