"""Replay mixing, the pure parts: closed-loop category weights, the ratio, and a pool disjoint from the monitored probes."""

from __future__ import annotations

import itertools
import json
import math

import pytest

from forgetwatch.remedies.mixing import ReplayMixer, category_weights, check_pool, check_ratio


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


# -- the stream ------------------------------------------------------------------------------------------------

def _mixer(ratio=0.25, seed=0, strategy="closed_loop", n_train=10):
    train = [{"text": f"t{i}"} for i in range(n_train)]
    pool = {c: [{"text": f"{c}{i}"} for i in range(5)] for c in ("a", "b", "c")}
    return ReplayMixer(train, pool, ratio, strategy=strategy, seed=seed)


@pytest.mark.parametrize("ratio", [0.1, 0.25, 1 / 3])
@pytest.mark.parametrize("slice_size,world_size", [(1, 1), (4, 1), (2, 2), (3, 4)])
def test_every_rank_gets_its_share_on_every_prefix(ratio, slice_size, world_size):
    mixer = _mixer(ratio)
    mixer.set_layout(slice_size, world_size)
    rows = [mixer.is_replay(n) for n in range(600)]
    for rank in range(world_size):
        mine = [r for n, r in enumerate(rows) if (n // slice_size) % world_size == rank]
        for m in range(1, len(mine) + 1):
            assert abs(sum(mine[:m]) - ratio * m) < 1  # within one example at every point of the run


def test_training_examples_go_round_once_per_epoch_in_a_seeded_order():
    rows = [r["text"] for r in itertools.islice(_mixer(ratio=0.0).rows(), 30)]
    assert sorted(rows[:10]) == sorted(rows[10:20]) == sorted(f"t{i}" for i in range(10))
    assert rows[:10] != rows[10:20]  # reshuffled each epoch
    again = [r["text"] for r in itertools.islice(_mixer(ratio=0.0).rows(), 30)]
    other = [r["text"] for r in itertools.islice(_mixer(ratio=0.0, seed=1).rows(), 30)]
    assert again == rows and other != rows


def test_a_stream_read_again_is_the_same_stream_across_weight_switches():
    mixer = _mixer()
    first = []
    for n, row in enumerate(mixer.rows()):
        first.append(row["text"])
        if n == 20:
            mixer.publish(10, {"a": 0.5, "b": 0.0, "c": 0.0})
        if n == 60:
            mixer.publish(20, {"a": 0.0, "b": 0.0, "c": 0.4})
        if n == 99:
            break
    assert [s for _, s, _ in mixer.schedule] == [10, 20]
    again = [r["text"] for r in itertools.islice(mixer.rows(), 100)]  # e.g. a resume reading what it skips
    assert again == first
    restored = _mixer()
    restored.restore(json.loads(json.dumps([list(e) for e in mixer.schedule])))  # what the record keeps
    assert [r["text"] for r in itertools.islice(restored.rows(), 100)] == first
    upto = _mixer()
    upto.restore(mixer.schedule, upto_step=10)  # a resume from step 10 keeps the switch of step 10 only
    assert [s for _, s, _ in upto.schedule] == [10]
    assert [r["text"] for r in itertools.islice(upto.rows(), 60)] == first[:60]


def test_closed_loop_shifts_draws_toward_the_category_that_forgets():
    mixer = _mixer(ratio=0.5)
    rows = mixer.rows()
    before = [r["text"][0] for r in itertools.islice(rows, 400) if not r["text"].startswith("t")]
    assert all(abs(before.count(c) / len(before) - 1 / 3) < 0.08 for c in "abc")  # nothing forgotten yet: uniform
    mixer.publish(10, {"a": 0.0, "b": 0.3, "c": 0.0})
    assert mixer.schedule[-1][:2] == (400, 10)  # from the position after the last one read
    after = [r["text"][0] for r in itertools.islice(rows, 400) if not r["text"].startswith("t")]
    # b: 0.1 / 3 + 0.9 of the draws
    assert after.count("b") / len(after) == pytest.approx(0.1 / 3 + 0.9, abs=0.05)
    uniform = _mixer(ratio=0.5, strategy="uniform")
    uniform.publish(10, {"a": 0.0, "b": 0.3, "c": 0.0})
    assert uniform.weights == pytest.approx({"a": 1 / 3, "b": 1 / 3, "c": 1 / 3}) and uniform.schedule == []
