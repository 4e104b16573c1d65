"""benchmarks/gpu_check.sh's comparison: the same tiny runs on the CPU and on CUDA, their figures side by side.

Reads /tmp/{cpu,gpu}-{penalty,anchor-sft}/forgetwatch (tests/ddp_train.py runs), /tmp/gpu-sidecar/forgetwatch (scored by
`forgetwatch watch --device cuda`) and $OUT/interp-{cpu,gpu}.json (`forgetwatch interpolate --json`); writes
$OUT/compare.json: per run, the base caches' agreement, each evaluation's figures as (CPU, GPU) pairs, and the
training losses with the penalty's hinge or the anchor's KL as (CPU, GPU).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from forgetwatch import BaseCache

OUT = Path(os.environ.get("OUT", "/tmp"))
KEYS = ("forgetting", "backward_transfer", "robust_forgetting", "consistency_post", "fragile")
TRAINER_KEYS = {"step", "epoch", "loss", "grad_norm", "learning_rate"}


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def pair(run: str) -> dict | None:
    cpu, gpu = Path(f"/tmp/cpu-{run}/forgetwatch"), Path(f"/tmp/gpu-{run}/forgetwatch")
    if not ((cpu / "base.parquet").exists() and (gpu / "base.parquet").exists()):
        return None
    bc, bg = BaseCache.load(cpu / "base.parquet").results, BaseCache.load(gpu / "base.parquet").results
    mc, mg = jsonl(cpu / "metrics.jsonl"), jsonl(gpu / "metrics.jsonl")
    lc, lg = jsonl(cpu / "trainer_log.jsonl"), jsonl(gpu / "trainer_log.jsonl")

    def term(x: dict):
        return x.get("penalty_hinge", x.get("anchor_kl"))

    return {
        "base_rows": len(bc.ids),
        "base_outcome_equal": int((bc.outcome == bg.outcome).sum()),
        "base_margin_maxdiff": float(np.nanmax(np.abs(bc.margin - bg.margin))),
        "evaluations": len(mc), "evaluations_gpu": len(mg),
        "steps": [(a["step"], {k: (a["metrics"]["overall"].get(k), b["metrics"]["overall"].get(k)) for k in KEYS})
                  for a, b in zip(mc, mg, strict=False)],
        "loss": [(a.get("step"), a.get("loss"), b.get("loss"), term(a), term(b))
                 for a, b in zip(lc, lg, strict=False) if "loss" in a],
        "extra_log_keys_gpu": sorted({k for x in lg for k in x} - TRAINER_KEYS),
    }


def interpolation(device: str):
    path = OUT / f"interp-{device}.json"
    try:
        alphas = json.loads(path.read_text())["alphas"]
    except (OSError, ValueError, KeyError) as e:
        err = OUT / f"interp-{device}.err"
        return f"unreadable ({e}): {err.read_text()[-1500:] if err.exists() else ''}"
    return [(a["alpha"], a["metrics"]["overall"]["forgetting"], a["metrics"]["overall"]["accuracy_post"]) for a in alphas]


def main() -> None:
    result = {run: pair(run) for run in ("penalty", "anchor-sft")}
    result.update({f"interp-{d}": interpolation(d) for d in ("cpu", "gpu")})
    result["sidecar_steps"] = [(m["step"], m["metrics"]["overall"].get("forgetting"),
                                m["metrics"]["overall"].get("robust_forgetting"))
                               for m in jsonl(Path("/tmp/gpu-sidecar/forgetwatch/metrics.jsonl"))]
    (OUT / "compare.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1)[:6000])


if __name__ == "__main__":
    main()
