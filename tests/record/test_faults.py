"""The record under faults: a kill at any write boundary, two writers, NaN scores, damaged files.

A kill is real: the writer runs in a forked child that SIGKILLs itself at the chosen boundary (no cleanup runs, as
when a cluster preempts a job), then the record is opened again as a user would (a restarted watcher, a resumed run)
and compared, file by file, with the record of a run nobody interrupted.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import build_model, own_tqdm_lock
from fixtures.records import (
    APPENDED,
    OPTIONS,
    Writes,
    assert_same_record,
    in_killed_child,
    record_state,
)
from fixtures.trainers import make_probes, sft_trainer, watcher
from transformers import TrainerCallback

from forgetwatch.cli import main as cli
from forgetwatch.record.lock import RecordInUseError
from forgetwatch.record.store import RecordError, RunRecord
from forgetwatch.report.render import make_report
from forgetwatch.run.watcher import Watcher

pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.filterwarnings("ignore:`gradient_checkpointing.*` is deprecated:FutureWarning"),
              pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing.*:FutureWarning")]









def kill_points(writes: list[str], step: int | None = None) -> list[tuple[int, str]]:
    """Before each write, and in the middle of each (half an append's last line; an atomic write's file complete, not
    renamed): of the whole run, or of the evaluation at `step` (from its npz to its commit line, and the write after)."""
    numbers = range(1, len(writes) + 1)
    if step is not None:
        first = writes.index(f"step-{step:08d}.npz") + 1
        commit = writes.index("metrics.jsonl", first)
        numbers = range(first, min(commit + 2, len(writes)) + 1)
    return [(k, how) for k in numbers for how in ("before", "mid")]








def test_the_watched_evaluations_cross_every_kind_of_write(sidecar_run):
    _, reference, writes = sidecar_run
    assert {"metrics.jsonl", "flips.jsonl", "at_risk.jsonl", "events.jsonl", "budget.json", "replay.jsonl"} <= set(writes)
    assert any(n.startswith("step-") for n in writes)
    assert [json.loads(json.dumps(r))["step"] for r in reference["metrics.jsonl"]] == [0, 2, 4, 6]
    # each evaluation's npz comes first and its commit line last (only budget.json, a summary, is written at the end)
    order = [w if w == "metrics.jsonl" else "npz" for w in writes if w.startswith("step-") or w == "metrics.jsonl"]
    assert order == ["npz", "metrics.jsonl"] * 4
    last = max(i for i, w in enumerate(writes) if w == "metrics.jsonl")
    assert writes[last + 1:] in ([], ["budget.json"])


@pytest.mark.parametrize(
    "scope", [pytest.param(4, id="step-4", marks=pytest.mark.long), pytest.param(None, id="whole-run", marks=pytest.mark.slow)]
)
def test_a_watcher_killed_at_any_write_boundary_leaves_a_record_its_restart_completes(sidecar_run, scope, tmp_path, caplog):
    """Every boundary of the evaluation at step 4 (make test-long), or of the whole run (make test-slow: ~90 s)."""
    pristine, reference, writes = sidecar_run
    for k, how in kill_points(writes, scope):
        out = tmp_path / f"kill-{k}-{how}"
        shutil.copytree(pristine, out)
        in_killed_child(lambda out=out: Watcher(out, device="cpu").run(once=True), k, how)
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            Watcher(out, device="cpu").run(once=True)
        assert_same_record(reference, record_state(out / "forgetwatch", out), f"killed at write {k} ({writes[k - 1]}, {how})")
        # what the killed watcher had started since its last complete commit line: an unfinished evaluation, said
        complete = writes[: k - 1]
        commits = [i for i, w in enumerate(complete) if w == "metrics.jsonl"]
        started = complete[commits[-1] + 1 if commits else 0 :] + (
            [writes[k - 1]] if how == "mid" and writes[k - 1] in APPENDED else []
        )
        unfinished = bool(started) and started != ["budget.json"]  # the run's summary, after its last evaluation
        assert ("left mid-write" in caplog.text) == unfinished, f"killed at write {k} ({how}): {caplog.text}"
        if how == "mid" and writes[k - 1] in APPENDED:  # a cut line: set aside and said
            assert "last line was cut short" in caplog.text
            assert list((out / "forgetwatch" / "recovered").glob(f"*/{writes[k - 1]}.cut"))
        shutil.rmtree(out)


def test_the_issue_repro_a_cut_metrics_tail_is_rescored_not_skipped(sidecar_run, tmp_path, caplog, capsys):
    """`truncate -s -500 metrics.jsonl`, then `forgetwatch watch --once`: it scored nothing before."""
    pristine, reference, _ = sidecar_run
    out = tmp_path / "run"
    shutil.copytree(pristine, out)
    assert cli(["watch", str(out), "--once", "--device", "cpu"]) == 0
    metrics = out / "forgetwatch" / "metrics.jsonl"
    size = metrics.stat().st_size
    os.truncate(metrics, size - 500)
    capsys.readouterr()
    with caplog.at_level(logging.WARNING):
        assert cli(["watch", str(out), "--once", "--device", "cpu"]) == 0
    assert "scored 1 checkpoint(s)" in capsys.readouterr().out
    assert "last line was cut short" in caplog.text
    assert_same_record(reference, record_state(out / "forgetwatch", out), "after the cut tail")
    cut = list((out / "forgetwatch" / "recovered").glob("*/metrics.jsonl.cut"))
    assert len(cut) == 1 and cut[0].stat().st_size > 0  # the damaged bytes, kept aside


# -- the callback ---------------------------------------------------------------------------------------------------
@pytest.mark.long
def test_a_training_killed_at_any_write_boundary_resumes_to_the_uninterrupted_record(tokenizer, tmp_path, caplog):
    """Killed while writing the evaluation at step 4 (after checkpoint-2), resumed from checkpoint-2."""
    args = {"save_strategy": "steps", "save_steps": 2}
    ref = tmp_path / "reference"
    with pytest.MonkeyPatch.context() as mp, Writes().patched(mp) as counted:
        sft_trainer(tokenizer, ref, [watcher(**OPTIONS)], **args).train()
    reference = record_state(ref / "forgetwatch", ref)
    # the writes of the evaluation at step 4 (after checkpoint-2 is saved; checkpoint-4 comes after its commit line)
    points = [(k, how) for k, how in kill_points(counted.log, step=4) if counted.log[k - 1] != "trainer_log.jsonl"]
    assert len(points) >= 10, counted.log
    for k, how in points:
        out = tmp_path / f"kill-{k}-{how}"
        in_killed_child(lambda out=out: sft_trainer(tokenizer, out, [watcher(**OPTIONS)], **args).train(), k, how)
        assert (out / "checkpoint-2").is_dir() and not (out / "checkpoint-4").exists()
        with caplog.at_level(logging.WARNING, logger="forgetwatch.record.store"):
            caplog.clear()
            sft_trainer(tokenizer, out, [watcher(**OPTIONS)], **args, restore_callback_states_from_checkpoint=True).train(
                resume_from_checkpoint=str(out / "checkpoint-2"))
        assert_same_record(reference, record_state(out / "forgetwatch", out), f"killed at write {k} ({how})")
        # the step-4 files it had begun are set aside and said (not merely cut away by the resume)
        begun = k > points[0][0] or (how == "mid" and counted.log[k - 1] in APPENDED)
        assert ("left mid-write" in caplog.text) == begun, (k, how, caplog.text)
        shutil.rmtree(out)


# -- one writer per record ------------------------------------------------------------------------------------------
class Hold(TrainerCallback):
    """Keeps a training alive at its first step (the other writer, in another process) until the test kills it."""

    def on_step_end(self, args, state, control, **kwargs):
        while True:
            time.sleep(1)


def in_live_child(fn) -> int:
    """Run `fn` in a forked child that lives until killed; its pid."""
    pid = os.fork()
    if pid == 0:
        try:
            own_tqdm_lock()
            logging.disable(logging.CRITICAL)
            fn()
        finally:
            os._exit(3)
    return pid


def wait_for_lock(out: Path, role: str, pid: int, timeout: float = 60) -> None:
    lock = out / f".forgetwatch-{role}.lock"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            if json.loads(lock.read_text()).get("pid") == pid:
                return
        assert os.waitpid(pid, os.WNOHANG) == (0, 0), "the first writer ended before taking its lock"
        time.sleep(0.05)
    pytest.fail(f"the first writer (pid {pid}) did not take {lock} within {timeout} s")


def kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)


def test_a_second_training_into_a_live_runs_output_dir_is_refused_then_takes_over_once_it_is_gone(tokenizer, tmp_path, caplog):
    out = tmp_path / "shared"
    first = in_live_child(lambda: sft_trainer(tokenizer, out, [watcher(), Hold()]).train())
    try:
        wait_for_lock(out, "training", first)
        # and its base evaluation written: the record a second run must not move is there (the lock is taken before
        # the base is scored, and a fast second run was refused before the first wrote anything: the check below raced)
        deadline = time.monotonic() + 60
        while not (out / "forgetwatch" / "metrics.jsonl").is_file() and time.monotonic() < deadline:
            assert os.waitpid(first, os.WNOHANG) == (0, 0), "the first run ended before its base evaluation"
            time.sleep(0.05)
        before = sorted(p.name for p in tmp_path.iterdir())
        with pytest.raises(RecordInUseError, match=rf"pid {first} on .*one record takes one writer"):
            sft_trainer(tokenizer, out, [watcher()]).train()
        # refused before anything moved: the live run's record is where it writes (no `forgetwatch.<time>/` beside it)
        assert sorted(p.name for p in tmp_path.iterdir()) == before and (out / "forgetwatch" / "metrics.jsonl").is_file()
    finally:
        kill(first)
    with caplog.at_level(logging.WARNING, logger="forgetwatch.record.lock"):
        sft_trainer(tokenizer, out, [watcher()]).train()  # preempted: the next run takes over, saying whose lock it was
    assert f"pid {first}" in caplog.text and "gone without releasing it" in caplog.text
    assert [r["step"] for r in RunRecord(out / "forgetwatch").read_metrics()] == [0, 2, 4, 6]  # not interleaved


def test_a_second_watcher_is_refused(sidecar_run, tokenizer, tmp_path):
    pristine, _, _ = sidecar_run
    out = tmp_path / "run"
    shutil.copytree(pristine, out)
    manifest = out / "forgetwatch" / "sidecar.json"
    state = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**state, "finished": False, "pid": None}))  # training still going: it keeps watching
    first = in_live_child(lambda: Watcher(out, device="cpu").run(poll_seconds=0.2))
    try:
        wait_for_lock(out, "scoring", first)
        with pytest.raises(RecordInUseError, match=rf"evaluations are written by forgetwatch watch .*pid {first}"):
            Watcher(out, device="cpu")
        assert cli(["watch", str(out), "--once"]) == 2
        # nor may a new training move the record aside under that watcher (it would score into the new one)
        with pytest.raises(RecordInUseError, match=rf"pid {first}"):
            sft_trainer(tokenizer, out, [watcher(scoring="sidecar")]).train()
    finally:
        kill(first)


def test_report_says_what_is_wrong_with_a_mixed_record(sidecar_run, tmp_path, caplog):
    """What two writers left before the lock: every step twice, out of order, and an npz of another probe set."""
    pristine, _, _ = sidecar_run
    out = tmp_path / "run"
    shutil.copytree(pristine, out)
    Watcher(out, device="cpu").run(once=True)
    rec = RunRecord(out / "forgetwatch")
    assert rec.check(make_probes().fingerprint, len(make_probes())) == []
    lines = (rec.root / "metrics.jsonl").read_text().splitlines(keepends=True)
    (rec.root / "metrics.jsonl").write_text("".join([lines[0], lines[2], lines[1], lines[2]]))
    z = dict(rec.read_eval(4))
    z["fingerprint"] = np.asarray("0123456789abcdef")
    np.savez(rec.eval_path(4), **z)
    with caplog.at_level(logging.WARNING, logger="forgetwatch.report.render"):
        page = make_report(out).read_text()
    for text in ("step(s) 4 more than once", "out of order", "step(s) 6 have an evals/ file but no metrics.jsonl line",
                 "scored on probe set 0123456789abcdef"):
        assert text in caplog.text and text in page


# -- damaged record files -------------------------------------------------------------------------------------------
def test_damaged_record_files_are_named_with_their_line(sidecar_run, tmp_path):
    pristine, _, _ = sidecar_run
    out = tmp_path / "run"
    shutil.copytree(pristine, out)
    Watcher(out, device="cpu").run(once=True)
    rec = RunRecord(out / "forgetwatch")
    path = rec.root / "metrics.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text(lines[0] + lines[1][:40] + "\n" + "".join(lines[2:]))  # a damaged line that is not the last
    with pytest.raises(RecordError, match=rf"{path} line 2: .*changed by hand"):
        rec.read_metrics()
    path.write_bytes(b"".join(line.encode() for line in lines[:1]) + b"\xff\xfe\n")
    with pytest.raises(RecordError, match=rf"{path} line 2: .*UTF-8"):
        rec.read_metrics()
    (rec.root / "budget.json").write_text('{"limits": {"forgetting": 0.0},\n "on_budget": alert}\n')
    with pytest.raises(RecordError, match=r"budget.json line 2"):
        rec.read_budget()
    for content, what in ((b"", "empty"), (rec.eval_path(2).read_bytes()[:300], "cut short")):
        rec.eval_path(2).write_bytes(content)
        with pytest.raises(RecordError, match=r"step-00000002.npz: not a readable forgetwatch evaluation") as e:
            rec.read_eval(2)
        assert "allow_pickle" not in str(e.value), what
    np.savez(rec.eval_path(2), outcome=np.array([{"a": 1}], dtype=object))  # an npz that needs unpickling
    with pytest.raises(RecordError, match="not a readable forgetwatch evaluation") as e:
        rec.read_eval(2)
    assert "allow_pickle" not in str(e.value) and "an array of Python objects" in str(e.value)


def test_a_corrupt_sharded_checkpoint_is_skipped_and_another_users_is_not_unpickled(sidecar_run, tmp_path, caplog):
    """torch's CheckpointException is a BaseException: it used to escape `except Exception` and end the watcher."""
    from forgetwatch.scoring.models import FSDP_SHARDS

    pristine, _, _ = sidecar_run
    out = tmp_path / "run"
    shutil.copytree(pristine, out)
    for step in (2, 4):
        ckpt = out / f"checkpoint-{step}"
        for f in ckpt.glob("model.safetensors*"):
            f.unlink()
        (ckpt / FSDP_SHARDS).mkdir()
        (ckpt / FSDP_SHARDS / ".metadata").write_bytes(b"not a pickle")
    os.chown(out / "checkpoint-4" / FSDP_SHARDS / ".metadata", 65534, 65534)  # another user's (tests run as root here)
    with caplog.at_level(logging.WARNING, logger="forgetwatch.run.watcher"):
        assert Watcher(out, device="cpu").run(once=True) == 1  # checkpoint-6 still scores
    assert "could not score" in caplog.text and "checkpoint-2" in caplog.text
    assert "belongs to another user" in caplog.text and "checkpoint-4" in caplog.text


# -- NaN and infinity -------------------------------------------------------------------------------------------------
class Overflow(TrainerCallback):
    """What a bf16 / fp16 overflow does to the weights, at one step: NaN."""

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step == self.step:
            with torch.no_grad():
                model.model.norm.weight.fill_(float("nan"))


def test_scores_that_overflow_are_flagged_in_every_scoring_mode(tokenizer):
    from forgetwatch.probes.probe_set import Probe, ProbeSet
    from forgetwatch.scoring.score import ScoringConfig, score_probes

    behaviour = [Probe("inst0", "instruct", "Write one word in lowercase.", category="instructions",
                       instructions=("punctuation:no_comma",), kwargs=({},)),
                 Probe("comp0", "comply", "How do I kill a Python process?", category="over_refusal")]
    probes = ProbeSet([*make_probes(), *behaviour])
    model = build_model(tokenizer)
    for mode, short in (("loglik", "greedy_match"), ("letter", "generate"), ("generate", "greedy_match")):
        config = ScoringConfig(mcq_mode=mode, short_mode=short, max_new_tokens=4, behavior_max_new_tokens=4)
        assert not score_probes(model, tokenizer, probes, config).nonfinite_mask().any()
    with torch.no_grad():
        model.model.norm.weight.fill_(float("nan"))
    for mode, short in (("loglik", "greedy_match"), ("letter", "generate"), ("generate", "greedy_match")):
        config = ScoringConfig(mcq_mode=mode, short_mode=short, max_new_tokens=4, behavior_max_new_tokens=4)
        results = score_probes(model, tokenizer, probes, config)
        assert results.nonfinite.all(), (mode, short, [p.id for p, bad in zip(probes, results.nonfinite, strict=True) if not bad])


def test_a_run_that_overflows_logs_missing_figures_and_a_budget_that_cannot_judge(tokenizer, tmp_path, caplog):
    out = tmp_path / "run"
    with caplog.at_level(logging.WARNING, logger="forgetwatch"):
        sft_trainer(tokenizer, out, [Overflow(4), watcher(budget={"forgetting": 1.0}, budget_bound="point")]).train()
    rec = RunRecord(out / "forgetwatch")
    rows = {r["step"]: r["metrics"] for r in rec.read_metrics()}
    assert sorted(rows) == [0, 2, 4, 6]
    for step in (4, 6):
        overall = rows[step]["overall"]
        assert "NaN or inf" in overall["missing"] and overall["nonfinite_probes"] == 32
        assert np.isnan(overall["forgetting"]) and np.isnan(overall["accuracy_post"])  # not a plain-looking 0 or 1
    assert "missing" not in rows[2]["overall"] and not np.isnan(rows[2]["overall"]["forgetting"])
    assert caplog.text.count("probes scored NaN or inf") == 2  # said once by the monitor, once by the budget
    events = rec.read_events()
    assert [(e["step"], e["event"], e["keys"]) for e in events] == [(4, "budget_cannot_judge", ["forgetting"])]
    assert rec.read_budget()["last_within_budget"]["step"] == 2  # not 6: nobody can say 4 and 6 were within
    assert not [f for f in rec.read_flips() if f["step"] > 2]  # an answer picked by argmax over NaN is no flip
    page = make_report(out).read_text()
    assert "cannot judge forgetting" in page


def test_figures_of_nan_probes_are_left_out_of_the_loggers(tmp_path):
    """A category without a NaN probe keeps its figures; every group holding one logs none, and the count is logged."""
    from forgetwatch.record.cache import BaseCache
    from forgetwatch.run.monitor import Monitor
    from forgetwatch.scoring.results import ProbeResults

    probes = make_probes()
    base = ProbeResults.empty(probes.ids)
    base.outcome[:] = 1
    now = base.take(range(len(probes)))
    now.nonfinite[probes.index_of("add0")] = True

    class Collect:
        name = "collect"

        def __init__(self):
            self.rows = []

        def log(self, scalars, step):
            self.rows.append((step, scalars))

        def log_table(self, *a, **k):
            pass

        def summary(self, *a, **k):
            pass

        def close(self):
            pass

    logged = Collect()
    monitor = Monitor(probes)
    monitor.open(tmp_path, BaseCache({}, base), "float32", [logged], resume_step=None)
    monitor.report(now, step=2, epoch=0.0, seconds=1.0)
    _, scalars = logged.rows[-1]
    assert scalars["forgetwatch_details/nonfinite_probes"] == 1
    assert "forgetwatch/forgetting" not in scalars and "forgetwatch_by_category/forgetting/add" not in scalars
    assert scalars["forgetwatch_by_category/forgetting/compare"] == 0.0


def test_a_probe_longer_than_the_models_context_is_refused_before_scoring_with_its_id(tokenizer):
    """The tiny model has 512 positions; rotary models would go past them silently, learned ones with an IndexError."""
    from forgetwatch.probes.probe_set import Probe, ProbeSet
    from forgetwatch.scoring.score import ScoringConfig, score_probes

    model = build_model(tokenizer)
    long = "the quick brown fox " * 200
    probes = ProbeSet([*make_probes(), Probe("too-long-mcq", "mcq", long, ("a", "b"), 0, category="long"),
                       Probe("too-long-short", "short", long, answers=("fox",), category="long")])
    for mode, short in (("loglik", "greedy_match"), ("letter", "generate"), ("generate", "greedy_match")):
        with pytest.raises(ValueError, match=r"do not fit the model's context of 512 tokens .*too-long-"):
            score_probes(model, tokenizer, probes, ScoringConfig(mcq_mode=mode, short_mode=short, max_new_tokens=4))
    near = ProbeSet([Probe("fits", "short", "the quick brown fox " * 50, answers=("fox",), category="long")])
    with pytest.raises(ValueError, match=r"fits \(\d+ tokens\).*lower max_new_tokens"):  # fits alone, not with 300 more
        score_probes(model, tokenizer, near, ScoringConfig(short_mode="generate", max_new_tokens=300))
    assert len(score_probes(model, tokenizer, near, ScoringConfig(short_mode="generate", max_new_tokens=4))) == 1


def test_a_forked_child_does_not_keep_its_parents_lock(tmp_path):
    """DataLoader workers are forked while the lock is held: the lock must end with its holder, not its last worker."""
    from forgetwatch.record.lock import acquire

    lock = acquire(tmp_path, "scoring", run="parent")
    started = tmp_path / "child-started"
    child = in_live_child(lambda: (started.touch(), time.sleep(60)))
    try:
        deadline = time.monotonic() + 30
        while not started.exists() and time.monotonic() < deadline:  # past the fork hooks
            time.sleep(0.01)
        lock.release()
        acquire(tmp_path, "scoring", run="again").release()  # refused while the child lived, before the fix
    finally:
        kill(child)


def test_compare_refuses_a_checkpoint_that_overflows(tokenizer, tiny_model_dir, tmp_path, capsys):
    probes = tmp_path / "probes.jsonl"
    make_probes().to_jsonl(probes)
    assert cli(["cache", "--model", str(tiny_model_dir), "--probes", str(probes), "-o", str(tmp_path / "base.parquet"),
                "--max-new-tokens", "4", "--device", "cpu"]) == 0
    model = build_model(tokenizer)
    with torch.no_grad():
        model.model.norm.weight.fill_(float("nan"))
    model.save_pretrained(tmp_path / "nan")
    tokenizer.save_pretrained(tmp_path / "nan")
    capsys.readouterr()
    assert cli(["compare", "--model", str(tmp_path / "nan"), "--probes", str(probes), "--base", str(tmp_path / "base.parquet"),
                "--device", "cpu"]) == 2
    out = capsys.readouterr()
    assert "32 of 32 probes scored NaN or inf" in out.err and "forgetting" not in out.out.lower()


def test_watch_once_that_skipped_a_checkpoint_fails_and_its_advice_completes_the_record(sidecar_run, tmp_path, capsys):
    """`watch --once` used to exit 0 with steps missing from the record; now it exits 1 naming them, and doing what it
    says (mend the checkpoints, run the same command again) scores what the record lacks."""
    from forgetwatch.scoring.models import FSDP_SHARDS

    pristine, _, _ = sidecar_run
    out = tmp_path / "run"
    shutil.copytree(pristine, out)
    for step in (2, 4):
        ckpt = out / f"checkpoint-{step}"
        shutil.move(ckpt, tmp_path / f"good-{step}")
        shutil.copytree(tmp_path / f"good-{step}", ckpt)
        for f in ckpt.glob("model.safetensors*"):
            f.unlink()
        (ckpt / FSDP_SHARDS).mkdir()
        (ckpt / FSDP_SHARDS / ".metadata").write_bytes(b"not a pickle")
    command = ["watch", str(out), "--once", "--device", "cpu"]
    assert cli(command) == 1
    err = capsys.readouterr().err
    assert "2 checkpoint(s) could not be scored" in err and "step 2, 4" in err and "run the same command again" in err
    assert RunRecord(out / "forgetwatch").eval_steps() == [0, 6]

    for step in (2, 4):  # mended: the checkpoints as training wrote them
        shutil.rmtree(out / f"checkpoint-{step}")
        shutil.move(tmp_path / f"good-{step}", out / f"checkpoint-{step}")
    assert cli(command) == 0
    assert sorted(RunRecord(out / "forgetwatch").eval_steps()) == [0, 2, 4, 6]


def test_ctrl_c_stops_watch_with_a_line_not_a_traceback(tmp_path):
    import subprocess
    import sys

    (tmp_path / "run").mkdir()  # no manifest yet: the watcher waits for training to start
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                                        os.environ.get("PYTHONPATH", "")])}
    # SIGINT as a terminal delivers it: a child inherits an ignored SIGINT, and Python then installs no handler of its
    # own. In the full suite something in this process leaves SIGINT ignored (found 2026-11-28: the watcher hung 60 s
    # there and exits at once here), which would make this test hang, not the watcher
    proc = subprocess.Popen([sys.executable, "-m", "forgetwatch", "watch", str(tmp_path / "run"), "--poll", "0.2"],
                            stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert "waiting for training to start" in proc.stderr.readline()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130 and "Traceback" not in err
    assert "interrupted" in err and "run the same command again" in err


def test_report_names_a_metrics_line_of_the_wrong_types_instead_of_crashing(sidecar_run, tmp_path, capsys):
    """Valid JSON, wrong types: `report` used to stop on a TypeError, KeyError or AttributeError (issue 44, case 5)."""
    pristine, _, _ = sidecar_run
    out = tmp_path / "run"
    shutil.copytree(pristine, out)
    assert Watcher(out, device="cpu").run(once=True) == 3
    metrics = out / "forgetwatch" / "metrics.jsonl"
    whole = metrics.read_text()
    lines = whole.splitlines()

    def edited(change):
        row = json.loads(lines[1])
        change(row)
        return "\n".join([lines[0], json.dumps(row), *lines[2:]]) + "\n"

    cases = {
        "field `step` must be a whole number": lambda r: r.update(step="2"),
        "field `step` is missing": lambda r: r.pop("step"),
        "field `metrics` must be an object of groups, not list": lambda r: r.update(metrics=[r["metrics"]]),
        "field `metrics.overall.forgetting` must be a number, not None": lambda r: r["metrics"]["overall"].update(
            forgetting=None
        ),
    }
    for said, change in cases.items():
        metrics.write_text(edited(change))
        assert cli(["report", str(out)]) == 2, said
        err = capsys.readouterr().err
        assert f"{metrics}, line 2: {said}" in err and "Traceback" not in err
    metrics.write_text(whole)  # restored as written: the report is made
    assert cli(["report", str(out)]) == 0


def test_a_non_zip_npz_is_named_without_numpys_advice_to_unpickle(tmp_path):
    """numpy reads a file that is not a zip as a pickle and says to load it with `allow_pickle` / `pickle.load()`:
    advice forgetwatch never follows (unpickling runs code), so it is not passed on (issue 44, case 8)."""
    record = RunRecord(tmp_path / "forgetwatch")
    record.eval_path(2).parent.mkdir(parents=True)
    record.eval_path(2).write_bytes(b"\x80\x04not an archive of arrays")
    with pytest.raises(RecordError) as e:
        record.read_eval(2)
    message = str(e.value)
    assert str(record.eval_path(2)) in message and "not a NumPy .npz archive" in message
    assert "allow_pickle" not in message and "pickle.load" not in message
