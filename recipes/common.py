"""What recipes/sft.py, grpo.py and dpo.py share: model path, data + callback, W&B mode, the closing summary."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from data import (  # recipes/data.py: the script's directory is on sys.path
    drop_probe_overlap,
    load_train_dataset,
)

from forgetwatch import ForgetWatchCallback, load_record
from forgetwatch.models import smollm2_path
from forgetwatch.replay import mix_replay
from forgetwatch.rewind import read_rewind
from forgetwatch.rewind_callback import rewind_callback
from forgetwatch.suites import is_probe_file


def resolve_model(model_args, training_args) -> str:
    """`smollm2` is the offline SmolLM2-135M-Instruct; the trainer builds the model from these kwargs."""
    if model_args.model_name_or_path == "smollm2":
        model_args.model_name_or_path = str(smollm2_path())
    training_args.model_init_kwargs = {
        "revision": model_args.model_revision,
        "trust_remote_code": training_args.trust_remote_code,
        "attn_implementation": model_args.attn_implementation,
        "dtype": model_args.dtype,
        **(training_args.model_init_kwargs or {}),
    }
    return model_args.model_name_or_path


def data_and_callbacks(script_args, training_args, fw_args, stage: str, model_path: str | None = None) -> tuple[Any, list, Any]:
    """The training set, without any row that asks a probe's question, the callback (when probes are set), and the KL
    anchor (when `forgetwatch_anchor_beta` > 0; pass it to `with_anchor(SFTTrainer)`)."""
    if fw_args.needs_base_outputs() and stage != "sft":
        raise ValueError("forgetwatch_replay_targets=base and forgetwatch_anchor_beta are SFT options: GRPO already anchors "
                         "to its reference model with `beta`, and replays prompts (forgetwatch_replay_mix, gold targets) "
                         "that its rewards check")
    if stage == "dpo" and fw_args.forgetwatch_replay_mix:
        raise ValueError("forgetwatch_replay_mix mixes examples into SFT or GRPO data; DPO trains on preference pairs: "
                         "set it to 0 for recipes/dpo.py")
    if fw_args.needs_base_outputs() and not fw_args.forgetwatch_probes:
        raise ValueError("forgetwatch_replay_targets=base and forgetwatch_anchor_beta need forgetwatch_probes: the pool "
                         "is held out from the monitored probes, and the loop follows what they measure")
    # Built first: it loads the probes, which the training data must not contain.
    callbacks = [ForgetWatchCallback.from_args(fw_args)] if fw_args.forgetwatch_probes else []
    rewind = rewind_callback(fw_args)  # forgetwatch_rewind: after the monitor, whose final evaluation it reads
    callbacks += [rewind] if rewind is not None else []
    with training_args.main_process_first(desc="loading the training data"):
        dataset = load_train_dataset(script_args.dataset_name, stage, config=script_args.dataset_config,
                                     split=script_args.dataset_train_split)
        if callbacks:
            dataset, dropped = drop_probe_overlap(dataset, callbacks[0].probes)
            if dropped and training_args.process_index == 0:
                print(f"dropped {dropped} training rows that ask a probe's question ({len(dataset)} left)")
        outputs = base_outputs(fw_args, training_args, model_path, callbacks[0]) if fw_args.needs_base_outputs() else None
        replay = fw_args.replay_kwargs()
        if replay is not None:
            if fw_args.forgetwatch_replay_targets == "base":
                replay["pool"] = outputs  # self-distilled: the base's own answers are the targets
            if not callbacks:
                raise ValueError("forgetwatch_replay_mix needs forgetwatch_probes: the loop follows what the probes measure")
            if training_args.max_steps <= 0:
                raise ValueError("forgetwatch_replay_mix makes the training data a stream without end: set max_steps")
            # the rest of the monitored suites (or the given pool), held out from the probes by id, mixed in at the ratio
            dataset = mix_replay(dataset, monitor=callbacks[0], seed=training_args.seed, **replay)
            if training_args.process_index == 0:
                sizes = ", ".join(f"{c} {len(rows)}" for c, rows in dataset.mixer.pool.items())
                print(f"replay: {replay['ratio']:.0%} of the examples, {replay['strategy']}, "
                      f"{fw_args.forgetwatch_replay_targets} targets, from {sizes}")
    anchor = None
    if fw_args.forgetwatch_anchor_beta:
        from forgetwatch.anchor import KLAnchor

        anchor = KLAnchor(outputs, beta=fw_args.forgetwatch_anchor_beta, ratio=fw_args.forgetwatch_anchor_ratio,
                          strategy=fw_args.forgetwatch_replay_strategy, monitor=callbacks[0], seed=training_args.seed,
                          tokenizer=_tokenizer(model_path), model=_architecture(model_path),
                          max_length=getattr(training_args, "max_length", None))
        if training_args.process_index == 0:
            print(f"KL anchor: beta {anchor.beta}, {anchor.ratio} pool conversations per example, "
                  f"{fw_args.forgetwatch_replay_strategy}, over {len(anchor.outputs)} base answers")
    if fw_args.forgetwatch_penalty_beta:
        if stage != "sft":
            raise ValueError("forgetwatch_penalty_beta is an SFT option (GRPO anchors to its reference with `beta`; DPO "
                             "to its reference model)")
        if not callbacks:
            raise ValueError("forgetwatch_penalty_beta needs forgetwatch_probes: its pool is held out from the monitored "
                             "probes, and the loop follows what they measure")
        from forgetwatch.penalty import MarginPenalty

        anchor = MarginPenalty(fw_args.pool(), beta=fw_args.forgetwatch_penalty_beta, ratio=fw_args.forgetwatch_penalty_ratio,
                               floor=fw_args.forgetwatch_penalty_floor, strategy=fw_args.forgetwatch_replay_strategy,
                               monitor=callbacks[0], tokenizer=_tokenizer(model_path), seed=training_args.seed,
                               max_length=getattr(training_args, "max_length", None))
        callbacks.append(anchor)  # it keeps the base's margins (read at the first micro-batch) for a resume
        if training_args.process_index == 0:
            print(f"1→0 penalty: beta {anchor.beta}, {anchor.ratio} pool items per example, floor {anchor.floor} nats, "
                  f"{fw_args.forgetwatch_replay_strategy}, over {len(anchor.items)} held-out multiple-choice items")
    report_to = training_args.report_to or []
    if "wandb" in report_to and not os.environ.get("WANDB_API_KEY") and not (Path.home() / ".netrc").is_file():
        os.environ.setdefault("WANDB_MODE", "offline")  # not logged in: keep the run on disk, `wandb sync` it later
    return dataset, callbacks, anchor


def base_outputs(fw_args, training_args, model_path: str, callback) -> Any:
    """The base's answers to the pool (`forgetwatch.distill`): read when made for this model, tokenizer and pool, else
    made now by the base (the main process first; the other ranks then read them)."""
    from forgetwatch.distill import load_or_make

    path = fw_args.forgetwatch_base_outputs or str(Path(training_args.output_dir) / "base_outputs.parquet")
    if training_args.world_size > 1 and not Path(path).is_file():
        # one process making them while the others wait at a barrier: ZeRO-3 cannot load the model on one rank, and a
        # large pool outlasts the barrier's timeout
        probes = str(fw_args.forgetwatch_probes)
        sampled = "" if is_probe_file(probes) else (  # suite names: sampled as the run samples
            f" --exclude-per-suite {fw_args.forgetwatch_per_suite or 'all'} --exclude-seed {fw_args.forgetwatch_seed}")
        raise ValueError(f"{path}: the base outputs do not exist yet; make them once before a multi-process run:\n  "
                         f"forgetwatch base-outputs --model {model_path} --pool {fw_args.pool()} --exclude {probes}{sampled} "
                         f"--max-length {getattr(training_args, 'max_length', None) or 1024} -o {path}\n"
                         f"and pass --forgetwatch_base_outputs {path}")
    kwargs = training_args.model_init_kwargs or {}
    dtype = kwargs.get("dtype") if isinstance(kwargs.get("dtype"), str) and kwargs.get("dtype") != "auto" else "float32"
    with training_args.main_process_first(desc="the base model's answers to the replay pool"):
        outputs = load_or_make(path, model_path, _tokenizer(model_path), fw_args.pool(), exclude=callback.probes,
                               max_length=getattr(training_args, "max_length", None), dtype=dtype,
                               max_new_tokens=fw_args.forgetwatch_behavior_max_new_tokens, progress=training_args.process_index == 0)
    if training_args.process_index == 0:
        print(f"base outputs: {len(outputs)} answers of the base in {path}")
    return outputs


def _tokenizer(model_path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path)


def _architecture(model_path: str) -> dict:
    from transformers import AutoConfig

    from forgetwatch.models import architecture_id

    return {"architecture": architecture_id(AutoConfig.from_pretrained(model_path))}


def finish(trainer, training_args, callbacks: list) -> None:
    """Save the model and print where everything is: the model, the forgetwatch record, the W&B run."""
    trainer.save_model(training_args.output_dir)
    if trainer.accelerator.is_main_process:
        print(f"model saved to {training_args.output_dir}")
        if callbacks:
            record = load_record(training_args.output_dir)
            print(record.format_curves())
            print(f"forgetwatch record: {record.root}  (replay file: {record.root / 'replay.jsonl'})")
        if "wandb" in (training_args.report_to or []):
            import wandb

            run_dir = Path(wandb.run.dir).parent if wandb.run is not None else None
            wandb.finish()
            if run_dir is not None and os.environ.get("WANDB_MODE") == "offline":
                print(f"W&B run (offline): {run_dir}\n  upload it with: wandb sync {run_dir}")
        if callbacks and (rewound := read_rewind(training_args.output_dir)) is not None:
            print(rewound.line())  # forgetwatch_rewind: the step back, at the checkpoint and at the picked α
    if hasattr(trainer, "end"):  # transformers >= 5.18: finish the trackers, destroy the process group
        trainer.end()
