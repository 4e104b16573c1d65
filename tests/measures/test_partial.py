"""Probing within a time budget (`max_share`, `forgetwatch.measures.partial`).

The design and its estimator on synthetic flips with a known truth (many draws: unbiased, intervals that cover at
their nominal level, also when the whole rotation runs with at-risk probes chosen from earlier draws); then real
Trainer runs (a tiny model): full passes exactly the run without the option, partial steps that score the at-risk
probes and a sample and record what they scored, a resume in the middle of a rotation, and ranks that agree.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from forgetwatch.measures.partial import (
    CERTAIN_AT_RISK,
    CERTAIN_DUE,
    CERTAIN_FLIPPED,
    SAMPLED,
    Design,
    ShareBudget,
    estimate_mean,
    plan_partial,
    rotation_k,
)

Z90 = 1.6448536269514722


# -- the design -----------------------------------------------------------------------------------------------------


def test_the_certain_probes_are_scored_and_the_rest_sampled_per_kind():
    kinds = np.array(["knowledge"] * 80 + ["behavior"] * 20)
    must = np.zeros(100, bool)
    must[[0, 1, 2, 90]] = True  # flipped at the last evaluation
    age = np.zeros(100, int)
    age[[10, 11]] = 9  # due with k = 10
    risk = np.full(100, np.inf)
    risk[20:40] = np.linspace(1.9, 0.0, 20)  # 20 knowledge probes at risk; room for 13 of them, the lowest margins
    d = plan_partial(kinds, must, age, k=10, fraction=0.25, seed=3, step=40, risk=risk)
    assert d.scored[[0, 1, 2, 90, 10, 11]].all()
    assert (d.stratum[[0, 1, 2, 90]] == CERTAIN_FLIPPED).all() and (d.stratum[[10, 11]] == CERTAIN_DUE).all()
    assert (d.stratum[25:40] == CERTAIN_AT_RISK).all()
    # each kind gets its own share: 25% of 80 = 20 knowledge probes: 3 flipped, 2 due, then the 15 most at risk; and
    # the fewest a sample takes (2) of the rest, so that the rest is estimated at all
    assert (d.stratum[:80] != SAMPLED).sum() == 20 and d.scored[:80].sum() == 22
    assert d.scored[25:40].all() and not d.scored[20:25].any()  # the lowest margins first; the rest join the sample
    # behaviour: 5 of 20, 1 flipped and a sample of 4 from the 19 others
    assert d.scored[80:].sum() == 5 and np.allclose(d.inclusion[80:][d.stratum[80:] == SAMPLED], 4 / 19)
    assert np.allclose(d.inclusion[d.stratum != SAMPLED], 1.0)
    # the knowledge sample is its minimum, 2 of the 60 left
    rest = (kinds == "knowledge") & (d.stratum == SAMPLED)
    assert rest.sum() == 60 and np.allclose(d.inclusion[rest], 2 / 60)
    # the draw is the seed's and the step's: the same on every rank and in a rerun, another at another step
    again = plan_partial(kinds, must, age, k=10, fraction=0.25, seed=3, step=40, risk=risk)
    assert (again.scored == d.scored).all()
    assert (plan_partial(kinds, must, age, k=10, fraction=0.25, seed=3, step=50, risk=risk).scored != d.scored).any()


def test_a_sampled_stratum_gets_at_least_two_probes_even_when_the_budget_is_spent():
    kinds = np.array(["knowledge"] * 50)
    d = plan_partial(kinds, np.zeros(50, bool), np.zeros(50, int), k=4, fraction=0.0, seed=0, step=1)
    assert d.scored.sum() == 2 and estimate_mean(np.ones(50), np.ones(50, bool), d).value == 1.0


def test_every_probe_is_scored_at_least_every_k_evaluations():
    n, k = 200, rotation_k(0.1)
    kinds = np.array(["knowledge"] * n)
    age = np.zeros(n, int)
    gaps = np.zeros(n, int)
    for step in range(1, 200):
        d = plan_partial(kinds, np.zeros(n, bool), age, k=k, fraction=0.1, seed=0, step=step)
        age = np.where(d.scored, 0, age + 1)
        gaps = np.maximum(gaps, age)
    assert k == 20 and gaps.max() <= k - 1  # unscored for at most k - 1 evaluations in a row: scored every k


# -- the estimator ----------------------------------------------------------------------------------------------------


def _population(rng, n=400, p_forgot=0.12):
    pre = (rng.random(n) < 0.7).astype(np.int8)
    post = pre.copy()
    post[(pre == 1) & (rng.random(n) < p_forgot / 0.7)] = 0
    post[(pre == 0) & (rng.random(n) < 0.1)] = 1
    return pre, post


def test_the_estimator_is_unbiased_and_its_interval_covers_at_the_nominal_level():
    rng = np.random.default_rng(0)
    pre, post = _population(rng)
    y = (pre == 1) & (post == 0)
    members = np.arange(len(y)) % 3 != 0  # a category: two thirds of the probes
    kinds = np.where(np.arange(len(y)) < 300, "knowledge", "behavior")
    must = (rng.random(len(y)) < 0.1) | (y & (rng.random(len(y)) < 0.3))  # the certain stratum, skewed to the flips
    truth = y[members].mean()
    draws, covered, est = 4000, 0, []
    for s in range(draws):
        d = plan_partial(kinds, must, np.zeros(len(y), int), k=100, fraction=0.3, seed=s, step=7)
        e = estimate_mean(y, members, d)
        est.append(e.value)
        covered += abs(e.value - truth) <= Z90 * e.se
    est = np.array(est)
    assert abs(est.mean() - truth) < 3 * est.std() / math.sqrt(draws)  # unbiased: the mean of many draws is the truth
    assert 0.88 <= covered / draws <= 0.97  # nominal 90%; Agresti-Coull's variance errs on the wide side


def test_the_whole_rotation_is_unbiased_when_earlier_draws_pick_the_at_risk_probes():
    """The design's promise in the loop: certain probes are chosen from what earlier partial evaluations saw, and the
    estimate at each step is still unbiased (the sample is random given them). Synthetic trajectories: probes flip
    over 12 evaluations; the truth at each step is known."""
    n, steps, runs = 300, 12, 600
    rng = np.random.default_rng(1)
    pre = (rng.random(n) < 0.75).astype(np.int8)
    forget_at = np.where(pre == 1, rng.integers(1, 40, n), 10**6)  # each known probe is forgotten at some step
    margin = rng.exponential(3.0, n)  # a small margin: forgotten soon, and at risk
    forget_at = np.where(margin < 1.0, rng.integers(1, 8, n), forget_at)
    errors = np.zeros((runs, steps))
    cover = np.zeros((runs, steps))
    kinds = np.array(["knowledge"] * n)
    for r in range(runs):
        age = np.zeros(n, int)
        last = pre.copy()
        flipped = np.zeros(n, bool)
        for t in range(1, steps + 1):
            post = np.where(forget_at <= t, 0, pre).astype(np.int8)
            risk = np.where((last == 1) & (pre == 1) & (margin < 1.0), margin, np.inf)
            d = plan_partial(kinds, flipped, age, k=rotation_k(0.2), fraction=0.2, seed=r, step=t, risk=risk)
            seen = np.where(d.scored, post, last)
            y = (pre == 1) & (seen == 0)
            e = estimate_mean(y, np.ones(n, bool), d)
            truth = ((pre == 1) & (post == 0)).mean()
            errors[r, t - 1] = e.value - truth
            cover[r, t - 1] = abs(e.value - truth) <= Z90 * e.se
            flipped = seen != last
            last, age = seen, np.where(d.scored, 0, age + 1)
    bias, spread = errors.mean(0), errors.std(0) / math.sqrt(runs)
    assert (np.abs(bias) < 4 * spread + 1e-12).all(), (bias, spread)
    assert cover.mean() >= 0.88


def test_categories_are_strata_of_their_own_and_small_ones_pooled():
    """Each category big enough is sampled within itself, so its estimate is its own stratum's and stays a rate; small
    ones share their kind's pooled stratum (a domain estimate, clipped to [0, 1])."""
    n = 230
    kinds = np.array(["knowledge"] * 200 + ["behavior"] * 30)
    categories = ["big"] * 150 + ["mid"] * 45 + ["tiny"] * 5 + [f"b{i % 10}" for i in range(30)]
    d = plan_partial(kinds, np.zeros(n, bool), np.zeros(n, int), k=50, fraction=0.1, seed=0, step=3, categories=categories)
    cells = set(d.cells.tolist())
    assert {"knowledge/big", "knowledge/mid", "knowledge/*", "behavior/*"} == cells
    assert d.scored[:150].sum() == 15 and d.scored[150:195].sum() >= 4 and d.scored[195:200].sum() >= 0
    assert d.scored[200:].sum() == 3  # 10% of 30 behaviour probes: their ten small categories pooled
    y = np.zeros(n, bool)
    y[np.flatnonzero(d.scored[195:200]) + 195] = True  # every sampled "tiny" probe flipped
    tiny = np.zeros(n, bool)
    tiny[195:200] = True
    e = estimate_mean(y, tiny, d)
    assert 0.0 <= e.value <= 1.0
    big = np.zeros(n, bool)
    big[:150] = True
    assert estimate_mean(np.ones(n, bool), big, d).value == 1.0  # within its own stratum: exact for a constant


def test_a_full_design_is_exact():
    kinds = np.array(["knowledge"] * 30)
    d = plan_partial(kinds, np.zeros(30, bool), np.zeros(30, int), k=2, fraction=1.0, seed=0, step=1)
    y = np.arange(30) % 4 == 0
    e = estimate_mean(y, np.ones(30, bool), d)
    assert d.scored.all() and e.value == y.mean() and e.se == 0.0


def test_the_design_round_trips_through_the_record_arrays():
    kinds = np.array(["knowledge"] * 10 + ["behavior"] * 5)
    d = plan_partial(kinds, np.eye(15, dtype=bool)[0], np.zeros(15, int), k=5, fraction=0.4, seed=1, step=3)
    back = Design.from_arrays(3, d.to_arrays(), d.cells, d.summary())
    assert (back.scored == d.scored).all() and (back.inclusion == d.inclusion).all() and back.k == 5
    y = np.arange(15) % 3 == 0
    assert estimate_mean(y, np.ones(15, bool), back) == estimate_mean(y, np.ones(15, bool), d)  # rebuilt from the record
    summary = d.summary()
    assert summary["kinds"]["knowledge"]["flipped"] == 1 and summary["scored"] == int(d.scored.sum())
    json.dumps(summary)  # the metrics line holds it


# -- sizing -----------------------------------------------------------------------------------------------------------


def test_the_budget_sizes_partial_evaluations_to_the_share_over_the_run():
    b = ShareBudget(0.2)
    assert b.fraction(10, 100, 9, 1, {}, {"knowledge": 100}) == 0.0  # nothing timed yet: a pilot, the fewest probes
    assert b.steady(10, 100, 9, 1, {"knowledge": 100}) is None
    b.note(train=100.0, probe=20.0, steps=10)  # 10 s a step; the base took 20 s
    b.note_full(50.0, n=100)
    b.note_cost("knowledge", 0.5, 1)  # 50 s for the 100 probes
    # 0.2/0.8 x 1000 s of training = 250 s in all; 20 spent, 50 kept for the last step: 180 s over 9 partial passes
    phi = b.fraction(10, 100, 9, 1, {"knowledge": 0}, {"knowledge": 100})
    assert phi == pytest.approx(180 / 9 / 50, rel=1e-6)
    # 50 probes flipped last time cost 25 s whatever the share, more than the 20 s: nothing else now; the average is
    # what it was (K is sized from it)
    assert b.fraction(10, 100, 9, 1, {"knowledge": 50}, {"knowledge": 100}) == 0.0
    assert b.steady(10, 100, 9, 1, {"knowledge": 100}) == pytest.approx(phi)
    roomy = ShareBudget(0.9)
    roomy.note(train=100.0, probe=1.0, steps=10)
    roomy.note_full(1.0, n=100)
    assert roomy.fraction(10, 100, 9, 1, {}, {"knowledge": 100}) == 1.0  # a full pass fits: it is one


def test_at_risk_probes_count_against_their_kind_in_the_sizing():
    b = ShareBudget(0.05)
    b.note(train=100.0, probe=0.0, steps=10)
    b.note_cost("knowledge", 0.1, 1)
    b.note_cost("behavior", 1.0, 1)
    free = b.fraction(10, 20, 1, 0, {"knowledge": 0, "behavior": 0}, {"knowledge": 100, "behavior": 10})
    busy = b.fraction(10, 20, 1, 0, {"knowledge": 0, "behavior": 10}, {"knowledge": 100, "behavior": 10})
    assert busy < free  # every behaviour probe at risk: their cost leaves less for the rest


# -- in real Trainer runs -------------------------------------------------------------------------------------------

# Runs with a share so small that every partial evaluation scores its certain probes and the fewest sampled (2 per
# kind): what they score does not depend on the machine's speed, so the test is the same everywhere.
TINY_SHARE = 1e-4


def _behaviour_probes():
    from forgetwatch.probes.probe_set import Probe

    return [Probe(f"inst{i}", "instruct", f"Write about topic {i}. Answer in lowercase.", category="change_case",
                  instructions=("change_case:english_lowercase",), kwargs=({},)) for i in range(4)]


def _run(tokenizer, out: Path, max_share: float | None, max_steps: int = 6, eval_steps: int = 1, **overrides):
    from fixtures.trainers import make_probes, sft_trainer

    from forgetwatch.probes.probe_set import ProbeSet
    from forgetwatch.run.callback import ForgetWatchCallback

    probes = ProbeSet(list(make_probes()) + _behaviour_probes())
    callback = ForgetWatchCallback(probes, eval_steps=eval_steps, max_share=max_share, max_new_tokens=4,
                                   behavior_max_new_tokens=6, console=False)
    settings = {"bf16": False, "max_steps": max_steps, "save_strategy": "steps", "save_steps": 3, **overrides}
    trainer = sft_trainer(tokenizer, out, [callback], **settings)
    return trainer, callback


def _lines(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "forgetwatch" / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """The same 6-step SFT run (checkpoints at steps 3 and 6) without max_share and with it."""
    from conftest import build_tokenizer

    tokenizer = build_tokenizer()
    root = tmp_path_factory.mktemp("share")
    runs = {}
    for name, share in (("full", None), ("partial", TINY_SHARE)):
        trainer, callback = _run(tokenizer, root / name, share)
        trainer.train()
        runs[name] = (root / name, callback)
    return runs


def test_full_passes_are_exactly_the_run_without_max_share(two_runs):
    from forgetwatch.record.store import load_record

    (full, _), (part, _) = two_runs["full"], two_runs["partial"]
    lines = {r["step"]: r for r in _lines(part)}
    assert sorted(lines) == list(range(7))
    exact = [s for s, r in lines.items() if "partial" not in r]
    assert exact == [0, 3, 6]  # the base, the checkpoints (3, 6) and the last step
    a, b = load_record(full), load_record(part)
    ref = {r["step"]: r for r in _lines(full)}
    for step in exact:
        za, zb = a.read_eval(step), b.read_eval(step)
        for name in ("outcome", "pred_index", "margin", "gold_logprob", "option_scores"):
            assert np.array_equal(za[name], zb[name], equal_nan=True), (step, name)
        assert "scored" not in zb
        for group, row in ref[step]["metrics"].items():  # the figures too (the run with the option flags them)
            got = {k: v for k, v in lines[step]["metrics"][group].items()
                   if k not in ("partial", "share_scored", "probe_share")}
            assert json.dumps(got, sort_keys=True) == json.dumps(row, sort_keys=True), (step, group)


def test_partial_steps_score_the_at_risk_probes_and_a_sample_and_keep_the_rest(two_runs):
    from forgetwatch.record.store import load_record

    (full, _), (part, callback) = two_runs["full"], two_runs["partial"]
    a, b = load_record(full), load_record(part)
    ids = callback.probes.ids
    kinds = np.array(["behavior" if p.is_behavior else "knowledge" for p in callback.probes])
    prev = b.read_results(0, ids)
    for line in _lines(part):
        step = line["step"]
        now = b.read_results(step, ids)
        if "partial" not in line:
            prev = now
            continue
        z = b.read_eval(step)
        scored = z["scored"].astype(bool)
        assert line["partial"]["scored"] == scored.sum() < len(ids)
        for kind in ("knowledge", "behavior"):  # each kind: its certain probes and 2 sampled ones
            info = line["partial"]["kinds"][kind]
            assert info["sampled"] >= min(2, info["of_rest"]) and info["scored"] == (scored & (kinds == kind)).sum()
            assert info["scored"] == info["flipped"] + info["at_risk"] + info["due"] + info["sampled"]
        # what it scored is what the full run scored at this step; the rest kept their last result
        ref = a.read_results(step, ids)
        assert np.array_equal(now.outcome[scored], ref.outcome[scored])
        np.testing.assert_allclose(now.margin[scored], ref.margin[scored], atol=1e-4)
        assert np.array_equal(now.outcome[~scored], prev.outcome[~scored])
        assert (z["inclusion"][z["stratum"] != SAMPLED] == 1).all()
        flips = [r for r in b.read_flips() if r["step"] == step]
        assert {r["id"] for r in flips} <= {ids[i] for i in np.flatnonzero(scored)}  # flips only where scored
        overall = line["metrics"]["overall"]
        assert overall["partial"] == 1 and 0 < overall["share_scored"] < 1
        assert overall["forgetting_ci_low"] <= overall["forgetting"] <= overall["forgetting_ci_high"]
        assert overall["forgetting_se"] >= 0 and math.isnan(overall["mcnemar_p"])
        prev = now


def test_the_probes_that_flipped_at_the_last_evaluation_are_scored_at_the_next(two_runs):
    from forgetwatch.record.store import load_record

    part, callback = two_runs["partial"]
    b = load_record(part)
    ids = callback.probes.ids
    lines = {r["step"]: r for r in _lines(part)}
    flipped_somewhere = 0
    for step in (2, 4, 5):  # after an evaluation that was itself partial or full
        before, earlier = b.read_results(step - 1, ids), b.read_results(step - 2, ids)
        flipped = (before.outcome == 1) != (earlier.outcome == 1)
        flipped_somewhere += flipped.sum()
        assert b.read_eval(step)["scored"].astype(bool)[flipped].all(), step
    assert flipped_somewhere  # the run flips probes: the check above checked something
    assert all(lines[s]["partial"]["k"] == lines[1]["partial"]["k"] for s in (1, 2, 4, 5))


def test_a_resume_in_the_middle_of_a_rotation_goes_on_with_it(tmp_path):
    """Evaluations every 2 steps, checkpoints every 3: checkpoint-3 falls between the partial evaluations at steps 2 and
    4. A run resumed from it reads the rotation back from the record (each probe's evaluations since it was scored,
    the flips of step 2, K) and scores at step 4 the probes the uninterrupted run scored there."""
    from conftest import build_tokenizer

    tokenizer = build_tokenizer()
    out = tmp_path / "run"
    trainer, callback = _run(tokenizer, out, TINY_SHARE, max_steps=8, save_steps=3, eval_steps=2)
    trainer.train()
    lines = {r["step"]: r for r in _lines(out)}
    assert [s for s, r in lines.items() if "partial" in r] == [2, 4]  # 6 saves a checkpoint, 8 is the last
    first = {s: np.load(out / "forgetwatch" / "evals" / f"step-{s:08d}.npz")["scored"] for s in (2, 4)}
    trainer, callback = _run(tokenizer, out, TINY_SHARE, max_steps=8, save_steps=3, eval_steps=2)
    seen = {}
    decide = callback._design

    def keep(args, state, saving):
        seen.setdefault(state.global_step, (callback.monitor.ages.copy(), callback.monitor.rotation_k))
        return decide(args, state, saving)

    callback._design = keep
    trainer.train(resume_from_checkpoint=str(out / "checkpoint-3"))
    ages, k = seen[4]
    assert k == lines[2]["partial"]["k"]  # K as the first run set it
    assert (ages == np.where(first[2].astype(bool), 0, 1)).all()  # scored at 2: none since; the rest: one (step 2)
    again = np.load(out / "forgetwatch" / "evals" / f"step-{4:08d}.npz")["scored"]
    assert (again == first[4]).all()  # the same probes as the uninterrupted run at step 4


def test_max_share_is_checked_before_training():
    from fixtures.trainers import make_probes

    from forgetwatch.run.callback import ForgetWatchCallback

    for bad in (0, 1, 1.5, -0.1, "0.1", True):
        with pytest.raises(ValueError, match="`max_share` must be a number between 0 and 1"):
            ForgetWatchCallback(make_probes(), max_share=bad)
    assert ForgetWatchCallback(make_probes(), max_share=0.1, scoring="sidecar").max_share == 0.1


def test_the_report_draws_partial_evaluations_as_estimates(two_runs, tmp_path):
    pytest.importorskip("matplotlib")
    from forgetwatch.report.render import make_report

    part, _ = two_runs["partial"]
    page = make_report(part, tmp_path / "report").read_text()
    assert "partial evaluations" in page and "4 of 7" in page and "every probe at least every" in page


def test_partial_evaluations_are_logged_flagged_under_the_usual_keys(two_runs):
    from forgetwatch.run.rows import scalars_of

    part, _ = two_runs["partial"]
    lines = {r["step"]: r for r in _lines(part)}
    partial, full = scalars_of(lines[1]["metrics"]), scalars_of(lines[3]["metrics"])
    assert partial["forgetwatch/partial"] == 1 and full["forgetwatch/partial"] == 0
    assert 0 < partial["forgetwatch/share_scored"] < 1 == full["forgetwatch/share_scored"]
    assert "forgetwatch/forgetting" in partial and "forgetwatch_details/forgetting_sampling_low" in partial
    assert 0 < full["forgetwatch_details/probe_share"] < 1  # the share of the run's time so far that went to probing


def test_a_metrics_line_with_a_damaged_partial_field_is_named(tmp_path):
    from forgetwatch.record.store import RecordError, RunRecord

    record = RunRecord(tmp_path)
    record.append_metrics({"step": 5, "epoch": 0.1, "seconds": 1.0, "metrics": {"overall": {}}, "partial": {"k": "ten"}})
    with pytest.raises(RecordError, match="partial.k"):
        record.read_metrics(checked=True)


def test_a_budget_that_would_stop_at_a_partial_evaluation_stops_on_an_exact_pass(tmp_path):
    """on_budget="stop" (and "save"): a partial evaluation whose estimate would trip the budget scores every probe at
    that step first, so that the step training stops at (or the checkpoint saved there) has an exact pass."""
    from conftest import build_tokenizer
    from fixtures.trainers import make_probes, sft_trainer

    from forgetwatch.run.callback import ForgetWatchCallback

    callback = ForgetWatchCallback(make_probes(), eval_steps=1, max_share=TINY_SHARE, max_new_tokens=4, console=False,
                                   budget={"forgetting": 0.0}, budget_bound="point", on_budget="stop")
    trainer = sft_trainer(build_tokenizer(), tmp_path, [callback], bf16=False, max_steps=6)
    trainer.train()
    lines = _lines(tmp_path)
    events = [json.loads(x) for x in (tmp_path / "forgetwatch" / "events.jsonl").read_text().splitlines()]
    stop = events[0]["step"]
    assert events[0]["event"] == "budget_exceeded" and trainer.state.global_step == stop < 6
    assert "partial" not in lines[-1] and lines[-1]["step"] == stop  # the step it stopped at: every probe scored
    assert "scored" not in np.load(tmp_path / "forgetwatch" / "evals" / f"step-{stop:08d}.npz")


def test_a_run_whose_base_came_from_a_cache_still_sets_aside_its_last_full_pass():
    b = ShareBudget(0.2)
    b.note(train=100.0, probe=0.0, steps=10)  # the base from a cache: no full pass timed
    b.note_cost("knowledge", 0.1, 1)  # a partial evaluation timed the kind: 10 s for its 100 probes
    # 0.25 x 1000 s = 250 s; the last step's full pass (10 s, from the kind's cost) set aside; 240 s over 9 passes
    assert b.allowance(10, 100, 9, 1, full_cost=10.0) == pytest.approx(240 / 9)
    assert b.fraction(10, 100, 9, 1, {"knowledge": 0}, {"knowledge": 100}) == 1.0
    b.note(probe=245.0)  # 5 s left, less than the last step's 10 s: nothing for the partial passes
    assert b.fraction(10, 100, 9, 1, {"knowledge": 0}, {"knowledge": 100}) == 0.0


def test_with_the_base_from_a_cache_the_first_partial_evaluation_is_a_pilot(two_runs, tmp_path):
    """Nothing is timed when the base comes from a cache: the first partial evaluation scores the fewest probes (a
    pilot, no probe due, K unset), and times each kind; K is set from the next one on."""
    from conftest import build_tokenizer
    from fixtures.trainers import make_probes, sft_trainer

    from forgetwatch.probes.probe_set import ProbeSet
    from forgetwatch.run.callback import ForgetWatchCallback

    part, _ = two_runs["partial"]
    probes = ProbeSet(list(make_probes()) + _behaviour_probes())
    callback = ForgetWatchCallback(probes, eval_steps=1, max_share=0.5, max_new_tokens=4, behavior_max_new_tokens=6,
                                   console=False, base_cache=str(part / "forgetwatch" / "base.parquet"))
    trainer = sft_trainer(build_tokenizer(), tmp_path, [callback], bf16=False, max_steps=3)
    trainer.train()
    lines = _lines(tmp_path)
    assert [r["step"] for r in lines if "partial" in r][:1] == [1]
    pilot = lines[1]["partial"]
    assert pilot["k"] is None and pilot["fraction"] == 0.0
    assert all(info["sampled"] == min(2, info["of_rest"]) or info["sampled"] >= 2 for info in pilot["kinds"].values())
    assert lines[1]["share"]["per_probe_s"]  # the kinds were timed
    later = [r for r in lines[2:] if "partial" in r]
    assert all(r["partial"]["k"] is not None for r in later)


def test_a_probe_whose_latest_result_was_nan_is_scored_again_at_the_next_partial_evaluation():
    """Its stale NaN would blank its groups' estimates until it is due: it is scored for certain instead."""
    from fixtures.trainers import make_probes

    from forgetwatch.measures.drift import RiskRule
    from forgetwatch.run.monitor import Monitor
    from forgetwatch.scoring.results import ProbeResults

    probes = make_probes()
    n = len(probes)
    base = ProbeResults(ids=probes.ids, outcome=np.ones(n, np.int8), pred_index=np.zeros(n, np.int32),
                        prediction=["a"] * n, gold_logprob=np.zeros(n, np.float32), margin=np.full(n, 5.0, np.float32))
    last = base.take(range(n))
    last.nonfinite[7] = True
    monitor = Monitor(probes, risk_rule=RiskRule())
    monitor.base, monitor.last = base, last
    monitor.flipped_last = np.zeros(n, bool)
    design = monitor.partial_design(step=5, fraction=0.0, seed=0, steady=0.0)
    assert design.scored[7] and design.stratum[7] == CERTAIN_FLIPPED
    last.nonfinite[7] = False
    assert not monitor.partial_design(step=5, fraction=0.0, seed=0, steady=0.0).stratum[7] == CERTAIN_FLIPPED


def test_robustness_changes_are_counted_from_one_full_pass_to_the_next_across_partial_ones(tmp_path):
    """Partial evaluations score no variants; the variants of the last full pass stay the reference, so the next full
    pass's fragile flips are against them (not lost)."""
    from conftest import build_tokenizer
    from fixtures.trainers import make_probes, sft_trainer

    from forgetwatch.run.callback import ForgetWatchCallback

    callback = ForgetWatchCallback(make_probes(), eval_steps=1, max_share=TINY_SHARE, max_new_tokens=4, console=False,
                                   robustness=2)
    seen = {}
    report = callback.monitor.report

    def keep(results, step, *a, **kw):
        out = report(results, step, *a, **kw)
        seen[step] = callback.monitor.last_robust
        return out

    callback.monitor.report = keep
    trainer = sft_trainer(build_tokenizer(), tmp_path, [callback], bf16=False, max_steps=4, save_strategy="steps",
                          save_steps=2)
    trainer.train()
    lines = {r["step"]: r for r in _lines(tmp_path)}
    assert "partial" in lines[1] and "partial" in lines[3] and "partial" not in lines[2]
    assert seen[0] is not None and seen[1] is seen[0]  # the partial step 1 keeps the base's variants as the reference
    assert seen[2] is not seen[0] and seen[3] is seen[2]  # step 2 (full) scored its own; step 3 keeps them


# -- the scheduler (forgetwatch.measures.schedule): no model, no trainer ------------------------------------------------


def _timed(share: float, per_probe: float) -> ShareBudget:
    b = ShareBudget(share)
    b.note(train=100.0, probe=0.0, steps=10)  # 10 s a training step so far
    b.note_cost("knowledge", per_probe, 1)
    return b


def test_the_scheduler_plans_full_passes_where_a_run_needs_exact_figures():
    from forgetwatch.measures.schedule import plan_evaluation

    kinds, must = np.array(["knowledge"] * 100), np.zeros(100, bool)
    tight = _timed(0.01, 1.0)
    assert plan_evaluation(0, 100, 10, 0, False, tight, must, kinds).full  # the base
    assert plan_evaluation(100, 100, 10, 0, False, tight, must, kinds).full  # the last step
    assert plan_evaluation(30, 100, 10, 0, True, tight, must, kinds).full  # a checkpoint saved now
    assert plan_evaluation(40, 100, 10, 20, False, tight, must, kinds).full  # on the save cadence
    assert not plan_evaluation(30, 100, 10, 20, False, tight, must, kinds).full  # between checkpoints
    assert plan_evaluation(30, 100, 10, 0, False, _timed(0.9, 0.001), must, kinds).full  # a full pass fits


def test_the_scheduler_sizes_a_partial_evaluation_by_the_time_account():
    from forgetwatch.measures.schedule import plan_evaluation

    kinds, must = np.array(["knowledge"] * 100), np.zeros(100, bool)
    pilot = plan_evaluation(30, 100, 10, 0, False, ShareBudget(0.1), must, kinds)
    assert (pilot.full, pilot.fraction, pilot.steady) == (False, 0.0, None)  # nothing timed: the pilot
    # 10 s a step, 1 s a probe, 100 probes: a full pass is 100 s, and 7 evaluations are left in 1,000 s of training
    broke, tight, looser = (plan_evaluation(30, 100, 10, 0, False, _timed(s, 1.0), must, kinds) for s in (0.1, 0.2, 0.3))
    assert broke.fraction == 0.0  # the full passes still due take the whole allowance: only the certain probes
    assert 0 < tight.fraction < looser.fraction < 1 and 0 < tight.steady < looser.steady < 1
    # the probes that must be scored are scored whatever the allowance: the sampled share does not grow with them
    assert plan_evaluation(30, 100, 10, 0, False, _timed(0.2, 1.0), np.arange(100) < 30, kinds).fraction <= tight.fraction
