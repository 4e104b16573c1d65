"""Compare two checkpoints probe by probe, without training: the Python API behind `forgetwatch compare`.

    python examples/compare_checkpoints.py --base smollm2 --other outputs/sft-demo/checkpoint-40   # 85 s measured
    python examples/compare_checkpoints.py                # base vs a noise-perturbed copy; 99 s measured (note below)

The first line compares the checkpoint `python examples/sft_smollm2.py` saves at its last step (with its defaults: 40
steps into outputs/sft-demo).
Time: measured once on 2026-11-27 with OMP_NUM_THREADS=1 on a 2-core CPU shared with other jobs (rough),
model loading included.
"""

from __future__ import annotations

import argparse

import torch

from forgetwatch import compute_report, load_probes, score_probes
from forgetwatch.measures.metrics import format_report
from forgetwatch.scoring.models import load_model


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", default="smollm2", help="model dir, Hub id, or smollm2")
    p.add_argument("--other", default=None, help="the checkpoint to compare (default: the base with noise added)")
    p.add_argument("--probes", default="arc_easy,sciq,mmlu")
    p.add_argument("--per-suite", type=int, default=20)
    args = p.parse_args()

    probes = load_probes(args.probes, per_suite=args.per_suite)
    model, tokenizer = load_model(args.base)
    base = score_probes(model, tokenizer, probes, progress=True, desc="base")
    if args.other:
        model, tokenizer = load_model(args.other)
    else:  # a stand-in for fine-tuning: seeded noise of 5% of each weight matrix's spread
        gen = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for param in model.parameters():
                if param.ndim == 2:
                    param.add_(torch.randn(param.shape, generator=gen) * 0.05 * param.std())
    other = score_probes(model, tokenizer, probes, progress=True, desc="other")

    report = compute_report(base.outcome, other.outcome, [p.num_choices for p in probes], [p.category for p in probes])
    print(format_report(report))


if __name__ == "__main__":
    main()
