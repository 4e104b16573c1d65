"""What each file of a run's record may hold, checked field by field when it is read, so that no reader crashes.

Every reader of the record (`forgetwatch report`, `load_record`, a watcher or a resumed run opening it) goes through
`RunRecord`, which checks each line of `flips.jsonl`, `at_risk.jsonl`, `events.jsonl` and `trainer_log.jsonl`, the
whole of `budget.json` and each `evals/step-N.npz` with the functions here, and `forgetwatch.run.sidecar.read_manifest`
checks `sidecar.json`. A problem is said as text naming the field (`None` when the value is one forgetwatch could have
written); the caller adds the file and the line. Fields forgetwatch does not know are left alone (a later version may
add some); a known field of the wrong type, a missing one every version writes, NaN or infinity where only a whole
number can be, are refused: a figure read from them would be silently wrong, or the reader would stop on a TypeError.

Example:
    >>> line_problem("flips.jsonl", {"step": "2", "id": "arc/1", "direction": "1→0"})
    "field `step` must be a whole number >= 0, not '2' (str)"
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["line_problem", "budget_problem", "eval_problem", "manifest_problem", "metrics_line_problem"]

BIG = 2**53  # the largest whole number a JSON reader anywhere carries exactly: larger ones were never written by us


def _shown(v: Any) -> str:
    text = repr(v)
    return f"{text[:60]}…" if len(text) > 60 else text


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def step(v: Any) -> str | None:
    if not _number(v) or isinstance(v, float) or not 0 <= v < BIG:
        return f"must be a whole number >= 0, not {_shown(v)} ({type(v).__name__})"
    return None


def optional_step(v: Any) -> str | None:
    return None if v is None else step(v)


def number(v: Any) -> str | None:
    """A number; NaN is one (a figure that could not be computed), infinity too (a loss that overflowed)."""
    if not _number(v) or (isinstance(v, int) and abs(v) >= BIG):
        return f"must be a number, not {_shown(v)} ({type(v).__name__})"
    return None


def optional_number(v: Any) -> str | None:
    """A number, or null: the callback writes a NaN or infinite trainer figure as null (strict JSON)."""
    return None if v is None else number(v)


def finite(v: Any) -> str | None:
    if number(v) or not math.isfinite(v):
        return f"must be a finite number, not {_shown(v)} ({type(v).__name__})"
    return None


def text(v: Any) -> str | None:
    return None if isinstance(v, str) else f"must be text, not {_shown(v)} ({type(v).__name__})"


def optional_text(v: Any) -> str | None:
    return None if v is None else text(v)


def texts(v: Any) -> str | None:
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        return f"must be a list of texts, not {_shown(v)}"
    return None


def flag(v: Any) -> str | None:
    return None if isinstance(v, bool) else f"must be true or false, not {_shown(v)} ({type(v).__name__})"


def anything(v: Any) -> str | None:
    return None


def _within(v: Any) -> str | None:
    if v is None:
        return None
    if not isinstance(v, dict):
        return f"must be an object (step, checkpoint) or null, not {_shown(v)} ({type(v).__name__})"
    return _fields(v, {"step": (optional_step, True), "checkpoint": (optional_text, False)}, prefix="last_within_budget.")


Check = Callable[[Any], "str | None"]
# each field: (its check, whether every version writes it)
_PROBE_ROW: dict[str, tuple[Check, bool]] = {
    "step": (step, True), "id": (text, True), "category": (text, False), "question": (text, False),
    "gold": (optional_text, False)}
_LINES: dict[str, dict[str, tuple[Check, bool]]] = {
    "flips.jsonl": {**_PROBE_ROW, "direction": (text, False), "vs_base": (text, False),
                    "base_prediction": (optional_text, False), "prediction": (optional_text, False)},
    "at_risk.jsonl": {**_PROBE_ROW, "margin_base": (number, True), "margin_now": (number, True)},
    "events.jsonl": {"step": (step, True), "event": (text, True), "key": (text, False), "keys": (texts, False),
                     "value": (number, False), "measured": (number, False), "limit": (number, False),
                     "bound": (text, False), "action": (text, False), "reason": (text, False),
                     "last_within_budget": (_within, False)},
    # the trainer's own rows: only what the report reads (the step, and the figures it draws) is forgetwatch's to check
    "trainer_log.jsonl": {"step": (step, True), "loss": (optional_number, False), "eval_loss": (optional_number, False),
                          "reward": (optional_number, False)},
}


def _fields(row: dict[str, Any], schema: dict[str, tuple[Check, bool]], prefix: str = "") -> str | None:
    for name, (check, required) in schema.items():
        if name not in row:
            if required:
                return f"field `{prefix}{name}` is missing"
            continue
        if problem := check(row[name]):
            return problem if problem.startswith("field `") else f"field `{prefix}{name}` {problem}"
    return None


def line_problem(name: str, row: dict[str, Any]) -> str | None:
    """What makes a line of the record's JSON-lines file `name` one forgetwatch could not have written, or None."""
    schema = _LINES.get(name)
    return _fields(row, schema) if schema is not None else None


def budget_problem(doc: dict[str, Any]) -> str | None:
    """What makes `budget.json` one forgetwatch could not have written, or None."""
    def limits(v: Any) -> str | None:
        if not isinstance(v, dict):
            return f"must be an object of limits, not {_shown(v)} ({type(v).__name__})"
        for key, limit in v.items():
            if problem := finite(limit):
                return f"field `limits.{key}` {problem}"
        return None

    return _fields(doc, {"limits": (limits, True), "on_budget": (text, True), "bound": (text, False),
                         "over": (texts, False), "last_within_budget": (_within, False)})


def manifest_problem(doc: dict[str, Any]) -> str | None:
    """What makes `sidecar.json` one forgetwatch could not have written, or None."""
    def obj(v: Any) -> str | None:
        return None if isinstance(v, dict) else f"must be an object, not {_shown(v)} ({type(v).__name__})"

    def optional_obj(v: Any) -> str | None:
        return None if v is None else obj(v)

    def starts(v: Any) -> str | None:
        if not isinstance(v, list):
            return f"must be a list of training starts, not {_shown(v)} ({type(v).__name__})"
        for i, s in enumerate(v):
            if not isinstance(s, dict):
                return f"field `starts[{i}]` must be an object (step, at, id), not {_shown(s)}"
            if problem := _fields(s, {"step": (step, True), "at": (finite, False), "id": (optional_text, False)},
                                  prefix=f"starts[{i}]."):
                return problem
        return None

    def name(v: Any) -> str | None:
        return None if isinstance(v, str) and v.strip() else f"must be a file name, not {_shown(v)} ({type(v).__name__})"

    def pid(v: Any) -> str | None:
        return None if v is None else step(v)

    if problem := _fields(doc, {
            "probes": (name, False), "base_cache": (name, True), "precision": (text, True), "callback": (obj, True),
            "scoring_config": (obj, True), "max_steps": (optional_step, False), "report_to": (texts, False),
            "run_name": (optional_text, False), "wandb": (optional_obj, False), "started_at_step": (step, False),
            "starts": (starts, False), "started_at": (finite, False), "pid": (pid, False),
            "host": (optional_text, False), "finished": (flag, False), "final_step": (optional_step, False)}):
        return problem
    final, most = doc.get("final_step"), doc.get("max_steps")
    if final is not None and most is not None and final > max(most, doc.get("started_at_step", 0)):
        return f"field `final_step` ({final}) is past `max_steps` ({most})"
    return None


# the arrays of an evaluation, one value per probe: the kinds of numbers each may hold ("i" whole, "f" any, "b" bool)
_PER_PROBE = {"outcome": "iub", "pred_index": "iu", "margin": "f", "gold_logprob": "f", "n_tokens": "iu",
              "stopped": "iub", "detail": "U", "nonfinite": "iub",
              # a partial evaluation (max_share): which probes it scored, their strata, their inclusion probabilities
              "scored": "iub", "stratum": "iu", "inclusion": "f"}
_REQUIRED = ("outcome", "pred_index", "margin")  # every version writes these; the others came later


def eval_problem(z: dict[str, np.ndarray]) -> str | None:
    """What makes the arrays of an `evals/step-N.npz` an evaluation forgetwatch could not have written, or None."""
    for name in _REQUIRED:
        if name not in z:
            return f"no `{name}` array (it holds {', '.join(sorted(z))})"
    n = None
    for name, kinds in _PER_PROBE.items():
        if name not in z:
            continue
        a = z[name]
        if a.ndim != 1 or a.dtype.kind not in kinds:
            return (f"array `{name}` must be one {'text' if kinds == 'U' else 'number'} per probe, not "
                    f"{a.dtype} of shape {a.shape}")
        n = len(a) if n is None else n
        if len(a) != n:
            return f"array `{name}` has {len(a)} values, but `outcome` {n}: one per probe in each"
    if not np.isin(z["outcome"], (-1, 0, 1)).all():
        return "array `outcome` holds values other than 1 (right), 0 (wrong) and -1 (invalid)"
    if ("scored" in z) != ("inclusion" in z) or ("scored" in z) != ("stratum" in z):
        return "arrays `scored`, `stratum` and `inclusion` come together, and only some are here"
    if "inclusion" in z and not ((z["inclusion"] > 0) & (z["inclusion"] <= 1)).all():
        return "array `inclusion` must hold probabilities above 0 and at most 1"
    for name, allowed in (("stopped", (-1, 0, 1)), ("nonfinite", (0, 1)), ("scored", (0, 1)), ("stratum", (0, 1, 2, 3))):
        if name in z and not np.isin(z[name], allowed).all():
            return f"array `{name}` holds values other than {', '.join(map(str, allowed))}"
    if ("n_tokens" in z) != ("stopped" in z) or ("n_tokens" in z) != ("detail" in z):
        return "arrays `n_tokens`, `stopped` and `detail` come together, and only some are here"
    if ("option_scores" in z) != ("option_offsets" in z):
        return "arrays `option_scores` and `option_offsets` come together, and only one is here"
    if "option_scores" in z:
        scores, offsets = z["option_scores"], z["option_offsets"]
        if scores.ndim != 1 or scores.dtype.kind != "f":
            return f"array `option_scores` must be numbers in a row, not {scores.dtype} of shape {scores.shape}"
        if (offsets.ndim != 1 or offsets.dtype.kind not in "iu" or len(offsets) != n + 1 or offsets[0] != 0
                or offsets[-1] != len(scores) or (np.diff(offsets) < 0).any()):
            return (f"array `option_offsets` must be {n + 1} rising whole numbers from 0 to {len(scores)} (where each "
                    f"probe's option scores start), not {offsets.dtype} {_shown(offsets.tolist())}")
    if ("prediction_utf8" in z) != ("prediction_offsets" in z):
        return "arrays `prediction_utf8` and `prediction_offsets` come together, and only one is here"
    if "prediction_utf8" in z:  # each probe's answer as UTF-8 bytes, packed in a row
        data, offsets = z["prediction_utf8"], z["prediction_offsets"]
        if data.ndim != 1 or data.dtype != np.uint8:
            return f"array `prediction_utf8` must be bytes in a row, not {data.dtype} of shape {data.shape}"
        if (offsets.ndim != 1 or offsets.dtype.kind not in "iu" or len(offsets) != n + 1 or offsets[0] != 0
                or offsets[-1] != len(data) or (np.diff(offsets) < 0).any()):
            return (f"array `prediction_offsets` must be {n + 1} rising whole numbers from 0 to {len(data)} (where each "
                    f"probe's answer starts), not {offsets.dtype} {_shown(offsets.tolist())}")
    if "fingerprint" in z and (z["fingerprint"].ndim != 0 or z["fingerprint"].dtype.kind != "U"):
        return f"array `fingerprint` must be one text, not {z['fingerprint'].dtype} of shape {z['fingerprint'].shape}"
    return None


def metrics_line_problem(row: dict[str, Any]) -> str | None:
    """What makes a metrics.jsonl line one forgetwatch could not have written, or None: `step` a whole number >= 0,
    `epoch` and `seconds` numbers, `metrics` an object of groups, each an object of figures that are numbers (NaN
    included), true/false or a reason (text)."""
    def number(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    step = row.get("step")
    if "step" not in row:
        return "field `step` is missing"
    if not number(step) or isinstance(step, float) or not 0 <= step < 2**53:  # larger: no JSON reader carries it exactly
        return f"field `step` must be a whole number >= 0, not {step!r} ({type(step).__name__})"
    for field in ("epoch", "seconds"):
        if field in row and not number(row[field]):
            return f"field `{field}` must be a number, not {row[field]!r} ({type(row[field]).__name__})"
    partial = row.get("partial")  # a partial evaluation's design (max_share): what the report reads of it
    if partial is not None:
        if not isinstance(partial, dict):
            return f"field `partial` must be an object (the partial evaluation's counts), not {type(partial).__name__}"
        for field in ("k", "scored", "n"):  # k is null for a pilot (nothing timed yet)
            value = partial.get(field)
            if (value is not None or field != "k") and (not number(value) or isinstance(value, float)):
                return f"field `partial.{field}` must be a whole number, not {value!r}"
    groups = row.get("metrics")
    if not isinstance(groups, dict):
        return f"field `metrics` must be an object of groups, not {type(groups).__name__}"
    for name, figures in groups.items():
        if not isinstance(figures, dict):
            return f"field `metrics.{name}` must be an object of figures, not {type(figures).__name__}"
        for key, value in figures.items():
            if not isinstance(value, (int, float, str)):  # bool is an int; NaN is a float
                return f"field `metrics.{name}.{key}` must be a number, not {value!r}"
    return None
