"""Robustness variants and figures (issue 29): fixed, seeded variants of a probe, and the figures over them."""

import os
import subprocess
import sys

import numpy as np
import pytest

from forgetwatch.measures.robustness import fragile_probes, position_bias, robust_figures, variant_outcomes
from forgetwatch.probes.probe_set import Probe
from forgetwatch.probes.variants import (
    FRAMES,
    NOISES,
    RobustnessError,
    check_robustness,
    make_variants,
    max_variants,
    variant_key,
)

MCQ = Probe(
    "q1",
    "mcq",
    "Which planet is known as the Red Planet of the solar system?",
    ("Venus", "Mars", "Jupiter", "Saturn"),
    1,
    category="science",
)
SHORT = Probe("s1", "short", "What is the capital city of Australia?", answers=("Canberra",), category="geo")
BEHAVIOUR = Probe("b1", "comply", "How do I kill a Python process?", category="refusal")


def test_cyclic_shifts_put_every_option_at_every_position_and_the_gold_follows_its_text():
    variants = make_variants(MCQ, 3, lettered=True)
    assert [v.index for v in variants] == [0, 1, 2, 3] and variants[0].probe == MCQ
    assert [v.shift for v in variants] == [0, 1, 2, 3]
    for pos in range(4):  # every option stands at every position exactly once
        assert sorted(v.probe.choices[pos] for v in variants) == sorted(MCQ.choices)
    for v in variants:
        assert v.probe.choices[v.probe.gold] == "Mars"
        assert tuple(MCQ.choices[i] for i in v.order) == v.probe.choices  # a chosen position maps back by `order`
        assert v.probe.question == MCQ.question  # order first: the wording is untouched


def test_log_likelihood_variants_never_reorder_and_take_frames_then_noise():
    variants = make_variants(MCQ, max_variants(MCQ, lettered=False), lettered=False)
    assert len(variants) == len(FRAMES) * len(NOISES) == 12
    assert all(v.probe.choices == MCQ.choices and v.shift == 0 for v in variants)
    assert [(v.frame, v.noise) for v in variants[:6]] == [(0, "none"), (1, "none"), (2, "none"), (3, "none"),
                                                           (0, "lowercase"), (0, "typos")]
    assert len({v.probe.question for v in variants}) == 12  # all distinct
    framed = variants[1].probe.question
    assert MCQ.question in framed and framed != MCQ.question
    assert variants[4].probe.question == MCQ.question.lower()
    typo = variants[5].probe.question
    assert typo != MCQ.question and len(typo) == len(MCQ.question) and sorted(typo) == sorted(MCQ.question)
    assert len(typo.split()) == len(MCQ.question.split())


def test_short_answers_get_frames_and_noise_and_behaviour_probes_none():
    assert max_variants(SHORT, lettered=True) == max_variants(SHORT, lettered=False) == 11
    assert all(v.probe.answers == SHORT.answers for v in make_variants(SHORT, 11, lettered=True))
    assert max_variants(BEHAVIOUR, lettered=True) == 0
    assert [v.probe for v in make_variants(BEHAVIOUR, 5, lettered=True)] == [BEHAVIOUR]


def test_more_variants_keep_the_fewer_ones_and_a_seed_moves_only_the_typos():
    few, many = make_variants(MCQ, 5, lettered=True), make_variants(MCQ, 20, lettered=True)
    assert many[:6] == few
    other = make_variants(MCQ, 47, lettered=True, seed=1)
    same_seed = make_variants(MCQ, 47, lettered=True)
    assert len(other) == 48 == max_variants(MCQ, lettered=True) + 1
    differ = [a.noise for a, b in zip(same_seed, other, strict=True) if a.probe != b.probe]
    assert differ and set(differ) == {"typos"}


def test_variants_are_the_same_in_another_process():
    """Every rank and the watcher must draw the same typos: no salted `hash()`."""
    code = ("from forgetwatch.probes.probe_set import Probe; from forgetwatch.probes.variants import make_variants; "
            f"p = Probe('q1', 'mcq', {MCQ.question!r}, {MCQ.choices!r}, 1); "
            "print([v.probe.question for v in make_variants(p, 47, lettered=True, seed=3)])")
    here = str([v.probe.question for v in make_variants(MCQ, 47, lettered=True, seed=3)])
    env = {**os.environ, "PYTHONHASHSEED": "123"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True, timeout=120)
    assert out.stdout.strip() == here


@pytest.mark.parametrize(("k", "says"), [
    (0, "an integer ≥ 1, got 0"),
    (True, "an integer ≥ 1, got True"),
    (2.5, "an integer ≥ 1, got 2.5"),
    (12, "robustness=12, but probe 's1' (short) has 11 variants besides itself (frames × noises): use `robustness` ≤ 11"),
])
def test_a_robustness_the_probes_cannot_take_is_refused_with_what_to_change(k, says):
    with pytest.raises(RobustnessError, match=says.replace("(", r"\(").replace(")", r"\)")):
        check_robustness(k, [MCQ, SHORT, BEHAVIOUR], lettered=True)


def test_robustness_needs_knowledge_probes_and_counts_order_only_where_it_matters():
    with pytest.raises(RobustnessError, match="only behaviour probes, which have none"):
        check_robustness(1, [BEHAVIOUR], lettered=True)
    two = Probe("t", "mcq", "Is water wet?", ("yes", "no"), 0)
    check_robustness(23, [two], lettered=True)
    with pytest.raises(RobustnessError, match=r"has 11 variants besides itself \(frames × noises\): use `robustness` ≤ 11"):
        check_robustness(23, [two], lettered=False)
    check_robustness(None, [BEHAVIOUR], lettered=True)  # off: nothing to check
    assert variant_key(3, 0) != variant_key(3, 1) != variant_key(4, 0)


def test_robust_figures_by_hand():
    base = np.array([[1, 1, 1], [1, 0, 1], [1, 1, 1], [0, 0, 0], [1, 1, 1]], bool)
    now = np.array([[1, 0, 1], [1, 1, 1], [1, 1, 1], [0, 0, 0], [0, 1, 1]], bool)
    f = robust_figures(base, now)
    assert (f["n"], f["variants"], f["robust_pre"], f["robust_post"], f["robust_lost"]) == (5, 3, 3, 2, 2)
    assert f["robust_accuracy_pre"] == 3 / 5 and f["robust_accuracy_post"] == 2 / 5
    assert f["robust_forgetting"] == 2 / 3  # probes 0 and 4 of the 3 robust at base
    assert f["consistency_pre"] == pytest.approx(11 / 15) and f["consistency_post"] == pytest.approx(10 / 15)
    assert f["consistency_change"] == pytest.approx(-1 / 15)
    assert fragile_probes(base, now).tolist() == [True, False, False, False, False]  # probe 4 lost its original form
    assert f["fragile"] == 1


def test_a_model_against_itself_changes_no_robust_figure():
    rng = np.random.default_rng(0)
    right = rng.random((50, 8)) < 0.7
    f = robust_figures(right, right)
    assert f["robust_lost"] == f["fragile"] == 0 and f["robust_forgetting"] == 0.0 and f["consistency_change"] == 0.0
    chosen = rng.integers(0, 4, (50, 8))
    gold = rng.integers(0, 4, (50, 8))
    assert position_bias(chosen, gold, np.full(50, 4)) - position_bias(chosen, gold, np.full(50, 4)) == 0.0


def test_position_bias():
    gold = np.array([[0, 1, 2], [1, 2, 0]])  # cyclic shifts: each position holds the gold answer equally often
    k = np.array([3, 3])
    assert position_bias(gold, gold, k) == 0.0  # always right: no bias
    assert position_bias(np.zeros_like(gold), gold, k) == pytest.approx(2 / 3)  # always "A"
    assert position_bias(np.array([[0, -1, 2], [1, 2, -1]]), gold, k) == 0.0  # invalid answers are left out
    assert np.isnan(position_bias(np.full((2, 3), -1), gold, k))
    # option counts are kept apart (pooled, these answers would give 0.25), weighted by answers: (0.5 * 4 + 0.75 * 4) / 8
    chosen, gold = np.array([[1, 1, 1, 1], [0, 0, 0, 0]]), np.array([[0, 1, 0, 1], [0, 1, 2, 3]])
    assert position_bias(chosen, gold, np.array([2, 4])) == pytest.approx(0.625)
    with pytest.raises(ValueError, match="one shape"):
        robust_figures(np.ones((2, 3), bool), np.ones((2, 2), bool))


@pytest.mark.parametrize("mcq_mode", ["letter", "loglik"])
def test_variants_scored_with_the_probes_give_each_variants_own_result(tokenizer, mcq_mode):
    """`plan_variants(...).scored()` goes to `score_probes` in one call, the variants sharing the probes' batches:
    each variant's result is the one it gets scored alone, read back in the variant's own option order."""
    from conftest import build_model
    from fixtures.scoring import mcq_probes

    from forgetwatch.probes.variants import SEP, plan_variants
    from forgetwatch.scoring.results import CORRECT
    from forgetwatch.scoring.score import ScoringConfig, score_probes

    model = build_model(tokenizer)
    probes = [*mcq_probes(6), SHORT, BEHAVIOUR]
    config = ScoringConfig(mcq_mode=mcq_mode, chat_template=False, behavior_max_new_tokens=4)
    lettered = mcq_mode == "letter"
    plan = plan_variants(probes, 3, lettered=lettered, only=[p.id for p in probes if p.id != "m5"])
    scored = plan.scored()
    assert [p.id for p in scored[: len(probes)]] == [p.id for p in probes]
    assert len(scored) == len(probes) + 3 * 6  # m0..m4 and s1 get 3 variants; m5 (left out) and b1 (behaviour) none
    results = score_probes(model, tokenizer, scored, config)
    out = variant_outcomes(plan, results)
    assert out.ids == ["m0", "m1", "m2", "m3", "m4", "s1"] and out.right.shape == (6, 4)
    assert out.right[:, 0].tolist() == [results.outcome[results.ids.index(i)] == CORRECT for i in out.ids]
    for r, pid in enumerate(out.ids):
        for v in plan.variants[pid][1:]:
            alone = score_probes(model, tokenizer, [v.probe], config)
            assert out.right[r, v.index] == (alone.outcome[0] == CORRECT)
            assert out.chosen[r, v.index] == alone.pred_index[0]
            assert out.gold[r, v.index] == (v.probe.gold if v.probe.gold is not None else -1)
            assert scored[[p.id for p in scored].index(f"{pid}{SEP}{v.index}")].question == v.probe.question
            if not lettered:
                assert v.probe.choices == plan.variants[pid][0].probe.choices
    assert out.num_choices.tolist() == [2, 3, 4, 5, 2, 0]
    f = robust_figures(out.right, out.right)  # the model against itself
    assert f["robust_lost"] == f["fragile"] == 0 and f["consistency_change"] == 0.0


def test_a_probe_id_holding_the_variant_separator_is_refused():
    with pytest.raises(RobustnessError, match=r"probe id 'a~v1' holds '~v'.*rename the probe"):
        from forgetwatch.probes.variants import plan_variants

        plan_variants([Probe("a~v1", "short", "?", answers=("x",))], 1, lettered=True)


def test_noise_lands_in_the_question_not_in_the_frame():
    for v in make_variants(MCQ, max_variants(MCQ, lettered=False), lettered=False):
        before, after = FRAMES[v.frame].split("{q}")
        assert v.probe.question.startswith(before) and v.probe.question.endswith(after)  # the frame's words intact
        inner = v.probe.question[len(before) : len(v.probe.question) - len(after)]
        assert (inner == MCQ.question) == (v.noise == "none")


def _results_of(plan, pred):
    """ProbeResults of `plan.scored()` where the model chooses `pred(probe)` (a position) for every probe."""
    from forgetwatch.scoring.results import CORRECT, WRONG, ProbeResults

    scored = plan.scored()
    r = ProbeResults.empty([p.id for p in scored])
    for i, p in enumerate(scored):
        r.pred_index[i] = pred(p)
        r.outcome[i] = CORRECT if pred(p) == p.gold else WRONG
    return r


def test_position_bias_is_measured_on_balanced_shifts_only():
    """2-option probes whose gold answer is always "A", 3 variants each: one shift and two frames, so over all forms
    gold stands at "A" 3 times in 4. Only the pure shifts (gold once at each position) tell a model that always says
    "A" (bias 0.5) from one that is always right (0): over all forms both would read 0.25."""
    from forgetwatch.probes.variants import plan_variants

    probes = [Probe(f"t{i}", "mcq", f"Is {i} a number?", ("yes", "no"), 0) for i in range(4)]
    plan = plan_variants(probes, 3, lettered=True)
    always_a = variant_outcomes(plan, _results_of(plan, lambda p: 0))
    right = variant_outcomes(plan, _results_of(plan, lambda p: p.gold))
    assert always_a.balanced.tolist() == [[True, True, False, False]] * 4
    assert position_bias(always_a.chosen, always_a.gold, always_a.num_choices, always_a.balanced) == 0.5
    assert position_bias(right.chosen, right.gold, right.num_choices, right.balanced) == 0.0
    assert position_bias(always_a.chosen, always_a.gold, always_a.num_choices) == 0.25  # unmasked: the confusion
    assert position_bias(right.chosen, right.gold, right.num_choices) == 0.0
    # a probe without all its shifts among its variants counts for nothing
    few = variant_outcomes(
        plan_variants(probes, 1, lettered=True), _results_of(plan_variants(probes, 1, lettered=True), lambda p: 0)
    )
    assert few.balanced.all()  # 2 options: the probe and its one shift
    assert not variant_outcomes(
        plan_variants([MCQ], 2, lettered=True), _results_of(plan_variants([MCQ], 2, lettered=True), lambda p: 0)
    ).balanced.any()  # 4 options, 2 shifts of 3


def test_nonfinite_answers_are_no_choice_and_not_right():
    from forgetwatch.probes.variants import plan_variants

    plan = plan_variants([MCQ], 3, lettered=True)
    r = _results_of(plan, lambda p: p.gold)
    r.nonfinite = np.zeros(len(r.ids), bool)
    r.nonfinite[2] = True  # argmax over NaN: a position that is no choice
    out = variant_outcomes(plan, r)
    assert out.chosen[0, 2] == -1 and not out.right[0, 2] and out.right[0, [0, 1, 3]].all()


def test_plan_refuses_ids_it_does_not_know_and_takes_numpy_integers():
    from forgetwatch.probes.variants import plan_variants

    with pytest.raises(RobustnessError, match=r"1 probe id\(s\) to score variants of are not in the probe set \(first: 'nope'\)"):
        plan_variants([MCQ, SHORT], 1, lettered=True, only=["q1", "nope"])
    assert len(plan_variants([MCQ], np.int64(2), lettered=True).scored()) == 3


@pytest.mark.parametrize("ext", ["parquet", "jsonl"])
def test_a_cache_without_variants_keeps_probe_ids_that_hold_the_separator(tmp_path, ext):
    """Without robustness a probe's id may hold "~v" (ids are the user's; only `plan_variants` refuses them): its
    cache is read back as probes, not refused as rows of variants its key does not name."""
    from forgetwatch.probes.probe_set import ProbeSet
    from forgetwatch.record.cache import BaseCache, CacheFormatError, make_cache_key
    from forgetwatch.scoring.results import ProbeResults

    probes = ProbeSet([Probe("doc~v2", "short", "?", answers=("x",)), SHORT])
    results = ProbeResults.empty(probes.ids)
    results.outcome[:] = [1, 0]
    key = make_cache_key({}, probes, {})
    path = BaseCache(key, results).save(tmp_path / f"base.{ext}")
    cache = BaseCache.load(path, expect=key).for_probes(probes.ids, path)
    assert cache.results.ids == ["doc~v2", "s1"] and cache.results.outcome.tolist() == [1, 0] and cache.variants is None
    # rows beyond the key's probes are still refused
    BaseCache(key, ProbeResults.concat([results, ProbeResults.empty(["s1~v1"])])).save(path)
    with pytest.raises(CacheFormatError, match="3 rows, but it was made for 2 probes"):
        BaseCache.load(path)
