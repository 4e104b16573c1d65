"""The engine seam: `score_probes` runs every scoring mode through an engine's requests, and `HFEngine` honours
per-request generation budgets. In-memory, a tiny random model."""

import pytest
from conftest import build_model
from test_scoring import assert_same_results, mcq_probes

from forgetwatch.engines import HFEngine
from forgetwatch.probes import Probe
from forgetwatch.requests import GenerateRequest
from forgetwatch.scoring import ScoringConfig, score_probes

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

