"""The issue's acceptance run: the real SmolLM2-135M-Instruct fine-tuned with the callback, W&B offline.

The forgetting curves read back from the W&B run file must agree with re-scoring the saved checkpoints
separately. Slow (a few minutes on 2 cores): `make test-slow`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import requires_olmo_eval, requires_smollm
from fixtures.trainers import logged_name
from fixtures.wandb_offline import find_run_file, read_history

from forgetwatch import ProbeSet, compute_report, load_record
from forgetwatch.scoring.score import ScoringConfig, score_probes

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@requires_smollm
@requires_olmo_eval
def test_sft_demo_curves_agree_with_rescored_checkpoints(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out, wandb_dir = tmp_path / "run", tmp_path / "wandb"
    wandb_dir.mkdir()
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_DIR": str(wandb_dir), "WANDB_SILENT": "true", "OMP_NUM_THREADS": "2"}
    cmd = [sys.executable, str(ROOT / "examples" / "sft_smollm2.py"), "--output-dir", str(out), "--max-steps", "6",
           "--eval-steps", "3", "--per-suite", "6", "--save-steps", "3", "--learning-rate", "5e-4"]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1500)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]

    record = load_record(out)
    probes = ProbeSet.from_jsonl(record.root / "probes.jsonl")
    logged = {int(r["train/global_step"]): r for r in read_history(find_run_file(wandb_dir)) if "forgetwatch/forgetting" in r}
    assert sorted(logged) == [0, 3, 6] == record.eval_steps()
    base = record.read_eval(0)["outcome"]
    k, cats = [p.num_choices for p in probes], [p.category for p in probes]
    for step in (3, 6):
        ckpt = out / f"checkpoint-{step}"
        model, tok = AutoModelForCausalLM.from_pretrained(ckpt), AutoTokenizer.from_pretrained(ckpt)
        with torch.autocast("cpu", dtype=torch.bfloat16):  # TRL trains in bf16 autocast: probe the same way
            rescored = score_probes(model, tok, probes, ScoringConfig())
        assert np.array_equal(rescored.outcome, record.read_eval(step)["outcome"]), f"step {step}"
        report = compute_report(base, rescored.outcome, k, cats)
        for name, m in report.items():
            for key, value in m.scalars().items():
                logged_key = logged_name(name, key)
                assert logged[step][logged_key] == pytest.approx(value, abs=1e-12), (step, name, key)
