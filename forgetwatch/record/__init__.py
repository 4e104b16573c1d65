"""Record: what is kept on disk, crash-safe, and read back checked.

`cache.py` holds the base model's per-probe results, keyed so that a mismatch is refused; `store.py` a run's local
record under `<output_dir>/forgetwatch/` (one commit line per evaluation), with `files.py` its files' names, appends and
checked reads, and `recovery.py` its upkeep (recovery after a crash, a resume's cut, the report's check); `schema.py`
what each record file may hold, field by field; `lock.py` the one writer per record; `ordering.py` evaluations in step order
whatever order they were scored in; `segments.py` the probe set pinned to a record; `replay.py` the forgotten probes as
training examples (`replay.jsonl`). A new record file gets its schema in `schema.py` and its writer in `store.py`.

Example:
    >>> from forgetwatch.record import load_record
    >>> record = load_record("outputs/my-run")  # doctest: +SKIP
"""

from .cache import BaseCache, make_cache_key
from .store import RecordError, RunRecord, load_record

__all__ = ["BaseCache", "RecordError", "RunRecord", "load_record", "make_cache_key"]
