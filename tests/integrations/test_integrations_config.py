"""forgetwatch_* keys in front-end YAMLs (Axolotl, LLaMA-Factory): misspelt keys, wrong types and refused options fail
before training with the file, the line, the key and the fix."""

import doctest
import importlib.util
from pathlib import Path

import pytest

import forgetwatch.integrations.config as config
from forgetwatch.integrations.config import (
    RECIPE_ONLY,
    TERM_OPTIONS,
    ConfigKeyError,
    front_end_arguments,
    parse_keys,
    split_keys,
    yaml_key_lines,
)


def test_doctests():
    assert doctest.testmod(config).failed == 0


@pytest.mark.parametrize("key, meant", [
    ("forgetwatch_eval_step", "forgetwatch_eval_steps"),
    ("forgetwach_probes", "forgetwatch_probes"),
    ("forget_watch_probes", "forgetwatch_probes"),
    ("ForgetWatch_Budget", "forgetwatch_budget"),
    ("forgetwatch-per-suite", "forgetwatch_per_suite"),
])
def test_misspelt_key_named_with_its_line_and_the_right_name(tmp_path, key, meant):
    path = tmp_path / "train.yaml"
    path.write_text(f"base_model: x\nlearning_rate: 1.0e-5\n{key}: 1\n")
    with pytest.raises(ConfigKeyError) as e:
        split_keys({"base_model": "x", "learning_rate": 1e-5, key: 1}, source=str(path), lines=yaml_key_lines(path))
    msg = str(e.value)
    assert f"{path}, line 3" in msg and repr(key) in msg and f"did you mean {meant!r}" in msg


def test_other_keys_pass_through_untouched():
    ours, rest = split_keys({"forgetwatch_probes": "sciq", "warmup_steps": 3, "eval_steps": 5, "watch": True})
    assert ours == {"forgetwatch_probes": "sciq"} and rest == {"warmup_steps": 3, "eval_steps": 5, "watch": True}


@pytest.mark.parametrize("key, value, want", [
    ("forgetwatch_eval_steps", "ten", "an integer"),
    ("forgetwatch_eval_steps", 2.5, "an integer"),
    ("forgetwatch_replay", "yes", "true or false"),
    ("forgetwatch_probes", ["sciq"], "a string or null"),
    ("forgetwatch_at_risk_margin", "two", "a number"),
    ("forgetwatch_budget", 0.05, "a mapping or a string or null"),
])
def test_wrong_type_named(key, value, want):
    with pytest.raises(ConfigKeyError, match=f"cfg.yaml, line 7: {key} must be {want}, got"):
        parse_keys({"forgetwatch_probes": "sciq", key: value}, source="cfg.yaml", lines={key: 7})


def test_refused_option_fails_before_training():
    with pytest.raises(ConfigKeyError, match="cfg.yaml: forgetwatch_scoring must be one of"):
        parse_keys({"forgetwatch_probes": "sciq", "forgetwatch_per_suite": 4, "forgetwatch_scoring": "beside"},
                   source="cfg.yaml")
    with pytest.raises(ConfigKeyError, match="cfg.yaml: .*nonsense"):
        parse_keys({"forgetwatch_probes": "sciq", "forgetwatch_per_suite": 4, "forgetwatch_budget": "nonsense=0.1"},
                   source="cfg.yaml")


def test_good_keys_make_the_arguments():
    args = parse_keys({"forgetwatch_probes": "sciq", "forgetwatch_per_suite": 4, "forgetwatch_eval_steps": 3,
                       "forgetwatch_budget": {"forgetting": 0.1}, "forgetwatch_at_risk_margin": 1})
    assert args.forgetwatch_eval_steps == 3 and args.forgetwatch_budget == {"forgetting": 0.1}
    assert args.forgetwatch_at_risk_margin == 1


def test_yaml_key_lines_on_a_file_that_is_not_a_mapping(tmp_path):
    (tmp_path / "a.yaml").write_text("- 1\n- 2\n")
    (tmp_path / "b.yaml").write_text("a: [\n")
    assert yaml_key_lines(tmp_path / "a.yaml") == {} and yaml_key_lines(tmp_path / "b.yaml") == {}
    assert yaml_key_lines(tmp_path / "missing.yaml") == {}


def test_a_key_given_elsewhere_than_the_file_is_named_there():
    """A front-end's command-line override: `lines` maps the key to where it was given, and the message says that."""
    lines = {"forgetwatch_probes": 3, "forgetwatch_eval_steps": "the command line (forgetwatch_eval_steps=two)"}
    with pytest.raises(ConfigKeyError, match=r"^the command line \(forgetwatch_eval_steps=two\): forgetwatch_eval_steps "
                                             r"must be an integer"):
        parse_keys({"forgetwatch_probes": "sciq", "forgetwatch_eval_steps": "two"}, source="cfg.yaml", lines=lines)
    with pytest.raises(ConfigKeyError, match=r"^the command line \(forgetwach_seed=1\): unknown key 'forgetwach_seed'"):
        split_keys({"forgetwach_seed": 1}, source="cfg.yaml", lines={"forgetwach_seed": "the command line (forgetwach_seed=1)"})


def test_numbers_yaml_reads_as_strings_are_numbers():
    """PyYAML reads `1e-1` (no dot) as a string; Axolotl's pydantic and LLaMA-Factory's parser take it as a number."""
    args = parse_keys({"forgetwatch_probes": "sciq", "forgetwatch_per_suite": 4, "forgetwatch_at_risk_drop": "1e-1"})
    assert args.forgetwatch_at_risk_drop == 0.1


@pytest.mark.parametrize("key, value, expect", [
    ("forgetwatch_scoring", "async", "c.yaml, line 9: forgetwatch_scoring must be one of inline, sidecar, got 'async'"),
    ("forgetwatch_eval_steps", -3, "c.yaml, line 9: forgetwatch_eval_steps must be a positive integer, got -3"),
    ("forgetwatch_probes", "no_such_suite", "c.yaml, line 9: unknown suite 'no_such_suite'"),
])
def test_the_callbacks_refusal_names_the_key_as_written_and_its_line(key, value, expect):
    keys = {"forgetwatch_probes": "sciq", "forgetwatch_per_suite": 4, key: value}
    with pytest.raises(ConfigKeyError) as e:
        parse_keys(keys, source="c.yaml", lines={key: 9})
    assert str(e.value).startswith(expect), str(e.value)


def test_sidecar_with_on_budget_stop_names_both_keys():
    keys = {"forgetwatch_probes": "sciq", "forgetwatch_per_suite": 4, "forgetwatch_scoring": "sidecar",
            "forgetwatch_on_budget": "stop", "forgetwatch_budget": "forgetting=0.1"}
    with pytest.raises(ConfigKeyError) as e:
        parse_keys(keys, source="c.yaml", lines={"forgetwatch_scoring": 4, "forgetwatch_on_budget": 5})
    msg = str(e.value)
    assert msg.startswith("c.yaml, line 4: ") and "forgetwatch_on_budget='stop'" in msg and "forgetwatch_scoring=" in msg


def test_a_nested_forgetwatch_mapping_is_told_to_use_top_level_keys():
    with pytest.raises(ConfigKeyError, match="c.yaml, line 2: 'forgetwatch': forgetwatch's keys are top-level keys"):
        split_keys({"forgetwatch": {"probes": "sciq"}}, source="c.yaml", lines={"forgetwatch": 2})


@pytest.mark.parametrize("config, expect", [
    ({"forgetwatch_eval_steps": 5}, "c.yaml, line 3: forgetwatch_eval_steps is set but forgetwatch_probes is not"),
    ({"forgetwatch_probes": None, "forgetwatch_eval_steps": 5}, "c.yaml, line 2: forgetwatch_probes is null"),
    ({"forgetwatch_probes": "  "}, "c.yaml, line 2: forgetwatch_probes is '  '"),
])
def test_front_ends_need_probes_once_any_key_is_set(config, expect):
    with pytest.raises(ConfigKeyError) as e:
        front_end_arguments(config, front_end="Axolotl", source="c.yaml",
                            lines={"forgetwatch_probes": 2, "forgetwatch_eval_steps": 3})
    assert str(e.value).startswith(expect) and "set `forgetwatch_probes:`" in str(e.value)


@pytest.mark.parametrize("key", RECIPE_ONLY)
def test_front_ends_refuse_replay_mixing(key):
    value = {"forgetwatch_replay_mix": 0.1, "forgetwatch_replay_targets": "base"}[key]
    with pytest.raises(ConfigKeyError, match=f"c.yaml, line 7: {key} is an option of replay mixing, which changes the "
                                             "training data .* LLaMA-Factory builds its own data pipeline"):
        front_end_arguments({"forgetwatch_probes": "sciq", key: value}, front_end="LLaMA-Factory", source="c.yaml",
                            lines={key: 7})


@pytest.mark.parametrize("key", TERM_OPTIONS)
def test_front_ends_refuse_a_term_option_without_its_term(key):
    value = {"forgetwatch_replay_strategy": "uniform", "forgetwatch_replay_pool": "sciq",
             "forgetwatch_base_outputs": "outs.parquet"}.get(key, 0.5)
    with pytest.raises(ConfigKeyError, match=f"c.yaml, line 7: {key} is an option of the .* is 0 here, so it would do "
                                             "nothing"):
        front_end_arguments({"forgetwatch_probes": "sciq", key: value}, front_end="Axolotl", source="c.yaml",
                            lines={key: 7})


def test_front_ends_take_the_anchor_and_the_penalty_for_sft_only():
    keys = {"forgetwatch_probes": "sciq", "forgetwatch_per_suite": 2, "forgetwatch_anchor_beta": 5,
            "forgetwatch_anchor_ratio": 0.5, "forgetwatch_replay_pool": "sciq", "forgetwatch_base_outputs": "outs.parquet"}
    args, rest = front_end_arguments({**keys, "stage": "sft"}, front_end="LLaMA-Factory", stage="sft")
    assert (args.forgetwatch_anchor_beta, args.forgetwatch_anchor_ratio, rest) == (5.0, 0.5, {"stage": "sft"})
    penalty = {"forgetwatch_probes": "sciq", "forgetwatch_per_suite": 2, "forgetwatch_penalty_beta": 1.0,
               "forgetwatch_penalty_floor": 3.0}
    assert front_end_arguments(penalty, front_end="Axolotl")[0].forgetwatch_penalty_floor == 3.0
    for stage in ("dpo", "kto", "rm", "ppo", "pt"):
        with pytest.raises(ConfigKeyError, match=f"c.yaml, line 4: forgetwatch_anchor_beta is an SFT option and this run "
                                                 f"trains stage '{stage}'"):
            front_end_arguments(keys, front_end="LLaMA-Factory", source="c.yaml", lines={"forgetwatch_anchor_beta": 4},
                                stage=stage)


def test_front_end_without_keys_gets_none_and_its_config_back():
    assert front_end_arguments({"stage": "sft"}, front_end="LLaMA-Factory") == (None, {"stage": "sft"})


def _axolotl_check(path):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "forgetwatch.integrations.axolotl", str(path)], capture_output=True,
                          text=True, timeout=120)


@pytest.mark.long
def test_the_axolotl_check_needs_no_axolotl(tmp_path):
    """`python -m forgetwatch.integrations.axolotl CONFIG` runs where axolotl is not installed (this venv): the plugin
    class alone needs axolotl, and it is made when Axolotl's loader asks for it."""
    import subprocess
    import sys

    code = ("import sys, forgetwatch.integrations.axolotl as a; a.check_config({'forgetwatch_probes': 'sciq', "
            "'forgetwatch_per_suite': 2, 'plugins': [a.PLUGIN]}); print('axolotl' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120).stdout == "False\n"
    cfg = tmp_path / "config.yaml"
    cfg.write_text("base_model: x\nplugins: forgetwatch.integrations.axolotl.ForgetWatchPlugin\n"
                   "forgetwatch_probes: sciq\nforgetwatch_per_suite: 2\n")
    proc = _axolotl_check(cfg)  # `plugins:` as one string is a list of one for this check, not a substring test
    assert proc.returncode == 0 and "forgetwatch keys ok" in proc.stdout, proc.stderr
    cfg.write_text("base_model: x\nplugins: [other.Plugin]\nforgetwatch_probes: sciq\n")
    proc = _axolotl_check(cfg)
    assert proc.returncode == 1
    assert f"{cfg}, line 3: forgetwatch_probes is set but the forgetwatch plugin is not in `plugins:`" in proc.stderr
    cfg.write_text("base_model: x\nforgetwatch_probes: [sciq\n")
    proc = _axolotl_check(cfg)
    assert proc.returncode == 1 and str(cfg) in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_front_ends_take_rewind_and_refuse_what_it_cannot_do():
    """`forgetwatch_rewind` in a front-end's YAML: accepted for SFT; refused before training where it could not pick
    (a preference or RL stage without held-out examples or a budget) or could not run (sidecar scoring)."""
    keys = {"forgetwatch_probes": "sciq", "forgetwatch_per_suite": 4, "forgetwatch_rewind": True}
    args, _ = front_end_arguments(keys, front_end="LLaMA-Factory", stage="sft")
    assert args.forgetwatch_rewind
    lines = {k: i for i, k in enumerate(keys, 1)}
    with pytest.raises(ConfigKeyError, match=r"c.yaml, line 3: forgetwatch_rewind picks α by a task loss.*dpo run.*"
                                             r"forgetwatch_rewind_data"):
        front_end_arguments(keys, front_end="LLaMA-Factory", stage="dpo", source="c.yaml", lines=lines)
    args, _ = front_end_arguments({**keys, "forgetwatch_budget": "forgetting=0.1"}, front_end="LLaMA-Factory", stage="dpo")
    assert args.forgetwatch_budget == "forgetting=0.1"
    with pytest.raises(ConfigKeyError, match="forgetwatch_scoring=sidecar leaves it to `forgetwatch watch`"):
        front_end_arguments({**keys, "forgetwatch_scoring": "sidecar"}, front_end="Axolotl", source="c.yaml")


def test_the_old_off_of_robustness_is_read_as_today():
    """`forgetwatch_robustness: null` was the default (off) before off was 0: a YAML that spelled it out still loads."""
    args = parse_keys({"forgetwatch_probes": "sciq", "forgetwatch_per_suite": 4, "forgetwatch_robustness": None})
    assert args.forgetwatch_robustness == 0
    # only that option's old value is translated: another null stays null, a mapping passes through
    args = parse_keys({"forgetwatch_probes": "sciq", "forgetwatch_per_suite": None, "forgetwatch_budget": {"forgetting": 0.1}})
    assert args.forgetwatch_per_suite is None and args.forgetwatch_budget == {"forgetting": 0.1}


@pytest.mark.parametrize("entry", ["forgetwatch.integrations.axolotl.ForgetwatchPlugin",
                                   "forgetwatch.integration.axolotl.ForgetWatchPlugin", "ForgetWatchPlugin"])
def test_a_misspelt_axolotl_plugin_is_named_as_a_misspelling(tmp_path, entry):
    from forgetwatch.integrations.axolotl import PLUGIN, main
    from forgetwatch.integrations.axolotl import check_config as check_axolotl

    cfg = tmp_path / "config.yaml"
    cfg.write_text(f"base_model: x\nplugins:\n  - {entry}\nforgetwatch_probes: sciq\n")
    with pytest.raises(ConfigKeyError, match=rf"{cfg}, line 2: plugins: '{entry}' is not a class Axolotl can load; "
                                             rf"forgetwatch's plugin is spelt {PLUGIN}"):
        check_axolotl({"plugins": [entry], "forgetwatch_probes": "sciq", "axolotl_config_path": str(cfg)})
    assert main([str(cfg)]) == 1
    # another plugin is not ours: then the keys without the plugin are what is wrong
    with pytest.raises(ConfigKeyError, match="the forgetwatch plugin is not in `plugins:`"):
        check_axolotl({"plugins": ["axolotl.integrations.liger.LigerPlugin"], "forgetwatch_probes": "sciq"})


@pytest.mark.parametrize("keys, needle", [
    ({"forgetwatch_max_share": 1.5}, "must be a number between 0 and 1"),
    ({"forgetwatch_eval_steps": 0}, "must be a positive integer, got 0"),
    ({"forgetwatch_scoring": "sidecar", "forgetwatch_budget": "forgetting=0.1", "forgetwatch_on_budget": "stop"},
     "needs the scores inside the training process"),
    ({"forgetwatch_engine": "vllm"}, "cannot score the model in training"),
])
def test_every_value_the_callback_refuses_is_refused_by_both_front_ends_checks(tmp_path, capsys, keys, needle):
    """One home for each check (`ForgetWatchArguments.__post_init__`): the callback, `python -m
    forgetwatch.integrations.axolotl CONFIG` and `forgetwatch llamafactory train CONFIG --check` refuse the same values
    with the same message, each front-end naming the key as its YAML spells it."""
    from forgetwatch import ForgetWatchArguments, ForgetWatchCallback
    from forgetwatch.cli import main as forgetwatch
    from forgetwatch.integrations.axolotl import PLUGIN
    from forgetwatch.integrations.axolotl import main as axolotl_check

    with pytest.raises(ValueError, match=needle):  # the options themselves, before any callback or front-end
        ForgetWatchArguments(forgetwatch_probes="sciq", **keys)
    with pytest.raises(ValueError) as e:
        ForgetWatchCallback(probes="sciq", per_suite=2, **{k.removeprefix("forgetwatch_"): v for k, v in keys.items()})
    assert needle in str(e.value)
    body = "".join(f"{k}: {v}\n" for k, v in keys.items())
    axolotl_cfg, llamafactory_cfg = tmp_path / "axolotl.yaml", tmp_path / "llamafactory.yaml"
    axolotl_cfg.write_text(f"base_model: x\nplugins: [{PLUGIN}]\nforgetwatch_probes: sciq\nforgetwatch_per_suite: 2\n{body}")
    llamafactory_cfg.write_text(f"stage: sft\nforgetwatch_probes: sciq\nforgetwatch_per_suite: 2\n{body}")
    capsys.readouterr()
    assert axolotl_check([str(axolotl_cfg)]) != 0
    axolotl_err = capsys.readouterr().err
    assert needle in axolotl_err and f"{axolotl_cfg}, line 5" in axolotl_err, axolotl_err
    # with LLaMA-Factory installed, --check reads its own keys too (tests/integrations/test_llamafactory.py)
    if importlib.util.find_spec("llamafactory") is None:
        assert forgetwatch(["llamafactory", "train", "--check", str(llamafactory_cfg)]) == 2
        llamafactory_err = capsys.readouterr().err
        assert needle in llamafactory_err and f"{llamafactory_cfg}, line 4" in llamafactory_err, llamafactory_err


def test_a_key_given_twice_is_refused_by_every_front_end(tmp_path, capsys):
    """A YAML reader keeps the last of a key given twice without a word (the stricter budget given first was dropped):
    the Axolotl check, `forgetwatch llamafactory train --check` and the recipes refuse it, naming the file, the key
    and both lines; nested keys (a budget's metrics) too. The front-end's own keys are its business."""
    from conftest import run_as_main

    from forgetwatch.cli import main as forgetwatch
    from forgetwatch.integrations.axolotl import PLUGIN
    from forgetwatch.integrations.axolotl import main as axolotl_check
    from forgetwatch.integrations.config import duplicate_keys

    body = ("forgetwatch_probes: sciq\nforgetwatch_per_suite: 2\nforgetwatch_eval_steps: 1\n"
            "forgetwatch_budget: {forgetting: 0.1, forgetting: 0.5}\nforgetwatch_eval_steps: 7\n")
    axolotl_cfg, llamafactory_cfg, recipe_cfg = (tmp_path / f"{n}.yaml" for n in ("axolotl", "llamafactory", "recipe"))
    axolotl_cfg.write_text(f"base_model: x\nplugins: [{PLUGIN}]\n{body}")
    llamafactory_cfg.write_text(f"stage: sft\n{body}")
    recipe_cfg.write_text(f"model_name_or_path: x\n{body}")
    assert duplicate_keys(axolotl_cfg) == [("forgetwatch_eval_steps", 5, 7), ("forgetwatch_budget.forgetting", 6, 6)]
    said = "forgetwatch_eval_steps is given twice (first at line"
    capsys.readouterr()
    assert axolotl_check([str(axolotl_cfg)]) == 1
    err = capsys.readouterr().err
    assert f"{axolotl_cfg}:7: {said} 5)" in err and "forgetwatch_budget.forgetting" in err, err
    if importlib.util.find_spec("llamafactory") is None:
        assert forgetwatch(["llamafactory", "train", "--check", str(llamafactory_cfg)]) == 2
        assert f"{llamafactory_cfg}:6: {said} 4)" in capsys.readouterr().err
    root = Path(__file__).resolve().parents[2]
    recipe = run_as_main(root / "recipes" / "sft.py", "--config", str(recipe_cfg), "--output_dir", str(tmp_path / "out"))
    assert recipe.returncode != 0 and f"{recipe_cfg}:6: {said} 4)" in recipe.stderr, recipe.stderr
    assert not (tmp_path / "out").exists()  # refused before anything was made
    # a key of the front-end's own given twice is not ours to refuse
    axolotl_cfg.write_text(f"base_model: x\nbase_model: y\nplugins: [{PLUGIN}]\nforgetwatch_probes: sciq\n")
    assert axolotl_check([str(axolotl_cfg)]) == 0
