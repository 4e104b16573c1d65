"""Robustness: is a probe still right when its options move, its question is worded around differently, or its text
carries light noise? Plain Python and NumPy.

A probe's variants are fixed and seeded, so the base and the model being trained see the same ones:

- **option order** (lettered multiple choice: `mcq_mode="letter"` or `"generate"`): cyclic shifts of the options, so
  with as many variants as options every option stands at every position once. Log-likelihood scoring reads each
  option on its own, after the question alone, so order cannot matter there: its variants are frames and noise only.
- **frames**: the question's wording around the same content ("Here is a question: ...").
- **surface noise**: the question in lower case, or a few adjacent letters swapped inside words (a typo rate).

Variant 0 is the probe itself; `robustness=K` adds K more, taken in a fixed order (order first where it can matter,
then frames, then noise, then their combinations), so a larger K keeps the smaller K's variants. Behaviour probes
have no variants (their prompt is the instruction being checked).

Example:
    >>> from forgetwatch.probes.probe_set import Probe
    >>> p = Probe("q1", "mcq", "2 + 2 = ?", ("3", "4", "5"), 1)
    >>> [v.probe.choices for v in make_variants(p, 2, lettered=True)]
    [('3', '4', '5'), ('5', '3', '4'), ('4', '5', '3')]
"""

from __future__ import annotations

import dataclasses
import hashlib
import numbers
import random
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import RobustnessError
from ..options import default
from .probe_set import Probe

__all__ = ["FRAMES", "NOISES", "Variant", "VariantPlan", "make_variants", "max_variants", "check_robustness",
           "plan_variants", "make_plan", "serves", "choose_robust", "LETTERED_MODES", "variant_key", "is_variant",
           "RobustnessError"]

# Bump when a frame, a noise rule or the order of variants changes: variants are part of the cache key.
VARIANTS_VERSION = 2
# The question's wording around the same content. Neutral for every kind of question (multiple choice, short answer).
FRAMES = ("{q}", "Here is a question: {q}", "Please answer the following question. {q}", "{q} Answer carefully.")
NOISES = ("none", "lowercase", "typos")
TYPO_RATE = 0.1  # share of the words of 4+ letters that get two adjacent letters swapped (at least one word)


@dataclass(frozen=True)
class Variant:
    """One form of a probe: the probe as scored (question, options and gold moved) and how it was made.

    `order[j]` is the original index of the option now at position j, so a chosen position maps back to the
    original option as `order[pred]`.
    """

    probe: Probe
    index: int  # 0: the probe itself
    shift: int = 0
    frame: int = 0
    noise: str = "none"
    order: tuple[int, ...] = ()


def max_variants(probe: Probe, lettered: bool) -> int:
    """How many variants `probe` can have besides itself (0 for behaviour probes).

    Example:
        >>> max_variants(Probe("q", "mcq", "?", ("a", "b"), 0), lettered=True)
        23
        >>> max_variants(Probe("q", "mcq", "?", ("a", "b"), 0), lettered=False)
        11
    """
    if probe.is_behavior:
        return 0
    shifts = probe.num_choices if (lettered and probe.kind == "mcq") else 1
    return shifts * len(FRAMES) * len(NOISES) - 1


def check_robustness(k: int | None, probes: Sequence[Probe], lettered: bool) -> None:
    """Refuse a `robustness` the probes cannot take, saying what to change: below 1, or more variants than a probe
    can have (behaviour probes are left out of robustness: they are not counted here)."""
    if k is None:
        return
    if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 1:
        raise RobustnessError(f"`robustness` is the number of variants scored besides each probe: an integer ≥ 1, got {k!r} "
                              "(0 scores no variants)")
    knowledge = [p for p in probes if not p.is_behavior]
    if not knowledge:
        raise RobustnessError("`robustness` scores variants of knowledge probes (multiple choice, short answers), and "
                              "this probe set has only behaviour probes, which have none: leave `robustness` unset")
    worst = min(knowledge, key=lambda p: max_variants(p, lettered))
    most = max_variants(worst, lettered)
    if k > most:
        how = "option orders × frames × noises" if lettered and worst.kind == "mcq" else "frames × noises"
        raise RobustnessError(f"robustness={k}, but probe {worst.id!r} ({worst.kind}"
                              f"{f', {worst.num_choices} options' if worst.kind == 'mcq' else ''}) has {most} variants "
                              f"besides itself ({how}): use `robustness` ≤ {most}")


def variant_key(k: int, seed: int) -> dict[str, int]:
    """The part of the cache key that says which variants were scored."""
    return {"k": k, "seed": seed, "version": VARIANTS_VERSION}


def make_variants(probe: Probe, k: int, *, lettered: bool, seed: int = 0) -> list[Variant]:
    """The probe itself and its first `k` variants (fewer where the probe has fewer: see `max_variants`).

    Deterministic: the same probe, `k`, `lettered` and `seed` give the same variants in any process.
    """
    plan = _plan(probe, lettered)[: k + 1]
    return [_apply(probe, i, shift, frame, noise, seed) for i, (shift, frame, noise) in enumerate(plan)]


# A variant is scored as a probe of its own, with this suffix on its probe's id (ids never hold it: `plan_variants`).
SEP = "~v"


@dataclass
class VariantPlan:
    """Which variants of which probes are scored: `scored()` is what goes to `score_probes` in one call (the probes
    and their variants together, so variants share the probes' batches), `forgetwatch.measures.robustness.variant_outcomes`
    reads the results back."""

    probes: list[Probe]
    variants: dict[str, list[Variant]] = field(default_factory=dict)  # robust probe id -> its variants, itself first
    k: int = 0
    seed: int = 0
    lettered: bool = False
    per_suite: int | None = None  # `robust_per_suite`: variants on a seeded draw of this many probes per suite

    def scored(self) -> list[Probe]:
        return [*self.probes, *self.extra()]

    def extra(self) -> list[Probe]:
        """The variants alone (variant 0, the probe itself, left out), as probes with `<id>~v<j>` ids."""
        return [dataclasses.replace(v.probe, id=f"{pid}{SEP}{v.index}") for pid, vs in self.variants.items() for v in vs[1:]]

    def key(self) -> dict[str, Any]:
        """What the base cache's key says of the variants: base and now must score the same ones."""
        ids = hashlib.sha256("\n".join(self.variants).encode()).hexdigest()[:16]
        return {**variant_key(self.k, self.seed), "lettered": self.lettered, "per_suite": self.per_suite,
                "probes": len(self.variants), "rows": len(self.extra()), "ids": ids}

    def split(self, results: Any) -> tuple[Any, Any]:
        """The `ProbeResults` of `scored()` as (the probes' own rows, in probe order; the variants' rows)."""
        n = len(self.probes)
        if len(results) != n + sum(len(vs) - 1 for vs in self.variants.values()):
            raise ValueError(f"{len(results)} results for a plan of {n} probes and their variants")
        return results.take(range(n)), results.take(range(n, len(results)))



def plan_variants(probes: Sequence[Probe], k: int, *, lettered: bool, seed: int = 0,
                  only: Collection[str] | None = None) -> VariantPlan:
    """Variants 1..k of every knowledge probe (of those in `only`, when given: a subset bounds the cost), checked
    first with `check_robustness`. Behaviour probes are scored as they are, without variants.

    Example:
        >>> plan = plan_variants([Probe("q", "mcq", "2 + 2 = ?", ("3", "4"), 1)], 2, lettered=True)
        >>> [p.id for p in plan.scored()]
        ['q', 'q~v1', 'q~v2']
    """
    if any(SEP in p.id for p in probes):
        bad = next(p.id for p in probes if SEP in p.id)
        raise RobustnessError(f"probe id {bad!r} holds {SEP!r}, which names variants: rename the probe to score variants")
    if only is not None:
        unknown = sorted(set(only) - {p.id for p in probes})
        if unknown:
            raise RobustnessError(f"{len(unknown)} probe id(s) to score variants of are not in the probe set (first: "
                                  f"{', '.join(map(repr, unknown[:3]))}): name probes of the set")
    chosen = [p for p in probes if not p.is_behavior and (only is None or p.id in only)]
    check_robustness(k, chosen, lettered)
    return VariantPlan(list(probes), {p.id: make_variants(p, k, lettered=lettered, seed=seed) for p in chosen},
                       k=k, seed=seed, lettered=lettered)


LETTERED_MODES = ("letter", "generate")  # multiple-choice modes that read the options as a lettered list


def make_plan(probes: Sequence[Probe], robustness: int | None, robust_per_suite: int | None = None,
              mcq_mode: str = default("mcq_mode")) -> VariantPlan | None:
    """The variants a run scores with `robustness=K` (0: robustness off; None, as records before 0.2 say, too), on
    `robust_per_suite` probes of each suite or all; option order varies only where the options are read as a list
    (`mcq_mode` letter or generate).
    One function for the callback, the watcher and the CLI, so that they always plan the same variants.

    Example:
        >>> plan = make_plan([Probe("q", "mcq", "2 + 2 = ?", ("3", "4"), 1)], 2, mcq_mode="letter")
        >>> [v.shift for v in plan.variants["q"]]
        [0, 1, 0]
    """
    if not robustness and not isinstance(robustness, bool):  # 0 or None: off
        if robust_per_suite is not None:
            raise RobustnessError(f"robust_per_suite={robust_per_suite} says how many probes get variants, but robustness "
                                  "is off: set `robustness` (e.g. 5) too, or leave robust_per_suite unset")
        return None
    plan = plan_variants(probes, robustness, lettered=mcq_mode in LETTERED_MODES,
                         only=choose_robust(probes, robust_per_suite))
    plan.per_suite = robust_per_suite
    return plan


def serves(found: Any, wanted: dict[str, Any]) -> bool:
    """Whether a base cache made with the variants `found` (its key's `variants`) holds every variant `wanted` needs:
    the same ones, or more of them on the same probes (variants are taken in a fixed order, so K's variants are the
    first K of any larger K's).

    Example:
        >>> five = {"k": 5, "seed": 0, "version": 2, "lettered": False, "per_suite": None, "probes": 3, "rows": 15, "ids": "x"}
        >>> serves(five, {**five, "k": 3, "rows": 9}), serves({**five, "k": 3, "rows": 9}, five)
        (True, False)
    """
    if not isinstance(found, dict):
        return False
    same = {k: v for k, v in found.items() if k not in ("k", "rows")} == {
        k: v for k, v in wanted.items() if k not in ("k", "rows")
    }
    return same and isinstance(found.get("k"), int) and found["k"] >= wanted.get("k", 0)


def choose_robust(probes: Sequence[Probe], per_suite: int | None, seed: int = 0) -> list[str] | None:
    """The knowledge probes to score variants of when only `per_suite` per suite should be (None: all of them): a
    seeded draw within each suite (`source`, or the category when probes carry none), the same in every process.

    Example:
        >>> ps = [Probe(f"q{i}", "mcq", "?", ("a", "b"), 0, source="s") for i in range(5)]
        >>> len(choose_robust(ps, 2))
        2
    """
    if per_suite is None:
        return None
    if isinstance(per_suite, bool) or not isinstance(per_suite, numbers.Integral) or per_suite < 1:
        raise RobustnessError(f"`robust_per_suite` is how many probes of each suite get variants: an integer ≥ 1, got "
                              f"{per_suite!r} (leave it unset for every probe)")
    suites: dict[str, list[Probe]] = {}
    for p in probes:
        if not p.is_behavior:
            suites.setdefault(p.source or p.category, []).append(p)
    keep = set()
    for members in suites.values():
        members = sorted(members, key=lambda p: _seed(seed, p.id, -1))
        keep.update(p.id for p in members[:per_suite])
    return [p.id for p in probes if p.id in keep]


def is_variant(probe_id: str) -> bool:
    """Whether a result row's id names a variant (`<probe id>~v<j>`) rather than a probe."""
    return SEP in probe_id


def _plan(probe: Probe, lettered: bool) -> list[tuple[int, int, str]]:
    """Every (shift, frame, noise) of a probe, in the order variants are taken: the probe, then each single change
    (order first, then frames, then noises), then the combinations."""
    if probe.is_behavior:
        return [(0, 0, "none")]
    shifts = range(probe.num_choices if (lettered and probe.kind == "mcq") else 1)
    every = [(s, f, n) for n in NOISES for f in range(len(FRAMES)) for s in shifts]
    changes = lambda v: (v[0] != 0) + (v[1] != 0) + (v[2] != "none")  # noqa: E731
    return sorted(every, key=changes)  # stable: within a number of changes, shifts vary fastest, then frames, noises


def _apply(probe: Probe, index: int, shift: int, frame: int, noise: str, seed: int) -> Variant:
    n = probe.num_choices
    order = tuple((j - shift) % n for j in range(n)) if n else ()  # position j holds original option order[j]
    question = probe.question  # noise first, so that typos land in the question, not in the frame's words
    rng = random.Random(_seed(seed, probe.id, index))
    if noise == "lowercase":
        question = question.lower()
    elif noise == "typos":
        question = _typos(question, rng)
    changes = {"question": FRAMES[frame].format(q=question)}
    if n:
        changes["choices"] = tuple(probe.choices[i] for i in order)
        changes["gold"] = order.index(probe.gold)
    return Variant(dataclasses.replace(probe, **changes), index, shift, frame, noise, order)


def _typos(text: str, rng: random.Random) -> str:
    words = text.split(" ")
    long = [i for i, w in enumerate(words) if sum(c.isalpha() for c in w) >= 4]
    if not long:
        return text
    for i in rng.sample(long, max(1, round(TYPO_RATE * len(long)))):
        w = words[i]
        spots = [j for j in range(len(w) - 1) if w[j].isalpha() and w[j + 1].isalpha() and w[j] != w[j + 1]]
        if spots:
            j = rng.choice(spots)
            words[i] = w[:j] + w[j + 1] + w[j] + w[j + 2 :]
    return " ".join(words)


def _seed(seed: int, probe_id: str, index: int) -> int:
    # not hash(): Python salts str hashes per process, and every rank and the watcher must draw the same typos
    return int.from_bytes(hashlib.sha256(f"{seed}\0{probe_id}\0{index}".encode()).digest()[:8], "big")
