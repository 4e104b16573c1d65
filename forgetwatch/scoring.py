"""Scoring probes with a causal LM: the torch code of forgetwatch (the callback adds only the distributed glue).

Three ways to score a multiple-choice probe, two for short answers, one for behaviour probes:

- ``loglik`` / ``loglik_norm``: the log-likelihood of each option's text after the prompt (``_norm`` divides by
  the option's length in characters, lm-evaluation-harness's ``acc_norm``). One forward per question: the
  question's tokens are followed by every option's tokens in the same row, and a block attention mask lets
  each option see the question and itself only, with positions restarting after the question. The shared
  prefix is computed once, and logits are computed only for the positions that are read.
- ``letter``: options listed with letters, one forward, the letters' next-token logits compared.
- ``generate``: greedy decoding, then answer extraction (`forgetwatch.answers`).
- ``greedy_match`` (short answers): one forward over the prompt and each accepted answer.
- behaviour probes (`instruct`, `comply`): greedy decoding in the chat template, then the answer is checked
  (`forgetwatch.behavior`); the same generation loop as ``generate``.

Scoring is deterministic (no sampling), runs under inference mode, computes log-softmax in fp32 so
results do not move with batch size, sorts requests by length to keep padding low, halves the batch on
out-of-memory, and leaves the model as it found it: every module's train/eval flag, `requires_grad`, and
the python / numpy / torch RNG states.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from . import answers
from .forward import PrefixCache, call, check_logits_kept, logits_to_keep_kwargs, no_grad_context, untouched
from .probes import Probe
from .prompts import (
    PROMPT_VERSION,
    behavior_prompt,
    generation_prompt,
    letter_prompt,
    loglik_request,
    short_answer_prefix,
    short_answer_prompt,
)
from .results import CORRECT, INVALID, WRONG, ProbeResults

__all__ = ["ScoringConfig", "score_probes", "describe_precision"]

logger = logging.getLogger(__name__)

MCQ_MODES = ("loglik", "loglik_norm", "letter", "generate")
SHORT_MODES = ("generate", "greedy_match")
SHORT_MATCHES = answers.MATCH_MODES
# The order in which modes are scored: fixed, so that every rank takes them in the same order. Short answers that are
# generated are a mode of their own: their prompt (and chat template) is not the multiple-choice one.
_MODE_ORDER = (*MCQ_MODES, "generate_short", "greedy_match", "behavior")
# Behaviour probes' answers are checked whole (word counts, sections, JSON, ...) and whether they stop is itself
# measured, so they get room: SmolLM2-135M-Instruct ends 4 in 5 of the built-in suite's answers within it (84 of 105;
# benchmarks/RESULTS.md §11).
BEHAVIOR_MAX_NEW_TOKENS = 256
_OOM_ERRORS = tuple({getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError), torch.cuda.OutOfMemoryError})


@dataclass(frozen=True)
class ScoringConfig:
    """How probes are scored. Every field but `batch_size` changes results, so it is part of the cache key.

    Args:
        mcq_mode: `"loglik"` (log-likelihood of each option's text), `"loglik_norm"` (divided by its length in
            characters), `"letter"` (compare the option letters' logits after a lettered list), or `"generate"`
            (greedy decoding, then the letter is extracted).
        chat_template: wrap prompts in the tokenizer's chat template. `None` (default) uses it for free-form
            generation (multiple choice with `mcq_mode="generate"`, short answers with `cot`) when the tokenizer has
            one, and plain prompts otherwise: for log-likelihood, letters, and the few-shot short-answer prompt (on
            SmolLM2-135M-Instruct the plain few-shot prompt gets bare answers where the chat template gets
            sentences; benchmarks/RESULTS.md).
        cot: ask for reasoning and a final "Answer: X" line before extracting the answer (generation only).
        max_new_tokens: generation budget; default 32, or 256 with `cot`.
        short_mode: how short-answer probes are scored. `"generate"`: greedy decoding after the few-shot prompt, then
            the answer is extracted and matched (`short_match`). `"greedy_match"`: one forward over the prompt and each
            accepted answer; correct when greedy decoding would produce an accepted answer as a whole answer: the
            model's argmax is the answer's token at every answer position, and right after it the argmax is a
            boundary (end of sequence or turn, whitespace or a newline, or punctuation that does not continue a word
            or number: not `-`, `'`, `_`, `/`, nor `.`/`,` after a digit). So "Paris" does not match a greedy
            "Parisian" nor "1" a greedy "12" or "1.5". Costs about one forward instead of a decode; never invalid;
            `gold_logprob` holds the best accepted answer's summed log-probability. Not with `cot`. Default (`None`):
            `"greedy_match"`, or `"generate"` with `cot`.
        short_match: with `short_mode="generate"`: `"exact"` (normalised exact match against any accepted answer) or
            `"contains"` (an accepted answer appears as whole words in the normalised prediction; more lenient).
            Numeric probes are compared as numbers with `math-verify` either way.
        system_prompt: an optional system message for chat templates.
        batch_size: questions per forward (halved automatically on out-of-memory).
        pack_choices: put all options of a question in one row behind the shared question (block attention
            mask). `None` uses it where the attention implementation accepts custom masks (eager, sdpa).
        behavior_max_new_tokens: generation budget of behaviour probes (`instruct`, `comply`); an answer that
            reaches it without ending its turn counts as a runaway. Default 256.

    Example:
        >>> ScoringConfig(mcq_mode="loglik_norm").key()["mcq_mode"]
        'loglik_norm'
    """

    mcq_mode: str = "loglik"
    chat_template: bool | None = None
    cot: bool = False
    max_new_tokens: int | None = None
    short_mode: str | None = None
    short_match: str = "exact"
    system_prompt: str | None = None
    batch_size: int = 16
    pack_choices: bool | None = None
    behavior_max_new_tokens: int = BEHAVIOR_MAX_NEW_TOKENS

    def __post_init__(self) -> None:
        if self.mcq_mode not in MCQ_MODES:
            raise ValueError(f"`mcq_mode` must be one of {', '.join(MCQ_MODES)}, got {self.mcq_mode!r}")
        if self.short_mode is not None and self.short_mode not in SHORT_MODES:
            raise ValueError(f"`short_mode` must be one of {', '.join(SHORT_MODES)}, got {self.short_mode!r}")
        if self.short_match not in SHORT_MATCHES:
            raise ValueError(f"`short_match` must be one of {', '.join(SHORT_MATCHES)}, got {self.short_match!r}")
        if self.cot and self.short_mode == "greedy_match":
            raise ValueError("`short_mode='greedy_match'` scores the answer right after the question, so it cannot follow "
                             "reasoning: with `cot=True` pass `short_mode='generate'`")
        if self.batch_size < 1:
            raise ValueError(f"`batch_size` must be at least 1, got {self.batch_size}")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise ValueError(f"`max_new_tokens` must be at least 1, got {self.max_new_tokens}")
        if self.behavior_max_new_tokens < 1:
            raise ValueError(f"`behavior_max_new_tokens` must be at least 1, got {self.behavior_max_new_tokens}")

    @property
    def short_scoring(self) -> str:
        """What `short_mode` resolves to: as given, else "greedy_match", or "generate" with `cot`."""
        return self.short_mode or ("generate" if self.cot else "greedy_match")

    @property
    def new_tokens(self) -> int:
        return self.max_new_tokens or (256 if self.cot else 32)

    def uses_chat(self, tokenizer: Any, generative: bool) -> bool:
        if self.chat_template is not None:
            if self.chat_template and not getattr(tokenizer, "chat_template", None):
                raise ValueError("`chat_template=True` but the tokenizer has no chat template; pass `chat_template=False`")
            return self.chat_template
        return generative and bool(getattr(tokenizer, "chat_template", None))

    def key(self, tokenizer: Any = None, precision: str | None = None) -> dict[str, Any]:
        """Everything that changes a probe's result: the part of the cache key that is about scoring."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ("batch_size", "pack_choices")}
        d["max_new_tokens"] = self.new_tokens
        d["short_mode"] = self.short_scoring
        d["prompt_version"] = PROMPT_VERSION
        if tokenizer is not None:
            # what the `chat_template` option resolved to for this tokenizer
            d["chat"] = {
                "mcq": self.uses_chat(tokenizer, self.mcq_mode == "generate"),
                "short": self.uses_chat(tokenizer, self.cot),
                "behavior": self.uses_chat(tokenizer, True),
            }
        # behaviour verdicts are cached: the rules that judged them are part of the key (left out by
        # `make_cache_key` when no behaviour probe is scored)
        from .behavior import behavior_rules_key

        d["behavior_rules"] = behavior_rules_key()
        if precision is not None:
            d["precision"] = precision
        return d


def describe_precision(model: torch.nn.Module, autocast: str | None = None) -> str:
    """The numeric precision scoring runs in, e.g. "float32" or "float32+autocast-bfloat16"."""
    param = next(model.parameters())
    dtype = str(param.dtype).removeprefix("torch.")
    # autocast is per device type: the no-argument `torch.is_autocast_enabled()` only sees CUDA's
    if autocast is None and torch.is_autocast_enabled(param.device.type):
        autocast = str(torch.get_autocast_dtype(param.device.type)).removeprefix("torch.")
    return f"{dtype}+autocast-{autocast}" if autocast else dtype


def precision_context(model: torch.nn.Module, precision: str) -> contextlib.AbstractContextManager:
    """Autocast as a precision string from `describe_precision` says ("float32+autocast-bfloat16"), else nothing:
    how a process outside the trainer scores in the trainer's precision.

    Example:
        >>> with precision_context(model, "float32+autocast-bfloat16"):  # doctest: +SKIP
        ...     results = score_probes(model, tokenizer, probes)
    """
    if "+autocast-" not in precision:
        return contextlib.nullcontext()
    autocast = precision.split("+autocast-")[1]
    return torch.autocast(next(model.parameters()).device.type, dtype=getattr(torch, autocast))


@contextlib.contextmanager
def full_precision(model: torch.nn.Module) -> Iterator[bool]:
    """Run forwards of `model` in fp32 without autocast inside this block; yields False (changing nothing) when its
    weights are not all fp32, since no fp32 answer exists then without a copy of the model.

    Inside a Trainer with bf16 / fp16, accelerate wraps the model's `forward` in autocast (keeping the original as
    `_original_forward`); an outer `autocast(enabled=False)` cannot undo that, so the original forward is put back
    for the block and the wrapper restored after it.

    Example:
        >>> with full_precision(model) as ok:  # doctest: +SKIP
        ...     reference = score_probes(model, tokenizer, probes) if ok else None
    """
    if any(p.dtype != torch.float32 for p in model.parameters()):
        yield False
        return
    device_type = next(model.parameters()).device.type
    wrapped = model.__dict__.get("forward") if "_original_forward" in model.__dict__ else None
    if wrapped is not None:
        model.forward = model.__dict__["_original_forward"]
    try:
        with torch.autocast(device_type, enabled=False):
            yield True
    finally:
        if wrapped is not None:
            model.forward = wrapped


def score_probes(
    model: torch.nn.Module,
    tokenizer: Any,
    probes: Sequence[Probe],
    config: ScoringConfig | None = None,
    *,
    progress: bool = False,
    desc: str = "scoring probes",
    sync_ranks: bool = False,
) -> ProbeResults:
    """Score every probe with `model`; results come back in the order of `probes`.

    Args:
        model: any Hugging Face causal LM (`AutoModelForCausalLM`), in any mode; it is left exactly as found.
        tokenizer: its tokenizer (the trainer's `processing_class`).
        probes: a `ProbeSet` or a list of `Probe`s (e.g. one rank's shard).
        config: a `ScoringConfig`; defaults to log-likelihood scoring of options.
        progress: show a progress bar.
        sync_ranks: this is one rank's shard and every rank of the process group calls `score_probes` together
            (`forgetwatch.distributed.score_distributed` does): each rank then runs as many forwards as the busiest,
            padding with forwards whose results are dropped, and generation keeps stepping until all ranks finish
            (`synced_gpus`), so FSDP / ZeRO-3, whose forwards gather weights from every rank, never wait forever.
            The shards must hold the same scoring modes (`plan_shard` sees to it).

    Example:
        >>> from forgetwatch import ProbeSet, score_probes
        >>> results = score_probes(model, tokenizer, ProbeSet.from_jsonl("probes.jsonl"))  # doctest: +SKIP
        >>> results.accuracy  # doctest: +SKIP
        0.52
    """
    config = config or ScoringConfig()
    probes = list(probes)
    results = ProbeResults.empty([p.id for p in probes])
    if not probes:
        return results
    by_mode: dict[str, list[int]] = {}
    for i, p in enumerate(probes):
        by_mode.setdefault(scoring_mode(p, config), []).append(i)
    # A fixed order of modes, whatever order the probes come in: ranks must take them in the same order.
    by_mode = {mode: by_mode[mode] for mode in _MODE_ORDER if mode in by_mode}

    from tqdm.auto import tqdm

    bar = tqdm(total=len(probes), desc=desc, disable=not progress, unit="probe")
    with untouched(model), no_grad_context():
        for mode, idx in by_mode.items():
            subset = [probes[i] for i in idx]
            if mode in ("loglik", "loglik_norm"):
                part = _score_loglik(model, tokenizer, subset, config, mode == "loglik_norm", bar, sync_ranks)
            elif mode == "letter":
                part = _score_letter(model, tokenizer, subset, config, bar, sync_ranks)
            elif mode == "greedy_match":
                part = _score_greedy_match(model, tokenizer, subset, config, bar, sync_ranks)
            elif mode == "behavior":
                part = _score_behavior(model, tokenizer, subset, config, bar, sync_ranks)
            else:
                part = _score_generate(model, tokenizer, subset, config, bar, sync_ranks)
            _scatter(results, idx, part)
    bar.close()
    return results


def scoring_mode(probe: Probe, config: ScoringConfig) -> str:
    """How `probe` is scored under `config`: one of `_MODE_ORDER` (ranks shard probes mode by mode)."""
    if probe.is_behavior:
        return "behavior"
    if probe.kind == "mcq":
        return config.mcq_mode
    return {"generate": "generate_short"}.get(config.short_scoring, config.short_scoring)


def _device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def _pad_id(tokenizer: Any) -> int:
    for tid in (tokenizer.pad_token_id, tokenizer.eos_token_id, 0):
        if tid is not None:
            return int(tid)
    return 0


def _encode(tokenizer: Any, texts: list[str], chat: bool) -> list[list[int]]:
    # A rendered chat template already holds its special tokens; plain prompts get the tokenizer's own (BOS).
    ids = tokenizer(texts, add_special_tokens=not chat)["input_ids"]
    if not chat and _appends_eos(tokenizer):
        # A prompt is the start of a text, never a finished one: an EOS after it would be scored in place of the
        # option's first token, and generation would start after an end of sequence.
        ids = [x[:-1] if x and x[-1] == tokenizer.eos_token_id else x for x in ids]
    return ids


def _appends_eos(tokenizer: Any) -> bool:
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        return False
    with_special = tokenizer("a", add_special_tokens=True)["input_ids"]
    return bool(with_special) and with_special[-1] == eos and eos not in tokenizer("a", add_special_tokens=False)["input_ids"]


def _accepts_custom_masks(model: torch.nn.Module) -> bool:
    impl = getattr(model.config, "_attn_implementation", None) or "eager"
    return impl in ("eager", "sdpa") and not _uses_alibi(model.config)


def _uses_alibi(config: Any) -> bool:
    # ALiBi models build their position bias from a 2-D padding mask (Bloom's `build_alibi_tensor` unpacks its shape),
    # so a packed 4-D mask crashes them: they score one option per row.
    return getattr(config, "model_type", "") in ("bloom", "mpt") or bool(getattr(config, "alibi", False))


def _run_batches(items: list, batch_size: int, run: Callable[..., None], bar, sync_ranks: bool = False) -> None:
    """Call `run(batch)` on consecutive slices of `items`; on out-of-memory halve the slice and retry.

    With `sync_ranks`, every rank runs as many batches as the busiest one: shards of equal probe counts can still
    differ in batches (options scored one per row). The count is agreed before the first forward, and a rank with
    fewer batches then calls `run(items[:1], keep=False)` (a forward whose result is dropped) after its own: under
    FSDP / ZeRO-3 each forward is itself a collective, so the ranks' forwards must pair up with no other collective
    between them (agreeing afterwards, a rank that finished early would wait in the count while the others wait in
    their next forward's all-gather). An out-of-memory retry on one rank only adds batches there; a second count
    at the end evens that out under DDP (under FSDP the ranks are already out of step by then).
    """
    target = _most_over_ranks(-(-len(items) // batch_size)) if sync_ranks else 0
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
    if sync_ranks:
        for _ in range(target - batches):
            run(items[:1], keep=False)
        batches = max(batches, target)
        for _ in range(_most_over_ranks(batches) - batches):
            run(items[:1], keep=False)


def _most_over_ranks(n: int) -> int:
    """The largest `n` over all ranks (a collective: every rank calls it)."""
    dist = torch.distributed
    # NCCL reduces CUDA tensors only; gloo (and the CPU) takes CPU tensors
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    t = torch.tensor([n], dtype=torch.long, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


class ProbeSetError(ValueError):
    """The probe set cannot be scored with this model at all (not one checkpoint's problem)."""


def _check_context(model, ids: Sequence[str] | None, lengths: Sequence[int], what: str, sync_ranks: bool = False) -> None:
    """Refuse, before any forward, a probe whose tokens (with what is generated after them) pass the model's context:
    past it, learned positions fail with an index error and rotary ones read positions never trained, so the answer
    would mean nothing."""
    config = getattr(model, "config", None)
    limit = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    if not isinstance(limit, int) or ids is None:
        return
    over = [(pid, n) for pid, n in zip(ids, lengths, strict=True) if pid is not None and n > limit]
    # every rank decides alike (a rank that raised alone would leave the others waiting in a collective forward)
    if sync_ranks and _most_over_ranks(len(over)) and not over:
        raise ProbeSetError(f"a probe on another rank does not fit the model's context of {limit} tokens with {what} (that "
                            "rank names it)")
    if over:
        listed = ", ".join(f"{pid} ({n} tokens)" for pid, n in over[:5])
        raise ProbeSetError(f"{len(over)} probe(s) do not fit the model's context of {limit} tokens with {what}: {listed}"
                         f"{' ...' if len(over) > 5 else ''}. Remove them from the probe set, or shorten their text "
                         "(or lower max_new_tokens / behavior_max_new_tokens)")


def _scatter(results: ProbeResults, idx: list[int], part: ProbeResults) -> None:
    for j, i in enumerate(idx):
        results.set_row(i, part, j)


def _decide(results: ProbeResults, i: int, probe: Probe, scores: np.ndarray, gold_logprob: float) -> None:
    """Fill row i from per-option scores: argmax (exact ties go to the lowest index, like np.argmax)."""
    # NaN / inf scores (an overflow in low precision): np.argmax would pick the first NaN, a plain-looking answer
    results.nonfinite[i] = not np.isfinite(scores).all()
    pred = int(np.argmax(scores))
    others = np.delete(scores, probe.gold)
    results.pred_index[i] = pred
    results.prediction[i] = probe.choices[pred]
    results.outcome[i] = CORRECT if pred == probe.gold else WRONG
    results.gold_logprob[i] = gold_logprob
    results.margin[i] = float(scores[probe.gold] - others.max())
    results.option_scores[i] = np.asarray(scores, np.float32)


# -- log-likelihood of each option ----------------------------------------------------------------------------


@dataclass
class _Row:
    probe_index: int  # position in the subset being scored
    context: list[int]
    options: list[list[int]]  # token ids of each option in this row
    option_ids: list[int]  # which option of the probe each one is

    @property
    def length(self) -> int:
        return len(self.context) + sum(map(len, self.options))


@dataclass
class _Continuations:
    """What one forward tells about each continuation (option or accepted answer) of each prompt."""

    tokens: list[list[list[int]]]  # [prompt][continuation] -> token ids
    logprobs: list[list[np.ndarray]]  # log-probability of each of those tokens (fp32 log-softmax)
    argmax: list[list[np.ndarray]]  # the model's greedy token at each of those positions (+1 after, with read_next)


def _score_continuations(model, tokenizer, contexts: Sequence[str], continuations: Sequence[Sequence[str]], chat: bool,
                         config: ScoringConfig, bar, sync_ranks: bool = False, read_next: bool = False,
                         shared: str | None = None, ids: Sequence[str] | None = None) -> _Continuations:
    """Teacher-force every continuation after its context: per token, its log-probability and the greedy argmax.

    With `read_next`, the argmax right after each continuation's last token is read too (is it a boundary?).
    `shared` is text every context starts with (few-shot exemplars): its keys and values are computed once and
    reused by every row, instead of once per row.
    """
    # Tokenise like lm-evaluation-harness: continuation tokens = encode(context + cont)[len(encode(context)):].
    ctx_ids = _encode(tokenizer, list(contexts), chat)
    flat = [c + o for c, opts in zip(contexts, continuations, strict=True) for o in opts]
    whole_ids = _encode(tokenizer, flat, chat)
    ends, k = [], 0
    for opts in continuations:  # each option's last position (packed or not, options start where the context ends)
        ends.append(max(len(w) for w in whole_ids[k : k + len(opts)]) + int(read_next))
        k += len(opts)
    _check_context(model, ids, ends, "their answers", sync_ranks)
    pack = config.pack_choices if config.pack_choices is not None else _accepts_custom_masks(model)
    device = _device(model)
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
    pad_id = _pad_id(tokenizer)

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

    _run_batches(rows, config.batch_size, run, bar, sync_ranks)
    return _Continuations(tokens, logprobs, argmax)


def _score_loglik(model, tokenizer, probes: list[Probe], config: ScoringConfig, normalize: bool, bar,
                  sync_ranks: bool = False) -> ProbeResults:
    chat = config.uses_chat(tokenizer, generative=False)
    contexts, continuations = zip(*(loglik_request(p, tokenizer, chat, config.system_prompt) for p in probes), strict=True)
    scored = _score_continuations(model, tokenizer, contexts, continuations, chat, config, bar, sync_ranks,
                                  ids=[p.id for p in probes])
    results = ProbeResults.empty([p.id for p in probes])
    for pi, p in enumerate(probes):
        # Options with the same tokens get the first one's score, so that they tie exactly and the lowest index wins;
        # packed in one row, the same tokens at other positions can differ in the last bits (up to 1.3e-5 measured).
        first = {}
        loglik = np.array([scored.logprobs[pi][first.setdefault(tuple(t), j)].sum() for j, t in enumerate(scored.tokens[pi])])
        scores = loglik / np.array([len(c) for c in p.choices]) if normalize else loglik
        _decide(results, pi, p, scores, float(loglik[p.gold]))
    return results


# -- short answers by teacher-forced greedy match -------------------------------------------------------------

# Punctuation that continues a word ("Jean-Paul", "O'Brien", "and/or", "snake_case"): no boundary after an answer.
_JOINERS = frozenset("-\u2010\u2011'\u2019_/")


class _Boundaries:
    """Whether a greedy token ends an answer: see `ScoringConfig.short_mode`. Cached per token id."""

    def __init__(self, tokenizer, eos_ids: Sequence[int]):
        self.tokenizer = tokenizer
        self.special = {int(t) for t in (*getattr(tokenizer, "all_special_ids", ()), *eos_ids)}
        self._first: dict[int, str] = {}

    def __call__(self, token_id: int, after_digit: bool) -> bool:
        if token_id in self.special:
            return True
        if token_id not in self._first:
            self._first[token_id] = self.tokenizer.decode([token_id])[:1]
        ch = self._first[token_id]
        if not ch or ch.isspace():
            return True
        if after_digit and ch in ".,":  # "1" is not the answer when greedy says "1.5" or "1,000"
            return False
        return ch not in _JOINERS and answers._is_punct(ch)


def _eos_ids(model, tokenizer) -> list[int]:
    # a list, not a set: generation configs often hold a list of EOS ids (unhashable)
    eos = [t for t in (tokenizer.eos_token_id, getattr(getattr(model, "generation_config", None), "eos_token_id", None)) if t is not None]
    return sorted({int(x) for t in eos for x in (t if isinstance(t, (list, tuple)) else [t])})


# Accepted answers teacher-forced per probe. TriviaQA lists 17 aliases on average (up to 108: Wikipedia redirect
# titles such as "The weather in Barcelona"), 71 tokens, more than the question. Kept: the first (the answer
# itself), the variants that normalised matching accepts and tokens do not (measured on SmolLM2, benchmarks/
# RESULTS.md): case ("CONCORDE" -> "Concorde", "concorde"), a leading article dropped ("The Georgia Peach" ->
# "Georgia Peach") or added to a one-word answer ("Moon" -> "The moon"); then the shortest other aliases.
MAX_ALIASES = 10
_ARTICLE = re.compile(r"^(?:the|a|an)\s+", re.IGNORECASE)


def _answer_continuations(probe: Probe, chat: bool) -> list[str]:
    # After a plain "Answer:" the model writes " Paris"; in a chat turn the answer opens the turn.
    aliases = [a.strip() for a in probe.answers]
    first = aliases[0]
    variants = [first, first[:1].upper() + first[1:].lower() if first.isupper() else first, first.lower(),
                _ARTICLE.sub("", first)]
    if " " not in first and not probe.numeric:
        variants.append("The " + first.lower())
    kept = list(dict.fromkeys(v for v in variants + sorted(aliases[1:], key=len) if v))[:MAX_ALIASES]
    return [a if chat else " " + a for a in kept]


def _score_greedy_match(model, tokenizer, probes: list[Probe], config: ScoringConfig, bar, sync_ranks: bool = False) -> ProbeResults:
    chat = config.uses_chat(tokenizer, generative=False)
    contexts = [short_answer_prompt(p, tokenizer, chat, config.system_prompt) for p in probes]
    continuations = [_answer_continuations(p, chat) for p in probes]
    shared = short_answer_prefix(tokenizer, chat, config.system_prompt)
    scored = _score_continuations(model, tokenizer, contexts, continuations, chat, config, bar, sync_ranks, read_next=True,
                                  ids=[p.id for p in probes],
                                  shared=shared)
    boundary = _Boundaries(tokenizer, _eos_ids(model, tokenizer))
    results = ProbeResults.empty([p.id for p in probes])
    for pi in range(len(probes)):
        best: tuple[int, float, int] | None = None  # (matched tokens, log-prob, alias): the greedy path's closest alias
        correct = None
        for j, (toks, lp, am) in enumerate(zip(scored.tokens[pi], scored.logprobs[pi], scored.argmax[pi], strict=True)):
            n = len(toks)
            matched = int(np.argmin(np.append(am[:n] == np.array(toks), False)))  # length of the greedy prefix
            if matched == n and boundary(int(am[n]), continuations[pi][j].rstrip()[-1:].isdigit()):
                correct = j if correct is None or lp.sum() > scored.logprobs[pi][correct].sum() else correct
            if best is None or (matched, lp.sum()) > best[:2]:
                best = (matched, float(lp.sum()), j)
        results.gold_logprob[pi] = max(float(lp.sum()) for lp in scored.logprobs[pi])
        results.nonfinite[pi] = not all(np.isfinite(lp).all() for lp in scored.logprobs[pi])
        if correct is not None:
            results.outcome[pi] = CORRECT
            results.prediction[pi] = continuations[pi][correct].strip()
        else:
            # What greedy decoding starts with: the alias's tokens it follows, then the token where it leaves them.
            m, _, j = best
            results.outcome[pi] = WRONG
            results.prediction[pi] = tokenizer.decode(scored.tokens[pi][j][:m] + [int(scored.argmax[pi][j][m])]).strip() + "…"
    return results


def _shared_prefix(tokenizer, shared: str, ctx_ids: list[list[int]], chat: bool) -> list[int]:
    """The tokens of `shared` that every context starts with, or [] when not worth it or not possible."""
    # The last token may merge with the text that follows ("Question:" + " Who" vs "Question: "), so it is left to
    # the rows; and each row keeps at least one token of its own, whose logits predict its first answer token.
    ids = _encode(tokenizer, [shared], chat)[0][:-1]
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


# -- letters --------------------------------------------------------------------------------------------------


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


def _score_letter(model, tokenizer, probes: list[Probe], config: ScoringConfig, bar, sync_ranks: bool = False) -> ProbeResults:
    chat = config.uses_chat(tokenizer, generative=False)
    built = [letter_prompt(p, tokenizer, chat, config.system_prompt) for p in probes]
    contexts = [c for c, _ in built]
    # The token that spells each letter right after the prompt ("Answer:" + " A" is usually one token " A").
    ctx, sep = built[0]
    base = _encode(tokenizer, [ctx], chat)[0]
    kmax = max(len(p.choices) for p in probes)
    spelled = [s[len(base) :] for s in _encode(tokenizer, [ctx + sep + answers.LETTERS[j] for j in range(kmax)], chat)]
    letters = [s[0] if len(s) == 1 else None for s in spelled]
    if None in letters or len(set(letters)) < kmax:
        # The separator is a token of its own for some letters (e.g. ":", " ", "A"), so the first tokens do not tell
        # the letters apart: end every prompt with the separator and compare the bare letters' tokens instead.
        contexts = [c + sep for c in contexts]
        bare = tokenizer(list(answers.LETTERS[:kmax]), add_special_tokens=False)["input_ids"]
        letters = [s[0] if len(s) == 1 else None for s in bare]
        if None in letters or len(set(letters)) < kmax:
            raise ValueError("`mcq_mode='letter'` needs one token per option letter, which this tokenizer lacks; use `mcq_mode='loglik'`")
    letter_ids = torch.tensor(letters)
    ids = _encode(tokenizer, contexts, chat)
    _check_context(model, [p.id for p in probes], [len(x) + 1 for x in ids], "the answer's letter", sync_ranks)

    prompts = sorted((_Prompt(i, x) for i, x in enumerate(ids)), key=lambda p: len(p.ids), reverse=True)
    device = _device(model)
    pad_id = _pad_id(tokenizer)
    scores: list[np.ndarray] = [np.zeros(0)] * len(probes)

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
        logprobs = torch.log_softmax(logits.float(), dim=-1)[:, letter_ids.to(logits.device)].double().cpu().numpy()
        for b, p in enumerate(batch):
            scores[p.probe_index] = logprobs[b, : len(probes[p.probe_index].choices)]

    _run_batches(prompts, config.batch_size, run, bar, sync_ranks)
    results = ProbeResults.empty([p.id for p in probes])
    for i, p in enumerate(probes):
        _decide(results, i, p, scores[i], float(scores[i][p.gold]))
    return results


# -- generation -----------------------------------------------------------------------------------------------


def _stop_strings(chat: bool, cot: bool) -> list[str]:
    if chat:
        return []  # the chat template's end-of-turn token is the model's EOS
    # Not a bare "\n": small models often open their answer with a newline, and the first non-empty line is kept.
    return ["\n\nQuestion:", "\nQuestion:"] if cot else ["\n\n", "\nQuestion:"]


@dataclass
class _Answer:
    text: str
    n_tokens: int  # up to the end of turn, not counting it (a stop string that cut the answer is counted)
    stopped: bool  # False: it ran to max_new_tokens
    nonfinite: bool = False  # a NaN / inf among the logits it was decoded from: the text means nothing


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


def _generate(model, tokenizer, texts: list[str], chat: bool, max_new_tokens: int, stops: list[str], config: ScoringConfig,
              bar, sync_ranks: bool = False, probe_ids: Sequence[str | None] | None = None) -> list[_Answer]:
    """Greedy answers to `texts` (batched, longest first, left-padded), in the order of `texts`."""
    from transformers import GenerationConfig

    ids = _encode(tokenizer, texts, chat)
    _check_context(model, probe_ids, [len(x) + max_new_tokens for x in ids], f"{max_new_tokens} generated tokens",
                   sync_ranks)
    prompts = sorted((_Prompt(i, x) for i, x in enumerate(ids)), key=lambda p: len(p.ids), reverse=True)
    device = _device(model)
    pad_id = _pad_id(tokenizer)
    eos_ids = _eos_ids(model, tokenizer)
    gen_config = GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=False,
        num_beams=1,
        pad_token_id=pad_id,
        eos_token_id=eos_ids or None,
        stop_strings=stops or None,
    )
    out_answers: list[_Answer] = [_Answer("", 0, False)] * len(texts)

    def run(batch: list[_Prompt], keep: bool = True) -> None:
        from transformers import LogitsProcessorList

        input_ids, mask = _left_pad(batch, pad_id)
        watch = _NonFinite()
        out = model.generate(
            input_ids=input_ids.to(device),
            attention_mask=mask.to(device),
            generation_config=gen_config,
            tokenizer=tokenizer if stops else None,
            logits_processor=LogitsProcessorList([watch]),
            # ZeRO-3 / FSDP: every rank must keep stepping until all have finished
            synced_gpus=sync_ranks,
        )
        if not keep:
            return
        bad = watch.bad.cpu().tolist() if watch.bad is not None else [False] * len(batch)
        new = out[:, input_ids.shape[1] :].cpu().tolist()
        for b, p in enumerate(batch):
            tokens = new[b]
            end = next((j for j, t in enumerate(tokens) if t in eos_ids), None)
            if end is None:  # no end of turn: cut by a stop string (then padded), or ran to the limit
                end = len(tokens)
                while end and tokens[end - 1] == pad_id:
                    end -= 1
            text = tokenizer.decode(tokens[:end], skip_special_tokens=True)
            cut = min((text.find(s) for s in stops if s in text), default=-1)
            stopped = end < max_new_tokens or cut >= 0
            out_answers[p.probe_index] = _Answer(text[:cut] if cut >= 0 else text, end, stopped, bool(bad[b]))

    _run_batches(prompts, config.batch_size, run, bar, sync_ranks)
    return out_answers


def _keep_answers(results: ProbeResults, generated: list[_Answer], rows: list[int] | None = None) -> None:
    """Answer i goes to row `rows[i]` (default i); a negative row is a padding probe's answer, dropped."""
    for i, a in zip(rows if rows is not None else range(len(generated)), generated, strict=True):
        if i < 0:
            continue
        results.generation[i] = a.text
        results.n_tokens[i] = a.n_tokens
        results.stopped[i] = int(a.stopped)
        results.nonfinite[i] = a.nonfinite


def _score_generate(model, tokenizer, probes: list[Probe], config: ScoringConfig, bar, sync_ranks: bool = False) -> ProbeResults:
    results = ProbeResults.empty([p.id for p in probes])
    # called for multiple-choice or for short-answer probes, never both: they may differ in chat template
    chat = config.uses_chat(tokenizer, generative=probes[0].kind == "mcq" or config.cot)
    texts = [generation_prompt(p, tokenizer, chat, config.cot, config.system_prompt) for p in probes]
    generated = _generate(model, tokenizer, texts, chat, config.new_tokens, _stop_strings(chat, config.cot), config, bar,
                          sync_ranks, probe_ids=[p.id for p in probes])
    _keep_answers(results, generated)
    for i, (p, a) in enumerate(zip(probes, generated, strict=True)):
        _judge_generation(results, i, p, a.text, config)
    return results


def _score_behavior(model, tokenizer, probes: list[Probe], config: ScoringConfig, bar, sync_ranks: bool = False) -> ProbeResults:
    from .behavior import REFUSAL_WINDOW, judge_behavior

    results = ProbeResults.empty([p.id for p in probes])
    chat = config.uses_chat(tokenizer, generative=True)
    # A refusal is read from the answer's opening, so a harmless request needs only its first tokens; instruction
    # probes get the whole budget. One call per kind, in a fixed order, so that ranks generate in step.
    for kind, budget in (("instruct", config.behavior_max_new_tokens), ("comply", min(REFUSAL_WINDOW, config.behavior_max_new_tokens))):
        idx = [i for i, p in enumerate(probes) if p.kind == kind]
        if sync_ranks:
            if _most_over_ranks(len(idx)) == 0:  # no rank has this kind (every rank asks, in the same order)
                continue
            idx = idx or [-1]  # every rank that has none takes part with a padding probe (its answer is dropped)
        if not idx:
            continue
        texts = [behavior_prompt(probes[i], tokenizer, chat, config.system_prompt) for i in idx]
        generated = _generate(model, tokenizer, texts, chat, budget, [], config, bar, sync_ranks,
                              probe_ids=[probes[i].id if i >= 0 else None for i in idx])
        _keep_answers(results, generated, idx)
        for i, a in zip(idx, generated, strict=True):
            if i < 0:
                continue
            results.outcome[i], results.detail[i] = judge_behavior(probes[i], a.text)
            results.prediction[i] = a.text  # the flips table shows the answer at base and now side by side
    return results


def _judge_generation(results: ProbeResults, i: int, probe: Probe, text: str, config: ScoringConfig) -> None:
    if probe.kind == "mcq":
        pred = answers.extract_letter(text, len(probe.choices))
        if pred is None:
            return  # stays INVALID
        results.pred_index[i] = pred
        results.prediction[i] = probe.choices[pred]
        results.outcome[i] = CORRECT if pred == probe.gold else WRONG
        return
    pred = answers.extract_short_answer(text, cot=config.cot)
    if pred is None or (probe.numeric and not answers.parse_math_answer(pred)):
        results.outcome[i] = INVALID
        return
    results.prediction[i] = pred
    ok = answers.is_correct_short(pred, probe.answers, probe.numeric, match=config.short_match)
    results.outcome[i] = CORRECT if ok else WRONG
