"""Peak memory of scoring one multiple-choice probe with many options (issue 63: memory bounded by the input).

    python benchmarks/bench_options_memory.py            # 50, 200, 800, 2,000 options; eager and sdpa (~2 min)

Each measurement is a fresh child process (the tiny Llama of the tests, fp32, CPU, one thread) that scores one probe of
N options in `loglik` mode and reports its peak resident memory (`ru_maxrss`) and the scoring time. "one row": every
option packed behind the question in one row, as before the split (`PACK_TOKENS` set past the probe's length); "split":
rows of at most `PACK_TOKENS` option tokens (the default). The baseline (the model, torch) is the 50-option figure.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHILD = """
import json, resource, sys, time
sys.path.insert(0, {tests!r})
import forgetwatch.scoring.engines.hf as hf
from conftest import build_model, build_tokenizer
from scoring.test_scoring import _many_options
from forgetwatch.scoring.score import ScoringConfig, score_probes
n, attn, whole = {n}, {attn!r}, {whole}
if whole:
    hf.PACK_TOKENS = 10**9
tok = build_tokenizer()
model = build_model(tok, attn=attn, context=16384)
t0 = time.perf_counter()
score_probes(model, tok, [_many_options(n)], ScoringConfig(mcq_mode="loglik"))
print(json.dumps({{"peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
                  "seconds": round(time.perf_counter() - t0, 2)}}))
"""


def measure(n: int, attn: str, whole: bool) -> dict:
    code = CHILD.format(tests=str(ROOT / "tests"), n=n, attn=attn, whole=whole)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900,
                          env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1][:120]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    print("options  attention  one row (peak MB, s)   split (peak MB, s)")
    for attn in ("eager", "sdpa"):
        for n in (50, 200, 800, 2000):
            one, split = measure(n, attn, True), measure(n, attn, False)
            show = lambda r: r.get("error") or f"{r['peak_mb']:>6} MB {r['seconds']:>6.2f} s"  # noqa: E731
            print(f"{n:>7}  {attn:>9}  {show(one):>20}   {show(split):>20}", flush=True)


if __name__ == "__main__":
    main()
