"""`rewound/` and `rewind.json` committed together (forgetwatch/remedies/rewound.py): a rewind stopped at any step of
its commit leaves a state the next start mends into one where the model and the decision agree, the model whole, and
nothing left over. A stop is an exception raised at the n-th file operation: the commit catches nothing, so the disk
is left exactly as a kill there would leave it. The end-to-end rewinds are in test_rewind.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from forgetwatch.remedies import rewound as module
from forgetwatch.remedies.rewind import read_rewind
from forgetwatch.remedies.rewound import DECISION, REWIND_FILE, REWOUND, commit, discard, reconcile, staging


class Killed(BaseException):
    pass


def _decision(alpha, saved=True, out=None) -> dict:
    front = [{"alpha": a} for a in sorted({alpha, 1.0})]
    return {"format": 1, "pick": {"alpha": alpha}, "rewound": str(out) if saved else None, "front": front,
            "alphas": [p["alpha"] for p in front]}


def _model(directory: Path, alpha: float) -> Path:
    directory.mkdir(parents=True)
    (directory / "model.safetensors").write_text(f"weights at {alpha}")
    (directory / "config.json").write_text("{}")
    return directory


def _saved(out: Path, alpha: float) -> None:
    """A run with a saved rewind at `alpha`, committed."""
    (out / "forgetwatch").mkdir(parents=True, exist_ok=True)
    commit(out, _model(staging(out), alpha), _decision(alpha, out=out / REWOUND))


def _state(out: Path) -> tuple[str | None, float | None, list[str]]:
    """(the weights in rewound/, the α the record's rewind.json says, what else lies in the output dir)."""
    weights = out / REWOUND / "model.safetensors"
    record = out / "forgetwatch" / REWIND_FILE
    said = json.loads(record.read_text()) if record.is_file() else None
    if said is not None and (out / REWOUND / DECISION).is_file():
        assert (out / REWOUND / DECISION).read_text() == record.read_text()
    return (weights.read_text() if weights.is_file() else None, said and said["pick"]["alpha"],
            sorted(p.name for p in out.iterdir() if p.name not in (REWOUND, "forgetwatch")))


def _stop_at(monkeypatch, n: int) -> list[str]:
    """Raise `Killed` at the n-th file operation of the commit (renames, writes, removals); returns the log."""
    log: list[str] = []

    def counted(name, real):
        def op(*args, **kwargs):
            log.append(name)
            if len(log) == n:
                raise Killed(name)
            return real(*args, **kwargs)
        return op

    monkeypatch.setattr(module, "_write", counted("write", module._write))
    monkeypatch.setattr(Path, "rename", counted("rename", Path.rename))
    monkeypatch.setattr(module.shutil, "rmtree", counted("rmtree", shutil.rmtree))
    return log


@pytest.mark.parametrize("n", range(1, 6))
def test_a_rewind_stopped_anywhere_in_its_commit_leaves_one_model_and_its_decision(n, tmp_path, monkeypatch):
    out = tmp_path / "out"
    _saved(out, 1.0)
    staged = _model(staging(out), 0.5)
    with monkeypatch.context() as mp:
        log = _stop_at(mp, n)
        try:
            commit(out, staged, _decision(0.5, out=out / REWOUND))
        except Killed:
            pass
    assert len(log) >= min(n, 5)  # write decision, rename aside, rename in, write record, remove aside
    reconcile(out)
    weights, alpha, rest = _state(out)
    assert (weights, alpha) in {("weights at 1.0", 1.0), ("weights at 0.5", 0.5)}, (n, log)
    assert rest == [], rest  # nothing left over
    if n >= 4:  # stopped after the rename in (op 3): the new rewind stands
        assert alpha == 0.5


def test_before_the_record_is_mended_the_report_reads_the_models_own_decision(tmp_path, monkeypatch):
    out = tmp_path / "out"
    _saved(out, 1.0)
    with monkeypatch.context() as mp:
        _stop_at(mp, 4)  # after the rename in, before the record's copy
        with pytest.raises(Killed):
            commit(out, _model(staging(out), 0.5), _decision(0.5, out=out / REWOUND))
    assert json.loads((out / "forgetwatch" / REWIND_FILE).read_text())["pick"]["alpha"] == 1.0  # stale
    assert read_rewind(out).alpha == 0.5  # what rewound/ holds
    assert reconcile(out) and read_rewind(out).path == out / "forgetwatch" / REWIND_FILE


@pytest.mark.parametrize("n", range(1, 4))
def test_a_rewind_that_saves_nothing_removes_the_model_with_its_decision_or_keeps_both(n, tmp_path, monkeypatch):
    out = tmp_path / "out"
    _saved(out, 0.5)
    with monkeypatch.context() as mp:
        _stop_at(mp, n)  # rename aside, write record, remove aside
        try:
            discard(out, _decision(1.0, saved=False))
        except Killed:
            pass
    reconcile(out)
    weights, alpha, rest = _state(out)
    assert (weights, alpha) in {("weights at 0.5", 0.5), (None, 1.0)} and rest == [], (n, weights, alpha, rest)


def test_unfinished_folders_of_a_stopped_rewind_are_removed_at_the_next_start(tmp_path):
    out = tmp_path / "out"
    _saved(out, 1.0)
    _model(out / f".{REWOUND}.tmp-99999", 0.5)  # a rewind killed while writing its model
    notes = reconcile(out)
    assert any("unfinished" in note for note in notes) and _state(out) == ("weights at 1.0", 1.0, [])
