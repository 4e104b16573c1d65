"""The local record of a run, under `<output_dir>/forgetwatch/`: everything needed to analyse it without W&B.

    probes.jsonl          the frozen probe set (the record's row order)
    unfit_probes.json     with unfit_probes="drop": the probes left out as longer than the model's context, and why
    base.parquet          the base model's per-probe results (the cache, unless one was given elsewhere)
    metrics.jsonl         one line per evaluation: step, epoch, seconds, every metric overall and per category
    evals/step-<N>.npz    per-probe outcome / pred_index / margin at step N: the probe × evaluation matrix (with
                          robustness on, each robust probe's variants too: right or not, the option chosen)
    flips.jsonl           the probes whose correctness changed at each evaluation
    at_risk.jsonl         the probes still right but at risk at each evaluation (see `forgetwatch.measures.drift`)
    events.jsonl          budget events: a limit exceeded, at which step, and what was done
    unwritten.jsonl       the evaluations that could not be written (a full disk, a folder made read-only): the step,
                          the file, the OS error; probing stopped there, and `forgetwatch report` names them
    budget.json           the budget, the limits over now, and the last evaluation within budget (and its checkpoint)
    trainer_log.jsonl     the trainer's own log rows (loss, learning rate, GRPO reward, ...) as the callback saw them in
                          `on_log`, with their step: the report draws them beside the forgetting curves
    replay.jsonl          forgotten probes as ready-to-train examples (when replay is on)
    model/                a sidecar-mode run's config and tokenizer: FSDP's sharded checkpoints hold neither, and
                          `forgetwatch watch` reads their weights into this model
    replay_mix.json       with `mix_replay`: the ratio, strategy, and from which stream position each evaluation's
                          category weights were drawn (what the closed loop decided; a resume reads it back)
    reordering.json       while a step scored late (lower than the last committed one) is inserted in step order, or a
                          step is set aside to be scored again: from which step the rows derived from the order (flips,
                          budget events) are being recomputed (`forgetwatch.record.ordering`); gone once that is done

Every file is written atomically or appended a whole line at a time, so a crash leaves a readable record. An
evaluation is committed by its `metrics.jsonl` line, written last: its npz, flips, at-risk rows, replay file and budget
events come first, so an evaluation without its line is unfinished, whatever else of it exists. `RunRecord.recover`
(run when a writer opens the record) sets a line cut short by a crash aside, with the files of unfinished evaluations,
under `recovered/<time>/`, and the writer scores those steps again. A resume from an earlier checkpoint sets what came
after it (the abandoned trajectory's evaluations and trainer-log rows) aside under `superseded/after-step-N-<start>/`.

The evaluations are in step order whatever order they were scored in: a step scored late is inserted, and each step's
flips are against the committed step just before it (`forgetwatch.record.ordering`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import shlex
import shutil
import time
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .._io import atomic_write, read_json, read_jsonl, repair_cut_tail, split_cut_tail
from ..errors import RecordError
from ..measures.robustness import VariantOutcomes
from ..scoring.results import ProbeResults, pack_ragged, unpack_ragged
from .schema import budget_problem, eval_problem, line_problem

__all__ = ["RunRecord", "RecordError", "load_record"]

logger = logging.getLogger(__name__)

_EVAL_FILE = re.compile(r"step-(\d+)\.npz$")
MODEL_FILES = "model"  # the record's directory of a sidecar-mode run's config and tokenizer
# what a resume from step N cuts back to N: the scoring's per-step files (the trainer log is the training process's own:
# the watcher, which scores beside training, never touches it)
# (unwritten.jsonl too: a resume from before a step that could not be written scores it again)
_STEP_FILES = ("evals", "metrics.jsonl", "flips.jsonl", "at_risk.jsonl", "events.jsonl", "unwritten.jsonl")
# the JSON-lines files an evaluation appends to (its scorer's: the watcher never touches the trainer's log)
_EVAL_LINES = ("metrics.jsonl", "flips.jsonl", "at_risk.jsonl", "events.jsonl")
UNWRITTEN = "unwritten.jsonl"  # the evaluations that could not be written (`append_unwritten`)
RECOVERED = "recovered"  # what `recover` set aside: <record>/recovered/<time>/
SUPERSEDED = "superseded"  # what a resume from an earlier step cut: <record>/superseded/after-step-N-<start>/
REORDERING = "reordering.json"  # the marker of a reordering under way (see the module's docstring)


_DAMAGED = ("forgetwatch writes whole lines, so the file was changed by hand or by another program: restore it, or move "
            "the record away")


def _append(path: Path, text: str, sync: bool = True) -> None:
    """Every append to a record file: whole lines in one write, synced (the record's only other writes are atomic). A
    write that fails part way (a full disk) is cut back, so that the next append never lands on half a line."""
    # unbuffered: a buffered file flushes what it holds before it truncates, and on a full disk that flush fails again
    # and leaves the half line in place
    data = memoryview(text.encode("utf-8"))
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        size = os.fstat(fd).st_size
        try:
            while data:
                data = data[os.write(fd, data):]
            if sync:
                os.fsync(fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, size)
            raise
    finally:
        os.close(fd)


def _append_line(path: Path, obj: dict[str, Any], sync: bool = True) -> None:
    _append(path, json.dumps(obj, ensure_ascii=False) + "\n", sync)


@dataclass
class RunRecord:
    """Writes (and reads back) the record directory of one training run."""

    root: Path

    def __post_init__(self) -> None:
        self.root = Path(self.root)

    @property
    def evals_dir(self) -> Path:
        return self.root / "evals"

    def eval_path(self, step: int) -> Path:
        return self.evals_dir / f"step-{step:08d}.npz"

    def write_eval(self, step: int, results: ProbeResults, fingerprint: str = "",
                   robust: VariantOutcomes | None = None, partial: dict[str, np.ndarray] | None = None) -> None:
        """The per-probe results of the evaluation at `step` (option scores packed flat with offsets), with the probe
        set's fingerprint, so that a file from another probe set is never read as this one's; with robustness on,
        each robust probe's variants (`robust_*` arrays, see `VariantOutcomes`) in the same file; for a partial
        evaluation (`forgetwatch.measures.partial.Design.to_arrays`) which probes it scored, their strata and inclusion
        probabilities (`scored`, `stratum`, `inclusion`), the others holding their results as last scored."""
        self.evals_dir.mkdir(parents=True, exist_ok=True)
        flat, offsets = pack_ragged(results.option_scores)
        extra = {**(robust.to_arrays() if robust is not None else {}), **(partial or {})}
        # the answers as text, packed (UTF-8 bytes and offsets): a flip recomputed later (a step scored late lands
        # before this one) shows the answer this evaluation gave, as the flip written at the time did
        text, text_offsets = _pack_text(results.prediction)
        with atomic_write(self.eval_path(step), "wb") as f:
            np.savez(f, outcome=results.outcome.astype(np.int8), pred_index=results.pred_index.astype(np.int32),
                     margin=results.margin.astype(np.float32), gold_logprob=results.gold_logprob.astype(np.float32),
                     option_scores=flat, option_offsets=offsets, n_tokens=results.n_tokens.astype(np.int32),
                     stopped=results.stopped.astype(np.int8), detail=np.asarray(results.detail, dtype=str),
                     nonfinite=results.nonfinite.astype(np.int8), fingerprint=np.asarray(fingerprint),
                     prediction_utf8=text, prediction_offsets=text_offsets, **extra)

    def append_metrics(self, row: dict[str, Any]) -> None:
        """The evaluation's commit point: written after every other file of it."""
        _append_line(self.root / "metrics.jsonl", row)

    def append_flips(self, rows: list[dict[str, Any]]) -> None:
        self._append_lines("flips.jsonl", rows)

    def _append_lines(self, name: str, rows: list[dict[str, Any]]) -> None:
        if not rows:
            return
        _append(self.root / name, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))

    def append_at_risk(self, rows: list[dict[str, Any]]) -> None:
        self._append_lines("at_risk.jsonl", rows)

    # -- step order (`forgetwatch.record.ordering` decides what; these write it) --------------------------------------------
    def rewrite_steps(self, name: str, steps: set[int], rows: list[dict[str, Any]]) -> None:
        """Replace the rows of `steps` in the JSON-lines file `name` with `rows`, the file kept in step order (rows of
        one step in the order given), rewritten whole, atomically."""
        kept = [r for r in _read_jsonl(self.root / name) if r.get("step") not in steps]
        ordered = sorted(kept + list(rows), key=_step_key)  # stable: a step's rows keep their order
        if not ordered and not (self.root / name).is_file():
            return
        with atomic_write(self.root / name) as f:
            f.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in ordered))

    def insert_metrics(self, row: dict[str, Any]) -> None:
        """The commit point of an evaluation scored late: metrics.jsonl rewritten whole (atomically) with its line in
        step order."""
        self.rewrite_steps("metrics.jsonl", {row["step"]}, [row])

    def sort_metrics(self) -> None:
        """metrics.jsonl in step order (a record an earlier forgetwatch wrote with a step scored late)."""
        self.rewrite_steps("metrics.jsonl", set(), [])

    def begin_reordering(self, step: int) -> None:
        """Say, before the first write, that the rows derived from the order (flips, budget events) are recomputed from
        `step` on: a writer killed before it is done leaves this file, and the next one recomputes them
        (`forgetwatch.record.ordering.repair`)."""
        pending = self.reordering()
        with atomic_write(self.root / REORDERING) as f:
            f.write(json.dumps({"from_step": step if pending is None else min(step, pending)}) + "\n")

    def reordering(self) -> int | None:
        """The step from which a reordering left unfinished recomputes, or None."""
        state = _read_json(self.root / REORDERING) if (self.root / REORDERING).is_file() else None
        step = (state or {}).get("from_step")
        return step if isinstance(step, int) and not isinstance(step, bool) else None

    def end_reordering(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.root / REORDERING).unlink()

    def set_aside_step(self, step: int) -> Path:
        """Take a committed evaluation out of the record so that it is scored again (`forgetwatch watch --rescore`):
        its npz, its metrics.jsonl line and its rows of flips.jsonl, at_risk.jsonl and events.jsonl move to
        `superseded/rescore-step-<step>-<time>/`, never deleted. Its line leaves metrics.jsonl first, after a copy is
        on disk: a kill part way leaves the step unfinished, and `recover` sets the rest aside. Returns the folder."""
        aside = _new_folder(self.root / SUPERSEDED / f"rescore-step-{step}-{time.strftime('%Y%m%d-%H%M%S')}")
        aside.mkdir(parents=True)
        self.begin_reordering(step)  # the step after it has its flips against it: recomputed against the one before
        names = sorted((n for n in _EVAL_LINES if (self.root / n).is_file()), key=lambda n: n != "metrics.jsonl")
        for name in names:
            rows = [r for r in _read_jsonl(self.root / name) if r.get("step") == step]
            if rows:
                with open(aside / name, "a", encoding="utf-8") as f:
                    f.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
                    f.flush()
                    os.fsync(f.fileno())
        for name in names:  # metrics.jsonl first: the step is uncommitted before anything else of it goes
            if any(r.get("step") == step for r in _read_jsonl(self.root / name)):
                self.rewrite_steps(name, {step}, [])
        if self.eval_path(step).exists():
            (aside / "evals").mkdir()
            shutil.move(self.eval_path(step), aside / "evals" / self.eval_path(step).name)
        return aside

    def append_trainer_log(self, row: dict[str, Any]) -> None:
        # Every logging step, inside the training loop: no fsync (a slow one on network storage would stall the step);
        # a crash loses at most the last rows, which trainer_state.json of the next checkpoint has anyway.
        _append_line(self.root / "trainer_log.jsonl", row, sync=False)

    def read_trainer_log(self) -> list[dict[str, Any]]:
        # written without fsync: after a power loss a line may be garbage, and a plot of the loss is worth keeping
        return _read_jsonl(self.root / "trainer_log.jsonl", skip_bad=True)

    def append_event(self, row: dict[str, Any]) -> None:
        _append_line(self.root / "events.jsonl", row)

    def append_unwritten(self, row: dict[str, Any]) -> None:
        """Note an evaluation that could not be written (`step`, `path`, `error`): not one of the evaluation's own files
        (those are set aside when uncommitted), so that the loss stays said. Its own file at the record's root, which a
        write failure in `evals/` or a full disk (a short line fits where an npz does not) may spare."""
        _append_line(self.root / UNWRITTEN, row)

    def unwritten(self) -> list[dict[str, Any]]:
        """The evaluations that could not be written and are still not in the record (a step scored again later, by a
        restarted watcher or a resumed run, is no longer missing), in step order."""
        done = set(self.committed_steps())
        rows = [r for r in _read_jsonl(self.root / UNWRITTEN) if r.get("step") not in done]
        return sorted(rows, key=lambda r: r["step"] if isinstance(r.get("step"), int) else -1)

    def write_budget(self, state: dict[str, Any]) -> None:
        with atomic_write(self.root / "budget.json") as f:
            f.write(json.dumps(state, ensure_ascii=False, indent=1) + "\n")

    def read_events(self) -> list[dict[str, Any]]:
        return _read_jsonl(self.root / "events.jsonl")

    def read_at_risk(self) -> list[dict[str, Any]]:
        return _read_jsonl(self.root / "at_risk.jsonl")

    def read_budget(self) -> dict[str, Any] | None:
        return _read_json(self.root / "budget.json", budget_problem)

    def write_replay(self, lines: Iterable[str]) -> Path:
        """Replace replay.jsonl with these JSONL lines (`ReplayTracker.lines()`)."""
        path = self.root / "replay.jsonl"
        with atomic_write(path) as f:
            f.writelines(lines)
        return path

    def write_mix(self, state: dict[str, Any]) -> None:
        with atomic_write(self.root / "replay_mix.json") as f:
            f.write(json.dumps(state, ensure_ascii=False, indent=1) + "\n")

    def read_mix(self) -> dict[str, Any] | None:
        return _read_json(self.root / "replay_mix.json")

    def _npz_steps(self) -> list[int]:
        if not self.evals_dir.is_dir():
            return []
        return sorted(int(m.group(1)) for p in self.evals_dir.iterdir() if (m := _EVAL_FILE.search(p.name)))

    def committed_steps(self, file_order: bool = False) -> list[int]:
        """The evaluations committed, in step order: those with a `metrics.jsonl` line (the commit point). With
        `file_order`, in the order of the file (an earlier forgetwatch appended a step scored late after later ones)."""
        rows = _read_jsonl(self.root / "metrics.jsonl") if file_order else self.read_metrics()
        return [r["step"] for r in rows if isinstance(r.get("step"), int) and not isinstance(r.get("step"), bool)]

    def eval_steps(self) -> list[int]:
        """The committed evaluations whose per-probe file is there, in step order (the probe x evaluation matrix)."""
        files = self._npz_steps()
        if not files:
            return []
        done = set(self.committed_steps())
        return [s for s in files if s in done]

    def read_eval(self, step: int) -> dict[str, np.ndarray]:
        """The arrays of one evaluation: outcome, pred_index, margin, gold_logprob, option_scores, option_offsets, ...

        A file that is not such an evaluation (empty, cut short, another format) raises `RecordError` naming it."""
        path = self.eval_path(step)
        try:
            with np.load(path, allow_pickle=False) as z:
                out = {k: z[k] for k in z.files}
        except FileNotFoundError:
            raise RecordError(f"{path}: no such evaluation file (step {step} is not in this record)") from None
        except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError) as e:
            # never "load it with allow_pickle": a forgetwatch evaluation holds no Python objects, and unpickling a file
            # runs code; so numpy's own advice to do so (its message for a file that is not a zip) is not repeated
            why = f"{type(e).__name__}: {e}"
            if isinstance(e, ValueError) and "pickle" in str(e):
                why = ("an array of Python objects" if "Object arrays" in str(e) else "not a NumPy .npz archive")
            raise RecordError(f"{path}: not a readable forgetwatch evaluation ({why}); it is damaged or "
                              f"not forgetwatch's. {self.rescore_advice(step)}") from None
        if "outcome" not in out:
            raise RecordError(f"{path}: not a forgetwatch evaluation (no `outcome` array; it holds {sorted(out)})")
        if problem := eval_problem(out):
            raise RecordError(f"{path}: not an evaluation forgetwatch could have written: {problem}; it is damaged or not "
                              f"forgetwatch's. {self.rescore_advice(step)}")
        return out

    def rescore_advice(self, step: int) -> str:
        """What to do about the damaged evaluation file of `step`: the command that scores its checkpoint again (a
        sidecar run whose checkpoint is there), or how to go on without its per-probe results."""
        run = self.root.parent if self.root.name == "forgetwatch" else self.root
        ckpt = run / f"checkpoint-{step}"
        if (self.root / "sidecar.json").is_file() and ckpt.is_dir():
            return (f"Score it again from {ckpt}: `forgetwatch watch {shlex.quote(str(run))} --rescore {step}` (the file is set aside under "
                    f"{self.root / SUPERSEDED}/, never deleted); or, to go on without it, {self.without_checkpoint(step)}")
        return (f"Its checkpoint cannot be scored again here ({ckpt} is not there" +
                ("" if (self.root / "sidecar.json").is_file() else ", or the run was not scored by `forgetwatch watch`") +
                f"): restore the file from a copy, or {self.without_checkpoint(step)}")

    def without_checkpoint(self, step: int) -> str:
        """How to go on without the damaged evaluation file of `step`."""
        aside = shlex.quote(str(self.root / RECOVERED))
        return (f"move the file out of evals/ (`mkdir -p {aside} && mv {shlex.quote(str(self.eval_path(step)))} {aside}/`): "
                "the step keeps its figures and flips, and only its per-probe results are lost")

    def read_results(self, step: int, ids: list[str]) -> ProbeResults:
        """One evaluation as `ProbeResults` (predictions and generations are not kept per step; answer lengths, stops and
        behaviour checks are)."""
        z = self.read_eval(step)
        if len(z["outcome"]) != len(ids):
            raise RecordError(f"{self.eval_path(step)}: {len(z['outcome'])} probes, but the record's probe set has "
                              f"{len(ids)}: an evaluation of another probe set. {self.rescore_advice(step)}")
        r = ProbeResults.empty(ids)
        r.outcome, r.pred_index, r.margin = z["outcome"], z["pred_index"], z["margin"]
        if "gold_logprob" in z:
            r.gold_logprob = z["gold_logprob"]
        if "option_scores" in z:
            r.option_scores = unpack_ragged(z["option_scores"], z["option_offsets"])
        if "n_tokens" in z:  # records written before behaviour probes have none
            r.n_tokens, r.stopped, r.detail = z["n_tokens"], z["stopped"], [str(d) for d in z["detail"]]
        if "nonfinite" in z:
            r.nonfinite = z["nonfinite"].astype(bool)
        if "prediction_utf8" in z:  # records written before answers were kept per step have none
            r.prediction = _unpack_text(z["prediction_utf8"], z["prediction_offsets"])
        return r

    def read_robust(self, step: int) -> VariantOutcomes | None:
        """The variants of one evaluation (robustness on), or None when it scored none."""
        return VariantOutcomes.from_arrays(self.read_eval(step))

    def read_metrics(self, checked: bool = False, file_order: bool = False) -> list[dict[str, Any]]:
        """The evaluations' commit lines, in step order whatever order the file holds them in (`file_order`: as the file
        holds them). With `checked`, every field is type-checked first (what the figures are made from: a report must not
        stop on a TypeError), and a line forgetwatch could not have written raises `RecordError` naming the file, the line
        and the field."""
        order = (lambda rows: list(rows)) if file_order else (lambda rows: sorted(rows, key=_step_key))
        if not checked:
            return order(_read_jsonl(self.root / "metrics.jsonl"))
        path = self.root / "metrics.jsonl"
        rows = list(read_jsonl(path, RecordError, _DAMAGED, objects=True, partial="skip")) if path.is_file() else []
        for lineno, row in rows:
            if problem := _metrics_line_problem(row):
                raise RecordError(f"{path}, line {lineno}: {problem}; {_DAMAGED}")
        return order(row for _, row in rows)

    def read_flips(self) -> list[dict[str, Any]]:
        return _read_jsonl(self.root / "flips.jsonl")

    def format_curves(self) -> str:
        """One line per evaluation: step, forgetting, backward transfer (raw and adjusted), accuracy; of the knowledge
        probes alone when behaviour probes are mixed in, and then a second line with the behaviour figures."""
        lines = []
        for row in self.read_metrics():
            groups = row["metrics"]
            m = groups.get("all_knowledge", groups["overall"])
            lines.append(
                f"step {row['step']:>5}: forgetting {m['forgetting']:.3f} (adj {m['forgetting_adjusted']:.3f})  "
                f"backward transfer {m['backward_transfer']:.3f} (adj {m['backward_transfer_adjusted']:.3f})  "
                f"accuracy {m['accuracy_post']:.3f}" + ("  (knowledge probes)" if "all_knowledge" in groups else "")
            )
            b = groups.get("all_behavior", groups["overall"])
            if "runaway_rate" in b:
                figures = [(name, b.get(key)) for name, key in (
                    ("instructions followed", "instruct_compliance"), ("runaway", "runaway_rate"),
                    ("refused harmless", "over_refusal_rate"))]
                text = [f"{name} {v:.3f}" for name, v in figures if v is not None and not math.isnan(v)]
                ratio = b.get("length_log_ratio")
                if ratio is not None and not math.isnan(ratio):
                    text.insert(2, f"length x{math.exp(ratio):.2f}")
                # behaviour probes present, or only generated knowledge answers (their runaways and lengths)
                behaviour = any(v is not None and not math.isnan(v) for k, v in figures if k != "runaway")
                kind = "behaviour" if behaviour else "generated answers"
                lines.append(" " * 12 + f"{kind}: " + ", ".join(text))
        return "\n".join(lines)

    def outcome_matrix(self, n: int | None = None, fingerprint: str | None = None, *, warn: bool = True
                       ) -> tuple[list[int], np.ndarray]:
        """(steps, matrix) with matrix[e, i] the outcome of probe i at the e-th evaluation. A step whose file does not
        belong in it (unreadable, or of another probe count or probe set than `n` and `fingerprint`, by default those of
        the record's probes.jsonl) is left out, with a warning naming it (`matrix_steps`), unless `warn` is False."""
        steps, left_out = self.matrix_steps(n, fingerprint)
        for why in left_out if warn else []:
            logger.warning("forgetwatch: %s", why)
        if not steps:
            return [], np.zeros((0, 0), np.int8)
        rows = [self.read_eval(s)["outcome"] for s in steps]
        if odd := [(s, len(r)) for s, r in zip(steps, rows, strict=True) if len(r) != len(rows[0])]:
            raise RecordError(f"{self.eval_path(odd[0][0])}: {odd[0][1]} probes, but {self.eval_path(steps[0])} has "
                              f"{len(rows[0])}: evaluations of two probe sets in one record")
        return steps, np.stack(rows)

    def matrix_steps(self, n: int | None = None, fingerprint: str | None = None) -> tuple[list[int], list[str]]:
        """The committed evaluations whose file belongs in the probe x evaluation matrix (and every other view made
        from the evals/ files), in step order, and for each one left out why, naming its file and what to do: a file
        that cannot be read, or one of another probe count or probe set than the record's (`n` and `fingerprint`; by
        default its probes.jsonl's). Their curves, from metrics.jsonl, are not affected."""
        if n is None and fingerprint is None and (self.root / "probes.jsonl").is_file():
            from ..probes.probe_set import ProbeSet

            probes = ProbeSet.from_jsonl(self.root / "probes.jsonl")
            n, fingerprint = len(probes), probes.fingerprint
        keep, left_out = [], []
        for s in self.eval_steps():
            try:
                z = self.read_eval(s)
            except RecordError as e:
                left_out.append(f"{e} (left out of the probe x evaluation matrix)")
                continue
            if n is None:
                n = len(z["outcome"])
            if problem := self._npz_problem(s, z, n, fingerprint):
                left_out.append(problem)
            else:
                keep.append(s)
        return keep, left_out

    def _npz_problem(self, step: int, z: dict[str, np.ndarray], n: int | None, fingerprint: str | None) -> str | None:
        """What makes an evaluation's file another probe set's (count or fingerprint) than the record's, or None."""
        path = self.eval_path(step)
        found = str(z["fingerprint"]) if "fingerprint" in z else ""
        if n is not None and len(z["outcome"]) != n:
            what = f"{path}: {len(z['outcome'])} probes, but the record's probes.jsonl has {n}"
        elif fingerprint and found and found != fingerprint:
            what = f"{path}: scored on probe set {found}, but the record's probes.jsonl is {fingerprint}"
        else:
            return None
        return (f"{what}; left out of the probe x evaluation matrix and every view made from the evals/ files (step "
                f"{step}'s curves, from metrics.jsonl, stand). forgetwatch writes each step's file from the record's "
                "probes, so this one was replaced or changed after it was written (another run's, copied in?): put step "
                f"{step}'s own file back if you have it, and the report draws that step again")

    # -- faults ---------------------------------------------------------------------------------------------------
    def recover(self) -> list[str]:
        """Make the record whole again after a crash, before writing to it: a line cut short by the crash, and every
        file of an evaluation without its commit line (npz, flips, at-risk rows, events), move to
        `recovered/<time>/`; nothing is deleted. Returns what was done (also said in one warning)."""
        aside = _new_folder(self.root / RECOVERED / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
        notes: list[str] = []
        for name in _EVAL_LINES:
            _, cut = split_cut_tail(self.root / name)
            if cut:
                aside.mkdir(parents=True, exist_ok=True)
                repair_cut_tail(self.root / name, aside / f"{name}.cut")
                notes.append(f"{name}: its last line was cut short ({len(cut)} bytes)")
        # a metrics line without its npz (evals/ pruned by hand) is committed all the same: a crash cannot make one
        committed = set(self.committed_steps())
        unfinished = [s for s in self._npz_steps() if s not in committed]
        for step in unfinished:
            aside.mkdir(parents=True, exist_ok=True)
            self.eval_path(step).rename(aside / self.eval_path(step).name)
        for name in _EVAL_LINES:
            path = self.root / name
            if not path.is_file():
                continue
            rows = self._read_lines(path)
            # a step that is no whole number (a metrics line edited by hand) is never committed: set aside with the rest
            done = [isinstance(r.get("step"), int) and r["step"] in committed for r in rows]
            keep = [r for r, d in zip(rows, done, strict=True) if d]
            if len(keep) < len(rows):
                unfinished += [r.get("step") for r, d in zip(rows, done, strict=True) if not d]
                aside.mkdir(parents=True, exist_ok=True)
                with open(aside / name, "a", encoding="utf-8") as f:
                    f.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r, d in zip(rows, done, strict=True) if not d))
                with atomic_write(path) as f:
                    f.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in keep))
        if unfinished:
            notes.append(f"step(s) {', '.join(sorted({str(s) for s in unfinished}))} were not finished (no "
                         "metrics.jsonl line, its commit point)")
        if notes:
            logger.warning("forgetwatch: %s was left mid-write (a crash or a kill?): %s. Set aside in %s; unfinished steps "
                           "are scored again where the model still exists (a checkpoint, or a resumed run).",
                           self.root, "; ".join(notes), aside)
        return notes

    def kept_aside(self) -> list[str]:
        """What this record set aside and kept, not in its figures: `recovered/<time>` (a crash's unfinished writes) and
        `superseded/after-step-N-<start>` (a trajectory a resume abandoned), as paths relative to the record."""
        out = []
        for folder in (RECOVERED, SUPERSEDED):
            try:
                out += [f"{folder}/{p.name}" for p in sorted((self.root / folder).iterdir(), key=lambda p: p.stat().st_mtime)
                        if p.is_dir()] if (self.root / folder).is_dir() else []
            except OSError as e:  # a report is not refused for a folder it cannot list
                out.append(f"{folder}/ (unreadable: {e.strerror or e})")
        return out

    def being_written(self) -> tuple[int, dict[str, Any]] | None:
        """The evaluation a live writer is writing now, and who: the latest npz without its `metrics.jsonl` line while
        the record's scoring lock is held by a live process (`forgetwatch.record.lock.live_holder`); None otherwise. Its files
        are not yet part of the record: not in its figures, and not a problem of it."""
        from .lock import live_holder

        unfinished = [s for s in self._npz_steps() if s not in set(self.committed_steps())]
        if not unfinished:
            return None
        holder = live_holder(self.root.parent if self.root.name == "forgetwatch" else self.root, "scoring")
        if holder is None:
            return None

        def written(step: int) -> float:
            try:
                return self.eval_path(step).stat().st_mtime
            except OSError:
                return 0.0

        # one writer scores one evaluation at a time: the newest file is its; an older one was left by a crash
        return max(unfinished, key=lambda s: (written(s), s)), holder

    def check(self, fingerprint: str | None = None, n: int | None = None,
              writing: int | None = None) -> list[str]:
        """What is wrong with this record, for `forgetwatch report`: steps repeated (and out of order), evaluations without
        their commit line or the other way round, npz files of another probe count or probe set. Empty when whole.
        `writing`: the step a live writer is writing now (`being_written`), whose missing line is no problem."""
        problems = []
        steps = [r.get("step") for r in self.read_metrics(checked=True, file_order=True)]  # refused by name if damaged
        repeated = sorted({s for s in steps if steps.count(s) > 1}, key=str)
        if repeated:
            problems.append(f"metrics.jsonl holds step(s) {', '.join(map(str, repeated))} more than once (two writers, or "
                            "an evaluation written twice): flips and curves count them twice")
        # out of order alone is a step scored late by an earlier forgetwatch: read in step order, nothing is wrong. With
        # a step twice, it is what two writers leave
        if repeated and any(isinstance(a, int) and isinstance(b, int) and b < a for a, b in zip(steps, steps[1:], strict=False)):
            problems.append(f"metrics.jsonl's steps are out of order with steps repeated ({', '.join(map(str, steps[:12]))}"
                            f"{', ...' if len(steps) > 12 else ''}): two runs wrote into one record?")
        files = [s for s in self._npz_steps() if s != writing or s in steps]  # committed meanwhile: an evaluation
        if missing := sorted({s for s in steps if isinstance(s, int)} - set(files)):
            problems.append(f"step(s) {', '.join(map(str, missing))} have a metrics.jsonl line but no evals/ file")
        if unfinished := [s for s in files if s not in set(steps)]:
            problems.append(f"step(s) {', '.join(map(str, unfinished))} have an evals/ file but no metrics.jsonl line "
                            "(unfinished: the writer stopped mid-evaluation)")
        for s in files:
            try:
                z = self.read_eval(s)
            except RecordError as e:
                problems.append(str(e))
                continue
            if problem := self._npz_problem(s, z, n, fingerprint):
                problems.append(problem)
        return problems

    def _read_lines(self, path: Path) -> list[dict[str, Any]]:
        return _read_jsonl(path)

    def set_aside(self) -> Path | None:
        """Move an earlier run's record out of the way (to `forgetwatch.<time>/` beside it), never overwriting it.

        Returns where it went, or None when there was no record here.
        """
        root = self.root
        metrics = root / "metrics.jsonl"
        # trainer_log.jsonl alone: a sidecar-mode run whose checkpoints no watcher scored; its log is a record too
        if not metrics.is_file() and not any(self.evals_dir.glob("step-*.npz")) and not (root / "trainer_log.jsonl").is_file():
            return None
        when = metrics.stat().st_mtime if metrics.is_file() else time.time()
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(when))
        target, n = root.with_name(f"{root.name}.{stamp}"), 1
        while target.exists():
            target, n = root.with_name(f"{root.name}.{stamp}-{n}"), n + 1
        root.rename(target)
        logger.warning("forgetwatch: %s held the record of an earlier run; moved it to %s (nothing is deleted). Resume with "
                       "`resume_from_checkpoint=` to continue a run's own record.", root, target)
        return target

    def truncate_after(self, step: int, names: tuple[str, ...] = _STEP_FILES, start: str | None = None) -> Path | None:
        """Cut the evaluations after `step` out of the record (resuming from an earlier checkpoint recomputes them);
        `names` says which files. What is cut, the abandoned trajectory's, is set aside byte for byte (evals/ files,
        JSON-lines rows, and the trainer log's unreadable lines) in `superseded/after-step-<step>-<start>/`, never
        deleted: `start` is the id of the training start that resumed, so the training process (its trainer log) and
        the watcher (the evaluations) of one resume fill one folder, and two resumes two. Returns the folder, or None
        when nothing came after `step`."""
        cut_evals = [s for s in self._npz_steps() if s > step] if "evals" in names else []  # committed or not
        # the commit lines (metrics.jsonl) go last: a crash mid-cut leaves those steps committed, cut again next time
        lines = sorted((n for n in names if n != "evals" and (self.root / n).is_file()), key=lambda n: n == "metrics.jsonl")
        cuts = {n: c for n in lines if (c := self._split_after(n, step))[1] or c[2]}
        if not cut_evals and not cuts:
            return None
        label = f"after-step-{step}" if step >= 0 else "from-the-start"
        aside = self.root / SUPERSEDED / (f"{label}-{start[:12]}" if start
                                          else _new_folder(self.root / SUPERSEDED / f"{label}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}").name)
        for s in cut_evals:
            (aside / "evals").mkdir(parents=True, exist_ok=True)
            src = self.eval_path(s)
            # shutil.move: evals/ may be a link to another disk, where a rename cannot go
            shutil.move(src, _new_folder(aside / "evals" / src.name))
        for name, (kept, after, unreadable) in cuts.items():
            aside.mkdir(parents=True, exist_ok=True)
            for suffix, part in (("", after), (".unreadable", unreadable)):
                if part:  # on disk before the record drops them: a crash between leaves them in both places
                    with open(aside / f"{name}{suffix}", "ab") as f:
                        f.write(part)
                        f.flush()
                        os.fsync(f.fileno())
            with atomic_write(self.root / name, "wb") as f:
                f.write(kept)
        what = (["evals/"] if cut_evals else []) + [n for n, c in cuts.items() if c[1]]
        # the trainer log alone (the training process's share of a resume) is said with the evaluations, by their writer
        say = logger.warning if cut_evals or set(cuts) - {"trainer_log.jsonl"} else logger.info
        say("forgetwatch: the run goes on from %s, so what the record held after it (%s%s) is of an abandoned trajectory "
            "and is written again; set aside in %s (nothing is deleted)",
            "the start" if step < 0 else f"step {step}", ", ".join(what) or "nothing",
            "; the trainer log's unreadable lines too" if cuts.get("trainer_log.jsonl", (0, 0, b""))[2] else "", aside)
        return aside

    def _split_after(self, name: str, step: int) -> tuple[bytes, bytes, bytes]:
        """A JSON-lines file's lines as (kept, after `step`, unreadable), each as its bytes. Unreadable: a last line cut
        short by a crash (left in place, the next line appended would be glued to it), and in the trainer log, written without
        fsync, a line a power loss garbled; damage elsewhere raises `RecordError` with the file and line. A row whose
        step is not a number is kept."""
        path = self.root / name
        tolerant = name == "trainer_log.jsonl"
        if not tolerant:
            _read_jsonl(path)  # damage is refused with the file and line
        kept, after, unreadable = [], [], []
        parts = path.read_bytes().split(b"\n")  # lines as the reader splits them (on \n alone)
        for i, line in enumerate([p + b"\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])):
            if not line.strip():
                continue
            try:  # a byte-order mark (an editor's) opens line 1: the reader skips it, so it is no damage
                text = line[3:] if i == 0 and line.startswith(b"\xef\xbb\xbf") else line
                row = json.loads(text.decode("utf-8")) if line.endswith(b"\n") else None
            except ValueError:
                row = None
            if not isinstance(row, dict):  # garbled (the trainer log only), or a last line cut short
                unreadable.append(line if line.endswith(b"\n") else line + b"\n")
                continue
            at = row.get("step", 0)
            numeric = isinstance(at, (int, float)) and not isinstance(at, bool)
            (after if numeric and at > step else kept).append(line)
        return b"".join(kept), b"".join(after), b"".join(unreadable)


def _step_key(row: dict[str, Any]) -> float:
    step = row.get("step")
    return step if isinstance(step, (int, float)) and not isinstance(step, bool) else math.inf


def _pack_text(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    data = [t.encode("utf-8") for t in texts]
    return np.frombuffer(b"".join(data), np.uint8), np.cumsum([0] + [len(d) for d in data], dtype=np.int64)


def _unpack_text(data: np.ndarray, offsets: np.ndarray) -> list[str]:
    raw = data.tobytes()
    return [raw[a:b].decode("utf-8", "replace") for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist(), strict=True)]


def _new_folder(path: Path) -> Path:
    """`path`, or `path.1`, `path.2`, ... (before a file's extension: `step-4.1.npz`): the first name not taken (what is
    set aside never replaces what was)."""
    target, n = path, 1
    while target.exists():
        target, n = path.with_name(f"{path.stem}.{n}{path.suffix}" if path.suffix == ".npz" else f"{path.name}.{n}"), n + 1
    return target


def _metrics_line_problem(row: dict[str, Any]) -> str | None:
    """What makes a metrics.jsonl line one forgetwatch could not have written, or None: `step` a whole number >= 0,
    `epoch` and `seconds` numbers, `metrics` an object of groups, each an object of figures that are numbers (NaN
    included), true/false or a reason (text)."""
    def number(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    step = row.get("step")
    if "step" not in row:
        return "field `step` is missing"
    if not number(step) or isinstance(step, float) or not 0 <= step < 2**53:  # larger: no JSON reader carries it exactly
        return f"field `step` must be a whole number >= 0, not {step!r} ({type(step).__name__})"
    for field in ("epoch", "seconds"):
        if field in row and not number(row[field]):
            return f"field `{field}` must be a number, not {row[field]!r} ({type(row[field]).__name__})"
    partial = row.get("partial")  # a partial evaluation's design (max_share): what the report reads of it
    if partial is not None:
        if not isinstance(partial, dict):
            return f"field `partial` must be an object (the partial evaluation's counts), not {type(partial).__name__}"
        for field in ("k", "scored", "n"):  # k is null for a pilot (nothing timed yet)
            value = partial.get(field)
            if (value is not None or field != "k") and (not number(value) or isinstance(value, float)):
                return f"field `partial.{field}` must be a whole number, not {value!r}"
    groups = row.get("metrics")
    if not isinstance(groups, dict):
        return f"field `metrics` must be an object of groups, not {type(groups).__name__}"
    for name, figures in groups.items():
        if not isinstance(figures, dict):
            return f"field `metrics.{name}` must be an object of figures, not {type(figures).__name__}"
        for key, value in figures.items():
            if not isinstance(value, (int, float, str)):  # bool is an int; NaN is a float
                return f"field `metrics.{name}.{key}` must be a number, not {value!r}"
    return None


def _read_jsonl(path: Path, skip_bad: bool = False) -> list[dict[str, Any]]:
    """The rows of a record's JSON-lines file; a last line cut short by a crash is not a record (`recover` sets it
    aside). A damaged line elsewhere raises `RecordError` with the file and line, unless `skip_bad` (the trainer's log,
    written without fsync: after a power loss a line may be garbage)."""
    if not path.is_file():
        return []
    if not skip_bad:
        numbered = list(read_jsonl(path, RecordError, _DAMAGED, objects=True, partial="skip"))
    else:
        numbered = []
        for lineno, line in enumerate(path.read_bytes().split(b"\n")[:-1], 1):  # the part after the last newline is cut
            with contextlib.suppress(UnicodeDecodeError, ValueError):
                row = json.loads(line.decode("utf-8")) if line.strip() else None
                if isinstance(row, dict):
                    numbered.append((lineno, row))
    # every field the readers use, type-checked: a report must say which line is wrong, not stop on a TypeError
    for lineno, row in numbered:
        if problem := line_problem(path.name, row):
            raise RecordError(f"{path}, line {lineno}: {problem}; {_DAMAGED}")
    return [row for _, row in numbered]


def _read_json(path: Path, check: Callable[[dict[str, Any]], str | None] | None = None) -> dict[str, Any] | None:
    """A record's JSON file (written whole, atomically), or None when absent; damage raises `RecordError` with the line,
    and a field `check` finds wrong with the field."""
    doc = read_json(path, "a forgetwatch record file", RecordError, objects=True) if path.is_file() else None
    if doc is not None and check is not None and (problem := check(doc)):
        raise RecordError(f"{path}: {problem}; {_DAMAGED}")
    return doc


def load_record(output_dir: str | os.PathLike) -> RunRecord:
    """The record of a finished or running training run (`output_dir` or its `forgetwatch/` folder).

    Example:
        >>> rec = load_record("outputs/sft-demo")  # doctest: +SKIP
        >>> steps, matrix = rec.outcome_matrix()  # doctest: +SKIP
    """
    root = Path(output_dir)
    if (root / "forgetwatch").is_dir():
        root = root / "forgetwatch"
    if not (root / "probes.jsonl").is_file():
        raise FileNotFoundError(f"{output_dir}: no forgetwatch record here (expected {root / 'probes.jsonl'})")
    return RunRecord(root)
