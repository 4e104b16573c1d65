r"""Answers: how a model's answer is read and judged, kept apart in two steps (nanochat's `tasks/gsm8k.py`,
lm-evaluation-harness's `filter_list` / `metric_list`).

1. **Extraction** (`extraction.py`) turns generated text into a parsed answer, or `None` when the model gave no
   answer we can read (invalid): `extract_letter`, `extract_final_answer`, `extract_short_answer`, `extract_number`.
2. **Checking** (`checking.py`) compares a parsed answer with the gold answer(s): `is_correct_short`.

Keeping them apart lets a caller count invalid answers apart from wrong ones (a model that forgets the answer format
is not a model that forgets the answer), and lets the same checkers serve as GRPO rewards with TRL's signature
(`rewards.py`: `short_answer_reward`, `mcq_reward`, `probe_reward`). IFEval's instruction checks (`instructions.py`)
and the refusal rule (`refusals.py`) judge behaviour probes. Plain Python and `re`.

Example:
    >>> from forgetwatch.answers import extract_short_answer, is_correct_short
    >>> is_correct_short(extract_short_answer("Answer: Rome."), ["Rome"])
    True
"""

from .checking import MATCH_MODES, is_correct_short, parse_math_answer
from .extraction import (
    LETTERS,
    extract_final_answer,
    extract_letter,
    extract_number,
    extract_short_answer,
    normalize_answer,
)
from .rewards import mcq_reward, probe_reward, short_answer_reward

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
