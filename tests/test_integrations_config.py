"""forgetwatch_* keys in front-end YAMLs (Axolotl, LLaMA-Factory): misspelt keys, wrong types and refused options fail
before training with the file, the line, the key and the fix."""

import doctest

import pytest

import forgetwatch.integrations.config as config
from forgetwatch.integrations.config import ConfigKeyError, parse_keys, split_keys, yaml_key_lines


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
    ("forgetwatch_at_risk_margin", "2", "a number"),
    ("forgetwatch_budget", 0.05, "a mapping or a string or null"),
])
def test_wrong_type_named(key, value, want):
    with pytest.raises(ConfigKeyError, match=f"cfg.yaml, line 7: {key} must be {want}, got"):
        parse_keys({"forgetwatch_probes": "sciq", key: value}, source="cfg.yaml", lines={key: 7})


def test_refused_option_fails_before_training():
    with pytest.raises(ConfigKeyError, match="cfg.yaml: the forgetwatch_\\* keys are refused: .*scoring"):
        parse_keys({"forgetwatch_probes": "sciq", "forgetwatch_per_suite": 4, "forgetwatch_scoring": "beside"},
                   source="cfg.yaml")
    with pytest.raises(ConfigKeyError, match="cfg.yaml: the forgetwatch_\\* keys are refused"):
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
