"""LoRA with PEFT, the most common SFT setup: what is scored is the adapted model, the base cache is the base model's,
and training is bit-identical with and without the callback."""

from __future__ import annotations

import numpy as np
import pytest

peft = pytest.importorskip("peft")
pytest.importorskip("trl")

from conftest import build_model  # noqa: E402,I001  (tests/ is on sys.path)
from fixtures.trainers import SEED, assert_same_weights, make_probes, rescore, sft_dataset, sft_trainer, watcher  # noqa: E402

from forgetwatch import BaseCache, load_record  # noqa: E402
from forgetwatch.scoring.models import model_identity  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


def lora_trainer(tokenizer, out, callbacks=()):
    model = build_model(tokenizer, seed=SEED)
    config = peft.LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "down_proj"], task_type="CAUSAL_LM")
    return sft_trainer(tokenizer, out, callbacks, model=peft.get_peft_model(model, config), learning_rate=5e-2, max_steps=4)


@pytest.fixture(scope="module")
def lora_runs(tokenizer, tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    cb = watcher()
    with_cb = lora_trainer(tokenizer, root / "with", [cb])
    with_cb.train()
    without = lora_trainer(tokenizer, root / "without")
    without.train()
    return with_cb, without, cb, root


def test_lora_adapted_model_is_what_is_scored(lora_runs, tokenizer):
    trainer, _, cb, root = lora_runs
    model = trainer.model
    assert isinstance(model, peft.PeftModel)
    record = load_record(root / "with")
    assert record.eval_steps() == [0, 2, 4]
    final = rescore(model, tokenizer, make_probes())  # bf16 autocast, as in TRL's loop
    assert np.array_equal(final.outcome, record.read_eval(4)["outcome"])
    with model.disable_adapter():  # the base model underneath: what step 0 saw
        base = rescore(model, tokenizer, make_probes())
    assert np.array_equal(base.outcome, record.read_eval(0)["outcome"])
    assert not np.allclose(final.gold_logprob, base.gold_logprob)  # the adapters changed the scores


def test_lora_base_cache_is_the_base_models(lora_runs, tokenizer):
    _, _, _, root = lora_runs
    key = BaseCache.load(root / "with" / "forgetwatch" / "base.parquet").key
    assert key["model"] == model_identity(build_model(tokenizer, seed=SEED))


def test_lora_training_is_bit_identical_with_and_without_the_callback(lora_runs):
    with_cb, without, _, _ = lora_runs
    assert_same_weights(with_cb.model, without.model)


def test_merged_lora_scores_the_same_as_the_adapter_model(lora_runs, tokenizer):
    """merge_and_unload() folds B·A into W: the same function up to float rounding, so the same scores in fp32.

    After training, accelerate leaves its mixed-precision wrapper on the model's forward (bf16 autocast here, TRL's
    default), so `trainer.model` keeps running in bf16 when called outside the loop, and log-likelihoods differ from
    the fp32 merged copy by up to 4.4e-3 (the merge itself is exact: 0.0 difference in logits once unwrapped). The
    comparison is fp32 on both sides: the wrapper is removed as accelerate documents (keep_fp32_wrapper=False)."""
    import copy

    from accelerate.utils import extract_model_from_parallel

    from forgetwatch.scoring.score import ScoringConfig, score_probes

    trainer, _, _, _ = lora_runs
    # in place: a deep copy would keep calling the original's forward through the wrapper's closure
    adapted = extract_model_from_parallel(trainer.model, keep_fp32_wrapper=False).eval()
    assert not hasattr(adapted.forward, "__wrapped__")
    merged = copy.deepcopy(adapted).merge_and_unload().eval()
    assert not isinstance(merged, peft.PeftModel)
    probes = make_probes()
    config = ScoringConfig(mcq_mode="loglik", short_mode="greedy_match")
    a = score_probes(adapted, tokenizer, probes, config)
    b = score_probes(merged, tokenizer, probes, config)
    near_tie = np.abs(a.margin) < 1e-4
    mcq = ~np.isnan(a.margin)
    assert mcq.sum() > 0
    np.testing.assert_array_equal(a.outcome[~near_tie], b.outcome[~near_tie])
    np.testing.assert_allclose(a.gold_logprob, b.gold_logprob, atol=1e-4, rtol=0, equal_nan=True)
    np.testing.assert_allclose(a.margin[mcq], b.margin[mcq], atol=1e-4, rtol=0)
    with_adapters_off = score_probes(build_model(tokenizer, seed=SEED), tokenizer, probes, config)
    assert np.nanmax(np.abs(a.gold_logprob - with_adapters_off.gold_logprob)) > 1e-2  # the adapters matter here


def test_sft_trainer_peft_config_is_scored_as_the_adapted_model(tokenizer, tmp_path):
    """The way docs/lora.md shows: a base model and `SFTTrainer(peft_config=LoraConfig(...))`, the callback unchanged.
    TRL wraps the model itself; the callback scores the adapted model and caches the base model's scores."""
    import torch

    torch.manual_seed(SEED)  # LoRA's A matrices start random
    base = build_model(tokenizer, seed=SEED)
    config = peft.LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "down_proj"], task_type="CAUSAL_LM")
    from trl import SFTTrainer

    args = sft_trainer(tokenizer, tmp_path / "run", model=base, max_steps=4).args  # the other tests' SFTConfig
    trainer = SFTTrainer(model=base, args=args, train_dataset=sft_dataset(), processing_class=tokenizer,
                         peft_config=config, callbacks=[watcher()])
    trainer.train()
    model = trainer.model
    assert isinstance(model, peft.PeftModel)
    record = load_record(tmp_path / "run")
    assert record.eval_steps() == [0, 2, 4]
    assert np.array_equal(rescore(model, tokenizer, make_probes()).outcome, record.read_eval(4)["outcome"])
    with model.disable_adapter():
        assert np.array_equal(rescore(model, tokenizer, make_probes()).outcome, record.read_eval(0)["outcome"])
    key = BaseCache.load(tmp_path / "run" / "forgetwatch" / "base.parquet").key
    assert key["model"] == model_identity(build_model(tokenizer, seed=SEED))
    assert record.read_metrics()[-1]["metrics"]["overall"]["kl"] > 0  # the adapters changed what is scored
