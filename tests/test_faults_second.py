"""Issue 44, second pass, cases 7 and 9: other weights saved at the model's path, a report read while an evaluation is
being written, an output_dir that cannot be written, and a probe far longer than the model's context.

Every fault is real: the weights are saved again with `save_pretrained`, the scoring lock is held by another live
process, the unwritable directory is written by a process running as an unprivileged user (`setpriv`; the tests run as
root, whom `chmod` does not stop), and the long probe is tokenized by a real tokenizer.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import build_model, build_tokenizer

from forgetwatch.cache import BaseCache, CacheMismatchError, make_cache_key
from forgetwatch.cli import main
from forgetwatch.models import model_identity
from forgetwatch.probes import Probe, ProbeSet
from forgetwatch.weights import weights_fingerprint

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = Path(__file__).resolve().parents[1]


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def probe_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("probes") / "probes.jsonl"
    ProbeSet(Probe(f"q{i}", "mcq", f"Question {i}: which?", ("Paris", "London", "fox")[: 2 + i % 2], i % 2)
             for i in range(6)).to_jsonl(path)
    return path


def save_model(path: Path, seed: int) -> None:
    tok = build_tokenizer()
    build_model(tok, seed=seed).save_pretrained(path)
    tok.save_pretrained(path)


# -- case 7: other weights saved at the base model's path ------------------------------------------------------------
KEPT = "already holds this cache (same model, probes and scoring): nothing scored, nothing written"


def test_other_weights_saved_at_the_same_path_are_not_taken_for_the_cached_model(capsys, tmp_path, probe_file):
    model, cache = tmp_path / "base", tmp_path / "base.parquet"
    save_model(model, seed=0)
    assert run(capsys, "cache", "--model", model, "--probes", probe_file, "-o", cache)[0] == 0
    before = cache.read_bytes()
    save_model(model, seed=1)  # a fine-tune written over its base: same path, same architecture, other weights
    code, out, err = run(capsys, "cache", "--model", model, "--probes", probe_file, "-o", cache)
    assert code == 2 and KEPT not in out, out
    assert f"-o {cache} exists and holds a cache made under another key" in err
    assert f"model.weights: the weight files at {model.resolve()} are not those this cache was made from" in err
    assert "choose another -o, or pass --force to replace it" in err
    assert cache.read_bytes() == before
    # the callback's check (`_find_base` loads the cache with the key of the model it trains) refuses it too
    from transformers import AutoModelForCausalLM

    old = BaseCache.load(cache)
    key = make_cache_key(model_identity(AutoModelForCausalLM.from_pretrained(model)), ProbeSet.from_jsonl(probe_file),
                         old.key["scoring"])
    with pytest.raises(CacheMismatchError, match="model.weights: the weight files at .* are not those"):
        BaseCache.load(cache, expect=key)
    # the advice, followed: --force scores the new weights, and the same command then keeps that cache
    code, _, err = run(capsys, "cache", "--model", model, "--probes", probe_file, "-o", cache, "--force")
    assert code == 0, err
    assert BaseCache.load(cache).key["model"]["weights"] == weights_fingerprint(model)
    code, out, err = run(capsys, "cache", "--model", model, "--probes", probe_file, "-o", cache)
    assert code == 0 and KEPT in out and "note" not in err, err


def test_the_same_bytes_with_new_file_times_are_kept_with_a_note(capsys, tmp_path, probe_file):
    """`cp -r` (new times) of the same weights is the same model, said in a note; `cp -a` (times kept) says nothing."""
    model, cache, backup = tmp_path / "base", tmp_path / "base.parquet", tmp_path / "backup"
    save_model(model, seed=0)
    assert run(capsys, "cache", "--model", model, "--probes", probe_file, "-o", cache)[0] == 0
    shutil.copytree(model, backup)  # cp -a: times kept
    shutil.rmtree(model)
    shutil.copytree(backup, model)
    code, out, err = run(capsys, "cache", "--model", model, "--probes", probe_file, "-o", cache)
    assert code == 0 and KEPT in out and "note" not in err, err
    shutil.rmtree(model)
    shutil.copytree(backup, model, copy_function=shutil.copyfile)  # cp -r: new times, the same bytes
    os.utime(model / "model.safetensors", (time.time() + 5, time.time() + 5))  # a coarse clock could give the old time
    code, out, err = run(capsys, "cache", "--model", model, "--probes", probe_file, "-o", cache)
    assert code == 0 and KEPT in out, err
    assert f"the weight files at {model.resolve()} were written again since this cache was made" in err
    assert "with the same size and sampled bytes (a copy, or the same weights saved again): the cache is used" in err


def test_a_cache_made_before_weight_fingerprints_still_serves(capsys, tmp_path, probe_file):
    model, cache = tmp_path / "base", tmp_path / "base.parquet"
    save_model(model, seed=0)
    assert run(capsys, "cache", "--model", model, "--probes", probe_file, "-o", cache)[0] == 0
    # the key as forgetwatch wrote it before the fingerprint existed
    table = pq.read_table(cache)
    key = json.loads(table.schema.metadata[b"forgetwatch"])
    del key["model"]["weights"]
    pq.write_table(table.replace_schema_metadata({b"forgetwatch": json.dumps(key).encode()}), cache)
    code, out, err = run(capsys, "cache", "--model", model, "--probes", probe_file, "-o", cache)
    assert code == 0 and KEPT in out, err
    assert f"{cache} was made without the weight files' fingerprint" in err
    assert f"`forgetwatch cache ... -o {cache} --force` makes it again with one" in err
    # the note's advice, followed: the cache made again holds the fingerprint, and the note is gone
    assert run(capsys, "cache", "--model", model, "--probes", probe_file, "-o", cache, "--force")[0] == 0
    code, out, err = run(capsys, "cache", "--model", model, "--probes", probe_file, "-o", cache)
    assert code == 0 and KEPT in out and "note" not in err, err
    # a Hub id has no files here to fingerprint: its revision names its weights
    assert weights_fingerprint("HuggingFaceTB/SmolLM2-135M-Instruct") is None
