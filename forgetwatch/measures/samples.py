"""Per-sample outputs of other evaluation harnesses, compared sample by sample like forgetwatch's own caches.

Reads what users already have on disk:

    lm-evaluation-harness (0.4.x) `--log_samples`: <output_path>/<model>/samples_<task>_<time>.jsonl, one line per
        document (and per filter), with `doc_id`, `doc_hash`, `arguments` (one per option for multiple choice),
        `filtered_resps` and one field per metric (`acc`, `exact_match`, ...).
    lighteval `--save-details`: <output_dir>/details/<model>/<time>/details_<task>_<time>.parquet, one row per
        document, with `doc` (query, choices, gold_index, id), `model_response` and `metric` (0.10 and later), or
        flat `example`, `choices`, `gold_index`, `predictions`, `metrics` columns and no id (before 0.10).

Samples are matched within a task by the document's content hash when both sides have one for every document
(lm-eval's `doc_hash`; for lighteval a hash of the document's query, choices and gold), else by document id.
Never by position or sorted prompt text: two runs may order, subsample or revise a dataset differently. A sample
found on one side only is counted and listed, not dropped silently. Each document brings its own number of
choices (0 for generative tasks, which have no chance term).

Example:
    >>> cmp = compare_samples("lm-eval-out/base", "lm-eval-out/step-1000")  # doctest: +SKIP
    >>> cmp.report["overall"].forgetting, len(cmp.only_before)  # doctest: +SKIP
    (0.071, 0)
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .._io import read_json, read_jsonl
from ..errors import SamplesFormatError
from .metrics import ForgettingMetrics, compute_report

__all__ = ["Sample", "SampleSet", "SampleComparison", "SamplesFormatError", "read_samples", "compare_samples"]

FORMATS = "lm-evaluation-harness `--log_samples` outputs (samples_<task>_<time>.jsonl) and lighteval details (details_<task>_<time>.parquet, from --save-details)"
# lm-eval names its files <prefix>_<task>_<ISO time with '-' for ':'>; the task name may itself hold underscores.
_LM_EVAL_FILE = re.compile(r"^samples_(?P<task>.+)_(?P<time>\d{4}-\d\d-\d\dT[\d\-.]+)\.jsonl$")
# lighteval: details_<task>|<few-shot>_<time>.parquet
_LIGHTEVAL_FILE = re.compile(r"^details_(?P<task>.+)_(?P<time>\d{4}-\d\d-\d\dT[\d\-.:]+)\.parquet$")
# document fields that hold the question, in the order tried, for the flips list (the full prompt has the few-shot)
_QUESTION_FIELDS = ("question", "query", "problem", "Question", "ctx", "sentence", "goal", "text", "prompt", "input")
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


def read_samples(path: str | Path, metric: str | None = None, filter: str | None = None) -> SampleSet:
    """Read one run's per-sample outputs: an lm-eval `--log_samples` directory or file, or lighteval details.

    Args:
        path: a directory (searched recursively), one `samples_*.jsonl` / `details_*.parquet` file, or
            lm-eval's `results_*.json` (its samples files beside it are read).
        metric: the 0/1 metric to count as correct where a task logs it (default per task: `acc`, `exact_match`,
            ... whichever the task has, in that order, else its first 0/1 metric).
        filter: lm-eval only: the filter whose answers count where a task has several (default: the task's
            first, e.g. gsm8k's `strict-match`).

    Raises:
        SamplesFormatError: unknown or malformed input; the message names the file, line and field.
    """
    path = Path(path)
    files, fmt = _find_files(path)
    if fmt == "lm-eval":
        return _read_lm_eval(path, files, metric, filter)
    if filter is not None:
        raise SamplesFormatError(f"--filter is an lm-eval option; {path} holds lighteval details")
    return _read_lighteval(path, files, metric)


def _find_files(path: Path) -> tuple[list[Path], str]:
    if not path.exists():
        raise SamplesFormatError(f"{path}: no such file or directory")
    if path.is_file():
        if path.name.startswith("results_") and path.suffix == ".json":
            # lm-eval's aggregate file: its samples files share its timestamp
            stamp = path.name[len("results_"):-len(".json")]
            files = sorted(p for p in path.parent.glob(f"samples_*_{stamp}.jsonl"))
            if not files:
                raise SamplesFormatError(f"{path} is lm-eval's results file, but no samples_*_{stamp}.jsonl is beside it: "
                                         "run lm_eval with --log_samples to write per-sample outputs")
            return files, "lm-eval"
        if path.suffix == ".jsonl":
            return [path], "lm-eval"
        if path.suffix == ".parquet":
            return [path], "lighteval"
        raise SamplesFormatError(f"{path}: not a per-sample output forgetwatch reads. It reads {FORMATS}")
    lm = sorted(p for p in path.rglob("samples_*.jsonl") if _LM_EVAL_FILE.match(p.name))
    le = sorted(p for p in path.rglob("details_*.parquet"))
    if lm and le:
        raise SamplesFormatError(f"{path} holds both lm-eval samples ({lm[0]}) and lighteval details ({le[0]}): "
                                 "point at the directory of one run")
    if not lm and not le:
        raise SamplesFormatError(f"{path}: no per-sample outputs found. forgetwatch reads {FORMATS}; lm-eval writes them "
                                 "with --log_samples --output_path DIR, lighteval with --save-details")
    return (lm, "lm-eval") if lm else (le, "lighteval")


def _latest_per_task(path: Path, files: list[Path], pattern: re.Pattern, notes: list[str]) -> dict[str, Path]:
    """One file per task: the newest run's, when a reused output directory holds several (said in `notes`)."""
    dirs = sorted({f.parent for f in files})
    if len(dirs) > 1 and pattern is _LM_EVAL_FILE:
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


# ---------------------------------------------------------------------------------------------------- lm-eval


def _read_lm_eval(path: Path, files: list[Path], metric: str | None, filter: str | None) -> SampleSet:
    notes: list[str] = []
    chosen = _latest_per_task(path, files, _LM_EVAL_FILE, notes)
    configs, model, version, subtasks = _lm_eval_results(chosen.values(), notes)
    samples: list[Sample] = []
    metrics: dict[str, str] = {}
    filters: dict[str, str] = {}
    filter_seen, logged_filters = False, set()
    for task_from_name, f in sorted(chosen.items()):
        rows = list(_jsonl(f))
        if not rows:
            raise SamplesFormatError(f"{f}: empty samples file")
        task = task_from_name if _LM_EVAL_FILE.match(f.name) else (_task_from_results(f, configs) or task_from_name)
        by_filter: dict[str, list[tuple[int, dict]]] = defaultdict(list)
        for line, row in rows:
            by_filter[str(row.get("filter", "none"))].append((line, row))
        names = list(by_filter)
        logged_filters.update(names)
        if filter is not None and filter in by_filter:
            use, filter_seen = filter, True
        else:
            use = names[0]
        filters[task] = use  # recorded always: both sides must count the same filter's answers
        if len(names) > 1:
            others = ", ".join(n for n in names if n != use)
            missing = f"--filter {filter!r} is not among them, so the first; " if filter is not None and use != filter else ""
            notes.append(f"{task}: answers after filter {use!r} ({missing}also logged: {others}; choose with --filter)")
        cfg = configs.get(task) or {}
        chosen_rows = by_filter[use]
        _refuse_repeated_ids(task, f, chosen_rows)
        name = _pick_metric(task, f, chosen_rows, metric)
        metrics[task] = name
        for line, row in chosen_rows:
            samples.append(_lm_eval_sample(task, f"{f} line {line}", row, name, cfg))
    if filter is not None and not filter_seen:
        raise SamplesFormatError(f"--filter {filter!r}: no task in {path} logged answers after that filter "
                                 f"(logged: {', '.join(sorted(logged_filters))})")
    _check_metric_used(path, metric, metrics)
    # each task's own group (mmlu_anatomy -> mmlu_stem), for the by-group table
    groups = {t: g for g, members in subtasks.items() for t in members if t in metrics}
    return SampleSet(str(path), "lm-eval", samples, metrics, filters, model, version, notes, groups)


def _refuse_repeated_ids(task: str, f: Path, rows: list[tuple[int, dict]]) -> None:
    """One row per document and filter: a document id twice means rows of several filters without a `filter` field
    (lm-eval before 0.4.2) or files of several runs merged; counting both would double the document."""
    seen: dict[str, int] = {}
    for line, row in rows:
        if row["doc_id"] is None:  # no id at all: matched by content hash, or refused later
            continue
        key = str(row["doc_id"])
        if key in seen:
            raise SamplesFormatError(
                f"{f} line {line}: doc_id {key} of task {task} again (first on line {seen[key]}). lm-eval writes one line per "
                "document and filter; lines without a `filter` field from several filters (lm-eval before 0.4.2), or "
                "several runs in one file, cannot be told apart: rerun with lm-eval 0.4.2 or later, or keep one run per file")
        seen[key] = line


def _jsonl(f: Path) -> Iterable[tuple[int, dict]]:
    for i, row in read_jsonl(f, SamplesFormatError, hint=f"forgetwatch reads {FORMATS}"):
        if not isinstance(row, dict) or "doc_id" not in row or not ({"filtered_resps", "resps"} & row.keys()):
            raise SamplesFormatError(f"{f} line {i}: not an lm-eval sample (needs `doc_id` and `filtered_resps`); "
                                     f"forgetwatch reads {FORMATS}")
        _check_lm_eval_fields(f"{f} line {i}", row)
        yield i, row


def _is_str_list(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


# lm-eval's fields that forgetwatch reads, each with the JSON types lm-eval writes and what a value must be
_LM_EVAL_FIELDS: dict[str, tuple[Any, str]] = {
    "doc_id": (lambda v: v is None or (isinstance(v, (int, str)) and not isinstance(v, bool)), "a number or a string"),
    "doc_hash": (lambda v: v is None or isinstance(v, str), "a string"),
    "prompt_hash": (lambda v: v is None or isinstance(v, str), "a string"),
    "filter": (lambda v: isinstance(v, str), "a string (the filter's name)"),
    "metrics": (_is_str_list, "a list of metric names"),
    "doc": (lambda v: isinstance(v, dict), "an object (the document)"),
    "filtered_resps": (lambda v: isinstance(v, list), "a list (one response per request)"),
    "resps": (lambda v: isinstance(v, list), "a list (one response per request)"),
    "arguments": (lambda v: isinstance(v, (list, dict)), "a list or an object of requests"),
}


def _check_lm_eval_fields(where: str, row: dict) -> None:
    """The fields forgetwatch reads are of the types lm-eval writes: a file edited or made by another tool is refused
    here, naming the field, rather than failing later with a traceback or counting a wrong figure."""
    for name, (ok, what) in _LM_EVAL_FIELDS.items():
        if name in row and not ok(row[name]):
            raise SamplesFormatError(f"{where}: field `{name}` must be {what}, got {_short(row[name])}; forgetwatch reads "
                                     f"lm-eval's --log_samples files as lm-eval writes them")
    args = row.get("arguments")
    if isinstance(args, dict):  # lm-eval 0.4.4+: {"gen_args_0": {"arg_0": ..., "arg_1": ...}, ...}
        for k, a in args.items():
            inner = list(a) if isinstance(a, dict) else []
            if not _numbered(k) or not (isinstance(a, (list, dict))) or not all(_numbered(x) for x in inner):
                raise SamplesFormatError(f"{where}: field `arguments`: {k!r}: {_short(a)} is not one of lm-eval's requests "
                                         "(`gen_args_<n>`: {`arg_<n>`: ...}); forgetwatch reads lm-eval's --log_samples files "
                                         "as lm-eval writes them")


def _numbered(key: Any) -> bool:
    return isinstance(key, str) and key.rsplit("_", 1)[-1].isdigit()


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def _lm_eval_results(files: Iterable[Path], notes: list[str]) -> tuple[dict[str, dict], str | None, str | None,
                                                                      dict[str, list[str]]]:
    """Task configs (for `output_type`), model, lm-eval version and groups (`group_subtasks`) from the results_*.json
    beside the samples. The samples carry the outcomes; a results file only adds names and each task's output type,
    so one that cannot be read is said in `notes` and left out, not fatal."""
    configs: dict[str, dict] = {}
    subtasks: dict[str, list[str]] = {}
    model = version = None
    for stamp_dir in sorted({f.parent for f in files}):
        for res in sorted(stamp_dir.glob("results_*.json")):
            try:
                data = read_json(res, "lm-eval's results file", SamplesFormatError)
            except (OSError, SamplesFormatError) as e:
                notes.append(f"{e}: left out (it only adds task configurations, groups and the model's name)")
                continue
            cfgs, groups, config = data.get("configs"), data.get("group_subtasks"), data.get("config")
            if isinstance(cfgs, dict):
                configs.update({t: c for t, c in cfgs.items() if isinstance(c, dict)})
            if isinstance(groups, dict):
                subtasks.update({g: [str(t) for t in m] for g, m in groups.items() if isinstance(m, list) and m})
            name = data.get("model_name") or (config.get("model_args") if isinstance(config, dict) else None)
            model = name if isinstance(name, str) and name else model
            v = data.get("lm_eval_version")
            version = v if isinstance(v, str) and v else version
    return configs, model, version, subtasks


def _task_from_results(f: Path, configs: dict[str, dict]) -> str | None:
    return next(iter(configs)) if len(configs) == 1 else None


def _is01(v: Any) -> bool:
    return isinstance(v, (bool, int, float)) and not (isinstance(v, float) and math.isnan(v)) and float(v) in (0.0, 1.0)


def _is_hole(v: Any) -> bool:
    """A value that is no score at all: missing, null, NaN, infinite, or not a number (text, a list, an object)."""
    if isinstance(v, (bool, int)):
        return False
    return not isinstance(v, float) or not math.isfinite(v)


def _pick_metric(task: str, f: Path, rows: list[tuple[int, dict]], metric: str | None, unit: str = "line") -> str:
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
            raise SamplesFormatError(f"{f} {unit} {line}: metric {metric!r} of task {task} is not 0/1 per sample "
                                     f"({row.get(metric)!r}); sample-wise forgetting needs a 0/1 metric (this task has: {', '.join(binary) or 'none'})")
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


def _check_metric_used(path: Path, metric: str | None, metrics: dict[str, str]) -> None:
    if metric is not None and metric not in metrics.values():
        raise SamplesFormatError(f"--metric {metric!r}: no task in {path} logs it per sample "
                                 f"(used: {', '.join(f'{t}: {m}' for t, m in sorted(metrics.items()))})")


def _lm_eval_args(row: dict) -> list[list]:
    """Each request's arguments: lm-eval 0.4.4+ writes {"gen_args_0": {"arg_0": ctx, "arg_1": ...}}, older a list."""
    args = row.get("arguments") or []
    if isinstance(args, dict):
        return [[a[k] for k in sorted(a, key=lambda s: int(s.rsplit("_", 1)[-1]))] if isinstance(a, dict) else list(a)
                for _, a in sorted(args.items(), key=lambda kv: int(kv[0].rsplit("_", 1)[-1]))]
    return [list(a) if isinstance(a, (list, tuple)) else [a] for a in args]


def _lm_eval_sample(task: str, where: str, row: dict, metric: str, cfg: dict) -> Sample:
    args = _lm_eval_args(row)
    output_type = cfg.get("output_type")
    half = len(args) // 2
    if len(args) >= 4 and len(args) % 2 == 0 and all(a and a[0] == "" for a in args[half:]) and all(a and a[0] for a in args[:half]):
        # acc_mutual_info adds each option again with an empty context (its unconditional log-likelihood)
        args = args[: len(args) // 2]
    continuations = [a[1] for a in args if len(a) > 1 and isinstance(a[1], str)]
    mcq = output_type == "multiple_choice" or (output_type is None and len(continuations) == len(args) >= 2)
    if mcq and len(continuations) >= 2 and len(set(continuations)) == 1:
        # the options are the contexts (winogrande: one continuation after each filled-in sentence)
        continuations = [str(a[0]).rsplit("\n", 1)[-1] for a in args]
    k = len(args) if mcq and len(args) >= 2 else 0
    doc = row.get("doc") if isinstance(row.get("doc"), dict) else {}
    target = row.get("target")
    resps = row.get("filtered_resps", row.get("resps"))
    if k:
        lls = [_loglik(r) for r in resps[:k]] if isinstance(resps, list) and len(resps) >= k else []
        if lls and metric == "acc_norm" and all(v is not None for v in lls):
            # lm-eval divides by the option's length in characters, without the delimiter before it
            delim = str(cfg.get("target_delimiter", " "))
            lls = [ll / max(len(c[len(delim):] if c.startswith(delim) else c), 1) for ll, c in zip(lls, continuations, strict=False)]
        prediction = continuations[int(np.argmax(lls))].strip() if lls and all(v is not None for v in lls) else ""
        gold = _gold_choice(target, continuations)
    else:
        prediction = _text(resps)
        # ifeval's target is a placeholder (0): what is checked is the document's instructions
        gold = "; ".join(map(str, doc["instruction_id_list"])) if isinstance(doc.get("instruction_id_list"), list) else _text(target)
    question = next((doc[q] for q in _QUESTION_FIELDS if isinstance(doc.get(q), str)), None)
    if question is None:
        question = str(args[0][0]) if args and args[0] else ""
    return Sample(task, "" if row["doc_id"] is None else str(row["doc_id"]), row.get("doc_hash"), int(float(row[metric])), k, question.strip(), gold,
                  prediction, where, row.get("prompt_hash"))


def _loglik(r: Any) -> float | None:
    # a multiple-choice response is [loglik, is_greedy], both written as strings
    v = r[0] if isinstance(r, (list, tuple)) and r else r
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def _gold_choice(target: Any, continuations: Sequence[str]) -> str:
    """The gold option's text. lm-eval writes `target` as a string: an index ("2"), the option's text, or a list of
    indices for several right options ("[0, 2]"). An index is read first: most tasks' targets are indices, and an
    option that happens to read "2" must not capture them."""
    if isinstance(target, str) and target.strip().startswith("["):
        try:
            target = json.loads(target)
        except ValueError:
            pass
    options = [c.strip() for c in continuations]
    out = []
    for t in target if isinstance(target, list) else [target]:
        try:
            out.append(options[int(t)])
        except (TypeError, ValueError, IndexError, OverflowError):  # OverflowError: an infinite target
            if str(t).strip() not in options:
                return _text(target)
            out.append(str(t).strip())
    return " | ".join(out)


def _text(v: Any) -> str:
    while isinstance(v, list) and len(v) == 1:
        v = v[0]
    return v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)


# -------------------------------------------------------------------------------------------------- lighteval


def _read_lighteval(path: Path, files: list[Path], metric: str | None) -> SampleSet:
    """lighteval details: one parquet per task, a row per document with `doc`, `metric`, `model_response` (0.10 and
    later) or flat `example`, `choices`, `gold_index`, `predictions`, `metrics` columns (before).

    lighteval writes no per-document hash, so the content hash is computed here from the document's query, choices
    and gold; `doc.id` is the document's index in its split (stable while the dataset is)."""
    import pyarrow.parquet as pq

    notes: list[str] = []
    dirs = sorted({f.parent.parent for f in files})  # details/<model>/<time>/details_*.parquet
    if len(dirs) > 1:
        shown = ", ".join(str(d) for d in dirs[:5])
        raise SamplesFormatError(f"{path} holds the details of {len(dirs)} models ({shown}): point at one of them")
    chosen = _latest_per_task(path, files, _LIGHTEVAL_FILE, notes)
    samples: list[Sample] = []
    metrics: dict[str, str] = {}
    old_said = False
    for _, f in sorted(chosen.items()):
        try:
            table = pq.read_table(f)
            # decoded here: a damaged file can pass the reading and fail in the decoding (a name that is not UTF-8)
            pylist = table.to_pylist()
        except Exception as e:  # pyarrow raises several types for a file that is not parquet
            raise SamplesFormatError(f"{f}: not a readable parquet file ({type(e).__name__}: {e}); forgetwatch reads "
                                     f"{FORMATS}") from None
        columns = set(table.column_names)
        if {"doc", "metric"} <= columns:
            rows = [(i, r) for i, r in enumerate(pylist, 1)]
        elif {"example", "metrics"} <= columns:  # lighteval before 0.10: flat columns, no document id
            rows = [(i, _old_lighteval_row(f"{f} row {i}", r)) for i, r in enumerate(pylist, 1)]
            if not old_said:
                notes.append(f"{path}: lighteval details from before 0.10 (no document ids): matched by a hash of each "
                             "document's query, choices and gold")
                old_said = True
        else:
            raise SamplesFormatError(f"{f}: not lighteval details (no columns doc + metric, nor example + metrics; it has "
                                     f"{', '.join(table.column_names)}); forgetwatch reads {FORMATS}")
        by_task: dict[str, list[tuple[int, dict]]] = defaultdict(list)
        named = m["task"] if (m := _LIGHTEVAL_FILE.match(f.name)) else f.stem
        for i, r in rows:
            _check_lighteval_row(f"{f} row {i}", r)
            by_task[str((r.get("doc") or {}).get("task_name") or named)].append((i, r))
        for task, trows in by_task.items():
            flat = [(i, {**(r.get("metric") or {}), "metrics": list((r.get("metric") or {}).keys())}) for i, r in trows]
            name = _pick_metric(task, f, flat, metric, unit="row")
            metrics[task] = name
            for (i, r), (_, m) in zip(trows, flat, strict=True):
                samples.append(_lighteval_sample(task, f"{f} row {i}", r, int(float(m[name]))))
    _check_metric_used(path, metric, metrics)
    model = None
    for f in chosen.values():
        parts = f.parts
        if "details" in parts:  # details/<model path>/<time>/file
            model = "/".join(parts[parts.index("details") + 1 : -2]) or None
    return SampleSet(str(path), "lighteval", samples, metrics, {}, model, None, notes)


def _old_lighteval_row(where: str, r: dict) -> dict:
    """A row of lighteval's details before 0.10 (`example`, `choices`, `gold_index`, `predictions`, `metrics`, `gold`) in
    the shape of today's (`doc`, `metric`, `model_response`)."""
    for name in ("choices", "predictions", "gold"):
        if r.get(name) is not None and not isinstance(r[name], list):
            raise _lighteval_field(where, name, "a list", r[name])
    choices = list(r.get("choices") or [])
    preds = list(r.get("predictions") or [])
    if choices:  # multiple choice: one (log-likelihood, is-greedy) pair per option
        doc = {"query": r.get("example"), "choices": choices, "gold_index": r.get("gold_index"), "sampling_methods": ["LOGPROBS"]}
        response = {"logprobs": [p[0] if isinstance(p, (list, tuple)) else p for p in preds]}
    else:  # generative: the golds are the answers, the predictions the texts
        doc = {"query": r.get("example"), "choices": list(r.get("gold") or []), "gold_index": 0, "sampling_methods": ["GENERATIVE"]}
        response = {"text": preds}
    return {"doc": doc, "metric": r.get("metrics") or {}, "model_response": response}


def _lighteval_field(where: str, name: str, what: str, got: Any) -> SamplesFormatError:
    return SamplesFormatError(f"{where}: field `{name}` must be {what}, got {_short(got)}; forgetwatch reads lighteval's "
                              "details files as lighteval writes them")


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _check_lighteval_row(where: str, row: dict) -> None:
    """The fields forgetwatch reads are of the types lighteval writes (see `_check_lm_eval_fields`)."""
    doc, metric, resp = row.get("doc"), row.get("metric"), row.get("model_response")
    if not isinstance(doc, dict):
        raise _lighteval_field(where, "doc", "an object (the document)", doc)
    if not isinstance(metric, dict):
        raise _lighteval_field(where, "metric", "an object (metric name: value)", metric)
    if resp is not None and not isinstance(resp, dict):
        raise _lighteval_field(where, "model_response", "an object", resp)
    if not isinstance(doc.get("query"), str):
        raise _lighteval_field(where, "doc.query", "a string (the question)", doc.get("query"))
    choices = doc.get("choices")
    if choices is not None and not _is_str_list(choices):
        raise _lighteval_field(where, "doc.choices", "a list of strings", choices)
    for name in ("id", "task_name"):
        v = doc.get(name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (str, int))):
            raise _lighteval_field(where, f"doc.{name}", "a string", v)
    if doc.get("sampling_methods") is not None and not _is_str_list(doc["sampling_methods"]):
        raise _lighteval_field(where, "doc.sampling_methods", "a list of strings", doc["sampling_methods"])
    gold = doc.get("gold_index")
    golds = gold if isinstance(gold, list) else [gold]
    if not golds or not all(isinstance(g, int) and not isinstance(g, bool) for g in golds):
        raise _lighteval_field(where, "doc.gold_index", "an index or a list of indices into `doc.choices`", gold)
    if choices and not all(0 <= g < len(choices) for g in golds):
        raise SamplesFormatError(f"{where}: field `doc.gold_index`: {gold} is out of range for {len(choices)} choices "
                                 f"(0..{len(choices) - 1})")
    lls = (resp or {}).get("logprobs")
    if lls is not None and not (isinstance(lls, list) and all(v is None or _is_num(v) for v in lls)):
        raise _lighteval_field(where, "model_response.logprobs", "a list of numbers", lls)


def _lighteval_sample(task: str, where: str, row: dict, outcome: int) -> Sample:
    doc = row.get("doc") or {}
    resp = row.get("model_response") or {}
    choices = [str(c) for c in (doc.get("choices") or [])]
    gold = doc.get("gold_index")
    golds = gold if isinstance(gold, list) else [gold]
    gold = golds[0] if len(golds) == 1 else golds  # [2] and 2 are the same gold (older versions wrote lists)
    generative = "GENERATIVE" in (doc.get("sampling_methods") or []) or not resp.get("logprobs")
    k = len(choices) if not generative and len(choices) >= 2 else 0
    if k:
        lls = resp.get("logprobs") or []
        # the prediction shown in the flips list; none when a log-probability is missing or NaN (argmax would pick it)
        known = len(lls) == k and all(_is_num(v) and math.isfinite(v) for v in lls)
        prediction = choices[int(np.argmax(lls))].strip() if known else ""
    else:
        text = resp.get("text_post_processed") or resp.get("text") or []
        prediction = _text(text) if text else ""
    gold_text = " | ".join(choices[g].strip() for g in golds if isinstance(g, int) and 0 <= g < len(choices))
    question = str(doc.get("original_query") or doc.get("query") or "")
    doc_id = doc.get("id")
    return Sample(task, "" if doc_id is None else str(doc_id), content_hash(doc.get("query"), choices, gold), outcome, k,
                  question.strip(), gold_text, prediction, where)


# -------------------------------------------------------------------------------------------------- comparing


@dataclass
class SampleComparison:
    """Two runs matched sample by sample: the forgetting report, the flips and what had no partner.

    `pre` / `post` / `num_choices` / `tasks` are aligned arrays over the matched samples.
    """

    before: SampleSet
    after: SampleSet
    match_by: dict[str, str]  # task -> "doc_hash" | "doc_id" | "content hash"
    matched: list[tuple[Sample, Sample]]
    only_before: list[Sample]
    only_after: list[Sample]
    tasks_only_before: list[str]
    tasks_only_after: list[str]
    report: dict[str, ForgettingMetrics]
    notes: list[str] = field(default_factory=list)  # what the comparison itself found (prompts that differ)
    by_group: dict[str, ForgettingMetrics] = field(default_factory=dict)  # lm-eval groups (a task outside one: itself)

    @property
    def flips(self) -> list[dict[str, Any]]:
        out = []
        for a, b in self.matched:
            if a.outcome != b.outcome:
                out.append({"task": a.task, "doc_id": a.doc_id, "doc_id_after": b.doc_id, "where": a.where,
                            "direction": "1→0" if a.outcome else "0→1",
                            "question": a.question, "gold": a.gold, "before": a.prediction, "after": b.prediction})
        return out

    def to_dict(self) -> dict[str, Any]:
        def side(s: SampleSet, only: list[Sample], tasks_only: list[str]) -> dict[str, Any]:
            return {"path": s.path, "format": s.format, "model": s.model, "version": s.version, "metric": s.metric,
                    "filter": s.filter, "tasks_only_here": tasks_only,
                    "samples_only_here": [{"task": x.task, "doc_id": x.doc_id, "doc_hash": x.doc_hash, "where": x.where} for x in only]}

        return {"before": side(self.before, self.only_before, self.tasks_only_before),
                "after": side(self.after, self.only_after, self.tasks_only_after),
                "n": len(self.matched), "match_by": self.match_by,
                "metrics": {k: v.to_dict() for k, v in self.report.items()},
                "groups": {k: v.to_dict() for k, v in self.by_group.items()}, "flips": self.flips,
                "notes": list(dict.fromkeys(self.before.notes + self.after.notes + self.notes))}


def compare_samples(before: str | Path | SampleSet, after: str | Path | SampleSet, *, metric: str | None = None,
                    filter: str | None = None, match: str = "auto") -> SampleComparison:
    """Match two runs' samples within each task and compute the sample-wise forgetting report.

    Args:
        before, after: paths for `read_samples`, or `SampleSet`s.
        metric, filter: as in `read_samples`.
        match: "auto" (content hash where both sides have one for every document of a task, else document id),
            "hash" or "id".

    Raises:
        SamplesFormatError: no task in common (both task lists are named), a document id that holds different
            documents on the two sides, or documents without any usable key.
    """
    if match not in ("auto", "hash", "id"):
        raise ValueError(f"match must be 'auto', 'hash' or 'id', got {match!r}")
    a = before if isinstance(before, SampleSet) else read_samples(before, metric, filter)
    b = after if isinstance(after, SampleSet) else read_samples(after, metric, filter)
    if a.format != b.format:
        raise SamplesFormatError(f"before ({a.path}) holds {a.format} outputs but after ({b.path}) holds {b.format} outputs: "
                                 "the two harnesses prompt and score differently; compare two runs of the same one")
    ta, tb = set(a.tasks), set(b.tasks)
    common = sorted(ta & tb)
    if not common:
        hint = ("; lm-eval names a task only in its file name, samples_<task>_<time>.jsonl: keep those names"
                if a.format == "lm-eval" else "")
        raise SamplesFormatError(f"the two runs share no task: before ({a.path}) has {', '.join(sorted(ta))}; "
                                 f"after ({b.path}) has {', '.join(sorted(tb))}{hint}")
    notes: list[str] = []
    for t in common:
        if a.metric[t] != b.metric[t]:
            raise SamplesFormatError(f"task {t}: before counts {a.metric[t]!r} but after counts {b.metric[t]!r}; "
                                     "pick one for both with --metric")
        if a.filter.get(t) != b.filter.get(t):
            raise SamplesFormatError(f"task {t}: before counts the answers after filter {a.filter.get(t, 'none')!r} but after "
                                     f"after {b.filter.get(t, 'none')!r}; pick one for both with --filter")
    sa, sb = _by_task(a.samples), _by_task(b.samples)
    match_by, matched, only_a, only_b = {}, [], [], []
    for t in common:
        how, pairs, oa, ob = _match_task(t, sa[t], sb[t], match)
        match_by[t] = how
        matched += pairs
        only_a += oa
        only_b += ob
    if not matched:
        raise SamplesFormatError(f"no document of {', '.join(common)} is on both sides ({a.path}, {b.path}); "
                                 "were the two runs made on different datasets?")
    for x, y in matched:
        if x.num_choices != y.num_choices:
            raise SamplesFormatError(f"task {x.task}: the same document has {x.num_choices or 'no'} options before ({x.where}) "
                                     f"but {y.num_choices or 'no'} after ({y.where}): the task's configuration differs between "
                                     "the runs (a generative task on one side?); compare runs of the same task version")
    # Same document, other prompt (few-shot examples, chat template, task version): flips then mix the model's change
    # with the prompt's. Said, not refused: comparing a chat-templated checkpoint with its base can be the point.
    asked = Counter(x.task for x, y in matched if x.prompt_hash and y.prompt_hash and x.prompt_hash != y.prompt_hash)
    for t, n in sorted(asked.items()):
        total = sum(1 for x, _ in matched if x.task == t)
        notes.append(f"{t}: {n} of {total} matched documents were asked with a different prompt (lm-eval's prompt_hash "
                     "differs: few-shot examples, chat template or task version); their flips mix the model's change "
                     "with the prompt's")
    pre = np.array([x.outcome for x, _ in matched], dtype=np.int8)
    post = np.array([y.outcome for _, y in matched], dtype=np.int8)
    k = np.array([x.num_choices for x, _ in matched], dtype=np.int64)
    tasks = [x.task for x, _ in matched]
    report = compute_report(pre, post, k, tasks)
    groups = {**b.groups, **a.groups}
    by_group = {}
    if any(t in groups for t in common):
        by_group = compute_report(pre, post, k, [groups.get(t, t) for t in tasks])
    return SampleComparison(a, b, match_by, matched, only_a, only_b, sorted(ta - tb), sorted(tb - ta), report, notes,
                            by_group)


def _by_task(samples: list[Sample]) -> dict[str, list[Sample]]:
    out: dict[str, list[Sample]] = defaultdict(list)
    for s in samples:
        out[s.task].append(s)
    return out


def _keyed(samples: list[Sample], attr: str) -> dict[tuple[str, int], Sample]:
    """Key -> sample; duplicates of a key (the same document twice in a dataset) are told apart by their order."""
    seen: Counter = Counter()
    out = {}
    for s in sorted(samples, key=lambda s: _id_order(s.doc_id)):
        v = getattr(s, attr)
        out[(v, seen[v])] = s
        seen[v] += 1
    return out


def _id_order(doc_id: str) -> tuple[int, Any]:
    return (0, int(doc_id)) if doc_id.lstrip("-").isdigit() else (1, doc_id)


def _match_task(task: str, a: list[Sample], b: list[Sample], match: str):
    hashed = all(s.doc_hash for s in a) and all(s.doc_hash for s in b)
    with_id = all(s.doc_id for s in a) and all(s.doc_id for s in b)
    if match == "hash" and not hashed:
        raise SamplesFormatError(f"task {task}: --match hash, but some documents carry no content hash ({_first_missing(a + b, 'doc_hash')})")
    if match == "id" and not with_id:
        raise SamplesFormatError(f"task {task}: --match id, but some documents carry no id ({_first_missing(a + b, 'doc_id')})")
    if match == "id" or (match == "auto" and not hashed):
        if not with_id:
            raise SamplesFormatError(f"task {task}: documents carry neither a content hash nor an id "
                                     f"({_first_missing(a + b, 'doc_id')}); cannot match them safely")
        attr, how = "doc_id", "doc_id"
        ka, kb = _keyed(a, attr), _keyed(b, attr)
        if hashed:  # same id, different document: the datasets differ, an id match would compare unrelated items
            bad = [(x, kb[key]) for key, x in ka.items() if key in kb and x.doc_hash != kb[key].doc_hash]
            if bad:
                x, y = bad[0]
                raise SamplesFormatError(f"task {task}: {len(bad)} document id(s) hold different documents on the two sides "
                                         f"(first: doc_id {x.doc_id} at {x.where} and {y.where}); match by content with --match hash")
    else:
        attr, how = "doc_hash", "content hash"
        ka, kb = _keyed(a, attr), _keyed(b, attr)
    pairs = [(ka[key], kb[key]) for key in ka if key in kb]
    only_a = [x for key, x in ka.items() if key not in kb]
    only_b = [y for key, y in kb.items() if key not in ka]
    return how, pairs, only_a, only_b


def _first_missing(samples: list[Sample], attr: str) -> str:
    s = next(s for s in samples if not getattr(s, attr))
    return f"first at {s.where}"


def content_hash(*parts: Any) -> str:
    """A stable hash of a document's content (for sources without one), as lm-eval's `doc_hash`: sha256 of JSON."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, ensure_ascii=False, default=str).encode()).hexdigest()
