"""The scripted engine (forgetwatch/scoring/engines/scripted.py): outcomes fixed per probe and step, no model; and the
callback driven through it with plain TrainerState / TrainerControl objects, its record checked against outcomes known
exactly (a real Trainer run's are whatever training made them)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from fixtures.hooks import drive

from forgetwatch import ForgetWatchCallback
from forgetwatch.probes.probe_set import Probe, ProbeSet
from forgetwatch.record.store import RunRecord
from forgetwatch.scoring.engines import ScriptedModel, make_engine, scripted_tokenizer
from forgetwatch.scoring.score import ScoringConfig, score_probes


@pytest.fixture(scope="module")
def tokenizer():
    return scripted_tokenizer()


def _mcq(n: int, k: int = 3) -> list[Probe]:
    return [Probe(f"m{i}", "mcq", f"Which is {i}?", tuple(f"option {j}" for j in range(k)), gold=i % k) for i in range(n)]


def _short(n: int) -> list[Probe]:
    return [Probe(f"s{i}", "short", f"What is {i} + {i}?", answers=(str(2 * i),), numeric=True) for i in range(n)]


@pytest.mark.parametrize("mode", ["loglik", "letter", "generate"])
def test_multiple_choice_outcomes_and_margins_are_the_scripts(tokenizer, mode):
    probes = ProbeSet(_mcq(6))
    margins = {"m0": 0.5, "m1": -0.25, "m2": 2.0, "m3": -3.0}
    model = ScriptedModel(lambda p, step: margins.get(p.id, p.id == "m4"), probes)
    got = score_probes(model, tokenizer, probes, ScoringConfig(mcq_mode=mode))
    assert got.outcome.tolist() == [1, 0, 1, 0, 1, 0]
    if mode != "generate":  # per-option scores: the margin is the script's
        np.testing.assert_allclose(got.margin[:4], [0.5, -0.25, 2.0, -3.0], rtol=1e-6)
        np.testing.assert_allclose(got.margin[4:], [1.0, -1.0])


@pytest.mark.parametrize("short_mode", ["generate", "greedy_match"])
def test_short_answers_are_the_scripts(tokenizer, short_mode):
    probes = ProbeSet(_short(4))
    model = ScriptedModel(lambda p, step: p.id in ("s0", "s3") if step == 0 else p.id == "s1", probes)
    config = ScoringConfig(short_mode=short_mode)
    assert score_probes(model, tokenizer, probes, config).outcome.tolist() == [1, 0, 0, 1]
    model.step = 5
    assert score_probes(model, tokenizer, probes, config).outcome.tolist() == [0, 1, 0, 0]


def test_a_script_may_write_the_answer_and_a_probe_it_does_not_know_is_named(tokenizer):
    probes = ProbeSet(_short(2))
    model = ScriptedModel(lambda p, step: "The sum is 2." if p.id == "s1" else "It is 7.", probes)
    assert score_probes(model, tokenizer, probes, ScoringConfig(short_mode="generate")).outcome.tolist() == [0, 1]
    with pytest.raises(KeyError, match="'m0', which is not among its probes"):
        score_probes(ScriptedModel(lambda p, step: True, probes), tokenizer, ProbeSet(_mcq(1)))


def test_the_model_brings_its_engine_whatever_the_configured_name(tokenizer):
    model = ScriptedModel(lambda p, step: True, _mcq(1))
    for name in ("hf", "continuous"):
        assert type(make_engine(name, model, tokenizer)).__name__ == "ScriptedEngine"


# -- the callback, with no Trainer ------------------------------------------------------------------------------

# Ten 2-option probes: the base knows m0..m7. Step 2 forgets m0 and m1; step 4 forgets m2 too and learns m8; step 6
# gets m0 back. F = #(1→0) / N, BT = #(0→1) / N, F_adj = F − (1 − acc_pre)(1 − acc_post)/(k − 1) (docs: metrics).
WRONG_AT = {0: {"m8", "m9"}, 2: {"m0", "m1", "m8", "m9"}, 4: {"m0", "m1", "m2", "m9"}, 6: {"m1", "m2", "m9"}}
EXPECTED = {0: (0.0, 0.0, 0.0), 2: (0.2, 0.0, 0.2 - 0.2 * 0.4), 4: (0.3, 0.1, 0.3 - 0.2 * 0.4), 6: (0.2, 0.1, 0.2 - 0.2 * 0.3)}


def test_the_callback_records_the_scripted_flips_exactly(tokenizer, tmp_path):
    probes = ProbeSet(_mcq(10, k=2))
    model = ScriptedModel(lambda p, step: p.id not in WRONG_AT[step - step % 2], probes)
    drive(ForgetWatchCallback(probes, eval_steps=2), model, tokenizer, tmp_path, max_steps=6)
    record = RunRecord(tmp_path / "forgetwatch")
    assert record.eval_steps() == [0, 2, 4, 6]
    for step in (0, 2, 4, 6):
        wrong = {probes[i].id for i in np.flatnonzero(record.read_eval(step)["outcome"] == 0)}
        assert wrong == WRONG_AT[step], step
    rows = {r["step"]: r["metrics"]["overall"] for r in record.read_metrics()}
    for step, (f, bt, f_adj) in EXPECTED.items():
        got = rows[step]["forgetting"], rows[step]["backward_transfer"], rows[step]["forgetting_adjusted"]
        assert got == pytest.approx((f, bt, f_adj)), step
    flips = [json.loads(line) for line in (tmp_path / "forgetwatch" / "flips.jsonl").read_text().splitlines()]
    assert flips, "the probes that flipped are listed"
