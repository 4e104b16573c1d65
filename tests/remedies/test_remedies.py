"""forgetwatch.remedies: the public names, the typed protocols, the refusals shared by every front-end, and a user's own
SFTTrainer script with the KL anchor (`build_remedies` + `Remedies.attach`) training exactly as recipes/sft.py does."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from fixtures.remedies import chat_dataset, make_pool
from fixtures.trainers import make_probes

from forgetwatch import ForgetWatchArguments, ForgetWatchCallback
from forgetwatch.remedies import (
    CheckpointedLossTerm,
    LossTerm,
    MonitorView,
    add_loss_term,
    build_remedies,
    check_remedies,
)

pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.filterwarnings("ignore:`gradient_checkpointing.*` is deprecated:FutureWarning")]

RECIPES = Path(__file__).resolve().parents[2] / "recipes"


def test_public_names_are_pinned_and_the_package_loads_without_torch():
    import forgetwatch.remedies as remedies

    assert remedies.__all__ == ["BaseOutputs", "CheckpointedLossTerm", "KLAnchor", "LossTerm", "MarginPenalty",
                                "MonitorView", "Remedies", "RewindCallback", "add_loss_term", "base_outputs_for",
                                "build_remedies", "check_remedies", "load_or_make", "make_base_outputs", "mix_replay",
                                "needs_base_outputs", "replay_pool", "rewind_callback"]
    assert all(getattr(remedies, name) is not None for name in remedies.__all__)
    # a name that is also a submodule would come back as the module once that is imported: none is
    import types

    import forgetwatch.remedies.rewinder  # noqa: F401
    assert not any(isinstance(getattr(remedies, name), types.ModuleType) for name in remedies.__all__)
    assert callable(remedies.rewind_callback) and isinstance(remedies.RewindCallback, type)
    code = "import sys, forgetwatch.remedies; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120).stdout == "False\n"


def test_the_monitor_and_the_terms_meet_their_protocols(tokenizer):
    from forgetwatch.remedies import MarginPenalty

    watch = ForgetWatchCallback(make_probes(), eval_steps=2)
    assert isinstance(watch, MonitorView)
    penalty = MarginPenalty(make_pool(), beta=1.0, monitor=watch, tokenizer=tokenizer)
    assert isinstance(penalty, LossTerm) and isinstance(penalty, CheckpointedLossTerm)


# -- refusals, before anything is loaded -----------------------------------------------------------------------------
def options(**kw) -> ForgetWatchArguments:
    return ForgetWatchArguments(**{"forgetwatch_probes": "sciq", **kw})


@pytest.mark.parametrize("stage, why", [("dpo", "DPO trains on preference pairs"), ("grpo", "GRPO already anchors"),
                                        ("kto", "KTO anchors"), ("ppo", "PPO anchors"), ("rm", "reward-model training"),
                                        ("pt", "pre-training"), ("orpo", "ORPO")])
@pytest.mark.parametrize("key", ["forgetwatch_anchor_beta", "forgetwatch_penalty_beta"])
def test_a_loss_term_is_refused_for_a_stage_other_than_sft(stage, why, key):
    with pytest.raises(ValueError, match=rf"^{key} is an SFT option and this run trains stage '{stage}': {why}.*"
                                         rf"Set {key} to 0 for this stage, or train with SFT"):
        check_remedies(options(**{key: 5.0}), stage)
    check_remedies(options(**{key: 5.0}), "sft")  # fine
    with pytest.raises(ValueError, match=f"{key} is an SFT option and this run trains stage '{stage}'"):
        build_remedies(options(**{key: 5.0}), stage=stage, callback=None, training_args=None, model=None)


@pytest.mark.parametrize("kw, stage, front_end, expect", [
    ({"forgetwatch_replay_mix": 0.1}, "dpo", None, "forgetwatch_replay_mix mixes examples into SFT or GRPO data; stage "
                                                   "'dpo' trains on other rows"),
    ({"forgetwatch_replay_mix": 0.1, "forgetwatch_replay_targets": "base"}, "grpo", None,
     "forgetwatch_replay_targets is an SFT option"),
    ({"forgetwatch_replay_mix": 0.1}, "sft", "Axolotl", "Axolotl builds its own data pipeline"),
    ({"forgetwatch_anchor_beta": 1.0, "forgetwatch_probes": None}, "sft", None, "forgetwatch_anchor_beta needs "
                                                                                "forgetwatch_probes"),
    ({"forgetwatch_penalty_beta": 1.0, "forgetwatch_scoring": "sidecar"}, "sft", None,
     "set forgetwatch_replay_strategy to uniform, or forgetwatch_scoring to inline"),
])
def test_combinations_that_cannot_work_are_refused_with_what_to_do(kw, stage, front_end, expect):
    with pytest.raises(ValueError, match=expect):
        check_remedies(options(**kw), stage, front_end=front_end)


def test_add_loss_term_refuses_preference_trainers_and_a_second_term(tokenizer, tiny_model, tmp_path):
    from transformers import Trainer, TrainingArguments

    class Term:
        def loss(self, model, micro_batch, batch_size):
            return None

        def pop_logs(self):
            return {}

    dpo = type("DPOTrainer", (Trainer,), {})  # TRL's DPOTrainer and every front-end's subclass of it, by name
    with pytest.raises(ValueError, match="DPOTrainer trains DPO .* terms of supervised fine-tuning"):
        add_loss_term(dpo.__new__(dpo), Term())
    trainer = Trainer(model=tiny_model, args=TrainingArguments(str(tmp_path), use_cpu=True, report_to="none"),
                      processing_class=tokenizer)
    assert add_loss_term(trainer, Term()) is trainer
    with pytest.raises(ValueError, match="already has a loss term \\(Term\\): one term at a time"):
        add_loss_term(trainer, Term())
    with pytest.raises(TypeError, match="must be a LossTerm"):
        add_loss_term(trainer, object())


# -- a user's own script, against recipes/sft.py --------------------------------------------------------------------
def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"recipes_{name}", RECIPES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _fw_args(files: Path) -> ForgetWatchArguments:
    return ForgetWatchArguments(forgetwatch_probes=str(files / "probes.jsonl"), forgetwatch_replay_pool=str(files / "pool.jsonl"),
                                forgetwatch_eval_steps=2, forgetwatch_max_new_tokens=4, forgetwatch_behavior_max_new_tokens=16,
                                forgetwatch_anchor_beta=5.0, forgetwatch_anchor_ratio=1.0,
                                forgetwatch_base_outputs=str(files / "base_outputs.parquet"))


def _training_args(out: Path):
    from trl import SFTConfig

    return SFTConfig(output_dir=str(out), use_cpu=True, bf16=False, max_steps=4, per_device_train_batch_size=4,
                     learning_rate=5e-2, lr_scheduler_type="constant", logging_steps=1, report_to="none",
                     save_strategy="no", seed=0, max_length=64, disable_tqdm=True, gradient_checkpointing=False)


def _losses(out: Path) -> list[tuple[int, float, float]]:
    rows = [json.loads(x) for x in (out / "forgetwatch" / "trainer_log.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"], r["anchor_kl"]) for r in rows if "loss" in r]


def test_a_users_sft_script_with_the_anchor_trains_as_the_recipe_does(tiny_model_dir, tmp_path, monkeypatch):
    """The same model, data order and seed: recipes/sft.py's `main` with `forgetwatch_anchor_beta`, and a script that
    builds its SFTTrainer itself and adds the anchor with the one documented call, log the same losses and the same
    anchor KL at every step, and end with the same weights."""
    from safetensors.torch import load_file
    from trl import ModelConfig, ScriptArguments, SFTTrainer

    from forgetwatch.remedies import KLAnchor

    files = tmp_path / "files"
    (files / "data").mkdir(parents=True)
    chat_dataset().to_json(files / "data" / "train.jsonl")  # a local dataset dir, as `dataset_name` takes it
    make_probes().to_jsonl(files / "probes.jsonl")
    make_pool().to_jsonl(files / "pool.jsonl")

    # recipes/sft.py, in this process (recipes/ is not a package: its modules by path, under the names it imports)
    monkeypatch.setitem(sys.modules, "data", _load("data"))
    monkeypatch.setitem(sys.modules, "common", _load("common"))
    recipe_out = tmp_path / "recipe"
    _load("sft").main(ScriptArguments(dataset_name=str(files / "data")), _training_args(recipe_out),
                      ModelConfig(model_name_or_path=str(tiny_model_dir), dtype="float32"), _fw_args(files))

    # a user's script: their own trainer, the remedies from the same options
    from datasets import load_dataset

    fw_args, args = _fw_args(files), _training_args(tmp_path / "script")
    watch = ForgetWatchCallback.from_args(fw_args)
    train = load_dataset(str(files / "data"), split="train")
    remedies = build_remedies(fw_args, stage="sft", callback=watch, training_args=args, model=str(tiny_model_dir),
                              train_dataset=train)
    assert isinstance(remedies.loss_term, KLAnchor) and remedies.callbacks == []
    trainer = SFTTrainer(model=str(tiny_model_dir), args=args, train_dataset=remedies.train_dataset, callbacks=[watch])
    remedies.attach(trainer)  # the one call: the anchor's term joins this trainer's loss
    trainer.train()

    recipe, script = _losses(recipe_out), _losses(tmp_path / "script")
    assert [s for s, _, _ in script] == [1, 2, 3, 4] and all(kl > 0 for _, _, kl in script[1:])
    assert script == recipe
    saved = load_file(recipe_out / "model.safetensors")
    for name, p in trainer.model.state_dict().items():
        if name in saved:
            assert torch.equal(p, saved[name]), name
    mixers = json.loads((tmp_path / "script" / "forgetwatch" / "replay_mix.json").read_text())["mixers"]
    assert [m["kind"] for m in mixers] == ["kl anchor: beta 5.0"]  # the draws recorded, as the recipe records them


def test_a_loss_term_trains_with_data_loader_workers(tiny_model_dir, tmp_path):
    """The anchor draws in the training process, not in the data loader: workers are not refused (only `mix_replay`'s
    streams, read by the data loader, need them off), and they change nothing."""
    from datasets import load_dataset
    from trl import SFTTrainer

    files = tmp_path / "files"
    (files / "data").mkdir(parents=True)
    chat_dataset().to_json(files / "data" / "train.jsonl")
    make_probes().to_jsonl(files / "probes.jsonl")
    make_pool().to_jsonl(files / "pool.jsonl")
    runs = {}
    for workers in (0, 1):
        fw_args, args = _fw_args(files), _training_args(tmp_path / f"w{workers}")
        args.dataloader_num_workers = workers
        watch = ForgetWatchCallback.from_args(fw_args)
        train = load_dataset(str(files / "data"), split="train")
        remedies = build_remedies(fw_args, stage="sft", callback=watch, training_args=args, model=str(tiny_model_dir),
                                  train_dataset=train)
        trainer = SFTTrainer(model=str(tiny_model_dir), args=args, train_dataset=remedies.train_dataset, callbacks=[watch])
        remedies.attach(trainer).train()
        runs[workers] = _losses(tmp_path / f"w{workers}")
    assert runs[1] == runs[0] and len(runs[1]) == 4


def test_a_multi_process_run_without_base_outputs_is_told_the_command_with_the_models_name(tiny_model, tmp_path):
    """A front-end passes the loaded model, not its name: the command in the refusal names the model, never prints the
    module."""
    from types import SimpleNamespace

    from forgetwatch.remedies import base_outputs_for

    tiny_model.config._name_or_path = "org/base-model"
    args = SimpleNamespace(world_size=2, output_dir=str(tmp_path), max_length=128)
    fw_args = options(forgetwatch_probes="arc_easy", forgetwatch_anchor_beta=5.0)
    with pytest.raises(ValueError, match=r"forgetwatch base-outputs --model org/base-model --pool arc_easy") as e:
        base_outputs_for(fw_args, args, tiny_model, ForgetWatchCallback("arc_easy", per_suite=2))
    assert "LlamaForCausalLM(" not in str(e.value)


def test_build_remedies_adds_the_rewind_callback_and_attach_keeps_one():
    """`forgetwatch_rewind` reaches a user's script through the one call: `build_remedies` puts the rewind callback in
    `Remedies.callbacks`, and `attach` adds it unless the trainer already has one (a front-end added it from the same
    options)."""
    from types import SimpleNamespace

    from forgetwatch.remedies import RewindCallback

    fw = options(forgetwatch_probes="arc_easy", forgetwatch_per_suite=2, forgetwatch_rewind=True,
                 forgetwatch_budget="forgetting=0.1")
    watch = ForgetWatchCallback.from_args(fw)
    remedies = build_remedies(fw, stage="dpo", callback=watch, training_args=SimpleNamespace(process_index=0),
                              model="unused")
    assert [type(c) for c in remedies.callbacks] == [RewindCallback] and remedies.callbacks[0].stage == "dpo"
    from forgetwatch.remedies import rewind_callback

    for already in ([watch], [watch, rewind_callback(fw, "dpo")]):  # the second: a front-end's own instance
        handler = SimpleNamespace(callbacks=list(already))
        trainer = SimpleNamespace(callback_handler=handler, add_callback=handler.callbacks.append)
        remedies.attach(trainer)
        assert [type(c) for c in handler.callbacks] == [ForgetWatchCallback, RewindCallback]
