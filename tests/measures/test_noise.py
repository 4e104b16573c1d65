"""The precision noise floor: the base scored in fp32 without autocast beside the bf16 cache, and flips without it."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import build_model
from fixtures.trainers import BF16, SCORING, make_probes, metric_rows, sft_trainer, watcher

from forgetwatch import BaseCache, load_record
from forgetwatch.measures.metrics import compute_report
from forgetwatch.measures.noise import NoiseFloor, min_detectable_forgetting
from forgetwatch.scoring.score import ScoringConfig, score_probes

pytestmark = pytest.mark.usefixtures("one_thread")


def test_min_detectable_forgetting_known_answers():
    assert min_detectable_forgetting(100) == 0.01  # one flip's Wilson lower bound is above 0
    assert min_detectable_forgetting(200, 4) == 0.04  # 8/200: lower bound 0.0203 > 0.02; 7/200: 0.0170
    assert min_detectable_forgetting(10, 10) == 1.0
    with pytest.raises(ValueError, match="`n` must be positive"):
        min_detectable_forgetting(0)


@pytest.fixture(scope="module")
def bf16_run(tokenizer, tmp_path_factory):
    """TRL's defaults: fp32 weights, bf16 autocast. The callback scores the base in both."""
    out = tmp_path_factory.mktemp("noise")
    trainer = sft_trainer(tokenizer, out, [watcher()])
    trainer.train()
    return trainer, out


def test_the_reference_is_the_base_in_fp32_without_autocast(bf16_run, tokenizer):
    _, out = bf16_run
    cache = BaseCache.load(out / "forgetwatch" / "base.parquet")
    assert cache.key["scoring"]["precision"] == BF16 and cache.reference is not None
    fp32 = score_probes(build_model(tokenizer, seed=0), tokenizer, make_probes(), ScoringConfig(**SCORING))
    np.testing.assert_array_equal(cache.reference.outcome, fp32.outcome)
    np.testing.assert_allclose(cache.reference.margin, fp32.margin, atol=1e-5, equal_nan=True)
    # and it really is another precision than the cache's (accelerate's autocast wrapper was bypassed)
    assert np.nanmax(np.abs(cache.results.margin - cache.reference.margin)) > 1e-3


def test_flips_with_and_without_the_noise_probes(bf16_run):
    _, out = bf16_run
    record, probes = load_record(out), make_probes()
    cache = BaseCache.load(out / "forgetwatch" / "base.parquet")
    floor = NoiseFloor.from_outcomes(cache.results.outcome, cache.reference.outcome)
    k = np.array([p.num_choices for p in probes])
    cats = [p.category for p in probes]
    keep = ~floor.mask
    for step, row in metric_rows(record).items():
        overall = row["metrics"]["overall"]
        assert overall["noise_probes"] == floor.count
        assert overall["min_detectable_forgetting"] == min_detectable_forgetting(len(probes), floor.count)
        now = record.read_eval(step)["outcome"]
        clean = compute_report(cache.results.outcome[keep], now[keep], k[keep], [c for c, m in zip(cats, keep, strict=True) if m])
        assert overall["forgetting_excl_noise"] == pytest.approx(clean["overall"].forgetting)
        assert overall["forgetting_adjusted_excl_noise"] == pytest.approx(clean["overall"].forgetting_adjusted)


def test_fp32_training_has_an_empty_noise_floor_and_no_reference(tokenizer, tmp_path):
    trainer = sft_trainer(tokenizer, tmp_path, [watcher()], bf16=False, max_steps=2)
    trainer.train()
    cache = BaseCache.load(tmp_path / "forgetwatch" / "base.parquet")
    assert cache.key["scoring"]["precision"] == "float32" and cache.reference is None
    rows = metric_rows(load_record(tmp_path))
    assert all(r["metrics"]["overall"]["noise_probes"] == 0 for r in rows.values())
    assert all(r["metrics"]["overall"]["forgetting_excl_noise"] == r["metrics"]["overall"]["forgetting"] for r in rows.values())
