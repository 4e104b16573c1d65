"""Atomic file writes, cross-process locks, and the one reader of the JSON and JSON-lines files forgetwatch reads.

Every error of the readers names the file and the line (and the column or byte where there is one), so that a user
can open the file at the fault: `probes.jsonl line 7: not valid JSON (Expecting ',' delimiter at column 31)`.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import logging
import os
import re
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from filelock import FileLock

logger = logging.getLogger(__name__)

__all__ = ["atomic_write", "file_lock", "read_jsonl", "JsonlLines", "split_cut_tail", "repair_cut_tail", "read_json",
           "strict_json"]

# A temporary file of a killed write is removed by a later write of the same file when its writer is gone: a process
# of this host that no longer runs, after STALE_TMP_DEAD_S (a margin for a process of another PID namespace that shares
# the host name and the directory), or any writer's after STALE_TMP_ANY_S (another host: its pid means nothing here).
STALE_TMP_DEAD_S = 10 * 60
STALE_TMP_ANY_S = 24 * 60 * 60
# the host name as it goes into a temporary file's name: no dots (they separate the name's parts), at most 16 characters
# a hash of the whole host name: cluster nodes often share a long prefix (a cut name would make them one host here)
_HOST = hashlib.sha1(socket.gethostname().encode("utf-8")).hexdigest()[:12]


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "w") -> Iterator:
    """Open a temporary file next to `path`; on success, fsync it and rename it over `path`.

    On error the temporary file is removed and `path` is left as it was. A process killed mid-write (SIGKILL, a
    preempted job) cannot remove its temporary file, `.<name>.<host>-<pid>.<random>.tmp`; the next write of the same
    `path` removes such leftovers whose writer is gone (see `STALE_TMP_DEAD_S`), never a live writer's.

    Example:
        >>> with atomic_write("budget.json") as f:  # doctest: +SKIP
        ...     f.write('{"max_forgetting": 0.05}')
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_tmp(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{_HOST}-{os.getpid()}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        # mkstemp makes the file private (0600); give it the permissions any new file would get
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def pid_alive(pid: int) -> bool:
    """Whether a process of this host with this pid exists (another user's counts as alive)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except (PermissionError, OSError, AttributeError):  # another user's process, or no such check on this system
        return True
    return True


def _remove_stale_tmp(path: Path) -> list[Path]:
    """Remove the temporary files of killed writes of `path` (see `atomic_write`); the removed paths."""
    name = re.escape(path.name)
    ours = re.compile(rf"^\.{name}\.(?P<host>[A-Za-z0-9_-]*?)-(?P<pid>\d+)\.[A-Za-z0-9_]+\.tmp$")
    older = re.compile(rf"^\.{name}\.[a-z0-9_]{{8}}\.tmp$")  # forgetwatch before the pid went into the name
    removed = []
    now = time.time()
    try:
        entries = list(os.scandir(path.parent))
    except OSError:
        return removed
    for entry in entries:
        if not entry.name.startswith(f".{path.name}.") or not entry.name.endswith(".tmp"):
            continue
        m = ours.match(entry.name)
        if m is None and not older.match(entry.name):
            continue  # another file's, or not ours
        try:
            age = now - entry.stat(follow_symlinks=False).st_mtime
        except OSError:
            continue  # gone already (its writer renamed it into place)
        dead_here = m is not None and m["host"] == _HOST and not pid_alive(int(m["pid"]))
        if age > STALE_TMP_ANY_S or (dead_here and age > STALE_TMP_DEAD_S):
            with contextlib.suppress(OSError):  # cleaning up must never fail the write itself
                os.unlink(entry.path)
                removed.append(Path(entry.path))
    if removed:
        logger.info("removed %d temporary file(s) left by a killed write of %s", len(removed), path)
    return removed


def file_lock(path: str | os.PathLike, timeout: float = 600) -> FileLock:
    """A lock file beside `path`, so that parallel processes (ranks, jobs) write it one at a time."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Hidden, and never deleted: removing a lock file while another process waits on it breaks the lock.
    return FileLock(str(path.parent / f".{path.name}.lock"), timeout=timeout)


# ------------------------------------------------------------------------------------------------------- reading

_LONE_SURROGATE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def _hint(hint: str) -> str:
    return f"; {hint}" if hint else ""


def _not_finite(name: str) -> float:
    raise ValueError(f"{name} is not a number JSON allows (write null for a missing value)")


def _loads(text: str, allow_nan: bool) -> Any:
    """json.loads; raises ValueError (JSONDecodeError with a position where the JSON itself is wrong)."""
    try:
        value = json.loads(text) if allow_nan else json.loads(text, parse_constant=_not_finite)
    except RecursionError:
        raise ValueError("nested too deeply to read") from None
    if _LONE_SURROGATE.search(text):
        _refuse_surrogates(value)
    return value


def _refuse_surrogates(value: Any) -> None:
    # "\ud800" alone decodes to a string that no file or terminal can encode: refused here, not at the next write
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError as e:
                raise ValueError(f"a lone UTF-16 surrogate escape (\\u{ord(v[e.start]):04x}) is not text") from None
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)


def _where_in_line(e: json.JSONDecodeError) -> str:
    # json's own messages may end in "at" ("Unterminated string starting at")
    return f"{e.msg} column {e.colno}" if e.msg.endswith(" at") else f"{e.msg} at column {e.colno}"


def _describe_json_error(e: ValueError) -> str:
    if isinstance(e, json.JSONDecodeError):
        return f"not valid JSON ({_where_in_line(e)})"
    if "integer string conversion" in str(e):  # Python's advice (sys.set_int_max_str_digits) is not the user's fix
        return "not valid JSON (a number of more than 4300 digits)"
    return f"not valid JSON ({e})"  # NaN refused, nested too deeply, a lone surrogate


class JsonlLines:
    """The iterator `read_jsonl` returns: (line number, value) pairs, and after the last one, what a cut tail held.

    Attributes:
        cut: with `partial="skip"`, the bytes after the file's last newline when they are not a complete line
            (a write interrupted mid-line); `b""` otherwise. Set once the iteration is done.
        cut_line: the line number of that cut line, or None.
    """

    def __init__(self, path, error, hint, objects, partial, allow_nan):
        if partial not in ("error", "skip"):
            raise ValueError(f"`partial` must be 'error' or 'skip', got {partial!r}")
        self.path, self._error, self._hint = path, error, hint
        self._objects, self._partial, self._allow_nan = objects, partial, allow_nan
        self.cut: bytes = b""
        self.cut_line: int | None = None
        self._it = self._lines()

    @property
    def tail_cut(self) -> bool:
        """Whether the file ended in a cut line (only with `partial="skip"`; "error" raises instead)."""
        return bool(self.cut)

    def __iter__(self) -> JsonlLines:
        return self

    def __next__(self) -> tuple[int, Any]:
        return next(self._it)

    def _fail(self, lineno: int, problem: str) -> Exception:
        return self._error(f"{self.path} line {lineno}: {problem}{_hint(self._hint)}")

    def _lines(self) -> Iterator[tuple[int, Any]]:
        offset = 0  # of the line's first byte in the file, for the byte offset of a bad byte
        # a .gz file is read as its text (offsets are then of the uncompressed text)
        opener = gzip.open if str(self.path).endswith(".gz") else open
        with opener(self.path, "rb") as f:
            for lineno, raw in enumerate(f, start=1):
                start, offset = offset, offset + len(raw)
                last = not raw.endswith(b"\n")
                if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):  # a byte-order mark some editors write
                    raw, start = raw[3:], start + 3
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    if last and self._partial == "skip":  # a multi-byte character cut by the end of the write
                        self._set_cut(lineno, raw)
                        return
                    col = len(raw[: e.start].decode("utf-8", "replace")) + 1
                    raise self._fail(lineno, f"not UTF-8 text (byte 0x{raw[e.start]:02x} at column {col}, byte offset "
                                             f"{start + e.start} of the file); save the file as UTF-8") from None
                if not text.strip():
                    continue
                try:
                    value = _loads(text.rstrip("\r\n"), self._allow_nan)  # the line's end is no part of its JSON
                except ValueError as e:
                    if last and self._partial == "skip":
                        self._set_cut(lineno, raw)
                        return
                    cut = ("; the file ends on this line without a newline: cut short by an interrupted write? Remove "
                           "the cut line or write the file again") if last else ""
                    raise self._fail(lineno, _describe_json_error(e) + cut) from None
                if self._objects and not isinstance(value, dict):
                    raise self._fail(lineno, f"expected a JSON object ({{...}}), got {_json_type(value)}")
                yield lineno, value

    def _set_cut(self, lineno: int, raw: bytes) -> None:
        self.cut, self.cut_line = raw, lineno


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "true/false", int: "a number", float: "a number", str: "a string", list: "a list",
            dict: "an object"}.get(type(value), type(value).__name__)


def read_jsonl(path: str | os.PathLike, error: type[Exception] = ValueError, hint: str = "", *, objects: bool = False,
               partial: str = "error", allow_nan: bool = True) -> JsonlLines:
    """(line number, value) for each non-blank line of a JSON-lines file; every fault raises `error` naming the
    file and the line, followed by `hint` (what the file should hold).

    Faults: a line that is not JSON (the column is said), bytes that are not UTF-8 (the column and the byte offset
    in the file are said), JSON nested too deeply or a number too long to read, a lone UTF-16 surrogate escape
    (`"\\ud800"`, which no file can hold), and with the options below a value that is not an object, NaN or
    infinities, or a cut last line.

    Args:
        path: the file; one ending in `.gz` is decompressed as it is read.
        error: the exception type raised (a `ValueError` subclass, so that the command line reports it).
        hint: said after every error, e.g. "one probe per line".
        objects: refuse a line whose value is not a JSON object (`{...}`), naming its type.
        partial: what a last line without a newline that is not complete JSON (a write interrupted mid-line) does:
            "error" (the default) raises, saying the file ends mid-line; "skip" leaves it out and keeps it in the
            returned iterator's `cut` (bytes) and `cut_line`, for a writer that repairs the file (see
            `split_cut_tail`). A complete last line without its newline (a hand-edited file) is read either way.
        allow_nan: read `NaN`, `Infinity` and `-Infinity` (Python writes them; JSON has no such values); False
            refuses them, naming the line.

    Returns:
        A `JsonlLines` iterator of `(line number, value)`; its `cut` / `tail_cut` are set once it is exhausted.

    Example:
        >>> import pathlib, tempfile
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "m.jsonl"
        >>> _ = p.write_text('{"step": 0}\\n\\n{"step": 2}\\n{"step": 4, "f')
        >>> lines = read_jsonl(p, objects=True, partial="skip")
        >>> list(lines), lines.cut, lines.cut_line
        ([(1, {'step': 0}), (3, {'step': 2})], b'{"step": 4, "f', 4)
    """
    return JsonlLines(path, error, hint, objects, partial, allow_nan)


def split_cut_tail(path: str | os.PathLike) -> tuple[int, bytes]:
    """Where a JSON-lines file's whole lines end, and the cut line after them: `(good_len, cut)`.

    A writer appends each line with its newline in one write; the newline is the line's commit mark. A process
    killed mid-append leaves a last line without one: `cut` is the bytes after the last newline (`b""` when the file
    ends with a newline, is empty or does not exist), `good_len` the size of the file without them. Bytes after the
    last newline are counted as cut even when they parse (`12` of a cut `123` does), so a writer that follows this rule
    never appends onto a half line.

    To repair, under the file's lock: keep `cut` aside, truncate the file to `good_len` (`repair_cut_tail` does both).

    Example:
        >>> import pathlib, tempfile
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "metrics.jsonl"
        >>> _ = p.write_bytes(b'{"step": 0}\\n{"step": 2, "for')
        >>> split_cut_tail(p)
        (12, b'{"step": 2, "for')
    """
    path = Path(path)
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return 0, b""
    if size == 0:
        return 0, b""
    with open(path, "rb") as f:
        # read backwards in blocks until a newline: a cut line is one line, whatever the file's size
        pos, tail = size, b""
        while pos > 0:
            step = min(1 << 16, pos)
            pos -= step
            f.seek(pos)
            tail = f.read(step) + tail
            nl = tail.rfind(b"\n")
            if nl >= 0:
                good = pos + nl + 1
                return good, tail[nl + 1 :]
        return 0, tail


def repair_cut_tail(path: str | os.PathLike, aside: str | os.PathLike | None = None) -> Path | None:
    """Move a JSON-lines file's cut last line (see `split_cut_tail`) to `aside` and truncate the file after its last
    whole line; the path the cut bytes went to, or None when the file ended in a whole line (nothing is done).

    Call it under the file's lock (`file_lock`): it must not run while another process appends. `aside` defaults to
    `<path>.cut`; an existing one is appended to (a second repair keeps the first's bytes), each cut on its own line.

    Example:
        >>> import pathlib, tempfile
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "metrics.jsonl"
        >>> _ = p.write_bytes(b'{"step": 0}\\n{"step": 2, "for')
        >>> repair_cut_tail(p).name, p.read_bytes()
        ('metrics.jsonl.cut', b'{"step": 0}\\n')
    """
    path = Path(path)
    good, cut = split_cut_tail(path)
    if not cut:
        return None
    aside = Path(aside) if aside is not None else path.with_name(path.name + ".cut")
    with open(aside, "ab") as f:  # kept first: a kill between the two steps loses nothing
        f.write(cut + b"\n")
        f.flush()
        os.fsync(f.fileno())
    with open(path, "r+b") as f:
        f.truncate(good)
        f.flush()
        os.fsync(f.fileno())
    return aside


def read_json(path: str | os.PathLike, what: str = "", error: type[Exception] = ValueError, *, objects: bool = True,
              allow_nan: bool = True) -> Any:
    """A whole-file JSON document (budget.json, sidecar.json, replay_mix.json); every fault raises `error` naming the
    file and the line (and column) where the JSON goes wrong, followed by `what` (what the file should be).

    Faults: an empty file, JSON that is not valid (the file's line and column, not a position in one long string),
    bytes that are not UTF-8 (line, column and byte offset), with `objects` (the default) a document that is not a
    JSON object, with `allow_nan=False` NaN or infinities. A missing file raises FileNotFoundError naming it.

    Args:
        path: the file.
        what: said after every error, e.g. "forgetwatch's budget file, written by the callback".
        error: the exception type raised (a `ValueError` subclass, so that the command line reports it).
        objects: refuse a document that is not a JSON object.
        allow_nan: as in `read_jsonl`.

    Example:
        >>> import pathlib, tempfile
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "budget.json"
        >>> _ = p.write_text('{\\n  "max_forgetting": 0.05,\\n  "on": "stop",,\\n}')
        >>> read_json(p, what="a budget file")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ValueError: .../budget.json line 3: not valid JSON (Expecting property name ... at column 16); a budget file
    """
    path = Path(path)
    data = path.read_bytes()

    def fail(problem: str) -> Exception:
        return error(f"{path}{problem}{_hint(what)}")

    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        line_start = data.rfind(b"\n", 0, e.start) + 1
        col = len(data[line_start : e.start].decode("utf-8", "replace")) + 1
        raise fail(f" line {line}: not UTF-8 text (byte 0x{data[e.start]:02x} at column {col}, byte offset {e.start} "
                   "of the file); save the file as UTF-8") from None
    if not text.strip():
        raise fail(": the file is empty (a write interrupted before its first byte?)")
    try:
        value = _loads(text, allow_nan)
    except json.JSONDecodeError as e:
        cut = "; the file ends before the JSON does: cut short by an interrupted write?" if e.pos >= len(text.rstrip()) else ""
        raise fail(f" line {e.lineno}: {_describe_json_error(e)}{cut}") from None
    except ValueError as e:
        raise fail(f": {_describe_json_error(e)}") from None
    if objects and not isinstance(value, dict):
        raise fail(f": expected a JSON object ({{...}}), got {_json_type(value)}")
    return value


def strict_json(obj: Any, **kwargs) -> str:
    """`json.dumps` for output other tools read: NaN and infinities (a rate with nothing to count) become null.

    Python writes them as bare `NaN`, which is not JSON: jq and JavaScript refuse the whole document.

        >>> strict_json({"forgotten": 0.25, "length_deviation": float("nan"), "by": [float("inf")]})
        '{"forgotten": 0.25, "length_deviation": null, "by": [null]}'
    """

    def clean(v):
        if isinstance(v, float):
            return v if v == v and v not in (float("inf"), float("-inf")) else None
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [clean(x) for x in v]
        return v

    return json.dumps(clean(obj), allow_nan=False, **kwargs)


def read_json_or_none(path: str | os.PathLike) -> dict[str, Any] | None:
    """A small JSON object this package wrote (a manifest, saved margins), or None when it is absent or unreadable:
    for state that is looked for in several places, where a missing file is not an error."""
    try:
        value = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None
