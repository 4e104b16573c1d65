"""`ForgetWatchCallback`: per-probe forgetting (1→0) and backward transfer (0→1), live, in any HF Trainer."""

from __future__ import annotations

import dataclasses
import inspect
import itertools
import logging
import math
import time
import uuid
import weakref
from pathlib import Path
from typing import Any

from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState

from ..measures.budgets import ROBUST_BUDGETS, Breach, Budget, parse_budget
from ..measures.drift import RiskRule
from ..measures.partial import Design, ShareBudget
from ..measures.robustness import variant_outcomes
from ..options import (
    GROUPS,
    REMEDIES,
    ForgetWatchArguments,
    changed,
    default,
    options_doc,
    options_from_kwargs,
    options_from_record,
)
from ..options import options as option_list
from ..probes.probe_set import ProbeSet
from ..probes.suites import load_probes
from ..probes.variants import make_plan
from ..record.cache import BaseCache, CacheMismatchError, make_cache_key
from ..record.store import RunRecord
from ..scoring.engines import engine_spec
from ..scoring.fit import ProbeFit, drop_unfit, measure_fit, write_dropped
from ..scoring.models import model_identity
from ..scoring.score import ScoringConfig, describe_precision
from .distributed import broadcast_from_main
from .hook_inputs import saves_at, tokenizer_of, training_autocast
from .inloop import decide_design, score_all, score_base, score_part, would_trip
from .loggers import make_loggers
from .monitor import PREFIX, Monitor
from .remedy_advice import remedy_advice
from .sidecar import SidecarManifest
from .start import base_cache_command, begin_segment, find_base, pin_probes, take_locks
from .steering import ReplaySteering

__all__ = ["ForgetWatchCallback"]

logger = logging.getLogger(__name__)


# Callbacks alive in this process, to find the user's object again after the Trainer restores a new one from a checkpoint.
_LIVE: weakref.WeakSet = weakref.WeakSet()
_SERIAL = itertools.count()


class ForgetWatchCallback(TrainerCallback, ExportableState):
    """Scores a frozen probe set every `eval_steps` and logs, per probe against the base model, what was forgotten.

    At the start of training the model is the base: unless a matching base cache is given, it is scored then
    and the cache written. Every `eval_steps` optimizer steps (and at the end) the model being trained is
    scored again, under the training precision, and the callback logs `forgetwatch/forgetting` (1→0 rate),
    `forgetwatch/backward_transfer` (0→1), their chance-adjusted versions, `accuracy`, `net_change` and
    `invalid_rate`, overall and as `forgetwatch_<metric>/<category>`, on the trainer's global-step axis, to
    each `report_to` backend (wandb, tensorboard, mlflow, trackio), plus a W&B table of the probes that
    flipped. It always writes a local record under `<output_dir>/forgetwatch/` (see `forgetwatch.record.store`).

    It never changes training: scoring consumes no randomness (RNG states are restored anyway), restores every
    module's train/eval flag, keeps no gradients, and never touches the trainer's own logs. A failing logging
    backend is switched off with a warning; training goes on.

    Args:
        probes: a `ProbeSet`, a JSONL path, or built-in suite names (a list or "arc_easy,mmlu").
        eval_steps: score every this many optimizer steps (default 50).
        **options: any other option of `forgetwatch options` (`forgetwatch docs options`) by its name without the `forgetwatch_`
            prefix: `per_suite=50`, `mcq_mode="loglik_norm"`, `budget={"forgetting": 0.05}`, `scoring="sidecar"`, ...
            They are listed below. The remedies' options (`anchor_beta`, `replay_mix`, ...) are not the callback's:
            `forgetwatch.remedies` builds them. A name that is not an option is refused, naming the closest.
        args: the options as parsed `ForgetWatchArguments`, instead of keywords (as `from_args`): the remedies' options
            in it are left to `forgetwatch.remedies`.

    Example:
        >>> from forgetwatch import ForgetWatchCallback
        >>> trainer = SFTTrainer(model=model, args=SFTConfig(..., report_to="wandb"), train_dataset=ds,
        ...                      callbacks=[ForgetWatchCallback(probes="probes.jsonl", eval_steps=50)])  # doctest: +SKIP
        >>> trainer.train()  # doctest: +SKIP
    """

    def __init__(self, probes: ProbeSet | str | list[str] | None = None, eval_steps: int | None = None, *,
                 args: ForgetWatchArguments | None = None, **options: Any):
        if options.pop("_from_state", False):  # a checkpoint's state (the Trainer calls `cls(**state["args"])`)
            args, options = _options_of_state(options), {}
        if args is not None and options:
            raise TypeError(f"pass the options as `args` or as keywords, not both (got args and {', '.join(options)})")
        # the two named parameters join the keywords, so that one given under both names is refused with the rest
        named = {k: v for k, v in (("probes", probes), ("eval_steps", eval_steps)) if v is not None}
        if args is None:
            args = options_from_kwargs(**named, **options)
        else:  # given as parsed arguments: the remedies' fields are theirs (a recipe's fw_args sets them), not refused here
            args = dataclasses.replace(options_from_kwargs(**args.to_kwargs()),
                                       **{"forgetwatch_" + k: v for k, v in named.items()})
        remedies = changed(args, names={o.name for o in option_list() if o.group == REMEDIES})
        if remedies:  # refused with the lines that add them, filled in
            raise ValueError(remedy_advice(remedies, args.forgetwatch_probes if probes is None else probes))
        o = args.unprefixed()
        probes, eval_steps = o["probes"], o["eval_steps"]
        if probes is None:
            raise ValueError("`probes` is required: a ProbeSet, a JSONL path, or built-in suite names like 'arc_easy,mmlu'")
        self.eval_steps = eval_steps
        self.config = ScoringConfig(**{f.name: o[f.name] for f in dataclasses.fields(ScoringConfig) if f.name in o})
        self.base_cache = o["base_cache"]
        scoring = o["scoring"]  # its values are checked with every option's (`ForgetWatchArguments.__post_init__`)
        if not engine_spec(self.config.engine).live_model:
            # an engine that loads directories is the watcher's (the options say so: scoring="sidecar"); this process
            # scores only the base, with transformers, and never starts that engine beside training's memory. The watcher
            # scores the base again with its engine (`forgetwatch.run.base_rescore`): both sides of each flip from one
            self.config = dataclasses.replace(self.config, engine="hf")
        self.scoring = scoring
        share = o["max_share"]
        self.max_share = float(share) if share is not None else None
        self._share: ShareBudget | None = None  # the time budget's account, from train begin (`forgetwatch.measures.partial`)
        self._clock: tuple[float, int] = (0.0, 0)  # when and at which step the last evaluation (or train begin) ended
        self.unfit_probes = o["unfit_probes"]
        self._fit: ProbeFit | None = None  # how the probes fit the model's context (`fit_probes`), once measured
        self._dropped: dict[str, int] = {}  # with unfit_probes="drop": the probes left out, and their lengths in tokens
        # the options as given (a ProbeSet object is not an option: the record keeps it as probes.jsonl)
        self.options = dataclasses.replace(args, forgetwatch_probes=probes if isinstance(probes, str) else None)
        self._use_probes(load_probes(probes, per_suite=o["per_suite"], seed=o["seed"]))
        if self.unfit_probes == "refuse":  # with "drop" the set may still shrink: checked once it is known (`fit_probes`)
            self._check_base_cache()
        self._started = False
        self._start_id: str | None = None  # this training start's id (on_train_begin), in its checkpoints and manifest
        self._serial = next(_SERIAL)
        _LIVE.add(self)
        self._has_base = False
        self._record_root: Path | None = None
        self._scored_step: int | None = None
        self._is_main = True
        self._progress = True
        self.steering = ReplaySteering()  # replay streams this run steers (`mix_replay`, the anchor's, the penalty's)
        self._locks: list = []  # the record's writer locks (main process), held from train begin to train end
        self._stopped = False  # probing stopped: an evaluation could not be written (`_probing_stopped`)
        self._cost, self._t_train = {}, time.perf_counter()  # the start's passes and when train() began

    @classmethod
    def from_args(cls, args: ForgetWatchArguments) -> ForgetWatchCallback:
        """Build the callback from parsed `ForgetWatchArguments` (its remedy options are `forgetwatch.remedies`')."""
        return cls(args=args)

    def _use_probes(self, probes: ProbeSet) -> None:
        """Score `probes`: the budget, the variants and the monitor are built for them (again, when some are dropped)."""
        o = self.options.unprefixed()
        self.probes = probes
        self.budget = Budget(parse_budget(o["budget"]), o["on_budget"], o["budget_bound"], probes.groups) if o["budget"] else None
        # which variants of which probes are scored besides them (None: robustness off); refused here, before training
        self.plan = make_plan(probes, o["robustness"], o["robust_per_suite"], self.config.mcq_mode)
        if self.budget is not None and self.plan is None:
            needs = [lim.key for lim in self.budget.limits if lim.metric in ROBUST_BUDGETS]
            if needs:
                raise ValueError(f"budget {', '.join(needs)}: robust figures need variants; set `robustness` (e.g. 5)")
        self.risk_rule = RiskRule(o["at_risk_margin"], o["at_risk_drop"])
        # what happens to each evaluation's results (figures, record, loggers, budget): shared with `forgetwatch watch`
        self.monitor = Monitor(probes, self.budget, self.risk_rule, log_table=o["log_table"], replay=o["replay"],
                               plan=self.plan, console="forgetwatch" if o["console"] else None)

    def _check_base_cache(self) -> None:
        base_cache = self.base_cache
        if base_cache and Path(base_cache).is_file():
            # Fail before any training step is spent: a cache for another probe set can never match. (A cache of an
            # older format is rebuilt at the start of training, with a warning that says how to make it once.)
            try:
                cache = BaseCache.load(base_cache)
            except CacheMismatchError:
                cache = None
            ids = cache.results.ids if cache is not None else []
            if cache is not None and set(ids) == set(self.probes.ids) and len(ids) == len(self.probes) and \
                    ProbeSet([self.probes[i] for i in ids]).fingerprint == cache.key["probes"]["fingerprint"]:
                return  # these probes in the cache's (and a resumed record's) order: the order is no change
            if cache is not None:
                expect = {"probes": {"fingerprint": self.probes.fingerprint, "n": len(self.probes)}}
                cache.check(expect, ignore=("format", "model", "scoring"), path=base_cache)

    def fit_probes(self, model: Any, processing_class: Any, *, warn: bool = True) -> None:
        """Measure the probes (and their variants) against the model's context, from the tokenizer and the model's
        config, running nothing: a probe that does not fit is refused with `ProbeSetError` (naming the probes, their
        suites, the context and the ways out), or, with `unfit_probes="drop"`, left out of the set with a warning.

        The Trainer calls it through `on_init_end`, so a probe set that cannot be scored stops the Trainer's
        constructor, before any logger (W&B, ...) has started a run. A callback added later with
        `trainer.add_callback` is checked in `on_train_begin`, which runs after the `report_to` loggers started theirs
        (the Trainer puts them first, and a callback gets no handle on the Trainer to move itself): call this then,
        before `trainer.train()`, to be refused before them too. Measured once; later calls return at once.

        Example:
            >>> trainer.add_callback(watch)  # doctest: +SKIP
            >>> watch.fit_probes(trainer.model, trainer.processing_class)  # doctest: +SKIP
        """
        if self._fit is not None:
            return
        fit = measure_fit(model, tokenizer_of(processing_class), self.plan.scored() if self.plan else list(self.probes),
                          self.config)
        over = fit.unfit
        if over and self.unfit_probes == "refuse":
            raise fit.refusal()  # not kept: asked again (on_train_begin after a caught refusal), it refuses again
        self._fit = fit
        if over:
            kept, self._dropped = drop_unfit(self.probes, fit, warn=warn)
            self._use_probes(kept)
        if self.unfit_probes != "refuse":  # the set is known now (__init__ checked it already under "refuse")
            self._check_base_cache()

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> ForgetWatchCallback:
        """The callback a checkpoint's saved state describes, written by any version (as the Trainer rebuilds it)."""
        instance = cls(**{**state["args"], "_from_state": True})
        for name, value in state["attributes"].items():
            setattr(instance, name, value)
        return instance

    # -- ExportableState: survives `resume_from_checkpoint` -------------------------------------------------
    def state(self) -> dict[str, Any]:
        args = self.options.to_kwargs()
        if args["probes"] is None and self._record_root is not None:
            args["probes"] = str(self._record_root / "probes.jsonl")  # a ProbeSet object is restored from the record
        # `_restored` tells the instance the Trainer rebuilds from this state that it replaces the user's own object
        # `_start_id` goes into every checkpoint's trainer_state.json: the watcher tells which training start wrote it
        # `_from_state`: the Trainer passes these args back to __init__, which then reads them as a record of any version
        return {"args": {**args, "_from_state": True},
                "attributes": {"evaluated_steps": list(self.evaluated_steps), "_restored": True, "_start_id": self._start_id}}

    @property
    def evaluated_steps(self) -> list[int]:
        """The global steps scored so far (0 is the base)."""
        return self.monitor.evaluated_steps

    @evaluated_steps.setter
    def evaluated_steps(self, steps: list[int]) -> None:  # the Trainer sets it when it restores the callback
        self.monitor.evaluated_steps = list(steps)

    # -- results for Python users ---------------------------------------------------------------------------
    @property
    def record_dir(self) -> Path | None:
        return self._record_root

    def replay_examples(self) -> list[dict[str, Any]]:
        """Forgotten probes so far, as training examples (see `forgetwatch.record.replay.replay_examples`)."""
        return self.monitor.tracker.examples() if self.monitor.tracker is not None else []

    def attach_mixer(self, mixer) -> None:
        """Steer a replay stream (`forgetwatch.remedies.mix_replay` calls this): after each evaluation its category
        weights follow the per-category forgetting, and its history goes into the record."""
        self.steering.attach(mixer, self.scoring)

    # -- trainer events -------------------------------------------------------------------------------------
    def on_init_end(self, args, state, control, model=None, processing_class=None, **kwargs):
        # The end of the Trainer's constructor: the report_to loggers start their runs in on_train_begin, which runs
        # theirs before ours, so a probe set that cannot be scored is refused here, before any of them logs anything.
        tokenizer = processing_class if processing_class is not None else kwargs.get("tokenizer")
        if model is not None and tokenizer is not None:  # without them on_train_begin says what is missing
            self.fit_probes(model, tokenizer, warn=state.is_world_process_zero)

    def on_train_begin(self, args, state, control, model=None, processing_class=None, **kwargs):
        if model is None:  # transformers passes the model to every hook; a release that stopped would end here
            import transformers

            raise RuntimeError(f"ForgetWatchCallback got no `model` in on_train_begin (transformers {transformers.__version__}): "
                               "the trainer no longer passes it to callbacks. Please report this with your versions.")
        tokenizer = tokenizer_of(processing_class if processing_class is not None else kwargs.get("tokenizer"))
        # measured in on_init_end, unless the callback was added after the Trainer was built or restored from a
        # checkpoint (a restored one drops what its first run dropped, so it finds the user's object by its probes)
        self.fit_probes(model, tokenizer, warn=state.is_world_process_zero)
        if getattr(self, "_restored", False):
            self._share_state_with_the_users_object()
        self._started = True
        self._stopped = False  # a resume, the record mended: probing goes on
        self._start_id = uuid.uuid4().hex  # the main process's goes into the checkpoints and the manifest
        self._is_main = state.is_world_process_zero
        self._progress = not args.disable_tqdm
        record = RunRecord(Path(args.output_dir) / PREFIX)
        self._record_root = record.root  # on every rank and in every mode (the Monitor opens it on the main process only)
        autocast = training_autocast(model, args)
        scoring_key = self.config.key(tokenizer, describe_precision(model, autocast=autocast))
        key = make_cache_key(model_identity(model), self.probes, scoring_key, self.plan.key() if self.plan else None)
        own_cache = record.root / "base.parquet"
        cache_path = Path(self.base_cache) if self.base_cache else own_cache
        resuming = state.global_step > 0
        # One training (and one scorer) per record, decided before an earlier record is moved aside: a second run into a
        # live run's output_dir would move its record away under it and interleave their steps. Refused on every rank.
        busy = broadcast_from_main(self._take_locks(args) if self._is_main else None)
        if busy is not None:  # said on every rank: a rank that raised alone would leave the others waiting
            raise busy
        # The record's probe set is pinned by its evaluations: a resume with other probes is refused here, before any
        # scoring (or, with probe_change="new_segment", starts a new segment once a base for them is found). Decided on
        # the main process, which reads the record, and told to every rank, as the refusals around it.
        change = None
        if resuming:
            order, change, error = broadcast_from_main(
                pin_probes(record.root, self.probes, self.options.forgetwatch_probe_change, who="the resumed run")
                if self._is_main else None)
            if error is not None:
                self._release_locks()  # refused: the record is free for the run that follows the advice
                raise error
            if order is not None:  # the record's probes in another order: scored in the record's (its npz rows)
                self._use_probes(ProbeSet([self.probes[i] for i in order], origin=self.probes.origin))
                key = make_cache_key(model_identity(model), self.probes, scoring_key, self.plan.key() if self.plan else None)
        # Decided once, on the main process, and the same on every rank: ranks that disagreed (a file one of them cannot
        # see, a cache written while another reads) would score apart and the others wait forever.
        # A resumed run uses the base its first run used: the given cache, or, when that was absent or did not match and
        # the base was scored at the start, the one written into the record.
        paths = [cache_path, own_cache] if resuming else [cache_path]
        advice = lambda: base_cache_command(key, self.probes, self.options, self._record_root)  # noqa: E731
        cache, error = broadcast_from_main(
            find_base(key, self.probes.ids, paths, state.global_step, given=bool(self.base_cache), cache_command=advice)
            if self._is_main else None)
        if error is not None:
            self._release_locks()
            raise error
        if self._is_main and not resuming and record.set_aside() and cache is not None and cache_path == own_cache:
            cache.save(own_cache)  # the base this run uses, from the record it just set aside
        if self._is_main and resuming:
            try:  # the resumed run logs those steps again
                record.truncate_after(state.global_step, names=("trainer_log.jsonl",), start=self._start_id)
            except Exception:  # the report's loss panel is not worth a run (nor other ranks waiting on this one)
                logger.exception("forgetwatch: could not cut trainer_log.jsonl back to step %d", state.global_step)
        if self._is_main and change is not None:  # a base for the new probes was found: the old segment moves aside
            begin_segment(record.root, change, state.global_step, self.probes, cache, start=self._start_id)
        self._share = ShareBudget(self.max_share) if self.max_share is not None and self.scoring == "inline" else None
        t_begin = self._t_train = time.perf_counter()
        self._cost = {}  # the start's passes, in seconds (`forgetwatch.run.cost`)
        if cache is None:
            cache, self._cost = score_base(model, tokenizer, self.probes, self.plan, self.config, key,
                                           scoring_key["precision"], self._is_main and not args.disable_tqdm)
            if self._share is not None:
                self._share.note_full(self._cost["base"], len(self.probes))
            if self._is_main:
                # A cache the user gave is never overwritten: a fresh one goes into this run's record.
                cache.save(record.root / "base.parquet" if self.base_cache else cache_path)
        self._has_base = True
        # Every rank tracks the last step it scored, so all ranks agree on the final evaluation (the record,
        # kept by the main process only, cannot tell the other ranks).
        self._scored_step = state.global_step
        if self._is_main and self._dropped:
            write_dropped(record.root, self._fit.limit, len(self.probes), self._dropped)
        if self.scoring == "sidecar":
            if self._is_main:
                self._start_sidecar(args, state, cache, record, scoring_key["precision"], model, tokenizer)
            self._begin_replay(args, state)
            return
        if not self._is_main:
            self._begin_replay(args, state)
            self._start_clock(state, t_begin)
            return

        loggers = make_loggers(args.report_to, args.output_dir, getattr(args, "logging_dir", None))
        if any(lg.name == "wandb" for lg in loggers):
            self._log_config()
        # A resumed run recomputes what came after its checkpoint (a fresh run's earlier record was set aside above).
        self.monitor.budgeted = self._share is not None
        self.monitor.open(args.output_dir, cache, scoring_key["precision"], loggers, state.global_step if resuming else None,
                          start=self._start_id, base_seconds=sum(self._cost.values()))
        if self._share is not None and resuming:
            try:  # the run's account goes on where it stopped (this start's base scoring is added by _start_clock)
                if kept := self.monitor.share_account():
                    self._share = ShareBudget.from_dict(self.max_share, kept)
            except Exception:  # an account the record cannot give back: a fresh one, said; training goes on
                logger.exception("forgetwatch: could not read back the time account of max_share; it starts again")
        if self.options.forgetwatch_wandb_workspace:
            self._save_workspace(loggers, args.output_dir)
        self._begin_replay(args, state)
        self._start_clock(state, t_begin)

    def _start_clock(self, state, t_begin: float) -> None:
        """With max_share: the probing so far (the base scored, the record opened) counts against the share."""
        if self._share is not None:
            now = time.perf_counter()
            self._share.note(probe=now - t_begin)
            self._clock = (now, state.global_step)

    @staticmethod
    def _save_workspace(loggers, output_dir) -> None:
        """`wandb_workspace`: the W&B workspace, from the base evaluation just recorded (never raises)."""
        runs = [lg.run for lg in loggers if lg.name == "wandb"]
        if not runs:
            logger.warning("forgetwatch: wandb_workspace is on but this run does not log to W&B (report_to); no workspace")
            return
        from .wandb_workspace import save_for_run

        save_for_run(runs[0], output_dir)

    def _begin_replay(self, args, state) -> None:
        last = None  # the weights of the last evaluation before a resume take effect again
        if self._is_main and state.global_step > 0 and self.steering.mixers and self.evaluated_steps \
                and self.evaluated_steps[-1] > 0:
            last = (self.evaluated_steps[-1], self.monitor.category_forgetting())
        self.steering.begin(args, state, self._record_root, self._is_main, last)

    def on_step_end(self, args, state, control, model=None, processing_class=None, **kwargs):
        # global_step is the same on every rank, so all ranks score together (a wall-clock trigger would deadlock).
        # The last step is scored here too, not in on_train_end: by then the report_to integrations (which run
        # first) may have ended their runs (mlflow, trackio).
        if self.scoring == "sidecar":
            if (state.global_step % self.eval_steps == 0 or state.global_step >= state.max_steps
                    or control.should_training_stop):
                control.should_save = True  # `forgetwatch watch` scores the checkpoint
            if self._is_main:
                self.steering.write(self._record_root)
            return control
        if (state.global_step % self.eval_steps == 0 or state.global_step >= state.max_steps) and not self._probing_stopped():
            breaches = self._evaluate(model, processing_class if processing_class is not None else kwargs.get("tokenizer"), state,
                                      saving=bool(control.should_save or control.should_training_stop)
                                      or saves_at(args, state, state.global_step),
                                      args=args)
            if self.budget is not None and self.budget.on_budget in ("save", "stop"):
                # Decided where the gathered results are, then shared: ranks that stopped or saved apart would hang.
                act = broadcast_from_main(bool(breaches) if self._is_main else None)
                if act and self.budget.on_budget == "save":
                    control.should_save = True
                elif act:
                    control.should_training_stop = True
        if self._is_main:
            self.steering.write(self._record_root)
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):
        # The trainer's own rows (loss, learning rate, GRPO reward), kept so the report can draw them on the step axis
        # beside the forgetting curves (the demo saves no checkpoint, so there is often no trainer_state.json). Read
        # only: `logs` is the dict every other callback gets next.
        if not self._is_main or self._record_root is None or not logs:
            return
        try:
            # a NaN / inf loss is written as null: strict JSON readers (jq, browsers) reject NaN
            row = {k: (v if math.isfinite(v) else None) for k, v in logs.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool) and not k.startswith(PREFIX + "/")}
            if row:
                RunRecord(self._record_root).append_trainer_log({"step": state.global_step, "epoch": state.epoch, **row})
        except Exception:  # a full disk must not end the run
            logger.exception("forgetwatch: could not keep the trainer's log row at step %d; training goes on", state.global_step)

    def on_train_end(self, args, state, control, model=None, processing_class=None, **kwargs):
        if self.scoring == "sidecar":
            if self._is_main:
                self._sidecar.update(finished=True, final_step=state.global_step)
                self._release_locks()
            return
        if self._scored_step != state.global_step and not self._probing_stopped():
            self._evaluate(model, processing_class if processing_class is not None else kwargs.get("tokenizer"), state,
                           saving=True)  # the end of training: a full pass
        if self._is_main:
            self.steering.write(self._record_root)
            self.monitor.finish(cost=self._cost, train_seconds=time.perf_counter() - self._t_train)
            self._release_locks()

    # -- one writer per record ---------------------------------------------------------------------------------
    def _take_locks(self, args) -> Exception | None:
        """The record's locks for this run (`forgetwatch.run.start.take_locks`); the error to raise, if any."""
        self._release_locks()
        self._locks, error = take_locks(args.output_dir, f"{args.run_name or Path(args.output_dir).name} (training)",
                                        scoring=self.scoring != "sidecar")  # sidecar: the watcher scores this run
        return error

    def _release_locks(self) -> None:
        for lock in getattr(self, "_locks", []):
            lock.release()
        self._locks = []

    # -- sidecar mode: the training process scores nothing -----------------------------------------------------
    def _start_sidecar(self, args, state, cache: BaseCache, record: RunRecord, precision: str, model, tokenizer) -> None:
        """What `forgetwatch watch` needs to score the checkpoints as this process would (`forgetwatch.run.sidecar`)."""
        self._sidecar = SidecarManifest(record.root)
        self._sidecar.start(args, state, options=self.options, config=self.config, precision=precision, probes=self.probes,
                            cache=cache, start_id=self._start_id, model=model, tokenizer=tokenizer)

    # -- internals ------------------------------------------------------------------------------------------
    def _share_state_with_the_users_object(self) -> None:
        """With `restore_callback_states_from_checkpoint=True` the Trainer replaces the user's callback by a new one built
        from the checkpoint, so the object the user holds would never see the run. Find it (same probes and options, never
        started, the latest made) and let it share this instance's attributes: it then reads the live record, steps, replay."""
        same = dataclasses.replace(self.options, forgetwatch_probes=None)
        mine = [cb for cb in list(_LIVE) if cb is not self and not cb._started
                and cb.probes.fingerprint == self.probes.fingerprint
                and dataclasses.replace(cb.options, forgetwatch_probes=None) == same]
        if mine:
            users = max(mine, key=lambda cb: cb._serial)
            self.steering = users.steering  # the replay streams it steers are not in the saved state
            users.__dict__ = self.__dict__

    def _probing_stopped(self) -> bool:
        """Whether an evaluation could not be written to the record, so that probing stopped there (the monitor said so,
        once, with what to do): the main process knows, every rank is told (a collective, at each evaluation step, so
        that all ranks skip the scoring together). Training goes on untouched."""
        if not self._stopped:
            self._stopped = bool(broadcast_from_main(self.monitor.write_failure is not None if self._is_main else None))
        return self._stopped

    def _evaluate(self, model, processing_class, state, saving: bool = False, args: Any = None) -> list[Breach]:
        """Score the model now and report it (main process); the budget limits newly exceeded (empty elsewhere). With
        max_share, a partial evaluation unless `saving` (a checkpoint is saved at this step) or it is the last step."""
        if not self._has_base:
            raise RuntimeError("ForgetWatchCallback: on_train_begin did not run; add the callback before `trainer.train()`")
        t0 = time.perf_counter()
        design = None
        if self._share is not None:
            self._share.note(train=t0 - self._clock[0], steps=state.global_step - self._clock[1])
            design = self._design(args, state, saving)
        # a bar as for the base (an evaluation can pause training for minutes), unless the trainer's bars are off
        progress, desc = self._is_main and self._progress, f"forgetwatch: step {state.global_step}"
        tokenizer = tokenizer_of(processing_class)
        if design is None:
            results, variants = score_all(model, tokenizer, self.probes, self.plan, self.config, progress, desc)
        else:  # variants are scored at the full passes only
            results, variants = score_part(model, tokenizer, self.probes, self.config, self._share, design, progress, desc), None
            # a budget would save or stop here: that step gets an exact pass
            if would_trip(self.monitor, self.budget, results, design, self._is_main):
                design = None
                results, variants = score_all(model, tokenizer, self.probes, self.plan, self.config, progress,
                                               f"{desc} (budget: every probe)")
        seconds = time.perf_counter() - t0
        account = None
        if self._share is not None:
            if design is None:
                self._share.note_full(seconds, len(self.probes))
            self._share.note(probe=seconds)
            account = self._share.to_dict()
        logger.info("forgetwatch: scored %d probes at step %d in %.1fs", len(results), state.global_step, seconds)
        self._scored_step = state.global_step
        robust = variant_outcomes(self.plan, results, variants) if self.plan is not None and design is None else None
        breaches = []
        if self._is_main:
            if design is not None:
                try:
                    results = self.monitor.merged(results)
                except Exception:  # never end training over a partial evaluation: this step is left out, said
                    logger.exception("forgetwatch: could not merge the partial evaluation at step %d; it is not recorded",
                                     state.global_step)
                    results = None
        if self._is_main and results is not None:
            breaches = self.monitor.report(results, state.global_step, state.epoch or 0.0, seconds, robust, design=design,
                                           share=account)
        if self._share is not None:  # the figures and the record's writing count as probing too
            now = time.perf_counter()
            self._share.note(probe=now - t0 - seconds)
            self._clock = (now, state.global_step)
        if self.steering.mixers:
            self.steering.steer(state.global_step, None if self.monitor.figures_missing else self.monitor.category_forgetting(),
                                self._is_main)
        return breaches

    # -- max_share: partial evaluations (`forgetwatch.run.inloop`) -----------------------------------------------------
    def _design(self, args, state, saving: bool) -> Design | None:
        """The design of this evaluation, None for a full pass (the same on every rank)."""
        return decide_design(self.monitor, self._share, args, state, self.eval_steps, saving,
                             self.options.forgetwatch_seed, self._is_main)

    def _log_config(self) -> None:
        try:
            import wandb

            wandb.run.config.update({PREFIX: {
                "probes": self.probes.origin, "n_probes": len(self.probes), "fingerprint": self.probes.fingerprint,
                "categories": list(self.probes.categories), "eval_steps": self.eval_steps, "unfit_dropped": len(self._dropped),
                "scoring": dataclasses.asdict(self.config),
            }}, allow_val_change=True)
        except Exception as e:
            logger.warning("forgetwatch: could not add its settings to the W&B config (%s)", e)


def _signature() -> inspect.Signature:
    """`ForgetWatchCallback(probes, eval_steps, *, per_suite=100, ...)` as `help()` and editors show it, made from the
    options (the remedies' are not the callback's)."""
    P = inspect.Parameter
    params = [P("self", P.POSITIONAL_OR_KEYWORD), P("probes", P.POSITIONAL_OR_KEYWORD, default=None),
              P("eval_steps", P.POSITIONAL_OR_KEYWORD, default=default("eval_steps"))]
    params += [P(o.short, P.KEYWORD_ONLY, default=o.default, annotation=o.type) for o in option_list()
               if o.group != REMEDIES and o.short not in ("probes", "eval_steps")]
    return inspect.Signature(params + [P("args", P.KEYWORD_ONLY, default=None)])


ForgetWatchCallback.__init__.__signature__ = _signature()
ForgetWatchCallback.__doc__ += options_doc(prefixed=False, groups=tuple(g for g in GROUPS if g != REMEDIES))


def _options_of_state(values: dict[str, Any]) -> ForgetWatchArguments:
    """The options a checkpoint's callback state holds, written by any version: an option this version does not know is
    dropped with a warning, a missing one takes its default (`options_from_record`)."""
    dropped = sorted(set(values) - {o.short for o in option_list()})
    if dropped:
        logger.warning("forgetwatch: the checkpoint's callback state names options this version does not know (%s); "
                       "resuming without them", ", ".join(dropped))
    return options_from_record(values)
