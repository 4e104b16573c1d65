"""The remedies a run's options ask for, built by one function that every front-end calls.

`build_remedies(fw_args, ...)` reads the `forgetwatch_*` options and returns a `Remedies`: the training data (with
replay mixed in, or as it was), the callbacks to add (the 1→0 penalty), the loss term to add (the KL anchor or the
penalty) and the base's outputs it read or made. `Remedies.attach(trainer)` puts the callbacks and the loss term
into a built trainer. forgetwatch's TRL recipes, the Axolotl plugin, `forgetwatch llamafactory train` and your own
script all go through these two calls, so each front-end gets the same checks, the same draws and the same loss.

`check_remedies(fw_args, stage)` is the part that needs no model: every combination that cannot work (a remedy for
a stage it does not fit, a closed loop without inline scoring, replay in a front-end that builds its own data) is
refused there, before anything is loaded, with the option and what to do; `build_remedies` calls it first.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path
from typing import Any

from ..commands import quote
from ..probes.suites import is_probe_file
from ..scoring.models import architecture_id
from .base_outputs import load_or_make
from .protocols import LossTerm, MonitorView

__all__ = ["Remedies", "base_outputs_for", "build_remedies", "check_remedies", "needs_base_outputs", "replay_pool"]

logger = logging.getLogger(__name__)

# Why a loss term or base-answer replay does not fit a stage, by the stage's name in the recipes (sft, grpo, dpo),
# LLaMA-Factory (pt, sft, rm, ppo, dpo, kto) and Axolotl (`rl:` types, reward models, pre-training).
_NOT_SFT = {
    "grpo": "GRPO already anchors to its reference model with `beta`, and replays prompts (forgetwatch_replay_mix, gold "
            "targets) that its rewards check",
    "gdpo": "GDPO anchors to its reference model with `beta`",
    "dpo": "DPO trains on preference pairs and anchors to its reference model with its own `beta`",
    "ipo": "IPO trains on preference pairs and anchors to its reference model",
    "simpo": "SimPO trains on preference pairs",
    "orpo": "ORPO trains on preference pairs",
    "kto": "KTO anchors to its reference model with its own `beta`",
    "ppo": "PPO anchors to its reference model with its KL coefficient",
    "rm": "reward-model training learns scores from pairs, not next tokens",
    "prm": "process-reward-model training learns step scores, not next tokens",
    "pt": "pre-training is not tested with it (forgetwatch measures and anchors answers to held-out questions after SFT)",
    "ebft": "Axolotl's EBFT trainer has its own objective",
}
REPLAY_STAGES = ("sft", "grpo")  # stages whose data replay mixing can join (recipes/sft.py, recipes/grpo.py)


def needs_base_outputs(fw_args: Any) -> bool:
    """Self-distilled replay or the KL anchor: both read the base's answers to the pool."""
    return bool(fw_args.forgetwatch_anchor_beta) or (bool(fw_args.forgetwatch_replay_mix)
                                                     and fw_args.forgetwatch_replay_targets == "base")


def replay_pool(fw_args: Any) -> str:
    """The pool that replay, the anchor and the penalty draw from: `forgetwatch_replay_pool`, or the rest of the
    monitored suites (the monitored probes are held out by id)."""

    pool = fw_args.forgetwatch_replay_pool
    if pool is None:
        probes = str(fw_args.forgetwatch_probes or "")
        if is_probe_file(probes):
            raise ValueError(f"forgetwatch_replay_pool is needed: forgetwatch_probes is a file ({probes}), so there are "
                             "no suites to hold examples out of; give suite names or a file of held-out examples")
        pool = probes
    return pool


def _terms(fw_args: Any) -> list[str]:
    """The options that turn a remedy on, as named in the config."""
    on = [k for k in ("forgetwatch_anchor_beta", "forgetwatch_penalty_beta") if getattr(fw_args, k)]
    if fw_args.forgetwatch_replay_mix:
        on.append("forgetwatch_replay_mix")
    return on


def check_remedies(fw_args: Any, stage: str, *, front_end: str | None = None) -> None:
    """Refuse, before anything is loaded, remedies that cannot work for this run: each `ValueError` names the option,
    the reason and what to do.

    Args:
        fw_args: the run's `ForgetWatchArguments`.
        stage: what the run trains: "sft", "grpo", "dpo" (the recipes), LLaMA-Factory's `stage` (pt, sft, rm, ppo,
            dpo, kto), or Axolotl's `rl:` type (dpo, kto, orpo, grpo, ...), "rm" for a reward model, "pt" for
            pre-training.
        front_end: "Axolotl" or "LLaMA-Factory" when the front-end builds the training data itself (replay mixing is
            then refused), None for the recipes and your own script.

    Example:
        >>> from forgetwatch import ForgetWatchArguments
        >>> check_remedies(ForgetWatchArguments(forgetwatch_probes="sciq", forgetwatch_anchor_beta=5.0), "sft")
        >>> check_remedies(ForgetWatchArguments(forgetwatch_probes="sciq", forgetwatch_anchor_beta=5.0), "dpo")
        Traceback (most recent call last):
        ...
        ValueError: forgetwatch_anchor_beta is an SFT option and this run trains stage 'dpo': ... or train with SFT
    """
    terms = _terms(fw_args)
    if not terms:
        return
    stage = str(stage).lower()
    if fw_args.forgetwatch_replay_mix and front_end is not None:
        raise ValueError(f"forgetwatch_replay_mix mixes held-out examples into the training data in forgetwatch's TRL recipes "
                         f"(recipes/sft.py, recipes/grpo.py); {front_end} builds its own data pipeline: set it to 0 and use "
                         "forgetwatch_anchor_beta or forgetwatch_penalty_beta here, or train with a recipe")
    sft_only = [k for k in terms if k != "forgetwatch_replay_mix"]
    if fw_args.forgetwatch_replay_mix and fw_args.forgetwatch_replay_targets == "base":
        sft_only.append("forgetwatch_replay_targets")
    if stage != "sft" and sft_only:
        key = sft_only[0]
        why = _NOT_SFT.get(stage, "the terms are weighted like training examples of supervised fine-tuning")
        fix = ("set it to gold (the probes' gold answers)" if key == "forgetwatch_replay_targets" else
               f"Set {key} to 0 for this stage")
        raise ValueError(f"{key} is an SFT option and this run trains stage {stage!r}: {why}. {fix}, or train with SFT")
    if fw_args.forgetwatch_replay_mix and stage not in REPLAY_STAGES:
        raise ValueError(f"forgetwatch_replay_mix mixes examples into SFT or GRPO data; stage {stage!r} trains on other "
                         "rows (preference pairs, rewards): set it to 0" + (" for recipes/dpo.py" if stage == "dpo" else ""))
    if not fw_args.forgetwatch_probes:
        raise ValueError(f"{terms[0]} needs forgetwatch_probes: its pool is held out from the monitored probes, and the "
                         "loop follows what they measure")
    replay_pool(fw_args)  # a probe file has no rest of its suites to draw from: forgetwatch_replay_pool is needed
    if fw_args.forgetwatch_scoring == "sidecar" and fw_args.forgetwatch_replay_strategy == "closed_loop":
        raise ValueError(f"{terms[0]} with forgetwatch_replay_strategy closed_loop: the loop steers by the scores inside "
                         "the training process, and forgetwatch_scoring sidecar scores in `forgetwatch watch`: set "
                         "forgetwatch_replay_strategy to uniform, or forgetwatch_scoring to inline")


@dataclasses.dataclass
class Remedies:
    """What `build_remedies` made for a run.

    Attributes:
        train_dataset: the data to train on: the training set with replay mixed in (a `datasets.IterableDataset`
            without end, so the trainer needs `max_steps`), or the training set as it was given.
        callbacks: callbacks to add to the trainer besides the monitor (the 1→0 penalty reads the base's margins when
            training begins, and keeps them for a resume).
        loss_term: the term to add to the trainer's loss (`KLAnchor` or `MarginPenalty`), or None.
        base_outputs: the base's answers to the pool (self-distilled replay, the anchor), or None.
        summary: one line per remedy, to print (the recipes print them on the main process).
    """

    train_dataset: Any = None
    callbacks: list[Any] = dataclasses.field(default_factory=list)
    loss_term: LossTerm | None = None
    base_outputs: Any = None
    summary: list[str] = dataclasses.field(default_factory=list)

    def attach(self, trainer: Any) -> Any:
        """Put the callbacks and the loss term into a built trainer (before `trainer.train()`); return it.

        Example:
            >>> trainer = SFTTrainer(model=model, args=args, train_dataset=remedies.train_dataset,
            ...                      callbacks=[watch])  # doctest: +SKIP
            >>> remedies.attach(trainer).train()  # doctest: +SKIP
        """
        for callback in self.callbacks:
            # one of each kind: a front-end may have added the rewind callback already, from the same options
            if not any(type(c) is type(callback) for c in trainer.callback_handler.callbacks):
                trainer.add_callback(callback)
        if self.loss_term is not None:
            from .trainer import add_loss_term

            add_loss_term(trainer, self.loss_term)
        return trainer


def build_remedies(fw_args: Any, *, stage: str, callback: MonitorView | None, training_args: Any, model: Any,
                   tokenizer: Any = None, train_dataset: Any = None, max_length: int | None = None,
                   front_end: str | None = None) -> Remedies:
    """The remedies `fw_args` asks for: replay mixing, the base's outputs, the KL anchor, the 1→0 penalty.

    Everything is checked (`check_remedies`) before anything is loaded; the base's outputs are read from
    `forgetwatch_base_outputs` when they match the model, tokenizer and pool, else made by the base (the main process
    first; a multi-process launch without the file is refused with the command that makes it).

    Args:
        fw_args: the run's `ForgetWatchArguments`.
        stage: what the run trains (see `check_remedies`): the anchor and the penalty are for "sft".
        callback: the run's `ForgetWatchCallback` (None only when no remedy is on): it steers the closed loop, its
            probes are held out of the pool, and it records the draws.
        training_args: the trainer's arguments (`TrainingArguments` or a subclass: `seed`, `output_dir`,
            `max_steps`, the process layout; TRL's `max_length` and `model_init_kwargs` when they are there).
        model: the base model's name or path (it is loaded only to make base outputs), or the model itself, before
            any training step.
        tokenizer: the model's own tokenizer (default: loaded from `model`): the pool is written in its chat template.
        train_dataset: the training examples, needed with `forgetwatch_replay_mix`.
        max_length: the longest sequence trained on (default: `training_args.max_length`); pool conversations are cut
            there.
        front_end: "Axolotl" or "LLaMA-Factory" when called by a front-end (see `check_remedies`).

    Returns:
        `Remedies`: `.train_dataset`, `.callbacks`, `.loss_term`; `.attach(trainer)` adds them to a trainer.

    Example:
        >>> from trl import SFTTrainer
        >>> watch = ForgetWatchCallback.from_args(fw_args)  # doctest: +SKIP
        >>> remedies = build_remedies(fw_args, stage="sft", callback=watch, training_args=args, model="my/base",
        ...                           train_dataset=train)  # doctest: +SKIP
        >>> trainer = SFTTrainer(model="my/base", args=args, train_dataset=remedies.train_dataset,
        ...                      callbacks=[watch])  # doctest: +SKIP
        >>> remedies.attach(trainer).train()  # doctest: +SKIP
    """
    check_remedies(fw_args, stage, front_end=front_end)
    remedies = Remedies(train_dataset=train_dataset)
    if fw_args.forgetwatch_rewind:  # the step back at the end: runs after the monitor's final evaluation
        from .rewinder import rewind_callback

        remedies.callbacks.append(rewind_callback(fw_args, stage))
    if not _terms(fw_args):
        return remedies
    if callback is None:
        raise ValueError(f"{_terms(fw_args)[0]} needs the run's ForgetWatchCallback (`callback=`): the loop follows what it "
                         "measures, and its probes are held out of the pool")
    if max_length is None:
        max_length = getattr(training_args, "max_length", None)
    if tokenizer is None and (needs_base_outputs(fw_args) or fw_args.forgetwatch_penalty_beta):
        if not isinstance(model, (str, Path)):
            raise ValueError("build_remedies: pass `tokenizer=` (the model's own tokenizer) with a model object")
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(model))
    if needs_base_outputs(fw_args):
        remedies.base_outputs = base_outputs_for(fw_args, training_args, model, callback, tokenizer=tokenizer,
                                                 max_length=max_length)
        path = remedies.base_outputs.source
        remedies.summary.append(f"base outputs: {len(remedies.base_outputs)} answers of the base in {path}")
    if fw_args.forgetwatch_replay_mix:
        from .replay_dataset import mix_replay

        if train_dataset is None:
            raise ValueError("forgetwatch_replay_mix needs the training examples (`train_dataset=`)")
        if training_args.max_steps <= 0:
            raise ValueError("forgetwatch_replay_mix makes the training data a stream without end: set max_steps")
        targets = fw_args.forgetwatch_replay_targets
        pool = remedies.base_outputs if targets == "base" else replay_pool(fw_args)  # base: the base's own answers
        ratio, strategy = fw_args.forgetwatch_replay_mix, fw_args.forgetwatch_replay_strategy
        remedies.train_dataset = mix_replay(train_dataset, pool, ratio=ratio, strategy=strategy, monitor=callback,
                                            seed=training_args.seed)
        sizes = ", ".join(f"{c} {len(rows)}" for c, rows in remedies.train_dataset.mixer.pool.items())
        remedies.summary.append(f"replay: {ratio:.0%} of the examples, {strategy}, {targets} targets, from {sizes}")
    strategy = fw_args.forgetwatch_replay_strategy
    if fw_args.forgetwatch_anchor_beta:
        from .anchor import KLAnchor

        ident = _architecture(model) if isinstance(model, (str, Path)) else model
        anchor = KLAnchor(remedies.base_outputs, beta=fw_args.forgetwatch_anchor_beta, ratio=fw_args.forgetwatch_anchor_ratio,
                          strategy=strategy, monitor=callback, seed=training_args.seed, tokenizer=tokenizer, model=ident,
                          max_length=max_length)
        remedies.loss_term = anchor
        remedies.summary.append(f"KL anchor: beta {anchor.beta}, {anchor.ratio} pool conversations per example, {strategy}, "
                                f"over {len(anchor.outputs)} base answers")
    if fw_args.forgetwatch_penalty_beta:
        from .penalty import MarginPenalty

        penalty = MarginPenalty(replay_pool(fw_args), beta=fw_args.forgetwatch_penalty_beta,
                                ratio=fw_args.forgetwatch_penalty_ratio, floor=fw_args.forgetwatch_penalty_floor,
                                strategy=strategy, monitor=callback, tokenizer=tokenizer, seed=training_args.seed,
                                max_length=max_length, scale=fw_args.forgetwatch_penalty_scale)
        remedies.loss_term = penalty
        remedies.callbacks.append(penalty)  # it keeps the base's margins (read at the first micro-batch) for a resume
        remedies.summary.append(
            f"1→0 penalty: beta {penalty.beta} ({penalty.scale}), {penalty.ratio} pool items per example, floor "
            f"{penalty.floor} nats, {strategy}, over {len(penalty.items)} held-out multiple-choice items"
        )
    if training_args.process_index == 0:
        for line in remedies.summary:
            logger.info("forgetwatch: %s", line)
    return remedies


def base_outputs_for(fw_args: Any, training_args: Any, model: Any, callback: MonitorView, *, tokenizer: Any = None,
                     max_length: int | None = None) -> Any:
    """The base's answers to the pool (`forgetwatch.remedies.BaseOutputs`): read from `forgetwatch_base_outputs` when
    made for this model, tokenizer and pool, else made now by the base (the main process first; the other ranks then
    read them). A multi-process launch without the file is refused, with the command that makes it."""

    if max_length is None:
        max_length = getattr(training_args, "max_length", None)
    path = fw_args.forgetwatch_base_outputs or str(Path(training_args.output_dir) / "base_outputs.parquet")
    if training_args.world_size > 1 and not Path(path).is_file():
        # one process making them while the others wait at a barrier: ZeRO-3 cannot load the model on one rank, and a
        # large pool outlasts the barrier's timeout
        probes = str(fw_args.forgetwatch_probes)
        sampled = "" if is_probe_file(probes) else (  # suite names: sampled as the run samples
            f" --exclude-per-suite {fw_args.forgetwatch_per_suite or 'all'} --exclude-seed {fw_args.forgetwatch_seed}")
        # a front-end passes the loaded model: its name, not its printout, goes into the command
        name = model if isinstance(model, (str, os.PathLike)) else (
            getattr(getattr(model, "config", None), "_name_or_path", None) or "<the base model>")
        raise ValueError(
            f"{path}: the base outputs do not exist yet; make them once before a multi-process run:\n  "
            f"forgetwatch base-outputs --model {quote(str(name))} --pool {replay_pool(fw_args)} --exclude {probes}{sampled} "
            f"--max-length {max_length or 1024} -o {path}\n"
            f"and pass --forgetwatch_base_outputs {path} (in a YAML config: forgetwatch_base_outputs: {path})"
        )
    if tokenizer is None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(model))
    kwargs = getattr(training_args, "model_init_kwargs", None) or {}
    dtype = kwargs.get("dtype") if isinstance(kwargs.get("dtype"), str) and kwargs.get("dtype") != "auto" else "float32"
    with training_args.main_process_first(desc="the base model's answers to the replay pool"):
        return load_or_make(path, model, tokenizer, replay_pool(fw_args), exclude=callback.probes, max_length=max_length,
                            dtype=dtype, max_new_tokens=fw_args.forgetwatch_behavior_max_new_tokens,
                            progress=training_args.process_index == 0)


def _architecture(model_path: str | Path) -> dict[str, Any]:
    from transformers import AutoConfig


    return {"architecture": architecture_id(AutoConfig.from_pretrained(str(model_path)))}
