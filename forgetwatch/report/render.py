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

The record is read by `load.py`, the plots drawn by `plots.py`, the page written by `page.py`.
"""

from __future__ import annotations

import html
import logging
import os
from pathlib import Path

import numpy as np

from .._io import atomic_write
from ..errors import InterpolationError
from ..record.segments import describe_segments
from ..remedies.rewind import read_rewind, rewind_section
from ..run.console import format_evaluation, headline_categories, worst_categories
from .load import (
    DPI,
    MAX_ROWS,
    OVERALL,
    PLOT_FILES,
    TRAIN_KEYS,
    final_flips,
    incomplete,
    probe_states,
    read_events,
    read_run,
    series,
    trainer_log,
    writable,
)
from .page import drift_section, event_text, incomplete_box, page_html, problems_box, robust_section
from .plots import (
    has_robustness,
    load_matplotlib,
    plot_accuracy,
    plot_behavior,
    plot_by_category,
    plot_drift,
    plot_matrix,
    plot_overall,
    plot_robustness,
    plot_states,
    plot_training,
)

__all__ = ["make_report", "summarize_run"]

logger = logging.getLogger(__name__)


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
    record, probes, rows, problems, writing = read_run(output_dir)
    figure_cls, canvas_cls = load_matplotlib()  # fail before writing anything
    out = Path(out_dir) if out_dir is not None else writable(record.root / "report", output_dir)
    out.mkdir(parents=True, exist_ok=True)

    names = [c for c in rows[-1]["metrics"] if c != OVERALL]
    # knowledge and behaviour probes together: their two summary groups come first, then the categories
    groups = [c for c in names if c in probes.kind_groups()]
    categories = groups + [c for c in names if c not in groups]
    # in the page's order: the headline, what training did beside it, every probe, then the breakdowns
    figures = {"overall": plot_overall(figure_cls, rows, len(probes))}
    train_log, train_source = trainer_log(record, [r["step"] for r in rows])
    if any(k in r for r in train_log for k in TRAIN_KEYS):
        figures["training"] = plot_training(figure_cls, rows, train_log)
    states = probe_states(record, probes)
    if states is not None:
        figures["states"] = plot_states(figure_cls, *states)
        figures["matrix"] = plot_matrix(figure_cls, *states, probes, rows[-1]["metrics"])
    if categories:
        for metric in ("forgetting", "backward_transfer"):
            figures[metric] = plot_by_category(figure_cls, rows, categories, metric)
    figures["accuracy"] = plot_accuracy(figure_cls, rows, categories)
    if any(np.isfinite(series(rows, OVERALL, "margin_change"))):  # records made before drift have no margins here
        figures["drift"] = plot_drift(figure_cls, rows)
    if any("runaway_rate" in r["metrics"][OVERALL] for r in rows):  # generated answers: how they behave
        figures["behavior"] = plot_behavior(figure_cls, rows)
    if has_robustness(rows):  # robustness on: each probe scored in variants too
        figures["robustness"] = plot_robustness(figure_cls, rows)
    for key, fig in figures.items():
        canvas_cls(fig)
        with atomic_write(out / PLOT_FILES[key], "wb") as f:
            fig.savefig(f, format="png", dpi=DPI)

    forgotten, learned = final_flips(record, probes, rows[-1]["step"])
    page = page_html(output_dir, record, probes, rows, categories, list(figures), forgotten, learned, max_rows, train_source,
                 writing)
    page = page.replace("<!--problems-->", incomplete_box(incomplete(record)) + problems_box(problems))
    page = page.replace("<!--drift-->", drift_section(record, rows, max_rows))
    robust = robust_section(record, probes, rows, max_rows)
    page = page.replace("<!--robustness-->", "\n\n" + robust if robust else "")
    try:
        section = rewind_section(record.root, out)
    except InterpolationError as e:  # a damaged rewind.json: said on the page, the rest of the report stands
        logger.warning("forgetwatch report: the rewind is left out: %s", e)
        section = f'<p class="note">The rewind is left out: {html.escape(str(e))}</p>'
    page = page.replace("<!--rewind-->", section)  # `forgetwatch rewind`'s front, when run
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
    record, probes, rows, problems, writing = read_run(output_dir, warn=False)  # the page's making warns of its problems
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
        events = read_events(record)
        said = "; ".join(event_text(e) for e in events[:3]) + (f"; … {len(events) - 3} more" if len(events) > 3 else "")
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
    try:
        rewound = read_rewind(record.root)
    except InterpolationError as e:  # a damaged rewind.json: the summary says so, the rest of the run stands
        lines.append(f"rewind: unreadable ({e})")
        rewound = None
    if rewound is not None:  # the run was rewound (forgetwatch_rewind, `forgetwatch rewind`): its line closes the summary
        lines.append(rewound.line())
    return "\n".join(lines)
