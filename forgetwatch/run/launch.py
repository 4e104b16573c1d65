"""How the trainer's engine shards the model: FSDP or DeepSpeed, read from the trainer's arguments or from
`accelerate launch`'s configuration (which sets `ACCELERATE_USE_FSDP` / `ACCELERATE_USE_DEEPSPEED` and leaves the
arguments' `fsdp` / `deepspeed` unset). Plain Python: no torch.

Example:
    >>> from types import SimpleNamespace
    >>> uses_fsdp(SimpleNamespace(fsdp="full_shard"), environ={})
    True
    >>> uses_deepspeed(SimpleNamespace(deepspeed=None), environ={"ACCELERATE_USE_DEEPSPEED": "true"})
    True
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

__all__ = ["uses_deepspeed", "uses_fsdp"]


def _set(environ: Mapping[str, str] | None, key: str) -> bool:
    return (os.environ if environ is None else environ).get(key, "").lower() == "true"


def uses_fsdp(args: Any, environ: Mapping[str, str] | None = None) -> bool:
    """FSDP: the trainer's `fsdp` argument, or `accelerate launch` with an FSDP configuration."""
    return bool(getattr(args, "fsdp", None)) or _set(environ, "ACCELERATE_USE_FSDP")


def uses_deepspeed(args: Any, environ: Mapping[str, str] | None = None) -> bool:
    """DeepSpeed: the trainer's `deepspeed` argument, or `accelerate launch` with a DeepSpeed configuration."""
    return bool(getattr(args, "deepspeed", None)) or _set(environ, "ACCELERATE_USE_DEEPSPEED")
