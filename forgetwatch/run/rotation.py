"""The monitor's side of partial evaluations (`max_share`): which probes a partial pass must score (those that flipped
last time, those whose turn is due after K-1 evaluations unscored), its design at a step, every probe's latest result
merged from the pass and the last, whether the estimates would trip a budget, and the rotation read back from the record
on a resume. The sampling and the estimates are `forgetwatch.measures.partial`'s; this keeps the run's state of them.

`Monitor` (`forgetwatch.run.monitor`) takes these as its own methods. Plain NumPy.

Example:
    >>> design = monitor.partial_design(step=20, fraction=0.25, seed=0, steady=0.25)  # doctest: +SKIP
    >>> results = monitor.merged(scored)  # doctest: +SKIP
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from ..measures.drift import at_risk_mask
from ..measures.partial import MIN_SAMPLE, Design, estimate_rows, plan_partial, rotation_k
from ..scoring.results import CORRECT, ProbeResults

__all__ = ["PartialRotation"]

logger = logging.getLogger(__name__)


class PartialRotation:
    """Each probe's evaluations since it was last scored (`ages`), the flips of the last evaluation (`flipped_last`) and
    the revisit bound K (`rotation_k`), as methods of `Monitor` (which holds the probes, the base and the record)."""

    ages: np.ndarray | None
    flipped_last: np.ndarray | None
    rotation_k: int | None

    def merged(self, scored: ProbeResults) -> ProbeResults:
        """Every probe's latest result: those in `scored` as scored now, the others as last scored (the last
        evaluation, or the base)."""
        assert self.base is not None
        latest = self.last if self.last is not None else self.base
        out = latest.take(range(len(latest)))
        for j, pid in enumerate(scored.ids):
            out.set_row(self.probes.index_of(pid), scored, j)
        return out

    def must_score(self) -> np.ndarray:
        """The probes a partial evaluation scores whatever its share: those that flipped at the last evaluation, and
        those due (not scored in the last K-1 evaluations)."""
        must = self._flipped_or_bad()
        if self.ages is not None and self.rotation_k is not None:
            must |= self.ages >= self.rotation_k - 1
        return must

    def _flipped_or_bad(self) -> np.ndarray:
        """Flipped at the last evaluation, or not finite when last scored (scored again: a NaN must not stand for the
        probe until it is due, blanking its groups' estimates)."""
        n = len(self.probes)
        must = self.flipped_last.copy() if self.flipped_last is not None else np.zeros(n, bool)
        if self.last is not None:
            must |= self.last.nonfinite_mask()
        return must

    def risk(self) -> np.ndarray:
        """Each probe's margin when last scored where it was at risk then (right at base, still right, margin under the
        at-risk threshold or fallen by the drop), inf elsewhere: a partial evaluation scores the lowest first."""
        assert self.base is not None
        latest = self.last if self.last is not None else self.base
        return np.where(at_risk_mask(self.base, latest, self.risk_rule), latest.margin.astype(np.float64), np.inf)

    def kinds(self) -> np.ndarray:
        """Each probe's kind as a partial evaluation samples them: knowledge or behavior, each with its own share."""
        return np.array(["behavior" if p.is_behavior else "knowledge" for p in self.probes], dtype=str)

    def partial_design(self, step: int, fraction: float, seed: int, steady: float | None = None) -> Design:
        """The design of a partial evaluation at `step` scoring `fraction` of each kind (`forgetwatch.measures.partial`).
        `steady`: the share the partial evaluations afford on average (`ShareBudget.steady`), which sizes K: twice the
        mean revisit time at it (or at the fewest a sample takes of the largest kind). K only grows, so that the due
        probes never eat a share that shrank; each evaluation's K is in the record. None (nothing timed yet): K is not
        set, and no probe is due."""
        kinds = self.kinds()
        if steady is not None:
            largest = max(int((kinds == kind).sum()) for kind in set(kinds.tolist()))
            self.rotation_k = max(self.rotation_k or 0, rotation_k(max(steady, MIN_SAMPLE / largest)))
        ages = self.ages if self.ages is not None else np.zeros(len(self.probes), np.int64)
        return plan_partial(kinds, self._flipped_or_bad(), ages, self.rotation_k, fraction, seed, step, risk=self.risk(),
                            categories=self._categories)

    def would_trip(self, results: ProbeResults, design: Design) -> bool:
        """Whether a partial evaluation's estimates would newly exceed a budget limit: with on_budget "save" or "stop"
        the callback then scores every probe at that step, so that the checkpoint it saves (or the step it stops at)
        has an exact pass. Never raises (False)."""
        if self.budget is None or self.base is None:
            return False
        try:
            _, _, rows = self.figures(results)
            estimate_rows(rows, self._members, design, self.base.outcome, results.outcome, self._k, self._categories)
            return any(b.key not in self.budget_state.over for b in self.budget.check(rows))
        except Exception:
            logger.exception("forgetwatch: could not judge the partial evaluation at step %d against the budget; it is "
                             "judged as recorded", design.step)
            return False

    def _advance_rotation(self, design: Design | None, prev: ProbeResults, now: ProbeResults) -> None:
        n = len(self.probes)
        scored = design.scored if design is not None else np.ones(n, bool)
        self.ages = np.where(scored, 0, (self.ages if self.ages is not None else np.zeros(n, np.int64)) + 1)
        self.flipped_last = (prev.outcome == CORRECT) != (now.outcome == CORRECT)

    def share_account(self) -> dict[str, Any] | None:
        """The time account (max_share) the record's last evaluation kept, or None."""
        if self.record is None or not self.evaluated_steps:
            return None
        line = next((r for r in reversed(self.record.read_metrics()) if r["step"] == self.evaluated_steps[-1]), {})
        return line.get("share")

    def _read_rotation(self) -> None:
        """The rotation as the record's evaluations left it (a resumed run goes on with it): each probe's evaluations
        since it was last scored, the flips of the last evaluation, and K."""
        assert self.record is not None and self.base is not None
        self.ages = self.flipped_last = self.rotation_k = None
        steps = self.evaluated_steps
        if not steps:
            return
        n = len(self.probes)
        ages = np.zeros(n, np.int64)
        with_files = set(self.record.eval_steps())
        ks = [line["partial"]["k"] for line in self.record.read_metrics()
              if line.get("partial") and line["partial"].get("k") is not None]
        self.rotation_k = max(ks) if ks else None  # K only grows: the run's latest
        for step in steps:
            z = self.record.read_eval(step) if step in with_files else {}
            scored = np.asarray(z["scored"]).astype(bool) if "scored" in z else np.ones(n, bool)
            ages = np.where(scored, 0, ages + 1)
        self.ages = ages
        if len(steps) >= 2 and {steps[-1], steps[-2]} <= with_files:
            a, b = (self.record.read_results(s, self.probes.ids).outcome for s in steps[-2:])
            self.flipped_last = (a == CORRECT) != (b == CORRECT)
