"""The Hugging Face engine: runs scoring requests with a causal LM in this process (the torch code of forgetwatch).

- Log-likelihood: one forward per question: the question's tokens are followed by every option's tokens in the same
  row, and a block attention mask lets each option see the question and itself only, with positions restarting
  after the question. A prefix every context shares (few-shot exemplars) is computed once, and logits are computed
  only for the positions that are read.
- Next token (letters): one forward, left-padded, the last position's logits.
- Generation: greedy decoding in a refilling batch: prompts are taken longest first, and when an answer ends its row
  leaves the batch (its keys and values dropped) and waiting prompts take the free rows (prefilled, then merged into
  the batch's KV cache, left-padded), so every decoded token slot belongs to an answer still being written. A model
  whose cache cannot be merged that way (not a plain `DynamicCache`) gets static batches through `model.generate`,
  said once in a warning; `HFEngine(refill=False)` asks for them.

Log-softmax runs in fp32 so results do not move with batch size; requests are sorted by length to keep padding low;
the batch is halved on out-of-memory. With `sync_ranks`, every rank runs as many forwards as the busiest and
generation keeps stepping until all ranks finish (the refilling loop agrees on it before every forward and a rank with
nothing left runs a one-token forward; static batches use `synced_gpus`), so FSDP / ZeRO-3 never wait forever.
"""

from __future__ import annotations

import contextlib
import logging
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ...options import default
from ..forward import (
    CACHE_NAMES,
    PrefixCache,
    cache_length,
    cache_of,
    call,
    check_logits_kept,
    forward_parameters,
    logits_to_keep_kwargs,
    model_device,
    no_grad_context,
    pad_token_id,
    untouched,
    warn_once,
)
from ..lengths import over_limit, refuse_over
from ..requests import (
    Answer,
    Continuations,
    GenerateRequest,
    LoglikRequest,
    NextTokenRequest,
    ProbeSetError,
    encode,
    encode_prompts,
)

__all__ = ["HFEngine"]

logger = logging.getLogger(__name__)

_OOM_ERRORS = tuple({getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError), torch.cuda.OutOfMemoryError})


class HFEngine:
    """Runs scoring requests with a Hugging Face causal LM (`AutoModelForCausalLM`) in this process.

    Args:
        model: the model, in any mode; `running()` leaves it exactly as found.
        tokenizer: its tokenizer.
        batch_size: questions (or prompts) per forward, halved automatically on out-of-memory.
        pack_choices: put all continuations of a context in one row behind it (block attention mask). `None` uses it
            where the attention implementation accepts custom masks (eager, sdpa).
        sync_ranks: every rank of the process group runs the same calls together (`score_probes(...,
            sync_ranks=True)`): each runs as many forwards as the busiest rank, in generation too.
        refill: generate in a refilling batch (finished answers leave, waiting prompts take their rows); False: static
            batches through `model.generate`, each decoding until its longest answer ends. Greedy answers are the
            same either way but for near-ties in the last bits (the rows' padding differs).

    Example:
        >>> engine = HFEngine(model, tokenizer, batch_size=8)  # doctest: +SKIP
        >>> with engine.running():  # doctest: +SKIP
        ...     engine.generate([GenerateRequest("Question: 2+2?\\nAnswer:", 8, ("\\n",))], chat=False)[0].text
        ' 4'
    """

    def __init__(self, model: torch.nn.Module, tokenizer: Any, *, batch_size: int = default("batch_size"), pack_choices: bool | None = None,
                 sync_ranks: bool = False, refill: bool = True):
        if batch_size < 1:
            raise ValueError(f"`batch_size` must be at least 1, got {batch_size}")
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.pack_choices = pack_choices
        self.sync_ranks = sync_ranks
        self.refill = refill

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """Eval mode and no gradients inside; afterwards the model's flags and the RNG states as before."""
        with untouched(self.model), no_grad_context():
            yield

    @property
    def eos_token_ids(self) -> list[int]:
        """The tokens that end an answer: the tokenizer's EOS and the model's generation config's."""
        return _eos_ids(self.model, self.tokenizer)

    def max_over_ranks(self, n: int) -> int:
        """The largest `n` over the ranks that score together (a collective with `sync_ranks`), else `n`."""
        return _most_over_ranks(n) if self.sync_ranks else n

    # -- log-likelihood of continuations --------------------------------------------------------------------------

    def loglik(self, requests: Sequence[LoglikRequest], *, chat: bool, read_next: bool = False, shared: str | None = None,
               bar: Any = None) -> list[Continuations]:
        """Teacher-force every continuation after its context: per token, its log-probability and the greedy argmax.

        With `read_next`, the argmax right after each continuation's last token is read too (is it a boundary?).
        `shared` is text every context starts with (few-shot exemplars): its keys and values are computed once and
        reused by every row, instead of once per row.
        """
        model, tokenizer = self.model, self.tokenizer
        contexts = [r.context for r in requests]
        continuations = [r.continuations for r in requests]
        # Tokenise like lm-evaluation-harness: continuation tokens = encode(context + cont)[len(encode(context)):].
        ctx_ids = encode(tokenizer, contexts, chat)
        flat = [c + o for c, opts in zip(contexts, continuations, strict=True) for o in opts]
        whole_ids = encode(tokenizer, flat, chat)
        ends, k = [], 0
        for opts in continuations:  # each option's last position (packed or not, options start where the context ends)
            ends.append(max(len(w) for w in whole_ids[k : k + len(opts)]) + int(read_next))
            k += len(opts)
        self._check_context([r.probe_id for r in requests], ends, "their answers")
        pack = self.pack_choices if self.pack_choices is not None else _accepts_custom_masks(model)
        device = model_device(model)
        prefix = _shared_prefix(tokenizer, shared, ctx_ids, chat) if shared else []
        # 100 exemplar tokens before a 20-token question: one forward here, then each row carries its own part only.
        # None when the model cannot take a cache back (said once in a warning): then every row carries the prefix.
        prefix_cache = PrefixCache.build(model, prefix, device) if prefix else None
        P = prefix_cache.length if prefix_cache else 0

        rows: list[_Row] = []
        tokens: list[list[list[int]]] = []
        k = 0
        for pi, (ctx, opts) in enumerate(zip(ctx_ids, continuations, strict=True)):
            option_tokens = []
            for _ in opts:
                toks = whole_ids[k][len(ctx) :]
                k += 1
                if not toks:  # the option merged into the context's last token; score that token instead
                    toks = whole_ids[k - 1][-1:]
                option_tokens.append(toks)
            tokens.append(option_tokens)
            own = ctx[P:]
            if pack:
                rows.append(_Row(pi, own, option_tokens, list(range(len(opts)))))
            else:
                rows.extend(_Row(pi, own, [t], [j]) for j, t in enumerate(option_tokens))
        rows.sort(key=lambda r: r.length, reverse=True)

        extra = int(read_next)
        logprobs = [[np.zeros(len(t), np.float64) for t in opts] for opts in tokens]
        argmax = [[np.zeros(len(t) + extra, np.int64) for t in opts] for opts in tokens]
        pad_id = pad_token_id(tokenizer)

        def run(batch: list[_Row], keep: bool = True) -> None:
            T = max(r.length for r in batch)
            # Left padding puts every row's options at the end, so the last K positions hold all logits we read.
            K = max(sum(map(len, r.options)) + 1 for r in batch)
            B = len(batch)
            input_ids = torch.full((B, T), pad_id, dtype=torch.long)
            position_ids = torch.zeros((B, T), dtype=torch.long)
            segment = torch.full((B, T), -1, dtype=torch.long)  # -1 padding, 0 question, j + 1 option j
            reads_row, reads_pos, reads_tok, reads_at = [], [], [], []
            for b, r in enumerate(batch):
                o = T - r.length
                L = len(r.context)
                input_ids[b, o : o + L] = torch.tensor(r.context)
                position_ids[b, o : o + L] = torch.arange(L)
                segment[b, o : o + L] = 0
                s = o + L
                for j, toks in enumerate(r.options):
                    n = len(toks)
                    input_ids[b, s : s + n] = torch.tensor(toks)
                    position_ids[b, s : s + n] = torch.arange(L, L + n)
                    segment[b, s : s + n] = j + 1
                    # token i of the option is predicted by the logits at the position before it (the question's last
                    # token for i = 0); with read_next also the option's last position: what comes after it.
                    # Kept positions are offset by T - K.
                    preds = [o + L - 1] + list(range(s, s + n - 1 + extra))
                    reads_row += [b] * len(preds)
                    reads_pos += [p - (T - K) for p in preds]
                    reads_tok += list(toks) + [pad_id] * extra  # the token after is unknown: its log-prob is not used
                    reads_at += [(r.probe_index, r.option_ids[j], t) for t in range(len(preds))]
                    s += n
            kwargs: dict[str, Any] = {"input_ids": input_ids.to(device), "position_ids": (position_ids + P).to(device), "use_cache": False}
            if len(batch) and any(len(r.options) > 1 for r in batch):
                kwargs["attention_mask"] = _block_mask(segment, model, P).to(device)
            else:
                kwargs["attention_mask"] = torch.cat([torch.ones(B, P, dtype=torch.long), (segment >= 0).long()], dim=1).to(device)
            if prefix_cache:
                kwargs.update(prefix_cache.for_batch(B))
            rows_t, pos_t = torch.tensor(reads_row, device=device), torch.tensor(reads_pos, device=device)
            kwargs.update(logits_to_keep_kwargs(model, K))
            head = model.get_output_embeddings() if "logits_to_keep" in kwargs else None
            gather, handle = None, None
            if head is not None:
                if isinstance(head, torch.nn.Module):
                    gather = _gather_read_positions(rows_t, pos_t, K)
                    handle = head.register_forward_pre_hook(gather)
            try:
                logits = call(model, kwargs).logits
            finally:
                if handle is not None:
                    handle.remove()
            if gather is not None and gather.gathered and logits.shape[:2] == (1, len(reads_tok)):
                logits = logits[0]  # (R, V): the output head ran on the read positions only
            else:
                if gather is not None and gather.gathered:  # a model that reshapes its head's output: run it plainly
                    if prefix_cache:
                        kwargs.update(prefix_cache.for_batch(B))  # the first forward grew the last copy
                    logits = call(model, kwargs).logits
                else:
                    check_logits_kept(model, logits, kwargs)
                logits = logits[:, -K:][rows_t, pos_t]
            if not keep:
                return
            logprobs_t = torch.log_softmax(logits.float(), dim=-1)  # fp32: stable across batch sizes and precisions
            reads = torch.arange(len(reads_tok), device=logprobs_t.device)
            picked = logprobs_t[reads, torch.tensor(reads_tok, device=logprobs_t.device)].double().cpu().numpy()
            greedy = logprobs_t.argmax(dim=-1).cpu().numpy()
            for (pi, j, t), lp, g in zip(reads_at, picked, greedy, strict=True):
                argmax[pi][j][t] = g
                if t < len(logprobs[pi][j]):
                    logprobs[pi][j][t] = lp

        self._run_batches(rows, run, bar)
        return [Continuations(t, lp, am) for t, lp, am in zip(tokens, logprobs, argmax, strict=True)]

    # -- next-token log-probabilities (letters) -------------------------------------------------------------------

    def next_token_logprobs(self, requests: Sequence[NextTokenRequest], *, chat: bool, bar: Any = None) -> list[np.ndarray]:
        """Per request, the fp32 log-probabilities of its `token_ids` as the next token after its context."""
        model = self.model
        ids = encode(self.tokenizer, [r.context for r in requests], chat)
        self._check_context([r.probe_id for r in requests], [len(x) + 1 for x in ids], "the answer's letter")
        prompts = sorted((_Prompt(i, x) for i, x in enumerate(ids)), key=lambda p: len(p.ids), reverse=True)
        device = model_device(model)
        pad_id = pad_token_id(self.tokenizer)
        scores: list[np.ndarray] = [np.zeros(0)] * len(requests)

        def run(batch: list[_Prompt], keep: bool = True) -> None:
            input_ids, mask = _left_pad(batch, pad_id)
            position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
            kwargs = {"input_ids": input_ids.to(device), "attention_mask": mask.to(device), "position_ids": position_ids.to(device), "use_cache": False}
            kwargs.update(logits_to_keep_kwargs(model, 1))
            logits = call(model, kwargs).logits
            check_logits_kept(model, logits, kwargs)
            logits = logits[:, -1]
            if not keep:
                return
            logprobs = torch.log_softmax(logits.float(), dim=-1)
            for b, p in enumerate(batch):
                wanted = torch.tensor(requests[p.probe_index].token_ids, device=logprobs.device)
                scores[p.probe_index] = logprobs[b, wanted].double().cpu().numpy()

        self._run_batches(prompts, run, bar)
        return scores

    # -- generation -----------------------------------------------------------------------------------------------

    def generate(self, requests: Sequence[GenerateRequest], *, chat: bool, bar: Any = None) -> list[Answer]:
        """Greedy answers, in the order of `requests` (with `sync_ranks` every rank must pass its requests in the same
        call). In a refilling batch all requests share one queue, whatever their budgets and stop strings; static
        batches run once per (`max_new_tokens`, `stops`), in the order they first appear."""
        if self.refill:  # with sync_ranks, a rank with no requests still steps with the others
            answers = self._generate_refill(list(requests), chat, bar)
            if answers is not None:
                return answers
        out: list[Answer] = [Answer("", 0, False)] * len(requests)
        groups: dict[tuple[int, tuple[str, ...]], list[int]] = {}
        for i, r in enumerate(requests):
            groups.setdefault((r.max_new_tokens, tuple(r.stops)), []).append(i)
        for (max_new_tokens, stops), idx in groups.items():
            answers = self._generate([requests[i] for i in idx], chat, max_new_tokens, list(stops), bar)
            for i, a in zip(idx, answers, strict=True):
                out[i] = a
        return out

    def _generate(self, requests: list[GenerateRequest], chat: bool, max_new_tokens: int, stops: list[str],
                  bar: Any) -> list[Answer]:
        from transformers import GenerationConfig, LogitsProcessorList

        model, tokenizer = self.model, self.tokenizer
        ids = encode(tokenizer, [r.prompt for r in requests], chat)
        self._check_context([r.probe_id for r in requests], [len(x) + max_new_tokens for x in ids],
                            f"{max_new_tokens} generated tokens")
        prompts = sorted((_Prompt(i, x) for i, x in enumerate(ids)), key=lambda p: len(p.ids), reverse=True)
        device = model_device(model)
        pad_id = pad_token_id(tokenizer)
        eos = self.eos_token_ids
        gen_config = GenerationConfig(
            max_new_tokens=max_new_tokens,
            do_sample=False,
            num_beams=1,
            pad_token_id=pad_id,
            eos_token_id=eos or None,
            stop_strings=stops or None,
        )
        out_answers: list[Answer] = [Answer("", 0, False)] * len(requests)

        def run(batch: list[_Prompt], keep: bool = True) -> None:
            input_ids, mask = _left_pad(batch, pad_id)
            watch = _NonFinite()
            out = model.generate(
                input_ids=input_ids.to(device),
                attention_mask=mask.to(device),
                generation_config=gen_config,
                tokenizer=tokenizer if stops else None,
                logits_processor=LogitsProcessorList([watch]),
                # ZeRO-3 / FSDP: every rank must keep stepping until all have finished
                synced_gpus=self.sync_ranks,
            )
            if not keep:
                return
            bad = watch.bad.cpu().tolist() if watch.bad is not None else [False] * len(batch)
            new = out[:, input_ids.shape[1] :].cpu().tolist()
            for b, p in enumerate(batch):
                out_answers[p.probe_index] = cut_answer(tokenizer, new[b], eos, pad_id, max_new_tokens, stops, bool(bad[b]))

        self._run_batches(prompts, run, bar)
        return out_answers

    def _generate_refill(self, requests: list[GenerateRequest], chat: bool, bar: Any) -> list[Answer] | None:
        """Greedy answers decoded in a refilling batch; None (said once) when the model's KV cache cannot be merged
        and split by rows, decided on the first forwards (alike on every rank): then static batches run instead."""
        from transformers import StopStringCriteria

        model, tokenizer = self.model, self.tokenizer
        ids = encode_prompts(tokenizer, requests, chat, self._check_context)
        eos, pad_id = self.eos_token_ids, pad_token_id(tokenizer)
        criteria = {stops: StopStringCriteria(tokenizer, list(stops)) for stops in {tuple(r.stops) for r in requests} if stops}
        slots = [_Slot(i, x, r.max_new_tokens, criteria.get(tuple(r.stops))) for i, (x, r) in enumerate(zip(ids, requests, strict=True))]
        slots.sort(key=lambda s: len(s.ids), reverse=True)  # longest first, as static batches (stable: ties keep order)
        out: list[Answer] = [Answer("", 0, False)] * len(requests)

        def finish(slot: _Slot) -> None:
            r = requests[slot.index]
            out[slot.index] = cut_answer(tokenizer, slot.tokens, eos, pad_id, r.max_new_tokens, list(r.stops), slot.bad)
            if bar is not None:
                bar.update(1)

        try:
            _RefillLoop(self, set(eos), pad_id).run(slots, finish)
        except _CannotRefill as e:
            warn_once(f"no-refill:{type(model).__name__}", f"forgetwatch: {e}: generating in static batches instead "
                      "(same answers; each batch decodes until its longest answer ends).")
            return None
        return out

    # -- shared by every kind of request --------------------------------------------------------------------------

    def _run_batches(self, items: list, run: Callable[..., None], bar: Any) -> None:
        """Call `run(batch)` on consecutive slices of `items`; on out-of-memory halve the slice and retry.

        With `sync_ranks`, every rank runs as many batches as the busiest one: shards of equal probe counts can still
        differ in batches (options scored one per row). The count is agreed before the first forward, and a rank with
        fewer batches then calls `run(items[:1], keep=False)` (a forward whose result is dropped) after its own: under
        FSDP / ZeRO-3 each forward is itself a collective, so the ranks' forwards must pair up with no other
        collective between them (agreeing afterwards, a rank that finished early would wait in the count while the
        others wait in their next forward's all-gather). An out-of-memory retry on one rank only adds batches there;
        a second count at the end evens that out under DDP (under FSDP the ranks are already out of step by then).
        """
        batch_size = self.batch_size
        target = _most_over_ranks(-(-len(items) // batch_size)) if self.sync_ranks else 0
        start = 0
        batches = 0
        while start < len(items):
            batch = items[start : start + batch_size]
            try:
                run(batch)
            except _OOM_ERRORS:
                if batch_size == 1:
                    raise
                batch_size = max(1, batch_size // 2)
                logger.warning("out of memory while scoring probes; retrying with batch_size=%d", batch_size)
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
                continue
            start += len(batch)
            batches += 1
            if bar is not None:
                bar.update(len({it.probe_index for it in batch}))
        if self.sync_ranks:
            for _ in range(target - batches):
                run(items[:1], keep=False)
            batches = max(batches, target)
            for _ in range(_most_over_ranks(batches) - batches):
                run(items[:1], keep=False)

    def _check_context(self, ids: Sequence[str | None], lengths: Sequence[int], what: str) -> None:
        """Refuse, before any forward, a probe whose tokens (with what is generated after them) pass the model's
        context: past it, learned positions fail with an index error and rotary ones read positions never trained, so
        the answer would mean nothing."""
        config = getattr(self.model, "config", None)
        limit = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
        if not isinstance(limit, int):
            return
        over = over_limit(ids, lengths, limit)
        # every rank decides alike (a rank that raised alone would leave the others waiting in a collective forward)
        if self.sync_ranks and _most_over_ranks(len(over)) and not over:
            raise ProbeSetError(f"a probe on another rank does not fit the model's context of {limit} tokens with {what} "
                                "(that rank names it)")
        refuse_over(over, limit, what)


def _most_over_ranks(n: int) -> int:
    """The largest `n` over all ranks (a collective: every rank calls it)."""
    dist = torch.distributed
    # NCCL reduces CUDA tensors only; gloo (and the CPU) takes CPU tensors
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    t = torch.tensor([n], dtype=torch.long, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def _eos_ids(model: Any, tokenizer: Any) -> list[int]:
    # a list, not a set: generation configs often hold a list of EOS ids (unhashable)
    eos = [t for t in (tokenizer.eos_token_id, getattr(getattr(model, "generation_config", None), "eos_token_id", None)) if t is not None]
    return sorted({int(x) for t in eos for x in (t if isinstance(t, (list, tuple)) else [t])})


def _accepts_custom_masks(model: torch.nn.Module) -> bool:
    impl = getattr(model.config, "_attn_implementation", None) or "eager"
    return impl in ("eager", "sdpa") and not _uses_alibi(model.config)


def _uses_alibi(config: Any) -> bool:
    # ALiBi models build their position bias from a 2-D padding mask (Bloom's `build_alibi_tensor` unpacks its shape),
    # so a packed 4-D mask crashes them: they score one option per row.
    return getattr(config, "model_type", "") in ("bloom", "mpt") or bool(getattr(config, "alibi", False))


@dataclass
class _Row:
    probe_index: int  # position in the requests being scored
    context: list[int]
    options: list[list[int]]  # token ids of each option in this row
    option_ids: list[int]  # which option of the probe each one is

    @property
    def length(self) -> int:
        return len(self.context) + sum(map(len, self.options))


def _shared_prefix(tokenizer, shared: str, ctx_ids: list[list[int]], chat: bool) -> list[int]:
    """The tokens of `shared` that every context starts with, or [] when not worth it or not possible."""
    # The last token may merge with the text that follows ("Question:" + " Who" vs "Question: "), so it is left to
    # the rows; and each row keeps at least one token of its own, whose logits predict its first answer token.
    ids = encode(tokenizer, [shared], chat)[0][:-1]
    if len(ids) < 16 or any(len(c) <= len(ids) or c[: len(ids)] != ids for c in ctx_ids):
        return []
    return ids


def _gather_read_positions(rows: torch.Tensor, pos: torch.Tensor, K: int):
    """A forward pre-hook for the output head: keep only the (row, position) pairs that are read.

    With left padding, `logits_to_keep=K` is set by the row with the most option tokens; the others' kept positions
    are mostly padding or question, and the vocabulary projection of those wasted ~20% of an MMLU forward. The head
    sees `(B, K, H)` hidden states and gets `(1, R, H)`, so the logits come back as `(1, R, V)`, one per read.
    """

    def hook(module, args):
        hidden = args[0] if args else None
        if not isinstance(hidden, torch.Tensor) or hidden.dim() != 3 or hidden.shape[1] != K or hook.gathered:
            return None  # not the (B, K, H) hidden states we expect (or called twice): leave it alone
        hook.gathered = True
        return (hidden[rows.to(hidden.device), pos.to(hidden.device)].unsqueeze(0), *args[1:])

    hook.gathered = False
    return hook


def _block_mask(segment: torch.Tensor, model: torch.nn.Module, prefix: int = 0) -> torch.Tensor:
    """(B, 1, T, prefix + T) mask: causal, and an option sees the (cached) shared prefix, the question and itself,
    never another option."""
    T = segment.shape[1]
    q = segment[:, :, None]
    k = segment[:, None, :]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    allowed = causal & (k >= 0) & ((k == 0) | (k == q))
    # Padding queries see themselves only, so no softmax row is empty (NaN); their outputs are never read.
    allowed |= torch.eye(T, dtype=torch.bool) & (q < 0)
    allowed = torch.cat([torch.ones(segment.shape[0], T, prefix, dtype=torch.bool), allowed], dim=2)[:, None]
    if getattr(model.config, "_attn_implementation", "eager") == "eager":
        # eager attention adds the mask to the scores
        mask = torch.zeros(allowed.shape, dtype=torch.float32)
        return mask.masked_fill_(~allowed, torch.finfo(torch.float32).min)
    return allowed


@dataclass
class _Prompt:
    probe_index: int
    ids: list[int]


def _left_pad(batch: list[_Prompt], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
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
class _Slot:
    """A prompt in a refilling batch: what it has generated so far, and when it must stop."""

    index: int  # position in the requests
    ids: list[int]  # the prompt's tokens
    max_new_tokens: int
    stop: Any  # a StopStringCriteria, or None
    tokens: list[int] = field(default_factory=list)
    bad: bool = False  # a NaN / +inf among its logits


class _CannotRefill(Exception):
    """The model's KV cache cannot be merged and split by rows (or the forward did not read it back)."""


class _RefillLoop:
    """Greedy decoding where finished rows leave the batch and waiting prompts take their place.

    The batch holds the rows being decoded: a KV cache whose per-layer keys and values are (B, H, T, D), left-padded,
    with a (B, T) attention mask, holding every row's tokens but the last one it generated (fed by the next forward).
    Each forward is either a decode step of every row (one token each) or the prefill of waiting prompts, which are
    then merged into the batch (both caches left-padded to one length and stacked); rows that end are dropped with
    `index_select`, and columns no row reads any more are cut off. A row's logits are its own whatever the other rows
    are (only their padding differs), so its greedy answer is what `model.generate` gives, up to near-ties in fp32.
    """

    def __init__(self, engine: HFEngine, eos: set[int], pad_id: int):
        self.engine, self.model, self.eos, self.pad_id = engine, engine.model, eos, pad_id
        self.device = model_device(engine.model)
        named, takes_kwargs = forward_parameters(self.model)
        self.cache_name = next((n for n in CACHE_NAMES if n in named), CACHE_NAMES[0] if takes_kwargs else None)
        if self.cache_name is None:
            raise _CannotRefill(f"the model's forward ({type(self.model).__name__}) takes no KV cache by name")

    def run(self, waiting_slots: list[_Slot], finish: Callable[[_Slot], None]) -> None:
        engine, model = self.engine, self.model
        waiting = deque(waiting_slots)
        batch_size = engine.batch_size
        # Waiting prompts join when a quarter of the rows are free: each prefill is a forward of its own, where the
        # rows already decoding wait, so joining one prompt at a time would add a forward per prompt.
        admit_at = max(1, batch_size // 4)
        self.batch: list[_Slot] = []
        self.cache: Any = None
        self.mask: torch.Tensor | None = None
        while True:
            has_work = bool(waiting or self.batch)
            if engine.sync_ranks:
                # Agreed before every forward (ZeRO-3 / FSDP: each forward is a collective): a rank with nothing left
                # runs a one-token forward alongside the others' until every rank is done.
                if not _most_over_ranks(int(has_work)):
                    return
                if not has_work:
                    call(model, {"input_ids": torch.full((1, 1), self.pad_id, device=self.device), "use_cache": False})
                    continue
            elif not has_work:
                return
            free = batch_size - len(self.batch)
            new: list[_Slot] = []
            try:
                if waiting and (free >= min(admit_at, len(waiting)) or not self.batch):
                    new = [waiting.popleft() for _ in range(min(free, len(waiting)))]
                    rows, logits = self._prefill(new)
                else:
                    rows, logits = self._decode()
            except _OOM_ERRORS:
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

    def _prefill(self, new: list[_Slot]) -> tuple[range, torch.Tensor]:
        """One forward over the waiting prompts `new` (left-padded), merged into the batch after its rows."""
        input_ids, mask = _left_pad([_Prompt(s.index, s.ids) for s in new], self.pad_id)
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
                old.keys = torch.cat([_pad_left(old.keys, T, 2), _pad_left(add.keys, T, 2)])
                old.values = torch.cat([_pad_left(old.values, T, 2), _pad_left(add.values, T, 2)])
            self.mask = torch.cat([_pad_left(self.mask, T, 1), _pad_left(mask, T, 1)])
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

    def _step(self, rows: range, logits: torch.Tensor, finish: Callable[[_Slot], None]) -> None:
        """Append each row's greedy token; rows that end leave the batch."""
        scores = logits.to(dtype=torch.float32)  # as `generate`: greedy over fp32 logits
        # -inf is how processors mask tokens (none run here): watch NaN and +inf, as _NonFinite does
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


def _pad_left(t: torch.Tensor, length: int, dim: int) -> torch.Tensor:
    """`t` with zeros before its entries along `dim`, up to `length`."""
    missing = length - t.shape[dim]
    if not missing:
        return t
    shape = list(t.shape)
    shape[dim] = missing
    return torch.cat([t.new_zeros(shape), t], dim=dim)


class _NonFinite:
    """A logits processor that only watches: which rows ever had a NaN or infinite logit (greedy decoding would pick
    token 0 or the first NaN and carry on, producing a plain-looking answer). No host sync per step."""

    def __init__(self):
        self.bad: torch.Tensor | None = None

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        # -inf is how processors mask tokens (none run here, but keep to NaN and +inf, which no processor writes)
        now = torch.isnan(scores).any(-1) | torch.isposinf(scores).any(-1)
        self.bad = now if self.bad is None else self.bad | now
        return scores
