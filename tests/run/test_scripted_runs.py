"""What the run stage decides, driven through the scripted engine (outcomes known exactly, no model, no Trainer) with
plain TrainerState / TrainerControl objects (`fixtures.hooks.drive`): when a budget saves or stops, what the record
says about it, and what a resume from an earlier step does to the evaluations after it. The real Trainer runs that
prove the same against real training are in test_callback.py and tests/measures/test_budgets.py."""

from __future__ import annotations

import json

import numpy as np
import pytest
from fixtures.hooks import drive

from forgetwatch import ForgetWatchCallback
from forgetwatch.probes.probe_set import Probe, ProbeSet
from forgetwatch.record.store import RunRecord
from forgetwatch.scoring.engines import ScriptedModel, scripted_tokenizer

# Ten 2-option probes; the base knows m0..m7. F (1→0 over all ten) is 0.2 at step 2 and 0.3 at step 4.
WRONG_AT = {0: {"m8", "m9"}, 2: {"m0", "m1", "m8", "m9"}, 4: {"m0", "m1", "m2", "m9"}, 6: {"m1", "m2", "m9"}}
PROBES = ProbeSet([Probe(f"m{i}", "mcq", f"Which is {i}?", ("yes", "no"), gold=i % 2) for i in range(10)])


def _model(wrong_at=WRONG_AT) -> ScriptedModel:
    return ScriptedModel(lambda p, step: p.id not in wrong_at[step - step % 2], PROBES)


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


@pytest.mark.parametrize("action", ["stop", "save"])
def test_a_budget_acts_at_the_first_evaluation_over_it_and_names_the_last_within(action, tmp_path):
    callback = ForgetWatchCallback(PROBES, eval_steps=2, budget={"forgetting": 0.25}, on_budget=action,
                                   budget_bound="point")
    flags = drive(callback, _model(), scripted_tokenizer(), tmp_path, max_steps=6)
    flag = "should_training_stop" if action == "stop" else "should_save"
    assert [step for step, f in flags.items() if f[flag]] == [4]  # F 0.2 at step 2, 0.3 at step 4
    assert max(flags) == (4 if action == "stop" else 6)
    events = _lines(tmp_path / "forgetwatch" / "events.jsonl")
    assert [(e["step"], e["event"], e["key"], e["action"]) for e in events] == [(4, "budget_exceeded", "forgetting", action)]
    assert events[0]["value"] == pytest.approx(0.3) and events[0]["last_within_budget"]["step"] == 2
    budget = json.loads((tmp_path / "forgetwatch" / "budget.json").read_text())
    if action == "stop":  # the run ends over budget
        assert budget["over"] == ["forgetting"] and budget["last_within_budget"]["step"] == 2
    else:  # it goes on, and step 6 (F 0.2) is within again
        assert budget["over"] == [] and budget["last_within_budget"]["step"] == 6


def test_a_budget_within_reach_changes_no_flag(tmp_path):
    callback = ForgetWatchCallback(PROBES, eval_steps=2, budget={"forgetting": 0.5}, on_budget="stop", budget_bound="point")
    flags = drive(callback, _model(), scripted_tokenizer(), tmp_path, max_steps=6)
    assert not any(f["should_training_stop"] or f["should_save"] for f in flags.values())
    assert _lines(tmp_path / "forgetwatch" / "events.jsonl") == []
    assert json.loads((tmp_path / "forgetwatch" / "budget.json").read_text())["last_within_budget"]["step"] == 6


def test_a_resume_from_an_earlier_step_sets_the_later_evaluations_aside_and_scores_them_again(tmp_path):
    tokenizer = scripted_tokenizer()
    drive(ForgetWatchCallback(PROBES, eval_steps=2), _model(), tokenizer, tmp_path, max_steps=6)
    record = RunRecord(tmp_path / "forgetwatch")
    before = {s: record.read_eval(s)["outcome"].tolist() for s in (4, 6)}
    # the resumed trajectory forgets nothing after step 2
    again = {**WRONG_AT, 4: WRONG_AT[2], 6: WRONG_AT[2]}
    drive(ForgetWatchCallback(PROBES, eval_steps=2), _model(again), tokenizer, tmp_path, max_steps=6, start=2)
    assert record.eval_steps() == [0, 2, 4, 6]
    rows = {r["step"]: r["metrics"]["overall"]["forgetting"] for r in record.read_metrics()}
    assert rows == pytest.approx({0: 0.0, 2: 0.2, 4: 0.2, 6: 0.2})
    aside = list((record.root / "superseded").iterdir())
    assert len(aside) == 1 and aside[0].name.startswith("after-step-2-")
    kept = {int(p.stem.split("-")[1]) for p in (aside[0] / "evals").iterdir()}
    assert kept == {4, 6}
    for step in (4, 6):  # the abandoned trajectory's files, as they were
        assert np.load(aside[0] / "evals" / f"step-{step:08d}.npz")["outcome"].tolist() == before[step]
    assert [r["step"] for r in _lines(aside[0] / "metrics.jsonl")] == [4, 6]


def test_the_whole_cost_is_recorded_and_said_at_the_end(tmp_path, capsys):
    """Step 0's probing seconds used to be 0.0 in metrics.jsonl although the base was scored then, and nothing said
    at the end what forgetwatch cost the run."""
    import time

    def slow(p, step):  # 2 ms a probe, so that every pass takes a time the record's milliseconds can hold
        time.sleep(0.002)
        return p.id not in WRONG_AT[step - step % 2]

    drive(ForgetWatchCallback(PROBES, eval_steps=2), ScriptedModel(slow, PROBES), scripted_tokenizer(), tmp_path,
          max_steps=6)
    rows = {r["step"]: r for r in _lines(tmp_path / "forgetwatch" / "metrics.jsonl")}
    assert rows[0]["seconds"] >= 0.02  # the base, scored at the start of this run (10 probes)
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("forgetwatch: probing cost this run"))
    total = sum(r["seconds"] for r in rows.values())
    assert f"{total:.1f} s" in line and "of train()" in line and "3 evaluations" in line and "the base" in line


def test_the_cost_line_names_the_noise_floor_pass_with_its_reason_and_how_to_skip_it():
    from forgetwatch.run.cost import cost_line, cost_summary

    line = cost_line({"base": 20.0, "noise_floor": 11.0}, evaluations=43.0, n_evaluations=3, train_seconds=370.0,
                     precision="float32+autocast-bfloat16")
    assert "74.0 s, 20% of train() (370.0 s)" in line and "noise floor 11.0 s (training runs under bfloat16 autocast" in line
    assert "`forgetwatch cache` skips both" in line
    cached = cost_line({}, evaluations=5.0, n_evaluations=1, train_seconds=50.0, precision="float32")
    assert "the base from its cache" in cached and "noise floor" not in cached and "1 evaluation 5.0 s" in cached
    summary = cost_summary({"base": 20.0, "noise_floor": 11.0}, evaluations=43.0, train_seconds=370.0, prefix="forgetwatch")
    assert summary["forgetwatch/cost/seconds"] == 74.0 and summary["forgetwatch/cost/share_of_train"] == 0.2
