"""Tests for forgetwatch.measures.metrics: the worked examples of notes/metrics.md, invariants and input checks."""

import math

import numpy as np
import pytest

from forgetwatch.measures import metrics
from forgetwatch.measures.metrics import (
    ForgettingMetrics,
    compute_metrics,
    compute_report,
    first_forgotten_index,
    forgetting_events,
    mcnemar_exact,
    wilson_interval,
)

TOL = 1e-4


def transitions(**counts: int) -> tuple[np.ndarray, np.ndarray]:
    """Outcome arrays from transition counts, e.g. transitions(r=700, f=100, nv=200).

    r = 1->1 (retained), f = 1->0 (forgotten), l = 0->1 (learned), nv = 0->0 (never).
    """
    pairs = {"r": (1, 1), "f": (1, 0), "l": (0, 1), "nv": (0, 0)}
    pre, post = [], []
    for key, count in counts.items():
        a, b = pairs[key]
        pre += [a] * count
        post += [b] * count
    return np.array(pre, dtype=np.int8), np.array(post, dtype=np.int8)


def random_outcomes(seed: int, n: int, n_categories: int = 0):
    rng = np.random.default_rng(seed)
    codes = np.array([-1, 0, 1], dtype=np.int8)
    pre = rng.choice(codes, n, p=[0.05, 0.35, 0.6])
    post = rng.choice(codes, n, p=[0.1, 0.3, 0.6])
    k = rng.choice(np.array([0, 2, 3, 4, 5]), n)
    cats = [f"c{i}" for i in rng.integers(0, n_categories, n)] if n_categories else None
    return pre, post, k, cats


def test_all_pinned():
    assert metrics.__all__ == [
        "OUTCOME_CORRECT",
        "OUTCOME_WRONG",
        "OUTCOME_INVALID",
        "ForgettingMetrics",
        "compute_metrics",
        "compute_report",
        "wilson_interval",
        "mcnemar_exact",
        "forgetting_events",
        "first_forgotten_index",
        "format_report",
        "format_figure",
    ]
    assert (metrics.OUTCOME_CORRECT, metrics.OUTCOME_WRONG, metrics.OUTCOME_INVALID) == (1, 0, -1)


# --- worked examples from metrics.md ---------------------------------------------------------------


def test_example_1_k4_accuracy_080_to_070():
    pre, post = transitions(r=700, f=100, nv=200)
    m = compute_metrics(pre, post, np.full(1000, 4))
    assert (m.n, m.retained, m.forgotten, m.learned, m.never) == (1000, 700, 100, 0, 200)
    assert m.forgetting == pytest.approx(0.10, abs=TOL)
    assert m.backward_transfer == pytest.approx(0.0, abs=TOL)
    assert m.chance == pytest.approx(0.2 * 0.3 / 3, abs=TOL)  # 0.02
    assert m.forgetting_adjusted == pytest.approx(0.08, abs=TOL)  # the formula, not the paper's "about 6%"
    assert m.backward_transfer_adjusted == pytest.approx(0.0, abs=TOL)
    assert m.forgetting_max == pytest.approx(0.7333, abs=TOL)
    assert m.backward_transfer_max == pytest.approx(0.60, abs=TOL)
    assert m.accuracy_pre == pytest.approx(0.8) and m.accuracy_post == pytest.approx(0.7)
    assert m.n_mcq == 1000 and m.adjusted


def test_example_2_k4_accuracy_070_to_065():
    pre, post = transitions(r=600, f=100, l=50, nv=250)
    m = compute_metrics(pre, post, np.full(1000, 4))
    assert m.forgetting == pytest.approx(0.10, abs=TOL)
    assert m.backward_transfer == pytest.approx(0.05, abs=TOL)
    assert m.chance == pytest.approx(0.035, abs=TOL)  # 0.3 * 0.35 / 3
    assert m.forgetting_adjusted == pytest.approx(0.065, abs=TOL)
    assert m.backward_transfer_adjusted == pytest.approx(0.015, abs=TOL)
    assert m.forgetting_max == pytest.approx(0.60, abs=TOL)
    assert m.backward_transfer_max == pytest.approx(0.5333, abs=TOL)


def test_example_3_two_coin_flip_classifiers_show_no_adjusted_forgetting():
    rng = np.random.default_rng(1234)
    n = 400_000
    pre = (rng.random(n) < 0.5).astype(np.int8)
    post = (rng.random(n) < 0.5).astype(np.int8)  # independent of pre
    m = compute_metrics(pre, post, np.full(n, 2))
    # F ≈ 0.25 with sd sqrt(0.25 * 0.75 / 4e5) ≈ 0.0007; chance ≈ 0.5 * 0.5 / 1 = 0.25.
    assert m.forgetting == pytest.approx(0.25, abs=0.005)
    assert m.chance == pytest.approx(0.25, abs=0.005)
    assert abs(m.forgetting - m.chance) < 0.005
    assert m.forgetting_adjusted < 0.005
    assert m.backward_transfer_adjusted < 0.005


def test_example_4_piqa_like_k2_uses_its_own_k():
    pre, post = transitions(r=700, f=100, l=100, nv=100)  # accuracy 0.8 -> 0.8, F = 0.10
    m = compute_metrics(pre, post, np.full(1000, 2))
    assert m.accuracy_pre == pytest.approx(0.8) and m.accuracy_post == pytest.approx(0.8)
    assert m.forgetting == pytest.approx(0.10, abs=TOL)
    assert m.chance == pytest.approx(0.04, abs=TOL)  # 0.2 * 0.2 / 1
    assert m.forgetting_adjusted == pytest.approx(0.06, abs=TOL)
    # The reference code's k = 4 for every task would report 0.10 - 0.04 / 3 = 0.0867.
    wrong = compute_metrics(pre, post, np.full(1000, 4))
    assert wrong.forgetting_adjusted == pytest.approx(0.0867, abs=TOL)


# --- invariants ------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(25))
def test_net_change_identity_on_random_data(seed):
    n = int(np.random.default_rng(seed).integers(1, 3000))
    pre, post, k, _ = random_outcomes(seed, n)
    m = compute_metrics(pre, post, k)
    assert m.backward_transfer - m.forgetting == pytest.approx(m.accuracy_post - m.accuracy_pre, abs=1e-12)
    assert m.net_change == pytest.approx(m.accuracy_post - m.accuracy_pre, abs=1e-12)
    assert m.retained + m.forgotten + m.learned + m.never == m.n == n
    assert 0 <= m.forgetting_adjusted <= m.forgetting
    assert 0 <= m.backward_transfer_adjusted <= m.backward_transfer
    assert m.forgetting_ci[0] <= m.forgetting <= m.forgetting_ci[1]
    assert m.backward_transfer_ci[0] <= m.backward_transfer <= m.backward_transfer_ci[1]
    assert 0 <= m.mcnemar_p <= 1


def test_invalid_counts_as_wrong_and_is_reported():
    pre = np.array([1, 1, -1, -1, 0, 1, -1, 1], dtype=np.int8)
    post = np.array([-1, 1, 1, -1, -1, 0, 0, 1], dtype=np.int8)
    m = compute_metrics(pre, post, np.full(8, 2))
    # 1->-1 and 1->0 are forgotten; -1->1 is learned; -1->-1, 0->-1, -1->0 are never known.
    assert (m.retained, m.forgotten, m.learned, m.never) == (2, 2, 1, 3)
    assert m.forgetting == pytest.approx(2 / 8)
    assert m.backward_transfer == pytest.approx(1 / 8)
    assert m.accuracy_pre == pytest.approx(4 / 8) and m.accuracy_post == pytest.approx(3 / 8)
    assert m.invalid_rate_pre == pytest.approx(3 / 8)
    assert m.invalid_rate_post == pytest.approx(3 / 8)
    # The chance term treats invalid as not correct too: 8 * (4/8) * (5/8) / 1 / 8.
    assert m.chance == pytest.approx(0.5 * 0.625)
    # Same numbers as if every invalid were a plain wrong answer, apart from the invalid rates.
    plain = compute_metrics(np.maximum(pre, 0), np.maximum(post, 0), np.full(8, 2))
    for key in ("forgetting", "backward_transfer", "chance", "forgetting_adjusted", "forgetting_max"):
        assert getattr(m, key) == getattr(plain, key)
    assert plain.invalid_rate_pre == plain.invalid_rate_post == 0


def test_mixed_k_sums_chance_per_group():
    # k=2 group: 300 items, accuracy 0.8 -> 0.7; k=4 group: 300 items, 0.6 -> 0.6; short: 400 items.
    p2, q2 = transitions(r=200, f=40, l=10, nv=50)
    p4, q4 = transitions(r=150, f=30, l=30, nv=90)
    ps, qs = transitions(r=200, f=50, l=20, nv=130)
    pre, post = np.concatenate([p2, p4, ps]), np.concatenate([q2, q4, qs])
    k = np.array([2] * 300 + [4] * 300 + [0] * 400)
    m = compute_metrics(pre, post, k)
    # expected lucky flips: 300 * 0.2 * 0.3 / 1 = 18, 300 * 0.4 * 0.4 / 3 = 16, short 0 -> 34 / 1000
    assert m.chance == pytest.approx(0.034, abs=1e-12)
    assert m.forgetting == pytest.approx(0.12)  # (40 + 30 + 50) / 1000
    assert m.forgetting_adjusted == pytest.approx(0.086, abs=1e-12)
    assert m.backward_transfer_adjusted == pytest.approx(0.06 - 0.034, abs=1e-12)
    # F_max = (300 * (2 * 0.8 - 1) / 1 + 300 * (4 * 0.6 - 1) / 3 + 250) / 1000 = (180 + 140 + 250) / 1000
    assert m.forgetting_max == pytest.approx(0.57, abs=1e-12)
    assert m.backward_transfer_max == pytest.approx((120 + 140 + 220) / 1000, abs=1e-12)
    assert m.n_mcq == 600 and m.adjusted
    # Wrongly using k = 4 for every multiple-choice item: one group of 600, accuracy 0.70 -> 0.65,
    # 600 * 0.3 * 0.35 / 3 = 21 expected flips instead of 34.
    wrong = compute_metrics(pre, post, np.where(k == 2, 4, k))
    assert wrong.chance == pytest.approx(0.021, abs=1e-12)
    assert wrong.forgetting_adjusted != pytest.approx(m.forgetting_adjusted, abs=TOL)
    # Short items add no chance term: the same chance as the mcq items alone, rescaled to N = 1000.
    mcq_only = compute_metrics(pre[:600], post[:600], k[:600])
    assert m.chance == pytest.approx(mcq_only.chance * 600 / 1000, abs=1e-12)


def test_short_answer_only_is_not_adjusted():
    pre, post = transitions(r=50, f=30, l=5, nv=15)
    m = compute_metrics(pre, post, np.zeros(100, dtype=int))
    assert not m.adjusted and m.n_mcq == 0 and m.chance == 0
    assert m.forgetting_adjusted == m.forgetting == pytest.approx(0.30)
    assert m.backward_transfer_adjusted == m.backward_transfer == pytest.approx(0.05)
    assert m.forgetting_max == pytest.approx(m.accuracy_pre)


def test_aggregate_first_clip_last():
    # Category "low": k=4, accuracy 0.1 before (below chance 0.25): its own F_max clips to 0.
    # Category "high": k=4, accuracy 0.9 before: F_max = (3.6 - 1) / 3 = 0.8667.
    p_low, q_low = transitions(r=10, nv=90)
    p_high, q_high = transitions(r=90, nv=10)
    pre, post = np.concatenate([p_low, p_high]), np.concatenate([q_low, q_high])
    report = compute_report(pre, post, np.full(200, 4), ["low"] * 100 + ["high"] * 100)
    assert report["low"].forgetting_max == 0.0
    assert report["high"].forgetting_max == pytest.approx(2.6 / 3)
    # Correct: (100 * (-0.2) + 100 * 0.8667) / 200 = 1/3; clip-then-average would give 0.4333.
    assert report["overall"].forgetting_max == pytest.approx(1 / 3)
    clipped_mean = (report["low"].forgetting_max + report["high"].forgetting_max) / 2
    assert clipped_mean == pytest.approx(0.4333, abs=TOL)
    assert report["overall"].forgetting_max != pytest.approx(clipped_mean, abs=TOL)


def test_adjusted_forgetting_is_clipped_after_pooling():
    # "a" (k=2): F = 0, chance 0.25 -> F_adj clipped to 0. "b" (k=2): F = 0.5, chance 0.14 -> 0.36.
    p_a, q_a = transitions(r=50, nv=50)
    p_b, q_b = transitions(f=50, r=30, nv=20)
    pre, post = np.concatenate([p_a, p_b]), np.concatenate([q_a, q_b])
    report = compute_report(pre, post, np.full(200, 2), ["a"] * 100 + ["b"] * 100)
    assert report["a"].forgetting_adjusted == 0.0
    assert report["b"].forgetting_adjusted == pytest.approx(0.36)
    # Overall sums the categories' expected flips: (25 + 14) / 200 = 0.195, F = 0.25, F_adj = 0.055 (clipped once, after
    # summing; averaging the clipped per-category values would give 0.18).
    assert report["overall"].chance == pytest.approx(0.195)
    assert report["overall"].forgetting_adjusted == pytest.approx(0.055)


def test_overall_chance_is_the_sum_of_the_categories():
    # two k = 4 categories of 100, 0.9 -> 0.9 and 0.3 -> 0.3 (no flips): chances 0.1 * 0.1 / 3 and 0.7 * 0.7 / 3.
    # Pooling every k = 4 item (acc 0.6) would give 0.4 * 0.4 / 3 = 0.053 overall, against 0.083 for the categories.
    pre = np.array([1] * 90 + [0] * 10 + [1] * 30 + [0] * 70)
    report = compute_report(pre, pre, np.full(200, 4), ["easy"] * 100 + ["hard"] * 100)
    assert report["easy"].chance == pytest.approx(0.01 / 3) and report["hard"].chance == pytest.approx(0.49 / 3)
    assert report["overall"].chance == pytest.approx((0.01 / 3 + 0.49 / 3) / 2)  # 0.0833


# --- uncertainty -----------------------------------------------------------------------------------


def test_wilson_interval_example():
    low, high = wilson_interval(100, 500)  # F = 0.20 on 500 items
    assert low == pytest.approx(0.167, abs=5e-4)
    assert high == pytest.approx(0.237, abs=5e-4)
    pre, post = transitions(f=100, r=300, nv=100)
    assert compute_metrics(pre, post, np.full(500, 4)).forgetting_ci == (low, high)


def test_wilson_interval_edges():
    low, high = wilson_interval(0, 50)
    assert low == 0.0 and 0 < high < 0.1
    low, high = wilson_interval(50, 50)
    assert high == 1.0 and 0.9 < low < 1
    with pytest.raises(ValueError, match="`n`"):
        wilson_interval(0, 0)
    with pytest.raises(ValueError, match="`successes`"):
        wilson_interval(6, 5)


def test_mcnemar_symmetric_is_one():
    assert mcnemar_exact(0, 0) == 1.0
    assert mcnemar_exact(5, 5) == 1.0
    assert mcnemar_exact(20_000, 20_000) == 1.0
    assert mcnemar_exact(5, 6) == 1.0  # 2 * P(X <= 5 | n = 11) = 1 exactly
    assert mcnemar_exact(5_000, 5_001) == pytest.approx(1.0, abs=1e-9)  # log-space path


def test_mcnemar_known_values():
    assert mcnemar_exact(10, 0) == pytest.approx(2 * 0.5**10, rel=1e-12)  # 0.001953125
    assert mcnemar_exact(0, 10) == mcnemar_exact(10, 0)
    # Against exact integer arithmetic (Python ints do not overflow).
    for b, c in [(3, 12), (40, 25), (700, 600)]:
        n = b + c
        exact = min(1.0, 2 * sum(math.comb(n, i) for i in range(min(b, c) + 1)) / 2**n)
        assert mcnemar_exact(b, c) == pytest.approx(exact, rel=1e-9)


def test_mcnemar_large_counts_do_not_overflow():
    p = mcnemar_exact(40_000, 39_000)
    # Normal approximation: z = 1000 / sqrt(79000) = 3.558, p ≈ erfc(z / sqrt(2)) ≈ 3.7e-4.
    z = (40_000 - 39_000 - 1) / math.sqrt(79_000)  # with continuity correction
    assert math.isfinite(p)
    assert p == pytest.approx(math.erfc(z / math.sqrt(2)), rel=0.05)
    assert mcnemar_exact(60_000, 0) == 0.0  # underflows cleanly
    with pytest.raises(ValueError):
        mcnemar_exact(-1, 3)


def test_mcnemar_in_metrics_uses_discordant_pairs():
    pre, post = transitions(r=500, f=10, nv=490)
    assert compute_metrics(pre, post, np.full(1000, 4)).mcnemar_p == pytest.approx(0.001953125)


# --- report, serialisation ---------------------------------------------------------------------------


def test_report_per_category_matches_subsets_and_sums_to_overall():
    pre, post, k, cats = random_outcomes(7, 5000, n_categories=6)
    report = compute_report(pre, post, k, cats)
    names = sorted(set(cats))
    assert list(report) == ["overall", *names]
    overall = report["overall"]
    for field in ("n", "retained", "forgotten", "learned", "never", "n_mcq"):
        assert sum(getattr(report[name], field) for name in names) == getattr(overall, field)
    # every count and rate of the overall row is the pooled one; the chance term is the sum of the categories'
    assert overall.chance == pytest.approx(sum(report[name].chance * report[name].n for name in names) / overall.n)
    pooled = compute_metrics(pre, post, k)
    assert (overall.forgotten, overall.learned, overall.forgetting_max) == (
        pooled.forgotten,
        pooled.learned,
        pooled.forgetting_max,
    )
    cats_a = np.asarray(cats)
    for name in names:
        mask = cats_a == name
        assert report[name] == compute_metrics(pre[mask], post[mask], k[mask])
    # A NumPy array of categories gives the same report.
    assert compute_report(pre, post, k, cats_a) == report


def test_report_without_categories():
    pre, post, k, _ = random_outcomes(3, 100)
    report = compute_report(pre, post, k)
    assert list(report) == ["overall"]
    assert isinstance(report["overall"], ForgettingMetrics)


def test_to_dict_and_scalars():
    pre, post = transitions(r=700, f=100, nv=200)
    m = compute_metrics(pre, post, np.full(1000, 4))
    d = m.to_dict()
    assert d["forgetting_ci_low"] == m.forgetting_ci[0]
    assert d["backward_transfer_ci_high"] == m.backward_transfer_ci[1]
    assert "forgetting_ci" not in d
    assert all(type(v) in (int, float, bool) for v in d.values())
    assert d["n"] == 1000 and d["adjusted"] is True
    assert m.scalars() == {
        "forgetting": m.forgetting,
        "backward_transfer": m.backward_transfer,
        "forgetting_adjusted": m.forgetting_adjusted,
        "backward_transfer_adjusted": m.backward_transfer_adjusted,
        "accuracy": m.accuracy_post,
        "net_change": m.net_change,
        "invalid_rate": m.invalid_rate_post,
    }
    short = compute_metrics([1, 0], [0, 1], [0, 0])  # short answers only: no chance term, no adjusted values logged
    assert sorted(short.scalars()) == ["accuracy", "backward_transfer", "forgetting", "invalid_rate", "net_change"]


def test_accepts_lists_and_bools():
    m = compute_metrics([True, True, False], [True, False, True], [2, 3, 0])
    assert (m.retained, m.forgotten, m.learned) == (1, 1, 1)


# --- bad inputs ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pre", "post", "k", "match"),
    [
        ([], [], [], "`pre` is empty"),
        ([1, 0, 1], [1, 0], [2, 2, 2], "`post`"),
        ([1, 0, 1], [1, 0, 1], [2, 2], "`num_choices`"),
        ([1, 0, 2, 5], [1, 0, 1, 1], [2, 2, 2, 2], r"`pre`.*index 2"),
        ([1, 0, 1, 1], [1, 0, 1, -2], [2, 2, 2, 2], r"`post`.*index 3"),
        ([1, 0, 1, 1], [1, 0, 1, 1], [2, 0, 1, 1], r"`num_choices`.*index 2"),
        ([1, 0, 1, 1], [1, 0, 1, 1], [2, -3, 4, 4], r"`num_choices`.*index 1"),
        ([1.0, 0.0], [1, 0], [2, 2], "`pre`.*dtype"),
        ([1, 0], [1, 0], [2.0, 2.0], "`num_choices`.*dtype"),
        ([[1, 0]], [[1, 0]], [[2, 2]], "`pre` must be 1-D"),
    ],
)
def test_bad_inputs_raise_naming_the_argument(pre, post, k, match):
    with pytest.raises(ValueError, match=match):
        compute_metrics(pre, post, k)


def test_bad_categories_raise():
    with pytest.raises(ValueError, match="`categories`"):
        compute_report([1, 0], [1, 0], [2, 2], ["a"])
    with pytest.raises(ValueError, match=r"`categories`.*index 1"):
        compute_report([1, 0], [1, 0], [2, 2], ["a", 3])
    with pytest.raises(ValueError, match=r"`categories`.*reserved.*index 1"):
        compute_report([1, 0], [1, 0], [2, 2], ["a", "overall"])


# --- trajectories ----------------------------------------------------------------------------------


def test_forgetting_events_on_hand_made_history():
    history = np.array(
        [
            [1, 1, 0, 1, -1],  # row 0: the base
            [0, 1, 1, -1, 1],
            [1, 1, 0, 1, 1],
            [0, 1, 0, 0, 1],
            [1, 0, 1, 0, 1],
        ],
        dtype=np.int8,
    )
    # probe 0: 1->0 twice; probe 1: once at the end; probe 2: 1->0 once; probe 3: 1->-1 and 1->0;
    # probe 4: never forgotten.
    assert forgetting_events(history).tolist() == [2, 1, 1, 2, 0]
    assert forgetting_events(history[:1]).tolist() == [0, 0, 0, 0, 0]
    assert first_forgotten_index(history[0], history[1:]).tolist() == [0, 3, -1, 0, -1]
    assert first_forgotten_index([1, 1], [[1, 1], [1, 1]]).tolist() == [-1, -1]
    assert first_forgotten_index([1, 0], np.zeros((0, 2), dtype=np.int8)).tolist() == [-1, -1]


def test_trajectory_bad_inputs():
    with pytest.raises(ValueError, match="`history` must be 2-D"):
        forgetting_events([1, 0, 1])
    with pytest.raises(ValueError, match=r"`history`.*\(1, 2\)"):
        forgetting_events([[1, 0, 1], [1, 0, 3]])
    with pytest.raises(ValueError, match="`history` has 3 columns"):
        first_forgotten_index([1, 0], [[1, 0, 1]])


# -- nothing to forget ----------------------------------------------------------------------------------------


def test_nothing_to_forget_multiple_choice_at_or_below_chance():
    # k = 4: 25% right at base is chance, nothing is known; 30% is above it
    assert compute_metrics([1] * 25 + [0] * 75, [0] * 100, [4] * 100).nothing_to_forget
    assert compute_metrics([1] * 20 + [0] * 80, [0] * 100, [4] * 100).nothing_to_forget
    assert not compute_metrics([1] * 30 + [0] * 70, [0] * 100, [4] * 100).nothing_to_forget


def test_nothing_to_forget_short_answers_under_two_and_two_percent():
    assert compute_metrics([0] * 100, [1] * 100, [0] * 100).nothing_to_forget  # only backward transfer can show
    assert compute_metrics([1] + [0] * 99, [0] * 100, [0] * 100).nothing_to_forget  # 1 right: under 2 and 2%
    assert not compute_metrics([1, 1] + [0] * 98, [0] * 100, [0] * 100).nothing_to_forget  # 2 right
    assert not compute_metrics([1] + [0] * 24, [0] * 25, [0] * 25).nothing_to_forget  # 1 of 25 is 4%


def test_nothing_to_forget_per_category_and_mixed():
    pre = [1] * 15 + [0] * 5 + [0] * 10  # k = 2: 75% right at base, above the 50% of guessing
    post = [0] * 30
    k = [2] * 20 + [0] * 10
    cats = ["mcq"] * 20 + ["short"] * 10
    report = compute_report(pre, post, k, cats)
    assert not report["mcq"].nothing_to_forget and report["short"].nothing_to_forget
    # a group holding both kinds has something to forget when either part does
    assert not report["overall"].nothing_to_forget
    assert "nothing_to_forget" in report["overall"].to_dict()
