"""What to paste when a remedy's option reaches `ForgetWatchCallback`: a remedy changes the training data or the loss
(replay, the KL anchor, the 1→0 penalty) or acts after training (rewind), which a callback's hooks cannot do, so the
callback refuses it with the lines that add that remedy, its values filled in.

Example:
    >>> print(remedy_advice({"forgetwatch_rewind": True, "forgetwatch_rewind_data": "held_out.jsonl"}, "arc_easy"))
    ... # doctest: +NORMALIZE_WHITESPACE
    forgetwatch_rewind, forgetwatch_rewind_data: rewind runs after training, beside the callback, not in it. Add it
    after the callback: from forgetwatch.remedies import RewindCallback; callbacks=[ForgetWatchCallback(probes='arc_easy',
    ...), RewindCallback(data='held_out.jsonl')]  (`forgetwatch docs rewind`)
"""

from __future__ import annotations

from typing import Any

from ..docs import docs_hint

__all__ = ["remedy_advice"]

# RewindCallback's arguments by option (the rest of its options are read from the run's record)
_REWIND = {"forgetwatch_rewind_data": "data", "forgetwatch_rewind_alphas": "alphas",
           "forgetwatch_rewind_heldout": "heldout"}


def remedy_advice(changed: dict[str, Any], probes: Any) -> str:
    """The refusal of remedy options given to the callback (`changed`: option name → value), with the lines that add
    the remedies they ask for."""
    names = ", ".join(changed)
    shown = repr(probes) if isinstance(probes, str) else "..."
    rewind = {k: v for k, v in changed.items() if k == "forgetwatch_rewind" or k in _REWIND}
    others = {k: v for k, v in changed.items() if k not in rewind}
    parts = []
    if rewind:
        args = ", ".join(f"{_REWIND[k]}={v!r}" for k, v in rewind.items() if k in _REWIND)
        parts.append("rewind runs after training, beside the callback, not in it. Add it after the callback: from "
                     f"forgetwatch.remedies import RewindCallback; callbacks=[ForgetWatchCallback(probes={shown}, ...), "
                     f"RewindCallback({args})]  ({docs_hint('rewind')})")
    if others:
        fields = ", ".join(f"{k}={v!r}" for k, v in others.items())
        parts.append("these change the training data or loss, which a callback cannot. Build them with the callback: "
                     "from forgetwatch import ForgetWatchArguments; from forgetwatch.remedies import build_remedies; "
                     f"fw = ForgetWatchArguments(forgetwatch_probes={shown}, {fields}); watch = "
                     "ForgetWatchCallback.from_args(fw); remedies = build_remedies(fw, stage='sft', callback=watch, "
                     "training_args=args, model=model_name, train_dataset=train_dataset); then pass "
                     "train_dataset=remedies.train_dataset and callbacks=[watch, *remedies.callbacks] to the trainer "
                     f"and call remedies.attach(trainer)  ({docs_hint('replay')})")
    return f"{names}: " + " Also, ".join(parts)
