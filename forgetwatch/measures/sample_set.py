"""One evaluation harness's per-sample outputs as forgetwatch reads them: `Sample`, `SampleSet`, and what every reader
shares (content hashes, the metric a task is judged by).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import SamplesFormatError

__all__ = ["Sample", "SampleSet", "LIGHTEVAL_FILE", "LM_EVAL_FILE", "QUESTION_FIELDS", "abbreviate", "as_text",
           "check_metric_used", "is_str_list", "latest_per_task", "pick_metric"]

FORMATS = ("lm-evaluation-harness `--log_samples` outputs (samples_<task>_<time>.jsonl) and lighteval details "
           "(details_<task>_<time>.parquet, from --save-details)")

# lm-eval names its files <prefix>_<task>_<ISO time with '-' for ':'>; the task name may itself hold underscores.
LM_EVAL_FILE = re.compile(r"^samples_(?P<task>.+)_(?P<time>\d{4}-\d\d-\d\dT[\d\-.]+)\.jsonl$")

# lighteval: details_<task>|<few-shot>_<time>.parquet
LIGHTEVAL_FILE = re.compile(r"^details_(?P<task>.+)_(?P<time>\d{4}-\d\d-\d\dT[\d\-.:]+)\.parquet$")

# document fields that hold the question, in the order tried, for the flips list (the full prompt has the few-shot)
QUESTION_FIELDS = ("question", "query", "problem", "Question", "ctx", "sentence", "goal", "text", "prompt", "input")

# 0/1 metrics tried first when a task logs several (lm-eval lists a task's metrics in its config order)
_PREFERRED = ("acc", "exact_match", "loglikelihood_acc", "em", "pass@1", "acc_norm",
              "prompt_level_strict_acc")  # lm-eval's ifeval: every instruction of the prompt followed, as generated


# those that are 0/1 by definition (pass@1 over several samples is a fraction)
_STRICT01 = frozenset(_PREFERRED) - {"pass@1"}


@dataclass(frozen=True)
class Sample:
    """One document's outcome in one evaluation run.

    `outcome` is 1 (correct) or 0 (wrong); `num_choices` is the document's own number of options, 0 for a
    generative task. `key` is what it is matched by (set by `compare_samples`).
    """

    task: str
    doc_id: str
    doc_hash: str | None
    outcome: int
    num_choices: int
    question: str
    gold: str
    prediction: str
    where: str  # file and line, for messages
    prompt_hash: str | None = None  # lm-eval's hash of the prompt as asked (few-shot, chat template and all)


@dataclass
class SampleSet:
    """The samples of one evaluation run (one side of a comparison), one metric and one filter per task."""

    path: str
    format: str  # "lm-eval" or "lighteval"
    samples: list[Sample]
    metric: dict[str, str]  # task -> the 0/1 metric used
    filter: dict[str, str] = field(default_factory=dict)  # task -> the lm-eval filter whose answers count
    model: str | None = None
    version: str | None = None
    notes: list[str] = field(default_factory=list)
    groups: dict[str, str] = field(default_factory=dict)  # task -> the lm-eval group it belongs to (mmlu_stem, ...)

    @property
    def tasks(self) -> list[str]:
        return sorted({s.task for s in self.samples})


def latest_per_task(path: Path, files: list[Path], pattern: re.Pattern, notes: list[str]) -> dict[str, Path]:
    """One file per task: the newest run's, when a reused output directory holds several (said in `notes`)."""
    dirs = sorted({f.parent for f in files})
    if len(dirs) > 1 and pattern is LM_EVAL_FILE:
        shown = ", ".join(str(d) for d in dirs[:5])
        raise SamplesFormatError(f"{path} holds the samples of {len(dirs)} models or runs ({shown}): point at one of them")
    by_task: dict[str, list[tuple[str, Path]]] = defaultdict(list)
    for f in files:
        m = pattern.match(f.name)
        if m is None:  # a file renamed by hand: its own name stands for the task (lighteval's rows name theirs)
            by_task[f.stem].append(("", f))
        else:
            by_task[m["task"]].append((m["time"], f))
    out = {}
    for task, runs in by_task.items():
        runs.sort()
        out[task] = runs[-1][1]
        if len(runs) > 1:
            notes.append(f"{task}: {len(runs)} runs found in {path}; using the latest ({runs[-1][1].name})")
    return out


def is_str_list(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


def abbreviate(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def _is01(v: Any) -> bool:
    return isinstance(v, (bool, int, float)) and not (isinstance(v, float) and math.isnan(v)) and float(v) in (0.0, 1.0)


def _is_hole(v: Any) -> bool:
    """A value that is no score at all: missing, null, NaN, infinite, or not a number (text, a list, an object)."""
    if isinstance(v, (bool, int)):
        return False
    return not isinstance(v, float) or not math.isfinite(v)


def pick_metric(task: str, f: Path, rows: list[tuple[int, dict]], metric: str | None, unit: str = "line") -> str:
    logged = rows[0][1].get("metrics") or [k for k in rows[0][1] if _is01(rows[0][1][k]) and k not in ("doc_id",)]
    binary = [m for m in logged if all(_is01(r.get(m)) for _, r in rows)]
    # 0/1 wherever there is a value, but NaN, null or missing somewhere: counting those documents as 0 (or leaving the
    # metric for another) would report a figure that looks plain and is not; they are refused, naming the first
    # (acc, exact_match, ... are 0/1 by definition: any other value there is a damaged file, said the same way)
    holed = [m for m in logged if m not in binary
             and (m in _STRICT01 or all(_is01(r.get(m)) or _is_hole(r.get(m)) for _, r in rows))]
    if metric is not None and metric in logged:
        if metric not in binary:
            line, row = next((ln, r) for ln, r in rows if not _is01(r.get(metric)))
            raise SamplesFormatError(
                f"{f} {unit} {line}: metric {metric!r} of task {task} is not 0/1 per sample "
                f"({row.get(metric)!r}); sample-wise forgetting needs a 0/1 metric (this task has: {', '.join(binary) or 'none'})"
            )
        return metric
    for m in (*_PREFERRED, *logged):
        if m in holed:
            line, row = next((ln, r) for ln, r in rows if not _is01(r.get(m)))
            n = sum(not _is01(r.get(m)) for _, r in rows)
            raise SamplesFormatError(f"{f} {unit} {line}: metric {m!r} of task {task} is {row.get(m, 'missing')!r}, not 0 or 1 "
                                     f"({n} of {len(rows)} documents): NaN, null or no value is a document the harness could "
                                     "not score, another value a damaged file; counting them as right or wrong would make "
                                     "the figures up: rerun the evaluation, or choose another metric with --metric")
        if m in binary:
            return m
    raise SamplesFormatError(f"{f}: task {task} logs no 0/1 metric per sample (it logs: {', '.join(logged) or 'nothing'}); "
                             "sample-wise forgetting needs correct / wrong per document")


def check_metric_used(path: Path, metric: str | None, metrics: dict[str, str]) -> None:
    if metric is not None and metric not in metrics.values():
        raise SamplesFormatError(f"--metric {metric!r}: no task in {path} logs it per sample "
                                 f"(used: {', '.join(f'{t}: {m}' for t, m in sorted(metrics.items()))})")


def as_text(v: Any) -> str:
    while isinstance(v, list) and len(v) == 1:
        v = v[0]
    return v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)


def content_hash(*parts: Any) -> str:
    """A stable hash of a document's content (for sources without one), as lm-eval's `doc_hash`: sha256 of JSON."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, ensure_ascii=False, default=str).encode()).hexdigest()
