"""Atomic file writes and cross-process locks: no reader ever sees a half-written file."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from filelock import FileLock


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "w") -> Iterator:
    """Open a temporary file next to `path`; on success, fsync it and rename it over `path`.

    On error the temporary file is removed and `path` is left as it was.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
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


def file_lock(path: str | os.PathLike, timeout: float = 600) -> FileLock:
    """A lock file beside `path`, so that parallel processes (ranks, jobs) write it one at a time."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Hidden, and never deleted: removing a lock file while another process waits on it breaks the lock.
    return FileLock(str(path.parent / f".{path.name}.lock"), timeout=timeout)


def read_jsonl(path: str | os.PathLike, error: type[Exception] = ValueError, hint: str = "") -> Iterator[tuple[int, Any]]:
    """(line number, value) for each non-blank line of a JSONL file; a line that is not JSON raises `error` naming
    the file, the line and the column, followed by `hint` (what the file should hold)."""
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                yield lineno, json.loads(line)
            except json.JSONDecodeError as e:
                raise error(f"{path} line {lineno}: not valid JSON ({e.msg} at column {e.colno}){'; ' + hint if hint else ''}") from None


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
