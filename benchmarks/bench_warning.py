"""How well does "at risk now" predict "forgotten by the next evaluation"? Measured on real training runs' records.

Each run's record (`<output_dir>/forgetwatch/`) holds every multiple-choice probe's margin at every evaluation. For
each evaluation t but the last, the probes right at base and still right at t are the candidates; a candidate is a
positive when it is wrong at evaluation t + 1 (flipped by the next evaluation), and, separately, when it is wrong at
the final evaluation (forgotten at the end). Predictors: the margin at t (lower = riskier) and its drop since base.
Reported per run: the AUC of each predictor (Mann-Whitney, ties halved), and the precision and recall of the at-risk
rule (`margin < margin_below` or `drop >= drop_by`). The rule's thresholds are chosen on the calibration runs only
(best F1 for the next evaluation over a grid) and reported on the other runs, whose probes are other samples of the
suites (`--forgetwatch_seed`), so the threshold is never tuned on the probes it is judged on.

    # the runs (SFT demo setting, evaluations every 5 steps, W&B off); each ~10 min on 1 CPU thread
    python benchmarks/bench_warning.py --run          # writes outputs/warning/<name>/
    python recipes/grpo.py --config recipes/SmolLM2-135M-Instruct/grpo/config_demo.yaml   # the GRPO demo's record
    python benchmarks/bench_warning.py                 # analysis -> benchmarks/results/bench_warning.json

Plain NumPy; no torch.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from forgetwatch.record.store import load_record  # noqa: E402
from forgetwatch.scoring.results import CORRECT  # noqa: E402

OUT = REPO / "outputs" / "warning"
SFT = ["recipes/sft.py", "--config", "recipes/SmolLM2-135M-Instruct/sft/config_demo.yaml", "--report_to", "none",
       "--forgetwatch_eval_steps", "5", "--forgetwatch_replay", "false"]
# name -> (role, extra arguments). Calibration and evaluation runs use different probe samples (forgetwatch_seed).
RUNS = {
    "sft-s0": ("calibrate", ["--seed", "0", "--forgetwatch_seed", "0"]),
    "sft-s1": ("evaluate", ["--seed", "1", "--forgetwatch_seed", "1"]),
    # twice as long at half the learning rate, scored every 10 steps
    "sft-long-s2": ("evaluate", ["--seed", "2", "--forgetwatch_seed", "2", "--max_steps", "60", "--learning_rate", "5e-4",
                                 "--forgetwatch_eval_steps", "10"]),
}
# records made elsewhere, analysed as they are (not trained by --run): the GRPO demo, run alone with its recipe
EXTERNAL = {"grpo-demo": ("evaluate", REPO / "outputs" / "SmolLM2-135M-Instruct-grpo-demo")}
GRID_MARGIN = [0.0, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0]
GRID_DROP = [0.5, 1.0, 1.5, 2.0, 3.0, math.inf]


def run_all(names: list[str]) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "TOKENIZERS_PARALLELISM": "false",
           "WANDB_MODE": "disabled"}
    for name in names:
        _, extra = RUNS[name]
        cmd = [sys.executable, *SFT, "--output_dir", str(OUT / name), "--run_name", name, *extra]
        print("+", " ".join(cmd), flush=True)
        subprocess.run(cmd, cwd=REPO, env=env, check=True)


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """P(score of a positive > score of a negative), ties counted half; NaN without both classes."""
    pos, neg = int(labels.sum()), int((~labels).sum())
    if pos == 0 or neg == 0:
        return math.nan
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores))
    sorted_scores = scores[order]
    i = 0
    while i < len(scores):  # average ranks over ties
        j = i
        while j + 1 < len(scores) and sorted_scores[j + 1] == sorted_scores[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return float((ranks[labels].sum() - pos * (pos + 1) / 2) / (pos * neg))


def candidates(record_dir: Path) -> dict[str, np.ndarray]:
    """One row per (evaluation t, candidate probe): margin at t, drop since base, flipped at t+1, wrong at the end."""
    record = load_record(record_dir)
    steps = record.eval_steps()
    evals = [record.read_eval(s) for s in steps]
    base_ok, base_margin = evals[0]["outcome"] == CORRECT, evals[0]["margin"].astype(np.float64)
    final_ok = evals[-1]["outcome"] == CORRECT
    rows: dict[str, list] = {"step": [], "margin": [], "drop": [], "next": [], "end": []}
    for t in range(len(steps) - 1):
        now_ok, margin = evals[t]["outcome"] == CORRECT, evals[t]["margin"].astype(np.float64)
        cand = base_ok & now_ok & np.isfinite(margin) & np.isfinite(base_margin)
        rows["step"] += [steps[t]] * int(cand.sum())
        rows["margin"] += margin[cand].tolist()
        rows["drop"] += (base_margin - margin)[cand].tolist()
        rows["next"] += (evals[t + 1]["outcome"][cand] != CORRECT).tolist()
        rows["end"] += (~final_ok[cand]).tolist()
    return {k: np.asarray(v) for k, v in rows.items()}


def rule(c: dict[str, np.ndarray], margin_below: float, drop_by: float, label: str) -> dict[str, float]:
    flagged = (c["margin"] < margin_below) | (c["drop"] >= drop_by)
    pos = c[label].astype(bool)
    tp = int((flagged & pos).sum())
    precision = tp / int(flagged.sum()) if flagged.any() else math.nan
    recall = tp / int(pos.sum()) if pos.any() else math.nan
    f1 = 2 * precision * recall / (precision + recall) if precision and recall and not math.isnan(precision + recall) else 0.0
    return {"flagged": int(flagged.sum()), "true_positives": tp, "positives": int(pos.sum()), "precision": precision,
            "recall": recall, "f1": f1, "base_rate": float(pos.mean()) if len(pos) else math.nan}


def analyse(names: list[str]) -> dict:
    dirs = {n: EXTERNAL[n][1] if n in EXTERNAL else OUT / n for n in names}
    data = {n: candidates(d) for n, d in dirs.items() if (d / "forgetwatch" / "metrics.jsonl").is_file()}
    missing = sorted(set(names) - set(data))
    if missing:
        print(f"no record for {missing}; run `python benchmarks/bench_warning.py --run {' '.join(missing)}`", file=sys.stderr)
    role = {**{n: r for n, (r, _) in RUNS.items()}, **{n: r for n, (r, _) in EXTERNAL.items()}}
    calib = [n for n in data if role[n] == "calibrate"]
    pooled = {k: np.concatenate([data[n][k] for n in calib]) for k in ("margin", "drop", "next", "end")}
    grid = [(m, d, rule(pooled, m, d, "next")["f1"]) for m in GRID_MARGIN for d in GRID_DROP]
    best_m, best_d, best_f1 = max(grid, key=lambda x: x[2])
    out = {"chosen_on": calib, "margin_below": best_m, "drop_by": best_d, "calibration_f1": best_f1, "runs": {}}
    for n, c in data.items():
        out["runs"][n] = {
            "role": role[n], "candidates": len(c["margin"]), "evaluations": len(set(c["step"].tolist())) + 1,
            "auc_next": {"margin": auc(-c["margin"], c["next"].astype(bool)), "drop": auc(c["drop"], c["next"].astype(bool))},
            "auc_end": {"margin": auc(-c["margin"], c["end"].astype(bool)), "drop": auc(c["drop"], c["end"].astype(bool))},
            "rule_next": rule(c, best_m, best_d, "next"), "rule_end": rule(c, best_m, best_d, "end"),
            "default_rule_next": rule(c, 0.5, 1.0, "next"),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", nargs="*", metavar="NAME", help=f"train these runs first (default all: {', '.join(RUNS)})")
    a = parser.parse_args()
    if a.run is not None:
        run_all(a.run or list(RUNS))
    result = analyse([*RUNS, *EXTERNAL])
    path = REPO / "benchmarks" / "results" / "bench_warning.json"
    path.write_text(json.dumps(result, indent=1, default=float) + "\n")
    print(json.dumps(result, indent=1, default=float))


if __name__ == "__main__":
    main()
