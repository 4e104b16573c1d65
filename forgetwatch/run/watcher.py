"""`forgetwatch watch OUTPUT_DIR`: score a run's checkpoints beside it, into the record the callback would have written.

Training runs with `ForgetWatchCallback(..., scoring="sidecar")`: the training process writes the probes, the base cache
and a manifest (`<output_dir>/forgetwatch/sidecar.json`), saves a checkpoint at every evaluation step, and scores
nothing. The watcher, in another process (another GPU, or the CPU), follows the `checkpoint-N` directories, waits
until each is complete (the Trainer writes `trainer_state.json` last), scores it with the same probes, scoring options
and precision, and hands the results to the same `Monitor` as the callback: `metrics.jsonl`, `evals/`, `flips.jsonl`,
replay, budget alerts, keyed by the trainer's global step. Checkpoints already in the record are skipped, so a
restarted watcher picks up where it stopped; an evaluation it was killed in the middle of is set aside and scored
again (`RunRecord.recover`). One watcher writes a record at a time (`forgetwatch.record.lock`).

What watching trusts: the watcher loads the checkpoints in the output_dir as resuming from them would. Full weights are
read from safetensors (or a `.bin` with torch's weights-only loader); FSDP's sharded checkpoints carry a `.metadata`
file that torch unpickles, which can run code: the watcher reads one only when it belongs to the user running the
watcher (or to root), and skips it with a warning otherwise.

Example:
    >>> Watcher("outputs/run").run(once=True)  # doctest: +SKIP
    forgetwatch watch step 0 (base): accuracy 0.515 on 200 probes
    forgetwatch watch step 50: F 0.040 [0.02, 0.08] adj 0.012, BT 0.015 [0.01, 0.04]; worst sciq F 0.060; probing 31.2 s
"""

from __future__ import annotations

import logging
import os
import re
import time
from pathlib import Path
from typing import Any

from .._io import pid_alive, read_json_or_none
from ..commands import quote
from ..errors import EngineUnavailableError, ForgetWatchError, SidecarError
from ..measures.budgets import Budget, parse_budget
from ..measures.drift import RiskRule
from ..measures.robustness import variant_outcomes
from ..options import options_from_record
from ..probes.probe_set import ProbeSet
from ..probes.variants import make_plan, serves
from ..record.cache import BaseCache, diff_keys, make_cache_key
from ..record.lock import acquire
from ..record.store import MODEL_FILES, RunRecord
from ..scoring.engines import engine_spec, engine_unavailable
from ..scoring.models import FSDP_SHARDS
from ..scoring.modes import ScoringConfig
from ..scoring.requests import ProbeSetError
from .base_rescore import base_for_engine, check_engine
from .loggers import MetricLogger, TensorBoardLogger, TrackioLogger, WandbLogger, tensorboard_dir
from .monitor import PREFIX, Monitor
from .sidecar import MANIFEST, read_manifest
from .start import begin_segment, pin_probes

__all__ = ["Watcher", "SidecarError"]

logger = logging.getLogger(__name__)

_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
MAX_ATTEMPTS = 3  # a checkpoint that fails to load or score this often is given up on


class Watcher:
    """Scores the checkpoints of one training run, as its callback would have.

    Args:
        output_dir: the trainer's `output_dir`.
        device: where to score ("cuda:1", "cpu"; default: cuda when available).
        report_to: backends to log to (default: the trainer's `report_to`); W&B gets a run of its own beside the
            trainer's (same project and group, named `<run>-forgetwatch`, the trainer's step on the x-axis).
        into_trainer_run: after training has ended, append to the trainer's own W&B run instead.
        batch_size: probes per forward (default: the callback's).
        engine: what runs the model, hf, continuous or vllm (default: the callback's). With vllm each checkpoint
            is loaded into one running vLLM (`forgetwatch.scoring.engines.vllm.engine_for_checkpoint`), and the base is scored
            by vLLM too when the training process scored it with transformers (`forgetwatch.run.base_rescore`).
        robustness, robust_per_suite: score variants (`forgetwatch.probes.variants`; default: the callback's). The record's
            base cache must hold the same variants: `forgetwatch cache ... --robustness K` makes one.
        probe_change: the record's probes.jsonl is not the probe set its evaluations were scored on: "refuse" (raise
            `ProbeSetChangedError` before scoring) or "new_segment" (`forgetwatch.record.segments`; default: the callback's).
        rescore: a step already in the record to score again from its checkpoint (its evaluation file damaged): its
            files and rows are set aside under `superseded/rescore-step-N-<time>/` (never deleted), and the checkpoint
            is scored into the record in step order. Refused, before anything is touched, when `checkpoint-N` is not
            there.
    """

    def __init__(self, output_dir: str | os.PathLike, device: str | None = None, report_to: list[str] | None = None,
                 into_trainer_run: bool = False, batch_size: int | None = None, engine: str | None = None,
                 robustness: int | None = None, robust_per_suite: int | None = None, probe_change: str | None = None,
                 rescore: int | None = None):
        self.output_dir = Path(output_dir)
        record_dir = self.output_dir / PREFIX
        start = ("start training with ForgetWatchCallback(probes, scoring=\"sidecar\") (a recipe: --forgetwatch_scoring "
                 "sidecar) writing to that output_dir, then run `forgetwatch watch` on it")
        if not self.output_dir.is_dir():
            raise SidecarError(f"{self.output_dir}: no such directory; {start}")
        path = record_dir / "sidecar.json"
        if not path.is_file():
            raise SidecarError(f"{self.output_dir}: no forgetwatch sidecar manifest ({path}); {start}")
        self.manifest = read_manifest(record_dir)
        self._rescore: int | None = None
        if rescore is not None and rescore not in (steps := RunRecord(record_dir).committed_steps()):
            raise SidecarError(f"--rescore {rescore}: the record has no evaluation at step {rescore} (its evaluations: "
                               f"{', '.join(map(str, steps)) or 'none'}), so there is nothing to score again; nothing was "
                               f"touched. `forgetwatch watch {quote(str(self.output_dir))}` scores the checkpoints the "
                               "record lacks")
        if rescore is not None and not (self.output_dir / f"checkpoint-{rescore}").is_dir():
            raise SidecarError(
                f"--rescore {rescore}: {self.output_dir / f'checkpoint-{rescore}'} is not there, so step {rescore} cannot be "
                f"scored again; nothing was touched and the record keeps step {rescore} as it is. Without the checkpoint, "
                f"if its evaluation file is damaged, {RunRecord(record_dir).without_checkpoint(rescore)}")
        probes_path = record_dir / str(self.manifest.get("probes", "probes.jsonl"))
        if not probes_path.is_file():
            raise SidecarError(f"{probes_path}: the record's probe set is missing (the training process writes it when "
                               "training starts, and the record's evaluations are of exactly those probes: a new probe set "
                               "would not match them). Restore that file, or start the run again")
        self.probes = ProbeSet.from_jsonl(probes_path)
        try:  # the options as the training process wrote them: one it could not have written is named, not a TypeError
            # a manifest of any version; it leaves `scoring` out, being the sidecar's (an engine such as vLLM is
            # valid only there)
            opts = options_from_record({**self.manifest["callback"], "scoring": "sidecar"}).unprefixed()
        except ForgetWatchError:
            raise
        except (TypeError, ValueError) as e:
            # the options' checks name an option by its short name in backticks: the manifest's field is callback.<name>
            named = re.search(r"`(\w+)`", str(e))
            field = f"callback.{named.group(1)}" if named and named.group(1) in self.manifest["callback"] else "callback"
            raise SidecarError(f"{path}: field `{field}` holds a value forgetwatch could not have written ({e}); the "
                               "training process writes this file whole: restore it, or start the run again") from None
        probe_change = probe_change or opts.get("probe_change") or "refuse"
        if opts.get("max_share") is not None:  # a budget for in-loop probing: the watcher runs beside training
            logger.info("forgetwatch watch: max_share=%s sizes probing inside a training process; the watcher runs beside "
                        "it and scores every checkpoint fully", opts["max_share"])
        # the record's evaluations pin its probe set: a probes.jsonl replaced after them is refused first (its base
        # cache was likely replaced with it); a new segment is started below, under the scoring lock
        _, _, refused = pin_probes(record_dir, self.probes, probe_change, who="forgetwatch watch")
        if refused is not None:
            raise refused
        cache_path = record_dir / self.manifest["base_cache"]
        cache = BaseCache.load(cache_path)
        # a cache for other probes can never match (as `compare` refuses it)
        cache.check(make_cache_key({}, self.probes, {}), ignore=("format", "model", "scoring"), path=cache_path)
        cache = cache.for_probes(self.probes.ids, cache_path)
        try:  # the options as the training process wrote them: one it could not have written is named, not a TypeError
            budget = (Budget(parse_budget(opts["budget"]), "alert", opts["budget_bound"], self.probes.groups)
                      if opts.get("budget") else None)
            self.eval_steps = opts["eval_steps"]  # checked with the other options (`ForgetWatchArguments`)
            # the callback's engine that cannot score in training (scoring="sidecar") is this watcher's: the training
            # process scored its base with transformers (`forgetwatch.run.base_rescore`)
            theirs = opts.get("engine") or "hf"
            given = {"batch_size": batch_size, "engine": engine or (None if engine_spec(theirs).live_model else theirs)}
            self.config = ScoringConfig(**{**self.manifest["scoring_config"], **{k: v for k, v in given.items() if v}})
            risk = RiskRule(opts["at_risk_margin"], opts["at_risk_drop"])
        except ForgetWatchError:
            raise
        except (TypeError, ValueError) as e:
            raise SidecarError(f"{path}: field `callback` or `scoring_config` holds options forgetwatch could not have "
                               f"written ({e}); the training process writes this file whole: restore it, or start the run "
                               "again") from None
        if why := engine_unavailable(self.config.engine):  # said before anything is set aside or scored
            raise EngineUnavailableError(f"engine={self.config.engine!r}: {why}")
        self.precision = self.manifest["precision"]
        check_engine(record_dir, cache, self.config, self.precision)  # before a step is set aside or a segment begun
        self.device = device
        if robustness is None:  # the callback's, unless given
            robustness, robust_per_suite = opts.get("robustness"), robust_per_suite or opts.get("robust_per_suite")
        elif robustness == 0:  # none, whatever the callback scored
            robustness = robust_per_suite = None
        self.plan = make_plan(self.probes, robustness, robust_per_suite, self.config.mcq_mode)
        if self.plan is not None and not serves(cache.key.get("variants"), self.plan.key()):
            found = cache.key.get("variants")
            said = ("no variants" if not isinstance(found, dict) else "other variants ("
                    + "; ".join(diff_keys(self.plan.key(), found)) + ")")
            raise SidecarError(
                f"{cache_path}: the base cache holds {said}, and this watcher scores robustness={robustness}"
                f"{f' on {robust_per_suite} probes per suite' if robust_per_suite else ''}: the base must be scored with "
                "the same variants. Make "
                f"it with the base model: `forgetwatch cache --model <base> --probes {record_dir / 'probes.jsonl'} ... "
                f"--robustness {robustness}{f' --robust-per-suite {robust_per_suite}' if robust_per_suite else ''} "
                f"-o {cache_path} --force` (the scoring options as in sidecar.json), or watch without --robustness")
        # strict: a record the watcher cannot write stops it (restarted, it scores that step again)
        self.monitor = Monitor(self.probes, budget, risk,
                               log_table=opts["log_table"], replay=opts["replay"], strict=True, plan=self.plan,
                               console="forgetwatch watch")
        if into_trainer_run and not self.manifest.get("finished"):
            raise SidecarError("--into-trainer-run appends to the trainer's W&B run, which two processes cannot write while "
                               "it is live: wait until training has ended, or leave the flag out (a run of its own beside it)")
        # one watcher per record: a second would score every step again into the same files
        self._lock = acquire(self.output_dir, "scoring", run=f"forgetwatch watch {self.output_dir}")
        try:
            record = RunRecord(record_dir)
            record.recover()  # killed mid-evaluation: that step's files set aside, and it is pending again
            _, change, refused = pin_probes(record_dir, self.probes, probe_change, who="forgetwatch watch")
            if refused is not None:
                raise refused
            if change:
                begin_segment(record_dir, change, max(record.committed_steps()), self.probes,
                              keep=(MANIFEST, self.manifest["base_cache"], "probes.jsonl", MODEL_FILES))
            self._rescore = rescore if rescore is not None and rescore in record.committed_steps() else None
            if self._rescore is not None:
                aside = record.set_aside_step(rescore)
                logger.warning("forgetwatch watch: step %d set aside in %s, to be scored again from checkpoint-%d",
                               rescore, aside, rescore)
            # the base scored by this watcher's engine: vLLM scores it again when transformers scored base.parquet
            cache = base_for_engine(record_dir, cache, self.config, self.precision, self.probes, self.plan)
            done = record.eval_steps()
            cut = self._abandoned_after(record)
            loggers = self._loggers(report_to if report_to is not None else self.manifest.get("report_to", []),
                                    into_trainer_run)
            self.monitor.open(self.output_dir, cache, self.precision, loggers,
                              resume_step=cut if cut is not None else max(done) if done else None,
                              start=self._resumed_by(cut))
        except BaseException:
            self._lock.release()
            raise
        self._cache = cache
        self._failed: dict[int, int] = {}  # step -> failed attempts
        self._gone: set[int] = set()
        self._stale: set[int] = set()

    # -- checkpoints ----------------------------------------------------------------------------------------------
    def checkpoints(self) -> dict[int, Path]:
        """The trainer's `checkpoint-N` directories by step."""
        out = {}
        for p in self.output_dir.iterdir():
            m = _CHECKPOINT.match(p.name)
            if m and p.is_dir():
                out[int(m.group(1))] = p
        return dict(sorted(out.items()))

    @staticmethod
    def complete(path: Path, step: int) -> dict[str, Any] | None:
        """The checkpoint's trainer state once it is completely written (the Trainer writes it last), else None."""
        state = _read_state(path)
        return state if state is not None and state.get("global_step") == step else None

    def is_evaluation(self, step: int) -> bool:
        """A step the callback would have scored: on the eval_steps grid, or the last one (a checkpoint the trainer
        saved for its own reasons at another step is not an evaluation, as in-loop probing would not score it)."""
        return step % self.eval_steps == 0 or step in (self.manifest.get("max_steps"), self.manifest.get("final_step"))

    def pending(self) -> list[tuple[int, Path]]:
        done = set(self.monitor.evaluated_steps) | {s for s, n in self._failed.items() if n >= MAX_ATTEMPTS}
        out = []
        for s, p in self.checkpoints().items():
            if s == self._rescore and s not in done:  # the record held it: scored again whatever start wrote it
                out.append((s, p))
                continue
            if s in done or s <= self._first_step() or not self.is_evaluation(s):
                continue
            if _mtime(p / "trainer_state.json") < self.manifest.get("started_at", 0) - 1:
                if s not in self._stale:  # an earlier run's, in a reused output_dir: never this run's step
                    self._stale.add(s)
                    logger.warning("forgetwatch watch: %s predates this run (an earlier run in the same output_dir); "
                                   "not scored", p)
                continue
            if self._superseded(s, _start_id(_read_state(p))) is not None:
                continue  # of the trajectory a resume from an earlier checkpoint abandoned: it will be written again
            out.append((s, p))
        return out

    def _report_deleted(self, present: dict[int, Path]) -> None:
        """Say so when an evaluation step's checkpoint disappeared before it was scored (`save_total_limit`)."""
        last = max(present, default=0)
        if self.manifest.get("final_step"):
            last = max(last, self.manifest["final_step"])
        start = self._first_step()
        expected = set(range(start - start % self.eval_steps + self.eval_steps, last + 1, self.eval_steps))
        if self.manifest.get("finished") and self.manifest.get("final_step"):
            expected.add(self.manifest["final_step"])
        for step in sorted(expected - set(present) - set(self.monitor.evaluated_steps) - self._gone):
            if step < last or self.manifest.get("finished"):
                self._gone.add(step)
                logger.warning("forgetwatch watch: checkpoint-%d was deleted before it was scored (the trainer's "
                               "save_total_limit?); step %d is missing from the record. Raise save_total_limit or keep the "
                               "watcher running alongside training.", step, step)

    # -- scoring --------------------------------------------------------------------------------------------------
    def score(self, step: int, path: Path, state: dict[str, Any]) -> bool:
        """Score one checkpoint into the record; a checkpoint that fails to load is skipped with a message."""
        from ..scoring.checkpoint import score_checkpoint

        t0 = time.perf_counter()
        try:
            _check_trusted(path)
            scored = self.plan.scored() if self.plan is not None else self.probes
            results = score_checkpoint(path, scored, self.config, precision=self.precision, device=self.device,
                                       model_files=self.output_dir / PREFIX / MODEL_FILES,
                                       desc=f"forgetwatch watch: {path.name}")
        except (KeyboardInterrupt, SystemExit, ProbeSetError, EngineUnavailableError):
            raise  # a probe set that cannot be scored fails on every checkpoint: said once, not retried
        # not loadable (yet), deleted meanwhile, out of memory, untrusted: skip it, keep watching. BaseException: torch's
        # CheckpointException (a corrupt sharded checkpoint) is not an Exception
        except BaseException as e:
            self._failed[step] = self._failed.get(step, 0) + 1
            last = self._failed[step] >= MAX_ATTEMPTS
            logger.warning("forgetwatch watch: could not score %s (%s: %s); %s", path, type(e).__name__, e,
                           "giving up on it" if last else "will try again")
            return False
        seconds = time.perf_counter() - t0
        robust = None
        if self.plan is not None:
            results, variants = self.plan.split(results)
            robust = variant_outcomes(self.plan, results, variants)
        start = _start_id(state)
        # the monitor prints the evaluation's line, as the callback's (`forgetwatch.run.console`)
        self.monitor.report(results, step, float(state.get("epoch") or 0.0), seconds, robust,
                            source={"start": start} if start else None)
        return True

    def poll(self) -> int:
        """Score every complete checkpoint not yet in the record, oldest first; the number scored."""
        self._refresh_manifest()
        cut = self._abandoned_after(self.monitor.record)
        if cut is not None:  # the training resumed from an earlier checkpoint while this watcher ran
            self.monitor.open(self.output_dir, self._cache, self.precision, self.monitor.loggers, resume_step=cut,
                              start=self._resumed_by(cut))
            # what was said or tried of the abandoned checkpoints does not hold for the ones that replace them
            self._failed = {s: n for s, n in self._failed.items() if s <= cut}
            self._gone = {s for s in self._gone if s <= cut}
        started = self.manifest.get("started_at", 0) - 1
        present = {s: p for s, p in self.checkpoints().items() if _mtime(p / "trainer_state.json") >= started}
        self._report_deleted(present)
        n = 0
        for step, path in self.pending():
            state = self.complete(path, step)
            if state is None:
                continue  # still being written: next time
            n += self.score(step, path, state)
        return n

    def unscored(self) -> list[int]:
        """The steps whose checkpoint this watcher tried and could not score (damaged, not loadable, untrusted): each is
        missing from the record, said in a warning when it failed. A later `forgetwatch watch` tries them again."""
        done = set(self.monitor.evaluated_steps)
        return sorted(s for s in self._failed if s not in done)

    def finished(self) -> bool:
        """Training has ended and every checkpoint up to its last step is scored (or gone)."""
        if not self.manifest.get("finished"):
            return False
        return not [s for s, _ in self.pending() if s <= (self.manifest.get("final_step") or 0)]

    def run(self, once: bool = False, poll_seconds: float = 10.0, timeout: float | None = None) -> int:
        """Score checkpoints as they appear; with `once`, those already there, then return. Ends when training has ended
        and its checkpoints are scored, or after `timeout` seconds. Returns the number of checkpoints scored."""
        t0, n = time.monotonic(), 0
        try:
            while True:
                n += self.poll()
                if once or self.finished():
                    break
                if not self.manifest.get("finished") and not self._trainer_alive():
                    n += self.poll()  # what it saved before it went
                    logger.warning("forgetwatch watch: the training process (pid %s) is gone without finishing; scored "
                                   "what it saved", self.manifest.get("pid"))
                    break
                if timeout is not None and time.monotonic() - t0 > timeout:
                    logger.warning("forgetwatch watch: stopped after %.0f s (--timeout) with training still going", timeout)
                    break
                time.sleep(poll_seconds)
        finally:
            self.monitor.finish()
            self._lock.release()
            if self._own_wandb is not None:
                self._own_wandb.finish()  # the watcher's run (or its turn on the trainer's): the trainer's callback ends its own
            if self._own_trackio:
                import trackio

                trackio.finish()
        return n

    def _first_step(self) -> int:
        """The last step before this record's evaluations: where the training started, or where this segment of the
        record starts (`forgetwatch.record.segments`), whichever is later."""
        return max(self.manifest.get("started_at_step", 0), self.monitor.segment_from or 0)

    def _trainer_alive(self) -> bool:
        """False when the training process ran on this host and no longer exists (elsewhere: assumed alive)."""
        import socket

        pid = self.manifest.get("pid")
        if not pid or self.manifest.get("host") != socket.gethostname():
            return True
        return pid_alive(int(pid))

    def _superseded(self, step: int, start: str | None) -> int | None:
        """The step of the resume that abandoned an evaluation at `step` of the checkpoint written by training start
        `start` (a resume from an earlier checkpoint supersedes the checkpoints after it), or None when it stands.
        Checkpoints and evaluations without a start id (an earlier forgetwatch) stand."""
        starts = self.manifest.get("starts", [])
        ids = [s.get("id") for s in starts]
        if start is None or start not in ids:
            return None  # an earlier run's checkpoint is told by its time (`pending`)
        later = [s["step"] for s in starts[ids.index(start) + 1:] if s["step"] < step]
        return min(later) if later else None

    def _resumed_by(self, step: int | None) -> str | None:
        """The id of the (latest) training start that resumed from `step`: what it abandoned goes in its folder of
        `superseded/`, beside the trainer-log rows its training process set aside."""
        ids = [s.get("id") for s in self.manifest.get("starts", []) if s.get("step") == step]
        return ids[-1] if step is not None and ids else None

    def _abandoned_after(self, record: RunRecord) -> int | None:
        """The step after which the record holds evaluations of checkpoints a later training start abandoned (it
        resumed from an earlier checkpoint), or None."""
        cut, stale = None, []
        for row in record.read_metrics():
            at = self._superseded(row["step"], row.get("start"))
            if at is not None:
                cut = at if cut is None else min(cut, at)
                stale.append(row["step"])
        if cut is not None:
            logger.warning("forgetwatch watch: the training resumed from step %d, so the record's steps %s (scored from "
                           "checkpoints of the abandoned trajectory) are forgotten and scored again as the run writes them",
                           cut, ", ".join(map(str, stale)))
        return cut

    def _refresh_manifest(self) -> None:
        try:
            self.manifest = read_manifest(self.output_dir / PREFIX, ValueError)
        except (OSError, ValueError):
            pass  # being rewritten: the previous one holds

    # -- loggers --------------------------------------------------------------------------------------------------
    def _loggers(self, report_to: list[str], into_trainer_run: bool) -> list[MetricLogger]:
        self._own_wandb, self._own_trackio = None, False
        loggers: list[MetricLogger] = []
        name = self.manifest.get("run_name") or self.output_dir.name
        for backend in [b for b in report_to if b not in ("none", None)]:
            try:
                if backend == "wandb":
                    loggers.append(WandbLogger(self._wandb_run(name, into_trainer_run)))
                elif backend == "tensorboard":
                    loggers.append(TensorBoardLogger(tensorboard_dir(str(self.output_dir))))
                elif backend == "trackio":
                    import trackio

                    trackio.init(project=self.manifest.get("trackio_project") or "huggingface", name=f"{name}-forgetwatch",
                                 resume="allow")
                    self._own_trackio = True
                    loggers.append(TrackioLogger())
                else:
                    logger.warning("forgetwatch watch: does not log to %r (it logs to wandb, tensorboard, trackio)", backend)
            except Exception as e:
                logger.warning("forgetwatch watch: cannot log to %s (%s: %s); the local record goes on", backend,
                               type(e).__name__, e)
        return loggers

    def _wandb_run(self, name: str, into_trainer_run: bool):
        import wandb

        info = self.manifest.get("wandb") or {}
        kwargs: dict[str, Any] = {"project": info.get("project") or os.environ.get("WANDB_PROJECT", "forgetwatch"),
                                  "entity": info.get("entity"), "resume": "allow"}
        if info.get("dir"):
            kwargs["dir"] = info["dir"]
        if info.get("mode") == "offline" and not os.environ.get("WANDB_MODE"):
            kwargs["mode"] = "offline"
        if into_trainer_run and info.get("id"):
            kwargs["id"] = info["id"]
        else:
            # a run of its own, beside the trainer's: same project and group, named after it; a restarted watcher
            # continues the same run (its id follows the trainer's)
            kwargs.update(group=info.get("group") or name, name=f"{info.get('name') or name}-forgetwatch",
                          job_type="forgetwatch", id=f"{info['id']}-forgetwatch" if info.get("id") else None,
                          config={PREFIX: {"watching": str(self.output_dir), "trainer_run": info.get("id"),
                                           "n_probes": len(self.probes), "fingerprint": self.probes.fingerprint,
                                           "eval_steps": self.eval_steps}})
        self._own_wandb = wandb.init(**kwargs)
        return self._own_wandb


def _check_trusted(path: Path) -> None:
    """Refuse a sharded checkpoint that another user could have written (see the module's note): torch unpickles its
    `.metadata` and may unpickle byte items of its shards, so every file there must be the watching user's (or root's)
    and writable by nobody else."""

    shards = path / FSDP_SHARDS
    if not shards.is_dir() or not hasattr(os, "getuid"):
        return
    me = os.getuid()
    for f in [shards, *shards.iterdir()]:
        st = f.stat()
        if st.st_uid not in (me, 0) or st.st_mode & 0o022:
            who = f"belongs to another user (uid {st.st_uid}; you are {me})" if st.st_uid not in (me, 0) else \
                "can be written by other users"
            raise PermissionError(f"{f} {who}, and torch unpickles sharded checkpoints to read them, which can run "
                                  "code: not loaded. Run the watcher as the user who trains, on files only they can write")


def _read_state(path: Path) -> dict[str, Any] | None:
    """A checkpoint's trainer_state.json, or None while it is not (completely) there."""
    return read_json_or_none(path / "trainer_state.json")


def _start_id(state: dict[str, Any] | None) -> str | None:
    """Which training start wrote a checkpoint: the id ForgetWatchCallback keeps in its trainer state."""
    found = ((state or {}).get("stateful_callbacks") or {}).get("ForgetWatchCallback")
    if isinstance(found, list):
        found = found[0] if found else None
    start = ((found or {}).get("attributes") or {}).get("_start_id") if isinstance(found, dict) else None
    return start if isinstance(start, str) else None


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return float("inf")  # not there (yet): `complete` decides
