"""What a remedy needs from the rest of forgetwatch, and what a trainer needs from a remedy, as typed protocols.

`LossTerm` is what `add_loss_term` calls at every training micro-batch and log: `KLAnchor` and `MarginPenalty` are
two; a term of your own with the same two methods joins a trainer the same way. `MonitorView` is what a remedy reads
from the run's monitor (`ForgetWatchCallback`): the probes it must hold out of its pool and whose categories it draws
by, the scoring form, and the hook through which its draws follow the forgetting measured at each evaluation.

Example:
    >>> class Zero:
    ...     def loss(self, model, micro_batch, batch_size):
    ...         return None  # nothing to add at this micro-batch
    ...     def pop_logs(self):
    ...         return {}
    >>> isinstance(Zero(), LossTerm)
    True
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from ..probes.probe_set import ProbeSet
    from ..scoring.modes import ScoringConfig
    from .mixing import ReplayMixer

__all__ = ["CheckpointedLossTerm", "LossTerm", "MonitorView"]


@runtime_checkable
class LossTerm(Protocol):
    """A term added to a trainer's training loss (`add_loss_term`).

    `loss(model, micro_batch, batch_size)` is called after the trainer's own loss at every training micro-batch:
    `micro_batch` counts micro-batches from the start of training (`global_step * gradient_accumulation_steps + i`, so
    a resumed run continues the count), `batch_size` is the trainer's `per_device_train_batch_size`. It returns the
    term for this micro-batch, weighted like one micro-batch's loss (the trainer divides it for gradient accumulation
    as it divides its own), or None for nothing. `pop_logs()` returns the figures to add to the trainer's next log
    since the last call (e.g. `{"anchor_kl": 0.01}`).
    """

    def loss(self, model: Any, micro_batch: int, batch_size: int) -> torch.Tensor | None: ...

    def pop_logs(self) -> dict[str, float]: ...


@runtime_checkable
class CheckpointedLossTerm(LossTerm, Protocol):
    """A `LossTerm` that keeps state in each checkpoint (the 1→0 penalty keeps the base's margins): told where a
    checkpoint is saved, and which one a resume reads (before any training step)."""

    def save_to_checkpoint(self, directory: str | os.PathLike) -> None: ...

    def resuming_from(self, checkpoint: str | os.PathLike | None) -> None: ...


@runtime_checkable
class MonitorView(Protocol):
    """What a remedy reads from the run's monitor (`forgetwatch.ForgetWatchCallback` is one).

    Attributes:
        probes: the monitored probes: a pool holding one of them is refused (by id), and their categories are the
            ones a closed loop can weigh.
        config: the monitor's scoring configuration (`mcq_mode`, `chat_template`, `system_prompt`): the 1→0 penalty
            reads margins in the same prompt form.
    """

    @property
    def probes(self) -> ProbeSet: ...

    @property
    def config(self) -> ScoringConfig: ...

    def attach_mixer(self, mixer: ReplayMixer) -> None:
        """Steer `mixer` from now on: after each evaluation it gets each category's forgetting (`mixer.publish`),
        and its weights' history goes into the record (kept for a resume)."""
        ...
