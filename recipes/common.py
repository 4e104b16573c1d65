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
from forgetwatch.remedies import build_remedies, check_remedies
from forgetwatch.scoring.models import smollm2_path


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
    """The training set, without any row that asks a probe's question (with replay mixed in when asked), the callbacks
    (the monitor when probes are set, the 1→0 penalty), and the `forgetwatch.remedies.Remedies` the options ask for
    (`remedies.attach(trainer)` adds the KL anchor's or the penalty's term to the trainer's loss). A refusal here, before
    any step (a probe file, a remedy the stage cannot take), ends the recipe with one line, no traceback."""
    try:
        return _data_and_callbacks(script_args, training_args, fw_args, stage, model_path)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None


def _data_and_callbacks(script_args, training_args, fw_args, stage: str, model_path: str | None) -> tuple[Any, list, Any]:
    check_remedies(fw_args, stage)  # before anything is loaded
    # Built first: it loads the probes, which the training data must not contain.
    callbacks = [ForgetWatchCallback.from_args(fw_args)] if fw_args.forgetwatch_probes else []
    with training_args.main_process_first(desc="loading the training data"):
        dataset = load_train_dataset(script_args.dataset_name, stage, config=script_args.dataset_config,
                                     split=script_args.dataset_train_split)
        if callbacks:
            dataset, dropped = drop_probe_overlap(dataset, callbacks[0].probes)
            if dropped and training_args.process_index == 0:
                print(f"dropped {dropped} training rows that ask a probe's question ({len(dataset)} left)")
        remedies = build_remedies(fw_args, stage=stage, callback=callbacks[0] if callbacks else None,
                                  training_args=training_args, model=model_path, train_dataset=dataset)
    if training_args.process_index == 0:
        for line in remedies.summary:
            print(line)
    report_to = training_args.report_to or []
    if "wandb" in report_to and not os.environ.get("WANDB_API_KEY") and not (Path.home() / ".netrc").is_file():
        os.environ.setdefault("WANDB_MODE", "offline")  # not logged in: keep the run on disk, `wandb sync` it later
    return remedies.train_dataset, callbacks + remedies.callbacks, remedies


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
    if hasattr(trainer, "end"):  # transformers >= 5.18: finish the trackers, destroy the process group
        trainer.end()


def parse(parser, argv: list[str] | None = None) -> tuple:
    """The recipe's arguments (`TrlParser.parse_args_and_config`), after its `--config` file is checked for one of
    forgetwatch's keys given twice: the YAML reader would keep the last value without a word (a stricter budget given
    first would be dropped), so the recipe stops, naming the file, the key and both lines."""
    import sys

    import yaml

    from forgetwatch.errors import ConfigKeyError
    from forgetwatch.integrations.config import check_keys, refuse_duplicate_keys, yaml_key_lines

    args = sys.argv[1:] if argv is None else argv
    for i, a in enumerate(args):
        if a == "--config" and i + 1 < len(args):
            path = args[i + 1]
        elif a.startswith("--config="):
            path = a.partition("=")[2]
        else:
            continue
        if Path(path).is_file():
            try:
                refuse_duplicate_keys(path)
                config = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
                if isinstance(config, dict):  # a misspelt forgetwatch key: named with the closest one
                    check_keys(config, source=path, lines=yaml_key_lines(path))
            except ConfigKeyError as e:
                raise SystemExit(f"error: {e}") from None
    try:  # a value an option refuses (`forgetwatch_max_share: 0`), a key no dataclass takes: one line, no traceback
        return parser.parse_args_and_config(args) if argv is not None else parser.parse_args_and_config()
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
