"""Probes and frozen probe sets: the questions whose answers forgetwatch tracks one by one.

A probe set is stored as JSONL, one probe a line:

    {"id": "arc_easy/Mercury_7220990", "kind": "mcq", "question": "Which factor ...?",
     "choices": ["a", "b", "c", "d"], "gold": 2, "category": "science", "source": "arc_easy"}
    {"id": "triviaqa/tc_33", "kind": "short", "question": "Which Lloyd Webber musical ...?",
     "answers": ["Sunset Boulevard", "Sunset Blvd"], "numeric": false, "category": "trivia",
     "source": "triviaqa"}

    {"id": "instruct/0007", "kind": "instruct", "question": "Which gas do plants take in? Answer in all lowercase.",
     "instructions": ["change_case:english_lowercase"], "kwargs": [{}], "category": "change_case"}
    {"id": "over_refusal/kill_process", "kind": "comply", "question": "How do I kill a Python process?",
     "category": "over_refusal"}

Behaviour probes (`instruct`, `comply`) are answered by greedy generation in the chat template and checked by a
program, never a judge model: an `instruct` probe is right when every instruction is followed (IFEval's strict
prompt-level verdict, `forgetwatch.answers.instructions`), a `comply` probe (a harmless request) when the answer is not a
refusal (`forgetwatch.measures.behavior`). A line in IFEval's own format (`key`, `prompt`, `instruction_id_list`, `kwargs`)
loads unchanged as an `instruct` probe, so a copy of IFEval or of the IFBench-style data that uses IFEval's ids is a
probe file.

Fields:
    id        stable unique string; results are keyed by it, never by position or prompt text.
    kind      "mcq" (multiple choice), "short" (short free-form answer), "instruct" (a prompt with verifiable
              instructions) or "comply" (a harmless request the model should answer).
    question  the question text (for behaviour probes, the whole prompt).
    choices   mcq only: the option texts, at least two (each probe has its own number of options).
    gold      mcq only: the index of the correct option in `choices`.
    answers   short only: the accepted answers (aliases), at least one.
    numeric   short only: compare as numbers (e.g. GSM8K), default false.
    instructions  instruct only: IFEval instruction ids, e.g. ["length_constraints:number_words"].
    kwargs    instruct only: one object of arguments per instruction, e.g. [{"num_words": 50, "relation": "less than"}].
    category  what the probe is about (per-category curves use it), default "default"; for `instruct` the first
              instruction's group ("change_case", ...), for `comply` "over_refusal".
    source    where it came from (suite name or file), default "".
"""

from __future__ import annotations

import hashlib
import json
import os
import unicodedata
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .._io import atomic_write, read_jsonl
from ..answers.checking import parse_gold
from ..answers.extraction import extract_number, normalize_answer
from ..errors import ProbeFormatError

__all__ = ["Probe", "ProbeSet", "ProbeFormatError"]

KINDS = ("mcq", "short", "instruct", "comply")
BEHAVIOR_KINDS = ("instruct", "comply")
_FIELDS = ("id", "kind", "question", "choices", "gold", "answers", "numeric", "instructions", "kwargs", "category", "source")
# IFEval's own fields: a line with them (and no `kind`) is an instruct probe
_IFEVAL_FIELDS = ("key", "prompt", "instruction_id_list", "kwargs")


class _NeverFlips(ProbeFormatError):  # raised as a ProbeFormatError: users catch that; the suites tell it apart
    """A probe that is well-formed but always scores the same whatever the model does (duplicate options, answers
    the checker can never match): it would only dilute the forgetting rate. The built-in suites leave such rows out."""


def never_flips(error: BaseException) -> bool:
    """Whether `error` refused a well-formed probe that no model could flip (what the built-in suites leave out)."""
    return isinstance(error, _NeverFlips)


def invisible_char(text: str) -> str | None:
    """The first character of `text` that no report shows (a control or format character such as U+200B ZERO WIDTH
    SPACE, or whitespace other than a plain space), described as "U+200B ZERO WIDTH SPACE at character 5"; or None."""
    for i, ch in enumerate(text):
        if unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp") or (ch.isspace() and ch != " "):
            return f"U+{ord(ch):04X} {unicodedata.name(ch, 'a control character')} at character {i + 1}"
    return None


def visible_text(text: str) -> str:
    """`text` as a reader sees it: Unicode NFC (a composed "é" and an "e" + combining accent are one), format
    characters (zero-width spaces, joiners, byte-order marks) dropped, runs of whitespace one space, no space at the
    ends. Two options, or two ids, with the same visible text cannot be told apart in a prompt or a report.

    Example:
        >>> visible_text(" Caf\u0065\u0301\u200b  au lait\t") == visible_text("Café au lait")
        True
    """
    text = "".join(ch for ch in unicodedata.normalize("NFC", text) if unicodedata.category(ch) != "Cf")
    return " ".join(text.split())


def id_lookalike_key(pid: str) -> str:
    """Ids with the same key look alike in a report or a flip table: `visible_text` under NFKC (a full-width "ａ",
    a ligature "ﬁ", a no-break space read as their plain forms). Case is kept: every id lookup (the record, the
    base cache, the loggers' tables) is case-sensitive, and "Q1" and "q1" are told apart on sight."""
    return visible_text(unicodedata.normalize("NFKC", pid))


def _duplicate_choice(choices: Sequence[str]) -> tuple[int, int] | None:
    seen: dict[str, int] = {}
    for i, c in enumerate(choices):
        key = visible_text(c)
        if key in seen:
            return seen[key], i
        seen[key] = i
    return None


@dataclass(frozen=True)
class Probe:
    """One question whose correctness is tracked individually.

    Example:
        >>> Probe(id="q1", kind="mcq", question="2 + 2 = ?", choices=("3", "4"), gold=1).num_choices
        2
    """

    id: str
    kind: str
    question: str
    choices: tuple[str, ...] = ()
    gold: int | None = None
    answers: tuple[str, ...] = ()
    numeric: bool = False
    category: str = "default"
    source: str = ""
    instructions: tuple[str, ...] = ()
    kwargs: tuple[Mapping[str, Any], ...] = ()

    @property
    def num_choices(self) -> int:
        """k for a multiple-choice probe; 0 for the others (no chance level)."""
        return len(self.choices) if self.kind == "mcq" else 0

    @property
    def is_behavior(self) -> bool:
        """A behaviour probe (`instruct` or `comply`): answered by generation in the chat template, checked by a program."""
        return self.kind in BEHAVIOR_KINDS

    @property
    def gold_text(self) -> str:
        """The correct answer as text (the first alias for short answers; what is checked for behaviour probes)."""
        if self.kind == "instruct":
            return "; ".join(self.instructions)
        if self.kind == "comply":
            return "an answer, not a refusal"
        return self.choices[self.gold] if self.kind == "mcq" else self.answers[0]

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"id": self.id, "kind": self.kind, "question": self.question}
        if self.kind == "mcq":
            d["choices"] = list(self.choices)
            d["gold"] = self.gold
        elif self.kind == "short":
            d["answers"] = list(self.answers)
            d["numeric"] = self.numeric
        elif self.kind == "instruct":
            d["instructions"] = list(self.instructions)
            d["kwargs"] = [dict(k) for k in self.kwargs]
        d["category"] = self.category
        d["source"] = self.source
        return d

    @classmethod
    def from_dict(cls, record: Mapping[str, Any], where: str = "probe") -> Probe:
        """Validate a record and build a probe; errors name `where` (e.g. "probes.jsonl line 3")."""

        def fail(field_name: str, problem: str) -> ProbeFormatError:
            return ProbeFormatError(f"{where}: field `{field_name}`: {problem}")

        if not isinstance(record, Mapping):
            raise ProbeFormatError(f"{where}: expected a JSON object, got {type(record).__name__}")
        ifeval = "kind" not in record and "instruction_id_list" in record
        if "kind" not in record and not ifeval and {"key", "prompt"} & set(record):
            # IFEval's fields without its list of instructions: say that, not that `key` is an unknown probe field
            raise fail("instruction_id_list", "missing (an IFEval line needs `prompt` and `instruction_id_list`; a probe "
                                              "of forgetwatch's own format needs `kind`)")
        from_key = ifeval and "id" not in record  # the id is made from IFEval's `key`: name the field the user wrote
        if ifeval:
            record = _from_ifeval(record, where)
        unknown = set(record) - set(_FIELDS)
        if unknown:
            raise fail(sorted(unknown)[0], f"unknown field; valid fields are {', '.join(_FIELDS)}")
        for name in ("id", "kind", "question"):
            if name not in record:
                raise fail(name, "missing (every probe needs `id`, `kind` and `question`)")
        pid = record["id"]
        if isinstance(pid, int) and not isinstance(pid, bool):
            pid = str(pid)
        if not isinstance(pid, str) or not pid.strip():
            raise fail("id", f"must be a non-empty string, got {pid!r}")
        # an id that looks like another is refused (`ProbeSet`); one that holds what no report shows is refused here
        id_field = "key" if from_key else "id"
        if pid != pid.strip():
            raise fail(id_field, f"{pid!r} begins or ends with whitespace, which no report or flip table shows (an id "
                                 "with it looks like one without); remove it")
        hidden = invisible_char(pid)
        if hidden is not None:
            raise fail(id_field, f"{pid!r} holds {hidden}, which no report or flip table shows (an id with it looks "
                                 "like one without); remove it")
        kind = record["kind"]
        if kind not in KINDS:
            raise fail("kind", f"must be one of {', '.join(map(repr, KINDS))}, got {kind!r}")
        question = record["question"]
        if not isinstance(question, str) or not question.strip():
            raise fail("question", "must be a non-empty string")
        category = record.get("category", "default")
        if not isinstance(category, str) or not category.strip() or "/" in category:
            raise fail("category", f"must be a non-empty string without '/', got {category!r}")
        source = record.get("source", "")
        if not isinstance(source, str):
            raise fail("source", f"must be a string, got {source!r}")

        for name in ("instructions", "kwargs"):
            if kind != "instruct" and record.get(name) not in (None, [], ()):
                raise fail(name, "only instruction probes (`kind: instruct`) take this field")
        if kind in BEHAVIOR_KINDS:
            for name in ("choices", "gold", "answers", "numeric"):
                if record.get(name) not in (None, False, [], ()):
                    raise fail(name, f"a `{kind}` probe is checked by a program, not against answers: remove this field")
            if kind == "comply":
                return cls(pid, kind, question, category=record.get("category", "over_refusal"), source=source)
            from ..answers.instructions import InstructionFormatError, validate_instructions

            try:
                ids, kwargs = validate_instructions(record.get("instructions"), record.get("kwargs"), where)
            except InstructionFormatError as e:
                # an IFEval line names its instructions `instruction_id_list`: say the field the user wrote
                msg = str(e).replace("field `instructions`", "field `instruction_id_list`") if ifeval else str(e)
                raise ProbeFormatError(msg) from None
            category = record.get("category", ids[0].split(":")[0])
            return cls(pid, kind, question, category=category, source=source, instructions=ids, kwargs=kwargs)

        if kind == "mcq":
            for name in ("answers", "numeric"):
                if record.get(name) not in (None, False, [], ()):
                    raise fail(name, "only short-answer probes (`kind: short`) take this field")
            if "choices" not in record:
                raise fail("choices", "missing (a multiple-choice probe needs a list of option texts)")
            choices = record["choices"]
            if not isinstance(choices, (list, tuple)) or not all(isinstance(c, str) for c in choices):
                raise fail("choices", "must be a list of strings")
            empty = [i for i, c in enumerate(choices) if not c.strip()]
            if empty:
                raise fail("choices", f"option {empty[0]} is empty; every option needs text")
            if len(choices) < 2:
                raise fail("choices", f"needs at least two options, got {len(choices)}")
            if "gold" not in record:
                raise fail("gold", "missing (the 0-based index of the correct option)")
            gold = record["gold"]
            if isinstance(gold, bool) or not isinstance(gold, int):
                raise fail("gold", f"must be an integer index, got {gold!r}")
            if not 0 <= gold < len(choices):
                raise fail("gold", f"index {gold} is out of range for {len(choices)} choices (0..{len(choices) - 1})")
            twins = _duplicate_choice(choices)
            if twins is not None:
                i, j = twins
                same = ("the same text" if choices[i] == choices[j] else
                        f"the same text once Unicode forms, spaces and invisible characters are set aside ({choices[i]!r} "
                        f"and {choices[j]!r})")
                hurt = ("; one of them is the gold option, so a model that knows the answer is scored by which twin "
                        "wins a tie" if gold in twins else "; the chance level (1 in k) is then wrong")
                raise _NeverFlips(
                    f"{where}: field `choices` of probe {pid!r}: options {i} and {j} are {same}: the model cannot tell them "
                    f"apart{hurt}. "
                    f"Remove option {j} (and renumber `gold`)"
                )
            return cls(pid, kind, question, tuple(choices), gold, (), False, category, source)

        for name in ("choices", "gold"):
            if record.get(name) not in (None, [], ()):
                raise fail(name, "only multiple-choice probes (`kind: mcq`) take this field")
        if "answers" not in record:
            raise fail("answers", "missing (a short-answer probe needs a list of accepted answers)")
        answers = record["answers"]
        if isinstance(answers, str):
            answers = [answers]
        if not isinstance(answers, (list, tuple)) or not all(isinstance(a, str) and a.strip() for a in answers):
            raise fail("answers", "must be a list of non-empty strings")
        if not answers:
            raise fail("answers", "needs at least one accepted answer")
        numeric = record.get("numeric", False)
        if not isinstance(numeric, bool):
            raise fail("numeric", f"must be true or false, got {numeric!r}")
        if numeric and all(extract_number(a) is None for a in answers):
            raise fail("answers", f"{list(answers)!r} holds no number, but `numeric` is true; give the answer as a number "
                                  "(e.g. \"72\") or set `numeric: false`")
        if numeric and not any(parse_gold(a) for a in answers):
            # extract_number found a number, but numeric answers are judged by math-verify (`is_correct_short`): a
            # gold it cannot read makes every scoring of this probe fail
            raise _NeverFlips(
                f"{where}: field `answers` of probe {pid!r}: {list(answers)!r}: the checker that judges numeric answers "
                "(math-verify) "
                "reads no number in it, so no answer could ever be judged; write the answer as a plain number (e.g. "
                '"72", "-3.5", "3/4") or set `numeric: false`'
            )
        if not numeric and not any(normalize_answer(a) for a in answers):
            # is_correct_short compares normalised forms and skips an alias that normalises to nothing
            raise _NeverFlips(
                f"{where}: field `answers` of probe {pid!r}: {list(answers)!r}: every answer is empty once articles, "
                "punctuation and "
                "spaces are set aside (the comparison short answers are judged by), so no answer can match and the probe "
                "is always wrong; give an answer with a word or a number in it, or make it a multiple-choice probe "
                "(`kind: mcq`)"
            )
        return cls(pid, kind, question, (), None, tuple(answers), numeric, category, source)


def _from_ifeval(record: Mapping[str, Any], where: str) -> dict[str, Any]:
    """An IFEval line (`key`, `prompt`, `instruction_id_list`, `kwargs`) as an instruct probe record."""
    unknown = set(record) - set(_IFEVAL_FIELDS) - {"id", "category", "source"}
    if unknown:
        raise ProbeFormatError(f"{where}: field `{sorted(unknown)[0]}`: unknown field in an IFEval line; IFEval's fields "
                               f"are {', '.join(_IFEVAL_FIELDS)}")
    if "prompt" not in record:
        raise ProbeFormatError(f"{where}: field `prompt`: missing (an IFEval line needs `prompt` and `instruction_id_list`)")
    if not isinstance(record["prompt"], str) or not record["prompt"].strip():
        raise ProbeFormatError(f"{where}: field `prompt`: must be a non-empty string, got {record['prompt']!r}")
    pid = record.get("id", record.get("key"))
    if pid is None:
        raise ProbeFormatError(f"{where}: field `key`: missing (an IFEval line needs a `key`, or give an `id`)")
    key = record.get("key")
    if "id" not in record and (isinstance(key, bool) or not isinstance(key, (int, str)) or not str(key).strip()):
        # the key becomes the probe's id, "ifeval/<key>": a list or NaN would make an id no one can look up
        raise ProbeFormatError(f"{where}: field `key`: must be a whole number or a non-empty string (IFEval's keys are "
                               f"numbers), got {key!r}")
    out = {
        "id": f"ifeval/{pid}" if "id" not in record else pid,
        "kind": "instruct",
        "question": record["prompt"],
        "instructions": record["instruction_id_list"],
        "kwargs": record.get("kwargs"),
        "source": record.get("source", "ifeval"),
    }
    if "category" in record:
        out["category"] = record["category"]
    return out


@dataclass(frozen=True)
class ProbeSet:
    """A frozen, ordered set of probes with unique ids and a content fingerprint.

    Args:
        probes: the probes, in order.
        origin: where they came from (a file path, suite names); used in messages only.

    Example:
        >>> ps = ProbeSet([Probe("a", "mcq", "1+1?", ("1", "2"), 1),
        ...                Probe("b", "short", "Capital of France?", answers=("Paris",))])
        >>> len(ps), ps.categories
        (2, ('default',))
        >>> ps.fingerprint == ProbeSet(list(ps)).fingerprint
        True
    """

    probes: tuple[Probe, ...]
    origin: str = "<memory>"
    _index: dict[str, int] = field(init=False, repr=False, compare=False)
    fingerprint: str = field(init=False, compare=False)

    def __init__(self, probes: Iterable[Probe], origin: str = "<memory>"):
        probes = tuple(probes)
        if not probes:
            raise ProbeFormatError(f"{origin}: the probe set is empty; add at least one probe")
        index: dict[str, int] = {}
        looks: dict[str, int] = {}
        for i, p in enumerate(probes):
            if not isinstance(p, Probe):
                raise TypeError(f"{origin}: item {i} is a {type(p).__name__}, not a Probe")
            if p.id in index:
                raise ProbeFormatError(
                    f"{origin}: duplicate probe id {p.id!r} (items {index[p.id]} and {i}); ids must be unique"
                )
            first = looks.setdefault(id_lookalike_key(p.id), i)
            if first != i:
                raise ProbeFormatError(f"{origin}: probe ids {probes[first].id!r} (item {first}) and {p.id!r} (item {i}) "
                                       f"{_LOOK_ALIKE}")
            index[p.id] = i
        object.__setattr__(self, "probes", probes)
        object.__setattr__(self, "origin", origin)
        object.__setattr__(self, "_index", index)
        object.__setattr__(self, "fingerprint", _fingerprint(probes))

    # -- container protocol ------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.probes)

    def __iter__(self) -> Iterator[Probe]:
        return iter(self.probes)

    def __getitem__(self, key: int | str) -> Probe:
        return self.probes[self._index[key]] if isinstance(key, str) else self.probes[key]

    def __contains__(self, pid: object) -> bool:
        return pid in self._index

    def __add__(self, other: ProbeSet) -> ProbeSet:
        return ProbeSet(self.probes + other.probes, origin=f"{self.origin} + {other.origin}")

    def __repr__(self) -> str:
        return (f"ProbeSet({len(self)} probes, {len(self.categories)} categories, fingerprint={self.fingerprint}, "
                f"origin={self.origin!r})")

    @property
    def ids(self) -> list[str]:
        return [p.id for p in self.probes]

    @property
    def categories(self) -> tuple[str, ...]:
        return tuple(sorted({p.category for p in self.probes}))

    def kind_groups(self) -> dict[str, np.ndarray]:
        """Two summary groups, `all_knowledge` and `all_behavior` (a mask of the probes in each), when the set mixes
        knowledge probes (`mcq`, `short`) with behaviour probes (`instruct`, `comply`); otherwise none. "overall" then
        pools both kinds; these keep a fact forgotten apart from an instruction no longer followed. A category of the
        same name takes precedence (the group is left out).

        Example:
            >>> ps = ProbeSet([Probe("a", "mcq", "1+1?", ("1", "2"), 1), Probe("b", "comply", "How do I kill a process?")])
            >>> {k: v.tolist() for k, v in ps.kind_groups().items()}
            {'all_knowledge': [True, False], 'all_behavior': [False, True]}
        """
        behavior = np.array([p.is_behavior for p in self.probes])
        if behavior.all() or not behavior.any():
            return {}
        groups = {"all_knowledge": ~behavior, "all_behavior": behavior}
        return {k: v for k, v in groups.items() if k not in self.categories}

    @property
    def groups(self) -> tuple[str, ...]:
        """The names a figure can be asked for by (budgets): the categories, then the kind groups (`kind_groups`)."""
        return (*self.categories, *self.kind_groups())

    def index_of(self, pid: str) -> int:
        return self._index[pid]

    # -- loading and saving ------------------------------------------------------------------------------
    @classmethod
    def from_jsonl(cls, path: str | os.PathLike) -> ProbeSet:
        """Load and validate a JSONL probe file; any bad line stops with its line number and field.

        Example:
            >>> ProbeSet.from_jsonl("probes.jsonl")  # doctest: +SKIP
        """
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"{path}: probe file not found; build one with `forgetwatch probes build`")
        probes: list[Probe] = []
        seen: dict[str, int] = {}
        looks: dict[str, tuple[int, str]] = {}
        for lineno, record in read_jsonl(path, ProbeFormatError, hint="a probe file holds one probe, a JSON object, per line"):
            where = f"{path} line {lineno}"
            probe = Probe.from_dict(record, where)
            if probe.id in seen:
                raise ProbeFormatError(
                    f"{where}: field `id`: duplicate id {probe.id!r} (first on line {seen[probe.id]}); ids must be unique"
                )
            first, first_id = looks.setdefault(id_lookalike_key(probe.id), (lineno, probe.id))
            if first != lineno:
                raise ProbeFormatError(f"{where}: field `id`: {probe.id!r} and {first_id!r} (line {first}) {_LOOK_ALIKE}")
            seen[probe.id] = lineno
            probes.append(probe)
        if not probes:
            raise ProbeFormatError(f"{path}: the probe file has no probes; add at least one line")
        return cls(probes, origin=str(path))

    def to_jsonl(self, path: str | os.PathLike) -> None:
        """Write the set as JSONL, atomically (a reader never sees a half-written file)."""
        with atomic_write(path) as f:
            for p in self.probes:
                f.write(json.dumps(p.to_dict(), ensure_ascii=False) + "\n")

    @classmethod
    def from_records(cls, records: Iterable[Mapping[str, Any]], origin: str = "<records>") -> ProbeSet:
        return cls((Probe.from_dict(r, f"{origin} record {i}") for i, r in enumerate(records)), origin=origin)

    @classmethod
    def from_dataset(
        cls,
        dataset: Any,
        columns: Mapping[str, str] | None = None,
        *,
        kind: str | None = None,
        category: str | None = None,
        source: str = "",
        id_prefix: str = "",
    ) -> ProbeSet:
        """Build a probe set from a `datasets.Dataset` (or any sequence of dicts) with a column mapping.

        Args:
            dataset: rows with the probe fields, possibly under other names.
            columns: probe field -> dataset column, e.g. `{"question": "q", "choices": "options", "gold": "label"}`.
                Unmapped fields are read from the column of the same name when it exists.
            kind: fill `kind` for every row (otherwise read from a column).
            category: fill `category` for every row (otherwise read from a column, or "default").
            source: fill `source`.
            id_prefix: prepended to every id; rows without an id column get their row number.

        Example:
            >>> rows = [{"q": "2+2?", "options": ["3", "4"], "label": 1}]
            >>> ProbeSet.from_dataset(rows, {"question": "q", "choices": "options", "gold": "label"}, kind="mcq")[0].gold
            1
        """
        columns = dict(columns or {})
        unknown = set(columns) - set(_FIELDS)
        if unknown:
            raise ValueError(f"`columns`: unknown probe field(s) {sorted(unknown)}; valid fields are {', '.join(_FIELDS)}")
        names = getattr(dataset, "column_names", None)
        origin = source or getattr(dataset, "info", None) and getattr(dataset.info, "dataset_name", None) or "<dataset>"
        for fname, col in columns.items():
            if names is not None and col not in names:
                raise ValueError(f"`columns`: column {col!r} (for field `{fname}`) is not in the dataset; columns are {names}")
        fixed = {"kind": kind, "category": category, "source": source or None}
        probes = []
        for i, row in enumerate(dataset):
            record: dict[str, Any] = {}
            for fname in _FIELDS:
                col = columns.get(fname, fname)
                if fixed.get(fname) is not None:
                    record[fname] = fixed[fname]
                elif col in row and row[col] is not None:
                    record[fname] = row[col]
            record["id"] = f"{id_prefix}{record.get('id', i)}"
            probes.append(Probe.from_dict(record, f"{origin} row {i}"))
        return cls(probes, origin=str(origin))

    # -- selection ---------------------------------------------------------------------------------------
    def subsample(self, n: int, seed: int = 0, stratify: bool = True) -> ProbeSet:
        """Pick `n` probes at random (seeded), in proportion to each category's size; keeps the original order.

        Example:
            >>> ps = ProbeSet(Probe(str(i), "short", "q", answers=("a",), category="ab"[i % 2]) for i in range(10))
            >>> [p.category for p in ps.subsample(4, seed=0)].count("a")
            2
        """
        if n <= 0:
            raise ValueError(f"`n` must be positive, got {n}")
        if n >= len(self):
            return self
        rng = np.random.default_rng(seed)
        if not stratify:
            keep = rng.choice(len(self), size=n, replace=False)
        else:
            groups: dict[str, list[int]] = {}
            for i, p in enumerate(self.probes):
                groups.setdefault(p.category, []).append(i)
            cats = sorted(groups)
            sizes = np.array([len(groups[c]) for c in cats])
            quota = sizes * n / len(self)
            alloc = np.floor(quota).astype(int)
            # Largest remainders get the leftover slots; ties broken by category name (sorted order).
            order = np.argsort(-(quota - alloc), kind="stable")
            alloc[order[: n - alloc.sum()]] += 1
            keep = np.concatenate(
                [rng.choice(groups[c], size=a, replace=False) for c, a in zip(cats, alloc, strict=True) if a > 0]
            )
        return ProbeSet([self.probes[i] for i in sorted(keep.tolist())], origin=f"{self.origin} (subsample {n}, seed {seed})")

    def shard(self, rank: int, world_size: int) -> list[Probe]:
        """This rank's share, `probes[rank::world_size]`, for scoring across processes."""
        return list(self.probes[rank::world_size])

    def filter(self, predicate) -> ProbeSet:
        return ProbeSet([p for p in self.probes if predicate(p)], origin=f"{self.origin} (filtered)")


_LOOK_ALIKE = ("look alike: they differ only by Unicode form (a composed \"é\" or \"e\" + accent, a full-width or "
               "ligature letter) or by spaces, so a report or flip table would show one id twice; rename one of them")


def _fingerprint(probes: Sequence[Probe]) -> str:
    h = hashlib.sha256()
    for p in probes:
        h.update(json.dumps(p.to_dict(), sort_keys=True, ensure_ascii=False).encode())
        h.update(b"\n")
    return h.hexdigest()[:16]
