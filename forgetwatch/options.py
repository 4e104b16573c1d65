"""Every `forgetwatch_*` option, declared once: its type, default, one-line meaning and group.

`ForgetWatchArguments` is the one declaration. Everything else derives from it: the callback's keyword arguments
(`ForgetWatchCallback(probes, eval_steps, **options)`), `ScoringConfig`'s defaults, the CLI flags that share a name
(`--mcq-mode`, `--batch-size`, ...), the sidecar manifest and the watcher, the Axolotl plugin's pydantic model, the
LLaMA-Factory key checks, TRL's `--help` in the recipes, `forgetwatch options` and its reference page (`forgetwatch docs
options`). A new option is one field here (with `_opt`) and the code that uses it.

"Off" means one thing everywhere: a number that turns something on is off at 0 (`robustness`, `replay_mix`,
`anchor_beta`, `penalty_beta`); an optional setting is off, or "decide for me", at None (`budget`, `at_risk_drop`).

This module is plain Python and imports only the docs' links and the errors, so every module may import it.

Example:
    >>> from forgetwatch.options import ForgetWatchArguments, describe
    >>> ForgetWatchArguments(forgetwatch_probes="arc_easy", forgetwatch_eval_steps=20).unprefixed()["eval_steps"]
    20
    >>> describe("forgetwatch_mcq_mode").default
    'loglik'
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .docs import docs_hint, results_url
from .errors import EngineUnavailableError

__all__ = ["AMOUNTS", "COUNTS", "ForgetWatchArguments", "GROUPS", "Option", "PREFIX", "add_flag", "amount", "count",
           "describe", "format_options", "options", "options_from_kwargs", "options_from_record", "options_markdown"]

PREFIX = "forgetwatch_"

# The option groups, in the order `forgetwatch options` and docs/options.md list them.
PROBES, LOGGING, BUDGETS, REMEDIES = "probes and scoring", "logging", "budgets and alerts", "remedies"
GROUPS = (PROBES, LOGGING, BUDGETS, REMEDIES)

# Choices of the options that take one of a few names (the modules that act on them import these).
MCQ_MODES = ("loglik", "loglik_norm", "letter", "generate")
SHORT_MODES = ("generate", "greedy_match")
SHORT_MATCHES = ("exact", "contains")
ENGINES = ("hf", "continuous", "vllm")
# the engines that load a model's directory and cannot score the model in training (`scoring="sidecar"` only), as
# `forgetwatch.scoring.engines.ENGINES` says of each (`EngineSpec.live_model`; tests/scoring/test_engines.py keeps them in step)
DIRECTORY_ENGINES = ("vllm",)
SCORING_MODES = ("inline", "sidecar")
ON_BUDGET = ("alert", "save", "stop")
BUDGET_BOUNDS = ("lower", "point")
REPLAY_STRATEGIES = ("closed_loop", "uniform")
REPLAY_TARGETS = ("gold", "base")
UNFIT_PROBES = ("refuse", "drop")
PROBE_CHANGES = ("refuse", "new_segment")

# Behaviour probes' answers are checked whole (word counts, sections, JSON, ...) and whether they stop is itself
# measured, so they get room: SmolLM2-135M-Instruct ends 4 in 5 of the built-in suite's answers within it (84 of 105;
# benchmarks/RESULTS.md §11).
BEHAVIOR_MAX_NEW_TOKENS = 256


class Option(NamedTuple):
    """One option as `forgetwatch options` shows it."""

    name: str  # with the prefix: forgetwatch_eval_steps
    type: str
    default: Any
    help: str
    group: str
    choices: tuple[str, ...] | None

    @property
    def short(self) -> str:
        """The name without the prefix: the callback's keyword argument, the manifest's and the record's key."""
        return self.name.removeprefix(PREFIX)


# `_opt` records each field's group and choices in declaration order; `_grouped` pairs them with the dataclass's fields.
# (HfArgumentParser passes a field's metadata to argparse as keyword arguments, so the group cannot live there.)
_PENDING: list[tuple[str, tuple[str, ...] | None]] = []


def _opt(default: Any, help: str, group: str, choices: tuple[str, ...] | None = None) -> Any:
    if group not in GROUPS:
        raise ValueError(f"unknown option group {group!r}")
    if "%" in help:  # argparse expands % in help texts: `python recipes/sft.py --help` would crash
        raise ValueError(f"an option's help may not contain '%': {help!r}")
    _PENDING.append((group, choices))
    metadata = {"help": help}
    if choices is not None:
        metadata["choices"] = choices  # argparse checks a value given on the command line
    return field(default=default, metadata=metadata)


def _grouped(cls: type) -> type:
    fields = dataclasses.fields(cls)
    if len(fields) != len(_PENDING):
        raise TypeError(f"every field of {cls.__name__} must be declared with _opt(...)")
    cls.__forgetwatch_options__ = {f.name: extra for f, extra in zip(fields, _PENDING, strict=True)}
    _PENDING.clear()
    return cls


@_grouped
@dataclass
class ForgetWatchArguments:
    """forgetwatch's options, for `TrlParser` / `HfArgumentParser` scripts, YAML recipes and front-end configs.

    Field names are the callback's argument names with a `forgetwatch_` prefix, because the trainer's own arguments
    already have `eval_steps` and `seed`. `forgetwatch options` lists them with their meanings (`forgetwatch docs options`:
    the page).

    Example:
        >>> from trl import SFTConfig, TrlParser
        >>> training_args, fw_args = TrlParser((SFTConfig, ForgetWatchArguments)).parse_args_and_config()  # doctest: +SKIP
        >>> trainer = SFTTrainer(..., callbacks=[ForgetWatchCallback.from_args(fw_args)])  # doctest: +SKIP
    """

    # -- probes and scoring ------------------------------------------------------------------------------------------
    forgetwatch_probes: str | None = _opt(
        None, "Probe set: a JSONL file, or comma-separated built-in suite names (e.g. 'arc_easy,mmlu,triviaqa'). Unset "
        "turns forgetwatch off.", PROBES)
    forgetwatch_eval_steps: int = _opt(50, "Score the probes every this many optimizer steps (and at the end).", PROBES)
    forgetwatch_max_share: float | None = _opt(
        None, "Keep probing within this share of train() (e.g. 0.1), averaged over the run: steps 0 and the last, and "
        "every step a checkpoint is saved at, are full passes; the evaluations between score the probes that just "
        "flipped, those due (every probe at least every K evaluations), the most at risk and a seeded random sample of "
        "the rest, each kind with its own share, and log F, BT and accuracy as estimates with intervals, flagged "
        f"forgetwatch/partial ({docs_hint('max-share')}). null: every evaluation scores every probe. `forgetwatch "
        "watch` always does.",
        PROBES)
    forgetwatch_per_suite: int | None = _opt(
        100, "With suite names: probes per suite, stratified by category (null: all).", PROBES)
    forgetwatch_seed: int = _opt(0, "With suite names: the subsampling seed.", PROBES)
    forgetwatch_base_cache: str | None = _opt(
        None, "The base model's results (from `forgetwatch cache`). Absent or not matching: the base is scored when "
        "training starts and written to <output_dir>/forgetwatch/base.parquet.", PROBES)
    forgetwatch_mcq_mode: str = _opt(
        "loglik", "Multiple choice: loglik (log-likelihood of each option's text), loglik_norm (per character), letter "
        "(the option letters' logits) or generate (decode, extract the letter).", PROBES, MCQ_MODES)
    forgetwatch_chat_template: bool | None = _opt(
        None, "Wrap prompts in the chat template (null: for generation only, when the tokenizer has one).", PROBES)
    forgetwatch_cot: bool = _opt(False, "Generative probes: ask for reasoning and a final 'Answer:' line.", PROBES)
    forgetwatch_max_new_tokens: int | None = _opt(
        None, "Generation budget of generative knowledge probes (null: 32, or 256 with cot).", PROBES)
    forgetwatch_short_mode: str | None = _opt(
        None, "Short answers: greedy_match (one forward: would greedy decoding give an accepted answer?) or generate "
        "(decode, extract, match). Null: greedy_match, generate with cot.", PROBES, SHORT_MODES)
    forgetwatch_short_match: str = _opt(
        "exact", "With short_mode generate: exact (normalised exact match) or contains (an accepted answer as whole "
        "words). Numeric answers are compared as numbers (math-verify).", PROBES, SHORT_MATCHES)
    forgetwatch_behavior_max_new_tokens: int = _opt(
        BEHAVIOR_MAX_NEW_TOKENS, "Generation budget of behaviour probes (instruct, comply): an answer that reaches it "
        "without ending its turn is a runaway.", PROBES)
    forgetwatch_batch_size: int = _opt(16, "Questions per forward pass (halved on out-of-memory).", PROBES)
    forgetwatch_engine: str = _opt(
        "hf", "What runs the model: hf (the model in this process, a refilling batch), continuous (transformers' "
        "continuous batching for generation; falls back to hf with a warning where it cannot run), or vllm (vLLM loads "
        "the model's directory itself: `forgetwatch cache`, `compare`, `interpolate`, and sidecar scoring, where "
        "`forgetwatch watch` scores the base again with vLLM; not in-loop scoring; needs vllm installed). The same "
        "answers up to near-ties in the last bits; a cache scored by vLLM is not taken by the others, nor theirs by it.",
        PROBES, ENGINES)
    forgetwatch_robustness: int = _opt(
        0, "Score this many variants of each knowledge probe besides itself (option orders, question frames, lower "
        "case, typos) for robust accuracy, consistency and position bias. 0: off. Each variant costs about one probe.",
        PROBES)
    forgetwatch_robust_per_suite: int | None = _opt(
        None, "With robustness: variants of only this many probes per suite, a seeded draw (null: every knowledge "
        "probe).", PROBES)
    forgetwatch_unfit_probes: str = _opt(
        "refuse", "Probes longer than the model's context (prompt and answer, or prompt and the tokens it may generate): "
        "refuse (stop before training starts, naming them and their suites) or drop (score the rest, with a warning; "
        "the record, the base cache and the W&B config then hold the smaller set).", PROBES, UNFIT_PROBES)
    forgetwatch_probe_change: str = _opt(
        "refuse", "A resume whose probes are not the ones the record's evaluations were scored on (ids added or removed, "
        "a probe's content changed; another order is no change): refuse (stop before anything is scored, naming what "
        "changed) or new_segment (the record so far moves, whole, to forgetwatch/segments/ and goes on with the new probes "
        "from the resumed step; `forgetwatch report` names both segments).", PROBES, PROBE_CHANGES)
    forgetwatch_scoring: str = _opt(
        "inline", "inline: score in the training process; sidecar: save a checkpoint at each evaluation step and leave "
        "the scoring to `forgetwatch watch OUTPUT_DIR` in another process.", PROBES, SCORING_MODES)
    # -- logging -----------------------------------------------------------------------------------------------------
    forgetwatch_console: bool = _opt(
        True, "Print one line per evaluation on the main process, beside the Trainer's own log lines: F and BT with "
        "their 95 percent intervals, the worst category, behaviour, probing seconds (false: quiet).", LOGGING)
    forgetwatch_log_table: bool = _opt(True, "Log a W&B table of the probes that flipped at each evaluation.", LOGGING)
    forgetwatch_wandb_workspace: bool = _opt(
        False, "At train start, when the run logs to W&B online, save a W&B workspace named forgetwatch for its project: "
        "the overview first (forgetting, backward transfer, adjusted, behaviour, budget), then by category. Needs "
        f"wandb-workspaces and a logged-in W&B; offline it is skipped; a failure is a warning ({docs_hint('wandb')}).",
        LOGGING)
    forgetwatch_replay: bool = _opt(
        False, "Write the forgotten probes to <output_dir>/forgetwatch/replay.jsonl as training examples.", LOGGING)
    forgetwatch_at_risk_margin: float = _opt(
        2.0, "A probe right at base and still right is at risk when its margin (nats) is below this (chosen on a "
        f"calibration run: {results_url(7)}).", LOGGING)
    forgetwatch_at_risk_drop: float | None = _opt(
        None, "...or, when set, when its margin has fallen by this many nats since base (null: off; the drop did not "
        "predict flips).", LOGGING)
    # -- budgets and alerts ------------------------------------------------------------------------------------------
    forgetwatch_budget: dict | str | None = _opt(
        None, "Upper limits on figures named as in metrics.jsonl (forgetting, forgetting_adjusted, margin_drop, kl, "
        "runaway, over_refusal, ...; overall or '<category>/<metric>'): a mapping in YAML, or "
        "'forgetting_adjusted=0.05,mmlu_stem/forgetting=0.1' on the command line. Null: no budget.", BUDGETS)
    forgetwatch_on_budget: str = _opt(
        "alert", "When a limit is exceeded: alert (a W&B / trackio alert, a warning and a record event), save (also save "
        "a checkpoint there) or stop (also stop training).", BUDGETS, ON_BUDGET)
    forgetwatch_budget_bound: str = _opt(
        "lower", "lower: a limit is exceeded when the lower end of the 95 percent interval is above it (noise pages "
        "nobody); point: when the measured value is.", BUDGETS, BUDGET_BOUNDS)
    # -- remedies ----------------------------------------------------------------------------------------------------
    forgetwatch_replay_mix: float = _opt(
        0.0, "Replay: the share of training examples drawn from the replay pool (0: off; e.g. 0.1). Needs max_steps.",
        REMEDIES)
    forgetwatch_replay_pool: str | None = _opt(
        None, "The pool replay, the anchor and the penalty draw from: suite names (their probes except the monitored "
        "ones), a probe JSONL, or a JSONL of training examples with a `category` (null: the rest of the monitored "
        "suites).", REMEDIES)
    forgetwatch_replay_strategy: str = _opt(
        "closed_loop", "How pool items are drawn: closed_loop (categories that forget get more, with a floor) or uniform.",
        REMEDIES, REPLAY_STRATEGIES)
    forgetwatch_replay_targets: str = _opt(
        "gold", "What replay trains toward: gold (the pool's gold answers) or base (the base model's own answers, made "
        "once into forgetwatch_base_outputs: self-distilled replay).", REMEDIES, REPLAY_TARGETS)
    forgetwatch_base_outputs: str | None = _opt(
        None, "The base model's answers and top-k log-probabilities on the pool (replay_targets base, the KL anchor): "
        "made before training when absent, reused when it matches, never overwritten (null: "
        "<output_dir>/base_outputs.parquet).", REMEDIES)
    forgetwatch_anchor_beta: float = _opt(
        0.0, "KL anchor: the weight of KL(base || model) on the answer tokens of pool conversations (0: off; 5 cut "
        f"held-out forgetting by a third in {results_url(18)}).", REMEDIES)
    forgetwatch_anchor_ratio: float = _opt(
        0.1, "KL anchor: pool conversations drawn per training example, in addition to it.", REMEDIES)
    forgetwatch_penalty_beta: float = _opt(
        0.0, "1→0 penalty: its strength (0: off; e.g. 1.0). With forgetwatch_penalty_scale task_gradient (the default), "
        "the penalty's gradient at a micro-batch where it pulls is beta times the task loss's gradient in norm, so "
        "gradient clipping scales both alike; with loss, beta weighs max(0, min(base margin, floor) − margin now) "
        "directly.", REMEDIES)
    forgetwatch_penalty_scale: str = _opt(
        "task_gradient", "1→0 penalty: task_gradient: beta is the penalty's gradient norm relative to the task loss's, "
        "measured at each micro-batch where it pulls (one more backward of each there; not under FSDP or DeepSpeed); "
        "loss: beta weighs the hinge in nats as a loss (under gradient clipping a step where it pulls is the "
        f"penalty's whatever beta: {results_url(18)}).", REMEDIES, ("task_gradient", "loss"))
    forgetwatch_penalty_ratio: float = _opt(
        0.1, "1→0 penalty: pool items drawn per training example.", REMEDIES)
    forgetwatch_penalty_floor: float = _opt(
        2.0, "1→0 penalty: the margin (nats) worth defending: an item is pulled back when its margin falls below its "
        "base margin or this, whichever is smaller.", REMEDIES)
    forgetwatch_rewind: bool = _opt(
        False, "Rewind: at the end of training, score the model moved back toward the base, θ(α) = base + α (final − "
        "base), at each α of forgetwatch_rewind_alphas on the monitored probes and the task loss (the trainer's eval "
        f"set, or forgetwatch_rewind_data), pick α by the rule of {docs_hint('rewind', 'rule')} and save that model to "
        "<output_dir>/rewound/ (the front and the pick: <output_dir>/forgetwatch/rewind.json). Needs a task measure or "
        "forgetwatch_budget. Single-process, inline scoring only (else: `forgetwatch rewind OUTPUT_DIR` after training).",
        REMEDIES)
    forgetwatch_rewind_data: str | None = _opt(
        None, "Rewind: the task loss on this JSONL of held-out examples (text, messages, or prompt + completion; as "
        "`forgetwatch interpolate --task-data` reads) instead of the trainer's eval set (which DPO and GRPO batches "
        "cannot give: they carry no language-model labels).", REMEDIES)
    forgetwatch_rewind_alphas: str = _opt(
        "0.5:1:0.1", "Rewind: the α grid (start:stop:step, or a list such as 0.6,0.8,1; 1 is always scored: it must "
        f"reproduce the final evaluation). The default spans where stepping back paid in {results_url(18)} (α 0.6–0.8) "
        "for 6 scorings of the probes and the task loss.", REMEDIES)
    forgetwatch_rewind_heldout: str | None = _opt(
        None, "Rewind: held-out probes (suite names or a probe JSONL), scored at the base, the picked α and the final "
        "model and reported apart: the pick never reads them.", REMEDIES)

    def __post_init__(self) -> None:
        _check_values(self)

    def unprefixed(self) -> dict[str, Any]:
        """The options by their short names (the callback's keyword arguments, the manifest's keys)."""
        return {f.name.removeprefix(PREFIX): getattr(self, f.name) for f in dataclasses.fields(self)}

    def to_kwargs(self) -> dict[str, Any]:
        """The callback's keyword arguments: every option but the remedies' (`forgetwatch.remedies` reads those)."""
        return {o.short: getattr(self, o.name) for o in options() if o.group != REMEDIES}


# Options whose value is a count: a whole number of at least 1 (or null, where the option takes null).
COUNTS = ("forgetwatch_eval_steps", "forgetwatch_per_suite", "forgetwatch_max_new_tokens",
          "forgetwatch_behavior_max_new_tokens", "forgetwatch_batch_size", "forgetwatch_robust_per_suite")


def count(text: str) -> int:
    """A count on the command line: a whole number of at least 1 (argparse names the flag with the message).

    Example:
        >>> count("4")
        4
        >>> count("0")
        Traceback (most recent call last):
        argparse.ArgumentTypeError: 0: must be a whole number of at least 1
    """
    import argparse

    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: must be a whole number of at least 1") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n}: must be a whole number of at least 1")
    return n


# Options whose value is an amount: a finite number of at least 0 (or null, where the option takes null).
AMOUNTS = ("forgetwatch_at_risk_margin", "forgetwatch_at_risk_drop")


def amount(text: str) -> float:
    """An amount on the command line (nats, a share): a finite number of at least 0; NaN and infinity are refused.

    Example:
        >>> amount("2.5")
        2.5
        >>> amount("nan")
        Traceback (most recent call last):
        argparse.ArgumentTypeError: 'nan': must be a finite number of at least 0
    """
    import argparse

    try:
        x = float(text)
    except ValueError:
        x = math.nan
    if not math.isfinite(x) or x < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be a finite number of at least 0")
    return x


# Values earlier versions wrote for an option, read as today's (records, checkpoints and YAML stay valid).
LEGACY_VALUES: dict[str, dict[Any, Any]] = {"forgetwatch_robustness": {None: 0}}  # off was None before it was 0


def read_legacy(name: str, value: Any) -> Any:
    """`value` of option `name` as today's: a value an earlier version wrote for it (`LEGACY_VALUES`) is translated."""
    table = LEGACY_VALUES.get(name, {})
    try:
        return table.get(value, value)
    except TypeError:  # unhashable (a budget's mapping): nothing to translate
        return value


def _check_values(args: ForgetWatchArguments) -> None:
    """The checks that need no model and no probes: choices, ranges, options that exclude each other."""
    import logging

    for name in LEGACY_VALUES:
        setattr(args, name, read_legacy(name, getattr(args, name)))
    for o in options():
        value = getattr(args, o.name)
        if o.choices is not None and value not in o.choices and not (value is None and o.default is None):
            raise ValueError(f"{o.name} must be one of {', '.join(o.choices)}, got {value!r}")
    for name, what in (("forgetwatch_anchor_beta", "the KL anchor"), ("forgetwatch_penalty_beta", "the 1→0 penalty")):
        try:
            setattr(args, name, check_beta(getattr(args, name), what))
        except ValueError as e:
            raise ValueError(f"{name}: {e}") from None
    for name, what, low, high in (("forgetwatch_anchor_ratio", "pool conversations per training example", 0, 8),
                                  ("forgetwatch_penalty_ratio", "pool items per training example", 0, 8),
                                  ("forgetwatch_penalty_floor", "nats", 0, math.inf)):
        value = getattr(args, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low < value <= high:
            raise ValueError(f"{name} ({what}) must be in ({low}, {high}], got {value!r}")
    # Messages name options as the callback's keywords (`eval_steps`, on_budget=); a front-end's config check
    # (forgetwatch.integrations.config) names them as its keys (forgetwatch_eval_steps).
    every = args.forgetwatch_eval_steps
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ValueError(f"`eval_steps` must be a positive integer, got {every!r}")
    for name in AMOUNTS:
        value = getattr(args, name)
        if value is None and "None" in describe(name).type:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise ValueError(f"`{name.removeprefix(PREFIX)}` must be a finite number of at least 0, got {value!r}")
    for name in COUNTS:
        value = getattr(args, name)
        if value is None and "None" in describe(name).type:  # null has its meaning (`per_suite`: all)
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"`{name.removeprefix(PREFIX)}` must be a whole number of at least 1, got {value!r}")
    share = args.forgetwatch_max_share
    if share is not None and (isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share < 1):
        raise ValueError(f"`max_share` must be a number between 0 and 1 (the share of train() probing may take, e.g. "
                         f"0.1), or None to score every probe at every evaluation; got {share!r}")
    scoring, on_budget = args.forgetwatch_scoring, args.forgetwatch_on_budget
    if scoring == "sidecar" and args.forgetwatch_budget and on_budget in ("save", "stop"):
        raise ValueError(f"on_budget={on_budget!r} needs the scores inside the training process, and scoring='sidecar' "
                         "scores in `forgetwatch watch`: use on_budget='alert' (the watcher raises the alert) or "
                         "scoring='inline'")
    engine = args.forgetwatch_engine
    if scoring == "inline" and engine in DIRECTORY_ENGINES:
        raise EngineUnavailableError(f"engine={engine!r} loads a model from its directory and cannot score the model in "
                                     f"training: pass scoring='sidecar' and run `forgetwatch watch OUTPUT_DIR --engine "
                                     f"{engine}` beside training (it scores each saved checkpoint), or use engine='hf'")
    if args.forgetwatch_penalty_beta and args.forgetwatch_anchor_beta:
        raise ValueError("forgetwatch_penalty_beta and forgetwatch_anchor_beta: one term at a time (each is measured "
                         "on its own in benchmarks/RESULTS.md); set one of them to 0")
    if args.forgetwatch_replay_targets == "base" and not args.forgetwatch_replay_mix:
        logging.getLogger(__name__).warning(
            "forgetwatch: forgetwatch_replay_targets=base does nothing while forgetwatch_replay_mix is 0: set the replay "
            "share (e.g. 0.1)")


def check_beta(beta: Any, what: str = "the KL anchor") -> float:
    """A loss term's weight (the anchor's, the penalty's): a finite number ≥ 0 (0 is off)."""
    if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not math.isfinite(beta) or beta < 0:
        raise ValueError(f"{what}'s `beta` must be a number >= 0 (0 turns it off; e.g. 1.0), got {beta!r}")
    return float(beta)


def options() -> list[Option]:
    """Every option, in declaration order (grouped).

    Example:
        >>> [o.short for o in options() if o.group == "budgets and alerts"]
        ['budget', 'on_budget', 'budget_bound']
    """
    extra = ForgetWatchArguments.__forgetwatch_options__
    # the annotations as written: HfArgumentParser rewrites a field's `type` in place (Optional[X] -> X) when it parses
    types = ForgetWatchArguments.__annotations__
    return [Option(f.name, _type_name(types[f.name]), f.default, f.metadata["help"], *extra[f.name])
            for f in dataclasses.fields(ForgetWatchArguments)]


def describe(name: str) -> Option:
    """One option, by its full or short name; an unknown name raises `KeyError` naming the closest."""
    by_name = {o.name: o for o in options()}
    full = name if name.startswith(PREFIX) else PREFIX + name
    if full not in by_name:
        raise KeyError(_unknown(name, by_name))
    return by_name[full]


def default(name: str) -> Any:
    """An option's default, by its short name: how `ScoringConfig` and the CLI take theirs."""
    return describe(name).default


def _unknown(name: str, known: Any) -> str:
    short = [k.removeprefix(PREFIX) for k in known]
    folded = name.removeprefix(PREFIX).lower().replace("-", "_")  # case and separators aside ("Eval-Steps")
    close = [folded] if folded in short else difflib.get_close_matches(folded, short, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"unknown forgetwatch option {name!r}: {hint}`forgetwatch options` lists them"


def options_from_kwargs(**kwargs: Any) -> ForgetWatchArguments:
    """`ForgetWatchArguments` from the callback's keyword arguments, each by its short name (`eval_steps`) or by the
    name `forgetwatch options`, the configs and the messages show (`forgetwatch_eval_steps`); an unknown one is refused
    by name, and so is one option given under both names.

    Example:
        >>> options_from_kwargs(probes="arc_easy", forgetwatch_eval_steps=10).forgetwatch_eval_steps
        10
        >>> options_from_kwargs(probes="arc_easy", eval_stpes=10)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        TypeError: unknown forgetwatch option 'eval_stpes': did you mean 'eval_steps'? ...
    """
    known = {f.name for f in dataclasses.fields(ForgetWatchArguments)}
    values: dict[str, Any] = {}
    for name, value in kwargs.items():
        full = name if name.startswith(PREFIX) else PREFIX + name
        if full not in known:
            raise TypeError(_unknown(name, known))
        if full in values:
            raise TypeError(f"forgetwatch option {full.removeprefix(PREFIX)!r} given twice (as "
                            f"{full.removeprefix(PREFIX)!r} and {full!r}): keep one")
        values[full] = value
    return ForgetWatchArguments(**values)


def options_from_record(values: Mapping[str, Any]) -> ForgetWatchArguments:
    """The options as a record holds them (the sidecar manifest's `callback`, a checkpoint's callback state), by short
    name, written by any version: a name this version does not know is left out, a missing one takes its default.

    Example:
        >>> options_from_record({"eval_steps": 5, "robustness": None, "gone": 1}).forgetwatch_robustness
        0
    """
    known = {f.name for f in dataclasses.fields(ForgetWatchArguments)}
    return ForgetWatchArguments(**{PREFIX + k: v for k, v in values.items() if PREFIX + k in known})


def _type_name(t: Any) -> str:
    return str(t).replace("typing.", "") if not isinstance(t, type) else t.__name__


def _yaml(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def format_options(group: str | None = None, width: int = 100) -> str:
    """The options as `forgetwatch options` prints them: by group, each with its default and meaning."""
    lines = []
    for g in GROUPS if group is None else (group,):
        lines.append(f"{g}:")
        for o in options():
            if o.group != g:
                continue
            choices = f" {{{','.join(o.choices)}}}" if o.choices else ""
            lines.append(f"  {o.name} ({o.type}, default {_yaml(o.default)}){choices}")
            lines += textwrap.wrap(o.help, width, initial_indent="      ", subsequent_indent="      ")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def options_markdown() -> str:
    """docs/options.md: the reference page, generated (`forgetwatch options --markdown > docs/options.md`)."""
    out = ["# Options: every `forgetwatch_*` option, its default and meaning", "",
           "<!-- Generated by `forgetwatch options --markdown > docs/options.md` from forgetwatch/options.py; a test "
           "fails when it is stale. -->",
           "",
           "Every `forgetwatch_*` option, as a YAML key of the recipes, the Axolotl plugin and `forgetwatch llamafactory "
           "train`, a `--forgetwatch_*` flag of `recipes/*.py`, and, without the prefix, a keyword argument of "
           "`ForgetWatchCallback`. A number that turns something on is off at 0; an optional setting is off (or "
           "decided for you) at `null`.", ""]
    for g in GROUPS:
        out += [f"## {g[0].upper() + g[1:]}", "", "| option | type | default | meaning |", "|---|---|---|---|"]
        for o in options():
            if o.group == g:
                choices = f" One of: {', '.join(f'`{c}`' for c in o.choices)}." if o.choices else ""
                text = (o.help + choices).replace("|", "\\|").replace("<", "&lt;")  # not an HTML tag
                out.append(f"| `{o.name}` | {o.type.replace('|', 'or')} | `{_yaml(o.default)}` | {text} |")
        out.append("")
    return "\n".join(out)


def options_doc(prefixed: bool = True, groups: tuple[str, ...] = GROUPS) -> str:
    """The options' meanings as a docstring section, so that `help(ForgetWatchArguments)` shows them."""
    lines = ["", "    Options (`forgetwatch options`; the page: `forgetwatch docs options`):"]
    for g in groups:
        lines.append(f"        {g}:")
        for o in options():
            if o.group == g:
                name = o.name if prefixed else o.short
                lines += textwrap.wrap(f"{name} (default {_yaml(o.default)}): {o.help}", 110,
                                       initial_indent="            ", subsequent_indent="                ")
    return "\n".join(lines) + "\n"


_UNSET = object()


def add_flag(parser: Any, name: str, *, default: Any = _UNSET, note: str = "", **overrides: Any) -> None:
    """The CLI flag of an option (`--mcq-mode` for `mcq_mode`): its type, choices, default and meaning from the one
    declaration. `default=None` for a flag whose absence means "as the cache / the run"; `note` is added to the help;
    `overrides` are argparse's own (e.g. `choices` where the command line spells values otherwise).

    Example:
        >>> import argparse
        >>> p = argparse.ArgumentParser()
        >>> add_flag(p, "batch_size")
        >>> p.parse_args([]).batch_size, p.parse_args(["--batch-size", "4"]).batch_size
        (16, 4)
    """
    import argparse

    o = describe(name)
    value = o.default if default is _UNSET else default
    kinds = {"int": int, "float": float, "str": str, "dict": str}
    base = o.type.split(" | ")[0]
    kwargs: dict[str, Any] = {"default": value, "help": o.help + note}
    if base == "bool":
        kwargs["action"] = argparse.BooleanOptionalAction
    else:
        kwargs["type"] = count if o.name in COUNTS else amount if o.name in AMOUNTS else kinds[base]
        if o.choices is not None:
            kwargs["choices"] = o.choices
    kwargs.update(overrides)
    parser.add_argument("--" + o.short.replace("_", "-"), **kwargs)


def changed(args: ForgetWatchArguments, names: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The options set to something other than their default, by full name (for messages and summaries)."""
    return {o.name: getattr(args, o.name) for o in options() if getattr(args, o.name) != o.default
            and (names is None or o.name in names)}


ForgetWatchArguments.__doc__ += options_doc()
