"""Verifiable instructions (the IFEval idea): constraints a program checks on an answer, no judge model.

The checkers are IFEval's own, from the maintained `if-verifiable` package (Apache-2.0; Google's IFEval registry
and AllenAI's IFBench), not rules of our own. This module validates a probe's instruction ids and arguments before
anything is scored, and gives each answer IFEval's verdicts:

- strict: the answer as generated follows the instruction;
- loose: some variant of it does (first or last line removed, Markdown asterisks removed), IFEval's "loose" score.

A probe is right when every instruction is followed strictly (IFEval's prompt-level strict accuracy); the loose
verdicts and each instruction's results are kept in the record beside it.

Nothing downloads at run time. Two of IFEval's 25 ids need nltk's punkt data, which no registry package installs,
so they are refused with that reason (`UNAVAILABLE`). `language:response_language` uses `langdetect`, seeded here so
that the same answer always gets the same verdict.

Example:
    >>> verdict = check_instructions("hello world", ["change_case:english_lowercase"], [{}])  # doctest: +SKIP
    >>> verdict.strict, verdict.loose  # doctest: +SKIP
    (True, True)
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from ..errors import InstructionFormatError

__all__ = ["InstructionFormatError", "Verdict", "UNAVAILABLE", "instruction_ids", "instruction_group",
           "describe_instruction", "validate_instructions", "check_instructions"]

# Instruction ids of IFEval whose checkers need nltk's punkt tokenizer: nltk downloads it at run time, and no
# registry package ships it, so they are left out rather than switched off in silence.
UNAVAILABLE = {
    "length_constraints:number_sentences": "its checker counts sentences with nltk's punkt tokenizer, a run-time download",
    "change_case:capital_word_frequency": "its checker splits words with nltk's punkt tokenizer, a run-time download",
}


# The type each IFEval argument takes (IFEval's checkers do not check them: `end_phrase: 5` would make every check
# raise, `keywords: "cat"` would be read letter by letter); the others are strings.
_LIST_ARGS = frozenset({"keywords", "forbidden_words"})
_INT_ARGS = frozenset({"capital_frequency", "frequency", "let_frequency", "nth_paragraph", "num_bullets", "num_highlights",
                       "num_paragraphs", "num_placeholders", "num_sections", "num_sentences", "num_words"})


def _type_problem(key: str, value: Any) -> str | None:
    if key in _LIST_ARGS:
        ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
        return None if ok else f"{key!r} must be a list of strings, got {value!r}"
    if key in _INT_ARGS:
        ok = isinstance(value, int) and not isinstance(value, bool)
        return None if ok else f"{key!r} must be a whole number, got {value!r}"
    return None if isinstance(value, str) else f"{key!r} must be a string, got {value!r}"


class _Missing(ImportError):
    pass


@cache
def _registry() -> dict[str, Any]:
    try:
        from if_verifiable.ifeval.instructions_registry import INSTRUCTION_DICT
    except ImportError as e:  # pragma: no cover - the dev and behavior extras install it
        raise _Missing(
            "instruction probes need the `if-verifiable` package (IFEval's checkers): "
            "pip install 'forgetwatch[behavior]'") from e
    import langdetect

    # langdetect samples: without a seed the same answer can be given another language from one call to the next
    langdetect.DetectorFactory.seed = 0
    return dict(INSTRUCTION_DICT)


def instruction_ids() -> list[str]:
    """The instruction ids that can be checked here: IFEval's, less `UNAVAILABLE`.

    Example:
        >>> "detectable_format:json_format" in instruction_ids()  # doctest: +SKIP
        True
    """
    return sorted(i for i in _registry() if i not in UNAVAILABLE)


def _arg_keys(instruction_id: str) -> list[str]:
    return list(_registry()[instruction_id](instruction_id).get_instruction_args_keys())


def validate_instructions(ids: Any, kwargs: Any, where: str) -> tuple[tuple[str, ...], tuple[dict[str, Any], ...]]:
    """Check a probe's `instructions` and `kwargs` and return them as tuples; errors name `where` and the field.

    Every argument a checker takes must be given: without one, IFEval's checker picks a random value, and a probe
    whose check changes between evaluations would flip by chance. `prompt_to_repeat` is the exception only in that
    IFEval's data always gives it.
    """
    def fail(field_name: str, problem: str) -> InstructionFormatError:
        return InstructionFormatError(f"{where}: field `{field_name}`: {problem}")

    if not isinstance(ids, (list, tuple)) or not ids or not all(isinstance(i, str) for i in ids):
        raise fail("instructions", f"must be a non-empty list of instruction ids, got {ids!r}")
    registry = _registry()
    for i in ids:
        if i in UNAVAILABLE:
            raise fail("instructions", f"{i!r} cannot be checked offline: {UNAVAILABLE[i]}. Remove it from the probe")
        if i not in registry:
            close = difflib.get_close_matches(i, list(registry), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise fail("instructions", f"unknown instruction id {i!r}.{hint} Valid ids: {', '.join(instruction_ids())}")
    if len(set(ids)) != len(ids):
        raise fail("instructions", f"an instruction is listed twice in {list(ids)}")
    if kwargs is None:
        kwargs = [{}] * len(ids)
    if not isinstance(kwargs, (list, tuple)) or len(kwargs) != len(ids):
        raise fail("kwargs", f"must be a list of one object per instruction ({len(ids)}), got {kwargs!r}")
    out = []
    for n, (i, kw) in enumerate(zip(ids, kwargs, strict=True)):
        if not isinstance(kw, Mapping):
            raise fail("kwargs", f"item {n} (for {i!r}) must be an object, got {kw!r}")
        # IFEval's HF export fills every argument of every instruction, null where unused
        kw = {k: v for k, v in kw.items() if v is not None}
        keys = _arg_keys(i)
        unknown = sorted(set(kw) - set(keys))
        if unknown:
            raise fail("kwargs", f"item {n} (for {i!r}): unknown argument {unknown[0]!r}; {i!r} takes "
                                 f"{', '.join(keys) or 'no arguments'}")
        for k, v in kw.items():
            problem = _type_problem(k, v)
            if problem:
                raise fail("kwargs", f"item {n} (for {i!r}): {problem}")
        missing = [k for k in keys if k not in kw]
        if missing:
            raise fail("kwargs", f"item {n} (for {i!r}): missing {', '.join(map(repr, missing))} (without it IFEval's "
                                 "checker picks a random value, so the check would change between evaluations)")
        try:
            _registry()[i](i).build_description(**kw)
        except (ValueError, TypeError, KeyError) as e:
            raise fail("kwargs", f"item {n} (for {i!r}): {kw!r} is refused by the checker: {e}") from None
        out.append(_plain(kw))
    return tuple(ids), tuple(out)


def describe_instruction(instruction_id: str, kwargs: Mapping[str, Any]) -> str:
    """The instruction as IFEval's checker words it, e.g. "Answer with less than 50 words."."""
    return _registry()[instruction_id](instruction_id).build_description(**kwargs)


def _plain(kw: Mapping[str, Any]) -> dict[str, Any]:
    # JSON round trip: the probe set's fingerprint hashes to_dict(), which must read the same after saving
    return json.loads(json.dumps(dict(kw), ensure_ascii=False))


@dataclass(frozen=True)
class Verdict:
    """IFEval's verdicts on one answer: per instruction (strict, loose) and for the whole prompt."""

    instructions: tuple[str, ...]
    strict_each: tuple[bool, ...]
    loose_each: tuple[bool, ...]

    @property
    def strict(self) -> bool:
        return all(self.strict_each)

    @property
    def loose(self) -> bool:
        return all(self.loose_each)

    def to_json(self) -> str:
        return json.dumps(
            {
                "strict": self.strict,
                "loose": self.loose,
                "each": {i: [s, lo] for i, s, lo in zip(self.instructions, self.strict_each, self.loose_each, strict=True)},
            }
        )


def check_instructions(answer: str, ids: Sequence[str], kwargs: Sequence[Mapping[str, Any]], prompt: str = "") -> Verdict:
    """IFEval's strict and loose verdicts on `answer` for each instruction (ids and kwargs already validated).

    Example:
        >>> check_instructions("A, b", ["punctuation:no_comma"], [{}]).strict  # doctest: +SKIP
        False
    """
    from if_verifiable.common import get_loose_transformations

    registry = _registry()
    variants = get_loose_transformations(answer)
    strict, loose = [], []
    for i, kw in zip(ids, kwargs, strict=True):
        checker = registry[i](i)
        checker.build_description(**kw)
        if "prompt" in (checker.get_instruction_args() or {}):
            checker.build_description(prompt=prompt)
        strict.append(bool(answer.strip()) and _follows(checker, answer))
        loose.append(any(v.strip() and _follows(checker, v) for v in variants))
    return Verdict(tuple(ids), tuple(strict), tuple(loose))


def _follows(checker: Any, text: str) -> bool:
    try:
        return bool(checker.check_following(text))
    except Exception:  # a checker that cannot read an answer (e.g. langdetect on digits only) counts it as not followed
        return False


def instruction_group(instruction_id: str) -> str:
    """The group of an instruction id: "change_case" for "change_case:english_lowercase"."""
    return instruction_id.split(":", 1)[0]

