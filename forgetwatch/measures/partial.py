"""Probing within a time budget (`forgetwatch_max_share`): what a partial evaluation scores, and what its figures are
worth.

With `max_share=0.1` the callback keeps probing to about a tenth of `train()`, averaged over the run. Steps 0 and the
last, and every step the Trainer saves a checkpoint at, are full passes, exact as without the option. The evaluations
between them score a part of the probes, chosen by a probability design, so that the figures stay honest:

- **certain**: those that flipped at the last evaluation (or whose latest result was not finite); those *due*, not scored in
  the last K-1 evaluations, so
  every probe is scored at least every K evaluations (K is fixed at the run's first partial evaluation and reported);
  and the probes at risk (right at base, still right when last scored, with a margin under the at-risk threshold),
  the most at risk first, as far as the kind's share goes.
- **sampled**: from the rest of each kind (knowledge, behaviour: each with its own share), a simple random sample
  without replacement within each category (in proportion, at least 2 of each), seeded by the step, so every rank
  draws the same.

A probe left out keeps the result it had when last scored (the record's per-probe state; it cannot flip at this step).
The figures F, BT, accuracy and the invalid rate of every group are estimated by the stratified Horvitz-Thompson
estimator: scored certain probes count once, each sampled probe for the N_h / n_h probes of its stratum. Given what
was scored before (which decides the certain probes), the sample is a simple random one, so the estimator is unbiased
and its variance is the stratified one, `sum_h N_h^2 (1 - n_h/N_h) s_h^2 / n_h`; `s_h^2` uses the Agresti-Coull
proportion (two successes and two failures added), so a sample without a single flip still has an interval.

Plain Python and NumPy.

Example:
    >>> import numpy as np
    >>> kinds = np.array(["knowledge"] * 8)
    >>> design = plan_partial(kinds, must=np.zeros(8, bool), age=np.zeros(8, int), k=4, fraction=0.5, seed=0, step=10)
    >>> int(design.scored.sum()), float(design.inclusion[0])
    (4, 0.5)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .metrics import wilson_interval

__all__ = ["CERTAIN_AT_RISK", "CERTAIN_DUE", "CERTAIN_FLIPPED", "MIN_SAMPLE", "SAMPLED", "Design", "Estimate",
           "ShareBudget", "estimate_mean", "estimate_rows", "plan_partial", "rotation_k"]

# each probe's stratum in a partial evaluation (the record's `stratum` array)
CERTAIN_AT_RISK, CERTAIN_DUE, SAMPLED, CERTAIN_FLIPPED = 0, 1, 2, 3
_Z90, _Z95 = 1.6448536269514722, 1.959963984540054
MIN_SAMPLE = 2  # per sampled stratum: the fewest probes a variance can be estimated from
POOL_BELOW = 10  # a category with fewer probes left to sample joins its kind's pooled stratum


@dataclass
class Design:
    """One partial evaluation's design: per probe whether it is scored, its stratum and its inclusion probability.

    `inclusion` holds every probe's probability of being scored at this step given the evaluations before it (1 for
    the certain ones); `stratum` is `CERTAIN_AT_RISK`, `CERTAIN_DUE`, `CERTAIN_FLIPPED` or `SAMPLED`; the sampled
    strata are one per cell (`cells`: each probe's kind and category), so every category's estimate is a sum of its
    own strata's. `k`: every probe is scored at least every `k` evaluations; `fraction`: the share of each kind's
    probes the time budget allowed."""

    step: int
    scored: np.ndarray  # bool
    inclusion: np.ndarray  # float64
    stratum: np.ndarray  # int8
    kinds: np.ndarray  # str
    k: int | None  # None: a pilot before anything was timed (no probe is due)
    fraction: float
    seed: int = 0
    cells: np.ndarray | None = None  # str: "<kind>/<category>"; None: one cell per kind

    def __post_init__(self) -> None:
        if self.cells is None:
            self.cells = np.asarray(self.kinds, dtype=str)

    @property
    def share_scored(self) -> float:
        return float(self.scored.mean()) if len(self.scored) else 1.0

    def strata(self) -> list[tuple[np.ndarray, int]]:
        """The sampled strata: (the mask of their population, how many of it are scored)."""
        out = []
        for cell in dict.fromkeys(self.cells.tolist()):
            pop = (self.cells == cell) & (self.stratum == SAMPLED)
            if pop.any():
                out.append((pop, int((pop & self.scored).sum())))
        return out

    def summary(self) -> dict[str, Any]:
        """What the record's metrics line keeps of it (`partial`): the counts by stratum and kind, K, the fraction."""
        by_kind = {}
        for kind in dict.fromkeys(self.kinds.tolist()):
            m = self.kinds == kind
            by_kind[kind] = {"n": int(m.sum()), "scored": int((m & self.scored).sum()),
                             "flipped": int((m & (self.stratum == CERTAIN_FLIPPED)).sum()),
                             "at_risk": int((m & (self.stratum == CERTAIN_AT_RISK)).sum()),
                             "due": int((m & (self.stratum == CERTAIN_DUE)).sum()),
                             "sampled": int((m & self.scored & (self.stratum == SAMPLED)).sum()),
                             "of_rest": int((m & (self.stratum == SAMPLED)).sum())}
        return {"scored": int(self.scored.sum()), "n": len(self.scored), "share_scored": round(self.share_scored, 6),
                "k": self.k, "fraction": round(self.fraction, 6), "seed": self.seed, "kinds": by_kind}

    def to_arrays(self) -> dict[str, np.ndarray]:
        """The per-probe arrays the record's npz keeps (so a report can be rebuilt)."""
        return {"scored": self.scored.astype(np.int8), "inclusion": self.inclusion.astype(np.float64),
                "stratum": self.stratum.astype(np.int8)}

    @classmethod
    def from_arrays(cls, step: int, z: Mapping[str, np.ndarray], cells: np.ndarray, summary: Mapping[str, Any]) -> Design:
        """A recorded partial evaluation's design (`to_arrays`, the line's `partial`), to rebuild its estimates;
        `cells`: each probe's "<kind>/<category>", as `plan_partial` drew them."""
        cells = np.asarray(cells, dtype=str)
        kinds = np.array([c.split("/", 1)[0] for c in cells], dtype=str)
        return cls(step, np.asarray(z["scored"]).astype(bool), np.asarray(z["inclusion"], np.float64),
                   np.asarray(z["stratum"], np.int8), kinds, summary.get("k"), float(summary.get("fraction", 0.0)),
                   int(summary.get("seed", 0)), cells)


def rotation_k(fraction: float) -> int:
    """K, the most evaluations a probe goes unscored, for a partial evaluation scoring `fraction` of the rest: twice
    the mean revisit time, so that the sample stays random for all but the few probes a run of bad luck left out (a
    probe is due with probability about e^-2 = 14% of the time; they are scored for certain).

    Example:
        >>> rotation_k(0.2), rotation_k(0.5), rotation_k(1.0)
        (10, 4, 2)
    """
    return max(2, math.ceil(2.0 / max(fraction, 1e-9) - 1e-9))


def _allocate(want: int, sizes: list[int], least: int) -> list[int]:
    """`want` split over cells of these sizes in proportion (largest remainders), each at least `least` (or all of a
    smaller cell), none more than its size."""
    total = sum(sizes)
    if total == 0:
        return [0] * len(sizes)
    exact = [max(want, 0) * size / total for size in sizes]
    out = [math.floor(x) for x in exact]
    for i in sorted(range(len(sizes)), key=lambda i: exact[i] - out[i], reverse=True)[:max(want, 0) - sum(out)]:
        out[i] += 1
    return [min(size, max(m, least)) for m, size in zip(out, sizes, strict=True)]


def plan_partial(kinds: np.ndarray, must: np.ndarray, age: np.ndarray, k: int | None, fraction: float, seed: int, step: int,
                 risk: np.ndarray | None = None, categories: Sequence[str] | None = None,
                 min_sample: int = MIN_SAMPLE) -> Design:
    """Which probes a partial evaluation scores.

    Args:
        kinds: each probe's kind ("knowledge", "behavior"): each kind gets the same `fraction` of its probes.
        must: the probes that flipped at the last evaluation, or whose latest result was not finite (scored for certain).
        age: evaluations since each probe was last scored (0: scored at the last one).
        k: a probe with `age >= k - 1` is due (scored for certain), so none goes more than `k` evaluations unscored
            (None: none is due, a pilot before anything was timed).
        fraction: the share of each kind's probes to score; the certain ones count in it.
        seed, step: the draw's seed: the same on every rank and in a rerun at the same fraction.
        risk: each probe's margin when at risk (lower: more at risk), inf when not at risk. At-risk probes are scored
            for certain, the most at risk first, as far as the kind's share goes (more of them than the share allows
            join the rest, to be sampled).
        categories: each probe's category: the rest is sampled within each (kind, category) cell, in proportion to its
            size and at least `min_sample` of it where it has that many, so that a category's estimate is its own
            stratum's; categories with fewer than `POOL_BELOW` probes left to sample are pooled, one cell per kind
            (their estimates are domain estimates, clipped to [0, 1]). None: one cell per kind.
    """
    n = len(kinds)
    kinds = np.asarray(kinds, dtype=str)
    # objects while cells are renamed (a fixed-width string array would cut "<kind>/*" to its width)
    cells = np.array(list(kinds) if categories is None else [f"{a}/{b}" for a, b in zip(kinds, categories, strict=True)],
                     dtype=object)
    must = np.asarray(must, bool)
    due = (np.asarray(age) >= k - 1) & ~must if k is not None else np.zeros(n, bool)
    risk = np.full(n, np.inf) if risk is None else np.asarray(risk, np.float64)
    stratum = np.full(n, SAMPLED, np.int8)
    stratum[must] = CERTAIN_FLIPPED
    stratum[due] = CERTAIN_DUE
    inclusion = np.ones(n, np.float64)
    rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, int(step)])
    picked = np.zeros(n, bool)  # the sampled probes scored
    for kind in dict.fromkeys(kinds.tolist()):
        members = kinds == kind
        room = math.ceil(fraction * members.sum() - 1e-9) - int((members & (stratum != SAMPLED)).sum())
        risky = np.flatnonzero(members & (stratum == SAMPLED) & np.isfinite(risk))
        if room > 0 and len(risky):  # the most at risk first (a stable order: ties by position)
            stratum[risky[np.argsort(risk[risky], kind="stable")[:room]]] = CERTAIN_AT_RISK
        want = math.ceil(fraction * members.sum() - 1e-9) - int((members & (stratum != SAMPLED)).sum())
        for cell in dict.fromkeys(cells[members].tolist()):  # a small category is no stratum of its own: pooled
            in_cell = members & (cells == cell)
            if (in_cell & (stratum == SAMPLED)).sum() < POOL_BELOW:
                cells[in_cell] = f"{kind}/*"
        names = list(dict.fromkeys(cells[members].tolist()))
        rests = [np.flatnonzero(members & (cells == c) & (stratum == SAMPLED)) for c in names]
        for rest, m in zip(rests, _allocate(want, [len(r) for r in rests], min_sample), strict=True):
            if len(rest):
                picked[rng.choice(rest, size=m, replace=False)] = True
                inclusion[rest] = m / len(rest)
    scored = (stratum != SAMPLED) | picked
    return Design(step, scored, inclusion, stratum, kinds, k, float(fraction), seed, cells.astype(str))


@dataclass(frozen=True)
class Estimate:
    """A group's rate estimated from a partial evaluation: the value, its standard error, and its 90% interval."""

    value: float
    se: float

    def interval(self, z: float = _Z90) -> tuple[float, float]:
        return max(self.value - z * self.se, 0.0), min(self.value + z * self.se, 1.0)


def estimate_mean(y: np.ndarray, members: np.ndarray, design: Design) -> Estimate:
    """The mean of the 0/1 figure `y` over the probes in `members`, estimated from the scored probes (`y` is read only
    where `design.scored`): Horvitz-Thompson over the strata, with the stratified variance.

    Example:
        >>> import numpy as np
        >>> d = plan_partial(np.array(["knowledge"] * 100), np.zeros(100, bool), np.zeros(100, int), 10, 0.3, 0, 1)
        >>> y = np.arange(100) % 2 == 0
        >>> e = estimate_mean(y, np.ones(100, bool), d)
        >>> 0.3 < e.value < 0.7 and e.se > 0
        True
    """
    members = np.asarray(members, bool)
    n_g = int(members.sum())
    if n_g == 0:
        return Estimate(math.nan, math.nan)
    z = np.asarray(y, np.float64) * members
    certain = design.scored & (design.stratum != SAMPLED)
    total, var = float(z[certain].sum()), 0.0
    for pop, n_h in design.strata():
        big_n = int(pop.sum())
        if n_h == 0:  # nothing of this stratum scored: nothing to estimate it from (a design never does this)
            return Estimate(math.nan, math.nan)
        sample = z[pop & design.scored]
        total += big_n * float(sample.mean())
        if n_h < big_n:
            # Agresti-Coull's proportion (never a zero variance from a sample of 0s), as the sample variance s^2
            p = (float(sample.sum()) + 2.0) / (n_h + 4.0)
            s2 = p * (1.0 - p) * (n_h / (n_h - 1) if n_h > 1 else 1.0)
            var += big_n**2 * (1.0 - n_h / big_n) * s2 / n_h
    return Estimate(min(max(total / n_g, 0.0), 1.0), math.sqrt(var) / n_g)


_ESTIMATED = ("forgetting", "backward_transfer", "accuracy_post", "invalid_rate_post")


def estimate_rows(rows: dict[str, dict[str, Any]], members: Callable[[str], np.ndarray], design: Design,
                  pre: np.ndarray, post: np.ndarray, k: np.ndarray, categories: Sequence[str]) -> None:
    """Replace, in place, each group's F, BT, accuracy and invalid rate in `rows` (computed from the probes' latest
    results) by their estimates from `design`, with what follows from them: net change, the chance term and the
    adjusted figures, the counts (as estimates), and the intervals. `forgetting_ci_low` / `_high` (what a budget
    judges) become the Wilson interval at the estimate widened by the sampling error (half-widths added in quadrature);
    `<figure>_se` and `<figure>_sampling_low` / `_high` (90%) are the sampling error alone. Each row gets `partial: 1`
    and `share_scored`; McNemar's test, which needs every probe's pair, becomes NaN. Other figures (drift, behaviour,
    robustness) stay as the probes' latest results make them (`partial_estimated` names the estimated ones)."""

    pre_right, post_right = pre == 1, post == 1
    indicators = {"forgetting": pre_right & ~post_right, "backward_transfer": ~pre_right & post_right,
                  "accuracy_post": post_right, "invalid_rate_post": post == -1}
    cats = np.asarray(categories, dtype=str)
    for name, row in rows.items():
        if row.get("missing"):  # probes scored NaN / inf: the row says why, and estimates nothing
            continue
        mask = members(name)
        n = int(mask.sum())
        if not n:
            continue
        est = {f: estimate_mean(y, mask, design) for f, y in indicators.items()}
        if any(math.isnan(e.value) for e in est.values()):
            continue
        for f, e in est.items():
            row[f] = e.value
            row[f"{f}_se"] = e.se
            row[f"{f}_sampling_low"], row[f"{f}_sampling_high"] = e.interval()
        row["net_change"] = row["accuracy_post"] - row["accuracy_pre"]
        # the chance term per (category, k) cell, with each cell's accuracy now estimated (`forgetwatch.measures.metrics`)
        chance = 0.0
        for cat, kk in {(c, int(x)) for c, x in zip(cats[mask], k[mask], strict=True) if x >= 2}:
            cell = mask & (cats == cat) & (k == kk)
            acc_pre = float(pre_right[cell].mean())
            acc_post = min(max(estimate_mean(post_right, cell, design).value, 0.0), 1.0)
            chance += cell.sum() * (1 - acc_pre) * (1 - acc_post) / (kk - 1)
        chance /= n
        row["chance"] = chance
        row["forgetting_adjusted"] = max(row["forgetting"] - chance, 0.0)
        row["backward_transfer_adjusted"] = max(row["backward_transfer"] - chance, 0.0)
        for f in ("forgetting", "backward_transfer"):
            wl, wh = wilson_interval(min(max(round(row[f] * n), 0), n), n)
            se = _Z95 * est[f].se
            value = row[f]
            row[f"{f}_ci_low"] = max(value - math.hypot(max(value - wl, 0.0), se), 0.0)
            row[f"{f}_ci_high"] = min(value + math.hypot(max(wh - value, 0.0), se), 1.0)
        for count, f in (("forgotten", "forgetting"), ("learned", "backward_transfer")):
            row[count] = round(row[f] * n, 2)
        row["mcnemar_p"] = math.nan
        row["partial"] = 1
        row["share_scored"] = float(design.scored[mask].mean())
        row["partial_estimated"] = "forgetting, backward_transfer, accuracy, invalid_rate, net_change, adjusted"


@dataclass
class ShareBudget:
    """How much of the probes an evaluation may score so that probing stays within `share` of `train()`, averaged over
    the run.

    The callback tells it the seconds spent training and probing (`note`), and each partial evaluation's seconds per
    probe of each kind (`note_cost`); `fraction` sizes the next evaluation: the probing time the run may still spend
    (share/(1 - share) of its training time, the training still to come extrapolated from the steps so far), less
    what it spent and what the full passes still to come will cost, split over the partial evaluations left.

    Example:
        >>> b = ShareBudget(0.2)
        >>> b.note(train=100.0, probe=30.0, steps=10)  # 10 steps trained; the base scored in 30 s
        >>> b.note_full(30.0, n=100)
        >>> # 0.25 * 300 s of training in all = 75 s, less the base's 30 and the last step's 30, over 2 partial passes
        >>> round(b.fraction(step=10, max_steps=30, partial_left=2, full_left=1, certain={}, n_by_kind={"knowledge": 100}), 3)
        0.25
    """

    share: float
    train_seconds: float = 0.0
    probe_seconds: float = 0.0
    steps_trained: int = 0
    full_cost: float | None = None  # seconds of a full pass, measured
    cost: dict[str, float] = field(default_factory=dict)  # seconds per probe, by kind (from partial evaluations)
    _per_probe: float | None = None  # seconds per probe of the last full pass, all kinds together

    def to_dict(self) -> dict[str, Any]:
        """The account so far, as the record's metrics line keeps it (`share`): a resumed run goes on with it."""
        return {"max_share": self.share, "train_s": round(self.train_seconds, 3), "probe_s": round(self.probe_seconds, 3),
                "steps": self.steps_trained, "measured_share": round(self.measured(), 4),
                "full_s": None if self.full_cost is None else round(self.full_cost, 3),
                "per_probe_s": {k: round(v, 6) for k, v in self.cost.items()},
                "full_per_probe_s": None if self._per_probe is None else round(self._per_probe, 6)}

    @classmethod
    def from_dict(cls, share: float, doc: Mapping[str, Any]) -> ShareBudget:
        """The account a record's line kept, for `share` (the resumed run's option)."""
        return cls(share, float(doc.get("train_s", 0.0)), float(doc.get("probe_s", 0.0)), int(doc.get("steps", 0)),
                   doc.get("full_s"), {k: float(v) for k, v in (doc.get("per_probe_s") or {}).items()},
                   doc.get("full_per_probe_s"))

    def measured(self) -> float:
        """The share of the time so far that went to probing."""
        total = self.train_seconds + self.probe_seconds
        return self.probe_seconds / total if total > 0 else 0.0

    def timed(self, n_by_kind: Mapping[str, int]) -> bool:
        """Whether any cost per probe is known for these kinds."""
        return any(self.per_probe(kind) is not None for kind in n_by_kind)

    def steady(self, step: int, max_steps: int, partial_left: int, full_left: int, n_by_kind: Mapping[str, int]
               ) -> float | None:
        """The share of the probes the partial evaluations can afford on average (the allowance over a full pass's
        cost, at most 1), whatever this one must score: what K is sized from. None before anything is timed.

        Example:
            >>> b = ShareBudget(0.2); b.note(train=100.0, probe=30.0, steps=10); b.note_cost("knowledge", 0.3, 1)
            >>> round(b.steady(10, 30, 2, 1, {"knowledge": 100}), 3)
            0.25
        """
        if not self.timed(n_by_kind):
            return None
        full = sum((self.per_probe(kind) or 0.0) * n for kind, n in n_by_kind.items())
        return min(self.allowance(step, max_steps, partial_left, full_left, full) / full, 1.0) if full > 0 else 1.0

    def note(self, train: float = 0.0, probe: float = 0.0, steps: int = 0) -> None:
        self.train_seconds += train
        self.probe_seconds += probe
        self.steps_trained += steps

    def note_full(self, seconds: float, n: int) -> None:
        """A full pass of `n` probes took `seconds` (scoring only)."""
        self.full_cost = seconds
        self._per_probe = seconds / max(n, 1)  # until the kinds are timed apart (partial evaluations score them apart)

    def note_cost(self, kind: str, seconds: float, n: int) -> None:
        if n > 0:
            self.cost[kind] = seconds / n

    def per_probe(self, kind: str) -> float | None:
        return self.cost.get(kind, self._per_probe)

    def allowance(self, step: int, max_steps: int, partial_left: int, full_left: int, full_cost: float | None = None
                  ) -> float:
        """The seconds this partial evaluation may take; `full_cost`: a full pass's seconds when none was timed (the
        base came from a cache), from the seconds per probe of each kind."""
        per_step = self.train_seconds / max(self.steps_trained, 1)
        train_total = self.train_seconds + per_step * max(max_steps - step, 0)
        budget = self.share / (1.0 - self.share) * train_total
        reserve = full_left * (self.full_cost if self.full_cost is not None else (full_cost or 0.0))
        return max(budget - self.probe_seconds - reserve, 0.0) / max(partial_left, 1)

    def fraction(self, step: int, max_steps: int, partial_left: int, full_left: int, certain: Mapping[str, int],
                 n_by_kind: Mapping[str, int]) -> float:
        """The share of each kind's probes this evaluation may score (1 or more: a full pass fits). Before any cost is
        measured (the base came from a cache), 0: a pilot scoring the certain probes and the fewest sampled, which
        times each kind."""
        if not self.timed(n_by_kind):
            return 0.0
        full = sum((self.per_probe(kind) or 0.0) * n for kind, n in n_by_kind.items())
        allowed = self.allowance(step, max_steps, partial_left, full_left, full)

        def cost(phi: float) -> float:
            return sum((self.per_probe(kind) or 0.0) * max(certain.get(kind, 0), phi * n) for kind, n in n_by_kind.items())

        if cost(1.0) <= allowed:
            return 1.0
        lo, hi = 0.0, 1.0
        for _ in range(40):  # cost is monotone in phi
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if cost(mid) <= allowed else (lo, mid)
        return lo
