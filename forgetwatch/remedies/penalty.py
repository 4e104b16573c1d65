"""An explicit 1→0 penalty: push back when a probe the base knew loses its margin.

Harmon et al. end on "objectives that explicitly penalise 1→0" as the first next step. `MarginPenalty` does that on a
pool of held-out multiple-choice items (the rest of the monitored suites, never the monitored probes): at every training
micro-batch it draws pool items at `ratio` per training example (by category: toward the categories the monitor sees
forgetting, or uniformly, the same machinery and record as replay), reads the current model's margin on each in the
scoring form (the gold option's summed log-likelihood after the question minus the best wrong option's, as
`mcq_mode="loglik"` scores it), and adds

    beta · Σ_drawn max(0, min(margin_base, floor) − margin_now) / batch_size

for the items the base answered right: nothing while an item keeps the margin it had (or `floor` nats, whichever is
smaller), a pull back as it slips toward a flip. Items the base got wrong are drawn and run like the others (every rank
runs the same forwards, as FSDP and ZeRO need) and weigh 0.

**What beta means** (`scale`). A margin is a sum of log-likelihoods over an option's tokens, and the hinge's gradient
is tens of times the task loss's (RESULTS §18: a norm of 41–339 at beta 1 against 3.2). Under gradient clipping
(`max_grad_norm`, 1.0 by default) a step where it pulls is then the penalty's alone, whatever beta: §18's beta 1 and 3
trained the same models. With `scale="task_gradient"` (the default) the term is rescaled at each micro-batch where it
pulls so that its gradient's norm is beta times the task loss's gradient norm at that micro-batch, both measured on
the trainable parameters (one more backward of each, only there; averaged over data-parallel ranks); clipping then
scales both alike, and beta is the penalty's share of the step: 1 pulls as hard as the task pushes. `scale="loss"`
keeps beta as the hinge's weight in nats (§18's runs). Under FSDP or DeepSpeed the parameters are sharded and their
gradients are not whole on a rank: there use `scale="loss"`.

The base's margins are read from the model itself at the first training micro-batch, before any optimizer step (it
is the base then), through the same forward as the margins they are compared with: the same padding, and the trainer's
own precision (under bf16 mixed precision the scoring form's packed forward rounds differently, and the penalty would
pull at the base itself). On every rank; kept in `<output_dir>/forgetwatch/penalty_base.json` and in every checkpoint,
for a resumed run.

Use it as the KL anchor is used: `add_loss_term(trainer, penalty)` (which also adds it to the trainer's callbacks:
it reads the base's margins when training begins); `build_remedies` builds it from the options.

Example:
    >>> watch = ForgetWatchCallback(probes="arc_easy,sciq", per_suite=50, eval_steps=20)  # doctest: +SKIP
    >>> penalty = MarginPenalty("arc_easy,sciq", beta=1.0, monitor=watch, tokenizer=tokenizer)  # doctest: +SKIP
    >>> trainer = SFTTrainer(model=model, args=args, train_dataset=train, callbacks=[watch, penalty])  # doctest: +SKIP
    >>> add_loss_term(trainer, penalty)  # doctest: +SKIP
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from .._io import atomic_write, read_json_or_none
from ..run.launch import uses_deepspeed, uses_fsdp
from ..scoring.modes import ScoringConfig
from ..scoring.prompts import loglik_request
from ..scoring.requests import encode
from .anchor import check_beta, check_draws, draw_rows
from .mixing import ReplayMixer
from .protocols import MonitorView

__all__ = ["MarginPenalty", "BASE_FILE"]

logger = logging.getLogger(__name__)

BASE_CHUNK = 16  # pool items a forward when the base's margins are read (every rank runs the same chunks)
BASE_FILE = "penalty_base.json"  # under <output_dir>/forgetwatch/: the base's margins, for a resumed run
SCALES = ("task_gradient", "loss")  # what beta means (see the module doc)


class MarginPenalty(TrainerCallback):
    """The 1→0 penalty's pool, draws, base margins and loss term (see the module doc).

    Args:
        pool: suite names (every probe of them but the monitored ones), a probe file or a `ProbeSet`; its multiple-choice
            items are used.
        beta: the weight of the term (≥ 0; 0 makes it do nothing).
        ratio: pool items drawn per training example (> 0; e.g. 0.1).
        floor: the margin (nats) worth defending: an item is pulled back when its margin falls below its base margin or
            this, whichever is smaller (2 nats: the at-risk rule's threshold, RESULTS §7; `math.inf`: always the base's
            own margin).
        strategy: "closed_loop" (toward the categories the monitor sees forgetting) or "uniform".
        monitor: the run's `ForgetWatchCallback`: steers the closed loop, and its probes are held out of the pool.
        tokenizer: the trainer's tokenizer.
        seed: the seed of every draw.
        max_length: the trainer's `max_length`: items longer than it are left out (with a warning).
        per_category: at most this many items per category (a seeded draw: the suites hold thousands, and the base's
            margins are read on every item at the first micro-batch); None for all.
        scale: "task_gradient" (beta is the penalty's gradient norm relative to the task loss's where it pulls) or
            "loss" (beta weighs the hinge in nats); see the module doc.
    """

    def __init__(self, pool: Any, beta: float, ratio: float = 0.1, floor: float = 2.0, strategy: str = "closed_loop",
                 monitor: MonitorView | None = None, tokenizer: Any = None, seed: int = 0, max_length: int | None = None,
                 per_category: int | None = 100, scale: str = "task_gradient"):
        from .base_outputs import pool_probes

        self.beta = check_beta(beta, "the 1→0 penalty")
        if scale not in SCALES:
            raise ValueError(f"the 1→0 penalty's `scale` must be one of {', '.join(SCALES)}, got {scale!r}")
        self.scale = scale
        check_draws("the 1→0 penalty", "penalty", "pool items", ratio, strategy, monitor)
        if isinstance(floor, bool) or not isinstance(floor, (int, float)) or math.isnan(floor) or floor <= 0:
            raise ValueError(f"the 1→0 penalty's `floor` (the margin in nats worth defending) must be > 0 (math.inf: "
                             f"always the base's own margin), got {floor!r}")
        if tokenizer is None:
            raise ValueError("the 1→0 penalty needs the trainer's `tokenizer` (it reads margins in the scoring form)")
        if monitor is not None and monitor.config.mcq_mode != "loglik":
            # the margin defended is the summed log-likelihood's; another form's flips need not follow it
            logger.warning("forgetwatch: the monitor scores multiple choice by %r, and the 1→0 penalty defends the "
                           "summed log-likelihood margin (loglik): it pushes back on another margin than the one whose "
                           "1→0 flips are counted. Monitor with forgetwatch_mcq_mode loglik to measure what it defends",
                           monitor.config.mcq_mode)
        items = [p for p in pool_probes(pool, exclude=monitor.probes if monitor is not None else None) if p.kind == "mcq"]
        if not items:
            raise ValueError(f"the 1→0 penalty's pool ({pool}) holds no multiple-choice items: margins need options")
        if monitor is not None:
            wanted = set(monitor.probes.categories)
            if not wanted & {p.category for p in items}:
                raise ValueError(f"none of the pool's categories ({', '.join(sorted({p.category for p in items}))}) is "
                                 "monitored, so the loop cannot weigh them")
            items = [p for p in items if p.category in wanted]
        if per_category is not None:
            rank = {p.id: hashlib.sha256(f"{seed}\0{p.id}".encode()).hexdigest() for p in items}
            chosen: dict[str, list[str]] = {}
            for p in sorted(items, key=lambda p: rank[p.id]):
                if len(chosen.setdefault(p.category, [])) < per_category:
                    chosen[p.category].append(p.id)
            keep = {i for ids in chosen.values() for i in ids}
            items = [p for p in items if p.id in keep]
        by_category: dict[str, list[dict[str, int]]] = {}
        for i, p in enumerate(items):
            by_category.setdefault(p.category, []).append({"row": i})
        self.items, self.floor, self.ratio, self.tokenizer = items, float(floor), float(ratio), tokenizer
        # the monitor's prompt form (its chat template setting and system prompt), so that margins are read as it reads them
        self.config = ScoringConfig(mcq_mode="loglik", chat_template=monitor.config.chat_template if monitor else None,
                                    system_prompt=monitor.config.system_prompt if monitor else None)
        encoded = [self._encode(p) for p in items]
        if max_length is not None:  # the trainer never sees longer rows: such items are left out, said once
            fits = [len(ctx) + max(map(len, toks)) <= max_length for ctx, toks in encoded]
            if not all(fits):
                logger.warning("forgetwatch: the 1→0 penalty leaves out %d of its %d pool items, longer than max_length=%d "
                               "tokens (first: %s)", fits.count(False), len(items), max_length,
                               next(p.id for p, ok in zip(items, fits, strict=True) if not ok))
                items = [p for p, ok in zip(items, fits, strict=True) if ok]
                encoded = [e for e, ok in zip(encoded, fits, strict=True) if ok]
            if not items:
                raise ValueError(f"every item of the 1→0 penalty's pool is longer than max_length={max_length} tokens: "
                                 "raise max_length or choose another pool")
            by_category = {}
            for i, p in enumerate(items):
                by_category.setdefault(p.category, []).append({"row": i})
            self.items = items
        self._tokens = encoded
        self.sampler = ReplayMixer([{}], by_category, 0.0, strategy=strategy, floor=0.1, seed=seed)
        self.sampler.ratio = self.ratio
        self.sampler.kind = f"1→0 penalty: beta {self.beta}"
        if monitor is not None:
            monitor.attach_mixer(self.sampler)
        self.base_margin: np.ndarray | None = None  # per item; NaN where the base was wrong (no penalty there)
        self._base_at: tuple[Path, bool] | None = None  # (where to keep them, main process?) until they are read
        self._saved: dict[str, Any] | None = None  # what penalty_base.json holds, once the margins are known
        self._resume_dir: str | os.PathLike | None = None  # the checkpoint a resume reads (add_loss_term says)
        self._sum, self._n, self._active = 0.0, 0, 0
        self._ratios: list[float] = []  # the hinge's gradient norm over the task loss's, where it pulled (task_gradient)
        self._warned = False

    # -- the base's margins -------------------------------------------------------------------------------------
    def on_train_begin(self, args, state, control, model=None, processing_class=None, **kwargs):
        if self.scale == "task_gradient" and self.beta:
            if _sharded(args, model):
                raise ValueError("the 1→0 penalty's scale task_gradient measures the task loss's and the penalty's "
                                 "gradients on whole parameters, and under FSDP / DeepSpeed a rank holds shards of them: "
                                 "set forgetwatch_penalty_scale loss (MarginPenalty(scale='loss')) and choose beta for "
                                 "it, or train with data parallelism (DDP)")
            if _reentrant_checkpointing(args, model):
                raise ValueError(REENTRANT)
        path = Path(args.output_dir) / "forgetwatch" / BASE_FILE
        ids = [p.id for p in self.items]
        if state.global_step > 0 and self.beta == 0:  # off: no margins were read, none are needed
            return
        if state.global_step > 0:  # resumed: the model is no longer the base
            # the checkpoint's own copy first (it belongs to the run being resumed), then this output_dir's
            places = [Path(self._resume_dir) / BASE_FILE] if self._resume_dir else []
            places += [Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}" / BASE_FILE, path]
            found = [(p, saved) for p in dict.fromkeys(places) if (saved := read_json_or_none(p)) is not None]
            match = next((saved for _, saved in found if saved.get("ids") == ids), None)
            if match is None:
                raise ValueError(f"resuming at step {state.global_step} needs the base's margins on the penalty's pool "
                                 f"({BASE_FILE}, kept in every checkpoint and in <output_dir>/forgetwatch; the model has "
                                 "changed since), and "
                                 + (f"{', '.join(str(p) for p, _ in found)} holds them for another pool" if found else
                                    "none is in " + ", ".join(str(p) for p in places))
                                 + f": resume with the same pool, copy {BASE_FILE} from the first run's "
                                 "output_dir/forgetwatch or checkpoint, or start the run again")
            self.base_margin = np.array([math.nan if m is None else m for m in match["margin"]], np.float64)
            if match.get("scale", "loss") != self.scale:  # runs before the option weighed the hinge in nats
                logger.warning("forgetwatch: this run started with the 1→0 penalty's scale %s and resumes with %s: "
                               "beta means another thing from step %d on (forgetwatch_penalty_scale)",
                               match.get("scale", "loss"), self.scale, state.global_step)
            self._saved = {**match, "scale": self.scale}
            if state.is_world_process_zero and not path.is_file():
                _write(path, match)  # this output_dir keeps them too
            return
        self.base_margin = None
        self._base_at = (path, state.is_world_process_zero)  # read at the first micro-batch (see the module doc)

    def resuming_from(self, checkpoint: str | os.PathLike | None) -> None:
        """The checkpoint `trainer.train(resume_from_checkpoint=...)` reads (`add_loss_term` tells it): a resume
        takes the base's margins from it first."""
        self._resume_dir = checkpoint

    def save_to_checkpoint(self, directory: str | os.PathLike) -> None:
        """Keep the base's margins in a checkpoint (`add_loss_term` calls it), so that it resumes wherever it
        is copied."""
        if self._saved is None:
            return
        try:
            _write(Path(directory) / BASE_FILE, self._saved)
        except OSError as e:  # this output_dir's copy still serves a resume in place: not worth the run
            logger.warning("forgetwatch: could not write %s into %s (%s)", BASE_FILE, directory, e)

    @torch.no_grad()
    def _read_base(self, model: Any) -> None:
        """The base's margins on every pool item, in the training forward's form and precision (eval mode: no
        dropout), in chunks; NaN where the base is wrong (argmax over the options, exact ties to the lowest index)."""
        path, main = self._base_at
        was_training = model.training
        model.eval()
        try:
            margins = []
            for i in range(0, len(self.items), BASE_CHUNK):
                rows = list(range(i, min(i + BASE_CHUNK, len(self.items))))
                for r, scores in zip(rows, self._option_scores(model, rows), strict=True):
                    s = scores.double().cpu().numpy()
                    gold = self.items[r].gold
                    right = np.isfinite(s).all() and int(np.argmax(s)) == gold
                    margins.append(float(s[gold] - np.delete(s, gold).max()) if right else math.nan)
        finally:
            model.train(was_training)
        self.base_margin = np.array(margins, np.float64)
        self._base_at = None
        self._saved = {"ids": [p.id for p in self.items],
                       "margin": [None if math.isnan(m) else float(m) for m in self.base_margin],
                       "floor": self.floor if math.isfinite(self.floor) else None,  # strict JSON: no Infinity
                       "scale": self.scale}
        if main:
            _write(path, self._saved)

    # -- the loss term ------------------------------------------------------------------------------------------
    def draws(self, micro_batch: int, batch_size: int) -> list[int]:
        """The pool items drawn for micro-batch `micro_batch` of `batch_size` examples (as the KL anchor draws)."""
        return draw_rows(self.sampler, self.ratio, micro_batch, batch_size)

    def margins(self, model: Any, rows: list[int]) -> torch.Tensor:
        """The current model's margin on each item (differentiable): the gold option's summed log-likelihood after the
        question minus the best wrong option's, one row per option."""
        out = []
        for r, s in zip(rows, self._option_scores(model, rows), strict=True):
            gold = self.items[r].gold
            out.append(s[gold] - torch.cat([s[:gold], s[gold + 1 :]]).max())
        return torch.stack(out)

    def _option_scores(self, model: Any, rows: list[int]) -> list[torch.Tensor]:
        """Each item's options' summed log-likelihoods after its question, one padded row per option."""
        seqs, spans, owner = [], [], []
        for r in rows:
            ctx, options = self._tokens[r]
            for toks in options:
                seqs.append(ctx + toks)
                spans.append((len(ctx), len(ctx) + len(toks)))
                owner.append(r)
        device = next(model.parameters()).device
        width = max(len(s) for s in seqs)
        ids = torch.zeros((len(seqs), width), dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for j, s in enumerate(seqs):
            ids[j, : len(s)], mask[j, : len(s)] = torch.tensor(s), 1
        logp = torch.log_softmax(model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits.float(), dim=-1)
        scores = [logp[j, a - 1 : b - 1].gather(-1, ids[j, a:b].to(device)[:, None]).sum() for j, (a, b) in enumerate(spans)]
        out, k = [], 0
        for r in rows:
            n = len(self._tokens[r][1])
            out.append(torch.stack(scores[k : k + n]))
            k += n
        return out

    def loss(self, model: Any, micro_batch: int, batch_size: int) -> torch.Tensor | None:
        """`beta · Σ hinge / batch_size` over this micro-batch's draws, or None when it draws none."""
        if self.beta == 0:  # off: no forward at all, not even the base's
            return None
        if self.base_margin is None:
            if self._base_at is None:
                raise RuntimeError("MarginPenalty: on_train_begin did not run; add it with `add_loss_term(trainer, penalty)` "
                                   "(which adds it to the trainer's callbacks too)")
            self._read_base(model)
        rows = self.draws(micro_batch, batch_size)
        if not rows:
            return None
        now = self.margins(model, rows)
        base = torch.as_tensor(self.base_margin[rows], dtype=torch.float32, device=now.device)
        known = torch.isfinite(base)
        target = torch.clamp(torch.nan_to_num(base, nan=0.0), max=self.floor)
        hinge = torch.where(known, torch.relu(target - now), torch.zeros_like(now))
        n = int(known.sum())
        if n:
            self._sum, self._n = self._sum + float(hinge.detach()[known].sum()), self._n + n
            self._active += int((hinge.detach() > 0).sum())
        return self.beta * hinge.sum() / batch_size

    def rescale(self, term: torch.Tensor, task_loss: torch.Tensor, model: Any) -> torch.Tensor:
        """The term as it joins the loss (`add_loss_term` calls this with the trainer's loss of the same micro-batch,
        both weighted as they will be summed): with `scale="task_gradient"` and a hinge that pulls, multiplied by a
        constant (no gradient flows through it) so that its gradient's norm is beta times the task loss's."""
        if self.scale != "task_gradient" or not term.requires_grad:
            return term
        ranks = torch.distributed.is_available() and torch.distributed.is_initialized()
        pulls = term.detach().float().reshape(1)
        if ranks:
            # Every rank draws at the same micro-batches (so each gets here), whether or not its own hinge pulls: the
            # same decision and one factor for all.
            torch.distributed.all_reduce(pulls, op=torch.distributed.ReduceOp.SUM)
        if float(pulls) == 0.0:
            return term  # nothing pulls anywhere: its gradient is zero whatever its scale
        if task_loss.dim() > 0:  # nn.DataParallel returns one loss per device; the trainer backpropagates their mean
            task_loss = task_loss.mean()
        params = [p for p in model.parameters() if p.requires_grad]
        norms = torch.stack([_grad_norm(task_loss, params), _grad_norm(term, params)]).pow(2)
        if ranks:  # the root mean square of the ranks' norms (each rank's own micro-batch)
            torch.distributed.all_reduce(norms, op=torch.distributed.ReduceOp.SUM)
            norms = norms / torch.distributed.get_world_size()
        task_norm, term_norm = norms.sqrt().tolist()
        if not (math.isfinite(task_norm) and math.isfinite(term_norm) and task_norm > 0):
            # no scale to set it by (an overflow, or a task gradient that vanished): this micro-batch goes without the
            # penalty rather than with the nats weighting, which would outweigh the task
            if not self._warned:
                logger.warning("forgetwatch: the 1→0 penalty skipped a micro-batch: the task loss's gradient norm was "
                               "%s and the penalty's %s (said once)", task_norm, term_norm)
                self._warned = True
            return term * 0.0
        if term_norm == 0.0:
            return term
        self._ratios.append(term_norm / self.beta / task_norm)
        return term * (self.beta * task_norm / term_norm)

    def pop_logs(self) -> dict[str, float]:
        """For the trainer's logs since the last call: the mean hinge (nats) over drawn items the base knew, the share
        of them pulled back (margin below its target), and (task_gradient) the median of the hinge's own gradient norm
        over the task loss's where it pulled, before rescaling: how far the loss weighting would have put it off."""
        out = {}
        if self._n:
            out = {"penalty_hinge": round(self._sum / self._n, 6), "penalty_active": round(self._active / self._n, 4)}
        if self._ratios:
            out["penalty_grad_ratio"] = round(float(np.median(self._ratios)), 4)
        self._sum, self._n, self._active, self._ratios = 0.0, 0, 0, []
        return out

    def _encode(self, probe: Any) -> tuple[list[int], list[list[int]]]:
        """Token ids as log-likelihood scoring builds them (`forgetwatch.scoring.engines.hf`): the question, then each option
        as encode(context + option) past the context's tokens."""
        chat = self.config.uses_chat(self.tokenizer, generative=False)
        context, options = loglik_request(probe, self.tokenizer, chat, self.config.system_prompt)
        ctx = encode(self.tokenizer, [context], chat)[0]
        whole = encode(self.tokenizer, [context + o for o in options], chat)
        return ctx, [w[len(ctx):] or w[-1:] for w in whole]


REENTRANT = ("the 1→0 penalty's scale task_gradient measures gradients with torch.autograd.grad, which reentrant "
             "activation checkpointing (use_reentrant=True) does not support: set gradient_checkpointing_kwargs="
             "{'use_reentrant': False} (transformers' default), turn checkpointing off, or set forgetwatch_penalty_scale "
             "loss")


def _grad_norm(loss: torch.Tensor, params: list[torch.Tensor]) -> torch.Tensor:
    """The norm of `loss`'s gradient on `params`, keeping the graph for the backward that follows (nothing is
    accumulated into `.grad`; the gradients live until the norm is taken: one more copy of the trainable parameters'
    gradients at peak)."""
    try:
        grads = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
    except RuntimeError as e:
        if "checkpoint" in str(e):
            raise ValueError(REENTRANT) from e
        raise
    squares = [g.detach().float().pow(2).sum().to(loss.device) for g in grads if g is not None]  # devices may differ
    return torch.stack(squares).sum().sqrt() if squares else torch.zeros((), device=loss.device)


def _reentrant_checkpointing(args: Any, model: Any = None) -> bool:
    """Reentrant activation checkpointing: asked for in the trainer's arguments, or already set on the model's layers
    (transformers < 5 makes `gradient_checkpointing=True` reentrant when no kwargs say otherwise, and a front-end may
    enable it on the model itself). Each checkpointed layer holds `functools.partial(checkpoint, use_reentrant=...)`."""
    if getattr(args, "gradient_checkpointing", False) and (
            (getattr(args, "gradient_checkpointing_kwargs", None) or {}).get("use_reentrant") is True):
        return True
    for module in model.modules() if model is not None else ():
        func = getattr(module, "_gradient_checkpointing_func", None)
        if isinstance(func, functools.partial) and func.keywords.get("use_reentrant") is True:
            return True
    return False


def _sharded(args: Any, model: Any = None) -> bool:
    """FSDP or DeepSpeed: in the trainer's arguments, in `accelerate launch`'s configuration (`forgetwatch.run.launch`),
    or in the parameters themselves (FSDP2's DTensors, ZeRO-3's partitioned ones)."""
    if uses_fsdp(args) or uses_deepspeed(args):
        return True
    params = list(model.parameters())[:1] if model is not None else []
    return any(type(p).__name__ == "DTensor" or hasattr(p, "ds_id") for p in params)


def _write(path: Path, saved: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path) as f:
        f.write(json.dumps(saved) + "\n")
