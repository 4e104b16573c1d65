"""A KL anchor to the base model on pool prompts: the soft form of "penalise 1→0".

Plain SFT minimises a forward KL on the new data only, which lets the mass the base put elsewhere drain away. The
anchor adds, at every training step, `beta · KL(base ‖ model)` over the answer tokens of pool conversations the base
answered itself (`forgetwatch.remedies.BaseOutputs`), read from the base's cached top-k log-probabilities: no second
model in memory. Per answer token the two distributions are compared on the base's top k tokens plus one bucket for
the rest of the vocabulary (a lower bound of the full KL, exact when the base's mass is in its top k).

Pool conversations are drawn at `ratio` of the training examples, in addition to them (the task keeps every example),
by category: uniformly, or toward the categories the monitor sees forgetting (closed loop, the same weights as
`mix_replay`, kept in the record and continued on resume). Each drawn conversation weighs as much as one training
example of the micro-batch: the term added is `beta · Σ_drawn mean_token_KL / batch_size`, so at `beta = 1` the anchor
has the weight replay at the same ratio would have.

Works with `Trainer` and TRL's `SFTTrainer` (any collator, packing, padding-free), under DDP, FSDP and ZeRO (every rank
runs the same number of anchor forwards, on its own draws); `forgetwatch.remedies.add_loss_term` puts it into a trainer
(`build_remedies` builds it from the options):

Example:
    >>> from trl import SFTTrainer
    >>> watch = ForgetWatchCallback(probes="arc_easy,sciq", per_suite=50, eval_steps=20)  # doctest: +SKIP
    >>> outs = load_or_make("base_outputs.parquet", model, tokenizer, "arc_easy,sciq", exclude=watch.probes)  # doctest: +SKIP
    >>> anchor = KLAnchor(outs, beta=1.0, ratio=0.1, monitor=watch, tokenizer=tokenizer)  # doctest: +SKIP
    >>> trainer = SFTTrainer(model=model, args=args, train_dataset=train, callbacks=[watch])  # doctest: +SKIP
    >>> add_loss_term(trainer, anchor)  # doctest: +SKIP
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from ..options import check_beta
from ..scoring.models import architecture_id, model_identity
from .base_outputs import BaseOutputs
from .mixing import STRATEGIES, ReplayMixer, check_pool
from .protocols import MonitorView

__all__ = ["KLAnchor", "check_beta", "topk_kl"]


def topk_kl(logits: torch.Tensor, topk_ids: torch.Tensor, topk_logprobs: torch.Tensor) -> torch.Tensor:
    """KL(base ‖ model) per position, on the base's top-k tokens plus one bucket for the rest.

    Args:
        logits: (T, V) the model's logits at the positions.
        topk_ids: (T, k) the base's top-k token ids there.
        topk_logprobs: (T, k) the base's log-probabilities of them.

    Example:
        >>> logits = torch.tensor([[2.0, 1.0, 0.0]])
        >>> base = torch.log_softmax(logits, -1)
        >>> float(topk_kl(logits, torch.tensor([[0, 1]]), base[:, :2])[0]) < 1e-6  # the model is the base
        True
    """
    logits = logits.float()
    total = torch.logsumexp(logits, dim=-1)
    logp = logits.gather(-1, topk_ids) - total[..., None]
    # the model's mass outside the base's top k, in log space from the logits themselves: 1 - sum(p) in float32 is
    # rounding error (or 0, with no gradient) once the model is sharper than the base
    log_rest_model = torch.logsumexp(logits.scatter(-1, topk_ids, float("-inf")), dim=-1) - total
    log_rest_model = log_rest_model.clamp_min(-80.0)  # k = the whole vocabulary: no mass left, not -inf
    base = topk_logprobs.float()
    p_base = base.exp()
    rest_base = (1 - p_base.sum(-1)).clamp_min(0)
    rest_term = torch.where(rest_base > 0, rest_base * (rest_base.clamp_min(1e-30).log() - log_rest_model),
                            torch.zeros_like(rest_base))
    return (p_base * (base - logp)).sum(-1) + rest_term


class KLAnchor:
    """The anchor's pool, draws and loss term (see the module doc).

    Args:
        outputs: the base's answers to the pool (`forgetwatch.remedies.BaseOutputs`, or a path to them).
        beta: the weight of the KL term (≥ 0; 0 makes the anchor do nothing).
        ratio: pool conversations drawn per training example (> 0; e.g. 0.1).
        strategy: "closed_loop" (toward the categories the monitor sees forgetting) or "uniform".
        monitor: the run's `ForgetWatchCallback`: steers the closed loop, and its probes may not be in the pool.
        floor: in closed loop, the share of draws spread evenly over the categories.
        seed: the seed of every draw.
        tokenizer: the trainer's tokenizer: outputs made with another one are refused before training.
        model: the model trained (or its identity): outputs made by another architecture are refused.
        max_length: the trainer's `max_length`: conversations are cut there; a prompt that fills it is refused.
    """

    def __init__(self, outputs: BaseOutputs | str, beta: float, ratio: float = 0.1, strategy: str = "closed_loop",
                 monitor: MonitorView | None = None, floor: float = 0.1, seed: int = 0, tokenizer: Any = None,
                 model: Any = None, max_length: int | None = None):
        self.beta = check_beta(beta)
        check_draws("the KL anchor", "anchor", "pool conversations", ratio, strategy, monitor)
        if not isinstance(outputs, BaseOutputs):
            outputs = BaseOutputs.load(outputs)
        path = outputs.source
        if tokenizer is None:
            raise ValueError("the KL anchor needs the trainer's `tokenizer`, to check that the base outputs were made with it")
        ident = model if isinstance(model, dict) or model is None else _identity(model)  # a path or name: its config
        outputs.check(ident, tokenizer, path)
        rows = [r for r in outputs.rows if len(r["topk_ids"])]
        if not rows:
            raise ValueError(f"{path}: no answer tokens to anchor on")
        if max_length is not None:
            long = [r["id"] for r in rows if r["start"] >= max_length]
            if long:
                raise ValueError(f"{path}: {len(long)} pool prompts fill max_length={max_length} ({', '.join(long[:5])}): "
                                 "nothing of their answers would be anchored. Raise max_length or make the outputs without them")
        self.outputs, self.ratio, self.max_length = outputs, float(ratio), max_length
        self._seqs = [self._tensors(r) for r in rows]
        by_category: dict[str, list[dict[str, int]]] = {}
        for i, r in enumerate(rows):
            by_category.setdefault(str(r["category"]), []).append({"row": i})
        if monitor is not None:
            wanted = sorted(set(monitor.probes.categories) & set(by_category))
            check_pool([r["id"] for r in rows], monitor.probes.ids)
            if not wanted:
                raise ValueError(f"{path}: none of the pool's categories ({', '.join(sorted(by_category))}) is monitored, "
                                 "so the loop cannot weigh them")
            by_category = {c: by_category[c] for c in wanted}
        # the draws by category, published weights and their schedule: the machinery of replay mixing, so the callback
        # steers, records and restores the anchor as it does a replay stream
        self.sampler = ReplayMixer([{}], by_category, 0.0, strategy=strategy, floor=floor, seed=seed)
        self.sampler.ratio = self.ratio  # what the record shows; the anchor's draws do not use the stream
        self.sampler.kind = f"kl anchor: beta {self.beta}"
        if monitor is not None:
            monitor.attach_mixer(self.sampler)
        self._kl_sum, self._kl_n = 0.0, 0

    def _tensors(self, r: dict[str, Any]) -> tuple[torch.Tensor, int, torch.Tensor, torch.Tensor]:
        ids = list(r["input_ids"])
        n_answer = len(r["topk_ids"])
        if self.max_length is not None and len(ids) > self.max_length:
            ids = ids[: self.max_length]
            n_answer = max(0, self.max_length - r["start"])
        return (torch.tensor(ids, dtype=torch.long), int(r["start"]),
                torch.as_tensor(np.asarray(r["topk_ids"][:n_answer]), dtype=torch.long),
                torch.as_tensor(np.asarray(r["topk_logprobs"][:n_answer]), dtype=torch.float32))

    def draws(self, micro_batch: int, batch_size: int) -> list[int]:
        """The pool rows drawn for micro-batch `micro_batch` (counted from the start of training) of `batch_size`
        examples: `ratio` per example on every prefix of the run (the same count on every rank, each its own rows)."""
        return draw_rows(self.sampler, self.ratio, micro_batch, batch_size)

    def loss(self, model: Any, micro_batch: int, batch_size: int) -> torch.Tensor | None:
        """`beta · Σ mean-token KL / batch_size` over this micro-batch's draws, or None when it draws none."""
        rows = self.draws(micro_batch, batch_size)
        if not rows or self.beta == 0:
            return None
        seqs = [self._seqs[i] for i in rows]
        device = next(model.parameters()).device
        width = max(len(s[0]) for s in seqs)
        ids = torch.zeros((len(seqs), width), dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for j, (x, _, _, _) in enumerate(seqs):
            ids[j, : len(x)], mask[j, : len(x)] = x, 1
        logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits
        total = logits.new_zeros((), dtype=torch.float32)
        for j, (_, start, top_ids, top_lp) in enumerate(seqs):
            span = logits[j, start - 1: start - 1 + len(top_ids)]
            kl = topk_kl(span, top_ids.to(device), top_lp.to(device)).mean()
            self._kl_sum, self._kl_n = self._kl_sum + float(kl.detach()), self._kl_n + 1
            total = total + kl
        return self.beta * total / batch_size

    def pop_mean_kl(self) -> float | None:
        """The mean per-token KL of the conversations anchored since the last call (for the trainer's logs)."""
        if not self._kl_n:
            return None
        mean, self._kl_sum, self._kl_n = self._kl_sum / self._kl_n, 0.0, 0
        return mean

    def pop_logs(self) -> dict[str, float]:
        """What the trainer's logs get since the last call: `anchor_kl`."""
        kl = self.pop_mean_kl()
        return {} if kl is None else {"anchor_kl": round(kl, 6)}


def check_draws(what: str, noun: str, items: str, ratio: Any, strategy: str, monitor: MonitorView | None) -> None:
    """Refuse a loss term's draw settings (the KL anchor's, the 1→0 penalty's), saying what to change."""
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio <= 8:
        raise ValueError(f"{what}'s `ratio` ({items} per training example) must be in (0, 8], got {ratio!r}")
    if strategy not in STRATEGIES:
        raise ValueError(f"`strategy` must be one of {', '.join(STRATEGIES)}; got {strategy!r}")
    if strategy == "closed_loop" and monitor is None:
        raise ValueError(f"a closed-loop {noun} follows a monitor: pass `monitor=` (the run's ForgetWatchCallback), or use "
                         "strategy='uniform'")


def draw_rows(sampler: ReplayMixer, ratio: float, micro_batch: int, batch_size: int) -> list[int]:
    """The pool rows a loss term (the KL anchor, the 1→0 penalty) draws for micro-batch `micro_batch` of `batch_size`
    examples: `ratio` per example on every prefix of the run, the same count on every rank (FSDP and ZeRO need every
    rank to run as many forwards), each rank its own positions of the sampler's stream, by its category weights."""
    per = ratio * batch_size
    first, last = math.floor(micro_batch * per), math.floor((micro_batch + 1) * per)
    rank, world = _rank_world()
    out = []
    for n in range(first, last):
        position = n * world + rank
        sampler._read = max(sampler._read, position)
        cat, i = sampler.draw(position)
        out.append(sampler.pool[cat][i]["row"])
    return out


def _identity(model: Any) -> dict[str, Any]:
    import os


    if isinstance(model, (str, os.PathLike)):
        from transformers import AutoConfig

        return {"architecture": architecture_id(AutoConfig.from_pretrained(str(model)))}
    return model_identity(getattr(model, "module", model))


def _rank_world() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1
