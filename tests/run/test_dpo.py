"""The preference stage: `ForgetWatchCallback` in TRL's `DPOTrainer` (a real one, on the tiny model): the policy is
scored, the reference model is untouched, and the trajectory is the one without the callback."""

from __future__ import annotations

import pytest
import torch
from conftest import build_model
from fixtures.remedies import preference_pairs
from fixtures.trainers import SEED, assert_same_weights, make_probes, watcher

from forgetwatch.record.store import load_record

pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.filterwarnings("ignore:`gradient_checkpointing.*` is deprecated:FutureWarning"),
              pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing.*:FutureWarning")]




def dpo_trainer(tokenizer, out, callbacks=(), **overrides):
    from trl import DPOConfig, DPOTrainer

    kwargs = {"output_dir": str(out), "use_cpu": True, "max_steps": 4, "per_device_train_batch_size": 4,
              "learning_rate": 5e-2, "logging_steps": 1, "report_to": "none", "save_strategy": "no", "seed": SEED,
              "disable_tqdm": True, "max_length": 64, "bf16": False}
    kwargs.update(overrides)
    # the reference passed as an instance (TRL would load it again from the policy's path, and this one has none)
    return DPOTrainer(model=build_model(tokenizer, seed=SEED), ref_model=build_model(tokenizer, seed=SEED),
                      args=DPOConfig(**kwargs), train_dataset=preference_pairs(), processing_class=tokenizer,
                      callbacks=list(callbacks))


def test_dpo_scores_the_policy_leaves_the_reference_and_the_trajectory_alone(tokenizer, tmp_path):
    watched = dpo_trainer(tokenizer, tmp_path / "watched", [watcher(eval_steps=2)])
    reference = {k: v.clone() for k, v in watched.ref_model.state_dict().items()}
    watched.train()
    plain = dpo_trainer(tokenizer, tmp_path / "plain")
    plain.train()

    assert_same_weights(watched.model, plain.model)  # the callback changed nothing of the policy's training
    losses = lambda t: [(e["step"], e["loss"]) for e in t.state.log_history if "loss" in e]  # noqa: E731
    assert losses(watched) == losses(plain) and len(losses(plain)) == 4
    for name, t in watched.ref_model.state_dict().items():  # the frozen reference: scoring never touches it
        assert torch.equal(t, reference[name]), name

    record = load_record(tmp_path / "watched")
    assert record.eval_steps() == [0, 2, 4]
    # the policy is what was scored: at step 4 its scores are those of the trained model, not of the base
    from forgetwatch.scoring.score import ScoringConfig, score_probes

    step4 = record.read_results(4, make_probes().ids)
    now = score_probes(watched.model, tokenizer, make_probes(), ScoringConfig(max_new_tokens=4))
    base = record.read_results(0, make_probes().ids)
    assert (step4.outcome == now.outcome).all()
    assert not all((a == b).all() for a, b in zip(step4.option_scores, base.option_scores, strict=True))
