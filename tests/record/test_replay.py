"""ReplayTracker (incremental) against the vectorised definitions in forgetwatch.measures.metrics."""

from __future__ import annotations

import json

import numpy as np
import pytest

from forgetwatch.measures.metrics import first_forgotten_index, forgetting_events
from forgetwatch.probes.probe_set import Probe
from forgetwatch.record.replay import ReplayTracker, replay_examples


def _probes(n: int) -> list[Probe]:
    return [Probe(f"p{i}", "mcq", f"q{i}?", ("a", "b", "c"), gold=i % 3) if i % 4 else
            Probe(f"p{i}", "short", f"q{i}?", answers=(str(i), f"#{i}"), numeric=False) for i in range(n)]


@pytest.mark.parametrize("seed", range(5))
def test_tracker_matches_the_whole_history_definitions(seed):
    """Fed one evaluation at a time, the tracker gives what the matrix definitions give on the whole history."""
    rng = np.random.default_rng(seed)
    n, evals = 300, 12
    probes = _probes(n)
    base = rng.choice([1, 0, -1], size=n, p=[0.6, 0.3, 0.1]).astype(np.int8)
    history = rng.choice([1, 0, -1], size=(evals, n), p=[0.5, 0.4, 0.1]).astype(np.int8)
    steps = [10 * (e + 1) for e in range(evals)]

    tracker = ReplayTracker(probes, base)
    for e, (step, outcome) in enumerate(zip(steps, history, strict=True)):
        tracker.update(step, outcome)
        seen = history[: e + 1]
        first = first_forgotten_index(base, seen)
        events = forgetting_events(np.vstack([base[None], seen]))
        got = tracker.examples()
        assert [ex["id"] for ex in got] == [probes[i].id for i in np.flatnonzero(first >= 0)]
        for ex in got:
            i = int(ex["id"][1:])
            assert ex["first_forgotten_step"] == steps[first[i]]
            assert ex["forgetting_events"] == events[i]
            assert ex["recovered"] == (outcome[i] == 1)
        assert [json.loads(line) for line in tracker.lines()] == got
    assert replay_examples(probes, base, steps, history) == tracker.examples()
    assert 0 < len(tracker.examples()) < n


def test_examples_handed_out_keep_their_values():
    p = Probe("q", "short", "Capital of France?", answers=("Paris",))
    tracker = ReplayTracker([p], np.array([1]))
    tracker.update(5, np.array([0]))
    before = tracker.examples()[0]
    tracker.update(10, np.array([1]))
    assert (before["recovered"], tracker.examples()[0]["recovered"]) == (False, True)
    assert before["messages"][1]["content"] == "Paris" and before["solution"] == ["Paris"]


def test_outcome_of_the_wrong_length_names_the_shape():
    tracker = ReplayTracker(_probes(3), np.array([1, 1, 0]))
    with pytest.raises(ValueError, match=r"shape \(2,\), expected \(3,\)"):
        tracker.update(1, np.array([1, 0]))
    with pytest.raises(ValueError, match="`steps` has 1 entries but `history` has 2 rows"):
        replay_examples(_probes(3), np.array([1, 1, 0]), [5], np.ones((2, 3), np.int8))
