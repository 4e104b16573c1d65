"""A run's local record as PNG plots and one HTML page: `forgetwatch report <output_dir>`, no W&B needed.

    <output_dir>/forgetwatch/report/
        report.html                        title, run, the plots, a per-category table, the flipped probes
        forgetting_backward_transfer.png   overall F and BT vs step: raw (solid, Wilson 95% band), chance-adjusted (dashed)
        forgetting_by_category.png         F per category, one panel each (shared axes)
        backward_transfer_by_category.png  BT per category, one panel each (shared axes)
        accuracy.png                       accuracy vs step, overall and per category
        training.png                       the trainer's loss (and GRPO reward) above F and BT, on one step axis
        probe_states.png                   how many probes are retained / forgotten / learned / never known at each step
        probe_matrix.png                   every probe × every evaluation, grouped by category, coloured by that state
        drift.png                          margins and KL since base (when the run has them)
        robustness.png                     robust vs plain forgetting, consistency, position bias (robustness on)
        rewind.png                         the rewind's front: forgetting against the task loss, α by α (after a rewind)

With robustness on (`robustness=K`) the page also shows the robust figures evaluation by evaluation and
the probes fragile at the final evaluation (robust at base, right as asked now, wrong in some variant now).

Everything comes from the record (`metrics.jsonl`, `flips.jsonl`, `probes.jsonl`, `evals/`, `trainer_log.jsonl`, or
the trainer's `trainer_state.json` for records made before the callback kept the trainer's log); nothing is
recomputed from a model. Plots use matplotlib's Agg canvas directly (no pyplot, no global backend change);
every file is written atomically, the HTML last, so the page never points at a missing plot.
"""

from __future__ import annotations

import html
import json
import logging
import math
import os
import re
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from .._io import atomic_write
from ..measures.robustness import fragile_probes
from ..probes.probe_set import ProbeSet
from ..record.segments import describe_segments
from ..record.store import RecordError, RunRecord, load_record
from ..remedies.rewind import read_rewind, rewind_section
from ..run.console import format_evaluation, headline_categories, worst_categories

__all__ = ["make_report", "summarize_run", "incomplete"]

logger = logging.getLogger(__name__)

OVERALL = "overall"
MAX_ROWS = 200
_DPI = 110
_F_COLOR, _BT_COLOR = "tab:red", "tab:blue"
_PNG = {
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
# the four states of a probe against the base model, in the order they are stacked, and their colours
_STATES = ("retained", "forgotten", "learned", "never known")
_STATE_COLORS = ("#8fc98f", "tab:red", "tab:blue", "#e6e6e6")
CUT = 160  # characters of a question (or answer) shown in a table cell; the rest unfolds below them
_VS_BASE = {(True, True): "retained", (True, False): "forgotten", (False, True): "learned", (False, False): "never known"}
_ROBUST_COLOR = "tab:purple"
_CORRECTNESS = ("1→0", "0→1")  # flips.jsonl directions that are changes of correctness (robustness adds others)
_LABEL = {"forgetting": "forgetting (1→0)", "backward_transfer": "backward transfer (0→1)"}


def make_report(output_dir: str | os.PathLike, out_dir: str | os.PathLike | None = None, *, max_rows: int = MAX_ROWS) -> Path:
    """Write PNG plots and a self-contained `report.html` from the local record of a training run.

    Args:
        output_dir: the trainer's `output_dir` (or its `forgetwatch/` folder) of a run made with
            `ForgetWatchCallback`; the record may belong to a run still in progress.
        out_dir: where to write the report; default `<output_dir>/forgetwatch/report/`.
        max_rows: at most this many rows in each table of flipped probes (forgotten, learned); the page says
            how many more there are.

    Returns:
        The path of `report.html`; the PNGs it shows are next to it.

    Raises:
        FileNotFoundError: `output_dir` holds no forgetwatch record.
        ValueError: the record has no evaluation yet.
        ImportError: matplotlib is not installed (`pip install 'forgetwatch[report]'`).

    Example:
        >>> from forgetwatch.report.render import make_report
        >>> page = make_report("outputs/sft-demo")  # doctest: +SKIP
        >>> page  # doctest: +SKIP
        PosixPath('outputs/sft-demo/forgetwatch/report/report.html')
    """
    if max_rows < 0:
        raise ValueError(f"`max_rows` must be >= 0, got {max_rows}")
    record, probes, rows, problems, writing = _load(output_dir)
    figure_cls, canvas_cls = _matplotlib()  # fail before writing anything
    out = Path(out_dir) if out_dir is not None else _writable(record.root / "report", output_dir)
    out.mkdir(parents=True, exist_ok=True)

    names = [c for c in rows[-1]["metrics"] if c != OVERALL]
    # knowledge and behaviour probes together: their two summary groups come first, then the categories
    groups = [c for c in names if c in probes.kind_groups()]
    categories = groups + [c for c in names if c not in groups]
    # in the page's order: the headline, what training did beside it, every probe, then the breakdowns
    figures = {"overall": _plot_overall(figure_cls, rows, len(probes))}
    train_log, train_source = _trainer_log(record, [r["step"] for r in rows])
    if any(k in r for r in train_log for k in _TRAIN_KEYS):
        figures["training"] = _plot_training(figure_cls, rows, train_log)
    states = _states(record, probes)
    if states is not None:
        figures["states"] = _plot_states(figure_cls, *states)
        figures["matrix"] = _plot_matrix(figure_cls, *states, probes, rows[-1]["metrics"])
    if categories:
        for metric in ("forgetting", "backward_transfer"):
            figures[metric] = _plot_by_category(figure_cls, rows, categories, metric)
    figures["accuracy"] = _plot_accuracy(figure_cls, rows, categories)
    if any(np.isfinite(_series(rows, OVERALL, "margin_change"))):  # records made before drift have no margins here
        figures["drift"] = _plot_drift(figure_cls, rows)
    if any("runaway_rate" in r["metrics"][OVERALL] for r in rows):  # generated answers: how they behave
        figures["behavior"] = _plot_behavior(figure_cls, rows)
    if _has_robustness(rows):  # robustness on: each probe scored in variants too
        figures["robustness"] = _plot_robustness(figure_cls, rows)
    for key, fig in figures.items():
        canvas_cls(fig)
        with atomic_write(out / _PNG[key], "wb") as f:
            fig.savefig(f, format="png", dpi=_DPI)

    forgotten, learned = _final_flips(record, probes, rows[-1]["step"])
    page = _html(output_dir, record, probes, rows, categories, list(figures), forgotten, learned, max_rows, train_source,
                 writing)
    page = page.replace("<!--problems-->", _incomplete(incomplete(record)) + _problems(problems))
    page = page.replace("<!--drift-->", _drift_section(record, rows, max_rows))
    robust = _robust_section(record, probes, rows, max_rows)
    page = page.replace("<!--robustness-->", "\n\n" + robust if robust else "")
    page = page.replace("<!--rewind-->", rewind_section(record.root, out))  # `forgetwatch rewind`'s front, when run
    path = out / "report.html"
    with atomic_write(path) as f:
        f.write(page)
    return path


def summarize_run(output_dir: str | os.PathLike, worst: int = 3) -> str:
    """A few lines of text on a run's record, as `forgetwatch report` prints them beside the page's path: the run and
    its evaluations, the last one's line (as the console printed it during training: F and BT with their intervals,
    F adjusted, behaviour, probing time), the categories with the highest F, the budget's events, and the rewind.

    Every figure is read from the record (`metrics.jsonl`, `events.jsonl`, `budget.json`, `rewind.json`), none
    computed again.

    Args:
        output_dir: the trainer's `output_dir` (or its `forgetwatch/` folder).
        worst: how many categories to name, highest F first.

    Raises:
        FileNotFoundError, ValueError: as `make_report` (no record, no evaluation yet).

    Example:
        >>> print(summarize_run("outputs/sft-demo"))  # doctest: +SKIP
        run sft-demo: 200 probes in 2 categories; 5 evaluations, at steps 0, 10, 20, 30, 40
        step 40: F 0.205 [0.16, 0.26] adj 0.125, BT 0.020 [0.01, 0.05]; probing 28.1 s
        most forgotten (surest first): sciq F 0.260 of 100, arc_easy F 0.150 of 100
    """
    record, probes, rows, problems, writing = _load(output_dir, warn=False)  # the page's making warns of its problems
    final = rows[-1]
    steps = [r["step"] for r in rows]
    name = record.root.parent.name if record.root.name == "forgetwatch" else record.root.name
    n_cats = len(probes.categories)
    lines = [f"run {name}: {len(probes)} probes in {n_cats} categor{'y' if n_cats == 1 else 'ies'}; {len(rows)} evaluation"
             f"{'' if len(rows) == 1 else 's'}, at steps {', '.join(map(str, steps[:12]))}{' …' if len(steps) > 12 else ''}"]
    lines.append(format_evaluation(final["step"], final["metrics"], final.get("seconds"), categories=probes.categories,
                                   label="", worst=False))
    top = worst_categories(final["metrics"], headline_categories(probes), n=worst)
    if top:
        def counted(c: str, f: float) -> str:  # "of N": why one probe's F 1.0 can rank below 15 of 40
            n = final["metrics"][c].get("n")
            return f"{c} F {f:.3f}" + (f" of {n}" if n else "")

        lines.append("most forgotten (surest first): " + ", ".join(counted(c, f) for c, f in top))
    budget = record.read_budget()
    if budget is not None:
        limits = ", ".join(f"{k} ≤ {v:g}" for k, v in (budget.get("limits") or {}).items())
        events = _events(record)
        said = "; ".join(_event_text(e) for e in events[:3]) + (f"; … {len(events) - 3} more" if len(events) > 3 else "")
        within = budget.get("last_within_budget") or {}
        where = f"step {within.get('step')}" + (f" ({within['checkpoint']})" if within.get("checkpoint") else "")
        lines.append(f"budget {limits} (on_budget {budget.get('on_budget')}): {said or 'never exceeded'}; last within "
                     f"budget: {where}")
    if writing:
        lines.append(f"being written: {writing}")
    lines += describe_segments(record.root)  # the probe set changed: where the earlier segment is, how to report it
    if problems:
        lines.append(f"record problems: {len(problems)} (the page lists them)")
    lines[1:1] = [f"record incomplete: {text}" for text in incomplete(record)]  # under the run's line: it qualifies it
    rewound = read_rewind(record.root)
    if rewound is not None:  # the run was rewound (forgetwatch_rewind, `forgetwatch rewind`): its line closes the summary
        lines.append(rewound.line())
    return "\n".join(lines)


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


def _load(output_dir: str | os.PathLike, warn: bool = True
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


def _writable(default: Path, output_dir: Any) -> Path:
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
_TRAIN_KEYS = ("loss", "eval_loss", "reward")
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def _trainer_log(record: RunRecord, eval_steps: list[int]) -> tuple[list[dict[str, Any]], str]:
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
        if rows and max(r["step"] for r in rows) <= last and len({r["step"] for r in rows}) > len({r.get("step") for r in best[0]}):
            best = (rows, str(path))
    return best


def _states(record: RunRecord, probes: ProbeSet) -> tuple[np.ndarray, np.ndarray] | None:
    """(steps, state[e, i]): each probe's state against the base at each evaluation, as an index into _STATES.

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


def _series(rows: list[dict[str, Any]], name: str, field: str) -> np.ndarray:
    return np.array([float(r["metrics"].get(name, {}).get(field, math.nan)) for r in rows])


def _steps(rows: list[dict[str, Any]]) -> np.ndarray:
    return np.array([r["step"] for r in rows])


def _adjusted(rows: list[dict[str, Any]], name: str) -> bool:
    """Whether the group has multiple-choice probes (otherwise the adjusted curve is the raw one)."""
    return bool(rows[-1]["metrics"].get(name, {}).get("adjusted", False))


def _final_flips(record: RunRecord, probes: ProbeSet, final_step: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
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


# -- plots --------------------------------------------------------------------------------------------------
def _matplotlib():
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as e:
        raise ImportError(f"`forgetwatch report` draws its plots with matplotlib ({e}): pip install 'forgetwatch[report]'") from e
    return Figure, FigureCanvasAgg


def _plain(text: str) -> str:
    """Text from the record as matplotlib shows it: literal, never mathtext (`$x$` would parse, a bad one raise)."""
    return str(text).replace("$", r"\$")


def _style_axis(ax, rows, ylabel: str | None = "share of probes") -> None:
    from matplotlib.ticker import MaxNLocator

    if len(rows) <= 12:
        ax.set_xticks(_steps(rows))  # a tick at every evaluation
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(True, alpha=0.3)
    ax.set_ylim(bottom=0)
    if ylabel:
        ax.set_ylabel(ylabel)


def _draw_metric(ax, rows, name: str, metric: str, color: str, label: str | None) -> None:
    """Raw (solid, markers) with its Wilson band, chance-adjusted (dashed) when the group has multiple choice."""
    x = _steps(rows)
    ax.fill_between(x, _series(rows, name, f"{metric}_ci_low"), _series(rows, name, f"{metric}_ci_high"),
                    color=color, alpha=0.15, linewidth=0, label=f"{label}, 95% Wilson interval" if label else None)
    ax.plot(x, _series(rows, name, metric), color=color, marker="o", markersize=4, linewidth=2, label=label)
    partial = np.array([bool(r.get("partial")) for r in rows])
    if partial.any():  # max_share: an estimate from a part of the probes, with its sampling interval (90%)
        y = _series(rows, name, metric)[partial]
        low, high = (_series(rows, name, f"{metric}_sampling_{end}")[partial] for end in ("low", "high"))
        ax.errorbar(x[partial], y, yerr=[np.clip(y - low, 0, None), np.clip(high - y, 0, None)], fmt="o", markersize=6,
                    markerfacecolor="white", color=color, capsize=3, linewidth=1,
                    label=f"{label}, estimated (partial evaluation, 90% sampling interval)" if label else None)
    if _adjusted(rows, name):
        ax.plot(x, _series(rows, name, f"{metric}_adjusted"), color=color, linestyle="--", marker="o", markersize=3,
                linewidth=1.5, label=f"{label}, chance-adjusted" if label else None)


def _plot_overall(figure_cls, rows, n_probes: int):
    fig = figure_cls(figsize=(8, 4.8), layout="constrained")
    ax = fig.add_subplot()
    for metric, color in (("forgetting", _F_COLOR), ("backward_transfer", _BT_COLOR)):
        _draw_metric(ax, rows, OVERALL, metric, color, _LABEL[metric])
    _style_axis(ax, rows)
    ax.set_xlabel("optimizer step")
    ax.set_title(f"Forgetting and backward transfer vs the base model, all {n_probes} probes")
    # below the axes, never over the curves; filled column by column: a column for F, one for BT
    handles, labels = ax.get_legend_handles_labels()
    order = [1, 2, 0, 4, 5, 3] if len(handles) == 6 else range(len(handles))
    fig.legend([handles[i] for i in order], [labels[i] for i in order], loc="outside lower center",
               ncols=2 if len(handles) > 3 else 1, fontsize="small", frameon=False)
    return fig


def _plot_training(figure_cls, rows, log: list[dict[str, Any]]):
    """The trainer's loss (and GRPO reward) above forgetting and backward transfer, sharing the step axis."""
    panels = [keys for keys in (("loss", "eval_loss"), ("reward",)) if any(k in r for r in log for k in keys)]
    fig = figure_cls(figsize=(8, 2.4 * (len(panels) + 1) + 0.6), layout="constrained")
    axes = fig.subplots(len(panels) + 1, 1, sharex=True, squeeze=False).ravel()
    styles = {"loss": ("black", "-", "training loss"), "eval_loss": ("tab:purple", "--", "eval loss"),
              "reward": ("tab:green", "-", "reward (mean)")}
    for ax, keys in zip(axes, panels, strict=False):
        for k in keys:
            pts = [(r["step"], float(r[k])) for r in log if isinstance(r.get(k), (int, float)) and math.isfinite(float(r[k]))]
            if pts:
                color, ls, label = styles[k]
                x, y = zip(*sorted(pts), strict=True)
                ax.plot(x, y, color=color, linestyle=ls, marker="." if len(pts) < 60 else None, linewidth=1.5, label=label)
        ax.grid(True, alpha=0.3)
        ax.set_ylabel("reward" if keys == ("reward",) else "loss")
        ax.legend(fontsize="small", loc="best")
    ax = axes[-1]
    for metric, color in (("forgetting", _F_COLOR), ("backward_transfer", _BT_COLOR)):
        _draw_metric(ax, rows, OVERALL, metric, color, _LABEL[metric])
    ax.grid(True, alpha=0.3)
    ax.set_ylim(bottom=0)
    ax.set_ylabel("share of probes")
    ax.set_xlabel("optimizer step")
    fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", ncols=2, fontsize="x-small", frameon=False)
    fig.suptitle("What training optimised, and what it cost: one step axis")
    return fig


def _plot_states(figure_cls, steps: np.ndarray, state: np.ndarray):
    """Stacked counts of retained / forgotten / learned / never known probes at each evaluation."""
    counts = np.stack([(state == i).sum(axis=1) for i in range(len(_STATES))])
    fig = figure_cls(figsize=(8, 4.4), layout="constrained")
    ax = fig.add_subplot()
    ax.stackplot(steps, counts, labels=[f"{s}" for s in _STATES], colors=_STATE_COLORS, alpha=0.95)
    ax.set_xlim(steps[0], steps[-1] if len(steps) > 1 else steps[0] + 1)
    ax.set_ylim(0, state.shape[1])
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("probes")
    ax.set_title(f"All {state.shape[1]} probes against the base model at each evaluation")
    ax.grid(True, alpha=0.3)
    fig.legend(loc="outside right upper", fontsize="small", reverse=True)
    return fig


def _matrix_layout(state: np.ndarray, categories: list[str], final: dict[str, Any], rows_per_label: float):
    """The probe × evaluation picture's row order and category labels.

    Rows are grouped by category (sorted); within one, the probes forgotten now come first, earliest forgotten first,
    then retained, learned and never known. Returns (order, band starts, (tick, label) pairs); a band's label is left
    out when it would sit closer than `rows_per_label` rows to the last one drawn (57 MMLU subjects, say)."""
    n_evals = state.shape[0]
    names = {c: j for j, c in enumerate(sorted(set(categories)))}
    first_lost = np.where((state == 1).any(axis=0), (state == 1).argmax(axis=0), n_evals)
    final_state = state[-1]
    order = sorted(range(len(categories)),
                   key=lambda i: (names[categories[i]], final_state[i] != 1, first_lost[i], final_state[i], i))
    sorted_cats = [categories[i] for i in order]
    n = len(order)
    starts = [0] + [j for j in range(1, n) if sorted_cats[j] != sorted_cats[j - 1]]
    labels, last = [], -math.inf
    for a, b in zip(starts, starts[1:] + [n], strict=True):
        mid = (a + b - 1) / 2
        if mid - last < rows_per_label:
            continue
        c = sorted_cats[a]
        mark = " (nothing to forget)" if final.get(c, {}).get("nothing_to_forget") else ""
        labels.append((mid, _plain(f"{c} ({b - a}){mark}")))
        last = mid
    return order, starts, labels


def _plot_matrix(figure_cls, steps: np.ndarray, state: np.ndarray, probes: ProbeSet, final: dict[str, Any]):
    """Every probe (row) at every evaluation (column), grouped by category (see `_matrix_layout`)."""
    from matplotlib.colors import BoundaryNorm, ListedColormap
    from matplotlib.patches import Patch

    cats = [p.category for p in probes]
    n = len(probes)
    height_in = min(max(4.2, n / 45), 14)
    fontsize = 8 if len(set(cats)) <= 30 else 6
    order, starts, labels = _matrix_layout(state, cats, final, rows_per_label=n * (fontsize * 1.25 / 72) / (height_in * 0.85))
    fig = figure_cls(figsize=(max(6.5, min(2.5 + 0.35 * len(steps), 12)), height_in), layout="constrained")
    ax = fig.add_subplot()
    # More probes than pixel rows: average the colours of the rows that share a pixel (in RGBA, after colouring) so
    # that a lone forgotten probe still tints its pixel instead of vanishing under a neighbour.
    many = n > height_in * _DPI * 0.8
    ax.imshow(state[:, order].T, aspect="auto", interpolation="antialiased" if many else "nearest", interpolation_stage="rgba",
              cmap=ListedColormap(_STATE_COLORS), norm=BoundaryNorm(np.arange(-0.5, len(_STATES)), len(_STATES)))
    ticks = range(len(steps)) if len(steps) <= 16 else np.linspace(0, len(steps) - 1, 10).astype(int)
    ax.set_xticks(list(ticks), [str(steps[i]) for i in ticks])
    ax.set_xlabel("evaluation at optimizer step")
    for j in starts[1:]:  # a line between category bands
        ax.axhline(j - 0.5, color="black", linewidth=0.8)
    ax.set_yticks([t for t, _ in labels], [label for _, label in labels], fontsize=fontsize)
    fig.legend([Patch(color=c) for c in _STATE_COLORS], list(_STATES), loc="outside lower center", ncols=4,
               fontsize="small", frameon=False)
    ax.set_title("Each probe at each evaluation, against the base model")
    return fig


def _plot_drift(figure_cls, rows):
    """Mean margin change since base with its 95% band (left), KL(base ‖ now) over the options (right)."""
    fig = figure_cls(figsize=(8, 4.2), layout="constrained")
    ax = fig.add_subplot()
    x = _steps(rows)
    ax.fill_between(x, _series(rows, OVERALL, "margin_change_ci_low"), _series(rows, OVERALL, "margin_change_ci_high"),
                    color=_F_COLOR, alpha=0.15, linewidth=0, label="95% interval")
    ax.plot(x, _series(rows, OVERALL, "margin_change"), color=_F_COLOR, marker="o", markersize=4, linewidth=2,
            label="mean margin change (nats)")
    ax.axhline(0, color="grey", linewidth=0.8)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("margin change since base (nats)")
    kl = ax.twinx()
    kl.plot(x, _series(rows, OVERALL, "kl"), color="black", linestyle="--", marker="s", markersize=3, label="KL(base ‖ now)")
    kl.set_ylabel("KL over the options (nats)")
    kl.set_ylim(bottom=0)
    ax.set_title("Drift of the multiple-choice probes since base")
    handles = ax.get_legend_handles_labels()[0] + kl.get_legend_handles_labels()[0]
    labels = ax.get_legend_handles_labels()[1] + kl.get_legend_handles_labels()[1]
    fig.legend(handles, labels, loc="outside lower center", ncols=3, fontsize="small", frameon=False)
    return fig


def _plot_behavior(figure_cls, rows):
    """Behaviour since base: rates (instructions followed, runaways, harmless requests refused) on the left axis, the
    median length ratio with its interval on a log-scaled right axis; knowledge forgetting beside them for reference."""
    group = "all_behavior" if "all_behavior" in rows[-1]["metrics"] else OVERALL
    fig = figure_cls(figsize=(8, 4.2), layout="constrained")
    ax = fig.add_subplot()
    x = _steps(rows)
    for key, label, color in (("instruct_compliance", "instructions followed (strict)", "tab:green"),
                              ("runaway_rate", "answers that run to the token limit", "tab:orange"),
                              ("over_refusal_rate", "harmless requests refused", "tab:purple")):
        y = _series(rows, group, key)
        if np.isfinite(y).any():
            ax.plot(x, y, marker="o", markersize=4, linewidth=2, color=color, label=label)
    if "all_knowledge" in rows[-1]["metrics"]:
        ax.plot(x, _series(rows, "all_knowledge", "forgetting"), color=_F_COLOR, linestyle=":", marker=".",
                label="knowledge probes forgotten (1→0)")
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("share of probes")
    length = ax.twinx()
    ratio = np.exp(_series(rows, group, "length_log_ratio"))
    if np.isfinite(ratio).any():
        low, high = np.exp(_series(rows, group, "length_log_ratio_ci_low")), np.exp(_series(rows, group, "length_log_ratio_ci_high"))
        length.fill_between(x, low, high, color="grey", alpha=0.15, linewidth=0)
        length.plot(x, ratio, color="black", linestyle="--", marker="s", markersize=3, label="answer length / base (median)")
        length.axhline(1, color="grey", linewidth=0.8)
        length.set_yscale("log")
        from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

        length.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))  # ×0.5, ×1, ×2, ×5, ...
        length.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"×{v:g}"))  # "×2", not "2 × 10^0"
        length.yaxis.set_minor_formatter(NullFormatter())
        length.set_ylabel("answer length now / at base (median, log scale)")
    behavior = group != OVERALL or np.isfinite(_series(rows, OVERALL, "instruct_compliance")).any() \
        or np.isfinite(_series(rows, OVERALL, "over_refusal_rate")).any()
    ax.set_title("Behaviour since base" + (" (behaviour probes)" if group != OVERALL else "") if behavior
                 else "Generated answers since base: stopping and length")
    handles = ax.get_legend_handles_labels()[0] + length.get_legend_handles_labels()[0]
    labels = ax.get_legend_handles_labels()[1] + length.get_legend_handles_labels()[1]
    fig.legend(handles, labels, loc="outside lower center", ncols=2, fontsize="small", frameon=False)
    return fig


def _has_robustness(rows) -> bool:
    """Whether the record's last evaluation has robust figures (robustness on)."""
    return "robust_n" in rows[-1]["metrics"][OVERALL]


def _robust_group(rows) -> str:
    """The group the robust figures are read from: the knowledge probes' when the set mixes in behaviour probes (they
    have no variants), else all probes."""
    return "all_knowledge" if "robust_n" in rows[-1]["metrics"].get("all_knowledge", {}) else OVERALL


def _count(value: Any) -> str:
    """A count from metrics.jsonl; "?" where the figure is missing (NaN)."""
    return "?" if value is None or (isinstance(value, float) and not math.isfinite(value)) else str(int(value))


def _plot_robustness(figure_cls, rows):
    """Robust forgetting with its Wilson band beside plain forgetting (top); the change of consistency since base and,
    in lettered modes, the position bias now (bottom, right axis)."""
    group = _robust_group(rows)
    final = rows[-1]["metrics"][group]
    x = _steps(rows)
    fig = figure_cls(figsize=(8, 6.4), layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=(3, 2))
    top.plot(x, _series(rows, group, "forgetting"), color=_F_COLOR, linestyle="--", marker="o", markersize=3,
             linewidth=1.5, label="forgetting as asked (1→0)")
    top.fill_between(x, _series(rows, group, "robust_forgetting_ci_low"), _series(rows, group, "robust_forgetting_ci_high"),
                     color=_ROBUST_COLOR, alpha=0.15, linewidth=0, label="robust forgetting, 95% Wilson interval")
    top.plot(x, _series(rows, group, "robust_forgetting"), color=_ROBUST_COLOR, marker="o", markersize=4, linewidth=2,
             label=f"robust forgetting (of the {_count(final.get('robust_pre'))} probes robust at base)")
    _style_axis(top, rows)
    top.set_title("Forgetting as asked and in every variant", fontsize="medium")
    change = _series(rows, group, "consistency_change")
    bottom.plot(x, change, color="black", marker="o", markersize=4, linewidth=2, label="consistency change since base")
    bottom.axhline(0, color="grey", linewidth=0.8)
    _style_axis(bottom, rows, ylabel="consistency change")
    span = np.nanmax(np.abs(np.r_[change, 0.0])) if np.isfinite(change).any() else 0.0
    bottom.set_ylim(-span * 1.15 - 0.01, span * 1.15 + 0.01)  # about 0: a drop shows below the line
    bottom.set_xlabel("optimizer step")
    handles, labels = [], []
    for ax in (top, bottom):
        h, lab = ax.get_legend_handles_labels()
        handles, labels = handles + h, labels + lab
    bias = _series(rows, group, "position_bias_post")
    if np.isfinite(bias).any():  # lettered modes: which letter the model picks, against where the gold answers are
        twin = bottom.twinx()
        twin.plot(x, bias, color="tab:orange", linestyle=":", marker="s", markersize=3, linewidth=1.5,
                  label="position bias now (right axis)")
        twin.set_ylim(0, max(0.1, float(np.nanmax(bias)) * 1.15))
        twin.set_ylabel("position bias (TV distance)")
        h, lab = twin.get_legend_handles_labels()
        handles, labels = handles + h, labels + lab
    what = "knowledge probes" if group != OVERALL else "probes"
    fig.suptitle(f"Robustness since base: {_count(final.get('robust_n'))} {what}, each in "
                 f"{_count(final.get('robust_variants'))} variants besides itself")
    fig.legend(handles, labels, loc="outside lower center", ncols=2, fontsize="small", frameon=False)
    return fig


def _drift_section(record: RunRecord, rows, max_rows: int) -> str:
    """At-risk probes at the last evaluation, the precision noise floor and budget events, when the record has them."""
    final, o = rows[-1], rows[-1]["metrics"][OVERALL]
    parts = []
    if "noise_probes" in o:
        parts.append(
            f"<p>Precision noise floor: {_e(o['noise_probes'])} of {_e(o['n'])} probes change correctness at base between "
            f"the training precision and fp32. Forgetting without them: {_f(o['forgetting_excl_noise'])} (with them "
            f"{_f(o['forgetting'])}). The smallest forgetting distinguishable from that floor with {_e(o['n'])} probes "
            f"(its 95% Wilson lower bound above the floor): {_f(o['min_detectable_forgetting'])}.</p>")
    if "at_risk" in o:
        risky = [r for r in record.read_at_risk() if r["step"] == final["step"]]
        risky.sort(key=lambda r: r["margin_now"])
        head = (f'<h3 id="at_risk">At risk at step {_e(final["step"])}: {len(risky)} probes right at base and still right, '
                "with a small margin or a large drop since base</h3>")
        if risky:
            cols = ("id", "category", "question", "gold", "margin_base", "margin_now")
            q_class = ' class="q"'
            body = "\n".join("<tr>" + "".join(f"<td{q_class if c == 'question' else ''}>{_cell(r[c])}</td>" for c in cols)
                             + "</tr>" for r in risky[:max_rows])
            more = len(risky) - max_rows
            parts.append(head + '<table class="flips"><thead><tr>' + "".join(f"<th>{c}</th>" for c in cols)
                         + "</tr></thead><tbody>" + body + "</tbody></table>"
                         + (f'<p class="note">… and {more} more (at_risk.jsonl).</p>' if more > 0 else ""))
        else:
            parts.append(head + '<p class="note">none</p>')
    events = _events(record)
    budget = record.read_budget()
    if budget is not None:
        within = budget.get("last_within_budget") or {}
        lines = "".join(_event(e) for e in events)
        limits, action = _e(budget.get("limits")), _e(budget.get("on_budget"))
        parts.append(f'<h3 id="budget">Budget {limits}, on_budget={action}</h3>'
                     f"<ul>{lines or '<li>never exceeded</li>'}</ul><p>Last evaluation within budget: step "
                     f"{_e(within.get('step'))}{', checkpoint ' + _e(within['checkpoint']) if within.get('checkpoint') else ''}.</p>")
    return ('<h2 id="drift">Drift, risk and budget</h2>\n' + "\n".join(parts)) if parts else ""


def _events(record: RunRecord) -> list[dict[str, Any]]:
    """The budget events in step order (a record an earlier forgetwatch wrote may hold a step scored late after later
    ones)."""
    return sorted(record.read_events(), key=lambda e: e["step"] if isinstance(e.get("step"), (int, float)) else math.inf)


def _event(e: dict[str, Any]) -> str:
    """One budget event of events.jsonl as a list item."""
    return f"<li>{_e(_event_text(e))}</li>"


def _event_text(e: dict[str, Any]) -> str:
    """One budget event of events.jsonl as text: a limit exceeded, or figures the budget could not judge."""
    if e.get("event") == "budget_cannot_judge":
        return f"step {e.get('step')}: cannot judge {', '.join(map(str, e.get('keys') or []))}: {e.get('reason')}"
    return (f"step {e.get('step')}: {e.get('key')} = {_f(e.get('measured', math.nan))} (compared: "
            f"{_f(e.get('value', math.nan))}) > {e.get('limit')}; action {e.get('action')}")


def _grid(n: int) -> tuple[int, int]:
    cols = min(n, 4)
    return math.ceil(n / cols), cols


def _plot_by_category(figure_cls, rows, categories: list[str], metric: str):
    nrows, ncols = _grid(len(categories))
    # one panel alone is drawn wider (a 3.9 in figure would wrap its title onto five lines)
    fig = figure_cls(figsize=(max(3.3 * ncols + 0.6, 5.5), 2.5 * nrows + 1.2), layout="constrained")
    axes = fig.subplots(nrows, ncols, sharex=True, sharey=True, squeeze=False).ravel()
    color = _F_COLOR if metric == "forgetting" else _BT_COLOR
    final = rows[-1]["metrics"]
    for ax, cat in zip(axes, categories, strict=False):  # axes: a full grid
        _draw_metric(ax, rows, cat, metric, color, None)
        _style_axis(ax, rows, ylabel=None)
        nothing = final.get(cat, {}).get("nothing_to_forget")
        ax.set_title(_plain(f"{cat} (n={final.get(cat, {}).get('n', '?')})") + ("\nnothing to forget" if nothing else ""),
                     fontsize="medium", color="grey" if nothing else "black")
        if nothing:  # the base knew nothing here beyond chance: only backward transfer can show
            ax.set_facecolor("#f2f2f2")
        ax.tick_params(labelbottom=True)
    # One y range for all panels, set once every panel is drawn (a limit set earlier would freeze autoscaling).
    top = max(np.nanmax(np.r_[_series(rows, c, f"{metric}_ci_high"), _series(rows, c, metric), 0.0]) for c in categories)
    axes[0].set_ylim(0, top * 1.06 if top > 0 else 0.05)
    for ax in axes[len(categories):]:
        ax.set_visible(False)
    fig.supxlabel("optimizer step")
    fig.supylabel("share of probes")
    what = "Forgetting (1→0)" if metric == "forgetting" else "Backward transfer (0→1)"
    # One colour per figure: the line styles are explained in the title instead of a legend. One or two panels make a
    # figure narrower than that text, which constrained layout does not wrap: broken at spaces to fit, it stays whole.
    size = _font_points("large")
    fig.suptitle(_wrap(f"{what} per category vs the base model\nsolid: raw, shaded: Wilson 95% interval, dashed: "
                       "chance-adjusted (multiple-choice categories)", 0.95 * 72 * fig.get_figwidth(), size), fontsize=size)
    return fig


def _font_points(size: str) -> float:
    from matplotlib.font_manager import FontProperties

    return FontProperties(size=size).get_size_in_points()


def _wrap(text: str, width: float, size: float) -> str:
    """Each line of `text` broken at spaces so that no line is wider than `width` points in the default font at `size`
    points (measured, not guessed from a character count)."""
    from matplotlib.font_manager import FontProperties
    from matplotlib.textpath import TextPath

    prop = FontProperties(size=size)
    lines = []
    for line in text.split("\n"):
        current = ""
        for word in line.split(" "):
            longer = f"{current} {word}" if current else word
            if current and TextPath((0, 0), _plain(longer), prop=prop).get_extents().width > width:
                lines.append(current)
                current = word
            else:
                current = longer
        lines.append(current)
    return "\n".join(lines)


def _plot_accuracy(figure_cls, rows, categories: list[str]):
    from matplotlib import colormaps

    fig = figure_cls(figsize=(9, 4.8), layout="constrained")
    ax = fig.add_subplot()
    x = _steps(rows)
    cmap = colormaps["tab10" if len(categories) <= 10 else "tab20"]
    final = rows[-1]["metrics"]
    for i, cat in enumerate(categories):
        ax.plot(x, _series(rows, cat, "accuracy_post"), color=cmap(i % cmap.N), linestyle=("-", "--", ":")[i // cmap.N % 3],
                marker="o", markersize=3, linewidth=1.2, label=_plain(f"{cat} (n={final[cat]['n']})"))
    ax.plot(x, _series(rows, OVERALL, "accuracy_post"), color="black", marker="o", markersize=4, linewidth=2.5,
            label=f"overall (n={final[OVERALL]['n']})")
    ax.axhline(final[OVERALL]["accuracy_pre"], color="black", linestyle=":", linewidth=1, label="overall, base model")
    _style_axis(ax, rows, ylabel="accuracy (share of probes correct)")
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("optimizer step")
    ax.set_title("Accuracy on the probes, overall and per category")
    fig.legend(loc="outside right upper", fontsize="small")
    return fig


# -- the page -----------------------------------------------------------------------------------------------
def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _box(css: str, headline: str, items: list[str]) -> str:
    """A warning box at the top of the page: a headline over a list; nothing when there is nothing to say."""
    if not items:
        return ""
    listed = "".join(f"<li>{_e(p)}</li>" for p in items)
    return f'<div class="{css}"><p>{headline}</p><ul>{listed}</ul></div>\n'


def _incomplete(lost: list[str]) -> str:
    return _box("problems incomplete", "<b>This record is incomplete</b>: its figures end before training did.", lost)


def _problems(problems: list[str]) -> str:
    return _box("problems", "<b>This record is not consistent</b>: its figures may count steps twice or mix runs.",
                problems)


def _f(value: float) -> str:
    return f"{value:.3f}"


def _cell(value: Any, cut: int = CUT) -> str:
    """A table cell's text, escaped. Longer than `cut` characters: its start, the rest unfolding below on a click, and
    the whole text as the tooltip (and for find-in-page tools that read attributes)."""
    text = str(value)
    if len(text) <= cut:
        return _e(text)
    return f'<details title="{_e(text)}"><summary>{_e(text[:cut])}…</summary>…{_e(text[cut:])}</details>'


_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 2em auto; max-width: 1200px; padding: 0 1em; color: #222; }
h1 { margin-bottom: 0.2em; } h2 { margin-top: 1.6em; border-bottom: 1px solid #ddd; padding-bottom: 0.2em; }
dl.meta { display: grid; grid-template-columns: max-content auto; gap: 0.2em 1em; }
dl.meta dt { font-weight: 600; } dl.meta dd { margin: 0; font-family: ui-monospace, monospace; overflow-wrap: anywhere; }
.summary { background: #f6f8fa; border-left: 4px solid #888; padding: 0.6em 1em; }
figure { margin: 1em 0; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { color: #555; font-size: 0.9em; }
table { border-collapse: collapse; font-size: 0.9em; margin: 0.5em 0; }
th, td { border: 1px solid #ddd; padding: 0.25em 0.5em; vertical-align: top; }
th { background: #f0f0f0; position: sticky; top: 0; }
table.metrics td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
table.metrics tr.overall td { font-weight: 600; border-top: 2px solid #999; }
table.flips td.q { max-width: 36em; white-space: pre-wrap; }
table.flips td.id { font-family: ui-monospace, monospace; font-size: 0.85em; overflow-wrap: anywhere; max-width: 16em; }
.note { color: #555; font-size: 0.9em; }
tr.nothing td { color: #777; }
"""

_METRIC_COLS = ("category", "n", "acc base", "acc now", "1→0", "0→1", "F", "F adj", "F 95% CI", "BT", "BT adj", "invalid")
_FLIP_COLS = ("id", "category", "question", "gold", "base prediction", "prediction now", "first flipped at step", "changes")


def _metrics_row(name: str, m: dict[str, Any]) -> str:
    adj = _f if m.get("adjusted") else (lambda v: "n/a")
    cells = [
        m["n"], _f(m["accuracy_pre"]), _f(m["accuracy_post"]), m["forgotten"], m["learned"], _f(m["forgetting"]),
        adj(m["forgetting_adjusted"]), f"[{_f(m['forgetting_ci_low'])}, {_f(m['forgetting_ci_high'])}]",
        _f(m["backward_transfer"]), adj(m["backward_transfer_adjusted"]), _f(m["invalid_rate_post"]),
    ]
    cls = ' class="overall"' if name == OVERALL else (' class="nothing"' if m.get("nothing_to_forget") else "")
    mark = " *" if m.get("nothing_to_forget") else ""
    return (f'<tr{cls} data-category="{_e(name)}"><td>{_e(name)}{mark}</td>'
            + "".join(f'<td class="num">{_e(c)}</td>' for c in cells) + "</tr>")


_BEHAVIOR_COLS = ("step", "instructions followed", "1→0 of followed", "runaway", "new runaways", "length ratio (median)",
                  "refused harmless", "new refusals")


def _behavior_section(rows: list[dict[str, Any]]) -> str:
    """Behaviour probes (and every generated answer) over the run: one row per evaluation, overall."""
    if not any("runaway_rate" in r["metrics"][OVERALL] for r in rows):
        return ""

    def rate(v: Any) -> str:
        return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3f}"

    def ratio(m: dict[str, Any]) -> str:
        v, lo, hi = m.get("length_log_ratio"), m.get("length_log_ratio_ci_low"), m.get("length_log_ratio_ci_high")
        if v is None or math.isnan(v):
            return "n/a"
        if lo is None or math.isnan(lo):  # no interval below 6 answers
            return f"×{math.exp(v):.2f}"
        return f"×{math.exp(v):.2f} [{math.exp(lo):.2f}, {math.exp(hi):.2f}]"

    body = []
    for r in rows:
        m = r["metrics"][OVERALL]
        cells = [r["step"], rate(m.get("instruct_compliance")), rate(m.get("instruct_forgetting")), rate(m.get("runaway_rate")),
                 rate(m.get("runaway")), ratio(m), rate(m.get("over_refusal_rate")), rate(m.get("over_refusal"))]
        body.append("<tr>" + "".join(f'<td class="num">{_e(c)}</td>' for c in cells) + "</tr>")
    return ('<h2 id="behavior">Behaviour, evaluation by evaluation</h2>\n<table class="metrics"><thead><tr>'
            + "".join(f"<th>{_e(c)}</th>" for c in _BEHAVIOR_COLS) + "</tr></thead><tbody>" + "\n".join(body)
            + '</tbody></table>\n<p class="note">Over every generated answer, each against the same probe\'s answer at base '
            "(step 0). Instructions followed: IFEval's prompt-level strict compliance of the instruction probes; 1→0: of "
            "those followed at base, the share not followed now. Runaway: answers that reach the token limit without ending "
            "their turn; new runaways: of those that ended at base, the share that run away now. Length ratio: the median "
            "over probes of tokens now / tokens at base, with its 95% interval. Refused harmless: harmless requests whose "
            "answer opens with a refusal phrase (XSTest's rule); new refusals: of those answered at base, the share refused "
            "now. n/a: no such probe.</p>")


def _robust_section(record: RunRecord, probes: ProbeSet, rows: list[dict[str, Any]], max_rows: int) -> str:
    """Robustness over the run (one row per evaluation), then the probes fragile at the final evaluation."""
    if not _has_robustness(rows):
        return ""
    group = _robust_group(rows)
    bias = any("position_bias_post" in r["metrics"].get(group, {}) for r in rows)

    def num(v: Any, fmt: str = ".3f") -> str:
        return "n/a" if v is None or (isinstance(v, float) and not math.isfinite(v)) else format(v, fmt)

    body = []
    for r in rows:
        m = r["metrics"].get(group, {})
        forgetting = num(m.get("robust_forgetting"))
        if forgetting != "n/a":
            forgetting += f" ({_count(m.get('robust_lost'))} of {_count(m.get('robust_pre'))})"
        ci = (f"[{num(m.get('robust_forgetting_ci_low'))}, {num(m.get('robust_forgetting_ci_high'))}]"
              if num(m.get("robust_forgetting_ci_low")) != "n/a" else "n/a")
        cells = [r["step"], f"{num(m.get('robust_accuracy_pre'))} → {num(m.get('robust_accuracy_post'))}", forgetting, ci,
                 num(m.get("consistency_post")), num(m.get("consistency_change"), "+.3f"), _count(m.get("fragile"))]
        if bias:
            cells += [num(m.get("position_bias_post")), num(m.get("position_bias_change"), "+.3f")]
        body.append(f'<tr data-step="{_e(r["step"])}">' + "".join(f'<td class="num">{_e(c)}</td>' for c in cells) + "</tr>")
    cols = _ROBUST_COLS + (_BIAS_COLS if bias else ())
    final = rows[-1]["metrics"][group]
    what = "knowledge probes" if group != OVERALL else "probes"
    missing = "".join(f" At step {_e(r['step'])}: {_e(r['metrics'][group].get('missing') or r['metrics'][group]['robust_missing'])}."
                      for r in rows if r["metrics"].get(group, {}).get("missing") or r["metrics"].get(group, {}).get("robust_missing"))
    bias_note = (" Position bias (lettered multiple choice only): the total variation distance between the letters "
                 "chosen and the gold letters, over the balanced option shifts (each option at each position once): 0 = "
                 "none, 1 − 1/k = always the same letter; its change since base.") if bias else ""
    section = (
        '<h2 id="robustness">Robustness, evaluation by evaluation</h2>\n'
        f'<p>Each of {_e(_count(final.get("robust_n")))} {what} scored as asked and in '
        f'{_e(_count(final.get("robust_variants")))} variants (question frames, lower case, typos; option orders in '
        f"lettered modes), each against its own variants at base (step 0).</p>\n"
        '<table class="metrics" data-kind="robustness"><thead><tr>' + "".join(f"<th>{_e(c)}</th>" for c in cols)
        + "</tr></thead><tbody>" + "\n".join(body) + "</tbody></table>\n"
        '<p class="note">Robust: right in every variant, the probe as asked among them. Robust accuracy: the share of the '
        "probes robust, at base → now. Robust F: of the probes robust at base, the share no longer robust now (how many "
        "of how many), with its 95% Wilson interval; n/a: none was robust at base. Consistency: the mean share of a "
        "probe's variants answered right, now, and its change since base. Fragile: robust at base, still right as "
        "asked, but wrong in some variant now: forgetting that the 1→0 count does not see." + bias_note
        + (f" Missing figures (n/a): {missing.strip()}" if missing else "") + "</p>"
    )
    fragile = _fragile_now(record, probes, rows[-1]["step"])
    return section + ("\n" + _fragile_table(fragile, max_rows, rows[-1]["step"]) if fragile is not None else "")


_ROBUST_COLS = ("step", "robust accuracy (base → now)", "robust F", "robust F 95% CI", "consistency now",
                "consistency change", "fragile")
_BIAS_COLS = ("position bias now", "position bias change")
_FRAGILE_COLS = ("id", "category", "question", "gold", "forms right now", "fragile since step")


def _fragile_now(record: RunRecord, probes: ProbeSet, final_step: int) -> list[dict[str, Any]] | None:
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


def _fragile_table(fragile: list[dict[str, Any]], max_rows: int, final_step: int) -> str:
    head = (f'<h3 id="fragile">Fragile at step {_e(final_step)}: {len(fragile)} probes robust at base, right as asked '
            "now, wrong in some variant now</h3>")
    if not fragile:
        return head + '<p class="note">none</p>'
    body = []
    for r in fragile[:max_rows]:
        since = r["since"] if r["since"] is not None else "—"
        cells = [(r["id"], ' class="id"'), (r["category"], ""), (r["question"], ' class="q"'), (r["gold"], ""),
                 (r["right"], ' class="num"'), (since, ' class="num"')]
        body.append(f'<tr data-id="{_e(r["id"])}">' + "".join(f"<td{c}>{_cell(v)}</td>" for v, c in cells) + "</tr>")
    more = len(fragile) - max_rows
    tail = f'<p class="note">… and {more} more not shown.</p>' if more > 0 else ""
    return (head + '<table class="flips" data-kind="fragile"><thead><tr>'
            + "".join(f"<th>{_e(c)}</th>" for c in _FRAGILE_COLS) + "</tr></thead><tbody>" + "\n".join(body)
            + "</tbody></table>" + tail
            + '<p class="note">Forms right now: of the probe as asked and its variants, how many are answered right. '
            "Fragile since: the first evaluation whose robust→fragile row in flips.jsonl names the probe; —: it became "
            "fragile through a plain flip (wrong as asked in between).</p>")


def _flips_table(kind: str, flips: list[dict[str, Any]], max_rows: int, final_step: int) -> str:
    what = {"forgotten": "right at base, wrong now (1→0)", "learned": "wrong at base, right now (0→1)"}[kind]
    head = f'<h3 id="{kind}">{kind.capitalize()} at step {final_step}: {len(flips)} probes, {what}</h3>'
    if not flips:
        return head + '<p class="note">none</p>'
    body = []
    for r in flips[:max_rows]:
        cells = [(r["id"], ' class="id"'), (r["category"], ""), (r["question"], ' class="q"'), (r["gold"], ""),
                 (r["base_prediction"], ""), (r["prediction"], ""), (r["first_step"], ' class="num"'), (r["changes"], ' class="num"')]
        body.append(f'<tr data-id="{_e(r["id"])}">' + "".join(f"<td{c}>{_cell(v)}</td>" for v, c in cells) + "</tr>")
    more = len(flips) - max_rows
    tail = f'<p class="note">… and {more} more not shown (the full list is in flips.jsonl).</p>' if more > 0 else ""
    return (head + f'<table class="flips" data-kind="{kind}"><thead><tr>' + "".join(f"<th>{_e(c)}</th>" for c in _FLIP_COLS)
            + "</tr></thead><tbody>" + "\n".join(body) + "</tbody></table>" + tail)


def _html(output_dir, record: RunRecord, probes: ProbeSet, rows, categories: list[str], figures: list[str],
          forgotten: list[dict[str, Any]], learned: list[dict[str, Any]], max_rows: int, train_source: str = "",
          writing: str | None = None) -> str:
    from ..versions import __version__

    final = rows[-1]
    fm = final["metrics"]
    o = fm[OVERALL]
    run_dir = Path(output_dir).resolve()
    name = record.root.parent.name if record.root.name == "forgetwatch" else record.root.name
    kinds = Counter(p.kind if p.kind != "mcq" else f"multiple choice (k={p.num_choices})" for p in probes)
    steps = [r["step"] for r in rows]
    adj = (lambda v: f", chance-adjusted {_f(v)}") if o.get("adjusted") else (lambda v: "")

    meta = [
        ("run dir", str(run_dir)),
        ("record", str(record.root.resolve())),
        ("probes", f"{len(probes)} ({', '.join(f'{v} {k}' for k, v in sorted(kinds.items()))}); fingerprint {probes.fingerprint}"),
        ("categories", ", ".join(categories) or "none"),
        ("evaluations", f"{len(rows)}, at steps {', '.join(map(str, steps[:12]))}{' …' if len(steps) > 12 else ''}"),
        ("final evaluation", f"step {final['step']}, epoch {float(final.get('epoch') or 0):.2f}"),
        ("trainer log", train_source or "none (kept by the callback from this version on; else a trainer_state.json)"),
    ]
    if writing:  # an evaluation a live writer has begun: not in these figures until its line is written
        meta.append(("being written", writing))
    if partial := [r for r in rows if r.get("partial")]:  # max_share: their figures are estimates
        k = max((r["partial"]["k"] for r in partial if r["partial"].get("k") is not None), default=None)
        every = f"every probe at least every {k} evaluations" if k is not None else "a pilot, timing the probes"
        meta.append(("partial evaluations", f"{len(partial)} of {len(rows)} (max_share: the probes at risk, those that "
                     f"flipped and a random sample of the rest; {every}), at steps "
                     f"{', '.join(str(r['step']) for r in partial[:12])}{' …' if len(partial) > 12 else ''}: their "
                     "figures are estimates, drawn as open circles with their 90% sampling interval"))
    if segments := describe_segments(record.root):  # the probe set changed: each segment is a record of its own
        meta.append(("segments", "; ".join(segments)))
    if aside := record.kept_aside():  # what a crash or a resume took out of these figures, kept beside them
        meta.append(("set aside", f"{', '.join(aside)} (in the record; not in these figures: "
                                  "recovered/ holds a crash's unfinished writes, superseded/ what a resume from an earlier "
                                  "checkpoint abandoned)"))
    summary = (
        f"At step {final['step']}: accuracy {_f(o['accuracy_pre'])} → {_f(o['accuracy_post'])} "
        f"(net {o['net_change']:+.3f}). Forgot {o['forgotten']} of {o['n']} probes: F = {_f(o['forgetting'])}"
        f"{adj(o['forgetting_adjusted'])}, 95% CI [{_f(o['forgetting_ci_low'])}, {_f(o['forgetting_ci_high'])}]. "
        f"Learned {o['learned']}: BT = {_f(o['backward_transfer'])}{adj(o['backward_transfer_adjusted'])}, "
        f"95% CI [{_f(o['backward_transfer_ci_low'])}, {_f(o['backward_transfer_ci_high'])}]. "
        f"McNemar exact p = {o['mcnemar_p']:.3g}."
    )
    captions = {
        "overall": "Share of all probes forgotten (right at base, wrong now) and learned (wrong at base, right now) at each "
                   "evaluation. Solid: raw, with its Wilson 95% interval shaded; dashed: minus the flips expected from "
                   "guessing among each multiple-choice probe's options.",
        "forgetting": "Forgetting per category, same encoding; all panels share their axes.",
        "backward_transfer": "Backward transfer per category, same encoding; all panels share their axes.",
        "accuracy": "Accuracy now, overall (black) and per category; the dotted line is the base model's overall accuracy.",
        "training": "The trainer's own log (loss; reward for GRPO) above the share of probes forgotten and learned, on the "
                    "same optimizer-step axis: what training optimised next to what it cost.",
        "states": "Every probe against the base model at each evaluation: retained (right at base, right now), forgotten "
                  "(right → wrong), learned (wrong → right), never known (wrong at both). Forgetting hidden by learning "
                  "shows here as red and blue growing together while accuracy stays flat.",
        "matrix": "One row per probe, one column per evaluation, grouped by category (their sizes in brackets); within a "
                  "category the probes forgotten earliest come first. Categories where the base knew nothing beyond "
                  "chance are marked: they can only show learning.",
        "behavior": "How the model answers, each probe against its own answer at base: the share of instruction probes "
                    "followed (IFEval's strict verdict), of answers that run to the token limit without ending, and of "
                    "harmless requests refused (left axis); the median ratio of answer length now to at base, with its "
                    "interval of at least 95% shaded (dashed, right axis, log scale); the knowledge probes' forgetting (dotted) for "
                    "comparison.",
        "drift": "Mean change since base of the multiple-choice margins (gold option's score minus the best wrong one's), "
                 "with its 95% interval, and KL(base ‖ now) of the probes' distributions over their options (dashed). "
                 "Margins fall before probes flip.",
        "robustness": "Top: the share of probes forgotten as asked (1→0, dashed) beside robust forgetting: of the probes "
                      "right in every variant at base, the share no longer right in every variant now, with its Wilson "
                      "95% interval shaded. Bottom: the change since base of consistency (the mean share of a probe's "
                      "variants answered right)" + ("; the position bias now (dotted, right axis: how far the letters "
                      "chosen are from the gold letters over balanced option shifts, 0 = none)." if "robustness" in figures
                      and np.isfinite(_series(rows, _robust_group(rows), "position_bias_post")).any() else "."),
    }
    figs = "\n".join(
        f'<figure><img src="{_e(_PNG[k])}" alt="{_e(captions[k])}"><figcaption>{_e(captions[k])}</figcaption></figure>'
        for k in figures
    )
    table = (
        '<table class="metrics"><thead><tr>' + "".join(f"<th>{_e(c)}</th>" for c in _METRIC_COLS) + "</tr></thead><tbody>"
        + "\n".join(_metrics_row(c, fm[c]) for c in categories) + "\n" + _metrics_row(OVERALL, o) + "</tbody></table>"
    )
    mismatch = ""
    if (len(forgotten), len(learned)) != (o["forgotten"], o["learned"]):
        mismatch = (f'<p class="note">flips.jsonl gives {len(forgotten)} forgotten and {len(learned)} learned probes, '
                    f"metrics.jsonl counts {o['forgotten']} and {o['learned']}: the record is incomplete.</p>")
    short_note = ""
    if any(p.kind == "short" for p in probes):
        short_note = ('<p class="note">Short-answer probes show the answer given at their last flip; multiple-choice '
                      "probes show the option chosen at the final evaluation.</p>")
    nothing = [c for c in categories if fm[c].get("nothing_to_forget")]
    nothing_note = ""
    if nothing:
        nothing_note = (f" * Nothing to forget in {', '.join(nothing)}: the base model knew nothing there beyond chance "
                        "(multiple choice: chance-corrected base accuracy 0; short answers: fewer than 2 and under 2% "
                        "right), so these categories can only show backward transfer.")
    title = f"forgetwatch report: {name}"
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{_e(title)}</title>
<style>{_CSS}</style>
</head>
<body>
<h1>{_e(title)}</h1>
<!--problems--><dl class="meta">
{"".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in meta)}
</dl>
<p class="summary">{_e(summary)}</p>

<h2>Curves</h2>
{figs}

<h2 id="categories">Per category at step {_e(final["step"])}</h2>
{table}
<p class="note">Rates are shares of the group's n probes; invalid (unparseable) answers count as wrong. F adj / BT adj
subtract the flips expected from guessing among each probe's own k options; groups of short-answer probes only have
no chance term (n/a). invalid: share of unparseable answers now.{nothing_note}</p>

<h2 id="flips">Flipped probes at step {_e(final["step"])}, vs the base model</h2>
{mismatch}{short_note}
{_flips_table("forgotten", forgotten, max_rows, final["step"])}
{_flips_table("learned", learned, max_rows, final["step"])}

{_behavior_section(rows)}<!--robustness-->

<!--drift-->

<!--rewind-->

<p class="note">Made by forgetwatch {_e(__version__)} from {_e(record.root.resolve())}.</p>
</body>
</html>
"""
