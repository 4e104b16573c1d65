"""Rewind: the step back toward the base, picked and saved at the end of a run.

θ(α) = θ_base + α (θ_final − θ_base) is scored at each α of a grid on the run's monitored probes (against its base
cache, in its precision) and on a task loss (the trainer's eval set, or a file of held-out examples); one α is picked by
`pick_alpha` (the rule, stated once, in `RULE`), θ(α) is saved to `<output_dir>/rewound/` in the checkpoint's dtype
(a LoRA merged into full weights), and the front and the pick go to `<output_dir>/forgetwatch/rewind.json`, the loggers
and the HTML report. α = 1 is always scored and must give the run's final evaluation, figure for figure: the check is
in rewind.json, and a mismatch is said loudly.

`RewindCallback` (forgetwatch.remedies.rewinder) runs this at the end of training; `forgetwatch rewind OUTPUT_DIR` on a
finished run. The weights are moved and scored by `forgetwatch.remedies.sweep` (torch lives there); this module is plain logic.

Example:
    >>> result = rewind("outputs/sft-run", task_data="held_out.jsonl")  # doctest: +SKIP
    >>> print(result.line())  # doctest: +SKIP
    rewind: α 0.7 (lowest task loss within budget) — F_adj 0.061 → 0.040, task loss 1.234 → 1.201; model in out/rewound
"""

from __future__ import annotations

import html
import logging
import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._io import read_json, strict_json
from ..errors import InterpolationError
from ..measures.budgets import ROBUST_BUDGETS, Budget, parse_budget
from ..measures.drift import RiskRule
from ..options import default
from ..probes.probe_set import ProbeSet
from ..probes.suites import load_probes
from ..record.cache import BaseCache
from ..record.lock import acquire
from ..record.store import RunRecord
from ..run.monitor import figure_rows
from ..scoring.modes import NOT_IN_KEY, ScoringConfig
from .alpha import RULE, Pick, front_measure, front_points, is_finite, pareto, pick_alpha
from .rewound import REWIND_FILE, REWOUND, commit, decision_path, discard, model_present, reconcile, staging
from .sweep import InterpolationSweep, plot_interpolation, resolve_base_model

__all__ = ["RULE", "Pick", "RewindResult", "expected_time", "pick_alpha", "front_measure", "find_checkpoint", "rewind",
           "read_rewind", "rewind_section", "REWOUND", "REWIND_FILE"]

logger = logging.getLogger(__name__)

FORMAT = 1
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")

def _label(metric: str) -> str:
    return "F_adj" if metric == "forgetting_adjusted" else "F"


# -- the run's parts ----------------------------------------------------------------------------------------------------


def find_checkpoint(output_dir: str | os.PathLike, checkpoint: str | os.PathLike | None = None) -> tuple[Path, int | None]:
    """(the model to rewind, its training step when known): `checkpoint` as given, else the final model the trainer saved
    in `output_dir` (`trainer.save_model`), else its latest `checkpoint-N` with weights. The step is N for a
    `checkpoint-N` directory (its evaluation is the one α = 1 must give), None otherwise (the last evaluation)."""
    output_dir = Path(output_dir)
    if checkpoint is not None:
        path = Path(checkpoint)
        if not path.is_dir():
            raise InterpolationError(f"--checkpoint {path}: no such directory (a model directory with safetensors weights, "
                                     "or a LoRA adapter directory)")
        m = _CHECKPOINT.match(path.name)
        return path, int(m.group(1)) if m else None
    if _has_weights(output_dir):
        return output_dir, None
    numbered = sorted(((int(m.group(1)), p) for p in output_dir.glob("checkpoint-*")
                       if (m := _CHECKPOINT.match(p.name)) and _has_weights(p)), reverse=True)
    if numbered:
        return numbered[0][1], numbered[0][0]
    raise InterpolationError(f"{output_dir}: no model to rewind: neither a final model saved there (trainer.save_model"
                             "(output_dir)) nor a checkpoint-N with safetensors weights; pass --checkpoint DIR")


def _has_weights(path: Path) -> bool:
    return any((path / f).is_file() for f in ("model.safetensors", "model.safetensors.index.json", "adapter_config.json"))


def _record_budget(record: Path, probes: ProbeSet, given: Any, bound: str | None) -> Budget | None:
    """The budget to pick within: as given (a `Budget`, a mapping, or the CLI's text), else the run's (its budget.json,
    or a sidecar run's manifest); None when the run had none."""
    if isinstance(given, Budget):
        budget = given
    elif given:
        budget = Budget(parse_budget(given), "alert", bound or default("budget_bound"), probes.groups)
    elif (record / "budget.json").is_file():
        saved = read_json(record / "budget.json", "forgetwatch's budget file, written by the callback", InterpolationError)
        budget = Budget(saved["limits"], "alert", bound or saved.get("bound", default("budget_bound")), probes.groups)
    elif _manifest(record):
        options = _manifest(record).get("callback", {})
        if not options.get("budget"):
            return None
        budget = Budget(parse_budget(options["budget"]), "alert", bound or options.get("budget_bound") or
                        default("budget_bound"), probes.groups)
    else:
        return None
    robust = [lim.key for lim in budget.limits if lim.metric in ROBUST_BUDGETS]
    if robust:
        raise InterpolationError(f"budget {', '.join(robust)}: rewind scores no robustness variants, so it cannot judge "
                                 "these limits; give a budget without them (--budget)")
    return budget


def _manifest(record: Path) -> dict[str, Any]:
    """A sidecar run's manifest (its callback's options, scoring config), or {} for a run scored in training."""
    if not (record / "sidecar.json").is_file():
        return {}
    return read_json(record / "sidecar.json", "a forgetwatch sidecar manifest", InterpolationError)


def _risk_rule(record: Path) -> Any:
    """The run's at-risk rule where the record says it (a sidecar run's manifest), else the options' defaults."""

    options = _manifest(record).get("callback", {})
    return RiskRule(options.get("at_risk_margin", default("at_risk_margin")), options.get("at_risk_drop"))


def _scoring_config(key: Mapping[str, Any], record: Path, batch_size: int | None, engine: str | None):
    """(ScoringConfig, dtype, autocast) as the base cache was scored: its key's settings and precision; batch size and
    engine (not in the key) as given, else a sidecar run's manifest's, else the options' defaults."""
    import dataclasses


    scoring = dict(key.get("scoring", {}))
    fields = {f.name for f in dataclasses.fields(ScoringConfig)} - set(NOT_IN_KEY)
    values = {k: v for k, v in scoring.items() if k in fields}
    manifest = _manifest(record).get("scoring_config", {})
    values["batch_size"] = batch_size or manifest.get("batch_size") or default("batch_size")
    values["engine"] = engine or manifest.get("engine") or default("engine")
    precision = str(scoring.get("precision", "float32"))
    dtype, _, autocast = precision.partition("+autocast-")
    return ScoringConfig(**values), dtype, autocast or None


def _check_alpha_1(now: Mapping[str, Mapping[str, Any]], recorded: Mapping[str, Any] | None, step: int | None
                   ) -> dict[str, Any]:
    """α = 1 against the run's evaluation of that model, figure by figure (every figure both hold; NaN equals NaN)."""
    if recorded is None:
        what = f"at step {step}" if step is not None else "of the final model (its last line was cut short by a kill)"
        return {"equal": None, "step": step, "compared": 0, "differences": [],
                "note": f"the record has no evaluation {what} to compare α = 1 with"}
    diffs, n = [], 0
    for group, row in now.items():
        old = recorded["metrics"].get(group)
        if old is None:
            continue
        for k, v in row.items():
            if k not in old or isinstance(v, (dict, list)):
                continue
            n += 1
            w = old[k]
            same = v == w or (v is None and w is None) or (_is_nan(v) and _is_nan(w))
            if not same:
                diffs.append({"group": group, "figure": k, "recorded": w, "alpha_1": v})
    return {"equal": not diffs and n > 0, "step": recorded["step"], "compared": n, "differences": diffs}


def _is_nan(v: Any) -> bool:
    return v is None or (isinstance(v, float) and v != v)


# -- rewinding ------------------------------------------------------------------------------------------------------------


def rewind(output_dir: str | os.PathLike, *, checkpoint: str | os.PathLike | None = None,
           base_cache: str | os.PathLike | None = None, base_model: str | None = None,
           alphas: str | Sequence[float] | None = None, task_data: str | os.PathLike | None = None,
           task_loss: Callable[[Any], float] | None = None, task_source: str | None = None,
           task_max_examples: int | None = 200, task_max_length: int = 1024,
           heldout: ProbeSet | str | None = None, budget: Budget | Mapping[str, float] | str | None = None,
           budget_bound: str | None = None, config: Any = None, batch_size: int | None = None, risk_rule: Any = None,
           device: str | None = None,
           save: bool = True, force: bool = False, loggers: Sequence[Any] = (), step: int | None = None,
           allow_other_model: bool = False, progress: Callable[[float, int, int], None] | None = None,
           announce: Callable[[str], None] | None = None) -> RewindResult:
    """Score the run's final model moved back toward its base at each α of the grid, pick α (`RULE`), save θ(α) to
    `<output_dir>/rewound/` and write the front and the pick to `<output_dir>/forgetwatch/rewind.json`.

    Everything that can be refused is refused before a model is loaded: a record without evaluations, no task measure
    and no budget, an existing `rewound/` (unless `force`), a budget on robust figures, a base cache that is not the
    run's; then whatever `forgetwatch interpolate` refuses (another base, DoRA, quantised weights, ...).

    Args:
        output_dir: the trainer's output_dir, holding the run's record (`forgetwatch/`).
        checkpoint: the model to rewind (default: `find_checkpoint`: the final model saved in output_dir, else the
            latest checkpoint-N).
        base_cache: the run's base cache (default: the record's base.parquet, or a sidecar run's).
        base_model: where the base model is (default: the model the cache was made with).
        alphas: the grid (`forgetwatch_rewind_alphas`' syntax, default its default); α = 1 is always added.
        task_data: a JSONL of held-out examples (or a dataset): its loss per answer token is the task measure.
        task_loss: instead, a function of the model giving a loss (the trainer's eval set: `RewindCallback`);
            `task_source` names it for messages and the record.
        task_max_examples, task_max_length: with `task_data`: at most this many examples, cut at this many tokens.
        heldout: probes scored at the base, the picked α and α = 1 only, reported apart (the pick never reads them);
            suite names give the suites' probes that are not monitored.
        budget: the budget to pick within (default: the run's, from its record); `budget_bound` its bound.
        config: the `ScoringConfig` (default: the base cache's settings, with `batch_size` or the run's where the record
            says it: a sidecar run's manifest).
        risk_rule: the run's at-risk rule (default: a sidecar run's, else the options'), for the at-risk count α = 1 is
            checked on.
        device: where to score. save: write `rewound/` (False: score and pick only). force: replace `rewound/`.
        loggers: `forgetwatch.run.loggers` backends to give the summary, the front table and the plot (at `step`).
        allow_other_model: as `forgetwatch interpolate --allow-other-model`.
        progress: `progress(alpha, i, n)` before each α is scored.

    Returns:
        The `RewindResult` (what rewind.json holds).

    Example:
        >>> result = rewind("outputs/sft-run", task_data="held_out.jsonl", budget="forgetting_adjusted=0.05")  # doctest: +SKIP
        >>> result.alpha, result.rewound  # doctest: +SKIP
        (0.7, PosixPath('outputs/sft-run/rewound'))
    """
    from .interpolate import alpha_grid, load_task_data

    t0 = time.perf_counter()
    output_dir = Path(output_dir)
    grid = sorted(set(alpha_grid(alphas if alphas is not None else default("rewind_alphas"), beyond=None)) | {1.0})
    record = RunRecord(output_dir / "forgetwatch")
    if not (record.root / "probes.jsonl").is_file():
        raise InterpolationError(f"{output_dir}: no forgetwatch record ({record.root}/probes.jsonl): rewind reads a run "
                                 "trained with ForgetWatchCallback (or watched by `forgetwatch watch`)")
    rows = record.read_metrics()
    if not rows:
        raise InterpolationError(f"{record.root}: the record has no evaluation yet; rewind a run whose final evaluation is in it")
    probes = ProbeSet.from_jsonl(record.root / "probes.jsonl")
    if task_data is not None and task_loss is not None:
        raise ValueError("give one task measure: `task_data` (a file of held-out examples) or `task_loss`, not both")
    budget = _record_budget(record.root, probes, budget, budget_bound)
    if task_data is None and task_loss is None and budget is None:
        raise InterpolationError("rewind: nothing to pick α by: no task loss and no budget. Give held-out task "
                                 "examples (forgetwatch_rewind_data, --data FILE), an eval set to the trainer, or a "
                                 "forgetwatch_budget (--budget)")
    rows_data = load_task_data(task_data, task_max_examples) if task_data is not None else None
    out = output_dir / REWOUND
    if save and model_present(output_dir) and not force:
        raise InterpolationError(f"{out} exists (an earlier rewind?), and rewind never replaces it without being asked: "
                                 "move it away, or pass --force")
    if not save and model_present(output_dir) and not force:
        raise InterpolationError(f"{out} holds an earlier rewind's model, which {record.root / REWIND_FILE} describes; a "
                                 "rewind that saves nothing would leave it undescribed: move it away, or pass --force "
                                 "(it is removed with the decision that made it)")
    cache_path = Path(base_cache) if base_cache else record.root / "base.parquet"
    if not cache_path.is_file():
        raise InterpolationError(f"{cache_path}: no base cache (the run was given one elsewhere, as base_cache): pass "
                                 "--base CACHE, the cache the run used")
    cache = BaseCache.load(cache_path).for_probes(probes.ids, cache_path)
    if 0 in record.eval_steps():  # the record's step 0 is the base it was scored against
        import numpy as np

        if not np.array_equal(record.read_results(0, probes.ids).outcome, cache.results.outcome):
            raise InterpolationError(f"{cache_path}: not the base this run was scored against (its outcomes differ from "
                                     "the record's step 0): pass --base with the cache the run used")
    as_cached, dtype, autocast = _scoring_config(cache.key, record.root, batch_size, None)
    config = config if config is not None else as_cached
    risk_rule = risk_rule if risk_rule is not None else _risk_rule(record.root)
    path, ckpt_step = find_checkpoint(output_dir, checkpoint)
    recorded = next((r for r in rows if r["step"] == ckpt_step), None) if ckpt_step is not None else rows[-1]
    if save and out.resolve() in (path.resolve(), *path.resolve().parents):
        raise InterpolationError(f"{out}: is or holds the checkpoint {path}; rewind that model from another place")
    base_name, base_dir = resolve_base_model(base_model, cache, cache_path, allow_other_model)
    held_out = _heldout_probes(heldout, probes) if heldout is not None else None  # refused before any α is scored

    if said := expected_time(rows, len(grid), len(probes)):  # before it starts: what it will cost, from the record
        (announce or logger.info)(said)
    locks = [acquire(output_dir, role, run=f"forgetwatch rewind {output_dir}") for role in ("training", "scoring")]
    try:
        reconcile(output_dir)  # what a stopped rewind left, mended under the locks
        if record.recover():  # a writer killed mid-evaluation (a cut last line): set aside, as every writer does
            rows = record.read_metrics()
            recorded = (next((r for r in rows if r["step"] == ckpt_step), None) if ckpt_step is not None
                        else None)  # the final model's evaluation was the one cut: nothing whole to compare α = 1 with
        sweep = InterpolationSweep(path, base_dir, probes, cache, config, dtype=dtype, autocast=autocast, device=device,
                                   base_name=base_name, cache_path=cache_path, task_rows=rows_data,
                                   task_max_length=task_max_length, task_source=str(task_data) if task_data else None,
                                   task_loss=task_loss, budget=budget, risk_rule=risk_rule,
                                   allow_other_model=allow_other_model)
        if sweep.differences:
            logger.warning("forgetwatch rewind: the checkpoint's tokenizer and generation settings differ from the base's "
                           "in %s: every α is scored under the checkpoint's", "; ".join(sweep.differences))
        steps = sweep.run(grid, progress=progress)
        group, metric = front_measure(steps[0]["metrics"])
        points = front_points(steps)
        pick = pick_alpha(points, budgeted=budget is not None)
        on_front = ({p["alpha"] for p in pareto(points)} if all(is_finite(p["task"]) for p in points) else set())
        check = _check_alpha_1(steps[-1]["metrics"], recorded, ckpt_step)
        if check["equal"] is False:
            first = check["differences"][0]
            logger.warning(
                "forgetwatch rewind: α = 1 does NOT reproduce the run's evaluation at step %s: %d of %d figures differ "
                "(first: %s/%s recorded %r, now %r). The front is not measured as the run was: a checkpoint other than "
                "the evaluated one (load_best_model_at_end?), other scoring settings (batch size, at-risk rule), or "
                "another base cache. rewind.json keeps every difference", check["step"], len(check["differences"]),
                check["compared"], first["group"], first["figure"], first["recorded"], first["alpha_1"])
        held = _score_heldout(sweep, heldout, *held_out, pick.alpha) if held_out is not None else None
        seconds_scored = time.perf_counter() - t0
        staged = None
        if save:
            staged = staging(output_dir)
            sweep.write(pick.alpha, staged)  # lets the scoring model go first
        data = {
            "format": FORMAT, "checkpoint": str(path), "checkpoint_step": ckpt_step, "base_model": str(base_dir),
            "base_cache": str(cache_path), "precision": cache.key.get("scoring", {}).get("precision"),
            "alphas": grid, "measure": {"group": group, "metric": metric, "label": _label(metric)},
            "task": None if sweep.task_kind is None else {
                "kind": "loss", "source": task_source or (str(task_data) if task_data is not None else "task_loss"),
                "unit": "nats per answer token" if task_data is not None else "nats per label token"},
            "budget": budget.to_dict() if budget is not None else None,
            "rule": RULE, "pick": pick._asdict(),
            "front": [{**p, "pareto": p["alpha"] in on_front, "metrics": s["metrics"]}
                      for p, s in zip(points, steps, strict=True)],
            "check_alpha_1": check, "heldout": held, "rewound": str(out) if staged is not None else None,
            "seconds": {"scoring": round(seconds_scored, 1), "total": round(time.perf_counter() - t0, 1)},
            "differences": sweep.differences,
        }
        if staged is not None:  # the model and its decision, committed together (`forgetwatch.remedies.rewound`)
            commit(output_dir, staged, data)
        else:
            discard(output_dir, data)
    finally:
        for lock in locks:
            lock.release()
    result = RewindResult(data, record.root / REWIND_FILE)
    plot = _plot(result, record.root / "rewind.png")
    _log(result, loggers, plot, step)
    return result


def _heldout_probes(heldout: ProbeSet | str, monitored: ProbeSet) -> tuple[ProbeSet, int]:
    """The held-out probes to score (those that are not monitored) and how many monitored ones were left out; refused
    when none is left (before any α is scored)."""
    probes = load_probes(heldout)
    mine = set(monitored.ids)
    overlap = [p.id for p in probes if p.id in mine]
    if overlap:
        kept = [p for p in probes if p.id not in mine]
        if not kept:
            raise InterpolationError(f"held-out probes {heldout}: every one is a monitored probe; give other probes")
        probes = ProbeSet(kept, origin=getattr(probes, "origin", ""))
    return probes, len(overlap)


def expected_time(rows: Sequence[Mapping[str, Any]], n_alphas: int, n_probes: int) -> str | None:
    """The line that says, before a rewind starts, what it will cost: one scoring of every probe per α, each about as
    long as the run's last full evaluation took (`metrics.jsonl`'s seconds), plus the task measure; None when the
    record holds no timed full evaluation.

    Example:
        >>> print(expected_time([{"step": 30, "seconds": 43.6}], n_alphas=6, n_probes=226))  # doctest: +NORMALIZE_WHITESPACE
        forgetwatch rewind: 6 α to score, each a pass over the 226 probes (43.6 s at the run's last full evaluation):
        about 4.4 min, plus the task loss at each α
    """
    timed = [r["seconds"] for r in rows if r.get("step", 0) > 0 and not r.get("partial") and (r.get("seconds") or 0) > 0]
    if not timed:
        return None
    total = n_alphas * timed[-1]
    when = f"{total / 60:.1f} min" if total >= 90 else f"{total:.0f} s"
    return (f"forgetwatch rewind: {n_alphas} α to score, each a pass over the {n_probes} probes ({timed[-1]:.1f} s at the "
            f"run's last full evaluation): about {when}, plus the task loss at each α")


def _score_heldout(sweep: Any, heldout: ProbeSet | str, probes: ProbeSet, left_out: int, alpha: float) -> dict[str, Any]:
    """Held-out probes at θ(0) (their base), θ(α) and θ(1), figures against θ(0): never read by the pick."""
    base = sweep.score(0.0, probes)
    out = {"probes": str(heldout) if isinstance(heldout, str) else probes.origin, "n": len(probes),
           "left_out_monitored": left_out, "note": "scored after the pick, which never reads them; base: θ(0)",
           "at": {}}
    for a in dict.fromkeys([alpha, 1.0]):
        out["at"][f"{a:g}"] = figure_rows(probes, base, sweep.score(a, probes))[2]
    return out


# -- what a rewind wrote ------------------------------------------------------------------------------------------------


@dataclass
class RewindResult:
    """A rewind's outcome, as rewind.json holds it (`data`), with the figures the summary line shows."""

    data: dict[str, Any]
    path: Path

    @property
    def alpha(self) -> float:
        return self.data["pick"]["alpha"]

    @property
    def rewound(self) -> Path | None:
        return Path(self.data["rewound"]) if self.data.get("rewound") else None

    def point(self, alpha: float) -> dict[str, Any]:
        """The front's point at `alpha`."""
        return next(p for p in self.data["front"] if p["alpha"] == alpha)

    def summary(self) -> dict[str, float]:
        """The summary keys for the loggers: `forgetwatch/rewind/alpha`, the forgetting and task loss at the checkpoint
        and at the pick."""
        one, pick = self.point(1.0), self.point(self.alpha)
        out = {"forgetwatch/rewind/alpha": self.alpha,
               "forgetwatch/rewind/forgetting": pick["forgetting"], "forgetwatch/rewind/forgetting_checkpoint": one["forgetting"],
               "forgetwatch/rewind/task_loss": pick["task"], "forgetwatch/rewind/task_loss_checkpoint": one["task"],
               "forgetwatch/rewind/alpha_1_matches": float(bool(self.data["check_alpha_1"]["equal"]))}
        return {k: float(v) for k, v in out.items() if is_finite(v)}

    def line(self) -> str:
        """One line: α, forgetting and task loss at the checkpoint and at α, and where the model is."""
        one, pick = self.point(1.0), self.point(self.alpha)
        label = self.data["measure"]["label"]
        fig = lambda v: f"{v:.3f}" if is_finite(v) else "n/a"  # noqa: E731
        task = self.data.get("task")
        name = "eval loss" if task and task["source"] == "the trainer's eval set" else "task loss"
        text = (f"rewind: α {self.alpha:g} ({self.data['pick']['why']}) — {label} {fig(one['forgetting'])} → "
                f"{fig(pick['forgetting'])}")
        if task:
            text += f", {name} {fig(one['task'])} → {fig(pick['task'])}"
        if self.alpha == min(self.data["alphas"]) > 0:  # the front may go on below the grid
            text += "; the grid's lowest α (a wider grid may go lower)"
        if pick.get("breaches"):  # the budget's limits still exceeded at the pick ("runaway = 0.92 ... > budget 0.1")
            text += "; over budget there: " + ", ".join(b.split(" = ")[0] for b in pick["breaches"])
        text += f"; model in {self.rewound}" if self.rewound else "; not saved"
        if self.data["check_alpha_1"]["equal"] is False:
            text += " (WARNING: α = 1 does not reproduce the final evaluation; see rewind.json)"
        return text


def read_rewind(output_dir: str | os.PathLike) -> RewindResult | None:
    """The rewind of a run (its `forgetwatch/rewind.json`, or None when it has none)."""
    root = Path(output_dir)
    path = decision_path(root / REWIND_FILE if root.name == "forgetwatch" else root / "forgetwatch" / REWIND_FILE)
    if path is None:
        return None
    data = read_json(path, "forgetwatch's rewind file", InterpolationError)
    if problem := _rewind_problem(data):
        raise InterpolationError(f"{path}: {problem}; `forgetwatch rewind` writes this file whole, so it was changed "
                                 "since: run the rewind again (with --force) to write it anew")
    return RewindResult(data, path)


def _rewind_problem(data: dict[str, Any]) -> str | None:
    """What makes a rewind.json one forgetwatch could not have written (what its readers would stop on), or None."""
    front, pick = data.get("front"), data.get("pick")
    if not isinstance(front, list) or not front or not all(isinstance(p, dict) and is_finite(p.get("alpha"))
                                                           for p in front):
        return "field `front` must be a list of points, each with its `alpha`"
    alphas = {p["alpha"] for p in front}
    if not isinstance(pick, dict) or pick.get("alpha") not in alphas:
        return f"field `pick.alpha` must be one of the front's alphas ({', '.join(f'{a:g}' for a in sorted(alphas))})"
    if 1.0 not in alphas:
        return "field `front` must hold α = 1 (the checkpoint itself)"
    return None


def _steps(result: RewindResult) -> tuple[list[dict[str, Any]], str | None]:
    """The front as `plot_interpolation` draws it."""
    steps = [{"alpha": p["alpha"], "metrics": p["metrics"], "task": p["task"], "within_budget": p["within_budget"]}
             for p in result.data["front"]]
    return steps, "loss" if result.data.get("task") else None


def _plot(result: RewindResult, path: Path) -> Path | None:
    """The front as a PNG (forgetting against the task loss, the pick named); None without matplotlib."""

    try:
        plot_interpolation(*_steps(result), path, chosen=result.alpha)
    except ImportError:
        logger.info("forgetwatch rewind: no plot of the front (matplotlib is not installed: pip install 'forgetwatch[report]')")
        return None
    return path


def _log(result: RewindResult, loggers: Sequence[Any], plot: Path | None, step: int | None) -> None:
    """The summary, the front as a table and the plot, to each logger (a failing one is switched off by itself)."""
    if not loggers:
        return
    columns = ["alpha", "forgetting", "task_loss", "within_budget", "picked"]
    table = [[p["alpha"], p["forgetting"], p["task"], p["within_budget"], p["alpha"] == result.alpha]
             for p in result.data["front"]]
    for lg in loggers:
        lg.summary(result.summary())
        lg.log_table("forgetwatch/rewind/front", columns, table, step or 0)
        if plot is not None:
            lg.log_image("forgetwatch/rewind/front_plot", plot, step or 0)


# -- the HTML report's section ------------------------------------------------------------------------------------------


def rewind_section(record_root: str | os.PathLike, out_dir: str | os.PathLike) -> str:
    """The report's rewind section (its plot written to `out_dir/rewind.png`), or "" when the run has no rewind."""
    result = read_rewind(record_root)
    if result is None:
        return ""
    e = html.escape
    d = result.data
    plot = _plot(result, Path(out_dir) / "rewind.png")
    fig = lambda v: f"{v:.3f}" if is_finite(v) else "n/a"  # noqa: E731
    label, task = d["measure"]["label"], d.get("task")
    head = ["α", f"{label} ({d['measure']['group']})", "task loss" if task else None,
            "within budget" if d.get("budget") else None, "on the front" if task else None, ""]
    cells = []
    for p in d["front"]:
        row = [f"{p['alpha']:g}", fig(p["forgetting"]), fig(p["task"]) if task else None,
               ("yes" if p["within_budget"] else "no: " + (", ".join(b.split(" = ")[0] for b in p["breaches"])
                                                            or "a figure it reads is missing")) if d.get("budget") else None,
               ("yes" if p["pareto"] else "") if task else None, "picked" if p["alpha"] == result.alpha else ""]
        cells.append("<tr>" + "".join(f"<td>{e(c)}</td>" for c in row if c is not None) + "</tr>")
    table = ('<table class="metrics"><thead><tr>' + "".join(f"<th>{e(h)}</th>" for h in head if h is not None)
             + "</tr></thead><tbody>" + "\n".join(cells) + "</tbody></table>")
    budget = (e(strict_json(d["budget"]["limits"])) + " (" + e(d["budget"]["bound"]) + " bound)") if d.get("budget") else "none"
    check = d["check_alpha_1"]
    said_check = (
        "α = 1 reproduces the run's evaluation at step {} ({} figures, all equal).".format(check["step"], check["compared"])
        if check["equal"]
        else check.get("note")
        or f"α = 1 does NOT reproduce the run's evaluation at step {check['step']}: {len(check['differences'])} of "
        f"{check['compared']} figures differ (rewind.json lists them)."
    )
    parts = [
        '<h2 id="rewind">Rewind: the step back toward the base</h2>',
        f'<p class="summary">{e(result.line())}</p>',
        f'<figure><img src="rewind.png" alt="the front"><figcaption>{e(label)} of the monitored probes against the task '
        "loss at each α (θ_base + α(θ_final − θ_base)), the picked α named.</figcaption></figure>"
        if plot
        else "",
        table,
        f'<p class="note">The rule: {e(d["rule"])} Task loss: {e(task["source"]) + ", " + e(task["unit"]) if task else "none"}. '
        f"Budget: {budget}. "
        f"{e(said_check)} Checkpoint: {e(d['checkpoint'])}"
        f"{'' if Path(d['checkpoint']).exists() else ' (the final model, saved there for the rewind and removed after)'}.</p>",
    ]
    held = d.get("heldout")
    if held:
        group = "all_knowledge" if any("all_knowledge" in rows for rows in held["at"].values()) else "overall"
        hrows = "".join(
            f"<tr><td>{e(a)}</td><td>{fig(r[group].get('forgetting'))}</td><td>{fig(r[group].get('backward_transfer'))}"
            f"</td><td>{fig(r[group].get('accuracy_post'))}</td></tr>"
            for a, r in held["at"].items()
        )
        parts += [f"<h3>Held-out probes ({held['n']}), apart from the pick</h3>",
                  '<table class="metrics"><thead><tr><th>α</th><th>F</th><th>BT</th><th>accuracy</th></tr></thead>'
                  f"<tbody>{hrows}</tbody></table>",
                  f'<p class="note">{e(held["probes"])}: {e(held["note"])}; the pick never reads them.</p>']
    return "\n".join(p for p in parts if p)
