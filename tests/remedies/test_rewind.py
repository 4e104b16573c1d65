"""Rewind (issue 42 item 4): the final model stepped back toward its base, α picked by the stated rule and saved.

Real trainers on the tiny Llama (TRL SFT with an eval set, a LoRA adapter, DPO, GRPO), the record they write, the
rewound model loaded back and scored, `forgetwatch rewind` on a finished run, an offline W&B run read back."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import math
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import build_model, build_tokenizer, penalty_pool
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

pytest.importorskip("trl")

from conftest import clear_wandb_env  # noqa: E402
from fixtures.trainers import SEED, make_probes, sft_dataset
from fixtures.wandb_offline import find_run_file, finish_offline_run, read_history, read_summary  # noqa: E402

import forgetwatch.remedies.rewind as rewind_module  # noqa: E402
from forgetwatch import ForgetWatchArguments, ForgetWatchCallback  # noqa: E402
from forgetwatch.cli import main as cli  # noqa: E402
from forgetwatch.errors import InterpolationError  # noqa: E402
from forgetwatch.record.cache import BaseCache  # noqa: E402
from forgetwatch.remedies.rewind import RULE, pick_alpha, read_rewind  # noqa: E402
from forgetwatch.remedies.rewinder import RewindCallback, rewind_callback  # noqa: E402
from forgetwatch.run.monitor import figure_rows  # noqa: E402
from forgetwatch.scoring.score import score_with_key  # noqa: E402

pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.filterwarnings("ignore:`gradient_checkpointing.*` is deprecated:FutureWarning"),
              pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing.*:FutureWarning")]

ROOT = Path(__file__).resolve().parents[2]
SCORING = {"forgetwatch_max_new_tokens": 4}  # short answers are generated: 4 tokens keep it fast


# -- building blocks ----------------------------------------------------------------------------------------------


def base_model(root: Path) -> tuple[Path, object]:
    """The tiny base saved with its tokenizer: the trainer loads it from there, as the rewind streams it."""
    tok = build_tokenizer()
    path = root / "base"
    if not path.is_dir():
        build_model(tok, seed=SEED).save_pretrained(path)
        tok.save_pretrained(path)
    return path, tok


def fw_args(root: Path, **options) -> ForgetWatchArguments:
    probes = root / "probes.jsonl"
    make_probes().to_jsonl(probes)
    return ForgetWatchArguments(forgetwatch_probes=str(probes), forgetwatch_eval_steps=3, **SCORING, **options)


def task_file(root: Path) -> Path:
    path = root / "task.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in sft_dataset().to_list()[8:]))
    return path


def sft_trainer(base: Path, tok, out: Path, callbacks, *, model=None, eval_set=True, **overrides):
    """TRL SFT for 6 steps from the saved base (bf16 autocast, TRL's default), an eval set evaluated at the end."""
    from trl import SFTConfig, SFTTrainer

    kwargs = {"output_dir": str(out), "use_cpu": True, "max_steps": 6, "per_device_train_batch_size": 4,
              "learning_rate": 5e-2, "logging_steps": 1, "max_length": 64, "report_to": "none", "save_strategy": "no",
              "seed": SEED, "disable_tqdm": True}
    if eval_set:
        kwargs.update(eval_strategy="steps", eval_steps=6, per_device_eval_batch_size=4)
    kwargs.update(overrides)
    data = sft_dataset()
    return SFTTrainer(model=model if model is not None else AutoModelForCausalLM.from_pretrained(base),
                      args=SFTConfig(**kwargs), train_dataset=data, eval_dataset=data.select(range(8)) if eval_set else None,
                      processing_class=tok, callbacks=list(callbacks))


class Snapshot(TrainerCallback):
    """The trainer's model at the end of training: every tensor, its train/eval flags and requires_grad."""

    def on_train_end(self, args, state, control, model=None, **kwargs):
        self.weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
        self.flags = [(n, m.training) for n, m in model.named_modules()]
        self.grads = [(n, p.requires_grad, p.dtype, p.device) for n, p in model.named_parameters()]


def rescore(model_dir: Path, record: Path) -> dict:
    """`model_dir` loaded and scored as the record's base cache was (its settings and precision), figures against it."""
    from forgetwatch.probes.probe_set import ProbeSet

    probes = ProbeSet.from_jsonl(record / "probes.jsonl")
    cache = BaseCache.load(record / "base.parquet").for_probes(probes.ids)
    config, dtype, autocast = rewind_module._scoring_config(cache.key, record, None, None)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype))
    tok = AutoTokenizer.from_pretrained(model_dir)
    results, _ = score_with_key(model, tok, probes, config, autocast)
    return figure_rows(probes, cache.results, results)[2]


def same(a: dict, b: dict) -> bool:
    """Figures equal, NaN equal to NaN."""
    return all(a[g][k] == b[g][k] or (a[g][k] != a[g][k] and b[g][k] != b[g][k]) for g in a for k in a[g]
               if not isinstance(a[g][k], (dict, list)))


def strip_json(value):
    """Figures as rewind.json holds them (NaN as null)."""
    return json.loads(json.dumps(value).replace("NaN", "null"))


# -- one SFT run with the rewind, W&B offline, shared by the tests that read it -----------------------------------


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("rewind")
    base, tok = base_model(root)
    held = root / "heldout.jsonl"
    penalty_pool().to_jsonl(held)
    args = fw_args(root, forgetwatch_budget="forgetting=0.3", forgetwatch_rewind=True,
                   forgetwatch_rewind_heldout=str(held))
    before, after = Snapshot(), Snapshot()
    callbacks = [ForgetWatchCallback.from_args(args), before, rewind_callback(args), after]
    with pytest.MonkeyPatch.context() as mp:
        clear_wandb_env(mp, root / "wandb")
        finish_offline_run()
        trainer = sft_trainer(base, tok, root / "out", callbacks, report_to="wandb")
        console = io.StringIO()  # what the user's terminal shows (the console lines go to the current stdout)
        try:
            with contextlib.redirect_stdout(console):
                trainer.train()
        finally:
            finish_offline_run()
    trainer.save_model(str(root / "out"))  # the final model, as recipes/common.py's finish() saves it
    out = root / "out"
    return SimpleNamespace(root=root, base=base, out=out, record=out / "forgetwatch", trainer=trainer, before=before,
                           after=after, rewind=read_rewind(out), wandb_file=find_run_file(root / "wandb"),
                           callback=callbacks[2], console=console.getvalue())


def test_the_run_writes_the_front_the_rule_and_the_pick(run):
    data = run.rewind.data
    assert data["alphas"] == [0.5, 0.6, 0.7, 0.8, 0.9, 1.0] and [p["alpha"] for p in data["front"]] == data["alphas"]
    assert data["rule"] == RULE and data["task"]["source"] == "the trainer's eval set"
    assert data["budget"]["limits"] == {"forgetting": 0.3} and data["budget"]["bound"] == "lower"
    points = [{k: p[k] for k in ("alpha", "forgetting", "task", "within_budget")} for p in data["front"]]
    assert all(math.isfinite(p["task"]) for p in points)
    assert tuple(pick_alpha(points, budgeted=True)) == tuple(data["pick"].values())  # the rule, applied to the front
    assert data["pick"]["alpha"] == run.rewind.alpha and data["rewound"] == str(run.out / "rewound")
    assert not (run.record / "rewind").exists()  # the scratch copy of the final model is gone
    group, metric = data["measure"]["group"], data["measure"]["metric"]
    for p in data["front"]:
        assert p["forgetting"] == p["metrics"][group][metric]
    assert run.callback.result.line().startswith(f"rewind: α {run.rewind.alpha:g} (")
    # in a user's own script too, the pick is the run's last console line (not only in rewind.json and the report)
    said = [line for line in run.console.splitlines() if line.startswith("forgetwatch ")]
    assert said[-1] == f"forgetwatch {run.rewind.line()}" and said[-3].startswith("forgetwatch step ")
    assert said[-2].startswith("forgetwatch rewind: ") and "α to score" in said[-2]  # what it will cost, said first
    assert "forgetwatch: probing cost this run" in run.console  # the monitor's cost line, at the end of training
    assert "eval loss" in run.rewind.line() and "model in" in run.rewind.line()


def test_alpha_1_is_the_final_evaluation_figure_for_figure(run):
    check = run.rewind.data["check_alpha_1"]
    assert check["equal"] is True and check["step"] == 6 and check["compared"] > 100
    final = json.loads((run.record / "metrics.jsonl").read_text().splitlines()[-1])
    assert final["step"] == 6
    one = run.rewind.point(1.0)["metrics"]
    for group, row in one.items():
        for k, v in row.items():
            assert strip_json(final["metrics"][group].get(k, v)) == strip_json(v), (group, k)


def test_the_rewound_model_loads_and_scores_to_the_figures_recorded_for_its_alpha(run):
    rewound = run.out / "rewound"
    assert (rewound / "model.safetensors").is_file() and (rewound / "tokenizer_config.json").is_file()
    from safetensors import safe_open

    with safe_open(rewound / "model.safetensors", "pt") as f, safe_open(run.out / "model.safetensors", "pt") as g:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {g.get_slice(k).get_dtype() for k in g.keys()}  # noqa: SIM118
    got = strip_json(rescore(rewound, run.record))
    assert same(got, strip_json(run.rewind.point(run.rewind.alpha)["metrics"]))


def test_the_trainers_model_is_left_bit_identical(run):
    assert run.before.weights.keys() == run.after.weights.keys()
    for k, v in run.before.weights.items():
        assert torch.equal(v, run.after.weights[k]), k
    assert run.before.flags == run.after.flags and run.before.grads == run.after.grads
    from safetensors.torch import load_file

    saved = load_file(run.out / "model.safetensors")  # what the trainer saved after the rewind
    for k, v in saved.items():
        assert torch.equal(v, run.after.weights[k]), k


def test_heldout_probes_are_scored_apart_from_the_pick(run):
    held = run.rewind.data["heldout"]
    assert held["n"] == len(penalty_pool()) and held["left_out_monitored"] == 0
    assert set(held["at"]) == {f"{run.rewind.alpha:g}", "1"} or set(held["at"]) == {"1"}
    assert "never reads them" in held["note"]


def test_wandb_gets_the_summary_the_front_and_its_plot(run):
    summary = read_summary(run.wandb_file)
    assert summary["forgetwatch/rewind/alpha"] == run.rewind.alpha
    for key in ("forgetting", "forgetting_checkpoint", "task_loss", "task_loss_checkpoint"):
        assert f"forgetwatch/rewind/{key}" in summary, key
    assert summary["forgetwatch/rewind/task_loss"] == pytest.approx(run.rewind.point(run.rewind.alpha)["task"])
    rows = [r for r in read_history(run.wandb_file) if "forgetwatch/rewind/front_plot" in r]
    assert len(rows) == 1 and rows[0]["train/global_step"] == 6
    assert rows[0]["forgetwatch/rewind/front_plot"]["_type"] == "image-file"
    assert any("forgetwatch/rewind/front" in r for r in read_history(run.wandb_file))


def test_the_report_shows_the_rewind(run, tmp_path, capsys):
    from forgetwatch.report.render import make_report

    page = make_report(run.out, tmp_path).read_text(encoding="utf-8")
    assert 'id="rewind"' in page and (tmp_path / "rewind.png").is_file() and 'src="rewind.png"' in page
    assert "Held-out probes" in page and "reproduces the run&#x27;s evaluation at step 6" in page
    # `forgetwatch report`: the page's path, the summary (the budget's line among it), the rewind's line last
    capsys.readouterr()
    assert cli(["report", str(run.out), "-o", str(tmp_path / "again")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == str(tmp_path / "again" / "report.html") and lines[1].startswith("run out: ")
    assert any(line.startswith("budget forgetting ≤ 0.3 (on_budget alert): ") for line in lines)
    assert lines[-1] == run.rewind.line()


def test_forgetwatch_rewind_on_the_finished_record(run, tmp_path, capsys):
    copy = tmp_path / "out"
    shutil.copytree(run.out, copy)
    assert cli(["rewind", str(copy), "--data", str(task_file(tmp_path))]) == 2  # the callback's rewound/ is there
    assert "exists" in capsys.readouterr().err
    assert cli(["rewind", str(copy), "--data", str(task_file(tmp_path)), "--force", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["checkpoint"] == str(copy) and data["checkpoint_step"] is None  # the model the trainer saved
    assert data["check_alpha_1"]["equal"] is True and data["task"]["source"] == str(tmp_path / "task.jsonl")
    assert data["budget"] == run.rewind.data["budget"]  # the run's, read from its record
    # the same weights scored the same way: the monitored figures are the callback's, α by α
    assert [p["metrics"] for p in data["front"]] == [p["metrics"] for p in run.rewind.data["front"]]
    again = read_rewind(copy)
    assert same(strip_json(rescore(copy / "rewound", copy / "forgetwatch")), strip_json(again.point(again.alpha)["metrics"]))
    # a rewind that saves nothing would leave rewound/ undescribed: refused before anything is scored or written
    before = {p: p.read_bytes() for p in sorted((copy / "rewound").iterdir()) + [copy / "forgetwatch" / "rewind.json"]}
    assert cli(["rewind", str(copy), "--data", str(tmp_path / "task.jsonl"), "--no-save"]) == 2
    err = capsys.readouterr().err
    assert "would leave it undescribed" in err and "--force" in err and "Traceback" not in err
    assert {p: p.read_bytes() for p in before} == before
    assert (copy / "rewound" / "forgetwatch-rewind.json").read_bytes() == before[copy / "forgetwatch" / "rewind.json"]
    assert cli(["rewind", str(copy), "--data", str(tmp_path / "task.jsonl"), "--no-save", "--force"]) == 0
    out = capsys.readouterr().out
    assert "rule: With a task loss" in out and out.strip().splitlines()[-2].startswith("rewind: α ")
    assert not (copy / "rewound").exists() and read_rewind(copy).rewound is None  # the model went with its decision
    assert sorted(p.name for p in copy.iterdir() if p.name.startswith(".rewound")) == []


def test_forgetwatch_rewind_on_a_sidecar_watched_run(tmp_path, capsys):
    """Scored by `forgetwatch watch` from its checkpoints: the latest checkpoint-N is rewound, α = 1 checked against the
    watcher's evaluation of step N, the scoring settings read from the run's manifest."""
    base, tok = base_model(tmp_path)
    args = fw_args(tmp_path, forgetwatch_scoring="sidecar")
    sft_trainer(base, tok, tmp_path / "out", [ForgetWatchCallback.from_args(args)], eval_set=False).train()
    assert cli(["watch", str(tmp_path / "out"), "--once", "--device", "cpu"]) == 0
    capsys.readouterr()
    assert cli(["rewind", str(tmp_path / "out"), "--data", str(task_file(tmp_path)), "--alphas", "0.5,1", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["checkpoint"] == str(tmp_path / "out" / "checkpoint-6") and data["checkpoint_step"] == 6
    assert data["check_alpha_1"]["equal"] is True and data["check_alpha_1"]["step"] == 6
    assert (tmp_path / "out" / "rewound" / "model.safetensors").is_file()


# -- other trainers and adapters --------------------------------------------------------------------------------


def test_a_lora_run_rewinds_to_merged_full_weights(tmp_path):
    from peft import LoraConfig, get_peft_model

    base, tok = base_model(tmp_path)
    args = fw_args(tmp_path, forgetwatch_rewind=True, forgetwatch_rewind_data=str(task_file(tmp_path)),
                   forgetwatch_rewind_alphas="0.5,1")
    lora = get_peft_model(AutoModelForCausalLM.from_pretrained(base), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    trainer = sft_trainer(base, tok, tmp_path / "out", [ForgetWatchCallback.from_args(args), rewind_callback(args)],
                          model=lora, eval_set=False, bf16=False, learning_rate=2e-1)
    trainer.train()
    result = read_rewind(tmp_path / "out")
    assert result.data["check_alpha_1"]["equal"] is True
    assert result.data["task"]["unit"] == "nats per answer token"
    rewound = tmp_path / "out" / "rewound"
    assert (rewound / "model.safetensors").is_file() and not (rewound / "adapter_config.json").exists()
    got, recorded = rescore(rewound, tmp_path / "out" / "forgetwatch"), result.point(result.alpha)["metrics"]
    # merged weights: the outcomes are the ones scored through the scaled adapter, margins up to the merge's rounding
    for group, row in recorded.items():
        for k in ("forgotten", "learned", "n", "accuracy_post", "forgetting", "backward_transfer"):
            assert got[group][k] == row[k], (group, k)
        if row.get("margin_change") is not None:
            assert got[group]["margin_change"] == pytest.approx(row["margin_change"], abs=1e-4)


def test_dpo_rewinds_on_held_out_examples_and_refuses_its_eval_set(tmp_path):
    from fixtures.remedies import preference_pairs
    from trl import DPOConfig, DPOTrainer

    base, tok = base_model(tmp_path)

    def dpo(out, args, **overrides):
        kwargs = {"output_dir": str(out), "use_cpu": True, "max_steps": 3, "per_device_train_batch_size": 4,
                  "learning_rate": 5e-2, "logging_steps": 1, "report_to": "none", "save_strategy": "no", "seed": SEED,
                  "disable_tqdm": True, "max_length": 64, "bf16": False, **overrides}
        return DPOTrainer(model=AutoModelForCausalLM.from_pretrained(base),
                          ref_model=AutoModelForCausalLM.from_pretrained(base), args=DPOConfig(**kwargs),
                          train_dataset=preference_pairs(), eval_dataset=preference_pairs().select(range(4)),
                          processing_class=tok, callbacks=[ForgetWatchCallback.from_args(args), rewind_callback(args)])

    no_data = fw_args(tmp_path, forgetwatch_rewind=True)
    trainer = dpo(tmp_path / "refused", no_data, eval_strategy="steps", eval_steps=3)
    with pytest.raises(ValueError, match="DPOConfig's eval batches carry no language-model labels"):
        trainer.train()
    assert trainer.state.global_step == 0  # refused before a step
    args = fw_args(tmp_path, forgetwatch_rewind=True, forgetwatch_rewind_data=str(task_file(tmp_path)),
                   forgetwatch_rewind_alphas="0.5,1")
    dpo(tmp_path / "out", args, eval_strategy="steps", eval_steps=3).train()
    result = read_rewind(tmp_path / "out")
    assert result.data["check_alpha_1"]["equal"] is True and result.data["pick"]["case"] == "lowest_task_loss"
    assert (tmp_path / "out" / "rewound" / "model.safetensors").is_file()


def test_grpo_rewinds_within_its_budget_without_a_task_loss(tmp_path):
    from fixtures.trainers import grpo_dataset, length_reward
    from trl import GRPOConfig, GRPOTrainer

    base, tok = base_model(tmp_path)
    args = fw_args(tmp_path, forgetwatch_rewind=True, forgetwatch_budget="forgetting=0.5", forgetwatch_rewind_alphas="0.5,1")
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(base), reward_funcs=length_reward, train_dataset=grpo_dataset(),
        processing_class=tok, callbacks=[ForgetWatchCallback.from_args(args), rewind_callback(args)],
        args=GRPOConfig(output_dir=str(tmp_path / "out"), use_cpu=True, max_steps=3, per_device_train_batch_size=4,
                        num_generations=4, max_completion_length=8, learning_rate=5e-2, logging_steps=1, report_to="none",
                        save_strategy="no", seed=SEED, disable_tqdm=True))
    trainer.train()
    result = read_rewind(tmp_path / "out")
    assert result.data["task"] is None and result.data["check_alpha_1"]["equal"] is True
    assert result.data["pick"]["case"] in ("largest_within", "least_forgetting")
    assert ", task loss" not in result.line() and (tmp_path / "out" / "rewound").is_dir()


# -- refusals, before training ---------------------------------------------------------------------------------


def test_refusals_before_a_step(tmp_path, caplog):
    base, tok = base_model(tmp_path)
    # no task measure and no budget
    args = fw_args(tmp_path, forgetwatch_rewind=True)
    trainer = sft_trainer(base, tok, tmp_path / "none", [ForgetWatchCallback.from_args(args), rewind_callback(args)],
                          eval_set=False)
    with pytest.raises(ValueError, match="nothing to pick α by"):
        trainer.train()
    assert trainer.state.global_step == 0
    # an earlier rewound/ is never replaced unless asked: a fresh run moves it aside (the test below)
    # after ForgetWatchCallback, not before
    trainer = sft_trainer(base, tok, tmp_path / "order", [rewind_callback(args), ForgetWatchCallback.from_args(args)])
    with pytest.raises(ValueError, match="add it after ForgetWatchCallback"):
        trainer.train()
    # a base built in memory has no weights to stream
    trainer = sft_trainer(base, tok, tmp_path / "memory", [ForgetWatchCallback.from_args(args), rewind_callback(args)],
                          model=build_model(tok, seed=SEED))
    with pytest.raises(ValueError, match="not loaded from a directory or a Hub id"):
        trainer.train()
    # sidecar scoring: the final evaluation is not in the training process
    with pytest.raises(ValueError, match="forgetwatch_scoring=sidecar"):
        rewind_callback(fw_args(tmp_path, forgetwatch_rewind=True, forgetwatch_scoring="sidecar"))
    sidecar = fw_args(tmp_path, forgetwatch_scoring="sidecar")
    trainer = sft_trainer(base, tok, tmp_path / "sidecar", [ForgetWatchCallback.from_args(sidecar), RewindCallback()])
    with pytest.raises(ValueError, match="forgetwatch_scoring=sidecar"):
        trainer.train()
    # several processes
    cb = RewindCallback()
    with pytest.raises(ValueError, match="runs in one process.*forgetwatch rewind"):
        cb.on_train_begin(SimpleNamespace(world_size=2, output_dir=str(tmp_path / "ddp")), None, None)
    # no probes, a bad grid
    with pytest.raises(ValueError, match="forgetwatch_rewind needs forgetwatch_probes"):
        rewind_callback(ForgetWatchArguments(forgetwatch_rewind=True))
    with pytest.raises(InterpolationError, match="outside"):
        RewindCallback(alphas="0.5:1.5:0.5")


def test_the_command_refuses_what_it_cannot_pick_or_read(run, tmp_path, capsys):
    assert cli(["rewind", str(tmp_path)]) == 2
    assert "no forgetwatch record" in capsys.readouterr().err
    copy = tmp_path / "out"
    shutil.copytree(run.out, copy)
    (copy / "forgetwatch" / "budget.json").unlink()
    assert cli(["rewind", str(copy), "--no-save"]) == 2
    assert "nothing to pick α by" in capsys.readouterr().err
    assert cli(["rewind", str(copy), "--no-save", "--budget", "robust_forgetting=0.1"]) == 2
    assert "robustness variants" in capsys.readouterr().err


# -- the rule ---------------------------------------------------------------------------------------------------


def front(*points, within=None):
    return [{"alpha": a, "task": t, "forgetting": f, "within_budget": (within(a, t, f) if within else None)}
            for a, t, f in points]


def test_the_rule_lowest_task_loss_within_the_budget():
    pts = front((0.6, 1.16, 0.03), (0.8, 1.15, 0.05), (1.0, 1.14, 0.07), within=lambda a, t, f: f <= 0.05)
    assert pick_alpha(pts, budgeted=True) == (0.8, "lowest_task_loss", "the lowest task loss within the budget")
    assert pick_alpha(pts, budgeted=False).alpha == 1.0  # no budget: the lowest loss overall
    ties = front((0.6, 1.15, 0.03), (0.8, 1.15, 0.05), (1.0, 1.15, 0.03), within=lambda *_: True)
    assert pick_alpha(ties, budgeted=True).alpha == 1.0  # equal loss: the smaller forgetting, then the larger α


def test_the_rule_knee_when_nothing_is_within_the_budget():
    # task loss falls and forgetting rises toward α = 1; scaled to the front, α 0.8 is farthest from the chord
    pts = front((0.6, 1.40, 0.015), (0.7, 1.20, 0.02), (0.8, 1.05, 0.03), (0.9, 1.01, 0.05), (1.0, 1.00, 0.10),
                within=lambda *_: False)
    assert pick_alpha(pts, budgeted=True)[:2] == (0.8, "knee")
    # a point beaten on both axes is off the front and never the knee
    beaten = front((0.5, 1.5, 0.2), (0.6, 1.40, 0.015), (0.8, 1.05, 0.03), (1.0, 1.00, 0.10), within=lambda *_: False)
    assert [p["alpha"] for p in rewind_module.pareto(beaten)] == [1.0, 0.8, 0.6]
    assert pick_alpha(beaten, budgeted=True).alpha == 0.8
    two = front((0.5, 1.2, 0.01), (1.0, 1.0, 0.09), within=lambda *_: False)
    assert pick_alpha(two, budgeted=True).alpha == 0.5  # no bend: the one that forgets less
    # the demo's front: stepping back lowers both, so the front is one point, the grid's end (and the line says so)
    demo = front((0.5, 1.453, 0.065), (0.6, 1.506, 0.069), (0.8, 1.636, 0.096), (1.0, 1.790, 0.125), within=lambda *_: False)
    pick = pick_alpha(demo, budgeted=True)
    assert pick.alpha == 0.5 and "has the lowest task loss and the least forgetting of all" in pick.why
    data = {"alphas": [0.5, 0.6, 0.8, 1.0], "pick": pick._asdict(), "measure": {"label": "F_adj"}, "rewound": None,
            "task": {"source": "the trainer's eval set"}, "check_alpha_1": {"equal": True},
            "front": [dict(p, breaches=["runaway = 0.9231 (lower 95% bound 0.6669) > budget 0.1"]) for p in demo]}
    line = rewind_module.RewindResult(data, Path("rewind.json")).line()
    assert line.startswith("rewind: α 0.5 (") and "F_adj 0.125 → 0.065, eval loss 1.790 → 1.453" in line
    assert "the grid's lowest α" in line and "over budget there: runaway;" in line and line.endswith("not saved")


def test_the_rule_without_a_task_loss():
    pts = front((0.6, None, 0.03), (0.8, None, 0.05), (1.0, None, 0.07), within=lambda a, t, f: f <= 0.05)
    assert pick_alpha(pts, budgeted=True)[:2] == (0.8, "largest_within")
    over = front((0.6, float("nan"), 0.03), (0.8, None, 0.05), (1.0, None, 0.07), within=lambda *_: False)
    assert pick_alpha(over, budgeted=True)[:2] == (0.6, "least_forgetting")
    with pytest.raises(InterpolationError, match="nothing to pick α by"):
        pick_alpha(pts, budgeted=False)


def test_the_docs_state_the_rule_the_code_applies():
    page = " ".join((ROOT / "docs" / "rewind.md").read_text(encoding="utf-8").split())
    assert " ".join(RULE.split()) in page
    for link in ("docs/replay.md", "docs/cli.md"):
        assert "rewind.md" in (ROOT / link).read_text(encoding="utf-8"), link
    assert re.search(r"forgetwatch_rewind_alphas", (ROOT / "docs" / "options.md").read_text(encoding="utf-8"))


def test_a_resume_with_restored_callback_states_rewinds_after_the_final_evaluation(tmp_path):
    """With `restore_callback_states_from_checkpoint=True` the Trainer rebuilds its stateful callbacks at the end of its
    list: the rewind is one of them, saved after the monitor, so it still runs after the monitor's final evaluation."""
    base, tok = base_model(tmp_path)
    args = fw_args(tmp_path, forgetwatch_rewind=True, forgetwatch_rewind_alphas="0.5,1",
                   forgetwatch_rewind_data=str(task_file(tmp_path)))
    out = tmp_path / "out"
    first = sft_trainer(base, tok, out, [ForgetWatchCallback.from_args(args), rewind_callback(args)], eval_set=False,
                        max_steps=4, save_strategy="steps", save_steps=2)
    first.train()
    shutil.rmtree(out / "rewound")
    (out / "forgetwatch" / "rewind.json").unlink()
    again = sft_trainer(base, tok, out, [ForgetWatchCallback.from_args(args), rewind_callback(args)], eval_set=False,
                        max_steps=4, save_strategy="steps", save_steps=2, restore_callback_states_from_checkpoint=True)
    again.train(resume_from_checkpoint=str(out / "checkpoint-2"))
    kinds = [type(cb).__name__ for cb in again.callback_handler.callbacks]
    assert kinds.index("ForgetWatchCallback") < kinds.index("RewindCallback")
    rewound = read_rewind(out)
    assert rewound is not None and rewound.data["check_alpha_1"]["equal"] is True
    assert rewound.data["check_alpha_1"]["step"] == 4 and (out / "rewound").is_dir()


def test_a_fresh_run_moves_an_earlier_rewound_model_aside(tmp_path):
    base, tok = base_model(tmp_path)
    args = fw_args(tmp_path, forgetwatch_rewind=True, forgetwatch_rewind_alphas="0.5,1",
                   forgetwatch_rewind_data=str(task_file(tmp_path)))
    out = tmp_path / "out"
    (out / "rewound").mkdir(parents=True)
    (out / "rewound" / "mine.txt").write_text("an earlier run's")
    sft_trainer(base, tok, out, [ForgetWatchCallback.from_args(args), rewind_callback(args)], eval_set=False,
                max_steps=3).train()
    assert (out / "rewound.1" / "mine.txt").read_text() == "an earlier run's"  # kept, as the earlier record is
    assert (out / "rewound" / "config.json").is_file() and read_rewind(out).data["check_alpha_1"]["equal"] is True


def test_rewind_refuses_other_weights_saved_at_the_bases_path(tmp_path, capsys):
    """Rewind streams the base from the path the cache names: weights saved there after training (the same name, the
    same architecture) are refused before any α is scored, naming the cache's fingerprint; it would otherwise step back
    toward another model and say nothing."""
    base, tok = base_model(tmp_path)
    args = fw_args(tmp_path, forgetwatch_budget="forgetting=0.3")
    trainer = sft_trainer(base, tok, tmp_path / "out", [ForgetWatchCallback.from_args(args)], eval_set=False)
    trainer.train()
    trainer.save_model(str(tmp_path / "out"))
    build_model(tok, seed=SEED + 1).save_pretrained(base)  # other weights at the base's path
    capsys.readouterr()
    assert cli(["rewind", str(tmp_path / "out"), "--no-save"]) == 2
    err = capsys.readouterr().err
    assert "are not those this cache was made from" in err and "--allow-other-model" in err and "Traceback" not in err
    assert not (tmp_path / "out" / "forgetwatch" / "rewind.json").exists()  # refused before anything was written


def test_heldout_probes_that_are_all_monitored_are_refused_before_any_alpha_is_scored(run, tmp_path, capsys, monkeypatch):
    """Such a file used to be refused only after every α was scored (minutes on a real model)."""
    import forgetwatch.remedies.rewind as rewind_module

    def never(*args, **kwargs):
        raise AssertionError("the sweep started before the held-out probes were checked")

    monkeypatch.setattr(rewind_module, "InterpolationSweep", never)
    copy = tmp_path / "out"
    shutil.copytree(run.out, copy)
    before = (copy / "forgetwatch" / "rewind.json").read_bytes()
    capsys.readouterr()
    assert cli(["rewind", str(copy), "--data", str(task_file(tmp_path)), "--force", "--no-save",
                "--heldout", str(copy / "forgetwatch" / "probes.jsonl")]) == 2
    err = capsys.readouterr().err
    assert "every one is a monitored probe" in err and "Traceback" not in err
    assert (copy / "forgetwatch" / "rewind.json").read_bytes() == before and (copy / "rewound").is_dir()


def test_a_damaged_checkpoint_is_named_before_anything_is_scored_or_written(run, tmp_path, capsys):
    """A model.safetensors cut short (a full disk, a killed save) used to end in safetensors' own error, as a
    traceback."""
    copy = tmp_path / "out"
    shutil.copytree(run.out, copy)
    weights = copy / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    before = {p: p.read_bytes() for p in (copy / "forgetwatch").rglob("*") if p.is_file()}
    capsys.readouterr()
    assert cli(["rewind", str(copy), "--data", str(task_file(tmp_path)), "--force"]) == 2
    err = capsys.readouterr().err
    assert f"the checkpoint {weights}: a damaged safetensors file" in err and "Traceback" not in err, err
    assert {p: p.read_bytes() for p in (copy / "forgetwatch").rglob("*") if p.is_file()} == before


@pytest.mark.parametrize("damage", ["alpha not on the front", "an empty front"])
def test_a_rewind_json_that_forgetwatch_could_not_have_written_leaves_the_report_whole(damage, run, tmp_path, capsys):
    """Such a file used to stop `report` with StopIteration / IndexError and no page."""
    copy = tmp_path / "out"
    shutil.copytree(run.out, copy)
    shutil.rmtree(copy / "rewound")  # the record's rewind.json alone (no model folder whose decision would stand)
    path = copy / "forgetwatch" / "rewind.json"
    data = json.loads(path.read_text())
    if damage == "an empty front":
        data["front"] = []
    else:
        data["pick"]["alpha"] = 0.333
    path.write_text(json.dumps(data))
    capsys.readouterr()
    assert cli(["report", str(copy)]) == 0
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and "rewind: unreadable" in captured.out
    page = (copy / "forgetwatch" / "report" / "report.html").read_text()
    assert "The rewind is left out" in page and "field `" in page


def test_a_cut_last_evaluation_is_recovered_and_said_not_reported_as_a_mismatch(run, tmp_path, capsys, caplog):
    """A killed writer's last metrics.jsonl line cut short used to make rewind warn that α = 1 "does NOT reproduce"
    the run (it compared with the evaluation before); now the record is recovered as every writer does, and α = 1 is
    said to have nothing whole to compare with."""
    copy = tmp_path / "out"
    shutil.copytree(run.out, copy)
    metrics = copy / "forgetwatch" / "metrics.jsonl"
    text = metrics.read_text()
    last = text.rstrip("\n").rsplit("\n", 1)[-1]
    metrics.write_text(text[: len(text) - len(last) - 1] + last[: len(last) // 2])  # the last line cut in half
    capsys.readouterr()
    with caplog.at_level(logging.WARNING, logger="forgetwatch"):
        assert cli(["rewind", str(copy), "--data", str(task_file(tmp_path)), "--force", "--no-save", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert "does NOT reproduce" not in caplog.text and "left mid-write" in caplog.text
    assert data["check_alpha_1"]["equal"] is None and "cut short by a kill" in data["check_alpha_1"]["note"]
    assert list((copy / "forgetwatch" / "recovered").iterdir())


def test_the_table_names_the_commands_own_flag(run, tmp_path, capsys):
    """The table's note named interpolate's --task-data where rewind's flag is --data."""
    copy = tmp_path / "out"
    shutil.copytree(run.out, copy)
    capsys.readouterr()
    assert cli(["rewind", str(copy), "--data", str(task_file(tmp_path)), "--force", "--no-save"]) == 0
    out = capsys.readouterr().out
    assert "nats per answer token on --data" in out and "--task-data" not in out


def test_the_expected_time_is_said_before_the_rewind_starts(run, tmp_path, capsys):
    """A rewind took longer than the training it followed, and nothing said so beforehand."""
    copy = tmp_path / "out"
    shutil.copytree(run.out, copy)
    capsys.readouterr()
    assert cli(["rewind", str(copy), "--data", str(task_file(tmp_path)), "--force", "--no-save"]) == 0
    err = capsys.readouterr().err.splitlines()
    said = next(i for i, line in enumerate(err) if line.startswith("forgetwatch rewind: ") and "α to score" in line)
    first = next(i for i, line in enumerate(err) if line.startswith("α = "))
    assert said < first and "each a pass over the" in err[said] and "plus the task loss" in err[said]
