"""forgetwatch.models: where the offline SmolLM2 checkpoint is kept."""

from __future__ import annotations

import transformers

from forgetwatch import models


def test_the_smollm2_checkpoint_is_kept_per_transformers_major_version(tmp_path, monkeypatch):
    """A tokenizer saved by transformers 5 does not load in 4: switching versions must not reuse the other's copy."""
    monkeypatch.setenv("FORGETWATCH_CACHE", str(tmp_path))
    five, four = models._smollm2_dir("5.24.0"), models._smollm2_dir("4.57.6")
    assert five == tmp_path / "SmolLM2-135M-Instruct"  # where transformers 5 users already have it
    assert four == tmp_path / "SmolLM2-135M-Instruct-transformers4"
    assert models._smollm2_dir() == (five if transformers.__version__.startswith("5.") else four)
