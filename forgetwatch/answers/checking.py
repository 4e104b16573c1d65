r"""Answer checking: is an extracted answer right? Numbers and math by `math-verify` (Hugging Face's answer verifier, as
in TRL's and open-r1's rewards), other short answers by their normal form (`forgetwatch.answers.extraction`).

Example:
    >>> is_correct_short("Sunset Blvd.", ["Sunset Boulevard", "Sunset Blvd"]), is_correct_short("$18.00", "18", numeric=True)
    (True, True)
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
from collections.abc import Sequence
from functools import cache
from typing import Any

from ..options import SHORT_MATCHES
from .extraction import TRAILING_CLAUSE, extract_final_answer, normalize_answer

__all__ = ["MATCH_MODES", "parse_math_answer", "parse_gold", "is_correct_short"]

MATCH_MODES = SHORT_MATCHES  # declared with the option (forgetwatch.options)


# -- numbers and math with math-verify ------------------------------------------------------------------------

_PLUS = re.compile(r"(?<![\w.])\+(?=\.?\d)")


def _math_timeout() -> int | None:
    # math-verify's timeouts use SIGALRM, which only the main thread may set; elsewhere run without one.
    return 5 if threading.current_thread() is threading.main_thread() else None


def parse_math_answer(answer: str) -> list[Any]:
    r"""The number or expression in an extracted answer, parsed by `math-verify`; `[]` when there is none.

    math-verify (Hugging Face's answer verifier, used by TRL and open-r1 rewards) reads plain numbers ("1,234",
    "$18.00", "-3.5", "50%"), fractions and LaTeX ("3/4", "rac{3}{4}", "oxed{7}") and units ("18 dollars").
    A trailing clause is dropped first, because math-verify takes the last number it finds: "18 dollars (2 x 9)"
    is 18, not 9.

    Example:
        >>> parse_math_answer("18 dollars (2 x 9)")[1], parse_math_answer("−5")[1], parse_math_answer("Paris")
        ('18', '-5', [])
    """
    from math_verify import parse

    text = _PLUS.sub("", answer.replace("\u2212", "-"))  # "+7" is 7; U+2212 is a minus math-verify does not know
    head = TRAILING_CLAUSE.split(text, maxsplit=1)[0]
    with _quiet_math_verify():
        for candidate in dict.fromkeys((head, text)):
            parsed = parse(candidate, parsing_timeout=_math_timeout())
            if parsed:
                return parsed
    return []


@cache
def parse_gold(gold: str) -> tuple[Any, ...]:
    # A gold may be a full GSM8K solution ("... #### 72"): its final answer, else the whole text.
    return tuple(parse_math_answer(extract_final_answer(gold) or gold))


def _verify(gold: Sequence[Any], value: Sequence[Any]) -> bool:
    from math_verify import verify

    with _quiet_math_verify():
        return bool(verify(list(gold), list(value), timeout_seconds=_math_timeout()))


@contextlib.contextmanager
def _quiet_math_verify():
    # Without a timeout (off the main thread) math-verify warns on every call; that is expected here.
    log = logging.getLogger("math_verify")
    level = log.level
    if _math_timeout() is None:
        log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


# -- checking ----------------------------------------------------------------------------------------------


def is_correct_short(
    prediction: str | None, answers: Sequence[str] | str, numeric: bool = False, match: str = "exact"
) -> bool:
    """Whether an extracted short answer is correct.

    Numeric probes compare `extract_number` of the prediction with that of each gold answer, equal within a
    relative 1e-6 ("$1,234.00" == "1234"). Other probes compare `normalize_answer` forms:

    - `match="exact"` (default): the normalised prediction equals a normalised alias. This is the honest
      metric: "Paris, the capital of France" does not count for "Paris".
    - `match="contains"`: a normalised alias appears in the normalised prediction as whole words ("Paris,
      of course" counts for "Paris", "Parisian" does not). More lenient: it also credits a prediction that
      lists several candidates, so use it only when generations are known to be wordy.

    Args:
        prediction: the extracted answer; `None` (invalid) is never correct.
        answers: the accepted answers (aliases); a single string is one alias.
        numeric: compare as numbers.
        match: "exact" or "contains"; ignored when `numeric`.

    Returns:
        `True` when the prediction matches any alias.

    Example:
        >>> is_correct_short("sunset blvd.", ["Sunset Boulevard", "Sunset Blvd"])
        True
        >>> said = "It is Paris, I think"
        >>> is_correct_short(said, ["Paris"]), is_correct_short(said, ["Paris"], match="contains")
        (False, True)
        >>> is_correct_short("$1,234.00", ["1234"], numeric=True)
        True
    """
    if match not in MATCH_MODES:
        raise ValueError(f"`match` must be one of {', '.join(map(repr, MATCH_MODES))}, got {match!r}")
    if isinstance(answers, str):
        answers = [answers]
    if not answers:
        raise ValueError("`answers` is empty; give at least one accepted answer")
    if prediction is None:
        return False
    if numeric:
        golds = [g for g in (parse_gold(str(a)) for a in answers) if g]
        if not golds:
            raise ValueError(f"`answers` {list(answers)!r} has no number, but `numeric` is true")
        value = parse_math_answer(prediction)
        return bool(value) and any(_verify(g, value) for g in golds)
    pred = normalize_answer(prediction)
    if not pred:
        return False  # an answer of only punctuation/articles matches nothing, not an alias like "The"
    aliases = [a for a in (normalize_answer(str(a)) for a in answers) if a]
    if match == "exact":
        return pred in aliases
    # Pad with spaces so the test is on whole words: " paris " is in " it is paris i think ".
    return any(f" {a} " in f" {pred} " for a in aliases)
