"""Generative short-answer scoring (TriviaQA probes, chat template, greedy, 32 new tokens) on SmolLM2-135M-Instruct:
forgetwatch's batched greedy decoding vs a loop of one `model.generate` per probe.

    OMP_NUM_THREADS=1 python benchmarks/bench_generate.py              # 160 probes, ~3 min
    OMP_NUM_THREADS=1 python benchmarks/bench_generate.py --n 32 --chunks 2

Both sides use the same prompt (`forgetwatch.scoring.prompts.generation_prompt` with the chat template), the same greedy
`GenerationConfig` (EOS ids of the tokenizer and the model, pad id) and the same answer checking. The probes are split
into chunks; each chunk is run by both sides in alternating order. "Useful" tokens are the tokens each probe generates
up to and including its EOS (from the per-probe loop, whose sequences have no padding); tokens/s divides those by each
side's time. The batched side also computes positions for rows that have already finished (it steps until the
longest answer of the batch ends): that is counted separately, as "decoded positions".
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from forgetwatch import answers  # noqa: E402
from forgetwatch.probes.suites import load_suite  # noqa: E402
from forgetwatch.scoring.models import load_model  # noqa: E402
from forgetwatch.scoring.prompts import generation_prompt  # noqa: E402
from forgetwatch.scoring.score import ScoringConfig, score_probes  # noqa: E402


def per_probe_loop(model, tok, probes, gen_config):
    """One unbatched `generate` per probe; returns (texts, useful new tokens per probe)."""
    texts, useful = [], []
    eos = set(gen_config.eos_token_id or [])
    with torch.inference_mode():
        for p in probes:
            ids = tok(generation_prompt(p, tok, True, False, None), add_special_tokens=False)["input_ids"]
            x = torch.tensor([ids])
            out = model.generate(input_ids=x, attention_mask=torch.ones_like(x), generation_config=gen_config)
            new = out[0, len(ids) :].tolist()
            n = next((i + 1 for i, t in enumerate(new) if t in eos), len(new))
            useful.append(n)
            texts.append(tok.decode(new, skip_special_tokens=True))
    return texts, useful


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=160)
    ap.add_argument("--chunks", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="bench_generate")
    args = ap.parse_args()
    _common.set_threads(args.threads)
    from transformers import GenerationConfig

    machine = _common.machine()
    model, tok = load_model("smollm2")
    probes = list(load_suite("triviaqa", n=args.n, seed=args.seed))
    config = ScoringConfig(batch_size=args.batch_size)
    assert config.uses_chat(tok, generative=True), "the tokenizer should have a chat template"
    # the same GenerationConfig forgetwatch builds for chat prompts (no stop strings: the end-of-turn token is EOS)
    eos = [t for t in (tok.eos_token_id, getattr(model.generation_config, "eos_token_id", None)) if t is not None]
    eos_ids = sorted({int(x) for t in eos for x in (t if isinstance(t, (list, tuple)) else [t])})
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    gen_config = GenerationConfig(max_new_tokens=config.new_tokens, do_sample=False, num_beams=1, pad_token_id=pad_id,
                                  eos_token_id=eos_ids)
    counter = _common.ForwardCounter(model, pad_ids=())
    sides = ["forgetwatch", "loop"]
    seconds = dict.fromkeys(sides, 0.0)
    calls = {s: {"calls": 0, "positions": 0} for s in sides}
    fw_gen, fw_out, loop_gen, useful = [None] * len(probes), [None] * len(probes), [None] * len(probes), [0] * len(probes)
    per_chunk = []
    for ci, idx in enumerate(np.array_split(np.arange(len(probes)), args.chunks)):
        sub = [probes[i] for i in idx]
        row = {}
        for side in sides if ci % 2 == 0 else sides[::-1]:
            counter.reset()
            t0 = time.perf_counter()
            if side == "forgetwatch":
                res = score_probes(model, tok, sub, config)
                for k, i in enumerate(idx):
                    fw_gen[i], fw_out[i] = res.generation[k], int(res.outcome[k])
            else:
                texts, n_new = per_probe_loop(model, tok, sub, gen_config)
                for k, i in enumerate(idx):
                    loop_gen[i], useful[i] = texts[k], n_new[k]
            dt = time.perf_counter() - t0
            seconds[side] += dt
            row[side] = round(dt, 2)
            calls[side]["calls"] += counter.calls
            calls[side]["positions"] += counter.positions
        per_chunk.append(row)
        print(
            f"  chunk {ci + 1}/{args.chunks} ({len(idx)} probes): forgetwatch {row['forgetwatch']:.1f}s  loop {row['loop']:.1f}s",
            flush=True,
        )

    # the loop's answers judged like forgetwatch judges them
    def judge(text, p):
        pred = answers.extract_short_answer(text, cot=False)
        if pred is None:
            return -1
        return int(answers.is_correct_short(pred, p.answers, p.numeric, match=config.short_match))

    loop_out = [judge(t, p) for t, p in zip(loop_gen, probes, strict=True)]
    total_useful = sum(useful)
    out = {
        "command": "python benchmarks/bench_generate.py " + " ".join(sys.argv[1:]),
        "machine": machine,
        "n": len(probes),
        "max_new_tokens": config.new_tokens,
        "batch_size": args.batch_size,
        "seconds": {k: round(v, 2) for k, v in seconds.items()},
        "useful_new_tokens": total_useful,
        "mean_new_tokens_per_probe": total_useful / len(probes),
        "probes_hitting_max_new_tokens": sum(u >= config.new_tokens for u in useful),
        "tokens_per_s": {s: total_useful / seconds[s] for s in sides},
        "probes_per_s": {s: len(probes) / seconds[s] for s in sides},
        "loop/forgetwatch": seconds["loop"] / seconds["forgetwatch"],
        "per_chunk_ratio": [round(r["loop"] / r["forgetwatch"], 2) for r in per_chunk],
        "forward_calls": calls,
        "identical_generations": sum(a == b for a, b in zip(fw_gen, loop_gen, strict=True)),
        "identical_outcomes": sum(a == b for a, b in zip(fw_out, loop_out, strict=True)),
        "accuracy_forgetwatch": float(np.mean([o == 1 for o in fw_out])),
        "differing_generations": [{"id": probes[i].id, "forgetwatch": fw_gen[i], "loop": loop_gen[i]}
                                  for i in range(len(probes)) if fw_gen[i] != loop_gen[i]][:10],
    }
    out["machine"]["loadavg_at_end"] = [round(x, 2) for x in __import__("os").getloadavg()]
    print(f"tokens/s forgetwatch {out['tokens_per_s']['forgetwatch']:.1f}  loop {out['tokens_per_s']['loop']:.1f}  "
          f"loop/forgetwatch {out['loop/forgetwatch']:.2f}  identical generations {out['identical_generations']}/{len(probes)}  "
          f"outcomes {out['identical_outcomes']}/{len(probes)}")
    print("saved", _common.save(args.out, out))


if __name__ == "__main__":
    main()
