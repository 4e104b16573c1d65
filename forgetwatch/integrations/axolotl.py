"""forgetwatch in Axolotl: a plugin that adds `ForgetWatchCallback` to `axolotl train`, configured by the YAML.

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

Checked when Axolotl loads the config, before the model or any training step: a misspelt `forgetwatch_*` key, a
value of the wrong type, an option the callback refuses, keys without `forgetwatch_probes`, and the TRL recipes'
data options (replay mixing, the KL anchor), which this plugin does not apply. Axolotl 0.19 drops top-level keys it
does not know without a word, and loads no plugin that `plugins:` does not list, so a config with forgetwatch keys
but without the plugin trains without forgetwatch: `python -m forgetwatch.integrations.axolotl CONFIG.yaml` checks a
config for that too (and everything above) without loading a model.

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

from axolotl.integrations.base import BasePlugin
from pydantic import Field, create_model

from ..callback import ForgetWatchArguments, ForgetWatchCallback
from .config import KEYS, ConfigKeyError, parse_keys, split_keys, yaml_key_lines

__all__ = ["PLUGIN", "ForgetWatchArgs", "ForgetWatchPlugin", "arguments", "check_config"]

logger = logging.getLogger(__name__)

_MODULE = "forgetwatch.integrations.axolotl"  # not __name__: that is __main__ under `python -m`
PLUGIN = f"{_MODULE}.ForgetWatchPlugin"
# Options of the TRL recipes that change the training data or the loss (recipes/common.py applies them); the plugin only
# adds the callback, so a value other than the default is refused rather than ignored.
RECIPE_ONLY = ("forgetwatch_replay_mix", "forgetwatch_replay_pool", "forgetwatch_replay_strategy",
               "forgetwatch_replay_targets", "forgetwatch_base_outputs", "forgetwatch_anchor_beta",
               "forgetwatch_anchor_ratio")
_HINTS = typing.get_type_hints(ForgetWatchArguments)


def _args_model():
    fields = {f.name: (_HINTS[f.name], Field(default=f.default, description=f.metadata.get("help")))
              for f in dataclasses.fields(ForgetWatchArguments)}
    model = create_model("ForgetWatchArgs", __module__=_MODULE, **fields)
    model.__doc__ = "The `forgetwatch_*` keys of an Axolotl config: `ForgetWatchArguments`' fields (made from them)."
    return model


ForgetWatchArgs = _args_model()


def _allows_none(name: str) -> bool:
    hint = _HINTS[name]
    return type(None) in typing.get_args(hint)


def check_config(cfg: Mapping[str, Any], *, source: str | None = None, need_plugin: bool = True) -> dict[str, Any]:
    """Check an Axolotl config's `forgetwatch_*` keys (a raw YAML mapping); return them. Raises `ConfigKeyError`
    naming the file, the line, the key and the fix.

    Example:
        >>> check_config({"plugins": [PLUGIN], "forgetwatch_probes": "sciq", "forgetwatch_per_suite": 4})
        {'forgetwatch_probes': 'sciq', 'forgetwatch_per_suite': 4}
    """
    path = cfg.get("axolotl_config_path")
    lines = yaml_key_lines(path) if path and Path(str(path)).is_file() else {}
    source = source or (str(path) if path else "the Axolotl config")
    ours, _ = split_keys(cfg, source=source, lines=lines)
    if not ours:
        return ours
    first = next(iter(ours))
    where = f"{source}, line {lines[first]}" if first in lines else source
    if need_plugin and PLUGIN not in (cfg.get("plugins") or []):
        raise ConfigKeyError(
            f"{where}: {first} is set but the forgetwatch plugin is not in `plugins:`, and Axolotl drops keys of plugins "
            f"it has not loaded without a word (the run would train without forgetwatch). Add to the config:\n"
            f"plugins:\n  - {PLUGIN}")
    for key in RECIPE_ONLY:
        if key in ours and ours[key] != KEYS[key].default:
            at = f"{source}, line {lines[key]}" if key in lines else source
            raise ConfigKeyError(
                f"{at}: {key}: the Axolotl plugin adds forgetwatch's callback and does not change Axolotl's training data "
                f"or loss; replay mixing and the KL anchor are applied by forgetwatch's TRL recipes (recipes/sft.py). "
                f"Remove {key} (or set it to {KEYS[key].default!r}), or train with a recipe")
    if not ours.get("forgetwatch_probes"):
        raise ConfigKeyError(
            f"{where}: {first} is set but forgetwatch_probes is not, so nothing would be scored: add "
            f"`forgetwatch_probes:` (built-in suite names such as arc_easy,sciq, or a probe JSONL file), or remove the "
            f"forgetwatch_* keys")
    parse_keys(ours, source=source, lines=lines)
    return ours


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


class ForgetWatchPlugin(BasePlugin):
    """Axolotl plugin: `ForgetWatchCallback` in `axolotl train`, from the config's `forgetwatch_*` keys.

    Example (in the Axolotl YAML):
        plugins:
          - forgetwatch.integrations.axolotl.ForgetWatchPlugin
        forgetwatch_probes: arc_easy,sciq
        forgetwatch_eval_steps: 50
    """

    def get_input_args(self) -> str:
        return f"{_MODULE}.ForgetWatchArgs"

    def register(self, cfg: dict) -> None:
        # The raw config, before Axolotl's schema drops the keys it does not know: a misspelt key is still there.
        keys = check_config(cfg, need_plugin=False)
        if not keys:
            logger.warning("forgetwatch: the plugin is listed but no forgetwatch_* key is set: nothing is scored "
                           "(set forgetwatch_probes)")

    def add_callbacks_post_trainer(self, cfg, trainer) -> list:
        args = arguments(cfg)
        if not args.forgetwatch_probes:
            return []
        callback = ForgetWatchCallback.from_args(args)
        logger.info("forgetwatch: %d probes scored every %d steps (%s), record in %s/forgetwatch",
                    len(callback.probes), callback.eval_steps, callback.scoring, trainer.args.output_dir)
        return [callback]


def main(argv: list[str] | None = None) -> int:
    """`python -m forgetwatch.integrations.axolotl CONFIG.yaml`: check a config's forgetwatch keys, load no model."""
    import yaml

    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or argv[0].startswith("-"):
        print("usage: python -m forgetwatch.integrations.axolotl CONFIG.yaml", file=sys.stderr)
        return 2
    path = Path(argv[0])
    try:
        cfg = yaml.safe_load(path.read_text())
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
