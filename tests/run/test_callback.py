"""ForgetWatchCallback inside real trainers (TRL SFTTrainer and GRPOTrainer, a tiny random Llama, CPU, offline).

What is checked: the numbers logged to W&B / TensorBoard are the local record's, and the record's are right
(re-scored from saved checkpoints); training is bit-for-bit the same with and without the callback (dropout
on, and GRPO, which samples); a failing logger never stops training; bad input fails before a step is spent;
resuming from a checkpoint recomputes what came after it; replay examples match the probe x evaluation matrix.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import transformers
from transformers import TrainerCallback

pytest.importorskip("trl")
wandb = pytest.importorskip("wandb")

from conftest import build_model, clear_wandb_env  # noqa: E402,I001  (tests/ is on sys.path: pytest's "prepend" import mode)
from fixtures.wandb_offline import (  # noqa: E402
    find_run_file,
    finish_offline_run,
    load_table,
    read_config,
    read_history,
    read_metric_definitions,
    read_summary,
)

from forgetwatch import (  # noqa: E402
    BaseCache,
    CacheMismatchError,
    ProbeFormatError,
    ProbeResults,
    ProbeSet,
    compute_report,
    load_record,
    make_cache_key,
)
from forgetwatch.answers import LETTERS, mcq_reward  # noqa: E402
from forgetwatch.run.callback import ForgetWatchCallback  # noqa: E402
from forgetwatch.versions import installed_versions, release  # noqa: E402
from forgetwatch.measures.drift import compute_drift  # noqa: E402
from forgetwatch.scoring.models import model_identity  # noqa: E402
from forgetwatch.record.store import RunRecord  # noqa: E402
from forgetwatch.scoring.score import ScoringConfig  # noqa: E402
from fixtures.trainers import (  # noqa: E402
    BF16,
    CrashBeforeStep,
    OVERVIEW,
    SCORING,
    SEED,
    StepCounter,
    assert_same_weights,
    grpo_trainer,
    logged_name,
    make_probes,
    metric_rows,
    own_logs,
    rescore,
    sft_trainer,
    the_watcher,
    watcher,
)

# logged name -> ForgettingMetrics field
LOGGED = {
    "forgetting": "forgetting",
    "backward_transfer": "backward_transfer",
    "forgetting_adjusted": "forgetting_adjusted",
    "backward_transfer_adjusted": "backward_transfer_adjusted",
    "accuracy": "accuracy_post",
    "net_change": "net_change",
    "invalid_rate": "invalid_rate_post",
}
CATEGORIES = ("add", "compare", "count", "short")


# -- building blocks ----------------------------------------------------------------------------------------






















class ConsumeRng(TrainerCallback):
    """A callback that draws from torch's RNG every step: the control that proves the trajectory tests can fail."""

    def on_step_end(self, args, state, control, **kwargs):
        torch.rand(1)














# drift curves: logged name -> how to read it from a metrics.jsonl group row (NaN: not logged for that group)
DRIFT_LOGGED = {
    "margin_change": lambda m: m["margin_change"],
    "margin_change_low": lambda m: m["margin_change_ci_low"],
    "margin_change_high": lambda m: m["margin_change_ci_high"],
    "kl": lambda m: m["kl"],
    "gold_logprob_change": lambda m: m["gold_logprob_change"],
    "at_risk": lambda m: float(m["at_risk"]) if m["n_at_risk_eligible"] else math.nan,
}


# behaviour curves of generated answers (none here: short answers are teacher-forced): logged name -> metrics.jsonl field;
# NaN: not logged
BEHAVIOR_LOGGED = {
    "runaway": "runaway", "runaway_rate": "runaway_rate", "length_log_ratio": "length_log_ratio",
    "length_log_ratio_low": "length_log_ratio_ci_low", "length_log_ratio_high": "length_log_ratio_ci_high",
    "over_refusal": "over_refusal", "over_refusal_rate": "over_refusal_rate", "instruct_forgetting": "instruct_forgetting",
    "instruct_compliance": "instruct_compliance", "instruct_deviation": "instruct_deviation",
    "runaway_deviation": "runaway_deviation", "over_refusal_deviation": "over_refusal_deviation",
    "length_deviation": "length_deviation",
}


def expected_logged(groups: dict[str, dict]) -> dict[str, float]:
    """Every scalar one evaluation logs, from its metrics.jsonl row: flip metrics, drift and behaviour, overall and per
    category."""
    out = {}
    for group, m in groups.items():
        figures = {name: m[field] for name, field in LOGGED.items() if m["adjusted"] or not name.endswith("_adjusted")}
        figures.update({name: f(m) for name, f in DRIFT_LOGGED.items() if not math.isnan(f(m))})
        figures.update({name: m[f] for name, f in BEHAVIOR_LOGGED.items() if f in m and not math.isnan(m[f])})
        out.update({logged_name(group, name): v for name, v in figures.items()})
    if "noise_probes" in groups["overall"]:  # the precision noise floor (a base scored in bf16 and in fp32)
        out["forgetwatch_details/noise_probes"] = groups["overall"]["noise_probes"]
        out["forgetwatch_details/forgetting_excl_noise"] = groups["overall"]["forgetting_excl_noise"]
    return out


pytestmark = pytest.mark.usefixtures("one_thread")


# -- one SFT run, report_to wandb, shared by the tests that read it -------------------------------------------


@pytest.fixture(scope="module")
def sft_run(tokenizer, tmp_path_factory):
    """SFT for 6 steps (bf16 autocast, LR 5e-2), probes every 2 steps, replay on, checkpoints every 2 steps,
    logging to an offline W&B run."""
    root = tmp_path_factory.mktemp("sft_run")
    with pytest.MonkeyPatch.context() as mp:
        clear_wandb_env(mp, root / "wandb")
        finish_offline_run()
        cb = watcher(replay=True)
        trainer = sft_trainer(tokenizer, root / "out", [cb], report_to="wandb", save_strategy="steps", save_steps=2)
        try:
            trainer.train()
        finally:
            finish_offline_run()  # WandbCallback leaves the run open; the file is complete after teardown
    return SimpleNamespace(trainer=trainer, callback=cb, out=root / "out", wandb_file=find_run_file(root / "wandb"),
                           record=load_record(root / "out"))


def test_sft_wandb_scalars_equal_the_local_record(sft_run):
    rows = read_history(sft_run.wandb_file)
    metrics = metric_rows(sft_run.record)
    assert sorted(metrics) == [0, 2, 4, 6]

    logged = [r for r in rows if "forgetwatch/forgetting" in r]
    assert [r["train/global_step"] for r in logged] == [0, 2, 4, 6]  # one row per evaluation, on the trainer's axis
    for r in logged:
        step = r["train/global_step"]
        groups = metrics[step]["metrics"]
        assert list(groups) == ["overall", *CATEGORIES]
        for group, m in groups.items():
            for name in LOGGED:
                if name.endswith("_adjusted") and not m["adjusted"]:
                    assert logged_name(group, name) not in r  # short answers only: no chance term, no "adjusted" curve
        scalars = {k: v for k, v in r.items() if k.startswith("forgetwatch") and isinstance(v, (int, float))
                   and k != "forgetwatch_details/probe_seconds"}
        assert scalars == expected_logged(groups), step
    drift = metrics[6]["metrics"]["overall"]
    assert drift["n_margin"] == 28 and drift["margin_change"] < 0 and drift["kl"] > 0  # the model moved
    assert "forgetwatch_details/kl" in logged[-1] and "forgetwatch_details/kl_in_short" not in logged[-1]  # no options
    assert not groups["short"]["adjusted"] and "forgetwatch_by_category/forgetting/short" in logged[-1]
    assert any(m["metrics"]["overall"]["forgotten"] > 0 for m in metrics.values())  # the LR is high enough to flip

    # the trainer's own W&B rows: every step's loss, none of our keys merged into them
    own = {r["train/global_step"]: r["train/loss"] for r in rows if "train/loss" in r}
    assert own == {e["step"]: pytest.approx(e["loss"]) for e in sft_run.trainer.state.log_history if "loss" in e}
    assert sorted(own) == [1, 2, 3, 4, 5, 6]
    assert not any(k.startswith("forgetwatch/") for r in rows if "train/loss" in r for k in r)
    assert not any(k.startswith("forgetwatch") for e in sft_run.trainer.state.log_history for k in e)


def test_sft_wandb_flip_tables_summary_and_axis(sft_run):
    path = sft_run.wandb_file
    rows = read_history(path)
    tables = {r["train/global_step"]: load_table(path.parent, r["forgetwatch/flips"]) for r in rows if "forgetwatch/flips" in r}
    flips: dict[int, list[dict]] = {}
    for f in sft_run.record.read_flips():
        flips.setdefault(f["step"], []).append(f)
    assert flips and tables == flips  # only this evaluation's flips, one table per evaluation that had any
    steps, matrix = sft_run.record.outcome_matrix()
    for e in range(1, len(steps)):
        changed = {sft_run.callback.probes[int(i)].id for i in np.flatnonzero((matrix[e] == 1) != (matrix[e - 1] == 1))}
        assert {f["id"] for f in flips.get(steps[e], [])} == changed

    last = metric_rows(sft_run.record)[6]["metrics"]
    summary = read_summary(path)
    final = {k: v for k, v in summary.items() if k.startswith("forgetwatch") and "/final/" in k}
    assert final == {k.replace("/", "/final/", 1): v for k, v in expected_logged(last).items()}

    for glob in ("forgetwatch/*", "forgetwatch_*"):  # overall keys, and per-category keys forgetwatch_<metric>/<category>
        assert {"glob_name": glob, "step_metric": "train/global_step",
                "options": {"step_sync": True, "defined": True}} in read_metric_definitions(path)
    # W&B's sections (one per prefix up to the last "/"): the overview, one per overview figure with every category
    # side by side in it, and one for the rest
    sections = {k.rsplit("/", 1)[0] for r in read_history(path) for k in r if k.startswith("forgetwatch")}
    assert sections == {"forgetwatch", "forgetwatch_details"} | {f"forgetwatch_by_category/{m}" for m in LOGGED if m in OVERVIEW}
    config = read_config(path)["forgetwatch"]
    assert config["n_probes"] == 32 and config["fingerprint"] == make_probes().fingerprint and config["eval_steps"] == 2


def test_sft_record_numbers_are_right(sft_run, tokenizer):
    """Re-score the base model, a saved checkpoint and the final model outside training: same outcomes, same metrics."""
    from transformers import AutoModelForCausalLM

    probes, record = make_probes(), sft_run.record
    metrics = metric_rows(record)
    k = np.array([p.num_choices for p in probes])
    cats = [p.category for p in probes]

    base = rescore(build_model(tokenizer, seed=SEED), tokenizer, probes)
    cache = BaseCache.load(sft_run.out / "forgetwatch" / "base.parquet")
    assert cache.key["scoring"]["precision"] == BF16
    assert np.array_equal(cache.results.outcome, base.outcome)
    assert np.array_equal(record.read_eval(0)["outcome"], base.outcome)

    checkpoints = [(s, AutoModelForCausalLM.from_pretrained(sft_run.out / f"checkpoint-{s}")) for s in (2, 4)]
    for step, model in [*checkpoints, (6, sft_run.trainer.model)]:
        now = rescore(model, tokenizer, probes)
        saved = record.read_eval(step)
        assert np.array_equal(saved["outcome"], now.outcome), step
        assert np.array_equal(saved["pred_index"], now.pred_index), step
        np.testing.assert_allclose(saved["margin"], now.margin, rtol=0, atol=1e-6, equal_nan=True)
        report = compute_report(base.outcome, now.outcome, k, cats)
        drift = compute_drift(base, now, cats)
        for group, m in report.items():
            got = metrics[step]["metrics"][group]
            assert json.loads(json.dumps(m.to_dict())) == {f: got[f] for f in m.to_dict()}, (step, group)
            want = json.loads(json.dumps(drift[group].to_dict()))  # rescored margins agree to 1e-6, not bit for bit
            assert {f: got[f] for f in want} == pytest.approx(want, abs=1e-4, nan_ok=True), (step, group)

    for row in metrics.values():
        for m in row["metrics"].values():  # the identity BT - F = acc_post - acc_pre, overall and per category
            assert m["backward_transfer"] - m["forgetting"] == pytest.approx(m["accuracy_post"] - m["accuracy_pre"], abs=1e-12)
            assert m["forgotten"] + m["retained"] + m["learned"] + m["never"] == m["n"]


def test_replay_matches_the_evaluation_matrix(sft_run, tokenizer, tmp_path):
    from datasets import Dataset

    probes = make_probes()
    steps, matrix = sft_run.record.outcome_matrix()
    assert steps == [0, 2, 4, 6]
    base, history = matrix[0], matrix[1:]
    expected = {}
    for i, p in enumerate(probes):
        if base[i] != 1 or (history[:, i] == 1).all():
            continue
        seq = [base[i], *history[:, i]]
        expected[p.id] = {
            "first_forgotten_step": steps[1 + int(np.argmax(history[:, i] != 1))],
            "recovered": bool(history[-1, i] == 1),
            "forgetting_events": sum(a == 1 and b != 1 for a, b in zip(seq, seq[1:], strict=False)),
        }
    assert expected
    path = sft_run.out / "forgetwatch" / "replay.jsonl"
    replay = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["id"] for r in replay] == [p.id for p in probes if p.id in expected]  # record order
    for r in replay:
        assert {k: r[k] for k in expected[r["id"]]} == expected[r["id"]], r["id"]
        p = probes[r["id"]]
        assert r["solution"] == LETTERS[p.gold]
        assert r["messages"][-1] == {"role": "assistant", "content": f"{LETTERS[p.gold]}. {p.choices[p.gold]}"}
        assert [*r["prompt"], *r["completion"]] == r["messages"] and p.question in r["prompt"][0]["content"]
    assert sft_run.callback.replay_examples() == replay

    # The file trains as it is: SFT (prompt-completion), and GRPO with forgetwatch's own reward on `solution`.
    ds = Dataset.from_json(str(path))
    assert {"messages", "prompt", "completion", "solution"} <= set(ds.column_names) and len(ds) == len(replay)
    sft = sft_trainer(tokenizer, tmp_path / "sft", dataset=ds, max_steps=1, max_length=256)  # lettered prompts are long
    sft.train()
    assert sft.state.global_step == 1
    from trl import GRPOConfig, GRPOTrainer

    grpo = GRPOTrainer(
        model=build_model(tokenizer), train_dataset=ds, processing_class=tokenizer, reward_funcs=mcq_reward,
        args=GRPOConfig(output_dir=str(tmp_path / "grpo"), use_cpu=True, max_steps=1, per_device_train_batch_size=4,
                        num_generations=4, max_completion_length=8, report_to="none", disable_tqdm=True),
    )
    grpo.train()
    assert grpo.state.log_history[0]["rewards/mcq_reward/mean"] >= 0


# -- GRPO ------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def grpo_runs(tokenizer, tmp_path_factory):
    """GRPO, attention dropout on, 5 steps: with the callback (probes at 0, 2, 4 and the end), without, and with a
    callback that draws from the RNG."""
    root = tmp_path_factory.mktemp("grpo")
    runs = {}
    for name, callbacks in [("watched", [watcher()]), ("plain", []), ("rng", [ConsumeRng()])]:
        runs[name] = grpo_trainer(tokenizer, root / name, callbacks, dropout=0.1, max_steps=5)
        runs[name].train()
    return SimpleNamespace(root=root, **runs)


def test_grpo_runs_with_the_callback(grpo_runs):
    trainer = grpo_runs.watched
    assert trainer.state.global_step == 5
    record = load_record(grpo_runs.root / "watched")
    assert record.eval_steps() == [0, 2, 4, 5]  # every 2 steps, and the end of training
    assert sorted(metric_rows(record)) == [0, 2, 4, 5]
    assert the_watcher(trainer).evaluated_steps == [0, 2, 4, 5]

    # TRL's GRPO metrics are logged at the same steps with the same keys (not flushed early, none merged)
    shape = [(e["step"], sorted(e)) for e in trainer.state.log_history]
    assert shape == [(e["step"], sorted(e)) for e in grpo_runs.plain.state.log_history]
    keys = set(trainer.state.log_history[0])
    assert {"reward", "reward_std", "completions/mean_length", "loss"} <= keys
    assert [e["step"] for e in trainer.state.log_history if "reward" in e] == [1, 2, 3, 4, 5]


def _numeric(row: dict) -> dict:
    return {k: v for k, v in row.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def test_the_trainers_own_log_rows_are_kept_for_the_report(sft_run, grpo_runs, tmp_path):
    """on_log copies every row the trainer logs (loss, learning rate, GRPO reward) into the record, on its step."""
    from forgetwatch.report.render import make_report

    for trainer, record in ((sft_run.trainer, sft_run.record), (grpo_runs.watched, load_record(grpo_runs.root / "watched"))):
        kept = record.read_trainer_log()
        assert [_numeric(r) for r in kept] == [_numeric(e) for e in trainer.state.log_history]
    grpo = load_record(grpo_runs.root / "watched")
    assert [r["step"] for r in grpo.read_trainer_log() if "reward" in r] == [1, 2, 3, 4, 5]
    page = make_report(grpo_runs.root / "watched", tmp_path / "report")
    assert (tmp_path / "report" / "training.png").is_file() and 'src="training.png"' in page.read_text(encoding="utf-8")


def test_on_log_copies_and_never_raises(tmp_path, caplog):
    cb = watcher()
    cb._record_root, cb._is_main = tmp_path / "forgetwatch", True
    cb._record_root.mkdir()
    state = SimpleNamespace(global_step=3, epoch=0.5)
    logs = {"loss": float("nan"), "grad_norm": float("inf"), "learning_rate": 1e-3, "note": "text", "flag": True,
            "forgetwatch/forgetting": 0.1}
    before = dict(logs)
    cb.on_log(None, state, None, logs=logs)
    assert logs.keys() == before.keys() and logs["learning_rate"] == 1e-3 and math.isnan(logs["loss"])  # untouched
    (row,) = RunRecord(cb._record_root).read_trainer_log()
    assert row == {"step": 3, "epoch": 0.5, "loss": None, "grad_norm": None, "learning_rate": 1e-3}
    assert "NaN" not in (cb._record_root / "trainer_log.jsonl").read_text()  # strict JSON
    # a rank other than the main one writes nothing
    cb._is_main = False
    cb.on_log(None, state, None, logs={"loss": 1.0})
    assert len(RunRecord(cb._record_root).read_trainer_log()) == 1
    # a record that cannot be written: a logged error, never an exception into the training loop
    cb._is_main, cb._record_root = True, tmp_path / "a-file"
    cb._record_root.write_text("")
    with caplog.at_level(logging.ERROR, logger="forgetwatch"):
        cb.on_log(None, state, None, logs={"loss": 1.0})
    assert "could not keep the trainer's log row at step 3" in caplog.text


def test_grpo_trajectory_is_bit_identical(grpo_runs):
    assert_same_weights(grpo_runs.watched.model, grpo_runs.plain.model)
    assert own_logs(grpo_runs.watched) == own_logs(grpo_runs.plain)
    # the control: drawing one random number per step changes the sampled trajectory
    assert own_logs(grpo_runs.rng) != own_logs(grpo_runs.plain)


def test_sft_trajectory_is_bit_identical(tokenizer, tmp_path):
    runs = {}
    for name, callbacks in [("watched", [watcher(eval_steps=1)]), ("plain", []), ("rng", [ConsumeRng()])]:
        runs[name] = sft_trainer(tokenizer, tmp_path / name, callbacks, dropout=0.1, max_steps=4)
        runs[name].train()
    assert load_record(tmp_path / "watched").eval_steps() == [0, 1, 2, 3, 4]
    assert_same_weights(runs["watched"].model, runs["plain"].model)
    assert own_logs(runs["watched"]) == own_logs(runs["plain"])  # the same entries: none dropped, none merged
    assert [e["step"] for e in runs["watched"].state.log_history if "loss" in e] == [1, 2, 3, 4]
    assert not any(k.startswith("forgetwatch") for e in runs["watched"].state.log_history for k in e)
    assert own_logs(runs["rng"]) != own_logs(runs["plain"])  # control: dropout makes the trajectory RNG-sensitive


# -- failing W&B -------------------------------------------------------------------------------------------------


def test_wandb_log_failing_turns_the_logger_off_and_training_goes_on(offline_wandb, tokenizer, tmp_path, monkeypatch, caplog):
    calls = []

    def failing_log(*args, **kwargs):
        calls.append(args)
        raise wandb.errors.CommError("network is down")

    real_init = wandb.init

    def init(*args, **kwargs):
        run = real_init(*args, **kwargs)
        run.log = failing_log  # the run's own method; `wandb.log`, which WandbCallback uses, still works
        return run

    monkeypatch.setattr(wandb, "init", init)
    caplog.set_level(logging.WARNING, logger="forgetwatch")
    trainer = sft_trainer(tokenizer, tmp_path / "out", [watcher(eval_steps=1)], report_to="wandb", max_steps=3)
    trainer.train()
    finish_offline_run()

    assert trainer.state.global_step == 3
    record = load_record(tmp_path / "out")
    assert record.eval_steps() == [0, 1, 2, 3] and sorted(metric_rows(record)) == [0, 1, 2, 3]
    assert len(calls) == 1  # switched off after the first failure
    warnings = [r for r in caplog.records if r.name.startswith("forgetwatch") and "nothing to forget" not in r.getMessage()]
    assert len(warnings) == 1 and "wandb" in warnings[0].getMessage() and "network is down" in warnings[0].getMessage()
    rows = read_history(find_run_file(offline_wandb))
    assert sorted(r["train/global_step"] for r in rows if "train/loss" in r) == [1, 2, 3]  # the trainer's logs went on
    assert not any(k.startswith("forgetwatch/") for r in rows for k in r)


def test_wandb_init_failing(offline_wandb, tokenizer, tmp_path, monkeypatch, caplog):
    from transformers.integrations import WandbCallback

    def failing_init(*args, **kwargs):
        raise wandb.errors.UsageError("api_key not configured (no-tty)")

    monkeypatch.setattr(wandb, "init", failing_init)
    # With the trainer's WandbCallback, its own wandb.init fails in on_train_begin, before forgetwatch scores anything.
    counter = StepCounter()
    trainer = sft_trainer(tokenizer, tmp_path / "a", [watcher(), counter], report_to="wandb")
    with pytest.raises(wandb.errors.UsageError):
        trainer.train()
    assert counter.steps == 0 and not (tmp_path / "a" / "forgetwatch" / "evals").exists()

    # Without it (a custom integration, say), forgetwatch never calls wandb.init itself: one warning, full record.
    caplog.set_level(logging.WARNING, logger="forgetwatch")
    trainer = sft_trainer(tokenizer, tmp_path / "b", [watcher()], report_to="wandb", max_steps=4)
    trainer.remove_callback(WandbCallback)
    trainer.train()
    assert trainer.state.global_step == 4
    assert load_record(tmp_path / "b").eval_steps() == [0, 2, 4]
    warnings = [
        r.getMessage() for r in caplog.records if r.name.startswith("forgetwatch") and "nothing to forget" not in r.getMessage()
    ]
    assert len(warnings) == 1 and "no W&B run is active" in warnings[0]


# -- bad input fails before any training step ---------------------------------------------------------------------


def _cache(tokenizer, probes: ProbeSet, config: ScoringConfig, path: Path, outcome: int = 1) -> Path:
    """A base cache with every probe at `outcome` (a value no real scoring of the tiny model gives)."""
    results = ProbeResults.empty(probes.ids)
    results.outcome[:] = outcome
    key = make_cache_key(model_identity(build_model(tokenizer, seed=SEED)), probes, config.key(tokenizer, BF16))
    return BaseCache(key, results).save(path)


def test_hooks_without_the_model_or_tokenizer_name_the_transformers_version(tokenizer, tmp_path):
    """transformers passes `model` and `processing_class` to every hook; a release that stopped must say so, not crash
    later on None."""
    from transformers import TrainerControl, TrainerState, TrainingArguments

    args, state, control = (
        TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none"),
        TrainerState(),
        TrainerControl(),
    )
    with pytest.raises(RuntimeError, match=rf"no `model` in on_train_begin \(transformers {transformers.__version__}\)"):
        watcher().on_train_begin(args, state, control, model=None, processing_class=tokenizer)
    with pytest.raises(ValueError, match=rf"pass `processing_class=tokenizer`.*transformers {transformers.__version__}"):
        watcher().on_train_begin(args, state, control, model=build_model(tokenizer), processing_class=None)


@pytest.mark.parametrize("bf16", [False, True])
def test_the_precision_recorded_is_the_one_the_trainer_runs(tokenizer, tmp_path, monkeypatch, caplog, bf16):
    """transformers 4 takes the precision from $ACCELERATE_MIXED_PRECISION too, which any bf16 TrainingArguments made
    earlier in the process leaves at "bf16": a run whose arguments say fp32 then trains and scores under bf16 autocast.
    The base cache must be keyed with the precision really run (found by running accelerate's forward wrapper)."""
    from forgetwatch.record.cache import BaseCache

    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    trainer = sft_trainer(tokenizer, tmp_path, [watcher()], max_steps=1, bf16=bf16)
    with caplog.at_level(logging.WARNING, logger="forgetwatch"):
        trainer.train()
    precision = BaseCache.load(tmp_path / "forgetwatch" / "base.parquet").key["scoring"]["precision"]
    runs_bf16 = trainer.accelerator.mixed_precision == "bf16"  # what the trainer really trained in
    assert precision == ("float32+autocast-bfloat16" if runs_bf16 else "float32")
    assert ("runs forwards under bfloat16 autocast although" in caplog.text) == (runs_bf16 and not bf16)
    if bf16:
        assert runs_bf16
    if release(transformers.__version__) < (5,):
        assert runs_bf16  # the environment wins over `bf16=False` there


def test_bad_probe_file_or_foreign_cache_fail_at_construction(tokenizer, tmp_path):
    path = tmp_path / "probes.jsonl"
    lines = [json.dumps(p.to_dict()) for p in list(make_probes())[:2]]
    path.write_text("\n".join([*lines, '{"id": "x", "kind": "mcq", "question": "q", "choices": ["a"], "gold": 0}']) + "\n")
    with pytest.raises(ProbeFormatError, match=rf"{path} line 3: field `choices`"):
        ForgetWatchCallback(str(path))

    probes = make_probes()
    other = ProbeSet(list(probes)[:-1])
    cache = _cache(tokenizer, other, ScoringConfig(**SCORING), tmp_path / "other.parquet")
    with pytest.raises(CacheMismatchError, match="probes.fingerprint"):
        ForgetWatchCallback(probes, base_cache=str(cache))


def test_cache_with_other_scoring_is_rescored_with_a_warning(tokenizer, tmp_path, caplog):
    probes = make_probes()
    cache = _cache(tokenizer, probes, ScoringConfig(mcq_mode="letter", **SCORING), tmp_path / "letter.parquet")
    caplog.set_level(logging.WARNING, logger="forgetwatch")
    trainer = sft_trainer(tokenizer, tmp_path / "out", [watcher(base_cache=str(cache))], max_steps=2)
    trainer.train()
    warnings = [r.getMessage() for r in caplog.records if r.name.startswith("forgetwatch") and "cache" in r.getMessage()]
    assert len(warnings) == 1 and "scoring.mcq_mode: cache has 'letter', now 'loglik'" in warnings[0]
    base = rescore(build_model(tokenizer, seed=SEED), tokenizer, probes)
    record = load_record(tmp_path / "out")
    assert np.array_equal(record.read_eval(0)["outcome"], base.outcome)  # the base model, not the cache's all-correct
    assert metric_rows(record)[0]["metrics"]["overall"]["accuracy_pre"] == pytest.approx(base.accuracy)
    assert BaseCache.load(cache).key["scoring"]["mcq_mode"] == "letter"  # the user's cache is never overwritten
    assert BaseCache.load(record.root / "base.parquet").key["scoring"]["mcq_mode"] == "loglik"  # the fresh one


def test_fresh_run_in_a_used_output_dir_starts_a_new_record(tokenizer, tmp_path):
    sft_trainer(tokenizer, tmp_path, [watcher(eval_steps=1)], max_steps=2).train()
    assert load_record(tmp_path).eval_steps() == [0, 1, 2]
    first = (tmp_path / "forgetwatch" / "metrics.jsonl").read_text()
    (tmp_path / "forgetwatch" / "report").mkdir()  # as `forgetwatch report` leaves it
    trainer = sft_trainer(tokenizer, tmp_path, [watcher(eval_steps=1)], max_steps=1)  # not a resume: from step 0
    trainer.train()
    record = load_record(tmp_path)
    assert record.eval_steps() == [0, 1]
    assert [r["step"] for r in record.read_metrics()] == [0, 1]  # one step-0 row, not the old one and a new one
    assert {f["step"] for f in record.read_flips()} <= {1}
    assert the_watcher(trainer).evaluated_steps == [0, 1]
    assert not (record.root / "report").exists()  # no stale report of the earlier run in the new record
    # the earlier run's record is kept beside it, whole
    (kept,) = [d for d in tmp_path.iterdir() if d.name.startswith("forgetwatch.")]
    assert (kept / "metrics.jsonl").read_text() == first and (kept / "report").is_dir()
    assert RunRecord(kept).eval_steps() == [0, 1, 2]
    assert (record.root / "base.parquet").is_file()


def test_resume_with_a_mismatched_or_missing_cache_fails_before_a_step(sft_run, tokenizer, tmp_path):
    checkpoint = str(sft_run.out / "checkpoint-2")
    letter = _cache(tokenizer, make_probes(), ScoringConfig(mcq_mode="letter", **SCORING), tmp_path / "letter.parquet")
    for base_cache, error in [(str(letter), CacheMismatchError), (None, FileNotFoundError)]:
        counter = StepCounter()
        out = tmp_path / ("mismatch" if base_cache else "missing")
        trainer = sft_trainer(tokenizer, out, [watcher(base_cache=base_cache), counter], save_strategy="steps", save_steps=2)
        with pytest.raises(error, match="mcq_mode" if base_cache else "resuming at step 2"):
            trainer.train(resume_from_checkpoint=checkpoint)
        assert counter.steps == 0 and trainer.state.global_step == 2
        assert not (out / "forgetwatch" / "evals").exists()


# -- resume ---------------------------------------------------------------------------------------------------------


def test_resume_finds_the_base_the_run_scored_when_the_given_cache_was_absent(tokenizer, tmp_path):
    # base_cache names a file that does not exist: the first run scores the base and keeps it in its record
    given = tmp_path / "not-made-yet.parquet"
    first = sft_trainer(tokenizer, tmp_path / "out", [watcher(base_cache=str(given), replay=True), CrashBeforeStep(4)],
                        save_strategy="steps", save_steps=2)
    with pytest.raises(RuntimeError, match="simulated crash"):
        first.train()
    assert not given.exists() and (tmp_path / "out" / "forgetwatch" / "base.parquet").is_file()
    mine = watcher(base_cache=str(given), replay=True)
    resumed = sft_trainer(tokenizer, tmp_path / "out", [mine], save_strategy="steps", save_steps=2,
                          restore_callback_states_from_checkpoint=True)
    resumed.train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-2"))  # was FileNotFoundError
    assert resumed.state.global_step == 6
    assert load_record(tmp_path / "out").eval_steps() == [0, 2, 4, 6]
    # the object the user holds sees the resumed run, though the Trainer rebuilt the callback from the checkpoint
    restored = the_watcher(resumed)
    assert restored is not mine
    assert mine.evaluated_steps == [0, 2, 4, 6] and mine.record_dir == tmp_path / "out" / "forgetwatch"
    assert mine.replay_examples() == restored.replay_examples()


def test_resume_recomputes_after_the_checkpoint(sft_run, tokenizer, tmp_path):
    out = tmp_path / "out"
    first = sft_trainer(tokenizer, out, [watcher(), CrashBeforeStep(5)], save_strategy="steps", save_steps=2)
    with pytest.raises(RuntimeError, match="simulated crash"):
        first.train()
    record = load_record(out)
    assert sorted(metric_rows(record)) == [0, 2, 4] and (out / "checkpoint-4").is_dir()
    abandoned_row, abandoned_npz = metric_rows(record)[4], record.eval_path(4).read_bytes()
    abandoned_log = [r for r in record.read_trainer_log() if r["step"] > 2]

    # Resume from the earlier checkpoint: the step-4 evaluation of the first run must be dropped and recomputed.
    given = watcher()
    second = sft_trainer(tokenizer, out, [given], save_strategy="steps", save_steps=2,
                         restore_callback_states_from_checkpoint=True)
    second.train(resume_from_checkpoint=str(out / "checkpoint-2"))
    assert second.state.global_step == 6
    cb = the_watcher(second)
    # rebuilt by the trainer from the checkpoint's `state()`: the probe set comes back from the record
    assert cb is not given and cb.probes.fingerprint == given.probes.fingerprint and cb.eval_steps == 2
    assert cb.evaluated_steps == [0, 2, 4, 6]

    metrics, reference = metric_rows(record), metric_rows(sft_run.record)
    assert [r["step"] for r in record.read_metrics()] == [0, 2, 4, 6]
    assert sorted(p.name for p in record.evals_dir.iterdir()) == [f"step-{s:08d}.npz" for s in (0, 2, 4, 6)]
    # the same numbers as the uninterrupted 6-step run (`sft_run`: same seed, data and settings)
    for step in (0, 2, 4, 6):
        ours, theirs = record.read_eval(step), sft_run.record.read_eval(step)
        assert np.array_equal(ours["outcome"], theirs["outcome"]), step
        assert metrics[step]["metrics"] == reference[step]["metrics"], step
    assert record.read_flips() == sft_run.record.read_flips()
    assert_same_weights(second.model, sft_run.trainer.model)
    # the trainer's own log rows of steps 3 and 4 (first run) were replaced by the resumed run's, not duplicated
    losses = [(r["step"], r["loss"]) for r in record.read_trainer_log() if "loss" in r]
    assert losses == [(r["step"], r["loss"]) for r in sft_run.record.read_trainer_log() if "loss" in r]
    assert [s for s, _ in losses] == [1, 2, 3, 4, 5, 6]
    # what the abandoned trajectory wrote after step 2 is set aside whole in one folder, not deleted
    (aside,) = (record.root / "superseded").iterdir()
    assert aside.name == f"after-step-2-{the_watcher(second)._start_id[:12]}"  # the resuming start's folder
    assert (aside / "evals" / "step-00000004.npz").read_bytes() == abandoned_npz
    assert [json.loads(line) for line in (aside / "metrics.jsonl").read_text().splitlines()] == [abandoned_row]
    assert [json.loads(line) for line in (aside / "trainer_log.jsonl").read_text().splitlines()] == abandoned_log
    from forgetwatch.report.render import make_report

    assert f"superseded/{aside.name} (in the record; not in these figures" in make_report(out).read_text()


# -- tensorboard -------------------------------------------------------------------------------------------------


def test_tensorboard_gets_the_scalars(tokenizer, tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logdir = tmp_path / "tb"
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(logdir))
    trainer = sft_trainer(tokenizer, tmp_path / "out", [watcher()], report_to=["tensorboard"], max_steps=4)
    trainer.train()

    # transformers 5 writes to $TENSORBOARD_LOGGING_DIR, 4 to `args.logging_dir` (<output_dir>/runs/<time>): read every
    # event file, by directory; forgetwatch must write into the trainer's own.
    by_dir: dict[Path, dict[str, dict[int, float]]] = {}
    for f in sorted(tmp_path.rglob("events.out.tfevents.*")):
        acc = EventAccumulator(str(f), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            by_dir.setdefault(f.parent, {}).setdefault(tag, {}).update({e.step: e.value for e in acc.Scalars(tag)})
    assert len(by_dir) == 1, {str(d): sorted(t) for d, t in by_dir.items()}
    [(where, scalars)] = by_dir.items()
    if release(transformers.__version__) >= (5,):
        assert where == logdir
    metrics = metric_rows(load_record(tmp_path / "out"))
    for group in ("overall", "add"):
        for name, field in LOGGED.items():
            expected = {step: row["metrics"][group][field] for step, row in metrics.items()}
            assert scalars[logged_name(group, name)] == pytest.approx(expected, abs=1e-6), (group, name)
    assert sorted(scalars["forgetwatch/forgetting"]) == [0, 2, 4]
    assert sorted(scalars["train/loss"]) == [1, 2, 3, 4]  # the trainer's own writer, same directory


def test_mlflow_gets_the_scalars(tokenizer, tmp_path, monkeypatch):
    mlflow = pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    uri = (tmp_path / "mlruns").as_uri()  # a file store (mlflow-skinny has no SQL backend)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "forgetwatch-test")
    trainer = sft_trainer(tokenizer, tmp_path / "out", [watcher()], report_to=["mlflow"], max_steps=5)
    trainer.train()
    mlflow.end_run()

    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("forgetwatch-test").experiment_id])
    metrics = metric_rows(load_record(tmp_path / "out"))
    for group in ("overall", "add"):
        for name, field in LOGGED.items():
            history = {m.step: m.value for m in client.get_metric_history(run.info.run_id, logged_name(group, name))}
            assert history == pytest.approx({s: row["metrics"][group][field] for s, row in metrics.items()}, abs=1e-6)
    assert sorted(metrics) == [0, 2, 4, 5]  # the last step (5) is logged before the trainer's MLflowCallback ends the run
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "loss")) == [1, 2, 3, 4, 5]  # the trainer's own
    # each evaluation's flips as a table artifact, row for row the record's
    flips = load_record(tmp_path / "out").read_flips()
    tables = {
        int(a.path.rsplit("step-", 1)[1].split(".")[0]): a.path
        for a in client.list_artifacts(run.info.run_id, "forgetwatch/flips")
    }
    assert tables and sorted(tables) == sorted({f["step"] for f in flips})
    for step, path in tables.items():
        table = json.loads(Path(client.download_artifacts(run.info.run_id, path, str(tmp_path / "dl"))).read_text())
        rows = [dict(zip(table["columns"], r, strict=True)) for r in table["data"]]
        assert rows == [f for f in flips if f["step"] == step]


@pytest.fixture(scope="module")
def trackio_run(tokenizer, tmp_path_factory):
    """SFT for 5 steps with report_to="trackio", the store in a fresh TRACKIO_DIR."""
    trackio = pytest.importorskip("trackio")
    root = tmp_path_factory.mktemp("trackio")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRACKIO_DIR", str(root / "trackio"))
        mp.setattr(trackio.sqlite_storage, "TRACKIO_DIR", root / "trackio", raising=False)
        # the trackio project: an argument from transformers 5, $TRACKIO_PROJECT before
        from transformers import TrainingArguments

        project = {"project": "fw-test"} if "project" in TrainingArguments.__dataclass_fields__ else {}
        mp.setenv("TRACKIO_PROJECT", "fw-test")
        trainer = sft_trainer(tokenizer, root / "out", [watcher()], report_to=["trackio"], max_steps=5, run_name="run",
                              **project)
        trainer.train()  # the trainer's TrackioCallback finishes the run
        logs = trackio.SQLiteStorage.get_logs("fw-test", "run")
    return SimpleNamespace(root=root, store=root / "trackio", logs=logs, record=load_record(root / "out"))


def test_trackio_gets_the_scalars_and_the_flips_table(trackio_run):
    logs = trackio_run.logs
    metrics = metric_rows(trackio_run.record)
    for group in ("overall", "add"):
        for name, field in LOGGED.items():
            key = logged_name(group, name)
            got = {int(r["train/global_step"]): r[key] for r in logs if key in r}
            assert got == pytest.approx({s: row["metrics"][group][field] for s, row in metrics.items()}, abs=1e-6), key
    assert sorted(metrics) == [0, 2, 4, 5]  # the last step (5) is logged before the trainer's TrackioCallback finishes
    own = [r for r in logs if "train/loss" in r]
    assert [int(r["train/global_step"]) for r in own] == [1, 2, 3, 4, 5]  # the trainer's own rows, untouched
    assert [int(r["step"]) for r in own] == sorted(int(r["step"]) for r in own)  # trackio's own counter still rises
    # the flips of each evaluation as a trackio.Table, row for row the record's
    tables = {int(r["train/global_step"]): r["forgetwatch/flips"] for r in logs if "forgetwatch/flips" in r}
    flips = trackio_run.record.read_flips()
    from forgetwatch.run.loggers import TrackioLogger

    if release(installed_versions(("trackio",))["trackio"]) < TrackioLogger.TABLES_FROM:  # beside transformers 4: scalars only
        assert not tables and flips
        return
    assert tables and sorted(tables) == sorted({f["step"] for f in flips})
    for step, table in tables.items():
        assert table["_type"] == "trackio.table"
        assert table["_value"] == [f for f in flips if f["step"] == step]


CHROMIUM = "/usr/bin/chromium"


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs Debian's chromium (apt-get install chromium; .ci/run installs it)")
@pytest.mark.skipif(  # beside transformers 4 (huggingface_hub < 1): no tables to show, and show() takes no server_port
    release(installed_versions(("trackio",))["trackio"] or "0") < (0, 21),
    reason=f"the dashboard test needs trackio >= 0.21; installed: trackio {installed_versions(('trackio',))['trackio']}")
def test_trackio_dashboard_shows_forgetwatch_offline(trackio_run, tmp_path):
    """trackio's local dashboard, opened in headless Chromium, shows forgetwatch's panels and its flips table."""
    import subprocess
    import sys
    import time
    import urllib.request

    from fixtures.multiproc import free_port

    port = free_port()
    env = {**os.environ, "TRACKIO_DIR": str(trackio_run.store)}
    server = subprocess.Popen(
        [sys.executable, "-c", "import sys, trackio; trackio.show(project='fw-test', open_browser=False, "
         "server_port=int(sys.argv[1]), block_thread=True)", str(port)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(base + "/", timeout=2).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"trackio's dashboard did not start: {server.stderr.read().decode()[-2000:]}") from None
                time.sleep(0.3)

        def chromium(url: str, *what: str) -> str:
            profile = tmp_path / f"profile-{len(list(tmp_path.iterdir()))}"
            # The flags keep Chromium off the network (this machine has none) and let the page's data load before
            # the DOM is dumped (virtual time runs until the page is idle or the budget is spent).
            cmd = [
                CHROMIUM,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-crash-reporter",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                f"--user-data-dir={profile}",
                "--window-size=1400,1000",
                "--virtual-time-budget=15000",
                *what,
                url,
            ]
            # its own session: the crash handler and zygote children go with it, even on a timeout
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
            try:
                stdout, stderr = proc.communicate(timeout=120)
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, 9)
                proc.wait()
            assert proc.returncode == 0, stderr[-2000:]
            return stdout

        dom = chromium(f"{base}/?project=fw-test&smoothing=0", "--dump-dom")
        assert 'data-metric="forgetwatch/forgetting"' in dom and 'data-metric="forgetwatch/backward_transfer"' in dom
        assert 'data-metric="train/loss"' in dom  # beside the trainer's own curves
        media = chromium(f"{base}/media?project=fw-test", "--dump-dom")
        assert "forgetwatch/flips" in media
        flipped = {f["id"] for f in trackio_run.record.read_flips()}
        assert any(f"<td>{pid}</td>" in media or f">{pid}<" in media for pid in flipped)
        shot = tmp_path / "dashboard.png"
        chromium(f"{base}/?project=fw-test&smoothing=0", f"--screenshot={shot}")
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, 15)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.pid, 9)
            server.wait()


# -- short-answer options and "nothing to forget" ------------------------------------------------------------


def test_short_answer_options_reach_scoring_and_the_cache_key(tokenizer, tmp_path):
    cb = watcher(short_mode="generate", short_match="contains")
    sft_trainer(tokenizer, tmp_path / "gen", [cb], max_steps=1).train()
    key = BaseCache.load(tmp_path / "gen" / "forgetwatch" / "base.parquet").key["scoring"]
    assert (key["short_mode"], key["short_match"]) == ("generate", "contains")
    assert cb.state()["args"]["short_mode"] == "generate" and cb.state()["args"]["short_match"] == "contains"
    base = BaseCache.load(tmp_path / "gen" / "forgetwatch" / "base.parquet").results
    short = [i for i, pid in enumerate(base.ids) if pid.startswith("short")]
    assert all(base.generation[i] for i in short)  # decoded

    sft_trainer(tokenizer, tmp_path / "default", [watcher()], max_steps=1).train()
    cache = BaseCache.load(tmp_path / "default" / "forgetwatch" / "base.parquet")
    assert cache.key["scoring"]["short_mode"] == "greedy_match"
    short = [i for i, pid in enumerate(cache.results.ids) if pid.startswith("short")]
    assert not any(cache.results.generation[i] for i in short) and np.isfinite(cache.results.gold_logprob[short]).all()


def test_short_answer_options_are_validated_and_parsed():
    with pytest.raises(ValueError, match="short_mode.*must be one of generate, greedy_match, got 'sample'"):
        watcher(short_mode="sample")
    with pytest.raises(ValueError, match="short_match.*must be one of exact, contains, got 'fuzzy'"):
        watcher(short_match="fuzzy")
    from trl import TrlParser

    from forgetwatch import ForgetWatchArguments

    (args,) = TrlParser((ForgetWatchArguments,)).parse_args_into_dataclasses(
        ["--forgetwatch_probes", "x.jsonl", "--forgetwatch_short_mode", "generate", "--forgetwatch_short_match", "contains"])
    assert (args.forgetwatch_short_mode, args.forgetwatch_short_match) == ("generate", "contains")
    assert args.to_kwargs()["short_mode"] == "generate"


def test_nothing_to_forget_is_warned_once(tokenizer, tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="forgetwatch")
    cb = watcher(eval_steps=1)
    sft_trainer(tokenizer, tmp_path, [cb], max_steps=3).train()
    base = metric_rows(load_record(tmp_path))[0]["metrics"]
    empty = sorted(c for c, m in base.items() if c != "overall" and m["nothing_to_forget"])
    assert "short" in empty  # a random tiny model answers no arithmetic question
    warnings = [r.getMessage() for r in caplog.records if "nothing to forget" in r.getMessage()]
    assert len(warnings) == 1 and all(f"{c} (" in warnings[0] for c in empty)
    assert not any(f"{c} (" in warnings[0] for c in base if c not in empty)


def test_evaluations_show_progress_on_a_terminal_unless_the_trainer_hides_its_bars(tokenizer, tmp_path, monkeypatch):
    """On a terminal a bar per evaluation; with `disable_tqdm` none; into a file (a job's log) none either, so that no
    escape code of ours lands there (`tests/scoring/test_scoring.py::test_the_progress_bar_draws_nothing_into_a_log_file`)."""
    import io
    import sys

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    for disable, out in ((False, Terminal()), (True, Terminal()), (False, io.StringIO())):
        monkeypatch.setattr(sys, "stderr", out)
        sft_trainer(tokenizer, tmp_path / f"{disable}-{type(out).__name__}", [watcher()], max_steps=2,
                    disable_tqdm=disable).train()
        drawn = "forgetwatch: scoring the base model" in out.getvalue() and "forgetwatch: step 2" in out.getvalue()
        assert drawn == (not disable and isinstance(out, Terminal)), (disable, type(out).__name__)
        assert isinstance(out, Terminal) or "\x1b[" not in out.getvalue()


def test_a_cli_cache_made_like_the_trainer_runs_is_used(tokenizer, tiny_model_dir, tmp_path, caplog):
    """The cache-once workflow with TRL's default bf16 autocast: a float32 cache is refused with the exact command that
    makes an accepted one; that command's cache is then used as it is, on the trainer's first step."""
    import shlex

    from transformers import AutoModelForCausalLM

    from forgetwatch.cli import main

    probes = tmp_path / "probes.jsonl"
    make_probes().to_jsonl(probes)
    fp32 = tmp_path / "fp32.parquet"
    assert main(["cache", "--model", str(tiny_model_dir), "--probes", str(probes), "--max-new-tokens", "4", "-o", str(fp32)]) == 0
    caplog.set_level(logging.WARNING, logger="forgetwatch")
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    sft_trainer(tokenizer, tmp_path / "a", [ForgetWatchCallback(str(probes), eval_steps=2, base_cache=str(fp32), **SCORING)],
                model=model, max_steps=1).train()
    (warning,) = [r.getMessage() for r in caplog.records if "A cache this run accepts" in r.getMessage()]
    assert "scoring.precision: cache has 'float32', now 'float32+autocast-bfloat16'" in warning
    command = warning.split("A cache this run accepts: ")[1].strip()
    assert "--autocast bfloat16" in command and f"--model {tiny_model_dir}" in command and command.endswith(f"-o {fp32}")

    bf16 = tmp_path / "bf16.parquet"
    argv = shlex.split(command.removeprefix("forgetwatch ").replace(f"-o {fp32}", f"-o {bf16}"))
    assert main(argv) == 0
    caplog.clear()
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    sft_trainer(tokenizer, tmp_path / "b", [ForgetWatchCallback(str(probes), eval_steps=2, base_cache=str(bf16), **SCORING)],
                model=model, max_steps=1).train()
    assert not [r for r in caplog.records if "cache" in r.getMessage()]  # accepted as it is
    assert not (tmp_path / "b" / "forgetwatch" / "base.parquet").exists()  # nothing re-scored
    record = load_record(tmp_path / "b")
    assert np.array_equal(record.read_eval(0)["outcome"], BaseCache.load(bf16).results.outcome)
    # the bf16 cache keeps the fp32 base beside it (the noise floor), the same as the fp32 cache's results
    reference, plain = BaseCache.load(bf16).reference, BaseCache.load(fp32).results
    assert np.array_equal(reference.outcome, plain.outcome)
    np.testing.assert_allclose(reference.margin, plain.margin, atol=1e-6, equal_nan=True)
    noise = int(((BaseCache.load(bf16).results.outcome == 1) != (plain.outcome == 1)).sum())
    assert metric_rows(record)[0]["metrics"]["overall"]["noise_probes"] == noise
