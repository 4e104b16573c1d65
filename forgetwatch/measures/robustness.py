"""Robustness figures: each probe against its own base, over its variants (`forgetwatch.probes.variants`).

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

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..probes.variants import SEP, VariantPlan
from ..scoring.results import CORRECT, ProbeResults
from .metrics import format_figure, row_scalars, wilson_interval

__all__ = ["VariantOutcomes", "variant_outcomes", "robust_figures", "position_bias", "fragile_probes", "robust_rows",
           "robust_scalars", "fragile_changes", "format_robust", "SCALARS"]

# the curves logged per group: scalar name -> its metrics.jsonl field
SCALARS = {"robust_accuracy": "robust_accuracy_post", "robust_forgetting": "robust_forgetting",
           "consistency": "consistency_post", "consistency_change": "consistency_change", "fragile": "fragile",
           "position_bias": "position_bias_post", "position_bias_change": "position_bias_change"}


@dataclass
class VariantOutcomes:
    """Per robust probe, per variant (0: the probe itself): right or not, and for multiple choice the position chosen
    (-1: none valid) and the gold position, in the variant's own order."""

    ids: list[str]
    right: np.ndarray  # [probes, variants] bool
    chosen: np.ndarray  # [probes, variants] int (-1: no valid answer, or NaN / inf scores)
    gold: np.ndarray  # [probes, variants] int (-1 for short answers)
    num_choices: np.ndarray  # [probes] int (0 for short answers)
    # [probes, variants] bool: the pure option shifts (no frame, no noise) of probes whose variants hold every shift,
    # over which the gold answer stands at each position equally often: what position bias is measured on
    balanced: np.ndarray
    # [probes, variants] bool: scored NaN / inf (an overflow): no figure over such a probe can be computed
    nonfinite: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.nonfinite is None:
            self.nonfinite = np.zeros(self.right.shape, bool)

    ARRAYS = ("right", "chosen", "gold", "num_choices", "balanced", "nonfinite")

    def to_arrays(self, prefix: str = "robust_") -> dict[str, np.ndarray]:
        """As `np.savez` keeps them (the record's per-step file): every array, and the ids."""
        return {f"{prefix}ids": np.asarray(self.ids, dtype=str),
                **{f"{prefix}{name}": np.asarray(getattr(self, name)) for name in self.ARRAYS}}

    @classmethod
    def from_arrays(cls, z: Any, prefix: str = "robust_") -> VariantOutcomes | None:
        """Read back what `to_arrays` wrote; None when the file holds no variants."""
        if f"{prefix}ids" not in z:
            return None
        return cls([str(i) for i in z[f"{prefix}ids"]], *(np.asarray(z[f"{prefix}{name}"]) for name in cls.ARRAYS))


def variant_outcomes(plan: VariantPlan, results: ProbeResults, variants: ProbeResults | None = None) -> VariantOutcomes:
    """Each robust probe's variants right or not, from the `ProbeResults` of `plan.scored()`, or from the probes' own
    results and the variants' rows (`plan.split`)."""

    if variants is not None:
        results = ProbeResults.concat([results, variants])
    ids = list(plan.variants)
    k = max((len(vs) for vs in plan.variants.values()), default=1)
    pos = {pid: i for i, pid in enumerate(results.ids)}
    nonfinite_rows = results.nonfinite_mask()
    right = np.zeros((len(ids), k), bool)
    chosen = np.full((len(ids), k), -1, np.int64)
    gold = np.full((len(ids), k), -1, np.int64)
    num = np.zeros(len(ids), np.int64)
    balanced = np.zeros((len(ids), k), bool)
    nonfinite = np.zeros((len(ids), k), bool)
    for r, pid in enumerate(ids):
        variants = plan.variants[pid]
        for v in variants:
            i = pos[pid if v.index == 0 else f"{pid}{SEP}{v.index}"]
            bad = bool(nonfinite_rows[i])
            nonfinite[r, v.index] = bad
            right[r, v.index] = results.outcome[i] == CORRECT and not bad
            chosen[r, v.index] = -1 if bad else results.pred_index[i]  # argmax over NaN is no choice
            gold[r, v.index] = v.probe.gold if v.probe.gold is not None else -1
        num[r] = variants[0].probe.num_choices
        shifts = [v.index for v in variants if v.frame == 0 and v.noise == "none"]
        if num[r] and len({variants[j].shift for j in shifts}) == num[r]:
            balanced[r, shifts] = True
    return VariantOutcomes(ids, right, chosen, gold, num, balanced, nonfinite)


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


def robust_rows(base: Any, now: Any, groups: Mapping[str, np.ndarray], lettered: bool) -> dict[str, dict[str, Any]]:
    """Each group's robust figures as `metrics.jsonl` fields, for `VariantOutcomes` of the same probes and variants.

    `groups` maps a group's name to a boolean mask over the robust probes (`base.ids`); a group without robust probes
    gets no row. `robust_forgetting` carries its Wilson 95% interval (`robust_forgetting_ci_low` / `_high`, what a
    budget's lower bound reads); position bias is measured in lettered modes only.

    Example:
        >>> o = VariantOutcomes(["q"], np.ones((1, 2), bool), np.zeros((1, 2), int), np.zeros((1, 2), int),
        ...                     np.array([2]), np.zeros((1, 2), bool))
        >>> robust_rows(o, o, {"overall": np.array([True])}, lettered=False)["overall"]["consistency_change"]
        0.0
    """
    if base.ids != now.ids or base.right.shape != now.right.shape:
        raise ValueError("base and now must hold the same robust probes and variants")
    out = {}
    for name, mask in groups.items():
        mask = np.asarray(mask, bool)
        if not mask.any():
            continue
        f = robust_figures(base.right[mask], now.right[mask])
        low, high = wilson_interval(f["robust_lost"], f["robust_pre"]) if f["robust_pre"] else (math.nan, math.nan)
        row = {"robust_n": f["n"], "robust_variants": f["variants"] - 1, "robust_pre": f["robust_pre"],
               "robust_post": f["robust_post"], "robust_lost": f["robust_lost"],
               "robust_accuracy_pre": f["robust_accuracy_pre"], "robust_accuracy_post": f["robust_accuracy_post"],
               "robust_forgetting": f["robust_forgetting"], "robust_forgetting_ci_low": low,
               "robust_forgetting_ci_high": high, "consistency_pre": f["consistency_pre"],
               "consistency_post": f["consistency_post"], "consistency_change": f["consistency_change"],
               "fragile": f["fragile"]}
        if lettered and (base.num_choices[mask] > 0).any():
            pre = position_bias(base.chosen[mask], base.gold[mask], base.num_choices[mask], base.balanced[mask])
            post = position_bias(now.chosen[mask], now.gold[mask], now.num_choices[mask], now.balanced[mask])
            row.update(position_bias_pre=pre, position_bias_post=post, position_bias_change=post - pre)
        out[name] = row
    return out


def robust_scalars(row: Mapping[str, Any]) -> dict[str, float]:
    """The robustness curves of one group from its metrics.jsonl row; absent or NaN figures are left out."""
    return row_scalars(row, SCALARS)


def fragile_changes(prev: Any, now: Any) -> list[tuple[int, str]]:
    """(row, kind) of the robust probes whose robustness changed while their original form stayed right: "robust→fragile"
    (right in every variant before, now right only in some, its original form among them) and "fragile→robust".
    A change of the original form itself is a plain flip (1→0 or 0→1), not listed here; probes scored NaN / inf
    either time are left out."""
    ok = ~(prev.nonfinite.any(1) | now.nonfinite.any(1))
    was_all, is_all = prev.right.all(1), now.right.all(1)
    both_right = prev.right[:, 0] & now.right[:, 0]
    out = [(int(i), "robust→fragile") for i in np.flatnonzero(ok & both_right & was_all & ~is_all)]
    out += [(int(i), "fragile→robust") for i in np.flatnonzero(ok & both_right & ~was_all & is_all)]
    return sorted(out)


def format_robust(rows: dict[str, dict[str, Any]]) -> str:
    """`compare`'s robustness table: one row per group that has robust probes, overall last."""
    num = format_figure
    w = max([22] + [len(k) + 2 for k in rows])
    lettered = any("position_bias_pre" in r for r in rows.values())
    head = (f"{'group':<{w}}{'n':>6}{'robust base':>13}{'robust now':>12}{'robust F':>10}{'consist. base':>15}"
            f"{'now':>7}{'change':>8}{'fragile':>9}" + (f"{'pos. bias base':>16}{'now':>7}" if lettered else ""))
    lines = [head, "-" * len(head)]
    for name in [k for k in rows if k != "overall"] + ["overall"]:
        r = rows[name]
        if name == "overall":
            lines.append("-" * len(head))
        change = r["consistency_change"]
        line = (f"{name:<{w}}{r['robust_n']:>6}{num(r['robust_accuracy_pre']):>13}{num(r['robust_accuracy_post']):>12}"
                f"{num(r['robust_forgetting']):>10}{num(r['consistency_pre']):>15}{num(r['consistency_post']):>7}"
                f"{'n/a' if change != change else f'{change:+.3f}':>8}{_count(r['fragile']):>9}")
        if lettered:
            line += f"{num(r.get('position_bias_pre')):>16}{num(r.get('position_bias_post')):>7}"
        lines.append(line)
    lines += [f"{name}: robust figures missing: {r['robust_missing']}" for name, r in rows.items() if r.get("robust_missing")]
    lines.append(
        "robust: right in every variant; robust F: of those robust at base, the share no longer robust; consist.: "
        "share of variants right; fragile: robust at base, right as asked, wrong in some variant now"
        + ("; pos. bias: distance of the chosen letters from the gold letters' distribution (0: none)" if lettered else "")
    )
    return "\n".join(lines)


def _count(v: Any) -> str:
    return "n/a" if v is None or (isinstance(v, float) and v != v) else str(int(v))
