"""A fuzz pass over the command line: every command, every flag that takes a value, given 0, -1, NaN, a huge number,
text, a link and a missing folder, the command's other inputs real (the tiny model, a probe file, its base cache, a
watched run's record, a task file), so that a value goes as deep as the command takes it. Whatever the command does
with it, it must not end in a traceback: it refuses in one line (exit 2, argparse's or forgetwatch's), or it runs.
`make test-slow` runs it (819 invocations)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path

import pytest

from forgetwatch.cli import build_parser, main

pytestmark = pytest.mark.slow

VALUES = ("0", "-1", "nan", "1e308", "text", "{link}", "{missing}")


def _commands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()):
    """(command words, positional names, options that take a value, required options) for every command."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, (*prefix, name))
            return
    positionals = [a for a in parser._actions if not a.option_strings and a.dest != "help"]
    valued = [a for a in parser._actions if a.option_strings and a.nargs != 0 and not isinstance(
        a, (argparse._HelpAction, argparse._VersionAction, argparse.BooleanOptionalAction))]
    yield prefix, positionals, valued


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, tiny_model_dir, sidecar_run):
    """Real inputs, made once: the tiny model, a probe file and its base cache, a watched run, a task file."""
    from fixtures.trainers import make_probes

    from forgetwatch.run.watcher import Watcher

    root = tmp_path_factory.mktemp("fuzz")
    probes = root / "probes.jsonl"
    make_probes().to_jsonl(probes)
    base = root / "base.parquet"
    assert main(["cache", "--model", str(tiny_model_dir), "--probes", str(probes), "-o", str(base)]) == 0
    run = root / "run"
    shutil.copytree(sidecar_run[0], run)
    assert Watcher(run, device="cpu").run(once=True) == 3
    task = root / "task.jsonl"
    task.write_text("".join(json.dumps({"prompt": f"What is {i} + {i}?", "completion": f" {2 * i}"}) + "\n"
                            for i in range(8)))
    return {"model": tiny_model_dir, "probes": probes, "base": base, "run": run, "task": task}


def _base(words, positionals, valued, inputs: dict, tmp: Path) -> list[str]:
    """The command with its required inputs real: positionals and required flags."""
    real = {"model": inputs["model"], "probes": inputs["probes"], "base": inputs["base"], "pool": inputs["probes"],
            "path": inputs["probes"], "output_dir": tmp / "run", "suites": "arc_easy", "topic": "options",
            "config": tmp / "missing.yaml", "runs": tmp / "run", "run": tmp / "run"}
    argv = list(words)
    for a in positionals:
        if a.nargs in ("*", "?", argparse.REMAINDER):
            continue
        argv.append(str(real.get(a.dest, tmp / "missing")))
    for a in valued:
        if a.required:
            argv += [a.option_strings[-1], str(real.get(a.dest, tmp / f"out-{a.dest}"))]
    if words == ("watch",):
        argv.append("--once")  # a watcher without it waits for training to start
    if words == ("rewind",):
        argv += ["--data", str(inputs["task"])]  # a task measure, so that rewind goes on to its sweep
    return argv


CASES = [(words, a.option_strings[-1], value) for words, positionals, valued in _commands(build_parser())
         for a in valued for value in VALUES]


@pytest.mark.parametrize(("words", "flag", "value"), CASES, ids=[f"{' '.join(w)} {f} {v}" for w, f, v in CASES])
def test_no_flag_value_ends_in_a_traceback(words, flag, value, inputs, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.chdir(tmp_path)
    shutil.copytree(inputs["run"], tmp_path / "run")  # a command may change the run: each case has its own copy
    link = tmp_path / "link"
    os.symlink("/etc/hostname", link)
    parser_words = {tuple(w): (p, v) for w, p, v in _commands(build_parser())}
    positionals, valued = parser_words[tuple(words)]
    argv = _base(words, positionals, valued, inputs, tmp_path)
    given = value.format(link=link, missing=tmp_path / "missing")
    nargs = next(a.nargs for a in valued if a.option_strings[-1] == flag)
    argv += [f"{flag}={given}"] if nargs in (None, "?") else [flag] + [given] * (nargs if isinstance(nargs, int) else 1)
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's refusal, or a command's own exit
        code = e.code
    err = capsys.readouterr().err
    assert "Traceback" not in err, (argv, err)
    assert code in (0, 1, 2, None) or isinstance(code, str), (argv, code)
