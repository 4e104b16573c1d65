"""The one options object (`forgetwatch.options`): declared once, and everything else derived from it."""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path

import pytest
from conftest import run_as_main

from forgetwatch import ForgetWatchArguments, ForgetWatchCallback, ScoringConfig
from forgetwatch.options import (
    GROUPS,
    REMEDIES,
    describe,
    format_options,
    options,
    options_from_kwargs,
    options_from_record,
    options_markdown,
)

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "forgetwatch"


def test_docs_options_md_is_generated_and_current():
    """docs/options.md is `forgetwatch options --markdown`; regenerate it when an option changes."""
    page = (ROOT / "docs" / "options.md").read_text()
    assert page == options_markdown(), ("docs/options.md is stale: run `forgetwatch options --markdown > "
                                        "docs/options.md`")
    for o in options():
        assert f"`{o.name}`" in page


def test_every_option_has_a_group_a_meaning_and_a_safe_help():
    seen = set()
    for o in options():
        assert o.group in GROUPS and o.help.strip() and "%" not in o.help
        assert o.name.startswith("forgetwatch_") and o.name not in seen
        seen.add(o.name)
    assert {o.group for o in options()} == set(GROUPS)
    text = format_options()
    assert all(f"{g}:" in text for g in GROUPS) and all(o.name in text for o in options())


def test_help_of_the_arguments_shows_each_meaning():
    doc = ForgetWatchArguments.__doc__
    for o in options():
        assert f"{o.name} (default" in doc


@pytest.mark.parametrize("recipe", ["sft", "grpo", "dpo"])
def test_recipe_help_exits_0_and_shows_every_meaning(recipe):
    """`python recipes/RECIPE.py --help`, as its `__main__` in this process (the recipes run as real scripts in
    tests/test_recipes.py)."""
    out = run_as_main(ROOT / "recipes" / f"{recipe}.py", "--help", cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    flat = " ".join(out.stdout.split())
    for o in options():
        assert f"--{o.name}" in flat
        assert " ".join(o.help.split())[:40] in flat, o.name


def test_scoring_defaults_are_the_options():
    """ScoringConfig, the engines and the callback take their defaults from the one declaration."""
    for f in dataclasses.fields(ScoringConfig):
        try:
            o = describe(f.name)
        except KeyError:
            continue  # system_prompt, pack_choices: not user options
        assert f.default == o.default, f.name
    sig = inspect.signature(ForgetWatchCallback)
    for o in options():
        if o.group != REMEDIES and o.short != "probes":
            assert sig.parameters[o.short].default == o.default


def test_defaults_are_written_once_in_the_package():
    """`mcq_mode`'s, `short_match`'s and `batch_size`'s defaults appear as literals only in options.py."""
    # a default: in a signature or a field (`name: type = value`), a `.get(name, value)`, an `or value` fallback, an
    # argparse `default=`; not a call that asks for a mode it needs (`ScoringConfig(mcq_mode="loglik")`: the penalty)
    patterns = {
        "mcq_mode": r'mcq_mode\s*:[^=\n]*=\s*"loglik"|\.get\("mcq_mode",\s*"loglik"\)|or "loglik"|default=d?\(?"loglik"',
        "short_match": r'short_match\s*:[^=\n]*=\s*"exact"|\.get\("short_match",\s*"exact"\)|or "exact"|default=d?\(?"exact"',
        "batch_size": r'batch_size\s*:[^=\n]*=\s*16\b|\.get\("batch_size",\s*16\)|or 16\b|default=16\b',
    }
    for name, pattern in patterns.items():
        hits = [f"{p.relative_to(ROOT)}:{i}" for p in PACKAGE.rglob("*.py") if p.name != "options.py"
                for i, line in enumerate(p.read_text().splitlines(), 1)
                if re.search(pattern, line) and ">>>" not in line]
        assert not hits, f"{name}'s default restated at {hits}: take it from forgetwatch.options"


def test_callback_refuses_an_unknown_option_by_name_and_remedies():
    with pytest.raises(TypeError, match="unknown forgetwatch option 'eval_stpes': did you mean 'eval_steps'"):
        ForgetWatchCallback("arc_easy", eval_stpes=3)
    with pytest.raises(ValueError, match="forgetwatch_anchor_beta: these change the training data or loss"):
        ForgetWatchCallback("arc_easy", per_suite=2, anchor_beta=5)
    with pytest.raises(TypeError, match="not both"):
        ForgetWatchCallback(args=ForgetWatchArguments(forgetwatch_probes="arc_easy"), per_suite=2)


def test_callback_from_args_and_keywords_agree():
    args = ForgetWatchArguments(forgetwatch_probes="arc_easy", forgetwatch_per_suite=3, forgetwatch_eval_steps=7,
                                forgetwatch_mcq_mode="loglik_norm", forgetwatch_batch_size=4)
    a = ForgetWatchCallback.from_args(args)
    b = ForgetWatchCallback("arc_easy", 7, per_suite=3, mcq_mode="loglik_norm", batch_size=4)
    assert a.options == b.options and a.config == b.config and a.eval_steps == b.eval_steps == 7
    assert a.config.batch_size == 4 and a.config.mcq_mode == "loglik_norm"
    assert a.state()["args"] == b.state()["args"]


def test_robustness_off_is_0_everywhere_and_old_records_say_none():
    """A checkpoint's callback state or a sidecar manifest written before "off" was 0 held `robustness: None`."""
    assert describe("robustness").default == 0
    old = ForgetWatchCallback("arc_easy", per_suite=2).state()["args"] | {"robustness": None}
    restored = ForgetWatchCallback(**old)
    assert restored.plan is None and restored.options.forgetwatch_robustness == 0
    assert options_from_record({"eval_steps": 4, "robustness": None, "from_the_future": 1}).forgetwatch_eval_steps == 4


def test_choices_are_checked_with_the_option_named():
    with pytest.raises(ValueError, match="forgetwatch_mcq_mode must be one of loglik, loglik_norm, letter, generate"):
        ForgetWatchArguments(forgetwatch_mcq_mode="letters")
    with pytest.raises(ValueError, match="forgetwatch_on_budget must be one of alert, save, stop"):
        options_from_kwargs(on_budget="page")
    with pytest.raises(KeyError, match="did you mean 'batch_size'"):
        describe("batchsize")


def test_forgetwatch_options_command(capsys):
    from forgetwatch.cli import main

    assert main(["options"]) == 0
    out = capsys.readouterr().out
    assert out == format_options() and all(f"{g}:" in out for g in GROUPS)
    assert main(["options", "--markdown"]) == 0
    assert capsys.readouterr().out == options_markdown()
    assert main(["options", "--group", "remedies"]) == 0
    out = capsys.readouterr().out
    assert "forgetwatch_anchor_beta" in out and "forgetwatch_mcq_mode" not in out


def test_cli_flags_that_share_a_name_are_the_options():
    """`--mcq-mode`, `--batch-size`, ... take their choices, defaults and meanings from the declaration."""
    from forgetwatch.cli import build_parser

    parser = build_parser()
    args = parser.parse_args(["cache", "--model", "m", "--probes", "p.jsonl", "-o", "c.parquet"])
    for name in ("mcq_mode", "short_match", "batch_size", "engine", "cot"):
        assert getattr(args, name) == describe(name).default, name
    sub = next(a for a in parser._subparsers._group_actions[0].choices["cache"]._actions if a.dest == "mcq_mode")
    assert tuple(sub.choices) == describe("mcq_mode").choices and sub.help.startswith(describe("mcq_mode").help)
    compare = parser.parse_args(["compare", "--model", "m", "--probes", "p.jsonl", "--base", "b.parquet"])
    assert compare.mcq_mode is None and compare.short_match is None  # absent: as in the base cache


def test_options_are_the_same_after_trl_parsed_them():
    """HfArgumentParser rewrites a dataclass field's `type` in place (Optional[X] -> X): the declaration read later (the
    page, `forgetwatch options`, the Axolotl model) must not change with it."""
    from trl import TrlParser

    before = options()
    TrlParser((ForgetWatchArguments,)).parse_args_into_dataclasses(["--forgetwatch_probes", "x.jsonl"])
    assert options() == before and describe("probes").type == "str | None"
    assert (ROOT / "docs" / "options.md").read_text() == options_markdown()


def test_parsed_arguments_with_remedies_build_the_callback():
    """A recipe's parsed arguments set the remedies' fields too: `args=` (and `from_args`) leaves them to the remedies."""
    args = ForgetWatchArguments(forgetwatch_probes="arc_easy", forgetwatch_per_suite=2, forgetwatch_anchor_beta=5.0,
                                forgetwatch_rewind=True)
    cb = ForgetWatchCallback(args=args)
    assert cb.options.forgetwatch_per_suite == 2 and cb.options.forgetwatch_anchor_beta == 0.0
    assert ForgetWatchCallback.from_args(args).options == cb.options


def test_a_checkpoint_state_of_another_version_restores(caplog):
    """The Trainer rebuilds the callback from a checkpoint's state (`from_state`): an option this version does not know
    is dropped with a warning, a missing one takes its default, robustness None (before 0 was off) is 0."""
    state = ForgetWatchCallback("arc_easy", per_suite=2, eval_steps=3).state()
    state["args"] = {**{k: v for k, v in state["args"].items() if k != "at_risk_drop"}, "robustness": None,
                     "from_the_future": 1}
    restored = ForgetWatchCallback.from_state(state)
    assert restored.eval_steps == 3 and restored.options.forgetwatch_per_suite == 2 and restored.plan is None
    assert restored._restored and "from_the_future" in caplog.text
    trainers = ForgetWatchCallback(**state["args"])  # what transformers' _load_callback_state does
    assert trainers.options == restored.options


def test_the_callback_takes_each_option_by_either_name_and_refuses_both_at_once():
    """`forgetwatch options`, the docs and the messages show `forgetwatch_eval_steps`; the callback used to refuse the
    name the list shows."""
    from forgetwatch import ForgetWatchCallback
    from forgetwatch.options import options

    for o in options():
        if o.group == "remedies" or o.short in ("probes",):
            continue
        assert ForgetWatchCallback("arc_easy", **{o.name: o.default}).options == \
            ForgetWatchCallback("arc_easy", **{o.short: o.default}).options, o.name
    watch = ForgetWatchCallback("arc_easy", forgetwatch_eval_steps=10, forgetwatch_per_suite=5)
    assert watch.eval_steps == 10 and len(watch.probes) == 5
    with pytest.raises(TypeError, match="given twice"):
        ForgetWatchCallback("arc_easy", eval_steps=10, forgetwatch_eval_steps=20)


@pytest.mark.parametrize(("kwargs", "paste"), [
    ({"rewind": True}, "callbacks=[ForgetWatchCallback(probes='arc_easy', ...), RewindCallback()]"),
    ({"forgetwatch_rewind": True, "rewind_data": "held.jsonl"}, "RewindCallback(data='held.jsonl')"),
    ({"replay_mix": 0.1}, "fw = ForgetWatchArguments(forgetwatch_probes='arc_easy', forgetwatch_replay_mix=0.1)"),
])
def test_a_remedys_option_given_to_the_callback_is_refused_with_the_lines_that_add_it(kwargs, paste):
    from forgetwatch import ForgetWatchCallback

    with pytest.raises(ValueError) as e:
        ForgetWatchCallback("arc_easy", **kwargs)
    assert paste in str(e.value)


@pytest.mark.parametrize(("given", "meant"), [("ARC-Easy", "arc_easy"), ("Trivia QA", "triviaqa"), ("SciQ", "sciq")])
def test_a_suite_name_in_another_case_or_spelling_of_separators_gets_did_you_mean(given, meant):
    from forgetwatch import ForgetWatchCallback

    with pytest.raises(ValueError, match=f"Did you mean '{meant}'"):
        ForgetWatchCallback(given)
