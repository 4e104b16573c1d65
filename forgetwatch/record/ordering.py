"""Evaluations in step order, whatever order they were scored in.

A watcher can score a checkpoint late: one that failed to load and was mended, a step set aside by `RunRecord.recover`
(a metrics line a program changed) or by `forgetwatch watch --rescore`. Such a step is inserted where it belongs: its
flips are against the committed step just before it, the flips of the step just after it are recomputed against it,
the budget's events from it on are those of the evaluations in step order, and the replay file follows step order.
What depends on the order is recomputed from the evaluations' npz files and metrics lines (`walk`); each step's own
files (npz, metrics line, at-risk rows) do not depend on it.

Crash safety: `RunRecord.begin_reordering` writes `reordering.json` before the first write, and the late step's
`metrics.jsonl` line still commits it, last. A writer killed in between leaves the step unfinished (`recover` sets its
files aside) and the marker, so the next writer's `Monitor.open` recomputes the order's rows from the marker's step
(`repair`): the record is the one the evaluations it holds make in step order, file by file. A record an earlier
forgetwatch wrote out of order is put in order the same way.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from ..measures.budgets import Breach, BudgetState
from ..measures.robustness import VariantOutcomes
from ..scoring.results import ProbeResults
from .replay import ReplayTracker

# the functions below take the `forgetwatch.run.monitor.Monitor` that composes them, typed `Monitor` only in words: it
# imports this module, and no two modules import each other
Monitor = Any

__all__ = ["Late", "History", "walk", "insert_late", "repair"]

logger = logging.getLogger(__name__)
_LINES = ("metrics.jsonl", "flips.jsonl", "at_risk.jsonl", "events.jsonl")


@dataclass
class Late:
    """An evaluation scored after a later step was committed: its results and its metrics.jsonl rows by group."""

    step: int
    results: ProbeResults
    robust: VariantOutcomes | None
    rows: dict[str, dict[str, Any]]


@dataclass
class History:
    """The record's evaluations replayed in step order: the rows that depend on the order from `start` on, and the
    monitor's state after the last one."""

    tracker: ReplayTracker
    state: BudgetState = field(default_factory=BudgetState)
    unjudged: set[str] = field(default_factory=set)
    flips: list[dict[str, Any]] = field(default_factory=list)
    redone: set[int] = field(default_factory=set)  # the steps whose flips are in `flips`
    events: list[dict[str, Any]] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    alerts: list[tuple[dict[str, Any], str, str]] = field(default_factory=list)  # the late step's budget events
    breaches: list[Breach] = field(default_factory=list)  # the limits the late step newly exceeds
    last: ProbeResults | None = None
    last_robust: VariantOutcomes | None = None


def walk(monitor: Monitor, start: int, late: Late | None = None) -> History:
    """Replay the committed evaluations (and `late`) in step order as an uninterrupted run scores them: each one's
    flips against the one before (a probe scored NaN / inf keeping its previous outcome), the replay tracker and the
    budget. Steps whose npz is gone (removed by hand) keep their flips and pass their turn."""
    record, base = monitor.record, monitor.base
    assert record is not None and base is not None
    # type-checked: a line forgetwatch could not have written is refused by name, not a KeyError mid-replay
    lines = {r["step"]: r["metrics"] for r in record.read_metrics(checked=True)}
    if late is not None:
        lines[late.step] = late.rows
    with_files = set(record.eval_steps())
    partial = {r["step"] for r in record.read_metrics() if r.get("partial")}  # no variants scored there
    h = History(ReplayTracker(monitor.probes, base.outcome))
    prev, prev_robust = None, None
    for step in sorted(lines):
        h.steps.append(step)
        results = robust = None
        if late is not None and step == late.step:
            results, robust = late.results, late.robust
        elif step in with_files:
            results, robust = record.read_results(step, monitor.probes.ids), monitor._read_robust(record, step)
        if results is not None:
            before = prev if prev is not None else base
            before_robust = prev_robust if prev is not None else monitor.base_robust
            held, _ = results.held(base, before)
            if step > 0:
                h.tracker.update(step, held.outcome)
            if step >= start:
                h.flips += monitor.flips(before, held, step)
                if robust is not None and before_robust is not None:
                    h.flips += monitor.fragile_flips(before_robust, robust, held, step)
                h.redone.add(step)
            prev, prev_robust = held, (robust if step not in partial else prev_robust)
        if monitor.budget is not None:
            new, events, h.unjudged = monitor.budget_events(h.state, h.unjudged, step, lines[step])
            if step >= start:
                h.events += [row for row, _, _ in events]
            if late is not None and step == late.step:
                h.alerts, h.breaches = events, new
    h.last, h.last_robust = prev, prev_robust
    return h


def insert_late(monitor: Monitor, late: Late, line: dict[str, Any], at_risk: list[dict[str, Any]]) -> History:
    """Write the evaluation `late` into the record in step order; `line` is its metrics.jsonl line, written last (the
    commit point). Budget alerts for its new breaches go out before it. Returns the replayed history."""
    record = monitor.record
    assert record is not None
    record.begin_reordering(late.step)
    record.write_eval(late.step, late.results, monitor.probes.fingerprint, late.robust)
    h = walk(monitor, late.step, late)
    record.rewrite_steps("flips.jsonl", h.redone, h.flips)
    record.rewrite_steps("at_risk.jsonl", {late.step}, at_risk)
    if monitor.replay:
        record.write_replay(h.tracker.lines())
    if monitor.budget is not None:
        for _, title, text in h.alerts:
            monitor.say_event(title, text)
        record.rewrite_steps("events.jsonl", {s for s in h.steps if s >= late.step}, h.events)
        monitor.write_budget(h.state)
    record.insert_metrics(line)
    record.end_reordering()
    return h


def repair(monitor: Monitor) -> int | None:
    """On opening a record: finish a reordering a killed writer left (`reordering.json`), or put in step order a record
    an earlier forgetwatch wrote out of order. Returns the step recomputed from, or None when nothing was to do. A
    record holding a step twice (two writers) is left as it is: `forgetwatch report` names it."""
    record = monitor.record
    assert record is not None
    steps = record.committed_steps(file_order=True)
    pending = record.reordering()
    misplaced = [b for a, b in zip(steps, steps[1:], strict=False) if b < a]
    if len(set(steps)) < len(steps) or (pending is None and not misplaced):
        return None
    start = min([s for s in (pending, min(misplaced, default=None)) if s is not None])
    rescored = pending is not None and record.reordering_reason() == "rescore"
    record.begin_reordering(start)
    h = walk(monitor, start)
    record.rewrite_steps("flips.jsonl", h.redone, h.flips)
    if monitor.budget is not None:
        record.rewrite_steps("events.jsonl", {s for s in h.steps if s >= start}, h.events)
    if misplaced:  # every row in step order; the commit lines last
        for name in _LINES[1:] + _LINES[:1]:
            record.rewrite_steps(name, set(), [])
    record.end_reordering()
    if rescored and not misplaced:  # asked for (`watch --rescore`): said plainly, not as the trace of a kill
        logger.info("forgetwatch: %s: step %d was set aside to be scored again; the flips%s after it are recomputed "
                    "against the step before it until it is", record.root, pending,
                    " and budget events" if monitor.budget is not None else "")
        return start
    logger.warning("forgetwatch: %s %s; the flips%s from step %d on are recomputed in step order from the evaluations' "
                   "files", record.root, "held steps scored out of order" if misplaced else
                   "was left in the middle of inserting a step scored late (a kill?)",
                   " and budget events" if monitor.budget is not None else "", start)
    return start
