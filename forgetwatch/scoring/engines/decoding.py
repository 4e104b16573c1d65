"""Greedy decoding for the Hugging Face engine: the refilling batch (`RefillLoop`: finished rows leave, waiting prompts
take their place in the KV cache), the pieces static batches share with it (left padding, a logits watcher for NaN and
+inf, the answer cut at the end of turn or a stop string: `cut_answer`, which the vLLM and continuous engines use too),
and the collective that keeps every rank stepping together under FSDP / ZeRO-3.

Example:
    >>> cut_answer(tokenizer, tokens, eos=[2], pad_id=0, max_new_tokens=32, stops=["\\n\\n"], bad=False)  # doctest: +SKIP
    Answer(text='Paris', tokens=2, stopped=True, bad=False)
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..forward import (
    CACHE_NAMES,
    cache_length,
    cache_of,
    call,
    forward_parameters,
    logits_to_keep_kwargs,
    model_device,
    pad_token_id,
    warn_once,
)
from ..requests import Answer, GenerateRequest

__all__ = ["OOM_ERRORS", "NonFinite", "Prompt", "RefillLoop", "Slot", "cut_answer", "generate_refill", "left_pad",
           "most_over_ranks"]

logger = logging.getLogger(__name__)

OOM_ERRORS = tuple({getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError), torch.cuda.OutOfMemoryError})


def most_over_ranks(n: int) -> int:
    """The largest `n` over all ranks (a collective: every rank calls it)."""
    dist = torch.distributed
    # NCCL reduces CUDA tensors only; gloo (and the CPU) takes CPU tensors
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    t = torch.tensor([n], dtype=torch.long, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


@dataclass
class Prompt:
    probe_index: int
    ids: list[int]


def left_pad(batch: list[Prompt], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    T = max(len(p.ids) for p in batch)
    input_ids = torch.full((len(batch), T), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), T), dtype=torch.long)
    for b, p in enumerate(batch):
        input_ids[b, T - len(p.ids) :] = torch.tensor(p.ids)
        mask[b, T - len(p.ids) :] = 1
    return input_ids, mask


def cut_answer(tokenizer: Any, tokens: list[int], eos: Sequence[int], pad_id: int, max_new_tokens: int, stops: Sequence[str],
            bad: bool) -> Answer:
    """The answer in generated `tokens`: up to the end of turn, else without trailing padding; cut at a stop string."""
    end = next((j for j, t in enumerate(tokens) if t in eos), None)
    if end is None:  # no end of turn: cut by a stop string (then padded, in a static batch), or ran to the limit
        end = len(tokens)
        while end and tokens[end - 1] == pad_id:
            end -= 1
    text = tokenizer.decode(tokens[:end], skip_special_tokens=True)
    cut = min((text.find(s) for s in stops if s in text), default=-1)
    stopped = end < max_new_tokens or cut >= 0
    return Answer(text[:cut] if cut >= 0 else text, end, stopped, bad)


@dataclass
class Slot:
    """A prompt in a refilling batch: what it has generated so far, and when it must stop."""

    index: int  # position in the requests
    ids: list[int]  # the prompt's tokens
    max_new_tokens: int
    stop: Any  # a StopStringCriteria, or None
    tokens: list[int] = field(default_factory=list)
    bad: bool = False  # a NaN / +inf among its logits


class _CannotRefill(Exception):
    """The model's KV cache cannot be merged and split by rows (or the forward did not read it back)."""


class RefillLoop:
    """Greedy decoding where finished rows leave the batch and waiting prompts take their place.

    The batch holds the rows being decoded: a KV cache whose per-layer keys and values are (B, H, T, D), left-padded,
    with a (B, T) attention mask, holding every row's tokens but the last one it generated (fed by the next forward).
    Each forward is either a decode step of every row (one token each) or the prefill of waiting prompts, which are
    then merged into the batch (both caches left-padded to one length and stacked); rows that end are dropped with
    `index_select`, and columns no row reads any more are cut off. A row's logits are its own whatever the other rows
    are (only their padding differs), so its greedy answer is what `model.generate` gives, up to near-ties in fp32.
    """

    def __init__(self, engine: Any, eos: set[int], pad_id: int):
        self.engine, self.model, self.eos, self.pad_id = engine, engine.model, eos, pad_id
        self.device = model_device(engine.model)
        named, takes_kwargs = forward_parameters(self.model)
        self.cache_name = next((n for n in CACHE_NAMES if n in named), CACHE_NAMES[0] if takes_kwargs else None)
        if self.cache_name is None:
            raise _CannotRefill(f"the model's forward ({type(self.model).__name__}) takes no KV cache by name")

    def run(self, waiting_slots: list[Slot], finish: Callable[[Slot], None]) -> None:
        engine, model = self.engine, self.model
        waiting = deque(waiting_slots)
        batch_size = engine.batch_size
        # Waiting prompts join when a quarter of the rows are free: each prefill is a forward of its own, where the
        # rows already decoding wait, so joining one prompt at a time would add a forward per prompt.
        admit_at = max(1, batch_size // 4)
        self.batch: list[Slot] = []
        self.cache: Any = None
        self.mask: torch.Tensor | None = None
        while True:
            has_work = bool(waiting or self.batch)
            if engine.sync_ranks:
                # Agreed before every forward (ZeRO-3 / FSDP: each forward is a collective): a rank with nothing left
                # runs a one-token forward alongside the others' until every rank is done.
                if not most_over_ranks(int(has_work)):
                    return
                if not has_work:
                    call(model, {"input_ids": torch.full((1, 1), self.pad_id, device=self.device), "use_cache": False})
                    continue
            elif not has_work:
                return
            free = batch_size - len(self.batch)
            new: list[Slot] = []
            try:
                if waiting and (free >= min(admit_at, len(waiting)) or not self.batch):
                    new = [waiting.popleft() for _ in range(min(free, len(waiting)))]
                    rows, logits = self._prefill(new)
                else:
                    rows, logits = self._decode()
            except OOM_ERRORS:
                if batch_size == 1:
                    raise
                batch_size = max(1, batch_size // 2)
                admit_at = max(1, batch_size // 4)
                logger.warning("out of memory while generating; retrying with batch_size=%d", batch_size)
                again = sorted(self.batch + new, key=lambda s: len(s.ids))  # shortest first: extendleft reverses
                for s in again:
                    s.tokens, s.bad = [], False
                waiting.extendleft(again)
                self.batch, self.cache, self.mask = [], None, None
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
                continue
            self._step(rows, logits, finish)

    def _prefill(self, new: list[Slot]) -> tuple[range, torch.Tensor]:
        """One forward over the waiting prompts `new` (left-padded), merged into the batch after its rows."""
        input_ids, mask = left_pad([Prompt(s.index, s.ids) for s in new], self.pad_id)
        position_ids = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)  # as `generate` numbers left-padded rows
        kwargs = {"input_ids": input_ids.to(self.device), "attention_mask": mask.to(self.device),
                  "position_ids": position_ids.to(self.device), "use_cache": True, **logits_to_keep_kwargs(self.model, 1)}
        output = call(self.model, kwargs)
        cache = cache_of(output)
        layers = getattr(cache, "layers", None)
        if not layers or any(type(layer).__name__ != "DynamicLayer" or getattr(layer, "keys", None) is None for layer in layers):
            raise _CannotRefill(f"the model returned a KV cache whose rows cannot be merged and dropped ({type(cache).__name__})")
        mask = mask.to(self.device)
        if self.cache is None:
            self.cache, self.mask = cache, mask
        else:
            T = max(self.mask.shape[1], mask.shape[1])
            for old, add in zip(self.cache.layers, layers, strict=True):
                old.keys = torch.cat([pad_left(old.keys, T, 2), pad_left(add.keys, T, 2)])
                old.values = torch.cat([pad_left(old.values, T, 2), pad_left(add.values, T, 2)])
            self.mask = torch.cat([pad_left(self.mask, T, 1), pad_left(mask, T, 1)])
        self.batch += new
        return range(len(self.batch) - len(new), len(self.batch)), output.logits[:, -1]

    def _decode(self) -> tuple[range, torch.Tensor]:
        """One forward: every row's last generated token, after its cached tokens."""
        assert self.mask is not None
        B = len(self.batch)
        self.mask = torch.cat([self.mask, self.mask.new_ones(B, 1)], dim=1)
        position_ids = self.mask.sum(-1, keepdim=True) - 1
        input_ids = torch.tensor([[s.tokens[-1]] for s in self.batch], device=self.device)
        kwargs = {"input_ids": input_ids, "attention_mask": self.mask, "position_ids": position_ids,
                  self.cache_name: self.cache, "use_cache": True, **logits_to_keep_kwargs(self.model, 1)}
        output = call(self.model, kwargs)
        if cache_length(self.cache) != self.mask.shape[1]:
            raise _CannotRefill(f"the model's forward did not read back the KV cache passed as `{self.cache_name}`")
        return range(B), output.logits[:, -1]

    def _step(self, rows: range, logits: torch.Tensor, finish: Callable[[Slot], None]) -> None:
        """Append each row's greedy token; rows that end leave the batch."""
        scores = logits.to(dtype=torch.float32)  # as `generate`: greedy over fp32 logits
        # -inf is how processors mask tokens (none run here): watch NaN and +inf, as NonFinite does
        bad = (torch.isnan(scores).any(-1) | torch.isposinf(scores).any(-1)).tolist()
        tokens = scores.argmax(dim=-1).tolist()
        ended = []
        for r, t, b in zip(rows, tokens, bad, strict=True):
            slot = self.batch[r]
            slot.tokens.append(t)
            slot.bad = slot.bad or b
            if t in self.eos or len(slot.tokens) >= slot.max_new_tokens:
                ended.append(r)
        for stop in {id(s.stop): s.stop for s in (self.batch[r] for r in rows) if s.stop is not None}.values():
            mine = [r for r in rows if self.batch[r].stop is stop and r not in ended]
            if mine:
                K = stop.maximum_token_len  # the stop string is matched on the sequence's last K tokens, prompt included
                tails = [(self.batch[r].ids + self.batch[r].tokens)[-K:] for r in mine]
                tails = torch.tensor([[self.pad_id] * (K - len(t)) + t for t in tails])
                ended += [r for r, hit in zip(mine, stop(tails, None).tolist(), strict=True) if hit]
        if not ended:
            return
        for r in sorted(ended):
            finish(self.batch[r])
        keep = [r for r in range(len(self.batch)) if r not in set(ended)]
        self.batch = [self.batch[r] for r in keep]
        if not keep:
            self.cache, self.mask = None, None
            return
        assert self.mask is not None
        index = torch.tensor(keep, device=self.mask.device)
        mask = self.mask.index_select(0, index)
        first = int(mask.any(0).int().argmax())  # columns before it are padding in every row left
        self.mask = mask[:, first:]
        for layer in self.cache.layers:
            layer.keys = layer.keys.index_select(0, index.to(layer.keys.device))[:, :, first:]
            layer.values = layer.values.index_select(0, index.to(layer.values.device))[:, :, first:]


def pad_left(t: torch.Tensor, length: int, dim: int) -> torch.Tensor:
    """`t` with zeros before its entries along `dim`, up to `length`."""
    missing = length - t.shape[dim]
    if not missing:
        return t
    shape = list(t.shape)
    shape[dim] = missing
    return torch.cat([t.new_zeros(shape), t], dim=dim)


class NonFinite:
    """A logits processor that only watches: which rows ever had a NaN or infinite logit (greedy decoding would pick
    token 0 or the first NaN and carry on, producing a plain-looking answer). No host sync per step."""

    def __init__(self):
        self.bad: torch.Tensor | None = None

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        # -inf is how processors mask tokens (none run here, but keep to NaN and +inf, which no processor writes)
        now = torch.isnan(scores).any(-1) | torch.isposinf(scores).any(-1)
        self.bad = now if self.bad is None else self.bad | now
        return scores


def generate_refill(engine: Any, ids: list[list[int]], requests: list[GenerateRequest], bar: Any) -> list[Answer] | None:
    """Greedy answers to `requests` (their prompts encoded as `ids`) decoded by `engine` (an `HFEngine`) in a refilling
    batch; None (said once) when the model's KV cache cannot be merged and split by rows, decided on the first forwards
    (alike on every rank): the caller then runs static batches."""
    from transformers import StopStringCriteria

    model, tokenizer = engine.model, engine.tokenizer
    eos, pad_id = engine.eos_token_ids, pad_token_id(tokenizer)
    criteria = {stops: StopStringCriteria(tokenizer, list(stops)) for stops in {tuple(r.stops) for r in requests} if stops}
    slots = [
        Slot(i, x, r.max_new_tokens, criteria.get(tuple(r.stops))) for i, (x, r) in enumerate(zip(ids, requests, strict=True))
    ]
    slots.sort(key=lambda s: len(s.ids), reverse=True)  # longest first, as static batches (stable: ties keep order)
    out: list[Answer] = [Answer("", 0, False)] * len(requests)

    def finish(slot: Slot) -> None:
        r = requests[slot.index]
        out[slot.index] = cut_answer(tokenizer, slot.tokens, eos, pad_id, r.max_new_tokens, list(r.stops), slot.bad)
        if bar is not None:
            bar.update(1)

    try:
        RefillLoop(engine, set(eos), pad_id).run(slots, finish)
    except _CannotRefill as e:
        warn_once(f"no-refill:{type(model).__name__}", f"forgetwatch: {e}: generating in static batches instead "
                  "(same answers; each batch decodes until its longest answer ends).")
        return None
    return out
