"""lm-evaluation-harness's `--log_samples` outputs read as forgetwatch samples: one `Sample` per document, its outcome
by the task's metric, matched across runs by content.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .._io import read_json, read_jsonl
from ..errors import SamplesFormatError
from .sample_set import (
    FORMATS,
    LM_EVAL_FILE,
    QUESTION_FIELDS,
    Sample,
    SampleSet,
    abbreviate,
    as_text,
    check_metric_used,
    is_str_list,
    latest_per_task,
    pick_metric,
)

__all__ = ["read_lm_eval"]


def read_lm_eval(path: Path, files: list[Path], metric: str | None, filter: str | None) -> SampleSet:
    notes: list[str] = []
    chosen = latest_per_task(path, files, LM_EVAL_FILE, notes)
    configs, model, version, subtasks = _lm_eval_results(chosen.values(), notes)
    samples: list[Sample] = []
    metrics: dict[str, str] = {}
    filters: dict[str, str] = {}
    filter_seen, logged_filters = False, set()
    for task_from_name, f in sorted(chosen.items()):
        rows = list(_jsonl(f))
        if not rows:
            raise SamplesFormatError(f"{f}: empty samples file")
        task = task_from_name if LM_EVAL_FILE.match(f.name) else (_task_from_results(f, configs) or task_from_name)
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
        name = pick_metric(task, f, chosen_rows, metric)
        metrics[task] = name
        for line, row in chosen_rows:
            samples.append(_lm_eval_sample(task, f"{f} line {line}", row, name, cfg))
    if filter is not None and not filter_seen:
        raise SamplesFormatError(f"--filter {filter!r}: no task in {path} logged answers after that filter "
                                 f"(logged: {', '.join(sorted(logged_filters))})")
    check_metric_used(path, metric, metrics)
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


# lm-eval's fields that forgetwatch reads, each with the JSON types lm-eval writes and what a value must be
_LM_EVAL_FIELDS: dict[str, tuple[Any, str]] = {
    "doc_id": (lambda v: v is None or (isinstance(v, (int, str)) and not isinstance(v, bool)), "a number or a string"),
    "doc_hash": (lambda v: v is None or isinstance(v, str), "a string"),
    "prompt_hash": (lambda v: v is None or isinstance(v, str), "a string"),
    "filter": (lambda v: isinstance(v, str), "a string (the filter's name)"),
    "metrics": (is_str_list, "a list of metric names"),
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
            raise SamplesFormatError(f"{where}: field `{name}` must be {what}, got {abbreviate(row[name])}; forgetwatch reads "
                                     f"lm-eval's --log_samples files as lm-eval writes them")
    args = row.get("arguments")
    if isinstance(args, dict):  # lm-eval 0.4.4+: {"gen_args_0": {"arg_0": ..., "arg_1": ...}, ...}
        for k, a in args.items():
            inner = list(a) if isinstance(a, dict) else []
            if not _numbered(k) or not (isinstance(a, (list, dict))) or not all(_numbered(x) for x in inner):
                raise SamplesFormatError(f"{where}: field `arguments`: {k!r}: {abbreviate(a)} is not one of lm-eval's requests "
                                         "(`gen_args_<n>`: {`arg_<n>`: ...}); forgetwatch reads lm-eval's --log_samples files "
                                         "as lm-eval writes them")


def _numbered(key: Any) -> bool:
    return isinstance(key, str) and key.rsplit("_", 1)[-1].isdigit()


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
    if (
        len(args) >= 4
        and len(args) % 2 == 0
        and all(a and a[0] == "" for a in args[half:])
        and all(a and a[0] for a in args[:half])
    ):
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
            lls = [
                ll / max(len(c[len(delim) :] if c.startswith(delim) else c), 1) for ll, c in zip(lls, continuations, strict=False)
            ]
        prediction = continuations[int(np.argmax(lls))].strip() if lls and all(v is not None for v in lls) else ""
        gold = _gold_choice(target, continuations)
    else:
        prediction = as_text(resps)
        # ifeval's target is a placeholder (0): what is checked is the document's instructions
        gold = (
            "; ".join(map(str, doc["instruction_id_list"]))
            if isinstance(doc.get("instruction_id_list"), list)
            else as_text(target)
        )
    question = next((doc[q] for q in QUESTION_FIELDS if isinstance(doc.get(q), str)), None)
    if question is None:
        question = str(args[0][0]) if args and args[0] else ""
    return Sample(
        task,
        "" if row["doc_id"] is None else str(row["doc_id"]),
        row.get("doc_hash"),
        int(float(row[metric])),
        k,
        question.strip(),
        gold,
        prediction,
        where,
        row.get("prompt_hash"),
    )


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
                return as_text(target)
            out.append(str(t).strip())
    return " | ".join(out)
