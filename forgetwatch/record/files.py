"""The record's files: their names, and how each is written and read. Every append is whole lines in one synced write,
cut back when it fails part way; every JSON-lines or JSON file is read back checked field by field (`schema.py`), a
damaged line refused naming the file and the line; what is set aside takes a name that replaces nothing.

Example:
    >>> import tempfile, pathlib
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "events.jsonl"
    >>> append_line(path, {"step": 4, "event": "budget"})
    >>> read_lines(path)
    [{'step': 4, 'event': 'budget'}]
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .._io import read_json, read_jsonl
from ..errors import RecordError
from .schema import line_problem

__all__ = ["DAMAGED", "EVAL_FILE", "EVAL_LINES", "RECOVERED", "REORDERING", "STEP_FILES", "SUPERSEDED", "UNWRITTEN",
           "append", "append_line", "new_folder", "read_json_file", "read_lines", "step_key"]

EVAL_FILE = re.compile(r"step-(\d+)\.npz$")
# what a resume from step N cuts back to N: the scoring's per-step files (the trainer log is the training process's own:
# the watcher, which scores beside training, never touches it)
# (unwritten.jsonl too: a resume from before a step that could not be written scores it again)
STEP_FILES = ("evals", "metrics.jsonl", "flips.jsonl", "at_risk.jsonl", "events.jsonl", "unwritten.jsonl")
# the JSON-lines files an evaluation appends to (its scorer's: the watcher never touches the trainer's log)
EVAL_LINES = ("metrics.jsonl", "flips.jsonl", "at_risk.jsonl", "events.jsonl")
UNWRITTEN = "unwritten.jsonl"  # the evaluations that could not be written (`RunRecord.append_unwritten`)
RECOVERED = "recovered"  # what `recover` set aside: <record>/recovered/<time>/
SUPERSEDED = "superseded"  # what a resume from an earlier step cut: <record>/superseded/after-step-N-<start>/
REORDERING = "reordering.json"  # the marker of a reordering under way (`forgetwatch.record.ordering`)

DAMAGED = ("forgetwatch writes whole lines, so the file was changed by hand or by another program: restore it, or move "
            "the record away")


def append(path: Path, text: str, sync: bool = True) -> None:
    """Every append to a record file: whole lines in one write, synced (the record's only other writes are atomic). A
    write that fails part way (a full disk) is cut back, so that the next append never lands on half a line."""
    # unbuffered: a buffered file flushes what it holds before it truncates, and on a full disk that flush fails again
    # and leaves the half line in place
    data = memoryview(text.encode("utf-8"))
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        size = os.fstat(fd).st_size
        try:
            while data:
                data = data[os.write(fd, data):]
            if sync:
                os.fsync(fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, size)
            raise
    finally:
        os.close(fd)


def append_line(path: Path, obj: dict[str, Any], sync: bool = True) -> None:
    append(path, json.dumps(obj, ensure_ascii=False) + "\n", sync)



def step_key(row: dict[str, Any]) -> float:
    step = row.get("step")
    return step if isinstance(step, (int, float)) and not isinstance(step, bool) else math.inf


def new_folder(path: Path) -> Path:
    """`path`, or `path.1`, `path.2`, ... (before a file's extension: `step-4.1.npz`): the first name not taken (what is
    set aside never replaces what was)."""
    target, n = path, 1
    while target.exists():
        target, n = path.with_name(f"{path.stem}.{n}{path.suffix}" if path.suffix == ".npz" else f"{path.name}.{n}"), n + 1
    return target


def read_lines(path: Path, skip_bad: bool = False) -> list[dict[str, Any]]:
    """The rows of a record's JSON-lines file; a last line cut short by a crash is not a record (`recover` sets it
    aside). A damaged line elsewhere raises `RecordError` with the file and line, unless `skip_bad` (the trainer's log,
    written without fsync: after a power loss a line may be garbage)."""
    if not path.is_file():
        return []
    if not skip_bad:
        numbered = list(read_jsonl(path, RecordError, DAMAGED, objects=True, partial="skip"))
    else:
        numbered = []
        for lineno, line in enumerate(path.read_bytes().split(b"\n")[:-1], 1):  # the part after the last newline is cut
            with contextlib.suppress(UnicodeDecodeError, ValueError):
                row = json.loads(line.decode("utf-8")) if line.strip() else None
                if isinstance(row, dict):
                    numbered.append((lineno, row))
    # every field the readers use, type-checked: a report must say which line is wrong, not stop on a TypeError
    for lineno, row in numbered:
        if problem := line_problem(path.name, row):
            raise RecordError(f"{path}, line {lineno}: {problem}; {DAMAGED}")
    return [row for _, row in numbered]


def read_json_file(path: Path, check: Callable[[dict[str, Any]], str | None] | None = None) -> dict[str, Any] | None:
    """A record's JSON file (written whole, atomically), or None when absent; damage raises `RecordError` with the line,
    and a field `check` finds wrong with the field."""
    doc = read_json(path, "a forgetwatch record file", RecordError, objects=True) if path.is_file() else None
    if doc is not None and check is not None and (problem := check(doc)):
        raise RecordError(f"{path}: {problem}; {DAMAGED}")
    return doc
