"""Shared helpers for the benchmarks: one thread, the machine's description, token counting, JSON output."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

# One thread before torch is imported: timings on this shared 2-core machine are stable only like this.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def set_threads(n: int) -> None:
    import torch

    torch.set_num_threads(n)


def machine() -> dict:
    import torch
    import transformers

    load = os.getloadavg()
    try:
        model_name = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        model_name = platform.processor()
    return {
        "cpu": model_name,
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "loadavg_at_start": [round(x, 2) for x in load],
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }


class ForwardCounter:
    """Counts the model's forward calls and tokens (all positions, and those that are not padding)."""

    def __init__(self, model, pad_ids=()):
        self.pad_ids = set(pad_ids)
        self.reset()
        self._handle = model.register_forward_pre_hook(self._hook, with_kwargs=True)
        head = model.get_output_embeddings()
        # rows the vocabulary projection really ran on (a post-hook sees the head's actual output)
        self._head_handle = head.register_forward_hook(self._head_hook) if head is not None else None

    def reset(self) -> None:
        self.calls = 0
        self.positions = 0  # B x T, padding included
        self.real = 0  # not padding
        self.logit_positions = 0  # positions whose full-vocabulary logits are computed (the output head's rows)

    def _hook(self, module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None:
            return
        self.calls += 1
        self.positions += ids.numel()
        real = ids.numel()
        for p in self.pad_ids:
            real -= int((ids == p).sum())
        self.real += real

    def _head_hook(self, module, args, output):
        self.logit_positions += output.shape[:-1].numel()

    def snapshot(self) -> dict:
        return {"calls": self.calls, "positions": self.positions, "real": self.real, "logit_positions": self.logit_positions}

    def remove(self) -> None:
        self._handle.remove()
        if self._head_handle is not None:
            self._head_handle.remove()


def save(name: str, data: dict) -> Path:
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path
