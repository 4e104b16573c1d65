"""`RewindCallback`: at the end of training, the step back toward the base (`forgetwatch.remedies.rewind`), picked and saved.

It runs after training, on the final model: it saves that model into the record (`<record>/rewind/checkpoint`, removed
once the rewind succeeded), scores θ(α) on a copy loaded from there, and never touches the trainer's model object, its
training, or what the trainer saves. What cannot work is refused when training starts, not at its end.

Example:
    >>> trainer = SFTTrainer(..., eval_dataset=held_out, args=SFTConfig(..., eval_strategy="steps"),
    ...                      callbacks=[ForgetWatchCallback(probes="arc_easy,sciq", budget={"forgetting_adjusted": 0.05}),
    ...                                 RewindCallback()])  # doctest: +SKIP
    >>> trainer.train()  # doctest: +SKIP
    rewind: α 0.7 (the lowest task loss within the budget) — F_adj 0.061 → 0.040, eval loss 1.234 → 1.201; model in ...
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import logging
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState

from ..errors import InterpolationError
from ..measures.budgets import ROBUST_BUDGETS, Budget, parse_budget
from ..measures.drift import RiskRule
from ..options import ForgetWatchArguments, default
from ..record.cache import read_key
from ..run.console import say
from .rewind import REWOUND, rewind

__all__ = ["RewindCallback", "rewind_callback", "eval_set_loss"]

logger = logging.getLogger(__name__)

EVAL_SET = "the trainer's eval set"
# TRL's trainers whose batches are not language-model examples with `labels` (SFTConfig and its subclasses are)
_NO_LM_LABELS = ("DPOConfig", "GRPOConfig", "KTOConfig", "ORPOConfig", "CPOConfig", "RewardConfig", "PPOConfig",
                 "RLOOConfig", "OnlineDPOConfig", "PRMConfig", "BCOConfig", "XPOConfig", "NashMDConfig")


class RewindCallback(TrainerCallback, ExportableState):
    """At the end of training, score the final model moved back toward the base at each α of a grid, pick α and save
    that model to `<output_dir>/rewound/` (`forgetwatch.remedies.rewind.rewind`; the rule: `forgetwatch.remedies.rewind.RULE`).

    Add it after `ForgetWatchCallback` (it reads the record that callback writes, final evaluation included). The task
    loss is `data`'s when given, else the trainer's eval set's (the mean loss per label token of its batches) when an
    evaluation ran; without either, only a budget can pick. Refused when training starts: several processes, sidecar
    scoring, no task measure and no budget, a DPO / GRPO trainer's eval set (no language-model labels), an existing
    `rewound/` (unless `force`), a LoRA or quantised model that interpolation cannot scale, a base without weights on
    disk. A rewind that fails at the end is logged with the way to redo it (`forgetwatch rewind`), never raised: the
    trained model must still be saved.

    Args:
        data: a JSONL of held-out task examples (`forgetwatch_rewind_data`).
        alphas: the α grid (`forgetwatch_rewind_alphas`); 1 is always scored.
        heldout: held-out probes scored at the pick only, reported apart (`forgetwatch_rewind_heldout`).
        budget, budget_bound: the budget to pick within (default: the run's, from its record).
        base_cache: the base cache the run was given (`forgetwatch_base_cache`), when the record has none of its own.
        config: the run's `ScoringConfig` (batch size, engine; the rest is checked against the base cache).
        risk_rule: the run's at-risk rule (`RiskRule`), for the α = 1 check.
        force: replace an existing `rewound/` (else a fresh run moves it aside, to `rewound.1`, ...; a resume refuses).
        stage: what the run trains, when the trainer's arguments do not say it (a front-end's `stage: dpo` runs with
            its own argument class): its eval set is a task measure for "sft" only.
        console: print the pick's line when training ends (`forgetwatch_console`), as each evaluation prints one.

    Example:
        >>> callbacks = [ForgetWatchCallback(probes="arc_easy"), RewindCallback(data="held_out.jsonl")]  # doctest: +SKIP
    """

    def __init__(self, data: str | None = None, alphas: str = default("rewind_alphas"), heldout: str | None = None, *,
                 budget: Mapping[str, float] | str | None = None, budget_bound: str = default("budget_bound"),
                 base_cache: str | None = None, config: Any = None, risk_rule: Any = None, force: bool = False,
                 stage: str | None = None, console: bool = True):
        from ..probes.suites import load_probes
        from .interpolate import alpha_grid, load_task_data

        alpha_grid(alphas, flag="forgetwatch_rewind_alphas", beyond=None)  # refused now, not after training
        self.data, self.alphas, self.heldout, self.force, self.console = data, alphas, heldout, force, console
        self.rows = load_task_data(data, max_examples=None) if data is not None else None
        if heldout is not None:
            load_probes(heldout)
        self.budget = Budget(parse_budget(budget), "alert", budget_bound) if budget else None
        if self.budget is not None and any(lim.metric in ROBUST_BUDGETS for lim in self.budget.limits):
            raise ValueError("`budget` on robust figures: rewind scores no robustness variants; leave those limits out")
        if isinstance(config, Mapping):  # as `state()` saves it in a checkpoint
            from ..scoring.score import ScoringConfig

            config = ScoringConfig(**config)
        if isinstance(risk_rule, (list, tuple)):
            from ..measures.drift import RiskRule

            risk_rule = RiskRule(*risk_rule)
        self.budget_bound, self.base_cache, self.config, self.risk_rule = budget_bound, base_cache, config, risk_rule
        self.stage = stage
        self._eval_set = False
        self.result = None  # the `RewindResult`, once done

    def state(self) -> dict[str, Any]:
        """Saved in checkpoints: with `restore_callback_states_from_checkpoint=True` the Trainer rebuilds the stateful
        callbacks at the end of its list, in their saved order, so this one stays after `ForgetWatchCallback`, whose
        final evaluation it reads."""
        budget = self.budget.to_dict()["limits"] if self.budget is not None else None
        config = dataclasses.asdict(self.config) if self.config is not None else None
        rule = [self.risk_rule.margin_below, self.risk_rule.drop_by] if self.risk_rule is not None else None
        return {"args": {"data": self.data, "alphas": self.alphas, "heldout": self.heldout, "budget": budget,
                         "budget_bound": self.budget_bound, "base_cache": self.base_cache, "config": config,
                         "risk_rule": rule, "force": self.force, "stage": self.stage,
                         "console": self.console}, "attributes": {}}

    def on_train_begin(self, args, state, control, model=None, processing_class=None, **kwargs):
        if args.world_size > 1:
            raise ValueError(f"forgetwatch_rewind runs in one process, and this run has {args.world_size}: leave it off "
                             f"and rewind after training with `forgetwatch rewind {args.output_dir}`")
        record = Path(args.output_dir) / "forgetwatch"
        if not (record / "probes.jsonl").is_file():
            raise ValueError("RewindCallback reads the record ForgetWatchCallback writes: add it after ForgetWatchCallback "
                             "in `callbacks` (forgetwatch_rewind needs forgetwatch_probes)")
        if (record / "sidecar.json").is_file():
            raise ValueError("forgetwatch_rewind needs the final evaluation in the training process, and "
                             "forgetwatch_scoring=sidecar leaves it to `forgetwatch watch`: rewind after training with "
                             f"`forgetwatch rewind {args.output_dir}`")
        out = Path(args.output_dir) / REWOUND
        if out.exists() and not self.force:
            if state.global_step > 0:  # a resume: that may be this run's own, from before it stopped
                raise ValueError(f"{out} exists (an earlier rewind?): move it away, or pass force=True, before training")
            aside = _free_name(out)  # a fresh run: the earlier run's is kept, as its record is
            out.rename(aside)
            logger.warning("forgetwatch: %s held an earlier run's rewound model: moved to %s", out, aside)
        _check_model(model)
        labelled = lm_labels(args) if self.stage is None else self.stage == "sft"
        evaluates = str(getattr(args.eval_strategy, "value", args.eval_strategy)) != "no"
        if self.rows is not None:
            from ..run.hook_inputs import tokenizer_of
            from .interpolate import encode_task_rows

            encode_task_rows(tokenizer_of(processing_class), self.rows, source=self.data)  # a row it cannot read: now
        elif evaluates and not labelled and self.budget is None and not (record / "budget.json").is_file():
            raise ValueError(f"forgetwatch_rewind: {type(args).__name__}'s eval batches carry no language-model labels, so "
                             "their loss cannot be the task measure: give held-out examples (forgetwatch_rewind_data, a "
                             "JSONL with text, messages, or prompt + completion)")
        self._eval_set = self.rows is None and evaluates and labelled
        if self.rows is None and evaluates and not labelled:
            logger.warning("forgetwatch_rewind: %s's eval batches are no task measure (not language-model examples): "
                           "the pick reads the budget only", self.stage or type(args).__name__)
        if not self._eval_set and self.rows is None and self.budget is None and not (record / "budget.json").is_file():
            raise ValueError("forgetwatch_rewind has nothing to pick α by: no task loss (forgetwatch_rewind_data, or an eval "
                             "set the trainer evaluates: eval_strategy) and no forgetwatch_budget; give one")
        _check_base(record, self.base_cache)

    def on_train_end(self, args, state, control, model=None, processing_class=None, eval_dataloader=None, **kwargs):
        if not state.is_world_process_zero:
            return
        from ..record.store import RunRecord
        from ..run.hook_inputs import tokenizer_of
        from ..run.loggers import make_loggers
        from ..scoring.forward import model_device

        record = Path(args.output_dir) / "forgetwatch"
        scratch = record / "rewind"
        checkpoint = scratch / "checkpoint"
        loggers = []
        try:
            steps = RunRecord(record).committed_steps()
            if not steps or steps[-1] != state.global_step:
                raise InterpolationError(f"the record's last evaluation is at step {steps[-1] if steps else None}, not at "
                                         f"the final step {state.global_step}: add RewindCallback after ForgetWatchCallback "
                                         "in `callbacks`, so that the final evaluation comes first")
            task_loss = None
            if self.rows is None and self._eval_set:
                if eval_dataloader is not None:
                    task_loss = eval_set_loss(eval_dataloader)
                else:
                    logger.warning("forgetwatch rewind: no evaluation ran, so the eval set gives no task loss: the pick "
                                   "reads the budget only")
            if scratch.exists():
                shutil.rmtree(scratch)
            model.save_pretrained(checkpoint)  # the final weights, read back by the sweep; the model itself untouched
            tokenizer_of(processing_class).save_pretrained(checkpoint)
            loggers = make_loggers(args.report_to, args.output_dir, getattr(args, "logging_dir", None))
            self.result = rewind(args.output_dir, checkpoint=checkpoint, base_cache=_base_cache(record, self.base_cache),
                                 alphas=self.alphas, task_data=self.data, task_max_examples=None, task_loss=task_loss,
                                 task_source=EVAL_SET if task_loss is not None else None, heldout=self.heldout,
                                 budget=self.budget, budget_bound=self.budget_bound if self.budget else None,
                                 config=self.config, risk_rule=self.risk_rule, device=str(model_device(model)), force=self.force,
                                 loggers=loggers, step=state.global_step, announce=say if self.console else None)
            shutil.rmtree(scratch)
            if self.console:  # the run's last console line, as each evaluation's (rewind.json and the report keep it)
                say(f"forgetwatch {self.result.line()}")
        except Exception:
            kept = f"the final model is kept at {checkpoint}; " if checkpoint.is_dir() else ""
            logger.exception("forgetwatch: the rewind failed; training is done and its model is as trained (%srewind it "
                             "with `forgetwatch rewind %s%s`)", kept, args.output_dir,
                             f" --checkpoint {checkpoint}" if kept else "")
        finally:
            for lg in loggers:
                lg.close()


def rewind_callback(args: ForgetWatchArguments, stage: str | None = None) -> RewindCallback | None:
    """The `RewindCallback` the options ask for (`forgetwatch_rewind` and its options), or None; add it after the
    `ForgetWatchCallback` built from the same options (`build_remedies` puts it in `Remedies.callbacks`). Refuses what
    cannot work before any model is loaded. `stage`: what the run trains, where its trainer's arguments do not say it.

    Example:
        >>> callbacks = [ForgetWatchCallback.from_args(fw_args)]  # doctest: +SKIP
        >>> callbacks += [cb for cb in [rewind_callback(fw_args)] if cb]  # doctest: +SKIP
    """
    if not args.forgetwatch_rewind:
        for name in ("forgetwatch_rewind_data", "forgetwatch_rewind_heldout"):
            if getattr(args, name):
                logger.warning("forgetwatch: %s does nothing while forgetwatch_rewind is false", name)
        return None
    if not args.forgetwatch_probes:
        raise ValueError("forgetwatch_rewind needs forgetwatch_probes: the step back is judged on the monitored probes")
    if args.forgetwatch_scoring == "sidecar":
        raise ValueError("forgetwatch_rewind needs the final evaluation in the training process, and forgetwatch_scoring="
                         "sidecar leaves it to `forgetwatch watch`: rewind after training with `forgetwatch rewind OUTPUT_DIR`")
    from ..scoring.score import ScoringConfig

    o = args.unprefixed()
    config = ScoringConfig(**{f.name: o[f.name] for f in dataclasses.fields(ScoringConfig) if f.name in o})
    return RewindCallback(args.forgetwatch_rewind_data, args.forgetwatch_rewind_alphas, args.forgetwatch_rewind_heldout,
                          budget=o["budget"], budget_bound=o["budget_bound"], base_cache=o["base_cache"], config=config,
                          risk_rule=RiskRule(o["at_risk_margin"], o["at_risk_drop"]), stage=stage, console=o["console"])


def _free_name(path: Path) -> Path:
    """`path` with the first free suffix: rewound.1, rewound.2, ..."""
    n = 1
    while path.with_name(f"{path.name}.{n}").exists():
        n += 1
    return path.with_name(f"{path.name}.{n}")


def lm_labels(args: Any) -> bool:
    """Whether the trainer's eval batches are language-model examples with `labels` (a plain `Trainer`, TRL's SFT), not
    preference pairs or prompts (TRL's DPO, GRPO, ...)."""
    return not any(c.__name__ in _NO_LM_LABELS for c in type(args).__mro__)


def eval_set_loss(dataloader: Any) -> Callable[[Any], float]:
    """The task measure of a trainer's eval set: a function of the model giving the mean loss per label token over the
    dataloader's batches (each batch's `model(**batch).loss`, weighted by its label tokens).

    Example:
        >>> loss = eval_set_loss(trainer.get_eval_dataloader())  # doctest: +SKIP
        >>> loss(model)  # doctest: +SKIP
        1.2034
    """

    def loss(model: Any) -> float:
        import torch

        from ..scoring.forward import model_device

        names = _forward_names(model)
        device = model_device(model)
        total, count = 0.0, 0
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                for batch in dataloader:
                    if "labels" not in batch:
                        raise InterpolationError("the eval set's batches carry no `labels`, so they have no loss: give "
                                                 "held-out examples (forgetwatch_rewind_data)")
                    n = int((batch["labels"][..., 1:] != -100).sum())
                    if not n:
                        continue
                    inputs = {k: v.to(device) if hasattr(v, "to") else v for k, v in batch.items() if k in names}
                    total += float(model(**inputs).loss.float()) * n
                    count += n
        finally:
            model.train(was_training)
        return total / count if count else float("nan")

    return loss


def _forward_names(model: Any) -> set[str]:
    """The batch keys the model's forward takes (a PEFT model's: its base model's)."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    names = set(inspect.signature(inner.forward).parameters) - {"kwargs", "args"}
    # padding-free batches (TRL) carry these through the forward's **kwargs
    return names | {"cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "seq_idx"}


def _base_cache(record: Path, given: str | None) -> str | None:
    """The base cache the run used: its record's own (written when the base was scored in the run), else the given one."""
    own = record / "base.parquet"
    return str(own) if own.is_file() else given


def _check_model(model: Any) -> None:
    """Refuse, before training, a model interpolation cannot move: quantised weights, a LoRA whose parts α cannot scale."""
    if model is None:
        return
    if getattr(model, "hf_quantizer", None) is not None or getattr(model, "is_quantized", False):
        raise ValueError("forgetwatch_rewind interpolates float weights, and this model is quantised: train a model in "
                         "float, or rewind a dequantised copy with `forgetwatch rewind --checkpoint DIR` after training")
    peft_config = getattr(model, "peft_config", None)
    if isinstance(peft_config, Mapping):
        from .interpolate import check_lora_config

        for name, config in peft_config.items():
            # as adapter_config.json holds it (enums as their values, sets as lists)
            as_dict = json.loads(json.dumps(config.to_dict() if hasattr(config, "to_dict") else dict(vars(config)),
                                            default=lambda v: sorted(v) if isinstance(v, set) else str(v)))
            try:
                check_lora_config(as_dict, f"the adapter {name!r}")
            except InterpolationError as e:
                raise ValueError(f"forgetwatch_rewind: {e}") from None


def _check_base(record: Path, given: str | None) -> None:
    """The base model's weights must be on disk (or on the Hub) at the end: refuse now a base built in memory."""

    path = _base_cache(record, given)
    key = read_key(path) if path else None
    name = (key or {}).get("model", {}).get("name_or_path") if key else None
    if key is not None and not name:
        raise ValueError("forgetwatch_rewind streams the base model's weights from disk, and this model was not loaded from "
                         "a directory or a Hub id (it has no name_or_path): save the base with save_pretrained(DIR) and "
                         "train a model loaded from DIR")
    if name and (name.startswith(("/", "./", "../", "~")) and not Path(name).expanduser().is_dir()):
        raise ValueError(f"forgetwatch_rewind streams the base model's weights from {name}, which is not a directory")
