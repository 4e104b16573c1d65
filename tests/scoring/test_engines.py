"""The engine seam: `score_probes` runs every scoring mode through an engine's requests, and `HFEngine` honours
per-request generation budgets. In-memory, a tiny random model."""

import pytest
import torch
from conftest import build_model, continuous_sessions, requires_continuous_batching
from fixtures.scoring import assert_same_results, mcq_probes

from forgetwatch.probes.probe_set import Probe
from forgetwatch.scoring.engines import HFEngine
from forgetwatch.scoring.requests import GenerateRequest
from forgetwatch.scoring.score import ScoringConfig, score_probes

pytestmark = pytest.mark.usefixtures("one_thread")


def short_probes(n: int) -> list[Probe]:
    return [Probe(f"s{i}", "short", f"What is {i} plus {i}?", answers=(str(2 * i), f"{2 * i}.0")) for i in range(n)]


class Counting(HFEngine):
    """An engine of one's own: the HF engine, counting what each kind of request asks for."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.asked = {"loglik": 0, "next_token_logprobs": 0, "generate": 0}

    def loglik(self, requests, **kw):
        self.asked["loglik"] += len(requests)
        return super().loglik(requests, **kw)

    def next_token_logprobs(self, requests, **kw):
        self.asked["next_token_logprobs"] += len(requests)
        return super().next_token_logprobs(requests, **kw)

    def generate(self, requests, **kw):
        self.asked["generate"] += len(requests)
        return super().generate(requests, **kw)


@pytest.mark.parametrize(("config", "asked"), [
    (ScoringConfig(mcq_mode="loglik", short_mode="greedy_match"), "loglik"),
    (ScoringConfig(mcq_mode="letter", chat_template=False), "next_token_logprobs"),
    (ScoringConfig(mcq_mode="generate", short_mode="generate", max_new_tokens=6), "generate"),
], ids=["loglik", "letter", "generate"])
def test_a_given_engine_runs_every_request(tokenizer, config, asked):
    model = build_model(tokenizer)
    probes = mcq_probes(4) + ([] if asked == "next_token_logprobs" else short_probes(3))
    engine = Counting(model, tokenizer)  # the batch size of ScoringConfig(): the same batches, the same bits
    res = score_probes(model, tokenizer, probes, config, engine=engine)
    assert engine.asked[asked] == len(probes)
    assert sum(engine.asked.values()) == len(probes)
    assert_same_results(res, score_probes(model, tokenizer, probes, config), atol=0)


def test_a_given_engine_brings_its_own_ranks(tokenizer):
    model = build_model(tokenizer)
    with pytest.raises(ValueError, match="`sync_ranks` is for the default engine"):
        score_probes(model, tokenizer, mcq_probes(2), engine=HFEngine(model, tokenizer), sync_ranks=True)


def test_generate_runs_each_budget_as_asked(tokenizer):
    """Requests with different budgets in one call get the answers of one call per budget, in the order asked."""
    model = build_model(tokenizer)
    engine = HFEngine(model, tokenizer, batch_size=4)
    prompts = ["Question: What is the capital of France?\nAnswer:", "Question: Name a colour.\nAnswer:",
               "Question: How many legs has a cat?\nAnswer:"]
    mixed = [GenerateRequest(p, n, ("\n\n",), f"p{i}") for i, (p, n) in enumerate(zip(prompts, (3, 8, 3), strict=True))]
    with engine.running():
        together = engine.generate(mixed, chat=False)
        apart = [engine.generate([r], chat=False)[0] for r in mixed]
    assert together == apart
    assert all(a.n_tokens <= r.max_new_tokens for a, r in zip(together, mixed, strict=True))



# -- generation in a refilling batch ----------------------------------------------------------------------------------

_WORDS = "Question: What is the capital of France? The quick brown fox jumps over the lazy dog 0 1 2 3 Answer: B".split()


def _prompts(n: int) -> list[str]:
    return [" ".join(_WORDS[i % 7 : i % 7 + 2 + (i * 7) % 15]) for i in range(n)]  # 2 to 16 words


def _ending_model(tokenizer, seed: int, prompts: list[str], chat: bool = False):
    """A tiny random model whose answers to `prompts` end at different lengths: a token it often writes is made an
    end of turn (its generation config's EOS list, as Llama 3 keeps several); and two stop strings it writes."""
    import collections

    model = build_model(tokenizer, seed=seed)
    engine = HFEngine(model, tokenizer, batch_size=8, refill=False)
    with engine.running():
        texts = [a.text for a in engine.generate([GenerateRequest(p, 40) for p in prompts], chat=chat)]
    seen = collections.Counter(t for x in texts for t in set(tokenizer(x, add_special_tokens=False)["input_ids"]))
    common = next(t for t, c in seen.most_common() if c <= 22)  # in some answers, not all
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, common]
    stops = tuple(s for s, _ in collections.Counter(x[j : j + 2] for x in texts for j in range(0, len(x) - 2, 5)).most_common(2))
    return model, stops


class Slots:
    """Token slots decoded: a forward decodes one token for each row of its batch."""

    def __init__(self, model):
        self.slots = self.forwards = 0
        self.handle = model.register_forward_pre_hook(self.hook, with_kwargs=True)

    def hook(self, module, args, kwargs):
        self.forwards += 1
        self.slots += kwargs["input_ids"].shape[0]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("chat", [False, True])
def test_refilling_gives_the_answers_of_static_batches(tokenizer, seed, chat):
    """Mixed prompt lengths, per-request budgets, stop strings and ends of turn, several batch sizes: the refilling
    batch's answers are `model.generate`'s in static batches, and its end-of-turn and stop-string endings happen."""
    prompts = _prompts(30)
    if chat:
        prompts = [tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
                   for p in prompts]
    model, stops = _ending_model(tokenizer, seed, prompts, chat)
    requests = [GenerateRequest(p, (3, 8, 20, 40)[i % 4], ((), stops[:1], stops)[i % 3], f"p{i}") for i, p in enumerate(prompts)]
    for batch_size in (1, 3, 16):
        static, refill = (
            HFEngine(model, tokenizer, batch_size=batch_size, refill=False),
            HFEngine(model, tokenizer, batch_size=batch_size),
        )
        with static.running():
            want = static.generate(requests, chat=chat)
            got = refill.generate(requests, chat=chat)
        assert got == want, batch_size
    ended = [a.n_tokens < r.max_new_tokens for a, r in zip(want, requests, strict=True)]
    assert 0 < sum(ended) < len(requests)  # some answers ended early, some ran to their budget


def test_refilling_flags_nonfinite_logits_as_static_batches(tokenizer):
    model = build_model(tokenizer)
    with torch.no_grad():
        model.model.norm.weight.fill_(float("nan"))
    requests = [GenerateRequest(p, 5, ("\n",), f"p{i}") for i, p in enumerate(_prompts(7))]
    static, refill = HFEngine(model, tokenizer, batch_size=3, refill=False), HFEngine(model, tokenizer, batch_size=3)
    with static.running():
        want, got = static.generate(requests, chat=False), refill.generate(requests, chat=False)
    assert got == want and all(a.nonfinite for a in got)


def test_refilling_decodes_fewer_slots_than_static_batches(tokenizer):
    """Answers of different lengths: a static batch decodes every row until its longest answer ends, the refilling
    batch one slot per token an answer generated (its end of turn included), no more."""
    model, _ = _ending_model(tokenizer, 0, _prompts(30))
    requests = [GenerateRequest(p, 40, (), f"p{i}") for i, p in enumerate(_prompts(30))]
    counts = {}
    for refill in (False, True):
        engine = HFEngine(model, tokenizer, batch_size=8, refill=refill)
        counter = Slots(model)
        with engine.running():
            answers = engine.generate(requests, chat=False)
        counter.handle.remove()
        counts[refill] = counter.slots
    generated = sum(a.n_tokens + (a.n_tokens < 40) for a in answers)  # an answer that ended early decoded its end too
    assert counts[True] == generated < counts[False]
    assert sum(a.n_tokens for a in answers) / counts[True] > 0.9 > sum(a.n_tokens for a in answers) / counts[False]


def test_refilling_falls_back_to_static_batches_when_the_cache_cannot_be_merged(tokenizer, caplog):
    """A model whose forward takes no KV cache by name gets static batches, said in one warning."""
    import logging

    model = build_model(tokenizer)

    class NoCacheName(torch.nn.Module):  # a wrapper whose forward names no cache and takes no **kwargs
        def __init__(self, inner):
            super().__init__()
            self.inner, self.config, self.generation_config = inner, inner.config, inner.generation_config

        def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=None, logits_to_keep=0):
            return self.inner(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                              use_cache=use_cache, logits_to_keep=logits_to_keep)

        def generate(self, **kwargs):
            return self.inner.generate(**kwargs)

    requests = [GenerateRequest(p, 4, (), f"p{i}") for i, p in enumerate(_prompts(3))]
    with caplog.at_level(logging.WARNING, logger="forgetwatch"):
        engine = HFEngine(NoCacheName(model), tokenizer, batch_size=2)
        with engine.running():
            got = engine.generate(requests, chat=False)
    assert "generating in static batches instead" in caplog.text
    static = HFEngine(model, tokenizer, batch_size=2, refill=False)
    with static.running():
        assert got == static.generate(requests, chat=False)


# -- transformers' continuous batching ----------------------------------------------------------------------------

@requires_continuous_batching
@pytest.mark.parametrize("chat", [False, True])
def test_continuous_batching_gives_the_answers_of_the_hf_engine(tokenizer, chat):
    """Mixed prompt lengths, per-request budgets, stop strings (matched after the fact) and ends of turn from the
    model's EOS list: transformers' continuous batching gives the HF engine's answers, token counts and endings."""
    from forgetwatch.scoring.engines import ContinuousBatchingEngine

    prompts = _prompts(30)
    if chat:
        prompts = [tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
                   for p in prompts]
    model, stops = _ending_model(tokenizer, 0, prompts, chat)
    impl, training = model.config._attn_implementation, model.training
    requests = [GenerateRequest(p, (3, 8, 20, 40)[i % 4], ((), stops[:1], stops)[i % 3], f"p{i}") for i, p in enumerate(prompts)]
    hf = HFEngine(model, tokenizer, batch_size=8)
    with hf.running():
        want = hf.generate(requests, chat=chat)
    for batch_size in (1, 16):
        engine = ContinuousBatchingEngine(model, tokenizer, batch_size=batch_size)
        assert engine.unavailable is None
        with engine.running():
            got = engine.generate(requests, chat=chat)
        assert got == want, batch_size
    assert any(a.stopped and a.n_tokens < r.max_new_tokens for a, r in zip(want, requests, strict=True) if r.stops)
    assert (model.config._attn_implementation, model.training) == (impl, training)  # left as found


@requires_continuous_batching
def test_continuous_batching_flags_nonfinite_logits(tokenizer):
    from forgetwatch.scoring.engines import ContinuousBatchingEngine

    model = build_model(tokenizer)
    with torch.no_grad():
        model.model.norm.weight.fill_(float("nan"))
    requests = [GenerateRequest(p, 5, ("\n",), f"p{i}") for i, p in enumerate(_prompts(4))]
    engine = ContinuousBatchingEngine(model, tokenizer, batch_size=3)
    with engine.running():
        got = engine.generate(requests, chat=False)
    assert all(a.nonfinite for a in got)


@requires_continuous_batching
def test_scoring_config_engine_scores_every_mode_alike(tokenizer, monkeypatch):
    """`ScoringConfig(engine="continuous")` through `score_probes`: generated multiple choice and short answers go
    through continuous batching and give the default engine's results; the engine is not part of the cache key."""

    sessions = continuous_sessions(monkeypatch)
    model = build_model(tokenizer)
    probes = mcq_probes(4) + short_probes(3)
    config = ScoringConfig(mcq_mode="generate", short_mode="generate", max_new_tokens=6)
    continuous = ScoringConfig(mcq_mode="generate", short_mode="generate", max_new_tokens=6, engine="continuous")
    assert_same_results(
        score_probes(model, tokenizer, probes, continuous), score_probes(model, tokenizer, probes, config), atol=0
    )
    assert sessions == [4, 3]  # the multiple-choice mode's requests, then the short answers'
    assert continuous.key() == config.key()
    with pytest.raises(ValueError, match="`engine` must be one of hf, continuous, vllm, got 'tgi'"):
        ScoringConfig(engine="tgi")


def test_continuous_batching_where_it_cannot_run_says_why(tokenizer, caplog):
    """Several processes scoring together (sync_ranks): refused with `fallback=False`, else one warning and the HF
    engine's answers. A model without continuous batching (a wrapper) likewise."""
    import logging

    from forgetwatch.scoring.engines import ContinuousBatchingEngine

    model = build_model(tokenizer)
    with pytest.raises(ValueError, match=r"engine='continuous' cannot run here: .*sync_ranks.*Use engine='hf'"):
        ContinuousBatchingEngine(model, tokenizer, sync_ranks=True, fallback=False)

    class Wrapped(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner, self.config, self.generation_config = inner, inner.config, inner.generation_config

        def forward(self, **kwargs):
            return self.inner(**kwargs)

        def generate(self, **kwargs):
            return self.inner.generate(**kwargs)

    requests = [GenerateRequest(p, 4, (), f"p{i}") for i, p in enumerate(_prompts(3))]
    hf = HFEngine(model, tokenizer)
    with hf.running():
        want = hf.generate(requests, chat=False)
    with caplog.at_level(logging.WARNING, logger="forgetwatch"):
        engine = ContinuousBatchingEngine(Wrapped(model), tokenizer)
        with engine.running():
            got = engine.generate(requests, chat=False)
    assert "engine='continuous' cannot run here" in caplog.text and "has no continuous batching" in caplog.text
    assert "generating with the HF engine's refilling batch instead" in caplog.text
    assert got == want
    from forgetwatch.scoring.engines.continuous import _config_class

    if _config_class() is None:  # transformers 4 (make test-oldest): the real model cannot either, and says why
        assert "has no `ContinuousBatchingConfig`" in ContinuousBatchingEngine(model, tokenizer).unavailable


@requires_continuous_batching
def test_continuous_batching_under_autocast(tokenizer, caplog):
    """Autocast belongs to a thread, and continuous batching decodes in its own: the caller's `torch.autocast` must
    still reach its forwards (bf16 weights), and where it would write another dtype than the paged cache holds
    (float32 weights under bf16 autocast, as in a bf16 Trainer) the HF engine generates instead, said once. Before,
    transformers failed every request there and the engine returned empty answers."""
    import logging

    from forgetwatch.scoring.engines import ContinuousBatchingEngine

    requests = [GenerateRequest(p, 4, (), f"p{i}") for i, p in enumerate(_prompts(3))]
    model = build_model(tokenizer).to(torch.bfloat16)
    seen: list[bool] = []
    handle = model.model.layers[0].mlp.register_forward_hook(lambda m, a, out: seen.append(torch.is_autocast_enabled("cpu")))
    engine = ContinuousBatchingEngine(model, tokenizer)
    with engine.running(), torch.autocast("cpu", dtype=torch.bfloat16):
        got = engine.generate(requests, chat=False)
    handle.remove()
    assert seen and all(seen) and "forward" not in model.__dict__
    hf = HFEngine(model, tokenizer)
    with hf.running(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert got == hf.generate(requests, chat=False)

    model = build_model(tokenizer)
    with caplog.at_level(logging.WARNING, logger="forgetwatch"):
        engine = ContinuousBatchingEngine(model, tokenizer)
        with engine.running(), torch.autocast("cpu", dtype=torch.bfloat16):
            got = engine.generate(requests, chat=False)
    assert "cannot run here (autocast to bfloat16 over float32 weights" in caplog.text
    hf = HFEngine(model, tokenizer)
    with hf.running(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert got == hf.generate(requests, chat=False)


@requires_continuous_batching
def test_a_request_continuous_batching_fails_raises_instead_of_an_empty_answer(tokenizer):
    """transformers ends a request that failed in its generation thread as finished, with no tokens: that must not
    come back as an empty answer (a wrong figure), but as the error."""
    from forgetwatch.scoring.engines import ContinuousBatchingEngine

    model = build_model(tokenizer)

    def broken(module, args, kwargs):
        raise RuntimeError("a forward that fails")

    handle = model.register_forward_pre_hook(broken, with_kwargs=True)
    engine = ContinuousBatchingEngine(model, tokenizer)
    with pytest.raises(RuntimeError, match="transformers' continuous batching failed: .*a forward that fails"), engine.running():
        engine.generate([GenerateRequest(p, 4, (), f"p{i}") for i, p in enumerate(_prompts(2))], chat=False)
    handle.remove()


@requires_continuous_batching
def test_a_models_own_continuous_batching_manager_is_not_taken_over(tokenizer, caplog):
    """transformers hands back a manager the model keeps (`persistent_manager=True`), configured for other requests
    (no log-probabilities: NaN would go unseen) and destroyed on exit: the HF engine generates instead, said once."""
    import logging

    from forgetwatch.scoring.engines import ContinuousBatchingEngine

    model = build_model(tokenizer)
    requests = [GenerateRequest(p, 4, (), f"p{i}") for i, p in enumerate(_prompts(2))]
    engine = ContinuousBatchingEngine(model, tokenizer)
    model._cached_continuous_batching_manager = kept = object.__new__(type("Manager", (), {}))
    with caplog.at_level(logging.WARNING, logger="forgetwatch"), engine.running():
        got = engine.generate(requests, chat=False)
    assert "holds a continuous-batching manager of its own" in caplog.text
    assert model._cached_continuous_batching_manager is kept
    del model._cached_continuous_batching_manager
    hf = HFEngine(model, tokenizer)
    with hf.running():
        assert got == hf.generate(requests, chat=False)


def test_the_registry_says_what_each_engine_can_do_and_the_options_agree():
    """Engines by capability (`ENGINES`): the options' choices are the registry's names, and the engines the options
    keep out of training (`DIRECTORY_ENGINES`) are those that cannot score a live model; nothing outside
    forgetwatch/scoring/engines/ compares an engine's name (the options declare the choices)."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    from forgetwatch import options
    from forgetwatch.scoring.engines import ENGINES, engine_spec, make_engine, open_checkpoint

    assert options.ENGINES == tuple(ENGINES)
    assert set(options.DIRECTORY_ENGINES) == {name for name, spec in ENGINES.items() if not spec.live_model}
    assert all(spec.checkpoint for spec in ENGINES.values() if not spec.live_model)  # a directory engine opens them
    with pytest.raises(ValueError, match="unknown engine 'tgi': use one of 'hf', 'continuous', 'vllm'"):
        engine_spec("tgi")
    with pytest.raises(ValueError, match="scores a model in memory"):
        open_checkpoint("hf", "out/checkpoint-1", "float32")
    from conftest import build_tokenizer

    tokenizer = build_tokenizer()
    model = build_model(tokenizer)
    assert isinstance(make_engine("hf", model, tokenizer, batch_size=4), HFEngine)
    # the registry is plain: reading what an engine can do loads no torch
    code = "import sys, forgetwatch.scoring.engines as e; e.engine_spec('vllm'); print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "False\n"
    package = Path(options.__file__).parent
    named = [f"{p.relative_to(package)}:{i}" for p in package.rglob("*.py") if "engines" not in p.parts
             for i, line in enumerate(p.read_text().splitlines(), 1) if re.search(r"""['"](vllm|continuous)['"]""", line)]
    assert named == ["options.py:48", "options.py:51"], named
