"""Remedies for forgetting, built from the options and added to any trainer.

- replay mixing (`mix_replay`, `mixing.ReplayMixer`): held-out examples in place of some training examples, more of
  the categories the monitor sees forgetting;
- the base's own outputs (`BaseOutputs`, `load_or_make`): the targets of self-distilled replay and of the anchor;
- the KL anchor (`KLAnchor`): `beta · KL(base ‖ model)` on the base's answers to pool prompts, added to the loss;
- the 1→0 penalty (`MarginPenalty`): a hinge on the margins of held-out items the base answered right;
- the step back toward the base after training (`rewind.rewind`, `RewindCallback`, `rewind_callback`; `interpolate` and
  `sweep` move and score the weights): θ(α) scored on the monitored probes and a task loss, α picked, the model saved.

`build_remedies(fw_args, ...)` builds what the `forgetwatch_*` options ask for, and `Remedies.attach(trainer)` adds
the loss term (and its callback) to a built trainer; forgetwatch's recipes, the Axolotl plugin and
`forgetwatch llamafactory train` do exactly this. With objects of your own, `add_loss_term(trainer, term)` is the call.

Example:
    >>> from trl import SFTConfig, SFTTrainer
    >>> from forgetwatch import ForgetWatchArguments, ForgetWatchCallback
    >>> fw_args = ForgetWatchArguments(forgetwatch_probes="arc_easy,sciq", forgetwatch_anchor_beta=5.0,
    ...                                forgetwatch_anchor_ratio=0.5)  # doctest: +SKIP
    >>> watch = ForgetWatchCallback.from_args(fw_args)  # doctest: +SKIP
    >>> remedies = build_remedies(fw_args, stage="sft", callback=watch, training_args=args, model="my/base")  # doctest: +SKIP
    >>> trainer = SFTTrainer(model="my/base", args=args, train_dataset=train, callbacks=[watch])  # doctest: +SKIP
    >>> remedies.attach(trainer).train()  # doctest: +SKIP

Only `protocols` and `build` load with this package; the rest (torch) on first use.
"""

from .._lazy import lazy
from .build import Remedies, base_outputs_for, build_remedies, check_remedies, needs_base_outputs, replay_pool
from .protocols import CheckpointedLossTerm, LossTerm, MonitorView

__all__ = [
    "BaseOutputs",
    "CheckpointedLossTerm",
    "KLAnchor",
    "LossTerm",
    "MarginPenalty",
    "MonitorView",
    "Remedies",
    "RewindCallback",
    "add_loss_term",
    "base_outputs_for",
    "build_remedies",
    "check_remedies",
    "load_or_make",
    "make_base_outputs",
    "mix_replay",
    "needs_base_outputs",
    "replay_pool",
    "rewind_callback",
]

__getattr__, __dir__ = lazy(__name__, globals(), {
    "BaseOutputs": ".base_outputs",
    "load_or_make": ".base_outputs",
    "make_base_outputs": ".base_outputs",
    "KLAnchor": ".anchor",
    "MarginPenalty": ".penalty",
    "add_loss_term": ".trainer",
    "mix_replay": ".replay_dataset",
    "RewindCallback": ".rewinder",
    "rewind_callback": ".rewinder",
})
