"""ForgetWatchCallback under FSDP2: HF Trainer, `torchrun --nproc_per_node 2`, gloo, on CPU.

Under FSDP every forward gathers each layer's weights from all ranks, so a rank that runs one forward more than the
others waits forever. These runs check, on a model that really is sharded (parameters are DTensors, each rank holds
about half), that both ranks run the same forwards at every evaluation for packed, one-option-per-row and generative
scoring, that the recorded results equal scoring in one process, and that a cache built by `forgetwatch cache` is
accepted on every rank (no rank re-scores the base). accelerate 1.15 enables FSDP only on accelerator devices; the
harness lifts that gate for CPU (tests/ddp_train.py `_allow_fsdp_on_cpu`), the sharding itself is torch's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import transformers
from conftest import build_model, build_tokenizer
from ddp_train import EVAL_STEPS, MAX_STEPS, SCORING, make_probes
from fixtures.internals import installed, library_changed
from fixtures.multiproc import (
    REPO,
    TIMEOUT,
    assert_same,
    assert_split,
    check_ok,
    torchrun,
    torchrun_cases,
    trace,
)

from forgetwatch.record.cache import BaseCache
from forgetwatch.scoring.score import ScoringConfig, score_probes
from forgetwatch.versions import release

STEPS = list(range(0, MAX_STEPS + 1, EVAL_STEPS))  # 0 (the base), 2, 4


pytestmark = pytest.mark.usefixtures("one_thread")

# The harness asks for FSDP2 through TrainingArguments(fsdp_config=...), which transformers sets up from 5 on (default
# version 2). transformers 4 builds FSDP1 from it, which refuses CPU; there FSDP2 comes from accelerate's own config
# (fsdp_version: 2, accelerate >= 1.6), which these CPU tests cannot reach.
needs_fsdp2 = pytest.mark.skipif(
    release(transformers.__version__) < (5,),
    reason=f"FSDP2 from TrainingArguments needs transformers 5; installed: {installed('transformers')}, "
    f"{installed('accelerate')}",
)


@pytest.fixture(scope="module")
def fsdp_runs(tmp_path_factory):
    """The 2-process FSDP2 training runs of this module, in one launch (one after another): the callback scoring with
    each of SCORING's options, then the budget, anchor and penalty runs."""
    cases = {f"scoring-{name}": ["--fsdp", f"--scoring={name}"] for name in SCORING}
    cases.update({"budget-stop": ["--fsdp", "--on-budget=stop", "--max-steps=8"],
                  "anchor": ["--fsdp", "--anchor=1.0", "--max-steps=4"],
                  "penalty": ["--fsdp", "--penalty=1.0", "--max-steps=4", "--sft"]})
    return torchrun_cases(tmp_path_factory.mktemp("fsdp"), cases)


def _case(runs, name: str):
    run, dirs = runs
    check_ok(run)
    return dirs[name]


@pytest.fixture(params=list(SCORING))
def fsdp_run(request, fsdp_runs):
    """The FSDP2 run whose callback scored with SCORING[param]."""
    run, dirs = fsdp_runs
    return request.param, run, dirs[f"scoring-{request.param}"]


def _scoring_calls(out, rank: int) -> list[dict]:
    return [r for r in trace(out, rank) if r["event"] == "score_probes"]


@needs_fsdp2
def test_fsdp_shards_the_model_the_callback_scores(fsdp_run):
    scoring, run, out = fsdp_run
    check_ok(run)
    for rank in range(2):
        calls = _scoring_calls(out, rank)
        assert len(calls) == len(STEPS), f"rank {rank}: the base and every evaluation"
        for c in calls:
            # fully_shard's class, not DDP's wrapper: else accelerate trained with DDP, its CPU gate moved
            assert c["model_class"].startswith("FSDP"), library_changed(
                "accelerate", "the CPU gate on FSDP (tests/ddp_train.py _allow_fsdp_on_cpu)", f"the model was {c['model_class']}")
            # every decoder layer is sharded; accelerate keeps the tail (final norm, lm_head) gathered after a forward
            # (reshard_after_forward=False), so it shows whole
            assert not [n for n in c["not_sharded"] if n.startswith("model.layers.")], c["not_sharded"]
            assert c["local_params"] < 0.65 * c["total_params"], c
    done = [r for rank in range(2) for r in trace(out, rank) if r["event"] == "done"]
    assert [(d["rank"], d["world_size"], d["global_step"], d["evaluated_steps"]) for d in done] == [
        (0, 2, MAX_STEPS, STEPS), (1, 2, MAX_STEPS, [])]  # only the main process keeps the record


@needs_fsdp2
def test_fsdp_ranks_run_the_same_forwards_at_every_evaluation(fsdp_run):
    scoring, run, out = fsdp_run
    check_ok(run)
    assert_split(out, calls=len(STEPS))
    forwards = [[c["forwards"] for c in _scoring_calls(out, rank)] for rank in range(2)]
    assert forwards[0] == forwards[1] and min(forwards[0]) > 0, (scoring, forwards)


@needs_fsdp2
def test_fsdp_results_equal_one_process(fsdp_run):
    """The base scored under FSDP equals the base scored here; the last evaluation equals re-scoring the final weights."""
    scoring, run, out = fsdp_run
    check_ok(run)
    config = ScoringConfig(**SCORING[scoring])
    tokenizer = build_tokenizer()
    probes = make_probes()
    root = out / "forgetwatch"
    assert [json.loads(line)["step"] for line in (root / "metrics.jsonl").read_text().splitlines()] == STEPS

    base = score_probes(build_model(tokenizer), tokenizer, probes, config)
    for what, got in (("base.parquet", BaseCache.load(root / "base.parquet").results),):
        assert_same(got.outcome, got.pred_index, got.margin, base, what)
        assert got.prediction == base.prediction and got.generation == base.generation
    step0 = np.load(root / "evals" / "step-00000000.npz")
    assert_same(step0["outcome"], step0["pred_index"], step0["margin"], base, "evals/step-0")

    trained = build_model(tokenizer)
    trained.load_state_dict(torch.load(out / "final-state.pt"))
    assert any(not torch.equal(a, b) for a, b in zip(trained.parameters(), build_model(tokenizer).parameters(), strict=True))
    last = np.load(root / "evals" / f"step-{MAX_STEPS:08d}.npz")
    assert_same(last["outcome"], last["pred_index"], last["margin"], score_probes(trained, tokenizer, probes, config),
                f"evals/step-{MAX_STEPS}")


@needs_fsdp2
@pytest.mark.long
def test_fsdp_accepts_a_cli_built_cache_on_every_rank(tmp_path, tiny_model_dir):
    """`forgetwatch cache` once, then FSDP training with base_cache=: no rank scores the base, none writes a cache."""
    probes_file = tmp_path / "probes.jsonl"
    make_probes().to_jsonl(probes_file)
    cache = tmp_path / "base.parquet"
    built = subprocess.run([sys.executable, "-m", "forgetwatch.cli", "cache", "--model", str(tiny_model_dir),
                            "--probes", str(probes_file), "-o", str(cache)],
                           cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT)
    assert built.returncode == 0, built.stderr[-4000:]
    out = tmp_path / "run"
    run = torchrun(out, "--fsdp", f"--model={tiny_model_dir}", f"--base-cache={cache}")
    check_ok(run)
    assert "Scoring the base model now" not in run.stdout and "does not exist" not in run.stdout, run.stdout[-3000:]
    for rank in range(2):
        events = [r["event"] for r in trace(out, rank)]
        assert events.count("score_probes") == len(STEPS) - 1, f"rank {rank} scored the base: {events}"
        assert "cache_save" not in events
    assert_split(out, calls=len(STEPS) - 1)
    # the record's step 0 is the cache's base, bit for bit
    cached = BaseCache.load(cache).results
    step0 = np.load(out / "forgetwatch" / "evals" / "step-00000000.npz")
    assert_same(step0["outcome"], step0["pred_index"], step0["margin"], cached, "evals/step-0 vs the CLI cache")
    assert not (out / "forgetwatch" / "base.parquet").exists()  # the user's cache is the base; no copy


@needs_fsdp2
def test_fsdp_budget_stop_on_every_rank(fsdp_runs):
    """Under FSDP a rank that stopped alone would leave the others waiting in the next forward's all-gather."""
    tmp_path = _case(fsdp_runs, "budget-stop")
    done = [r for rank in range(2) for r in trace(tmp_path, rank) if r["event"] == "done"]
    events = [json.loads(line) for line in (tmp_path / "forgetwatch" / "events.jsonl").read_text().splitlines()]
    trip = events[0]["step"]
    assert trip < 8 and [(d["rank"], d["global_step"]) for d in done] == [(0, trip), (1, trip)]


@needs_fsdp2
@pytest.mark.long
def test_fsdp_sidecar_checkpoints_are_merged_and_scored_by_the_watcher(tmp_path):
    """scoring='sidecar' under FSDP2 with sharded checkpoints (pytorch_model_fsdp_0/: no config, no tokenizer, no
    full weights in them): the training ranks score only the base; `forgetwatch watch`, in one process, merges each
    checkpoint's shards into the model the training process described, and its last evaluation equals scoring the
    final weights here."""
    run = torchrun(tmp_path, "--fsdp", "--sidecar")
    check_ok(run)
    for rank in range(2):
        assert len(_scoring_calls(tmp_path, rank)) == 1, f"rank {rank}: the base only"
    last_ckpt = tmp_path / f"checkpoint-{MAX_STEPS}"
    assert (last_ckpt / "pytorch_model_fsdp_0").is_dir() and not (last_ckpt / "config.json").exists()
    assert {"config.json", "tokenizer.json"} <= {p.name for p in (tmp_path / "forgetwatch" / "model").iterdir()}
    watch = subprocess.run([sys.executable, "-m", "forgetwatch.cli", "watch", str(tmp_path), "--once", "--device", "cpu"],
                           cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT,
                           env={**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"})
    assert watch.returncode == 0, watch.stderr[-4000:]
    root = tmp_path / "forgetwatch"
    assert [json.loads(line)["step"] for line in (root / "metrics.jsonl").read_text().splitlines()] == STEPS
    tokenizer = build_tokenizer()
    trained = build_model(tokenizer)
    trained.load_state_dict(torch.load(tmp_path / "final-state.pt"))
    last = np.load(root / "evals" / f"step-{MAX_STEPS:08d}.npz")
    assert_same(last["outcome"], last["pred_index"], last["margin"],
                score_probes(trained, tokenizer, make_probes(), ScoringConfig(**SCORING["default"])), "the watcher's last step")


def test_a_checkpoint_without_readable_weights_is_named(tmp_path):
    from forgetwatch.scoring.models import load_checkpoint

    ckpt = tmp_path / "checkpoint-2"
    (ckpt / "pytorch_model_fsdp_0").mkdir(parents=True)  # shards, but no config anywhere
    (ckpt / "trainer_state.json").write_text("{}")
    with pytest.raises(ValueError, match="holds FSDP-sharded weights .* no config.json"):
        load_checkpoint(ckpt)
    (ckpt / "pytorch_model_fsdp_0").rmdir()
    (ckpt / "optimizer.pt").write_text("")
    with pytest.raises(
        ValueError, match="holds no model weights the watcher can read .* it has optimizer.pt, trainer_state.json"
    ):
        load_checkpoint(ckpt)


@pytest.mark.parametrize("kept", ["both names", "one name"])
def test_sharded_checkpoints_of_tied_weights_load(tmp_path, kept):
    """A model whose lm_head is its embedding (SmolLM2): the shards may hold the tensor under both names or one; the
    watcher's model gets the trained weights either way (written here with torch.distributed.checkpoint, one process)."""
    import torch.distributed.checkpoint as dcp
    from transformers import LlamaConfig, LlamaForCausalLM

    from forgetwatch.scoring.models import FSDP_SHARDS, load_checkpoint

    tokenizer = build_tokenizer()
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True)
    trained = LlamaForCausalLM(config)
    state = trained.state_dict()
    assert state["lm_head.weight"].data_ptr() == state["model.embed_tokens.weight"].data_ptr()
    if kept == "one name":
        state = {k: v for k, v in state.items() if k != "lm_head.weight"}
    ckpt = tmp_path / "checkpoint-2"
    dcp.save({"model": state}, checkpoint_id=str(ckpt / FSDP_SHARDS), no_dist=True)
    files = tmp_path / "model"
    config.save_pretrained(files)
    tokenizer.save_pretrained(files)
    model, _ = load_checkpoint(ckpt, device="cpu", model_files=files)
    for name, t in trained.state_dict().items():
        assert torch.equal(model.state_dict()[name], t), name


@needs_fsdp2
def test_the_kl_anchor_under_fsdp(fsdp_runs):
    """FSDP2 gathers weights in every forward: the anchor's extra forwards must be the same on every rank, or a rank
    waits forever. The launch ends (bounded by the harness's timeout) with the same draws counted on both ranks."""
    tmp_path = _case(fsdp_runs, "anchor")
    counts = [[len(r["rows"]) for r in trace(tmp_path, rank) if r["event"] == "anchor"] for rank in range(2)]
    assert counts[0] == counts[1] == [1, 1, 1, 1]
    done = [r for rank in range(2) for r in trace(tmp_path, rank) if r["event"] == "done"]
    assert [(d["rank"], d["global_step"]) for d in done] == [(0, 4), (1, 4)]


@needs_fsdp2
def test_the_1_to_0_penalty_under_fsdp(fsdp_runs):
    """The penalty's base margins (read by every rank at train begin) and its extra forwards under FSDP2's gathers."""
    from fixtures.remedies import check_penalty_run

    check_penalty_run(_case(fsdp_runs, "penalty"))
