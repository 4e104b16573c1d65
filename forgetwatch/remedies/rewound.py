"""`<output_dir>/rewound/` and `<output_dir>/forgetwatch/rewind.json`, kept in agreement through kills and reruns.

The decision travels inside the model's folder: rewind writes the new model and its decision
(`rewound/forgetwatch-rewind.json`, the same text as the record's `rewind.json`) into a hidden folder beside it, moves
an earlier `rewound/` aside, renames the new folder into place (the commit point: one rename), then writes the record's
copy and removes what it moved aside. A kill at any point leaves one of two states that `reconcile` mends at the next
start (and `read_decision` reads right meanwhile):

- before the rename: the earlier `rewound/` (or its aside copy, moved back) and the earlier `rewind.json`, which agree;
  the unfinished folder is removed;
- after it: the new `rewound/` with its decision; the record's copy is brought up to it.

A rewind that does not save (`--no-save`) never leaves an earlier `rewound/` beside a `rewind.json` that no longer
describes it: it is refused while one exists, or with `force` the model is removed with the decision that described it.

Example:
    >>> notes = reconcile("outputs/sft-run")  # doctest: +SKIP
    ['rewind.json brought up to rewound/ (a rewind was stopped after saving its model)']
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Any

from .._io import atomic_write, strict_json

__all__ = ["DECISION", "REWIND_FILE", "REWOUND", "commit", "decision_path", "discard", "model_present", "reconcile", "staging"]

logger = logging.getLogger(__name__)

REWOUND = "rewound"  # <output_dir>/rewound/: the model at the picked α
REWIND_FILE = "rewind.json"  # <output_dir>/forgetwatch/rewind.json: the front and the pick
DECISION = "forgetwatch-rewind.json"  # rewound/forgetwatch-rewind.json: the decision that made this model


def staging(output_dir: str | os.PathLike) -> Path:
    """The hidden folder a rewind writes its model into before `commit` renames it into place."""
    return Path(output_dir) / f".{REWOUND}.tmp-{os.getpid()}"


def model_present(output_dir: str | os.PathLike) -> bool:
    """Whether the run has a rewound model: `rewound/`, or one a stopped rewind moved aside (`reconcile` puts it back)."""
    output_dir = Path(output_dir)
    return (output_dir / REWOUND).exists() or any(output_dir.glob(f".{REWOUND}.old-*"))


def _aside(output_dir: Path) -> Path:
    return output_dir / f".{REWOUND}.old-{os.getpid()}"


def _write(path: Path, text: str) -> None:
    with atomic_write(path) as f:
        f.write(text)


def commit(output_dir: str | os.PathLike, staged: Path, data: dict[str, Any]) -> None:
    """Make `staged` (a finished model folder) the run's `rewound/`, with `data` as its decision and the record's."""
    output_dir = Path(output_dir)
    out, text = output_dir / REWOUND, strict_json(data, indent=1)
    _write(staged / DECISION, text)
    aside = None
    if out.exists():
        aside = _aside(output_dir)
        out.rename(aside)
    staged.rename(out)  # the commit point
    _write(output_dir / "forgetwatch" / REWIND_FILE, text)
    if aside is not None:
        shutil.rmtree(aside)


def discard(output_dir: str | os.PathLike, data: dict[str, Any]) -> None:
    """Record a rewind that saved no model: an earlier `rewound/` goes with the decision that described it (the caller
    was asked `force`)."""
    output_dir = Path(output_dir)
    out, aside = output_dir / REWOUND, None
    if out.exists():
        aside = _aside(output_dir)
        out.rename(aside)  # a kill from here to the write below: `reconcile` puts it back, with its decision
    _write(output_dir / "forgetwatch" / REWIND_FILE, strict_json(data, indent=1))
    if aside is not None:
        shutil.rmtree(aside)


def reconcile(output_dir: str | os.PathLike) -> list[str]:
    """Mend what a killed rewind left (run under the record's locks, before anything else): unfinished model folders
    removed, an earlier `rewound/` moved aside and not yet replaced put back, and the record's `rewind.json` brought up
    to the decision inside `rewound/`. Returns what was done (also said in one warning)."""
    output_dir = Path(output_dir)
    out, notes = output_dir / REWOUND, []
    for tmp in sorted(output_dir.glob(f".{REWOUND}.tmp-*")):
        shutil.rmtree(tmp, ignore_errors=True)
        notes.append(f"{tmp.name}: an unfinished rewound model, removed")
    olds = sorted(output_dir.glob(f".{REWOUND}.old-*"), key=lambda p: p.stat().st_mtime)
    if olds and not out.exists():
        olds.pop().rename(out)
        notes.append(f"{REWOUND}/ put back from where a stopped rewind had moved it")
    for old in olds:
        shutil.rmtree(old, ignore_errors=True)
        notes.append(f"{old.name}: a replaced rewound model, removed")
    inside, record = out / DECISION, output_dir / "forgetwatch" / REWIND_FILE
    if inside.is_file() and (not record.is_file() or record.read_bytes() != inside.read_bytes()):
        _write(record, inside.read_text(encoding="utf-8"))
        notes.append(f"{REWIND_FILE} brought up to {REWOUND}/ (a rewind was stopped after saving its model)")
    if notes:
        logger.warning("forgetwatch rewind: %s held what a stopped rewind left: %s", output_dir, "; ".join(notes))
    return notes


def decision_path(record_json: Path) -> Path | None:
    """The decision in force: the one inside `rewound/` when the record's copy disagrees with it (a rewind stopped
    between the two writes; the next rewind's `reconcile` mends the record), else the record's; None when neither is."""
    inside = record_json.parent.parent / REWOUND / DECISION
    if inside.is_file() and (not record_json.is_file() or record_json.read_bytes() != inside.read_bytes()):
        logger.warning("forgetwatch: %s disagrees with %s (a rewind was stopped between the two writes): reading the "
                       "model's own; the next `forgetwatch rewind` mends the record", record_json, inside)
        return inside
    return record_json if record_json.is_file() else None
