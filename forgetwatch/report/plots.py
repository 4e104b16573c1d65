"""The report's PNG plots, one function each, from the record's rows (matplotlib, loaded on first use).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..probes.probe_set import ProbeSet
from .load import (
    DPI,
    OVERALL,
    STATES,
    adjusted,
    series,
    steps_of,
)

__all__ = ["format_count", "has_robustness", "load_matplotlib", "plot_accuracy", "plot_behavior", "plot_by_category",
           "plot_drift", "plot_matrix", "plot_overall", "plot_robustness", "plot_states", "plot_training", "robust_group"]

# the colours of forgetting and backward transfer, of the four probe states (`load.STATES`) and of robust figures
F_COLOR, BT_COLOR = "tab:red", "tab:blue"
STATE_COLORS = ("#8fc98f", "tab:red", "tab:blue", "#e6e6e6")
ROBUST_COLOR = "tab:purple"
LABEL = {"forgetting": "forgetting (1→0)", "backward_transfer": "backward transfer (0→1)"}


# -- plots --------------------------------------------------------------------------------------------------
def load_matplotlib():
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
        ax.set_xticks(steps_of(rows))  # a tick at every evaluation
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(True, alpha=0.3)
    ax.set_ylim(bottom=0)
    if ylabel:
        ax.set_ylabel(ylabel)


def _draw_metric(ax, rows, name: str, metric: str, color: str, label: str | None) -> None:
    """Raw (solid, markers) with its Wilson band, chance-adjusted (dashed) when the group has multiple choice."""
    x = steps_of(rows)
    ax.fill_between(x, series(rows, name, f"{metric}_ci_low"), series(rows, name, f"{metric}_ci_high"),
                    color=color, alpha=0.15, linewidth=0, label=f"{label}, 95% Wilson interval" if label else None)
    ax.plot(x, series(rows, name, metric), color=color, marker="o", markersize=4, linewidth=2, label=label)
    partial = np.array([bool(r.get("partial")) for r in rows])
    if partial.any():  # max_share: an estimate from a part of the probes, with its sampling interval (90%)
        y = series(rows, name, metric)[partial]
        low, high = (series(rows, name, f"{metric}_sampling_{end}")[partial] for end in ("low", "high"))
        ax.errorbar(x[partial], y, yerr=[np.clip(y - low, 0, None), np.clip(high - y, 0, None)], fmt="o", markersize=6,
                    markerfacecolor="white", color=color, capsize=3, linewidth=1,
                    label=f"{label}, estimated (partial evaluation, 90% sampling interval)" if label else None)
    if adjusted(rows, name):
        ax.plot(x, series(rows, name, f"{metric}adjusted"), color=color, linestyle="--", marker="o", markersize=3,
                linewidth=1.5, label=f"{label}, chance-adjusted" if label else None)


def plot_overall(figure_cls, rows, n_probes: int):
    fig = figure_cls(figsize=(8, 4.8), layout="constrained")
    ax = fig.add_subplot()
    for metric, color in (("forgetting", F_COLOR), ("backward_transfer", BT_COLOR)):
        _draw_metric(ax, rows, OVERALL, metric, color, LABEL[metric])
    _style_axis(ax, rows)
    ax.set_xlabel("optimizer step")
    ax.set_title(f"Forgetting and backward transfer vs the base model, all {n_probes} probes")
    # below the axes, never over the curves; filled column by column: a column for F, one for BT
    handles, labels = ax.get_legend_handles_labels()
    order = [1, 2, 0, 4, 5, 3] if len(handles) == 6 else range(len(handles))
    fig.legend([handles[i] for i in order], [labels[i] for i in order], loc="outside lower center",
               ncols=2 if len(handles) > 3 else 1, fontsize="small", frameon=False)
    return fig


def plot_training(figure_cls, rows, log: list[dict[str, Any]]):
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
    for metric, color in (("forgetting", F_COLOR), ("backward_transfer", BT_COLOR)):
        _draw_metric(ax, rows, OVERALL, metric, color, LABEL[metric])
    ax.grid(True, alpha=0.3)
    ax.set_ylim(bottom=0)
    ax.set_ylabel("share of probes")
    ax.set_xlabel("optimizer step")
    fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", ncols=2, fontsize="x-small", frameon=False)
    fig.suptitle("What training optimised, and what it cost: one step axis")
    return fig


def plot_states(figure_cls, steps: np.ndarray, state: np.ndarray):
    """Stacked counts of retained / forgotten / learned / never known probes at each evaluation."""
    counts = np.stack([(state == i).sum(axis=1) for i in range(len(STATES))])
    fig = figure_cls(figsize=(8, 4.4), layout="constrained")
    ax = fig.add_subplot()
    ax.stackplot(steps, counts, labels=[f"{s}" for s in STATES], colors=STATE_COLORS, alpha=0.95)
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


def plot_matrix(figure_cls, steps: np.ndarray, state: np.ndarray, probes: ProbeSet, final: dict[str, Any]):
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
    many = n > height_in * DPI * 0.8
    ax.imshow(state[:, order].T, aspect="auto", interpolation="antialiased" if many else "nearest", interpolation_stage="rgba",
              cmap=ListedColormap(STATE_COLORS), norm=BoundaryNorm(np.arange(-0.5, len(STATES)), len(STATES)))
    ticks = range(len(steps)) if len(steps) <= 16 else np.linspace(0, len(steps) - 1, 10).astype(int)
    ax.set_xticks(list(ticks), [str(steps[i]) for i in ticks])
    ax.set_xlabel("evaluation at optimizer step")
    for j in starts[1:]:  # a line between category bands
        ax.axhline(j - 0.5, color="black", linewidth=0.8)
    ax.set_yticks([t for t, _ in labels], [label for _, label in labels], fontsize=fontsize)
    fig.legend([Patch(color=c) for c in STATE_COLORS], list(STATES), loc="outside lower center", ncols=4,
               fontsize="small", frameon=False)
    ax.set_title("Each probe at each evaluation, against the base model")
    return fig


def plot_drift(figure_cls, rows):
    """Mean margin change since base with its 95% band (left), KL(base ‖ now) over the options (right)."""
    fig = figure_cls(figsize=(8, 4.2), layout="constrained")
    ax = fig.add_subplot()
    x = steps_of(rows)
    ax.fill_between(x, series(rows, OVERALL, "margin_change_ci_low"), series(rows, OVERALL, "margin_change_ci_high"),
                    color=F_COLOR, alpha=0.15, linewidth=0, label="95% interval")
    ax.plot(x, series(rows, OVERALL, "margin_change"), color=F_COLOR, marker="o", markersize=4, linewidth=2,
            label="mean margin change (nats)")
    ax.axhline(0, color="grey", linewidth=0.8)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("margin change since base (nats)")
    kl = ax.twinx()
    kl.plot(x, series(rows, OVERALL, "kl"), color="black", linestyle="--", marker="s", markersize=3, label="KL(base ‖ now)")
    kl.set_ylabel("KL over the options (nats)")
    kl.set_ylim(bottom=0)
    ax.set_title("Drift of the multiple-choice probes since base")
    handles = ax.get_legend_handles_labels()[0] + kl.get_legend_handles_labels()[0]
    labels = ax.get_legend_handles_labels()[1] + kl.get_legend_handles_labels()[1]
    fig.legend(handles, labels, loc="outside lower center", ncols=3, fontsize="small", frameon=False)
    return fig


def plot_behavior(figure_cls, rows):
    """Behaviour since base: rates (instructions followed, runaways, harmless requests refused) on the left axis, the
    median length ratio with its interval on a log-scaled right axis; knowledge forgetting beside them for reference."""
    group = "all_behavior" if "all_behavior" in rows[-1]["metrics"] else OVERALL
    fig = figure_cls(figsize=(8, 4.2), layout="constrained")
    ax = fig.add_subplot()
    x = steps_of(rows)
    for key, label, color in (("instruct_compliance", "instructions followed (strict)", "tab:green"),
                              ("runaway_rate", "answers that run to the token limit", "tab:orange"),
                              ("over_refusal_rate", "harmless requests refused", "tab:purple")):
        y = series(rows, group, key)
        if np.isfinite(y).any():
            ax.plot(x, y, marker="o", markersize=4, linewidth=2, color=color, label=label)
    if "all_knowledge" in rows[-1]["metrics"]:
        ax.plot(x, series(rows, "all_knowledge", "forgetting"), color=F_COLOR, linestyle=":", marker=".",
                label="knowledge probes forgotten (1→0)")
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("share of probes")
    length = ax.twinx()
    ratio = np.exp(series(rows, group, "length_log_ratio"))
    if np.isfinite(ratio).any():
        low, high = (
            np.exp(series(rows, group, "length_log_ratio_ci_low")),
            np.exp(series(rows, group, "length_log_ratio_ci_high")),
        )
        length.fill_between(x, low, high, color="grey", alpha=0.15, linewidth=0)
        length.plot(x, ratio, color="black", linestyle="--", marker="s", markersize=3, label="answer length / base (median)")
        length.axhline(1, color="grey", linewidth=0.8)
        length.set_yscale("log")
        from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

        length.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))  # ×0.5, ×1, ×2, ×5, ...
        length.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"×{v:g}"))  # "×2", not "2 × 10^0"
        length.yaxis.set_minor_formatter(NullFormatter())
        length.set_ylabel("answer length now / at base (median, log scale)")
    behavior = group != OVERALL or np.isfinite(series(rows, OVERALL, "instruct_compliance")).any() \
        or np.isfinite(series(rows, OVERALL, "over_refusal_rate")).any()
    ax.set_title("Behaviour since base" + (" (behaviour probes)" if group != OVERALL else "") if behavior
                 else "Generated answers since base: stopping and length")
    handles = ax.get_legend_handles_labels()[0] + length.get_legend_handles_labels()[0]
    labels = ax.get_legend_handles_labels()[1] + length.get_legend_handles_labels()[1]
    fig.legend(handles, labels, loc="outside lower center", ncols=2, fontsize="small", frameon=False)
    return fig


def has_robustness(rows) -> bool:
    """Whether the record's last evaluation has robust figures (robustness on)."""
    return "robust_n" in rows[-1]["metrics"][OVERALL]


def robust_group(rows) -> str:
    """The group the robust figures are read from: the knowledge probes' when the set mixes in behaviour probes (they
    have no variants), else all probes."""
    return "all_knowledge" if "robust_n" in rows[-1]["metrics"].get("all_knowledge", {}) else OVERALL


def format_count(value: Any) -> str:
    """A count from metrics.jsonl; "?" where the figure is missing (NaN)."""
    return "?" if value is None or (isinstance(value, float) and not math.isfinite(value)) else str(int(value))


def plot_robustness(figure_cls, rows):
    """Robust forgetting with its Wilson band beside plain forgetting (top); the change of consistency since base and,
    in lettered modes, the position bias now (bottom, right axis)."""
    group = robust_group(rows)
    final = rows[-1]["metrics"][group]
    x = steps_of(rows)
    fig = figure_cls(figsize=(8, 6.4), layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=(3, 2))
    top.plot(x, series(rows, group, "forgetting"), color=F_COLOR, linestyle="--", marker="o", markersize=3,
             linewidth=1.5, label="forgetting as asked (1→0)")
    top.fill_between(x, series(rows, group, "robust_forgetting_ci_low"), series(rows, group, "robust_forgetting_ci_high"),
                     color=ROBUST_COLOR, alpha=0.15, linewidth=0, label="robust forgetting, 95% Wilson interval")
    top.plot(x, series(rows, group, "robust_forgetting"), color=ROBUST_COLOR, marker="o", markersize=4, linewidth=2,
             label=f"robust forgetting (of the {format_count(final.get('robust_pre'))} probes robust at base)")
    _style_axis(top, rows)
    top.set_title("Forgetting as asked and in every variant", fontsize="medium")
    change = series(rows, group, "consistency_change")
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
    bias = series(rows, group, "position_bias_post")
    if np.isfinite(bias).any():  # lettered modes: which letter the model picks, against where the gold answers are
        twin = bottom.twinx()
        twin.plot(x, bias, color="tab:orange", linestyle=":", marker="s", markersize=3, linewidth=1.5,
                  label="position bias now (right axis)")
        twin.set_ylim(0, max(0.1, float(np.nanmax(bias)) * 1.15))
        twin.set_ylabel("position bias (TV distance)")
        h, lab = twin.get_legend_handles_labels()
        handles, labels = handles + h, labels + lab
    what = "knowledge probes" if group != OVERALL else "probes"
    fig.suptitle(f"Robustness since base: {format_count(final.get('robust_n'))} {what}, each in "
                 f"{format_count(final.get('robust_variants'))} variants besides itself")
    fig.legend(handles, labels, loc="outside lower center", ncols=2, fontsize="small", frameon=False)
    return fig


def _grid(n: int) -> tuple[int, int]:
    cols = min(n, 4)
    return math.ceil(n / cols), cols


def plot_by_category(figure_cls, rows, categories: list[str], metric: str):
    nrows, ncols = _grid(len(categories))
    # one panel alone is drawn wider (a 3.9 in figure would wrap its title onto five lines)
    fig = figure_cls(figsize=(max(3.3 * ncols + 0.6, 5.5), 2.5 * nrows + 1.2), layout="constrained")
    axes = fig.subplots(nrows, ncols, sharex=True, sharey=True, squeeze=False).ravel()
    color = F_COLOR if metric == "forgetting" else BT_COLOR
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
    top = max(np.nanmax(np.r_[series(rows, c, f"{metric}_ci_high"), series(rows, c, metric), 0.0]) for c in categories)
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


def plot_accuracy(figure_cls, rows, categories: list[str]):
    from matplotlib import colormaps

    fig = figure_cls(figsize=(9, 4.8), layout="constrained")
    ax = fig.add_subplot()
    x = steps_of(rows)
    cmap = colormaps["tab10" if len(categories) <= 10 else "tab20"]
    final = rows[-1]["metrics"]
    for i, cat in enumerate(categories):
        ax.plot(x, series(rows, cat, "accuracy_post"), color=cmap(i % cmap.N), linestyle=("-", "--", ":")[i // cmap.N % 3],
                marker="o", markersize=3, linewidth=1.2, label=_plain(f"{cat} (n={final[cat]['n']})"))
    ax.plot(x, series(rows, OVERALL, "accuracy_post"), color="black", marker="o", markersize=4, linewidth=2.5,
            label=f"overall (n={final[OVERALL]['n']})")
    ax.axhline(final[OVERALL]["accuracy_pre"], color="black", linestyle=":", linewidth=1, label="overall, base model")
    _style_axis(ax, rows, ylabel="accuracy (share of probes correct)")
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("optimizer step")
    ax.set_title("Accuracy on the probes, overall and per category")
    fig.legend(loc="outside right upper", fontsize="small")
    return fig
