"""The monitor's side of a forgetting budget: each evaluation's turn of it (limits newly exceeded, figures that cannot be
judged, the events and alerts they raise), the last evaluation within budget and its checkpoint, and `budget.json`.
The limits and their bounds are `forgetwatch.measures.budgets`'; this keeps the run's state of them.

`Monitor` (`forgetwatch.run.monitor`) takes these as its own methods. Plain Python.

Example:
    >>> monitor.within_budget()  # doctest: +SKIP
    {'step': 20, 'checkpoint': 'out/checkpoint-20'}
"""

from __future__ import annotations

import logging
from typing import Any

from ..measures.budgets import ROBUST_BUDGETS, Breach, BudgetState

__all__ = ["BudgetWatch"]

logger = logging.getLogger(__name__)


class BudgetWatch:
    """The budget's state through a run (`budget_state`), as methods of `Monitor` (which holds the budget, the record,
    the loggers and the output directory)."""

    budget_state: BudgetState

    def _check_budget(self, step: int, rows: dict[str, dict[str, Any]]) -> list[Breach]:
        """Compare this evaluation with the budget; alert on each limit newly exceeded. Never raises."""
        assert self.budget is not None and self.record is not None
        try:
            new, events, self._unjudged_before = self.budget_events(self.budget_state, self._unjudged_before, step, rows)
            for row, title, text in events:
                self.say_event(title, text)
                self.record.append_event(row)
            self.write_budget()
            return new
        except OSError:  # events.jsonl or budget.json could not be written: the step cannot be committed either
            raise
        except Exception:
            logger.exception("forgetwatch: could not check the forgetting budget at step %d; training goes on", step)
            return []

    def say_event(self, title: str, text: str) -> None:
        """A budget event's warning, and its alert to every logger."""
        logger.warning("forgetwatch: budget%s %s", " exceeded." if title.endswith("over budget") else ".", text)
        for lg in self.loggers:
            lg.alert(title, text)

    def budget_events(self, state: BudgetState, unjudged_before: set[str], step: int, rows: dict[str, dict[str, Any]]
                      ) -> tuple[list[Breach], list[tuple[dict[str, Any], str, str]], set[str]]:
        """One evaluation's turn of the budget: `state` updated in place; returns the limits newly exceeded, the events
        (row of events.jsonl, alert title, text) and the keys that cannot be judged now (`unjudged_before` next)."""
        assert self.budget is not None
        unjudged = self._unjudged(rows) if step > 0 else []
        new = state.update(step, self.budget.check(rows) if step > 0 else [], unjudged=unjudged)
        within = self.within_budget(state)
        events = []
        new_unjudged = [k for k in unjudged if k not in unjudged_before]
        if new_unjudged:  # said when it starts, like a limit exceeded: not at every evaluation it lasts
            groups = {lim.group: lim for lim in self.budget.limits if lim.key in new_unjudged}
            reason = next(rows[g].get("missing") or rows[g]["robust_missing"] for g in groups if g in rows)
            text = (f"Step {step}: cannot judge {', '.join(new_unjudged)}: {reason}. This step does not count as within "
                    "budget.")
            events.append(({"step": step, "event": "budget_cannot_judge", "keys": new_unjudged, "reason": reason,
                            "last_within_budget": within}, "forgetwatch: budget cannot judge", text))
        for b in new:
            where = f"step {within['step']}" + (
                f" ({within['checkpoint']})" if within["checkpoint"] else ", no checkpoint saved there"
            )
            text = f"Step {step}: {b.describe()}. Last evaluation within budget: {where}. Action: {self.budget.on_budget}."
            events.append(({"step": step, "event": "budget_exceeded", "key": b.key, "value": b.value,
                            "measured": b.measured, "limit": b.limit, "bound": b.bound, "action": self.budget.on_budget,
                            "last_within_budget": within}, f"forgetwatch: {b.key} over budget", text))
        return new, events, set(unjudged)

    def _unjudged(self, rows: dict[str, dict[str, Any]]) -> list[str]:
        """The budget's keys whose figure is missing at this evaluation (probes, or for robust figures their variants,
        scored NaN / inf)."""
        assert self.budget is not None

        def missing(lim) -> bool:
            row = rows.get(lim.group) or {}
            return bool(row.get("missing") or (lim.metric in ROBUST_BUDGETS and row.get("robust_missing")))

        return [lim.key for lim in self.budget.limits if missing(lim)]

    def within_budget(self, state: BudgetState | None = None) -> dict[str, Any]:
        """The last evaluation within budget and its checkpoint directory, when the trainer saved one at that step."""
        step = (state if state is not None else self.budget_state).last_within
        ckpt = self.output_dir / f"checkpoint-{step}" if step is not None and self.output_dir is not None else None
        return {"step": step, "checkpoint": str(ckpt) if ckpt is not None and ckpt.is_dir() else None}

    def write_budget(self, state: BudgetState | None = None) -> None:
        assert self.budget is not None and self.record is not None
        state = state if state is not None else self.budget_state
        self.record.write_budget({**self.budget.to_dict(), "over": sorted(state.over),
                                  "last_within_budget": self.within_budget(state)})
