"""How scoring calls a causal LM's forward, whatever the transformers version: found out by behaviour, not by name.

transformers renames forward arguments between releases (`num_logits_to_keep` became `logits_to_keep` in 4.45;
`past_key_values` became `cache` in 5.24, the output field too). Looking a name up in `inspect.signature` turned the
few-shot prefix cache off in silence on 5.24. So here a capability is tried on the model itself: the KV cache is
asked for once and passed back under each name the forward may take, and a name counts only if the cache it was
given really grew. A capability that does not work is said once in a warning (never switched off in silence), and
scoring falls back to the slower path that needs nothing from the model.

Also here, because every forward forgetwatch runs goes through them: `untouched` (eval mode inside; train/eval flags,
requires_grad and RNG states restored after, so training goes on as it would) and `no_grad_context`, and
`wrapped_autocast`, which reads the precision the trainer's forward really runs in.

Example:
    >>> prefix = PrefixCache.build(model, exemplar_ids, device)   # doctest: +SKIP
    >>> kwargs = {"input_ids": rows, **(prefix.for_batch(len(rows)) if prefix else {})}   # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import logging
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .._warnings import warn_once as _warn_once

__all__ = ["PrefixCache", "cache_of", "call", "model_device", "pad_token_id", "logits_to_keep_kwargs",
           "check_logits_kept", "warn_once", "wrapped_autocast", "untouched", "no_grad_context"]

logger = logging.getLogger(__name__)

# Newest first: the name a 5.24+ forward takes, then the one every release before it took (and 5.24 still accepts,
# with a deprecation warning).
CACHE_NAMES = ("cache", "past_key_values")


def model_device(model: torch.nn.Module) -> torch.device:
    """Where the model's (first) parameters live: where its inputs go."""
    return next(model.parameters()).device


def pad_token_id(tokenizer: Any) -> int:
    """The id to pad with: the tokenizer's pad token, else its EOS (masked out either way), else 0."""
    for tid in (tokenizer.pad_token_id, tokenizer.eos_token_id, 0):
        if tid is not None:
            return int(tid)
    return 0


def warn_once(key: str, message: str) -> None:
    """Log `message` as a warning the first time `key` is seen in this process."""
    _warn_once(logger, key, message)


def _where(model: torch.nn.Module) -> str:
    import transformers

    return f"{type(model).__name__}, transformers {transformers.__version__}"


def forward_parameters(model: torch.nn.Module) -> tuple[set[str], bool]:
    """The forward's named parameters, and whether it takes **kwargs."""
    try:
        params = inspect.signature(model.forward).parameters.values()
    except (TypeError, ValueError):  # a C-level or odd forward: offer everything, behaviour decides
        return set(), True
    return {p.name for p in params}, any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def cache_of(output: Any) -> Any:
    """The KV cache in a model output, under whichever field this transformers version uses (`cache` from 5.24,
    `past_key_values` before), or None when the model returned none."""
    from transformers.cache_utils import Cache

    values = list(output.values()) if hasattr(output, "values") else []
    for value in values:
        if isinstance(value, Cache):
            return value
    for name in CACHE_NAMES:  # a legacy tuple cache, or an output that is not a ModelOutput
        value = getattr(output, name, None) if not hasattr(output, "get") else output.get(name)
        if value is not None:
            return value
    return None


def cache_length(cache: Any) -> int | None:
    try:
        return int(cache.get_seq_length())
    except Exception:  # not a Cache object (a legacy tuple): its length is what we can read of its keys
        try:
            return int(cache[0][0].shape[-2])
        except Exception:
            return None


@dataclass
class PrefixCache:
    """The keys and values of a prefix every row starts with (few-shot exemplars), computed once.

    `name` is the forward keyword the model really reads the cache from, found by `build`.
    """

    cache: Any
    name: str
    length: int

    @classmethod
    def build(cls, model: torch.nn.Module, prefix: list[int], device: torch.device) -> PrefixCache | None:
        """Compute the prefix's cache, finding on the way the keyword the forward reads a cache from.

        All but the last token run first; the last one then goes through the forward with that cache, under each name
        the forward may take, until the cache grows by it (the first name that works costs nothing beyond the prefix's
        own forward; a forward that refuses a name is simply not given it). None (with a warning said once) when the
        model returns no reusable cache or reads none back: then every row carries the prefix itself.
        """
        P = len(prefix)
        if P < 2:
            return None
        ids = torch.tensor([prefix], device=device)
        cache = cache_of(model(input_ids=ids[:, :-1], use_cache=True))
        if cache is None or not hasattr(cache, "batch_repeat_interleave"):
            what = "no KV cache" if cache is None else f"a KV cache it cannot copy per row ({type(cache).__name__})"
            warn_once(
                f"no-cache:{type(model).__name__}",
                f"forgetwatch: the model returned {what} ({_where(model)}): the few-shot exemplars are "
                "recomputed in every row (same results, slower).",
            )
            return None
        named, takes_kwargs = forward_parameters(model)
        names = [n for n in CACHE_NAMES if n in named] or (list(CACHE_NAMES) if takes_kwargs else [])
        for i, name in enumerate(names):
            trial = copy.deepcopy(cache) if i < len(names) - 1 else cache
            try:
                model(input_ids=ids[:, -1:], position_ids=torch.tensor([[P - 1]], device=device),
                      attention_mask=torch.ones(1, P, dtype=torch.long, device=device), use_cache=True, **{name: trial})
            except (TypeError, ValueError) as e:
                # a **kwargs wrapper (PEFT) around a forward that names only the other one refuses this name
                if name not in str(e):
                    raise
                continue
            if cache_length(trial) == P:
                return cls(trial, name, P)
        tried = " or ".join(f"`{n}`" for n in names) if names else "any keyword (its forward names none and takes no **kwargs)"
        warn_once(
            f"cache-ignored:{type(model).__name__}",
            f"forgetwatch: the model's forward read back no KV cache passed as {tried} ({_where(model)}): the few-shot "
            "exemplars are recomputed in every row (same results, slower). Please report this with the output of "
            "`python -m forgetwatch.versions`.",
        )
        return None

    def for_batch(self, batch_size: int) -> dict[str, Any]:
        """Forward kwargs that continue every row of a batch from the prefix (a fresh copy each call: forwards grow it)."""
        cache = copy.deepcopy(self.cache)
        cache.batch_repeat_interleave(batch_size)
        return {self.name: cache, "use_cache": True}


# Model classes whose forward takes **kwargs but refused `logits_to_keep` when it came that way (old Bloom raises
# "Got unexpected arguments").
_refuses_logits_to_keep: set[type] = set()


def logits_to_keep_kwargs(model: torch.nn.Module, keep: int) -> dict[str, int]:
    """`{"logits_to_keep": keep}` when the forward may take it (named, or through **kwargs, as PEFT's wrappers pass it
    on), else {} with a warning said once. Pass the result to `call`, which drops it if the forward refuses it, and
    see `check_logits_kept` for whether it was honoured."""
    named, takes_kwargs = forward_parameters(model)
    if "logits_to_keep" in named or (takes_kwargs and type(model) not in _refuses_logits_to_keep):
        return {"logits_to_keep": keep}
    warn_once(
        f"no-logits-to-keep:{type(model).__name__}",
        f"forgetwatch: the model's forward takes no `logits_to_keep` ({_where(model)}): logits are computed at every "
        "position (same results, slower).",
    )
    return {}


def call(model: torch.nn.Module, kwargs: dict[str, Any]) -> Any:
    """`model(**kwargs)`; a `logits_to_keep` the forward refuses is dropped, said once, and the call made again without
    it, provided the refusal came before the forward grew any cache it was given (else the error stands)."""
    lengths = {k: cache_length(v) for k, v in kwargs.items() if k in CACHE_NAMES}
    try:
        return model(**kwargs)
    except (TypeError, ValueError) as e:
        if "logits_to_keep" not in kwargs or "logits_to_keep" not in str(e):
            raise
        if any(cache_length(kwargs[k]) != n for k, n in lengths.items()):
            raise
        _refuses_logits_to_keep.add(type(model))
        kwargs.pop("logits_to_keep")
        logits_to_keep_kwargs(model, 0)  # says why, once
        return model(**kwargs)


def check_logits_kept(model: torch.nn.Module, logits: torch.Tensor, kwargs: dict[str, Any]) -> None:
    """Warn once when `logits_to_keep` was passed but the model returned (B, T, V) logits for every position."""
    keep = kwargs.get("logits_to_keep")
    if keep and logits.shape[1] != keep:
        warn_once(
            f"logits-to-keep-ignored:{type(model).__name__}",
            f"forgetwatch: the model ignored `logits_to_keep` ({_where(model)}): logits are computed at every position "
            "(same results, slower).",
        )


# -- keeping the model untouched ------------------------------------------------------------------------------


@contextlib.contextmanager
def untouched(model: torch.nn.Module) -> Iterator[None]:
    """Eval mode inside; afterwards every module's train/eval flag, requires_grad and the RNG states as before."""
    modes = [(m, m.training) for m in model.modules()]
    grads = [(p, p.requires_grad) for p in model.parameters()]
    rng = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    model.eval()
    try:
        yield
    finally:
        for m, training in modes:
            m.training = training
        for p, requires_grad in grads:
            p.requires_grad_(requires_grad)
        random.setstate(rng[0])
        np.random.set_state(rng[1])
        torch.set_rng_state(rng[2])
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)


def no_grad_context():
    """`torch.inference_mode()`, or `torch.no_grad()` when a process group exists."""
    # inference_mode is the fastest, but its tensors must never meet FSDP / ZeRO-3 parameter hooks,
    # which gather and re-shard weights during the forward: use no_grad when a process group exists.
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.no_grad()
    return torch.inference_mode()



def wrapped_autocast(model: torch.nn.Module, device: torch.device) -> str | None:
    """The dtype accelerate's wrapper autocasts the model's forward to ("bfloat16", "float16"), or None.

    Under mixed precision accelerate replaces `model.forward` with an autocast wrapper (keeping `_original_forward`).
    Which precision that is cannot be read from the Trainer's arguments alone: transformers 4 also takes it from
    $ACCELERATE_MIXED_PRECISION, which any `TrainingArguments(bf16=True)` made earlier in the process sets, and
    `accelerate launch --mixed_precision` sets it too. So one token goes through the wrapped forward, and the autocast
    state is read inside it, at the first linear layer. None also when that forward fails (said once).
    """
    if "_original_forward" not in model.__dict__:
        return None
    linear = next((m for m in model.modules() if isinstance(m, torch.nn.Linear)), None)
    if linear is None:
        return None
    seen: list[str | None] = []

    def read(module, args):
        if not seen:
            on = torch.is_autocast_enabled(device.type)
            seen.append(str(torch.get_autocast_dtype(device.type)).removeprefix("torch.") if on else None)

    handle = linear.register_forward_pre_hook(read)
    try:
        with untouched(model), no_grad_context():  # no dropout drawn, no RNG consumed: training goes on as it would
            model(input_ids=torch.zeros(1, 1, dtype=torch.long, device=device), use_cache=False)
    except Exception as e:
        warn_once(f"autocast-probe:{type(model).__name__}",
                  f"forgetwatch: could not run one token through the trainer's forward to read its autocast "
                  f"({type(e).__name__}: {e}); the precision is taken from the training arguments")
        return None
    finally:
        handle.remove()
    return seen[0] if seen else None
