"""What a Trainer hook hands forgetwatch, read as it means: the tokenizer inside `processing_class`, the autocast the
trainer really runs its forwards in, and whether the Trainer saves a checkpoint at a step.

Example:
    >>> from types import SimpleNamespace
    >>> saves_at(SimpleNamespace(save_strategy="steps"), SimpleNamespace(save_steps=5), 10)
    True
"""

from __future__ import annotations

import logging
import os
from typing import Any

__all__ = ["tokenizer_of", "training_autocast", "saves_at"]

logger = logging.getLogger(__name__)


def tokenizer_of(processing_class: Any) -> Any:
    """The tokenizer in a Trainer hook's `processing_class` (a multimodal processor wraps one); refused when None."""
    if processing_class is None:
        import transformers

        raise ValueError("ForgetWatchCallback needs the tokenizer: pass `processing_class=tokenizer` to the Trainer "
                         f"(transformers {transformers.__version__} passed none to the callback)")
    from transformers import ProcessorMixin

    # a multimodal processor wraps the tokenizer
    return processing_class.tokenizer if isinstance(processing_class, ProcessorMixin) else processing_class


def training_autocast(model: Any, args: Any) -> str | None:
    """The autocast dtype the trainer really runs forwards in: what accelerate's forward wrapper does, found by running it
    (`forward.wrapped_autocast`), else what the arguments say."""
    from ..scoring.forward import model_device, wrapped_autocast

    said = "bfloat16" if args.bf16 else ("float16" if args.fp16 else None)
    done = wrapped_autocast(model, model_device(model))
    if done is not None and done != said:
        logger.warning("forgetwatch: the trainer runs forwards under %s autocast although its arguments say %s "
                       "($ACCELERATE_MIXED_PRECISION=%s: set by `accelerate launch --mixed_precision`, or on transformers "
                       "4 by any earlier TrainingArguments with bf16/fp16 in this process); probes are scored, and the "
                       "base cache keyed, in the precision it runs", done, f"{said} autocast" if said else "none",
                       os.environ.get("ACCELERATE_MIXED_PRECISION"))
    return done or said


def saves_at(args: Any, state: Any, step: int) -> bool:
    """Whether the Trainer saves a checkpoint at `step` by its save strategy "steps" (the current step's save is also
    read from `control.should_save`)."""
    strategy = getattr(getattr(args, "save_strategy", None), "value", getattr(args, "save_strategy", None))
    every = getattr(state, "save_steps", 0) or 0
    return strategy == "steps" and every > 0 and step % every == 0
