"""Multiple-choice log-likelihood scoring on SmolLM2-135M-Instruct: forgetwatch vs a naive loop, lm-evaluation-harness
and the compute floor, on MMLU (long questions) and ARC-Easy (short).

    OMP_NUM_THREADS=1 python benchmarks/bench_mcq.py                # 500 questions per suite (~40 min on 2 shared cores)
    OMP_NUM_THREADS=1 python benchmarks/bench_mcq.py --n 48 --naive-n 8 --chunks 3   # a quick run (~2 min)

Sides, all on the same in-memory fp32 model, one thread, the same prompts (`forgetwatch.scoring.prompts.loglik_request`:
context "Question: {q}\\nAnswer:", continuations " {choice}"):

    forgetwatch  score_probes(mcq_mode="loglik", batch_size=16): every option packed behind its question in one row
    lm-eval      lm_eval 0.4.13 HFLM(pretrained=model, tokenizer=tok, batch_size=16).loglikelihood(...): one request
                 per (question, option), as its multiple-choice tasks send them
    floor        one bare forward over each question's tokens once and each option's tokens once (question + options
                 concatenated in one row, no block mask), logits_to_keep=1, length-sorted batches of 16, left padding;
                 pre-tokenised, so it is the model's compute alone
    floor+head   the floor plus what log-likelihood scoring cannot avoid: the vocabulary projection and fp32
                 log-softmax at one position per option token (on gathered hidden states)
    naive        one unbatched forward per (question, option), full logits, measured on an evenly spaced subset of
                 `--naive-n` questions and extrapolated per question

The questions are sorted by length (question + options) and split into `--chunks` chunks of whole batches of 16
(so each side batches exactly as it would over all N at once); each chunk is scored by every side, in an order that
rotates from chunk to chunk, so a change of machine load hits every side alike. Ratios are computed from the summed
times. Predictions (argmax of summed log-likelihood, exact ties to the lowest index) of forgetwatch and lm-eval are
compared question by question; a disagreement is reported with both sides' gaps between the two options involved.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402  (sets OMP_NUM_THREADS before torch is imported)
import numpy as np  # noqa: E402
import torch  # noqa: E402

from forgetwatch.probes.suites import load_suite  # noqa: E402
from forgetwatch.scoring.models import load_model  # noqa: E402
from forgetwatch.scoring.prompts import loglik_request  # noqa: E402
from forgetwatch.scoring.score import ScoringConfig, score_probes  # noqa: E402


def tokenize(tok, probes):
    """Per question: (context ids, [option ids]) split like lm-evaluation-harness (and forgetwatch)."""
    out = []
    for p in probes:
        ctx, conts = loglik_request(p, tok, False, None)
        c = tok(ctx)["input_ids"]
        opts = []
        for o in conts:
            whole = tok(ctx + o)["input_ids"]
            assert whole[: len(c)] == c, "context tokens changed when an option was appended"
            opts.append(whole[len(c) :])
        out.append((c, opts))
    return out


def run_forgetwatch(model, tok, probes, batch_size):
    res = score_probes(model, tok, probes, ScoringConfig(mcq_mode="loglik", batch_size=batch_size))
    return res.pred_index.astype(int).tolist(), res.gold_logprob.astype(float).tolist(), res.margin.astype(float).tolist()


def lm_eval_requests(tok, probes):
    from lm_eval.api.instance import Instance

    reqs, owner = [], []
    for qi, p in enumerate(probes):
        ctx, conts = loglik_request(p, tok, False, None)
        for j, cont in enumerate(conts):
            reqs.append(Instance(request_type="loglikelihood", doc={"q": qi}, arguments=(ctx, cont), idx=j))
            owner.append((qi, j))
    return reqs, owner


def run_lm_eval(lm, tok, probes):
    reqs, owner = lm_eval_requests(tok, probes)  # building the request objects is part of the harness's cost
    out = lm.loglikelihood(reqs, disable_tqdm=True)
    scores = [np.zeros(len(p.choices)) for p in probes]
    for (qi, j), (ll, _greedy) in zip(owner, out, strict=True):
        scores[qi][j] = ll
    return scores


@torch.inference_mode()
def run_floor(model, rows, pad_id, batch_size, option_tokens=None):
    """rows: pre-tokenised question + options, concatenated; sorted longest first, left-padded, logits_to_keep=1.

    With `option_tokens` (per row, how many of its last tokens are options): "floor+head", the same forward plus the
    work log-likelihood scoring cannot avoid: the vocabulary projection and fp32 log-softmax at the positions that
    predict an option token (one per option token), on the decoder's hidden states gathered at those positions.
    """
    order = sorted(range(len(rows)), key=lambda i: len(rows[i]), reverse=True)
    for s in range(0, len(order), batch_size):
        batch = [rows[i] for i in order[s : s + batch_size]]
        T = len(batch[0])
        ids = torch.full((len(batch), T), pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), T), dtype=torch.long)
        for b, r in enumerate(batch):
            ids[b, T - len(r) :] = torch.tensor(r)
            mask[b, T - len(r) :] = 1
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        if option_tokens is None:
            model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False, logits_to_keep=1)
            continue
        hidden = model.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False).last_hidden_state
        rb, rp = [], []
        for b, i in enumerate(order[s : s + batch_size]):
            n = option_tokens[i]
            rb += [b] * n
            rp += list(range(T - n - 1, T - 1))  # the positions whose next token is an option token
        logits = model.lm_head(hidden[torch.tensor(rb), torch.tensor(rp)])
        torch.log_softmax(logits.float(), dim=-1)


@torch.inference_mode()
def run_naive(model, tok, probes):
    """One unbatched forward per (question, option), tokenised on the fly, full logits, log-softmax, gather."""
    preds = []
    for p in probes:
        ctx, conts = loglik_request(p, tok, False, None)
        c = tok(ctx)["input_ids"]
        scores = []
        for o in conts:
            whole = tok(ctx + o)["input_ids"]
            n = len(whole) - len(c)
            logits = model(input_ids=torch.tensor([whole[:-1]])).logits[0]
            lp = torch.log_softmax(logits.float(), -1)[len(c) - 1 :]
            scores.append(float(lp[torch.arange(n), torch.tensor(whole[len(c) :])].sum()))
        preds.append(int(np.argmax(scores)))
    return preds


def bench_suite(name, args, model, tok, lm, counter, pad_id):
    probes = list(load_suite(name, n=args.n, seed=args.seed))
    n = len(probes)
    toks = tokenize(tok, probes)
    for c, opts in toks:  # the token counter treats 0 (lm-eval's padding) and pad_id as padding: they must not occur
        assert not {0, pad_id} & set(c + [t for o in opts for t in o])
    floor_rows = [c + [t for o in opts for t in o] for c, opts in toks]
    # Chunks are contiguous runs of whole batches of the length-sorted questions, so every side batches exactly as it
    # would over all N questions at once (chunking a random order would leave ~30% padding in MMLU batches of 16).
    order = sorted(range(n), key=lambda i: len(floor_rows[i]), reverse=True)
    batches = [order[s : s + args.batch_size] for s in range(0, n, args.batch_size)]
    chunks = [np.array([i for k in part for i in batches[k]]) for part in np.array_split(np.arange(len(batches)), args.chunks)]
    naive_every = max(1, n // max(args.naive_n, 1)) if args.naive_n else 0
    naive_idx = set(order[::naive_every][: args.naive_n]) if naive_every else set()  # evenly spread over lengths

    sides = ["forgetwatch", "lm-eval", "floor", "floor+head", "naive"]
    option_tokens = [sum(map(len, opts)) for _, opts in toks]
    seconds = dict.fromkeys(sides, 0.0)
    tokens = {s: {"calls": 0, "positions": 0, "real": 0, "logit_positions": 0} for s in sides}
    per_chunk = []
    fw_pred, fw_gold, fw_margin, lm_scores, naive_pred = [None] * n, [None] * n, [None] * n, [None] * n, {}
    t_start = time.perf_counter()
    for ci, idx in enumerate(chunks):
        sub = [probes[i] for i in idx]
        naive_sub = [i for i in idx if i in naive_idx]
        side_order = sides[ci % len(sides) :] + sides[: ci % len(sides)]
        row = {}
        for side in side_order:
            counter.reset()
            t0 = time.perf_counter()
            if side == "forgetwatch":
                pr, gl, mg = run_forgetwatch(model, tok, sub, args.batch_size)
                for k, i in enumerate(idx):
                    fw_pred[i], fw_gold[i], fw_margin[i] = pr[k], gl[k], mg[k]
            elif side == "lm-eval":
                sc = run_lm_eval(lm, tok, sub)
                for k, i in enumerate(idx):
                    lm_scores[i] = sc[k]
            elif side == "floor":
                run_floor(model, [floor_rows[i] for i in idx], pad_id, args.batch_size)
            elif side == "floor+head":
                run_floor(model, [floor_rows[i] for i in idx], pad_id, args.batch_size, [option_tokens[i] for i in idx])
            elif naive_sub:
                for i, pr in zip(naive_sub, run_naive(model, tok, [probes[i] for i in naive_sub]), strict=True):
                    naive_pred[i] = pr
            dt = time.perf_counter() - t0
            seconds[side] += dt
            row[side] = round(dt, 3)
            for k, v in counter.snapshot().items():
                tokens[side][k] += v
        per_chunk.append(row)
        print(
            f"  {name} chunk {ci + 1}/{len(chunks)} ({len(idx)} q): " + "  ".join(f"{s} {row[s]:.1f}s" for s in sides), flush=True
        )

    # predictions: forgetwatch vs lm-eval (argmax of summed log-likelihood, ties to the lowest index)
    lm_pred = [int(np.argmax(s)) for s in lm_scores]
    disagree = []
    for i in range(n):
        if fw_pred[i] != lm_pred[i]:
            s = lm_scores[i]
            disagree.append({
                "id": probes[i].id, "forgetwatch": fw_pred[i], "lm_eval": lm_pred[i],
                "lm_eval_gap": float(s[lm_pred[i]] - s[fw_pred[i]]),
                "forgetwatch_margin_vs_gold": fw_margin[i],
            })
    gold_diff = np.array([abs(fw_gold[i] - lm_scores[i][probes[i].gold]) for i in range(n)])
    gold_rel = gold_diff / np.maximum(1.0, np.abs([lm_scores[i][probes[i].gold] for i in range(n)]))
    lm_gaps = np.array([np.sort(s)[-1] - np.sort(s)[-2] for s in lm_scores])
    naive_agree = sum(naive_pred[i] == fw_pred[i] for i in naive_pred)

    nq_naive = len(naive_pred)
    naive_per_q = seconds["naive"] / nq_naive if nq_naive else float("nan")
    naive_extrap = naive_per_q * n
    subset_len = np.mean([len(floor_rows[i]) for i in naive_pred]) if nq_naive else float("nan")
    out = {
        "suite": name,
        "n": n,
        "options": sum(len(p.choices) for p in probes),
        "chunks": len(chunks),
        "seconds": {k: round(v, 2) for k, v in seconds.items()},
        "naive_questions_measured": nq_naive,
        "naive_seconds_extrapolated": round(naive_extrap, 1),
        # the subset's questions are not exactly of average length: the same extrapolation per token (question + options)
        "naive_seconds_extrapolated_by_tokens": round(
            seconds["naive"] * sum(map(len, floor_rows)) / max(1, sum(len(floor_rows[i]) for i in naive_pred)), 1
        ),
        "naive_subset_mean_tokens": round(float(subset_len), 1),
        "all_mean_tokens": round(float(np.mean([len(r) for r in floor_rows])), 1),
        "questions_per_s": {
            "forgetwatch": n / seconds["forgetwatch"],
            "lm-eval": n / seconds["lm-eval"],
            "floor": n / seconds["floor"],
            "floor+head": n / seconds["floor+head"],
            "naive": (1 / naive_per_q) if nq_naive else None,
        },
        "tokens": tokens,
        "tokens_needed": sum(map(len, floor_rows)),
        "ratios": {
            "forgetwatch/floor": seconds["forgetwatch"] / seconds["floor"],
            "floor+head/floor": seconds["floor+head"] / seconds["floor"],
            "forgetwatch/floor+head": seconds["forgetwatch"] / seconds["floor+head"],
            "lm-eval/forgetwatch": seconds["lm-eval"] / seconds["forgetwatch"],
            "naive/forgetwatch": naive_extrap / seconds["forgetwatch"],
            "naive/forgetwatch (per-token extrapolation)": seconds["naive"]
            * sum(map(len, floor_rows))
            / max(1, sum(len(floor_rows[i]) for i in naive_pred))
            / seconds["forgetwatch"],
        },
        "per_chunk_ratios": {
            "forgetwatch/floor": [round(r["forgetwatch"] / r["floor"], 3) for r in per_chunk],
            "forgetwatch/floor+head": [round(r["forgetwatch"] / r["floor+head"], 3) for r in per_chunk],
            "lm-eval/forgetwatch": [round(r["lm-eval"] / r["forgetwatch"], 3) for r in per_chunk],
        },
        "predictions": {
            "disagreements_forgetwatch_vs_lm_eval": len(disagree),
            "details": disagree,
            "max_abs_diff_gold_loglik": float(gold_diff.max()),
            "max_rel_diff_gold_loglik": float(gold_rel.max()),
            "min_lm_eval_top2_gap": float(lm_gaps.min()),
            "questions_with_top2_gap_below_1e-5": int((lm_gaps < 1e-5).sum()),
            "accuracy_forgetwatch": float(np.mean([fw_pred[i] == probes[i].gold for i in range(n)])),
            "accuracy_lm_eval": float(np.mean([lm_pred[i] == probes[i].gold for i in range(n)])),
            "naive_agrees_with_forgetwatch": f"{naive_agree}/{nq_naive}",
        },
        "wall_seconds": round(time.perf_counter() - t_start, 1),
        "per_chunk_seconds": per_chunk,
    }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=500, help="questions per suite")
    ap.add_argument("--naive-n", type=int, default=60, help="questions per suite for the naive loop (extrapolated)")
    ap.add_argument("--suites", default="mmlu,arc_easy")
    ap.add_argument("--chunks", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="bench_mcq")
    args = ap.parse_args()

    _common.set_threads(args.threads)
    from lm_eval.models.huggingface import HFLM

    model, tok = load_model("smollm2")
    lm = HFLM(pretrained=model, tokenizer=tok, batch_size=args.batch_size)
    # Tokenisation must agree: forgetwatch encodes plain prompts with add_special_tokens=True; lm-eval with the
    # tokenizer's default unless add_bos_token is set. SmolLM2's tokenizer adds no BOS either way.
    probe_text = "Question: Which gas do plants absorb?\nAnswer:"
    assert lm.tok_encode(probe_text) == tok(probe_text, add_special_tokens=True)["input_ids"]
    bos_added = tok(probe_text, add_special_tokens=True)["input_ids"] != tok(probe_text, add_special_tokens=False)["input_ids"]
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    counter = _common.ForwardCounter(model, pad_ids=(0, pad_id))
    info = {
        "command": "python benchmarks/bench_mcq.py " + " ".join(sys.argv[1:]),
        "machine": _common.machine(),
        "model": f"SmolLM2-135M-Instruct (fp32, attn={model.config._attn_implementation})",
        "tokenizer_adds_bos": bos_added,
        "lm_eval_add_bos_token": lm.add_bos_token,
        "args": vars(args),
        "suites": [],
    }
    for name in args.suites.split(","):
        print(f"{name}: {args.n} questions, {args.chunks} chunks", flush=True)
        r = bench_suite(name, args, model, tok, lm, counter, pad_id)
        info["suites"].append(r)
        q, rt, pr = r["questions_per_s"], r["ratios"], r["predictions"]
        print(
            f"{name}: q/s forgetwatch {q['forgetwatch']:.2f}  lm-eval {q['lm-eval']:.2f}  floor {q['floor']:.2f}  "
            f"naive {q['naive']:.2f}\n  forgetwatch/floor {rt['forgetwatch/floor']:.3f}  forgetwatch/floor+head "
            f"{rt['forgetwatch/floor+head']:.3f}  lm-eval/forgetwatch "
            f"{rt['lm-eval/forgetwatch']:.2f}  naive/forgetwatch {rt['naive/forgetwatch']:.2f}  disagreements "
            f"{pr['disagreements_forgetwatch_vs_lm_eval']}  max |d gold loglik| {pr['max_abs_diff_gold_loglik']:.2e}",
            flush=True,
        )
    info["machine"]["loadavg_at_end"] = [round(x, 2) for x in __import__("os").getloadavg()]
    print("saved", _common.save(args.out, info))


if __name__ == "__main__":
    main()
