"""Engines: what runs scoring requests with a model. The scoring modes (`forgetwatch.scoring.modes`) build the requests
and judge the results; an engine only runs them. Each engine is registered by name in `ENGINES` with what it can do
(`EngineSpec`: score the model in training, load a checkpoint's directory, reload weights in place, what it adds to a
cache key), and is imported only when one is built: callers ask what an engine can do, never which one it is.

Adding an engine, in three steps (as lm-evaluation-harness registers its model backends):

1. a module here with a class that implements `Engine`, and a factory `(model, tokenizer, *, batch_size, pack_choices,
   sync_ranks) -> Engine` (the class itself will do); for an engine that loads directories, also
   `(path, dtype, tokenizer_dir) -> (engine, tokenizer)`;
2. its `EngineSpec` in `ENGINES`;
3. its name in the option's choices (`forgetwatch.options.ENGINES`, and `DIRECTORY_ENGINES` when it cannot score the
   model in training); `tests/scoring/test_engines.py` checks that the two agree.

Example:
    >>> engine_spec("hf").live_model, engine_spec("vllm").runtime
    (True, 'vllm')
    >>> engine = make_engine("continuous", model, tokenizer, batch_size=16)  # doctest: +SKIP
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ..._lazy import lazy
from ...options import default
from ..requests import Answer, Continuations, GenerateRequest, LoglikRequest, NextTokenRequest

__all__ = ["ENGINES", "Engine", "EngineSpec", "HFEngine", "ContinuousBatchingEngine", "ScriptedModel", "engine_spec",
           "engine_unavailable", "make_engine", "open_checkpoint", "scripted_tokenizer"]

# torch loads with the engines, on first use: this registry is read by plain modules (`ScoringConfig.key`, the options)
__getattr__, __dir__ = lazy(__name__, globals(), {"HFEngine": ".hf", "ContinuousBatchingEngine": ".continuous",
                                                  "ScriptedModel": ".scripted", "scripted_tokenizer": ".scripted"})


@dataclass(frozen=True)
class EngineSpec:
    """What an engine can do, known without importing it.

    Args:
        factory: `"module:name"` in this package: builds the engine for a model in memory.
        live_model: it scores the model object the trainer holds, in the training process (`scoring="inline"`);
            otherwise it loads a model's directory and serves `forgetwatch watch` (`scoring="sidecar"`).
        runtime: its kernels are not transformers': near-ties come out otherwise, so a cache it scores says so
            (`scoring.runtime` in the key) and is never compared with one scored by another runtime.
        checkpoint: `"module:name"`: opens a checkpoint's directory as `(engine, tokenizer)` without loading it in this
            process (engines that load directories); None: a checkpoint is loaded with transformers and scored live.
        reloads_weights: a later checkpoint of the same model is loaded into the running engine, not started anew.
        autocast: it can score under the trainer's autocast (else the weights run in their own dtype).
        unavailable: `"module:name"`: a function that says why the engine cannot run here (its library missing), or
            None when it can; asked before anything is changed (`engine_unavailable`).
    """

    factory: str
    live_model: bool = True
    runtime: str | None = None
    checkpoint: str | None = None
    reloads_weights: bool = False
    autocast: bool = True
    unavailable: str | None = None


ENGINES: dict[str, EngineSpec] = {
    "hf": EngineSpec(".hf:HFEngine"),
    "continuous": EngineSpec(".continuous:ContinuousBatchingEngine"),
    "vllm": EngineSpec(".vllm:engine_for_model", live_model=False, runtime="vllm", checkpoint=".vllm:engine_for_checkpoint",
                       reloads_weights=True, autocast=False, unavailable=".vllm:vllm_unavailable"),
}


def engine_spec(name: str) -> EngineSpec:
    """What the engine `name` can do; an unknown name is refused, naming the known ones."""
    if name not in ENGINES:
        raise ValueError(f"unknown engine {name!r}: use one of {', '.join(repr(n) for n in ENGINES)}")
    return ENGINES[name]


def engine_unavailable(name: str) -> str | None:
    """Why the engine `name` cannot run here (with what to do), or None when it can: asked by the commands that would
    otherwise change a record or a file before finding out (`watch --rescore`, rewind)."""
    spec = engine_spec(name)
    return _load(spec.unavailable)() if spec.unavailable else None


def _load(target: str) -> Any:
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module, __name__), attr)


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


def make_engine(
    name: str,
    model: Any,
    tokenizer: Any,
    *,
    batch_size: int = default("batch_size"),
    pack_choices: bool | None = None,
    sync_ranks: bool = False,
) -> Engine:
    """The engine `ScoringConfig.engine` names, built for `model` (in memory): `"hf"` (`HFEngine`), `"continuous"`
    (`ContinuousBatchingEngine`, which falls back to the HF engine's generation with a warning where it cannot run), or
    `"vllm"` (on the directory `model` was loaded from, in its dtype; vLLM is imported only then, and what it cannot
    serve is refused with `EngineUnavailableError`). A model with a `forgetwatch_engine(tokenizer, **options)` method
    brings its own engine, used whatever the name (`ScriptedModel`, for tests).

    Example:
        >>> engine = make_engine("continuous", model, tokenizer, batch_size=16)  # doctest: +SKIP
    """
    spec = engine_spec(name)
    own = getattr(model, "forgetwatch_engine", None)
    if callable(own):  # a model that brings its own engine (`ScriptedModel`): whatever the configured name
        return own(tokenizer, batch_size=batch_size, pack_choices=pack_choices, sync_ranks=sync_ranks)
    factory = _load(spec.factory)
    return factory(model, tokenizer, batch_size=batch_size, pack_choices=pack_choices, sync_ranks=sync_ranks)


def open_checkpoint(name: str, path: str | os.PathLike, dtype: str, tokenizer_dir: str | os.PathLike | None = None
                    ) -> tuple[Engine, Any]:
    """(engine, tokenizer) for a checkpoint's directory, for an engine that loads directories (`EngineSpec.checkpoint`):
    the model is not loaded in this process. `tokenizer_dir`: where the tokenizer is when the checkpoint holds none.

    Example:
        >>> engine, tokenizer = open_checkpoint("vllm", "out/checkpoint-500", "bfloat16")  # doctest: +SKIP
    """
    spec = engine_spec(name)
    if spec.checkpoint is None:
        raise ValueError(f"engine {name!r} scores a model in memory: load the checkpoint (forgetwatch.scoring.checkpoint)")
    return _load(spec.checkpoint)(path, dtype, tokenizer_dir=tokenizer_dir)
