r"""Answer extraction: a generated text turned into the answer it gives, or `None` when there is none to read.

`extract_letter` (multiple choice), `extract_final_answer` (a worked solution's last line), `extract_short_answer`
(a short answer out of a sentence), `extract_number`; `normalize_answer`, the SQuAD / TriviaQA normal form that
checking compares. Kept apart from checking (`forgetwatch.answers.checking`) so that an answer the model did not give
is counted apart from a wrong one, as nanochat's `tasks/gsm8k.py` and lm-evaluation-harness's `filter_list` do.

Plain Python and `re`: testable in milliseconds.

Example:
    >>> extract_letter("The answer is (B).", 4), extract_number("It costs $1,234.50."), normalize_answer("The U.S.")
    (1, 1234.5, 'us')
"""

from __future__ import annotations

import operator
import re
import string
import unicodedata
from functools import cache

__all__ = ["LETTERS", "extract_letter", "extract_final_answer", "extract_short_answer", "normalize_answer",
           "extract_number", "is_punct"]

LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


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
TRAILING_CLAUSE = re.compile(
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
    line = TRAILING_CLAUSE.split(line, maxsplit=1)[0]
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


def is_punct(ch: str) -> bool:
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
    s = "".join(" " if ch != "." and is_punct(ch) else ch for ch in s)
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
