"""A seeded fuzz pass over the readers of user files: probe JSONL, lm-eval samples, lighteval details, and
`forgetwatch compare BEFORE AFTER` end to end (issue 26).

Every bad input (a truncation at many byte offsets, a field of the wrong JSON type, NaN or infinity in a score, bytes
that are not UTF-8, an empty file, a huge line) must end in one of two ways:
  - a named refusal: ProbeFormatError / SamplesFormatError (ValueErrors the command line prints as
    `forgetwatch: error: ...`) naming the file, and the line or row where there is one;
  - or a correct result: the figures computed independently from the file's own values.
Never a traceback (any other exception fails the test as it is) nor a plain-looking wrong figure.
"""

from __future__ import annotations

import copy
import json
import math
import random
import shutil
from pathlib import Path

import pytest

from forgetwatch import ProbeFormatError, ProbeSet, load_probes
from forgetwatch.cli import main
from forgetwatch.measures.samples import SamplesFormatError, compare_samples

SEED = 26
STAMP = "2026-01-01T00-00-00"


def outcome(fn):
    """("ok", value) or ("refused", message); any exception other than the two named refusals propagates."""
    try:
        return "ok", fn()
    except (ProbeFormatError, SamplesFormatError) as e:
        return "refused", str(e)


# ------------------------------------------------------------------------------------------------ probe files

PROBES = [
    {"id": "arc/1", "kind": "mcq", "question": "Which is a planet?", "choices": ["Mars", "Moon", "Sun"], "gold": 0,
     "category": "science", "source": "arc"},
    {"id": "gsm/2", "kind": "short", "question": "What is 6 * 7?", "answers": ["42"], "numeric": True, "category": "math"},
    {"id": "tqa/3", "kind": "short", "question": "Capital of France?", "answers": ["Paris", "Paris, France"]},
    {"id": "ins/4", "kind": "instruct", "question": "Describe rain in under 20 words.",
     "instructions": ["length_constraints:number_words"], "kwargs": [{"num_words": 20, "relation": "less than"}]},
    {"id": "ref/5", "kind": "comply", "question": "How do I kill a Python process?"},
    {"key": 1001, "prompt": "Write a haiku in lowercase.", "instruction_id_list": ["change_case:english_lowercase"],
     "kwargs": [{}]},
]
IDS = ["arc/1", "gsm/2", "tqa/3", "ins/4", "ref/5", "ifeval/1001"]
# every JSON type, and the numbers that are not numbers
VALUES = [None, True, False, 0, -1, 1.5, float("nan"), float("inf"), float("-inf"), "", "x", [], [1], ["x"], {}, {"a": 1},
          10**30]


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


MISSING = _Missing()  # the field left out


def _lines(rows) -> bytes:
    return b"".join(json.dumps(r, ensure_ascii=False).encode() + b"\n" for r in rows)


def _legal(record: dict, field: str, value) -> bool:
    """Whether a probe line with `field` set to `value` (or MISSING) is a valid probe: the format's rules, restated."""
    is_int = isinstance(value, int) and not isinstance(value, bool)
    text = isinstance(value, str) and bool(value.strip())
    if field in ("id", "key"):
        return is_int or text
    if field in ("question", "prompt"):
        return text
    if field == "category":
        return value is MISSING or (text and "/" not in value)
    if field == "source":
        return value is MISSING or isinstance(value, str)
    if field == "numeric":
        return value is MISSING or isinstance(value, bool)
    if field == "answers":
        answers = [value] if isinstance(value, str) else value
        return (isinstance(answers, list) and bool(answers) and all(isinstance(a, str) and a.strip() for a in answers)
                and (not record.get("numeric") or any(c.isdigit() for a in answers for c in a)))
    if field == "gold":
        return is_int and 0 <= value < len(record["choices"])
    if field == "kwargs" and "key" in record:  # IFEval: no arguments means none for each instruction
        return value in (MISSING, None)
    return False  # kind, choices, instructions and kwargs of the values above: none is valid


def test_probe_file_truncated_at_every_byte(tmp_path):
    data = _lines(PROBES)
    whole = data.split(b"\n")
    path = tmp_path / "probes.jsonl"
    for cut in range(len(data) + 1):
        part = data[:cut]
        path.write_bytes(part)
        kind, got = outcome(lambda: ProbeSet.from_jsonl(path))
        done = part.count(b"\n")
        tail = part[part.rfind(b"\n") + 1 :]
        if tail and tail == whole[done]:  # the cut fell just before a newline: that line is whole
            done, tail = done + 1, b""
        if tail:
            assert kind == "refused" and got.startswith(f"{path} line {done + 1}: not valid JSON"), (cut, got)
            assert "ends on this line without a newline: cut short" in got
        elif done == 0:
            assert kind == "refused" and got == f"{path}: the probe file has no probes; add at least one line"
        else:
            assert kind == "ok" and got.ids == IDS[:done], cut


@pytest.mark.parametrize("line", range(len(PROBES)))
def test_probe_fields_of_every_wrong_type(tmp_path, line):
    path = tmp_path / "probes.jsonl"
    for field in PROBES[line]:
        for value in [MISSING, *VALUES]:
            record = dict(PROBES[line])
            if value is MISSING:
                del record[field]
            else:
                record[field] = value
            rows = list(PROBES)
            rows[line] = record
            path.write_bytes(_lines(rows))
            kind, got = outcome(lambda: load_probes(path))
            if _legal(PROBES[line], field, value):
                assert kind == "ok", (field, value, got)
                probe = got.probes[line].to_dict()
                if field in ("question", "prompt", "gold", "source", "category", "numeric") and value is not MISSING:
                    assert probe["question" if field == "prompt" else field] == value
            else:
                assert kind == "refused", (field, value, got)
                assert got.startswith(f"{path} line {line + 1}: field `"), got
                named = {"prompt": ("prompt",), "key": ("key",), "instruction_id_list": ("instruction_id_list",)}
                assert any(f"`{f}`" in got for f in named.get(field, (field, "instructions", "kwargs"))), got


def test_nan_and_infinities_in_probe_numbers_are_refused(tmp_path):
    path = tmp_path / "probes.jsonl"
    for line, edit in [(0, {"gold": float("nan")}), (0, {"gold": float("inf")}), (1, {"numeric": float("nan")}),
                       (3, {"kwargs": [{"num_words": float("nan"), "relation": "less than"}]}),
                       (3, {"kwargs": [{"num_words": float("-inf"), "relation": "less than"}]})]:
        rows = [dict(r) for r in PROBES]
        rows[line].update(edit)
        path.write_bytes(_lines(rows))
        kind, got = outcome(lambda: ProbeSet.from_jsonl(path))
        assert kind == "refused" and got.startswith(f"{path} line {line + 1}: field `"), got


def test_probe_file_with_bytes_that_are_not_utf8(tmp_path):
    rng = random.Random(SEED)
    data = _lines(PROBES)
    path = tmp_path / "probes.jsonl"
    for _ in range(60):
        at = rng.randrange(len(data))
        bad = bytes([rng.choice([0x80, 0xBF, 0xC0, 0xE9, 0xF8, 0xFF])])
        part = data[:at] + bad + data[at:]
        path.write_bytes(part)
        kind, got = outcome(lambda: ProbeSet.from_jsonl(path))
        line = part.count(b"\n", 0, at) + 1
        assert kind == "refused" and got.startswith(f"{path} line {line}: not UTF-8 text (byte 0x{bad[0]:02x} at column "), got
        assert f"byte offset {at} of the file" in got


def test_empty_blank_and_huge_probe_files(tmp_path):
    path = tmp_path / "probes.jsonl"
    for data in (b"", b"\n", b"  \n\t\n"):
        path.write_bytes(data)
        assert outcome(lambda: ProbeSet.from_jsonl(path)) == ("refused", f"{path}: the probe file has no probes; add at "
                                                                         "least one line")
    huge = dict(PROBES[2], question="Capital of France? " + "very " * 1_000_000)  # a 5 MB line: read, and right
    path.write_bytes(_lines([PROBES[0], huge]))
    kind, got = outcome(lambda: ProbeSet.from_jsonl(path))
    assert kind == "ok" and got["tqa/3"].question == huge["question"]
    path.write_bytes(_lines([PROBES[0]]) + b"x" * 5_000_000 + b"\n")
    kind, got = outcome(lambda: ProbeSet.from_jsonl(path))
    assert kind == "refused" and got.startswith(f"{path} line 2: not valid JSON (Expecting value at column 1)")


# ------------------------------------------------------------------------------------------------- lm-eval samples

# pre / post outcomes of 8 documents: 2 forgotten (1 -> 0), 1 learned (0 -> 1)
PRE = [1, 1, 0, 1, 0, 1, 1, 0]
POST = [1, 0, 0, 0, 1, 1, 1, 0]


def _lm_eval_row(i: int, acc: int) -> dict:
    q = f"Question {i}: which one?"
    return {"doc_id": i, "doc": {"question": q, "choices": ["yes", "no"], "label": i % 2}, "target": str(i % 2),
            "arguments": {"gen_args_0": {"arg_0": f"{q}\nAnswer:", "arg_1": " yes"},
                          "gen_args_1": {"arg_0": f"{q}\nAnswer:", "arg_1": " no"}},
            "resps": [[["-1.5", "False"]], [["-2.5", "False"]]], "filtered_resps": [["-1.5", "False"], ["-2.5", "False"]],
            "filter": "none", "metrics": ["acc", "acc_norm"], "doc_hash": f"hash-{i}", "prompt_hash": "p",
            "target_hash": "t", "acc": float(acc), "acc_norm": float(1 - acc)}


def _lm_eval_run(root: Path, outcomes, raw: bytes | None = None) -> tuple[Path, Path]:
    """A run directory as lm-eval writes it: <root>/<model>/samples_fw_<stamp>.jsonl."""
    shutil.rmtree(root, ignore_errors=True)
    (root / "model").mkdir(parents=True)
    f = root / "model" / f"samples_fw_{STAMP}.jsonl"
    f.write_bytes(raw if raw is not None else _lines(_lm_eval_row(i, a) for i, a in enumerate(outcomes)))
    return root, f


def _expected(docs, post=POST) -> tuple[int, int, int]:
    """(n, forgotten, learned) over the documents `docs`, straight from PRE and POST."""
    return (len(docs), sum(PRE[i] == 1 and post[i] == 0 for i in docs), sum(PRE[i] == 0 and post[i] == 1 for i in docs))


def _figures(cmp) -> tuple[int, int, int]:
    m = cmp.report["overall"]
    return m.n, m.forgotten, m.learned


@pytest.fixture
def lm_eval(tmp_path):
    before, _ = _lm_eval_run(tmp_path / "before", PRE)
    after, f = _lm_eval_run(tmp_path / "after", POST)
    return before, after, f


def test_lm_eval_samples_truncated_at_many_offsets(lm_eval):
    before, after, f = lm_eval
    data = f.read_bytes()
    ends = [i + 1 for i, b in enumerate(data) if b == ord("\n")]
    offsets = sorted({0, len(data), *ends, *(e - 1 for e in ends), *(e + 1 for e in ends[:-1]),
                      *random.Random(SEED).sample(range(len(data)), 60)})
    for cut in offsets:
        part = data[:cut]
        f.write_bytes(part)
        kind, got = outcome(lambda: compare_samples(before, after))
        done = part.count(b"\n")
        tail = part[part.rfind(b"\n") + 1 :]
        complete = bool(tail) and tail == data.split(b"\n")[done]
        if complete:
            done, tail = done + 1, b""
        if tail:
            assert kind == "refused" and got.startswith(f"{f} line {done + 1}: not valid JSON"), (cut, got)
        elif done == 0:
            assert kind == "refused" and got == f"{f}: empty samples file", (cut, got)
        else:  # whole lines only: the documents they hold are compared, the others listed as one-sided
            assert kind == "ok", (cut, got)
            assert _figures(got) == _expected(range(done)), cut
            assert sorted(int(s.doc_id) for s in got.only_before) == list(range(done, len(PRE)))


LM_EVAL_FIELDS = ["doc_id", "doc_hash", "filter", "metrics", "doc", "filtered_resps", "resps", "arguments", "target",
                  "prompt_hash", "acc", "acc_norm"]


def test_lm_eval_fields_of_every_wrong_type(lm_eval):
    before, after, f = lm_eval
    for field in LM_EVAL_FIELDS:
        for value in [MISSING, *VALUES]:
            rows = [_lm_eval_row(i, a) for i, a in enumerate(POST)]
            if value is MISSING:
                del rows[3][field]
            else:
                rows[3][field] = value
            f.write_bytes(_lines(rows))
            kind, got = outcome(lambda: compare_samples(before, after))
            if kind == "refused":
                # the line and the field, or for what only both sides together show, the task and both places
                assert got.startswith(f"{f} line 4: ") or got.startswith(f"{f}: ") or got.startswith("task fw: "), (
                    field,
                    value,
                    got,
                )
                assert field in got or "lm-eval sample" in got or "no 0/1 metric" in got or "options" in got, (field, value, got)
            else:
                # accepted: each matched document carries the files' own outcomes, the figures are theirs, and a
                # document left unmatched is listed as one-sided, not dropped
                post = [int(r["acc"]) for r in rows]  # the file's own outcomes (an `acc` of true is a 1)
                compared = [int(a.doc_id) for a, _ in got.matched]
                assert all((a.outcome, b.outcome) == (PRE[int(a.doc_id)], post[int(a.doc_id)]) for a, b in got.matched), (
                    field,
                    value,
                )
                assert _figures(got) == _expected(compared, post), (field, value)
                assert sorted(compared + [int(s.doc_id) for s in got.only_before]) == list(range(len(PRE))), (field, value)
                assert got.before.metric == got.after.metric == {"fw": "acc"}, (field, value)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf"), None, "1", [1], MISSING])
def test_an_lm_eval_score_that_is_no_number_is_refused_naming_its_line(lm_eval, value):
    # never 0 or 1 in disguise, and never a silent switch to the other 0/1 metric the file logs (acc_norm)
    before, after, f = lm_eval
    rows = [_lm_eval_row(i, a) for i, a in enumerate(POST)]
    if value is MISSING:
        del rows[5]["acc"]
    else:
        rows[5]["acc"] = value
    f.write_bytes(_lines(rows))
    kind, got = outcome(lambda: compare_samples(before, after))
    assert kind == "refused" and got.startswith(f"{f} line 6: metric 'acc' of task fw is "), got
    assert "not 0 or 1 (1 of 8 documents)" in got


def test_lm_eval_samples_with_bytes_that_are_not_utf8(lm_eval):
    before, after, f = lm_eval
    rng = random.Random(SEED + 1)
    data = f.read_bytes()
    for _ in range(30):
        at = rng.randrange(len(data))
        f.write_bytes(data[:at] + b"\xff" + data[at:])
        kind, got = outcome(lambda: compare_samples(before, after))
        line = data.count(b"\n", 0, at) + 1
        assert kind == "refused" and got.startswith(f"{f} line {line}: not UTF-8 text (byte 0xff at column "), got


def test_lm_eval_samples_empty_and_huge(lm_eval):
    before, after, f = lm_eval
    for data in (b"", b"\n\n"):
        f.write_bytes(data)
        assert outcome(lambda: compare_samples(before, after)) == ("refused", f"{f}: empty samples file")
    rows = [_lm_eval_row(i, a) for i, a in enumerate(POST)]
    rows[2]["doc"]["question"] += " long" * 1_000_000  # a 5 MB line: read, and the figures right
    f.write_bytes(_lines(rows))
    kind, got = outcome(lambda: compare_samples(before, after))
    assert kind == "ok" and _figures(got) == _expected(range(8))


# ------------------------------------------------------------------------------------------------ lighteval details

LIGHTEVAL = Path(__file__).parents[1] / "data" / "lighteval"


def _lighteval_run(root: Path, side: str) -> Path:
    d = root / side / "details" / "tiny" / STAMP
    d.mkdir(parents=True)
    for task in ("probe_mc", "probe_gen"):
        shutil.copy(LIGHTEVAL / side / f"{task}.parquet", d / f"details_{task}|0_{STAMP}.parquet")
    return root / side


def _lighteval_expected(before_rows, after_rows, metric="acc") -> tuple[int, int, int]:
    pre = {r["doc"]["id"]: r["metric"][metric] for r in before_rows}
    post = {r["doc"]["id"]: r["metric"][metric] for r in after_rows}
    both = [i for i in pre if i in post]
    return len(both), sum(pre[i] > post[i] for i in both), sum(pre[i] < post[i] for i in both)


@pytest.fixture
def lighteval(tmp_path):
    import pyarrow.parquet as pq

    before, after = _lighteval_run(tmp_path, "base"), _lighteval_run(tmp_path, "after")
    (f,) = after.rglob("details_probe_mc|0_*.parquet")
    rows = {side: pq.read_table(LIGHTEVAL / side / "probe_mc.parquet").to_pylist() for side in ("base", "after")}
    return before, after, f, rows


def test_lighteval_details_truncated_and_damaged(lighteval):
    before, after, f, _ = lighteval
    data = f.read_bytes()
    rng = random.Random(SEED)
    for cut in sorted({0, 1, 4, len(data) - 1, *rng.sample(range(len(data)), 25)}):
        f.write_bytes(data[:cut])
        kind, got = outcome(lambda: compare_samples(before, after))
        assert kind == "refused" and got.startswith(f"{f}: not a readable parquet file ("), (cut, got)
    # a flipped byte: refused, or (where it changed nothing read) the right figures
    for at in rng.sample(range(len(data)), 25):
        f.write_bytes(data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1 :])
        kind, got = outcome(lambda: compare_samples(before, after))
        if kind == "refused":
            assert str(f) in got, (at, got)
        else:
            probe_mc = got.report["probe_mc|0"]
            import pyarrow.parquet as pq

            rows = pq.read_table(f).to_pylist()
            base = pq.read_table(LIGHTEVAL / "base" / "probe_mc.parquet").to_pylist()
            assert (probe_mc.n, probe_mc.forgotten, probe_mc.learned) == _lighteval_expected(base, rows), at


def _set(row: dict, path: tuple[str, ...], value) -> None:
    for k in path[:-1]:
        row = row[k]
    if value is MISSING:
        row.pop(path[-1], None)
    else:
        row[path[-1]] = value


LIGHTEVAL_FIELDS = [("doc",), ("metric",), ("model_response",), ("doc", "query"), ("doc", "choices"),
                    ("doc", "gold_index"), ("doc", "id"), ("doc", "task_name"), ("doc", "sampling_methods"),
                    ("model_response", "logprobs"), ("model_response", "text"), ("metric", "acc")]


def test_lighteval_fields_of_every_wrong_type(lighteval):
    import pyarrow as pa
    import pyarrow.parquet as pq

    before, after, f, rows = lighteval
    for path in LIGHTEVAL_FIELDS:
        for value in [MISSING, *VALUES]:
            edited = copy.deepcopy(rows["after"])
            for r in edited:  # every row: a parquet column holds one type
                _set(r, path, value)
            try:
                pq.write_table(pa.Table.from_pylist(edited), f)
            except (pa.ArrowException, TypeError, OverflowError):
                continue  # a value parquet cannot hold: no such file can be written
            kind, got = outcome(lambda: compare_samples(before, after))
            name = ".".join(path)
            if kind == "refused":
                assert str(f) in got or "task probe_mc|0" in got, (name, value, got)
            else:
                # accepted: every probe_mc document is compared with its own figures, or said to be one-sided
                back = pq.read_table(f).to_pylist()
                m = got.report.get("probe_mc|0")
                matched = [(a, b) for a, b in got.matched if a.task == "probe_mc|0"]
                assert len(matched) + len([s for s in got.only_after if s.task == "probe_mc|0"]) in (0, len(back)), name
                if m is not None:
                    pre = {a.doc_hash: a.outcome for a, _ in matched}
                    post = {b.doc_hash: b.outcome for _, b in matched}
                    assert (m.n, m.forgotten, m.learned) == (len(pre), sum(pre[h] > post[h] for h in pre),
                                                             sum(pre[h] < post[h] for h in pre)), name
                    assert all(b.outcome == int(back[int(b.where.rsplit(" ", 1)[1]) - 1]["metric"]["acc"])
                               for _, b in matched), name


@pytest.mark.parametrize("value", [float("nan"), float("inf"), None])
def test_a_lighteval_score_that_is_no_number_is_refused_naming_its_row(lighteval, value):
    import pyarrow as pa
    import pyarrow.parquet as pq

    before, after, f, rows = lighteval
    edited = copy.deepcopy(rows["after"])
    edited[4]["metric"]["acc"] = value
    pq.write_table(pa.Table.from_pylist(edited), f)
    kind, got = outcome(lambda: compare_samples(before, after))
    assert kind == "refused" and got.startswith(f"{f} row 5: metric 'acc' of task probe_mc|0 is {value!r}, not 0 or 1"), got


def test_lighteval_empty_and_huge(lighteval):
    import pyarrow as pa
    import pyarrow.parquet as pq

    before, after, f, rows = lighteval
    f.write_bytes(b"")
    kind, got = outcome(lambda: compare_samples(before, after))
    assert kind == "refused" and got.startswith(f"{f}: not a readable parquet file ("), got
    edited = copy.deepcopy(rows["after"])
    edited[0]["model_response"]["text"] = ["long " * 1_000_000]
    pq.write_table(pa.Table.from_pylist(edited), f)
    kind, got = outcome(lambda: compare_samples(before, after))
    m = got.report["probe_mc|0"]
    assert kind == "ok" and (m.n, m.forgotten, m.learned) == _lighteval_expected(rows["base"], rows["after"])


# ------------------------------------------------------------------------------------- `forgetwatch compare` end to end


def test_compare_end_to_end_refuses_by_name_or_prints_the_right_figures(tmp_path, capsys):
    before, _ = _lm_eval_run(tmp_path / "before", PRE)
    good = _lines(_lm_eval_row(i, a) for i, a in enumerate(POST))
    nan_row = [_lm_eval_row(i, a) for i, a in enumerate(POST)]
    nan_row[1]["acc"] = float("nan")
    wrong_type = [_lm_eval_row(i, a) for i, a in enumerate(POST)]
    wrong_type[2]["metrics"] = 5
    cases = {
        "truncated": (good[:-40], "line 8: not valid JSON"),
        "wrong type": (_lines(wrong_type), "line 3: field `metrics` must be a list of metric names"),
        "NaN score": (_lines(nan_row), "line 2: metric 'acc' of task fw is nan, not 0 or 1"),
        "not UTF-8": (good[:100] + b"\xe9" + good[100:], "line 1: not UTF-8 text (byte 0xe9 at column 101"),
        "empty": (b"", ": empty samples file"),
        "huge line": (good + b"[" * 200_000 + b"\n", "line 9: not valid JSON (nested too deeply to read)"),
    }
    for name, (data, says) in cases.items():
        after, f = _lm_eval_run(tmp_path / "after", POST, raw=data)
        assert main(["compare", str(before), str(after)]) == 2, name
        err = capsys.readouterr().err
        assert err.startswith(f"forgetwatch: error: {f}{'' if says.startswith(':') else ' '}{says}"), (name, err)
        assert "Traceback" not in err
    after, f = _lm_eval_run(tmp_path / "after", POST, raw=good)
    assert main(["compare", str(before), str(after), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)["metrics"]["overall"]
    assert (report["n"], report["forgotten"], report["learned"]) == _expected(range(8))
    assert not any(isinstance(v, float) and math.isnan(v) for v in report.values() if v is not None)


@pytest.mark.parametrize("value", [1.5, -1, 10**30, 0.5])
def test_an_lm_eval_acc_outside_0_and_1_is_refused_not_swapped_for_acc_norm(lm_eval, value):
    before, after, f = lm_eval
    rows = [_lm_eval_row(i, a) for i, a in enumerate(POST)]
    rows[6]["acc"] = value
    f.write_bytes(_lines(rows))
    kind, got = outcome(lambda: compare_samples(before, after))
    assert kind == "refused" and got.startswith(f"{f} line 7: metric 'acc' of task fw is {value!r}, not 0 or 1"), got


# ---------------------------------------------------------------------------------- replay pools of unlabelled prompts


def test_prompt_pool_lines_of_every_type(tmp_path):
    from forgetwatch.remedies.base_outputs import pool_probes

    path = tmp_path / "prompts.jsonl"
    good = {"prompt": "How do I boil an egg?", "category": "cooking"}
    for value in VALUES:
        path.write_bytes(_lines([good, value]))
        try:
            got = pool_probes(str(path))
        except ValueError as e:  # the pool's refusals are ValueErrors the command line reports
            assert str(e).startswith(f"{path} line 2: "), (value, e)
        else:
            raise AssertionError(f"a pool line {value!r} was accepted: {got}")
    path.write_bytes(_lines([good]) + b'{"prompt": "caf\xe9", "category": "x"}\n')
    with pytest.raises(ValueError, match=rf"{path} line 2: not UTF-8 text"):
        pool_probes(str(path))
