"""Replay mixing, the pure parts: how much of each category to replay, and what may be replayed at all.

Closed-loop replay samples a pool of held-out examples by category in proportion to what the monitor measured at its
last evaluation (categories that forget get more), with a floor so that no category starves; uniform replay (the
control) weighs every category alike. The pool must be disjoint from the monitored probes: training on a monitored
probe would repair the measured forgetting trivially. Plain Python and NumPy.

Example:
    >>> w = category_weights({"arc_easy": 0.10, "sciq": 0.0, "piqa": 0.02}, floor=0.1)
    >>> {c: round(v, 3) for c, v in w.items()}  # 0.1 spread evenly, 0.9 in proportion to 0.10 : 0 : 0.02
    {'arc_easy': 0.783, 'sciq': 0.033, 'piqa': 0.183}
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

__all__ = ["STRATEGIES", "category_weights", "check_ratio", "check_pool"]

STRATEGIES = ("closed_loop", "uniform")


def category_weights(forgetting: Mapping[str, float], floor: float = 0.1, strategy: str = "closed_loop") -> dict[str, float]:
    """Sampling weights per category, summing to 1.

    Args:
        forgetting: each category's forgetting at the last evaluation (a rate; NaN or negative counts as 0).
        floor: the share of the replay spread evenly over all categories whatever they measured, so none starves.
        strategy: "closed_loop" (the rest in proportion to forgetting) or "uniform" (even weights).

    With nothing forgotten anywhere yet, closed loop is uniform.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"`strategy` must be one of {', '.join(STRATEGIES)}; got {strategy!r}")
    if not 0 <= floor <= 1:
        raise ValueError(f"`floor` must be in [0, 1], got {floor!r}")
    cats = list(forgetting)
    if not cats:
        raise ValueError("no categories to weigh")
    even = 1 / len(cats)
    scores = {c: v if isinstance(v, (int, float)) and not math.isnan(v) and v > 0 else 0.0 for c, v in forgetting.items()}
    total = sum(scores.values())
    if strategy == "uniform" or total == 0:
        return {c: even for c in cats}
    return {c: floor * even + (1 - floor) * scores[c] / total for c in cats}


def check_ratio(ratio: float) -> float:
    """The share of replay examples in what is trained on: in [0, 1)."""
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 <= ratio < 1:
        raise ValueError(f"`ratio` (the replay share of the training examples) must be in [0, 1), got {ratio!r}")
    return float(ratio)


def check_pool(pool_ids: Iterable[str], monitored_ids: Iterable[str], categories: Mapping[str, int] | None = None,
               wanted: Iterable[str] = ()) -> None:
    """Refuse a pool that shares ids with the monitored probes (naming them), or that has nothing for a wanted category.

    Args:
        pool_ids: the replay pool's example ids.
        monitored_ids: the monitored probes' ids.
        categories: the pool's example count per category.
        wanted: categories the loop may ask for (the monitored probes' categories).
    """
    overlap = sorted(set(pool_ids) & set(monitored_ids))
    if overlap:
        shown = ", ".join(overlap[:10]) + (f" and {len(overlap) - 10} more" if len(overlap) > 10 else "")
        raise ValueError(f"the replay pool holds {len(overlap)} monitored probes ({shown}): training on them would repair "
                         "the measured forgetting trivially; hold them out of the pool (by id)")
    if categories is not None:
        empty = [c for c in wanted if not categories.get(c)]
        if empty:
            raise ValueError(f"the replay pool has no example for categories {', '.join(empty)} that the monitor measures; "
                             "add examples for them or leave them out of the probe set")
