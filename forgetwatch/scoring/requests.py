"""What scoring asks of an engine and what comes back: the seam between the scoring modes (`forgetwatch.scoring.modes`, plain
Python) and the engines that run a model (`forgetwatch.scoring.engines`, torch).

A mode turns probes into requests (continuations to score after a context, contexts whose next token is read,
prompts to generate from), an engine runs them, and the mode judges what comes back. The text is the mode's
(prompt formats, chat templates); tokenising it the way scoring always has is shared here, so that every engine
scores the same tokens.

Example:
    >>> LoglikRequest("Question: 2+2?\\nAnswer:", (" 4", " 5")).continuations
    (' 4', ' 5')
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ProbeSetError

__all__ = ["LoglikRequest", "NextTokenRequest", "GenerateRequest", "Continuations", "Answer", "ProbeSetError",
           "encode_prompts"]


@dataclass(frozen=True)
class LoglikRequest:
    """Teacher-force each continuation after `context`: per token, its log-probability and the greedy token.

    `probe_id` names the probe in errors (None: a padding request whose result is dropped).

    Example:
        >>> LoglikRequest("Question: The sky is\\nAnswer:", (" blue", " green"), probe_id="q1").probe_id
        'q1'
    """

    context: str
    continuations: tuple[str, ...]
    probe_id: str | None = None


@dataclass(frozen=True)
class NextTokenRequest:
    """The log-probabilities of `token_ids` as the next token after `context` (the letters of lettered options).

    Example:
        >>> NextTokenRequest("...\\nAnswer:", (330, 418)).token_ids
        (330, 418)
    """

    context: str
    token_ids: tuple[int, ...]
    probe_id: str | None = None


@dataclass(frozen=True)
class GenerateRequest:
    """Greedy decoding after `prompt`, up to `max_new_tokens` or the end of turn, cut at the first of `stops`.

    Example:
        >>> GenerateRequest("Question: 2+2?\\nAnswer:", 32, ("\\n\\n",)).max_new_tokens
        32
    """

    prompt: str
    max_new_tokens: int
    stops: tuple[str, ...] = ()
    probe_id: str | None = None


@dataclass
class Continuations:
    """What one forward tells about each continuation (option or accepted answer) of one `LoglikRequest`."""

    tokens: list[list[int]]  # [continuation] -> token ids
    logprobs: list[np.ndarray]  # log-probability of each of those tokens (fp32 log-softmax)
    argmax: list[np.ndarray]  # the model's greedy token at each of those positions (+1 after, with read_next)


@dataclass
class Answer:
    """A generated answer."""

    text: str
    n_tokens: int  # up to the end of turn, not counting it (a stop string that cut the answer is counted)
    stopped: bool  # False: it ran to max_new_tokens
    nonfinite: bool = False  # a NaN / inf among the logits it was decoded from: the text means nothing


def encode(tokenizer: Any, texts: Sequence[str], chat: bool) -> list[list[int]]:
    """Token ids of prompts: `chat` says the texts are rendered chat templates, which hold their special tokens."""
    # A rendered chat template already holds its special tokens; plain prompts get the tokenizer's own (BOS).
    ids = tokenizer(list(texts), add_special_tokens=not chat)["input_ids"]
    if not chat and _appends_eos(tokenizer):
        # A prompt is the start of a text, never a finished one: an EOS after it would be scored in place of the
        # option's first token, and generation would start after an end of sequence.
        ids = [x[:-1] if x and x[-1] == tokenizer.eos_token_id else x for x in ids]
    return ids


def encode_prompts(tokenizer: Any, requests: Sequence[GenerateRequest], chat: bool,
                   check_context: Callable[[list[str | None], list[int], str], None]) -> list[list[int]]:
    """The generation prompts' token ids (`encode`), each checked with the tokens it may generate against the engine's
    context before anything runs: `check_context(probe_ids, lengths, what)` refuses what does not fit (every engine
    has its own limit and its own way to say so)."""
    ids = encode(tokenizer, [r.prompt for r in requests], chat) if requests else []
    check_context([r.probe_id for r in requests], [len(x) + r.max_new_tokens for x, r in zip(ids, requests, strict=True)],
                  "the tokens they may generate (max_new_tokens)")
    return ids


def _appends_eos(tokenizer: Any) -> bool:
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        return False
    with_special = tokenizer("a", add_special_tokens=True)["input_ids"]
    return bool(with_special) and with_special[-1] == eos and eos not in tokenizer("a", add_special_tokens=False)["input_ids"]

