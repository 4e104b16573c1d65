"""The local record of a run, under `<output_dir>/forgetwatch/`: everything needed to analyse it without W&B.

    probes.jsonl          the frozen probe set (the record's row order)
    base.parquet          the base model's per-probe results (the cache, unless one was given elsewhere)
    metrics.jsonl         one line per evaluation: step, epoch, seconds, every metric overall and per category
    evals/step-<N>.npz    per-probe outcome / pred_index / margin at step N: the probe × evaluation matrix
    flips.jsonl           the probes whose correctness changed at each evaluation
    at_risk.jsonl         the probes still right but at risk at each evaluation (see `forgetwatch.drift`)
    events.jsonl          budget events: a limit exceeded, at which step, and what was done
    budget.json           the budget, the limits over now, and the last evaluation within budget (and its checkpoint)
    trainer_log.jsonl     the trainer's own log rows (loss, learning rate, GRPO reward, ...) as the callback saw them in
                          `on_log`, with their step: the report draws them beside the forgetting curves
    replay.jsonl          forgotten probes as ready-to-train examples (when replay is on)
    model/                a sidecar-mode run's config and tokenizer: FSDP's sharded checkpoints hold neither, and
                          `forgetwatch watch` reads their weights into this model
    replay_mix.json       with `mix_replay`: the ratio, strategy, and from which stream position each evaluation's
                          category weights were drawn (what the closed loop decided; a resume reads it back)

Every file is written atomically or appended a whole line at a time, so a crash leaves a readable record.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ._io import atomic_write
from .results import ProbeResults, pack_ragged, unpack_ragged

__all__ = ["RunRecord", "load_record"]

logger = logging.getLogger(__name__)

_EVAL_FILE = re.compile(r"step-(\d+)\.npz$")
MODEL_FILES = "model"  # the record's directory of a sidecar-mode run's config and tokenizer
# what a resume from step N cuts back to N: the scoring's per-step files (the trainer log is the training process's own:
# the watcher, which scores beside training, never touches it)
_STEP_FILES = ("evals", "metrics.jsonl", "flips.jsonl", "at_risk.jsonl", "events.jsonl")


def _append_line(path: Path, obj: dict[str, Any], sync: bool = True) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(obj, ensure_ascii=False) + "\n")
        f.flush()
        if sync:
            os.fsync(f.fileno())


@dataclass
class RunRecord:
    """Writes (and reads back) the record directory of one training run."""

    root: Path

    def __post_init__(self) -> None:
        self.root = Path(self.root)

    @property
    def evals_dir(self) -> Path:
        return self.root / "evals"

    def write_eval(self, step: int, results: ProbeResults) -> None:
        """The per-probe results of the evaluation at `step` (option scores packed flat with offsets)."""
        self.evals_dir.mkdir(parents=True, exist_ok=True)
        flat, offsets = pack_ragged(results.option_scores)
        with atomic_write(self.evals_dir / f"step-{step:08d}.npz", "wb") as f:
            np.savez(f, outcome=results.outcome.astype(np.int8), pred_index=results.pred_index.astype(np.int32),
                     margin=results.margin.astype(np.float32), gold_logprob=results.gold_logprob.astype(np.float32),
                     option_scores=flat, option_offsets=offsets, n_tokens=results.n_tokens.astype(np.int32),
                     stopped=results.stopped.astype(np.int8), detail=np.asarray(results.detail, dtype=str))

    def append_metrics(self, row: dict[str, Any]) -> None:
        _append_line(self.root / "metrics.jsonl", row)

    def append_flips(self, rows: list[dict[str, Any]]) -> None:
        self._append_lines("flips.jsonl", rows)

    def _append_lines(self, name: str, rows: list[dict[str, Any]]) -> None:
        if not rows:
            return
        with open(self.root / name, "a", encoding="utf-8") as f:
            f.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
            f.flush()
            os.fsync(f.fileno())

    def append_at_risk(self, rows: list[dict[str, Any]]) -> None:
        self._append_lines("at_risk.jsonl", rows)

    def append_trainer_log(self, row: dict[str, Any]) -> None:
        # Every logging step, inside the training loop: no fsync (a slow one on network storage would stall the step);
        # a crash loses at most the last rows, which trainer_state.json of the next checkpoint has anyway.
        _append_line(self.root / "trainer_log.jsonl", row, sync=False)

    def read_trainer_log(self) -> list[dict[str, Any]]:
        # written without fsync: after a power loss a line may be garbage, and a plot of the loss is worth keeping
        return _read_jsonl(self.root / "trainer_log.jsonl", skip_bad=True)

    def append_event(self, row: dict[str, Any]) -> None:
        _append_line(self.root / "events.jsonl", row)

    def write_budget(self, state: dict[str, Any]) -> None:
        with atomic_write(self.root / "budget.json") as f:
            f.write(json.dumps(state, ensure_ascii=False, indent=1) + "\n")

    def read_events(self) -> list[dict[str, Any]]:
        return _read_jsonl(self.root / "events.jsonl")

    def read_at_risk(self) -> list[dict[str, Any]]:
        return _read_jsonl(self.root / "at_risk.jsonl")

    def read_budget(self) -> dict[str, Any] | None:
        path = self.root / "budget.json"
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None

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
        path = self.root / "replay_mix.json"
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None

    def eval_steps(self) -> list[int]:
        if not self.evals_dir.is_dir():
            return []
        return sorted(int(m.group(1)) for p in self.evals_dir.iterdir() if (m := _EVAL_FILE.search(p.name)))

    def read_eval(self, step: int) -> dict[str, np.ndarray]:
        """The arrays of one evaluation: outcome, pred_index, margin, gold_logprob, option_scores, option_offsets."""
        with np.load(self.evals_dir / f"step-{step:08d}.npz") as z:
            return {k: z[k] for k in z.files}

    def read_results(self, step: int, ids: list[str]) -> ProbeResults:
        """One evaluation as `ProbeResults` (predictions and generations are not kept per step; answer lengths, stops and
        behaviour checks are)."""
        z = self.read_eval(step)
        r = ProbeResults.empty(ids)
        r.outcome, r.pred_index, r.margin = z["outcome"], z["pred_index"], z["margin"]
        if "gold_logprob" in z:
            r.gold_logprob = z["gold_logprob"]
        if "option_scores" in z:
            r.option_scores = unpack_ragged(z["option_scores"], z["option_offsets"])
        if "n_tokens" in z:  # records written before behaviour probes have none
            r.n_tokens, r.stopped, r.detail = z["n_tokens"], z["stopped"], [str(d) for d in z["detail"]]
        return r

    def read_metrics(self) -> list[dict[str, Any]]:
        return _read_jsonl(self.root / "metrics.jsonl")

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

    def outcome_matrix(self) -> tuple[list[int], np.ndarray]:
        """(steps, matrix) with matrix[e, i] the outcome of probe i at the e-th evaluation."""
        steps = self.eval_steps()
        if not steps:
            return [], np.zeros((0, 0), np.int8)
        return steps, np.stack([self.read_eval(s)["outcome"] for s in steps])

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

    def truncate_after(self, step: int, names: tuple[str, ...] = _STEP_FILES) -> None:
        """Forget evaluations after `step` (resuming from an earlier checkpoint recomputes them); `names` says which files."""
        if "evals" in names:
            for s in self.eval_steps():
                if s > step:
                    (self.evals_dir / f"step-{s:08d}.npz").unlink()
        for name in names:
            if name == "evals":
                continue
            path = self.root / name
            if path.is_file():
                # the trainer log is written without fsync: a garbled line is dropped, not fatal
                kept = [r for r in _read_jsonl(path, skip_bad=name == "trainer_log.jsonl") if r.get("step", 0) <= step]
                with atomic_write(path) as f:
                    f.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in kept))


def _read_jsonl(path: Path, skip_bad: bool = False) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.endswith("\n"):  # a line cut short by a crash is not a record
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    if not skip_bad:
                        raise
    return rows


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
