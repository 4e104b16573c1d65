"""Scoring modes: how each kind of probe becomes requests for an engine (`forgetwatch.scoring.requests`), and how the
results are judged. Plain Python and NumPy; the model runs in an engine (`forgetwatch.scoring.engines`).

Three ways to score a multiple-choice probe, two for short answers, one for behaviour probes:

- ``loglik`` / ``loglik_norm``: the log-likelihood of each option's text after the prompt (``_norm`` divides by
  the option's length in characters, lm-evaluation-harness's ``acc_norm``).
- ``letter``: options listed with letters, the letters' next-token log-probabilities compared.
- ``generate``: greedy decoding, then answer extraction (`forgetwatch.answers`).
- ``greedy_match`` (short answers): the prompt and each accepted answer teacher-forced, then compared with the
  model's greedy tokens.
- behaviour probes (`instruct`, `comply`): greedy decoding in the chat template, then the answer is checked
  (`forgetwatch.measures.behavior`); the same generation requests as ``generate``.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import answers
from ..answers.extraction import is_punct
from ..options import BEHAVIOR_MAX_NEW_TOKENS, ENGINES, MCQ_MODES, SHORT_MATCHES, SHORT_MODES, default
from ..probes.probe_set import Probe
from .engines import engine_spec
from .judge import REFUSAL_WINDOW, judge_behavior
from .prompts import (
    PROMPT_VERSION,
    behavior_prompt,
    generation_prompt,
    letter_prompt,
    loglik_request,
    short_answer_prefix,
    short_answer_prompt,
)
from .requests import Answer, GenerateRequest, LoglikRequest, NextTokenRequest, encode
from .results import CORRECT, INVALID, WRONG, ProbeResults

if TYPE_CHECKING:
    from .engines import Engine

__all__ = ["ScoringConfig", "MCQ_MODES", "SHORT_MODES", "SHORT_MATCHES", "ENGINES", "BEHAVIOR_MAX_NEW_TOKENS"]

# How the probes are run, not what they score: left out of the cache key.
NOT_IN_KEY = ("batch_size", "pack_choices", "engine")


@dataclass(frozen=True)
class ScoringConfig:
    """How probes are scored. Every field but `batch_size`, `pack_choices` and `engine` changes results, so it is
    part of the cache key; of the engines, vLLM's other kernels are keyed (`runtime`), as near-ties can come
    out otherwise there.

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
        engine: what runs generation (`forgetwatch.scoring.engines`): `hf` (default: the model in this process, finished
            answers leaving a refilling batch) or `continuous` (transformers' continuous batching, where it is
            faster: RESULTS §14; where it cannot run it falls back to `hf` with a warning saying why) or `vllm`
            (vLLM loads the model's directory: commands and the sidecar watcher, not in-loop scoring; needs vllm
            installed, `forgetwatch.scoring.engines.vllm`). The same greedy answers either way, up to near-ties in the last bits.

    Example:
        >>> ScoringConfig(mcq_mode="loglik_norm").key()["mcq_mode"]
        'loglik_norm'
    """

    # the defaults of the options users set are forgetwatch.options' (declared once there)
    mcq_mode: str = default("mcq_mode")
    chat_template: bool | None = default("chat_template")
    cot: bool = default("cot")
    max_new_tokens: int | None = default("max_new_tokens")
    short_mode: str | None = default("short_mode")
    short_match: str = default("short_match")
    system_prompt: str | None = None
    batch_size: int = default("batch_size")
    pack_choices: bool | None = None
    behavior_max_new_tokens: int = default("behavior_max_new_tokens")
    engine: str = default("engine")

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"`engine` must be one of {', '.join(ENGINES)}, got {self.engine!r}")
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
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in NOT_IN_KEY}
        d["max_new_tokens"] = self.new_tokens
        d["short_mode"] = self.short_scoring
        d["prompt_version"] = PROMPT_VERSION
        runtime = engine_spec(self.engine).runtime
        if runtime is not None:
            # other kernels than transformers': near-ties come out otherwise, so a cache says so and `compare` refuses
            # one of another runtime (`forgetwatch.run.base_rescore`). Absent for transformers: earlier caches keep their key
            d["runtime"] = runtime
        if tokenizer is not None:
            # what the `chat_template` option resolved to for this tokenizer
            d["chat"] = {
                "mcq": self.uses_chat(tokenizer, self.mcq_mode == "generate"),
                "short": self.uses_chat(tokenizer, self.cot),
                "behavior": self.uses_chat(tokenizer, True),
            }
        # behaviour verdicts are cached: the rules that judged them are part of the key (left out by
        # `make_cache_key` when no behaviour probe is scored)
        from .judge import behavior_rules_key

        d["behavior_rules"] = behavior_rules_key()
        if precision is not None:
            d["precision"] = precision
        return d


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


def score_loglik(
    engine: Engine, tokenizer, probes: list[Probe], config: ScoringConfig, normalize: bool, bar=None
) -> ProbeResults:
    chat = config.uses_chat(tokenizer, generative=False)
    requests = []
    for p in probes:
        context, options = loglik_request(p, tokenizer, chat, config.system_prompt)
        requests.append(LoglikRequest(context, tuple(options), p.id))
    scored = engine.loglik(requests, chat=chat, bar=bar)
    results = ProbeResults.empty([p.id for p in probes])
    for pi, (p, s) in enumerate(zip(probes, scored, strict=True)):
        # Options with the same tokens get the first one's score, so that they tie exactly and the lowest index wins;
        # packed in one row, the same tokens at other positions can differ in the last bits (up to 1.3e-5 measured).
        first = {}
        loglik = np.array([s.logprobs[first.setdefault(tuple(t), j)].sum() for j, t in enumerate(s.tokens)])
        scores = loglik / np.array([len(c) for c in p.choices]) if normalize else loglik
        _decide(results, pi, p, scores, float(loglik[p.gold]))
    return results


# -- letters --------------------------------------------------------------------------------------------------


def score_letter(engine: Engine, tokenizer, probes: list[Probe], config: ScoringConfig, bar=None) -> ProbeResults:
    chat = config.uses_chat(tokenizer, generative=False)
    built = [letter_prompt(p, tokenizer, chat, config.system_prompt) for p in probes]
    contexts = [c for c, _ in built]
    # The token that spells each letter right after the prompt ("Answer:" + " A" is usually one token " A").
    ctx, sep = built[0]
    base = encode(tokenizer, [ctx], chat)[0]
    kmax = max(len(p.choices) for p in probes)
    spelled = [s[len(base) :] for s in encode(tokenizer, [ctx + sep + answers.LETTERS[j] for j in range(kmax)], chat)]
    letters = [s[0] if len(s) == 1 else None for s in spelled]
    if None in letters or len(set(letters)) < kmax:
        # The separator is a token of its own for some letters (e.g. ":", " ", "A"), so the first tokens do not tell
        # the letters apart: end every prompt with the separator and compare the bare letters' tokens instead.
        contexts = [c + sep for c in contexts]
        bare = tokenizer(list(answers.LETTERS[:kmax]), add_special_tokens=False)["input_ids"]
        letters = [s[0] if len(s) == 1 else None for s in bare]
        if None in letters or len(set(letters)) < kmax:
            raise ValueError(
                "`mcq_mode='letter'` needs one token per option letter, which this tokenizer lacks; use `mcq_mode='loglik'`"
            )
    requests = [NextTokenRequest(c, tuple(letters[: len(p.choices)]), p.id) for c, p in zip(contexts, probes, strict=True)]
    scores = engine.next_token_logprobs(requests, chat=chat, bar=bar)
    results = ProbeResults.empty([p.id for p in probes])
    for i, p in enumerate(probes):
        _decide(results, i, p, scores[i], float(scores[i][p.gold]))
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
        return ch not in _JOINERS and is_punct(ch)


# Accepted answers teacher-forced per probe. TriviaQA lists 17 aliases on average (up to 108: Wikipedia redirect
# titles such as "The weather in Barcelona"), 71 tokens, more than the question. Kept: the first (the answer
# itself), the variants that normalised matching accepts and tokens do not (measured on SmolLM2, benchmarks/
# RESULTS.md): case ("CONCORDE" -> "Concorde", "concorde"), a leading article dropped ("The Georgia Peach" ->
# "Georgia Peach") or added to a one-word answer ("Moon" -> "The moon"); then the shortest other aliases.
MAX_ALIASES = 10
_ARTICLE = re.compile(r"^(?:the|a|an)\s+", re.IGNORECASE)


def answer_continuations(probe: Probe, chat: bool) -> list[str]:
    # After a plain "Answer:" the model writes " Paris"; in a chat turn the answer opens the turn.
    aliases = [a.strip() for a in probe.answers]
    first = aliases[0]
    variants = [first, first[:1].upper() + first[1:].lower() if first.isupper() else first, first.lower(),
                _ARTICLE.sub("", first)]
    if " " not in first and not probe.numeric:
        variants.append("The " + first.lower())
    kept = list(dict.fromkeys(v for v in variants + sorted(aliases[1:], key=len) if v))[:MAX_ALIASES]
    return [a if chat else " " + a for a in kept]


def score_greedy_match(engine: Engine, tokenizer, probes: list[Probe], config: ScoringConfig, bar=None) -> ProbeResults:
    chat = config.uses_chat(tokenizer, generative=False)
    continuations = [answer_continuations(p, chat) for p in probes]
    requests = [LoglikRequest(short_answer_prompt(p, tokenizer, chat, config.system_prompt), tuple(c), p.id)
                for p, c in zip(probes, continuations, strict=True)]
    shared = short_answer_prefix(tokenizer, chat, config.system_prompt)
    scored = engine.loglik(requests, chat=chat, read_next=True, shared=shared, bar=bar)
    boundary = _Boundaries(tokenizer, engine.eos_token_ids)
    results = ProbeResults.empty([p.id for p in probes])
    for pi, s in enumerate(scored):
        best: tuple[int, float, int] | None = None  # (matched tokens, log-prob, alias): the greedy path's closest alias
        correct = None
        for j, (toks, lp, am) in enumerate(zip(s.tokens, s.logprobs, s.argmax, strict=True)):
            n = len(toks)
            matched = int(np.argmin(np.append(am[:n] == np.array(toks), False)))  # length of the greedy prefix
            if matched == n and boundary(int(am[n]), continuations[pi][j].rstrip()[-1:].isdigit()):
                correct = j if correct is None or lp.sum() > s.logprobs[correct].sum() else correct
            if best is None or (matched, lp.sum()) > best[:2]:
                best = (matched, float(lp.sum()), j)
        results.gold_logprob[pi] = max(float(lp.sum()) for lp in s.logprobs)
        results.nonfinite[pi] = not all(np.isfinite(lp).all() for lp in s.logprobs)
        if correct is not None:
            results.outcome[pi] = CORRECT
            results.prediction[pi] = continuations[pi][correct].strip()
        else:
            # What greedy decoding starts with: the alias's tokens it follows, then the token where it leaves them.
            m, _, j = best
            results.outcome[pi] = WRONG
            results.prediction[pi] = tokenizer.decode(s.tokens[j][:m] + [int(s.argmax[j][m])]).strip() + "…"
    return results


# -- generation -----------------------------------------------------------------------------------------------


def _stop_strings(chat: bool, cot: bool) -> tuple[str, ...]:
    if chat:
        return ()  # the chat template's end-of-turn token is the model's EOS
    # Not a bare "\n": small models often open their answer with a newline, and the first non-empty line is kept.
    return ("\n\nQuestion:", "\nQuestion:") if cot else ("\n\n", "\nQuestion:")


def _keep_answers(results: ProbeResults, generated: list[Answer], rows: list[int] | None = None) -> None:
    """Answer i goes to row `rows[i]` (default i); a negative row is a padding probe's answer, dropped."""
    for i, a in zip(rows if rows is not None else range(len(generated)), generated, strict=True):
        if i < 0:
            continue
        results.generation[i] = a.text
        results.n_tokens[i] = a.n_tokens
        results.stopped[i] = int(a.stopped)
        results.nonfinite[i] = a.nonfinite


def score_generate(engine: Engine, tokenizer, probes: list[Probe], config: ScoringConfig, bar=None) -> ProbeResults:
    results = ProbeResults.empty([p.id for p in probes])
    # called for multiple-choice or for short-answer probes, never both: they may differ in chat template
    chat = config.uses_chat(tokenizer, generative=probes[0].kind == "mcq" or config.cot)
    stops = _stop_strings(chat, config.cot)
    requests = [GenerateRequest(generation_prompt(p, tokenizer, chat, config.cot, config.system_prompt), config.new_tokens,
                                stops, p.id) for p in probes]
    generated = engine.generate(requests, chat=chat, bar=bar)
    _keep_answers(results, generated)
    for i, (p, a) in enumerate(zip(probes, generated, strict=True)):
        _judge_generation(results, i, p, a.text, config)
    return results


def score_behavior(engine: Engine, tokenizer, probes: list[Probe], config: ScoringConfig, bar=None) -> ProbeResults:

    results = ProbeResults.empty([p.id for p in probes])
    chat = config.uses_chat(tokenizer, generative=True)
    # A refusal is read from the answer's opening, so a harmless request needs only its first tokens; instruction
    # probes get the whole budget. One call per kind, in a fixed order, so that ranks generate in step.
    for kind, budget in (
        ("instruct", config.behavior_max_new_tokens),
        ("comply", min(REFUSAL_WINDOW, config.behavior_max_new_tokens)),
    ):
        idx = [i for i, p in enumerate(probes) if p.kind == kind]
        if engine.max_over_ranks(len(idx)) == 0:  # no rank has this kind (every rank asks, in the same order)
            continue
        idx = idx or [-1]  # a rank that has none takes part with a padding probe (its answer is dropped)
        requests = [GenerateRequest(behavior_prompt(probes[i], tokenizer, chat, config.system_prompt), budget, (),
                                    probes[i].id if i >= 0 else None) for i in idx]
        generated = engine.generate(requests, chat=chat, bar=bar)
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
