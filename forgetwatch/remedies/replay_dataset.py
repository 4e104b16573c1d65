"""Replay mixing: held-out examples mixed into the training data while it runs, steered by the monitor.

`mix_replay` turns a training set and a pool (the rest of the monitored suites, your own examples, or the base's own
answers) into a stream in which `ratio` of the examples are replay, drawn by category (`forgetwatch.remedies.mixing`).

Example:
    >>> watch = ForgetWatchCallback(probes="arc_easy,sciq", per_suite=50, eval_steps=10)  # doctest: +SKIP
    >>> train = mix_replay(gsm8k, pool="arc_easy,sciq", ratio=0.1, monitor=watch, seed=0)  # doctest: +SKIP
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .._io import read_jsonl
from ..probes.probe_set import Probe, ProbeSet
from ..probes.suites import load_probes
from ..record.replay import FORMS, training_example
from .base_outputs import BaseOutputs
from .mixing import STRATEGIES, ReplayMixer, check_pool, check_ratio
from .protocols import MonitorView

__all__ = ["mix_replay"]

logger = logging.getLogger(__name__)


def mix_replay(
    train_dataset: Any,
    pool: Any,
    ratio: float = 0.1,
    strategy: str = "closed_loop",
    monitor: MonitorView | None = None,
    seed: int = 0,
    floor: float = 0.1,
    form: str | None = None,
) -> Any:
    """The dataset to train on: `train_dataset` with examples of a held-out `pool` mixed in at `ratio`.

    With `strategy="closed_loop"` the pool is drawn by category in proportion to the forgetting `monitor` (a
    `ForgetWatchCallback`) measured at its last evaluation, with `floor` of the draws spread evenly so that no
    category starves; `"uniform"` draws every category alike (the control). Replay takes the place of training
    examples (one step holds as many examples as without replay), so the task sees `1 - ratio` of them.

    The pool must not hold a monitored probe: training on it would repair the measured forgetting trivially, so
    an overlap is refused, naming the ids. Pass the rest of the monitored suites (`"arc_easy,sciq"`: every probe of
    the suites except the monitored ones), a `ProbeSet`, a probe JSONL file, or your own examples (a `datasets.Dataset`
    or a list of dicts) with a `category` column, an `id` column (checked against the monitored ids) and the
    training dataset's columns. Probes become examples in both SFT and GRPO shapes (see `training_example`): for
    SFT data in the form the probes are scored in (the question, then the gold option's text or the bare answer), for
    GRPO data (a `solution` column) in the lettered form its rewards check.

    **Self-distilled replay**: pass `pool=` a `forgetwatch.remedies.BaseOutputs` (the base model's own answers to a
    pool, `make_base_outputs`): the replayed targets are then what the base answered, not the gold answers, so any
    prompts can be replayed (no labels) and the replay stays on the base's own distribution.

    The result is a `datasets.IterableDataset` without end (so set `max_steps`), the same wherever it is read from:
    deterministic under `seed`, continued exactly by `resume_from_checkpoint` (the callback keeps the weights' history
    in its record), and sliced between DDP ranks so that each gets its share. Read it in the training process
    (`dataloader_num_workers=0`, the default): the loop's weights live there.

    Args:
        train_dataset: the training examples (`datasets.Dataset` or a list of dicts).
        pool: what may be replayed (see above).
        ratio: the replay share of the examples trained on, in [0, 1).
        strategy: "closed_loop" or "uniform".
        monitor: the `ForgetWatchCallback` of the run; required for closed loop, and checks the pool against its probes.
        seed: the seed of the training order and of every replay draw.
        floor: in closed loop, the share of replay spread evenly over the categories.
        form: how probes of the pool are written: "scoring" or "letter" (default: "letter" for GRPO data, which has a
            `solution` column, else "scoring").

    Example:
        >>> watch = ForgetWatchCallback(probes="arc_easy,sciq", per_suite=50, eval_steps=10)  # doctest: +SKIP
        >>> train = mix_replay(gsm8k, pool="arc_easy,sciq", ratio=0.1, monitor=watch, seed=0)  # doctest: +SKIP
        >>> SFTTrainer(model, args=SFTConfig(max_steps=300, ...), train_dataset=train, callbacks=[watch])  # doctest: +SKIP
    """
    from datasets import IterableDataset

    ratio = check_ratio(ratio)
    if strategy not in STRATEGIES:
        raise ValueError(f"`strategy` must be one of {', '.join(STRATEGIES)}; got {strategy!r}")
    if strategy == "closed_loop" and monitor is None:
        raise ValueError("closed-loop replay follows a monitor: pass `monitor=` (the run's ForgetWatchCallback), "
                         "or use strategy='uniform'")
    if len(train_dataset) == 0:
        raise ValueError("`train_dataset` is empty")
    columns = list(train_dataset.column_names) if hasattr(train_dataset, "column_names") else list(train_dataset[0])
    if form is None:
        form = "letter" if "solution" in columns else "scoring"
    if form not in FORMS:
        raise ValueError(f"`form` must be one of {', '.join(FORMS)}; got {form!r}")
    rows = _pool_rows(pool, monitor.probes if monitor is not None else None, form)
    fill: dict[str, Any] = {}
    if "solution" in columns and "kind" not in columns and any(r.get("kind") == "mcq" for _, r in rows):
        # GRPO data with replayed multiple choice: `probe_reward` needs each row's kind (the training rows' own reward
        # applies where it is None), or a replayed question would be checked as a short answer against its letter
        columns, fill = [*columns, "kind"], {"kind": None}
    by_category: dict[str, list[dict[str, Any]]] = {}
    for where, row in rows:
        missing = [c for c in columns if c not in row]
        if missing:
            raise ValueError(f"replay pool {where} lacks the training dataset's column(s) {', '.join(missing)}: every "
                             f"replayed example must train like the others (columns {', '.join(columns)})")
        by_category.setdefault(str(row["category"]), []).append({c: row[c] for c in columns})
    if monitor is not None:
        # behaviour probes have no gold answer to replay: their categories are monitored, not replayed, unless the
        # pool holds the base's own answers to behaviour prompts of those categories (self-distilled replay)
        wanted = sorted({p.category for p in monitor.probes if not p.is_behavior})
        check_pool([r.get("id") for _, r in rows if r.get("id") is not None], monitor.probes.ids,
                   {c: len(v) for c, v in by_category.items()}, wanted)
        steered = set(monitor.probes.categories) if _is_base_outputs(pool) else set(wanted)
        unsteered = sorted(set(by_category) - steered)
        if unsteered:
            logger.warning("forgetwatch: replay pool categories %s are not monitored, so the loop cannot weigh them: "
                           "left out", ", ".join(unsteered))
        by_category = {c: by_category[c] for c in sorted(steered & set(by_category))}
    mixer = ReplayMixer(train_dataset, by_category, ratio, strategy=strategy, floor=floor, seed=seed, fill=fill)
    mixer.kind = "replay: base answers" if _is_base_outputs(pool) else f"replay: {form} form"  # said in replay_mix.json
    mixer.feeds_data_loader = True  # its rows are read by the data loader (the loss terms draw in the training process)
    if monitor is not None:
        monitor.attach_mixer(mixer)

    def stream():  # a closure, not a bound method: `datasets` may copy its generator's arguments, never the function
        yield from mixer.rows()

    dataset = IterableDataset.from_generator(stream)
    dataset.mixer = mixer  # for inspection; the callback holds its own reference
    return dataset


def _pool_rows(pool: Any, monitored: Any, form: str = "scoring") -> list[tuple[str, dict[str, Any]]]:
    """(where, example) for every pool entry: probes become training examples; a user's rows are used as they are."""

    if isinstance(pool, BaseOutputs):
        if not len(pool):
            raise ValueError("the base outputs hold no answer to replay")
        return [(f"base output {r['id']!r}", r) for r in pool.replay_rows()]
    if isinstance(pool, (str, os.PathLike)):
        path = Path(pool)
        if path.is_file() and not _is_probe_file(path):
            return [(f"{path}, line {i}", row) for i, row in _read_rows(path)]
        pool = load_probes(pool)  # suite names (every probe of them) or a probe JSONL
        if pool.origin.startswith("suites:") and monitored is not None:
            # "the rest of the same suites": the monitored probes are held out by id
            pool = pool.filter(lambda p: p.id not in monitored)
    if isinstance(pool, ProbeSet) or (isinstance(pool, (list, tuple)) and pool and isinstance(pool[0], Probe)):
        # behaviour probes have no gold answer to train on: they stay monitored only
        rows = [(f"probe {p.id!r}", training_example(p, form)) for p in pool if not p.is_behavior]
        if not rows:
            raise ValueError("the replay pool holds behaviour probes only (instruct, comply), which have no gold answer to "
                             "replay; give knowledge suites or a file of training examples")
        return rows
    rows = pool.to_list() if hasattr(pool, "to_list") else list(pool)
    if not rows:
        raise ValueError("the replay pool is empty")
    out = []
    for i, row in enumerate(rows):
        if not isinstance(row, dict) or "category" not in row:
            raise ValueError(f"replay pool row {i}: needs a `category` (the loop draws by category); got "
                             f"{sorted(row) if isinstance(row, dict) else type(row).__name__}")
        out.append((f"row {i}" + (f" (id {row['id']!r})" if row.get("id") is not None else ""), row))
    return out


def _is_base_outputs(pool: Any) -> bool:
    return isinstance(pool, BaseOutputs)


def _is_probe_file(path: Path) -> bool:
    for _, row in _read_rows(path, limit=1):
        return "question" in row and "kind" in row
    return False


def _read_rows(path: Path, limit: int | None = None) -> Iterator[tuple[int, dict[str, Any]]]:
    for i, row in read_jsonl(path, hint="one example per line"):
        yield i, row
        if limit is not None and i >= limit:
            return
