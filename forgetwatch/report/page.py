"""The report's HTML page: the summary, the tables of figures, flips, behaviour and robustness, and the plots.
"""

from __future__ import annotations

import html
import math
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from ..probes.probe_set import ProbeSet
from ..record.segments import describe_segments
from ..record.store import RunRecord
from ..versions import __version__
from .load import CUT, OVERALL, PLOT_FILES, fragile_now, read_events, series
from .plots import format_count, has_robustness, robust_group

__all__ = ["drift_section", "escape", "event_text", "figure", "incomplete_box", "page_html", "problems_box", "robust_section"]


def drift_section(record: RunRecord, rows, max_rows: int) -> str:
    """At-risk probes at the last evaluation, the precision noise floor and budget events, when the record has them."""
    final, o = rows[-1], rows[-1]["metrics"][OVERALL]
    parts = []
    if "noise_probes" in o:
        parts.append(
            f"<p>Precision noise floor: {escape(o['noise_probes'])} of {escape(o['n'])} probes change correctness at base "
            f"between the training precision and fp32. Forgetting without them: {figure(o['forgetting_excl_noise'])} (with them "
            f"{figure(o['forgetting'])}). The smallest forgetting distinguishable from that floor with {escape(o['n'])} probes "
            f"(its 95% Wilson lower bound above the floor): {figure(o['min_detectable_forgetting'])}.</p>"
        )
    if "at_risk" in o:
        risky = [r for r in record.read_at_risk() if r["step"] == final["step"]]
        risky.sort(key=lambda r: r["margin_now"])
        head = (f'<h3 id="at_risk">At risk at step {escape(final["step"])}: {len(risky)} probes right at base and still right, '
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
    events = read_events(record)
    budget = record.read_budget()
    if budget is not None:
        within = budget.get("last_within_budget") or {}
        lines = "".join(_event(e) for e in events)
        limits, action = escape(budget.get("limits")), escape(budget.get("on_budget"))
        where = f", checkpoint {escape(within['checkpoint'])}" if within.get("checkpoint") else ""
        parts.append(f'<h3 id="budget">Budget {limits}, on_budget={action}</h3>'
                     f"<ul>{lines or '<li>never exceeded</li>'}</ul><p>Last evaluation within budget: step "
                     f"{escape(within.get('step'))}{where}.</p>")
    return ('<h2 id="drift">Drift, risk and budget</h2>\n' + "\n".join(parts)) if parts else ""


def _event(e: dict[str, Any]) -> str:
    """One budget event of events.jsonl as a list item."""
    return f"<li>{escape(event_text(e))}</li>"


def event_text(e: dict[str, Any]) -> str:
    """One budget event of events.jsonl as text: a limit exceeded, or figures the budget could not judge."""
    if e.get("event") == "budget_cannot_judge":
        return f"step {e.get('step')}: cannot judge {', '.join(map(str, e.get('keys') or []))}: {e.get('reason')}"
    return (f"step {e.get('step')}: {e.get('key')} = {figure(e.get('measured', math.nan))} (compared: "
            f"{figure(e.get('value', math.nan))}) > {e.get('limit')}; action {e.get('action')}")


# -- the page -----------------------------------------------------------------------------------------------
def escape(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _box(css: str, headline: str, items: list[str]) -> str:
    """A warning box at the top of the page: a headline over a list; nothing when there is nothing to say."""
    if not items:
        return ""
    listed = "".join(f"<li>{escape(p)}</li>" for p in items)
    return f'<div class="{css}"><p>{headline}</p><ul>{listed}</ul></div>\n'


def incomplete_box(lost: list[str]) -> str:
    return _box("problems incomplete", "<b>This record is incomplete</b>: its figures end before training did.", lost)


def problems_box(problems: list[str]) -> str:
    return _box("problems", "<b>This record is not consistent</b>: its figures may count steps twice or mix runs.",
                problems)


def figure(value: float) -> str:
    return f"{value:.3f}"


def _cell(value: Any, cut: int = CUT) -> str:
    """A table cell's text, escaped. Longer than `cut` characters: its start, the rest unfolding below on a click, and
    the whole text as the tooltip (and for find-in-page tools that read attributes)."""
    text = str(value)
    if len(text) <= cut:
        return escape(text)
    return f'<details title="{escape(text)}"><summary>{escape(text[:cut])}…</summary>…{escape(text[cut:])}</details>'


_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 2em auto; max-width: 1200px;
       padding: 0 1em; color: #222; }
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
    adj = figure if m.get("adjusted") else (lambda v: "n/a")
    cells = [
        m["n"], figure(m["accuracy_pre"]), figure(m["accuracy_post"]), m["forgotten"], m["learned"], figure(m["forgetting"]),
        adj(m["forgetting_adjusted"]), f"[{figure(m['forgetting_ci_low'])}, {figure(m['forgetting_ci_high'])}]",
        figure(m["backward_transfer"]), adj(m["backward_transfer_adjusted"]), figure(m["invalid_rate_post"]),
    ]
    cls = ' class="overall"' if name == OVERALL else (' class="nothing"' if m.get("nothing_to_forget") else "")
    mark = " *" if m.get("nothing_to_forget") else ""
    return (f'<tr{cls} data-category="{escape(name)}"><td>{escape(name)}{mark}</td>'
            + "".join(f'<td class="num">{escape(c)}</td>' for c in cells) + "</tr>")


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
        body.append("<tr>" + "".join(f'<td class="num">{escape(c)}</td>' for c in cells) + "</tr>")
    return ('<h2 id="behavior">Behaviour, evaluation by evaluation</h2>\n<table class="metrics"><thead><tr>'
            + "".join(f"<th>{escape(c)}</th>" for c in _BEHAVIOR_COLS) + "</tr></thead><tbody>" + "\n".join(body)
            + '</tbody></table>\n<p class="note">Over every generated answer, each against the same probe\'s answer at base '
            "(step 0). Instructions followed: IFEval's prompt-level strict compliance of the instruction probes; 1→0: of "
            "those followed at base, the share not followed now. Runaway: answers that reach the token limit without ending "
            "their turn; new runaways: of those that ended at base, the share that run away now. Length ratio: the median "
            "over probes of tokens now / tokens at base, with its 95% interval. Refused harmless: harmless requests whose "
            "answer opens with a refusal phrase (XSTest's rule); new refusals: of those answered at base, the share refused "
            "now. n/a: no such probe.</p>")


def robust_section(record: RunRecord, probes: ProbeSet, rows: list[dict[str, Any]], max_rows: int) -> str:
    """Robustness over the run (one row per evaluation), then the probes fragile at the final evaluation."""
    if not has_robustness(rows):
        return ""
    group = robust_group(rows)
    bias = any("position_bias_post" in r["metrics"].get(group, {}) for r in rows)

    def num(v: Any, fmt: str = ".3f") -> str:
        return "n/a" if v is None or (isinstance(v, float) and not math.isfinite(v)) else format(v, fmt)

    body = []
    for r in rows:
        m = r["metrics"].get(group, {})
        forgetting = num(m.get("robust_forgetting"))
        if forgetting != "n/a":
            forgetting += f" ({format_count(m.get('robust_lost'))} of {format_count(m.get('robust_pre'))})"
        ci = (f"[{num(m.get('robust_forgetting_ci_low'))}, {num(m.get('robust_forgetting_ci_high'))}]"
              if num(m.get("robust_forgetting_ci_low")) != "n/a" else "n/a")
        cells = [r["step"], f"{num(m.get('robust_accuracy_pre'))} → {num(m.get('robust_accuracy_post'))}", forgetting, ci,
                 num(m.get("consistency_post")), num(m.get("consistency_change"), "+.3f"), format_count(m.get("fragile"))]
        if bias:
            cells += [num(m.get("position_bias_post")), num(m.get("position_bias_change"), "+.3f")]
        body.append(
            f'<tr data-step="{escape(r["step"])}">' + "".join(f'<td class="num">{escape(c)}</td>' for c in cells) + "</tr>"
        )
    cols = _ROBUST_COLS + (_BIAS_COLS if bias else ())
    final = rows[-1]["metrics"][group]
    what = "knowledge probes" if group != OVERALL else "probes"
    missing = "".join(
        f" At step {escape(r['step'])}: {escape(r['metrics'][group].get('missing') or r['metrics'][group]['robust_missing'])}."
        for r in rows
        if r["metrics"].get(group, {}).get("missing") or r["metrics"].get(group, {}).get("robust_missing")
    )
    bias_note = (" Position bias (lettered multiple choice only): the total variation distance between the letters "
                 "chosen and the gold letters, over the balanced option shifts (each option at each position once): 0 = "
                 "none, 1 − 1/k = always the same letter; its change since base.") if bias else ""
    section = (
        '<h2 id="robustness">Robustness, evaluation by evaluation</h2>\n'
        f'<p>Each of {escape(format_count(final.get("robust_n")))} {what} scored as asked and in '
        f'{escape(format_count(final.get("robust_variants")))} variants (question frames, lower case, typos; option orders in '
        f"lettered modes), each against its own variants at base (step 0).</p>\n"
        '<table class="metrics" data-kind="robustness"><thead><tr>' + "".join(f"<th>{escape(c)}</th>" for c in cols)
        + "</tr></thead><tbody>" + "\n".join(body) + "</tbody></table>\n"
        '<p class="note">Robust: right in every variant, the probe as asked among them. Robust accuracy: the share of the '
        "probes robust, at base → now. Robust F: of the probes robust at base, the share no longer robust now (how many "
        "of how many), with its 95% Wilson interval; n/a: none was robust at base. Consistency: the mean share of a "
        "probe's variants answered right, now, and its change since base. Fragile: robust at base, still right as "
        "asked, but wrong in some variant now: forgetting that the 1→0 count does not see." + bias_note
        + (f" Missing figures (n/a): {missing.strip()}" if missing else "") + "</p>"
    )
    fragile = fragile_now(record, probes, rows[-1]["step"])
    return section + ("\n" + _fragile_table(fragile, max_rows, rows[-1]["step"]) if fragile is not None else "")


_ROBUST_COLS = ("step", "robust accuracy (base → now)", "robust F", "robust F 95% CI", "consistency now",
                "consistency change", "fragile")


_BIAS_COLS = ("position bias now", "position bias change")

_FRAGILE_COLS = ("id", "category", "question", "gold", "forms right now", "fragile since step")


def _fragile_table(fragile: list[dict[str, Any]], max_rows: int, final_step: int) -> str:
    head = (f'<h3 id="fragile">Fragile at step {escape(final_step)}: {len(fragile)} probes robust at base, right as asked '
            "now, wrong in some variant now</h3>")
    if not fragile:
        return head + '<p class="note">none</p>'
    body = []
    for r in fragile[:max_rows]:
        since = r["since"] if r["since"] is not None else "—"
        cells = [(r["id"], ' class="id"'), (r["category"], ""), (r["question"], ' class="q"'), (r["gold"], ""),
                 (r["right"], ' class="num"'), (since, ' class="num"')]
        body.append(f'<tr data-id="{escape(r["id"])}">' + "".join(f"<td{c}>{_cell(v)}</td>" for v, c in cells) + "</tr>")
    more = len(fragile) - max_rows
    tail = f'<p class="note">… and {more} more not shown.</p>' if more > 0 else ""
    return (head + '<table class="flips" data-kind="fragile"><thead><tr>'
            + "".join(f"<th>{escape(c)}</th>" for c in _FRAGILE_COLS) + "</tr></thead><tbody>" + "\n".join(body)
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
        cells = [
            (r["id"], ' class="id"'),
            (r["category"], ""),
            (r["question"], ' class="q"'),
            (r["gold"], ""),
            (r["base_prediction"], ""),
            (r["prediction"], ""),
            (r["first_step"], ' class="num"'),
            (r["changes"], ' class="num"'),
        ]
        body.append(f'<tr data-id="{escape(r["id"])}">' + "".join(f"<td{c}>{_cell(v)}</td>" for v, c in cells) + "</tr>")
    more = len(flips) - max_rows
    tail = f'<p class="note">… and {more} more not shown (the full list is in flips.jsonl).</p>' if more > 0 else ""
    return (head + f'<table class="flips" data-kind="{kind}"><thead><tr>' + "".join(f"<th>{escape(c)}</th>" for c in _FLIP_COLS)
            + "</tr></thead><tbody>" + "\n".join(body) + "</tbody></table>" + tail)


def page_html(output_dir, record: RunRecord, probes: ProbeSet, rows, categories: list[str], figures: list[str],
          forgotten: list[dict[str, Any]], learned: list[dict[str, Any]], max_rows: int, train_source: str = "",
          writing: str | None = None) -> str:

    final = rows[-1]
    fm = final["metrics"]
    o = fm[OVERALL]
    run_dir = Path(output_dir).resolve()
    name = record.root.parent.name if record.root.name == "forgetwatch" else record.root.name
    kinds = Counter(p.kind if p.kind != "mcq" else f"multiple choice (k={p.num_choices})" for p in probes)
    steps = [r["step"] for r in rows]
    adj = (lambda v: f", chance-adjusted {figure(v)}") if o.get("adjusted") else (lambda v: "")

    meta = [
        ("run dir", str(run_dir)),
        ("record", str(record.root.resolve())),
        (
            "probes",
            f"{len(probes)} ({', '.join(f'{v} {k}' for k, v in sorted(kinds.items()))}); fingerprint {probes.fingerprint}",
        ),
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
        f"At step {final['step']}: accuracy {figure(o['accuracy_pre'])} → {figure(o['accuracy_post'])} "
        f"(net {o['net_change']:+.3f}). Forgot {o['forgotten']} of {o['n']} probes: F = {figure(o['forgetting'])}"
        f"{adj(o['forgetting_adjusted'])}, 95% CI [{figure(o['forgetting_ci_low'])}, {figure(o['forgetting_ci_high'])}]. "
        f"Learned {o['learned']}: BT = {figure(o['backward_transfer'])}{adj(o['backward_transfer_adjusted'])}, "
        f"95% CI [{figure(o['backward_transfer_ci_low'])}, {figure(o['backward_transfer_ci_high'])}]. "
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
        "variants answered right)"
        + (
            "; the position bias now (dotted, right axis: how far the letters "
            "chosen are from the gold letters over balanced option shifts, 0 = none)."
            if "robustness" in figures and np.isfinite(series(rows, robust_group(rows), "position_bias_post")).any()
            else "."
        ),
    }
    figs = "\n".join(
        f'<figure><img src="{escape(PLOT_FILES[k])}" '
        f'alt="{escape(captions[k])}"><figcaption>{escape(captions[k])}</figcaption></figure>'
        for k in figures
    )
    table = (
        '<table class="metrics"><thead><tr>' + "".join(f"<th>{escape(c)}</th>" for c in _METRIC_COLS) + "</tr></thead><tbody>"
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
<title>{escape(title)}</title>
<style>{_CSS}</style>
</head>
<body>
<h1>{escape(title)}</h1>
<!--problems--><dl class="meta">
{"".join(f"<dt>{escape(k)}</dt><dd>{escape(v)}</dd>" for k, v in meta)}
</dl>
<p class="summary">{escape(summary)}</p>

<h2>Curves</h2>
{figs}

<h2 id="categories">Per category at step {escape(final["step"])}</h2>
{table}
<p class="note">Rates are shares of the group's n probes; invalid (unparseable) answers count as wrong. F adj / BT adj
subtract the flips expected from guessing among each probe's own k options; groups of short-answer probes only have
no chance term (n/a). invalid: share of unparseable answers now.{nothing_note}</p>

<h2 id="flips">Flipped probes at step {escape(final["step"])}, vs the base model</h2>
{mismatch}{short_note}
{_flips_table("forgotten", forgotten, max_rows, final["step"])}
{_flips_table("learned", learned, max_rows, final["step"])}

{_behavior_section(rows)}<!--robustness-->

<!--drift-->

<!--rewind-->

<p class="note">Made by forgetwatch {escape(__version__)} from {escape(record.root.resolve())}.</p>
</body>
</html>
"""
