"""What a resume from an earlier checkpoint cuts from a run's record: set aside whole, never deleted (`truncate_after`)."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from forgetwatch.record.store import RecordError, RunRecord
from forgetwatch.scoring.results import ProbeResults


def make_record(root: Path, steps: list[int], last_log_step: int) -> RunRecord:
    record = RunRecord(root)
    for s in steps:
        record.write_eval(s, ProbeResults.empty(["a", "b"]), "fp")
        record.append_flips([{"step": s, "id": "a"}])
        record.append_metrics({"step": s, "metrics": {}})
    for s in range(last_log_step + 1):
        record.append_trainer_log({"step": s, "loss": 1.0})
    return record


def steps_in(path: Path) -> list:
    return [json.loads(line)["step"] for line in path.read_text().splitlines()]


def test_the_training_and_its_watcher_set_one_resume_aside_in_one_folder_and_two_resumes_in_two(tmp_path):
    """The training process cuts its trainer log and the watcher (another process) the evaluations: both name the folder
    by the resuming start's id, so one resume fills one folder; a second resume to the same step gets its own."""
    record = make_record(tmp_path / "forgetwatch", [0, 2, 4, 6], last_log_step=6)
    npz = record.eval_path(4).read_bytes()
    first = record.truncate_after(2, names=("trainer_log.jsonl",), start="a" * 32)
    assert RunRecord(record.root).truncate_after(2, start="a" * 32) == first  # a fresh object, as in another process
    assert first.name == f"after-step-2-{'a' * 12}"
    assert steps_in(first / "metrics.jsonl") == [4, 6] and steps_in(first / "flips.jsonl") == [4, 6]
    assert steps_in(first / "trainer_log.jsonl") == [3, 4, 5, 6]
    assert (first / "evals" / "step-00000004.npz").read_bytes() == npz
    assert steps_in(record.root / "metrics.jsonl") == [0, 2] and record.eval_steps() == [0, 2]
    # the resumed run writes 4 again, then is resumed from 2 once more
    record.write_eval(4, ProbeResults.empty(["a", "b"]), "fp")
    record.append_metrics({"step": 4, "metrics": {}})
    second = record.truncate_after(2, start="b" * 32)
    assert second != first and steps_in(second / "metrics.jsonl") == [4] and steps_in(first / "metrics.jsonl") == [4, 6]
    assert record.truncate_after(2, start="c" * 32) is None  # nothing after step 2: no folder
    assert sorted(p.name for p in (record.root / "superseded").iterdir()) == [first.name, second.name]


def test_a_file_set_aside_twice_under_one_name_keeps_both(tmp_path):
    record = make_record(tmp_path / "forgetwatch", [0, 2, 4], last_log_step=4)
    aside = record.truncate_after(2, start="s" * 32)
    record.write_eval(4, ProbeResults.empty(["a", "b"]), "fp")
    assert record.truncate_after(2, start="s" * 32) == aside
    assert sorted(p.name for p in (aside / "evals").iterdir()) == ["step-00000004.1.npz", "step-00000004.npz"]


def test_evals_on_another_disk_are_moved_across(tmp_path, monkeypatch):
    """evals/ linked to another disk: a rename cannot cross it (EXDEV), and the resume must not die of it."""
    record = make_record(tmp_path / "forgetwatch", [0, 2, 4], last_log_step=4)
    npz = record.eval_path(4).read_bytes()
    rename = os.rename

    def cross_device(src, dst, *args, **kwargs):
        if "evals" in str(src) and str(src).endswith(".npz"):
            raise OSError(errno.EXDEV, "Invalid cross-device link")
        return rename(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "rename", cross_device)
    aside = record.truncate_after(2, start="x" * 32)
    assert (aside / "evals" / "step-00000004.npz").read_bytes() == npz and record.eval_steps() == [0, 2]


def test_the_trainer_logs_unreadable_lines_are_set_aside_not_dropped(tmp_path):
    """The trainer log is written without fsync: after a power loss it may hold a garbled line, and a last line cut
    short. Such lines go aside as they were; the lines kept are kept byte for byte; a row whose step is not a number
    stays."""
    record = make_record(tmp_path / "forgetwatch", [0, 2, 4], last_log_step=4)
    path = record.root / "trainer_log.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    garbled, odd, cut = b'{"step": 1, "lo\n', b'{"step": "final", "note": 1}\n', b'{"step": 5, "loss": 1.0'
    path.write_bytes(b"".join(lines[:2]) + garbled + odd + b"".join(lines[2:]) + b"\xff\xfe\n" + cut)
    aside = record.truncate_after(2, names=("trainer_log.jsonl",), start="t" * 32)
    assert path.read_bytes() == b"".join(lines[:2]) + odd + lines[2]
    assert (aside / "trainer_log.jsonl").read_bytes() == b"".join(lines[3:])
    assert (aside / "trainer_log.jsonl.unreadable").read_bytes() == garbled + b"\xff\xfe\n" + cut + b"\n"


def test_damage_in_the_scorers_files_is_refused_by_name_before_anything_moves(tmp_path):
    record = make_record(tmp_path / "forgetwatch", [0, 2, 4], last_log_step=4)
    with open(record.root / "flips.jsonl", "ab") as f:
        f.write(b"not json\n")
    with pytest.raises(RecordError, match="flips.jsonl"):
        record.truncate_after(2, start="d" * 32)
    assert record.eval_steps() == [0, 2, 4] and steps_in(record.root / "metrics.jsonl") == [0, 2, 4]
    assert not (record.root / "superseded").exists()


def test_a_last_line_cut_short_goes_aside_rather_than_be_glued_to_the_next(tmp_path):
    record = make_record(tmp_path / "forgetwatch", [0, 2, 4], last_log_step=4)
    with open(record.root / "flips.jsonl", "ab") as f:
        f.write(b'{"step": 6, "id"')
    aside = record.truncate_after(2, start="e" * 32)
    assert (aside / "flips.jsonl.unreadable").read_bytes() == b'{"step": 6, "id"\n'
    record.append_flips([{"step": 4, "id": "b"}])
    assert steps_in(record.root / "flips.jsonl") == [0, 2, 4]


def test_an_append_that_runs_out_of_space_leaves_whole_lines(tmp_path):
    """A disk that fills mid-append (here a file-size limit, which fails a write part way as a full disk does): the
    half-written line is cut back, so the append after space is freed starts on a fresh line, and every line reads."""
    import subprocess
    import sys

    record = make_record(tmp_path / "forgetwatch", [0], last_log_step=0)
    script = f"""
import resource, signal, os
from forgetwatch.record.store import RunRecord
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit then fails (EFBIG) instead of killing us
record = RunRecord({str(record.root)!r})
size = os.path.getsize(record.root / "flips.jsonl")
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
resource.setrlimit(resource.RLIMIT_FSIZE, (size + 20, hard))
try:
    record.append_flips([{{"step": 2, "id": "a", "question": "x" * 200}}])
except OSError as e:
    print("failed:", e.errno)
resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
record.append_flips([{{"step": 4, "id": "a"}}])
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("failed:")
    assert steps_in(record.root / "flips.jsonl") == [0, 4]


def test_a_byte_order_mark_on_line_one_is_no_damage(tmp_path):
    """An editor's byte-order mark before line 1: the reader skips it, and so does the cut (the row stays)."""
    record = make_record(tmp_path / "forgetwatch", [0, 2, 4], last_log_step=4)
    path = record.root / "metrics.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    aside = record.truncate_after(2, start="f" * 32)
    assert path.read_bytes().startswith(b"\xef\xbb\xbf") and steps_in(aside / "metrics.jsonl") == [4]
    assert [r["step"] for r in record.read_metrics()] == [0, 2] and not (aside / "metrics.jsonl.unreadable").exists()
    assert record.kept_aside() == [f"superseded/{aside.name}"]


def test_a_set_aside_folder_that_cannot_be_listed_does_not_stop_the_report(tmp_path, monkeypatch):
    record = make_record(tmp_path / "forgetwatch", [0, 2, 4], last_log_step=4)
    record.truncate_after(2, start="g" * 32)
    listing = Path.iterdir

    def denied(self):
        if self.name == "superseded":
            raise PermissionError(13, "Permission denied")
        return listing(self)

    monkeypatch.setattr(Path, "iterdir", denied)
    assert record.kept_aside() == ["superseded/ (unreadable: Permission denied)"]
