"""lighteval's details files (`--save-details`, parquet) read as forgetwatch samples.
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import SamplesFormatError
from .sample_set import (
    FORMATS,
    LIGHTEVAL_FILE,
    Sample,
    SampleSet,
    abbreviate,
    as_text,
    check_metric_used,
    content_hash,
    is_str_list,
    latest_per_task,
    pick_metric,
)

__all__ = ["read_lighteval"]


def read_lighteval(path: Path, files: list[Path], metric: str | None) -> SampleSet:
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
    chosen = latest_per_task(path, files, LIGHTEVAL_FILE, notes)
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
        named = m["task"] if (m := LIGHTEVAL_FILE.match(f.name)) else f.stem
        for i, r in rows:
            _check_lighteval_row(f"{f} row {i}", r)
            by_task[str((r.get("doc") or {}).get("task_name") or named)].append((i, r))
        for task, trows in by_task.items():
            flat = [(i, {**(r.get("metric") or {}), "metrics": list((r.get("metric") or {}).keys())}) for i, r in trows]
            name = pick_metric(task, f, flat, metric, unit="row")
            metrics[task] = name
            for (i, r), (_, m) in zip(trows, flat, strict=True):
                samples.append(_lighteval_sample(task, f"{f} row {i}", r, int(float(m[name]))))
    check_metric_used(path, metric, metrics)
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
        doc = {
            "query": r.get("example"),
            "choices": list(r.get("gold") or []),
            "gold_index": 0,
            "sampling_methods": ["GENERATIVE"],
        }
        response = {"text": preds}
    return {"doc": doc, "metric": r.get("metrics") or {}, "model_response": response}


def _lighteval_field(where: str, name: str, what: str, got: Any) -> SamplesFormatError:
    return SamplesFormatError(f"{where}: field `{name}` must be {what}, got {abbreviate(got)}; forgetwatch reads lighteval's "
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
    if choices is not None and not is_str_list(choices):
        raise _lighteval_field(where, "doc.choices", "a list of strings", choices)
    for name in ("id", "task_name"):
        v = doc.get(name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (str, int))):
            raise _lighteval_field(where, f"doc.{name}", "a string", v)
    if doc.get("sampling_methods") is not None and not is_str_list(doc["sampling_methods"]):
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
        prediction = as_text(text) if text else ""
    gold_text = " | ".join(choices[g].strip() for g in golds if isinstance(g, int) and 0 <= g < len(choices))
    question = str(doc.get("original_query") or doc.get("query") or "")
    doc_id = doc.get("id")
    return Sample(task, "" if doc_id is None else str(doc_id), content_hash(doc.get("query"), choices, gold), outcome, k,
                  question.strip(), gold_text, prediction, where)
