"""Behaviour probes on SmolLM2-135M-Instruct: base compliance, agreement with the reference checker, and cost.

    OMP_NUM_THREADS=2 python benchmarks/bench_behavior.py            # ~45 min on 2 cores
    OMP_NUM_THREADS=2 python benchmarks/bench_behavior.py --quick    # 24 prompts, 1 sample each, 8 probes timed

1. Base compliance: the built-in `instructions` suite (105 prompts) and `over_refusal` set (32 requests) scored as
   the callback scores them (batched greedy decoding, chat template, 256 new tokens; 48 for the harmless requests):
   prompt-level strict and loose compliance per instruction group, runaway rate, answer length, refusals.
2. Agreement with the reference checker: the verdicts of `forgetwatch.answers.instructions` (if-verifiable's copy of IFEval's
   checkers) against lm-evaluation-harness's own copy of Google's IFEval code (`lm_eval.tasks.ifeval`), on the base's
   greedy answers and on `--samples` sampled answers per prompt (temperature 1.0, seeded), prompt and instruction
   level, strict and loose.
3. Cost: forgetwatch's batched greedy decoding against one `model.generate` per probe on the same prompts (the
   answers must be identical), seconds per behaviour probe.

Figures go to benchmarks/results/behavior.json; benchmarks/RESULTS.md §11 summarises them. `--parts compliance` or
`--parts cost` runs one part (the cost is a timing: run it with nothing else on the machine).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from forgetwatch.answers.instructions import check_instructions  # noqa: E402
from forgetwatch.probes.suites import load_suite  # noqa: E402
from forgetwatch.scoring.judge import REFUSAL_WINDOW  # noqa: E402
from forgetwatch.scoring.models import load_model  # noqa: E402
from forgetwatch.scoring.prompts import behavior_prompt  # noqa: E402
from forgetwatch.scoring.score import ScoringConfig, score_probes  # noqa: E402


def reference_verdicts(probe, answer: str) -> tuple[list[bool], list[bool]]:
    """lm-eval's IFEval code (Google's, vendored): per-instruction strict and loose verdicts."""
    from lm_eval.tasks.ifeval.utils import (
        InputExample,
        test_instruction_following_loose,
        test_instruction_following_strict,
    )

    inp = InputExample(key=0, instruction_id_list=list(probe.instructions), prompt=probe.question,
                       kwargs=[dict(k) for k in probe.kwargs])
    strict = test_instruction_following_strict(inp, answer).follow_instruction_list
    loose = test_instruction_following_loose(inp, answer).follow_instruction_list
    return list(strict), list(loose)


def sampled_answers(model, tok, probes, n: int, max_new_tokens: int, seed: int) -> list[tuple[int, str]]:
    out = []
    torch.manual_seed(seed)
    eos = tok.eos_token_id
    with torch.inference_mode():
        for i, p in enumerate(probes):
            ids = torch.tensor([tok(behavior_prompt(p, tok, True, None), add_special_tokens=False)["input_ids"]])
            gen = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
                                 max_new_tokens=max_new_tokens, num_return_sequences=n, pad_token_id=eos, eos_token_id=eos)
            for row in gen[:, ids.shape[1]:].tolist():
                end = row.index(eos) if eos in row else len(row)
                out.append((i, tok.decode(row[:end], skip_special_tokens=True)))
    return out


def per_probe_loop(model, tok, probes, max_new_tokens: int) -> list[str]:
    eos = tok.eos_token_id
    texts = []
    with torch.inference_mode():
        for p in probes:
            ids = torch.tensor([tok(behavior_prompt(p, tok, True, None), add_special_tokens=False)["input_ids"]])
            budget = max_new_tokens if p.kind == "instruct" else min(REFUSAL_WINDOW, max_new_tokens)
            row = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=budget,
                                 pad_token_id=eos, eos_token_id=eos)[0, ids.shape[1]:].tolist()
            end = row.index(eos) if eos in row else len(row)
            texts.append(tok.decode(row[:end], skip_special_tokens=True))
    return texts


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--samples", type=int, default=2, help="sampled answers per prompt for the agreement check")
    ap.add_argument("--timed", type=int, default=24, help="instruction probes in the cost comparison")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--parts", default="compliance,cost",
                    help="compliance (parts 1 and 2: base compliance, agreement) and/or cost (part 3, timed: run it alone)")
    ap.add_argument("--out", default=str(_common.RESULTS_DIR / "behavior.json"))
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    logging.getLogger("absl").setLevel(logging.ERROR)
    _common.set_threads(args.threads)
    n_inst = 24 if args.quick else None
    samples = 1 if args.quick else args.samples
    timed = 8 if args.quick else args.timed

    model, tok = load_model("smollm2")
    model.eval()
    instruct = load_suite("instructions", n=n_inst)
    refusal = load_suite("over_refusal")
    config = ScoringConfig()
    result: dict = json.loads(Path(args.out).read_text()) if Path(args.out).is_file() else {}
    result.update({"model": "SmolLM2-135M-Instruct", "max_new_tokens": config.behavior_max_new_tokens})
    if "compliance" in parts:
        compliance(model, tok, instruct, refusal, config, samples, result)
    if "cost" in parts:
        result["machine_cost"] = _common.machine()
        cost(model, tok, instruct, refusal, config, timed, result)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    print("written", args.out)


def compliance(model, tok, instruct, refusal, config, samples: int, result: dict) -> None:
    result["machine_compliance"] = _common.machine()
    # 1. base compliance
    t0 = time.perf_counter()
    res = score_probes(model, tok, instruct + refusal, config)
    result["seconds_base_scoring"] = time.perf_counter() - t0
    n_i = len(instruct)
    groups: dict[str, list[int]] = defaultdict(list)
    for i, p in enumerate(instruct):
        groups[p.category].append(i)
    per_group = {}
    for g, idx in sorted(groups.items()):
        loose = [json.loads(res.detail[i])["loose"] for i in idx]
        per_group[g] = {"n": len(idx), "strict": float(np.mean(res.outcome[idx] == 1)), "loose": float(np.mean(loose)),
                        "runaway": float(np.mean(res.stopped[idx] == 0)), "median_tokens": float(np.median(res.n_tokens[idx]))}
    idx = list(range(n_i))
    per_group["all"] = {"n": n_i, "strict": float(np.mean(res.outcome[idx] == 1)),
                        "loose": float(np.mean([json.loads(res.detail[i])["loose"] for i in idx])),
                        "runaway": float(np.mean(res.stopped[idx] == 0)), "median_tokens": float(np.median(res.n_tokens[idx]))}
    ref_idx = list(range(n_i, len(res)))
    refused = [res.generation[i][:80] for i in ref_idx if res.outcome[i] != 1]
    result["base_compliance"] = per_group
    result["over_refusal"] = {"n": len(ref_idx), "refused": len(refused), "examples": refused[:5]}
    print(json.dumps(per_group, indent=1), json.dumps(result["over_refusal"], indent=1))

    # 2. agreement with the reference checker
    answers = [(i, res.generation[i]) for i in range(n_i)]
    t0 = time.perf_counter()
    answers += sampled_answers(model, tok, list(instruct), samples, config.behavior_max_new_tokens, seed=0)
    result["seconds_sampling"] = time.perf_counter() - t0
    agree = defaultdict(list)
    disagreements = []
    for i, text in answers:
        p = instruct[i]
        ours = check_instructions(text, p.instructions, p.kwargs, p.question)
        ref_s, ref_l = reference_verdicts(p, text)
        agree["prompt_strict"].append(ours.strict == all(ref_s))
        agree["prompt_loose"].append(ours.loose == all(ref_l))
        agree["instruction_strict"] += [a == b for a, b in zip(ours.strict_each, ref_s, strict=True)]
        agree["instruction_loose"] += [a == b for a, b in zip(ours.loose_each, ref_l, strict=True)]
        if ours.strict != all(ref_s) or ours.loose != all(ref_l):
            disagreements.append({"id": p.id, "instructions": list(p.instructions), "ours": [ours.strict, ours.loose],
                                  "reference": [all(ref_s), all(ref_l)], "answer": text[:300]})
    result["agreement"] = {k: {"n": len(v), "agree": int(sum(v)), "rate": float(np.mean(v))} for k, v in agree.items()}
    result["agreement"]["generations"] = len(answers)
    result["disagreements"] = disagreements
    print(json.dumps(result["agreement"], indent=1))



def cost(model, tok, instruct, refusal, config, timed: int, result: dict) -> None:
    # 3. cost: batched vs one generate per probe (identical answers)
    probes = instruct.subsample(timed, seed=1) + refusal.subsample(max(timed // 3, 1), seed=1)
    t0 = time.perf_counter()
    batched = score_probes(model, tok, probes, config)
    t_batched = time.perf_counter() - t0
    t0 = time.perf_counter()
    loop = per_probe_loop(model, tok, list(probes), config.behavior_max_new_tokens)
    t_loop = time.perf_counter() - t0
    same = sum(a == b for a, b in zip(batched.generation, loop, strict=True))
    result["cost"] = {"probes": len(probes), "batched_s": t_batched, "loop_s": t_loop, "speedup": t_loop / t_batched,
                      "batched_s_per_probe": t_batched / len(probes), "loop_s_per_probe": t_loop / len(probes),
                      "identical_answers": same, "generated_tokens": int(batched.n_tokens.sum())}
    print(json.dumps(result["cost"], indent=1))


if __name__ == "__main__":
    main()
