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

import itertools
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from ..options import REPLAY_STRATEGIES

__all__ = ["STRATEGIES", "ReplayMixer", "category_weights", "check_ratio", "check_pool"]

STRATEGIES = REPLAY_STRATEGIES  # declared with forgetwatch_replay_strategy (forgetwatch.options)


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


class ReplayMixer:
    """The replay stream: training examples with pool examples mixed in at `ratio`, drawn by category weights.

    Position n of the stream is a pool example when the Bresenham rule puts one there (the share of replay is
    `ratio` on every prefix, within one example, and on every rank's slice when `set_layout` says how the stream
    is sliced between ranks), and a training example otherwise (one pass over a permutation per epoch; the
    stream never ends, so the trainer needs `max_steps`). Every draw depends only on (seed, position) and on
    the weights in force at that position, so the stream is the same whenever it is read again (TRL reads its
    first rows while preparing the dataset, a resumed run reads and discards what it already trained on).

    The weights change when the monitor publishes an evaluation (`publish`): they take effect after the last position
    read so far, and the switch is kept in `schedule` as (position, step, weights). The callback writes the schedule
    into its record at that step (before a checkpoint is saved) and hands it back on resume (`restore`), so that a
    resumed run draws exactly what the uninterrupted run drew, however far ahead the data pipeline reads.

    Args:
        train: the training examples (dicts with the same keys).
        pool: the replay examples by category (dicts with at least the keys of `train`).
        ratio: the replay share of the stream, in [0, 1).
        strategy: "closed_loop" (weights follow the monitor's per-category forgetting) or "uniform".
        floor: the share spread evenly over categories in closed loop.
        seed: the seed of every draw.
        fill: columns the pool has and the training rows lack, with the value the training rows get.

    Example:
        >>> mixer = ReplayMixer([{"text": "t0"}, {"text": "t1"}], {"a": [{"text": "a0"}], "b": [{"text": "b0"}]},
        ...                     ratio=0.5, seed=0)
        >>> [row["text"] for row in itertools.islice(mixer.rows(), 4)]  # every second example is replay
        ['t0', 'b0', 't1', 'a0']
        >>> mixer.publish(10, {"a": 0.2, "b": 0.0})  # the monitor saw category a forget: a gets 0.1/2 + 0.9
        >>> mixer.weights
        {'a': 0.95, 'b': 0.05}
    """

    def __init__(self, train: Sequence[Mapping[str, Any]], pool: Mapping[str, Sequence[Mapping[str, Any]]], ratio: float,
                 strategy: str = "closed_loop", floor: float = 0.1, seed: int = 0, fill: Mapping[str, Any] | None = None):
        if strategy not in STRATEGIES:
            raise ValueError(f"`strategy` must be one of {', '.join(STRATEGIES)}; got {strategy!r}")
        if not train:
            raise ValueError("the training dataset is empty")
        self.train, self.ratio, self.strategy, self.floor, self.seed = train, check_ratio(ratio), strategy, floor, seed
        self.fill = dict(fill or {})
        self.pool = {c: list(rows) for c, rows in pool.items() if rows}
        if ratio > 0 and not self.pool:
            raise ValueError("the replay pool is empty")
        self.categories = list(self.pool)
        self._initial = category_weights(dict.fromkeys(self.categories, 0.0), floor, strategy) if self.categories else {}
        self.weights = self._initial  # the latest published
        # (position, step, weights): the weights in force from that position on
        self.schedule: list[tuple[int, int, dict[str, float]]] = []
        self._read = -1  # the furthest position read so far
        self._slice, self._world = 1, 1

    # -- the monitor's side ------------------------------------------------------------------------------------
    def set_layout(self, slice_size: int, world_size: int) -> None:
        """The stream is read by `world_size` ranks, each taking `slice_size` consecutive examples in turn: the replay
        share is then kept on each rank's own examples (with one rank, any layout is the same)."""
        self._slice, self._world = max(1, int(slice_size)), max(1, int(world_size))

    def publish(self, step: int, forgetting: Mapping[str, float]) -> None:
        """The monitor's evaluation at `step`: each category's forgetting. The new weights hold from the position after
        the last one read (what the data pipeline already read keeps the weights it was drawn with); the switch is in
        `schedule` at once, so a checkpoint saved after this evaluation can carry it."""
        if self.strategy == "uniform" or not self.categories:
            return
        weights = category_weights({c: forgetting.get(c, 0.0) for c in self.categories}, self.floor, self.strategy)
        self.weights = {c: round(w, 12) for c, w in weights.items()}
        # after the last switch too: a stream read again from its start (a resume skipping what it trained on) has not
        # caught up yet with the positions already switched
        position = max(self._read + 1, self.schedule[-1][0] + 1 if self.schedule else 0)
        self.schedule.append((position, int(step), self.weights))

    def restore(self, schedule: Sequence[Sequence[Any]], upto_step: int | None = None) -> None:
        """Take back a schedule written by an earlier run, keeping switches of evaluations up to `upto_step` (a resume
        recomputes what came after its checkpoint); the weights in force are the last kept."""
        kept = [(int(p), int(s), dict(w)) for p, s, w in schedule if upto_step is None or int(s) <= upto_step]
        self.schedule = kept
        if kept:
            self.weights = dict(kept[-1][2])

    def reset(self) -> None:
        """Forget every switch (a fresh run)."""
        self.restore([])
        self.weights = self._initial

    # -- the stream --------------------------------------------------------------------------------------------
    def is_replay(self, n: int) -> bool:
        """Whether position n holds a replay example: every rank's m-th example is replay when floor((m+1)·ratio)
        passes an integer, so each rank gets its share."""
        block, offset = divmod(n, self._slice * self._world)
        m = block * self._slice + offset % self._slice  # this example's index among its rank's examples
        return math.floor((m + 1) * self.ratio) > math.floor(m * self.ratio)

    def _weights_at(self, n: int) -> dict[str, float]:
        for p, _, w in reversed(self.schedule):  # a position read again gets the weights it had the first time
            if p <= n:
                return w
        return self._initial

    def draw(self, n: int) -> tuple[str, int]:
        """(category, index in the pool) of the replay example at position n."""
        weights = self._weights_at(n)
        rng = np.random.default_rng([self.seed, n, 1])
        cats = self.categories
        p = np.array([weights.get(c, 0.0) for c in cats])
        cat = cats[int(rng.choice(len(cats), p=p / p.sum()))]
        return cat, int(rng.integers(len(self.pool[cat])))

    def rows(self) -> Iterator[dict[str, Any]]:
        """The stream from position 0, without end."""
        n_train, train_seen, perm = len(self.train), 0, None
        for n in itertools.count():
            self._read = max(self._read, n)
            if self.ratio > 0 and self.is_replay(n):
                cat, i = self.draw(n)
                yield dict(self.pool[cat][i])
                continue
            epoch, k = divmod(train_seen, n_train)
            if k == 0 or perm is None:
                perm = np.random.default_rng([self.seed, epoch, 0]).permutation(n_train)
            train_seen += 1
            yield {**self.train[int(perm[k])], **self.fill}
