"""Scoring: a model's answer to each probe, right or wrong, with the numbers behind it.

A scoring mode (`modes.py`: loglik, letter, greedy_match, generate, behaviour; `ScoringConfig` chooses) turns probes
into requests (`requests.py`, the seam's types) and judges what comes back (`judge.py` for behaviour probes, with
`forgetwatch.answers`); an engine (`engines/`) runs the requests with a model; `score.py`'s `score_probes` composes
the two into `ProbeResults` (`results.py`). `prompts.py` says how a probe becomes text, `forward.py` how to call a
model's forward across transformers versions, `lengths.py` and `fit.py` whether probes fit the model's context,
`models.py` and `weights.py` how a model is loaded and told apart. A new way of running a model is an engine; a new
way of asking is a mode. Only `score.py`, `forward.py` and the engines load torch, on first use.

Example:
    >>> from forgetwatch.scoring import ScoringConfig
    >>> ScoringConfig(mcq_mode="letter").mcq_mode
    'letter'
    >>> from forgetwatch.scoring import score_probes  # loads torch  # doctest: +SKIP
"""

from .._lazy import lazy
from .modes import ScoringConfig
from .results import CORRECT, INVALID, WRONG, ProbeResults

__all__ = ["CORRECT", "INVALID", "WRONG", "ProbeResults", "ScoringConfig", "describe_precision", "make_engine",
           "score_probes", "score_with_key"]

__getattr__, __dir__ = lazy(__name__, globals(), {
    "score_probes": ".score",
    "score_with_key": ".score",
    "describe_precision": ".score",
    "make_engine": ".engines",
})
