"""Robustness figures (issue 29): each probe against its own base, over its variants (`forgetwatch.robustness`).

Inputs are per-probe, per-variant outcomes, variant 0 the probe itself: `right[i, v]` is True when probe i's variant v
is answered right, NaN-free booleans (a probe with an invalid or non-finite variant counts it wrong, as plain
accuracy does).

- `robust_accuracy`: share of probes right in every variant.
- `robust_forgetting`: of the probes robust at base, the share not robust now (1→0 of robustness).
- `consistency`: mean share of a probe's variants answered right; its change since base.
- `fragile`: probes robust at base, still right in their original form, but no longer in every variant: half
  forgotten, invisible to plain 1→0 (`fragile_probes` says which).
- `position_bias` (lettered modes only): total variation distance between the positions the model chose and the
  positions of the gold answers, per number of options, averaged over option counts weighted by answers; its change
  since base. Measured on the pure option shifts of probes that have all of them (`VariantOutcomes.balanced`): there
  the gold answer stands at every position equally often, so always choosing one letter shows as bias, while a model
  that is right or guesses uniformly is at 0.

Example:
    >>> import numpy as np
    >>> base = np.array([[1, 1, 1], [1, 0, 1], [1, 1, 1]], bool)
    >>> now = np.array([[1, 0, 1], [1, 0, 1], [1, 1, 1]], bool)
    >>> f = robust_figures(base, now)
    >>> f["robust_accuracy_pre"], f["robust_accuracy_post"], f["robust_forgetting"], f["fragile"]
    (0.6666666666666666, 0.3333333333333333, 0.5, 1)
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["robust_figures", "position_bias", "fragile_probes"]


def robust_figures(base: np.ndarray, now: np.ndarray) -> dict[str, Any]:
    """Robust accuracy before and after, robust forgetting, consistency and its change, and the fragile count, for
    one group of probes (`base` and `now`: [probes, variants] booleans, variant 0 the probe itself)."""
    base, now = np.asarray(base, bool), np.asarray(now, bool)
    if base.shape != now.shape or base.ndim != 2:
        raise ValueError(f"base and now must be [probes, variants] of one shape, got {base.shape} and {now.shape}")
    n = base.shape[0]
    robust_pre, robust_post = base.all(1), now.all(1)
    held = int(robust_pre.sum())
    lost = int((robust_pre & ~robust_post).sum())
    consistency_pre = float(base.mean()) if n else float("nan")
    consistency_post = float(now.mean()) if n else float("nan")
    return {
        "n": n,
        "variants": base.shape[1],
        "robust_pre": held,
        "robust_post": int(robust_post.sum()),
        "robust_lost": lost,
        "robust_accuracy_pre": held / n if n else float("nan"),
        "robust_accuracy_post": float(robust_post.mean()) if n else float("nan"),
        "robust_forgetting": lost / held if held else float("nan"),
        "consistency_pre": consistency_pre,
        "consistency_post": consistency_post,
        "consistency_change": consistency_post - consistency_pre,
        "fragile": int(fragile_probes(base, now).sum()),
    }


def fragile_probes(base: np.ndarray, now: np.ndarray) -> np.ndarray:
    """Per probe: robust at base, right in its original form now, not right in every variant now."""
    base, now = np.asarray(base, bool), np.asarray(now, bool)
    return base.all(1) & now[:, 0] & ~now.all(1)


def position_bias(chosen: np.ndarray, gold: np.ndarray, num_choices: np.ndarray, mask: np.ndarray | None = None) -> float:
    """Total variation distance between chosen and gold positions, per option count, weighted by answers.

    `chosen`, `gold`: [probes, variants] positions (chosen -1 where the model gave no valid letter: left out);
    `num_choices`: [probes]; `mask`: [probes, variants], the answers to count (`VariantOutcomes.balanced`). NaN when
    no answer is valid.

    Example:
        >>> import numpy as np
        >>> position_bias(np.array([[0, 0], [0, 0]]), np.array([[0, 1], [1, 0]]), np.array([2, 2]))  # always "A"
        0.5
    """
    chosen, gold = np.asarray(chosen), np.asarray(gold)
    num_choices = np.asarray(num_choices)
    mask = np.ones(chosen.shape, bool) if mask is None else np.asarray(mask, bool)
    total, weight = 0.0, 0
    for k in np.unique(num_choices[num_choices > 0]):
        rows = num_choices == k
        c, g = chosen[rows].ravel(), gold[rows].ravel()
        valid = (c >= 0) & mask[rows].ravel()
        m = int(valid.sum())
        if not m:
            continue
        pc = np.bincount(c[valid], minlength=int(k)) / m
        pg = np.bincount(g[valid], minlength=int(k)) / m
        total += 0.5 * float(np.abs(pc - pg).sum()) * m
        weight += m
    return total / weight if weight else float("nan")
