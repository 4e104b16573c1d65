"""`mix_replay` in real TRL SFT runs (tiny model): the ratio on what is trained on, no monitored probe ever in a batch,
the closed loop following the callback's measurements, resume continuing the same stream, and bad input refused."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
from datasets import Dataset
from fixtures.remedies import chat_dataset, make_pool
from fixtures.trainers import make_probes

from forgetwatch import ForgetWatchCallback
from forgetwatch.probes.probe_set import Probe, ProbeSet
from forgetwatch.record.store import RunRecord
from forgetwatch.remedies import mix_replay
from forgetwatch.remedies.mixing import category_weights

pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.filterwarnings("ignore:`gradient_checkpointing.*` is deprecated:FutureWarning")]

STEPS, BATCH, RATIO = 6, 4, 0.25
# the runs whose tiny model forgets `add` by step 6 (what the closed-loop tests follow) replay the lettered form; the
# scoring form (the default for SFT data) trains differently, and tests/remedies/test_anchor.py checks it
LETTERS = "letter"






def traced_sft(tokenizer, out: Path, watcher, dataset, **overrides):
    """An SFTTrainer that records the text of every example of every batch it trains on."""
    from conftest import build_model
    from trl import SFTConfig, SFTTrainer

    class Traced(SFTTrainer):
        fed: list[list[str]] = []

        def training_step(self, model, inputs, *args, **kwargs):
            rows = [tokenizer.decode([t for t in ids if t != tokenizer.pad_token_id]) for ids in inputs["input_ids"].tolist()]
            self.fed.append(rows)
            return super().training_step(model, inputs, *args, **kwargs)

    kwargs = {"output_dir": str(out), "use_cpu": True, "bf16": False, "max_steps": STEPS, "per_device_train_batch_size": BATCH,
              "learning_rate": 5e-2, "logging_steps": 1, "max_length": 64, "report_to": "none", "save_strategy": "no",
              "seed": 0, "disable_tqdm": True, **overrides}
    trainer = Traced(model=build_model(tokenizer, seed=0), args=SFTConfig(**kwargs), train_dataset=dataset,
                     processing_class=tokenizer, callbacks=[watcher])
    trainer.fed = []
    return trainer


def watcher() -> ForgetWatchCallback:
    return ForgetWatchCallback(make_probes(), eval_steps=2, max_new_tokens=4)


@pytest.fixture(scope="module")
def replay_run(tokenizer, tmp_path_factory):
    out = tmp_path_factory.mktemp("replay")
    w = watcher()
    trainer = traced_sft(tokenizer, out, w, mix_replay(chat_dataset(), make_pool(), ratio=RATIO, monitor=w, seed=0, form=LETTERS))
    trainer.train()
    return trainer, RunRecord(out / "forgetwatch")


def test_the_ratio_holds_on_what_is_trained_on(replay_run):
    trainer, _ = replay_run
    assert len(trainer.fed) == STEPS and all(len(batch) == BATCH for batch in trainer.fed)
    replayed = [sum("Pool" in row for row in batch) for batch in trainer.fed]
    assert sum(replayed) == RATIO * STEPS * BATCH  # exactly: one in four, counted on the batches trained on
    tasks = [row for batch in trainer.fed for row in batch if "Pool" not in row]
    assert all("plus one?" in row for row in tasks)  # the rest is the training set


def test_no_monitored_probe_reaches_a_batch(replay_run):
    trainer, _ = replay_run
    texts = "\n".join(row for batch in trainer.fed for row in batch)
    assert not [p.question for p in make_probes() if p.question in texts]


def test_closed_loop_weights_follow_the_measured_forgetting(replay_run):
    """Each switch in replay_mix.json holds the weights of that evaluation's per-category forgetting (chance-adjusted,
    raw for short answers) in metrics.jsonl."""
    _, record = replay_run
    mix = record.read_mix()["mixers"][0]
    assert (
        mix["ratio"] == RATIO and mix["strategy"] == "closed_loop" and mix["categories"] == ["add", "compare", "count", "short"]
    )
    metrics = {row["step"]: row["metrics"] for row in record.read_metrics()}
    # each evaluation's weights hold from the position after the last one read then (step 6's: after the last batch)
    assert [step for _, step, _ in mix["schedule"]] == [2, 4, 6]
    assert [p for p, _, _ in mix["schedule"]] == [12, 20, 28]  # one batch read ahead: steps 3, 5, 7 are read at 2, 4, 6
    def expected(step):
        forgetting = {c: m.get("forgetting_adjusted", m["forgetting"]) for c, m in metrics[step].items() if c != "overall"}
        return category_weights(forgetting, floor=0.1)

    for _, step, weights in mix["schedule"]:
        assert weights == pytest.approx(expected(step))
    # the last evaluation's weights (published, not drawn from: training ended): this run forgot in `add`, and the
    # loop leans there (0.1 / 4 + 0.9 of the draws)
    assert mix["weights"] == pytest.approx(expected(STEPS))
    assert metrics[STEPS]["add"]["forgetting_adjusted"] > 0 and mix["weights"]["add"] > 0.5


def test_resume_continues_the_same_stream(tokenizer, tmp_path):
    """Resumed from step 6's checkpoint (in a copy of the run's directory), the stream is read again from its start
    (the skipped batches included) and steps 7-8 train on the same examples as the uninterrupted run: step 8's replay is
    drawn by step 6's weights (which lean to `add`), from the position the record holds, after step 7's batch (read
    before step 6's evaluation) which keeps step 4's."""
    def run(out: Path, resume: bool = False):
        w = watcher()
        stream = mix_replay(chat_dataset(), make_pool(), ratio=RATIO, monitor=w, seed=0, form=LETTERS)
        trainer = traced_sft(tokenizer, out, w, stream, save_strategy="steps", save_steps=2, max_steps=8)
        trainer.train(resume_from_checkpoint=str(out / "checkpoint-6") if resume else None)
        return trainer, RunRecord(out / "forgetwatch").read_mix()["mixers"][0]["schedule"]

    whole, whole_schedule = run(tmp_path / "whole")
    (position, step, weights), = [e for e in whole_schedule if e[1] == 6]
    assert weights["add"] > 0.5 and position == 28  # step 8's batch is positions 28-31
    shutil.copytree(tmp_path / "whole", tmp_path / "cut")
    resumed, schedule = run(tmp_path / "cut", resume=True)  # evaluations after step 6 are recomputed
    assert resumed.fed == whole.fed[6:]
    assert schedule == whole_schedule


@pytest.mark.parametrize("record", ["kind recorded", "older record"])
def test_a_resume_with_other_replay_is_said(tokenizer, tmp_path, caplog, record):
    """Started with lettered replay, resumed with the scoring form (as after the upgrade that changed the default): the
    run goes on, and the warning says what changed and from which step. A record from before streams said their kind
    is read as the lettered form."""
    def run(out: Path, form: str, resume: bool = False):
        w = watcher()
        stream = mix_replay(chat_dataset(), make_pool(), ratio=RATIO, monitor=w, seed=0, form=form)
        trainer = traced_sft(tokenizer, out, w, stream, save_strategy="steps", save_steps=2, max_steps=8)
        trainer.train(resume_from_checkpoint=str(out / "checkpoint-6") if resume else None)

    run(tmp_path / "run", LETTERS)
    path = tmp_path / "run" / "forgetwatch" / "replay_mix.json"
    if record == "older record":
        mix = json.loads(path.read_text())
        path.write_text(json.dumps({"mixers": [{k: v for k, v in m.items() if k != "kind"} for m in mix["mixers"]]}))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="forgetwatch"):
        run(tmp_path / "run", "scoring", resume=True)
    said = [r.getMessage() for r in caplog.records if "resumes at step" in r.getMessage()]
    assert said == [
        "forgetwatch: this run started with replay: letter "
        f"form{' (a record from before streams said their kind)' if record == 'older record' else ''} "
        "but resumes at step 6 with replay: scoring form: the replayed examples change from here on, so its "
        "curves before and after are not one experiment; to continue it as it was, resume with the same "
        "replay options (and forgetwatch version)"
    ]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="forgetwatch"):
        run(tmp_path / "run", "scoring", resume=True)  # now recorded as the scoring form: nothing to say
    assert not [r for r in caplog.records if "resumes at step" in r.getMessage()]
    # and a resume that drops replay altogether
    assert resumed_without_replay(tokenizer, tmp_path / "run", watcher(), 6, 8, caplog) == [dropped_replay(6)]


def resumed_without_replay(tokenizer, out: Path, callback, step: int, max_steps: int, caplog) -> list[str]:
    """Resume the run in `out` from checkpoint-`step` without replay; the resume warnings said."""
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="forgetwatch"):
        traced_sft(tokenizer, out, callback, chat_dataset(), save_strategy="steps", save_steps=2,
                   max_steps=max_steps).train(resume_from_checkpoint=str(out / f"checkpoint-{step}"))
    return [r.getMessage() for r in caplog.records if "resumes at step" in r.getMessage()]


def dropped_replay(step: int) -> str:
    return (f"forgetwatch: this run started with replay: scoring form but resumes at step {step} with no replay: the "
            "replayed examples change from here on, so its curves before and after are not one experiment; to continue "
            "it as it was, resume with the same replay options (and forgetwatch version)")


def test_a_sidecar_resume_that_drops_replay_is_said(tokenizer, tmp_path, caplog):
    """Sidecar scoring with uniform replay (closed loop needs the scores in the training process), resumed without it: the
    warning an inline run gets is said here too (the sidecar branch returned before reaching it)."""
    def watcher_sidecar() -> ForgetWatchCallback:
        return ForgetWatchCallback(make_probes(), eval_steps=2, max_new_tokens=4, scoring="sidecar")

    w = watcher_sidecar()
    traced_sft(tokenizer, tmp_path / "run", w, mix_replay(chat_dataset(), make_pool(), ratio=RATIO, monitor=w, seed=0,
                                                          strategy="uniform", form="scoring"),
               save_strategy="steps", save_steps=2, max_steps=6).train()
    assert resumed_without_replay(tokenizer, tmp_path / "run", watcher_sidecar(), 4, 6, caplog) == [dropped_replay(4)]


def test_grpo_data_gets_each_rows_kind_for_probe_reward():
    """A GRPO dataset without a `kind` column: replayed multiple-choice rows carry kind "mcq" (the training rows None),
    so `probe_reward` checks their letter rather than a short answer."""
    from forgetwatch.answers import probe_reward

    w = watcher()
    train = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": f"{i} + 1 = ?"}], "solution": str(i + 1)} for i in range(8)]
    )
    pool = ProbeSet(
        [p for p in make_pool() if p.kind == "mcq"]
        + [Probe("pool-short", "short", "Pool short?", answers=("yes",), category="short")]
    )
    rows = list(mix_replay(train, pool, ratio=0.5, strategy="uniform", monitor=w).take(8))
    assert all(set(r) == {"prompt", "solution", "kind"} for r in rows)
    mcq = [r for r in rows if r["kind"] == "mcq"]
    assert mcq and {r["kind"] for r in rows if r["solution"] in [str(i + 1) for i in range(8)]} == {None}
    assert probe_reward([mcq[0]["solution"]], solution=[mcq[0]["solution"]], kind=[mcq[0]["kind"]]) == [1.0]


def test_bad_input_is_refused_before_training(tokenizer):
    w = watcher()
    train = chat_dataset()
    overlap = ProbeSet(list(make_pool()) + [make_probes()["add3"]])
    with pytest.raises(ValueError, match=r"1 monitored probes \(add3\)"):
        mix_replay(train, overlap, monitor=w)
    with pytest.raises(ValueError, match=r"must be in \[0, 1\)"):
        mix_replay(train, make_pool(), ratio=1.0, monitor=w)
    with pytest.raises(ValueError, match="pass `monitor=`"):
        mix_replay(train, make_pool())
    no_short = ProbeSet([p for p in make_pool() if p.category != "short"])
    with pytest.raises(ValueError, match="no example for categories short"):
        mix_replay(train, no_short, monitor=w)
    with pytest.raises(ValueError, match=r"row 1 \(id 'x'\) lacks the training dataset's column\(s\) messages"):
        mix_replay(train, [{"category": "add", "messages": []}, {"category": "add", "id": "x", "text": "hi"}], monitor=w)
    with pytest.raises(ValueError, match="row 0: needs a `category`"):
        mix_replay(train, [{"messages": []}], strategy="uniform")


def test_a_users_dataset_as_pool_and_its_ids_checked(tokenizer, tmp_path):
    w = watcher()
    rows = [{"id": f"u{i}", "category": c, "messages": [{"role": "user", "content": f"Own {c} {i}?"},
                                                       {"role": "assistant", "content": "Sure."}]}
            for i, c in enumerate(["add", "compare", "count", "short"] * 2)]
    mixed = mix_replay(chat_dataset(), Dataset.from_list(rows), ratio=0.5, strategy="uniform", monitor=w, seed=1)
    got = [r["messages"][0]["content"] for r in mixed.take(8)]
    assert sum(t.startswith("Own") for t in got) == 4 and list(next(iter(mixed))) == ["messages"]
    with pytest.raises(ValueError, match=r"1 monitored probes \(cmp1\)"):
        mix_replay(chat_dataset(), Dataset.from_list(rows + [{**rows[0], "id": "cmp1"}]), monitor=w)


def test_dataloader_workers_are_refused_at_the_start(tokenizer, tmp_path):
    w = watcher()
    trainer = traced_sft(tokenizer, tmp_path, w, mix_replay(chat_dataset(), make_pool(), ratio=RATIO, monitor=w),
                         dataloader_num_workers=1)
    with pytest.raises(ValueError, match="dataloader_num_workers=0"):
        trainer.train()


def test_a_probe_file_needs_a_replay_pool():
    """With suite names the pool defaults to the rest of the suites; a probe file has no rest, and would otherwise be
    its own pool (refused as the monitored probes themselves)."""
    from forgetwatch import ForgetWatchArguments
    from forgetwatch.remedies import replay_pool

    args = ForgetWatchArguments(forgetwatch_probes="arc_easy,sciq", forgetwatch_replay_mix=0.1)
    assert replay_pool(args) == "arc_easy,sciq"
    with pytest.raises(ValueError, match=r"forgetwatch_replay_pool is needed: forgetwatch_probes is a file \(probes.jsonl\)"):
        replay_pool(ForgetWatchArguments(forgetwatch_probes="probes.jsonl", forgetwatch_replay_mix=0.1))
    assert "replay_mix" not in str(args.to_kwargs())  # the callback does not take mix_replay's options


def test_ratio_zero_reads_the_same_training_rows_without_replay():
    """The control for a replay run (README, RESULTS §12): at ratio 0 the stream holds the training rows a replay run
    at the same seed reads, in the same order, and nothing else."""
    w = watcher()
    train = chat_dataset()
    pool = make_pool()
    replayed = list(mix_replay(train, pool, ratio=0.25, strategy="uniform", monitor=w, seed=3).take(40))
    control = list(mix_replay(train, pool, ratio=0.0, strategy="uniform", monitor=w, seed=3).take(40))
    rows = [t["messages"] for t in train]
    training = [r for r in replayed if r["messages"] in rows]
    assert len(training) == 30 and control[:30] == training  # 10 of 40 were replay; the rest is the control's prefix
    assert all(r["messages"] in rows for r in control)
