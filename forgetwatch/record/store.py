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
import shlex
import shutil
import time
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .._io import atomic_write, read_jsonl
from ..errors import RecordError
from ..measures.robustness import VariantOutcomes
from ..scoring.results import ProbeResults, pack_ragged, unpack_ragged
from .files import (
    DAMAGED,
    EVAL_FILE,
    EVAL_LINES,
    RECOVERED,
    REORDERING,
    SUPERSEDED,
    UNWRITTEN,
    append,
    append_line,
    new_folder,
    read_json_file,
    read_lines,
    step_key,
)
from .recovery import Recovery
from .schema import budget_problem, eval_problem, metrics_line_problem

__all__ = ["RunRecord", "RecordError", "load_record"]

logger = logging.getLogger(__name__)

MODEL_FILES = "model"  # the record's directory of a sidecar-mode run's config and tokenizer


@dataclass
class RunRecord(Recovery):
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
        append_line(self.root / "metrics.jsonl", row)

    def append_flips(self, rows: list[dict[str, Any]]) -> None:
        self._append_lines("flips.jsonl", rows)

    def _append_lines(self, name: str, rows: list[dict[str, Any]]) -> None:
        if not rows:
            return
        append(self.root / name, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))

    def append_at_risk(self, rows: list[dict[str, Any]]) -> None:
        self._append_lines("at_risk.jsonl", rows)

    # -- step order (`forgetwatch.record.ordering` decides what; these write it) --------------------------------------------
    def rewrite_steps(self, name: str, steps: set[int], rows: list[dict[str, Any]]) -> None:
        """Replace the rows of `steps` in the JSON-lines file `name` with `rows`, the file kept in step order (rows of
        one step in the order given), rewritten whole, atomically."""
        kept = [r for r in read_lines(self.root / name) if r.get("step") not in steps]
        ordered = sorted(kept + list(rows), key=step_key)  # stable: a step's rows keep their order
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

    def begin_reordering(self, step: int, reason: str = "late") -> None:
        """Say, before the first write, that the rows derived from the order (flips, budget events) are recomputed from
        `step` on: a writer killed before it is done leaves this file, and the next one recomputes them
        (`forgetwatch.record.ordering.repair`). `reason`: "late" (a step scored late is inserted) or "rescore" (a step
        set aside to be scored again), for what the next writer says."""
        pending = self.reordering()
        reason = reason if pending is None else self.reordering_reason()
        with atomic_write(self.root / REORDERING) as f:
            f.write(json.dumps({"from_step": step if pending is None else min(step, pending), "reason": reason}) + "\n")

    def reordering(self) -> int | None:
        """The step from which a reordering left unfinished recomputes, or None."""
        state = read_json_file(self.root / REORDERING) if (self.root / REORDERING).is_file() else None
        step = (state or {}).get("from_step")
        return step if isinstance(step, int) and not isinstance(step, bool) else None

    def reordering_reason(self) -> str:
        """Why the reordering under way began: "late" or "rescore" (`begin_reordering`)."""
        state = read_json_file(self.root / REORDERING) if (self.root / REORDERING).is_file() else None
        return "rescore" if (state or {}).get("reason") == "rescore" else "late"

    def end_reordering(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.root / REORDERING).unlink()

    def set_aside_step(self, step: int) -> Path:
        """Take a committed evaluation out of the record so that it is scored again (`forgetwatch watch --rescore`):
        its npz, its metrics.jsonl line and its rows of flips.jsonl, at_risk.jsonl and events.jsonl move to
        `superseded/rescore-step-<step>-<time>/`, never deleted. Its line leaves metrics.jsonl first, after a copy is
        on disk: a kill part way leaves the step unfinished, and `recover` sets the rest aside. Returns the folder."""
        aside = new_folder(self.root / SUPERSEDED / f"rescore-step-{step}-{time.strftime('%Y%m%d-%H%M%S')}")
        aside.mkdir(parents=True)
        self.begin_reordering(step, "rescore")  # the step after it has its flips against it: recomputed against the one before
        names = sorted((n for n in EVAL_LINES if (self.root / n).is_file()), key=lambda n: n != "metrics.jsonl")
        for name in names:
            rows = [r for r in read_lines(self.root / name) if r.get("step") == step]
            if rows:
                with open(aside / name, "a", encoding="utf-8") as f:
                    f.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
                    f.flush()
                    os.fsync(f.fileno())
        for name in names:  # metrics.jsonl first: the step is uncommitted before anything else of it goes
            if any(r.get("step") == step for r in read_lines(self.root / name)):
                self.rewrite_steps(name, {step}, [])
        if self.eval_path(step).exists():
            (aside / "evals").mkdir()
            shutil.move(self.eval_path(step), aside / "evals" / self.eval_path(step).name)
        return aside

    def append_trainer_log(self, row: dict[str, Any]) -> None:
        # Every logging step, inside the training loop: no fsync (a slow one on network storage would stall the step);
        # a crash loses at most the last rows, which trainer_state.json of the next checkpoint has anyway.
        append_line(self.root / "trainer_log.jsonl", row, sync=False)

    def read_trainer_log(self) -> list[dict[str, Any]]:
        # written without fsync: after a power loss a line may be garbage, and a plot of the loss is worth keeping
        return read_lines(self.root / "trainer_log.jsonl", skip_bad=True)

    def append_event(self, row: dict[str, Any]) -> None:
        append_line(self.root / "events.jsonl", row)

    def append_unwritten(self, row: dict[str, Any]) -> None:
        """Note an evaluation that could not be written (`step`, `path`, `error`): not one of the evaluation's own files
        (those are set aside when uncommitted), so that the loss stays said. Its own file at the record's root, which a
        write failure in `evals/` or a full disk (a short line fits where an npz does not) may spare."""
        append_line(self.root / UNWRITTEN, row)

    def unwritten(self) -> list[dict[str, Any]]:
        """The evaluations that could not be written and are still not in the record (a step scored again later, by a
        restarted watcher or a resumed run, is no longer missing), in step order."""
        done = set(self.committed_steps())
        rows = [r for r in read_lines(self.root / UNWRITTEN) if r.get("step") not in done]
        return sorted(rows, key=lambda r: r["step"] if isinstance(r.get("step"), int) else -1)

    def write_budget(self, state: dict[str, Any]) -> None:
        with atomic_write(self.root / "budget.json") as f:
            f.write(json.dumps(state, ensure_ascii=False, indent=1) + "\n")

    def read_events(self) -> list[dict[str, Any]]:
        return read_lines(self.root / "events.jsonl")

    def read_at_risk(self) -> list[dict[str, Any]]:
        return read_lines(self.root / "at_risk.jsonl")

    def read_budget(self) -> dict[str, Any] | None:
        return read_json_file(self.root / "budget.json", budget_problem)

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
        return read_json_file(self.root / "replay_mix.json")

    def _npz_steps(self) -> list[int]:
        if not self.evals_dir.is_dir():
            return []
        return sorted(int(m.group(1)) for p in self.evals_dir.iterdir() if (m := EVAL_FILE.search(p.name)))

    def committed_steps(self, file_order: bool = False) -> list[int]:
        """The evaluations committed, in step order: those with a `metrics.jsonl` line (the commit point). With
        `file_order`, in the order of the file (an earlier forgetwatch appended a step scored late after later ones)."""
        rows = read_lines(self.root / "metrics.jsonl") if file_order else self.read_metrics()
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
            return (
                f"Score it again from {ckpt}: `forgetwatch watch {shlex.quote(str(run))} --rescore {step}` (the file is set "
                "aside under "
                f"{self.root / SUPERSEDED}/, never deleted); or, to go on without it, {self.without_checkpoint(step)}"
            )
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
        order = (lambda rows: list(rows)) if file_order else (lambda rows: sorted(rows, key=step_key))
        if not checked:
            return order(read_lines(self.root / "metrics.jsonl"))
        path = self.root / "metrics.jsonl"
        rows = list(read_jsonl(path, RecordError, DAMAGED, objects=True, partial="skip")) if path.is_file() else []
        for lineno, row in rows:
            if problem := metrics_line_problem(row):
                raise RecordError(f"{path}, line {lineno}: {problem}; {DAMAGED}")
        return order(row for _, row in rows)

    def read_flips(self) -> list[dict[str, Any]]:
        return read_lines(self.root / "flips.jsonl")

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

    def _read_lines(self, path: Path) -> list[dict[str, Any]]:
        return read_lines(path)



def _pack_text(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    data = [t.encode("utf-8") for t in texts]
    return np.frombuffer(b"".join(data), np.uint8), np.cumsum([0] + [len(d) for d in data], dtype=np.int64)


def _unpack_text(data: np.ndarray, offsets: np.ndarray) -> list[str]:
    raw = data.tobytes()
    return [raw[a:b].decode("utf-8", "replace") for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist(), strict=True)]


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
