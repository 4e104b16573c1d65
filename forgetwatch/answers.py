r"""Answer extraction and answer checking, kept apart.

Scoring a generation takes two steps, as in nanochat's `tasks/gsm8k.py` and lm-evaluation-harness's
`filter_list` / `metric_list`:

1. **Extraction** turns the generated text into a parsed answer, or `None` when the model gave no answer
   we can read (invalid). `extract_letter`, `extract_final_answer`, `extract_short_answer`, `extract_number`.
2. **Checking** compares a parsed answer with the gold answer(s). `is_correct_short`.

Keeping them apart lets a caller count invalid answers separately from wrong ones (a model that forgets the
answer format is not the same as a model that forgets the answer), and lets the same checkers serve as GRPO
rewards with TRL's signature (`short_answer_reward`, `mcq_reward`).

Plain Python and `re` only: everything here is testable in milliseconds.
"""

from __future__ import annotations

import contextlib
import logging
import operator
import re
import string
import threading
import unicodedata
from collections.abc import Callable, Sequence
from functools import cache
from typing import Any

from .options import SHORT_MATCHES

__all__ = [
    "LETTERS",
    "MATCH_MODES",
    "extract_letter",
    "extract_final_answer",
    "extract_short_answer",
    "normalize_answer",
    "extract_number",
    "parse_math_answer",
    "is_correct_short",
    "short_answer_reward",
    "mcq_reward",
    "probe_reward",
]

LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
MATCH_MODES = SHORT_MATCHES  # declared with the option (forgetwatch.options)


# -- multiple choice ---------------------------------------------------------------------------------------


@cache
def _letter_patterns(num_choices: int) -> tuple[re.Pattern[str], re.Pattern[str], re.Pattern[str]]:
    # The letter class is built per k so that out-of-range letters never match: with 4 choices, "E" is not
    # an answer, it is noise. Only the word "answer" is case-insensitive; the letter must be uppercase,
    # because "the answer is a bit unclear" and "a cat" are prose, not option A.
    letter = f"[A-{LETTERS[num_choices - 1]}]"
    answer_line = re.compile(
        r"\b(?i:answer)\b"
        # "answer is", "answer would be"; separators may carry Markdown ("**Answer:** C", "Answer: **C**")
        # but not a newline: an answer line is one line, so "The answer\nA cat ..." is not option A.
        r"(?:[ \t*_]+(?i:is|was|would[ \t]+be|should[ \t]+be)\b)?"
        r"[ \t:*_=\-]*"
        r"(?:(?i:option|choice)[ \t]+)?"
        rf"[(\[]?({letter})"
        r"(?![A-Za-z0-9])"  # "Answer: Canada" is not option C
    )
    boxed = re.compile(rf"\\boxed\{{[ \t]*\(?({letter})\)?[ \t]*\}}")
    # A bare letter at the start counts only when something marks it as a label: ")", "]", ".", ":",
    # or nothing else on the line. A letter followed by a space is prose ("A cat is ...", "I think ...").
    leading = re.compile(rf"\s*(?:\*\*)?[(\[]?({letter})(?:\*\*)?(?:[)\].:]|[ \t]*(?:\n|$))")
    return answer_line, boxed, leading


def extract_letter(text: str, num_choices: int) -> int | None:
    r"""The option a generation chose in a multiple-choice question, as an index, or `None` if it chose none.

    Two places are looked at, in this order:

    1. A final-answer line: "Answer: C", "answer is (C)", "**Answer:** C", "The correct answer is C.",
       "Answer: option C", or "\boxed{C}". The word "answer" may have any case; the letter must be an
       uppercase letter among the first `num_choices`. When there are several, the last one wins (models
       often reason through options before concluding). Answer lines whose letter is out of range are ignored.
    2. Otherwise, a letter at the very start of the text marked as a label: "C", "C.", "(C)", "C) Paris",
       " C: Paris". A letter followed by a space ("A cat is ...") is prose and does not count.

    Lowercase letters are never accepted, even after "answer:", since "the answer is a ..." is ordinary
    English far more often than a choice.

    Args:
        text: the generated text.
        num_choices: how many options the question has (k, at most 26); letters beyond the k-th are invalid.

    Returns:
        The 0-based index of the chosen option, or `None` when no valid choice can be read.

    Example:
        >>> extract_letter("Let's compare A and B. **Answer:** (C)", num_choices=4)
        2
        >>> extract_letter("B) Paris", num_choices=4), extract_letter("A cat is an animal.", num_choices=4)
        (1, None)
        >>> extract_letter("E", num_choices=4) is None
        True
    """
    if isinstance(num_choices, bool) or not isinstance(num_choices, int) or not 1 <= num_choices <= len(LETTERS):
        raise ValueError(f"`num_choices` must be an integer from 1 to {len(LETTERS)}, got {num_choices!r}")
    answer_line, boxed, leading = _letter_patterns(num_choices)
    text = unicodedata.normalize("NFKC", text)  # full-width "Ｃ" -> "C"
    found = [(m.start(), m.group(1)) for m in answer_line.finditer(text)]
    found += [(m.start(), m.group(1)) for m in boxed.finditer(text)]
    if found:
        return LETTERS.index(max(found)[1])
    m = leading.match(text)
    return LETTERS.index(m.group(1)) if m else None


# -- short answers -----------------------------------------------------------------------------------------

# "Answer: X" (any case, Markdown around the colon allowed) and "the answer is X". The content is the rest of
# the line; after a bare "Answer:" it is the next non-empty line. Wrapped in a lookahead so that matches may
# overlap: in "the answer is 5. No, the answer is 6." the second one must be found too.
_ANSWER_LINE = re.compile(r"(?=\b(?i:answer)\b(?:[ \t*_]+(?i:is)\b|[ \t*_]*:)[ \t:*_]*(?:\n\s*)?([^\n]+))")
# GSM8K's "#### 72". Only when a number follows, so Markdown headings ("#### Step 2", "#### 1. Setup") are not
# taken for answers.
_HASHES = re.compile(r"####[ \t]*((?:[-+$]|\\\$)*\d(?![\d,]*\.[ \t]+[A-Za-z])[^\n]*)")
_BOXED = re.compile(r"\\boxed[ \t]*\{")


def _boxed_contents(text: str) -> list[tuple[int, str]]:
    # Braces nest ("\boxed{\frac{3}{4}}"), which a regex cannot follow; count them instead.
    out = []
    for m in _BOXED.finditer(text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            out.append((m.start(), text[m.end() : i - 1]))
    return out


def _clean_answer(s: str) -> str:
    # Markdown emphasis and TeX math delimiters wrap answers ("**Paris**", "$18$"); a sentence-final period
    # ends "The answer is Paris." but is not part of the answer.
    s = s.strip().strip("*_").strip()
    if len(s) >= 2 and s[0] == s[-1] == "$" and s.count("$") == 2:
        s = s[1:-1].strip()
    if s.endswith(".") and not s.endswith(".."):
        s = s[:-1].rstrip()
    return s


def extract_final_answer(text: str) -> str | None:
    r"""The final answer of a chain-of-thought generation, or `None` if it never states one.

    Recognised forms: an "Answer: X" line (also "Final answer: X", "**Answer:** X"), "the answer is X",
    GSM8K's "#### X" (only when X starts with a number, so Markdown headings don't count) and "\boxed{X}"
    (nested braces allowed). When several appear, the last one in the text wins. The content runs to the end
    of the line; surrounding `**`, a `$...$` pair and one sentence-final period are removed.

    Args:
        text: the generated text.

    Returns:
        The answer text, or `None`.

    Example:
        >>> extract_final_answer("Paris is in France.\nAnswer: Paris.")
        'Paris'
        >>> extract_final_answer(r"So x = 3/4, and the answer is $\boxed{\frac{3}{4}}$.")
        '\\frac{3}{4}'
        >>> extract_final_answer("I am not sure.") is None
        True
    """
    found = [(m.start(), m.group(1)) for m in _ANSWER_LINE.finditer(text)]
    found += [(m.start(), m.group(1)) for m in _HASHES.finditer(text)]
    found += _boxed_contents(text)
    # Later beats earlier; at the same line, a \boxed{} inside an "Answer:" line starts later and so wins,
    # which strips the TeX wrapper.
    for _, content in sorted(found, key=operator.itemgetter(0), reverse=True):
        content = _clean_answer(content)
        if content:
            return content
    return None


# A label the model (or a few-shot prompt it echoes) puts before its answer: "Answer:", "**Final answer:**", "A:".
_LABEL = re.compile(r"^(?:(?:\*\*|__)?(?:(?i:(?:final|short)[ \t]+)?(?i:answer)|A)(?:\*\*|__)?[ \t]*:(?:\*\*|__)?[ \t]*)+")
# An instruct model's lead-in before a bare answer: "The answer is", "So the correct answer would be:".
_LEAD_IN = re.compile(
    r"^(?i:(?:so|thus|therefore)?,?[ \t]*(?:the[ \t]+)?(?:correct[ \t]+|final[ \t]+|short[ \t]+)?answer"
    r"[ \t]+(?:is|was|would[ \t]+be|should[ \t]+be|will[ \t]+be)\b)[ \t:]*"
)
# A clause that explains the answer rather than being it: "Rome, which is ...", "Rome (the capital)", "Rome because".
_TRAILING_CLAUSE = re.compile(
    r",[ \t]+(?i:which|who|whose|where|when|that|because|since|as|although|though|but|so)\b"
    r"|[ \t]+(?i:because|since|which[ \t]+(?:is|was)|who[ \t]+(?:is|was))\b"
    r"|[ \t]+\("
)
# The end of a first sentence: ". " before a capital, after a lowercase word of 3+ letters or a digit, so that
# abbreviations ("St. Louis", "U.S. Army", "Dr. No") are not cut.
_SENTENCE_END = re.compile(r"(?:(?<=[a-z]{3})|(?<=\d))[.!?]+[ \t]+(?=[A-Z\"'\u201c(])")
_QUOTES = {'"': '"', "'": "'", "\u201c": "\u201d", "\u2018": "\u2019", "\u00ab": "\u00bb", "`": "`"}


def _strip_wrappers(s: str) -> str:
    # Markdown emphasis and quotes around the whole answer: **"Paris"**, “Paris”, `72`.
    while True:
        t = s.strip().strip("*_").strip()
        if len(t) >= 2 and _QUOTES.get(t[0]) == t[-1]:
            t = t[1:-1].strip()
        if t == s:
            return s
        s = t


def _bare_answer(line: str) -> str:
    """The answer in one line of a direct (non-CoT) reply: labels, lead-ins, quotes and trailing clauses dropped."""
    line = _LABEL.sub("", line.strip())
    line = _LEAD_IN.sub("", line).strip()
    line = _LABEL.sub("", line)  # "The answer is: Answer: X" happens
    line = _SENTENCE_END.split(line, maxsplit=1)[0]
    line = _TRAILING_CLAUSE.split(line, maxsplit=1)[0]
    return _clean_answer(_strip_wrappers(line))


def extract_short_answer(text: str, cot: bool = False) -> str | None:
    """The answer in a short-answer generation, or `None` if there is none.

    Without chain of thought the model is expected to answer straight away, so the answer is read from the first
    non-empty line (anything after it is the model rambling on). Instruct models wrap it in a sentence, so these
    are dropped: a leading label ("Answer:", "A:"), a lead-in ("The answer is"), quotes and Markdown emphasis
    around it, a second sentence ("Rome. It is the capital."), a trailing clause ("Rome, which ...",
    "Rome (the capital)", "Rome because ...") and a final period. A whole sentence such as "The capital of Italy
    is Rome." is kept as it is: only `match="contains"` (or `short_mode="greedy_match"`) can credit it.
    With `cot=True` the answer is `extract_final_answer(text)`.

    Args:
        text: the generated text.
        cot: whether the generation reasons first and states its answer at the end.

    Returns:
        The answer text, stripped, or `None`.

    Example:
        >>> extract_short_answer("\\n  Sunset Boulevard \\nQuestion: who wrote it?")
        'Sunset Boulevard'
        >>> extract_short_answer('The answer is "Rome", which is the capital of Italy.')
        'Rome'
        >>> extract_short_answer("It opened in 1993.\\nAnswer: Sunset Boulevard", cot=True)
        'Sunset Boulevard'
    """
    if cot:
        return extract_final_answer(text)
    for line in text.splitlines():
        answer = _bare_answer(line)
        if answer:
            return answer
    return None


_APOSTROPHES = "'\u2018\u2019`\u00b4"
_DIGIT_COMMA = re.compile(r"(?<=\d),(?=\d)")
_NON_DECIMAL_DOT = re.compile(r"\.(?!\d)")  # every period but a decimal point (".5" and "3.5" keep theirs)
_ARTICLES = re.compile(r"\b(?:a|an|the)\b")
# "-5", "(-5)", "x = -0.5": a minus (ASCII or U+2212) that starts a number, not a hyphen inside "1-2" or "Jean-5".
_MINUS = re.compile(r"(?<![\w.])[-\u2212](?=\.?\d)")
_MINUS_KEEP = "\ue000"


def _is_punct(ch: str) -> bool:
    return ch in string.punctuation or unicodedata.category(ch).startswith("P")


def normalize_answer(s: str) -> str:
    """Normalise an answer for comparison, as in SQuAD / TriviaQA evaluation.

    Steps: Unicode NFKC, lowercase, drop apostrophes ("Smith's" -> "smiths") and periods ("U.S." -> "us")
    except decimal points ("3.5" stays), drop thousands commas ("1,234" -> "1234"), turn all other
    punctuation into spaces ("Sunset-Boulevard" -> "sunset boulevard") except a minus sign before a number
    ("-5" stays "-5", so it never equals "5"), remove the articles a/an/the, and collapse whitespace.

    This is TriviaQA's rule (punctuation becomes a space) with SQuAD's deletion for the marks that sit inside
    words and numbers, so both "US" / "U.S." and "Sunset Boulevard" / "Sunset-Boulevard" compare equal.

    Args:
        s: the answer text.

    Returns:
        The normalised text (possibly empty).

    Example:
        >>> normalize_answer("  The Sunset-Boulevard! ")
        'sunset boulevard'
        >>> normalize_answer("U.S. population: 1,234.5")
        'us population 1234.5'
        >>> normalize_answer("-5 degrees"), normalize_answer("1-2")
        ('-5 degrees', '1 2')
    """
    s = unicodedata.normalize("NFKC", s).lower()
    s = "".join(ch for ch in s if ch not in _APOSTROPHES)
    s = _DIGIT_COMMA.sub("", s)
    s = _NON_DECIMAL_DOT.sub("", s)
    # A minus sign is kept through the punctuation step in a private-use character (not punctuation).
    s = _MINUS.sub(_MINUS_KEEP, s)
    s = "".join(" " if ch != "." and _is_punct(ch) else ch for ch in s)
    s = _ARTICLES.sub(" ", s).replace(_MINUS_KEEP, "-")
    return " ".join(s.split())


# -- numbers -----------------------------------------------------------------------------------------------

_NUMBER = re.compile(
    r"\\d?frac\{\s*([-+]?\d+(?:\.\d+)?)\s*\}\{\s*([-+]?\d+(?:\.\d+)?)\s*\}"  # \frac{3}{4}
    r"|(?<![\w./])"  # not the tail of a word or a number ("x2", "1.5.2", "3/4/2020")
    r"([-+]?(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+))(?!\d)"  # 1,234.5 / 18 / -3.5 / .5
    r"(?:/(\d+(?:\.\d+)?)(?!\d|/|\.\d))?"  # 3/4
    r"(?!/\d)"  # a date's "3/4/2020" is no number at all
)


def _numbers(text: str) -> list[float]:
    out = []
    for m in _NUMBER.finditer(text.replace("\u2212", "-")):  # U+2212 MINUS SIGN, which NFKC keeps
        num, den = (m.group(1), m.group(2)) if m.group(1) is not None else (m.group(3), m.group(4))
        value = float(num.replace(",", ""))
        if den is not None:
            if float(den) == 0:
                continue  # "1/0" is not a number
            value /= float(den)
        out.append(value)
    return out


def extract_number(text: str) -> float | None:
    r"""The numeric answer in a text, or `None` if it has no number.

    When the text states a final answer ("Answer: ...", "the answer is ...", "#### ...", "\boxed{...}", see
    `extract_final_answer`) that contains a number, the first number of that answer is taken ("Answer: 18
    dollars (2 x 9)" -> 18, like GSM8K's own "#### 72" parsing); otherwise the last number in the text.
    Thousands commas ("1,234"), currency ("$18.00"), a sentence-final period ("18."), signs ("-3.5"),
    fractions ("3/4", "\frac{3}{4}") and units ("18 dollars") are handled.

    Args:
        text: the generated text, or a gold answer.

    Returns:
        The number as a float, or `None`.

    Example:
        >>> extract_number("She pays $1,234.50 in total. The answer is 1,234.5.")
        1234.5
        >>> extract_number(r"Hence \boxed{3/4}"), extract_number("4 apples, 7 pears, 11 fruits")
        (0.75, 11.0)
        >>> extract_number("no idea") is None
        True
    """
    final = extract_final_answer(text)
    if final is not None:
        numbers = _numbers(final)
        if numbers:
            return numbers[0]
    numbers = _numbers(text)
    return numbers[-1] if numbers else None


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
    head = _TRAILING_CLAUSE.split(text, maxsplit=1)[0]
    with _quiet_math_verify():
        for candidate in dict.fromkeys((head, text)):
            parsed = parse(candidate, parsing_timeout=_math_timeout())
            if parsed:
                return parsed
    return []


@cache
def _gold_math(gold: str) -> tuple[Any, ...]:
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
        >>> is_correct_short("It is Paris, I think", ["Paris"]), is_correct_short("It is Paris, I think", ["Paris"], match="contains")
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
        golds = [g for g in (_gold_math(str(a)) for a in answers) if g]
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


# -- GRPO rewards (TRL signature) --------------------------------------------------------------------------


def _completion_text(completion: Any) -> str:
    # TRL passes plain strings for standard datasets and a list of messages for conversational ones; the
    # model's answer is the last message. Multimodal messages carry a list of parts; keep the text parts.
    if isinstance(completion, str):
        return completion
    content = completion[-1]["content"] if completion else ""
    if isinstance(content, list):
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content or ""


def _per_example(value: Any, n: int, name: str) -> list[Any]:
    # GRPOTrainer passes every dataset column as a list with one value per completion, so `numeric` or
    # `num_choices` may be a column; called directly, they are usually one scalar for all.
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise ValueError(f"`{name}` has {len(value)} values for {n} completions; give one per completion or a scalar")
        return list(value)
    return [value] * n


def _log(kwargs: dict[str, Any], column: str, values: list, invalid: list[bool]) -> None:
    # Inside GRPOTrainer these hooks put the parsed answers in the completions table and the invalid rate in
    # the logs: a reward of 0 from "wrong answer" and from "no answer" call for different fixes.
    log_extra: Callable[[str, list], None] | None = kwargs.get("log_extra")
    log_metric: Callable[[str, float], None] | None = kwargs.get("log_metric")
    if callable(log_extra):
        log_extra(column, values)
    if callable(log_metric) and invalid:
        log_metric(f"forgetwatch/{column}_invalid", sum(invalid) / len(invalid))


def short_answer_reward(
    completions: Sequence[Any],
    solution: Sequence[str | Sequence[str] | None],
    numeric: bool | Sequence[bool] = False,
    cot: bool | Sequence[bool] = True,
    match: str | Sequence[str] = "exact",
    **kwargs: Any,
) -> list[float | None]:
    """Reward 1.0 for a correct short answer, 0.0 for a wrong or missing one; usable as a TRL GRPO reward.

    The answer is read with `extract_short_answer(text, cot)` and checked with `is_correct_short`.
    `GRPOTrainer` passes every dataset column other than the prompt as a keyword argument holding one value
    per completion, so a `solution` column arrives as `solution=` and a `numeric` column as a list; scalars
    apply to every completion.

    Args:
        completions: the generations, as strings or as conversations (the last message is read).
        solution: per completion, the gold answer or a list of aliases; `None` skips that completion (reward
            `None`, which TRL ignores).
        numeric: compare as numbers; a scalar or one value per completion.
        cot: whether generations reason first and end with a final answer; a scalar or one per completion.
        match: "exact" or "contains" (see `is_correct_short`); a scalar or one per completion.
        **kwargs: other columns and trainer hooks; `log_extra`/`log_metric`, when given, record the parsed
            answers and the invalid rate.

    Returns:
        One reward per completion.

    Example:
        >>> completions = [[{"role": "assistant", "content": "3 + 4 = 7. The answer is 7."}], "Answer: 8"]
        >>> short_answer_reward(completions, solution=["7", "7"], numeric=True)
        [1.0, 0.0]
    """
    n = len(completions)
    if len(solution) != n:
        raise ValueError(f"`solution` has {len(solution)} values for {n} completions; give one per completion")
    rows = zip(
        completions,
        solution,
        _per_example(numeric, n, "numeric"),
        _per_example(cot, n, "cot"),
        _per_example(match, n, "match"),
        strict=True,
    )
    rewards: list[float | None] = []
    parsed: list[str | None] = []
    for completion, gold, is_numeric, is_cot, mode in rows:
        answer = extract_short_answer(_completion_text(completion), cot=bool(is_cot))
        parsed.append(answer)
        if gold is None:
            rewards.append(None)
            continue
        aliases = [str(gold)] if isinstance(gold, (str, int, float)) else [str(a) for a in gold]
        rewards.append(float(is_correct_short(answer, aliases, numeric=bool(is_numeric), match=mode)))
    _log(kwargs, "short_answer", parsed, [p is None for p in parsed])
    return rewards


def _gold_index(gold: Any, k: int) -> int:
    # The gold may be a letter ("C", from a text column) or an index (2, like `Probe.gold`).
    if isinstance(gold, str):
        letter = gold.strip().strip("()[].").upper()
        if len(letter) != 1 or letter not in LETTERS:
            raise ValueError(f"`solution` {gold!r} is not a letter A-Z or an option index")
        index = LETTERS.index(letter)
    elif isinstance(gold, bool):
        raise ValueError(f"`solution` {gold!r} is not a letter A-Z or an option index")
    else:
        index = operator.index(gold)  # accepts numpy integers, rejects floats
    if not 0 <= index < k:
        raise ValueError(f"`solution` {gold!r} is out of range for {k} choices")
    return index


def mcq_reward(
    completions: Sequence[Any],
    solution: Sequence[str | int | None],
    num_choices: int | Sequence[int] | None = None,
    **kwargs: Any,
) -> list[float | None]:
    """Reward 1.0 for choosing the gold option, 0.0 for a wrong or unreadable choice; a TRL GRPO reward.

    The choice is read with `extract_letter`. The number of options k comes from `num_choices` (a scalar or
    one per completion, e.g. a dataset column); without it, from a `choices` column when the dataset has one
    (its length); otherwise any letter A-Z is read, so an out-of-range letter counts as wrong rather than
    invalid (the reward is 0.0 either way).

    Args:
        completions: the generations, as strings or as conversations (the last message is read).
        solution: per completion, the gold option as a letter ("C") or a 0-based index (2); `None` skips that
            completion (reward `None`).
        num_choices: the number of options; a scalar or one per completion.
        **kwargs: other columns (`choices` is used as described) and trainer hooks (`log_extra`/`log_metric`
            record the parsed letters and the invalid rate).

    Returns:
        One reward per completion.

    Example:
        >>> mcq_reward(["Answer: (B)", [{"role": "assistant", "content": "E"}]], solution=["B", 1], num_choices=4)
        [1.0, 0.0]
    """
    n = len(completions)
    if len(solution) != n:
        raise ValueError(f"`solution` has {len(solution)} values for {n} completions; give one per completion")
    choices = kwargs.get("choices")
    if num_choices is None and choices is not None:
        # A `choices` column holds one option list per completion; a single list of strings serves all.
        per_example = not all(isinstance(c, str) for c in choices)
        ks = [len(c) for c in (_per_example(choices, n, "choices") if per_example else [choices] * n)]
    else:
        ks = [len(LETTERS) if k is None else k for k in _per_example(num_choices, n, "num_choices")]
    rewards: list[float | None] = []
    parsed: list[str | None] = []
    for completion, gold, k in zip(completions, solution, ks, strict=True):
        choice = extract_letter(_completion_text(completion), num_choices=k)
        parsed.append(None if choice is None else LETTERS[choice])
        rewards.append(None if gold is None else float(choice == _gold_index(gold, k)))
    _log(kwargs, "mcq", parsed, [p is None for p in parsed])
    return rewards


def probe_reward(completions: Sequence[Any], solution: Sequence[Any], kind: str | Sequence[str] | None = None,
                 **kwargs: Any) -> list[float | None]:
    """A GRPO reward for a dataset that mixes multiple-choice and short-answer rows, such as training data with
    replayed probes (`forgetwatch.replay.mix_replay`): each row is scored by `mcq_reward` when its `kind` column is
    "mcq", by `short_answer_reward` otherwise (the other columns, `numeric`, `cot`, `num_choices`, go along).

    Example:
        >>> probe_reward(["B", "12"], solution=["B", "12"], kind=["mcq", "short"], numeric=[False, True], cot=False)
        [1.0, 1.0]
    """
    n = len(completions)
    kinds = _per_example(kind, n, "kind")
    # each kind logs its invalid rate (over its own rows); the per-completion column log needs every row: left out
    quiet = {k: v for k, v in kwargs.items() if k != "log_extra"}
    rewards: list[float | None] = [None] * n
    for is_mcq, reward in ((True, mcq_reward), (False, short_answer_reward)):
        rows = [i for i in range(n) if (kinds[i] == "mcq") == is_mcq]
        if not rows:
            continue
        # per-completion columns follow their rows; scalars apply to all
        pick = {k: [v[i] for i in rows] if isinstance(v, (list, tuple)) and len(v) == n else v for k, v in quiet.items()}
        if is_mcq:
            pick.pop("numeric", None), pick.pop("cot", None)
        else:
            pick.pop("num_choices", None)
        for i, r in zip(rows, reward([completions[i] for i in rows], [solution[i] for i in rows], **pick), strict=True):
            rewards[i] = r
    return rewards
