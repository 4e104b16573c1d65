"""Per-probe scoring results: plain NumPy columns keyed by probe id."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["ProbeResults", "CORRECT", "WRONG", "INVALID", "pack_ragged", "unpack_ragged"]

# Outcome codes shared by scoring, metrics and the record.
CORRECT, WRONG, INVALID = 1, 0, -1

_NO_SCORES = np.zeros(0, np.float32)


@dataclass
class ProbeResults:
    """One row per probe: how one model answered it.

    Columns:
        ids: probe ids (the join key with a base cache; never positions or prompt text).
        outcome: int8, 1 correct, 0 wrong, -1 invalid (the answer could not be parsed).
        pred_index: the chosen option for multiple choice, -1 for short answers or invalid ones.
        prediction: the answer as text (the chosen option, or the extracted short answer; "" if invalid).
        gold_logprob: log-likelihood of the gold option (log-likelihood scoring only, else NaN).
        margin: gold log-likelihood minus the best wrong option's (>0 means correct; NaN if not scored that way).
        generation: the raw generated text for generative scoring ("" otherwise), kept to debug extraction.
        option_scores: each option's score as the mode ranks them (summed log-likelihood, per character for
            `loglik_norm`, the letter's log-probability for `letter`); empty for short answers and generation.
            What drift and KL over the options are computed from.
        n_tokens: generated answers only: the answer's length in tokens (to the end of turn), else -1.
        stopped: generated answers only: 1 if the answer ended (end of turn or a stop string), 0 if it ran to
            `max_new_tokens` (a runaway), -1 when nothing was generated.
        detail: behaviour probes only: what the checks found, as JSON (each instruction's strict and loose
            verdict; for harmless requests, the refusal rule that matched), else "".
        nonfinite: True where the model's scores for the probe were NaN or infinite (a low-precision overflow):
            its outcome means nothing, and no figure over it can be computed (`nonfinite_mask` adds any NaN/inf
            found in the score columns themselves).

    Example:
        >>> r = ProbeResults.empty(["a", "b"]); r.outcome[:] = [1, 0]; r.accuracy
        0.5
    """

    ids: list[str]
    outcome: np.ndarray
    pred_index: np.ndarray
    prediction: list[str]
    gold_logprob: np.ndarray
    margin: np.ndarray
    generation: list[str] = field(default_factory=list)
    option_scores: list[np.ndarray] = field(default_factory=list)
    n_tokens: np.ndarray | None = None
    stopped: np.ndarray | None = None
    detail: list[str] = field(default_factory=list)
    nonfinite: np.ndarray | None = None

    COLUMNS = ("id", "outcome", "pred_index", "prediction", "gold_logprob", "margin", "generation", "option_scores",
               "n_tokens", "stopped", "detail", "nonfinite")

    def __post_init__(self) -> None:
        n = len(self.ids)
        if not self.generation:
            self.generation = [""] * n
        if not len(self.option_scores):
            self.option_scores = [_NO_SCORES] * n
        self.option_scores = [
            _NO_SCORES if x is None or len(x) == 0 else np.asarray(x, dtype=np.float32) for x in self.option_scores
        ]
        self.n_tokens = np.full(n, -1, np.int32) if self.n_tokens is None else np.asarray(self.n_tokens, dtype=np.int32)
        self.stopped = np.full(n, -1, np.int8) if self.stopped is None else np.asarray(self.stopped, dtype=np.int8)
        if not self.detail:
            self.detail = [""] * n
        self.nonfinite = (np.zeros(n, bool) if self.nonfinite is None
                          else np.asarray([bool(v) if v is not None else False for v in self.nonfinite], dtype=bool))
        self.outcome = np.asarray(self.outcome, dtype=np.int8)
        self.pred_index = np.asarray(self.pred_index, dtype=np.int32)
        self.gold_logprob = np.asarray(self.gold_logprob, dtype=np.float32)
        self.margin = np.asarray(self.margin, dtype=np.float32)
        lengths = {len(self.outcome), len(self.pred_index), len(self.prediction), len(self.gold_logprob), len(self.margin),
                   len(self.generation), len(self.option_scores), len(self.n_tokens), len(self.stopped), len(self.detail),
                   len(self.nonfinite)}
        if lengths != {n}:
            raise ValueError(f"ProbeResults columns have different lengths: ids {n}, others {sorted(lengths)}")

    @classmethod
    def empty(cls, ids: Sequence[str]) -> ProbeResults:
        n = len(ids)
        return cls(
            ids=list(ids),
            outcome=np.full(n, INVALID, np.int8),
            pred_index=np.full(n, -1, np.int32),
            prediction=[""] * n,
            gold_logprob=np.full(n, np.nan, np.float32),
            margin=np.full(n, np.nan, np.float32),
            generation=[""] * n,
            option_scores=[_NO_SCORES] * n,
        )

    def __len__(self) -> int:
        return len(self.ids)

    def nonfinite_mask(self) -> np.ndarray:
        """Probes whose scores hold NaN or infinity: flagged while scoring, or found in margin, gold log-probability or
        option scores (NaN there alone means "not scored that way" and is fine; NaN among option scores is not).

        Example:
            >>> r = ProbeResults.empty(["a", "b"]); r.margin[1] = float("inf"); r.nonfinite_mask().tolist()
            [False, True]
        """
        bad = self.nonfinite.copy()
        bad |= np.isinf(self.margin) | np.isinf(self.gold_logprob)
        bad |= np.array([len(x) > 0 and not np.isfinite(x).all() for x in self.option_scores], dtype=bool)
        return bad

    @property
    def accuracy(self) -> float:
        return float((self.outcome == CORRECT).mean()) if len(self) else float("nan")

    def to_columns(self) -> dict[str, Any]:
        return {
            "id": self.ids,
            "outcome": self.outcome,
            "pred_index": self.pred_index,
            "prediction": self.prediction,
            "gold_logprob": self.gold_logprob,
            "margin": self.margin,
            "generation": self.generation,
            "option_scores": [x.tolist() for x in self.option_scores],
            "n_tokens": self.n_tokens,
            "stopped": self.stopped,
            "detail": self.detail,
            "nonfinite": self.nonfinite.astype(np.int8),
        }

    @classmethod
    def from_columns(cls, cols: dict[str, Any]) -> ProbeResults:
        return cls(
            ids=[str(i) for i in cols["id"]],
            outcome=cols["outcome"],
            pred_index=cols["pred_index"],
            prediction=[str(p) for p in cols["prediction"]],
            gold_logprob=cols["gold_logprob"],
            margin=cols["margin"],
            generation=[str(g) for g in cols.get("generation") or [""] * len(cols["id"])],
            option_scores=list(cols.get("option_scores") or []),
            # caches written before behaviour probes have none of these: nothing was generated for them
            n_tokens=_column(cols, "n_tokens", -1),
            stopped=_column(cols, "stopped", -1),
            detail=[] if cols.get("detail") is None else ["" if d is None else str(d) for d in cols["detail"]],
            nonfinite=cols.get("nonfinite"),  # caches before it have none: every probe scored finite
        )

    def select(self, ids: Sequence[str]) -> ProbeResults:
        """The rows for `ids`, in that order; a KeyError names the first id that has no result."""
        pos = {pid: i for i, pid in enumerate(self.ids)}
        try:
            return self.take([pos[pid] for pid in ids])
        except KeyError as e:
            raise KeyError(f"no result for probe id {e.args[0]!r}") from None

    def held(self, base: ProbeResults, before: ProbeResults) -> tuple[ProbeResults, np.ndarray]:
        """These results with every probe scored NaN / inf (here or in `base`) keeping its outcome in `before`, and that
        mask: such a probe has no answer, so it neither flips nor counts as forgotten (argmax over NaN would pick an
        option as if it were one).

        Example:
            >>> now, was = ProbeResults.empty(["a"]), ProbeResults.empty(["a"]); now.margin[0] = float("nan")
            >>> now.nonfinite[0] = True; was.outcome[0] = 1
            >>> now.held(was, was)[0].outcome.tolist()
            [1]
        """
        bad = base.nonfinite_mask() | self.nonfinite_mask()
        if not bad.any():
            return self, bad
        held = self.take(range(len(self)))
        held.outcome[bad] = before.outcome[bad]
        return held, bad

    def take(self, positions: Sequence[int]) -> ProbeResults:
        """The rows at these positions, in that order."""
        idx = np.asarray(positions, dtype=np.int64)
        return ProbeResults(
            ids=[self.ids[i] for i in idx],
            outcome=self.outcome[idx],
            pred_index=self.pred_index[idx],
            prediction=[self.prediction[i] for i in idx],
            gold_logprob=self.gold_logprob[idx],
            margin=self.margin[idx],
            generation=[self.generation[i] for i in idx],
            option_scores=[self.option_scores[i] for i in idx],
            n_tokens=self.n_tokens[idx],
            stopped=self.stopped[idx],
            detail=[self.detail[i] for i in idx],
            nonfinite=self.nonfinite[idx],
        )

    @classmethod
    def concat(cls, parts: Sequence[ProbeResults]) -> ProbeResults:
        """Join results from several shards (e.g. gathered from ranks)."""
        return cls(
            ids=[i for p in parts for i in p.ids],
            outcome=np.concatenate([p.outcome for p in parts]) if parts else np.zeros(0, np.int8),
            pred_index=np.concatenate([p.pred_index for p in parts]) if parts else np.zeros(0, np.int32),
            prediction=[x for p in parts for x in p.prediction],
            gold_logprob=np.concatenate([p.gold_logprob for p in parts]) if parts else np.zeros(0, np.float32),
            margin=np.concatenate([p.margin for p in parts]) if parts else np.zeros(0, np.float32),
            generation=[x for p in parts for x in p.generation],
            option_scores=[x for p in parts for x in p.option_scores],
            n_tokens=np.concatenate([p.n_tokens for p in parts]) if parts else np.zeros(0, np.int32),
            stopped=np.concatenate([p.stopped for p in parts]) if parts else np.zeros(0, np.int8),
            detail=[x for p in parts for x in p.detail],
            nonfinite=np.concatenate([p.nonfinite for p in parts]) if parts else np.zeros(0, bool),
        )

    def set_row(self, i: int, other: ProbeResults, j: int) -> None:
        """Row i takes `other`'s row j (every column)."""
        for name in ("outcome", "pred_index", "gold_logprob", "margin", "n_tokens", "stopped", "nonfinite"):
            getattr(self, name)[i] = getattr(other, name)[j]
        for name in ("prediction", "generation", "option_scores", "detail"):
            getattr(self, name)[i] = getattr(other, name)[j]


def _column(cols: dict[str, Any], name: str, missing: int) -> np.ndarray | None:
    values = cols.get(name)
    if values is None:
        return None
    return np.asarray([missing if v is None else v for v in values])


def pack_ragged(rows: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Ragged rows as (flat values, offsets) for `np.savez`: row i is `flat[offsets[i]:offsets[i + 1]]`."""
    offsets = np.zeros(len(rows) + 1, np.int64)
    offsets[1:] = np.cumsum([len(r) for r in rows])
    flat = np.concatenate([np.asarray(r, np.float32) for r in rows]) if rows else np.zeros(0, np.float32)
    return flat.astype(np.float32), offsets


def unpack_ragged(flat: np.ndarray, offsets: np.ndarray) -> list[np.ndarray]:
    return [flat[offsets[i] : offsets[i + 1]] for i in range(len(offsets) - 1)]
