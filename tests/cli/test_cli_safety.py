"""Issue 26 at the command line: what a user made is never replaced without being asked, an `-o` that cannot be written
is refused before any scoring, a failed write says where the results went, a malformed base cache is refused before
the model is scored, and the commands forgetwatch suggests can be pasted as they are.

The model is the tiny random Llama of conftest (`tiny_model_dir`), scored on 6 probes: each command takes a second.
"""

from __future__ import annotations

import ast
import errno
import json
import os
import shlex
from pathlib import Path

import numpy as np
import pytest

from forgetwatch.cli import build_parser, main
from forgetwatch.probes.probe_set import ProbeSet
from forgetwatch.record.cache import BaseCache

pytestmark = pytest.mark.usefixtures("one_thread")

SCORED = "scoring "  # the progress bar's description: present only when the probes were scored


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def refused(code: int, err: str, *words: str) -> None:
    assert code == 2, err
    assert "forgetwatch: error: " in err and "Traceback" not in err
    for w in words:
        assert w in err, (w, err)
    assert SCORED not in err, "refused only after scoring"


@pytest.fixture(scope="module")
def base(tmp_path_factory, tiny_model_dir, probe_file) -> Path:
    """A base cache of the tiny model (read-only for the tests: copy it to change it)."""
    path = tmp_path_factory.mktemp("base") / "base.parquet"
    assert main(["cache", "--model", str(tiny_model_dir), "--probes", str(probe_file), "-o", str(path)]) == 0
    return path


def other_model(tmp_path, tiny_model_dir) -> Path:
    """The tiny model with other weights (a fine-tune of it, for the cache key: another name, same architecture)."""
    from conftest import build_model, build_tokenizer

    out = tmp_path / "other-model"
    tok = build_tokenizer()
    build_model(tok, seed=3).save_pretrained(out)
    tok.save_pretrained(out)
    return out


# -- item 2: nothing a user made is replaced without being asked ----------------------------------------------


def test_compare_refuses_to_write_over_its_base_cache(capsys, tmp_path, tiny_model_dir, probe_file, base, monkeypatch):
    """`compare --base X -o X` replaced the base with the checkpoint's results; the next comparison then showed F = 0."""
    copy = tmp_path / "base.parquet"
    copy.write_bytes(base.read_bytes())
    before = copy.read_bytes()
    monkeypatch.chdir(tmp_path)
    for spelling in (copy, "base.parquet", "./sub/../base.parquet"):
        (tmp_path / "sub").mkdir(exist_ok=True)
        for force in ([], ["--force"]):
            code, out, err = run(capsys, "compare", "--model", tiny_model_dir, "--probes", probe_file, "--base", copy,
                                 "-o", spelling, *force)
            refused(code, err, f"-o {spelling} is the --base file itself", "Choose another -o", "even with --force")
    os.link(copy, tmp_path / "hardlink.parquet")  # the same file under another name
    code, _, err = run(
        capsys, "compare", "--model", tiny_model_dir, "--probes", probe_file, "--base", copy, "-o", "hardlink.parquet"
    )
    refused(code, err, "is the --base file itself")
    assert copy.read_bytes() == before


def test_compare_o_onto_an_existing_file_needs_force(capsys, tmp_path, tiny_model_dir, probe_file, base):
    out = tmp_path / "checkpoint.jsonl"
    out.write_text("my notes\n")
    args = ("compare", "--model", tiny_model_dir, "--probes", probe_file, "--base", base, "--json", "-o", out)
    code, stdout, err = run(capsys, *args)
    refused(code, err, f"-o {out} exists (per-probe results)", "never replaces a file without being asked",
            "pass --force to replace it")
    assert stdout == "" and out.read_text() == "my notes\n"
    code, stdout, err = run(capsys, *args, "--force")
    assert code == 0, err
    assert BaseCache.load(out).results.ids == ProbeSet.from_jsonl(probe_file).ids


def test_compare_o_onto_the_probe_file_is_refused_even_with_force(capsys, tmp_path, tiny_model_dir, probe_file, base):
    probes = tmp_path / "probes.jsonl"
    probes.write_bytes(probe_file.read_bytes())
    code, _, err = run(capsys, "compare", "--model", tiny_model_dir, "--probes", probes, "--base", base, "-o", probes, "--force")
    refused(code, err, "is the --probes file itself")
    assert probes.read_bytes() == probe_file.read_bytes()


def test_cache_o_onto_another_models_cache_is_refused(capsys, tmp_path, tiny_model_dir, probe_file, base):
    """`cache -o X` onto a cache of another model replaced it without a word."""
    path = tmp_path / "base.parquet"
    path.write_bytes(base.read_bytes())
    before = path.read_bytes()
    other = other_model(tmp_path, tiny_model_dir)
    code, _, err = run(capsys, "cache", "--model", other, "--probes", probe_file, "-o", path)
    refused(code, err, f"-o {path} exists and holds a cache made under another key",
            f"model.name_or_path: cache has '{tiny_model_dir.resolve()}', now '{other.resolve()}'", "pass --force")
    assert path.read_bytes() == before
    code, _, err = run(capsys, "cache", "--model", other, "--probes", probe_file, "-o", path, "--force")
    assert code == 0, err
    assert BaseCache.load(path).key["model"]["name_or_path"] == str(other.resolve())


def test_cache_o_onto_a_cache_of_other_probes_is_refused_before_loading_the_model(capsys, tmp_path, probe_file, base):
    path = tmp_path / "base.parquet"
    path.write_bytes(base.read_bytes())
    fewer = tmp_path / "fewer.jsonl"
    ProbeSet(list(ProbeSet.from_jsonl(probe_file))[:4]).to_jsonl(fewer)
    # a model path that would fail to load: the refusal comes first
    code, _, err = run(capsys, "cache", "--model", tmp_path, "--probes", fewer, "-o", path)
    refused(code, err, f"-o {path} exists and holds another cache", "probes.n: cache has 6, now 4", "pass --force")


def test_cache_o_onto_a_file_that_is_no_cache_is_refused(capsys, tmp_path, tiny_model_dir, probe_file):
    path = tmp_path / "results.jsonl"
    path.write_text('{"my": "results"}\n')
    code, _, err = run(capsys, "cache", "--model", tiny_model_dir, "--probes", probe_file, "-o", path)
    refused(code, err, f"-o {path} exists and is not a readable forgetwatch cache", "pass --force")
    assert path.read_text() == '{"my": "results"}\n'


def test_cache_o_onto_the_same_cache_keeps_it_without_scoring(capsys, tmp_path, tiny_model_dir, probe_file, base):
    """The same command twice (a script rerun): the cache it would write is there, so nothing is scored or written."""
    path = tmp_path / "base.parquet"
    path.write_bytes(base.read_bytes())
    os.utime(path, (1_000_000_000, 1_000_000_000))
    code, out, err = run(capsys, "cache", "--model", tiny_model_dir, "--probes", probe_file, "-o", path)
    assert code == 0, err
    assert out.strip() == (f"{path} already holds this cache (same model, probes and scoring): nothing scored, nothing "
                           "written; pass --force to score again and replace it")
    assert SCORED not in err and path.stat().st_mtime == 1_000_000_000 and path.read_bytes() == base.read_bytes()
    # another scoring setting is another key: refused, saying which
    code, _, err = run(capsys, "cache", "--model", tiny_model_dir, "--probes", probe_file, "-o", path, "--mcq-mode", "letter")
    refused(code, err, "scoring.mcq_mode: cache has 'loglik', now 'letter'")
    assert path.stat().st_mtime == 1_000_000_000


def test_probes_build_o_onto_an_existing_file_needs_force(capsys, tmp_path):
    path = tmp_path / "probes.jsonl"
    path.write_text("my probes\n")
    code, _, err = run(capsys, "probes", "build", "arc_easy", "--per-suite", "2", "-o", path)
    refused(code, err, f"-o {path} exists (a probe file)", "pass --force to replace it")
    assert path.read_text() == "my probes\n"
    code, _, err = run(capsys, "probes", "build", "arc_easy", "--per-suite", "2", "-o", tmp_path / "probes.txt")
    refused(code, err, "the file name must end in .jsonl")


def test_the_help_says_what_happens_to_an_existing_output(capsys):
    with pytest.raises(SystemExit):
        main(["cache", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "An existing file is never replaced unless --force" in text
    assert "if it already holds the cache this command would write (same model, probes and scoring key) nothing is scored" in text


# -- item 5: -o checked before scoring; a failed write says where the results are ------------------------------


def bad_outputs(tmp_path: Path) -> list[tuple[Path, str]]:
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "out-dir").mkdir()
    cases = [
        (tmp_path / "out-dir", "is a directory; give a file in it, e.g. -o"),
        (tmp_path / "no-such-dir" / "base.parquet", "the directory"),
        (tmp_path / "a-file" / "base.parquet", "is not a directory"),
        (tmp_path / "base.csv", "the file name must end in .parquet or .jsonl"),
        (tmp_path / "base", "the file name must end in .parquet or .jsonl"),
    ]
    if Path("/proc/self").is_dir():  # a place no one, root included, can create a file in
        cases.append((Path("/proc/forgetwatch-base.parquet"), "cannot write in /proc"))
    return cases


@pytest.mark.parametrize("command", ["cache", "compare"])
def test_an_output_that_cannot_be_written_is_refused_before_scoring(capsys, tmp_path, tiny_model_dir, probe_file, base, command):
    extra = ["--base", base] if command == "compare" else []
    for out, says in bad_outputs(tmp_path):
        code, _, err = run(capsys, command, "--model", tiny_model_dir, "--probes", probe_file, *extra, "-o", out)
        refused(code, err, f"-o {out}", says)
    assert not (tmp_path / "no-such-dir").exists()  # a mistyped directory is not created
    code, _, err = run(
        capsys, "cache", "--model", tiny_model_dir, "--probes", probe_file, "-o", tmp_path / "no-such-dir" / "b.jsonl"
    )
    refused(code, err, f"mkdir -p {tmp_path / 'no-such-dir'}")


def fail_writes(monkeypatch, n: int) -> None:
    """A full disk for the next `n` parquet writes: pyarrow's writer fails as it does on ENOSPC (a real full disk
    cannot be made here without root mounts); later writes go through. The cache's own write and its fallback in the
    same directory are the first two."""
    import pyarrow.parquet as pq

    write, calls = pq.write_table, []

    def write_table(table, where, **kwargs):
        calls.append(where)
        if len(calls) <= n:
            raise OSError(errno.ENOSPC, "No space left on device")
        return write(table, where, **kwargs)

    monkeypatch.setattr(pq, "write_table", write_table)


def test_a_failed_cache_write_saves_the_results_elsewhere_and_says_where(
    capsys, tmp_path, tiny_model_dir, probe_file, base, monkeypatch
):
    import tempfile

    full, spare = tmp_path / "full", tmp_path / "tmp"
    full.mkdir()
    spare.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(spare))  # $TMPDIR
    fail_writes(monkeypatch, 2)  # -o, then a copy beside it
    code, _, err = run(capsys, "cache", "--model", tiny_model_dir, "--probes", probe_file, "-o", full / "base.parquet")
    assert code == 2 and "Traceback" not in err
    (saved,) = spare.glob("base.unsaved-*.parquet")
    assert (
        f"could not write {full / 'base.parquet'} ([Errno 28] No space left on device); the results were saved to {saved}" in err
    )
    assert f"mv {saved} {full / 'base.parquet'}" in err
    # no half file, no empty placeholder (the lock files stay, by design: see forgetwatch._io.file_lock)
    assert [p.name for p in full.iterdir() if not p.name.endswith(".lock")] == []
    again = BaseCache.load(saved)
    assert again.key == BaseCache.load(base).key and np.array_equal(again.results.outcome, BaseCache.load(base).results.outcome)


def test_a_failed_compare_write_still_prints_the_report(capsys, tmp_path, tiny_model_dir, probe_file, base, monkeypatch):
    full = tmp_path / "full"
    full.mkdir()
    fail_writes(monkeypatch, 1)  # -o only: the copy goes beside it
    code, out, err = run(capsys, "compare", "--model", tiny_model_dir, "--probes", probe_file, "--base", base, "--json",
                         "-o", full / "post.parquet")
    assert code == 2 and json.loads(out)["n"] == 6
    (saved,) = full.glob("post.unsaved-*.parquet")
    assert f"the results were saved to {saved} instead" in err
    assert len(BaseCache.load(saved).results) == 6


def test_a_file_that_appears_while_scoring_is_not_replaced(tmp_path, base):
    from forgetwatch.cli.common import save_results

    cache = BaseCache.load(base)
    path = tmp_path / "base.parquet"
    path.write_text("written by another process meanwhile")
    with pytest.raises(OSError) as e:
        save_results(cache, str(path), replace=False)
    assert "appeared while scoring" in str(e.value) and "the results were saved to" in str(e.value)
    assert path.read_text() == "written by another process meanwhile"
    (saved,) = tmp_path.glob("base.unsaved-*.parquet")
    assert BaseCache.load(saved).key == cache.key


# -- items 3 and 8: a malformed base cache is refused before the model is scored --------------------------------


def test_compare_refuses_a_nan_outcome_naming_file_line_and_column(capsys, tmp_path, tiny_model_dir, probe_file, base):
    """A NaN outcome read as 0 gave base accuracy 0.150 instead of 0.250, and F 0.100 instead of 0.200."""
    path = tmp_path / "base.jsonl"
    BaseCache.load(base).save(path)
    lines = path.read_text().splitlines()
    row = json.loads(lines[3])
    row["outcome"] = float("nan")
    lines[3] = json.dumps(row)
    path.write_text("\n".join(lines) + "\n")
    code, out, err = run(capsys, "compare", "--model", tiny_model_dir, "--probes", probe_file, "--base", path)
    refused(code, err, f"{path} line 4 (probe 'q2'): column `outcome` is NaN, and it must be -1, 0 or 1")
    assert out == ""
    row["outcome"] = None  # a null outcome: refused the same way, no TypeError
    lines[3] = json.dumps(row)
    path.write_text("\n".join(lines) + "\n")
    code, _, err = run(capsys, "compare", "--model", tiny_model_dir, "--probes", probe_file, "--base", path)
    refused(code, err, f"{path} line 4 (probe 'q2'): column `outcome` is null")


def test_compare_refuses_rows_that_are_not_the_probes(capsys, tmp_path, tiny_model_dir, probe_file, base):
    path = tmp_path / "base.jsonl"
    BaseCache.load(base).save(path)
    path.write_text(path.read_text().replace('"id": "q4"', '"id": "q4-renamed"'))
    code, _, err = run(capsys, "compare", "--model", tiny_model_dir, "--probes", probe_file, "--base", path)
    refused(code, err, f"{path}: the cache's rows are not the probes': 1 probe(s) without a row ('q4'); "
                       "1 row(s) of no probe ('q4-renamed')")


def test_compare_refuses_a_key_of_the_wrong_type(capsys, tmp_path, tiny_model_dir, probe_file, base):
    path = tmp_path / "base.jsonl"
    BaseCache.load(base).save(path)
    lines = path.read_text().splitlines()
    header = json.loads(lines[0])
    header["forgetwatch_cache"]["scoring"] = ["loglik"]
    path.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    code, _, err = run(capsys, "compare", "--model", tiny_model_dir, "--probes", probe_file, "--base", path)
    refused(code, err, f"{path}: the cache key's `scoring` is a JSON array, not an object")


# -- item 9: suggested commands paste as they are; the library does not import its CLI --------------------------


def test_suggested_cache_commands_quote_paths_with_spaces():
    from forgetwatch.commands import cache_command

    model, probes, out = "/data/my models/base", "my probes.jsonl", "caches/it's base.parquet"
    command = cache_command(model, probes, {"mcq_mode": "letter", "precision": "bfloat16"}, out)
    argv = shlex.split(command)
    assert argv[:2] == ["forgetwatch", "cache"]
    args = build_parser().parse_args(argv[1:])
    assert (args.model, args.probes, args.output, args.mcq_mode, args.dtype) == (model, probes, out, "letter", "bfloat16")
    # the callback's suite names with their sampling options: the options stay options
    args = build_parser().parse_args(shlex.split(cache_command("m", "arc_easy,mmlu --per-suite 100 --seed 2", {}))[1:])
    assert (args.probes, args.per_suite, args.seed) == ("arc_easy,mmlu", 100, 2)


def test_a_missing_cache_message_quotes_its_path(tmp_path):
    path = tmp_path / "my caches" / "base.parquet"
    with pytest.raises(FileNotFoundError) as e:
        BaseCache.load(path)
    assert f"-o {shlex.quote(str(path))}`" in str(e.value)


def test_the_library_never_imports_its_command_line():
    """callback.py imported `cache_command` from cli.py: the library reached up into its command line."""
    package = Path(__import__("forgetwatch").__file__).parent
    offenders = []
    for source in sorted(package.glob("*.py")):  # the command line is the package forgetwatch/cli/, not among them
        if source.name == "__main__.py":
            continue
        for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and "cli" in (node.module or "").split("."):  # .cli, .cli.common
                offenders.append(f"{source.name}:{node.lineno}")
    assert offenders == []


# -- item 9: a task counted by acc_norm says so in a note of its own ----------------------------------------------


def lm_eval_samples(directory: Path, flip: bool) -> Path:
    """An lm-eval `--log_samples` file of a multiple-choice task that logs acc_norm but no acc."""
    directory.mkdir()
    rows = []
    for i in range(4):
        right = float(i % 2 == 0) if not (flip and i == 0) else 0.0
        rows.append(
            {
                "doc_id": i,
                "doc": {"question": f"q{i}"},
                "target": "0",
                "filter": "none",
                "metrics": ["acc_norm"],
                "arguments": {
                    "gen_args_0": {"arg_0": f"q{i}", "arg_1": " yes"},
                    "gen_args_1": {"arg_0": f"q{i}", "arg_1": " no"},
                },
                "resps": [[["-1.0", "False"]], [["-2.0", "False"]]],
                "filtered_resps": [["-1.0", "False"], ["-2.0", "False"]],
                "acc_norm": right,
            }
        )
    (directory / "samples_fw_mc_2025-01-01T00-00-00.000000.jsonl").write_text("\n".join(map(json.dumps, rows)) + "\n")
    return directory


def test_compare_says_in_a_note_when_it_counts_acc_norm(capsys, tmp_path):
    before, after = lm_eval_samples(tmp_path / "before", False), lm_eval_samples(tmp_path / "after", True)
    code, out, err = run(capsys, "compare", before, after)
    assert code == 0, err
    assert "  note: fw_mc: counted acc_norm (length-normalised), not acc: the task logs no 0/1 `acc` on every sample" in out
    code, out, _ = run(capsys, "compare", before, after, "--json")
    assert any(n.startswith("fw_mc: counted acc_norm") for n in json.loads(out)["notes"])
    code, out, _ = run(capsys, "compare", before, after, "--metric", "acc_norm")  # asked for: no note
    assert "counted acc_norm (length-normalised)" not in out


# -- numbers mean one thing ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv", [
    ["rewind", "OUT", "--data-max-examples", "-1"],  # computed the task loss on 1 example
    ["rewind", "OUT", "--data-max-examples", "0"],  # meant "all rows" here, "the default" for --batch-size
    ["rewind", "OUT", "--data-max-length", "0"],
    ["rewind", "OUT", "--batch-size", "0"],
    ["watch", "OUT", "--batch-size", "0"],
    ["watch", "OUT", "--rescore", "4", "--batch-size", "-3"],  # blamed sidecar.json
    ["interpolate", "--model", "M", "--probes", "P", "--base", "B", "--task-max-examples", "-1"],
    ["cache", "--model", "M", "--probes", "P", "--per-suite", "0"],
    ["probes", "build", "arc_easy", "--per-suite", "0", "-o", "p.jsonl"],  # said "`n` must be positive"
])
def test_a_count_below_one_is_refused_by_its_flag_before_anything_runs(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    flag = next(a for a in reversed(argv) if a.startswith("--"))
    assert f"argument {flag}: " in err and "must be a whole number of at least 1" in err, err


@pytest.mark.parametrize("name", ["batch_size", "per_suite", "max_new_tokens", "behavior_max_new_tokens",
                                  "robust_per_suite", "eval_steps"])
def test_the_options_refuse_a_count_below_one_as_their_flags_do(name):
    from forgetwatch.options import options_from_kwargs

    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match=f"`{name}` must be a"):
            options_from_kwargs(**{name: bad})


@pytest.mark.parametrize("command", [["rewind", "OUT"], ["watch", "OUT"], ["interpolate", "--model", "M", "--probes", "P",
                                     "--base", "B"], ["cache", "--model", "M", "--probes", "P"]])
def test_a_device_that_is_none_is_refused_by_its_flag(command, capsys):
    """`--device nosuch` used to end in torch's RuntimeError, printed as a traceback."""
    with pytest.raises(SystemExit) as e:
        main([*command, "--device", "nosuch"])
    assert e.value.code == 2
    assert "argument --device: 'nosuch' is not a device: use cpu, cuda, cuda:1" in capsys.readouterr().err


def test_verbose_shows_the_traceback_of_a_refusal_and_plain_shows_one_line(capsys, tmp_path):
    assert main(["report", str(tmp_path / "nothing-here")]) == 2
    plain = capsys.readouterr().err
    assert "Traceback" not in plain and plain.count("\n") == 1
    assert main(["-v", "report", str(tmp_path / "nothing-here")]) == 2
    assert "Traceback (most recent call last)" in capsys.readouterr().err


def test_advice_names_a_flag_of_the_command_that_gives_it(capsys):
    """rewind used to advise --extrapolate (interpolate's flag, which rewind rejects) and a NaN --at-risk-margin was
    refused as `margin_below` (a name no command takes)."""
    assert main(["rewind", "OUT", "--alphas=-0.5,1"]) == 2
    err = capsys.readouterr().err
    assert "--alphas: -0.5 is outside [0, 1]" in err and "--extrapolate" not in err
    with pytest.raises(SystemExit):
        main(["rewind", "OUT", "--at-risk-margin", "nan"])
    err = capsys.readouterr().err
    assert "argument --at-risk-margin: 'nan'" in err and "margin_below" not in err


def test_a_grid_of_alphas_is_capped_before_anything_is_scored(capsys):
    from forgetwatch.remedies.interpolate import MAX_ALPHAS

    assert main(["rewind", "OUT", "--alphas", "0:1:1e-9"]) == 2  # a billion scorings (and as many floats in memory)
    assert f"at most {MAX_ALPHAS}" in capsys.readouterr().err


def test_a_recipes_rewind_alphas_are_refused_by_their_key():
    from forgetwatch.remedies import RewindCallback

    with pytest.raises(ValueError, match=r"forgetwatch_rewind_alphas: 1\.5 is outside \[0, 1\]") as e:
        RewindCallback(data=None, alphas="0.5,1.5", budget={"forgetting": 0.1})
    assert "--" not in str(e.value)
