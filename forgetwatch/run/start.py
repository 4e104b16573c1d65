"""The start of a run's record, one piece of code for the two faces that start one: the callback (when training
begins, `ForgetWatchCallback.on_train_begin`) and the watcher (`forgetwatch watch`, `Watcher`). Each adapts only its
own events; what they share is here:

- one writer per record (`take_locks`): training and scoring locks, refused by name when another live process holds
  one or the directory cannot be written;
- the probes pinned by the record's evaluations (`pin_probes`): other probes are refused, the same probes in another
  order are scored in the record's, and with `probe_change="new_segment"` a new segment starts (`begin_segment`);
- the base found (`find_base`): the given cache, or on a resume the one the first run wrote into the record; a cache
  of other probes, model or scoring is named with the command that makes one that fits.

Every function here decides and returns (an error included) rather than raising, where the callback must tell every
rank the same decision before anyone raises (`forgetwatch.run.distributed.broadcast_from_main`).

Example:
    >>> locks, error = take_locks("out", "my-run (training)", scoring=True)  # doctest: +SKIP
    >>> order, change, error = pin_probes(record_root, probes, "refuse", who="the resumed run")  # doctest: +SKIP
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..record.cache import BaseCache, CacheMismatchError
from ..record.lock import RecordInUseError, RecordUnwritableError, acquire
from ..record.segments import check_probes, start_segment

__all__ = ["base_cache_command", "begin_segment", "find_base", "pin_probes", "take_locks"]

logger = logging.getLogger(__name__)


def take_locks(output_dir: str | os.PathLike, run: str, *, scoring: bool) -> tuple[list[Any], Exception | None]:
    """The record's training lock, and its scoring lock when this process scores (`scoring`): (the locks held, None),
    or ([], the error to raise) when another live process holds one (`RecordInUseError`) or the directory cannot be
    written (`RecordUnwritableError`). Without `scoring` the scoring lock is taken and freed at once: no watcher of an
    earlier run may still be writing here (moving the record aside would hand it this run's record)."""
    locks: list[Any] = []
    try:
        for role in ("training", "scoring"):
            locks.append(acquire(output_dir, role, run=run))
        if not scoring:
            locks.pop().release()
    except Exception as e:
        for lock in locks:
            lock.release()
        # another writer, or a directory nobody can write in (a read-only file system is no writer's fault)
        return [], e if isinstance(e, (RecordInUseError, RecordUnwritableError)) else RecordInUseError(f"{type(e).__name__}: {e}")
    return locks, None


def pin_probes(record_root: str | os.PathLike, probes: Any, probe_change: str, who: str
               ) -> tuple[list[int] | None, Any, Exception | None]:
    """(the positions of `probes` in the record's order when the record holds the same probes in another order, the
    change a new segment starts for, the refusal): `forgetwatch.record.segments.check_probes`, told rather than raised."""
    try:
        pinned, change = check_probes(record_root, probes, probe_change, who=who)
    except Exception as e:
        return None, None, e
    order = [probes.index_of(p.id) for p in pinned] if pinned is not probes else None
    return order, change, None


def begin_segment(record_root: str | os.PathLike, change: Any, step: int, probes: Any, cache: BaseCache | None = None,
                  **kwargs: Any) -> None:
    """The record's earlier segment moves aside for the new probes (`forgetwatch.record.segments.start_segment`, its
    keyword arguments passed on); the new segment's base, when given, is written beside it unless one is there (the
    report draws it)."""
    root = Path(record_root)
    start_segment(root, change, step, probes, **kwargs)
    if cache is not None and not (root / "base.parquet").exists():
        cache.save(root / "base.parquet")


def find_base(key: dict[str, Any], probe_ids: list[str], paths: list[Path], step: int, *, given: bool,
              cache_command: Callable[[], str]) -> tuple[BaseCache | None, Exception | None]:
    """(the base cache to use, its results in probe order; or None to score the base now, or the error a resume must
    stop with). `paths`: where to look, in order (the given cache, then on a resume the record's own). `given`: the
    user named a cache (a missing one is said). `cache_command()`: the `forgetwatch cache` command that makes a cache
    matching `key`, for the messages."""
    resuming = step > 0
    problems, mismatched = [], False
    for path in dict.fromkeys(paths):
        if not path.is_file():
            problems.append(f"{path}: no such file")
            if not resuming and given:
                logger.warning("forgetwatch: base_cache %s does not exist; scoring the base model now. A cache this run "
                               "accepts: %s", path, cache_command())
            continue
        try:
            # rows checked against the probes too: a key can match while rows edited by hand do not
            return BaseCache.load(path, expect=key).for_probes(probe_ids, path), None
        except (CacheMismatchError, ValueError) as e:  # made under another key, or unreadable
            problems.append(str(e))
            mismatched = True
            if not resuming:
                logger.warning("forgetwatch: %s\nScoring the base model now. A cache this run accepts: %s", e, cache_command())
    if not resuming:
        return None, None
    error = CacheMismatchError if mismatched else FileNotFoundError
    return None, error(
        f"resuming at step {step} needs the base model's results from the first run (the model has already changed), "
        "and none matches:\n  " + "\n  ".join(problems) + "\nPass `base_cache=` pointing to the cache the first run used"
        + (f", or, where the resume changed what the cache holds (robustness, or the probes with "
           f"probe_change='new_segment'), one of the base model made with: {cache_command()}"
           if mismatched else ".")
    )


def base_cache_command(key: dict[str, Any], probes: Any, options: Any, record_root: Path | None) -> str:
    """The `forgetwatch cache` command that makes a base cache matching `key` (model, probes, scoring, precision), for
    the advice `find_base` gives: the probes named as the run named them (suites with their sampling, a JSONL path, or
    the record's copy of a `ProbeSet` built in code)."""
    from ..commands import cache_command

    origin = probes.origin
    if origin.startswith("suites:"):
        named = origin.removeprefix("suites:")
        per_suite, seed = options.forgetwatch_per_suite, options.forgetwatch_seed
        named += (f" --per-suite {per_suite}" if per_suite else "") + (f" --seed {seed}" if seed else "")
    elif origin.endswith(".jsonl"):
        named = origin
    else:  # a ProbeSet built in code: the run's record keeps it as JSONL
        named = str(record_root / "probes.jsonl") if record_root else "probes.jsonl"
    return cache_command(key["model"].get("name_or_path", ""), named, key["scoring"],
                         options.forgetwatch_base_cache or "base.parquet",
                         robustness=options.forgetwatch_robustness or None,
                         robust_per_suite=options.forgetwatch_robust_per_suite)
