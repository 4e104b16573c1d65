"""Scoring under several processes: probes split across ranks, results gathered, logged once, equal to 1 process.

`plan_shard` is tested in-process. The rest runs tests/ddp_train.py under `torchrun --nproc_per_node 2`
(DDP on CPU, gloo) and compares what the 2-process run recorded with scoring in this process.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest
import torch
from conftest import build_model, build_tokenizer
from ddp_train import EVAL_STEPS, SCORING, make_probes
from fixtures.multiproc import (
    REPO,
    SCRIPT,
    TIMEOUT,
    assert_same,
    assert_split,
    case_output,
    check_ok,
    clean_env,
    torchrun,
    torchrun_cases,
    trace,
)
from fixtures.remedies import check_penalty_run

from forgetwatch.probes.probe_set import Probe
from forgetwatch.record.cache import BaseCache, make_cache_key
from forgetwatch.run.distributed import plan_shard, score_distributed, world
from forgetwatch.scoring.models import model_identity
from forgetwatch.scoring.score import ScoringConfig, describe_precision, score_probes

CONFIG = ScoringConfig()  # what ForgetWatchCallback(probes, eval_steps=...) scores with


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def base_results():
    """The freshly built base model scored in this process (the single-process reference)."""
    tokenizer = build_tokenizer()
    model = build_model(tokenizer)
    return score_probes(model, tokenizer, make_probes(), CONFIG), model, tokenizer


# -- plan_shard, no processes ------------------------------------------------------------------------------


def _probes(kinds: str) -> list[Probe]:
    """'m' a multiple-choice probe (k cycling 2..5), 's' a short-answer probe, in the given order."""
    out = []
    for i, c in enumerate(kinds):
        if c == "m":
            k = 2 + i % 4
            out.append(Probe(f"p{i}", "mcq", f"q{i}?", tuple(f"o{j}" for j in range(k)), gold=i % k))
        else:
            out.append(Probe(f"p{i}", "short", f"q{i}?", answers=(str(i),)))
    return out


SHARD_CASES = {
    "mixed-odd": ("mmsmmmsmmsm", 2),  # 8 mcq + 3 short on 2 ranks: both kinds padded
    "mixed-3-ranks": ("m" * 7 + "s" * 5, 3),
    "even": ("msms", 2),  # no padding at all
    "fewer-than-ranks": ("ms", 4),  # ranks 1..3 have no mcq, ranks 1..3 no short either
    "one-probe": ("m", 3),
    "no-short": ("m" * 5, 2),
    "no-mcq": ("s" * 5, 4),
    "one-rank": ("mmsms", 1),
}


@pytest.mark.parametrize("kinds,world_size", list(SHARD_CASES.values()), ids=list(SHARD_CASES))
def test_plan_shard_covers_every_probe_once_with_equal_shapes(kinds, world_size):
    probes = _probes(kinds)
    shards = [plan_shard(probes, CONFIG, r, world_size) for r in range(world_size)]

    # every probe is in exactly one rank's real part
    real = Counter(p.id for shard, n in shards for p in shard[:n])
    assert real == Counter(p.id for p in probes)

    # each rank's real part is its slice of each kind, in the original order; padding only after it
    for rank, (shard, n) in enumerate(shards):
        expect_real = [p for kind in ("mcq", "short") for p in [q for q in probes if q.kind == kind][rank::world_size]]
        present_kinds = [p.kind for p in probes]
        # plan_shard groups in order of first appearance; compare per kind so that order does not matter
        for kind in set(present_kinds):
            assert [p for p in shard[:n] if p.kind == kind] == [p for p in expect_real if p.kind == kind]
        assert n == len(expect_real)
        assert all(p in probes for p in shard[n:])  # padding repeats real probes

    # every rank scores the same number of probes of each kind (same forwards under FSDP / ZeRO-3)
    for kind in ("mcq", "short"):
        n_kind = sum(p.kind == kind for p in probes)
        per_rank = [sum(p.kind == kind for p in shard) for shard, _ in shards]
        assert per_rank == [-(-n_kind // world_size)] * world_size, kind
    assert len({len(shard) for shard, _ in shards}) == 1


def test_plan_shard_pads_with_the_ranks_own_probe_when_it_has_one():
    probes = _probes("mmmmm")  # 5 mcq on 2 ranks: rank 1 gets p1, p3 and a repeat of p1 (docstring example)
    assert [p.id for p in plan_shard(probes, CONFIG, 0, 2)[0]] == ["p0", "p2", "p4"]
    assert plan_shard(probes, CONFIG, 1, 2) == (probes[1:4:2] + [probes[1]], 2)


def test_world_without_process_group():
    assert world() == (0, 1)


def test_score_distributed_in_one_process_is_score_probes(base_results):
    ref, model, tokenizer = base_results
    got = score_distributed(model, tokenizer, make_probes(), CONFIG)
    assert got.ids == make_probes().ids
    assert_same(got.outcome, got.pred_index, got.margin, ref, "score_distributed, 1 process")


@pytest.mark.parametrize("n_probes,world_size", [(12, 3), (4, 5)], ids=["12-on-3", "4-on-5"])
def test_score_distributed_merges_shards_in_probe_order(base_results, monkeypatch, n_probes, world_size):
    """The gather and merge, ranks simulated one after another in this process (incl. ranks with no probes)."""
    import forgetwatch.run.distributed as fd

    ref, model, tokenizer = base_results
    probes = list(make_probes())[:n_probes]  # includes short-0 (the 6th probe) in the 12
    parts: dict[int, object] = {}
    rank = [0]
    monkeypatch.setattr(fd, "world", lambda: (rank[0], world_size))

    def all_gather_object(gathered, obj):
        parts[rank[0]] = obj
        gathered[:] = [parts.get(r) for r in range(world_size)]

    monkeypatch.setattr(torch.distributed, "all_gather_object", all_gather_object)
    # no process group to pad batches across or to sync generation with: score each simulated shard plainly
    monkeypatch.setattr(fd, "score_probes", lambda *a, sync_ranks, **k: score_probes(*a, **k))
    for r in range(world_size):  # first round: collect every rank's part (later ranks' parts missing yet)
        rank[0] = r
        try:
            score_distributed(model, tokenizer, probes, CONFIG)
        except KeyError:
            assert r < world_size - 1
    # each rank's gathered part holds its real probes only (the padding was dropped before the gather)
    for r in range(world_size):
        assert parts[r].ids == [p.id for kind in ("mcq", "short") for p in [q for q in probes if q.kind == kind][r::world_size]]
    ids = [p.id for p in probes]
    want = ref.select(ids)
    for r in range(world_size):
        rank[0] = r
        got = score_distributed(model, tokenizer, probes, CONFIG)
        assert got.ids == ids
        assert_same(got.outcome, got.pred_index, got.margin, want, f"rank {r}")
        assert got.prediction == want.prediction and got.generation == want.generation


def _forwards(model, tokenizer, probes, config) -> int:
    calls = [0]

    def hook(*_):
        calls[0] += 1

    handle = model.register_forward_hook(hook)
    try:
        score_probes(model, tokenizer, probes, config)
    finally:
        handle.remove()
    return calls[0]


@pytest.mark.parametrize("config", [
    ScoringConfig(mcq_mode="loglik"),
    ScoringConfig(mcq_mode="loglik_norm", batch_size=4),
    ScoringConfig(mcq_mode="letter", batch_size=5),
], ids=["loglik", "loglik_norm-bs4", "letter-bs5"])
def test_ranks_run_the_same_number_of_forwards(tokenizer, config):
    """What the padding is for: every rank's shard costs the same forwards (counted on the model's forward).

    With one option per row (pack_choices=False, the default under flash attention) shards of equal probe counts
    differ in rows; `sync_ranks` evens that out, which needs a real process group: see
    test_score_distributed_under_torchrun[unpacked]."""
    model = build_model(tokenizer)
    probes = [p for p in make_probes() if p.kind == "mcq"]  # mixed k; generation's step count is data-dependent
    counts = [_forwards(model, tokenizer, plan_shard(probes, config, r, 2)[0], config) for r in range(2)]
    assert counts[0] == counts[1], counts


# -- torchrun, 2 processes ---------------------------------------------------------------------------------


# max_steps 4 with eval_steps 2: the last step is scored in on_step_end. 5: on_train_end scores step 5.
@pytest.fixture(scope="module")
def ddp_runs(tmp_path_factory):
    """tests/ddp_train.py under torchrun with 2 processes, for 4 and 5 steps, in one launch (not asserted here: each
    test checks the exit)."""
    return torchrun_cases(tmp_path_factory.mktemp("ddp"), {f"steps{n}": [f"--max-steps={n}"] for n in (4, 5)})


@pytest.fixture(params=[4, 5], ids=lambda n: f"steps{n}")
def ddp_run(request, ddp_runs):
    max_steps = request.param
    run, dirs = ddp_runs
    steps = sorted({0, *range(EVAL_STEPS, max_steps + 1, EVAL_STEPS), max_steps})
    return run, dirs[f"steps{max_steps}"], steps


def test_ddp_run_uses_gloo_and_splits_probes(ddp_run):
    run, out, steps = ddp_run
    check_ok(run)
    done = [r for rank in range(2) for r in trace(out, rank) if r["event"] == "done"]
    assert [(d["rank"], d["backend"], d["world_size"], d["global_step"]) for d in done] == [
        (0, "gloo", 2, steps[-1]), (1, "gloo", 2, steps[-1])]
    assert_split(out, calls=len(steps))  # base + every evaluation, on both ranks


def test_ddp_run_writes_one_record_from_the_main_process(ddp_run):
    run, out, steps = ddp_run
    check_ok(run)
    # only rank 0 wrote: the cache once, one npz and one metrics line per evaluation
    for rank, expect in ((0, Counter({"cache_save": 1, "write_eval": len(steps), "append_metrics": len(steps)})), (1, Counter())):
        writes = Counter(r["event"] for r in trace(out, rank) if r["event"] in ("cache_save", "write_eval", "append_metrics"))
        assert writes == expect, f"rank {rank}"
    metrics_files = list(out.rglob("metrics.jsonl"))
    assert metrics_files == [out / "forgetwatch" / "metrics.jsonl"]
    lines = metrics_files[0].read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == steps  # no duplicate lines from rank 1
    root = out / "forgetwatch"
    assert sorted(p.name for p in (root / "evals").iterdir()) == [f"step-{s:08d}.npz" for s in steps]
    assert not [p.name for p in root.rglob("*.tmp")], "no temporary file left behind"
    assert list(out.rglob("base.parquet")) == [root / "base.parquet"]
    # one console line per evaluation in the launch's output, both ranks' together: the main process's only
    printed = case_output(run.stdout, out)
    assert [int(s) for s in re.findall(r"^forgetwatch step (\d+)\b", printed, re.MULTILINE)] == steps


def test_ddp_base_cache_is_loadable_and_equals_single_process(ddp_run, base_results):
    run, out, _ = ddp_run
    check_ok(run)
    ref, model, tokenizer = base_results
    key = make_cache_key(model_identity(model), make_probes(), CONFIG.key(tokenizer, describe_precision(model)))
    cache = BaseCache.load(out / "forgetwatch" / "base.parquet", expect=key)  # the key a 1-process run would expect
    assert cache.results.ids == make_probes().ids
    assert_same(cache.results.outcome, cache.results.pred_index, cache.results.margin, ref, "base.parquet")
    assert cache.results.prediction == ref.prediction
    assert cache.results.generation == ref.generation
    step0 = np.load(out / "forgetwatch" / "evals" / "step-00000000.npz")
    assert_same(step0["outcome"], step0["pred_index"], step0["margin"], ref, "evals/step-0")


def test_ddp_final_step_equals_single_process_rescoring(ddp_run):
    """DDP sees other batches than 1 process, so compare with re-scoring the same (saved) weights in-process."""
    from transformers import AutoModelForCausalLM

    run, out, steps = ddp_run
    check_ok(run)
    tokenizer = build_tokenizer()
    model = AutoModelForCausalLM.from_pretrained(out / "final", dtype=torch.float32)
    fresh = build_model(tokenizer)
    assert any(not torch.equal(a, b) for a, b in zip(model.parameters(), fresh.parameters(), strict=True)), "trained"
    ref = score_probes(model, tokenizer, make_probes(), CONFIG)
    last = np.load(out / "forgetwatch" / "evals" / f"step-{steps[-1]:08d}.npz")
    assert_same(last["outcome"], last["pred_index"], last["margin"], ref, f"evals/step-{steps[-1]}")


@pytest.fixture(scope="module")
def single_runs(tmp_path_factory):
    """The same script without torchrun, for 4 and 5 steps, in one process (`--cases`)."""
    root = tmp_path_factory.mktemp("single")
    env = clean_env()
    env.update(OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")
    cases = json.dumps([[str(root / f"steps{n}"), f"--max-steps={n}"] for n in (4, 5)])
    run = subprocess.run([sys.executable, str(SCRIPT), str(root), "--cases", cases], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=TIMEOUT)
    return run, root


def test_single_process_run_records_the_same_base(ddp_run, single_runs):
    """The same script without torchrun: one process, same record layout, same base numbers."""
    run, out, steps = ddp_run
    check_ok(run)
    single, root = single_runs
    assert single.returncode == 0, single.stderr[-4000:]
    tmp_path = root / f"steps{steps[-1]}"
    assert {r["event"] for r in trace(tmp_path, 0) if r["event"] == "score_probes"} and not trace(tmp_path, 1)
    assert all(r["n"] == 34 for r in trace(tmp_path, 0) if r["event"] == "score_probes")  # no split
    one = BaseCache.load(tmp_path / "forgetwatch" / "base.parquet").results
    two = BaseCache.load(out / "forgetwatch" / "base.parquet").results
    assert_same(two.outcome, two.pred_index, two.margin, one, "1-process vs 2-process base.parquet")
    assert [json.loads(line)["step"] for line in (tmp_path / "forgetwatch" / "metrics.jsonl").read_text().splitlines()] == steps


@pytest.fixture(scope="module")
def score_only_run(tmp_path_factory):
    """`score_distributed` under torchrun for every scoring options of SCORING, in one launch (a directory each)."""
    out = tmp_path_factory.mktemp("score-only")
    run = torchrun(out, "--score-only", f"--scoring={','.join(SCORING)}")
    return run, out


@pytest.mark.parametrize("scoring", list(SCORING))
def test_score_distributed_under_torchrun(score_only_run, base_results, scoring):
    """score_distributed alone: each rank scores its shard, every rank gets all results in probe order, and both
    ranks run the same number of forwards (what FSDP / ZeRO-3 need), whatever their shards' options."""
    run, out = score_only_run
    check_ok(run)
    out = out / scoring
    _, model, tokenizer = base_results
    probes = make_probes(behavior=scoring == "behavior")
    ref = score_probes(model, tokenizer, probes, ScoringConfig(**SCORING[scoring]))
    ids = probes.ids
    assert_split(out, calls=1, behavior=scoring == "behavior")
    forwards = [json.loads((out / f"scored-rank{rank}.json").read_text())["forwards"] for rank in range(2)]
    assert forwards[0] == forwards[1] > 0, forwards
    for rank in range(2):
        got = json.loads((out / f"scored-rank{rank}.json").read_text())
        assert (got["rank"], got["world_size"]) == (rank, 2)
        assert got["ids"] == ids
        margin = [np.nan if m is None else m for m in got["margin"]]
        assert_same(got["outcome"], got["pred_index"], margin, ref, f"rank {rank}")
        assert got["prediction"] == ref.prediction
        assert got["generation"] == ref.generation
        assert got["n_tokens"] == ref.n_tokens.tolist() and got["stopped"] == ref.stopped.tolist() and got["detail"] == ref.detail


@pytest.fixture(scope="module")
def ddp_remedies(tmp_path_factory):
    """The runs of the budget, replay, anchor and penalty tests under 2-process DDP, in one launch (one after another)."""
    return torchrun_cases(tmp_path_factory.mktemp("ddp-remedies"), {
        "budget-stop": ["--on-budget=stop", "--max-steps=8"],
        "replay": ["--replay=0.25", "--max-steps=8"],
        "replay-sft": ["--replay=0.25", "--max-steps=8", "--sft"],
        "anchor": ["--anchor=1.0", "--max-steps=4"],
        "penalty": ["--penalty=1.0", "--max-steps=4", "--sft"],
    })


def _case(runs, name: str):
    run, dirs = runs
    check_ok(run)
    return dirs[name]


def test_budget_stop_is_the_same_decision_on_every_rank(ddp_remedies):
    """A budget trips on the main process (where the record is) and every rank stops at that step: a rank that went on
    alone would wait forever in the next step's gradient all-reduce (the launch's timeout fails the test then)."""
    tmp_path = _case(ddp_remedies, "budget-stop")
    done = [r for rank in range(2) for r in trace(tmp_path, rank) if r["event"] == "done"]
    events = [json.loads(line) for line in (tmp_path / "forgetwatch" / "events.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events] == ["budget_exceeded"] and events[0]["action"] == "stop"
    trip = events[0]["step"]
    assert trip < 8 and [(d["rank"], d["global_step"]) for d in done] == [(0, trip), (1, trip)]


def test_replay_stream_gives_each_rank_its_share(ddp_remedies):
    """`mix_replay` under 2-process DDP (plain Trainer: accelerate reads the stream on rank 0 and hands each rank its
    slice): each rank trains on a quarter of replay, counted on the batches it trained on, the training rows of an
    epoch are split between the ranks without repeats, and the loop's weights follow the main process's evaluations."""
    tmp_path = _case(ddp_remedies, "replay")
    fed = {rank: [r for r in trace(tmp_path, rank) if r["event"] == "batch"] for rank in range(2)}
    for rank in range(2):
        assert [b["step"] for b in fed[rank]] == list(range(1, 9))
        rows = [row for b in fed[rank] for row in b["rows"]]
        assert len(rows) == 16 and sum(row.startswith("pool-") for row in rows) == 4
    train_rows = [[row for b in fed[rank] for row in b["rows"] if row.startswith("train-")] for rank in range(2)]
    first_epoch = train_rows[0][:6] + train_rows[1][:6]  # 12 rows per rank in 8 steps; 16 rows in an epoch
    assert len(set(first_epoch)) == 12
    (mix,) = [r for r in trace(tmp_path, 0) if r["event"] == "mix"]
    assert [step for _, step, _ in mix["schedule"]] == [2, 4, 6, 8]
    recorded = json.loads((tmp_path / "forgetwatch" / "replay_mix.json").read_text())["mixers"][0]["schedule"]
    assert recorded == mix["schedule"]


def test_replay_stream_under_ddp_with_sfttrainer(ddp_remedies):
    """The same under TRL's SFTTrainer (its own dataset preparation and collator between the stream and the model):
    each rank trains on exactly a quarter of replay, and every rank's mixer switched to the main process's weights at
    its evaluations (the broadcast reached the other rank)."""
    tmp_path = _case(ddp_remedies, "replay-sft")
    for rank in range(2):
        fed = [r for r in trace(tmp_path, rank) if r["event"] == "batch"]
        assert [b["step"] for b in fed] == list(range(1, 9))
        rows = [row for b in fed for row in b["rows"]]
        assert len(rows) == 16 and sum(row.startswith("pool-") for row in rows) == 4
    mixes = [[r for r in trace(tmp_path, rank) if r["event"] == "mix"] for rank in range(2)]
    assert mixes[0] and mixes[0][0]["schedule"] and [step for _, step, _ in mixes[0][0]["schedule"]] == [2, 4, 6, 8]
    assert [[s[1:] for s in m[0]["schedule"]] for m in mixes] == [[s[1:] for s in mixes[0][0]["schedule"]]] * 2


@pytest.mark.parametrize("sft", [False, pytest.param(True, marks=pytest.mark.long)], ids=["Trainer", "SFTTrainer"])
def test_the_kl_anchor_under_ddp(tmp_path, sft, request):
    """The KL anchor under 2-process DDP: every rank runs an anchor forward at the same micro-batches (as many
    conversations each, drawn apart; a second forward before the backward, which DDP's reducer takes), the run ends,
    and the closed loop steered the anchor's draws."""
    if sft:  # a launch of its own (`long`)
        run = torchrun(tmp_path, "--anchor=1.0", "--max-steps=4", "--sft")
        check_ok(run)
    else:  # the fixture is asked for here only, so that the long parameter does not wait for its launch
        tmp_path = _case(request.getfixturevalue("ddp_remedies"), "anchor")
    draws = {rank: [r for r in trace(tmp_path, rank) if r["event"] == "anchor"] for rank in range(2)}
    assert [d["micro_batch"] for d in draws[0]] == [d["micro_batch"] for d in draws[1]] == [0, 1, 2, 3]
    assert [len(d["rows"]) for d in draws[0]] == [len(d["rows"]) for d in draws[1]] == [1, 1, 1, 1]  # 0.5 x 2 examples
    assert [d["rows"] for d in draws[0]] != [d["rows"] for d in draws[1]]  # each rank its own conversations
    mix = json.loads((tmp_path / "forgetwatch" / "replay_mix.json").read_text())["mixers"][0]
    assert [step for _, step, _ in mix["schedule"]] == [2, 4]  # the closed loop steered the anchor on every rank


def test_the_1_to_0_penalty_under_ddp(ddp_remedies):
    check_penalty_run(_case(ddp_remedies, "penalty"))




@pytest.mark.long
def test_partial_evaluations_score_the_same_probes_on_every_rank(tmp_path):
    """max_share under DDP: the main process plans each partial evaluation (it holds the record's per-probe state and
    the clock) and every rank scores the same probes, split between them; the record flags the partial steps."""
    run = torchrun(tmp_path, "--max-share=0.0001", "--max-steps=6")
    check_ok(run)
    designs = [{r["step"]: r["scored"] for r in trace(tmp_path, rank) if r["event"] == "design"} for rank in range(2)]
    assert designs[0] == designs[1] and sorted(designs[0]) == [2, 4, 6]
    assert designs[0][6] is None and designs[0][2] is not None and designs[0][4] is not None  # the last step: a full pass
    lines = [json.loads(line) for line in (tmp_path / "forgetwatch" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines if "partial" in r] == [2, 4]
    # each rank's score_probes calls after an evaluation's design (in its trace's order) are that evaluation's
    scored: dict[int, set[str]] = {}
    for rank in range(2):
        step = None
        for r in trace(tmp_path, rank):
            if r["event"] == "design":
                step = r["step"]
            elif r["event"] == "score_probes" and step is not None:
                scored.setdefault(step, set()).update(r["ids"])
    ids = make_probes(behavior=True).ids
    for step in (2, 4):  # the ranks together scored the design, nothing else
        assert scored[step] == {ids[i] for i in designs[0][step]}
    assert scored[6] == set(ids)
