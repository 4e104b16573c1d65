"""The interpolation sweep (WiSE-FT without training): a fine-tuned checkpoint moved back toward its base, θ(α) =
θ_base + α (θ_ft − θ_base), scored at each α of a grid against the base cache, beside a task measure; the α a budget
chooses; the table and the plot of the front.

`forgetwatch interpolate` is this module behind a parser. The weights themselves are moved by `forgetwatch.remedies.interpolate`
(tensors streamed from safetensors, a LoRA scaled by α); here they are scored, α by α, one model in memory.

Example:
    >>> base_name, base_dir = resolve_base_model(None, cache)  # doctest: +SKIP
    >>> sweep = InterpolationSweep("outputs/checkpoint-500", base_dir, probes, cache, config, base_name=base_name,
    ...                            task_rows=load_task_data("held_out.jsonl"))  # doctest: +SKIP
    >>> steps = sweep.run([0, 0.25, 0.5, 0.75, 1])  # doctest: +SKIP
    >>> print(format_interpolation(steps, sweep.task_kind))  # doctest: +SKIP
    >>> sweep.save(0.5, "outputs/wise-0.5")  # doctest: +SKIP
"""

from __future__ import annotations

import gc
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .._io import atomic_write
from ..errors import EngineUnavailableError
from ..measures.budgets import Budget
from ..measures.metrics import format_figure
from ..probes.probe_set import ProbeSet
from ..record.cache import BaseCache, make_cache_key
from ..scoring.engines import engine_spec
from ..scoring.models import check_model_path, load_checkpoint, load_model, local_model_path, smollm2_path
from ..scoring.weights import compare_weights, weights_fingerprint

__all__ = ["InterpolationSweep", "interpolation_front", "resolve_base_model", "base_model_dir",
           "format_interpolation", "plot_interpolation"]

logger = logging.getLogger(__name__)


def interpolation_front(model: str | os.PathLike, base_dir: str | os.PathLike, probes: ProbeSet, cache: BaseCache,
                        alphas: Sequence[float], config: Any, *, task_data: str | os.PathLike | None = None,
                        task_split: str = "test", task_max_examples: int | None = 200, **options: Any
                        ) -> list[dict[str, Any]]:
    """Score the checkpoint `model` moved toward the base model in `base_dir` at each α of `alphas`, against the base
    cache: one dict per α with its figures (`InterpolationSweep.run`).

    Args:
        model: the fine-tuned checkpoint: a model directory (safetensors) or a LoRA adapter directory.
        base_dir: the base model's directory (`resolve_base_model` finds the cache's).
        probes: the probe set of the base cache.
        cache: the base cache, for `probes` (`BaseCache.for_probes`).
        alphas: the grid (`forgetwatch.remedies.interpolate.alpha_grid` reads one from text); 0 is the base, 1 the checkpoint.
        config: the `ScoringConfig` the cache was scored with.
        task_data: a held-out task set (a JSONL file or a dataset, `load_task_data`): its loss is each α's task
            measure (nats per answer token; lower is better).
        task_split, task_max_examples: with a dataset in `task_data`: its split; at most this many examples.
        **options: `InterpolationSweep`'s keyword arguments (dtype, autocast, device, task_probes, budget, ...).

    Example:
        >>> steps = interpolation_front("outputs/ckpt", "base/", probes, cache, [0, 0.5, 1], config)  # doctest: +SKIP
        >>> [round(s["metrics"]["overall"]["forgetting"], 3) for s in steps]  # doctest: +SKIP
        [0.0, 0.012, 0.041]
    """
    from .interpolate import load_task_data

    if task_data is not None:
        options.update(task_rows=load_task_data(task_data, task_max_examples, task_split), task_source=str(task_data))
    return InterpolationSweep(model, base_dir, probes, cache, config, **options).run(alphas)


class InterpolationSweep:
    """A fine-tuned checkpoint loaded once and moved toward its base along α (θ_base + α(θ_ft − θ_base); a LoRA adapter
    is scaled by α), scored at each α against the base cache as `forgetwatch compare` scores a checkpoint.

    Loading refuses, before anything is scored, a checkpoint that is not a local directory, an adapter trained on
    another base, and (unless `allow_other_model`) a model of another architecture than the cache's. `differences`
    lists the tokenizer and generation settings the checkpoint changed: every α is scored under the checkpoint's.

    Args:
        model: the fine-tuned checkpoint: a model directory (safetensors) or a LoRA adapter directory.
        base_dir: the base model's directory (`resolve_base_model`).
        probes: the probe set of the base cache.
        cache: the base cache, for `probes` (`BaseCache.for_probes`).
        config: the `ScoringConfig` the cache was scored with.
        dtype: the weights' dtype while scoring (float32, bfloat16, float16).
        autocast: score under `torch.autocast` in this dtype, as the cache was (None: no autocast).
        device: where to score (default: cuda when available).
        base_name: the base model as named (a Hub id, `smollm2`): an adapter's base is recognised by it too.
        cache_path: the base cache as messages name it.
        task_rows: a held-out task set (`load_task_data`): its loss is each α's task measure.
        task_probes: a probe set of the task: its accuracy is each α's task measure (not with `task_rows`).
        task_loss: a function of the model giving a loss (lower is better; e.g. a trainer's eval set): each α's task
            measure (not with `task_rows` or `task_probes`); called under the scoring precision (`autocast`).
        task_max_length: with `task_rows`: examples cut at this many tokens, as training cut them.
        task_source: with `task_rows`: where they came from, for messages.
        budget: a `Budget`: each α says whether it is within it.
        risk_rule: which probes count as at risk (the run's `at_risk_margin` / `at_risk_drop`; default the options').
        allow_other_model: go on with a checkpoint of another architecture than the cache's model.

    Example:
        >>> sweep = InterpolationSweep("outputs/ckpt", "base/", probes, cache, config)  # doctest: +SKIP
        >>> steps = sweep.run([0, 0.5, 1])  # doctest: +SKIP
        >>> sweep.save(pick_alpha(front_points(steps), budgeted=True).alpha, "outputs/rewound")  # doctest: +SKIP
    """

    def __init__(self, model: str | os.PathLike, base_dir: str | os.PathLike, probes: ProbeSet, cache: BaseCache,
                 config: Any, *, dtype: str = "float32", autocast: str | None = None, device: str | None = None,
                 base_name: str | None = None, cache_path: str | os.PathLike = "the base cache",
                 task_rows: Sequence[dict[str, Any]] | None = None, task_probes: ProbeSet | None = None,
                 task_max_length: int = 1024, task_source: str | None = None, budget: Budget | None = None,
                 task_loss: Callable[[Any], float] | None = None, risk_rule: Any = None, allow_other_model: bool = False):
        from ..scoring.models import model_identity
        from ..scoring.weights import check_weight_files
        from .interpolate import InterpolationError, setting_differences

        if sum(x is not None for x in (task_rows, task_probes, task_loss)) > 1:
            raise ValueError("give one task measure: `task_rows` (held-out loss), `task_probes` (accuracy) or `task_loss`")
        self.name, self.base_dir = str(model), Path(base_dir)
        self.probes, self.cache, self.config, self.autocast = probes, cache, config, autocast
        self.cache_path, self.budget = str(cache_path), budget
        self.task_rows, self.task_probes, self.task_max_length, self.task_source = (task_rows, task_probes,
                                                                                    task_max_length, task_source)
        self.task_loss, self.risk_rule = task_loss, risk_rule
        self.task_kind = "accuracy" if task_probes is not None else "loss" if task_rows is not None or task_loss else None
        self.dtype = dtype
        for directory, what in ((model, "the checkpoint"), (base_dir, "the base model")):  # before anything is loaded
            check_weight_files(directory, what, InterpolationError)
        engine = getattr(config, "engine", "hf")
        if autocast and not engine_spec(engine).autocast:
            raise EngineUnavailableError(f"engine={engine!r} runs the weights in their own dtype and cannot autocast: "
                                         "pass --dtype bfloat16 (or float16) instead of --autocast, or use --engine hf")
        self.model, self.tokenizer, self._inner, self.tuned_dir = _load(self.name, self.base_dir, dtype, device, base_name)
        built, now = cache.key.get("model", {}).get("architecture"), model_identity(self.model)["architecture"]
        if built and now and built != now and not allow_other_model:
            raise InterpolationError(f"{cache_path} was made with a {built}, and --model {model} is a {now}: not a "
                                     "fine-tune of that base (pass --allow-other-model to go on)")
        self.differences = setting_differences(self.base_dir, self.model, self.tokenizer)

    def set(self, alpha: float) -> None:
        """Move the scoring model to θ(α)."""
        self._inner.set(alpha)

    def score(self, alpha: float, probes: ProbeSet) -> Any:
        """The `ProbeResults` of `probes` (any probe set: held-out ones, say) at θ(α), in the sweep's scoring settings."""
        self.set(alpha)
        return self._score_at(alpha, probes, f"scoring {self.name} at α = {alpha:g}")[0]

    def _score_at(self, alpha: float, probes: ProbeSet, desc: str) -> tuple[Any, dict[str, Any]]:
        """`score_with_key` at θ(α) (the model already set to it). With an engine that loads directories (vLLM), θ(α)
        is written beside the checkpoint (`save_interpolated`, one at a time, deleted after) and scored from there
        (`forgetwatch.scoring.checkpoint.score_checkpoint`, which loads each into one running engine)."""
        from ..scoring.score import describe_precision, score_with_key

        if engine_spec(self.config.engine).live_model:
            return score_with_key(self.model, self.tokenizer, probes, self.config, self.autocast, desc=desc)
        from ..scoring.checkpoint import score_checkpoint
        from .interpolate import save_interpolated, save_lora_merged

        parent = Path(self.tuned_dir).parent
        with tempfile.TemporaryDirectory(prefix=".forgetwatch-theta-", dir=parent) as tmp:
            theta = Path(tmp) / f"alpha-{alpha:g}"
            if _is_lora(self._inner):
                save_lora_merged(self.base_dir, self.tuned_dir, alpha, theta)
            else:
                save_interpolated(self.base_dir, self.tuned_dir, alpha, theta)
            self.tokenizer.save_pretrained(theta)
            results = score_checkpoint(theta, probes, self.config, precision=self.dtype, desc=desc, progress=True)
        return results, self.config.key(self.tokenizer, describe_precision(self.model))

    def run(self, alphas: Sequence[float], progress: Callable[[float, int, int], None] | None = None
            ) -> list[dict[str, Any]]:
        """Score θ(α) at each α, in order: one dict per α with `alpha`, `metrics` (each group's figures against the
        base, the rows of a run's metrics.jsonl), `task` (the task measure, or None), `breaches` (the budget's limits
        it exceeds) and `within_budget` (None without a budget; False where a figure the budget reads is missing).

        The cache's scoring settings are checked against this model's, and the task rows encoded, before anything is
        scored. `progress(alpha, i, n)` is called before each α is scored (default: logged)."""
        from ..run.monitor import figure_rows
        from ..scoring.models import model_identity
        from ..scoring.score import describe_precision, precision_context
        from .interpolate import encode_task_rows, held_out_loss

        # the cache's scoring settings (template, precision, ...) against this model's, before any scoring
        before = self.config.key(self.tokenizer, describe_precision(self.model, autocast=self.autocast))
        self.cache.check(make_cache_key(model_identity(self.model), self.probes, before), ignore=("model",),
                         path=self.cache_path)
        pairs = None
        if self.task_rows is not None:  # every row encoded now: a row the model cannot read is refused before scoring
            pairs = encode_task_rows(self.tokenizer, self.task_rows, self.task_max_length, source=self.task_source)
        steps = []
        for i, alpha in enumerate(alphas):
            self.set(alpha)
            (progress or _log_progress)(alpha, i + 1, len(alphas))
            results, scoring_key = self._score_at(alpha, self.probes, f"scoring {self.name}")
            if i == 0 and scoring_key != before:  # as checked above, unless scoring settled something the key names
                self.cache.check(make_cache_key(model_identity(self.model), self.probes, scoring_key), ignore=("model",),
                                 path=self.cache_path)
            rows = figure_rows(self.probes, self.cache.results, results, self.risk_rule)[2]
            task = None
            if pairs is not None:
                task = held_out_loss(self.model, self.tokenizer, pairs, batch_size=self.config.batch_size)
            elif self.task_loss is not None:
                with precision_context(self.model, describe_precision(self.model, autocast=self.autocast)):
                    task = float(self.task_loss(self.model))
            elif self.task_probes is not None:
                task = self._score_at(alpha, self.task_probes, f"scoring {self.name}")[0].accuracy
            breaches = self.budget.check(rows) if self.budget is not None else []
            missing = [name for name, row in rows.items() if row.get("missing")]
            steps.append({"alpha": alpha, "metrics": rows, "task": task, "breaches": [b.describe() for b in breaches],
                          "within_budget": None if self.budget is None else not breaches and not missing})
        return steps

    def write(self, alpha: float, directory: str | os.PathLike) -> None:
        """Write θ(α) into the new directory `directory` (removed again if writing fails), at the checkpoint's own
        precision (not the scoring one), with its tokenizer (a LoRA adapter at α is merged into the base's full weights).
        θ(α) is made from the two directories, so the scoring model is let go first (one model in memory): the sweep
        scores nothing after."""
        from .interpolate import save_interpolated, save_lora_merged

        lora = _is_lora(self._inner)
        self.model = self._inner = None
        gc.collect()
        directory = Path(directory)
        if directory.exists():
            shutil.rmtree(directory)
        try:
            if lora:
                save_lora_merged(self.base_dir, self.tuned_dir, alpha, directory)
            else:
                save_interpolated(self.base_dir, self.tuned_dir, alpha, directory)
            self.tokenizer.save_pretrained(directory)
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)
            raise

    def save(self, alpha: float, out: str | os.PathLike) -> None:
        """Write θ(α) to the directory `out` (`write`); an existing `out` is replaced once the new one is complete."""
        out = Path(out)
        tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
        self.write(alpha, tmp)
        if out.exists():
            shutil.rmtree(out) if out.is_dir() else out.unlink()
        tmp.rename(out)


def _log_progress(alpha: float, i: int, n: int) -> None:
    logger.info("α = %g (%d of %d)", alpha, i, n)


def _is_lora(inner: Any) -> bool:
    from .interpolate import LoraScaler

    return isinstance(inner, LoraScaler)


def _load(path: str, base_dir: Path, dtype: str, device: str | None, base_name: str | None):
    """(model, tokenizer, what moves it along α (weights, or a LoRA's scale), the checkpoint's directory)."""
    from .interpolate import InterpolationError, Interpolator, LoraScaler, check_lora_config

    directory = check_model_path(path)
    if directory is None:
        raise InterpolationError(f"--model {path}: interpolate reads a local checkpoint directory")
    adapter = directory / "adapter_config.json"
    if adapter.is_file():
        config = json.loads(adapter.read_text(encoding="utf-8"))
        check_lora_config(config, adapter)
        said = config.get("base_model_name_or_path") or ""
        if not _model_names(said) & (_model_names(str(base_dir)) | _model_names(base_name or "")):
            raise InterpolationError(f"{adapter}: the adapter was trained on {said or 'an unnamed base'}, not on the base "
                                     f"model {base_dir}: interpolate an adapter toward its own base (--base-model, or a cache "
                                     "made with that model)")
        model, tokenizer = load_checkpoint(directory, dtype=dtype, device=device)
        return model, tokenizer, LoraScaler(model), directory
    model, tokenizer = load_model(str(directory), dtype=dtype, device=device)
    return model, tokenizer, Interpolator(model, base_dir, directory), directory


def resolve_base_model(base_model: str | None, cache: BaseCache, cache_path: str | os.PathLike = "the base cache",
                       allow_other_model: bool = False) -> tuple[str | None, Path]:
    """(the base model's name, its local directory): `base_model` (a directory, a Hub id, `smollm2`), or the model the
    cache was made with. A `base_model` other than the cache's, or weight files at its path other than those the cache
    was made from (the key's fingerprint), are refused unless `allow_other_model`: α = 0 would be scored as a drift from
    another model.

    Example:
        >>> resolve_base_model(None, BaseCache.load("base.parquet"))  # doctest: +SKIP
        ('smollm2', PosixPath('/home/me/.cache/forgetwatch/smollm2'))
    """
    from .interpolate import InterpolationError

    cached = cache.key.get("model", {}).get("name_or_path")
    if base_model and cached and not _model_names(base_model) & _model_names(cached) and not allow_other_model:
        raise InterpolationError(f"{cache_path} was made with {cached}, not with --base-model {base_model}: α = 0 would "
                                 "be scored as a drift from another model. Give the cache's own base (or make a cache with "
                                 "this one: forgetwatch cache --model ...), or pass --allow-other-model to go on")
    name = base_model or cached
    directory = base_model_dir(name, cache_path)
    # the same name is not the same weights: other weights saved at the base's path since the cache was made would make
    # α = 0 another model, and every step toward the base a step toward it (the key holds the files' fingerprint)
    diff, _ = compare_weights(cache.key.get("model", {}).get("weights"), weights_fingerprint(directory), str(directory))
    if diff and not allow_other_model:
        raise InterpolationError(f"{cache_path}: {diff}. Stepping back toward these weights would not be stepping back "
                                 "toward the base the record was scored against: restore the base's weights there (or "
                                 "give --base-model the directory that holds them), or pass --allow-other-model to go on")
    return name, directory


def base_model_dir(name: str | None, cache_path: str | os.PathLike = "the base cache") -> Path:
    """The base model's local directory (its weights are streamed from there): `smollm2`'s, a local directory, or a Hub
    model's download (config, tokenizer and safetensors weights only)."""

    if not name:
        raise ValueError(f"{cache_path} does not say which model it was made with: pass --base-model")
    if name == "smollm2":
        return smollm2_path()
    local = check_model_path(name)
    if local is not None:
        return local
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(name, allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt"]))


def _model_names(name: str) -> set[str]:
    """The spellings of one model: as given and resolved; `smollm2` and the checkpoint it converts to are one."""

    if not name:
        return set()
    names = {name, local_model_path(name)}
    if name == "smollm2":
        names.add(local_model_path(str(smollm2_path())))
    return names


def format_interpolation(steps: list[dict[str, Any]], task_kind: str | None, task_flag: str = "--task-data") -> str:
    """One row per α: forgetting, backward transfer and accuracy of the knowledge probes, behaviour where there is some,
    and the task measure."""
    num = format_figure
    first = steps[0]["metrics"]
    group = "all_knowledge" if "all_knowledge" in first else "overall"
    behaviour = "all_behavior" if "all_behavior" in first else None
    head = f"{'α':>6}{'F':>8}{'F adj':>8}{'BT':>8}{'acc':>8}"
    if behaviour:
        head += f"{'instr.':>9}{'runaway':>9}{'refused':>9}"
    if task_kind:
        head += f"{'task ' + task_kind:>15}"
    if steps[0]["within_budget"] is not None:
        head += f"{'budget':>9}"
    lines = [head, "-" * len(head)]
    for s in steps:
        m = s["metrics"][group]
        line = (f"{s['alpha']:>6g}{num(m.get('forgetting')):>8}{num(m.get('forgetting_adjusted')):>8}"
                f"{num(m.get('backward_transfer')):>8}{num(m.get('accuracy_post')):>8}")
        if behaviour:
            b = s["metrics"][behaviour]
            line += f"{num(b.get('instruct_compliance')):>9}{num(b.get('runaway_rate')):>9}{num(b.get('over_refusal_rate')):>9}"
        if task_kind:
            line += f"{num(s['task']):>15}"
        if s["within_budget"] is not None:
            line += f"{'within' if s['within_budget'] else 'over':>9}"
        lines.append(line)
    what = "knowledge probes" if group == "all_knowledge" else "all probes"
    lines.append(f"F, F adj, BT, acc: {what}, each against the base cache (α = 0 is the base, α = 1 the checkpoint)"
                 + ("; instr.: instructions followed, runaway: answers that hit the token limit, refused: harmless requests "
                    "refused" if behaviour else "")
                 + (f"; task loss: nats per answer token on {task_flag} (lower is better)" if task_kind == "loss" else "")
                 + ("; task accuracy: on --task-probes" if task_kind == "accuracy" else ""))
    return "\n".join(lines)


def plot_interpolation(steps: list[dict[str, Any]], task_kind: str | None, path: str | os.PathLike,
                       chosen: float | None = None) -> None:
    """A PNG at `path` of forgetting (chance-adjusted where it exists) against the task measure (else α), one point per
    α, the Pareto front marked and `chosen` named. Needs matplotlib (`pip install 'forgetwatch[report]'`)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    group = "all_knowledge" if "all_knowledge" in steps[0]["metrics"] else "overall"
    adjusted = bool(steps[0]["metrics"][group].get("adjusted"))
    key = "forgetting_adjusted" if adjusted else "forgetting"
    xs = [s["task"] if task_kind else s["alpha"] for s in steps]
    ys = [s["metrics"][group].get(key) for s in steps]
    fig = Figure(figsize=(6.5, 4.5), layout="constrained")
    ax = fig.add_subplot()
    ax.plot(xs, ys, "o-", color="tab:red", alpha=0.35)
    better = (lambda a, b: a <= b) if task_kind == "loss" else (lambda a, b: a >= b)
    front = [i for i in range(len(steps)) if not any(
        j != i and better(xs[j], xs[i]) and ys[j] <= ys[i] and (xs[j], ys[j]) != (xs[i], ys[i]) for j in range(len(steps)))]
    ax.plot([xs[i] for i in front], [ys[i] for i in front], "o", color="tab:red", markersize=8, label="Pareto front")
    for s, x, y in zip(steps, xs, ys, strict=True):
        ax.annotate(f"α={s['alpha']:g}" + (" (chosen)" if s["alpha"] == chosen else ""), (x, y), fontsize=8,
                    textcoords="offset points", xytext=(4, 4))
    ax.set_xlabel({"loss": "task loss (nats per answer token, lower is better)", "accuracy": "task accuracy"}.get(task_kind, "α"))
    ax.set_ylabel(("chance-adjusted " if adjusted else "") + "forgetting since base")
    ax.set_title("Interpolation toward the base: forgetting against the task")
    ax.legend(fontsize="small", frameon=False)
    FigureCanvasAgg(fig)
    with atomic_write(path, "wb") as f:
        fig.savefig(f, format="png", dpi=110)
