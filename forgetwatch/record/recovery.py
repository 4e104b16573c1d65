"""Keeping a run's record whole through crashes, kills and resumes: what a crash left half written set aside
(`recover`), what a resume from an earlier checkpoint abandoned cut out and kept (`truncate_after`), an earlier run's
record moved out of the way (`set_aside`), and the problems the report names (`check`, `being_written`). Nothing here
deletes: what is cut goes to `recovered/<time>/` or `superseded/after-step-N-<start>/` beside the record's files.

`RunRecord` (`forgetwatch.record.store`) takes these as its own methods.

Example:
    >>> from forgetwatch.record import load_record
    >>> record = load_record("outputs/my-run")  # doctest: +SKIP
    >>> record.recover()  # doctest: +SKIP
    ['metrics.jsonl: its last line was cut short (17 bytes)']
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

from .._io import atomic_write, repair_cut_tail, split_cut_tail
from ..errors import RecordError
from .files import EVAL_LINES, RECOVERED, STEP_FILES, SUPERSEDED, new_folder, read_lines

__all__ = ["Recovery"]

logger = logging.getLogger(__name__)


class Recovery:
    """The record's upkeep, as methods of `RunRecord` (which gives `root`, the step lists and the readers)."""

    root: Path

    def recover(self) -> list[str]:
        """Make the record whole again after a crash, before writing to it: a line cut short by the crash, and every
        file of an evaluation without its commit line (npz, flips, at-risk rows, events), move to
        `recovered/<time>/`; nothing is deleted. Returns what was done (also said in one warning)."""
        aside = new_folder(self.root / RECOVERED / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
        notes: list[str] = []
        for name in EVAL_LINES:
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
        for name in EVAL_LINES:
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

    def truncate_after(self, step: int, names: tuple[str, ...] = STEP_FILES, start: str | None = None) -> Path | None:
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
        aside = (
            self.root
            / SUPERSEDED
            / (
                f"{label}-{start[:12]}"
                if start
                else new_folder(self.root / SUPERSEDED / f"{label}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}").name
            )
        )
        for s in cut_evals:
            (aside / "evals").mkdir(parents=True, exist_ok=True)
            src = self.eval_path(s)
            # shutil.move: evals/ may be a link to another disk, where a rename cannot go
            shutil.move(src, new_folder(aside / "evals" / src.name))
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
            read_lines(path)  # damage is refused with the file and line
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
