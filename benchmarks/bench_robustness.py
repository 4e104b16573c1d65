"""Robustness at base (issue 29): how many of SmolLM2-135M-Instruct's right answers stay right when the options move,
the question is framed otherwise or carries noise, per suite; its position bias; and the cost per variant.

    python benchmarks/bench_robustness.py --threads 2              # the demo's 200 knowledge probes, ~10 min
    python benchmarks/bench_robustness.py --per-suite 8 --out /tmp/r.json   # does it run

The probes are the SFT demo's knowledge probes (arc_easy, sciq, piqa, hellaswag, triviaqa; 40 each, seed 0), scored
by the base model twice: log-likelihood (the default mode: variants are frames and noise, `--k-loglik`) and letters
(variants start with cyclic option shifts, `--k-letter`). Per suite and overall: accuracy, robust accuracy, the share
of right answers that are robust, consistency; for letters the position bias. Cost: seconds of the probes alone and
with their variants, in one run (interleaved), per variant. Goes to benchmarks/results/robustness_base.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402
import numpy as np  # noqa: E402

from forgetwatch.measures.robustness import position_bias, robust_figures, variant_outcomes  # noqa: E402
from forgetwatch.probes.suites import load_probes  # noqa: E402
from forgetwatch.probes.variants import plan_variants  # noqa: E402
from forgetwatch.scoring.models import load_model  # noqa: E402
from forgetwatch.scoring.score import ScoringConfig, score_probes  # noqa: E402

SUITES = "arc_easy,sciq,piqa,hellaswag,triviaqa"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--per-suite", type=int, default=40)
    ap.add_argument("--k-loglik", type=int, default=5)
    ap.add_argument("--k-letter", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0, help="the variants' seed (typos)")
    ap.add_argument("--out", default=str(_common.RESULTS_DIR / "robustness_base.json"))
    args = ap.parse_args()
    _common.set_threads(args.threads)
    model, tok = load_model("smollm2")
    model.eval()
    probes = list(load_probes(SUITES, per_suite=args.per_suite, seed=0))
    out: dict = {"model": "SmolLM2-135M-Instruct", "machine": _common.machine(), "threads": args.threads,
                 "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "suites": SUITES, "per_suite": args.per_suite,
                 "variant_seed": args.seed}
    for mode, k in (("loglik", args.k_loglik), ("letter", args.k_letter)):
        # letters: multiple choice only (short answers are scored the same way in both modes)
        subset = probes if mode == "loglik" else [p for p in probes if p.kind == "mcq"]
        config = ScoringConfig(mcq_mode=mode)
        plan = plan_variants(subset, k, lettered=mode == "letter", seed=args.seed)
        t0 = time.perf_counter()
        plain = score_probes(model, tok, subset, config)
        t_plain = time.perf_counter() - t0
        t0 = time.perf_counter()
        results = score_probes(model, tok, plan.scored(), config)
        t_all = time.perf_counter() - t0
        o = variant_outcomes(plan, results)
        assert np.array_equal(results.outcome[: len(subset)], plain.outcome)  # the probes' own results are unchanged
        cats = [p.category for p in subset]
        suites = sorted({c.split("/")[0] for c in cats}) + ["overall"]
        per: dict = {}
        for s in suites:
            rows = np.array([s == "overall" or c.split("/")[0] == s for c in cats])
            f = robust_figures(o.right[rows], o.right[rows])
            right = o.right[rows, 0]
            entry = {"n": int(rows.sum()), "accuracy": float(right.mean()),
                     "robust_accuracy": f["robust_accuracy_pre"],
                     "robust_share_of_right": float(o.right[rows].all(1).sum() / right.sum()) if right.sum() else None,
                     "consistency": f["consistency_pre"],
                     "right_in_original_but_not_all": int((right & ~o.right[rows].all(1)).sum())}
            if mode == "letter":
                # on the pure option shifts of probes that have them all (gold equally often at each position)
                entry["position_bias"] = position_bias(o.chosen[rows], o.gold[rows], o.num_choices[rows], o.balanced[rows])
                entry["position_bias_answers"] = int(o.balanced[rows].sum())
                chosen = o.chosen[rows].ravel()
                entry["chosen_letters"] = np.bincount(chosen[chosen >= 0], minlength=5).tolist()
            per[s] = entry
        out[mode] = {"k": k, "probes": len(subset), "scored": len(plan.scored()), "seconds_probes": t_plain,
                     "seconds_with_variants": t_all, "seconds_per_variant_per_probe": (t_all - t_plain) / (k * len(subset)),
                     "cost_ratio_per_variant": (t_all / t_plain - 1) / k, "by_suite": per}
        print(mode, json.dumps(out[mode], indent=1), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print("written", args.out)


if __name__ == "__main__":
    main()
