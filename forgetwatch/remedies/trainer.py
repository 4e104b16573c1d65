"""A loss term (the KL anchor, the 1→0 penalty, or your own `LossTerm`) added to a trainer that is already built.

`add_loss_term(trainer, term)` is the one way a term joins training, wherever the trainer comes from: your own
`Trainer` / `SFTTrainer` script, forgetwatch's recipes, Axolotl's trainer (the plugin calls it once Axolotl has built
it) and LLaMA-Factory's (`forgetwatch llamafactory train` calls it once LLaMA-Factory has built it). It wraps four
methods of that one trainer object, and nothing else:

- `compute_loss`: after the trainer's own loss, at every training micro-batch (evaluation losses are left as they
  are), the term's `loss(model, micro_batch, batch_size)` is added, divided by the gradient accumulation steps exactly
  when the trainer divides its own loss;
- `log`: the term's figures since the last log (`anchor_kl`, `penalty_hinge`, ...) join every log that has a `loss`;
- `save_model` / `train`: a term that keeps state in checkpoints (`CheckpointedLossTerm`) writes it into each, and is
  told which checkpoint a resume reads.

Why not `Trainer(compute_loss_func=...)`: that hook replaces the model's own loss (it gets the outputs and the labels,
never the model, the step or whether it is training), so the task loss would be computed anew, not kept as it is.

Example:
    >>> from trl import SFTTrainer
    >>> trainer = SFTTrainer(model=model, args=args, train_dataset=train, callbacks=[watch])  # doctest: +SKIP
    >>> add_loss_term(trainer, KLAnchor(outputs, beta=5.0, ratio=0.5, monitor=watch, tokenizer=tok))  # doctest: +SKIP
    >>> trainer.train()  # doctest: +SKIP
"""

from __future__ import annotations

import os
from typing import Any

from ..docs import results_url
from .protocols import CheckpointedLossTerm, LossTerm

__all__ = ["REFUSED_TRAINERS", "add_loss_term", "loss_term_of"]

# Trainers whose loss is not a next-token loss on training examples: a term weighted like one more training example
# means nothing there (GRPO and DPO anchor to their reference model with their own `beta`). Matched by class name
# anywhere in the trainer's class hierarchy (TRL's, and the front-ends' subclasses of them).
REFUSED_TRAINERS = {
    "DPOTrainer": "DPO (it anchors to its reference model with its own `beta`)",
    "GRPOTrainer": "GRPO (it anchors to its reference model with `beta`)",
    "RLOOTrainer": "RLOO (it anchors to its reference model with `beta`)",
    "OnlineDPOTrainer": "online DPO (it anchors to its reference model with its own `beta`)",
    "KTOTrainer": "KTO (it anchors to its reference model with its own `beta`)",
    "ORPOTrainer": "ORPO (a preference loss on pairs)",
    "CPOTrainer": "CPO (a preference loss on pairs)",
    "PPOTrainer": "PPO (it anchors to its reference model with its KL coefficient)",
    "RewardTrainer": "reward-model training (a pairwise loss on scores)",
    "PRMTrainer": "process-reward-model training",
    "PairwiseTrainer": "reward-model training (a pairwise loss on scores)",  # LLaMA-Factory's stage rm
}
_ATTR = "_forgetwatch_loss_term"


def loss_term_of(trainer: Any) -> LossTerm | None:
    """The term `add_loss_term` added to `trainer`, or None."""
    return getattr(trainer, _ATTR, None)


def add_loss_term(trainer: Any, term: LossTerm) -> Any:
    """Add `term` to `trainer`'s training loss at every micro-batch, and its figures to the trainer's logs.

    Call it once the trainer is built and before `trainer.train()`. A term that is also a `TrainerCallback` (the
    1→0 penalty reads the base's margins when training begins) is added to the trainer's callbacks unless it is there.

    Args:
        trainer: a `transformers.Trainer` or a subclass of it (TRL's `SFTTrainer`, Axolotl's, LLaMA-Factory's SFT
            trainer) whose loss is a next-token loss on the training examples.
        term: a `LossTerm`: `forgetwatch.remedies.KLAnchor`, `MarginPenalty`, or your own.

    Returns:
        The same trainer.

    Raises:
        ValueError: a trainer of preference pairs or rewards (DPO, GRPO, KTO, PPO, reward models: `REFUSED_TRAINERS`),
            a trainer that already has a term (one at a time), or sequence / context parallelism (each rank holds a
            slice of every sequence, and the term's own forward runs whole sequences); all before any training step.

    Example:
        >>> add_loss_term(trainer, anchor)  # doctest: +SKIP
        >>> trainer.train()  # doctest: +SKIP
    """
    if not isinstance(term, LossTerm):
        raise TypeError(f"`term` must be a LossTerm (with `loss(model, micro_batch, batch_size)` and `pop_logs()`), "
                        f"got {type(term).__name__}")
    _check_trainer(trainer)
    if loss_term_of(trainer) is not None:
        raise ValueError(f"this trainer already has a loss term ({type(loss_term_of(trainer)).__name__}): one term at a "
                         f"time (each is measured on its own: {results_url(18)})")
    setattr(trainer, _ATTR, term)
    from transformers import TrainerCallback

    if isinstance(term, TrainerCallback) and term not in trainer.callback_handler.callbacks:
        trainer.add_callback(term)
    counter = {"step": -1, "micro": 0}  # the micro-batch within the optimizer step
    compute_loss, log, save_model, train = trainer.compute_loss, trainer.log, trainer.save_model, trainer.train

    def compute_loss_with_term(model, inputs, return_outputs=False, num_items_in_batch=None):
        out = compute_loss(model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch)
        if not model.training:
            return out
        step = trainer.state.global_step
        if step != counter["step"]:
            counter["step"], counter["micro"] = step, 0
        else:
            counter["micro"] += 1
        args = trainer.args
        accumulation = getattr(trainer, "current_gradient_accumulation_steps", None) or args.gradient_accumulation_steps
        micro_batch = step * args.gradient_accumulation_steps + counter["micro"]
        extra = term.loss(model, micro_batch, args.per_device_train_batch_size)
        if extra is None:
            return out
        if _loss_scaled_for_accumulation(trainer, num_items_in_batch):
            extra = extra / accumulation  # the trainer divides the loss by the accumulation steps only when it is not
        loss, outputs = out if return_outputs else (out, None)
        rescale = getattr(term, "rescale", None)
        if rescale is not None:  # a term whose weight is relative to the task loss's gradient (the 1→0 penalty's)
            extra = rescale(extra, loss, model)
        loss = loss + extra.to(loss.dtype)
        return (loss, outputs) if return_outputs else loss

    def log_with_term(logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
        if "loss" in logs:
            logs = {**logs, **term.pop_logs()}
        return log(logs, *args, **kwargs)

    def save_model_with_term(output_dir: str | None = None, _internal_call: bool = False) -> None:
        save_model(output_dir, _internal_call=_internal_call)
        # a checkpoint (`_internal_call`), wherever the Trainer puts it (hyperparameter search runs too), before it is
        # pushed to the Hub; by each process that writes checkpoints
        if _internal_call and output_dir and trainer.args.should_save and isinstance(term, CheckpointedLossTerm):
            term.save_to_checkpoint(output_dir)

    def train_with_term(resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any):
        # The term may keep state in each checkpoint (the penalty's base margins): tell it which one a resume reads, as
        # the Trainer resolves it (its callbacks are not told).
        if isinstance(term, CheckpointedLossTerm):
            path = resume_from_checkpoint
            if path is True:
                from transformers.trainer_utils import get_last_checkpoint

                path = get_last_checkpoint(trainer.args.output_dir)
            term.resuming_from(path if isinstance(path, str | os.PathLike) else None)
        return train(resume_from_checkpoint, *args, **kwargs)

    trainer.compute_loss, trainer.log = compute_loss_with_term, log_with_term
    trainer.save_model, trainer.train = save_model_with_term, train_with_term
    return trainer


def _check_trainer(trainer: Any) -> None:
    for cls in type(trainer).__mro__:
        if cls.__name__ in REFUSED_TRAINERS:
            raise ValueError(f"{type(trainer).__name__} trains {REFUSED_TRAINERS[cls.__name__]}: the KL anchor and the "
                             "1→0 penalty are terms of supervised fine-tuning (SFT), weighted like training examples. "
                             "Remove the term (forgetwatch_anchor_beta / forgetwatch_penalty_beta 0) for this trainer")
    config = getattr(getattr(trainer, "accelerator", None), "parallelism_config", None)
    for kind in ("cp", "sp"):
        if config is not None and getattr(config, f"{kind}_enabled", False):
            raise ValueError(f"{'context' if kind == 'cp' else 'sequence'} parallelism is on (parallelism_config "
                             f"{kind}_size={getattr(config, f'{kind}_size', '?')}): each rank holds a slice of every "
                             "sequence, and the KL anchor's / 1→0 penalty's own forward runs whole sequences. Train "
                             "with data parallelism, FSDP or ZeRO for the term, or without the term")


def _loss_scaled_for_accumulation(trainer: Any, num_items_in_batch: Any) -> bool:
    # as Trainer.training_step decides whether to divide the loss by the gradient accumulation steps
    flag = getattr(trainer, "loss_is_scaled_for_ga", None)
    if flag is not None:
        return bool(flag)
    return bool((getattr(trainer, "model_accepts_loss_kwargs", False) and num_items_in_batch is not None)
                or getattr(trainer, "compute_loss_func", None) is not None)
