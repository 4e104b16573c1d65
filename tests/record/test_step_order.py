"""Steps in order, always (issue 44, cases 1 and 2): a checkpoint scored late is inserted in step order, crash-safe,
told truthfully to the loggers; `watch --rescore STEP`, the advice of a damaged evaluation file, gives back a whole
record.

Each record is compared, file by file, with the one an uninterrupted watcher wrote for the same checkpoints
(`watched`: tests/record/test_faults.py's `sidecar_run`).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from fixtures.records import APPENDED, Writes, assert_same_record, in_killed_child, record_state

from forgetwatch.cli import main as cli
from forgetwatch.record.store import RunRecord
from forgetwatch.report.render import summarize_run
from forgetwatch.run.watcher import Watcher
from forgetwatch.scoring.models import FSDP_SHARDS

pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.filterwarnings("ignore:`gradient_checkpointing.*` is deprecated:FutureWarning"),
              pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing.*:FutureWarning")]

WATCH = ["--once", "--device", "cpu"]


def damage_checkpoint(out: Path, step: int, keep: Path) -> None:
    """checkpoint-`step` as a sharded checkpoint whose `.metadata` is no pickle (it fails to load); the good one kept."""
    ckpt = out / f"checkpoint-{step}"
    shutil.copytree(ckpt, keep)
    for f in ckpt.glob("model.safetensors*"):
        f.unlink()
    (ckpt / FSDP_SHARDS).mkdir()
    (ckpt / FSDP_SHARDS / ".metadata").write_bytes(b"not a pickle")


def mend_checkpoint(out: Path, step: int, keep: Path) -> None:
    shutil.rmtree(out / f"checkpoint-{step}")
    shutil.copytree(keep, out / f"checkpoint-{step}")


def steps_of(out: Path) -> list:
    return [json.loads(line)["step"] for line in (out / "forgetwatch" / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def watched(request):
    """tests/record/test_faults.py's `sidecar_run`: checkpoints 2, 4, 6 of a finished sidecar run, the record an uninterrupted
    watcher wrote for them, and its writes."""
    return request.getfixturevalue("sidecar_run")


@pytest.fixture(scope="module")
def skipped_4(watched, tmp_path_factory):
    """The sidecar run after a watcher that could not load checkpoint-4 (steps 0, 2, 6 scored), checkpoint-4 mended
    since; and the writes of the `watch --once` that scores it late."""
    pristine, _, _ = watched
    root = tmp_path_factory.mktemp("order")
    out = root / "skipped"
    shutil.copytree(pristine, out)
    damage_checkpoint(out, 4, root / "good-4")
    assert Watcher(out, device="cpu").run(once=True) == 2
    assert steps_of(out) == [0, 2, 6]
    mend_checkpoint(out, 4, root / "good-4")
    counted = root / "counted"
    shutil.copytree(out, counted)
    with pytest.MonkeyPatch.context() as mp, Writes().patched(mp) as writes:
        assert Watcher(counted, device="cpu").run(once=True) == 1
    return out, writes.log


# -- case 1: a late step lands in order ------------------------------------------------------------------------------
def test_a_checkpoint_scored_late_is_inserted_in_step_order_and_logged_truthfully(watched, tmp_path, capsys, caplog,
                                                                                    offline_wandb):
    """Skip then rescore: checkpoint-4 fails to load, is mended, and `watch --once` scores it after step 6 was
    committed. Before: metrics.jsonl read 0, 2, 6, 4, step 4's flips were against step 6, and `report` blamed two runs."""
    from fixtures.wandb_offline import find_run_file, finish_offline_run, read_history, read_tables

    pristine, reference, _ = watched
    out = tmp_path / "run"
    shutil.copytree(pristine, out)
    damage_checkpoint(out, 4, tmp_path / "good-4")
    assert cli(["watch", str(out), *WATCH]) == 1
    mend_checkpoint(out, 4, tmp_path / "good-4")
    capsys.readouterr()
    with caplog.at_level(logging.WARNING):
        assert cli(["watch", str(out), *WATCH, "--report-to", "wandb"]) == 0
    finish_offline_run()
    assert steps_of(out) == [0, 2, 4, 6]
    # the record an uninterrupted watcher wrote, file by file: flips of 4 against 2, of 6 against 4, budget, replay
    assert_same_record(reference, record_state(out / "forgetwatch", out), "after step 4 was scored late")
    said = capsys.readouterr().out
    assert "forgetwatch watch step 4:" in said and "(scored late, after step 6: inserted in step order)" in said
    assert "step 4 was scored late" in caplog.text and "forgetwatch_details/late_evaluations at step 6" in caplog.text
    assert RunRecord(out / "forgetwatch").check() == []
    assert "at steps 0, 2, 4, 6" in summarize_run(out)
    # W&B keeps rows in the order logged: step 4 comes as a row of a table, at step 6, with its figures
    run_file = find_run_file(offline_wandb)
    (late,) = read_tables(run_file)["forgetwatch_details/late_evaluations"]
    line = next(r for r in RunRecord(out / "forgetwatch").read_metrics() if r["step"] == 4)
    assert len(late) == 1 and (late[0]["step"], late[0]["scored_after_step"]) == (4, 6)
    assert late[0]["forgetwatch/forgetting"] == pytest.approx(line["metrics"]["overall"]["forgetting"])
    assert [r["train/global_step"] for r in read_history(run_file) if "forgetwatch_details/late_evaluations" in r] == [6]
    assert not [r for r in read_history(run_file) if r.get("train/global_step") == 4]  # never a row W&B would drop


def test_a_metrics_line_set_aside_is_rescored_in_step_order(watched, tmp_path, caplog):
    """`"step": "2"` written into metrics.jsonl by hand: recover sets the line aside, the watcher scores checkpoint-2
    again, and it lands between 0 and 4 (it was appended after 6, with its flips against 6)."""
    pristine, reference, _ = watched
    out = tmp_path / "run"
    shutil.copytree(pristine, out)
    assert Watcher(out, device="cpu").run(once=True) == 3
    metrics = out / "forgetwatch" / "metrics.jsonl"
    lines = metrics.read_text().splitlines()
    row = json.loads(lines[1])
    assert row["step"] == 2
    metrics.write_text("\n".join([lines[0], json.dumps({**row, "step": "2"}), *lines[2:]]) + "\n")
    with caplog.at_level(logging.WARNING):
        assert Watcher(out, device="cpu").run(once=True) == 1
    assert "were not finished" in caplog.text
    assert steps_of(out) == [0, 2, 4, 6]
    assert_same_record(reference, record_state(out / "forgetwatch", out), "after the set-aside line was rescored")
    kept = [
        json.loads(x) for p in (out / "forgetwatch" / "recovered").glob("*/metrics.jsonl") for x in p.read_text().splitlines()
    ]
    assert [r["step"] for r in kept] == ["2"]  # the changed line, kept


# make test: a kill before the npz (the marker written), before the first file rewritten, before the commit line;
# make test-slow: before and in the middle of every write of the rescoring run from the marker on (~35 s)
KEY_WRITES = ("step-00000004.npz", "flips.jsonl", "metrics.jsonl")


@pytest.mark.parametrize("scope", [pytest.param("key", id="before-key-writes"),
                                   pytest.param("all", id="every-write", marks=pytest.mark.slow)])
def test_a_watcher_killed_while_inserting_a_late_step_leaves_a_record_its_restart_completes(watched, skipped_4, scope,
                                                                                            tmp_path):
    """A kill at the writes of the late insertion of step 4 (its marker, npz, flips, at-risk rows, replay, events,
    budget, commit line, and the writes after), then `watch --once` again: the uninterrupted run's record, and no
    marker left. A kill in the middle: an append's last line half written, an atomic write's temporary complete and
    not renamed."""
    _, reference, _ = watched
    skipped, writes = skipped_4
    first = writes.index("reordering.json") + 1
    assert writes[first - 1:first + 2] == ["reordering.json", "step-00000004.npz", "flips.jsonl"]
    if scope == "key":
        points = [(writes.index(name, first - 1) + 1, "before") for name in KEY_WRITES]
    else:
        points = [(k, how) for k in range(first, len(writes) + 1) for how in ("before", "mid")]
    for k, how in points:
        out = tmp_path / f"kill-{k}-{how}"
        shutil.copytree(skipped, out)
        in_killed_child(lambda out=out: Watcher(out, device="cpu").run(once=True), k, how)
        Watcher(out, device="cpu").run(once=True)
        what = f"killed {how} write {k} ({writes[k - 1]}{', an append' if writes[k - 1] in APPENDED else ''})"
        assert_same_record(reference, record_state(out / "forgetwatch", out), what)
        assert not (out / "forgetwatch" / "reordering.json").exists(), what
        shutil.rmtree(out)


def test_a_record_an_earlier_version_wrote_out_of_order_is_read_and_put_in_order(watched, tmp_path, caplog):
    """What today's main wrote for a late step (0, 2, 6, 4; step 4's flips against 6, step 6's against 2): `report`
    reads it in step order without blaming two runs, and the next watcher recomputes it into the in-order record."""
    pristine, reference, _ = watched
    out = tmp_path / "run"
    shutil.copytree(pristine, out)
    assert Watcher(out, device="cpu").run(once=True) == 3
    root = out / "forgetwatch"
    for name in ("metrics.jsonl", "flips.jsonl", "at_risk.jsonl"):  # step 4's rows after step 6's
        rows = (root / name).read_text().splitlines(keepends=True)
        (root / name).write_text("".join([r for r in rows if json.loads(r)["step"] != 4] +
                                         [r for r in rows if json.loads(r)["step"] == 4]))
    with (root / "flips.jsonl").open("a") as f:  # a wrong row such as the old order made
        f.write(json.dumps({"step": 4, "id": "add0", "direction": "1→0"}) + "\n")
    assert steps_of(out) == [0, 2, 6, 4]
    assert RunRecord(root).check() == []
    assert "at steps 0, 2, 4, 6" in summarize_run(out)
    with caplog.at_level(logging.WARNING):
        assert Watcher(out, device="cpu").run(once=True) == 0
    assert "held steps scored out of order" in caplog.text
    assert_same_record(reference, record_state(root, out), "after the watcher put the record in order")


def test_report_still_says_two_runs_wrote_where_a_step_is_there_twice(watched, tmp_path):
    pristine, _, _ = watched
    out = tmp_path / "run"
    shutil.copytree(pristine, out)
    assert Watcher(out, device="cpu").run(once=True) == 3
    metrics = out / "forgetwatch" / "metrics.jsonl"
    lines = metrics.read_text().splitlines(keepends=True)
    metrics.write_text("".join([lines[0], lines[2], lines[1], lines[2]]))
    problems = RunRecord(out / "forgetwatch").check()
    assert any("step(s) 4 more than once" in p for p in problems)
    assert any("out of order with steps repeated" in p and "two runs" in p for p in problems)


# -- case 2: the damaged-npz advice, followed ------------------------------------------------------------------------
def test_a_damaged_evaluation_file_is_scored_again_by_the_command_its_message_gives(watched, tmp_path, capsys, caplog):
    """The message used to say "move it away and score that step again": `watch --once` then scored nothing, and the
    step's per-probe data was gone. Now it gives `forgetwatch watch OUT --rescore 4`, run here as written."""
    pristine, reference, _ = watched
    out = tmp_path / "run"
    shutil.copytree(pristine, out)
    assert Watcher(out, device="cpu").run(once=True) == 3
    rec = RunRecord(out / "forgetwatch")
    damaged = rec.eval_path(4).read_bytes()[:300]  # cut short
    rec.eval_path(4).write_bytes(damaged)
    capsys.readouterr()
    # the report is written without the damaged step's per-probe views, and says what to run
    assert cli(["report", str(out)]) == 0
    err = capsys.readouterr().err + caplog.text
    commands = set(re.findall(r"`(forgetwatch watch [^`]+)`", err))
    assert commands == {f"forgetwatch watch {out} --rescore 4"}, err
    assert cli(shlex.split(commands.pop())[1:]) == 0  # as the user types it (the device: the default)
    assert "scored 1 checkpoint(s)" in capsys.readouterr().out
    assert_same_record(reference, record_state(rec.root, out), "after --rescore 4")  # the same figures as before
    (aside,) = (rec.root / "superseded").glob("rescore-step-4-*")
    assert (aside / "evals" / rec.eval_path(4).name).read_bytes() == damaged  # the damaged file, kept
    assert [json.loads(x)["step"] for x in (aside / "metrics.jsonl").read_text().splitlines()] == [4]
    assert cli(["report", str(out)]) == 0


def test_rescore_without_the_checkpoint_is_refused_touching_nothing_and_the_other_way_on_works(watched, tmp_path,
                                                                                              capsys, caplog):
    pristine, _, _ = watched
    out = tmp_path / "run"
    shutil.copytree(pristine, out)
    assert Watcher(out, device="cpu").run(once=True) == 3
    rec = RunRecord(out / "forgetwatch")
    rec.eval_path(4).write_bytes(b"")
    shutil.rmtree(out / "checkpoint-4")  # save_total_limit took it
    before = {p: p.read_bytes() for p in rec.root.rglob("*") if p.is_file()}
    capsys.readouterr()
    assert cli(["watch", str(out), "--rescore", "4", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert f"{out / 'checkpoint-4'} is not there" in err and "the record keeps step 4 as it is" in err
    assert {p: p.read_bytes() for p in rec.root.rglob("*") if p.is_file()} == before
    # the message of the damaged file, now without a checkpoint to score: its other way on, followed as written
    caplog.clear()
    assert cli(["report", str(out)]) == 0  # written without the step's per-probe views, saying what to do
    err = capsys.readouterr().err + caplog.text
    assert "--rescore" not in err and f"{out / 'checkpoint-4'} is not there" in err
    (command,) = set(re.findall(r"`(mkdir [^`]+)`", err))
    subprocess.run(["bash", "-c", command], check=True)  # as the user types it
    assert cli(["report", str(out)]) == 0
    page = (rec.root / "report" / "report.html").read_text()
    assert "step(s) 4 have a metrics.jsonl line but no evals/ file" in page
    assert (rec.root / "recovered" / rec.eval_path(4).name).is_file()
    assert [r["step"] for r in rec.read_metrics()] == [0, 2, 4, 6]  # its figures kept


def _watched_copy(watched, tmp_path) -> tuple[Path, RunRecord, dict[Path, bytes]]:
    """A copy of the watched run, its record, and the record's files as bytes (to show a refusal changed nothing)."""
    out = tmp_path / "run"
    shutil.copytree(watched[0], out)
    assert Watcher(out, device="cpu").run(once=True) == 3
    rec = RunRecord(out / "forgetwatch")
    return out, rec, {p: p.read_bytes() for p in rec.root.rglob("*") if p.is_file()}



@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here: the engine can run")
def test_rescore_with_an_engine_that_cannot_run_is_refused_before_the_step_is_set_aside(watched, tmp_path, capsys):
    """`--rescore 4 --engine vllm` where vLLM is not installed used to move step 4 aside and only then refuse: the
    record went on without it (step 6's flips against step 2). Now it is refused first, the record untouched."""
    out, rec, before = _watched_copy(watched, tmp_path)
    capsys.readouterr()
    assert cli(["watch", str(out), "--rescore", "4", "--engine", "vllm", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "vLLM is not installed here" in err and "Traceback" not in err
    assert {p: p.read_bytes() for p in rec.root.rglob("*") if p.is_file()} == before
    assert not (rec.root / "superseded").exists()


def test_rescore_with_an_engine_that_cannot_autocast_is_refused_before_the_step_is_set_aside(watched, tmp_path, capsys,
                                                                                               monkeypatch):
    """The same with vLLM installed: a run trained under autocast cannot be scored by it, and that is said first."""
    import forgetwatch.scoring.engines as engines

    out, rec, before = _watched_copy(watched, tmp_path)
    monkeypatch.setitem(engines.ENGINES, "vllm", engines.ENGINES["vllm"].__class__(
        **{**engines.ENGINES["vllm"].__dict__, "unavailable": None}))  # as where vLLM is installed
    capsys.readouterr()
    assert cli(["watch", str(out), "--rescore", "4", "--engine", "vllm", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "cannot autocast" in err and "Traceback" not in err
    assert {p: p.read_bytes() for p in rec.root.rglob("*") if p.is_file()} == before


@pytest.mark.parametrize(("step", "said"), [
    ("3", "the record has no evaluation at step 3 (its evaluations: 0, 2, 4, 6)"),  # a checkpoint-3 exists
    ("0", "0 is the base's evaluation (the base cache), which is never scored again"),
    ("-1", "-1: a step is a whole number of at least 1"),
    ("x", "'x': a step is a whole number"),
])
def test_rescore_of_a_step_that_is_no_training_evaluation_is_refused_by_what_it_is(step, said, watched, tmp_path, capsys):
    """`--rescore 3` used to say "the record keeps step 3 as it is", `-1` to look for `checkpoint--1`, and `0` to advise
    moving the base evaluation's file away."""
    out, rec, before = _watched_copy(watched, tmp_path)
    shutil.copytree(out / "checkpoint-2", out / "checkpoint-3")  # a checkpoint the trainer saved off the eval grid
    capsys.readouterr()
    try:
        code = cli(["watch", str(out), "--rescore", step, "--device", "cpu"])
    except SystemExit as e:  # argparse's refusal of the value itself
        code = e.code
    assert code == 2
    err = capsys.readouterr().err
    assert said in err and "Traceback" not in err and "checkpoint--1" not in err, err
    assert {p: p.read_bytes() for p in rec.root.rglob("*") if p.is_file()} == before


def test_a_rescore_asked_for_is_not_reported_as_a_kill(watched, tmp_path, capsys, caplog):
    """A valid `--rescore 4` used to warn that the record "was left in the middle of inserting a step scored late
    (a kill?)": the marker it writes itself was read as a crash's."""
    pristine, reference, _ = watched
    out = tmp_path / "run"
    shutil.copytree(pristine, out)
    assert Watcher(out, device="cpu").run(once=True) == 3
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="forgetwatch"):
        assert cli(["watch", str(out), "--rescore", "4", "--device", "cpu"]) == 0
    assert "a kill?" not in caplog.text and "step 4 was set aside to be scored again" in caplog.text
    assert_same_record(reference, record_state(RunRecord(out / "forgetwatch").root, out), "after --rescore 4")
