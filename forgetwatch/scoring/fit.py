"""Does a probe set fit a model's context? Measured before anything is scored, from the tokenizer and the model's
config alone: a probe set that cannot be scored is refused before training starts (or its probes that do not fit are
dropped, with `unfit_probes="drop"`).

A probe's length is what scoring puts in front of the model: its prompt and longest option (log-likelihood), its
prompt and the letter (letters), or its prompt and the tokens it may generate (generation, behaviour probes). They are
measured by running the scoring modes' own request building (`forgetwatch.scoring.modes`) against an engine that counts tokens
as `HFEngine` does and runs no model, so the measure follows the prompts wherever they change.

Example:
    >>> fit = measure_fit(model, tokenizer, probes, ScoringConfig())  # doctest: +SKIP
    >>> fit.limit, len(fit.unfit), fit.longest_by_suite()  # doctest: +SKIP
    (2048, 0, {'arc_easy': 132, 'mmlu': 1653})
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .._io import atomic_write
from ..errors import ProbeSetError
from ..probes.probe_set import Probe, ProbeSet
from ..probes.variants import SEP as VARIANT_SEP
from .lengths import context_limit, screen_long
from .requests import Answer, Continuations, GenerateRequest, LoglikRequest, NextTokenRequest, encode

__all__ = ["ProbeFit", "context_limit", "drop_unfit", "measure_fit", "probe_lengths", "screen_long", "write_dropped"]

logger = logging.getLogger(__name__)


class _Measure:
    """An `Engine` that runs no model: it records, per probe id, the most tokens a request of that probe puts before
    the model (the lengths `HFEngine._check_context` checks), and answers with placeholders the modes can judge."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.need: dict[str, int] = {}
        eos = getattr(tokenizer, "eos_token_id", None)
        self.eos_token_ids = [eos] if isinstance(eos, int) else []

    def _note(self, probe_id: str | None, n: int) -> None:
        if probe_id is not None:
            self.need[probe_id] = max(n, self.need.get(probe_id, 0))

    def running(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def max_over_ranks(self, n: int) -> int:
        return n

    def loglik(self, requests: Sequence[LoglikRequest], *, chat: bool, read_next: bool = False, shared: str | None = None,
               bar: Any = None) -> list[Continuations]:
        ctx_ids = encode(self.tokenizer, [r.context for r in requests], chat)
        whole = encode(self.tokenizer, [r.context + o for r in requests for o in r.continuations], chat)
        out, k = [], 0
        for r, ctx in zip(requests, ctx_ids, strict=True):
            mine = whole[k : k + len(r.continuations)]
            k += len(r.continuations)
            self._note(r.probe_id, max(len(w) for w in mine) + int(read_next))
            tokens = [w[len(ctx):] or w[-1:] for w in mine]  # an option merged into the context's last token: that token
            out.append(Continuations(tokens, [np.zeros(len(t)) for t in tokens],
                                     [np.zeros(len(t) + int(read_next), np.int64) for t in tokens]))
        return out

    def next_token_logprobs(self, requests: Sequence[NextTokenRequest], *, chat: bool, bar: Any = None) -> list[np.ndarray]:
        for r, ids in zip(requests, encode(self.tokenizer, [r.context for r in requests], chat), strict=True):
            self._note(r.probe_id, len(ids) + 1)
        return [np.zeros(len(r.token_ids)) for r in requests]

    def generate(self, requests: Sequence[GenerateRequest], *, chat: bool, bar: Any = None) -> list[Answer]:
        for r, ids in zip(requests, encode(self.tokenizer, [r.prompt for r in requests], chat), strict=True):
            self._note(r.probe_id, len(ids) + r.max_new_tokens)
        return [Answer("", 0, True) for _ in requests]


def probe_lengths(tokenizer: Any, probes: Sequence[Probe], config: Any = None) -> dict[str, int]:
    """Per probe id, the most tokens scoring it under `config` (a `ScoringConfig`) puts before the model: its prompt
    with its longest option, its letter, or the tokens it may generate.

    Example:
        >>> probe_lengths(tokenizer, load_probes("arc_easy", per_suite=5))  # doctest: +SKIP
        {'arc_easy/Mercury_7220990': 41, ...}
    """
    from .score import score_probes

    engine = _Measure(tokenizer)
    score_probes(None, tokenizer, list(probes), config, engine=engine)
    return engine.need


@dataclass(frozen=True)
class ProbeFit:
    """How a probe set fits a model's context: each probe's length in tokens, the limit (None: unknown, all fit) and
    the probes over it."""

    lengths: dict[str, int]
    limit: int | None
    suites: dict[str, str]  # probe id -> its suite (`source`, else its category)
    # probes whose question's first characters alone are over the context: their length is a lower bound (`screen_long`)
    at_least: frozenset[str] = frozenset()

    def tokens(self, pid: str) -> str:
        """A probe's length as said: `1,653 tokens`, or `over 8,256 tokens` for one only its prefix was measured of."""
        return f"over {self.lengths[pid]:,} tokens" if pid in self.at_least else f"{self.lengths[pid]:,} tokens"

    @property
    def unfit(self) -> list[str]:
        """The probes (and variants) longer than the context, longest first."""
        if self.limit is None:
            return []
        return sorted((pid for pid, n in self.lengths.items() if n > self.limit), key=lambda p: -self.lengths[p])

    def longest_by_suite(self) -> dict[str, int]:
        """Per suite, its longest probe in tokens."""
        out: dict[str, int] = {}
        for pid, n in self.lengths.items():
            suite = self.suites.get(pid, "")
            out[suite] = max(n, out.get(suite, 0))
        return out

    def refusal(self, option: str = "unfit_probes") -> ProbeSetError:
        """The error that refuses this set: which probes, of which suites, the context, and the ways out."""
        over = self.unfit
        listed = ", ".join(f"{pid} ({self.tokens(pid)})" for pid in over[:3]) + (" ..." if len(over) > 3 else "")
        total: dict[str, int] = {}
        bad: dict[str, int] = {}
        for pid, suite in self.suites.items():
            if pid in self.lengths:
                total[suite] = total.get(suite, 0) + 1
        for pid in over:
            bad[self.suites.get(pid, "")] = bad.get(self.suites.get(pid, ""), 0) + 1
        longest = self.longest_by_suite()
        lower = {self.suites.get(pid, "") for pid in self.at_least if self.lengths[pid] == longest[self.suites.get(pid, "")]}
        per_suite = "; ".join(f"{s or 'probes'}: {bad.get(s, 0)} of {total[s]} over, longest "
                              f"{'over ' if s in lower else ''}{longest[s]:,}"
                              for s in sorted(total, key=lambda s: -bad.get(s, 0)))
        fitting = [s for s in total if s and not bad.get(s)]
        return ProbeSetError(
            f"{len(over)} of {len(self.lengths)} probe(s) do not fit the model's context of {self.limit:,} tokens "
            f"(what scoring puts before the model: the prompt and the longest answer or the generated tokens): {listed}. "
            f"Per suite: {per_suite}. Either score suites whose probes fit"
            + (f" (here: {', '.join(fitting)})" if fitting else "")
            + f" or a model with a longer context, or set `{option}='drop'` (forgetwatch_{option}: drop) to score "
            f"without these {len(over)} probe(s), with a warning")


def measure_fit(model: Any, tokenizer: Any, probes: Sequence[Probe], config: Any = None) -> ProbeFit:
    """How `probes` (with any variants, as scored) fit `model`'s context under `config`; nothing runs the model.

    Example:
        >>> fit = measure_fit(model, tokenizer, probes, ScoringConfig())  # doctest: +SKIP
        >>> if fit.unfit: raise fit.refusal()  # doctest: +SKIP
    """
    limit = context_limit(model)
    probes = list(probes)
    suites = {p.id: p.source or p.category for p in probes}
    if limit is None:
        return ProbeFit({}, limit, suites)
    over = screen_long(tokenizer, probes, limit)
    lengths = probe_lengths(tokenizer, [p for p in probes if p.id not in over], config)
    return ProbeFit({**lengths, **over}, limit, suites, frozenset(over))


def drop_unfit(probes: ProbeSet, fit: ProbeFit, *, warn: bool = True) -> tuple[ProbeSet, dict[str, int]]:
    """`probes` without those that do not fit (`unfit_probes="drop"`; a variant that does not fit drops its probe), and
    the dropped probes' lengths in tokens; said in one warning, per suite. Refuses when nothing would be left.

    Example:
        >>> kept, dropped = drop_unfit(probes, measure_fit(model, tokenizer, probes))  # doctest: +SKIP
    """
    drop = {pid.split(VARIANT_SEP)[0] for pid in fit.unfit}
    if not drop:
        return probes, {}
    keep = [p for p in probes if p.id not in drop]
    if not keep:
        raise ProbeSetError(f"none of the {len(probes)} probes fits the model's context of {fit.limit:,} tokens "
                            f"(the shortest needs {min(fit.lengths.values()):,}): score shorter suites, or a model with "
                            "a longer context")
    if warn:
        by_suite: dict[str, int] = {}
        for pid in drop:
            suite = fit.suites.get(pid, "")
            by_suite[suite] = by_suite.get(suite, 0) + 1
        logger.warning("forgetwatch: unfit_probes='drop': %d of %d probes do not fit the model's context of %d tokens "
                       "and are left out (%s); %d probes are scored, and the base cache and the record hold those",
                       len(drop), len(probes), fit.limit,
                       ", ".join(f"{s or 'probes'}: {n}" for s, n in sorted(by_suite.items())), len(keep))
    dropped = {pid: fit.lengths[pid] for pid in probes.ids if pid in drop}
    kept = ProbeSet(keep, origin=f"{probes.origin} without {len(drop)} probe(s) over the context of {fit.limit} tokens")
    return kept, dropped


def write_dropped(root: str | Path, limit: int | None, kept: int, dropped: dict[str, int]) -> None:
    """`unfit_probes.json` in a record: the probes left out of the run and their lengths (never raises: the warning
    said it already, and a full disk must not end a training run)."""
    root = Path(root)
    try:
        root.mkdir(parents=True, exist_ok=True)
        with atomic_write(root / "unfit_probes.json") as f:
            json.dump({"context": limit, "kept": kept, "dropped": [{"id": pid, "tokens": n} for pid, n in dropped.items()]},
                      f, indent=1)
    except OSError:
        logger.exception("forgetwatch: could not write unfit_probes.json into %s", root)
