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

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import SamplesFormatError
from .lighteval_samples import read_lighteval
from .lm_eval_samples import read_lm_eval
from .metrics import ForgettingMetrics, compute_report
from .sample_set import FORMATS, LM_EVAL_FILE, Sample, SampleSet

__all__ = ["Sample", "SampleSet", "SampleComparison", "SamplesFormatError", "read_samples", "compare_samples"]


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
        return read_lm_eval(path, files, metric, filter)
    if filter is not None:
        raise SamplesFormatError(f"--filter is an lm-eval option; {path} holds lighteval details")
    return read_lighteval(path, files, metric)


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
    lm = sorted(p for p in path.rglob("samples_*.jsonl") if LM_EVAL_FILE.match(p.name))
    le = sorted(p for p in path.rglob("details_*.parquet"))
    if lm and le:
        raise SamplesFormatError(f"{path} holds both lm-eval samples ({lm[0]}) and lighteval details ({le[0]}): "
                                 "point at the directory of one run")
    if not lm and not le:
        raise SamplesFormatError(f"{path}: no per-sample outputs found. forgetwatch reads {FORMATS}; lm-eval writes them "
                                 "with --log_samples --output_path DIR, lighteval with --save-details")
    return (lm, "lm-eval") if lm else (le, "lighteval")


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
            return {
                "path": s.path,
                "format": s.format,
                "model": s.model,
                "version": s.version,
                "metric": s.metric,
                "filter": s.filter,
                "tasks_only_here": tasks_only,
                "samples_only_here": [
                    {"task": x.task, "doc_id": x.doc_id, "doc_hash": x.doc_hash, "where": x.where} for x in only
                ],
            }

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
        raise SamplesFormatError(
            f"task {task}: --match hash, but some documents carry no content hash ({_first_missing(a + b, 'doc_hash')})"
        )
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
                raise SamplesFormatError(
                    f"task {task}: {len(bad)} document id(s) hold different documents on the two sides "
                    f"(first: doc_id {x.doc_id} at {x.where} and {y.where}); match by content with --match hash"
                )
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
