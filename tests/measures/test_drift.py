"""Drift since base: margin change with its interval, KL over the options, gold log-probability change, at-risk probes."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import build_model
from fixtures.scoring import mcq_probes, plain_context, reference_loglik

from forgetwatch.measures.drift import RiskRule, at_risk_mask, compute_drift, option_kl
from forgetwatch.scoring.results import ProbeResults
from forgetwatch.scoring.score import ScoringConfig, score_probes

pytestmark = pytest.mark.usefixtures("one_thread")


def results(margins, outcomes=None, scores=None, gold=None) -> ProbeResults:
    n = len(margins)
    r = ProbeResults.empty([f"p{i}" for i in range(n)])
    r.margin = np.asarray(margins, np.float32)
    r.outcome = np.asarray(outcomes if outcomes is not None else [1] * n, np.int8)
    if scores is not None:
        r.option_scores = [np.asarray(s, np.float32) for s in scores]
    if gold is not None:
        r.gold_logprob = np.asarray(gold, np.float32)
    return r


def test_margin_change_mean_and_interval_known_answer():
    base = results([2.0, 2.0, 2.0, 2.0])
    now = results([1.0, 0.0, 2.0, 3.0])  # changes -1, -2, 0, +1: mean -0.5, sd 1.2910, n 4
    d = compute_drift(base, now)["overall"]
    assert d.n_margin == 4 and d.margin_change == pytest.approx(-0.5)
    half = 1.959963984540054 * math.sqrt(5 / 3) / 2
    assert d.margin_change_ci == pytest.approx((-0.5 - half, -0.5 + half))
    assert d.to_dict()["margin_drop"] == pytest.approx(0.5)


def test_groups_skip_probes_without_margins_and_split_by_category():
    base = results([1.0, np.nan, 3.0, 5.0], gold=[np.nan, -2.0, np.nan, np.nan])
    now = results([0.0, np.nan, 2.0, 5.0], gold=[np.nan, -3.5, np.nan, np.nan])  # p1 a short answer
    d = compute_drift(base, now, ["a", "s", "a", "b"])
    assert list(d) == ["overall", "a", "s", "b"]
    assert d["overall"].n_margin == 3 and d["overall"].margin_change == pytest.approx(-2 / 3)
    assert d["a"].margin_change == pytest.approx(-1.0) and d["a"].margin_change_ci == pytest.approx((-1.0, -1.0))
    assert d["s"].n_margin == 0 and math.isnan(d["s"].margin_change) and "margin_change" not in d["s"].scalars()
    assert d["s"].gold_logprob_change == pytest.approx(-1.5) and d["overall"].n_gold == 1
    assert d["b"].margin_change == 0.0 and d["b"].n_margin == 1


def test_option_kl_known_answer_and_edge_cases():
    p, q = np.array([0.5, 0.25, 0.25]), np.array([0.25, 0.5, 0.25])
    expected = float(np.sum(p * np.log(p / q)))  # = 0.25 ln 2
    got = option_kl(
        [np.log(p) + 3.0, np.zeros(2), np.zeros(0), np.zeros(3)], [np.log(q) - 1.0, np.zeros(2), np.zeros(0), np.zeros(2)]
    )
    assert got[0] == pytest.approx(expected) and got[0] == pytest.approx(0.25 * math.log(2))  # shift-invariant scores
    assert got[1] == 0.0
    assert math.isnan(got[2]) and math.isnan(got[3])  # no options; option counts that differ


def test_at_risk_rule():
    base = results([3.0, 3.0, 0.4, 3.0, 3.0, np.nan], outcomes=[1, 1, 1, 1, 0, 1])
    now = results([2.5, 1.9, 0.45, -0.1, 0.1, np.nan], outcomes=[1, 1, 1, 0, 1, 1])
    mask = at_risk_mask(base, now, RiskRule(margin_below=0.5, drop_by=1.0))
    # p0 fine; p1 fell 1.1; p2 small margin; p3 already forgotten; p4 was wrong at base; p5 has no margin
    assert mask.tolist() == [False, True, True, False, False, False]
    d = compute_drift(base, now, rule=RiskRule(0.5, 1.0))["overall"]
    assert (d.at_risk, d.n_at_risk_eligible) == (2, 3)
    assert at_risk_mask(base, now, RiskRule(margin_below=0.0, drop_by=2.0)).tolist() == [False] * 6
    assert at_risk_mask(base, now, RiskRule(margin_below=0.5)).tolist() == [False, False, True, False, False, False]
    assert RiskRule() == RiskRule(margin_below=2.0, drop_by=None)


@pytest.mark.parametrize("kwargs", [{"margin_below": -1}, {"drop_by": float("nan")}, {"drop_by": "1"}])
def test_risk_rule_refuses_bad_thresholds(kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        RiskRule(**kwargs)


def test_kl_equals_a_direct_computation_on_a_tiny_model(tokenizer):
    """Option scores from packed scoring, softmaxed, against one full forward per option (lm-eval's way)."""
    torch.manual_seed(0)
    base_model = build_model(tokenizer, seed=0).eval()
    now_model = build_model(tokenizer, seed=0).eval()
    with torch.no_grad():
        for p in now_model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    probes = mcq_probes(12)
    config = ScoringConfig(pack_choices=True, batch_size=8)
    base, now = score_probes(base_model, tokenizer, probes, config), score_probes(now_model, tokenizer, probes, config)
    got = option_kl(base.option_scores, now.option_scores)

    def softmax(x):
        e = np.exp(x - x.max())
        return e / e.sum()

    for i, probe in enumerate(probes):
        p = softmax(reference_loglik(base_model, tokenizer, probe, plain_context(probe)))
        q = softmax(reference_loglik(now_model, tokenizer, probe, plain_context(probe)))
        assert got[i] == pytest.approx(float(np.sum(p * np.log(p / q))), abs=1e-5), probe.id
    assert np.all(got >= 0) and got.max() > 1e-2  # the perturbation moved some probes clearly
    d = compute_drift(base, now)["overall"]
    assert d.kl == pytest.approx(float(got.mean())) and d.n_kl == 12
