"""Sidecar scoring's manifest: what the training process leaves for `forgetwatch watch` to score its checkpoints as the
callback would have (`ForgetWatchCallback(..., scoring="sidecar")`).

The training process writes, under `<output_dir>/forgetwatch/`, the probes (`probes.jsonl`), the base cache
(`base.parquet`), the model's config and tokenizer (for sharded checkpoints that hold neither) and `sidecar.json`: the
options, the scoring config and precision, the trainer's W&B run to sit beside, and every training start (a resume from
an earlier checkpoint supersedes the checkpoints after it). The watcher reads it with `read_manifest`.

Example:
    >>> manifest = read_manifest("outputs/run")  # doctest: +SKIP
    >>> manifest["precision"], manifest["callback"]["eval_steps"]  # doctest: +SKIP
    ('float32+autocast-bfloat16', 50)
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import socket
import time
from pathlib import Path
from typing import Any

from .._io import atomic_write, read_json, read_json_or_none
from ..errors import SidecarError
from ..record.cache import read_key
from ..record.schema import manifest_problem
from ..record.store import MODEL_FILES
from .launch import uses_deepspeed, uses_fsdp

__all__ = ["MANIFEST", "SidecarManifest", "read_manifest"]

logger = logging.getLogger(__name__)

MANIFEST = "sidecar.json"


class SidecarManifest:
    """`<record>/sidecar.json`, written by the training process: made at train begin, finished at train end."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.path = self.root / MANIFEST
        self.data: dict[str, Any] = {}

    def start(self, args: Any, state: Any, *, options: Any, config: Any, precision: str, probes: Any, cache: Any,
              start_id: str | None, model: Any, tokenizer: Any) -> None:
        """The probes, the base cache, the model's files and the manifest, for a training start (first or resumed)."""
        self.root.mkdir(parents=True, exist_ok=True)
        probes.to_jsonl(self.root / "probes.jsonl")
        base_path = self.root / "base.parquet"
        if not base_path.is_file():
            cache.save(base_path)
        elif read_key(base_path) != json.loads(json.dumps(cache.key)):  # as the file holds it
            # A resume under other options (robustness turned on, with a cache that has the variants): the watcher
            # scores as the manifest says, against this base. It is the record's own copy, never a file the user named.
            logger.info("forgetwatch: %s was made under other options than this run's; replacing it with the base "
                        "cache this run uses", base_path)
            cache.save(base_path)
        first = read_json_or_none(self.path) if state.global_step > 0 else None  # a resume keeps its first start
        # The model's config and tokenizer, for checkpoints that hold neither: FSDP's sharded ones (also when FSDP comes
        # from `accelerate launch`, where args.fsdp is unset and SHARDED_STATE_DICT is accelerate's default). Small.
        try:
            _save_model_files(model, tokenizer, self.root / MODEL_FILES)
        except Exception as e:  # only sharded FSDP checkpoints need them: not worth ending the run for
            logger.warning("forgetwatch: could not write the model's config and tokenizer for `forgetwatch watch` (%s: %s); "
                           "it can still load checkpoints that hold them", type(e).__name__, e)
        if uses_fsdp(args) and hasattr(model, "peft_config"):
            logger.warning("forgetwatch: a LoRA run under FSDP saves adapter-only checkpoints; with sharded ones "
                           "(SHARDED_STATE_DICT) `forgetwatch watch` cannot score them: set fsdp_config state_dict_type "
                           "FULL_STATE_DICT")
        if uses_deepspeed(args):
            logger.warning("forgetwatch: scoring='sidecar' loads the checkpoints in another process: under ZeRO-3 set "
                           "stage3_gather_16bit_weights_on_model_save true so that they hold full weights, or "
                           "`forgetwatch watch` cannot load them")
        self.data = {
            "format": 1, "probes": "probes.jsonl", "base_cache": "base.parquet", "precision": precision,
            # the options by their short names (`forgetwatch.options.options_from_record` reads any version's)
            "callback": {k: v for k, v in options.to_kwargs().items() if k not in ("probes", "base_cache", "scoring")},
            "scoring_config": dataclasses.asdict(config), "max_steps": state.max_steps,
            "report_to": list(args.report_to or []), "run_name": args.run_name, "wandb": _wandb_run_info(),
            "trackio_project": getattr(args, "project", None),
            "started_at_step": first.get("started_at_step", 0) if first else state.global_step,
            # each training start (the first, then every resume): its step and id, which its checkpoints carry; a
            # resume from an earlier checkpoint supersedes the checkpoints after it, and the watcher's evaluations of them
            "starts": ((first or {}).get("starts", []) if state.global_step > 0 else [])
            + [{"step": state.global_step, "at": time.time(), "id": start_id}],
            # a checkpoint older than this run's start belongs to an earlier run in the same output_dir
            "started_at": first.get("started_at", time.time()) if first else time.time(),
            "pid": os.getpid(), "host": socket.gethostname(), "finished": False, "final_step": None,
        }
        self.update()

    def update(self, **fields: Any) -> None:
        """Set `fields` (e.g. `finished=True`) and write the manifest whole (atomic: a watcher never reads half)."""
        self.data.update(fields)
        with atomic_write(self.path) as f:
            f.write(json.dumps(self.data, indent=1) + "\n")


def read_manifest(record_dir: str | os.PathLike, error: type[Exception] = SidecarError) -> dict[str, Any]:
    """The manifest of a record (`<output_dir>/forgetwatch`); unreadable, not an object, or a field of the wrong type
    (`forgetwatch.record.schema.manifest_problem`) raises `error` naming it (and the field)."""
    path = Path(record_dir) / MANIFEST
    manifest = read_json(path, "a forgetwatch sidecar manifest", error)
    if problem := manifest_problem(manifest):
        raise error(f"{path}: {problem}; the training process writes this file whole: restore it, or start the run again")
    return manifest


def _save_model_files(model, tokenizer, target: Path) -> None:
    """Config, generation config and tokenizer into `target`, replaced whole (a watcher reading the old ones meanwhile
    sees the old ones, never a mix; no stale file of an earlier run is left)."""
    import shutil
    import tempfile

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        config = getattr(model, "config", None)
        if config is None:
            return
        config.save_pretrained(tmp)
        if getattr(model, "generation_config", None) is not None:
            model.generation_config.save_pretrained(tmp)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        old = target.with_name(f".{target.name}.old-{os.getpid()}")
        if target.exists():
            target.rename(old)
        tmp.rename(target)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _wandb_run_info() -> dict[str, Any] | None:
    """The trainer's live W&B run, for a watcher's run to sit beside it (same project and group, named after it)."""
    try:
        import wandb

        run = wandb.run
        if run is None:
            return None
        return {"id": run.id, "project": run.project, "entity": run.entity, "group": run.group or run.id, "name": run.name,
                "mode": "offline" if run.settings._offline else "online",
                "dir": str(Path(run.dir).parents[2])}  # run.dir is <dir>/wandb/<run>/files
    except Exception:  # wandb absent or a run without these fields: the watcher starts its own run elsewhere
        return None
