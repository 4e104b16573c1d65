"""The SFT demo's in-loop cost (issue 28): what share of `trainer.train()` probing takes, and how an evaluation
splits between the knowledge and the behaviour probes.

    python benchmarks/bench_demo_share.py                      # the demo as `make demo` runs it (2 threads), ~6 min
    python benchmarks/bench_demo_share.py --engine continuous  # generation through transformers' continuous batching
    python benchmarks/bench_demo_share.py --static             # generation in static batches (before issue 28)
    python benchmarks/bench_demo_share.py --max-steps 10       # does it run

Runs recipes/sft.py in this process on recipes/SmolLM2-135M-Instruct/sft/config_demo.yaml (W&B off, the output in
outputs/bench_demo_share/), with the scoring modes wrapped by timers: per evaluation, the seconds spent in the
knowledge modes (log-likelihood, letters, short answers) and in behaviour generation, beside the callback's own
`seconds` (the whole evaluation: scoring, figures, record) and `train()`'s runtime. Timings: run it alone on the
machine. Figures go to benchmarks/results/demo_share[_<engine>].json; RESULTS §14 summarises them.
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "2")  # as `make demo`
os.environ["WANDB_MODE"] = "disabled"

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "recipes/SmolLM2-135M-Instruct/sft/config_demo.yaml"
KNOWLEDGE_MODES = ("score_loglik", "score_letter", "score_greedy_match", "score_generate")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", default="hf", choices=("hf", "continuous"))
    ap.add_argument("--static", action="store_true",
                    help="the HF engine's static `model.generate` batches (HFEngine(refill=False)), as before issue 28")
    ap.add_argument("--max-steps", type=int, default=None, help="fewer steps: a check that it runs")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    label = "static" if args.static else args.engine
    out_dir = ROOT / "outputs" / "bench_demo_share" / label
    if args.static:
        if args.engine != "hf":
            ap.error("--static is the HF engine's")
        from forgetwatch.scoring.engines import hf

        init = hf.HFEngine.__init__

        def static_init(self, *a, **kw):
            init(self, *a, **{**kw, "refill": False})

        hf.HFEngine.__init__ = static_init

    from forgetwatch.scoring.score import modes

    spans: list[tuple[str, float, float]] = []  # (kind, start, seconds)

    def timed(name: str, fn):
        kind = "behavior" if name == "score_behavior" else "knowledge"

        def wrapper(*a, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                spans.append((kind, t0, time.perf_counter() - t0))

        return wrapper

    for name in (*KNOWLEDGE_MODES, "score_behavior"):
        setattr(modes, name, timed(name, getattr(modes, name)))

    argv = [str(ROOT / "recipes/sft.py"), "--config", str(CONFIG), "--output_dir", str(out_dir), "--report_to", "none",
            "--forgetwatch_engine", args.engine]
    if args.max_steps:
        argv += ["--max_steps", str(args.max_steps)]
    machine = _common.machine()
    sys.argv = argv
    sys.path.insert(0, str(ROOT / "recipes"))
    if out_dir.exists():
        import shutil

        shutil.rmtree(out_dir)
    t0 = time.perf_counter()
    runpy.run_path(argv[0], run_name="__main__")
    wall = time.perf_counter() - t0

    record = out_dir / "forgetwatch"
    metrics = [json.loads(line) for line in (record / "metrics.jsonl").read_text().splitlines() if line.strip()]
    trainer_log = [json.loads(line) for line in (record / "trainer_log.jsonl").read_text().splitlines() if line.strip()]
    runtime = next(r["train_runtime"] for r in reversed(trainer_log) if "train_runtime" in r)
    # spans belong to the evaluation they fall in: evaluations run one after another, in step order
    evals = []
    per_eval: list[dict] = []
    for row in metrics:
        per_eval.append({"step": row["step"], "seconds": row.get("seconds")})
    # group the spans into evaluations by gaps (an evaluation's modes run back to back)
    groups: list[list[tuple[str, float, float]]] = []
    for kind, s, d in sorted(spans, key=lambda x: x[1]):
        if groups and s - (groups[-1][-1][1] + groups[-1][-1][2]) < 5.0:
            groups[-1].append((kind, s, d))
        else:
            groups.append([(kind, s, d)])
    for e, g in zip(per_eval, groups, strict=False):
        e["knowledge_s"] = round(sum(d for k, _, d in g if k == "knowledge"), 2)
        e["behavior_s"] = round(sum(d for k, _, d in g if k == "behavior"), 2)
        evals.append(e)
    for e, g in zip(per_eval, groups, strict=False):
        e["scoring_wall_s"] = round(g[-1][1] + g[-1][2] - g[0][1], 2)
    # the base is scored at the start of train() (its row says 0 s: no figures to compute); later rows' seconds hold
    # scoring, figures and the record
    in_loop = sum(max(e["seconds"] or 0, e.get("scoring_wall_s", 0)) for e in per_eval)
    out = {"engine": args.engine, "generation": "static batches" if args.static else "refilling batch" if args.engine == "hf"
           else "continuous batching", "machine": machine, "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
           "config": str(CONFIG.relative_to(ROOT)), "max_steps": args.max_steps, "train_runtime_s": runtime,
           "wall_s": wall, "evaluations": evals, "in_loop_s": in_loop, "in_loop_share": in_loop / runtime,
           "forgetting_step_last": metrics[-1]["metrics"]["all_knowledge"].get("forgetting")
           if "all_knowledge" in metrics[-1]["metrics"] else None}
    print(json.dumps(out, indent=1))
    path = Path(args.out) if args.out else _common.RESULTS_DIR / f"demo_share_{label}.json"
    if not args.max_steps or args.out:
        path.write_text(json.dumps(out, indent=1) + "\n")
        print("written", path)


if __name__ == "__main__":
    main()
