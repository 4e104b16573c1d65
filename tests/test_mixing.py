"""Replay mixing, the pure parts: closed-loop category weights, the ratio, and a pool disjoint from the monitored probes."""

from __future__ import annotations

import math

import pytest

from forgetwatch.mixing import category_weights, check_pool, check_ratio


def test_closed_loop_weighs_categories_by_forgetting_with_a_floor():
    w = category_weights({"a": 0.3, "b": 0.1, "c": 0.0}, floor=0.3)
    assert sum(w.values()) == pytest.approx(1.0)
    assert w == pytest.approx({"a": 0.1 + 0.7 * 0.75, "b": 0.1 + 0.7 * 0.25, "c": 0.1})
    assert w["a"] > w["b"] > w["c"] > 0  # the category that forgets most gets most; none starves


def test_nothing_forgotten_or_uniform_gives_even_weights():
    even = {"a": 1 / 3, "b": 1 / 3, "c": 1 / 3}
    assert category_weights({"a": 0.0, "b": math.nan, "c": -0.1}) == pytest.approx(even)
    assert category_weights({"a": 0.5, "b": 0.0, "c": 0.0}, strategy="uniform") == pytest.approx(even)
    assert category_weights({"a": 0.2, "b": 0.0}, floor=0.0) == pytest.approx({"a": 1.0, "b": 0.0})


@pytest.mark.parametrize("kwargs,message", [
    ({"strategy": "greedy"}, "`strategy` must be one of closed_loop, uniform"),
    ({"floor": 1.5}, r"`floor` must be in \[0, 1\]"),
])
def test_bad_weight_options(kwargs, message):
    with pytest.raises(ValueError, match=message):
        category_weights({"a": 0.1}, **kwargs)


@pytest.mark.parametrize("ratio", [-0.1, 1.0, 1.5, True, "0.1"])
def test_ratio_outside_zero_one_is_refused(ratio):
    with pytest.raises(ValueError, match=r"must be in \[0, 1\)"):
        check_ratio(ratio)


def test_ratio_inside_is_kept():
    assert check_ratio(0) == 0.0 and check_ratio(0.1) == 0.1


def test_a_pool_overlapping_the_monitored_probes_is_refused_naming_the_ids():
    with pytest.raises(ValueError, match=r"holds 2 monitored probes \(arc/1, arc/7\)"):
        check_pool(["arc/1", "arc/2", "arc/7"], ["arc/7", "arc/1", "arc/9"])
    many = [f"p{i:02d}" for i in range(12)]
    with pytest.raises(ValueError, match="and 2 more"):
        check_pool(many, many)
    check_pool(["arc/2"], ["arc/1"])  # disjoint: fine


def test_a_pool_without_examples_for_a_measured_category_is_refused():
    with pytest.raises(ValueError, match="no example for categories sciq"):
        check_pool(["a"], ["b"], categories={"arc_easy": 40, "sciq": 0}, wanted=["arc_easy", "sciq"])
