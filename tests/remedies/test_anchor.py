"""Self-distilled replay and the KL anchor (issue 21): the base's outputs made once and keyed, replay in the scoring form,
the anchor's term in real Trainer and SFTTrainer runs (tiny model), and bad input refused before training."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from datasets import Dataset
from fixtures.remedies import chat_dataset, make_pool, remedy_trainer
from fixtures.trainers import make_probes

from forgetwatch import ForgetWatchArguments, ForgetWatchCallback
from forgetwatch.probes.probe_set import Probe
from forgetwatch.record.replay import training_example
from forgetwatch.record.store import RunRecord
from forgetwatch.remedies import mix_replay, needs_base_outputs
from forgetwatch.remedies.anchor import KLAnchor, check_beta, topk_kl
from forgetwatch.remedies.base_outputs import BaseOutputs, load_or_make, make_base_outputs
from forgetwatch.scoring.score import ScoringConfig, score_probes

pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.filterwarnings("ignore:`gradient_checkpointing.*` is deprecated:FutureWarning")]


# -- the KL on the top k ----------------------------------------------------------------------------------------
def test_topk_kl_is_the_full_kl_when_k_is_the_vocabulary_and_a_lower_bound_below():
    g = torch.Generator().manual_seed(0)
    base_logits, logits = torch.randn(5, 50, generator=g), torch.randn(5, 50, generator=g)
    base = torch.log_softmax(base_logits, -1)
    full = (base.exp() * (base - torch.log_softmax(logits, -1))).sum(-1)
    ids = base.argsort(-1, descending=True)
    exact = topk_kl(logits, ids, base.gather(-1, ids))
    assert torch.allclose(exact, full, atol=1e-5)
    for k in (1, 5, 20):
        bound = topk_kl(logits, ids[:, :k], base.gather(-1, ids[:, :k]))
        assert (bound <= full + 1e-6).all() and (bound >= 0).all()
    assert torch.allclose(topk_kl(base_logits, ids[:, :5], base.gather(-1, ids[:, :5])), torch.zeros(5), atol=1e-6)


# -- base outputs ----------------------------------------------------------------------------------------------
def pool_probes() -> list[Probe]:
    return list(make_pool()) + [Probe("pool-ask", "comply", "Tell me about cats.", category="chat")]


@pytest.fixture(scope="module")
def outputs(tokenizer):
    from conftest import build_model

    model = build_model(tokenizer, seed=0)
    return model, make_base_outputs(model, tokenizer, pool_probes(), max_length=64, max_new_tokens=200)


def test_base_outputs_are_the_base_answers_as_scored(tokenizer, outputs):
    model, outs = outputs
    probes = {p.id: p for p in pool_probes()}
    scored = score_probes(model, tokenizer, [p for p in probes.values() if p.kind == "mcq"], ScoringConfig(mcq_mode="loglik"))
    chosen = dict(zip(scored.ids, scored.prediction, strict=True))
    rows = {r["id"]: r for r in outs.rows}
    for pid, answer in chosen.items():  # multiple choice: the option the base ranks first, and its whole distribution
        r = rows[pid]
        assert r["answer"] == answer and r["user"] == f"Question: {probes[pid].question}"
        assert math.isclose(sum(r["option_probs"]), 1, rel_tol=1e-6) and np.argmax(r["option_probs"]) == probes[
            pid
        ].choices.index(answer)
    # the top-k log-probabilities are the base's, at the positions that predict the answer's tokens
    r = rows["pool-add0"]
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([r["input_ids"]])).logits[0].float(), -1)
    values, ids = logp[r["start"] - 1: len(r["input_ids"]) - 1].topk(20, -1)
    assert np.array_equal(r["topk_ids"], ids.numpy()) and np.allclose(r["topk_logprobs"], values.numpy(), atol=1e-5)
    assert tokenizer.decode(r["input_ids"][r["start"]:]).startswith(r["answer"])


def test_base_outputs_round_trip_and_are_never_overwritten(tokenizer, outputs, tmp_path):
    _, outs = outputs
    path = outs.save(tmp_path / "outs.parquet")
    back = BaseOutputs.load(path, expect=outs.key)
    assert [r["answer"] for r in back.rows] == [r["answer"] for r in outs.rows]
    assert all(np.array_equal(a["topk_ids"], b["topk_ids"]) for a, b in zip(back.rows, outs.rows, strict=True))
    with pytest.raises(FileExistsError, match="never overwritten"):
        outs.save(path)
    other = {**outs.key, "pool": {"fingerprint": "0" * 16, "n": 3}}
    with pytest.raises(ValueError, match=r"pool\.fingerprint"):
        BaseOutputs.load(path, expect=other)


def test_load_or_make_reuses_a_match_and_refuses_another_pool_or_tokenizer(tokenizer, outputs, tmp_path):
    from conftest import build_tokenizer

    model, outs = outputs
    path = outs.save(tmp_path / "outs.parquet")
    assert len(load_or_make(path, model, tokenizer, pool_probes())) == len(outs)  # no model call: read back
    with pytest.raises(ValueError, match=r"made for another pool:\n  pool"):
        load_or_make(path, model, tokenizer, pool_probes()[:-1])
    other = build_tokenizer()
    other.chat_template = other.chat_template.replace("<|im_start|>", "<|im_start|> ")
    with pytest.raises(ValueError, match=r"tokenizer\.chat_template"):
        load_or_make(path, model, other, pool_probes())


def test_a_file_made_with_a_shorter_max_length_is_said(tokenizer, outputs, tmp_path, caplog):
    model, outs = outputs  # made with max_length 64
    path = outs.save(tmp_path / "outs.parquet")
    load_or_make(path, model, tokenizer, pool_probes(), max_length=128)
    assert "was made with max_length=64, below this run's 128" in caplog.text


def test_the_anchor_is_zero_on_the_model_that_made_the_outputs(tokenizer, outputs):
    """Its term reads the base's log-probabilities at the positions that predict each answer token: on the base itself
    the KL is 0 (an off-by-one would make it large), and the gradient flows."""
    import copy

    model, outs = outputs
    model = copy.deepcopy(model)  # the fixture's model stays the base
    anchor = KLAnchor(outs, beta=1.0, ratio=4.0, strategy="uniform", tokenizer=tokenizer, model=model)
    with torch.no_grad():
        base_loss = anchor.loss(model, 0, 2)
    assert abs(float(base_loss)) < 1e-4
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    moved = anchor.loss(model, 1, 2)
    moved.backward()
    assert float(moved.detach()) > 0.01 and model.lm_head.weight.grad.abs().sum() > 0


def test_a_pool_prompt_longer_than_max_length_is_refused_by_name(tokenizer, tiny_model):
    long = Probe("pool-long", "mcq", "Why? " * 80, ("a", "b"), 0, category="add")
    with pytest.raises(ValueError, match=r"pool-long \(\d+ tokens\).*Raise max_length"):
        make_base_outputs(tiny_model, tokenizer, [*make_pool(), long], max_length=64)


def test_unlabelled_prompts_are_a_pool(tokenizer, tiny_model, tmp_path, caplog):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"Write about topic {i}.", "category": "chat"}) + "\n" for i in range(3)))
    # the random model never ends its turn: answers that ran to the limit are left out, and said
    outs = make_base_outputs(tiny_model, tokenizer, path, max_new_tokens=8)
    assert len(outs) == 0 and "leave out 3 answers that did not end within 8 tokens" in caplog.text
    # a model that ends at once (its end-of-turn token is the one it always predicts): every prompt is kept
    with torch.no_grad():
        tiny_model.model.norm.weight.zero_()  # every logit 0: the first token id wins
    tiny_model.generation_config.eos_token_id = 0
    outs = make_base_outputs(tiny_model, tokenizer, path, max_new_tokens=8)
    assert {r["kind"] for r in outs.rows} == {"prompt"} and len({r["id"] for r in outs.rows}) == len(outs.rows) == 3
    path.write_text(json.dumps({"text": "no prompt"}) + "\n")
    with pytest.raises(ValueError, match=r"prompts.jsonl line 1: needs a `prompt`"):
        make_base_outputs(tiny_model, tokenizer, path)


# -- replay forms ----------------------------------------------------------------------------------------------
def test_gold_replay_is_written_as_the_probes_are_scored():
    mcq = Probe("m", "mcq", "Which is red?", ("sky", "fire"), 1, category="c")
    ex = training_example(mcq, "scoring")
    assert ex["messages"] == [{"role": "user", "content": "Question: Which is red?"}, {"role": "assistant", "content": "fire"}]
    assert ex["text"] == "Question: Which is red?\nAnswer: fire"
    short = training_example(Probe("s", "short", "Capital of France?", answers=("Paris", "paris"), category="c"), "scoring")
    assert short["completion"] == [{"role": "assistant", "content": "Paris"}]
    assert training_example(mcq)["completion"][0]["content"] == "B. fire"  # replay.jsonl keeps the lettered form


def test_mix_replay_writes_sft_data_in_the_scoring_form_and_grpo_data_lettered():
    watch = ForgetWatchCallback(make_probes(), eval_steps=2)
    stream = mix_replay(chat_dataset(), make_pool(), ratio=0.5, strategy="uniform", monitor=watch)
    replayed = [stream.mixer.pool[c][0] for c in stream.mixer.categories]
    assert all("Answer with the letter" not in r["messages"][0]["content"] for r in replayed)
    assert {r["messages"][1]["content"] for r in replayed} <= {"left", "right", "yes"}
    grpo = Dataset.from_list([{"prompt": [{"role": "user", "content": "1 + 1?"}], "solution": "2"}])
    lettered = mix_replay(
        grpo, make_pool(), ratio=0.5, strategy="uniform", monitor=ForgetWatchCallback(make_probes(), eval_steps=2)
    )
    assert lettered.mixer.pool["add"][0]["solution"] in ("A", "B")


def test_self_distilled_replay_trains_the_base_answers(tokenizer, outputs):
    _, outs = outputs
    watch = ForgetWatchCallback(make_probes(), eval_steps=2)
    stream = mix_replay(chat_dataset(), outs, ratio=0.5, strategy="uniform", monitor=watch)
    answers = {(r["user"], r["answer"]) for r in outs.rows}
    pooled = [r for rows in stream.mixer.pool.values() for r in rows]
    assert pooled and all((r["messages"][0]["content"], r["messages"][1]["content"]) in answers for r in pooled)
    # categories the monitor does not measure cannot be steered: left out
    assert "chat" not in stream.mixer.categories


def test_a_pool_holding_a_monitored_probe_is_refused(tokenizer, tiny_model):
    outs = make_base_outputs(tiny_model, tokenizer, [*make_pool(), make_probes()[0]])
    watch = ForgetWatchCallback(make_probes(), eval_steps=2)
    with pytest.raises(ValueError, match="holds 1 monitored probes \\(add0\\)"):
        mix_replay(chat_dataset(), outs, ratio=0.5, monitor=watch)
    with pytest.raises(ValueError, match="holds 1 monitored probes \\(add0\\)"):
        KLAnchor(outs, beta=1.0, monitor=watch, tokenizer=tokenizer)


# -- the anchor: bad input -------------------------------------------------------------------------------------
@pytest.mark.parametrize("beta", [-0.1, float("nan"), "1", True])
def test_a_negative_or_non_number_beta_is_refused(beta):
    with pytest.raises(ValueError, match="`beta` must be a number >= 0"):
        check_beta(beta)
    with pytest.raises(ValueError, match="forgetwatch_anchor_beta"):
        ForgetWatchArguments(forgetwatch_probes="arc_easy", forgetwatch_anchor_beta=beta)


def test_options_are_checked_when_parsed(caplog):
    with pytest.raises(ValueError, match="forgetwatch_replay_targets must be one of gold, base"):
        ForgetWatchArguments(forgetwatch_replay_targets="teacher")
    with pytest.raises(ValueError, match=r"forgetwatch_anchor_ratio .* must be in \(0, 8\]"):
        ForgetWatchArguments(forgetwatch_anchor_ratio=0)
    args = ForgetWatchArguments(forgetwatch_probes="arc_easy", forgetwatch_anchor_beta=0.5)
    assert needs_base_outputs(args) and "anchor_beta" not in args.to_kwargs() and "base_outputs" not in args.to_kwargs()
    assert not needs_base_outputs(ForgetWatchArguments(forgetwatch_probes="arc_easy", forgetwatch_replay_targets="base"))
    assert "forgetwatch_replay_targets=base does nothing while forgetwatch_replay_mix is 0" in caplog.text


def test_an_anchor_on_outputs_of_another_tokenizer_or_model_is_refused(tokenizer, outputs):
    from conftest import build_model, build_tokenizer

    _, outs = outputs
    other = build_tokenizer()
    other.chat_template += " "
    with pytest.raises(ValueError, match=r"another model or tokenizer:\n  tokenizer\.chat_template"):
        KLAnchor(outs, beta=1.0, strategy="uniform", tokenizer=other)
    with pytest.raises(ValueError, match=r"model\.architecture"):
        KLAnchor(outs, beta=1.0, strategy="uniform", tokenizer=tokenizer, model=build_model(tokenizer, hidden=32))
    with pytest.raises(ValueError, match="fill max_length=8"):
        KLAnchor(outs, beta=1.0, strategy="uniform", tokenizer=tokenizer, max_length=8)
    with pytest.raises(ValueError, match="closed-loop anchor follows a monitor"):
        KLAnchor(outs, beta=1.0, tokenizer=tokenizer)


def test_draws_hold_the_ratio_on_every_prefix(tokenizer, outputs):
    _, outs = outputs
    anchor = KLAnchor(outs, beta=1.0, ratio=0.3, strategy="uniform", tokenizer=tokenizer)
    counts = [len(anchor.draws(m, 4)) for m in range(50)]
    assert all(abs(sum(counts[: m + 1]) - 0.3 * 4 * (m + 1)) < 1 for m in range(50))
    again = KLAnchor(outs, beta=1.0, ratio=0.3, strategy="uniform", tokenizer=tokenizer)
    assert [again.draws(m, 4) for m in range(10)] == [KLAnchor(outs, beta=1.0, ratio=0.3, strategy="uniform",
                                                               tokenizer=tokenizer).draws(m, 4) for m in range(10)]




def _pool_kl(model, anchor) -> float:
    """Mean per-token KL(base || model) over every anchored conversation (what the anchor pulls down)."""
    with torch.no_grad():
        kls = []
        for ids, start, top_ids, top_lp in anchor._seqs:
            logits = model(ids[None].to(model.device)).logits[0, start - 1: start - 1 + len(top_ids)]
            kls.append(float(topk_kl(logits, top_ids, top_lp).mean()))
    return float(np.mean(kls))


@pytest.mark.parametrize("sft", [True, False], ids=["SFTTrainer", "Trainer"])
def test_the_anchor_pulls_the_model_toward_the_base_on_the_pool(tokenizer, outputs, tmp_path, sft):
    """Same data, seed and steps: with the anchor the KL to the base on the pool ends lower; its term is logged."""
    from transformers import Trainer
    from trl import SFTTrainer

    _, outs = outputs
    cls = SFTTrainer if sft else Trainer
    plain = remedy_trainer(cls, tokenizer, tmp_path / "plain", sft=sft)
    plain.train()
    anchor = KLAnchor(outs, beta=5.0, ratio=1.0, strategy="uniform", tokenizer=tokenizer, model=plain.model)
    anchored = remedy_trainer(cls, tokenizer, tmp_path / "anchored", loss_term=anchor, sft=sft)
    anchored.train()
    assert _pool_kl(anchored.model, anchor) < 0.5 * _pool_kl(plain.model, anchor)
    logged = [h for h in anchored.state.log_history if "anchor_kl" in h]
    assert len(logged) == 4 and logged[0]["anchor_kl"] >= 0 and all("loss" in h for h in logged)


def test_an_anchor_at_beta_zero_leaves_the_trajectory_unchanged(tokenizer, outputs, tmp_path):
    from trl import SFTTrainer

    _, outs = outputs
    plain = remedy_trainer(SFTTrainer, tokenizer, tmp_path / "plain")
    plain.train()
    zero = remedy_trainer(SFTTrainer, tokenizer, tmp_path / "zero",
                    loss_term=KLAnchor(outs, beta=0.0, ratio=1.0, strategy="uniform", tokenizer=tokenizer))
    zero.train()
    for a, b in zip(plain.model.parameters(), zero.model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_gradient_accumulation_keeps_the_anchor_weight(tokenizer, outputs, tmp_path):
    """4 examples in one micro-batch or 2 x 2 accumulated: the same anchored conversations, the same gradient."""
    from trl import SFTTrainer

    _, outs = outputs

    def run(batch, accumulation, name):
        anchor = KLAnchor(outs, beta=5.0, ratio=0.5, strategy="uniform", tokenizer=tokenizer)
        # plain SGD: the update is the gradient itself (Adam's first steps are ~lr * sign, blind to a wrong factor)
        # another initialisation than the base's: the anchor's KL and its gradient are large from the first step
        t = remedy_trainer(SFTTrainer, tokenizer, tmp_path / name, loss_term=anchor, max_steps=2, optim="sgd",
                     per_device_train_batch_size=batch, gradient_accumulation_steps=accumulation, learning_rate=1.0,
                     model_seed=1)
        t.train()
        return t.model

    one, two = run(4, 1, "one"), run(2, 2, "two")
    diffs = [float((a - b).abs().max()) for a, b in zip(one.parameters(), two.parameters(), strict=True)]
    assert max(diffs) < 1e-5  # a wrong accumulation factor: 1.6e-3; summation order alone: ~5e-8


def test_a_closed_loop_anchor_follows_the_monitor_and_is_recorded(tokenizer, outputs, tmp_path):
    from trl import SFTTrainer

    _, outs = outputs
    watch = ForgetWatchCallback(make_probes(), eval_steps=2, max_new_tokens=4)
    anchor = KLAnchor(outs, beta=1.0, ratio=0.5, monitor=watch, tokenizer=tokenizer)
    remedy_trainer(SFTTrainer, tokenizer, tmp_path / "run", loss_term=anchor, callbacks=[watch]).train()
    mix = RunRecord(tmp_path / "run" / "forgetwatch").read_mix()["mixers"][0]
    assert mix["kind"] == "kl anchor: beta 1.0"
    assert mix["ratio"] == 0.5 and mix["categories"] == ["add", "compare", "count", "short"]
    assert [step for _, step, _ in mix["schedule"]] == [2, 4, 6, 8]
    assert anchor.sampler.weights == mix["weights"]


def test_the_cli_makes_base_outputs_once(tiny_model_dir, tmp_path, capsys):
    from forgetwatch.cli import main

    probes = tmp_path / "pool.jsonl"
    make_pool().to_jsonl(probes)
    out = tmp_path / "outs.parquet"
    assert main(["base-outputs", "--model", str(tiny_model_dir), "--pool", str(probes), "-o", str(out), "--device", "cpu"]) == 0
    assert "answers of" in capsys.readouterr().out and len(BaseOutputs.load(out)) > 0
    assert main(["base-outputs", "--model", str(tiny_model_dir), "--pool", str(probes), "-o", str(out), "--device", "cpu"]) == 2
    assert "never overwritten" in capsys.readouterr().err


def test_the_cli_refuses_suite_names_to_exclude_without_their_sample(tiny_model_dir, tmp_path, capsys):
    """A run monitors a sample of each suite: `--exclude arc_easy` alone would hold out every arc_easy probe."""
    from forgetwatch.cli import main

    out = tmp_path / "outs.parquet"
    args = [
        "base-outputs",
        "--model",
        str(tiny_model_dir),
        "--pool",
        "arc_easy:4",
        "--exclude",
        "arc_easy,triviaqa:3",
        "-o",
        str(out),
    ]
    assert main(args) == 2 and not out.exists()
    assert (
        "give the run's forgetwatch_per_suite and forgetwatch_seed as --exclude-per-suite N --exclude-seed S"
        in capsys.readouterr().err
    )
    assert main([*args, "--exclude-per-suite", "0"]) == 2
    assert "--exclude-per-suite must be a whole number >= 1 or `all`; got '0'" in capsys.readouterr().err


def test_resume_continues_the_anchor_draws(tokenizer, outputs, tmp_path):
    """Resumed from step 6's checkpoint, steps 7-8 anchor the same conversations, drawn by the same closed-loop weights,
    as the uninterrupted run."""
    import shutil

    from trl import SFTTrainer

    _, outs = outputs

    def run(out, resume=False):
        watch = ForgetWatchCallback(make_probes(), eval_steps=2, max_new_tokens=4)
        anchor = KLAnchor(outs, beta=1.0, ratio=0.5, monitor=watch, tokenizer=tokenizer)
        drawn, draws = [], anchor.draws
        anchor.draws = lambda m, b: drawn.append((m, r := draws(m, b))) or r
        t = remedy_trainer(SFTTrainer, tokenizer, out, loss_term=anchor, callbacks=[watch], save_strategy="steps",
                     save_steps=2)
        t.train(resume_from_checkpoint=str(out / "checkpoint-6") if resume else None)
        return drawn, RunRecord(out / "forgetwatch").read_mix()["mixers"][0]["schedule"], t.model

    whole, whole_schedule, whole_model = run(tmp_path / "whole")
    assert [m for m, _ in whole] == list(range(8)) and sum(len(r) for _, r in whole) == 16  # 0.5 x 4 examples x 8 steps
    shutil.copytree(tmp_path / "whole", tmp_path / "cut")
    resumed, schedule, model = run(tmp_path / "cut", resume=True)
    assert resumed == whole[6:] and schedule == whole_schedule
    for a, b in zip(whole_model.parameters(), model.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6)
