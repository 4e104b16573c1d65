"""One engine on both sides of every flip (forgetwatch/run/base_rescore.py, the cache key's `runtime`): what holds without
vLLM installed. The whole sidecar run with vLLM is tests/scoring/test_vllm.py (`make check-vllm`)."""

from __future__ import annotations

import importlib.util
import json

import pytest

from forgetwatch.errors import CacheMismatchError, EngineUnavailableError, SidecarError
from forgetwatch.probes.probe_set import Probe, ProbeSet
from forgetwatch.record.cache import BaseCache, make_cache_key
from forgetwatch.run.base_rescore import base_file, base_for_engine, runtime_key
from forgetwatch.scoring.results import ProbeResults
from forgetwatch.scoring.score import ScoringConfig

VLLM_BASE = base_file("vllm")


def _probes(n=3):
    return ProbeSet([Probe(f"p{i}", "mcq", f"Q{i}?", ("a", "b"), 0) for i in range(n)])


def _cache(config=None, probes=None):
    probes = probes or _probes()
    key = make_cache_key({"name_or_path": "/nowhere/base"}, probes, (config or ScoringConfig()).key(None, "float32"))
    return BaseCache(key, ProbeResults.empty(probes.ids))


def _record(tmp_path, steps):
    root = tmp_path / "forgetwatch"
    root.mkdir()
    (root / "metrics.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in steps))
    return root


def test_a_vllm_key_says_so_and_the_transformers_engines_keep_theirs():
    assert ScoringConfig(engine="vllm").key()["runtime"] == "vllm"
    assert ScoringConfig().key() == ScoringConfig(engine="continuous").key()  # caches made before keep their key
    assert "runtime" not in ScoringConfig().key()
    assert runtime_key(_cache().key, "vllm") == _cache(ScoringConfig(engine="vllm")).key


def test_a_cache_of_the_other_engine_is_refused_naming_the_fix():
    hf, vllm = _cache(), _cache(ScoringConfig(engine="vllm"))
    for cache, other in ((hf, vllm), (vllm, hf)):
        with pytest.raises(CacheMismatchError, match=r"(?s)scoring\.runtime.*scored by vLLM and the other by transformers.*"
                                                     r"--engine vllm"):
            cache.check(other.key)
    assert hf.check(_cache(ScoringConfig(engine="continuous")).key) == []


def test_a_record_is_scored_by_one_engine(tmp_path):
    hf, vllm_config = ScoringConfig(), ScoringConfig(engine="vllm")
    # transformers evaluations, then a vLLM watcher: refused before anything is scored
    root = _record(tmp_path, [0, 2, 4])
    with pytest.raises(SidecarError, match=r"2 evaluation\(s\) were scored by transformers.*--engine hf"):
        base_for_engine(root, _cache(), vllm_config, "float32", _probes())
    assert not (root / VLLM_BASE).exists()
    # vLLM evaluations (its base beside base.parquet), then a transformers watcher: refused
    _cache(vllm_config).save(root / VLLM_BASE)
    with pytest.raises(SidecarError, match=r"were scored by --engine vllm.*Watch with --engine vllm"):
        base_for_engine(root, _cache(), hf, "float32", _probes())
    # the vLLM watcher goes on against the base vLLM scored, read back (its key checked)
    again = base_for_engine(root, _cache(), vllm_config, "float32", _probes())
    assert again.key["scoring"]["runtime"] == "vllm"
    # a cache the training process was given that vLLM scored is used as it is
    given = _cache(vllm_config)
    assert base_for_engine(tmp_path / "empty", given, vllm_config, "float32", _probes()) is given
    # a record only the base is in (step 0): the transformers watcher takes it as it is
    (tmp_path / "b").mkdir()
    hf_cache = _cache()
    assert base_for_engine(_record(tmp_path / "b", [0]), hf_cache, hf, "float32", _probes()) is hf_cache


def test_vllm_cannot_score_a_run_trained_under_autocast(tmp_path):
    with pytest.raises(EngineUnavailableError, match=r"autocast.*--engine hf"):
        base_for_engine(_record(tmp_path, [0]), _cache(), ScoringConfig(engine="vllm"), "float32+autocast-bfloat16",
                        _probes())


def test_the_base_directory_must_hold_the_weights_the_cache_was_scored_from(tmp_path):
    from forgetwatch.run.base_rescore import base_directory

    with pytest.raises(SidecarError, match="not a directory here"):
        base_directory({"name_or_path": str(tmp_path / "gone")}, "vllm")
    # a Hub id where the Hub cannot be reached (as here, offline): named, with what to do
    with pytest.raises(SidecarError, match=r"'no-such-org/no-such-model' .*could not be fetched.*--engine hf"):
        base_directory({"name_or_path": "no-such-org/no-such-model"}, "vllm")
    model = tmp_path / "base"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"x" * 64)
    from forgetwatch.scoring.weights import weights_fingerprint

    fingerprint = weights_fingerprint(model)
    assert base_directory({"name_or_path": str(model), "weights": fingerprint}, "vllm") == str(model)
    (model / "model.safetensors").write_bytes(b"y" * 64)  # other weights saved at the same path
    with pytest.raises(SidecarError, match="not those the record's base cache was scored from"):
        base_directory({"name_or_path": str(model), "weights": fingerprint}, "vllm")


def test_the_sidecar_callback_leaves_vllm_to_the_watcher():
    """engine="vllm" with scoring="sidecar": the training process scores its base with transformers (never a vLLM
    beside training) and its options say vllm, which the watcher takes."""
    from forgetwatch import ForgetWatchCallback

    cb = ForgetWatchCallback(probes=_probes(), engine="vllm", scoring="sidecar")
    assert cb.config.engine == "hf" and "runtime" not in cb.config.key()
    assert cb.options.forgetwatch_engine == "vllm"


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="with vllm, tests/scoring/test_vllm.py watches the run")
def test_the_watcher_takes_the_sidecar_manifests_vllm(tokenizer, tiny_model_dir, tmp_path, capsys):
    """A run started with engine="vllm", scoring="sidecar": its manifest's options (which leave `scoring` out: the
    manifest is the sidecar's) are the watcher's, which goes on to score the base with vLLM (here: not installed)."""
    from fixtures.trainers import sft_trainer, watcher
    from transformers import AutoModelForCausalLM

    from forgetwatch.cli import main

    out = tmp_path / "run"
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    sft_trainer(tokenizer, out, [watcher(scoring="sidecar", engine="vllm")], model=model, max_steps=2, bf16=False,
                save_strategy="steps", save_steps=2).train()
    assert main(["watch", str(out), "--once", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "could not have written" not in err and "cannot score the model in training" not in err
    assert "vllm" in err.lower() and "not installed" in err
