"""Forgetting budgets: parsing and validation, the lower-bound rule, and real Trainer runs that trip them."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
from conftest import clear_wandb_env
from fixtures.trainers import (
    CrashBeforeStep,
    assert_same_weights,
    make_probes,
    metric_rows,
    sft_trainer,
    the_watcher,
    watcher,
)
from fixtures.wandb_offline import find_run_file, finish_offline_run, read_records, read_summary, read_tables

from forgetwatch import ForgetWatchArguments, ForgetWatchCallback, load_record
from forgetwatch.measures.budgets import Breach, Budget, BudgetState, parse_budget
from forgetwatch.measures.metrics import compute_metrics

pytestmark = pytest.mark.usefixtures("one_thread")

# -- the budget itself, no training ----------------------------------------------------------------------------


def test_parse_budget_forms():
    want = {"forgetting_adjusted": 0.05, "add/forgetting": 0.1}
    assert parse_budget(want) == want
    assert parse_budget("forgetting_adjusted=0.05, add/forgetting=0.1") == want
    assert parse_budget('{"forgetting_adjusted": 0.05, "add/forgetting": 0.1}') == want
    assert parse_budget(None) is None
    with pytest.raises(ValueError, match="'forgetting_adjusted' is not 'metric=limit'"):
        parse_budget("forgetting_adjusted")
    with pytest.raises(ValueError, match="not valid JSON"):
        parse_budget("{forgetting: 1}")


@pytest.mark.parametrize("limits,message", [
    ({"forgeting": 0.1}, r"'forgeting' is not a budget metric; use one of forgetting, forgetting_adjusted, margin_drop, kl"),
    ({"astronomy/forgetting": 0.1}, r"no category 'astronomy' in the probe set; its categories are add, compare, count, short"),
    ({"forgetting": -0.1}, r"between 0 and 1, got -0.1"),
    ({"forgetting_adjusted": 1.5}, r"between 0 and 1, got 1.5"),
    ({"kl": -1}, r"0 or more \(nats\)"),
    ({"forgetting": "low"}, r"must be a number, got 'low'"),
])
def test_bad_budgets_are_refused_at_construction(limits, message):
    with pytest.raises(ValueError, match=message):
        watcher(budget=limits)


def test_bad_on_budget_and_bound_are_refused():
    with pytest.raises(ValueError, match="forgetwatch_on_budget must be one of alert, save, stop, got 'halt'"):
        watcher(budget={"forgetting": 0.1}, on_budget="halt")
    with pytest.raises(ValueError, match="forgetwatch_budget_bound must be one of lower, point"):
        watcher(budget={"forgetting": 0.1}, budget_bound="upper")


def test_a_budget_compares_the_lower_end_of_the_interval_by_default():
    # 20 of 100 forgotten: F = 0.20, Wilson 95% [0.133, 0.289]; k = 4 at 0.8 -> 0.6: chance 0.2*0.4/3 = 0.0267
    m = compute_metrics([1] * 80 + [0] * 20, [1] * 60 + [0] * 40, [4] * 100)
    row = {
        "overall": m.to_dict(),
        "add": {**m.to_dict(), "kl": 0.3, "margin_change": -1.0, "margin_change_ci_low": -1.5, "margin_change_ci_high": -0.5},
    }
    low = m.forgetting_ci[0]
    assert Budget({"forgetting": 0.15}).check(row) == []  # 0.20 measured, but 0.133 is not above 0.15
    (b,) = Budget({"forgetting": 0.15}, bound="point").check(row)
    assert (b.value, b.measured, b.bound) == (pytest.approx(0.2), pytest.approx(0.2), "point")
    (b,) = Budget({"forgetting": 0.10}).check(row)
    assert b.value == pytest.approx(low) and b.measured == pytest.approx(0.2)
    (b,) = Budget({"forgetting_adjusted": 0.10}).check(row)
    assert b.value == pytest.approx(low - m.chance) and b.measured == pytest.approx(m.forgetting_adjusted)
    assert (
        b.describe() == f"forgetting_adjusted = {m.forgetting_adjusted:.4f} (lower 95% bound {low - m.chance:.4f}) > budget 0.1"
    )
    (b,) = Budget({"add/margin_drop": 0.4}).check(row)  # the drop is at least 0.5 nats: over 0.4
    assert (b.value, b.measured) == (pytest.approx(0.5), pytest.approx(1.0))
    assert Budget({"add/margin_drop": 0.6}).check(row) == []
    assert [x.key for x in Budget({"add/kl": 0.2, "overall/kl": 0.0}).check(row)] == ["add/kl"]  # no kl overall here


def test_budget_state_trips_once_and_remembers_the_last_evaluation_within():
    state = BudgetState()
    b = Breach("forgetting", 0.2, 0.3, 0.1, "lower")
    assert state.update(0, []) == [] and state.last_within == 0
    assert state.update(2, []) == [] and state.last_within == 2
    assert state.update(4, [b]) == [b] and state.over == {"forgetting"}
    assert state.update(6, [b]) == []  # still over: no second alert
    assert state.update(8, []) == [] and state.last_within == 8
    assert state.update(10, [b]) == [b]  # over again
    assert state.last_within == 8


def test_forgetwatch_arguments_carry_the_budget():
    args = ForgetWatchArguments(forgetwatch_probes="x", forgetwatch_budget="forgetting=0.2", forgetwatch_on_budget="save")
    kwargs = args.to_kwargs()
    assert (kwargs["budget"], kwargs["on_budget"], kwargs["budget_bound"]) == ("forgetting=0.2", "save", "lower")
    cb = ForgetWatchCallback(make_probes(), budget=kwargs["budget"], on_budget="save")
    assert cb.budget.to_dict() == {"limits": {"forgetting": 0.2}, "on_budget": "save", "bound": "lower"}


# -- real training runs ----------------------------------------------------------------------------------------

TRIP = {"forgetting": 0.0}  # exceeded as soon as F's lower 95% bound is above 0: the first evaluation with a 1->0 flip


def first_trip(record) -> int:
    return min(s for s, row in metric_rows(record).items() if row["metrics"]["overall"]["forgotten"] > 0)


@pytest.fixture(scope="module")
def stop_run(tokenizer, tmp_path_factory):
    """on_budget="stop", logging to an offline W&B run."""
    root = tmp_path_factory.mktemp("budget_stop")
    with pytest.MonkeyPatch.context() as mp:
        clear_wandb_env(mp, root / "wandb")
        finish_offline_run()
        trainer = sft_trainer(tokenizer, root / "out", [watcher(budget=TRIP, on_budget="stop")], report_to="wandb")
        try:
            trainer.train()
        finally:
            finish_offline_run()
    return SimpleNamespace(trainer=trainer, out=root / "out", record=load_record(root / "out"),
                           wandb_file=find_run_file(root / "wandb"))


def test_stop_ends_training_at_the_evaluation_that_trips(stop_run):
    record = stop_run.record
    trip = first_trip(record)
    assert 0 < trip < 6
    assert stop_run.trainer.state.global_step == trip  # not max_steps (6)
    assert sorted(metric_rows(record)) == [*range(0, trip, 2), trip]
    (event,) = record.read_events()
    assert event["step"] == trip and event["key"] == "forgetting" and event["action"] == "stop" and event["value"] > 0
    assert event["last_within_budget"] == {"step": trip - 2, "checkpoint": None}
    budget = record.read_budget()
    assert budget["over"] == ["forgetting"] and budget["last_within_budget"]["step"] == trip - 2
    assert budget["limits"] == TRIP and budget["on_budget"] == "stop" and budget["bound"] == "lower"


def test_stop_alert_and_summary_are_in_the_wandb_run(stop_run):
    alerts = [r.alert for r in read_records(stop_run.wandb_file) if r.WhichOneof("record_type") == "alert"]
    assert [a.title for a in alerts] == ["forgetwatch: forgetting over budget"]
    trip = first_trip(stop_run.record)
    assert alerts[0].text.startswith(f"Step {trip}: forgetting = ") and "Action: stop." in alerts[0].text
    summary = read_summary(stop_run.wandb_file)
    assert summary["forgetwatch/budget/exceeded"] == 1
    assert summary["forgetwatch/budget/last_within_step"] == trip - 2
    assert summary["forgetwatch/budget/last_within_checkpoint"] == ""
    # the at-risk probes as a table beside the flips, one per evaluation that had any (not under the count's key)
    tables = read_tables(stop_run.wandb_file)
    risky = stop_run.record.read_at_risk()
    per_step = [sum(r["step"] == s for r in risky) for s in sorted({r["step"] for r in risky})]
    assert [len(t) for t in tables["forgetwatch_details/at_risk_probes"]] == per_step
    assert {r["id"] for t in tables["forgetwatch_details/at_risk_probes"] for r in t} == {r["id"] for r in risky}


def test_save_writes_a_checkpoint_at_the_trip_and_alerts_trackio(tokenizer, tmp_path, monkeypatch):
    trackio = pytest.importorskip("trackio")
    monkeypatch.setenv("TRACKIO_DIR", str(tmp_path / "trackio"))
    monkeypatch.setattr(trackio.sqlite_storage, "TRACKIO_DIR", tmp_path / "trackio", raising=False)
    trainer = sft_trainer(tokenizer, tmp_path / "out", [watcher(budget=TRIP, on_budget="save")], report_to=["trackio"],
                          project="fw-budget", run_name="save")
    trainer.train()
    record = load_record(tmp_path / "out")
    trip = first_trip(record)
    assert trainer.state.global_step == 6  # "save" goes on training
    assert sorted(p.name for p in (tmp_path / "out").glob("checkpoint-*")) == [f"checkpoint-{trip}"]  # save_strategy "no"
    assert [e["step"] for e in record.read_events()] == [trip]
    alerts = trackio.SQLiteStorage.get_alerts("fw-budget", run_name="save")
    assert [a["title"] for a in alerts] == ["forgetwatch: forgetting over budget"]
    assert f"Step {trip}: forgetting" in alerts[0]["text"]


def test_last_within_budget_names_its_checkpoint(tokenizer, tmp_path):
    """With checkpoints every 2 steps, the last evaluation within budget points to the checkpoint saved there.

    In this run F's lower 95% bound is 0.032 at step 2 and 0.050 at step 4, so a budget of 0.04 trips at step 4."""
    trainer = sft_trainer(tokenizer, tmp_path, [watcher(budget={"forgetting": 0.04})], save_strategy="steps", save_steps=2)
    trainer.train()
    record = load_record(tmp_path)
    lows = {s: row["metrics"]["overall"]["forgetting_ci_low"] for s, row in metric_rows(record).items()}
    assert lows[2] < 0.04 < lows[4]
    (event,) = record.read_events()
    assert event["step"] == 4
    assert event["last_within_budget"] == {"step": 2, "checkpoint": str(tmp_path / "checkpoint-2")}
    assert record.read_budget()["last_within_budget"] == {"step": 2, "checkpoint": str(tmp_path / "checkpoint-2")}


def test_resume_keeps_the_budget_state(tokenizer, tmp_path):
    """Crash after the trip, resume from a checkpoint: no second alert for a limit still over, same record as one run."""
    ref = sft_trainer(tokenizer, tmp_path / "ref", [watcher(budget=TRIP)], save_strategy="steps", save_steps=2)
    ref.train()
    reference = load_record(tmp_path / "ref")
    trip = first_trip(reference)
    assert trip <= 4, "the crash below must come after the trip"

    out = tmp_path / "run"
    crashing = sft_trainer(tokenizer, out, [watcher(budget=TRIP), CrashBeforeStep(6)], save_strategy="steps", save_steps=2,
                           restore_callback_states_from_checkpoint=True)
    with pytest.raises(RuntimeError):
        crashing.train()
    resumed = sft_trainer(tokenizer, out, [watcher(budget=TRIP)], save_strategy="steps", save_steps=2,
                          restore_callback_states_from_checkpoint=True)
    resumed.train(resume_from_checkpoint=str(out / "checkpoint-4"))
    record = load_record(out)
    assert the_watcher(resumed).budget is not None
    strip = lambda events: [{k: v for k, v in e.items() if k != "last_within_budget"} for e in events]  # noqa: E731
    assert strip(record.read_events()) == strip(reference.read_events())
    assert record.read_budget()["over"] == reference.read_budget()["over"]
    assert record.read_budget()["last_within_budget"]["step"] == reference.read_budget()["last_within_budget"]["step"]


def test_a_budget_that_never_trips_changes_nothing(tokenizer, tmp_path):
    never = sft_trainer(tokenizer, tmp_path / "a", [watcher(budget={"forgetting": 1.0, "kl": 1e6}, on_budget="stop")])
    never.train()
    plain = sft_trainer(tokenizer, tmp_path / "b")
    plain.train()
    assert never.state.global_step == plain.state.global_step == 6
    assert_same_weights(never.model, plain.model)
    record = load_record(tmp_path / "a")
    assert record.read_events() == [] and record.read_budget()["over"] == []
    assert record.read_budget()["last_within_budget"]["step"] == 6


def test_at_risk_probes_are_recorded(stop_run):
    rows = stop_run.record.read_at_risk()
    metrics = metric_rows(stop_run.record)
    for step, row in metrics.items():
        mine = [r for r in rows if r["step"] == step]
        assert len(mine) == row["metrics"]["overall"]["at_risk"], step
        for r in mine:  # right at base and now, with a margin under 2 nats (the default rule)
            assert r["margin_now"] < 2.0
    assert json.dumps(rows)  # plain JSON
    assert not math.isnan(metrics[0]["metrics"]["overall"]["margin_change"])


def test_the_report_shows_drift_risk_noise_and_the_budget(stop_run):
    pytest.importorskip("matplotlib")
    from forgetwatch.report.render import make_report

    page = make_report(stop_run.out)
    html = page.read_text()
    assert (page.parent / "drift.png").stat().st_size > 0 and 'src="drift.png"' in html
    trip = first_trip(stop_run.record)
    risky = [r for r in stop_run.record.read_at_risk() if r["step"] == trip]
    assert f"At risk at step {trip}: {len(risky)} probes" in html
    assert "Precision noise floor: " in html and "smallest forgetting distinguishable" in html
    assert f"<li>step {trip}: forgetting = " in html and "action stop" in html
    assert f"Last evaluation within budget: step {trip - 2}." in html


def test_budget_options_are_checked_even_without_a_budget():
    """A typo in on_budget must not pass silently because the budget itself was left out (e.g. in a recipe)."""
    with pytest.raises(ValueError, match="forgetwatch_on_budget must be one of alert, save, stop, got 'halt'"):
        watcher(on_budget="halt")
    with pytest.raises(ValueError, match="forgetwatch_budget_bound must be one of lower, point"):
        watcher(budget_bound="upper")


@pytest.mark.parametrize("spec", ["forgetting=0.1,forgetting=0.2", '{"forgetting": 0.1, "forgetting": 0.5}'])
def test_a_metric_given_twice_in_a_budget_is_refused(spec):
    """The last limit would win silently (the stricter one given first dropped): refused, naming the metric."""
    with pytest.raises(ValueError, match="'forgetting' is given twice"):
        parse_budget(spec)
