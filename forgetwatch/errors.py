"""Every error forgetwatch raises on purpose, under one root, so that users catch one type.

The tree (each error also keeps the builtin base it had before the root existed, in brackets, so that
`except ValueError` code keeps working):

* ForgetWatchError
  + ProbeFormatError        [ValueError]       a probe file or record is malformed             (probes)
  + InstructionFormatError  [ValueError]       a probe's instruction ids or arguments          (instructions)
  + ProbeSetError           [ValueError]       the probe set cannot be scored with this model  (requests, scoring)
  + EngineUnavailableError  [ValueError]       the engine asked for cannot serve this model     (engines.vllm)
  + RobustnessError         [ValueError]       a robustness setting these probes cannot take   (robustness)
  + CacheMismatchError      [ValueError]       the base cache was made for something else      (cache)
  + CacheFormatError        [ValueError]       a damaged base cache file                       (cache)
  + RecordError             [ValueError]       a record file forgetwatch cannot read           (record)
  + RecordInUseError        [BlockingIOError]  another live process writes this record         (lock)
  + RecordUnwritableError   [OSError]          the record's directory cannot be written        (lock)
  + ProbeSetChangedError    [ValueError]       a run's probes are not the record's pinned set  (segments)
  + RecordWriteError        [OSError]          an evaluation the record could not hold         (monitor)
  + SidecarError            [ValueError]       an output directory that cannot be watched      (watch)
  + InterpolationError      [ValueError]       models or settings that cannot be interpolated  (interpolate)
  + SamplesFormatError      [ValueError]       a per-sample evaluation file, unknown or broken (samples)
  + ConfigKeyError          [ValueError]       a front-end config's `forgetwatch_*` key        (integrations.config)

Each is importable from here, from `forgetwatch`, and from the module that raises it (in parentheses above).
This module imports nothing from forgetwatch, so any module can import it.

Example:
    >>> import forgetwatch
    >>> try:
    ...     forgetwatch.Probe.from_dict({"id": "q1", "kind": "mcq"})
    ... except forgetwatch.ForgetWatchError as e:  # any of the above; `except forgetwatch.ProbeFormatError` for this one
    ...     print(f"{type(e).__name__}: {e}")
    ProbeFormatError: probe: field `question`: missing (every probe needs `id`, `kind` and `question`)
"""

from __future__ import annotations

__all__ = [
    "CacheFormatError",
    "CacheMismatchError",
    "ConfigKeyError",
    "EngineUnavailableError",
    "ForgetWatchError",
    "InstructionFormatError",
    "InterpolationError",
    "ProbeFormatError",
    "ProbeSetChangedError",
    "ProbeSetError",
    "RecordError",
    "RecordInUseError",
    "RecordUnwritableError",
    "RecordWriteError",
    "RobustnessError",
    "SamplesFormatError",
    "SidecarError",
]


class ForgetWatchError(Exception):
    """The root of forgetwatch's errors: `except ForgetWatchError` catches every error forgetwatch raises on purpose."""


# -- probes ----------------------------------------------------------------------------------------------------------


class ProbeFormatError(ForgetWatchError, ValueError):
    """A probe file or record is malformed; the message names where and what to fix."""


class InstructionFormatError(ForgetWatchError, ValueError):
    """A probe's instruction ids or arguments are wrong; the message names where and the field (`ProbeSet` loading
    turns it into a `ProbeFormatError`)."""


# -- scoring ---------------------------------------------------------------------------------------------------------


class ProbeSetError(ForgetWatchError, ValueError):
    """The probe set cannot be scored with this model at all (not one checkpoint's problem)."""


class EngineUnavailableError(ForgetWatchError, ValueError):
    """The engine asked for (vLLM, say) cannot serve here: not installed, or a model it cannot load (an unmerged
    LoRA adapter, a model in memory only, autocast); the message says what to do instead."""


class RobustnessError(ForgetWatchError, ValueError):
    """A robustness setting that cannot be applied to these probes (says what to change)."""


# -- the base cache --------------------------------------------------------------------------------------------------


class CacheMismatchError(ForgetWatchError, ValueError):
    """The cache was made for another model, probe set or scoring config."""


class CacheFormatError(ForgetWatchError, ValueError):
    """A cache file that is damaged or was not written by forgetwatch: the message names the file, column and row."""


# -- the record ------------------------------------------------------------------------------------------------------


class RecordError(ForgetWatchError, ValueError):
    """A record file that cannot be read as forgetwatch wrote it; the message names the file and what is wrong."""


class RecordInUseError(ForgetWatchError, BlockingIOError):
    """Another live process writes this record; the message names it and says what to do."""


class RecordUnwritableError(ForgetWatchError, OSError):
    """The directory a record is to be written in cannot be written (read-only file system, permission denied); the
    message names it and the way on. Readers (`forgetwatch report`) never raise it."""


class ProbeSetChangedError(ForgetWatchError, ValueError):
    """A resumed run or a watcher has other probes than the record's evaluations were scored on; the message names the
    record, what changed, and the two ways on (a new output dir, or a new segment of the record)."""


class RecordWriteError(ForgetWatchError, OSError):
    """An evaluation could not be written to the record (a full disk, a folder made read-only or immutable, a link to a
    disk that went away): the message names the step, the file, the OS error and what to do."""


# -- tools: watch, interpolate, compare ------------------------------------------------------------------------------


class SidecarError(ForgetWatchError, ValueError):
    """The output directory cannot be watched; the message says why and what to do."""


class InterpolationError(ForgetWatchError, ValueError):
    """Two models that cannot be interpolated, or a setting that cannot be applied: the message says what to change."""


class SamplesFormatError(ForgetWatchError, ValueError):
    """A per-sample file is of an unknown format or malformed; the message names the file, line and field."""


# -- front ends (Axolotl, LLaMA-Factory) -----------------------------------------------------------------------------


class ConfigKeyError(ForgetWatchError, ValueError):
    """A `forgetwatch_*` key of a front-end's config is unknown, of the wrong type, or refused; the message says which."""
