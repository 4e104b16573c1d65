"""One writer per record: a lock beside the record that names its holder, refuses a second writer, and is taken over
(with a warning) when its holder is gone.

Two roles write a run's record: the training process (`training`: the probes, the base cache, the sidecar manifest,
the trainer's log) and whoever scores it (`scoring`: the evaluations, in the training process itself or in
`forgetwatch watch`). Each role has its own lock file in the trainer's output_dir, beside the record directory (so that
moving an earlier record aside never moves a live lock):

    <output_dir>/.forgetwatch-training.lock
    <output_dir>/.forgetwatch-scoring.lock

The lock is an `flock` held for the life of the process, so the kernel drops it when the process dies, even by
SIGKILL. The file also says who holds it (host, pid, run, since) for the refusal's message, and a daemon thread
refreshes its time every `HEARTBEAT` seconds: where a shared file system does not carry locks between hosts, a holder
on another host counts as gone once its heartbeat is older than `STALE_AFTER`.

Example:
    >>> lock = acquire("outputs/run", "scoring", run="run-a")  # doctest: +SKIP
    >>> acquire("outputs/run", "scoring", run="run-b")  # another process  # doctest: +SKIP
    Traceback (most recent call last):
    forgetwatch.errors.RecordInUseError: outputs/run: the forgetwatch record is being written (scoring) by run-a ...
    >>> lock.release()  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._io import pid_alive
from ..errors import RecordInUseError, RecordUnwritableError

__all__ = ["RecordInUseError", "RecordUnwritableError", "RecordLock", "acquire", "live_holder", "ROLES"]

logger = logging.getLogger(__name__)

ROLES = ("training", "scoring")
HEARTBEAT = 30.0  # seconds between refreshes of the lock file's time
STALE_AFTER = 300.0  # a holder on another host whose heartbeat is older than this is taken to be gone

# Locks this process holds, by lock file: a second `acquire` in the same process (a notebook running train() again after
# an exception) takes its own lock over instead of refusing itself.
_HELD: dict[str, RecordLock] = {}
_HELD_GUARD = threading.Lock()


@dataclass
class RecordLock:
    """A held lock on one role of one record; `release()` (or the end of the process) frees it."""

    path: Path
    info: dict[str, Any]
    _fd: int | None = None
    _stop: threading.Event = field(default_factory=threading.Event)

    def release(self) -> None:
        """Free the lock and mark the file released (a later writer then takes it without a warning)."""
        with _HELD_GUARD:
            if _HELD.get(_key(self.path)) is self:
                del _HELD[_key(self.path)]
        self._stop.set()
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            _write_info(fd, {**self.info, "released": time.time()})
        except OSError:
            pass  # the lock itself is what matters, and closing drops it
        finally:
            os.close(fd)  # drops the flock

    @property
    def held(self) -> bool:
        return self._fd is not None

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT):
            try:
                os.utime(self.path)
            except OSError:
                pass  # a heartbeat that fails only makes the lock look stale to another host, later


def acquire(output_dir: str | os.PathLike, role: str, run: str | None = None) -> RecordLock:
    """Take the `role` lock of the record in `output_dir`, or raise `RecordInUseError` naming the live holder.

    A lock whose holder is gone (its process no longer exists on this host, or, on another host, no heartbeat for
    `STALE_AFTER` seconds) is taken over with a warning naming it.
    """
    if role not in ROLES:
        raise ValueError(f"lock role must be one of {', '.join(ROLES)}, got {role!r}")
    path = Path(output_dir) / f".forgetwatch-{role}.lock"
    with _HELD_GUARD:
        mine = _HELD.get(_key(path))
    if mine is not None:
        logger.info("forgetwatch: this process held the %s lock of %s already (an earlier run in it); taking it over",
                    role, output_dir)
        mine.release()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        if e.errno in _UNWRITABLE:  # not another writer: no writer at all can write here
            raise RecordUnwritableError(unwritable(output_dir, e, role)) from e
        raise
    try:
        locked = _flock(fd)
        prev = _read_info(fd)  # after the flock: a holder that released meanwhile has said so
        if locked is False:
            raise RecordInUseError(_refusal(output_dir, role, prev))
        # a free flock is the answer on this host; elsewhere (or where flock does not work) pid and heartbeat decide
        if prev and not prev.get("released"):
            if not (locked and prev.get("host") == socket.gethostname()) and _maybe_alive(prev, path):
                raise RecordInUseError(_refusal(output_dir, role, prev))
            logger.warning("forgetwatch: %s: taking over the %s lock of %s, which is gone without releasing it (killed or "
                           "preempted?); the record continues from what it finished", output_dir, role, _describe(prev))
        info = {"host": socket.gethostname(), "pid": os.getpid(), "run": run or str(output_dir), "role": role,
                "since": time.time(), "released": None}
        _write_info(fd, info)
    except BaseException:
        os.close(fd)
        raise
    lock = RecordLock(path, info, fd)
    with _HELD_GUARD:
        _HELD[_key(path)] = lock
        if not _HELD_AT_FORK:
            _HELD_AT_FORK.append(True)
            os.register_at_fork(after_in_child=_forget_in_child)
    threading.Thread(target=lock._beat, name=f"forgetwatch-{role}-lock", daemon=True).start()
    return lock


def live_holder(output_dir: str | os.PathLike, role: str) -> dict[str, Any] | None:
    """Who holds the `role` lock of the record in `output_dir` (host, pid, run, since), while it lives; None when nobody
    does. Read, never taken: a reader (`forgetwatch report`) must not stand in a writer's way, even for an instant, nor
    need to write where it only reads.

    Example:
        >>> live_holder("outputs/run", "scoring")  # doctest: +SKIP
        {'host': 'node1', 'pid': 4242, 'run': 'forgetwatch watch outputs/run', 'role': 'scoring', 'since': ..., 'released': None}
    """
    path = Path(output_dir) / f".forgetwatch-{role}.lock"
    try:
        with open(path, "rb") as f:
            data = f.read(65536)
        info = json.loads(data.decode("utf-8")) if data.strip() else None
    except (OSError, ValueError):
        return None
    if not isinstance(info, dict) or info.get("released"):
        return None
    with _HELD_GUARD:
        if _key(path) in _HELD:  # this very process writes it (a notebook reporting on its own run)
            return info
    return info if _maybe_alive(info, path) else None


_HELD_AT_FORK: list[bool] = []


def _forget_in_child() -> None:
    """A forked child (a DataLoader worker) shares the parent's open lock files, and an flock lasts while any process
    has one open: close the child's copies, so that the lock ends with its holder, not with its last worker."""
    for lock in list(_HELD.values()):
        fd, lock._fd = lock._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)  # closing a copy keeps the parent's flock
    _HELD.clear()


def _key(path: Path) -> str:
    return str(path.resolve())


def _flock(fd: int) -> bool | None:
    """True when this process now holds the lock; False when another holds it; None where there is no flock (Windows,
    a file system that refuses it): then the holder's pid and heartbeat decide alone."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not on the platforms we test
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError:  # ENOLCK and the like: no locks on this file system
        return None
    return True


def _maybe_alive(prev: dict[str, Any], path: Path) -> bool:
    """Whether an unreleased holder might still run, although its flock is free (a file system that keeps no locks)."""
    if prev.get("host") == socket.gethostname():
        pid = prev.get("pid")
        # a lock file is anyone's to garble: a pid no process can have is no holder (and never reaches os.kill)
        if not isinstance(pid, int) or isinstance(pid, bool) or not 0 < pid < 2**31 or pid == os.getpid() or not pid_alive(pid):
            return False
        # a live pid and no flock to ask: the pid was reused by another program, or it is the holder; the heartbeat
        # tells them apart
    try:
        age = time.time() - path.stat().st_mtime
    except OSError:
        return False
    return age < STALE_AFTER


def _read_info(fd: int) -> dict[str, Any] | None:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        data = os.read(fd, 65536)
        info = json.loads(data.decode("utf-8")) if data.strip() else None
    except (OSError, ValueError):
        return None  # a lock file cut short by a crash: nobody to name
    return info if isinstance(info, dict) else None


def _write_info(fd: int, info: dict[str, Any]) -> None:
    data = (json.dumps(info) + "\n").encode("utf-8")
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)
    os.fsync(fd)


def _describe(info: dict[str, Any] | None) -> str:
    if not info:
        return "another process (it did not say which)"
    since = info.get("since")
    try:  # a garbled file's time (NaN, 1e300, text) is said as unknown
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(since)) if isinstance(since, (int, float)) else "?"
    except (ValueError, OverflowError, OSError):
        when = "?"
    return f"{info.get('run')!s} (pid {info.get('pid')} on {info.get('host')}, since {when})"


_UNWRITABLE = (errno.EACCES, errno.EPERM, errno.EROFS)


def unwritable(output_dir: Any, error: OSError, role: str = "training") -> str:
    """The refusal of an output_dir that cannot be written: what it is, and the way on."""
    what = {"training": "the training run's record and its writer lock",
            "scoring": "the evaluations `forgetwatch watch` scores, and its writer lock"}[role]
    where = error.filename or output_dir
    return (f"{output_dir}: cannot write to {where}: {(error.strerror or str(error)).lower()}. forgetwatch writes {what} "
            "there: give an output_dir you can write (`forgetwatch report` only reads a record, and writes its page where "
            "it can)")


def _refusal(output_dir: Any, role: str, holder: dict[str, Any] | None) -> str:
    what = {"training": "a training run writes", "scoring": "its evaluations are written by"}[role]
    return (f"{output_dir}: {what} {_describe(holder)}: one record takes one writer (two would mix their steps). "
            f"Use another output_dir, or stop that process first"
            + ("; to watch a run, one `forgetwatch watch` at a time" if role == "scoring" else "")
            + f". If it is gone and this still refuses (a file system that keeps no locks), delete "
              f"{Path(output_dir) / f'.forgetwatch-{role}.lock'}")
