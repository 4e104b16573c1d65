"""The precision noise floor: probes whose correctness at base depends on the numeric precision, not on knowledge.

A near-tie between two options can flip when bf16 autocast replaces fp32 arithmetic. Scoring the base model twice,
in the training precision (the cache) and in fp32 without autocast (the reference), finds those probes: a flip of
one of them during training says little. `NoiseFloor` holds them, and the smallest forgetting distinguishable from
what precision alone could produce for the probe count in use. Plain NumPy.

Example:
    >>> import numpy as np
    >>> floor = NoiseFloor.from_outcomes(np.array([1, 1, 0, 1]), np.array([1, 0, 0, 1]))
    >>> floor.count, floor.mask.tolist()
    (1, [False, True, False, False])
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..scoring.results import CORRECT
from .metrics import wilson_interval

__all__ = ["NoiseFloor", "min_detectable_forgetting", "noise_floor"]


@dataclass(frozen=True)
class NoiseFloor:
    mask: np.ndarray  # probes right in one precision and wrong in the other, at base

    @classmethod
    def from_outcomes(cls, training: np.ndarray, reference: np.ndarray) -> NoiseFloor:
        return cls((np.asarray(training) == CORRECT) != (np.asarray(reference) == CORRECT))

    @property
    def count(self) -> int:
        return int(self.mask.sum())

    def min_detectable(self) -> float:
        return min_detectable_forgetting(len(self.mask), self.count)


def min_detectable_forgetting(n: int, noise_count: int = 0) -> float:
    """The smallest forgetting F = x/n whose Wilson 95% lower bound is above `noise_count / n`, the share of probes that
    precision alone could flip; with no such probe, 1/n (any flip is then distinguishable from zero).

    Example:
        >>> min_detectable_forgetting(200, 0), min_detectable_forgetting(200, 4)
        (0.005, 0.04)
    """
    if n <= 0:
        raise ValueError(f"`n` must be positive, got {n}")
    floor = noise_count / n
    for x in range(1, n + 1):
        if wilson_interval(x, n)[0] > floor:
            return x / n
    return 1.0


def noise_floor(cache, precision: str) -> NoiseFloor | None:
    """The noise floor of a base cache (`BaseCache`): from its fp32 reference; empty when it was scored in fp32 (the
    reference would be itself); None when unknown (another precision, no reference kept)."""
    if cache.reference is not None:
        return NoiseFloor.from_outcomes(cache.results.outcome, cache.reference.outcome)
    if precision == "float32":
        return NoiseFloor(np.zeros(len(cache.results), bool))
    return None
