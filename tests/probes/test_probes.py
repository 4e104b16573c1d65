import json

import pytest

from forgetwatch import Probe, ProbeFormatError, ProbeSet, load_probes


def mcq(pid="q1", **kw):
    d = {"id": pid, "kind": "mcq", "question": "2 + 2 = ?", "choices": ["3", "4", "5"], "gold": 1}
    d.update(kw)
    return d


def write(tmp_path, rows, name="probes.jsonl"):
    path = tmp_path / name
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_roundtrip_and_fingerprint(tmp_path):
    ps = ProbeSet.from_records(
        [mcq("a", category="math"), {"id": "b", "kind": "short", "question": "Capital of France?", "answers": ["Paris"]}]
    )
    ps.to_jsonl(tmp_path / "p.jsonl")
    back = ProbeSet.from_jsonl(tmp_path / "p.jsonl")
    assert list(back) == list(ps)
    assert back.fingerprint == ps.fingerprint
    assert back["b"].answers == ("Paris",) and back["a"].num_choices == 3 and back["b"].num_choices == 0
    assert back.categories == ("default", "math")
    # any content change moves the fingerprint; so does order
    changed = ProbeSet.from_records(
        [mcq("a", category="math", gold=2), {"id": "b", "kind": "short", "question": "Capital of France?", "answers": ["Paris"]}]
    )
    assert changed.fingerprint != ps.fingerprint
    assert ProbeSet(list(ps)[::-1]).fingerprint != ps.fingerprint


@pytest.mark.parametrize(
    "row, field, words",
    [
        ("{not json", None, "not valid JSON"),
        ({"kind": "mcq", "question": "q", "choices": ["a", "b"], "gold": 0}, "id", "missing"),
        (mcq(kind="essay"), "kind", "must be one of"),
        (mcq(gold=3), "gold", "out of range for 3 choices"),
        (mcq(gold="B"), "gold", "integer index"),
        (mcq(choices=["only"]), "choices", "at least two"),
        (mcq(choices=["a", " "], gold=0), "choices", "empty"),
        ({"id": "s", "kind": "short", "question": "q"}, "answers", "missing"),
        ({"id": "s", "kind": "short", "question": "q", "answers": []}, "answers", "at least one"),
        (mcq(answers=["x"]), "answers", "only short-answer"),
        (mcq(color="red"), "color", "unknown field"),
        (mcq(category="a/b"), "category", "without '/'"),
    ],
)
def test_bad_lines_name_file_line_and_field(tmp_path, row, field, words):
    path = write(tmp_path, [mcq("ok"), row])
    with pytest.raises(ProbeFormatError) as e:
        ProbeSet.from_jsonl(path)
    msg = str(e.value)
    assert f"{path} line 2" in msg and words in msg
    if field:
        assert f"`{field}`" in msg


def test_duplicate_id_names_both_lines(tmp_path):
    path = write(tmp_path, [mcq("x"), mcq("y"), mcq("x")])
    with pytest.raises(ProbeFormatError, match=r"line 3: field `id`: duplicate id 'x' \(first on line 1\)"):
        ProbeSet.from_jsonl(path)


def test_empty_sets_and_missing_file(tmp_path):
    with pytest.raises(ProbeFormatError, match="no probes"):
        ProbeSet.from_jsonl(write(tmp_path, ["", "  "]))
    with pytest.raises(ProbeFormatError, match="empty"):
        ProbeSet([])
    with pytest.raises(FileNotFoundError, match="forgetwatch probes build"):
        ProbeSet.from_jsonl(tmp_path / "nope.jsonl")


def test_from_dataset_with_column_mapping():
    from datasets import Dataset

    ds = Dataset.from_list(
        [
            {"q": "2+2?", "opts": ["3", "4"], "label": 1, "topic": "math"},
            {"q": "3+3?", "opts": ["6", "7"], "label": 0, "topic": "math"},
        ]
    )
    ps = ProbeSet.from_dataset(
        ds, {"question": "q", "choices": "opts", "gold": "label", "category": "topic"}, kind="mcq", source="toy", id_prefix="toy/"
    )
    assert ps.ids == ["toy/0", "toy/1"] and ps[1].gold == 0 and ps[0].category == "math" and ps[0].source == "toy"
    with pytest.raises(ValueError, match="column 'nope'"):
        ProbeSet.from_dataset(ds, {"question": "nope"}, kind="mcq")
    with pytest.raises(ProbeFormatError, match="row 0: field `gold`"):
        ProbeSet.from_dataset(ds, {"question": "q", "choices": "opts", "gold": "topic"}, kind="mcq")


def test_subsample_is_seeded_stratified_and_ordered():
    ps = ProbeSet(Probe(str(i), "short", "q", answers=("a",), category="abc"[i % 3] if i < 90 else "a") for i in range(100))
    sub = ps.subsample(20, seed=1)
    assert len(sub) == 20
    assert sub.ids == ps.subsample(20, seed=1).ids  # deterministic
    assert sub.ids != ps.subsample(20, seed=2).ids
    counts = {c: sum(p.category == c for p in sub) for c in "abc"}
    assert counts == {"a": 8, "b": 6, "c": 6}  # 40/30/30 of 100 -> 8/6/6 of 20
    positions = [ps.index_of(i) for i in sub.ids]
    assert positions == sorted(positions)
    assert ps.subsample(1000) is ps


def test_load_dispatches_on_spec(tmp_path):
    path = write(tmp_path, [mcq("a")])
    assert load_probes(str(path)).ids == ["a"]
    ps = load_probes(path)
    assert load_probes(ps) is ps
    with pytest.raises(ValueError, match="arc_easy"):
        load_probes("no_such_suite")


def test_a_numeric_probe_needs_a_number_among_its_answers(tmp_path):
    path = tmp_path / "probes.jsonl"
    good = {"id": "g", "kind": "short", "question": "2 + 2?", "answers": ["4"], "numeric": True}
    bad = {"id": "b", "kind": "short", "question": "2 + 2?", "answers": ["four"], "numeric": True}
    path.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(ProbeFormatError, match=rf"{path} line 2: field `answers`: \['four'\] holds no number"):
        ProbeSet.from_jsonl(path)


@pytest.mark.parametrize(
    "data, says",
    [
        (b'{"id": "b", "kind": "mcq", "question": "caf\xe9?", "choices": ["a", "b"], "gold": 0}\n',
         "line 2: not UTF-8 text (byte 0xe9 at column 44, byte offset"),
        (b'{"id": "b", "kind": "short", "question": "\\ud800", "answers": ["x"]}\n',
         "line 2: not valid JSON (a lone UTF-16 surrogate escape (\\ud800) is not text)"),
        (b"[" * 100_000 + b"\n", "line 2: not valid JSON (nested too deeply to read)"),
        (b'{"id": "b", "kind": "mcq", "question": "q", "choices": ["a", "b"], "gold": ' + b"1" * 5000 + b"}\n",
         "line 2: not valid JSON (a number of more than 4300 digits)"),
        (b'{"id": "b", "kind": "mcq", "question": "q", "cho', "line 2: not valid JSON (Unterminated string starting "
         "at column 45); the file ends on this line without a newline: cut short by an interrupted write?"),
    ],
)
def test_unreadable_lines_name_the_file_and_line_not_a_traceback(tmp_path, data, says):
    # before the one reader: UnicodeDecodeError, RecursionError, a ValueError without a file, a set that failed to
    # write (its fingerprint could not encode the lone surrogate)
    path = tmp_path / "probes.jsonl"
    path.write_bytes(json.dumps(mcq("a")).encode() + b"\n" + data)
    with pytest.raises(ProbeFormatError) as e:
        ProbeSet.from_jsonl(path)
    assert str(e.value).startswith(f"{path} {says}")
    assert str(e.value).endswith("; a probe file holds one probe, a JSON object, per line")


@pytest.mark.parametrize("key", [[1], {"a": 1}, None, True, 1.5, float("nan"), ""])
def test_an_ifeval_key_must_be_a_number_or_a_string(tmp_path, key):
    path = write(tmp_path, [{"key": key, "prompt": "Say hi.", "instruction_id_list": ["change_case:english_lowercase"],
                             "kwargs": [{}]}])
    with pytest.raises(ProbeFormatError, match=rf"{path} line 1: field `key`: (must be a whole number|missing)"):
        ProbeSet.from_jsonl(path)
    path = write(tmp_path, [{"key": 1001, "prompt": "Say hi.", "instruction_id_list": ["change_case:english_lowercase"]}])
    assert ProbeSet.from_jsonl(path).ids == ["ifeval/1001"]


def test_an_ifeval_line_without_its_instructions_says_so(tmp_path):
    # it was read as a probe of forgetwatch's own format: "field `key`: unknown field"
    path = write(tmp_path, [{"key": 7, "prompt": "Say hi.", "kwargs": [{}]}])
    with pytest.raises(ProbeFormatError, match=rf"{path} line 1: field `instruction_id_list`: missing \(an IFEval line "
                                               "needs `prompt` and `instruction_id_list`; a probe of forgetwatch's own "
                                               "format needs `kind`\\)"):
        ProbeSet.from_jsonl(path)
