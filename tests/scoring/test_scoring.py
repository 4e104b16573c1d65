"""Scoring on a tiny random Llama: every mode against a plain reference computation, and the model left as found.

The references are written the slow, obvious way (one unpadded forward per option, one `model.generate` per
probe), so they share no code with `forgetwatch.scoring.score` beyond the prompt texts of `forgetwatch.scoring.prompts`.
"""

from __future__ import annotations

import functools
import random

import numpy as np
import pytest
import torch
from conftest import (  # tests/ is on sys.path (pytest "prepend" import mode)
    build_model,
    build_tokenizer,
    requires_smollm,
)
from fixtures.scoring import (
    WORDS,
    assert_same_results,
    enc,
    mcq_probes,
    plain_context,
    reference_loglik,
    row_logprobs,
)

from forgetwatch import answers
from forgetwatch.answers import LETTERS
from forgetwatch.answers.extraction import is_punct
from forgetwatch.probes.probe_set import Probe
from forgetwatch.scoring import prompts
from forgetwatch.scoring.results import CORRECT, INVALID, WRONG
from forgetwatch.scoring.score import ScoringConfig, answer_continuations, describe_precision, score_probes

SHORT = [
    Probe("s0", "short", "What is the capital of France?", answers=("Paris",)),
    Probe("s1", "short", "Which gas do plants absorb?", answers=("carbon dioxide", "CO2")),
    Probe("s2", "short", "2 + 2 = ?", answers=("4",), numeric=True),
]


pytestmark = pytest.mark.usefixtures("one_thread")


# -- references -----------------------------------------------------------------------------------------------










def reference_letter(model, tokenizer, probe: Probe, chat: bool) -> np.ndarray:
    """Log-probs of the option letters at the last position of the lettered prompt (one forward)."""
    ctx, sep = prompts.letter_prompt(probe, tokenizer, chat, None)
    k = probe.num_choices
    base = enc(tokenizer, ctx, chat)
    spelled = [enc(tokenizer, ctx + sep + L, chat)[len(base) :] for L in LETTERS[:k]]
    if all(len(s) == 1 for s in spelled) and len({s[0] for s in spelled}) == k:
        ids, letters = base, [s[0] for s in spelled]
    else:  # " A" is two tokens (" ", "A"): the prompt ends with the separator, the letters follow it
        ids = enc(tokenizer, ctx + sep, chat)
        letters = [tokenizer.convert_tokens_to_ids(L) for L in LETTERS[:k]]
    return row_logprobs(model, ids)[-1, letters].double().numpy()


def reference_generate(model, tokenizer, probe: Probe, chat: bool, max_new_tokens: int) -> str:
    """Greedy `model.generate` on one unpadded prompt; without a chat template the answer ends at a blank line."""
    prompt = prompts.generation_prompt(probe, tokenizer, chat, cot=False, system_prompt=None)
    ids = torch.tensor([enc(tokenizer, prompt, chat)])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False)
    text = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
    return text if chat else text.split("\n\n")[0].split("\nQuestion:")[0]


def expected_outcome(probe: Probe, text: str) -> int:
    """What `forgetwatch.answers` makes of a generation."""
    if probe.kind == "mcq":
        pred = answers.extract_letter(text, probe.num_choices)
        return INVALID if pred is None else CORRECT if pred == probe.gold else WRONG
    pred = answers.extract_short_answer(text)
    if pred is None or (probe.numeric and not answers.parse_math_answer(pred)):
        return INVALID
    return CORRECT if answers.is_correct_short(pred, probe.answers, probe.numeric) else WRONG


def check_decisions(res, probes, scores, gold_logprob, atol=1e-5):
    """pred_index / outcome / margin / gold log-prob from per-option reference scores."""
    for i, (p, s) in enumerate(zip(probes, scores, strict=True)):
        pred = int(np.argmax(s))
        assert res.pred_index[i] == pred, (p.id, s)
        assert res.prediction[i] == p.choices[pred]
        assert res.outcome[i] == (CORRECT if pred == p.gold else WRONG)
        assert res.margin[i] == pytest.approx(s[p.gold] - np.delete(s, p.gold).max(), abs=atol)
        assert res.gold_logprob[i] == pytest.approx(gold_logprob[i], abs=atol)
        assert res.generation[i] == ""




def bigram_model(tokenizer, table: dict[str, str], default: str = "<|im_end|>"):
    """A real LlamaForCausalLM whose next token is a lookup of the current one, so its generations are known.

    Attention and MLP outputs are zeroed, leaving the residual stream = the current token's embedding; each
    token in `table` gets its own one-hot embedding, every other token shares one, and `lm_head` maps them.
    """
    model = build_model(tokenizer)
    tid = tokenizer.convert_tokens_to_ids
    slots = {tok: i + 1 for i, tok in enumerate(sorted(table))}
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        emb, head = model.model.embed_tokens.weight, model.lm_head.weight
        emb.zero_()
        emb[:, 0] = 1.0
        head.zero_()
        head[tid(default), 0] = 10.0
        for src, slot in slots.items():
            emb[tid(src)] = 0.0
            emb[tid(src), slot] = 1.0
            head[tid(table[src]), slot] = 10.0
    return model.eval()


# -- log-likelihood -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("pack", [None, False], ids=["packed", "one-row-per-option"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_loglik_matches_reference(tokenizer, attn, pack):
    model = build_model(tokenizer, attn=attn).eval()
    probes = mcq_probes()
    assert prompts.loglik_request(probes[0], tokenizer, False, None)[0] == plain_context(probes[0])
    ref = [reference_loglik(model, tokenizer, p, plain_context(p)) for p in probes]
    by_bs = {}
    for bs in (1, 16):  # 16: probes with k = 2..5 share a batch
        res = score_probes(model, tokenizer, probes, ScoringConfig(pack_choices=pack, batch_size=bs))
        assert res.ids == [p.id for p in probes]
        check_decisions(res, probes, ref, [r[p.gold] for r, p in zip(ref, probes, strict=True)])
        by_bs[bs] = res
    assert_same_results(by_bs[1], by_bs[16])
    assert 0 < by_bs[16].accuracy < 1  # the test sees both outcomes


def test_loglik_norm_divides_by_length_in_characters(tokenizer):
    model = build_model(tokenizer).eval()
    probes = mcq_probes(seed=1)
    ref = [reference_loglik(model, tokenizer, p, plain_context(p)) for p in probes]
    norm = [r / np.array([len(c) for c in p.choices]) for r, p in zip(ref, probes, strict=True)]
    # the normalisation matters for these probes (otherwise this test would not tell the modes apart)
    assert any(np.argmax(a) != np.argmax(b) for a, b in zip(ref, norm, strict=True))
    res = score_probes(model, tokenizer, probes, ScoringConfig(mcq_mode="loglik_norm"))
    # margin is on the normalised scores; gold_logprob stays the raw log-likelihood
    check_decisions(res, probes, norm, [r[p.gold] for r, p in zip(ref, probes, strict=True)])


@pytest.mark.parametrize("bs", [1, 16])
@pytest.mark.parametrize("pack", [None, False], ids=["packed", "one-row-per-option"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_exact_ties_go_to_the_lowest_index(tokenizer, attn, pack, bs):
    model = build_model(tokenizer, attn=attn).eval()
    long = "the quick brown fox jumps over the lazy dog step final answer line"
    probes = [
        Probe("t0", "mcq", "Which gas do plants absorb?", ("oxygen", long, "oxygen"), gold=2),
        Probe("t1", "mcq", "What is the capital of France?", (long, "Paris", "Paris", "Paris"), gold=3),
        *mcq_probes(6),
    ]
    for p in probes[:2]:  # the duplicates are the best options, by more than rounding
        r = reference_loglik(model, tokenizer, p, plain_context(p))
        assert r[p.gold] - r[r != r[p.gold]].max() > 1.0
    res = score_probes(model, tokenizer, probes, ScoringConfig(pack_choices=pack, batch_size=bs))
    assert res.pred_index[:2].tolist() == [0, 1]
    assert res.outcome[:2].tolist() == [WRONG, WRONG]
    assert res.margin[:2].tolist() == [0.0, 0.0]


# -- letters --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("chat", [False, True], ids=["plain", "chat"])
def test_letter_matches_reference(tokenizer, chat):
    model = build_model(tokenizer).eval()
    probes = mcq_probes(seed=2)
    ctx, sep = prompts.letter_prompt(probes[0], tokenizer, chat, None)
    # The tiny tokenizer spells " A" as two tokens (" ", "A") but " B" as one: the first tokens alone would
    # score A, C and D identically. With the chat template the letters follow "\n" as single tokens.
    assert len(enc(tokenizer, ctx + sep + "A", chat)) - len(enc(tokenizer, ctx, chat)) == (1 if chat else 2)
    ref = [reference_letter(model, tokenizer, p, chat) for p in probes]
    by_bs = {}
    for bs in (1, 16):
        res = score_probes(model, tokenizer, probes, ScoringConfig(mcq_mode="letter", chat_template=chat, batch_size=bs))
        check_decisions(res, probes, ref, [r[p.gold] for r, p in zip(ref, probes, strict=True)])
        by_bs[bs] = res
    assert_same_results(by_bs[1], by_bs[16])
    assert (by_bs[1].margin != 0).all()  # every letter has a score of its own (no shared " " token)


# -- generation -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("chat", [None, False], ids=["chat-by-default", "plain"])
def test_generate_matches_reference_greedy(tokenizer, chat):
    model = build_model(tokenizer).eval()
    probes = mcq_probes(8, seed=3) + SHORT
    config = ScoringConfig(mcq_mode="generate", chat_template=chat, max_new_tokens=10, short_mode="generate")
    # the tokenizer has a chat template: letter generation uses it unless told not to; the few-shot short-answer
    # prompt is plain unless told otherwise
    uses_chat = chat is None
    res = score_probes(model, tokenizer, probes, config)
    for i, p in enumerate(probes):
        text = reference_generate(model, tokenizer, p, uses_chat and p.kind == "mcq", 10)
        assert res.generation[i] == text, p.id
        assert res.outcome[i] == expected_outcome(p, text), (p.id, text)
    # a random model writes no letter: every multiple-choice answer is invalid, with nothing predicted
    assert res.outcome[:8].tolist() == [INVALID] * 8
    assert res.pred_index.tolist() == [-1] * len(probes) and res.prediction[:8] == [""] * 8
    assert np.isnan(res.gold_logprob).all() and np.isnan(res.margin).all()
    assert_same_results(
        res,
        score_probes(
            model,
            tokenizer,
            probes,
            ScoringConfig(mcq_mode="generate", chat_template=chat, max_new_tokens=10, batch_size=1, short_mode="generate"),
        ),
    )


@pytest.mark.parametrize("chat", [None, False], ids=["chat", "plain"])
def test_generate_outcomes_follow_answer_extraction(tokenizer, chat):
    probes = [
        Probe("b", "mcq", "Which gas do plants absorb?", ("oxygen", "carbon dioxide", "helium", "neon"), gold=1),
        Probe("a", "mcq", "What is the capital of France?", ("Paris", "London"), gold=0),
        Probe("sb", "short", "Which letter comes after A?", answers=("B",)),
        Probe("sp", "short", "What is the capital of France?", answers=("Paris", "Paris, France")),
        Probe("n", "short", "2 + 2 = ?", answers=("4",), numeric=True),
    ]
    # The prompt ends with ":" (plain) or "\n" (chat). Model 1 answers " B\n" over and over up to the token
    # budget (the first line is the answer), model 2 answers " Paris" then end-of-turn.
    says_b = bigram_model(tokenizer, {":": "ĠB", "Ċ": "ĠB", "ĠB": "Ċ"})
    says_paris = bigram_model(tokenizer, {":": "ĠParis", "Ċ": "ĠParis", "ĠParis": "<|im_end|>"})
    config = ScoringConfig(mcq_mode="generate", chat_template=chat, max_new_tokens=6, short_mode="generate")
    expected = {
        "b": ([CORRECT, WRONG, CORRECT, WRONG, INVALID], [1, 1, -1, -1, -1], ["carbon dioxide", "London", "B", "B", ""]),
        "paris": ([INVALID, INVALID, WRONG, CORRECT, INVALID], [-1] * 5, ["", "", "Paris", "Paris", ""]),
    }
    for name, model in (("b", says_b), ("paris", says_paris)):
        res = score_probes(model, tokenizer, probes, config)
        for i, p in enumerate(probes):
            text = reference_generate(model, tokenizer, p, chat is None and p.kind == "mcq", 6)
            assert res.generation[i] == text
            assert res.outcome[i] == expected_outcome(p, text)
        outcome, pred_index, prediction = expected[name]
        assert res.outcome.tolist() == outcome, name
        assert res.pred_index.tolist() == pred_index and res.prediction == prediction
    assert score_probes(says_b, tokenizer, probes[:1], config).generation == [" B\n B\n B\n"]


def test_generation_config_with_a_list_of_eos_ids(tokenizer):
    # Llama 3, Qwen, ... keep several end-of-turn ids in generation_config.eos_token_id
    model = bigram_model(tokenizer, {":": "ĠParis", "Ċ": "ĠParis", "ĠParis": "<|endoftext|>"})
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, tokenizer.pad_token_id]
    res = score_probes(model, tokenizer, SHORT[:1], ScoringConfig(chat_template=True, short_mode="generate"))
    assert res.generation == [" Paris"] and res.outcome.tolist() == [CORRECT]


# -- chat template --------------------------------------------------------------------------------------------


def test_chat_template_renders_the_prompt(tokenizer):
    model = build_model(tokenizer).eval()
    probes = mcq_probes(8, seed=4)
    system = "You are a careful assistant."
    config = ScoringConfig(chat_template=True, system_prompt=system)
    ref = []
    for p in probes:
        messages = [{"role": "system", "content": system}, {"role": "user", "content": f"Question: {p.question}"}]
        ctx = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert ctx.startswith("<|im_start|>system\n") and ctx.endswith("<|im_start|>assistant\n")
        ref.append(reference_loglik(model, tokenizer, p, ctx, sep="", chat=True))  # the answer starts the model's turn
    res = score_probes(model, tokenizer, probes, config)
    check_decisions(res, probes, ref, [r[p.gold] for r, p in zip(ref, probes, strict=True)])
    plain = score_probes(model, tokenizer, probes, ScoringConfig())
    assert not np.allclose(plain.gold_logprob, res.gold_logprob)
    # what `chat_template=None` resolved to goes into the cache key
    # (behaviour probes are always generated: in the template when there is one)
    assert ScoringConfig().key(tokenizer)["chat"] == {"mcq": False, "short": False, "behavior": True}
    assert ScoringConfig(mcq_mode="generate").key(tokenizer)["chat"] == {"mcq": True, "short": False, "behavior": True}
    assert ScoringConfig(cot=True).key(tokenizer)["chat"] == {"mcq": False, "short": True, "behavior": True}
    assert ScoringConfig(chat_template=False).key(tokenizer)["chat"] == {"mcq": False, "short": False, "behavior": False}


def test_chat_template_required_but_missing_names_the_field():
    tok = build_tokenizer()
    tok.chat_template = None
    model = build_model(tok)
    with pytest.raises(ValueError, match="`chat_template=True`"):
        score_probes(model, tok, mcq_probes(2), ScoringConfig(chat_template=True))
    # without a template, generation falls back to the plain prompt
    assert ScoringConfig().key(tok)["chat"] == {"mcq": False, "short": False, "behavior": False}


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"mcq_mode": "cloze"}, "mcq_mode"),
        ({"short_match": "fuzzy"}, "short_match"),
        ({"batch_size": 0}, "batch_size"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
    ],
)
def test_config_validation_names_the_field(kwargs, field):
    with pytest.raises(ValueError, match=f"`{field}`"):
        ScoringConfig(**kwargs)


def test_describe_precision(tokenizer):
    model = build_model(tokenizer)
    assert describe_precision(model) == "float32"
    assert describe_precision(model, autocast="bfloat16") == "float32+autocast-bfloat16"
    with torch.autocast("cpu", dtype=torch.bfloat16):  # what the trainer does under `bf16=True`
        assert describe_precision(model) == "float32+autocast-bfloat16"
    assert describe_precision(model.to(torch.bfloat16)) == "bfloat16"


def test_batch_size_is_not_in_the_key():
    assert ScoringConfig(batch_size=1).key() == ScoringConfig(batch_size=64, pack_choices=False).key()
    assert ScoringConfig(mcq_mode="letter").key() != ScoringConfig().key()
    assert ScoringConfig(cot=True).new_tokens == 256 and ScoringConfig().new_tokens == 32


# -- the model is left as found -------------------------------------------------------------------------------

MODES = ["loglik", "loglik_norm", "letter", "generate"]


def test_model_left_exactly_as_found(tokenizer):
    model = build_model(tokenizer, dropout=0.1)  # dropout: train mode would consume RNG
    model.train()
    model.model.layers[1].eval()
    model.lm_head.eval()
    model.model.layers[0].self_attn.q_proj.weight.requires_grad_(False)
    model.model.embed_tokens.weight.requires_grad_(False)
    training = {name: m.training for name, m in model.named_modules()}
    requires_grad = {name: p.requires_grad for name, p in model.named_parameters()}
    assert len(set(training.values())) == 2 and len(set(requires_grad.values())) == 2  # really mixed
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    generation_config = model.generation_config.to_dict()
    random.seed(7)
    np.random.seed(7)
    torch.manual_seed(7)
    py_rng, np_rng, torch_rng = random.getstate(), np.random.get_state(), torch.get_rng_state()

    # a forward that draws random numbers anyway (custom code, a layer that ignores eval mode)
    draws = []
    hook = model.model.norm.register_forward_hook(lambda *_: draws.append((random.random(), np.random.rand(), torch.rand(1))))
    probes = mcq_probes(6) + SHORT
    for mode in MODES:
        score_probes(model, tokenizer, probes, ScoringConfig(mcq_mode=mode, max_new_tokens=4))
    score_probes(model, tokenizer, probes, ScoringConfig(pack_choices=False, chat_template=True, max_new_tokens=4))
    hook.remove()
    assert draws

    assert {name: m.training for name, m in model.named_modules()} == training
    assert {name: p.requires_grad for name, p in model.named_parameters()} == requires_grad
    assert all(p.grad is None for p in model.parameters())
    assert model.state_dict().keys() == weights.keys()
    assert all(torch.equal(v, weights[k]) for k, v in model.state_dict().items())
    assert model.generation_config.to_dict() == generation_config
    assert random.getstate() == py_rng
    assert all(np.array_equal(a, b) for a, b in zip(np.random.get_state(), np_rng, strict=True))
    assert torch.equal(torch.get_rng_state(), torch_rng)
    assert torch.is_grad_enabled() and not torch.is_inference_mode_enabled()


# -- out of memory --------------------------------------------------------------------------------------------


def fail_above(model, monkeypatch, max_rows: int) -> list[int]:
    """Make the model's forward raise torch.OutOfMemoryError (as a GPU would) on more than `max_rows` rows."""
    forward = model.forward
    seen: list[int] = []

    @functools.wraps(forward)
    def forward_with_limit(*args, **kwargs):
        rows = (kwargs["input_ids"] if "input_ids" in kwargs else args[0]).shape[0]
        seen.append(rows)
        if rows > max_rows:
            raise torch.OutOfMemoryError(f"CUDA out of memory (simulated: {rows} rows > {max_rows})")
        return forward(*args, **kwargs)

    monkeypatch.setattr(model, "forward", forward_with_limit)
    return seen


@pytest.mark.parametrize("mode", MODES)
def test_out_of_memory_halves_the_batch(tokenizer, monkeypatch, mode):
    model = build_model(tokenizer).eval()
    probes = mcq_probes(10, seed=5) + SHORT
    config = ScoringConfig(mcq_mode=mode, batch_size=8, max_new_tokens=6)
    expected = score_probes(model, tokenizer, probes, config)
    seen = fail_above(model, monkeypatch, max_rows=2)
    got = score_probes(model, tokenizer, probes, config)
    assert max(seen) > 2 and 2 in seen  # it did run out of memory, and went on with smaller batches
    assert_same_results(got, expected)


def test_out_of_memory_at_batch_size_one_is_raised(tokenizer, monkeypatch):
    model = build_model(tokenizer)
    model.train()
    fail_above(model, monkeypatch, max_rows=0)
    with pytest.raises(torch.OutOfMemoryError):
        score_probes(model, tokenizer, mcq_probes(3), ScoringConfig(batch_size=4))
    assert all(m.training for m in model.modules())  # restored on the way out, too


# -- short answers: teacher-forced greedy match ---------------------------------------------------------------


def is_boundary(tokenizer, token_id: int, after_digit: bool) -> bool:
    """The documented rule, written out: special token / whitespace / punctuation that does not continue the answer."""
    if token_id in tokenizer.all_special_ids:
        return True
    text = tokenizer.decode([token_id])
    if not text or text[0].isspace():
        return True
    if after_digit and text[0] in ".,":
        return False
    return text[0] not in "-\u2010\u2011'\u2019_/" and is_punct(text[0])


def reference_greedy_prefix(model, tokenizer, probe: Probe, chat: bool) -> bool:
    """Decode greedily, then: do the new tokens begin with an accepted answer's tokens, followed by a boundary?"""
    prompt = prompts.short_answer_prompt(probe, tokenizer, chat, None)
    ctx = enc(tokenizer, prompt, chat)
    conts = [enc(tokenizer, prompt + (a if chat else " " + a), chat)[len(ctx) :] for a in probe.answers]
    ids = torch.tensor([ctx])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max(map(len, conts)) + 1,
                         do_sample=False, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    new = out[0, len(ctx) :].tolist()
    for alias, toks in zip(probe.answers, conts, strict=True):
        if new[: len(toks)] == toks and len(new) > len(toks) and is_boundary(tokenizer, new[len(toks)], alias[-1].isdigit()):
            return True
    return False


def greedy_fixture(model, tokenizer, chat: bool, n: int = 16) -> list[Probe]:
    """Short probes whose accepted answers are prefixes of what the model decodes: some end where the decoded answer
    ends (a boundary follows), some do not, and one random word per probe that decoding does not produce."""
    rng = random.Random(1)
    out = []
    for i in range(n):
        q = " ".join(rng.choices(WORDS, k=rng.randint(2, 8))) + "?"
        prompt = prompts.short_answer_prompt(Probe("q", "short", q, answers=("x",)), tokenizer, chat, None)
        ctx = enc(tokenizer, prompt, chat)
        ids = torch.tensor([ctx])
        new = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False,
                             pad_token_id=tokenizer.pad_token_id)[0, len(ctx) :].tolist()
        aliases = []
        for m in range(1, len(new)):
            text = tokenizer.decode(new[:m])
            alias = text.strip()
            # keep prefixes that tokenise back to the same tokens after the prompt (random models write odd splits)
            if alias and (text if chat else " " + alias) == text and enc(tokenizer, prompt + text, chat)[len(ctx) :] == new[:m]:
                aliases.append(alias)
        picked = rng.sample(aliases, min(1, len(aliases)))
        out.append(Probe(f"g{i}", "short", q, answers=(*picked, rng.choice(WORDS))))
    return out


def wordy_model(tokenizer, seed: int):
    """A random tiny Llama that writes words: the output rows of tokens that are not printable ASCII are zeroed and the
    others scaled up (words after a space most), so greedy decoding picks among words, digits and punctuation (a random
    model's first choice is otherwise a stray byte, and no answer could ever start a generation)."""
    model = build_model(tokenizer, seed=seed)
    with torch.no_grad():
        for tid in range(len(tokenizer)):
            text = tokenizer.decode([tid])
            printable = bool(text) and text.isascii() and text.isprintable() and tid not in tokenizer.all_special_ids
            # words that start with a space lead, as after "Answer:" in real text
            model.lm_head.weight[tid] *= (5.0 if text.startswith(" ") else 4.0) if printable else 0.0
    return model.eval()


@pytest.mark.parametrize("chat", [False, True], ids=["plain", "chat"])
@pytest.mark.parametrize("seed", [0, 1])
def test_greedy_match_equals_decode_then_prefix_match(tokenizer, chat, seed):
    model = wordy_model(tokenizer, seed)
    probes = greedy_fixture(model, tokenizer, chat)
    config = ScoringConfig(chat_template=chat, short_mode="greedy_match")
    res = score_probes(model, tokenizer, probes, config)
    expected = [reference_greedy_prefix(model, tokenizer, p, chat) for p in probes]
    assert res.outcome.tolist() == [CORRECT if e else WRONG for e in expected]
    assert 0 < sum(expected) < len(probes)  # the fixture has both outcomes
    # the continuous score: the best accepted answer's summed log-probability (over the answers and the first one's
    # case variants, as teacher-forced), as one unpadded forward per answer computes it
    for i, p in enumerate(probes):
        prompt = prompts.short_answer_prompt(p, tokenizer, chat, None)
        forced = tuple(a.strip() for a in answer_continuations(p, chat))
        assert set(p.answers) <= set(forced)
        ref = reference_loglik(model, tokenizer, Probe("r", "mcq", "q", forced, 0), prompt, sep="" if chat else " ", chat=chat)
        assert res.gold_logprob[i] == pytest.approx(ref.max(), abs=1e-4)
    assert (res.outcome != INVALID).all() and res.generation == [""] * len(probes)
    # the same results whatever the batch size and packing
    for bs, pack in ((1, None), (3, False), (16, True)):
        assert_same_results(
            res, score_probes(model, tokenizer, probes, ScoringConfig(chat_template=chat, batch_size=bs, pack_choices=pack))
        )


@pytest.mark.parametrize(
    ("then", "alias", "correct"),
    [
        ("<|im_end|>", "Paris", True),  # end of sequence
        ("Ċ", "Paris", True),  # a newline
        (".", "Paris", True),  # punctuation ends the answer
        ("i", "Paris", False),  # "Parisian" is another word
        ("i", "Parisian", True),
        ("-", "Paris", False),  # a hyphen continues the word
    ],
)
def test_greedy_match_needs_a_boundary_after_the_answer(tokenizer, then, alias, correct):
    # the plain prompt ends with "Answer:"; the model answers " Paris" and then `then` (then "an" after "i")
    model = bigram_model(tokenizer, {":": "ĠParis", "ĠParis": then, "i": "an"})
    probe = Probe("p", "short", "What is the capital of France?", answers=(alias, "Lyon"))
    res = score_probes(model, tokenizer, [probe], ScoringConfig(chat_template=False))
    assert res.outcome.tolist() == [CORRECT if correct else WRONG]
    assert res.prediction == [alias] if correct else res.prediction[0].endswith("…")


@pytest.mark.parametrize(
    ("then", "alias", "correct"),
    [("Ċ", "1", True), ("2", "1", False), ("2", "12", True), (".", "1", False), (",", "1", False)],
)
def test_greedy_match_numbers_end_only_where_the_number_ends(tokenizer, then, alias, correct):
    # " 1" then "2" is 12, " 1" then "." is 1.5 or the like, " 1" then "," is 1,000 or the like
    model = bigram_model(tokenizer, {":": "Ġ1", "Ġ1": then, "2": "Ċ"})
    probe = Probe("n", "short", "2 - 1 = ?", answers=(alias,), numeric=True)
    assert score_probes(model, tokenizer, [probe], ScoringConfig(chat_template=False)).outcome.tolist() == [
        CORRECT if correct else WRONG]


def test_short_mode_defaults_and_validation():
    assert ScoringConfig().short_scoring == "greedy_match"
    assert ScoringConfig(cot=True).short_scoring == "generate"
    assert ScoringConfig().key()["short_mode"] == "greedy_match"
    assert ScoringConfig(short_mode="generate").key() != ScoringConfig().key()
    with pytest.raises(ValueError, match="`short_mode` must be one of generate, greedy_match, got 'decode'"):
        ScoringConfig(short_mode="decode")
    with pytest.raises(ValueError, match="cot=True.*short_mode='generate'"):
        ScoringConfig(short_mode="greedy_match", cot=True)


def test_greedy_match_computes_the_exemplars_once(tokenizer, monkeypatch):
    model = wordy_model(tokenizer, 0)
    probes = greedy_fixture(model, tokenizer, chat=False)
    seen = []
    handle = model.register_forward_pre_hook(lambda m, a, kw: seen.append(kw["input_ids"].shape), with_kwargs=True)
    res = score_probes(model, tokenizer, probes, ScoringConfig(chat_template=False, batch_size=4))
    shared = len(enc(tokenizer, prompts.short_answer_prefix(tokenizer, False, None))) - 1
    # the exemplars once (all but the last token, then the last through the cache, which shows the model reads it
    # back: forgetwatch.scoring.forward), then 16 probes in batches of 4
    assert seen[:2] == [(1, shared - 1), (1, 1)] and len(seen) == 2 + 4
    longest = max(len(enc(tokenizer, prompts.short_answer_prompt(p, tokenizer, False, None))) for p in probes)
    assert all(s[1] < longest - shared + 40 for s in seen[1:])  # rows hold the question and answers, not the exemplars
    handle.remove()
    # the same results as with the exemplars recomputed in every row
    monkeypatch.setattr("forgetwatch.scoring.engines.hf._shared_prefix", lambda *a, **k: [])
    assert_same_results(res, score_probes(model, tokenizer, probes, ScoringConfig(chat_template=False, batch_size=4)), atol=1e-4)


# -- edge cases -------------------------------------------------------------------------------------------------


@requires_smollm
def test_duplicate_options_tie_exactly_and_the_lowest_index_wins(smollm):
    """Packed in one row, the same option text at another position scored up to 1e-5 apart on SmolLM2 (and index 1
    won once in 7); options with the same tokens must tie exactly, so the lowest index wins by construction."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, tok = AutoModelForCausalLM.from_pretrained(smollm), AutoTokenizer.from_pretrained(smollm)
    texts = ["carbon dioxide", "the Eiffel Tower", "a large grocery store", "ride a bicycle", "feeling very happy",
             "New York City", "the kitchen sink"]
    probes = [
        Probe(f"d{i}", "mcq", f"Which of these is the answer to question {i}?", (t, t), gold=0) for i, t in enumerate(texts)
    ]
    res = score_probes(model, tok, probes, ScoringConfig(pack_choices=True))
    assert res.pred_index.tolist() == [0] * len(probes) and res.margin.tolist() == [0.0] * len(probes)


def eos_appending_tokenizer():
    from tokenizers import processors

    tok = build_tokenizer()
    eos = tok.eos_token_id
    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="$A <|im_end|>", special_tokens=[("<|im_end|>", eos)]
    )
    assert tok("a")["input_ids"][-1] == eos
    return tok


@pytest.mark.parametrize("mode", ["loglik", "letter", "greedy_match"])
def test_a_tokenizer_that_appends_eos_scores_like_one_that_does_not(tokenizer, mode):
    model = build_model(tokenizer).eval()
    probes = mcq_probes(8, seed=5) + SHORT
    config = ScoringConfig(mcq_mode=mode if mode != "greedy_match" else "loglik", chat_template=False)
    assert_same_results(score_probes(model, eos_appending_tokenizer(), probes, config),
                        score_probes(model, tokenizer, probes, config))


def test_alibi_models_score_one_option_per_row(tokenizer):
    """Bloom's ALiBi bias is built from a 2-D mask: the packed 4-D mask crashed it ("too many values to unpack")."""
    from transformers import BloomConfig, BloomForCausalLM

    torch.manual_seed(0)
    config = BloomConfig(vocab_size=len(tokenizer), hidden_size=64, n_layer=2, n_head=4, pad_token_id=tokenizer.pad_token_id)
    model = BloomForCausalLM(config).eval()
    probes = mcq_probes(8, seed=2)
    res = score_probes(model, tokenizer, probes, ScoringConfig())
    assert_same_results(res, score_probes(model, tokenizer, probes, ScoringConfig(pack_choices=False)))
    ref = [reference_loglik(model, tokenizer, p, plain_context(p)) for p in probes]
    check_decisions(res, probes, ref, [r[p.gold] for r, p in zip(ref, probes, strict=True)], atol=1e-4)


def test_greedy_match_on_a_model_that_returns_no_cache(tokenizer, monkeypatch):
    """A model may return no cache although asked (a LoRA model merged after TRL training did, with gradient
    checkpointing on): then every row carries the exemplars itself, instead of crashing."""
    model = wordy_model(tokenizer, 0)
    probes = greedy_fixture(model, tokenizer, chat=False)[:6]
    plain = score_probes(model, tokenizer, probes, ScoringConfig(chat_template=False))
    forward = model.forward

    def no_cache(*args, **kwargs):  # the model's own forward, with the cache dropped from its output
        out = forward(*args, **kwargs)
        for name in ("cache", "past_key_values"):  # the output field's name from transformers 5.24, and before
            if name in out:
                out[name] = None
        return out

    monkeypatch.setattr(model, "forward", no_cache)
    seen = []
    model.register_forward_pre_hook(lambda m, a, kw: seen.append(kw["input_ids"].shape), with_kwargs=True)
    assert_same_results(score_probes(model, tokenizer, probes, ScoringConfig(chat_template=False)), plain, atol=1e-4)
    shared = len(enc(tokenizer, prompts.short_answer_prefix(tokenizer, False, None))) - 1
    assert seen[0] == (1, shared - 1) and all(s[1] > shared for s in seen[1:])  # asked once, then rows carry the exemplars


# -- a probe with thousands of options: memory linear in its options ---------------------------------------------------
def _many_options(n: int) -> Probe:
    words = "Paris London capital France plants absorb gas oxygen carbon dioxide helium neon".split()
    return Probe("many", "mcq", "Which one is it?", tuple(f"{words[i % 12]} {words[i * 7 % 12]} {i}" for i in range(n)),
                 gold=3)


def test_options_beyond_one_packed_row_are_scored_as_if_each_were_alone(tokenizer):
    """300 options (about 1,400 option tokens) are packed into rows of at most PACK_TOKENS: every option's score is the
    one it gets scored alone (unpacked)."""
    from forgetwatch.scoring.engines.hf import PACK_TOKENS, pack_groups

    model = build_model(tokenizer, context=4096)
    probe = _many_options(300)
    packed = score_probes(model, tokenizer, [probe], ScoringConfig(mcq_mode="loglik", pack_choices=True))
    alone = score_probes(model, tokenizer, [probe], ScoringConfig(mcq_mode="loglik", pack_choices=False))
    lengths = [len(tokenizer(" " + c, add_special_tokens=False)["input_ids"]) for c in probe.choices]
    assert len(pack_groups([[0] * n for n in lengths])) > 1 and sum(lengths) > PACK_TOKENS  # really split
    np.testing.assert_allclose(packed.option_scores, alone.option_scores, rtol=0, atol=1e-4)
    assert packed.outcome.tolist() == alone.outcome.tolist()


def test_a_probe_with_2000_options_is_scored_under_a_3_gb_memory_cap(tmp_path):
    """All options in one packed row took 6.5 GB at its peak (eager attention, the tiny model): the block mask and the
    attention grow with the square of the row. A child process capped at 3 GB of address space scores it now."""
    import resource
    import subprocess
    import sys
    from pathlib import Path

    tests = Path(__file__).resolve().parents[1]
    code = f"""
import sys
sys.path.insert(0, {str(tests)!r})
from conftest import build_model, build_tokenizer
from scoring.test_scoring import _many_options
from forgetwatch.scoring.score import ScoringConfig, score_probes
tok = build_tokenizer()
model = build_model(tok, attn="eager", context=16384)
print(score_probes(model, tok, [_many_options(2000)], ScoringConfig(mcq_mode="loglik")).outcome.tolist())
"""

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (3 * 2**30, 3 * 2**30))

    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, preexec_fn=cap)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() in ("[0]", "[1]")


def test_the_progress_bar_draws_nothing_into_a_log_file(tokenizer, monkeypatch):
    """Written to a file (a job's log), the bar beside the Trainer's left escape codes and carriage returns: it is
    drawn on a terminal only."""
    import io
    import sys

    log = io.StringIO()
    monkeypatch.setattr(sys, "stderr", log)
    score_probes(build_model(tokenizer), tokenizer, mcq_probes(6), ScoringConfig(mcq_mode="loglik"), progress=True,
                 desc="forgetwatch: step 10")
    assert "\x1b[" not in log.getvalue() and "\r" not in log.getvalue() and "step 10" not in log.getvalue()
