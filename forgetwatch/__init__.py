"""forgetwatch: see what your model forgets, live, while you post-train it.

Example:
    >>> from forgetwatch import ProbeSet, score_probes, compute_report
    >>> probes = load_probes("arc_easy,mmlu", per_suite=100)  # doctest: +SKIP
"""

from ._lazy import lazy
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
from .measures.budgets import Budget
from .measures.drift import DriftStats, RiskRule, compute_drift
from .measures.metrics import ForgettingMetrics, compute_metrics, compute_report
from .measures.noise import NoiseFloor
from .options import ForgetWatchArguments
from .probes.probe_set import Probe, ProbeSet
from .probes.suites import load_probes
from .record.cache import BaseCache, make_cache_key
from .record.store import load_record
from .scoring.results import ProbeResults
from .versions import __version__ as __version__  # noqa: F401  (the package's release, `forgetwatch.__version__`)

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
__getattr__, __dir__ = lazy(__name__, globals(), {
    "ForgetWatchCallback": ".run.callback",
    "ScoringConfig": ".scoring",
    "score_probes": ".scoring.score",
})
