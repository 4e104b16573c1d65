"""transformers' continuous batching as an engine: generation runs through `model.init_continuous_batching` (a paged
KV cache, requests scheduled in and out of the batch by transformers, whose prefix sharing can reuse a prompt start
that fills whole cache pages); log-likelihood and next-token requests run as in `HFEngine`, which this extends.

Where it is worth it: RESULTS §14 measures it against the HF engine's refilling batch. On these 2-core CPUs the
refilling batch is faster, so the default stays `HFEngine`; ask for this engine with `engine="continuous"` to
measure it where it may win (a GPU, where transformers uses flash or paged attention kernels: not measured), and where it
cannot run (several processes
scoring together, a transformers without continuous batching, a model that cannot page its attention) it is refused
or falls back with one line saying which and why.

Example:
    >>> from forgetwatch.scoring.engines import ContinuousBatchingEngine
    >>> engine = ContinuousBatchingEngine(model, tokenizer, batch_size=16)  # doctest: +SKIP
    >>> results = score_probes(model, tokenizer, probes, engine=engine)  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from ...options import default
from ..forward import pad_token_id, warn_once
from ..requests import Answer, GenerateRequest, encode_prompts
from .decoding import cut_answer
from .hf import HFEngine

__all__ = ["ContinuousBatchingEngine", "continuous_batching_unavailable"]

logger = logging.getLogger(__name__)

# Pages small enough that a chat template's system turn (24 tokens for SmolLM2) fills one that prefix sharing can
# reuse; transformers' default (256) shares nothing shorter than 256 tokens. (Sharing is on for SmolLM2; how often it
# hits is not measured: prompts prefilled in the same step cannot share.)
_PAGE_SIZE = 16
# The engine waits this long for a result before asking whether the generation thread is still alive.
_POLL_S = 1.0


def continuous_batching_unavailable(model: torch.nn.Module, *, sync_ranks: bool = False) -> str | None:
    """Why transformers' continuous batching cannot run `model` here, or None when it can.

    Example:
        >>> continuous_batching_unavailable(model, sync_ranks=True)  # doctest: +SKIP
        'it schedules requests per process, and several processes score together here (sync_ranks)'
    """
    if sync_ranks:
        return ("it schedules requests per process, and several processes score together here (sync_ranks): their "
                "forwards would not pair up under FSDP / ZeRO-3")
    if not hasattr(model, "init_continuous_batching"):
        return "the model has no continuous batching (`init_continuous_batching`: not a transformers `PreTrainedModel`)"
    if _config_class() is None:
        import transformers

        return (f"transformers {transformers.__version__} has no `ContinuousBatchingConfig` (the continuous batching "
                "forgetwatch runs is that of transformers 5)")
    config = getattr(model, "config", None)
    impl = getattr(config, "_attn_implementation", None)
    if impl not in (None, "eager", "sdpa", "paged|eager", "paged|sdpa") and "flash" not in str(impl):
        return f"the model's attention implementation {impl!r} has no paged form"
    if any(p.device.type == "meta" for p in model.parameters()):
        return "the model's weights are sharded (FSDP / ZeRO-3) or on the meta device"
    if len(set((getattr(model, "hf_device_map", None) or {}).values())) > 1:
        return "the model is split across devices (device_map), and its paged cache lives on one"
    if getattr(model, "_cached_continuous_batching_manager", None) is not None:
        # transformers would hand back that manager, sized and configured for someone else's requests
        return "the model holds a continuous-batching manager of its own (persistent_manager=True)"
    return None


class ContinuousBatchingEngine(HFEngine):
    """Generation through transformers' continuous batching; log-likelihood and next-token requests as `HFEngine`.

    Greedy answers are those of the HF engine up to near-ties in the last bits (paged attention sums in another
    order); RESULTS §14 counts them. Its paged cache holds the weights' dtype, so autocast to another dtype (float32
    weights in a bf16 / fp16 Trainer, or the watcher scoring in that precision) generates with the HF engine instead,
    said once. Stop strings are matched after the fact (continuous batching has no stop-string
    criterion): an answer's tokens past its stop string are decoded and then dropped, so they cost time but change
    nothing. A NaN / +inf in the logits is seen through the chosen token's log-probability (NaN then).

    Args:
        model, tokenizer, batch_size, pack_choices: as `HFEngine` (`batch_size` bounds the requests decoded together).
        fallback: where continuous batching cannot run (see `continuous_batching_unavailable`), warn once and
            generate with the HF engine's refilling batch; False: raise `ValueError` instead.

    Example:
        >>> engine = ContinuousBatchingEngine(model, tokenizer)  # doctest: +SKIP
        >>> with engine.running():  # doctest: +SKIP
        ...     engine.generate([GenerateRequest("Question: 2+2?\\nAnswer:", 8, ("\\n",))], chat=False)[0].text
        ' 4'
    """

    name = "continuous"

    def __init__(self, model: torch.nn.Module, tokenizer: Any, *, batch_size: int = default("batch_size"),
                 pack_choices: bool | None = None, sync_ranks: bool = False, fallback: bool = True):
        super().__init__(model, tokenizer, batch_size=batch_size, pack_choices=pack_choices, sync_ranks=sync_ranks)
        self.unavailable = continuous_batching_unavailable(model, sync_ranks=sync_ranks)
        if self.unavailable and not fallback:
            raise ValueError(f"engine='continuous' cannot run here: {self.unavailable}. Use engine='hf'.")

    def generate(self, requests: Sequence[GenerateRequest], *, chat: bool, bar: Any = None) -> list[Answer]:
        """Greedy answers, in the order of `requests`, from one continuous-batching session."""
        # asked again: autocast, a manager of the model's own and the like can change between calls
        why = continuous_batching_unavailable(self.model, sync_ranks=self.sync_ranks) or _mixed_precision(self.model)
        if why:
            warn_once(f"no-continuous:{why}", f"forgetwatch: engine='continuous' cannot run here ({why}): generating "
                      "with the HF engine's refilling batch instead.")
            return super().generate(requests, chat=chat, bar=bar)
        requests = list(requests)
        if not requests:
            return []
        tokenizer = self.tokenizer
        ids = encode_prompts(tokenizer, requests, chat, self._check_context)
        eos, pad_id = self.eos_token_ids, pad_token_id(tokenizer)
        tokens, logprobs = self._run(ids, [r.max_new_tokens for r in requests], eos)
        from transformers import StopStringCriteria

        # one matcher per set of stop strings: building one reads the whole vocabulary (~60 ms for SmolLM2's)
        criteria = {stops: StopStringCriteria(tokenizer, list(stops)) for stops in {tuple(r.stops) for r in requests} if stops}
        out = []
        for x, r, toks, lps in zip(ids, requests, tokens, logprobs, strict=True):
            toks = _cut_at_stop(criteria[tuple(r.stops)], pad_id, x, toks, eos) if r.stops else toks
            bad = any(not (lp == lp and abs(lp) != float("inf")) for lp in lps[: len(toks)])
            out.append(cut_answer(tokenizer, toks, eos, pad_id, r.max_new_tokens, list(r.stops), bad))
            if bar is not None:
                bar.update(1)
        return out

    def _run(self, ids: list[list[int]], budgets: list[int], eos: list[int]) -> tuple[list[list[int]], list[list[float]]]:
        from transformers import GenerationConfig

        ContinuousBatchingConfig = _config_class()

        model = self.model
        gen_config = GenerationConfig(max_new_tokens=max(budgets), do_sample=False, num_beams=1,
                                      pad_token_id=pad_token_id(self.tokenizer), eos_token_id=eos or None)
        cb_config = ContinuousBatchingConfig(
            page_size=_PAGE_SIZE,
            num_blocks=_blocks_needed(ids, budgets, self.batch_size),
            max_batch_tokens=max(max(map(len, ids)), 256),
            max_requests_per_batch=self.batch_size,
            return_logprobs=True,
            auto_switch_to_flash=False,  # the attention the user chose: flash is not installed by forgetwatch
        )
        tokens: dict[str, list[int]] = {}
        logprobs: dict[str, list[float]] = {}
        with _autocast_in_every_thread(model), model.continuous_batching_context_manager(
                generation_config=gen_config, continuous_batching_config=cb_config, block=True, timeout=30,
                warmup=False) as manager, _hard_stop_on_error(manager):
            for i, (x, n) in enumerate(zip(ids, budgets, strict=True)):
                manager.add_request(x, request_id=str(i), max_new_tokens=n, eos_token_id=eos or -1)
            while len(tokens) < len(ids):
                result = manager.get_result(timeout=_POLL_S)
                if result is None:
                    if not manager.is_running():
                        raise RuntimeError("transformers' continuous batching stopped before every answer was written "
                                           f"({len(tokens)} of {len(ids)}); its log above says why")
                    continue
                if result.is_finished():
                    if result.error is not None:  # transformers ends a failed request as finished, with no tokens
                        raise RuntimeError(f"transformers' continuous batching failed: {result.error}")
                    tokens[result.request_id] = list(result.generated_tokens)
                    logprobs[result.request_id] = list(getattr(result, "logprobs", None) or [])
                    if len(logprobs[result.request_id]) < len(tokens[result.request_id]):
                        # without them a NaN would pass for an answer
                        raise RuntimeError("transformers' continuous batching returned no log-probabilities, which "
                                           "forgetwatch reads to flag NaN / inf answers")
        keys = [str(i) for i in range(len(ids))]
        return [tokens[k] for k in keys], [logprobs[k] for k in keys]


@contextlib.contextmanager
def _hard_stop_on_error(manager: Any) -> Iterator[None]:
    """On an error (or Ctrl-C) stop the generation thread at once, failing what is queued: by default transformers'
    exit flushes the queue, generating every answer nobody will read."""
    try:
        yield
    except BaseException:
        manager.stop(block=True, timeout=30, hard_stop=True)
        raise


def _config_class() -> Any:
    try:
        from transformers.generation.configuration_utils import ContinuousBatchingConfig
    except ImportError:
        return None
    return ContinuousBatchingConfig


def _mixed_precision(model: torch.nn.Module) -> str | None:
    """Why the paged cache cannot hold the model's keys and values: it is made in the weights' dtype, and autocast to
    another dtype (the caller's, or the one accelerate wraps a mixed-precision Trainer's model in) writes others."""
    device_type = next(model.parameters()).device.type
    dtype = getattr(model, "dtype", torch.float32)
    if torch.is_autocast_enabled(device_type) and torch.get_autocast_dtype(device_type) != dtype:
        return (f"autocast to {str(torch.get_autocast_dtype(device_type)).removeprefix('torch.')} over "
                f"{str(dtype).removeprefix('torch.')} weights: its paged cache holds the weights' dtype only")
    if "_original_forward" in model.__dict__ and dtype == torch.float32:  # accelerate's mixed-precision wrapper
        return ("the Trainer's mixed precision (bf16 / fp16 autocast) over float32 weights: its paged cache holds the "
                "weights' dtype only")
    return None


@contextlib.contextmanager
def _autocast_in_every_thread(model: torch.nn.Module) -> Iterator[None]:
    """Autocast is a thread's own state, and continuous batching decodes in a thread of its own: a caller's
    `torch.autocast` (the watcher scoring bf16 weights in the trainer's bf16 autocast) would not reach it. So for
    the session the model's forward is wrapped in the caller's autocast, as accelerate wraps a Trainer's model."""
    device_type = next(model.parameters()).device.type
    if not torch.is_autocast_enabled(device_type):
        yield
        return
    dtype = torch.get_autocast_dtype(device_type)
    own = model.__dict__.get("forward")
    inner = model.forward

    @functools.wraps(inner)
    def forward(*args: Any, **kwargs: Any) -> Any:
        with torch.autocast(device_type, dtype=dtype):
            return inner(*args, **kwargs)

    model.forward = forward
    try:
        yield
    finally:
        if own is not None:
            model.forward = own
        else:
            del model.forward


def _blocks_needed(ids: list[list[int]], budgets: list[int], batch_size: int) -> int:
    """Pages for the `batch_size` longest requests at once (prompt + budget), and a few spare."""
    need = sorted((-(-(len(x) + n) // _PAGE_SIZE) for x, n in zip(ids, budgets, strict=True)), reverse=True)
    return sum(need[:batch_size]) + 8


def _cut_at_stop(stop: Any, pad: int, prompt: list[int], tokens: list[int], eos: list[int]) -> list[int]:
    """`tokens` up to the one that completes a stop string, matched as the HF engine's refilling batch matches it
    (transformers' `StopStringCriteria` `stop` on the sequence's last tokens, prompt included)."""
    K = stop.maximum_token_len
    for k in range(1, len(tokens) + 1):
        if tokens[k - 1] in eos:
            return tokens
        tail = (prompt + tokens[:k])[-K:]
        if bool(stop(torch.tensor([[pad] * (K - len(tail)) + tail]), None)[0]):
            return tokens[:k]
    return tokens

