"""Replay streams steered by the monitor: after each evaluation their category weights follow the per-category
forgetting, and their history goes into the record (`replay_mix.json`) so that a resumed run draws as the first did.

The streams are `mix_replay`'s and the samplers of the KL anchor and the 1→0 penalty (`forgetwatch.remedies`); each
attaches itself to the callback, which owns one `ReplaySteering` and calls it at train begin, after each evaluation
and at each step end. Every rank holds the same streams and draws the same rows, so whatever a stream is told is
decided on the main process and broadcast.

Example:
    >>> steering = ReplaySteering()
    >>> steering.mixers
    []
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..record.store import RunRecord
from .distributed import broadcast_from_main

__all__ = ["ReplaySteering"]

logger = logging.getLogger(__name__)

# What replay_mix.json written before streams recorded their kind held: gold replay in the lettered form.
_OLD_KIND = "replay: letter form (a record from before streams said their kind)"


class ReplaySteering:
    """The replay streams one run steers, and their part of the record."""

    def __init__(self) -> None:
        self.mixers: list = []  # never part of the callback's saved state: the record's replay_mix.json holds them
        self._written: list = []

    def attach(self, mixer: Any, scoring: str) -> None:
        """Steer `mixer` from now on; closed-loop streams need the scores in this process (inline scoring)."""
        if scoring == "sidecar" and mixer.strategy == "closed_loop":
            raise ValueError("closed-loop replay steers by the scores inside the training process, and scoring='sidecar' "
                             "scores in `forgetwatch watch`: use strategy='uniform' or scoring='inline'")
        self.mixers.append(mixer)

    def begin(self, args: Any, state: Any, record_root: Path, is_main: bool,
              last: tuple[int, Mapping[str, float]] | None) -> None:
        """At train begin: tell the streams how ranks slice them and give a resumed run the weights' history up to its
        checkpoint (`last`: the last evaluation's step and category forgetting, on the main process). A resume without
        the replay the run started with is said."""
        if not self.mixers:
            if state.global_step > 0 and is_main:
                try:
                    self._warn_changed_kinds(_kinds(RunRecord(record_root).read_mix()), state.global_step)
                except Exception as e:  # a warning is not worth a run
                    logger.warning("forgetwatch: could not read replay_mix.json (%s)", e)
            return
        if args.dataloader_num_workers and any(getattr(m, "feeds_data_loader", False) for m in self.mixers):
            raise ValueError("mix_replay: the replay stream follows the monitor in the training process; set "
                             "`dataloader_num_workers=0` (workers would read a copy that never hears of an evaluation)")
        if getattr(args, "num_generations", None):  # GRPO: the stream holds prompts, each sampled num_generations times
            per_rank = args.per_device_train_batch_size * getattr(args, "steps_per_generation", 1) / args.num_generations
            if getattr(args, "shuffle_dataset", False) and any(m.strategy == "closed_loop" for m in self.mixers):
                logger.warning("forgetwatch: GRPO's buffered shuffle reads ~1,000 prompts ahead, so closed-loop replay "
                               "reacts that late; set `shuffle_dataset=False` (mix_replay shuffles the training data itself)")
        else:
            per_rank = args.per_device_train_batch_size
        world_size = args.world_size if float(per_rank).is_integer() else 1  # groups spanning ranks: no per-rank share
        schedules = None
        if is_main and state.global_step > 0:
            try:
                mix = RunRecord(record_root).read_mix()
                schedules = [m.get("schedule", []) for m in mix["mixers"]] if mix else []
                self._warn_changed_kinds(_kinds(mix), state.global_step)
            except Exception as e:  # decided here and shared: raising on this rank alone would leave the others waiting
                logger.warning("forgetwatch: could not read replay_mix.json (%s); the replay weights start afresh", e)
                schedules = []
        schedules, last = broadcast_from_main((schedules, last if is_main else None))
        for i, mixer in enumerate(self.mixers):
            mixer.set_layout(int(per_rank), world_size)
            mixer.reset()
            if schedules:
                mixer.restore(schedules[i] if i < len(schedules) else [], upto_step=state.global_step)
            if last is not None and (not mixer.schedule or mixer.schedule[-1][1] < last[0]):
                # the run stopped before its last evaluation's weights were drawn: they take effect now
                mixer.publish(*last)
        self._written = []

    def steer(self, step: int, forgetting: Mapping[str, float] | None, is_main: bool) -> None:
        """Hand each category's forgetting at this evaluation to the streams (the same on every rank); None (figures
        missing: probes scored NaN / inf) keeps the weights in force."""
        if not self.mixers:
            return
        forgetting = broadcast_from_main(forgetting if is_main else None)
        if forgetting is None:
            return
        for mixer in self.mixers:
            mixer.publish(step, forgetting)

    def write(self, record_root: Path) -> None:
        """replay_mix.json, when an evaluation published new weights or a stream switched to them since it was last
        written (a switch happens when the data is next read, after the evaluation)."""
        state = [(len(m.schedule), m.weights) for m in self.mixers]
        if not self.mixers or state == self._written:
            return
        self._written = state
        try:
            RunRecord(record_root).write_mix({"mixers": [
                {"kind": getattr(m, "kind", "replay"), "ratio": m.ratio, "strategy": m.strategy, "floor": m.floor,
                 "seed": m.seed, "categories": m.categories,
                 "weights": m.weights, "schedule": [list(e) for e in m.schedule]} for m in self.mixers]})
        except Exception:
            logger.exception("forgetwatch: could not write replay_mix.json; training goes on")

    def _warn_changed_kinds(self, was: list[str], step: int) -> None:
        """A resume whose replay streams are not what the run started with (another target or form, as after an upgrade
        from the lettered form) trains on other examples from here on: said, not refused (the user may mean it)."""
        now = [getattr(m, "kind", "replay") for m in self.mixers]
        if was and was != now:
            logger.warning("forgetwatch: this run started with %s but resumes at step %d with %s: the replayed examples "
                           "change from here on, so its curves before and after are not one experiment; to continue it "
                           "as it was, resume with the same replay options (and forgetwatch version)",
                           " + ".join(was), step, " + ".join(now) or "no replay")


def _kinds(mix: dict[str, Any] | None) -> list[str]:
    return [m.get("kind", _OLD_KIND) for m in mix["mixers"]] if mix else []
