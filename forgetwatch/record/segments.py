"""The probe set pinned to a record, and the segments a record is split into when the probe set changes on purpose.

A record's evaluations are rows of one probe set: its `probes.jsonl`, whose fingerprint each `evals/step-N.npz` carries.
Once the record holds a committed evaluation, that set is pinned: a resumed run (or a watcher) with other probes (ids
added or removed, or a probe whose content changed) is refused with `ProbeSetChangedError` before anything is scored,
because its figures would be of other probes than the record's earlier ones. The same probes in another order, or the
same file saved again, are no change: the run scores them in the record's order.

Two ways on: a new output dir (a record of its own), or the option `probe_change="new_segment"` (`forgetwatch watch
--probe-change new_segment`), which starts a new segment: the record as it stood moves, whole, into

    <record>/segments/<k>-steps-<first>-<last>/     the earlier segment: a complete record `forgetwatch report` reads
    <record>/segments.json                          the segments before this one, and the step this one starts at

and the record starts again with the new probe set at the step the run goes on from. The new segment has no base row at
step 0 (the model was no longer the base): its first evaluation's flips are against the base.

Example:
    >>> probes, change = check_probes(record_root, run_probes, "refuse")  # doctest: +SKIP
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._io import atomic_write, read_json
from ..commands import quote
from ..errors import ProbeSetChangedError, RecordError
from ..probes.probe_set import ProbeSet
from .store import RunRecord

__all__ = ["ProbeChange", "ProbeSetChangedError", "check_probes", "diff_probes", "read_segments", "segment_start",
           "start_segment", "SEGMENTS", "SEGMENTS_FILE", "PROBE_CHANGE_HINT"]

logger = logging.getLogger(__name__)

SEGMENTS = "segments"  # <record>/segments/<k>-steps-<a>-<b>/: the earlier segments, each a complete record
SEGMENTS_FILE = "segments.json"  # <record>/segments.json: which segments came before this one, and where it starts
PROBE_CHANGE_HINT = (
    "probe_change='new_segment' (--forgetwatch_probe_change new_segment; `forgetwatch watch --probe-change new_segment`)"
)
_SHOWN = 5  # ids named per kind of change


@dataclass
class ProbeChange:
    """How a run's probe set differs from the record's: ids added, removed, and ids whose content changed."""

    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    reordered: bool = False  # the same probes in another order: no change
    replaced: str | None = None  # probes.jsonl replaced after its evaluations: the fingerprint they were scored on

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.changed or self.replaced)

    def describe(self) -> str:
        """"2 added ('q40', 'q41'); 1 changed (content: 'q3')" (counts, then the first few ids)."""
        parts = []
        for what, ids in (("added", self.added), ("removed", self.removed), ("whose content changed", self.changed)):
            if ids:
                shown = ", ".join(map(repr, ids[:_SHOWN])) + (", ..." if len(ids) > _SHOWN else "")
                parts.append(f"{len(ids)} {what} ({shown})")
        if self.replaced:
            parts.append(f"probes.jsonl replaced after the evaluations of probe set {self.replaced} were written")
        return "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {k: {"count": len(v), "first": v[:_SHOWN]} for k, v in
                (("added", self.added), ("removed", self.removed), ("changed", self.changed)) if v}


def diff_probes(pinned: ProbeSet, run: ProbeSet) -> ProbeChange:
    """What changed from the record's probes to the run's: by id, each probe's whole content (`Probe.to_dict`, which the
    fingerprint hashes), whatever the order.

    Example:
        >>> diff_probes(record_probes, run_probes).describe()  # doctest: +SKIP
        "1 added ('q40'); 1 whose content changed ('q3')"
    """
    have, want = {p.id: p.to_dict() for p in pinned}, {p.id: p.to_dict() for p in run}
    return ProbeChange(added=[i for i in want if i not in have], removed=[i for i in have if i not in want],
                       changed=[i for i in have if i in want and have[i] != want[i]],
                       reordered=list(have) != list(want))


def pinned_probes(root: Path) -> tuple[ProbeSet | None, list[int]]:
    """(the record's pinned probe set, its committed steps): the set is None while the record holds no evaluation."""

    record = RunRecord(root)
    steps = record.committed_steps() if (root / "metrics.jsonl").is_file() else []
    if not steps:
        return None, []
    path = root / "probes.jsonl"
    return (ProbeSet.from_jsonl(path) if path.is_file() else None), steps


def check_probes(root: str | os.PathLike, probes: ProbeSet, policy: str, who: str = "this run"
                 ) -> tuple[ProbeSet, ProbeChange | None]:
    """The probes to score into the record at `root` and the change to start a new segment for.

    The record's own set in its order when the run's are the same probes (in any order); the run's probes and their
    change from the record's when they differ and `policy` is "new_segment"; refused with `ProbeSetChangedError` when
    they differ under "refuse". Before the record's first evaluation nothing is pinned: the run's probes, no change."""
    root = Path(root)
    pinned, steps = pinned_probes(root)
    if pinned is None:
        scored = _scored_fingerprints(root, steps)
        if scored and probes.fingerprint not in scored:  # probes.jsonl deleted: the evaluations' fingerprint pins the set
            raise ProbeSetChangedError(
                f"{root}: the record's probes.jsonl is missing, its evaluations (steps {_span(steps)}) were scored on probe "
                f"set {', '.join(sorted(scored))}, and {who} has probe set {probes.fingerprint} ({probes.origin}). Restore "
                f"the probe file the run started with into {root / 'probes.jsonl'}, score into a new output dir, or start "
                f"a new segment of this record with {PROBE_CHANGE_HINT}")
        return probes, None
    change = diff_probes(pinned, probes)
    # the evaluations themselves say which set they are of: a probes.jsonl replaced by hand (or by an earlier
    # forgetwatch, which wrote it at every start) no longer pins what was scored
    scored = _scored_fingerprints(root, steps)
    if not change and scored - {pinned.fingerprint}:
        if policy == "new_segment":
            return probes, ProbeChange(replaced=sorted(scored - {pinned.fingerprint})[0])
        raise ProbeSetChangedError(
            f"{root}: the record's probes.jsonl (fingerprint {pinned.fingerprint}) is not the probe set its evaluations were "
            f"scored on ({', '.join(sorted(scored - {pinned.fingerprint}))}): it was replaced after they were written. "
            f"Restore the probe file the run started with into {root / 'probes.jsonl'}, train into a new output dir, or "
            f"keep the evaluations as an earlier segment and go on with these probes: {PROBE_CHANGE_HINT} (that segment's "
            "probe set is then unknown, and its report says so)")
    if not change:
        if change.reordered:
            logger.info("forgetwatch: %s lists the record's probes in another order; scoring them in the record's order "
                        "(%s)", probes.origin, root / "probes.jsonl")
        return (pinned if change.reordered else probes), None
    if policy == "new_segment":
        return probes, change
    raise ProbeSetChangedError(
        f"{root}: the record's probe set is pinned by its evaluations (steps {_span(steps)}, {len(pinned)} probes, "
        f"fingerprint {pinned.fingerprint}), and {who} has other probes ({probes.origin}: {len(probes)}, fingerprint "
        f"{probes.fingerprint}): {change.describe()}. Their figures would not be comparable, so nothing was scored. Either "
        f"score into a new output dir (a record of its own), or start a new segment of this record with "
        f"{PROBE_CHANGE_HINT}: the evaluations so far move, whole, to {root / SEGMENTS}/ and the record goes on with the "
        "new probes from the step it resumes at")


def start_segment(root: str | os.PathLike, change: ProbeChange, step: int, probes: ProbeSet, start: str | None = None,
                  keep: tuple[str, ...] = ()) -> Path:
    """End the record's current segment at `step` and start a new one for `probes`: what came after `step` is set aside
    first (as a resume does), then every file of the record moves, whole, to `segments/<k>-steps-<first>-<last>/`, and
    `segments.json` says which segments came before. `keep`: files (or folders) of the record copied back into the new
    segment (the watcher's: the sidecar manifest, the base cache, the model's files, which the training process wrote
    for these probes). Returns the earlier segment's folder."""
    import shutil


    root = Path(root)
    RunRecord(root).truncate_after(step, start=start)
    pinned, steps = pinned_probes(root)
    before = read_segments(root)
    earlier = list(before.get("segments", [])) if before else []
    first, last = (steps[0], steps[-1]) if steps else (step, step)
    folder = root / SEGMENTS / f"{len(earlier) + 1}-steps-{first}-{last}"
    n = 1
    while folder.exists():  # never over an earlier one
        folder, n = folder.with_name(f"{len(earlier) + 1}-steps-{first}-{last}.{n}"), n + 1
    folder.mkdir(parents=True)
    for entry in sorted(root.iterdir()):
        if entry.name != SEGMENTS:
            entry.rename(folder / entry.name)
    for name in keep:
        if (folder / name).is_dir():
            shutil.copytree(folder / name, root / name)
        elif (folder / name).is_file():
            shutil.copy2(folder / name, root / name)
    fingerprints = _scored_fingerprints(folder, steps)
    entry = {"folder": str(folder.relative_to(root)), "first_step": first, "last_step": last,
             "n_probes": len(pinned) if pinned is not None else None,
             "fingerprint": pinned.fingerprint if pinned is not None else None}
    if pinned is not None and fingerprints - {pinned.fingerprint}:  # its probes.jsonl was replaced (`check_probes`)
        entry.update(n_probes=None, fingerprint=sorted(fingerprints)[0], probes_unknown=True)
    state = {"format": 1, "from_step": step, "segments": [*earlier, entry], "change": change.to_dict(),
             "n_probes": len(probes), "fingerprint": probes.fingerprint}
    with atomic_write(root / SEGMENTS_FILE) as f:
        f.write(json.dumps(state, indent=1) + "\n")
    logger.warning("forgetwatch: the probe set changed at step %d (%s); the record's earlier segment (steps %d-%d) moved, "
                   "whole, to %s (report it with `forgetwatch report %s`); this segment starts at step %d with %d probes, "
                   "and its first evaluation's flips are against the base", step, change.describe(), first, last, folder,
                   folder, step, len(probes))
    return folder


def read_segments(root: str | os.PathLike) -> dict[str, Any] | None:
    """The record's `segments.json` (the segments before this one), or None when it is its first."""
    path = Path(root) / SEGMENTS_FILE
    return read_json(path, "a forgetwatch segments file", RecordError, objects=True) if path.is_file() else None


def segment_start(root: str | os.PathLike) -> int | None:
    """The step this segment of the record starts at (it has no base row), or None for a record's first segment."""
    state = read_segments(root)
    step = (state or {}).get("from_step")
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def top_record(root: Path) -> Path:
    """The record a segment folder belongs to (its folders are named from there); the record itself otherwise."""
    return root.parent.parent if root.parent.name == SEGMENTS else root


def describe_segments(root: str | os.PathLike) -> list[str]:
    """What `forgetwatch report` says of a record's segments: where the probe set changed and where each earlier
    segment is, with the command that reports it."""

    root = Path(root)
    state, top, lines = read_segments(root), top_record(root), []
    if top != root:  # an earlier segment itself
        later = read_segments(top) or {}
        lines.append(f"an earlier segment of the record {top}: the probe set changed after it (at step "
                     f"{later.get('from_step')}); report the record's latest segment with `forgetwatch report {quote(top)}`")
    if not state:
        return lines
    lines += [f"probe set changed at step {state.get('from_step')}: this segment starts there, with "
             f"{state.get('n_probes')} probes (fingerprint {state.get('fingerprint')}), and has no base row: its first "
             "evaluation's flips are against the base"]
    for seg in state.get("segments", []):
        where = top / str(seg.get("folder"))
        probes = (f"{seg.get('n_probes')} probes, fingerprint {seg.get('fingerprint')}" if not seg.get("probes_unknown")
                  else f"probe set {seg.get('fingerprint')}, not kept: its probes.jsonl had been replaced")
        lines.append(f"the earlier segment (steps {seg.get('first_step')}-{seg.get('last_step')}, {probes}) is in {where}; "
                     f"report it with `forgetwatch report {quote(where)}`")
    return lines


def _scored_fingerprints(root: Path, steps: list[int]) -> set[str]:
    """The probe-set fingerprints the committed evaluations' npz files carry (unreadable ones left to `report`)."""

    record, out = RunRecord(root), set()
    for s in dict.fromkeys([steps[0], steps[-1]] if steps else []):  # the first and the last: a replaced set shows there
        try:
            z = record.read_eval(s)
        except (RecordError, OSError):
            continue
        if "fingerprint" in z and str(z["fingerprint"]):
            out.add(str(z["fingerprint"]))
    return out


def _span(steps: list[int]) -> str:
    return f"{steps[0]}-{steps[-1]}" if len(steps) > 1 else str(steps[0])
