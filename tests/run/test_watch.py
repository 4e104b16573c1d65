"""Sidecar mode and `forgetwatch watch`: the training process scores nothing, the watcher scores its checkpoints into
the same record as in-loop probing (probe by probe), restart-safe, beside the trainer's W&B run."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import requires_olmo_eval
from fixtures.trainers import make_probes, sft_trainer, watcher
from fixtures.wandb_offline import find_run_files, finish_offline_run, read_history, read_records

from forgetwatch import ForgetWatchCallback
from forgetwatch.cli import main as cli
from forgetwatch.probes.probe_set import ProbeSet
from forgetwatch.record.store import RunRecord
from forgetwatch.run.console import format_evaluation
from forgetwatch.run.watcher import SidecarError, Watcher

pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.filterwarnings("ignore:`gradient_checkpointing.*` is deprecated:FutureWarning")]


def count_scoring(monkeypatch) -> list[int]:
    """Counts the probes scored in this process (every route goes through `score_probes`)."""
    import forgetwatch.run.distributed as fd

    calls: list[int] = []
    orig = fd.score_probes

    def score_probes(model, tokenizer, probes, *a, **kw):
        calls.append(len(probes))
        return orig(model, tokenizer, probes, *a, **kw)

    monkeypatch.setattr(fd, "score_probes", score_probes)
    return calls


@pytest.fixture(scope="module")
def runs(tokenizer, tmp_path_factory):
    """The same SFT run (TRL's bf16 autocast) scored in the loop and in sidecar mode, then watched with --once."""
    root = tmp_path_factory.mktemp("watch")
    sft_trainer(tokenizer, root / "inline", [watcher()]).train()
    side = sft_trainer(
        tokenizer, root / "side", [watcher(scoring="sidecar", base_cache=str(root / "inline" / "forgetwatch" / "base.parquet"))]
    )
    with pytest.MonkeyPatch.context() as mp:
        calls = count_scoring(mp)
        side.train()
    assert cli(["watch", str(root / "side"), "--once", "--device", "cpu"]) == 0
    return root, calls


def test_sidecar_record_equals_the_in_loop_record_probe_by_probe(runs):
    root, _ = runs
    inline, side = RunRecord(root / "inline" / "forgetwatch"), RunRecord(root / "side" / "forgetwatch")
    assert side.eval_steps() == inline.eval_steps() == [0, 2, 4, 6]
    for step in inline.eval_steps():
        a, b = inline.read_eval(step), side.read_eval(step)
        assert sorted(a) == sorted(b)
        for key in a:
            np.testing.assert_array_equal(a[key], b[key], err_msg=f"step {step}: {key}")
    # time taken, and which training start wrote the checkpoint (the watcher says): not figures
    strip = lambda rows: [{k: v for k, v in r.items() if k not in ("seconds", "start")} for r in rows]  # noqa: E731
    assert strip(side.read_metrics()) == strip(inline.read_metrics())
    assert side.read_flips() == inline.read_flips() and side.read_at_risk() == inline.read_at_risk()
    # the trainer's own log rows are kept by the training process (the watcher never touches them): the same run's
    losses = lambda rec: [(r["step"], r["loss"]) for r in rec.read_trainer_log() if "loss" in r]  # noqa: E731
    assert losses(side) == losses(inline) and [s for s, _ in losses(side)] == [1, 2, 3, 4, 5, 6]


def test_the_training_process_scores_nothing_and_saves_at_every_evaluation(runs):
    root, calls = runs
    assert calls == []  # the base came from a cache; no evaluation was scored in the training process
    assert sorted(p.name for p in (root / "side").glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]
    manifest = json.loads((root / "side" / "forgetwatch" / "sidecar.json").read_text())
    assert manifest["finished"] and manifest["final_step"] == 6 and manifest["precision"] == "float32+autocast-bfloat16"


def test_a_restarted_watcher_scores_only_what_is_new(tokenizer, tmp_path, caplog, capsys):
    out = tmp_path / "run"
    sft_trainer(tokenizer, out, [watcher(scoring="sidecar")]).train()
    assert "forgetwatch step" not in capsys.readouterr().out  # the training process scores nothing, so says nothing
    parked = tmp_path / "parked"
    parked.mkdir()
    for step in (4, 6):  # as if training had only reached step 2 when the watcher first looked
        shutil.move(out / f"checkpoint-{step}", parked / f"checkpoint-{step}")
    (out / "checkpoint-8").mkdir()  # a checkpoint still being written: no trainer_state.json yet
    assert Watcher(out, device="cpu").run(once=True) == 1
    # the callback's console line, one per evaluation, from the record's rows (`forgetwatch.run.console`)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("forgetwatch watch step")]
    rows = RunRecord(out / "forgetwatch").read_metrics()
    assert [line.split("; probing ")[0] for line in lines] == [
        format_evaluation(r["step"], r["metrics"], categories=make_probes().categories, label="forgetwatch watch")
        for r in rows]
    assert lines[0].startswith("forgetwatch watch step 0 (base): accuracy ") and "; probing " in lines[1]
    for step in (4, 6):
        shutil.move(parked / f"checkpoint-{step}", out / f"checkpoint-{step}")
    (out / "checkpoint-6" / "model.safetensors").write_bytes(b"not a model")  # fails to load: skipped, not fatal
    with caplog.at_level(logging.WARNING, logger="forgetwatch.run.watcher"):
        assert Watcher(out, device="cpu").run(once=True) == 1
    assert RunRecord(out / "forgetwatch").eval_steps() == [0, 2, 4]
    assert "could not score" in caplog.text and "checkpoint-6" in caplog.text and "will try again" in caplog.text
    assert Watcher(out, device="cpu").run(once=True) == 0  # nothing new: checkpoint-6 is retried, still broken


def test_a_resume_from_an_earlier_checkpoint_is_scored_again_from_the_checkpoints_it_writes(tokenizer, tmp_path, caplog):
    """The watcher, running throughout, scored steps 2, 4 and 6; training then resumes from checkpoint-2 on other data:
    the record's 4 and 6 (the abandoned trajectory) are forgotten, the old checkpoints are not scored while they wait to
    be written again, and the record ends with the resumed run's own evaluations."""
    import torch
    from datasets import Dataset
    from fixtures.trainers import SCORING
    from transformers import TrainerCallback

    from forgetwatch import score_probes
    from forgetwatch.scoring.models import load_checkpoint
    from forgetwatch.scoring.score import ScoringConfig

    out = tmp_path / "run"
    sft_trainer(tokenizer, out, [watcher(scoring="sidecar")]).train()
    live = Watcher(out, device="cpu")
    try:
        assert live.poll() == 3
        record = RunRecord(out / "forgetwatch")
        # as if scored after the resume below, or by a host whose clock runs ahead: times must not decide
        import os
        import time

        future = time.time() + 3600
        for path in [*record.evals_dir.glob("*.npz"), *out.glob("checkpoint-*/trainer_state.json")]:
            os.utime(path, (future, future))
        abandoned = {s: record.read_results(s, live.probes.ids) for s in (4, 6)}
        other = Dataset.from_list([
            {"messages": [{"role": "user", "content": f"Name {i} twice."}, {"role": "assistant", "content": f"{i} {i}."}]}
            for i in range(16)])
        polled = []

        class PollBeforeStep3(TrainerCallback):  # the resumed run has begun and written no checkpoint yet
            def on_step_begin(self, args, state, control, **kwargs):
                if state.global_step == 2:
                    polled.append((live.poll(), record.eval_steps()))

        resumed = sft_trainer(tokenizer, out, [watcher(scoring="sidecar"), PollBeforeStep3()], dataset=other)
        with caplog.at_level(logging.WARNING, logger="forgetwatch.run.watcher"):
            resumed.train(resume_from_checkpoint=str(out / "checkpoint-2"))
        # the abandoned steps were forgotten, and the old checkpoints 4 and 6, waiting to be written again, not scored
        assert polled == [(0, [0, 2])]
        assert "resumed from step 2" in caplog.text and "steps 4, 6" in caplog.text
        (aside,) = (record.root / "superseded").iterdir()  # set aside whole, not deleted, one folder for the resume
        assert (aside / "trainer_log.jsonl").is_file()  # the training process's share, named alike
        assert sorted(p.name for p in (aside / "evals").iterdir()) == ["step-00000004.npz", "step-00000006.npz"]
        assert [json.loads(line)["step"] for line in (aside / "metrics.jsonl").read_text().splitlines()] == [4, 6]
        assert live.poll() == 2
        assert record.eval_steps() == [0, 2, 4, 6] and live.poll() == 0
        for step in (4, 6):
            model, _ = load_checkpoint(out / f"checkpoint-{step}", dtype="float32", device="cpu")
            with torch.autocast("cpu", dtype=torch.bfloat16):
                now = score_probes(model, tokenizer, live.probes, ScoringConfig(**SCORING))
            got = record.read_results(step, live.probes.ids)
            np.testing.assert_array_equal(got.outcome, now.outcome, err_msg=f"step {step}")
            np.testing.assert_allclose(got.gold_logprob, now.gold_logprob, rtol=0, atol=1e-5, err_msg=f"step {step}")
            assert not np.allclose(got.gold_logprob, abandoned[step].gold_logprob, equal_nan=True)  # not the old one
    finally:
        live.monitor.finish()
        live._lock.release()
    # a watcher started after such a resume (from checkpoint-4, on the first data) forgets step 6 as it opens
    before = record.read_results(6, live.probes.ids)
    sft_trainer(tokenizer, out, [watcher(scoring="sidecar")]).train(resume_from_checkpoint=str(out / "checkpoint-4"))
    assert Watcher(out, device="cpu").run(once=True) == 1
    assert record.eval_steps() == [0, 2, 4, 6]
    assert not np.allclose(record.read_results(6, live.probes.ids).gold_logprob, before.gold_logprob, equal_nan=True)


def test_a_checkpoint_deleted_before_it_was_scored_is_reported(tokenizer, tmp_path, caplog):
    out = tmp_path / "run"
    sft_trainer(tokenizer, out, [watcher(scoring="sidecar")], save_total_limit=1).train()
    assert [p.name for p in out.glob("checkpoint-*")] == ["checkpoint-6"]
    with caplog.at_level(logging.WARNING, logger="forgetwatch.run.watcher"):
        assert Watcher(out, device="cpu").run(once=True) == 1
    assert "checkpoint-2 was deleted before it was scored" in caplog.text and "checkpoint-4 was deleted" in caplog.text


def test_bad_output_dirs_say_how_to_start(tokenizer, tmp_path, capsys):
    with pytest.raises(SidecarError, match="no such directory; start training with ForgetWatchCallback"):
        Watcher(tmp_path / "nope")
    assert cli(["watch", str(tmp_path), "--once"]) == 2
    assert "no forgetwatch sidecar manifest" in capsys.readouterr().err
    out = tmp_path / "run"
    sft_trainer(tokenizer, out, [watcher(scoring="sidecar")], max_steps=2).train()
    ProbeSet(list(make_probes())[:-1]).to_jsonl(out / "forgetwatch" / "probes.jsonl")  # not the cache's probes any more
    with pytest.raises(ValueError, match="probes"):
        Watcher(out)


def test_sidecar_refuses_what_needs_scores_in_the_training_process():
    with pytest.raises(ValueError, match="on_budget='stop' needs the scores inside the training process"):
        ForgetWatchCallback(make_probes(), budget={"forgetting": 0.1}, on_budget="stop", scoring="sidecar")
    with pytest.raises(ValueError, match="scoring.*must be one of inline, sidecar"):
        ForgetWatchCallback(make_probes(), scoring="async")
    from datasets import Dataset

    from forgetwatch.remedies import mix_replay

    cb = ForgetWatchCallback(make_probes(), scoring="sidecar")
    pool = [{"id": f"p{i}", "category": c, "messages": []} for i, c in enumerate(["add", "compare", "count", "short"])]
    with pytest.raises(ValueError, match="closed-loop replay steers by the scores inside the training process"):
        mix_replay(Dataset.from_list([{"messages": []}]), pool, monitor=cb)
    mix_replay(Dataset.from_list([{"messages": []}]), pool, strategy="uniform", monitor=cb)  # no feedback needed: fine


def test_the_watchers_wandb_run_sits_beside_the_trainers(tokenizer, tmp_path, monkeypatch):
    """Offline: the trainer's run and the watcher's own run (same project and group, named after it, the trainer's step
    on the x-axis), read back from their run files; then --into-trainer-run after training appends to the trainer's id."""
    from conftest import clear_wandb_env

    clear_wandb_env(monkeypatch, tmp_path / "wandb")
    finish_offline_run()
    out = tmp_path / "run"
    try:
        sft_trainer(tokenizer, out, [watcher(scoring="sidecar")], report_to="wandb", run_name="sft-tiny").train()
    finally:
        finish_offline_run()
    trainer_id = json.loads((out / "forgetwatch" / "sidecar.json").read_text())["wandb"]["id"]
    assert cli(["watch", str(out), "--once", "--device", "cpu"]) == 0
    finish_offline_run()
    (watcher_file,) = [f for f in find_run_files(tmp_path / "wandb") if "forgetwatch" in f.parent.name]
    run = [r.run for r in read_records(watcher_file) if r.HasField("run")][0]
    assert (run.run_id, run.run_group, run.display_name, run.project) == (f"{trainer_id}-forgetwatch", trainer_id,
                                                                      "sft-tiny-forgetwatch", "forgetwatch-tests")
    rows = [r for r in read_history(watcher_file) if "forgetwatch/forgetting" in r]
    metrics = {m["step"]: m["metrics"]["overall"]["forgetting"] for m in RunRecord(out / "forgetwatch").read_metrics()}
    assert {r["train/global_step"]: r["forgetwatch/forgetting"] for r in rows} == pytest.approx(metrics)
    assert sorted(metrics) == [0, 2, 4, 6]
    assert len(find_run_files(tmp_path / "wandb")) == 2  # the trainer's and the watcher's, side by side


def test_into_trainer_run_after_training(tokenizer, tmp_path, monkeypatch):
    from conftest import clear_wandb_env

    clear_wandb_env(monkeypatch, tmp_path / "wandb")
    finish_offline_run()
    out = tmp_path / "run"
    try:
        sft_trainer(tokenizer, out, [watcher(scoring="sidecar")], report_to="wandb", max_steps=4).train()
    finally:
        finish_offline_run()
    manifest_path = out / "forgetwatch" / "sidecar.json"
    manifest = json.loads(manifest_path.read_text())
    manifest_path.write_text(json.dumps({**manifest, "finished": False}))  # as while training runs
    with pytest.raises(SidecarError, match="two processes cannot write while it is live"):
        Watcher(out, into_trainer_run=True)
    manifest_path.write_text(json.dumps(manifest))
    assert cli(["watch", str(out), "--once", "--device", "cpu", "--into-trainer-run"]) == 0
    finish_offline_run()
    mine = [f for f in find_run_files(tmp_path / "wandb")
            if [r.run.run_id for r in read_records(f) if r.HasField("run")][0] == manifest["wandb"]["id"]]
    assert len(mine) == 2  # the trainer's own run file, and the watcher's turn on the same run id (synced into one)
    steps = sorted(r["train/global_step"] for f in mine for r in read_history(f) if "forgetwatch/forgetting" in r)
    assert steps == [0, 2, 4]


def test_lora_adapter_checkpoints_are_scored_on_their_base_model(tokenizer, tiny_model_dir, tmp_path):
    """A LoRA run saves adapter-only checkpoints; the watcher loads each on the base model named in its adapter config
    and gets what the callback measured in the loop, probe by probe."""
    import peft
    import torch
    from transformers import AutoModelForCausalLM

    def lora(out, cb):
        torch.manual_seed(0)  # LoRA's A matrices start random: the same start in both runs
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
        config = peft.LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "down_proj"], task_type="CAUSAL_LM")
        sft_trainer(tokenizer, out, [cb], model=peft.get_peft_model(model, config), max_steps=4, bf16=False).train()

    lora(tmp_path / "inline", watcher())
    lora(tmp_path / "side", watcher(scoring="sidecar"))
    assert (tmp_path / "side" / "checkpoint-2" / "adapter_config.json").is_file()
    assert not (tmp_path / "side" / "checkpoint-2" / "model.safetensors").exists()  # adapter only
    assert Watcher(tmp_path / "side", device="cpu").run(once=True) == 2
    inline, side = RunRecord(tmp_path / "inline" / "forgetwatch"), RunRecord(tmp_path / "side" / "forgetwatch")
    assert side.eval_steps() == inline.eval_steps() == [0, 2, 4]
    for step in (2, 4):
        a, b = inline.read_eval(step), side.read_eval(step)
        np.testing.assert_array_equal(a["outcome"], b["outcome"])
        np.testing.assert_allclose(a["margin"], b["margin"], atol=1e-5)
    assert inline.read_metrics()[-1]["metrics"]["overall"]["kl"] > 0  # the adapters changed what is scored


@requires_olmo_eval
@pytest.mark.long
def test_watching_a_recipe_run_as_it_trains(tiny_model_dir, tmp_path):
    """Two terminals: the SFT recipe with `--forgetwatch_scoring sidecar` in one process, `forgetwatch watch` following
    it in another; the watcher ends by itself when training has ended and every checkpoint is scored."""
    import os
    import subprocess
    import sys

    out = tmp_path / "out"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "WANDB_MODE": "disabled",
           "PYTHONWARNINGS": "ignore::FutureWarning"}
    root = Path(__file__).resolve().parents[2]
    train = subprocess.Popen(
        [sys.executable, "recipes/sft.py", "--config", "recipes/SmolLM2-135M-Instruct/sft/config_demo.yaml",
         "--model_name_or_path", str(tiny_model_dir), "--output_dir", str(out), "--max_steps", "6", "--report_to", "none",
         "--forgetwatch_per_suite", "3", "--forgetwatch_eval_steps", "2", "--forgetwatch_scoring", "sidecar",
         "--forgetwatch_rewind", "false"],  # the demo rewinds at the end, which needs inline scoring
        cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        import time

        for _ in range(600):  # the second terminal: once training has started (the manifest is written)
            if (out / "forgetwatch" / "sidecar.json").is_file() or train.poll() is not None:
                break
            time.sleep(0.2)
        watch = subprocess.run([sys.executable, "-m", "forgetwatch.cli", "watch", str(out), "--poll", "0.5", "--timeout",
                                "240", "--device", "cpu"], cwd=root, env=env, capture_output=True, text=True, timeout=300)
        train_out, _ = train.communicate(timeout=300)
    finally:
        train.kill()
    assert train.returncode == 0, train_out[-3000:]
    assert watch.returncode == 0, watch.stderr[-3000:]
    assert "scored 3 checkpoint(s)" in watch.stdout
    assert [r["step"] for r in RunRecord(out / "forgetwatch").read_metrics()] == [0, 2, 4, 6]


def test_only_evaluation_steps_of_this_run_and_a_dead_trainer_ends_the_watch(tokenizer, tmp_path, caplog):
    """Checkpoints the trainer saved for itself off the eval grid are not evaluations; checkpoints older than the run
    (an earlier run in the same output_dir) are not this run's; a watcher whose training process died stops."""
    import subprocess
    import sys

    out = tmp_path / "run"
    sft_trainer(tokenizer, out, [watcher(scoring="sidecar")], save_strategy="steps", save_steps=3).train()
    assert sorted(int(p.name.split("-")[1]) for p in out.glob("checkpoint-*")) == [2, 3, 4, 6]
    path = out / "forgetwatch" / "sidecar.json"
    manifest = json.loads(path.read_text())
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    path.write_text(json.dumps({**manifest, "finished": False, "final_step": None, "pid": int(dead.stdout)}))
    shutil.copytree(out / "checkpoint-6", out / "checkpoint-8")  # an earlier run's, older than this run
    state = out / "checkpoint-8" / "trainer_state.json"
    state.write_text(state.read_text().replace('"global_step": 6', '"global_step": 8'))
    import os

    os.utime(state, (manifest["started_at"] - 60, manifest["started_at"] - 60))
    with caplog.at_level(logging.WARNING, logger="forgetwatch.run.watcher"):
        assert Watcher(out, device="cpu").run(poll_seconds=0.1, timeout=60) == 3
    assert RunRecord(out / "forgetwatch").eval_steps() == [0, 2, 4, 6]
    assert "checkpoint-8 predates this run" in caplog.text
    assert f"the training process (pid {int(dead.stdout)}) is gone without finishing" in caplog.text


def test_the_watcher_logs_to_tensorboard_and_trackio(tokenizer, tmp_path, monkeypatch):
    """Like the callback: TensorBoard into the trainer's log directory, trackio into a run of its own
    (`<run>-forgetwatch`) in the trainer's project; both read back from disk, on the trainer's step axis."""
    pytest.importorskip("tensorboard")
    trackio = pytest.importorskip("trackio")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "tb"))
    monkeypatch.setenv("TRACKIO_DIR", str(tmp_path / "trackio"))
    monkeypatch.setattr(trackio.sqlite_storage, "TRACKIO_DIR", tmp_path / "trackio", raising=False)
    out = tmp_path / "run"
    sft_trainer(tokenizer, out, [watcher(scoring="sidecar")], report_to=["tensorboard", "trackio"], max_steps=4,
                project="fw-test", run_name="run").train()
    assert Watcher(out, device="cpu").run(once=True) == 2
    expected = {m["step"]: m["metrics"]["overall"]["forgetting"] for m in RunRecord(out / "forgetwatch").read_metrics()}
    tb: dict[int, float] = {}
    for f in sorted((tmp_path / "tb").glob("events.out.tfevents.*")):
        acc = EventAccumulator(str(f), size_guidance={"scalars": 0})
        acc.Reload()
        if "forgetwatch/forgetting" in acc.Tags()["scalars"]:
            tb.update({e.step: e.value for e in acc.Scalars("forgetwatch/forgetting")})
    assert tb == pytest.approx(expected) and sorted(tb) == [0, 2, 4]
    logs = trackio.SQLiteStorage.get_logs("fw-test", "run-forgetwatch")
    got = {int(r["train/global_step"]): r["forgetwatch/forgetting"] for r in logs if "forgetwatch/forgetting" in r}
    assert got == pytest.approx(expected)
