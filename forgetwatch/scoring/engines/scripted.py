"""A scripted engine: fixed outcomes per probe and step, no model. For testing what comes after scoring (the monitor,
the record, budgets, partial evaluation, reports, front-ends) in milliseconds and with outcomes known exactly, as
httpx ships a mock transport.

`ScriptedModel` stands where the model in training would (the callback, `score_probes`, `score_distributed` take it
as they take a model): it holds one parameter and a config, so that whatever reads a model's precision, identity or
context reads it, and it brings its own engine (`forgetwatch_engine`, which `make_engine` asks every model for). Its
answers are the script's: `script(probe, step)` for the step it is at (`model.step`, set by the test as training
would move the weights), one of

- `True` / `False`: right or wrong, with a margin of 1 (multiple choice) or the gold answer / a wrong one (short);
- a number: the margin, the gold option's log-likelihood minus the best other's (> 0 right, < 0 wrong);
- a string: the generated text (short answers, behaviour prompts, multiple choice in `generate` mode); scoring
  short answers by greedy match, it is right when it is one of the probe's answers.

Multiple choice is answered in `loglik` and `letter` modes (per-option scores), and `generate` (a letter); short
answers in both short modes. `loglik_norm` divides by the options' lengths, which the engine does not see: the
outcome holds there only for options of one length.

Example:
    >>> from forgetwatch.probes.probe_set import Probe, ProbeSet
    >>> from forgetwatch.scoring.score import score_probes
    >>> probes = ProbeSet([Probe("q1", "mcq", "2+2?", ("4", "5"), gold=0), Probe("q2", "short", "Capital of France?",
    ...                    answers=("Paris",))])
    >>> model = ScriptedModel(lambda probe, step: step < 2 or probe.id == "q2", probes)  # q1 forgotten at step 2
    >>> score_probes(model, scripted_tokenizer(), probes).outcome.tolist()
    [1, 1]
    >>> model.step = 2
    >>> score_probes(model, scripted_tokenizer(), probes).outcome.tolist()
    [0, 1]
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import torch

from ...answers import extraction
from ..requests import Answer, Continuations, GenerateRequest, LoglikRequest, NextTokenRequest

__all__ = ["ScriptedEngine", "ScriptedModel", "scripted_tokenizer"]

Script = Callable[[Any, int], "bool | float | str"]
WRONG = "I do not know."  # a short answer the script marks wrong (no gold answer contains it)


class _Config:
    """What forgetwatch reads of a model's config: its name, type and context."""

    model_type = "scripted"

    def __init__(self, name_or_path: str, max_position_embeddings: int):
        self._name_or_path = name_or_path
        self.max_position_embeddings = max_position_embeddings

    def to_dict(self) -> dict[str, Any]:
        return {"model_type": self.model_type, "max_position_embeddings": self.max_position_embeddings}


class ScriptedModel(torch.nn.Module):
    """A stand-in for the model in training whose answers `script(probe, step)` decides (see the module's docstring).

    Args:
        script: `(probe, step) -> bool | float | str`, called for every probe scored, with `self.step`.
        probes: the probes it may be asked (requests name only their probe's id); robustness variants included.
        name_or_path: what the base cache's key names it by.
        max_length: its context in tokens (probes longer than that are refused or dropped, as for a model).
    """

    def __init__(self, script: Script, probes: Iterable[Any], *, name_or_path: str = "scripted", max_length: int = 4096):
        super().__init__()
        self.script = script
        self.step = 0
        self.config = _Config(name_or_path, max_length)
        # one fp32 parameter: what reads a model's dtype and device (precision, the noise floor) reads this
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.probes = {p.id: p for p in probes}

    def forgetwatch_engine(self, tokenizer: Any, **_: Any) -> ScriptedEngine:
        """The engine `make_engine` uses for this model, whatever the configured engine's name."""
        return ScriptedEngine(self, tokenizer)

    def answer(self, probe: Any) -> bool | float | str:
        return self.script(probe, self.step)


class ScriptedEngine:
    """Answers scoring requests from a `ScriptedModel`'s script (an `Engine`; see `forgetwatch.scoring.engines`)."""

    def __init__(self, model: ScriptedModel, tokenizer: Any = None):
        self.model = model
        self.tokenizer = tokenizer

    def running(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    @property
    def eos_token_ids(self) -> list[int]:
        eos = getattr(self.tokenizer, "eos_token_id", None)
        return [] if eos is None else [int(eos)]

    def max_over_ranks(self, n: int) -> int:
        return n

    def _probe(self, probe_id: str | None) -> Any:
        """The request's probe (None for a padding request)."""
        if probe_id is None:
            return None
        if probe_id not in self.model.probes:
            raise KeyError(f"the scripted model was asked probe {probe_id!r}, which is not among its probes: give "
                           "ScriptedModel every probe it will be asked (variants too)")
        return self.model.probes[probe_id]

    def _margins(self, probe: Any, k: int) -> np.ndarray:
        """Scores of `k` options whose gold one leads the best other by the script's margin (or trails it)."""
        said = self.model.answer(probe)
        margin = (1.0 if said else -1.0) if isinstance(said, bool) else float(said)
        gold = probe.gold
        scores = np.full(k, -1.0 - margin if margin > 0 else -2.0 + margin, dtype=np.float64)
        scores[gold] = -1.0 if margin > 0 else -1.0 + margin
        if margin <= 0 and k > 1:
            scores[(gold + 1) % k] = -1.0  # the best other
        return scores.astype(np.float32)

    def loglik(self, requests: Sequence[LoglikRequest], *, chat: bool, read_next: bool = False, shared: str | None = None,
               bar: Any = None) -> list[Continuations]:
        out = []
        for r in requests:
            probe = self._probe(r.probe_id)
            k = len(r.continuations)
            if probe is not None and probe.kind == "mcq":
                scores = self._margins(probe, k)
                # one token per option, each its own (options with the same tokens would tie)
                out.append(Continuations([[j + 1] for j in range(k)], [np.array([s]) for s in scores],
                                         [np.array([j + 1, 0] if read_next else [j + 1]) for j in range(k)]))
                continue
            # a short answer by greedy match: the greedy tokens are the answer's own when the script says right
            said = self.model.answer(probe) if probe is not None else False
            if isinstance(said, str):  # a text: right when it is one of the answers (greedy match reads no text)
                right = said.strip() in probe.answers
            else:
                right = bool(said) if isinstance(said, bool) else float(said) > 0
            tokens = [list(range(10 * j + 1, 10 * j + 3)) for j in range(k)]
            argmax = [np.array(t + [0]) if right else np.array([0] * (len(t) + 1)) for t in tokens]
            out.append(Continuations(tokens, [np.zeros(len(t), dtype=np.float32) for t in tokens],
                                     [a if read_next else a[:-1] for a in argmax]))
        if bar is not None:
            bar.update(len(requests))
        return out

    def next_token_logprobs(self, requests: Sequence[NextTokenRequest], *, chat: bool, bar: Any = None) -> list[np.ndarray]:
        out = [self._margins(self._probe(r.probe_id), len(r.token_ids)) for r in requests]
        if bar is not None:
            bar.update(len(requests))
        return out

    def generate(self, requests: Sequence[GenerateRequest], *, chat: bool, bar: Any = None) -> list[Answer]:
        out = []
        for r in requests:
            probe = self._probe(r.probe_id)
            said = self.model.answer(probe) if probe is not None else ""
            if not isinstance(said, str):
                right = bool(said) if isinstance(said, bool) else float(said) > 0
                if probe.kind == "mcq":
                    pick = probe.gold if right else (probe.gold + 1) % len(probe.choices)
                    said = f"The answer is {extraction.LETTERS[pick]}."
                else:
                    said = probe.answers[0] if right and probe.answers else _wrong(probe)
            out.append(Answer(said, len(said.split()), True))
        if bar is not None:
            bar.update(len(requests))
        return out


def _wrong(probe: Any) -> str:
    """A wrong short answer: another number for a numeric probe (not an unparsable one), else `WRONG`."""
    if getattr(probe, "numeric", False) and probe.answers:
        return f"{probe.answers[0]}1"
    return WRONG


def scripted_tokenizer() -> Any:
    """A small tokenizer for a `ScriptedModel` (byte-level BPE trained here on a few lines, with a chat template):
    the scoring modes render and measure prompts with it; the scripted engine never reads its tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["Question: Answer: A. B. C. D. The answer is", "0 1 2 3 4 5 6 7 8 9 + - = ?"], trainer)
    out = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    out.chat_template = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
                         "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
    return out
