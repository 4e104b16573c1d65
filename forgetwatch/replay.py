"""Replay flagging: the probes a run forgot, with their history, as ready-to-train examples."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .answers import LETTERS
from .metrics import first_forgotten_index, forgetting_events
from .probes import Probe
from .prompts import question_block

__all__ = ["replay_examples"]


def replay_examples(probes: Sequence[Probe], base: np.ndarray, steps: Sequence[int], history: np.ndarray) -> list[dict[str, Any]]:
    """One example per probe that went 1→0 at any evaluation so far.

    Args:
        probes: the probe set, in record order.
        base: the base model's outcomes (1 correct, 0 wrong, -1 invalid).
        steps: the global step of each evaluation.
        history: (len(steps), len(probes)) outcomes at each evaluation, in time order.

    Each example has the probe's `id`, `category`, `first_forgotten_step`, `recovered` (correct again at the
    last evaluation), `forgetting_events` (1→0 changes between consecutive evaluations, base included), and
    the training data: `messages` (user question, assistant gold answer), the same split into `prompt` and
    `completion` (TRL's SFTTrainer reads a dataset with a `prompt` column as prompt-completion, so the file
    trains as it is), and `solution` for a GRPO reward function such as `forgetwatch.answers.mcq_reward` /
    `short_answer_reward`.

    Example:
        >>> p = Probe("q", "mcq", "2 + 2 = ?", ("3", "4"), 1)
        >>> ex = replay_examples([p], np.array([1]), [10, 20], np.array([[0], [1]]))[0]
        >>> ex["first_forgotten_step"], ex["recovered"], ex["solution"]
        (10, True, 'B')
    """
    if len(steps) == 0:
        return []
    first = first_forgotten_index(base, history)
    events = forgetting_events(np.vstack([base[None, :], history]))
    out = []
    for i in np.flatnonzero(first >= 0):
        p = probes[i]
        user = question_block(p, with_letters=p.kind == "mcq")
        if p.kind == "mcq":
            user += "\nAnswer with the letter of the correct option."
            answer, solution = f"{LETTERS[p.gold]}. {p.choices[p.gold]}", LETTERS[p.gold]
        else:
            answer, solution = p.answers[0], list(p.answers)
        out.append({
            "id": p.id,
            "category": p.category,
            "source": p.source,
            "first_forgotten_step": int(steps[first[i]]),
            "recovered": bool(history[-1, i] == 1),
            "forgetting_events": int(events[i]),
            "messages": [{"role": "user", "content": user}, {"role": "assistant", "content": answer}],
            "prompt": [{"role": "user", "content": user}],
            "completion": [{"role": "assistant", "content": answer}],
            "solution": solution,
            "numeric": p.numeric,
            "num_choices": p.num_choices,
        })
    return out
