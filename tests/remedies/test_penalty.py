"""The explicit 1→0 penalty (issue 30, item 2): margins in the scoring form, the base's margins read when training
begins, a hinge that pulls back items slipping toward a flip, the trajectory untouched at beta 0, resume."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest
import torch
from conftest import build_model
from conftest import penalty_pool as pool
from fixtures.remedies import remedy_trainer
from fixtures.trainers import make_probes

from forgetwatch import ForgetWatchCallback, Probe, ProbeSet, score_probes
from forgetwatch.record.store import RunRecord
from forgetwatch.remedies.penalty import BASE_FILE, MarginPenalty
from forgetwatch.scoring.score import ScoringConfig

pytest.importorskip("trl")
pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.filterwarnings("ignore:`gradient_checkpointing.*` is deprecated:FutureWarning")]


def penalty(tokenizer, beta=1.0, **kw) -> MarginPenalty:
    kw.setdefault("strategy", "uniform")
    return MarginPenalty(pool(), beta=beta, ratio=1.0, tokenizer=tokenizer, **kw)


def test_margins_are_the_scoring_forms(tokenizer):
    """The penalty's differentiable margins equal log-likelihood scoring's, item by item; short answers are left out."""
    p = penalty(tokenizer)
    assert [x.id for x in p.items] == [x.id for x in pool() if x.kind == "mcq"]
    model = build_model(tokenizer)
    rows = list(range(len(p.items)))
    with torch.no_grad():
        mine = p.margins(model, rows).numpy()
    scored = score_probes(model, tokenizer, p.items, ScoringConfig(mcq_mode="loglik"))
    np.testing.assert_allclose(mine, scored.margin, atol=2e-4)
    assert p.margins(model, [0, 3]).requires_grad


def test_the_base_margins_are_read_before_the_first_step_and_kept(tokenizer, tmp_path):
    from trl import SFTTrainer

    p = penalty(tokenizer)
    t = remedy_trainer(SFTTrainer, tokenizer, tmp_path, loss_term=p, max_steps=2)
    assert p in t.callback_handler.callbacks  # add_loss_term adds the penalty's callback too
    t.train()
    base = score_probes(build_model(tokenizer), tokenizer, p.items, ScoringConfig(mcq_mode="loglik"))
    right = base.outcome == 1
    assert 0 < right.sum() < len(right)  # some items the base knew, some not: both cases are exercised
    np.testing.assert_allclose(p.base_margin[right], base.margin[right], atol=2e-4)  # padded rows vs packed: as above
    assert np.isnan(p.base_margin[~right]).all()
    saved = json.loads((tmp_path / "forgetwatch" / BASE_FILE).read_text())
    assert saved["ids"] == [x.id for x in p.items] and [m is None for m in saved["margin"]] == list(~right)


def test_the_penalty_pulls_back_and_at_beta_zero_changes_nothing(tokenizer, tmp_path):
    from trl import SFTTrainer

    plain = remedy_trainer(SFTTrainer, tokenizer, tmp_path / "plain")
    plain.train()
    zero = penalty(tokenizer, beta=0.0)
    z = remedy_trainer(SFTTrainer, tokenizer, tmp_path / "zero", loss_term=zero, callbacks=[zero])
    z.train()
    for a, b in zip(plain.model.parameters(), z.model.parameters(), strict=True):
        assert torch.equal(a, b)
    strong = penalty(tokenizer, beta=20.0, floor=5.0)
    s = remedy_trainer(SFTTrainer, tokenizer, tmp_path / "strong", loss_term=strong, callbacks=[strong])
    s.train()
    logged = [h for h in s.state.log_history if "penalty_hinge" in h]
    assert len(logged) == 4 and all("loss" in h and 0 <= h["penalty_active"] <= 1 for h in logged)

    def shortfall(model) -> float:  # how far the items the base knew are below their targets
        with torch.no_grad():
            now = strong.margins(model, list(range(len(strong.items)))).numpy()
        known = np.isfinite(strong.base_margin)
        target = np.minimum(strong.base_margin[known], strong.floor)
        return float(np.maximum(target - now[known], 0).sum())

    assert shortfall(s.model) < shortfall(plain.model)


def test_resume_reads_the_base_margins_back_and_draws_the_same(tokenizer, tmp_path):
    from trl import SFTTrainer

    def run(out, resume_from=None, beta=5.0, base_cache=None):
        watch = ForgetWatchCallback(make_probes(), eval_steps=2, max_new_tokens=4, base_cache=base_cache)
        p = MarginPenalty(pool(), beta=beta, ratio=0.5, monitor=watch, tokenizer=tokenizer)
        t = remedy_trainer(SFTTrainer, tokenizer, out, loss_term=p, callbacks=[watch, p], save_strategy="steps",
                     save_steps=2)
        t.train(resume_from_checkpoint=resume_from)
        return t.model, p, RunRecord(out / "forgetwatch").read_mix()

    whole, p_whole, mix = run(tmp_path / "whole")
    assert any(m["kind"].startswith("1→0 penalty") for m in mix["mixers"])
    shutil.copytree(tmp_path / "whole", tmp_path / "cut")
    cut = tmp_path / "cut" / "checkpoint-6"
    resumed, p_cut, _ = run(tmp_path / "cut", resume_from=str(cut))
    np.testing.assert_array_equal(p_cut.base_margin, p_whole.base_margin)  # read back, not scored on a trained model
    for a, b in zip(whole.parameters(), resumed.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6)
    # every checkpoint carries them: a resume finds them there when the run's own copy is gone, and `True` finds the last
    (tmp_path / "cut" / "forgetwatch" / BASE_FILE).unlink()
    assert json.loads((cut / BASE_FILE).read_text())["ids"] == [p.id for p in p_whole.items]
    _, p_again, _ = run(tmp_path / "cut", resume_from=True)
    np.testing.assert_array_equal(p_again.base_margin, p_whole.base_margin)
    # a checkpoint copied elsewhere resumes into another output_dir (the watcher given the first run's base cache)
    shutil.copytree(cut, tmp_path / "elsewhere" / "ckpt")
    moved_model, p_moved, _ = run(tmp_path / "moved", resume_from=str(tmp_path / "elsewhere" / "ckpt"),
                                  base_cache=str(tmp_path / "whole" / "forgetwatch" / "base.parquet"))
    np.testing.assert_array_equal(p_moved.base_margin, p_whole.base_margin)
    assert (tmp_path / "moved" / "forgetwatch" / BASE_FILE).is_file()
    assert (tmp_path / "moved" / "checkpoint-8" / BASE_FILE).is_file()  # and its own checkpoints carry them on
    for a, b in zip(whole.parameters(), moved_model.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6)
    for where in ("forgetwatch", "checkpoint-6"):
        (tmp_path / "cut" / where / BASE_FILE).unlink(missing_ok=True)
    with pytest.raises(ValueError, match=f"resuming at step 6 needs the base's margins.*{BASE_FILE}.*checkpoint-6"):
        run(tmp_path / "cut", resume_from=str(cut))
    # off (beta 0) it reads no margins, and a resume needs none
    run(tmp_path / "cut", resume_from=str(cut), beta=0.0)


@pytest.mark.parametrize("kwargs, says", [
    ({"beta": -1.0}, "must be a number >= 0"),
    ({"ratio": 0}, "`ratio`"),
    ({"floor": 0}, "`floor`"),
    ({"strategy": "closed_loop"}, "pass `monitor=`"),
    ({"tokenizer": None}, "needs the trainer's `tokenizer`"),
])
def test_bad_settings_are_refused(tokenizer, kwargs, says):
    args = {"beta": 1.0, "tokenizer": tokenizer, "strategy": "uniform", **kwargs}
    with pytest.raises(ValueError, match=says):
        MarginPenalty(pool(), **args)


def test_a_pool_without_multiple_choice_or_holding_monitored_probes(tokenizer):
    shorts = ProbeSet([Probe("s", "short", "2 + 2?", answers=("4",), category="add")])
    with pytest.raises(ValueError, match="holds no multiple-choice items"):
        MarginPenalty(shorts, beta=1.0, strategy="uniform", tokenizer=tokenizer)
    watch = ForgetWatchCallback(make_probes(), eval_steps=2)
    p = MarginPenalty(ProbeSet([*make_probes(), *pool()]), beta=1.0, monitor=watch, tokenizer=tokenizer)
    assert not {x.id for x in p.items} & set(watch.probes.ids)  # the monitored probes are held out


@pytest.mark.parametrize("floor", [50.0, math.inf])
def test_under_bf16_the_base_itself_is_not_pulled(tokenizer, tmp_path, floor):
    """At learning rate 0 the model stays the base, so the penalty must stay at 0 at every step. It did not under bf16
    mixed precision while the base's margins were read in fp32 by the scoring form's packed forward and the current
    ones under the trainer's autocast, padded (review of issue 30: 3 of 4 items pulled at the base); they are now read
    by the same forward, at the first micro-batch."""
    from trl import SFTTrainer

    p = penalty(tokenizer, floor=floor)  # every item the base knew defended at its full base margin: the strictest case
    t = remedy_trainer(SFTTrainer, tokenizer, tmp_path, loss_term=p, callbacks=[p], max_steps=4, learning_rate=0.0,
                 bf16=True, logging_steps=1)
    t.train()
    hinges = [h["penalty_hinge"] for h in t.state.log_history if "penalty_hinge" in h]
    assert len(hinges) >= 3 and np.isfinite(p.base_margin).sum() > 0
    assert max(hinges) == 0.0, hinges


def test_a_monitor_scoring_another_form_is_told_what_the_penalty_defends(tokenizer, caplog):
    """The penalty defends the summed log-likelihood margin; a monitor that counts flips by letters (or generation)
    measures another margin, and the user is told so (a second review of issue 30)."""
    import logging

    with caplog.at_level(logging.WARNING, logger="forgetwatch.remedies.penalty"):
        MarginPenalty(pool(), beta=1.0, monitor=ForgetWatchCallback(make_probes(), eval_steps=2), tokenizer=tokenizer)
    assert "defends the summed log-likelihood" not in caplog.text
    with caplog.at_level(logging.WARNING, logger="forgetwatch.remedies.penalty"):
        MarginPenalty(pool(), beta=1.0, monitor=ForgetWatchCallback(make_probes(), eval_steps=2, mcq_mode="letter"),
                      tokenizer=tokenizer)
    assert "scores multiple choice by 'letter'" in caplog.text


def _pulling(tokenizer, beta, scale):
    """A penalty whose every item the base knew pulls now: targets set above today's margins."""
    p = penalty(tokenizer, beta=beta, floor=math.inf, scale=scale)
    model = build_model(tokenizer)
    with torch.no_grad():
        now = p.margins(model, list(range(len(p.items)))).numpy()
    p.base_margin = now + 1.0
    return p, model


def _grad(loss, model):
    return torch.cat([g.flatten() for g in torch.autograd.grad(loss, list(model.parameters()), retain_graph=True)])


@pytest.mark.parametrize("beta", [0.5, 1.0, 3.0])
def test_task_gradient_scale_makes_beta_the_penalty_share_of_the_step(tokenizer, beta):
    """§18 found beta 1 = beta 3: the hinge's gradient was 13-100 times the task loss's, and clipping to norm 1 made a
    step where it pulled the penalty's whatever beta. With scale="task_gradient" the term joins the loss so that its
    gradient's norm is exactly beta times the task loss's at that micro-batch (the direction is the hinge's)."""
    p, model = _pulling(tokenizer, beta, "task_gradient")
    batch = tokenizer(["Q: what is 2 + 2? A: 4", "Q: the capital of France? A: Paris"], return_tensors="pt", padding=True)
    task = model(**batch, labels=batch["input_ids"]).loss
    term = p.loss(model, micro_batch=0, batch_size=4)
    raw = _grad(term, model)
    scaled = p.rescale(term, task, model)
    g_task, g_term = _grad(task, model), _grad(scaled, model)
    assert float(g_term.norm() / g_task.norm()) == pytest.approx(beta, rel=1e-4)
    assert float(torch.nn.functional.cosine_similarity(g_term, raw, dim=0)) == pytest.approx(1.0, abs=1e-4)
    logged = p.pop_logs()["penalty_grad_ratio"]  # the hinge's own gradient over the task's, as the loss weighting had it
    assert logged == pytest.approx(float(raw.norm() / beta / g_task.norm()), rel=1e-3)
    # scale="loss" is the hinge in nats, as §18 ran it: untouched
    q, _ = _pulling(tokenizer, beta, "loss")
    assert q.rescale(term, task, model) is term


def test_under_clipping_beta_changes_the_trained_model_only_with_task_gradient(tokenizer, tmp_path):
    """The bug of §18 in a real run: with every step pulled and clipped (max_grad_norm 1), the loss weighting trains
    nearly the same model at beta and 3 x beta once the hinge outweighs the task; relative to the task's gradient,
    beta 1 and 3 are different steps. Plain SGD, so that the clip is the whole story (Adam's per-coordinate scaling
    would blur it)."""
    from trl import SFTTrainer

    def train(beta, scale):
        p, _ = _pulling(tokenizer, beta, scale)
        base = p.base_margin.copy()
        p.on_train_begin = lambda *a, **k: None  # keep the targets set above (every item pulls)
        t = remedy_trainer(SFTTrainer, tokenizer, tmp_path / f"{scale}-{beta}", loss_term=p, callbacks=[p], max_steps=6,
                     max_grad_norm=1.0, learning_rate=0.5, optim="sgd")
        p.base_margin = base
        t.train()
        return torch.cat([x.detach().flatten() for x in t.model.parameters()]), t

    start = torch.cat([x.detach().flatten() for x in build_model(tokenizer).parameters()])
    gaps = {}
    # the loss weighting where the hinge outweighs the task (here at beta 40; §18's real runs were there at beta 1)
    for scale, low in (("loss", 40.0), ("task_gradient", 1.0)):
        one, t = train(low, scale)
        three, _ = train(3 * low, scale)
        gaps[scale] = float((three - one).norm() / (one - start).norm())
    ratios = [h["penalty_grad_ratio"] for h in t.state.log_history if "penalty_grad_ratio" in h]
    assert ratios and min(ratios) > 1  # the hinge's own gradient outweighs the task's
    assert gaps["loss"] < 0.05, gaps  # the clip made beta 120 the same step as beta 40
    assert gaps["task_gradient"] > 0.2, gaps


@pytest.mark.parametrize("args, env, says", [
    ({"fsdp": "full_shard"}, {}, "under FSDP / DeepSpeed"),
    ({"deepspeed": "ds.json"}, {}, "under FSDP / DeepSpeed"),
    ({}, {"ACCELERATE_USE_FSDP": "true"}, "under FSDP / DeepSpeed"),  # `accelerate launch` sets only the environment
    ({}, {"ACCELERATE_USE_DEEPSPEED": "True"}, "under FSDP / DeepSpeed"),
    ({"gradient_checkpointing": True, "gradient_checkpointing_kwargs": {"use_reentrant": True}}, {}, "use_reentrant"),
])
def test_task_gradient_refuses_what_it_cannot_measure_before_training(tokenizer, tmp_path, monkeypatch, args, env, says):
    """Sharded gradients and reentrant checkpointing are refused when training begins, with what to do instead; the
    nats weighting (scale="loss") is not refused."""
    from types import SimpleNamespace

    from transformers import TrainerState

    for key, value in env.items():
        monkeypatch.setenv(key, value)

    full = {"fsdp": "", "deepspeed": None, "gradient_checkpointing": False, "gradient_checkpointing_kwargs": None,
            "output_dir": str(tmp_path), **args}
    with pytest.raises(ValueError, match=says):
        penalty(tokenizer).on_train_begin(SimpleNamespace(**full), TrainerState(), None, model=build_model(tokenizer))
    penalty(tokenizer, scale="loss").on_train_begin(SimpleNamespace(**full), TrainerState(), None,
                                                    model=build_model(tokenizer))


def test_reentrant_checkpointing_set_on_the_model_is_refused_before_training(tokenizer, tmp_path):
    """Checkpointing the trainer's arguments do not show (transformers < 5 makes `gradient_checkpointing=True`
    reentrant by default; a front-end may enable it on the model) is found on the model's layers; non-reentrant passes."""
    from types import SimpleNamespace

    from transformers import TrainerState

    args = SimpleNamespace(fsdp="", deepspeed=None, gradient_checkpointing=False, gradient_checkpointing_kwargs=None,
                           output_dir=str(tmp_path))
    model = build_model(tokenizer)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    with pytest.raises(ValueError, match="use_reentrant"):
        penalty(tokenizer).on_train_begin(args, TrainerState(), None, model=model)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    penalty(tokenizer).on_train_begin(args, TrainerState(), None, model=model)


def test_no_scale_to_set_it_by_skips_the_micro_batch(tokenizer):
    """A task loss whose gradient vanished gives no scale: the micro-batch goes without the penalty (a zero term), not
    with the nats weighting that would outweigh the task."""
    p, model = _pulling(tokenizer, 1.0, "task_gradient")
    term = p.loss(model, micro_batch=0, batch_size=4)
    task = sum(x.sum() for x in model.parameters()) * 0.0  # a loss with no gradient
    out = p.rescale(term, task, model)
    assert float(out) == 0.0 and out.requires_grad
