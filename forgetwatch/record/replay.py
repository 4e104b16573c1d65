"""Replay flagging: the probes a run forgot, with their history, as ready-to-train examples (the record's
`replay.jsonl`, kept up to date by the monitor).

Mixing held-out examples into training while it runs is a remedy: `forgetwatch.remedies.mix_replay`, which writes
probes as training examples with `training_example` from here.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from ..answers import LETTERS
from ..probes.probe_set import Probe
from ..scoring.prompts import question_block
from ..scoring.results import CORRECT

__all__ = ["FORMS", "ReplayTracker", "replay_examples", "training_example"]


class ReplayTracker:
    """The replay examples of a run, brought up to date one evaluation at a time.

    `update` keeps three numbers per probe (first step forgotten, forgetting events, correct now) with array
    operations; examples are built when asked for. Only a probe whose correctness changed can change its example,
    so `lines()` serialises those again and reuses the other lines: at 100,000 probes and 3% flips per evaluation,
    writing replay.jsonl no longer means rebuilding every example from the whole history (~660 ms an evaluation
    and growing before; benchmarks/RESULTS.md).

    Args:
        probes: the probe set, in record order.
        base: the base model's outcomes (1 correct, 0 wrong, -1 invalid).

    Example:
        >>> p = Probe("q", "mcq", "2 + 2 = ?", ("3", "4"), 1)
        >>> tracker = ReplayTracker([p], np.array([1]))
        >>> tracker.update(10, np.array([0])); tracker.update(20, np.array([1]))
        >>> ex = tracker.examples()[0]
        >>> ex["first_forgotten_step"], ex["recovered"], ex["forgetting_events"]
        (10, True, 1)
    """

    def __init__(self, probes: Sequence[Probe], base: np.ndarray):
        self.probes = probes
        # behaviour probes have no gold answer to replay (self-distilled replay trains on their base answers:
        # forgetwatch.remedies.base_outputs)
        self._replayable = np.array([not p.is_behavior for p in probes], bool)
        self.base_correct = np.asarray(base) == CORRECT
        self._was_correct = self.base_correct.copy()
        self._first_step = np.full(len(probes), -1, np.int64)  # -1: never forgotten
        self._events = np.zeros(len(probes), np.int64)
        self._stale = np.zeros(len(probes), bool)  # the cached JSON line no longer matches the example
        self._lines: dict[int, str] = {}

    def update(self, step: int, outcome: np.ndarray) -> None:
        """Take the outcomes of the evaluation at global step `step` (evaluations in time order)."""
        correct = np.asarray(outcome) == CORRECT
        if correct.shape != self._was_correct.shape:
            raise ValueError(f"`outcome` has shape {correct.shape}, expected ({len(self.probes)},): one per probe")
        changed = np.flatnonzero(correct != self._was_correct)
        lost = changed[self._was_correct[changed]]  # correct at the previous evaluation, not now: a forgetting event
        self._events[lost] += 1
        first = lost[self.base_correct[lost] & (self._first_step[lost] < 0)]
        self._first_step[first] = step
        self._stale[changed] = True
        self._was_correct = correct

    def examples(self) -> list[dict[str, Any]]:
        """One example per probe forgotten so far, in probe order (see `replay_examples` for the fields)."""
        return [self._example(i) for i in np.flatnonzero((self._first_step >= 0) & self._replayable).tolist()]

    def lines(self) -> Iterator[str]:
        """The examples as JSONL lines, in probe order; only the lines of probes that flipped are made again."""
        for i in np.flatnonzero((self._first_step >= 0) & self._replayable).tolist():
            if self._stale[i] or i not in self._lines:
                self._lines[i] = json.dumps(self._example(i), ensure_ascii=False) + "\n"
                self._stale[i] = False
            yield self._lines[i]

    def _example(self, i: int) -> dict[str, Any]:
        return {**training_example(self.probes[i]), "first_forgotten_step": int(self._first_step[i]),
                "recovered": bool(self._was_correct[i]), "forgetting_events": int(self._events[i])}


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
    if len(steps) != len(history):
        raise ValueError(f"`steps` has {len(steps)} entries but `history` has {len(history)} rows: one step per evaluation")
    tracker = ReplayTracker(probes, base)
    for step, outcome in zip(steps, history, strict=True):
        tracker.update(step, outcome)
    return tracker.examples()


FORMS = ("scoring", "letter")


def training_example(p: Probe, form: str = "letter") -> dict[str, Any]:
    """A probe as SFT / GRPO data; `ReplayTracker._example` fills in the history fields (placeholders here keep
    the key order of the file).

    Example:
        >>> training_example(Probe("q", "mcq", "2 + 2 = ?", ("3", "4"), 1), "scoring")["messages"][1]
        {'role': 'assistant', 'content': '4'}

    `form="letter"`: the lettered question and "B. <option>" (what a GRPO letter reward checks); `form="scoring"`:
    the question as the probes are scored, then the gold option's text or the bare short answer (what log-likelihood
    scoring reads), also as plain `text` for a dataset that trains on text.
    """
    if form == "scoring":
        user = question_block(p, with_letters=False)
        answer = p.choices[p.gold] if p.kind == "mcq" else p.answers[0]
        solution = [answer] if p.kind == "mcq" else list(p.answers)
        # a replayed question answered with its option's text is a short answer as far as a reward can tell
        return {"id": p.id, "category": p.category, "source": p.source, "kind": "short",
                "first_forgotten_step": -1, "recovered": False, "forgetting_events": 0,
                "messages": [{"role": "user", "content": user}, {"role": "assistant", "content": answer}],
                "prompt": [{"role": "user", "content": user}],
                "completion": [{"role": "assistant", "content": answer}],
                "text": f"{user}\nAnswer: {answer}", "solution": solution, "numeric": p.numeric, "cot": False,
                "num_choices": 0}
    user = question_block(p, with_letters=p.kind == "mcq")
    if p.kind == "mcq":
        user += "\nAnswer with the letter of the correct option."
        answer, solution = f"{LETTERS[p.gold]}. {p.choices[p.gold]}", LETTERS[p.gold]
    else:
        answer, solution = p.answers[0], list(p.answers)
    return {
        "id": p.id,
        "category": p.category,
        "source": p.source,
        "kind": p.kind,
        "first_forgotten_step": -1,
        "recovered": False,
        "forgetting_events": 0,
        "messages": [{"role": "user", "content": user}, {"role": "assistant", "content": answer}],
        "prompt": [{"role": "user", "content": user}],
        "completion": [{"role": "assistant", "content": answer}],
        "solution": solution,
        "numeric": p.numeric,
        "cot": False,  # the answer alone, as the probe asks it
        "num_choices": p.num_choices,
    }
