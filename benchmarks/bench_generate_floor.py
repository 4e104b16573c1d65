"""Generation at the token floor (issue 28): static batches against the refilling batch, on SmolLM2-135M-Instruct.

    OMP_NUM_THREADS=1 python benchmarks/bench_generate_floor.py --counts-only   # counts only: any machine, ~20 min
    OMP_NUM_THREADS=2 python benchmarks/bench_generate_floor.py --threads 2     # counts and timings: an idle machine
    python benchmarks/bench_generate_floor.py --quick --out /tmp/floor.json     # does it run (12 prompts)
    OMP_NUM_THREADS=2 python benchmarks/bench_generate_floor.py --threads 2 --continuous   # 3. only: an idle machine

1. Counts (not times, so they hold on a busy machine): the built-in `instructions` suite (105 prompts, chat template,
   256 new tokens) scored as the callback scores it, once with static batches (`HFEngine(refill=False)`: today's
   `model.generate` per batch of 16) and once with the refilling batch (the default). Per run: forwards, token slots
   decoded (each forward decodes one token per row it holds), the answers' tokens (`n_tokens`: up to the end of turn,
   not counting it), the useful share (answer tokens / slots decoded), prefill positions, and whether the answers are
   identical (text, token count, stopped, non-finite flag), every difference listed. Also the prompts' shared prefix
   (the chat template's system turn): the positions computing it once would save.
2. Timings (skipped with `--counts-only`): the 32 behaviour probes of RESULTS §11 (24 instruction prompts at 256
   tokens, 8 harmless requests at 48): static batches, the refilling batch, and one `model.generate` per probe, on the
   same prompts, with the answers compared; then the whole `instructions` suite, static against refilling.

3. `--continuous`: transformers' continuous batching (`ContinuousBatchingEngine`) against the refilling batch, single
   process, same prompts: the 32 behaviour probes twice each (interleaved: refill, continuous, refill, continuous),
   then the `instructions` suite once each; answers compared. Goes to generate_floor_continuous.json.

Figures go to benchmarks/results/generate_floor.json; benchmarks/RESULTS.md §14 summarises them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402
from bench_behavior import per_probe_loop  # noqa: E402

from forgetwatch.probes.probe_set import ProbeSet  # noqa: E402
from forgetwatch.probes.suites import load_suite  # noqa: E402
from forgetwatch.scoring.engines import ContinuousBatchingEngine, HFEngine  # noqa: E402
from forgetwatch.scoring.models import load_model  # noqa: E402
from forgetwatch.scoring.prompts import behavior_prompt  # noqa: E402
from forgetwatch.scoring.requests import encode  # noqa: E402
from forgetwatch.scoring.score import ScoringConfig, score_probes  # noqa: E402


class SlotCounter:
    """Forwards and decoded token slots: a forward decodes one token for each row of its batch (the prefill too)."""

    def __init__(self, model):
        self.forwards = self.slots = self.prefill_positions = 0
        self._handle = model.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None:
            return
        self.forwards += 1
        self.slots += ids.shape[0]
        if ids.shape[1] > 1:
            self.prefill_positions += ids.numel()

    def remove(self) -> dict:
        self._handle.remove()
        return {"forwards": self.forwards, "slots": self.slots, "prefill_positions": self.prefill_positions}


def run(model, tok, probes, config, refill: bool, engine=None) -> tuple[dict, object]:
    engine = engine or HFEngine(model, tok, batch_size=config.batch_size, refill=refill)
    counter = SlotCounter(model)
    t0 = time.perf_counter()
    res = score_probes(model, tok, probes, config, engine=engine)
    seconds = time.perf_counter() - t0
    counts = counter.remove()
    counts["answer_tokens"] = int(res.n_tokens.sum())
    counts["useful_share"] = counts["answer_tokens"] / counts["slots"]
    counts["seconds"] = seconds
    return counts, res


def compare(a, b, probes, names=("static", "refill")) -> dict:
    same = [x == y and n == m and s == t for x, y, n, m, s, t in
            zip(a.generation, b.generation, a.n_tokens, b.n_tokens, a.stopped, b.stopped, strict=True)]
    diffs = []
    for i, ok in enumerate(same):
        if not ok:
            x, y = a.generation[i], b.generation[i]
            at = next((j for j, (c, d) in enumerate(zip(x, y, strict=False)) if c != d), min(len(x), len(y)))
            diffs.append({"id": probes[i].id, "tokens": [int(a.n_tokens[i]), int(b.n_tokens[i])], "first_difference_at_char": at,
                          names[0]: x[max(0, at - 40) : at + 40], names[1]: y[max(0, at - 40) : at + 40]})
    return {"identical": int(sum(same)), "of": len(same), "differences": diffs}


def shared_prefix(tok, probes, config) -> dict:
    chat = config.uses_chat(tok, generative=True)
    ids = encode(tok, [behavior_prompt(p, tok, chat, config.system_prompt) for p in probes], chat)
    n = 0
    while all(len(x) > n and x[n] == ids[0][n] for x in ids):
        n += 1
    return {"shared_prefix_tokens": n, "prompt_tokens": sum(map(len, ids)), "prompts": len(ids),
            "mean_prompt_tokens": sum(map(len, ids)) / len(ids)}


def _suite(name: str, args) -> ProbeSet:
    return ProbeSet.from_jsonl(Path(args.probes_dir) / f"{name}.jsonl") if args.probes_dir else load_suite(name)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--counts-only", action="store_true", help="skip the timings (they need an idle machine)")
    ap.add_argument("--quick", action="store_true", help="a check that the script runs: 12 prompts, 6 + 2 timed")
    ap.add_argument("--continuous", action="store_true", help="only 3.: continuous batching against the refilling batch")
    ap.add_argument("--out", default=None)
    ap.add_argument("--probes-dir", default=None,
                    help="read the suites from DIR/instructions.jsonl and DIR/over_refusal.jsonl (`ProbeSet.to_jsonl`): for a "
                         "machine without the suites' data package")
    args = ap.parse_args()
    args.out = args.out or str(_common.RESULTS_DIR / f"generate_floor{'_continuous' if args.continuous else ''}.json")
    _common.set_threads(args.threads)
    model, tok = load_model("smollm2")
    model.eval()
    config = ScoringConfig()
    suite = _suite("instructions", args)
    if args.quick:
        suite = suite.subsample(12, seed=0)
    if args.continuous:
        return continuous(model, tok, config, suite, args)
    out: dict = {"model": "SmolLM2-135M-Instruct", "machine": _common.machine(), "threads": args.threads,
                 "max_new_tokens": config.behavior_max_new_tokens, "batch_size": config.batch_size,
                 "timed": not args.counts_only, "omp_num_threads": os.environ.get("OMP_NUM_THREADS")}

    # 1. counts on the instructions suite (seconds recorded, but they are timings only on an idle machine)
    static, res_static = run(model, tok, suite, config, refill=False)
    refill, res_refill = run(model, tok, suite, config, refill=True)
    out["instructions"] = {"probes": len(suite), "static": static, "refill": refill,
                           "answers": compare(res_static, res_refill, suite), **shared_prefix(tok, suite, config)}
    pre = out["instructions"]
    positions = refill["prefill_positions"] + refill["slots"]
    pre["shared_prefix_share_of_positions"] = pre["shared_prefix_tokens"] * pre["prompts"] / positions
    print(json.dumps(out["instructions"], indent=1))

    # 2. timings: the 32 probes of RESULTS §11, batched (static, refill) against one generate per probe
    if not args.counts_only:
        refusal = _suite("over_refusal", args)
        probes = suite.subsample(6 if args.quick else 24, seed=1) + refusal.subsample(2 if args.quick else 8, seed=1)
        t_static, r_static = run(model, tok, probes, config, refill=False)
        t_refill, r_refill = run(model, tok, probes, config, refill=True)
        t0 = time.perf_counter()
        loop = per_probe_loop(model, tok, list(probes), config.behavior_max_new_tokens)
        t_loop = time.perf_counter() - t0
        out["behaviour_32"] = {
            "static": t_static, "refill": t_refill, "loop_s": t_loop,
            "speedup_static": t_loop / t_static["seconds"], "speedup_refill": t_loop / t_refill["seconds"],
            "refill_identical_to_loop": sum(a == b for a, b in zip(r_refill.generation, loop, strict=True)),
            "static_identical_to_loop": sum(a == b for a, b in zip(r_static.generation, loop, strict=True)),
            "refill_vs_static": compare(r_static, r_refill, probes)}
        print(json.dumps(out["behaviour_32"], indent=1))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    print("written", args.out)


def continuous(model, tok, config, suite, args) -> None:
    """3.: the refilling batch against transformers' continuous batching, on the same prompts, one process."""
    refusal = _suite("over_refusal", args)
    probes = suite.subsample(6 if args.quick else 24, seed=1) + refusal.subsample(2 if args.quick else 8, seed=1)
    engines = {"refill": lambda: HFEngine(model, tok, batch_size=config.batch_size),
               "continuous": lambda: ContinuousBatchingEngine(model, tok, batch_size=config.batch_size)}
    out: dict = {"model": "SmolLM2-135M-Instruct", "machine": _common.machine(), "threads": args.threads,
                 "batch_size": config.batch_size, "omp_num_threads": os.environ.get("OMP_NUM_THREADS")}
    for name, ps, rounds in (("behaviour_32", probes, 2), ("instructions", suite, 1)):
        seconds: dict[str, list[float]] = {k: [] for k in engines}
        results = {}
        for _ in range(rounds):
            for k, make in engines.items():
                t0 = time.perf_counter()
                results[k] = score_probes(model, tok, ps, config, engine=make())
                seconds[k].append(time.perf_counter() - t0)
        out[name] = {"probes": len(ps), "seconds": seconds,
                     "continuous_over_refill": sum(seconds["continuous"]) / sum(seconds["refill"]),
                     "answer_tokens": int(results["refill"].n_tokens.sum()),
                     "answers": compare(results["refill"], results["continuous"], ps, ("refill", "continuous"))}
        print(name, json.dumps(out[name], indent=1), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    print("written", args.out)


if __name__ == "__main__":
    main()
