"""Robustness drift under training (issue 29), as benchmarks/protocols/robustness_drift.md fixed it before any run.

Six runs: the SFT and GRPO demos (30 steps, fp32, CPU) x training seeds 0, 1, 2, evaluated every 5 steps with
`robustness=5` (log-likelihood: 3 frames, lowercase, typos) on the demos' 200 knowledge probes, drawn per run with
`forgetwatch_seed` = the training seed. SFT seed 0 is the calibration run; the other five are held out.

    python benchmarks/bench_robust_drift.py --run sft-s0 sft-s1 sft-s2     # train (one at a time; run two such
    python benchmarks/bench_robust_drift.py --run grpo-s0 grpo-s1 grpo-s2  #  commands side by side on 2 cores)
    python benchmarks/bench_robust_drift.py --letters                      # position bias: letters, K = 3, per run
    python benchmarks/bench_robust_drift.py --identity                     # the base against itself on SmolLM2
    python benchmarks/bench_robust_drift.py                                # analysis -> results/robust_drift.json

Each run writes outputs/robust_drift/<name>/ (its record under forgetwatch/, its final model, wall.json).
Analysis: plain NumPy over the records (`RunRecord.read_eval`, `read_robust`, `metrics.jsonl`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from forgetwatch.measures.metrics import wilson_interval  # noqa: E402
from forgetwatch.record.store import load_record  # noqa: E402
from forgetwatch.scoring.results import CORRECT  # noqa: E402

OUT = REPO / "outputs" / "robust_drift"
RESULT = REPO / "benchmarks" / "results" / "robust_drift.json"
ENV = {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "WANDB_MODE": "disabled"}
COMMON = ["--forgetwatch_eval_steps", "5", "--forgetwatch_robustness", "5", "--report_to", "none",
          "--forgetwatch_replay", "false"]
RECIPE = {
    "sft": ["recipes/sft.py", "--config", "recipes/SmolLM2-135M-Instruct/sft/config_demo.yaml",
            # the protocol's probes are the 200 knowledge probes: the SFT demo's behaviour suites left out, and its
            # budget's behaviour / kind groups with them
            "--forgetwatch_probes", "arc_easy,sciq,piqa,hellaswag,triviaqa", "--forgetwatch_per_suite", "40",
            "--forgetwatch_budget", "forgetting_adjusted=0.05"],
    "grpo": ["recipes/grpo.py", "--config", "recipes/SmolLM2-135M-Instruct/grpo/config_demo.yaml"],
}
SEEDS = (0, 1, 2)
RUNS = [f"{r}-s{s}" for s in SEEDS for r in ("sft", "grpo")]
CALIBRATION = "sft-s0"


def run_command(name: str) -> list[str]:
    recipe, seed = name.split("-s")
    return [sys.executable, *RECIPE[recipe], "--seed", seed, "--forgetwatch_seed", seed, *COMMON,
            "--output_dir", str(OUT / name), "--run_name", name]


def train(names: list[str]) -> None:
    env = {**os.environ, **ENV}
    for name in names:
        cmd = run_command(name)
        print("+", " ".join(cmd), flush=True)
        t0 = time.time()
        rc = subprocess.run(cmd, cwd=REPO, env=env).returncode
        wall = time.time() - t0
        (OUT / name).mkdir(parents=True, exist_ok=True)
        (OUT / name / "wall.json").write_text(json.dumps({"command": cmd, "env": ENV, "rc": rc, "wall_s": wall,
                                                           "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t0))}))
        print(f"{name}: rc {rc}, {wall:.0f} s", flush=True)



# ---------------------------------------------------------------------------------------------- letters and identity
def _cli(args: list[str], out: Path | None = None) -> str:
    env = {**os.environ, **ENV}
    cmd = [str(REPO / ".venv" / "bin" / "forgetwatch"), *args]
    print("+", " ".join(cmd), flush=True)
    t0 = time.time()
    r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stderr[-4000:]}")
    print(f"  {time.time() - t0:.0f} s", flush=True)
    if out is not None:
        out.write_text(r.stdout)
    return r.stdout


def letters(names: list[str]) -> None:
    """Position bias in letters (K = 3) on each run's multiple-choice probes: its base, then its final model."""
    for name in names:
        rec = OUT / name / "forgetwatch"
        if not (OUT / name / "model.safetensors").is_file():
            print(f"{name}: no final model yet, skipped", flush=True)
            continue
        d = OUT / "letters" / name
        d.mkdir(parents=True, exist_ok=True)
        rows = [line for line in (rec / "probes.jsonl").read_text().splitlines() if json.loads(line)["kind"] == "mcq"]
        (d / "probes_mcq.jsonl").write_text("\n".join(rows) + "\n")
        t0 = time.time()
        _cli(["cache", "--model", "smollm2", "--probes", str(d / "probes_mcq.jsonl"), "--mcq-mode", "letter",
              "--robustness", "3", "-o", str(d / "base.parquet")])
        t1 = time.time()
        _cli(["compare", "--model", str(OUT / name), "--probes", str(d / "probes_mcq.jsonl"), "--base",
              str(d / "base.parquet"), "--json"], out=d / "compare.json")
        (d / "wall.json").write_text(json.dumps({"cache_s": t1 - t0, "compare_s": time.time() - t1, "probes": len(rows)}))


def identity() -> None:
    """The base against itself (log-likelihood, K = 5, sft-s0's probes): every robust figure must be at zero change."""
    d = OUT / "identity"
    d.mkdir(parents=True, exist_ok=True)
    probes = OUT / CALIBRATION / "forgetwatch" / "probes.jsonl"
    t0 = time.time()
    _cli(["cache", "--model", "smollm2", "--probes", str(probes), "--robustness", "5", "-o", str(d / "base.parquet")])
    t1 = time.time()
    _cli(["compare", "--model", "smollm2", "--probes", str(probes), "--base", str(d / "base.parquet"), "--json"],
         out=d / "compare.json")
    (d / "wall.json").write_text(json.dumps({"cache_s": t1 - t0, "compare_s": time.time() - t1}))


# ------------------------------------------------------------------------------------------------------------ analysis
def auc(scores: np.ndarray, labels: np.ndarray, weights: np.ndarray | None = None) -> float:
    """P(score of a positive > score of a negative), ties counted half (Mann-Whitney); `weights`: how many times each
    row counts (a bootstrap resample). NaN without both classes."""
    w = np.ones(len(scores)) if weights is None else np.asarray(weights, float)
    labels = np.asarray(labels, bool)
    pos, neg = float(w[labels].sum()), float(w[~labels].sum())
    if pos == 0 or neg == 0:
        return math.nan
    # per distinct score: weighted positives and negatives; a positive beats every negative with a lower score, and
    # ties count half
    values, inv = np.unique(scores, return_inverse=True)
    p = np.bincount(inv, weights=w * labels, minlength=len(values))
    n = np.bincount(inv, weights=w * ~labels, minlength=len(values))
    below = np.cumsum(n) - n
    return float((p * (below + 0.5 * n)).sum() / (pos * neg))


def logistic_fit(x: np.ndarray, y: np.ndarray, l2: float = 1e-6, iters: int = 100) -> np.ndarray:
    """Logistic regression by Newton's method (a column of ones added first); returns the coefficients."""
    X = np.column_stack([np.ones(len(x)), x])
    beta = np.zeros(X.shape[1])
    for _ in range(iters):
        p = 1 / (1 + np.exp(-X @ beta))
        grad = X.T @ (y - p) - l2 * beta
        hess = (X * (p * (1 - p))[:, None]).T @ X + l2 * np.eye(X.shape[1])
        step = np.linalg.solve(hess, grad)
        beta += step
        if np.abs(step).max() < 1e-10:
            break
    return beta


def evaluations(name: str) -> tuple[list[int], list[dict], list, list[dict], list[str]]:
    record = load_record(OUT / name / "forgetwatch")
    steps = record.eval_steps()
    metrics = {r["step"]: r for r in record.read_metrics()}
    ids = [json.loads(line)["id"] for line in (OUT / name / "forgetwatch" / "probes.jsonl").read_text().splitlines()]
    return steps, [record.read_eval(s) for s in steps], [record.read_robust(s) for s in steps], [metrics[s] for s in steps], ids


def bootstrap_mean_ci(x: np.ndarray, n: int = 1000, seed: int = 0) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, len(x), (n, len(x)))].mean(1)
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def curves(name: str) -> dict:
    """Question 1: per evaluation, plain F, robust forgetting, consistency change, fragile; with their intervals."""
    steps, _, robust, metrics, _ = evaluations(name)
    base_right = robust[0].right
    rows = []
    for s, rob, m in zip(steps, robust, metrics, strict=True):
        o = m["metrics"]["overall"]
        if rob.ids != robust[0].ids:
            raise ValueError(f"{name} step {s}: robust probes differ from the base's")
        drop = base_right.mean(1) - rob.right.mean(1)  # per probe: share of its forms lost since base
        fragile_share = wilson_interval(o["fragile"], o["robust_pre"])
        right_pre = o["retained"] + o["forgotten"]
        rows.append({
            "step": s, "seconds": m.get("seconds"), "n": o["n"],
            "F": o["forgetting"], "F_ci": [o["forgetting_ci_low"], o["forgetting_ci_high"]],
            "forgotten": o["forgotten"], "right_at_base": right_pre,
            # supplementary, like for like with robust forgetting: the share of the base's right answers now wrong
            "F_of_right": o["forgotten"] / right_pre if right_pre else math.nan,
            "F_of_right_ci": list(wilson_interval(o["forgotten"], right_pre)) if right_pre else [math.nan, math.nan],
            "robust_pre": o["robust_pre"], "robust_lost": o["robust_lost"],
            "robust_forgetting": o["robust_forgetting"],
            "robust_forgetting_ci": [o["robust_forgetting_ci_low"], o["robust_forgetting_ci_high"]],
            "consistency_pre": o["consistency_pre"], "consistency_post": o["consistency_post"],
            "consistency_change": o["consistency_change"],
            # no Wilson interval for a mean of shares: a bootstrap over probes (1,000, seed 0) of the mean drop
            "consistency_drop_ci": list(bootstrap_mean_ci(drop)) if s != steps[0] else [0.0, 0.0],
            "consistency_change_check": float(-drop.mean()),
            "fragile": o["fragile"], "fragile_share": o["fragile"] / o["robust_pre"] if o["robust_pre"] else math.nan,
            "fragile_share_ci": list(fragile_share),
            "robust_variants": o["robust_variants"], "robust_n": o["robust_n"],
        })
    first = {}
    for key, ci in (("F", "F_ci"), ("F_of_right", "F_of_right_ci"), ("robust_forgetting", "robust_forgetting_ci"),
                    ("consistency_drop", "consistency_drop_ci"), ("fragile_share", "fragile_share_ci")):
        first[key] = next((r["step"] for r in rows if r[ci][0] > 0), None)
    last = rows[-1]
    by_suite = {g: {k: m.get(k) for k in ("n", "forgotten", "retained", "forgetting", "robust_pre", "robust_lost",
                                         "robust_forgetting", "consistency_change", "fragile")}
                for g, m in metrics[-1]["metrics"].items() if g != "overall" and "robust_pre" in m}
    return {"steps": steps, "rows": rows, "final_by_group": by_suite, "first_step_lower_bound_above_0": first,
            "more_robust_minus_F_at_end": last["robust_forgetting"] - last["F"],
            "more_robust_minus_F_of_right_at_end": last["robust_forgetting"] - last["F_of_right"],
            "final_step": last["step"]}


def candidates(name: str) -> dict[str, np.ndarray]:
    """Question 3: one row per (evaluation t before the last, probe right at base and right as asked at t)."""
    steps, evals, robust, _, ids = evaluations(name)
    if robust[0].ids != ids:
        raise ValueError(f"{name}: the robust probes are not the probe set in order")
    base_ok = evals[0]["outcome"] == CORRECT
    out: dict[str, list] = {"probe": [], "step": [], "margin": [], "consistency": [], "next": []}
    for t in range(len(steps) - 1):
        now_ok = evals[t]["outcome"] == CORRECT
        cand = np.flatnonzero(base_ok & now_ok)
        out["probe"] += [ids[i] for i in cand]
        out["step"] += [steps[t]] * len(cand)
        out["margin"] += evals[t]["margin"].astype(np.float64)[cand].tolist()
        out["consistency"] += robust[t].right[cand].mean(1).tolist()
        out["next"] += (evals[t + 1]["outcome"][cand] != CORRECT).tolist()
    return {k: np.asarray(v) for k, v in out.items()}


def pr_at(score: np.ndarray, label: np.ndarray, threshold: float) -> dict:
    flagged = score >= threshold
    tp = int((flagged & label).sum())
    return {"flagged": int(flagged.sum()), "true_positives": tp, "positives": int(label.sum()),
            "precision": tp / int(flagged.sum()) if flagged.any() else math.nan,
            "recall": tp / int(label.sum()) if label.any() else math.nan}


def threshold_for_recall(score: np.ndarray, label: np.ndarray, recall: float = 0.5) -> float:
    """The highest threshold (flag score >= it) whose recall on these rows reaches `recall`."""
    pos = np.sort(score[label])[::-1]
    return float(pos[math.ceil(recall * len(pos)) - 1])


def leading(data: dict[str, dict[str, np.ndarray]], resamples: int = 1000, seed: int = 0) -> dict:
    cal = data[CALIBRATION]
    fin = np.isfinite(cal["margin"])
    x_cal = np.column_stack([cal["margin"][fin], cal["consistency"][fin]])
    mu, sd = x_cal.mean(0), x_cal.std(0)
    beta = logistic_fit((x_cal - mu) / sd, cal["next"][fin].astype(float))

    def scores(c: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        x = (np.column_stack([c["margin"], c["consistency"]]) - mu) / sd
        return {"margin": -c["margin"], "consistency": -c["consistency"],  # higher = riskier
                "combined": 1 / (1 + np.exp(-(beta[0] + x @ beta[1:])))}

    cal_s = {k: v[fin] for k, v in scores(cal).items()}
    thresholds = {k: threshold_for_recall(v, cal["next"][fin].astype(bool)) for k, v in cal_s.items()}
    # consistency alone is defined on every candidate, short answers included: its threshold on all of them too
    thr_cons_all = threshold_for_recall(-cal["consistency"], cal["next"].astype(bool))
    out = {"calibration": CALIBRATION, "logistic": {"standardise_mean": mu.tolist(), "standardise_sd": sd.tolist(),
           "coef_intercept_margin_consistency": beta.tolist(), "fit_rows": int(fin.sum()),
           "fit_positives": int(cal["next"][fin].sum())},
           "thresholds_50pct_recall_on_calibration": {**thresholds, "consistency_all_candidates": thr_cons_all},
           "runs": {}}
    held = [n for n in data if n != CALIBRATION]
    sets = {n: [n] for n in data} | {"pooled_held_out": held,
                                     "pooled_sft_held_out": [n for n in held if n.startswith("sft")],
                                     "pooled_grpo": [n for n in held if n.startswith("grpo")]}
    for set_name, members in sets.items():
        if not members:
            continue
        c = {k: np.concatenate([data[n][k] for n in members]) for k in ("margin", "consistency", "next")}
        cluster = np.concatenate([[f"{n}|{p}" for p in data[n]["probe"]] for n in members])
        s = scores(c)
        label = c["next"].astype(bool)
        fin = np.isfinite(c["margin"])
        # the bootstrap unit is a probe of a run (a probe is a candidate at several evaluations): 1,000 resamples,
        # seed 0, the same resamples for every score (paired differences)
        uniq, inv = np.unique(cluster, return_inverse=True)
        rng = np.random.default_rng(seed)
        draws = rng.integers(0, len(uniq), (resamples, len(uniq)))
        boot = {k: [] for k in ("margin", "consistency", "combined", "combined-margin", "consistency-margin",
                                "consistency_all")}
        for d in draws:
            w = np.bincount(d, minlength=len(uniq))[inv].astype(float)
            a = {k: auc(s[k][fin], label[fin], w[fin]) for k in ("margin", "consistency", "combined")}
            for k in ("margin", "consistency", "combined"):
                boot[k].append(a[k])
            boot["combined-margin"].append(a["combined"] - a["margin"])
            boot["consistency-margin"].append(a["consistency"] - a["margin"])
            boot["consistency_all"].append(auc(s["consistency"], label, w))

        def ci(v: list[float]) -> list[float]:
            v = np.asarray(v)
            v = v[np.isfinite(v)]
            return [float(np.percentile(v, 2.5)), float(np.percentile(v, 97.5))] if len(v) else [math.nan, math.nan]

        point = {k: auc(s[k][fin], label[fin]) for k in ("margin", "consistency", "combined")}
        out["runs"][set_name] = {
            "members": members, "candidates": int(len(label)), "positives": int(label.sum()),
            "finite_margin_candidates": int(fin.sum()), "finite_margin_positives": int(label[fin].sum()),
            "probes": int(len(uniq)),
            "auc_finite_margin": {k: {"auc": point[k], "ci": ci(boot[k])} for k in point},
            "auc_diff_combined_minus_margin": {"diff": point["combined"] - point["margin"], "ci": ci(boot["combined-margin"])},
            "auc_diff_consistency_minus_margin": {"diff": point["consistency"] - point["margin"],
                                                  "ci": ci(boot["consistency-margin"])},
            "auc_consistency_all_candidates": {"auc": auc(s["consistency"], label), "ci": ci(boot["consistency_all"])},
            "at_calibration_threshold": {k: pr_at(s[k][fin], label[fin], thresholds[k]) for k in thresholds}
            | {"consistency_all_candidates": pr_at(s["consistency"], label, thr_cons_all)},
            "base_rate_finite_margin": float(label[fin].mean()) if fin.any() else math.nan,
            # how often a candidate has lost some form while still right (consistency < 1), and its flip rate
            "inconsistent_candidates": int((c["consistency"] < 1).sum()),
            "flip_rate_inconsistent": float(label[c["consistency"] < 1].mean()) if (c["consistency"] < 1).any() else math.nan,
            "flip_rate_consistent": float(label[c["consistency"] == 1].mean()) if (c["consistency"] == 1).any() else math.nan,
            # the plain rule "lost some form while still right" (consistency < 1), no threshold to choose
            "rule_consistency_below_1": pr_at(s["consistency"], label, -1 + 1e-9),
        }
    return out


def _same_base() -> bool:
    """The identity check's `forgetwatch cache` against the calibration run's own base (scored by the callback): the
    same 1,200 rows, outcomes and margins."""
    import pandas as pd

    a = pd.read_parquet(OUT / "identity" / "base.parquet")
    b = pd.read_parquet(OUT / CALIBRATION / "forgetwatch" / "base.parquet")
    return bool(list(a["id"]) == list(b["id"]) and (a["outcome"].values == b["outcome"].values).all()
                and np.array_equal(a["margin"].values, b["margin"].values, equal_nan=True))


def mean_sd(values: list[float]) -> list[float]:
    v = np.asarray([x for x in values if x is not None and np.isfinite(x)], float)
    return [float(v.mean()), float(v.std(ddof=1)) if len(v) > 1 else math.nan, int(len(v))] if len(v) else [math.nan, math.nan, 0]


def analyse() -> dict:
    done = [n for n in RUNS if (OUT / n / "wall.json").is_file() and json.loads((OUT / n / "wall.json").read_text())["rc"] == 0]
    result: dict = {"protocol": "benchmarks/protocols/robustness_drift.md", "runs_done": done,
                    "runs_missing": [n for n in RUNS if n not in done], "env": ENV, "runs": {}}
    for n in done:
        result["runs"][n] = {"wall": json.loads((OUT / n / "wall.json").read_text()), "curves": curves(n)}
        letters_file = OUT / "letters" / n / "compare.json"
        if letters_file.is_file():
            rep = json.loads(letters_file.read_text())
            g = rep["robustness"]["groups"]["overall"]
            result["runs"][n]["letters"] = {k: g.get(k) for k in (
                "position_bias_pre", "position_bias_post", "position_bias_change", "robust_accuracy_pre",
                "robust_accuracy_post", "consistency_pre", "consistency_post", "robust_n", "robust_variants")}
            result["runs"][n]["letters"]["wall"] = json.loads((OUT / "letters" / n / "wall.json").read_text())
            plain = rep["metrics"]["overall"]
            result["runs"][n]["letters"].update(accuracy_pre=plain["accuracy_pre"], accuracy_post=plain["accuracy_post"],
                                                forgetting=plain["forgetting"], n=plain["n"])
    # mean +- sd over seeds, per recipe and evaluation
    summary = {}
    for recipe in ("sft", "grpo"):
        names = [n for n in done if n.startswith(recipe)]
        if not names:
            continue
        per_step = {}
        for i, step in enumerate(result["runs"][names[0]]["curves"]["steps"]):
            per_step[step] = {k: mean_sd([result["runs"][n]["curves"]["rows"][i][k] for n in names])
                              for k in ("F", "F_of_right", "robust_forgetting", "consistency_change", "fragile",
                                        "fragile_share", "seconds")}
        summary[recipe] = {
            "runs": names,
            "per_step": per_step,
            "more_robust_minus_F_at_end": mean_sd([result["runs"][n]["curves"]["more_robust_minus_F_at_end"] for n in names]),
            "more_robust_minus_F_of_right_at_end": mean_sd(
                [result["runs"][n]["curves"]["more_robust_minus_F_of_right_at_end"] for n in names]
            ),
            "first_step_lower_bound_above_0": {n: result["runs"][n]["curves"]["first_step_lower_bound_above_0"] for n in names},
            "position_bias_change": mean_sd([result["runs"][n].get("letters", {}).get("position_bias_change") for n in names]),
            "wall_s": mean_sd([result["runs"][n]["wall"]["wall_s"] for n in names]),
        }
    result["summary"] = summary
    if CALIBRATION in done:
        result["leading_indicator"] = leading({n: candidates(n) for n in done})
    ident = OUT / "identity" / "compare.json"
    if ident.is_file():
        rep = json.loads(ident.read_text())
        plain = rep["metrics"]["overall"]
        result["identity"] = {"overall": rep["robustness"]["groups"]["overall"],
                              "groups_all_zero_change": all(
                                  g["consistency_change"] == 0 and g["robust_lost"] == 0 and g["fragile"] == 0
                                  for g in rep["robustness"]["groups"].values()),
                              "plain": {k: plain[k] for k in ("n", "forgotten", "learned", "forgetting", "accuracy_pre",
                                                              "accuracy_post")},
                              "callback_base_equals_cli_cache": _same_base(),
                              "wall": json.loads((OUT / "identity" / "wall.json").read_text())}
    # cost: seconds per evaluation (probes + variants in one call) and per row
    cost = {}
    for n in done:
        rows = result["runs"][n]["curves"]["rows"][1:]
        secs = [r["seconds"] for r in rows]
        k = rows[0]["robust_variants"]
        cost[n] = {"seconds_per_eval": mean_sd(secs), "rows_per_eval": rows[0]["n"] * (1 + k),
                   "seconds_per_probe_row": float(np.mean(secs)) / (rows[0]["n"] * (1 + k)),
                   # were a variant to cost one probe (§15: 0.82-0.87x), the probes alone would take 1 / (1 + K) of it
                   "probes_alone_if_variant_costs_1": float(np.mean(secs)) / (1 + k),
                   "probes_alone_if_variant_costs_0.85": float(np.mean(secs)) / (1 + 0.85 * k)}
    result["cost"] = cost
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", nargs="+", metavar="NAME", choices=RUNS, help="train these runs, one after another")
    parser.add_argument("--letters", nargs="*", metavar="NAME", help="position bias in letters of these runs (default all)")
    parser.add_argument("--identity", action="store_true", help="the base scored against itself")
    a = parser.parse_args()
    if a.run:
        train(a.run)
        return
    if a.letters is not None:
        letters(a.letters or RUNS)
        return
    if a.identity:
        identity()
        return
    result = analyse()
    result["commands"] = {
        "runs": {n: run_command(n) for n in RUNS},
        "letters": ["forgetwatch cache --model smollm2 --probes <run>/letters/probes_mcq.jsonl --mcq-mode letter "
                    "--robustness 3 -o <run>/letters/base.parquet",
                    "forgetwatch compare --model <run's final model> --probes <same> --base <that cache> --json"],
        "identity": ["forgetwatch cache --model smollm2 --probes outputs/robust_drift/sft-s0/forgetwatch/probes.jsonl "
                     "--robustness 5 -o outputs/robust_drift/identity/base.parquet",
                     "forgetwatch compare --model smollm2 --probes <same> --base <that cache> --json"],
    }
    result["seeds"] = {"training": list(SEEDS), "forgetwatch_seed": "= the training seed", "variant_seed": 0,
                       "bootstrap": {"resamples": 1000, "seed": 0, "unit": "a probe of a run"}}
    result["notes"] = [
        "runs were made over three sessions, two at a time (seed 0, then 1, then 2); a first sft-s1 was stopped during "
        "its base scoring and a first seed-2 pair was stopped by a session's end: their partial records were deleted "
        "and the runs made again from the start",
        "grpo-s0 (held out) shares its probe draw (forgetwatch_seed 0) with the calibration run sft-s0: the protocol's "
        "'forgetwatch_seed = the training seed' and 'shares no probe draw with the held-out ones' cannot both hold",
        "consistency change has no Wilson interval: consistency_drop_ci is a bootstrap over probes of the mean "
        "per-probe drop (1,000 resamples, seed 0); fragile_share_ci is Wilson over the probes robust at base",
        "thresholds: the highest threshold whose recall on the calibration run reaches 50%; for consistency (values "
        "k/6) it flags every candidate, so rule_consistency_below_1 is reported beside it",
        "cost: the runs scored only with variants; seconds without variants were not measured in the same runs",
    ]
    RESULT.write_text(json.dumps(result, indent=1, default=float) + "\n")
    print(json.dumps({k: result[k] for k in ("runs_done", "runs_missing")}, indent=1))


if __name__ == "__main__":
    main()
