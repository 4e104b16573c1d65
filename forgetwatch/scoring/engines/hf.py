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
  said once in a warning; `HFEngine(refill=False)` asks for them. The decoding loop is `decoding.py`'s.

Log-softmax runs in fp32 so results do not move with batch size; requests are sorted by length to keep padding low;
the batch is halved on out-of-memory. With `sync_ranks`, every rank runs as many forwards as the busiest and
generation keeps stepping until all ranks finish (the refilling loop agrees on it before every forward and a rank with
nothing left runs a one-token forward; static batches use `synced_gpus`), so FSDP / ZeRO-3 never wait forever.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ...options import default
from ..forward import (
    PrefixCache,
    call,
    check_logits_kept,
    logits_to_keep_kwargs,
    model_device,
    no_grad_context,
    pad_token_id,
    untouched,
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
from .decoding import (
    OOM_ERRORS,
    NonFinite,
    Prompt,
    cut_answer,
    generate_refill,
    left_pad,
    most_over_ranks,
)

__all__ = ["HFEngine", "PACK_TOKENS", "pack_groups"]

logger = logging.getLogger(__name__)


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

    def __init__(self, model: torch.nn.Module, tokenizer: Any, *, batch_size: int = default("batch_size"),
                 pack_choices: bool | None = None, sync_ranks: bool = False, refill: bool = True):
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
        return most_over_ranks(n) if self.sync_ranks else n

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
            if pack:  # options packed after one copy of the question, at most PACK_TOKENS of them to a row
                rows.extend(_Row(pi, own, [option_tokens[j] for j in group], group) for group in pack_groups(option_tokens))
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
            kwargs: dict[str, Any] = {
                "input_ids": input_ids.to(device),
                "position_ids": (position_ids + P).to(device),
                "use_cache": False,
            }
            if len(batch) and any(len(r.options) > 1 for r in batch):
                kwargs["attention_mask"] = _block_mask(segment, model, P).to(device)
            else:
                kwargs["attention_mask"] = torch.cat([torch.ones(B, P, dtype=torch.long), (segment >= 0).long()], dim=1).to(
                    device
                )
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
        prompts = sorted((Prompt(i, x) for i, x in enumerate(ids)), key=lambda p: len(p.ids), reverse=True)
        device = model_device(model)
        pad_id = pad_token_id(self.tokenizer)
        scores: list[np.ndarray] = [np.zeros(0)] * len(requests)

        def run(batch: list[Prompt], keep: bool = True) -> None:
            input_ids, mask = left_pad(batch, pad_id)
            position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
            kwargs = {
                "input_ids": input_ids.to(device),
                "attention_mask": mask.to(device),
                "position_ids": position_ids.to(device),
                "use_cache": False,
            }
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
        prompts = sorted((Prompt(i, x) for i, x in enumerate(ids)), key=lambda p: len(p.ids), reverse=True)
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

        def run(batch: list[Prompt], keep: bool = True) -> None:
            input_ids, mask = left_pad(batch, pad_id)
            watch = NonFinite()
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
        """Greedy answers decoded in a refilling batch (`decoding.generate_refill`); None when the model's KV cache
        cannot be merged and split by rows: then static batches run instead."""
        return generate_refill(self, encode_prompts(self.tokenizer, requests, chat, self._check_context), requests, bar)

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
        target = most_over_ranks(-(-len(items) // batch_size)) if self.sync_ranks else 0
        start = 0
        batches = 0
        while start < len(items):
            batch = items[start : start + batch_size]
            try:
                run(batch)
            except OOM_ERRORS:
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
            for _ in range(most_over_ranks(batches) - batches):
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
        if self.sync_ranks and most_over_ranks(len(over)) and not over:
            raise ProbeSetError(f"a probe on another rank does not fit the model's context of {limit} tokens with {what} "
                                "(that rank names it)")
        refuse_over(over, limit, what)


def _eos_ids(model: Any, tokenizer: Any) -> list[int]:
    # a list, not a set: generation configs often hold a list of EOS ids (unhashable)
    eos = [
        t
        for t in (tokenizer.eos_token_id, getattr(getattr(model, "generation_config", None), "eos_token_id", None))
        if t is not None
    ]
    return sorted({int(x) for t in eos for x in (t if isinstance(t, (list, tuple)) else [t])})


def _accepts_custom_masks(model: torch.nn.Module) -> bool:
    impl = getattr(model.config, "_attn_implementation", None) or "eager"
    return impl in ("eager", "sdpa") and not _uses_alibi(model.config)


def _uses_alibi(config: Any) -> bool:
    # ALiBi models build their position bias from a 2-D padding mask (Bloom's `build_alibi_tensor` unpacks its shape),
    # so a packed 4-D mask crashes them: they score one option per row.
    return getattr(config, "model_type", "") in ("bloom", "mpt") or bool(getattr(config, "alibi", False))


# Option tokens packed into one row after its question. A packed row's attention (and the block mask that keeps its
# options apart) grows with the square of its length: a probe with thousands of options in one row took gigabytes
# (2,000 options: 6.5 GB peak with eager attention on the tiny test model). Split into rows of at most this many option
# tokens, memory grows linearly with the options; a benchmark's 4 or 5 options stay in one row, scored as before.
PACK_TOKENS = 512


def pack_groups(option_tokens: Sequence[Sequence[int]], budget: int | None = None) -> list[list[int]]:
    """The options of one question split into packed rows, in order: each row at most `budget` option tokens (default
    `PACK_TOKENS`; an option longer than that gets a row of its own).

    Example:
        >>> pack_groups([[1] * 300, [2] * 300, [3] * 100], budget=512)
        [[0], [1, 2]]
    """
    budget = PACK_TOKENS if budget is None else budget
    groups: list[list[int]] = []
    used = budget
    for j, toks in enumerate(option_tokens):
        if used + len(toks) > budget:
            groups.append([])
            used = 0
        groups[-1].append(j)
        used += len(toks)
    return groups


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


