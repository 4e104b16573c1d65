"""Peak resident memory added by ForgetWatchCallback during training: the SFT demo run in child processes with and
without the callback; each child's peak RSS is compared.

    OMP_NUM_THREADS=1 python benchmarks/bench_memory.py          # ~6 min

Children (same data, model, settings as benchmarks/bench_training.py; 4 optimizer steps; report_to none):
    without         no callback
    with-100        the demo's probes (arc_easy,sciq,mmlu,triviaqa x 25), eval_steps 4: the base is scored before
                    the first step, then the model at step 4, when gradients and Adam states exist
    with-400        the callback's default of 100 probes per suite (400 probes), eval_steps 4
Memory does not depend on the machine's load, but the children run one after the other anyway. Inside each child
with the callback, the peak during each scoring call (base and evaluation) is also measured apart from the peak
outside scoring (training), from the kernel's high-water mark, reset around each call.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402

HERE = Path(__file__).resolve().parent


def _vm(field: str) -> float:
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


class PeakSplitter:
    """Peak RSS during the callback's scoring vs outside it, in one process: the kernel's high-water mark (VmHWM) is
    read and reset (/proc/self/clear_refs = 5) around every scoring call (base scoring and each evaluation)."""

    def __init__(self):
        self.outside = 0.0
        self.scoring: list[dict] = []

    def _reset(self) -> None:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")

    def wrap(self, fn, name):
        def wrapped(*a, **k):
            self.outside = max(self.outside, _vm("VmHWM"))
            rss0 = _vm("VmRSS")
            self._reset()
            try:
                return fn(*a, **k)
            finally:
                peak = _vm("VmHWM")
                self.scoring.append({"what": name, "rss_before_mb": rss0, "peak_during_mb": peak, "added_mb": peak - rss0})
                self._reset()
        return wrapped

    def instrument(self, fw) -> None:
        fw.on_train_begin = self.wrap(fw.on_train_begin, "base scoring (on_train_begin)")
        fw._evaluate = self.wrap(fw._evaluate, "evaluation")

    def finish(self) -> dict:
        self.outside = max(self.outside, _vm("VmHWM"))
        return {"peak_outside_scoring_mb": self.outside, "scoring": self.scoring}


def child(variant: str, steps: int) -> None:
    import tempfile

    import bench_training

    _common.set_threads(1)
    os.environ.setdefault("WANDB_MODE", "disabled")
    cfg = bench_training.demo_settings()
    args = argparse.Namespace(max_steps=steps, eval_steps=steps, per_suite=400 // 4 if variant == "with-400" else None)
    with tempfile.TemporaryDirectory(prefix="fw-mem-", dir=HERE) as tmp:
        splitter = PeakSplitter()
        r = bench_training.run_once(cfg, args, variant != "without", Path(tmp), instrument=splitter.instrument)
    r = {k: v for k, v in r.items() if not k.startswith("_")}
    r.update(splitter.finish())
    r["ru_maxrss_mb_self"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("RESULT " + json.dumps(r), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", default="bench_memory")
    args = ap.parse_args()
    if args.child:
        child(args.child, args.steps)
        return
    info = {
        "command": "python benchmarks/bench_memory.py " + " ".join(sys.argv[1:]),
        "machine": _common.machine(),
        "children": {},
    }
    for variant in ("without", "with-100", "with-400"):
        proc = subprocess.Popen([sys.executable, __file__, "--child", variant, "--steps", str(args.steps)],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        out = proc.stdout.read()
        _, status, usage = os.wait4(proc.pid, 0)
        line = next((x for x in out.splitlines() if x.startswith("RESULT ")), None)
        if status != 0 or line is None:
            raise SystemExit(f"child {variant} failed (status {status}):\n{out[-2000:]}")
        r = json.loads(line[len("RESULT "):])
        # Resetting the high-water mark (clear_refs) also resets what ru_maxrss reports, so with the splitter the
        # process peak is the larger of the peak outside scoring and the peaks during scoring.
        r["ru_maxrss_mb_wait4"] = usage.ru_maxrss / 1024
        r["peak_rss_mb"] = max([r["peak_outside_scoring_mb"]] + [x["peak_during_mb"] for x in r["scoring"]])
        info["children"][variant] = r
        print(f"{variant}: peak RSS {r['peak_rss_mb']:.0f} MB  (wall {r['wall_seconds']:.0f}s); peak outside scoring "
              f"{r['peak_outside_scoring_mb']:.0f} MB; scoring: " + ", ".join(
                  f"{x['what']} {x['rss_before_mb']:.0f} -> {x['peak_during_mb']:.0f} MB" for x in r["scoring"]), flush=True)
    base = info["children"]["without"]["peak_rss_mb"]
    info["added_mb"] = {v: c["peak_rss_mb"] - base for v, c in info["children"].items() if v != "without"}
    info["added_pct"] = {v: 100 * (c["peak_rss_mb"] / base - 1) for v, c in info["children"].items() if v != "without"}
    print("added by the callback (MB):", {k: round(v) for k, v in info["added_mb"].items()})
    print("saved", _common.save(args.out, info))


if __name__ == "__main__":
    main()
