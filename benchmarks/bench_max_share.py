"""Probing within a time budget (issue 46): the SFT demo with `forgetwatch_max_share: 0.2` against the same run without
it, and a 10,000-probe set at a share of 0.1.

    python benchmarks/bench_max_share.py --run full --seed 0      # the demo config (rewind off, W&B off), every probe
    python benchmarks/bench_max_share.py --run partial --seed 0   # the same with forgetwatch_max_share 0.2
    python benchmarks/bench_max_share.py                          # the analysis of the runs made: results/max_share.json
    python benchmarks/bench_max_share.py --scale --evaluations 6  # 10,000 knowledge probes at 0.1 (see below)

Each run is recipes/sft.py in this process on recipes/SmolLM2-135M-Instruct/sft/config_demo.yaml, output in
outputs/bench_max_share/<run>-s<seed>/. The callback's hooks (train begin: the base; each step's end: evaluations;
train end) are timed: the in-loop probing is their sum, and its share is over `train()`'s runtime, as in RESULTS §14.
Run the timed runs alone on the machine.

The analysis compares each partial run with the full run of its seed (training is the same: the callback does not
change it): the exact passes (npz and figures), the full run's F inside the partial estimate's 90% sampling interval
at the partial steps (overall and every group), the mean absolute error of F, and the early warning kept: of the
full run's flips at the partial steps (the exact passes see every flip), the share the partial run's record shows at or
before the evaluation where the full run saw them (the probe's state there equal to the full run's).

`--scale`: every probe of arc_easy, arc_challenge, openbookqa, commonsense_qa, sciq, piqa and nq_open, and triviaqa up
to 10,000 (5,428 multiple choice, 4,572 short answers; outputs/bench_max_share/probes_10k.jsonl, made by `--scale` when
absent), on the demo's model and training, every 10 steps with max_share 0.1 and
`max_steps` 3000 (so the run is long enough for a budget to be worth sizing). The base comes from a cache made first
(`forgetwatch cache`, timed apart); the run stops after `--evaluations` partial evaluations (a full pass of 10,000
probes at the last step would take as long as the cache did): what each evaluation scores, its seconds, the share it
kept, and K, the most evaluations a probe waits.
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import shutil
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "2")  # as `make demo`
os.environ["WANDB_MODE"] = "disabled"

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "recipes/SmolLM2-135M-Instruct/sft/config_demo.yaml"
OUT = ROOT / "outputs" / "bench_max_share"
SHARE, SCALE_SHARE = 0.2, 0.1
Z90 = 1.6448536269514722


class _Stop(Exception):
    pass


def _timed_hooks(spans: list[float], stop_after: int | None = None):
    """Time the callback's hooks (all its work in `train()`); with `stop_after`, end the process's training after that
    many partial evaluations (a `_Stop` out of the hook: the record holds what was committed)."""
    from forgetwatch.run.callback import ForgetWatchCallback

    for name in ("on_train_begin", "on_step_end", "on_train_end"):
        original = getattr(ForgetWatchCallback, name)

        def timed(self, *a, _original=original, **kw):
            t0 = time.perf_counter()
            try:
                return _original(self, *a, **kw)
            finally:
                spans.append(time.perf_counter() - t0)
                record = self._record_root
                if stop_after and record is not None and (record / "metrics.jsonl").is_file():
                    partial = sum('"partial": {' in line for line in (record / "metrics.jsonl").read_text().splitlines())
                    if partial >= stop_after:
                        raise _Stop

        setattr(ForgetWatchCallback, name, timed)


def run(mode: str, seed: int, extra: list[str], out_dir: Path, stop_after: int | None = None) -> dict:
    spans: list[float] = []
    _timed_hooks(spans, stop_after)
    argv = [str(ROOT / "recipes/sft.py"), "--config", str(CONFIG), "--output_dir", str(out_dir), "--report_to", "none",
            "--seed", str(seed), "--forgetwatch_rewind", "false", *extra]
    if out_dir.exists():
        shutil.rmtree(out_dir)
    sys.argv = argv
    sys.path.insert(0, str(ROOT / "recipes"))
    t0 = time.perf_counter()
    stopped = False
    try:
        runpy.run_path(argv[0], run_name="__main__")
    except _Stop:
        stopped = True
    wall = time.perf_counter() - t0
    record = out_dir / "forgetwatch"
    log = [json.loads(line) for line in (record / "trainer_log.jsonl").read_text().splitlines() if line.strip()]
    runtime = next((r["train_runtime"] for r in reversed(log) if "train_runtime" in r), None)
    timing = {"mode": mode, "seed": seed, "extra": extra, "machine": _common.machine(),
              "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "train_runtime_s": runtime, "wall_s": wall,
              "in_loop_s": sum(spans), "in_loop_share": sum(spans) / runtime if runtime else None,
              "stopped_after_partial": stopped and stop_after}
    (out_dir / "timing.json").write_text(json.dumps(timing, indent=1) + "\n")
    print(json.dumps(timing, indent=1))
    return timing


def _lines(out: Path) -> dict[int, dict]:
    return {r["step"]: r for r in (json.loads(x) for x in (out / "forgetwatch/metrics.jsonl").read_text().splitlines())}


def analyse() -> dict:
    import numpy as np

    from forgetwatch.record.store import load_record

    seeds = sorted(int(p.name.split("-s")[1]) for p in OUT.glob("partial-s*") if (p / "timing.json").is_file())
    out = {"share": SHARE, "seeds": {}, "groups_inside": 0, "groups_total": 0, "overall_inside": 0, "overall_total": 0}
    errors, flips_total, flips_seen = [], 0, 0
    for seed in seeds:
        full, part = OUT / f"full-s{seed}", OUT / f"partial-s{seed}"
        if not (full / "forgetwatch/metrics.jsonl").is_file():
            continue
        a, b = load_record(full), load_record(part)
        ids = [json.loads(x)["id"] for x in (full / "forgetwatch/probes.jsonl").read_text().splitlines()]
        la, lb = _lines(full), _lines(part)
        row: dict = {"timing_full": _timing(full), "timing_partial": _timing(part), "exact_steps": [], "partial_steps": []}
        for step, line in sorted(lb.items()):
            if "partial" not in line:  # an exact pass: the same files and figures as the full run's
                za, zb = a.read_eval(step), b.read_eval(step)
                same = all(np.array_equal(za[k], zb[k], equal_nan=True) for k in ("outcome", "margin", "option_scores"))
                figs = {g: {k: v for k, v in r.items() if k not in ("partial", "share_scored", "probe_share")}
                        for g, r in line["metrics"].items()}
                row["exact_steps"].append({"step": step, "npz_identical": same,
                                           "figures_identical": json.dumps(figs, sort_keys=True) ==
                                           json.dumps(la[step]["metrics"], sort_keys=True)})
                continue
            per = {"step": step, "scored": line["partial"]["scored"], "n": line["partial"]["n"],
                   "k": line["partial"]["k"], "kinds": line["partial"]["kinds"], "groups": {}}
            for group, r in line["metrics"].items():
                if "forgetting_sampling_low" not in r:
                    continue
                truth = la[step]["metrics"][group]["forgetting"]
                inside = r["forgetting_sampling_low"] - 1e-12 <= truth <= r["forgetting_sampling_high"] + 1e-12
                per["groups"][group] = {"full_F": truth, "estimate": r["forgetting"], "se": r["forgetting_se"],
                                        "low": r["forgetting_sampling_low"], "high": r["forgetting_sampling_high"],
                                        "inside": inside}
                out["groups_total"] += 1
                out["groups_inside"] += inside
                if group == "overall":
                    out["overall_total"] += 1
                    out["overall_inside"] += inside
                    errors.append(abs(r["forgetting"] - truth))
            row["partial_steps"].append(per)
        # early warning: each flip of the full run (against its previous evaluation), seen by the partial run at or
        # before that evaluation when the partial record's state of the probe there is the full run's
        index = {pid: i for i, pid in enumerate(ids)}
        seen = total = seen10 = total10 = 0
        partial_steps = {s for s, line in lb.items() if "partial" in line}  # the exact passes see every flip
        for flip in a.read_flips():
            if flip["direction"] not in ("1→0", "0→1") or flip["step"] not in partial_steps:
                continue
            step, i = flip["step"], index[flip["id"]]
            state = b.read_results(step, ids).outcome[i] == 1
            truth = a.read_results(step, ids).outcome[i] == 1
            total += 1
            seen += bool(state == truth)
            if flip["direction"] == "1→0":
                total10 += 1
                seen10 += bool(state == truth)
        row["flips"] = {"total": total, "seen_in_time": seen, "forgotten_total": total10, "forgotten_seen_in_time": seen10}
        flips_total += total
        flips_seen += seen
        out["seeds"][seed] = row
    out["overall_mae"] = float(np.mean(errors)) if errors else None
    out["overall_max_error"] = float(np.max(errors)) if errors else None
    out["flips_seen_in_time"] = flips_seen / flips_total if flips_total else None
    path = _common.RESULTS_DIR / "max_share.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: v for k, v in out.items() if k != "seeds"}, indent=1))
    for seed, row in out["seeds"].items():
        tf, tp = row["timing_full"] or {}, row["timing_partial"] or {}
        print(f"seed {seed}: share full {tf.get('in_loop_share')}, partial {tp.get('in_loop_share')}; exact "
              f"{[(e['step'], e['npz_identical'], e['figures_identical']) for e in row['exact_steps']]}; flips "
              f"{row['flips']}")
        for p in row["partial_steps"]:
            o = p["groups"].get("overall", {})
            print(f"  step {p['step']}: scored {p['scored']}/{p['n']} (k {p['k']}), F full {o.get('full_F'):.4f} "
                  f"est {o.get('estimate'):.4f} [{o.get('low'):.4f}, {o.get('high'):.4f}]")
    print("written", path)
    return out


def _timing(out: Path) -> dict | None:
    path = out / "timing.json"
    return json.loads(path.read_text()) if path.is_file() else None


SCALE_SUITES = ("arc_easy", "arc_challenge", "openbookqa", "commonsense_qa", "sciq", "piqa", "nq_open")


def scale_probes(path: Path) -> None:
    """Every probe of SCALE_SUITES, then triviaqa up to 10,000 (a seeded draw)."""
    from forgetwatch.probes.probe_set import ProbeSet
    from forgetwatch.probes.suites import load_suite

    probes = [p for name in SCALE_SUITES for p in load_suite(name, n=None, seed=0)]
    probes += list(load_suite("triviaqa", n=10_000 - len(probes), seed=0))
    path.parent.mkdir(parents=True, exist_ok=True)
    ProbeSet(probes, origin="10k").to_jsonl(path)


def scale(evaluations: int) -> None:
    probes, cache = OUT / "probes_10k.jsonl", OUT / "base_10k.parquet"
    if not probes.is_file():
        scale_probes(probes)
    if not cache.is_file():
        raise SystemExit(f"make the base cache first: forgetwatch cache --model smollm2 --probes {probes} -o {cache}")
    extra = ["--forgetwatch_probes", str(probes), "--forgetwatch_base_cache", str(cache),
             "--forgetwatch_max_share", str(SCALE_SHARE), "--max_steps", "3000", "--forgetwatch_replay", "false",
             # no behaviour probes here: the demo's budget names their group; the cache's scoring key (`forgetwatch
             # cache`'s defaults) has the default behaviour budget
             "--forgetwatch_budget", "forgetting_adjusted=0.05", "--forgetwatch_behavior_max_new_tokens", "256"]
    out_dir = OUT / "scale-10k"
    timing = run("scale", 0, extra, out_dir, stop_after=evaluations)
    lines = _lines(out_dir)
    rows = []
    for step, line in sorted(lines.items()):
        if step == 0:
            continue
        share = line.get("share", {})
        rows.append({"step": step, "seconds": line["seconds"], "partial": line.get("partial"),
                     "train_s": share.get("train_s"), "probe_s": share.get("probe_s"),
                     "measured_share": share.get("measured_share"), "F": line["metrics"]["overall"]["forgetting"],
                     "F_se": line["metrics"]["overall"].get("forgetting_se")})
        p = line.get("partial") or {}
        print(f"step {step}: {p.get('scored')} of {p.get('n')} scored ({p.get('kinds', {}).get('knowledge')}), "
              f"{line['seconds']:.1f} s, k {p.get('k')}, share so far {share.get('measured_share')}")
    result = {"timing": timing, "evaluations": rows, "share": SCALE_SHARE}
    path = _common.RESULTS_DIR / "max_share_scale.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print("written", path)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run", choices=("full", "partial"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scale", action="store_true")
    ap.add_argument("--evaluations", type=int, default=6, help="--scale: stop after this many partial evaluations")
    args = ap.parse_args()
    if args.scale:
        scale(args.evaluations)
    elif args.run:
        extra = ["--forgetwatch_max_share", str(SHARE)] if args.run == "partial" else []
        run(args.run, args.seed, extra, OUT / f"{args.run}-s{args.seed}")
    else:
        analyse()


if __name__ == "__main__":
    main()
