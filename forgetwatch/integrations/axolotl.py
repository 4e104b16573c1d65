"""forgetwatch in Axolotl: a plugin that adds `ForgetWatchCallback` (and the KL anchor or the 1→0 penalty) to
`axolotl train`, configured by the YAML.

Add to an Axolotl config:

    plugins:
      - forgetwatch.integrations.axolotl.ForgetWatchPlugin
    forgetwatch_probes: arc_easy,sciq      # or a probe JSONL file
    forgetwatch_per_suite: 100
    forgetwatch_eval_steps: 50

The `forgetwatch_*` keys are `ForgetWatchArguments`' fields (same names, types, defaults and meanings as in the TRL
recipes); `ForgetWatchArgs`, the pydantic model Axolotl merges into its config schema, is made from them. The callback
is added to the trainer for SFT and for the RL builders (DPO, GRPO), logs to the trainer's `report_to` (which Axolotl
sets from `wandb_project` / `use_tensorboard` / ...), and writes its record under `<output_dir>/forgetwatch/`.

For SFT configs, `forgetwatch_anchor_beta: 5` adds the KL anchor to the loss (`forgetwatch_penalty_beta`: the 1→0
penalty), with the same keys and meanings as the TRL recipes (`forgetwatch_anchor_ratio`, `forgetwatch_replay_pool`,
`forgetwatch_replay_strategy`, `forgetwatch_base_outputs`, `forgetwatch_penalty_ratio`, `forgetwatch_penalty_floor`):
once Axolotl has built its trainer (`post_trainer_create`), `forgetwatch.remedies.build_remedies` builds the term from
them (the base's outputs are made by the model Axolotl loaded, before its first step, unless the file is there) and
`Remedies.attach` adds it to that trainer's loss.

Checked when Axolotl loads the config, before the model or any training step: a misspelt `forgetwatch_*` key, a
value of the wrong type, an option the callback refuses, keys without `forgetwatch_probes`, the TRL recipes' replay
mixing (Axolotl builds its own data), a loss term for an `rl:` config, a reward model or pre-training, and a term with
context parallelism. Axolotl 0.19 drops top-level keys it does not know without a word, and loads no plugin that
`plugins:` does not list, so a config with forgetwatch keys but without the plugin trains without forgetwatch:
`python -m forgetwatch.integrations.axolotl CONFIG.yaml` checks a config for that too (and everything above) without
loading a model.

This is the only module of forgetwatch that imports axolotl.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import Field, create_model

from ..options import LEGACY_VALUES, ForgetWatchArguments
from ..remedies.rewinder import rewind_callback
from ..run.callback import ForgetWatchCallback
from .config import (
    KEYS,
    TYPES,
    ConfigKeyError,
    front_end_arguments,
    penalty_needs_nonreentrant,
    refuse_duplicate_keys,
    where_given,
    yaml_key_lines,
)

__all__ = ["PLUGIN", "ForgetWatchArgs", "ForgetWatchPlugin", "arguments", "check_config", "stage"]  # noqa: F822 (made on first use)

logger = logging.getLogger(__name__)

_MODULE = "forgetwatch.integrations.axolotl"  # not __name__: that is __main__ under `python -m`
PLUGIN = f"{_MODULE}.ForgetWatchPlugin"


def _args_model():
    # an option whose earlier "off" was null (LEGACY_VALUES) still takes null: `arguments` reads it as today's
    fields = {f.name: (TYPES[f.name] | None if None in LEGACY_VALUES.get(f.name, {}) else TYPES[f.name],
                       Field(default=f.default, description=f.metadata.get("help")))
              for f in dataclasses.fields(ForgetWatchArguments)}
    model = create_model("ForgetWatchArgs", __module__=_MODULE, **fields)
    model.__doc__ = "The `forgetwatch_*` keys of an Axolotl config: `ForgetWatchArguments`' fields (made from them)."
    return model


ForgetWatchArgs = _args_model()


def _allows_none(name: str) -> bool:
    hint = TYPES[name]
    return type(None) in typing.get_args(hint)


def stage(cfg: Mapping[str, Any]) -> str:
    """What an Axolotl config trains, in `forgetwatch.remedies.check_remedies`' words: its `rl:` type (dpo, kto, orpo,
    grpo, ...), "rm" / "prm" for a (process) reward model, "pt" for pre-training data, else "sft".

    Example:
        >>> stage({"rl": "dpo"}), stage({"datasets": [{"path": "x"}]})
        ('dpo', 'sft')
    """
    rl = cfg.get("rl")
    if rl:
        return str(getattr(rl, "value", rl)).lower()
    if cfg.get("reward_model"):
        return "rm"
    if cfg.get("process_reward_model"):
        return "prm"
    if cfg.get("pretraining_dataset"):
        return "pt"
    return "sft"


def check_config(cfg: Mapping[str, Any], *, source: str | None = None, need_plugin: bool = True) -> dict[str, Any]:
    """Check an Axolotl config's `forgetwatch_*` keys (a raw YAML mapping); return them. Raises `ConfigKeyError`
    naming the file, the line, the key and the fix.

    Example:
        >>> check_config({"plugins": [PLUGIN], "forgetwatch_probes": "sciq", "forgetwatch_per_suite": 4})
        {'forgetwatch_probes': 'sciq', 'forgetwatch_per_suite': 4}
    """
    path = cfg.get("axolotl_config_path")
    lines = yaml_key_lines(path) if path and Path(str(path)).is_file() else {}
    if lines:  # the file is there: a key given twice lost a value before Axolotl (or this check) read it
        refuse_duplicate_keys(path)
    source = source or (str(path) if path else "the Axolotl config")
    plugins = cfg.get("plugins") or []
    plugins = [plugins] if isinstance(plugins, str) else list(plugins)
    if need_plugin and PLUGIN not in plugins:
        misspelt = next((p for p in plugins if _looks_like_ours(p)), None)
        if misspelt is not None:
            raise ConfigKeyError(
                f"{where_given(source, lines, 'plugins')}: plugins: {misspelt!r} is not a class Axolotl can load; "
                f"forgetwatch's plugin is spelt {PLUGIN}")
    args, _ = front_end_arguments(cfg, front_end="Axolotl", source=source, lines=lines, stage=stage(cfg))
    if args is None:
        return {}
    ours = {k: v for k, v in cfg.items() if k in KEYS}
    term = next((k for k in ("forgetwatch_anchor_beta", "forgetwatch_penalty_beta") if ours.get(k)), None)
    for key in ("context_parallel_size", "sequence_parallel_degree"):
        if term and (cfg.get(key) or 1) > 1:
            raise ConfigKeyError(
                f"{where_given(source, lines, term)}: {term} with {key}: {cfg[key]}: context parallelism splits every "
                "sequence across ranks, and the term's own forward runs whole sequences. Train the term with data "
                f"parallelism, FSDP or DeepSpeed (remove {key}), or without the term")
    if need_plugin and PLUGIN not in plugins:
        first = next(iter(ours))
        raise ConfigKeyError(
            f"{where_given(source, lines, first)}: {first} is set but the forgetwatch plugin is not in `plugins:`, and Axolotl "
            f"drops keys of plugins it has not loaded without a word (the run would train without forgetwatch). Add to "
            f"the config:\nplugins:\n  - {PLUGIN}")
    return ours


def _nonreentrant_for_the_penalty(cfg: dict) -> None:
    """The raw config, before Axolotl normalises it: with the 1→0 penalty (scale task_gradient) and
    `gradient_checkpointing` on, `gradient_checkpointing_kwargs` unset is made non-reentrant, which Axolotl would
    otherwise make reentrant (`penalty_needs_nonreentrant`); `use_reentrant: true` written in the config is refused."""
    if not cfg.get("gradient_checkpointing"):
        return
    args = arguments(cfg) if cfg.get("forgetwatch_penalty_beta") else None
    kwargs = cfg.get("gradient_checkpointing_kwargs") or {}
    path = cfg.get("axolotl_config_path")
    lines = yaml_key_lines(path) if path and Path(str(path)).is_file() else {}
    if lines:  # the file is there: a key given twice lost a value before Axolotl (or this check) read it
        refuse_duplicate_keys(path)
    if penalty_needs_nonreentrant(args, kwargs.get("use_reentrant"), key="gradient_checkpointing_kwargs.use_reentrant",
                                  source=str(path or "the Axolotl config"), lines=lines):
        cfg["gradient_checkpointing_kwargs"] = {**kwargs, "use_reentrant": False}
        logger.warning("forgetwatch: gradient_checkpointing_kwargs.use_reentrant set to false: the 1→0 penalty's scale "
                       "task_gradient measures gradients through the checkpointed layers, which reentrant "
                       "checkpointing does not allow")


def _looks_like_ours(entry: Any) -> bool:
    """A `plugins:` entry that is forgetwatch's plugin misspelt: another case, a letter off, a module path off
    (`forgetwatch.integration.axolotl.ForgetwatchPlugin`), or the class without its module path."""
    import difflib

    text = str(entry).strip()
    if text.lower() == PLUGIN.lower() or text.rsplit(".", 1)[-1].lower() == "forgetwatchplugin":
        return True
    return difflib.SequenceMatcher(None, text.lower(), PLUGIN.lower()).ratio() >= 0.85


def arguments(cfg: Mapping[str, Any]) -> ForgetWatchArguments:
    """`ForgetWatchArguments` from a config Axolotl has validated.

    Axolotl's validated config drops keys whose value is null (`model_dump(exclude_none=True)`) after filling in the
    defaults of the others, so a key that may be null and is absent was set to null (`forgetwatch_per_suite: null`:
    every probe of the suites).
    """
    values = {}
    for name in KEYS:
        if name in cfg:
            values[name] = cfg[name]
        elif _allows_none(name):
            values[name] = None
    return ForgetWatchArguments(**values)


def _tokenizer(cfg: Mapping[str, Any]):
    """The model's own tokenizer (the pool is written in its chat template, as `forgetwatch base-outputs` writes it),
    not the one Axolotl may have changed for its own prompt format."""
    from transformers import AutoTokenizer

    name = cfg.get("tokenizer_config") or cfg.get("base_model")
    return AutoTokenizer.from_pretrained(str(name), trust_remote_code=bool(cfg.get("trust_remote_code")))


def _plugin_class():
    from axolotl.integrations.base import BasePlugin

    class ForgetWatchPlugin(BasePlugin):
        """Axolotl plugin: `ForgetWatchCallback` in `axolotl train`, from the config's `forgetwatch_*` keys; for SFT,
        the KL anchor or the 1→0 penalty in the trainer's loss (`forgetwatch.remedies.build_remedies`).

        Example (in the Axolotl YAML):
            plugins:
              - forgetwatch.integrations.axolotl.ForgetWatchPlugin
            forgetwatch_probes: arc_easy,sciq
            forgetwatch_eval_steps: 50
            forgetwatch_anchor_beta: 5.0
        """

        def get_input_args(self) -> str:
            return f"{_MODULE}.ForgetWatchArgs"

        def register(self, cfg: dict) -> None:
            # The raw config, before Axolotl's schema drops the keys it does not know: a misspelt key is still there.
            keys = check_config(cfg, need_plugin=False)
            _nonreentrant_for_the_penalty(cfg)
            if not keys:
                logger.warning("forgetwatch: the plugin is listed but no forgetwatch_* key is set: nothing is scored "
                               "(set forgetwatch_probes)")

        def add_callbacks_post_trainer(self, cfg, trainer) -> list:
            args = arguments(cfg)
            self._callback = None
            if not args.forgetwatch_probes:
                return []
            callback = self._callback = ForgetWatchCallback.from_args(args)
            logger.info("forgetwatch: %d probes scored every %d steps (%s), record in %s/forgetwatch",
                        len(callback.probes), callback.eval_steps, callback.scoring, trainer.args.output_dir)
            rewind = rewind_callback(args, stage(cfg))  # forgetwatch_rewind: after the monitor, whose final evaluation it reads
            return [callback] + ([rewind] if rewind is not None else [])

        def post_trainer_create(self, cfg, trainer) -> None:
            # Axolotl calls it after the builder added the callbacks above, before any training step: the KL anchor or
            # the 1→0 penalty joins this trainer's loss, built as the recipes build it
            args = arguments(cfg)
            callback = getattr(self, "_callback", None)
            if callback is not None:
                # Added after the trainer was built, the callback missed on_init_end: the probes are measured against
                # the model's context now, so a set that does not fit is refused before W&B starts a run (train begin).
                callback.fit_probes(trainer.model, getattr(trainer, "processing_class", None) or _tokenizer(cfg))
            if callback is None or not (args.forgetwatch_anchor_beta or args.forgetwatch_penalty_beta):
                return
            from ..remedies import build_remedies

            tokenizer = _tokenizer(cfg)
            remedies = build_remedies(args, stage=stage(cfg), callback=callback, training_args=trainer.args,
                                      model=trainer.model, tokenizer=tokenizer, max_length=cfg.get("sequence_len"),
                                      front_end="Axolotl")
            remedies.attach(trainer)
            for line in remedies.summary:
                logger.info("forgetwatch: %s", line)

    ForgetWatchPlugin.__module__ = _MODULE
    return ForgetWatchPlugin


def __getattr__(name: str):
    # The plugin class subclasses axolotl's BasePlugin, so it is made on first use (Axolotl's plugin loader asks for it
    # by name): the keys model, `check_config` and `python -m forgetwatch.integrations.axolotl CONFIG` need no axolotl.
    if name == "ForgetWatchPlugin":
        cls = globals()["ForgetWatchPlugin"] = _plugin_class()
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main(argv: list[str] | None = None) -> int:
    """`python -m forgetwatch.integrations.axolotl CONFIG.yaml`: check a config's forgetwatch keys, load no model."""
    import argparse

    import yaml

    parser = argparse.ArgumentParser(
        prog=f"python -m {_MODULE}",
        description="Check an Axolotl config's forgetwatch_* keys (names, types, values, the plugin in `plugins:`) "
                    "without axolotl, a model or a GPU. Exit 0: the keys are fine; 1: the config is refused (the "
                    "message names the file, the line and the fix).")
    parser.add_argument("config", metavar="CONFIG.yaml", help="the Axolotl YAML config")
    try:
        path = Path(parser.parse_args(sys.argv[1:] if argv is None else argv).config)
    except SystemExit as e:  # --help: 0; a usage error: 2 (returned, for callers of main)
        return int(e.code or 0)
    try:
        with open(path) as f:  # an open file, so that a syntax error names it
            cfg = yaml.safe_load(f)
    except (OSError, yaml.YAMLError) as e:
        print(f"forgetwatch: error: {path}: {e}", file=sys.stderr)
        return 1
    if not isinstance(cfg, dict):
        print(f"forgetwatch: error: {path}: not a YAML mapping", file=sys.stderr)
        return 1
    try:
        keys = check_config({**cfg, "axolotl_config_path": str(path)})
    except ConfigKeyError as e:
        print(f"forgetwatch: error: {e}", file=sys.stderr)
        return 1
    print(f"{path}: forgetwatch keys ok ({', '.join(keys) or 'none set'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
