"""Does replay cut forgetting when the task improves? Gold vs self-distilled replay vs a KL anchor, 3 seeds.

Setting (fixed before the first run; benchmarks/RESULTS.md §12): SmolLM2-135M-Instruct, fp32, SFT on GSM8K worked
solutions (rows 100+; rows 0-99 are the held-out task), learning rate 1e-4 constant, 200 steps of 2 examples,
max_length 128, the monitor's evaluations every 20 steps (they steer the closed loop). 2 examples a step, not 4: at one
thread a step of 4 x 128 tokens took 5.3 s, and 18 runs of 200 steps would not fit in a few hours. Probe sets, disjoint, from
arc_easy, sciq, piqa, hellaswag, triviaqa:

    monitored   20 per suite (seed 0): the callback scores them every 20 steps; they steer the closed loop
    held out    40 per suite (another sample): scored every 40 steps by this script only (never steer, never replayed);
                the headline. Plus 24 held-out instruction prompts (instructions suite), scored at base and at the end.
    pool        200 per suite of the rest whose prompt fits in 96 tokens: what every replay arm and the anchor draw from

Arms, at ratio 0.1 (`--forgetwatch_replay_mix 0.1`, or `--forgetwatch_anchor_ratio 0.1`):

    none            no replay
    gold_uniform    gold answers in the scoring form (question -> option text / bare answer), uniform over categories
    gold_closed     the same, closed loop (categories that forget get more)
    base_uniform    the base model's own answers as targets (self-distilled), uniform
    base_closed     self-distilled, closed loop
    anchor          KL(base || model) on the base's answers to pool prompts, beta 1.0, closed loop, no replay
    none_stream     (added after the 18 runs, a control) no replay, but the training examples the replay arms see: the
                    replay stream's permutation of the data at ratio 1e-9, where no position of the 400 is replay

The sweep (ratios 0.05 and 0.25) runs for the arm with the lowest mean held-out F at 0.1: `--sweep ARM`.

    python benchmarks/bench_replay_targets.py --prepare     # probe files, base caches, base outputs (~6 min)
    python benchmarks/bench_replay_targets.py --run         # every run not done yet (the control too), 2 at a time, 1 thread each
    python benchmarks/bench_replay_targets.py --run --sweep gold_closed   # the arm with the lowest mean held-out F at 0.1
    python benchmarks/bench_replay_targets.py               # table + plots -> benchmarks/results/replay_targets.{json,png}

Resumable run by run: a run is done when its result is in benchmarks/results/replay_targets/<run>.json (tracked, so a
fresh clone continues the experiment; `--prepare` makes the same probe files and base outputs again, all seeded); an
unfinished run starts again from scratch.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "recipes"))

OUT = REPO / "outputs" / "replay_targets"
DONE = REPO / "benchmarks" / "results" / "replay_targets"  # one small JSON per finished run, kept in git
SUITES = ("arc_easy", "sciq", "piqa", "hellaswag", "triviaqa")
MONITORED, HELD_OUT, POOL = 20, 40, 200
HELD_OUT_BEHAVIOR = 24
SEEDS = (0, 1, 2)
RATIO = 0.1
SWEEP = (0.05, 0.25)
STEPS, EVAL_STEPS, LR, BATCH, MAX_LENGTH = 200, 20, 1e-4, 2, 128
HELD_OUT_STEPS = 40
MAX_PROMPT = 96  # pool prompts longer than this (with the chat template) are left out: their answers would be cut
BETA = 1.0
HELD_OUT_TASK = 100
BEHAVIOR_TOKENS = 96


def arm_args(arm: str, ratio: float = RATIO) -> list[str]:
    replay = ["--forgetwatch_replay_mix", str(ratio), "--forgetwatch_replay_pool", str(OUT / "pool.jsonl")]
    return {
        "none": [],
        # added after the 18 runs (not in the protocol): no replay, but the training examples in the replay stream's order.
        # The replay arms draw their training examples from mix_replay's own permutation of the data, no replay from the
        # Trainer's sampler: other examples. At ratio 1e-9 no position of the 400 holds replay (floor((m+1)·ratio) = 0).
        "none_stream": ["--forgetwatch_replay_mix", "1e-9", "--forgetwatch_replay_pool", str(OUT / "pool.jsonl"),
                        "--forgetwatch_replay_strategy", "uniform", "--forgetwatch_replay_targets", "gold"],
        "gold_uniform": [*replay, "--forgetwatch_replay_strategy", "uniform", "--forgetwatch_replay_targets", "gold"],
        "gold_closed": [*replay, "--forgetwatch_replay_strategy", "closed_loop", "--forgetwatch_replay_targets", "gold"],
        "base_uniform": [*replay, "--forgetwatch_replay_strategy", "uniform", "--forgetwatch_replay_targets", "base"],
        "base_closed": [*replay, "--forgetwatch_replay_strategy", "closed_loop", "--forgetwatch_replay_targets", "base"],
        "anchor": ["--forgetwatch_replay_pool", str(OUT / "pool.jsonl"), "--forgetwatch_replay_strategy", "closed_loop",
                   "--forgetwatch_anchor_beta", str(BETA), "--forgetwatch_anchor_ratio", str(ratio)],
    }[arm]


ARMS = ("none", "gold_uniform", "gold_closed", "base_uniform", "base_closed", "anchor", "none_stream")


def _env() -> dict:
    # glibc's malloc maps and unmaps every large tensor (a 128-token batch's logits are 25-50 MB), and the page faults
    # were half the CPU time: keep freed memory in the heap instead (12 steps: 64 s against 75 s)
    return {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "WANDB_MODE": "disabled",
            "MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": "100000000000"}


# -- preparation ------------------------------------------------------------------------------------------------
def prepare() -> None:
    import torch

    from forgetwatch.probes.probe_set import ProbeSet
    from forgetwatch.probes.suites import load_probes, load_suite
    from forgetwatch.remedies import load_or_make
    from forgetwatch.scoring.models import load_model
    from forgetwatch.scoring.score import ScoringConfig, score_probes

    torch.set_num_threads(2)
    OUT.mkdir(parents=True, exist_ok=True)
    model, tok = load_model("smollm2")
    model.eval()
    monitored = load_probes(",".join(SUITES), per_suite=MONITORED, seed=0)
    held, pool = [], []
    for suite in SUITES:
        rest = load_suite(suite).filter(lambda p: p.id not in monitored)
        sample = rest.subsample(HELD_OUT, seed=1)
        held += list(sample)
        rest = rest.filter(lambda p: p.id not in sample).subsample(4 * POOL, seed=2)  # noqa: B023 (called here)
        fits = [p for p in rest if _prompt_tokens(tok, p) <= MAX_PROMPT]
        pool += fits[:POOL]
    behavior = load_probes(f"instructions:{HELD_OUT_BEHAVIOR}", seed=1)
    monitored.to_jsonl(OUT / "monitored.jsonl")
    ProbeSet(held, origin="held_out").to_jsonl(OUT / "held_out.jsonl")
    behavior.to_jsonl(OUT / "held_out_behavior.jsonl")
    ProbeSet(pool, origin="pool").to_jsonl(OUT / "pool.jsonl")
    print(f"monitored {len(monitored)}, held out {len(held)} + {len(behavior)} behaviour, pool {len(pool)}", flush=True)
    subprocess.run([str(Path(sys.executable).parent / "forgetwatch"), "cache", "--model", "smollm2", "--probes",
                    str(OUT / "monitored.jsonl"), "-o", str(OUT / "base-monitored.parquet"), "--device", "cpu"], check=True)
    base = {
        "knowledge": score_probes(model, tok, ProbeSet(held)).outcome.tolist(),
        "behavior": score_probes(model, tok, behavior, ScoringConfig(behavior_max_new_tokens=BEHAVIOR_TOKENS)).outcome.tolist(),
        "task_loss": held_out_loss(model, tok),
    }
    (OUT / "base_held_out.json").write_text(json.dumps(base))
    outs = load_or_make(OUT / "base_outputs.parquet", model, tok, str(OUT / "pool.jsonl"), exclude=monitored,
                        max_length=MAX_LENGTH, max_new_tokens=128, progress=True)
    print(f"base outputs: {len(outs)}; base held-out task loss {base['task_loss']:.4f}", flush=True)
    _check_prepared()


def _prepared() -> dict:
    """What the runs depend on: the probe files' and base outputs' hashes, and the base's held-out results."""
    import hashlib

    from forgetwatch.remedies import BaseOutputs

    files = ("monitored.jsonl", "held_out.jsonl", "held_out_behavior.jsonl", "pool.jsonl")
    out = {f: hashlib.sha256((OUT / f).read_bytes()).hexdigest()[:16] for f in files}
    answers = [r["answer"] for r in BaseOutputs.load(OUT / "base_outputs.parquet").rows]
    out["base_outputs_answers"] = hashlib.sha256(json.dumps(answers).encode()).hexdigest()[:16]
    out["base_held_out"] = json.loads((OUT / "base_held_out.json").read_text())
    return out


def _check_prepared() -> None:
    """The runs kept in git were made from one preparation: a fresh `--prepare` must make the same, or they do not mix."""
    check_prepared(_prepared(), DONE)


def check_prepared(now: dict, done: Path) -> None:
    """Keep `now` (what `--prepare` made) in `done`/prepared.json the first time; later, refuse a preparation that made
    other files than the finished runs in `done` used."""
    path = done / "prepared.json"
    if not path.is_file():
        done.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(now, indent=1))
        return
    kept = json.loads(path.read_text())
    if kept != now:
        diff = [k for k in kept if kept.get(k) != now.get(k)]
        raise SystemExit(f"--prepare made other files than the finished runs used ({', '.join(diff)}): their results "
                         f"cannot be mixed with new runs; move {done} aside to start the experiment again")


def _prompt_tokens(tok, probe) -> int:
    from forgetwatch.scoring.prompts import question_block

    text = tok.apply_chat_template([{"role": "user", "content": question_block(probe, False)}], tokenize=False,
                                   add_generation_prompt=True)
    return len(tok(text, add_special_tokens=False)["input_ids"])


def held_out_loss(model, tokenizer) -> float:
    """Mean loss per assistant token over the held-out GSM8K worked solutions, cut at MAX_LENGTH as in training."""
    from bench_replay import held_out_loss as loss  # the same 100 rows and the same loss as §9

    return loss(model, tokenizer, max_length=MAX_LENGTH)


# -- one run ----------------------------------------------------------------------------------------------------
def run_name(arm: str, seed: int, ratio: float = RATIO) -> str:
    return f"{arm}-r{ratio:g}-s{seed}"


def one(arm: str, seed: int, ratio: float) -> None:
    """Train one run in this process, scoring the held-out probes every EVAL_STEPS; write done.json at the end."""
    import torch
    from sft import main, make_parser
    from transformers import TrainerCallback

    from forgetwatch.probes.probe_set import ProbeSet
    from forgetwatch.scoring.models import load_model
    from forgetwatch.scoring.score import ScoringConfig, score_probes

    torch.set_num_threads(1)
    out = OUT / run_name(arm, seed, ratio)
    held = ProbeSet.from_jsonl(OUT / "held_out.jsonl")
    curve: list[dict] = []

    class HeldOut(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, processing_class=None, **kwargs):
            if state.global_step % HELD_OUT_STEPS == 0 or state.global_step >= state.max_steps:
                t0 = time.perf_counter()
                outcome = score_probes(model, processing_class, held).outcome.tolist()
                curve.append({"step": state.global_step, "outcome": outcome, "seconds": time.perf_counter() - t0})

    argv = ["--config", "recipes/SmolLM2-135M-Instruct/sft/config_demo.yaml", "--report_to", "none",
            "--output_dir", str(out), "--run_name", out.name, "--seed", str(seed),
            "--dataset_train_split", f"train[{HELD_OUT_TASK}:]", "--learning_rate", str(LR), "--max_steps", str(STEPS),
            "--per_device_train_batch_size", str(BATCH), "--max_length", str(MAX_LENGTH), "--logging_steps", "10",
            "--disable_tqdm", "true",
            "--forgetwatch_probes", str(OUT / "monitored.jsonl"), "--forgetwatch_base_cache", str(OUT / "base-monitored.parquet"),
            "--forgetwatch_eval_steps", str(EVAL_STEPS), "--forgetwatch_replay", "false",
            "--forgetwatch_budget", "forgetting=1.0", "--forgetwatch_base_outputs", str(OUT / "base_outputs.parquet"),
            *arm_args(arm, ratio)]
    t0 = time.time()
    main(*make_parser().parse_args_and_config(args=argv), extra_callbacks=[HeldOut()])
    train_seconds = time.time() - t0
    model, tok = load_model(str(out))
    model.eval()
    behavior = ProbeSet.from_jsonl(OUT / "held_out_behavior.jsonl")
    done = {
        "arm": arm,
        "seed": seed,
        "ratio": ratio,
        "curve": curve,
        "task_loss": held_out_loss(model, tok),
        "behavior": score_probes(model, tok, behavior, ScoringConfig(behavior_max_new_tokens=BEHAVIOR_TOKENS)).outcome.tolist(),
        "train_seconds": train_seconds,
        "total_seconds": time.time() - t0,
    }
    (out / "done.json").write_text(json.dumps(done))
    DONE.mkdir(parents=True, exist_ok=True)
    (DONE / f"{out.name}.json").write_text(json.dumps(done))
    for f in out.glob("model*.safetensors"):
        f.unlink()  # 540 MB a run; everything measured is in done.json and the record


def run_one(arm: str, seed: int, ratio: float) -> None:
    out = OUT / run_name(arm, seed, ratio)
    if (DONE / f"{out.name}.json").is_file():
        print(f"{out.name}: done already", flush=True)
        return
    if out.exists():
        shutil.rmtree(out)  # an unfinished run starts again from scratch
    t0 = time.time()
    OUT.mkdir(parents=True, exist_ok=True)
    with open(OUT / f"{out.name}.log", "w") as log:
        proc = subprocess.run([sys.executable, __file__, "--one", arm, str(seed), str(ratio)], env=_env(), cwd=REPO,
                              stdout=log, stderr=subprocess.STDOUT)
    print(
        f"{out.name}: {'ok' if proc.returncode == 0 else f'FAILED ({proc.returncode})'} in {time.time() - t0:.0f} s", flush=True
    )


# -- analysis ---------------------------------------------------------------------------------------------------
def _rates(base: list[int], now: list[int]) -> tuple[float, float]:
    b, n = np.asarray(base) == 1, np.asarray(now) == 1
    return float((b & ~n).sum() / len(b)), float((~b & n).sum() / len(b))


def analyse() -> dict:
    base = json.loads((OUT / "base_held_out.json").read_text())
    runs = {}
    for done in sorted(DONE.glob("*-r*-s*.json")):  # the runs (prepared.json is not one)
        d = json.loads(done.read_text())
        curve = [{"step": 0, "F": 0.0, "BT": 0.0}] + [
            {"step": c["step"], "F": _rates(base["knowledge"], c["outcome"])[0], "BT": _rates(base["knowledge"], c["outcome"])[1]}
            for c in d["curve"]]
        f_beh, bt_beh = _rates(base["behavior"], d["behavior"])
        runs[done.stem] = {"arm": d["arm"], "seed": d["seed"], "ratio": d["ratio"], "curve": curve,
                                  "F": curve[-1]["F"], "BT": curve[-1]["BT"], "task_loss": d["task_loss"],
                                  # added after the runs (not in the protocol): F averaged over the held-out evaluations
                                  # (steps 40-200), less at the mercy of the last one than the headline
                                  "F_curve_mean": float(np.mean([c["F"] for c in curve[1:]])),
                                  "behavior_F": f_beh, "behavior_BT": bt_beh, "minutes": d["total_seconds"] / 60}
    arms: dict[str, dict] = {}
    for r in runs.values():
        arms.setdefault(f"{r['arm']}-r{r['ratio']:g}", []).append(r)
    summary = {}
    for name, rs in arms.items():
        def stat(key):
            v = [r[key] for r in rs]  # noqa: B023 (called in this iteration)
            return {"mean": float(np.mean(v)), "sd": float(np.std(v, ddof=1)) if len(v) > 1 else None, "runs": v}

        summary[name] = {
            "seeds": sorted(r["seed"] for r in rs),
            "F": stat("F"),
            "F_curve_mean": stat("F_curve_mean"),
            "BT": stat("BT"),
            "task_loss": stat("task_loss"),
            "behavior_F": stat("behavior_F"),
            "minutes": stat("minutes"),
        }
    # paired by seed and probe: among the base's right held-out answers, forgotten by the reference arm only vs by the
    # arm only (pooled over the seeds both have), with an exact two-sided sign test: is the difference more than churn?
    # Against no replay (the cut) and against uniform gold replay (the issue's second bar).
    finals = {name: {d["seed"]: np.asarray(d["outcome"]) for d in _finals(name)} for name in summary}
    right = np.asarray(base["knowledge"]) == 1
    for ref_name in (f"none-r{RATIO:g}", f"gold_uniform-r{RATIO:g}", f"none_stream-r{RATIO:g}"):
        ref_final = finals.get(ref_name, {})
        for name, s in summary.items():
            seeds = sorted(set(finals[name]) & set(ref_final))
            only_ref = sum(int((right & (ref_final[k] != 1) & (finals[name][k] == 1)).sum()) for k in seeds)
            only_arm = sum(int((right & (ref_final[k] == 1) & (finals[name][k] != 1)).sum()) for k in seeds)
            s[f"paired_vs_{ref_name.split('-r')[0]}"] = {"seeds": seeds, "forgotten_by_reference_only": only_ref,
                                                          "forgotten_by_arm_only": only_arm,
                                                          "sign_test_p": _sign_test(only_ref, only_arm)}
    ref = summary.get(f"none-r{RATIO:g}")
    if ref:
        for s in summary.values():
            s["cut_F"] = 1 - s["F"]["mean"] / ref["F"]["mean"] if ref["F"]["mean"] else None
            s["cut_F_curve_mean"] = (
                1 - s["F_curve_mean"]["mean"] / ref["F_curve_mean"]["mean"] if ref["F_curve_mean"]["mean"] else None
            )
            s["task_cost"] = s["task_loss"]["mean"] / ref["task_loss"]["mean"] - 1
    return {
        "setting": {
            "steps": STEPS,
            "eval_steps": EVAL_STEPS,
            "held_out_steps": HELD_OUT_STEPS,
            "lr": LR,
            "batch": BATCH,
            "max_length": MAX_LENGTH,
            "ratio": RATIO,
            "beta": BETA,
            "seeds": SEEDS,
            "monitored_per_suite": MONITORED,
            "held_out_per_suite": HELD_OUT,
            "pool_per_suite": POOL,
            "suites": SUITES,
        },
        "base_task_loss": base["task_loss"],
        "arms": summary,
        "runs": runs,
    }


def _finals(name: str) -> list[dict]:
    """Each finished run of arm-ratio `name`: its seed and its held-out outcome at the last step."""
    out = []
    for done in sorted(DONE.glob(f"{name}-s*.json")):
        d = json.loads(done.read_text())
        out.append({"seed": d["seed"], "outcome": d["curve"][-1]["outcome"]})
    return out


def _sign_test(a: int, b: int) -> float | None:
    """Exact two-sided binomial p of a split a : b under 1/2 : 1/2 (McNemar's exact test)."""
    from math import comb

    n = a + b
    if n == 0:
        return None
    tail = sum(comb(n, i) for i in range(min(a, b) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def plot(result: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 4.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (name, s) in enumerate(sorted(result["arms"].items())):
        rs = [r for r in result["runs"].values() if f"{r['arm']}-r{r['ratio']:g}" == name]
        steps = [c["step"] for c in rs[0]["curve"]]
        f = np.array([[c["F"] for c in r["curve"]] for r in rs if len(r["curve"]) == len(steps)])
        color = colors[i % len(colors)]
        a.plot(steps, f.mean(0), color=color, label=f"{name} ({len(f)} seeds)")
        if len(f) > 1:
            a.fill_between(steps, f.min(0), f.max(0), color=color, alpha=0.15)
        b.errorbar(s["task_loss"]["mean"], s["F"]["mean"], xerr=s["task_loss"]["sd"] or 0, yerr=s["F"]["sd"] or 0,
                   fmt="o", color=color, label=name)
    a.set_xlabel("step"), a.set_ylabel("held-out F (1→0 of the base's right answers)"), a.legend(fontsize=7)
    a.set_title("held-out forgetting over training (line: mean; band: seeds' range)")
    # the base's loss (1.57) is far right of every arm's (1.16-1.21): named in the label, not drawn
    b.set_xlabel(f"held-out GSM8K loss at the end (lower is better; base {result['base_task_loss']:.4f})")
    b.set_ylabel("held-out F at the end"), b.legend(fontsize=7)
    b.set_title("forgetting against task loss (mean ± sd over seeds)")
    fig.tight_layout()
    fig.savefig(REPO / "benchmarks" / "results" / "replay_targets.png", dpi=110)


def _paired(s: dict, ref: str = "none") -> str:
    p = s.get(f"paired_vs_{ref}")
    if not p or p["sign_test_p"] is None:
        return ""
    return f"{p['forgotten_by_reference_only']} : {p['forgotten_by_arm_only']} (p {p['sign_test_p']:.2f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prepare", action="store_true")
    ap.add_argument("--run", action="store_true")
    ap.add_argument("--sweep", metavar="ARM", choices=ARMS, help="with --run: the sweep's ratios for this arm")
    ap.add_argument("--one", nargs=3, metavar=("ARM", "SEED", "RATIO"), help=argparse.SUPPRESS)
    ap.add_argument("--parallel", type=int, default=2)
    args = ap.parse_args()
    if args.one:
        one(args.one[0], int(args.one[1]), float(args.one[2]))
    elif args.prepare:
        prepare()
    elif args.run:
        jobs = [(arm, s, RATIO) for s in SEEDS for arm in ARMS]
        if args.sweep:
            jobs = [(args.sweep, s, r) for r in SWEEP for s in SEEDS]
        t0 = time.time()
        with ThreadPoolExecutor(args.parallel) as ex:
            list(ex.map(lambda j: run_one(*j), jobs))
        print(f"all runs: {(time.time() - t0) / 60:.1f} min", flush=True)
    else:
        result = analyse()
        (REPO / "benchmarks" / "results" / "replay_targets.json").write_text(json.dumps(result, indent=1))
        plot(result)
        print(
            "| arm | seeds | held-out F (headline) | held-out 0→1 | held-out GSM8K loss | task cost | F cut vs none | "
            "forgotten by none only : by the arm only (p) | by gold uniform only : by the arm only (p) | by none_stream only : "
            "by the arm only (p) | F over the run (steps 40-200; post hoc) | instructions lost (of the 8 followed at base) | "
            "minutes a run |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for name, s in sorted(result["arms"].items(), key=lambda kv: ARMS.index(kv[0].split("-r")[0])):
            sd = lambda x: f" ± {x['sd']:.3f}" if x["sd"] is not None else ""  # noqa: E731
            cut, cost = s.get("cut_F"), s.get("task_cost")
            print(
                f"| {name} | {len(s['seeds'])} | {s['F']['mean']:.3f}{sd(s['F'])} | {s['BT']['mean']:.3f}{sd(s['BT'])} | "
                f"{s['task_loss']['mean']:.4f}{sd(s['task_loss'])} | {'' if cost is None else f'{cost:+.1%}'} | "
                f"{'' if cut is None else f'{cut:+.0%}'} | {_paired(s)} | {_paired(s, 'gold_uniform')} | "
                f"{_paired(s, 'none_stream')} | {s['F_curve_mean']['mean']:.3f}{sd(s['F_curve_mean'])} "
                f"({s['cut_F_curve_mean']:+.0%}) | {s['behavior_F']['mean'] * 24:.1f} | "
                f"{s['minutes']['mean']:.0f} |"
            )
        for name, s in sorted(result["arms"].items()):
            print(f"{name:20s} seeds {s['seeds']}  held-out F {s['F']['mean']:.3f} ± {s['F']['sd'] or 0:.3f}"
                  f"  BT {s['BT']['mean']:.3f}  task loss {s['task_loss']['mean']:.4f} ± {s['task_loss']['sd'] or 0:.4f}"
                  f"  behaviour F {s['behavior_F']['mean']:.3f}  cut {s.get('cut_F')}  cost {s.get('task_cost')}")


if __name__ == "__main__":
    main()
