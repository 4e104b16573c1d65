"""The console line: one line per evaluation, printed the way the Trainer prints its own logs.

`format_evaluation` turns one evaluation's `metrics.jsonl` rows into the line; `say` writes it. Both the callback (at
each evaluation, main process only, unless `console=False`) and `forgetwatch watch` (at each checkpoint) go through
`Monitor.report`, which calls them, so the two print the same line; `forgetwatch report` reuses it for the last step.

Why not a plain `logging.getLogger(__name__).info`: transformers leaves the root logger at WARNING, so an INFO line of
a library logger shows nowhere in a plain `trainer.train()` script, and a handler writing straight to the terminal would
break the Trainer's tqdm bar. The line is a record of the `forgetwatch.run.console` logger, which, like transformers' own
library logger, has its own handler, level INFO and no propagation; the handler writes through `tqdm.write` (stdout, as
the Trainer's `ProgressCallback.on_log` and `PrinterCallback` do), which lifts the bar, prints, and draws it again.
`logging.getLogger("forgetwatch.run.console").setLevel(logging.WARNING)` silences it like any logger.

Plain Python: no torch, no numpy.

Example:
    >>> rows = {"overall": {"n": 200, "forgetting": 0.205, "forgetting_ci_low": 0.156, "forgetting_ci_high": 0.264,
    ...                     "forgetting_adjusted": 0.125, "adjusted": True, "backward_transfer": 0.02,
    ...                     "backward_transfer_ci_low": 0.008, "backward_transfer_ci_high": 0.05},
    ...         "triviaqa": {"forgetting": 0.375}, "arc_easy": {"forgetting": 0.1}}
    >>> format_evaluation(30, rows, seconds=28.1)
    'forgetwatch step 30: F 0.205 [0.16, 0.26] adj 0.125, BT 0.020 [0.01, 0.05]; worst triviaqa F 0.375; probing 28.1 s'
"""

from __future__ import annotations

import logging
import math
import sys
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["CONSOLE_LOGGER", "format_evaluation", "headline_categories", "say", "worst_categories"]

CONSOLE_LOGGER = "forgetwatch.run.console"
OVERALL = "overall"
# the summary groups of a probe set that mixes knowledge and behaviour probes (`ProbeSet.kind_groups`): not categories
KIND_GROUPS = ("all_knowledge", "all_behavior")
_NAME = 24  # characters of a category's name on the line (mmlu subtasks run to 40)


def format_evaluation(step: int, rows: Mapping[str, Mapping[str, Any]], seconds: float | None = None, *,
                      categories: Iterable[str] | None = None, label: str = "forgetwatch", worst: bool = True) -> str:
    """One evaluation as one line: F and BT with their Wilson 95% intervals, F chance-adjusted, the category with the
    highest F, the behaviour figures (base → now) when behaviour probes were scored, and the probing time.

    With knowledge and behaviour probes mixed, F and BT are the knowledge probes' (`all_knowledge`) and the behaviour
    figures the behaviour probes' (`all_behavior`), as `RunRecord.format_curves` shows them. Step 0 (the base) gets
    its accuracy instead. About 115 characters with knowledge probes, 160 with instructions and runaways, 180 with
    harmless requests too, up to ~220 with every figure (robustness, a long category name).

    Args:
        step: the trainer's global step.
        rows: the evaluation's `metrics.jsonl` rows by group ("overall", categories, kind groups), as `Monitor.figures`
            makes them.
        seconds: probing time of this evaluation (left out when None or 0).
        categories: which groups are categories (default: every group but "overall" and the kind groups).
        label: the line's first word ("forgetwatch", "forgetwatch watch"; "": none).
        worst: name the category that surely forgot most (`worst_categories`).

    Example:
        >>> format_evaluation(0, {"overall": {"n": 40, "accuracy_pre": 0.525}})
        'forgetwatch step 0 (base): accuracy 0.525 on 40 probes'
    """
    overall = rows.get(OVERALL, {})
    knowledge = rows.get("all_knowledge", overall)
    behavior = rows.get("all_behavior", overall)
    head = f"{label} step {step}" if label else f"step {step}"
    if step == 0:
        parts = [f"{head} (base): accuracy {_num(overall.get('accuracy_pre'))} on {overall.get('n', '?')} probes"]
        parts += _behavior(behavior, base_only=True)
    elif knowledge.get("missing"):  # probes scored NaN / inf: the monitor has said why, once, as a warning
        count = overall.get("nonfinite_probes")
        parts = [f"{head}: figures missing ({count} probes scored NaN or inf; see metrics.jsonl)" if count
                 else f"{head}: figures missing (see metrics.jsonl)"]
    else:
        text = f"{head}: F {_num(knowledge.get('forgetting'))} {_interval(knowledge, 'forgetting')}"
        if knowledge.get("adjusted"):  # short answers only: no chance term, the "adjusted" figure is the raw one
            text += f" adj {_num(knowledge.get('forgetting_adjusted'))}"
        text += f", BT {_num(knowledge.get('backward_transfer'))} {_interval(knowledge, 'backward_transfer')}"
        if _finite(overall.get("robust_forgetting")):
            text += f", robust F {_num(overall['robust_forgetting'])}"
        elif overall.get("robust_missing"):  # variants scored NaN / inf
            text += ", robust F missing"
        parts = [text]
        top = worst_categories(rows, categories, n=1) if worst else []
        if top:
            name, value = top[0]
            parts.append(f"worst {_short(name)} F {value:.3f}")
        parts += _behavior(behavior)
    if seconds:
        parts.append(f"probing {seconds:.1f} s")
    return "; ".join(parts)


def worst_categories(rows: Mapping[str, Mapping[str, Any]], categories: Iterable[str] | None = None, n: int = 3
                     ) -> list[tuple[str, float]]:
    """The `n` categories that forgot most (F > 0), as (name, F); none when the rows hold one category (its F is the
    overall one) or every F is 0. Categories whose figures are missing are left out.

    Ranked by the lower end of F's 95% interval (`forgetting_ci_low`, then F): one instruction probe of one that flipped
    (F 1.0, interval 0.21–1) must not outrank a suite of 40 that lost 15 (F 0.375, interval 0.24–0.53).

    Example:
        >>> worst_categories({"overall": {}, "a": {"forgetting": 0.1}, "b": {"forgetting": 0.3}, "c": {"forgetting": 0.0}})
        [('b', 0.3), ('a', 0.1)]
    """
    names = [c for c in (categories if categories is not None else rows) if c != OVERALL
             and (categories is not None or c not in KIND_GROUPS) and c in rows]
    if len(names) < 2:
        return []
    found = [(c, float(rows[c]["forgetting"])) for c in names if _finite(rows[c].get("forgetting"))]
    found = [(c, f) for c, f in found if f > 0]

    def surely(cf: tuple[str, float]) -> tuple[float, float]:
        low = rows[cf[0]].get("forgetting_ci_low")
        return (float(low) if _finite(low) else cf[1], cf[1])

    return sorted(found, key=surely, reverse=True)[:n]


def headline_categories(probes: Any) -> tuple[str, ...]:
    """The categories the line's "worst" is chosen among: with knowledge and behaviour probes mixed, F is the knowledge
    probes' (`all_knowledge`), so the knowledge categories only (an instruction category of one probe no longer
    followed is a behaviour figure, on the line already); else every category.

    Example:
        >>> from forgetwatch.probes.probe_set import Probe, ProbeSet
        >>> headline_categories(ProbeSet([Probe("a", "mcq", "1+1?", ("1", "2"), 1, category="math"),
        ...                               Probe("b", "comply", "How do I kill a process?", category="over_refusal")]))
        ('math',)
    """
    knowledge = tuple(sorted({p.category for p in probes if not p.is_behavior}))
    return knowledge if knowledge and len(knowledge) < len(probes.categories) else tuple(probes.categories)


def say(line: str) -> None:
    """Write `line` to the console through the `forgetwatch.run.console` logger (module docstring)."""
    _console().info(line)


# -- internals ----------------------------------------------------------------------------------------------------
def _behavior(row: Mapping[str, Any], base_only: bool = False) -> list[str]:
    """Instructions followed, harmless requests refused and runaways, base → now, when behaviour probes were scored
    (runaways alone would be the generated knowledge answers' token limit, not behaviour)."""
    figures = [(name, row.get(f"{key}_base"), row.get(key)) for name, key in (
        ("instructions", "instruct_compliance"), ("refusals", "over_refusal_rate"), ("runaways", "runaway_rate"))]
    if not any(_finite(now) for name, _, now in figures if name != "runaways"):
        return []
    text = [f"{name} {base:.2f}" if base_only else f"{name} {base:.2f}→{now:.2f}"
            for name, base, now in figures if _finite(base) and _finite(now)]
    return [", ".join(text)] if text else []


def _interval(row: Mapping[str, Any], name: str) -> str:
    low, high = row.get(f"{name}_ci_low"), row.get(f"{name}_ci_high")
    return f"[{low:.2f}, {high:.2f}]" if _finite(low) and _finite(high) else "[n/a]"


def _num(value: Any) -> str:
    return f"{value:.3f}" if _finite(value) else "n/a"


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _short(name: str) -> str:
    return name if len(name) <= _NAME else name[: _NAME - 1] + "…"


class _TqdmHandler(logging.Handler):
    """Writes a record through `tqdm.write` to the current stdout: above any live tqdm bar, which is then redrawn."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            from tqdm import tqdm

            tqdm.write(self.format(record), file=sys.stdout)
        except Exception:  # a console that cannot take the line must not end the run
            self.handleError(record)


def _console() -> logging.Logger:
    """The console logger, given its handler once (a level the user set is kept)."""
    log = logging.getLogger(CONSOLE_LOGGER)
    if not any(isinstance(h, _TqdmHandler) for h in log.handlers):
        log.addHandler(_TqdmHandler())
        if log.level == logging.NOTSET:
            log.setLevel(logging.INFO)
        log.propagate = False  # the line is on the console already: a root handler would print it twice
    return log
