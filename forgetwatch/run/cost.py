"""What forgetwatch cost a training run, said whole at its end: the base scored at the start, the fp32 pass of the
base for the precision noise floor (a pass the user did not ask for, named with its reason and how to skip it), every
evaluation, each in seconds and together as a share of `train()`; one console line and the loggers' summary.

Example:
    >>> print(cost_line({"base": 20.0, "noise_floor": 11.0}, evaluations=43.0, n_evaluations=3, train_seconds=370.0,
    ...                 precision="float32+autocast-bfloat16"))  # doctest: +NORMALIZE_WHITESPACE
    forgetwatch: probing cost this run 74.0 s, 20% of train() (370.0 s): the base 20.0 s, its fp32 pass for the
    precision noise floor 11.0 s (training runs under bfloat16 autocast; a base cache made once with `forgetwatch
    cache` skips both), 3 evaluations 43.0 s
"""

from __future__ import annotations

from typing import Any

__all__ = ["cost_line", "cost_summary"]


def _total(parts: dict[str, float], evaluations: float) -> float:
    return sum(parts.values()) + evaluations


def cost_line(parts: dict[str, float], *, evaluations: float, n_evaluations: int, train_seconds: float,
              precision: str) -> str:
    """The end-of-training line: `parts` are the start's passes ("base", "noise_floor"; absent or 0 when a base
    cache was given), `evaluations` the seconds of `n_evaluations` evaluations, `train_seconds` the wall time of
    `train()` (probing included)."""
    total = _total(parts, evaluations)
    share = f", {total / train_seconds:.0%} of train() ({train_seconds:.1f} s)" if train_seconds > 0 else ""
    said = []
    if parts.get("base"):
        said.append(f"the base {parts['base']:.1f} s")
    if parts.get("noise_floor"):
        running = precision.split("+autocast-")[-1] + " autocast" if "+autocast-" in precision else precision
        said.append(f"its fp32 pass for the precision noise floor {parts['noise_floor']:.1f} s (training runs under "
                    f"{running}; a base cache made once with `forgetwatch cache` skips both)")
    if not parts.get("base"):
        said.append("the base from its cache")
    said.append(f"{n_evaluations} evaluation{'s' if n_evaluations != 1 else ''} {evaluations:.1f} s")
    return f"forgetwatch: probing cost this run {total:.1f} s{share}: " + ", ".join(said)


def cost_summary(parts: dict[str, float], *, evaluations: float, train_seconds: float, prefix: str) -> dict[str, Any]:
    """The same, for the loggers' run summary (`forgetwatch/cost/...`)."""
    total = _total(parts, evaluations)
    return {f"{prefix}/cost/seconds": round(total, 3), f"{prefix}/cost/base_seconds": round(parts.get("base", 0.0), 3),
            f"{prefix}/cost/noise_floor_seconds": round(parts.get("noise_floor", 0.0), 3),
            f"{prefix}/cost/evaluation_seconds": round(evaluations, 3),
            f"{prefix}/cost/share_of_train": round(total / train_seconds, 4) if train_seconds > 0 else None}
