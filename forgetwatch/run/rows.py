"""One evaluation's rows: the flips and fragile flips probe by probe, the robust figures added to each group's row,
and every curve a logger shows, under its key (plain Python and NumPy).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ..measures.behavior import behavior_scalars
from ..measures.metrics import mark_missing
from ..measures.robustness import (
    VariantOutcomes,
    fragile_changes,
    robust_rows,
    robust_scalars,
)
from ..probes.probe_set import ProbeSet
from ..scoring.results import CORRECT, ProbeResults
from .keys import OVERALL, figure_key

__all__ = ["flip_rows", "fragile_flip_rows", "add_robust_figures", "group_figures", "scalars_of", "members_of"]


def flip_rows(probes: ProbeSet, base: ProbeResults, prev: ProbeResults, now: ProbeResults) -> list[dict[str, Any]]:
    """The probes whose correctness changed from `prev` to `now` (`prev` is `base` for the flips since base), one row
    each: its id, category, question, gold answer, the base's and the current prediction, the direction ("1→0" or
    "0→1") and `vs_base` (retained, forgotten, learned or never known since base).

    Example:
        >>> flip_rows(probes, base, base, results)[0]["direction"]  # doctest: +SKIP
        '1→0'
    """
    was, is_ = prev.outcome == CORRECT, now.outcome == CORRECT
    rows = []
    for i in np.flatnonzero(was != is_):
        p = probes[int(i)]
        rows.append({
            "id": p.id, "category": p.category, "question": p.question, "gold": p.gold_text,
            "base_prediction": base.prediction[i], "prediction": now.prediction[i],
            "direction": "0→1" if is_[i] else "1→0",
            "vs_base": _vs_base(int(base.outcome[i] == CORRECT), int(is_[i])),
        })
    return rows


def fragile_flip_rows(probes: ProbeSet, base: ProbeResults, base_robust: VariantOutcomes, prev: VariantOutcomes,
                      now: VariantOutcomes, results: ProbeResults) -> list[dict[str, Any]]:
    """Probes still right in their original form whose robustness changed from `prev` to `now` (the variants'
    outcomes; `prev` is `base_robust` for the changes since base): a flip of its own kind ("robust→fragile": no longer
    right in every variant; "fragile→robust"), in the rows of `flip_rows`. `results` are the probes now, and `vs_base`
    says whether the probe was robust at base. Variants of other probes than `prev`'s: none."""
    if prev.ids != now.ids or prev.right.shape != now.right.shape:
        return []
    rows = []
    for r, kind in fragile_changes(prev, now):
        i = probes.index_of(now.ids[r])
        p = probes[i]
        rows.append({
            "id": p.id, "category": p.category, "question": p.question, "gold": p.gold_text,
            "base_prediction": base.prediction[i], "prediction": results.prediction[i], "direction": kind,
            "vs_base": "robust at base" if base_robust.right[r].all() else "not robust at base",
        })
    return rows


def add_robust_figures(rows: dict[str, dict[str, Any]], probes: ProbeSet, base: VariantOutcomes, now: VariantOutcomes,
                       lettered: bool, what: str = "have a variant scored NaN or inf") -> int:
    """Add each group's robust figures (`robust_rows`) to its row in `rows`, in place; `rows` names the groups:
    "overall", categories, kind groups (`ProbeSet.kind_groups`); a group without robust probes gets none. A variant
    scored NaN / inf, at base or now, blanks its groups' robust figures only (the probes as asked have their answers),
    saying why in `robust_missing` ("N of M probes <what> ..."). Returns the number of such probes.

    Example:
        >>> rows = {"overall": {}}
        >>> add_robust_figures(rows, probes, variant_outcomes(plan, base, base_variants), variant_outcomes(plan, now, variants),
        ...                    plan.lettered)  # doctest: +SKIP
        0
    """
    index = np.array([probes.index_of(pid) for pid in base.ids], np.int64)
    members = members_of(probes)
    robust = robust_rows(base, now, {name: members(name)[index] for name in rows}, lettered)
    for name, row in robust.items():
        rows[name].update(row)
    bad = np.zeros(len(probes), bool)
    bad[index] = base.nonfinite.any(1) | now.nonfinite.any(1)
    if bad.any():
        mark_missing(rows, bad, members, [probes[int(i)].id for i in np.flatnonzero(bad)], keys=set().union(*robust.values()),
                     field="robust_missing", what=what, count="nonfinite_variant_probes")
    return int(bad.sum())


def members_of(probes: ProbeSet) -> Callable[[str], np.ndarray]:
    """A figure's group by name -> the mask of the probes it holds: all of them, a kind group's, or a category's."""
    groups, categories = probes.kind_groups(), np.array([p.category for p in probes], dtype=str)

    def members(name: str) -> np.ndarray:
        if name == "overall":
            return np.ones(len(categories), bool)
        if name in groups:
            return np.asarray(groups[name], bool)
        return categories == name

    return members


def figures_of(row: dict[str, Any]) -> dict[str, float]:
    """The curves one group's metrics.jsonl row logs: F, BT (and chance-adjusted where there is a chance term),
    accuracy, net change, invalid rate; drift (NaN left out); behaviour and robustness (absent or NaN left out)."""
    out = {"forgetting": row["forgetting"], "backward_transfer": row["backward_transfer"]}
    if row["adjusted"]:  # short answers only: no chance term, so no "adjusted" curve that would repeat the raw one
        out.update(forgetting_adjusted=row["forgetting_adjusted"], backward_transfer_adjusted=row["backward_transfer_adjusted"])
    out.update(accuracy=row["accuracy_post"], net_change=row["net_change"], invalid_rate=row["invalid_rate_post"])
    drift = {"margin_change": row["margin_change"], "margin_change_low": row["margin_change_ci_low"],
             "margin_change_high": row["margin_change_ci_high"], "kl": row["kl"],
             "gold_logprob_change": row["gold_logprob_change"]}
    out.update({k: float(v) for k, v in drift.items() if v is not None and not math.isnan(v)})
    if row["n_at_risk_eligible"]:
        out["at_risk"] = float(row["at_risk"])
    return {**out, **behavior_scalars(row), **robust_scalars(row)}


def group_figures(rows: dict[str, dict[str, Any]], seconds: float | None = None, over_budget: int | None = None
                  ) -> dict[str, dict[str, float]]:
    """Every curve one evaluation logs, by group ("overall", categories, kind groups), from its metrics.jsonl rows;
    `seconds`: the time scoring took; `over_budget`: the budget limits exceeded now (both overall)."""
    out: dict[str, dict[str, float]] = {}
    for name, row in rows.items():
        if row.get("missing"):
            continue  # not a number: left out of this step (the record says why)
        out[name] = figures_of(row)
    overall = rows.get(OVERALL, {})
    extra = out.setdefault(OVERALL, {})
    if "noise_probes" in overall:  # the precision noise floor, overall
        extra.update(noise_probes=overall["noise_probes"], forgetting_excl_noise=overall["forgetting_excl_noise"])
    if "nonfinite_variant_probes" in overall:
        extra["nonfinite_variant_probes"] = overall["nonfinite_variant_probes"]
    if "partial" in overall:  # max_share on: whether this evaluation scored a part of the probes, and how much
        extra.update(partial=overall["partial"], share_scored=overall["share_scored"])
        if "probe_share" in overall:  # the share of the run's time so far that went to probing
            extra["probe_share"] = overall["probe_share"]
        if overall["partial"]:
            extra.update(forgetting_sampling_low=overall["forgetting_sampling_low"],
                         forgetting_sampling_high=overall["forgetting_sampling_high"])
    if "nonfinite_probes" in overall:
        extra["nonfinite_probes"] = overall["nonfinite_probes"]
        out = {g: {k: v for k, v in figs.items() if not (isinstance(v, float) and math.isnan(v)) or k == "nonfinite_probes"}
               for g, figs in out.items()}
    if over_budget is not None:
        out[OVERALL]["over_budget"] = over_budget
    if seconds is not None:
        out[OVERALL]["probe_seconds"] = seconds
    return {g: figs for g, figs in out.items() if figs}


def scalars_of(rows: dict[str, dict[str, Any]], seconds: float | None = None, over_budget: int | None = None
               ) -> dict[str, float]:
    """Every curve one evaluation logs (`group_figures`) under the keys of `forgetwatch.run.keys`: the overview in
    `forgetwatch/`, its figures per category in `forgetwatch_by_category/`, the rest in `forgetwatch_details/`.

    Example:
        >>> scalars_of(monitor.last_rows)["forgetwatch/forgetting"]  # doctest: +SKIP
        0.05
    """
    return {figure_key(group, name): value for group, figs in group_figures(rows, seconds, over_budget).items()
            for name, value in figs.items()}


def _vs_base(base_correct: int, now_correct: int) -> str:
    return {(1, 1): "retained", (1, 0): "forgotten", (0, 1): "learned", (0, 0): "never known"}[(base_correct, now_correct)]
