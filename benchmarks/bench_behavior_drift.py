"""Does behaviour drift with knowledge? The SFT and GRPO demos, 3 seeds each, with behaviour probes beside knowledge.

Setting (fixed before the first run): the demos as shipped (`recipes/SmolLM2-135M-Instruct/{sft,grpo}/config_demo.yaml`:
SFT on GSM8K worked solutions at lr 1e-3, GRPO on easy arithmetic at lr 5e-5, 30 steps, fp32, CPU), seeds 0, 1, 2,
scored at steps 0, 10, 20, 30 on one probe file:

    knowledge   the demos' 200 probes (40 each of arc_easy, sciq, piqa, hellaswag, triviaqa)
    behaviour   the whole built-in `instructions` suite (105 prompts, 9 instruction groups) and `over_refusal` (32)

Behaviour probes are generated greedily with 128 new tokens (the demo's setting on CPU; 48 for harmless requests).
The base is scored once (`--prepare`, `forgetwatch cache`) and shared by the six runs, which run two at a time with
one thread each (`--run`; a run whose record already reaches step 30 is skipped, so a stopped experiment continues).
The summary reads each run's local record (per-step outcomes, answer lengths and stops) and computes knowledge and
behaviour figures apart, with `forgetwatch.measures.metrics` and `forgetwatch.measures.behavior`.

    python benchmarks/bench_behavior_drift.py --prepare    # probe file + base cache (~5 min)
    python benchmarks/bench_behavior_drift.py --run        # 6 runs, 2 at a time (~50 min on 2 cores)
    python benchmarks/bench_behavior_drift.py              # summary -> benchmarks/results/behavior_drift.json
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

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "outputs" / "behavior_drift"
KNOWLEDGE = "arc_easy,sciq,piqa,hellaswag,triviaqa"
PER_SUITE = 40
SEEDS = (0, 1, 2)
STAGES = {
    "sft": "recipes/SmolLM2-135M-Instruct/sft/config_demo.yaml",
    "grpo": "recipes/SmolLM2-135M-Instruct/grpo/config_demo.yaml",
}
MAX_NEW_TOKENS = 128
LAST_STEP = 30


def _env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "WANDB_MODE": "disabled"}


def prepare() -> None:
    from forgetwatch.probes.suites import load_probes, load_suite

    OUT.mkdir(parents=True, exist_ok=True)
    probes = load_probes(KNOWLEDGE, per_suite=PER_SUITE, seed=0) + load_suite("instructions") + load_suite("over_refusal")
    probes.to_jsonl(OUT / "probes.jsonl")
    print(f"{len(probes)} probes")
    subprocess.run([str(Path(sys.executable).parent / "forgetwatch"), "cache", "--model", "smollm2", "--probes",
                    str(OUT / "probes.jsonl"), "--behavior-max-new-tokens", str(MAX_NEW_TOKENS), "-o", str(OUT / "base.parquet"),
                    "--device", "cpu"], check=True, env={**_env(), "OMP_NUM_THREADS": "2"})


def _done(out: Path) -> bool:
    path = out / "forgetwatch" / "metrics.jsonl"
    return path.is_file() and any(json.loads(line)["step"] == LAST_STEP for line in path.read_text().splitlines() if line)


def run_one(stage: str, seed: int) -> None:
    out = OUT / f"{stage}-s{seed}"
    if _done(out):
        print(f"{out.name}: done already", flush=True)
        return
    cmd = [sys.executable, f"recipes/{stage}.py", "--config", STAGES[stage], "--report_to", "none", "--output_dir", str(out),
           "--run_name", out.name, "--seed", str(seed), "--forgetwatch_probes", str(OUT / "probes.jsonl"),
           "--forgetwatch_base_cache", str(OUT / "base.parquet"), "--forgetwatch_behavior_max_new_tokens", str(MAX_NEW_TOKENS),
           "--forgetwatch_replay", "false"]
    t0 = time.time()
    with open(OUT / f"{out.name}.log", "w") as log:
        subprocess.run(cmd, check=True, env=_env(), cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    print(f"{out.name}: {time.time() - t0:.0f} s", flush=True)


def summarise_run(out: Path) -> dict:
    """Per evaluation step: knowledge F/BT (raw, adjusted), behaviour figures overall and per instruction group."""
    from forgetwatch.measures.behavior import compute_behavior
    from forgetwatch.measures.metrics import compute_report
    from forgetwatch.probes.probe_set import ProbeSet
    from forgetwatch.record.store import load_record

    probes = ProbeSet.from_jsonl(OUT / "probes.jsonl")
    record = load_record(out)
    know = np.array([not p.is_behavior for p in probes])
    inst = np.array([p.kind == "instruct" for p in probes])
    k = np.array([p.num_choices for p in probes])
    cats = np.array([p.category for p in probes], dtype=object)
    kinds = [p.kind for p in probes]
    base = record.read_results(0, probes.ids)
    steps = {}
    for step in record.eval_steps():
        now = record.read_results(step, probes.ids)
        kr = compute_report(base.outcome[know], now.outcome[know], k[know], list(cats[know]))["overall"]
        ir = compute_report(base.outcome[inst], now.outcome[inst], k[inst], list(cats[inst]))
        beh = compute_behavior(base, now, list(cats), kinds)["overall"].to_dict()
        steps[step] = {
            "knowledge_F": kr.forgetting,
            "knowledge_F_adj": kr.forgetting_adjusted,
            "knowledge_BT": kr.backward_transfer,
            "knowledge_acc": kr.accuracy_post,
            "knowledge_mcnemar_p": kr.mcnemar_p,
            "instruct_F": ir["overall"].forgetting,
            "instruct_BT": ir["overall"].backward_transfer,
            "instruct_mcnemar_p": ir["overall"].mcnemar_p,
            "instruct_compliance": beh["instruct_compliance"],
            "instruct_forgetting": beh["instruct_forgetting"],
            "runaway_rate": beh["runaway_rate"],
            "runaway": beh["runaway"],
            "length_ratio": float(np.exp(beh["length_log_ratio"])),
            "over_refusal_rate": beh["over_refusal_rate"],
            "over_refusal": beh["over_refusal"],
            "groups": {
                g: {"F": m.forgetting, "BT": m.backward_transfer, "acc_pre": m.accuracy_pre, "acc_post": m.accuracy_post}
                for g, m in ir.items()
                if g != "overall"
            },
        }
    return steps


def summarise() -> dict:
    runs = {f"{stage}-s{s}": summarise_run(OUT / f"{stage}-s{s}") for stage in STAGES for s in SEEDS
            if _done(OUT / f"{stage}-s{s}")}
    summary = {}
    for stage in STAGES:
        names = [n for n in runs if n.startswith(stage)]
        if not names:
            continue
        steps = sorted(set.intersection(*(set(runs[n]) for n in names)))
        figs = [f for f in runs[names[0]][0] if f != "groups"]
        summary[stage] = {"seeds": len(names), "steps": steps, "figures": {
            f: {str(s): {"mean": float(np.nanmean(v)), "sd": float(np.nanstd(v, ddof=1)) if len(v) > 1 else None,
                         "runs": v}
                for s in steps for v in [[runs[n][s][f] for n in names]]}
            for f in figs}}
        groups = runs[names[0]][0]["groups"]
        summary[stage]["groups_final"] = {
            g: {
                f: float(np.mean([runs[n][steps[-1]]["groups"][g][f] for n in names])) for f in ("F", "BT", "acc_pre", "acc_post")
            }
            for g in groups
        }
    return {"setting": {"knowledge": KNOWLEDGE, "per_suite": PER_SUITE, "behaviour": "instructions (105) + over_refusal (32)",
                        "max_new_tokens": MAX_NEW_TOKENS, "seeds": SEEDS, "configs": STAGES}, "summary": summary, "runs": runs}


def plot(result: dict) -> None:
    """Knowledge and behaviour over steps, per stage: seeds' mean (line) and each run (dots)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (("knowledge_F", "knowledge: F (1→0)"), ("instruct_forgetting", "instructions: 1→0 of followed"),
              ("runaway_rate", "runaway rate"), ("length_ratio", "length now / base (median)"),
              ("over_refusal_rate", "harmless requests refused"))
    stages = list(result["summary"])
    fig, axes = plt.subplots(len(stages), len(panels), figsize=(3.2 * len(panels), 2.8 * len(stages)), squeeze=False)
    for r, stage in enumerate(stages):
        s = result["summary"][stage]
        x = s["steps"]
        for c, (key, title) in enumerate(panels):
            ax = axes[r][c]
            by_step = s["figures"][key]
            ax.plot(x, [by_step[str(t)]["mean"] for t in x], "o-", color="#cc6633" if c else "#336699", lw=2)
            for t in x:
                ax.plot([t] * len(by_step[str(t)]["runs"]), by_step[str(t)]["runs"], "k.", ms=4)
            ax.set_title(f"{stage.upper()}: {title}", fontsize=9)
            ax.set_xticks(x)
            if key == "length_ratio":
                ax.axhline(1, color="k", ls=":", lw=1)
        axes[r][0].set_ylabel(f"{s['seeds']} seeds")
    fig.suptitle("SmolLM2-135M-Instruct demos: knowledge and behaviour since base (line: mean over seeds; dots: runs)")
    fig.tight_layout()
    fig.savefig(REPO / "benchmarks" / "results" / "behavior_drift.png", dpi=100)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prepare", action="store_true")
    ap.add_argument("--run", action="store_true")
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--stages", default="sft,grpo")
    args = ap.parse_args()
    if args.prepare:
        prepare()
        return
    if args.run:
        jobs = [(stage, s) for s in SEEDS for stage in args.stages.split(",")]
        with ThreadPoolExecutor(args.parallel) as pool:
            list(pool.map(lambda j: run_one(*j), jobs))
        return
    result = summarise()
    path = REPO / "benchmarks" / "results" / "behavior_drift.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    plot(result)
    for stage, s in result["summary"].items():
        print(f"{stage} ({s['seeds']} seeds)")
        for f, by_step in s["figures"].items():
            print(f"  {f:22s}" + "  ".join(f"{st}: {v['mean']:.3f}±{v['sd'] or 0:.3f}" for st, v in by_step.items()))
    print("written", path)


if __name__ == "__main__":
    main()
