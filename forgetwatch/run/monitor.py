"""What happens to one evaluation's results: the figures against the base, the local record, the loggers, the budget.

`Monitor` is shared by the two ways of scoring a run: `ForgetWatchCallback` (scoring inside the training process) and
`forgetwatch watch` (scoring the saved checkpoints beside it). Both hand it `ProbeResults` keyed by the trainer's
global step, so their records and curves are the same. Plain Python and NumPy: no torch here.

Example:
    >>> monitor = Monitor(probes, budget=None)  # doctest: +SKIP
    >>> monitor.open(output_dir, base_cache, loggers=[], resume_step=None)  # doctest: +SKIP
    >>> monitor.report(results, step=50, epoch=0.1, seconds=12.0)  # doctest: +SKIP
"""

from __future__ import annotations

import bisect
import logging
import math
import re
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import RecordWriteError
from ..measures.behavior import compute_behavior
from ..measures.budgets import Breach, Budget, BudgetState
from ..measures.drift import RiskRule, at_risk_mask, compute_drift
from ..measures.metrics import compute_report, mark_missing
from ..measures.noise import NoiseFloor, noise_floor
from ..measures.partial import Design, estimate_rows
from ..measures.robustness import (
    VariantOutcomes,
    variant_outcomes,
)
from ..probes.probe_set import ProbeSet
from ..probes.variants import VariantPlan
from ..record.cache import BaseCache, CacheMismatchError
from ..record.ordering import History, Late, insert_late, repair, walk
from ..record.replay import ReplayTracker
from ..record.segments import ProbeSetChangedError, check_probes, segment_start
from ..record.store import RunRecord
from ..scoring.results import ProbeResults
from .budget_watch import BudgetWatch
from .console import format_evaluation, headline_categories, say
from .cost import cost_line, cost_summary
from .keys import OVERALL, PREFIX, final_key, table_key
from .rotation import PartialRotation
from .rows import add_robust_figures, flip_rows, fragile_flip_rows, members_of, scalars_of

__all__ = ["Monitor", "figure_rows"]

logger = logging.getLogger(__name__)


class Monitor(PartialRotation, BudgetWatch):
    """One run's forgetting record, kept up to date evaluation by evaluation.

    Args:
        probes: the frozen probe set.
        budget: a `Budget`, or None.
        risk_rule: which probes count as at risk.
        log_table: log the flips and at-risk tables to the loggers that take tables.
        replay: keep `replay.jsonl` (forgotten probes as training examples) up to date.
        strict: raise `RecordWriteError` when an evaluation cannot be written (the watcher: it can stop and be
            restarted), instead of saying so and going on (the callback: training goes on, and it stops probing: see
            `write_failure`).
        plan: with robustness on, which variants are scored (`forgetwatch.probes.variants.plan_variants`): the robust
            figures, fragile flips and the variants' outcomes in the record.
        console: print one line per evaluation (`forgetwatch.run.console`) starting with this label ("forgetwatch",
            "forgetwatch watch"); None: no line.
    """

    def __init__(self, probes: ProbeSet, budget: Budget | None = None, risk_rule: RiskRule | None = None,
                 log_table: bool = True, replay: bool = False, strict: bool = False, plan: VariantPlan | None = None,
                 console: str | None = None):
        self.probes, self.budget, self.log_table, self.replay = probes, budget, log_table, replay
        self.console = console
        self.plan = plan
        self.base_robust: VariantOutcomes | None = None
        self.last_robust: VariantOutcomes | None = None
        self.strict = strict
        # the evaluation that could not be written ({"step", "path", "error"}), or None: the record ends before it, so a
        # writer that goes on must stop scoring (a later step written after a hole would have its flips against the
        # step before the hole, and nothing would say the hole is there)
        self.write_failure: dict[str, Any] | None = None
        self._said_missing: set[str] = set()  # which kinds of missing figures were said (once a run)
        self._unjudged_before: set[str] = set()
        self.risk_rule = risk_rule or RiskRule()
        self.evaluated_steps: list[int] = []
        self.segment_from: int | None = None  # a later segment of the record: the step it starts at (no base row)
        self.record: RunRecord | None = None
        self.output_dir: Path | None = None
        self.base: ProbeResults | None = None
        self.noise: NoiseFloor | None = None
        self.loggers: list = []
        self.tracker: ReplayTracker | None = None
        self.last: ProbeResults | None = None
        self.last_report: dict = {}
        self.last_drift: dict = {}
        self.last_rows: dict = {}
        self.budget_state = BudgetState()
        self.precision, self.evaluation_seconds, self.n_evaluations = "", 0.0, 0  # this start's probing (`finish`)
        self._k = np.array([p.num_choices for p in probes])
        self._categories = [p.category for p in probes]
        self._kinds = [p.kind for p in probes]
        # knowledge and behaviour probes together: "overall" pools them; these two groups keep them apart
        self._groups = probes.kind_groups()
        self._members = members_of(probes)
        # what replay can weigh: categories, not summary groups (behaviour categories too: self-distilled replay can
        # replay the base's own answers to behaviour prompts)
        self._replayable = {p.category for p in probes}
        # with `max_share` (`forgetwatch.measures.partial`): each probe's evaluations since it was last scored, and whether it
        # flipped at the last evaluation; None until the first evaluation after open
        self.budgeted = False
        self.ages: np.ndarray | None = None
        self.flipped_last: np.ndarray | None = None
        self.rotation_k: int | None = None

    def open(self, output_dir: str | Path, cache: BaseCache, precision: str, loggers: list, resume_step: int | None,
             start: str | None = None, base_seconds: float = 0.0) -> None:
        """Start (or continue) the record under `<output_dir>/forgetwatch/` against the base in `cache`.

        With `resume_step`, evaluations after it are forgotten (set aside under `superseded/`, in the folder of the
        training start `start` that resumed) and the rest read back, so that the next evaluation continues as in an
        uninterrupted run (its flips against the last one, the budget's state as it was); without, the record starts
        empty and the base is reported as step 0, with `base_seconds` (what scoring it took in this process: 0 when it
        came from a cache)."""
        self.output_dir = Path(output_dir)
        self.precision, self.evaluation_seconds, self.n_evaluations = precision, 0.0, 0
        self.record = record = RunRecord(self.output_dir / PREFIX)
        self.write_failure = None
        self.base, self.noise, self.loggers = cache.results, noise_floor(cache, precision), loggers
        self.base_robust = self._base_robust(cache) if self.plan is not None else None
        self.last_robust = None
        unmeasured = sum(bool(g) and s < 0 for g, s in zip(self.base.generation, self.base.stopped, strict=True))
        if unmeasured:  # a cache written before answer lengths and stops were kept
            logger.warning("forgetwatch: the base cache holds %d generated answers without their length and stop (written "
                           "by an earlier forgetwatch): the stopping and length figures leave them out; make the cache "
                           "again (`forgetwatch cache`) to include them", unmeasured)
        record.root.mkdir(parents=True, exist_ok=True)
        # the record's probe set is pinned by its first evaluation: the callers refuse other probes (or start a new
        # segment, `forgetwatch.record.segments`) before anything is scored; this is the last guard, never an overwrite
        pinned, _ = check_probes(record.root, self.probes, "refuse", who=self.console or "this run")
        if pinned.fingerprint != self.probes.fingerprint:
            raise ProbeSetChangedError(f"{record.root}: the record's probes are these in another order; score them in "
                                       "the record's order (`forgetwatch.record.segments.check_probes`)")
        self.probes.to_jsonl(record.root / "probes.jsonl")
        # a later segment of the record (the probe set changed at a resume) starts there, without a base row
        self.segment_from = segment_start(record.root)
        if resume_step is None and self.segment_from is not None:
            resume_step = self.segment_from
        record.recover()  # a crash mid-evaluation: its partial files set aside, the step scored again
        record.truncate_after(resume_step if resume_step is not None else -1, start=start)
        try:  # a step scored late that a killed writer left half inserted, or a record an earlier version wrote out of order
            repair(self)
        except Exception:
            if self.strict:
                raise
            logger.exception("forgetwatch: could not put the record's steps in order on opening it; training goes on")
        # the next evaluation continues as in an uninterrupted run: the replay tracker and the budget as the evaluations
        # made them, in step order
        self.last, self._unjudged_before = None, set()
        try:
            history = walk(self, start=math.inf)
        except Exception:  # never end a resumed run over a record it cannot read back
            if self.strict:
                raise
            logger.exception("forgetwatch: could not read back the record's evaluations; the replay file and the budget "
                             "start again from the next evaluation; training goes on")
            history = History(ReplayTracker(self.probes, self.base.outcome), steps=sorted(record.committed_steps()))
        self.tracker, self.budget_state, self.evaluated_steps = history.tracker, history.state, history.steps
        try:
            self._read_rotation()
        except Exception:  # the rotation starts again: every probe is due soon, nothing is lost
            logger.exception("forgetwatch: could not read back which probes the record's partial evaluations scored; the "
                             "rotation starts again")
            self.ages = self.flipped_last = self.rotation_k = None
        if self.budget is not None:
            self._unjudged_before = history.unjudged
        last, last_robust = history.last, history.last_robust
        if last is not None and self.evaluated_steps[-1] > 0:
            # the next evaluation's flips are against the last one's, as in an uninterrupted run (not against the base)
            try:
                self.last_report, self.last_drift, self.last_rows = self.figures(last, last_robust)
                self.last, self.last_robust = last, last_robust
                line = next((r for r in reversed(record.read_metrics()) if r["step"] == self.evaluated_steps[-1]), {})
                if line.get("partial"):  # a partial evaluation's figures are its estimates, as recorded
                    self.last_rows = line["metrics"]
            except Exception:
                logger.exception("forgetwatch: could not recompute the figures of recorded step %d; the next evaluation's "
                                 "flips are counted against the base; training goes on", self.evaluated_steps[-1])
        try:  # files rewritten whole, as they stood at the last committed evaluation (a killed one may have gone on)
            if self.budget is not None and self.evaluated_steps:
                self.write_budget()
            if self.replay and self.evaluated_steps:
                record.write_replay(self.tracker.lines())
        except OSError:
            logger.exception("forgetwatch: could not rewrite budget.json / replay.jsonl on opening the record")
        if resume_step is None:
            self.report(self.base, step=0, epoch=0.0, seconds=base_seconds, robust=self.base_robust)
            _warn_nothing_to_forget(self.last_report)

    def _base_robust(self, cache: BaseCache) -> VariantOutcomes:
        """The base's variants, from the cache (whose key the caller checked against the plan's)."""
        assert self.plan is not None
        want = [p.id for p in self.plan.extra()]
        have = cache.variants.ids if cache.variants is not None else []
        if not set(want) <= set(have):  # a cache of more variants on the same probes serves (the first K are these)
            missing = [i for i in want if i not in set(have)]
            raise CacheMismatchError(f"the base cache holds {len(have)} rows of variants, not the {len(want)} this run scores "
                                     f"(first missing: {', '.join(map(repr, missing[:3]))}): make it with the same "
                                     "`--robustness` and `--robust-per-suite` as the run")
        return variant_outcomes(self.plan, cache.results, cache.variants)

    def _read_robust(self, record: RunRecord, step: int) -> VariantOutcomes | None:
        """A recorded evaluation's variants when they are this plan's (a step scored without variants has none)."""
        if self.plan is None:
            return None
        robust = record.read_robust(step)
        if robust is None or robust.ids != list(self.plan.variants) or robust.right.shape != self.base_robust.right.shape:
            return None
        return robust

    # -- figures ------------------------------------------------------------------------------------------------
    def figures(self, results: ProbeResults, robust: VariantOutcomes | None = None
                ) -> tuple[dict, dict, dict[str, dict[str, Any]]]:
        """(forgetting report, drift, both as metrics.jsonl rows by group) for results against the base; with the
        variants' outcomes (robustness on), the robust figures in the same rows."""
        assert self.base is not None
        report = compute_report(self.base.outcome, results.outcome, self._k, self._categories, self._groups)
        drift = compute_drift(self.base, results, self._categories, self.risk_rule, self._groups)
        rows = {name: {**m.to_dict(), **drift[name].to_dict()} for name, m in report.items()}
        if (self.base.stopped >= 0).any():  # generated answers: how they behave (stopping, length, refusals)
            behavior = compute_behavior(self.base, results, self._categories, self._kinds, self._groups)
            for name, row in rows.items():
                row.update(behavior[name].to_dict())
        if self.noise is not None:
            # flips with and without the probes whose base correctness depends on the precision
            keep = ~self.noise.mask
            clean = compute_report(self.base.outcome[keep], results.outcome[keep], self._k[keep],
                                   [c for c, k in zip(self._categories, keep, strict=True) if k],
                                   {g: m[keep] for g, m in self._groups.items()}) if self.noise.count else report
            for name, row in rows.items():
                row["forgetting_excl_noise"] = clean[name].forgetting if name in clean else float("nan")
                row["forgetting_adjusted_excl_noise"] = clean[name].forgetting_adjusted if name in clean else float("nan")
            rows["overall"].update(noise_probes=self.noise.count, min_detectable_forgetting=self.noise.min_detectable())
        if robust is not None and self.base_robust is not None:
            add_robust_figures(rows, self.probes, self.base_robust, robust, self.plan.lettered)
        bad = self.base.nonfinite_mask() | results.nonfinite_mask()
        if bad.any():
            mark_missing(rows, bad, self._members, [self.probes[int(i)].id for i in np.flatnonzero(bad)])
        return report, drift, rows

    @property
    def figures_missing(self) -> bool:
        """Some figure of the last evaluation is missing (probes scored NaN / inf)."""
        return any(row.get("missing") for row in self.last_rows.values())

    def category_forgetting(self) -> dict[str, float]:
        """Each category's forgetting at the last evaluation, as replay weighs it: chance-adjusted (a rate net of
        lucky guesses), raw where there is no chance term (short answers). Categories whose figures are missing are
        left out (see `figures_missing`)."""
        out = {}
        for name, m in self.last_report.items():
            row = self.last_rows.get(name, {})
            if name in self._replayable and not row.get("missing"):
                if row.get("partial"):  # a partial evaluation: its estimates, not the probes' latest results
                    value, raw = row["forgetting_adjusted"], row["forgetting"]
                else:
                    value, raw = m.forgetting_adjusted, m.forgetting
                out[name] = raw if value is None or math.isnan(value) else value
        return out

    # -- one evaluation -----------------------------------------------------------------------------------------
    def report(self, results: ProbeResults, step: int, epoch: float, seconds: float,
               robust: VariantOutcomes | None = None, source: dict[str, Any] | None = None,
               design: Design | None = None, share: dict[str, Any] | None = None) -> list[Breach]:
        """Record and log one evaluation, and check the budget; never raises into training (unless `strict`, when the
        record cannot be written).

        The record's files of this step are written first and its `metrics.jsonl` line last: that line commits the
        evaluation, so a crash anywhere before it leaves the step unfinished (`RunRecord.recover` sets its files aside
        and the step is scored again), never half in the record. A step lower than the record's last (a checkpoint
        scored late) is inserted in step order (`_report_late`). `robust`: the variants' outcomes (robustness on).
        `design`: a partial evaluation's (`forgetwatch.measures.partial`; `results` then holds every probe's latest result, from
        `merged`): its figures are estimates, and the record keeps what it scored. `share`: with max_share, the time
        account so far (`ShareBudget.to_dict`), kept in the line for a resumed run. Returns the budget limits newly
        exceeded."""
        if step > 0:  # the cost line at the end of training (`finish`)
            self.evaluation_seconds += seconds
            self.n_evaluations += 1
        assert self.base is not None and self.record is not None and self.tracker is not None
        prev = self.last if self.last is not None else self.base
        # a later segment's first evaluation: no earlier one of these probes, so its flips are counted from the base
        first_of_segment = self.segment_from is not None and not self.evaluated_steps and step > 0
        prev_robust = self.last_robust if self.last is not None else self.base_robust
        try:
            report, drift, rows = self.figures(results, robust)
            if design is not None:
                estimate_rows(rows, self._members, design, self.base.outcome, results.outcome, self._k, self._categories)
            elif self.budgeted:
                rows[OVERALL].update(partial=0, share_scored=1.0)
            if share is not None:
                rows[OVERALL]["probe_share"] = share["measured_share"]
        except Exception:  # a figure that cannot be computed must not end a training run
            logger.exception("forgetwatch: could not compute the figures at step %d; training goes on", step)
            return []
        self._say_missing(rows, step)
        if self.evaluated_steps and step < max(self.evaluated_steps):  # scored late: inserted in step order
            return self._report_late(Late(step, results, robust, rows), epoch, seconds, source)
        self.last_report, self.last_drift, self.last_rows = report, drift, rows
        # a probe scored NaN / inf keeps the outcome it had: it neither flips nor counts as forgotten for replay
        held, bad = results.held(self.base, prev)
        if step > 0:
            self.tracker.update(step, held.outcome)
        flips, at_risk, breaches = [], [], []
        root = self.record.root
        writing = self.record.eval_path(step)  # the file being written, for the message when a write fails
        try:
            self.record.write_eval(step, results, self.probes.fingerprint, robust,
                                   design.to_arrays() if design is not None else None)
            flips = self.flips(prev, held, step)
            if robust is not None and prev_robust is not None:
                flips += self.fragile_flips(prev_robust, robust, held, step)
            writing = root / "flips.jsonl"
            self.record.append_flips(flips)
            at_risk = [r for r in self.at_risk(results, step) if not bad[i := self.probes.index_of(r["id"])]
                       and (design is None or design.scored[i])]  # a probe not scored now is not judged now
            writing = root / "at_risk.jsonl"
            self.record.append_at_risk(at_risk)
            if self.replay:
                writing = root / "replay.jsonl"
                self.record.write_replay(self.tracker.lines())
            writing = root / "events.jsonl"
            breaches = self._check_budget(step, rows) if self.budget is not None else []
            writing = root / "metrics.jsonl"
            self.record.append_metrics({"step": step, "epoch": epoch, "seconds": round(seconds, 3), "metrics": rows,
                                        **({"partial": design.summary()} if design is not None else {}),
                                        **({"share": share} if share is not None else {}), **(source or {})})
            # committed: the next evaluation's flips are against this one (never against one the record lacks)
            self._advance_rotation(design, prev, held)
            # a partial evaluation scores no variants: the next full pass's robustness changes are against the last's
            self.last, self.last_robust = held, robust if design is None else self.last_robust
            self.evaluated_steps.append(step)
        except Exception as e:
            text = self._write_failed(step, writing, e)
            if self.strict:
                raise RecordWriteError(text) from e
        scalars = scalars_of(rows, seconds, len(self.budget_state.over) if self.budget is not None else None)
        for lg in self.loggers:
            lg.log(scalars, step)
            # the at-risk table is not the at-risk count's key (`forgetwatch_details/at_risk`): that key is its curve
            for name, table in (("flips", flips), ("at_risk_probes", at_risk)):
                if self.log_table and table:
                    cols = list(table[0])
                    lg.log_table(table_key(name), cols, [[r[c] for c in cols] for r in table], step)
        if self.console:
            try:  # from the rows just recorded: the line and metrics.jsonl cannot disagree
                line = format_evaluation(step, rows, seconds, categories=headline_categories(self.probes), label=self.console)
                if first_of_segment:
                    line += f"; new probe set since step {self.segment_from}: flips against the base"
                if design is not None:
                    line += (f"; partial: {design.scored.sum()} of {len(design.scored)} probes scored, figures estimated "
                             + (f"(every probe at least every {design.k} evaluations)" if design.k is not None
                                else "(a pilot: timing the probes)"))
                say(line)
            except Exception:  # a line that cannot be made or printed must not end a training run
                logger.exception("forgetwatch: could not print the console line at step %d; training goes on", step)
        return breaches

    def _report_late(self, late: Late, epoch: float, seconds: float, source: dict[str, Any] | None) -> list[Breach]:
        """An evaluation at a step lower than the record's last (a checkpoint scored late): inserted in the record in
        step order (`forgetwatch.record.ordering`); the loggers that keep one value per step in order (W&B, trackio) get it as a
        row of the table `forgetwatch_details/late_evaluations` at the record's last step, the others at its own step.
        The last evaluation (`last`, the figures `finish` logs) stays the newest step's."""
        assert self.base is not None and self.record is not None
        step, newest = late.step, max(self.evaluated_steps)
        bad = self.base.nonfinite_mask() | late.results.nonfinite_mask()
        at_risk = [r for r in self.at_risk(late.results, step) if not bad[self.probes.index_of(r["id"])]]
        try:
            history = insert_late(self, late, {"step": step, "epoch": epoch, "seconds": round(seconds, 3),
                                               "metrics": late.rows, **(source or {})}, at_risk)
        except Exception as e:  # as an in-order step's: said once, noted, probing stops (the watcher: raised)
            text = self._write_failed(step, self.record.root, e)
            if self.strict:
                raise RecordWriteError(text) from e
            return []
        flips = [r for r in history.flips if r["step"] == step]
        self.tracker, self.budget_state, self._unjudged_before = history.tracker, history.state, history.unjudged
        self.last, self.last_robust = history.last, history.last_robust
        bisect.insort(self.evaluated_steps, step)
        after = [s for s in self.evaluated_steps if s > step][0]
        tabled = [lg.name for lg in self.loggers if not lg.takes_late_steps]
        logger.warning("forgetwatch: step %d was scored late (the record already held steps up to %d): inserted in step "
                       "order, step %d's flips recomputed against it%s", step, newest, after,
                       f"; {' and '.join(tabled)} (rows kept in the order logged) get it as a row of the table "
                       f"{table_key('late_evaluations')} at step {newest}" if tabled else "")
        scalars = scalars_of(late.rows, seconds, len(self.budget_state.over) if self.budget is not None else None)
        for lg in self.loggers:
            if lg.takes_late_steps:  # TensorBoard, MLflow: a value at any step, shown in step order
                lg.log(scalars, step)
                at = step
            else:
                cols = ["step", "scored_after_step", *scalars]
                lg.log_table(table_key("late_evaluations"), cols, [[step, newest, *scalars.values()]], newest)
                at = newest
            for name, table in (("flips", flips), ("at_risk_probes", at_risk)):  # their rows carry their step
                if self.log_table and table:
                    cols = list(table[0])
                    lg.log_table(table_key(name), cols, [[r[c] for c in cols] for r in table], at)
        if self.console:
            try:
                say(format_evaluation(step, late.rows, seconds, categories=headline_categories(self.probes),
                                      label=self.console) + f" (scored late, after step {newest}: inserted in step order)")
            except Exception:
                logger.exception("forgetwatch: could not print the console line at step %d; training goes on", step)
        return history.breaches

    def _write_failed(self, step: int, path: Path, error: Exception) -> str:
        """An evaluation the record could not hold: said once, as an ERROR naming the step, the file, the OS error and
        what to do; noted in `unwritten.jsonl` where that can still be written; sent to the loggers (an alert, and
        `forgetwatch/unwritten_step` in the run summary). Returns the text. Sets `write_failure`: the callback stops
        probing on it (a record with a hole in it must not go on as if whole)."""
        assert self.record is not None
        why = f"{type(error).__name__}: {error}"
        self.write_failure = {"step": step, "path": str(path), "error": why}
        noted = self.record.root / "unwritten.jsonl"
        try:
            self.record.append_unwritten({**self.write_failure, "time": round(time.time(), 3)})
            where = f"noted in {noted}, and `forgetwatch report` names it"
        except Exception as e:  # the root itself is out of reach too: the log line, the alert and the summary remain
            where = f"not even noted in {noted} ({type(e).__name__}: {e})"
        ends = f"ends at step {self.evaluated_steps[-1]}" if self.evaluated_steps else "holds no evaluation"
        folder = path.parent
        if self.strict:
            text = (f"step {step} could not be written to the record: writing {path}: {why}. The watcher stops; the "
                    f"record {ends} ({where}). Make {folder} writable again (free space, restore the folder or "
                    "its permissions), then run `forgetwatch watch` again: it scores step "
                    f"{step} and the checkpoints after it")
        else:
            earlier = _checkpoint_before(self.output_dir, step)
            if step == 0:  # the base, as training starts: nothing is lost by starting again but the time
                how = "then start the training again: this run's probing stopped before its first step"
            elif earlier is not None:
                how = (f"then resume training from {earlier} (a checkpoint from before step {step}; `trainer.train("
                       f"resume_from_checkpoint=...)`): the resumed run scores step {step} and the steps after it again")
            else:
                how = f"no checkpoint was saved before step {step}, so this run cannot score those steps again"
            guard = (f"; the budget (on_budget={self.budget.on_budget}) no longer judges this run"
                     if self.budget is not None else "")
            text = (f"step {step} could not be written to the record: writing {path}: {why}. Probing stops here: no "
                    f"later step is scored, training goes on untouched and the trainer's own logs are kept{guard}. The "
                    f"record {ends} ({where}). Make {folder} writable again (free space, restore the folder "
                    f"or its permissions); {how}")
        if not isinstance(error, OSError):  # a bug of forgetwatch: the traceback says where
            logger.exception("forgetwatch: %s", text)
        elif not self.strict:  # the disk's fault, said in full: a traceback would add nothing (strict: the error says it)
            logger.error("forgetwatch: %s", text)
        for lg in self.loggers:
            lg.alert("forgetwatch: record not written", text)
            lg.summary({f"{PREFIX}/unwritten_step": step})
        return text

    def _say_missing(self, rows: dict[str, dict[str, Any]], step: int) -> None:
        """Once a run: figures are missing because probes scored NaN / inf, and why."""
        for field, what in (("missing", "figures"), ("robust_missing", "robust figures")):
            missing = [name for name, row in rows.items() if row.get(field)]
            if missing and field not in self._said_missing:
                self._said_missing.add(field)
                logger.warning("forgetwatch: at step %d %s; the %s of %s are missing (NaN in metrics.jsonl with the reason "
                               "in `%s`; not logged) wherever that happens, and a budget on them cannot judge. Lower the "
                               "learning rate, or train in bf16 rather than fp16.", step, rows[missing[0]][field], what,
                               ", ".join(missing), field)

    def finish(self, cost: dict[str, float] | None = None, train_seconds: float | None = None) -> None:
        """The run summary (`forgetwatch/final/...`, the budget's outcome) to every logger, then close them. With
        `cost` (the start's passes, `forgetwatch.run.cost`) and `train_seconds` (a training run's `train()`): what
        probing cost it, in the console and the summary."""
        if self.last is None:
            return
        # forgetwatch/forgetting -> forgetwatch/final/forgetting, forgetwatch_details/kl -> forgetwatch_details/final/kl
        final = {final_key(k): v for k, v in scalars_of(self.last_rows).items()}
        if cost is not None and train_seconds is not None:
            final.update(cost_summary(cost, evaluations=self.evaluation_seconds, train_seconds=train_seconds,
                                      prefix=PREFIX))
            if self.console:
                say(cost_line(cost, evaluations=self.evaluation_seconds, n_evaluations=self.n_evaluations,
                              train_seconds=train_seconds, precision=self.precision))
        if self.write_failure is not None:  # these figures are the last written step's, not the end of training's
            final[f"{PREFIX}/unwritten_step"] = self.write_failure["step"]
        if self.budget is not None:
            within = self.within_budget()
            try:
                self.write_budget()
            except OSError as e:  # the end of a run whose record broke: the summary still goes out
                logger.warning("forgetwatch: could not rewrite budget.json at the end of training (%s: %s)",
                               type(e).__name__, e)
            final.update({f"{PREFIX}/budget/exceeded": len(self.budget_state.over),
                          f"{PREFIX}/budget/last_within_step": within["step"],
                          f"{PREFIX}/budget/last_within_checkpoint": within["checkpoint"] or ""})
        for lg in self.loggers:
            lg.summary(final)
            lg.close()

    # -- tables -------------------------------------------------------------------------------------------------
    def at_risk(self, results: ProbeResults, step: int) -> list[dict[str, Any]]:
        """Probes right at base and still right now whose margin is small or has fallen (see `forgetwatch.measures.drift`)."""
        assert self.base is not None
        rows = []
        for i in np.flatnonzero(at_risk_mask(self.base, results, self.risk_rule)):
            p = self.probes[int(i)]
            rows.append({"step": step, "id": p.id, "category": p.category, "question": p.question, "gold": p.gold_text,
                         "margin_base": round(float(self.base.margin[i]), 4), "margin_now": round(float(results.margin[i]), 4)})
        return rows

    def flips(self, prev: ProbeResults, now: ProbeResults, step: int) -> list[dict[str, Any]]:
        """Probes whose correctness changed since the previous evaluation, as rows of flips.jsonl."""
        assert self.base is not None
        return [{"step": step, **row} for row in flip_rows(self.probes, self.base, prev, now)]

    def fragile_flips(self, prev: VariantOutcomes, now: VariantOutcomes, results: ProbeResults, step: int
                      ) -> list[dict[str, Any]]:
        """Probes still right in their original form whose robustness changed since the previous evaluation, as rows
        of flips.jsonl (`fragile_flip_rows`)."""
        assert self.base is not None and self.base_robust is not None
        return [{"step": step, **row}
                for row in fragile_flip_rows(self.probes, self.base, self.base_robust, prev, now, results)]


def figure_rows(probes: ProbeSet, base: ProbeResults, results: ProbeResults, risk_rule: RiskRule | None = None
                ) -> tuple[dict, dict, dict[str, dict[str, Any]]]:
    """(forgetting report, drift, metrics.jsonl rows by group) of `results` against `base`, as an evaluation of a run
    computes them, for a comparison outside a run (`forgetwatch interpolate`); a budget's `check` reads the rows."""
    monitor = Monitor(probes, risk_rule=risk_rule)
    monitor.base = base
    return monitor.figures(results)


def _checkpoint_before(output_dir: Path | None, step: int) -> Path | None:
    """The trainer's latest checkpoint directory from before `step` in `output_dir`, or None."""
    try:
        found = [(int(m.group(1)), p) for p in output_dir.iterdir()
                 if (m := re.fullmatch(r"checkpoint-(\d+)", p.name)) and p.is_dir() and int(m.group(1)) < step]
    except (OSError, AttributeError):  # no output dir (None), or one that cannot be listed
        return None
    return max(found)[1] if found else None


def _warn_nothing_to_forget(base_report: dict) -> None:
    empty = [f"{name} ({m.accuracy_pre:.0%} right at base)" for name, m in base_report.items()
             if name != "overall" and m.nothing_to_forget]
    if empty:
        logger.warning(
            "forgetwatch: nothing to forget in %s: the base model knows nothing there beyond chance, so these categories "
            "can only show backward transfer. Choose probes the base model knows (or another scoring mode) to watch "
            "forgetting there.", ", ".join(empty))
