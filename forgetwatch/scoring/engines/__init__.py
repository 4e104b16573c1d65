"""Engines: what runs scoring requests with a model. The scoring modes (`forgetwatch.scoring.modes`) build the requests and
judge the results; an engine only runs them, so a new way of running a model (transformers' continuous batching,
vLLM) is one new module here implementing `Engine` (`vllm.py`: vLLM, imported only when `make_engine("vllm", ...)` runs).

Example:
    >>> from forgetwatch.scoring.engines import HFEngine
    >>> results = score_probes(model, tokenizer, probes, engine=HFEngine(model, tokenizer, batch_size=8))  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

import numpy as np

from ...options import default
from ..requests import Answer, Continuations, GenerateRequest, LoglikRequest, NextTokenRequest
from .continuous import ContinuousBatchingEngine
from .hf import HFEngine

__all__ = ["Engine", "HFEngine", "ContinuousBatchingEngine", "make_engine"]


class Engine(Protocol):
    """What `score_probes` needs from an engine. Results come back in the order of the requests and are deterministic
    (greedy decoding, log-softmax in fp32): the same call gives the same results every time, while another batching
    may move log-probabilities in their last bits (the HF engine at another batch size does).

    `chat` says the texts are rendered chat templates, which hold their special tokens (tokenise them with
    `forgetwatch.scoring.requests.encode`, so every engine scores the same tokens). `bar`, when given, is told progress with
    `bar.update(n)`. A request whose `probe_id` is None pads a rank's share (its result is dropped). An engine
    refuses a probe that does not fit the model's context with `ProbeSetError` before running anything.
    """

    def running(self) -> AbstractContextManager:
        """A block around all the calls of one `score_probes` (the HF engine: eval mode, no grad, model left as
        found)."""
        ...

    @property
    def eos_token_ids(self) -> list[int]:
        """The token ids that end an answer (end of sequence or turn): generation stops at them, and `greedy_match`
        counts them as the end of an answer."""
        ...

    def max_over_ranks(self, n: int) -> int:
        """The largest `n` over the processes that score together (a collective), or `n` alone."""
        ...

    def loglik(self, requests: Sequence[LoglikRequest], *, chat: bool, read_next: bool = False, shared: str | None = None,
               bar: Any = None) -> list[Continuations]:
        """Teacher-force every continuation after its context. Continuation tokens are those of context +
        continuation past the context's (lm-evaluation-harness's rule); a continuation that merged into the
        context's last token is scored as that token. `read_next`: also the greedy token after each continuation.
        `shared`: text every context starts with, worth computing once."""
        ...

    def next_token_logprobs(self, requests: Sequence[NextTokenRequest], *, chat: bool, bar: Any = None) -> list[np.ndarray]:
        """Per request, the log-probabilities of its `token_ids` as the next token after its context."""
        ...

    def generate(self, requests: Sequence[GenerateRequest], *, chat: bool, bar: Any = None) -> list[Answer]:
        """Greedy answers: decoded until the end of turn (the tokenizer's or the model's EOS), `max_new_tokens`, or
        a stop string (the text is cut there)."""
        ...


def make_engine(name: str, model: Any, tokenizer: Any, *, batch_size: int = default("batch_size"), pack_choices: bool | None = None,
                sync_ranks: bool = False) -> Engine:
    """The engine `ScoringConfig.engine` names: `"hf"` (`HFEngine`), `"continuous"` (`ContinuousBatchingEngine`,
    which falls back to the HF engine's generation with a warning where it cannot run), or `"vllm"` (`VLLMEngine` on
    the directory `model` was loaded from, in its dtype; vLLM is imported only here, and what it cannot serve is
    refused with `EngineUnavailableError`: `forgetwatch.scoring.engines.vllm.engine_for_model`).

    Example:
        >>> engine = make_engine("continuous", model, tokenizer, batch_size=16)  # doctest: +SKIP
    """
    if name == "hf":
        return HFEngine(model, tokenizer, batch_size=batch_size, pack_choices=pack_choices, sync_ranks=sync_ranks)
    if name == "continuous":
        return ContinuousBatchingEngine(model, tokenizer, batch_size=batch_size, pack_choices=pack_choices,
                                        sync_ranks=sync_ranks)
    if name == "vllm":
        from .vllm import engine_for_model  # vLLM itself is imported only when an engine is built

        return engine_for_model(model, tokenizer, sync_ranks=sync_ranks)
    raise ValueError(f"unknown engine {name!r}: use 'hf', 'continuous' or 'vllm'")
