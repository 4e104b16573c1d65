"""The callback's reporting path at scale: 100,000 probes x 50 evaluations with synthetic results, no model.

    python benchmarks/bench_scale.py                       # 100k probes, 50 evaluations, replay off and on (~1-2 min)
    python benchmarks/bench_scale.py --probes 10000 --evals 10

Each evaluation goes through `Monitor.report` exactly as in training (after `on_train_begin` has opened the record
against the base): `compute_report` (overall + per category, chance adjustment), `RunRecord.write_eval`
(evals/step-N.npz), `append_metrics` (metrics.jsonl), the flips since the previous evaluation (`flips` +
`append_flips`) and, with `replay=True`, the replay file. No logging backend is attached (their cost is theirs).

Synthetic data: 80% multiple-choice probes (k = 2..5) and 20% short-answer probes in 20 categories; the base model
is right on 50%; at each evaluation `--flip-rate` of the probes change correctness, slightly biased towards
forgetting. Per evaluation: wall time (target < 50 ms) and where it goes; peak memory (tracemalloc, in a separate
pass because tracing slows Python down) and the process's peak RSS; the record's size on disk.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import resource
import shutil
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402
import numpy as np  # noqa: E402

import forgetwatch.run.monitor as cb_module  # noqa: E402
from forgetwatch import ForgetWatchCallback  # noqa: E402
from forgetwatch.probes.probe_set import Probe, ProbeSet  # noqa: E402
from forgetwatch.record.replay import ReplayTracker  # noqa: E402
from forgetwatch.record.store import RunRecord  # noqa: E402
from forgetwatch.run.monitor import Monitor  # noqa: E402
from forgetwatch.scoring.results import ProbeResults  # noqa: E402


def synthetic_probes(n: int, rng: np.random.Generator) -> ProbeSet:
    cats = [f"category_{c:02d}" for c in range(20)]
    probes = []
    for i in range(n):
        cat = cats[i % 20]
        q = f"Synthetic question number {i} about {cat}: which of these statements is the right one, all things considered?"
        if i % 5 == 4:
            probes.append(Probe(f"s/{i}", "short", q, answers=(f"answer {i}", f"alias {i}"), category=cat, source="synthetic"))
        else:
            k = 2 + i % 4
            probes.append(Probe(f"m/{i}", "mcq", q, tuple(f"option {j} of question {i}" for j in range(k)),
                                gold=int(rng.integers(k)), category=cat, source="synthetic"))
    return ProbeSet(probes, origin="synthetic")


def results_from(probes: ProbeSet, correct: np.ndarray, rng: np.random.Generator) -> ProbeResults:
    n = len(probes)
    res = ProbeResults.empty(probes.ids)
    res.outcome = np.where(correct, 1, 0).astype(np.int8)
    k = np.array([p.num_choices for p in probes])
    gold = np.array([p.gold if p.gold is not None else -1 for p in probes])
    wrong = (gold + 1) % np.maximum(k, 1)
    res.pred_index = np.where(k > 0, np.where(correct, gold, wrong), -1).astype(np.int32)
    res.margin = np.where(correct, 1.0, -1.0).astype(np.float32) * rng.random(n, dtype=np.float32)
    res.gold_logprob = -rng.random(n, dtype=np.float32) * 5
    res.prediction = [p.choices[j] if p.kind == "mcq" else (p.answers[0] if c else "something else")
                      for p, j, c in zip(probes, res.pred_index.tolist(), correct.tolist(), strict=True)]
    return res


def make_stream(probes: ProbeSet, evals: int, flip_rate: float, seed: int):
    """The base results and `evals` successive results (correctness drifting with `flip_rate`)."""
    rng = np.random.default_rng(seed)
    n = len(probes)
    correct = rng.random(n) < 0.5
    base = results_from(probes, correct, rng)
    stream = []
    for _ in range(evals):
        flip = rng.random(n) < flip_rate
        # a bit more 1->0 than 0->1: the run forgets
        flip &= np.where(correct, True, rng.random(n) < 0.8)
        correct = correct ^ flip
        stream.append(results_from(probes, correct, rng))
    return base, stream


class Timers:
    """Wraps the steps of `Monitor.report` with timers (seconds summed per step name)."""

    def __init__(self, monitor: Monitor):
        self.t: dict[str, float] = {}
        rec = monitor.record
        for name in ("write_eval", "append_metrics", "append_flips", "write_replay"):
            setattr(rec, name, self._wrap(name, getattr(rec, name)))
        monitor.flips = self._wrap("flips (rows)", monitor.flips)
        monitor.tracker.update = self._wrap("replay tracker update", monitor.tracker.update)
        self._orig_report = cb_module.compute_report
        cb_module.compute_report = self._wrap("compute_report", cb_module.compute_report)

    def _wrap(self, name, fn):
        def timed(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self.t[name] = self.t.get(name, 0.0) + time.perf_counter() - t0
        return timed

    def restore(self) -> None:
        cb_module.compute_report = self._orig_report


def new_callback(probes, base, root: Path, replay: bool) -> Monitor:
    cb = ForgetWatchCallback(probes=probes, eval_steps=50, replay=replay).monitor
    cb.base, cb.record, cb.loggers = base, RunRecord(root), []
    cb.tracker = ReplayTracker(probes, base.outcome)  # what on_train_begin sets up
    root.mkdir(parents=True, exist_ok=True)
    probes.to_jsonl(root / "probes.jsonl")
    return cb


def run(probes, base, stream, root: Path, replay: bool, trace: bool = False, profile: bool = False) -> dict:
    shutil.rmtree(root, ignore_errors=True)
    cb = new_callback(probes, base, root, replay)
    timers = None if (trace or profile) else Timers(cb)
    prof = cProfile.Profile() if profile else None
    if trace:
        tracemalloc.start()
    per_eval = []
    cb.report(base, step=0, epoch=0.0, seconds=0.0)  # step 0: the base, as on_train_begin does
    for e, res in enumerate(stream, start=1):
        t0 = time.perf_counter()
        if prof:
            prof.enable()
        cb.report(res, step=50 * e, epoch=e / len(stream), seconds=1.0)
        if prof:
            prof.disable()
        per_eval.append(time.perf_counter() - t0)
    out = {
        "replay": replay,
        "ms_per_eval_mean": 1000 * float(np.mean(per_eval)),
        "ms_per_eval_median": 1000 * float(np.median(per_eval)),
        "ms_first_5": [round(1000 * x, 1) for x in per_eval[:5]],
        "ms_last_5": [round(1000 * x, 1) for x in per_eval[-5:]],
        "ms_max": 1000 * float(np.max(per_eval)),
        "record_bytes": {p.name: sum(f.stat().st_size for f in ([p] if p.is_file() else p.rglob("*"))) for p in root.iterdir()},
        "flip_rows_per_eval": sum(1 for _ in open(root / "flips.jsonl")) / len(stream) if (root / "flips.jsonl").exists() else 0,
    }
    out["record_bytes_total"] = sum(out["record_bytes"].values())
    if timers:
        timers.restore()
        out["ms_per_eval_by_step"] = {
            k: round(1000 * v / len(stream), 2) for k, v in sorted(timers.t.items(), key=lambda kv: -kv[1])
        }
    if trace:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        out["tracemalloc_peak_mb"] = peak / 2**20
    if prof:
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(25)
        out["profile"] = s.getvalue()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--probes", type=int, default=100_000)
    ap.add_argument("--evals", type=int, default=50)
    ap.add_argument("--flip-rate", type=float, default=0.03)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dir", default=None, help="where to write the record (default: a temp dir on the working disk)")
    ap.add_argument("--out", default="bench_scale")
    args = ap.parse_args()

    t0 = time.perf_counter()
    rng = np.random.default_rng(args.seed)
    probes = synthetic_probes(args.probes, rng)
    base, stream = make_stream(probes, args.evals, args.flip_rate, args.seed + 1)
    setup_s = time.perf_counter() - t0
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    parent = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="fw-scale-", dir=Path(__file__).resolve().parent))
    info = {
        "command": "python benchmarks/bench_scale.py " + " ".join(sys.argv[1:]),
        "machine": _common.machine(),
        "probes": len(probes), "evals": args.evals, "flip_rate": args.flip_rate,
        "setup_seconds (synthetic probes + results, ProbeSet fingerprint)": round(setup_s, 1),
        "peak_rss_mb_after_setup": rss_before,
        "runs": {},
    }
    try:
        for replay in (False, True):
            r = run(probes, base, stream, parent / f"replay-{replay}", replay)
            info["runs"][f"replay={replay}"] = r
            print(
                f"replay={replay}: {r['ms_per_eval_mean']:.1f} ms/eval (median {r['ms_per_eval_median']:.1f}, max "
                f"{r['ms_max']:.1f}); first {r['ms_first_5']} last {r['ms_last_5']}; record "
                f"{r['record_bytes_total'] / 2**20:.1f} MB "
                f"{r['record_bytes']}; flip rows/eval {r['flip_rows_per_eval']:.0f}\n  by step (ms/eval): "
                f"{r['ms_per_eval_by_step']}",
                flush=True,
            )
        info["peak_rss_mb_end"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        for replay in (False, True):
            tr = run(probes, base, stream, parent / f"trace-{replay}", replay, trace=True)
            info["runs"][f"replay={replay}"]["tracemalloc_peak_mb"] = tr["tracemalloc_peak_mb"]
            print(
                f"replay={replay}: tracemalloc peak during the {args.evals} evaluations {tr['tracemalloc_peak_mb']:.1f} MB",
                flush=True,
            )
        prof = run(probes, base, stream[:10], parent / "profile", True, profile=True)
        info["profile_replay_on_10_evals"] = prof["profile"]
        print(prof["profile"])
    finally:
        if not args.dir:
            shutil.rmtree(parent, ignore_errors=True)
    print("saved", _common.save(args.out, info))


if __name__ == "__main__":
    main()
