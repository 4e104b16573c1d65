"""Probes that do not fit the model's context: measured without running the model (`forgetwatch.scoring.fit`), refused before
the Trainer starts any logger (W&B offline, read back from disk), or dropped with `unfit_probes="drop"`.
"""

from __future__ import annotations

import json
import logging

import pytest

pytest.importorskip("trl")
pytest.importorskip("wandb")

from conftest import build_model  # noqa: E402,I001
from fixtures.trainers import SCORING, make_probes, sft_trainer  # noqa: E402
from fixtures.wandb_offline import find_run_file, find_run_files, finish_offline_run, read_config  # noqa: E402

from forgetwatch import BaseCache, Probe, ProbeSet, ProbeSetError, load_record, score_probes  # noqa: E402
from forgetwatch.run.callback import ForgetWatchCallback  # noqa: E402
from forgetwatch.scoring.fit import measure_fit, probe_lengths  # noqa: E402
from forgetwatch.scoring.score import ScoringConfig  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

LONG = "the quick brown fox " * 200  # ~800 tokens with the test tokenizer: past the tiny model's 512 positions


def with_long(n: int = 1) -> ProbeSet:
    long = [Probe(f"long{i}", "mcq", LONG + str(i), ("a", "b"), 0, category="long", source="longsuite") for i in range(n)]
    return ProbeSet([*make_probes(), *long])


@pytest.mark.parametrize("config", [
    ScoringConfig(max_new_tokens=4),  # loglik options, short answers by greedy match (read_next)
    ScoringConfig(mcq_mode="letter", short_mode="generate", max_new_tokens=7),
    ScoringConfig(mcq_mode="generate", chat_template=True, max_new_tokens=5),
], ids=["loglik", "letter", "generate"])
def test_the_measure_is_the_limit_the_engine_refuses_at(tokenizer, config):
    """At a context of exactly the longest probe's length every probe is scored; one token less and the engine refuses
    the probe the measure names. So the measure is the engine's own, mode by mode."""
    probes = ProbeSet(
        [
            *make_probes(),
            Probe(
                "ins",
                "instruct",
                "Write two words.",
                instructions=("length_constraints:number_words",),
                kwargs=({"relation": "at least", "num_words": 2},),
                category="ins",
            ),
        ]
    )
    lengths = probe_lengths(tokenizer, probes, config)
    assert set(lengths) == set(probes.ids)
    longest = max(lengths, key=lengths.get)
    model = build_model(tokenizer)
    model.config.max_position_embeddings = lengths[longest]
    assert measure_fit(model, tokenizer, probes, config).unfit == []
    assert len(score_probes(model, tokenizer, probes, config)) == len(probes)
    model.config.max_position_embeddings = lengths[longest] - 1
    assert longest in measure_fit(model, tokenizer, probes, config).unfit
    with pytest.raises(ProbeSetError, match=longest):
        score_probes(model, tokenizer, probes, config)


def test_a_probe_set_that_does_not_fit_is_refused_before_any_wandb_run(offline_wandb, tokenizer, tmp_path, caplog):
    """The refusal comes from the Trainer's constructor (on_init_end): W&B has no run, the output has no record, and
    the message names the probes, their suite, the context and both ways out."""
    out = tmp_path / "out"
    with caplog.at_level(logging.INFO, logger="forgetwatch"), pytest.raises(ProbeSetError) as e:
        sft_trainer(tokenizer, out, [ForgetWatchCallback(with_long(2), eval_steps=2, **SCORING)], report_to="wandb")
    text = str(e.value)
    assert "2 of 34 probe(s) do not fit the model's context of 512 tokens" in text
    assert "long0 (" in text and "longsuite: 2 of 2 over" in text  # the probes and their suite
    assert "here: add, compare, count, short" in text  # the suites that fit
    assert "unfit_probes='drop'" in text and "forgetwatch_unfit_probes: drop" in text
    assert find_run_files(offline_wandb) == []  # no W&B run was started
    assert not (out / "forgetwatch").exists()
    assert [r.getMessage() for r in caplog.records if r.name.startswith("forgetwatch")] == []


def test_added_later_it_is_refused_at_train_begin_or_when_asked_before(tokenizer, tmp_path):
    trainer = sft_trainer(tokenizer, tmp_path / "out", [], max_steps=1)
    callback = ForgetWatchCallback(with_long(), eval_steps=2, **SCORING)
    trainer.add_callback(callback)  # on_init_end has passed: checked in on_train_begin, after the report_to loggers
    with pytest.raises(ProbeSetError, match="1 of 33 probe"):
        callback.fit_probes(trainer.model, trainer.processing_class)  # before them, when the user asks
    with pytest.raises(ProbeSetError, match="1 of 33 probe"):
        trainer.train()
    assert not (tmp_path / "out" / "forgetwatch").exists()


def test_drop_scores_the_rest_and_says_so_in_the_record_the_cache_and_wandb(offline_wandb, tokenizer, tmp_path, caplog):
    probes = with_long(2)
    out = tmp_path / "out"
    callback = ForgetWatchCallback(probes, eval_steps=2, unfit_probes="drop", **SCORING)
    with caplog.at_level(logging.WARNING, logger="forgetwatch"):
        trainer = sft_trainer(tokenizer, out, [callback], report_to="wandb", max_steps=2)
    warnings = [r.getMessage() for r in caplog.records if r.name.startswith("forgetwatch")]
    assert len(warnings) == 1 and "2 of 34 probes do not fit the model's context of 512 tokens" in warnings[0]
    assert "longsuite: 2" in warnings[0]
    trainer.train()
    finish_offline_run()
    kept = ProbeSet([p for p in probes if p.source != "longsuite"])
    assert callback.probes.fingerprint == kept.fingerprint
    record = load_record(out)
    assert ProbeSet.from_jsonl(record.root / "probes.jsonl").fingerprint == kept.fingerprint
    dropped = json.loads((record.root / "unfit_probes.json").read_text())
    assert dropped["context"] == 512 and dropped["kept"] == 32
    assert [d["id"] for d in dropped["dropped"]] == ["long0", "long1"] and all(d["tokens"] > 512 for d in dropped["dropped"])
    key = BaseCache.load(record.root / "base.parquet").key
    assert key["probes"]["fingerprint"] == kept.fingerprint and key["probes"]["n"] == 32
    config = read_config(find_run_file(offline_wandb))["forgetwatch"]
    assert config["n_probes"] == 32 and config["unfit_dropped"] == 2 and config["fingerprint"] == kept.fingerprint


def test_nothing_left_after_dropping_is_refused(tokenizer):
    model = build_model(tokenizer)
    callback = ForgetWatchCallback(ProbeSet([Probe("long", "mcq", LONG, ("a", "b"), 0)]), unfit_probes="drop")
    with pytest.raises(ProbeSetError, match="none of the 1 probes fits the model's context of 512 tokens"):
        callback.fit_probes(model, tokenizer)
