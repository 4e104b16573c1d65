"""Run a LLaMA-Factory YAML with forgetwatch: `forgetwatch llamafactory train config.yaml [key=value ...]`.

`llamafactory-cli train` passes no callbacks and its parser refuses keys it does not know. This launcher reads the YAML
and the `key=value` overrides as `llamafactory-cli train` does (OmegaConf: the file merged with the overrides), takes
the `forgetwatch_*` keys out and checks them (`forgetwatch.integrations.config`: a misspelt key or a wrong type is named
with its file and line before anything is trained), then calls LLaMA-Factory's own
`llamafactory.train.tuner.run_exp(args=rest, callbacks=[ForgetWatchCallback])`, which hands the callback to every
stage's trainer. Tested with llamafactory 0.9.5, stages sft and dpo (`forgetwatch docs llamafactory`).

For `stage: sft`, `forgetwatch_anchor_beta: 5` adds the KL anchor to the loss (`forgetwatch_penalty_beta`: the 1→0
penalty), with the same keys and meanings as the TRL recipes. `run_exp` builds its trainer itself, so for that call
LLaMA-Factory's SFT trainer class (`llamafactory.train.sft.workflow.CustomSeq2SeqTrainer`) is a subclass whose
`__init__` ends with `forgetwatch.remedies.build_remedies(...).attach(self)`: the term is built from the keys, the base's
outputs made by the model LLaMA-Factory loaded (before its first step) unless the file is there, and the term added to
that trainer's loss. Other stages, Ray, and Megatron (`use_mca`) or HyperParallel runs are refused with the term.

Several GPUs: like `llamafactory-cli train`, the command re-runs itself under torchrun (one process per visible device,
or `NPROC_PER_NODE`; `FORCE_TORCHRUN=1` forces it), as this module::

    torchrun --nproc_per_node 4 -m forgetwatch.integrations.llamafactory config.yaml [key=value ...]

Example:
    $ forgetwatch llamafactory train recipes/SmolLM2-135M-Instruct/llamafactory/sft_demo.yaml max_steps=10
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path
from typing import Any

from ..docs import docs_hint
from ..remedies import build_remedies
from .config import (
    ConfigKeyError,
    front_end_arguments,
    penalty_needs_nonreentrant,
    refuse_duplicate_keys,
    where_given,
    yaml_key_lines,
)

__all__ = ["TESTED_VERSION", "check", "launch", "main", "prepare", "read_config", "run", "split_config", "train"]

logger = logging.getLogger(__name__)

TESTED_VERSION = "0.9.5"
INSTALL = (f"pip install 'llamafactory=={TESTED_VERSION}' (it pins transformers <= 5.6.0, trl <= 0.24 and datasets <= "
           "4.0.0: give it a venv of its own, then install forgetwatch there from its wheel or its clone, `pip install -e "
           f"/path/to/forgetwatch`; {docs_hint('llamafactory', 'install')})")
TESTED_STAGES = ("sft", "dpo")
def _require_llamafactory() -> None:
    if importlib.util.find_spec("llamafactory") is None:
        raise ImportError(f"`forgetwatch llamafactory` needs LLaMA-Factory, which is not installed: {INSTALL}")
    have = version("llamafactory")
    if have != TESTED_VERSION:
        logger.warning("forgetwatch: llamafactory %s is installed; forgetwatch is tested with %s", have, TESTED_VERSION)


def read_config(path: str | os.PathLike,
                overrides: list[str] | tuple[str, ...] = ()) -> tuple[dict[str, Any], dict[str, int | str]]:
    """The config `llamafactory-cli train PATH KEY=VALUE...` would train on, and where each top-level key was given.

    Read as LLaMA-Factory 0.9.5's `hparams.parser.read_args` reads it: `OmegaConf.load` of the YAML (or JSON) merged
    with `OmegaConf.from_cli(overrides)`. The second dict maps a key to its line in the file, or for an override to the
    text `the command line (key=value)`, for messages.
    """
    import json

    import yaml

    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"{path}: no such config file")
    if file.suffix not in (".yaml", ".yml", ".json"):
        raise ValueError(f"{path}: LLaMA-Factory reads a .yaml, .yml or .json config")
    for item in overrides:
        if "=" not in item:
            raise ValueError(f"{item!r}: overrides are key=value, as for `llamafactory-cli train` (e.g. max_steps=10)")
    try:
        from omegaconf import OmegaConf  # LLaMA-Factory's own dependency
    except ImportError:  # `--check` without LLaMA-Factory: the same merge, written out (no ${...} interpolation)
        OmegaConf = None
    try:
        if OmegaConf is None:
            loaded = json.loads(file.read_text()) if file.suffix == ".json" else yaml.safe_load(file.read_text())
        elif file.suffix == ".json":
            config = OmegaConf.create(json.loads(file.read_text()))
        else:
            config = OmegaConf.load(file.absolute())
    except (json.JSONDecodeError, yaml.YAMLError) as e:
        raise ValueError(f"{path}: not a readable config: {e}") from None
    lines = yaml_key_lines(file) if file.suffix != ".json" else {}
    if lines:
        refuse_duplicate_keys(file)  # the reader kept the last of a key given twice: refused, as the other front-ends do
    if OmegaConf is not None:
        loaded = OmegaConf.to_container(config)
    if not isinstance(loaded, dict):
        raise ValueError(f"{path}: expected a mapping of LLaMA-Factory's arguments (`key: value` lines), got a "
                         f"{type(loaded).__name__}")
    if OmegaConf is None:
        merged = _merge_overrides(loaded, overrides)
    else:
        merged = OmegaConf.to_container(OmegaConf.merge(config, OmegaConf.from_cli(list(overrides))))
    where: dict[str, int | str] = dict(lines)
    for item in overrides:
        key = item.split("=", 1)[0].strip().split(".", 1)[0]
        where[key] = f"the command line ({item})"
    return merged, where


def _merge_overrides(config: dict[str, Any], overrides: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """`OmegaConf.merge(config, OmegaConf.from_cli(overrides))` for plain values, without omegaconf: a dotted key sets a
    nested one, and a value is read as YAML (`10` a number, `true` a boolean, `null` None)."""
    import copy

    import yaml

    merged = copy.deepcopy(config)
    for item in overrides:
        key, _, text = item.partition("=")
        try:
            value = yaml.safe_load(text) if text.strip() else None
        except yaml.YAMLError:
            value = text
        *parents, last = key.strip().split(".")
        node = merged
        for part in parents:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[last] = value
    return merged


# LLaMA-Factory options that run SFT outside `run_sft`'s trainer (Megatron, HyperParallel): a loss term cannot join there.
_OTHER_RUNNERS = {"use_mca": "Megatron-Core (mcore_adapter)", "use_hyper_parallel": "HyperParallel"}


def split_config(config: dict[str, Any], *, source: str, lines: dict[str, int | str] | None = None):
    """(`ForgetWatchArguments` or None, LLaMA-Factory's own keys): forgetwatch's keys checked, before any training.

    None when the config sets no forgetwatch key (LLaMA-Factory then runs without the callback, said in a warning);
    keys without `forgetwatch_probes` are refused, like replay mixing, and a loss term (the KL anchor, the 1→0
    penalty) for a stage other than sft or with an SFT runner it cannot join.
    Raises `ConfigKeyError` naming the file, the line, the key and the fix.
    """
    stage = config.get("stage", "sft")
    args, rest = front_end_arguments(config, front_end="LLaMA-Factory", source=source, lines=lines, stage=stage)
    if args is None:
        logger.warning("forgetwatch: %s sets no forgetwatch_* key: LLaMA-Factory runs without forgetwatch (add "
                       "forgetwatch_probes, e.g. arc_easy,sciq, to score probes)", source)
        return None, rest
    term = _term(args)
    for key, runner in _OTHER_RUNNERS.items():
        if term and rest.get(key):
            raise ConfigKeyError(f"{where_given(source, lines, term)}: {term} with {key}: true: {runner} trains SFT with its "
                                 f"own trainer, which the term cannot join. Remove {key}, or the term")
    if stage not in TESTED_STAGES:
        logger.warning("forgetwatch: stage %r: the callback is handed to it, but only %s are tested with LLaMA-Factory",
                       stage, " and ".join(TESTED_STAGES))
    if not rest.get("disable_gradient_checkpointing") and penalty_needs_nonreentrant(
            args, rest.get("use_reentrant_gc"), key="use_reentrant_gc", source=source, lines=lines):
        rest["use_reentrant_gc"] = False  # LLaMA-Factory's default is reentrant; the same gradients, and the scale works
        logger.warning("forgetwatch: use_reentrant_gc set to false: the 1→0 penalty's scale task_gradient measures "
                       "gradients through the checkpointed layers, which reentrant checkpointing does not allow")
    return args, rest


def _term(fw_args) -> str | None:
    """The option of the loss term this config turns on (the KL anchor, the 1→0 penalty), or None."""
    return next((k for k in ("forgetwatch_anchor_beta", "forgetwatch_penalty_beta") if getattr(fw_args, k)), None)


@contextlib.contextmanager
def _remedies_in_sft_trainer(fw_args, rest: dict[str, Any], callback) -> Iterator[None]:
    """While `run_exp` runs: LLaMA-Factory's SFT trainer class, made to end its `__init__` with the remedies the keys
    ask for (`build_remedies(...).attach(trainer)`), as the Axolotl plugin's `post_trainer_create` does."""
    if fw_args is None or callback is None or not _term(fw_args):
        yield
        return
    from llamafactory.train.sft import workflow


    original = workflow.CustomSeq2SeqTrainer

    class ForgetWatchSeq2SeqTrainer(original):
        def __init__(self, *args: Any, **kwargs: Any):
            super().__init__(*args, **kwargs)
            if not self.args.do_train:
                return
            from transformers import AutoTokenizer

            # the model's own tokenizer: the pool is written in its chat template, as `forgetwatch base-outputs` writes it
            tokenizer = AutoTokenizer.from_pretrained(rest["model_name_or_path"],
                                                      trust_remote_code=bool(rest.get("trust_remote_code")))
            remedies = build_remedies(fw_args, stage="sft", callback=callback, training_args=self.args, model=self.model,
                                      tokenizer=tokenizer, max_length=rest.get("cutoff_len", 2048),
                                      front_end="LLaMA-Factory")
            remedies.attach(self)
            if self.is_world_process_zero():
                for line in remedies.summary:
                    print(f"forgetwatch: {line}")

    workflow.CustomSeq2SeqTrainer = ForgetWatchSeq2SeqTrainer
    try:
        yield
    finally:
        workflow.CustomSeq2SeqTrainer = original


def _resolve_model(rest: dict[str, Any]) -> None:
    """`model_name_or_path: smollm2` is the offline SmolLM2-135M-Instruct, as in forgetwatch's recipes."""
    if rest.get("model_name_or_path") == "smollm2":
        from ..scoring.models import smollm2_path

        rest["model_name_or_path"] = str(smollm2_path())


def _world() -> tuple[bool, int]:
    """(re-run under torchrun?, processes per node), decided as LLaMA-Factory 0.9.5's launcher decides it."""
    from llamafactory.extras.misc import get_device_count, is_env_enabled, use_kt, use_ray

    if os.environ.get("LOCAL_RANK") is not None:  # already a torchrun worker
        return False, 1
    count = get_device_count()
    relaunch = is_env_enabled("FORCE_TORCHRUN") or (count > 1 and not use_ray() and not use_kt())
    return relaunch, int(os.getenv("NPROC_PER_NODE", str(max(count, 1))))


def _torchrun(path: str, overrides: list[str], nproc: int) -> int:
    from llamafactory.extras.misc import find_available_port

    command = [sys.executable, "-m", "torch.distributed.run",
               "--nnodes", os.getenv("NNODES", "1"), "--node_rank", os.getenv("NODE_RANK", "0"),
               "--nproc_per_node", str(nproc), "--master_addr", os.getenv("MASTER_ADDR", "127.0.0.1"),
               "--master_port", os.getenv("MASTER_PORT", str(find_available_port())),
               "-m", __name__, path, *overrides]
    print("forgetwatch: " + " ".join(command[2:]), file=sys.stderr)
    return subprocess.run(command, check=False).returncode


def prepare(path: str | os.PathLike, overrides: list[str] | tuple[str, ...] = ()):
    """(`ForgetWatchArguments` or None, LLaMA-Factory's arguments): the config read and its forgetwatch keys checked.

    Raises `ImportError` (LLaMA-Factory missing, with how to install it) or `ConfigKeyError` / `ValueError` (a bad
    key, named with its file and line) before anything is loaded or trained.
    """
    source = str(path)
    config, lines = read_config(path, list(overrides))  # a missing file or a bad key is said before the install line
    fw_args, rest = split_config(config, source=source, lines=lines)
    _require_llamafactory()
    if fw_args is not None and _term(fw_args):
        from llamafactory.extras.misc import use_ray

        if use_ray():
            raise ConfigKeyError(f"{where_given(source, lines, _term(fw_args))}: {_term(fw_args)} with USE_RAY=1: Ray trains in "
                                 "worker processes, where the term is not added to the trainer. Unset USE_RAY, or remove "
                                 "the term")
    _resolve_model(rest)
    return fw_args, rest


def check(path: str | os.PathLike, overrides: list[str] | tuple[str, ...] = ()) -> None:
    """Check a config without training: forgetwatch's keys, then LLaMA-Factory's own parser (`get_train_args`). Without
    LLaMA-Factory installed, forgetwatch's keys alone, and the line printed says what was not checked."""
    if importlib.util.find_spec("llamafactory") is None:
        config, lines = read_config(path, list(overrides))
        fw_args, _ = split_config(config, source=str(path), lines=lines)
        print(f"{path}: forgetwatch: {_summary(fw_args)}. LLaMA-Factory's own keys were not checked (LLaMA-Factory is "
              f"not installed: {INSTALL})")
        return
    fw_args, rest = prepare(path, overrides)
    from llamafactory.hparams import get_train_args

    get_train_args(dict(rest))  # it refuses keys it does not know, as `llamafactory-cli train` would
    print(f"{path}: LLaMA-Factory's arguments parse; forgetwatch: {_summary(fw_args)}")


def _summary(fw_args) -> str:
    return f"probes {fw_args.forgetwatch_probes}, every {fw_args.forgetwatch_eval_steps} steps" if fw_args else "off"


def run(fw_args, rest: dict[str, Any]) -> None:
    """LLaMA-Factory's `run_exp` on `rest`, with the callback when `fw_args` is set (from `prepare`)."""
    from llamafactory.train.tuner import run_exp

    from ..remedies.rewinder import rewind_callback
    from ..run.callback import ForgetWatchCallback

    callbacks = [ForgetWatchCallback.from_args(fw_args)] if fw_args else []
    rewind = rewind_callback(fw_args, str(rest.get("stage", "sft"))) if fw_args else None  # after the monitor
    callbacks += [rewind] if rewind is not None else []
    with _remedies_in_sft_trainer(fw_args, rest, callbacks[0] if callbacks else None):
        run_exp(args=rest, callbacks=callbacks)
    if fw_args and int(os.environ.get("RANK", "0")) == 0:
        out = rest.get("output_dir", ".")
        print(f"forgetwatch: record in {Path(out) / 'forgetwatch'}; `forgetwatch report {out}` for plots and a page")


def launch(fw_args, rest: dict[str, Any], path: str | os.PathLike, overrides: list[str] | tuple[str, ...] = (),
           *, relaunch: bool = True) -> int:
    """Train: under torchrun when several devices are visible (as `llamafactory-cli train` does), else `run` here."""
    if relaunch:
        multi, nproc = _world()
        if multi:
            return _torchrun(str(path), list(overrides), nproc)
    run(fw_args, rest)
    return 0


def train(path: str | os.PathLike, overrides: list[str] | tuple[str, ...] = (), *, relaunch: bool = True) -> int:
    """Check `path`'s forgetwatch keys, then train with LLaMA-Factory and the callback (see the module docstring).

    Args:
        path: a LLaMA-Factory YAML (or JSON) config, with `forgetwatch_*` keys.
        overrides: `key=value` items, as `llamafactory-cli train` takes them after the file.
        relaunch: re-run under torchrun when several devices are visible, as `llamafactory-cli train` does.

    Example:
        >>> train("sft.yaml", ["max_steps=20", "forgetwatch_eval_steps=5"])  # doctest: +SKIP
    """
    fw_args, rest = prepare(path, overrides)
    return launch(fw_args, rest, path, overrides, relaunch=relaunch)


def main(argv: list[str] | None = None) -> int:
    """`python -m forgetwatch.integrations.llamafactory CONFIG [key=value ...]`: the form torchrun runs."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        fw_args, rest = prepare(argv[0], argv[1:])
    except (ValueError, ImportError, OSError) as e:
        print(f"forgetwatch: error: {e}", file=sys.stderr)
        return 2
    run(fw_args, rest)  # under torchrun already, or one process
    return 0


if __name__ == "__main__":
    sys.exit(main())
