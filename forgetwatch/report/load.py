"""What the report reads from a run's record: the evaluations, the trainer's log, each probe's state at each step,
the flips at the end, the budget's events, the fragile probes; and what of the record is missing.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from ..measures.robustness import fragile_probes
from ..probes.probe_set import ProbeSet
from ..record.store import RecordError, RunRecord, load_record

__all__ = ["incomplete", "DPI", "PLOT_FILES", "STATES", "TRAIN_KEYS", "adjusted", "final_flips", "fragile_now",
           "probe_states", "read_events", "read_run", "series", "steps_of", "trainer_log", "writable"]

logger = logging.getLogger(__name__)


OVERALL = "overall"

MAX_ROWS = 200

DPI = 110


PLOT_FILES = {
    "overall": "forgetting_backward_transfer.png",
    "forgetting": "forgetting_by_category.png",
    "backward_transfer": "backward_transfer_by_category.png",
    "accuracy": "accuracy.png",
    "drift": "drift.png",
    "training": "training.png",
    "states": "probe_states.png",
    "matrix": "probe_matrix.png",
    "behavior": "behavior.png",
    "robustness": "robustness.png",
}

# the four states of a probe against the base model, in the order they are stacked
STATES = ("retained", "forgotten", "learned", "never known")


CUT = 160  # characters of a question (or answer) shown in a table cell; the rest unfolds below them

_VS_BASE = {(True, True): "retained", (True, False): "forgotten", (False, True): "learned", (False, False): "never known"}


_CORRECTNESS = ("1→0", "0→1")  # flips.jsonl directions that are changes of correctness (robustness adds others)


# -- the record ---------------------------------------------------------------------------------------------
def incomplete(record: RunRecord) -> list[str]:
    """What the record lacks because it could not be written (`RunRecord.unwritten`), one sentence per step: "step 4
    could not be written (writing <file>: <OS error>); probing stopped there". Empty when it lacks nothing so.

    Example:
        >>> incomplete(load_record("outputs/sft-demo"))  # doctest: +SKIP
        []
    """
    return [f"step {r.get('step')} could not be written (writing {r.get('path')}: {r.get('error')}); probing stopped there"
            for r in record.unwritten()]


def read_run(output_dir: str | os.PathLike, warn: bool = True
          ) -> tuple[RunRecord, ProbeSet, list[dict[str, Any]], list[str], str | None]:
    """The record, its probes, its committed metrics rows in step order, its problems, and the evaluation a live writer is
    writing now (said, not a problem; None when none)."""
    how = ("run training with `ForgetWatchCallback` (it writes the record under <output_dir>/forgetwatch/), "
           "then pass that output_dir")
    if not Path(output_dir).is_dir():
        raise FileNotFoundError(f"{output_dir}: no such directory; {how}")
    try:
        record = load_record(output_dir)
    except FileNotFoundError as e:
        raise FileNotFoundError(f"{e}; {how}") from None
    rows = sorted(record.read_metrics(checked=True), key=lambda r: r["step"])
    if not rows:
        lost = incomplete(record)  # the first evaluation could not be written: say so, not "not yet"
        raise RecordError(
            f"{record.root}: the record has no evaluation yet ({record.root / 'metrics.jsonl'} is missing or empty); "
            + ("; ".join(lost) if lost else
               "the callback writes the first one (the base model, step 0) when training starts")
        )
    probes = ProbeSet.from_jsonl(record.root / "probes.jsonl")
    # read while a writer scores: its newest evaluation has an npz and no line yet, which is no damage
    busy = record.being_written()
    problems = record.check(probes.fingerprint, len(probes), writing=busy[0] if busy else None)
    for problem in problems if warn else []:  # the page shows them too: a figure from a mixed record is not the run's
        logger.warning("forgetwatch report: %s", problem)
    writing = None
    if busy is not None:
        step, holder = busy
        writing = (f"step {step}, by {holder.get('run')} (pid {holder.get('pid')} on {holder.get('host')}), which holds "
                   "the record's scoring lock: its per-probe file is written and its metrics.jsonl line not yet; not in "
                   "these figures (report again once it is written)")
    return record, probes, rows, problems, writing


def writable(default: Path, output_dir: Any) -> Path:
    """The report's folder: `default` (in the record) where it can be written; else, a record on a read-only file system
    or of another user, a folder of the system's temporary directory named after it (a report only reads the record)."""
    try:
        default.mkdir(parents=True, exist_ok=True)
        if os.access(default, os.W_OK):
            return default
        reason = "permission denied"
    except OSError as e:
        reason = (e.strerror or str(e)).lower()
    import hashlib
    import tempfile

    where = str(default.resolve())
    name = default.parent.parent.name if default.parent.name == "forgetwatch" else default.parent.name
    out = Path(tempfile.gettempdir()) / f"forgetwatch-report-{name}-{hashlib.sha256(where.encode()).hexdigest()[:8]}"
    logger.warning("forgetwatch report: cannot write to %s (%s): the record is only read, and the page goes to %s "
                   "(`forgetwatch report %s --output DIR` chooses where)", default, reason, out, output_dir)
    return out


# the trainer's log keys drawn beside the forgetting curves: loss panel, then reward panel (GRPO)
TRAIN_KEYS = ("loss", "eval_loss", "reward")

_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def trainer_log(record: RunRecord, eval_steps: list[int]) -> tuple[list[dict[str, Any]], str]:
    """The trainer's log rows with their step, and where they came from.

    The rows the callback kept (`trainer_log.jsonl`) when they start with the run (by its first evaluation after the
    base); else the `log_history` of a `trainer_state.json` (the output dir's or a checkpoint's) that covers the most
    steps without going past the record's last evaluation (a longer one is an earlier run's, in a reused output dir);
    else whatever the callback kept (a record kept from a resume on)."""
    kept = record.read_trainer_log()
    source = str(record.root / "trainer_log.jsonl")
    first = min((s for s in eval_steps if s > 0), default=0)
    if kept and min(r.get("step", 0) for r in kept) <= max(first, 1):
        return kept, source
    run_dir, last = record.root.parent, max(eval_steps, default=0)
    paths = [run_dir / "trainer_state.json"]
    if run_dir.is_dir():
        ckpts = sorted((int(m.group(1)), p) for p in run_dir.iterdir() if (m := _CHECKPOINT.match(p.name)) and p.is_dir())
        paths += [p / "trainer_state.json" for _, p in reversed(ckpts)]
    best: tuple[list[dict[str, Any]], str] = (kept, source if kept else "")
    for path in paths:
        try:
            history = json.loads(path.read_text(encoding="utf-8")).get("log_history") or []
        except (OSError, ValueError, AttributeError):
            continue
        rows = [r for r in history if isinstance(r, dict) and isinstance(r.get("step"), int)]
        if (
            rows
            and max(r["step"] for r in rows) <= last
            and len({r["step"] for r in rows}) > len({r.get("step") for r in best[0]})
        ):
            best = (rows, str(path))
    return best


def probe_states(record: RunRecord, probes: ProbeSet) -> tuple[np.ndarray, np.ndarray] | None:
    """(steps, state[e, i]): each probe's state against the base at each evaluation, as an index into STATES.

    The base is the record's step-0 evaluation, or its base.parquet when the record starts later (a resumed run
    whose earlier record was cut)."""
    # steps whose file is another probe set's are left out (`record.check` said so, with what to do)
    steps, matrix = record.outcome_matrix(len(probes), probes.fingerprint, warn=False)
    if not steps or matrix.shape[1] != len(probes):
        return None
    if steps[0] == 0:
        base = matrix[0]
    else:
        from ..record.cache import BaseCache

        try:
            base = BaseCache.load(record.root / "base.parquet").results.select(probes.ids).outcome
        except Exception:  # no base at hand: no picture, the rest of the report stands
            return None
    b, now = base[None, :] == 1, matrix == 1
    # retained 0, forgotten 1, learned 2, never known 3
    state = np.where(b, np.where(now, 0, 1), np.where(now, 2, 3)).astype(np.int8)
    return np.asarray(steps), state


def series(rows: list[dict[str, Any]], name: str, field: str) -> np.ndarray:
    return np.array([float(r["metrics"].get(name, {}).get(field, math.nan)) for r in rows])


def steps_of(rows: list[dict[str, Any]]) -> np.ndarray:
    return np.array([r["step"] for r in rows])


def adjusted(rows: list[dict[str, Any]], name: str) -> bool:
    """Whether the group has multiple-choice probes (otherwise the adjusted curve is the raw one)."""
    return bool(rows[-1]["metrics"].get(name, {}).get("adjusted", False))


def final_flips(record: RunRecord, probes: ProbeSet, final_step: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The probes forgotten (base right, wrong now) and learned (base wrong, right now) at the final evaluation.

    `flips.jsonl` holds one row per change of correctness between consecutive evaluations (1→0, 0→1), so a probe's
    last such row gives its state now; its rows of changes of robustness (robust→fragile, fragile→robust) are not
    counted here. Multiple-choice predictions come from the final evaluation's `pred_index`
    (a forgotten probe can move between wrong options without a flip); short answers keep their last flip's text.
    """
    by_id: dict[str, list[dict[str, Any]]] = {}
    for r in sorted(record.read_flips(), key=lambda r: r["step"]):
        # only changes of correctness: robustness's rows (robust→fragile, fragile→robust) are of a probe right as asked
        if r["step"] <= final_step and r.get("direction") in _CORRECTNESS:
            by_id.setdefault(r["id"], []).append(r)
    pred_index = None
    if final_step in record.matrix_steps(len(probes), probes.fingerprint)[0]:  # not another probe set's file
        pred_index = record.read_eval(final_step)["pred_index"]

    forgotten, learned = [], []
    for pid, flips in by_id.items():
        # Until its first flip a probe is as it was at base, so the record's vs_base can be derived where missing.
        base_ok = flips[0]["direction"] == "1→0"
        states = [f.get("vs_base") or _VS_BASE[base_ok, f["direction"] == "0→1"] for f in flips]
        state, last = states[-1], flips[-1]
        if state not in ("forgotten", "learned"):
            continue
        prediction = last.get("prediction", "")
        if pred_index is not None and pid in probes:
            i = probes.index_of(pid)
            p = probes[i]
            if p.kind == "mcq" and 0 <= int(pred_index[i]) < len(p.choices):
                prediction = p.choices[int(pred_index[i])]
        row = {
            "id": pid, "category": last.get("category", ""), "question": last.get("question", ""), "gold": last.get("gold", ""),
            "base_prediction": last.get("base_prediction", ""), "prediction": prediction,
            "first_step": next(f["step"] for f, st in zip(flips, states, strict=True) if st == state), "changes": len(flips),
        }
        (forgotten if state == "forgotten" else learned).append(row)
    key = lambda r: (r["category"], r["first_step"], r["id"])  # noqa: E731
    return sorted(forgotten, key=key), sorted(learned, key=key)


def read_events(record: RunRecord) -> list[dict[str, Any]]:
    """The budget events in step order (a record an earlier forgetwatch wrote may hold a step scored late after later
    ones)."""
    return sorted(record.read_events(), key=lambda e: e["step"] if isinstance(e.get("step"), (int, float)) else math.inf)


def fragile_now(record: RunRecord, probes: ProbeSet, final_step: int) -> list[dict[str, Any]] | None:
    """The probes fragile at the final evaluation (robust at base, right as asked now, wrong in some variant now), from
    the variants recorded at step 0 and at the final step; None when either has none, or they are not the same probes.

    Probes with a variant scored NaN / inf either time are left out (such a variant is no answer). The step each first
    became fragile comes from flips.jsonl's robust→fragile rows; a probe that became fragile through a plain flip (wrong
    as asked in between) has none."""
    steps = record.matrix_steps(len(probes), probes.fingerprint)[0]  # not another probe set's files
    if 0 not in steps or final_step not in steps:
        return None
    try:
        base, now = record.read_robust(0), record.read_robust(final_step)
    except RecordError:
        return None
    if base is None or now is None or base.ids != now.ids or base.right.shape != now.right.shape:
        return None
    since: dict[str, int] = {}
    for r in sorted(record.read_flips(), key=lambda r: r["step"]):
        if r.get("direction") == "robust→fragile" and r["step"] <= final_step:
            since.setdefault(r["id"], r["step"])
    ok = ~(base.nonfinite.any(1) | now.nonfinite.any(1))
    out = []
    for r in np.flatnonzero(fragile_probes(base.right, now.right) & ok):
        pid = base.ids[int(r)]
        p = probes[pid] if pid in probes else None
        out.append({"id": pid, "category": p.category if p else "", "question": p.question if p else "",
                    "gold": p.gold_text if p else "", "right": f"{int(now.right[r].sum())} of {now.right.shape[1]}",
                    "since": since.get(pid)})
    return sorted(out, key=lambda r: (r["category"], r["since"] if r["since"] is not None else math.inf, r["id"]))
