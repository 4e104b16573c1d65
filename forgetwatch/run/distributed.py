"""Scoring across processes (DDP, FSDP, DeepSpeed): split the probes, score the shards, gather on every rank.

Uses the process group the trainer's engine (accelerate / torch.distributed) already set up; nothing of its own.
Under FSDP / ZeRO-3 each forward gathers weights from all ranks, so every rank must run the same forwards or one
waits forever. Two layers see to it: every rank gets the same number of probes of each scoring mode (short shards
are padded with a repeat of a probe whose result is dropped), and `score_probes(..., sync_ranks=True)` pads the
number of batches to the busiest rank's (options scored one per row differ in count) and generates with
`synced_gpus`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..probes.probe_set import Probe
from ..scoring.results import ProbeResults
from ..scoring.score import ScoringConfig, score_probes, scoring_mode

__all__ = ["world", "plan_shard", "score_distributed", "broadcast_from_main"]


def world() -> tuple[int, int]:
    """(rank, world size) of the default process group, (0, 1) without one."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def broadcast_from_main(obj):
    """Rank 0's `obj` on every rank (a collective: every rank calls it); `obj` itself without a process group.

    Example:
        >>> base, error = broadcast_from_main(find_base() if rank == 0 else None)  # doctest: +SKIP
    """
    rank, world_size = world()
    if world_size == 1:
        return obj
    box = [obj if rank == 0 else None]
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0]


def plan_shard(probes: Sequence[Probe], config: ScoringConfig, rank: int, world_size: int) -> tuple[list[Probe], int]:
    """This rank's probes and how many of them are real (the rest is padding, at the end).

    Example:
        >>> # 5 mcq probes on 2 ranks -> rank 0 scores 0, 2, 4; rank 1 scores 1, 3 and a repeat of 1
    """
    groups: dict[str, list[Probe]] = {}
    for p in probes:
        groups.setdefault(scoring_mode(p, config), []).append(p)
    real: list[Probe] = []
    pads: list[Probe] = []
    for group in groups.values():
        mine = group[rank::world_size]
        width = -(-len(group) // world_size)  # ceil: the longest shard of this group
        real += mine
        pads += [mine[0] if mine else group[0]] * (width - len(mine))
    return real + pads, len(real)


def score_distributed(model, tokenizer, probes: Sequence[Probe], config: ScoringConfig, progress: bool = False,
                      desc: str = "scoring probes") -> ProbeResults:
    """Score `probes` split across all ranks; every rank returns the full results in the order of `probes`.

    With `progress`, rank 0 shows a bar for its shard (`desc` labels it)."""
    rank, world_size = world()
    if world_size == 1:
        return score_probes(model, tokenizer, probes, config, progress=progress, desc=desc)
    shard, n_real = plan_shard(probes, config, rank, world_size)
    part = score_probes(model, tokenizer, shard, config, progress=progress and rank == 0, desc=desc, sync_ranks=True)
    part = part.take(range(n_real))  # drop the padding
    gathered: list[ProbeResults | None] = [None] * world_size
    torch.distributed.all_gather_object(gathered, part)
    merged = ProbeResults.concat([g for g in gathered if g is not None])
    return merged.select([p.id for p in probes])
