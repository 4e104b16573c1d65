"""GRPO rewards with TRL's signature, `(completions, solution, **kwargs) -> list[float | None]`: the same extraction and
checking that score the probes, so a probe set doubles as a reward (`short_answer_reward`, `mcq_reward`,
`probe_reward`).

Example:
    >>> short_answer_reward(["The answer is Paris."], [["Paris"]])
    [1.0]
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

from .checking import is_correct_short
from .extraction import LETTERS, extract_letter, extract_short_answer

__all__ = ["short_answer_reward", "mcq_reward", "probe_reward"]


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
    replayed probes (`forgetwatch.remedies.mix_replay`): each row is scored by `mcq_reward` when its `kind` column is
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
