"""Read back what wandb wrote to an offline run, so tests can check what was logged.

wandb (0.31) ships no reader for offline run files. `<WANDB_DIR>/wandb/offline-run-*/run-<id>.wandb` is:
a 7-byte header `<4sHB` (b":W&B", magic 0xBEE1, version 0), then the LevelDB log format: 32 KiB blocks of
records, each with a `<IHB` header (crc32, length, type FULL=1 / FIRST=2 / MIDDLE=3 / LAST=4) where the
crc is zlib's CRC-32 of the type byte followed by the payload; a block tail shorter than 7 bytes is zero
padding. Blocks are counted from the start of the file (the first one holds the file header). One record,
once its chunks are joined, is a serialized `wandb.proto.wandb_internal_pb2.Record`.

History, summary and config values are JSON in `value_json`. A logged dict (and a wandb.Table, which is
logged as a dict) is flattened by wandb into items with a multi-part `nested_key`; the readers here put the
nesting back, so a row reads like what was passed to `wandb.log`. A key such as "train/loss" is one part.

Call `finish_offline_run()` before reading: offline `run.finish()` can return before the file is complete,
and `wandb.teardown()` waits for it. The readers check that the file ends with the run's exit record.
"""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path
from typing import Any

from google.protobuf.json_format import MessageToDict
from internals import library_changed, relies_on

with relies_on("wandb", "the protobuf module of offline run files (wandb.proto.wandb_internal_pb2)"):
    from wandb.proto import wandb_internal_pb2 as pb

_FILE_HEADER = struct.Struct("<4sHB")  # ident, magic, version
_IDENT, _MAGIC, _VERSION = b":W&B", 0xBEE1, 0
_RECORD_HEADER = struct.Struct("<IHB")  # crc32, payload length, chunk type
_BLOCK = 32 * 1024
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def finish_offline_run() -> None:
    """Finish the active wandb run (if any) and tear wandb down, so the run file is complete on disk."""
    import wandb

    if wandb.run is not None:
        wandb.finish()
    wandb.teardown()


def find_run_files(wandb_dir: str | Path) -> list[Path]:
    """All `run-*.wandb` files under `wandb_dir` (searched recursively; the `latest-run` link counted once)."""
    return sorted({p.resolve() for p in Path(wandb_dir).rglob("run-*.wandb")})


def find_run_file(wandb_dir: str | Path) -> Path:
    """The single `run-*.wandb` file under `wandb_dir`; raises if there is none or several."""
    files = find_run_files(wandb_dir)
    if not files:
        raise FileNotFoundError(
            f"no run-*.wandb file under {wandb_dir} (was wandb.init run in offline mode?)"
        )
    if len(files) > 1:
        listing = "\n  ".join(map(str, files))
        raise ValueError(f"{len(files)} run files under {wandb_dir}; use find_run_files():\n  {listing}")
    return files[0]


def read_records(path: str | Path, *, require_exit: bool = True) -> list[pb.Record]:
    """Parse every record of a run file. Raises ValueError on a bad header, checksum or truncated record,
    and (unless `require_exit=False`, e.g. for a run still in progress) if the run's exit record is missing.
    A run file of another format version, or a record that does not parse, is reported as a change of wandb's format
    (`internals.LibraryChanged`, naming the installed wandb).
    """
    data = Path(path).read_bytes()
    if len(data) < _FILE_HEADER.size or _FILE_HEADER.unpack_from(data)[0] != _IDENT:
        raise ValueError(f"{path}: not a wandb run file (header {data[: _FILE_HEADER.size]!r})")
    if _FILE_HEADER.unpack_from(data) != (_IDENT, _MAGIC, _VERSION):
        raise library_changed("wandb", "the offline run file format", f"{path} has header {data[: _FILE_HEADER.size]!r}, "
                              f"this reader knows {_FILE_HEADER.pack(_IDENT, _MAGIC, _VERSION)!r}")
    records: list[pb.Record] = []
    chunks: list[bytes] = []
    pos = _FILE_HEADER.size
    while pos < len(data):
        room = _BLOCK - pos % _BLOCK
        if room < _RECORD_HEADER.size:  # block trailer: zero padding
            pos += room
            continue
        if pos + _RECORD_HEADER.size > len(data):
            raise ValueError(f"{path}: truncated record header at byte {pos}")
        crc, length, kind = _RECORD_HEADER.unpack_from(data, pos)
        start = pos + _RECORD_HEADER.size
        payload = data[start : start + length]
        if len(payload) != length:
            raise ValueError(f"{path}: truncated record at byte {pos} ({len(payload)} of {length} bytes)")
        if zlib.crc32(payload, zlib.crc32(bytes([kind]))) != crc:
            raise ValueError(f"{path}: checksum mismatch in record at byte {pos}")
        # FULL and FIRST start a record, MIDDLE and LAST continue one.
        if kind not in (_FULL, _FIRST, _MIDDLE, _LAST) or (kind in (_FULL, _FIRST)) == bool(chunks):
            raise ValueError(f"{path}: unexpected chunk type {kind} at byte {pos}")
        chunks.append(payload)
        pos = start + length
        if kind in (_FULL, _LAST):
            record = pb.Record()
            with relies_on("wandb", "the offline run file's records (wandb_internal_pb2.Record)"):
                record.ParseFromString(b"".join(chunks))
            records.append(record)
            chunks = []
    if chunks:
        raise ValueError(f"{path}: file ends inside a multi-chunk record")
    if require_exit and not any(r.HasField("exit") for r in records):
        raise ValueError(f"{path}: no exit record; finish the run and call wandb.teardown() before reading")
    return records


def _value(item: Any) -> Any:
    """Decode an item's value: `value_json`, else the typed `value` oneof (HistoryItem only)."""
    if item.value_json:
        return json.loads(item.value_json)
    which = item.WhichOneof("value") if "value" in item.DESCRIPTOR.oneofs_by_name else None
    if which == "json":
        return json.loads(item.json)
    return None if which in (None, "none") else getattr(item, which)


def _apply(target: dict, items: Any, remove: Any = ()) -> dict:
    """Set each item's value at its (nested) key in `target`, then delete the keys of `remove`."""
    for item in items:
        *parents, last = list(item.nested_key) or [item.key]
        node = target
        for part in parents:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[last] = _value(item)
    for item in remove:
        *parents, last = list(item.nested_key) or [item.key]
        node = target
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(last, None)
    return target


def _sections(records: list[pb.Record], field: str) -> list[Any]:
    """The run record's `field` ("summary" or "config") and every standalone `field` record, in order."""
    return [
        getattr(r.run if r.HasField("run") else r, field)
        for r in records
        if r.HasField("run") or r.HasField(field)
    ]


def read_history(path: str | Path, *, require_exit: bool = True) -> list[dict]:
    """One dict per history row (`wandb.log` call), in order, with `_step`, `_runtime` and `_timestamp`."""
    rows = []
    for record in read_records(path, require_exit=require_exit):
        if record.HasField("history"):
            row = _apply({}, record.history.item)
            row.setdefault("_step", record.history.step.num)
            rows.append(row)
    return rows


def read_summary(path: str | Path, *, require_exit: bool = True) -> dict:
    """The run's final summary (every summary update and removal applied in order), without `_wandb`."""
    summary: dict = {}
    for section in _sections(read_records(path, require_exit=require_exit), "summary"):
        _apply(summary, section.update, section.remove)
    summary.pop("_wandb", None)
    return summary


def read_config(path: str | Path, *, require_exit: bool = True) -> dict:
    """The run's final config (from `wandb.init(config=...)` and later updates), without `_wandb`.

    The records hold plain values; if every value has the `{"value": ..., "desc": ...}` wrapper of wandb's
    config.yaml, it is stripped.
    """
    config: dict = {}
    for section in _sections(read_records(path, require_exit=require_exit), "config"):
        _apply(config, section.update, section.remove)
    config.pop("_wandb", None)
    if config and all(
        isinstance(v, dict) and "value" in v and v.keys() <= {"value", "desc"} for v in config.values()
    ):
        config = {k: v["value"] for k, v in config.items()}
    return config


def read_metric_definitions(path: str | Path, *, require_exit: bool = True) -> list[dict]:
    """The `define_metric` records, in order, as dicts of their set fields, e.g. `{"name": "acc",
    "step_metric": "my_step", "options": {"step_sync": True, "defined": True}, "summary": {"max": True}}`
    (a glob definition has `glob_name` instead of `name`)."""
    return [
        MessageToDict(r.metric, preserving_proto_field_name=True)
        for r in read_records(path, require_exit=require_exit)
        if r.HasField("metric")
    ]


def load_table(run_dir: str | Path, value: dict) -> list[dict]:
    """The rows (dicts keyed by column) of a logged wandb.Table, given its history/summary value
    (`{"_type": "table-file", "path": "media/table/....table.json", ...}`) and the run directory."""
    if not isinstance(value, dict) or value.get("_type") != "table-file":
        raise ValueError(f"not a logged wandb.Table value: {value!r}")
    table = json.loads((Path(run_dir) / "files" / value["path"]).read_text())
    return [dict(zip(table["columns"], row, strict=True)) for row in table["data"]]


def read_tables(path: str | Path, *, require_exit: bool = True) -> dict[str, list[list[dict]]]:
    """Every wandb.Table logged at the top level of a history row: key -> one list of rows per log call."""
    tables: dict[str, list[list[dict]]] = {}
    for row in read_history(path, require_exit=require_exit):
        for key, value in row.items():
            if isinstance(value, dict) and value.get("_type") == "table-file":
                tables.setdefault(key, []).append(load_table(Path(path).parent, value))
    return tables
