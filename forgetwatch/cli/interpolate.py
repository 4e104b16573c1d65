"""`forgetwatch interpolate`: the options of an interpolation sweep (`forgetwatch.remedies.sweep`), checked before any model is
loaded, and its figures printed, plotted, and the model saved at one α."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .._io import strict_json
from ..commands import quote
from ..docs import docs_hint
from ..measures.budgets import Budget, parse_budget
from ..options import add_flag, count
from ..probes.suites import load_probes
from ..remedies.alpha import front_points, pick_alpha
from ..remedies.sweep import (
    InterpolationSweep,
    format_interpolation,
    plot_interpolation,
    resolve_base_model,
)
from .common import (
    check_output,
    device,
    exists_error,
    follow_link,
    read_base,
    read_probes,
    same_file,
    scoring_args,
    scoring_config,
)


def add_interpolate(sub) -> None:
    """`interpolate`."""
    ip = sub.add_parser(
        "interpolate", help="score a checkpoint interpolated toward its base (θ_base + α(θ_ft − θ_base)) at each α, against the "
        "base cache, beside a task measure: what stepping back toward the base buys in forgetting and costs on the task",
        description="WiSE-FT without training: for each α of the grid the weights are θ_base + α(θ_ft − θ_base) (a LoRA "
                    "adapter is scaled by α), streamed in slices of a tensor (one model in memory), and scored as `compare` "
                    f"scores a checkpoint. α = 0 is the base, α = 1 the checkpoint. More: {docs_hint('cli', 'interpolate')}.")
    ip.add_argument(
        "--model", required=True, help="the fine-tuned checkpoint: a model directory (safetensors) or a LoRA adapter directory"
    )
    ip.add_argument("--probes", required=True, help="the probe set of the base cache: a JSONL file or suite names")
    ip.add_argument("--base", required=True, help="the base cache made by `forgetwatch cache`")
    ip.add_argument("--base-model", default=None,
                    help="the base model's directory (or Hub id; `smollm2`) (default: the model the base cache was made with)")
    ip.add_argument("--alphas", default=None, help="the grid: 0,0.5,1 or start:stop:step (default 0:1:0.1)")
    ip.add_argument("--extrapolate", action="store_true", help="allow α outside [0, 1]")
    ip.add_argument("--task-data", default=None, help="task measure: the held-out loss on this JSONL, or dataset (a "
                                                      "directory or Hub name; text, messages, or prompt + completion rows; "
                                                      "nats per answer token; lower is better)")
    ip.add_argument("--task-split", default="test", help="with a dataset in --task-data: its split (default test)")
    ip.add_argument(
        "--task-max-examples", type=count, default=200, help="with --task-data: at most this many examples (default 200)"
    )
    ip.add_argument("--task-max-length", type=count, default=1024,
                    help="with --task-data: examples cut at this many tokens, as training cut them (default 1024)")
    ip.add_argument("--task-probes", default=None, help="task measure: accuracy on this probe set of the task (e.g. gsm8k)")
    ip.add_argument("--task-per-suite", type=count, default=None, help="with suite names in --task-probes: probes per suite")
    add_flag(ip, "budget", note=" The best α within it is chosen.")
    add_flag(ip, "budget_bound")
    ip.add_argument("--json", action="store_true", help="print every α's figures as JSON")
    ip.add_argument("--plot", default=None, help="write a PNG of forgetting against the task measure, α by α (the Pareto front)")
    ip.add_argument("--save-at", nargs=2, metavar=("ALPHA", "OUT"), default=None,
                    help="also write the model at ALPHA to the directory OUT (refused if it exists, unless --force)")
    ip.add_argument("--force", action="store_true", help="replace --save-at's OUT or the --plot file if it exists")
    ip.add_argument("--allow-other-model", action="store_true",
                    help="the checkpoint's architecture differs from the base cache's model: compare anyway")
    ip.add_argument("--revision", default=None, help=argparse.SUPPRESS)
    ip.add_argument("--device", type=device, default=None, help="cuda, cpu, ... (default: cuda when available)")
    scoring_args(ip, defaults=False, robustness=False)  # it scores no variants: --robustness would be ignored
    ip.set_defaults(func=cmd_interpolate)


def cmd_interpolate(args: argparse.Namespace) -> int:
    from ..remedies.interpolate import InterpolationError, alpha_grid, load_task_data

    # everything that can be refused is refused before a model is loaded
    alphas = alpha_grid(args.alphas, args.extrapolate)
    save_at = None
    if args.save_at:
        try:
            at = alpha_grid(args.save_at[0], args.extrapolate)
        except InterpolationError as e:
            raise InterpolationError(str(e).replace("--alphas", "--save-at")) from None
        if len(at) != 1:
            raise InterpolationError(f"--save-at {args.save_at[0]}: give one α to save the model at (e.g. --save-at 0.5 "
                                     "OUT), not a grid")
        save_at = (at[0], Path(follow_link(args.save_at[1], "--save-at ALPHA")))
        _check_save_at(save_at[1], {"--model": args.model, "--probes": args.probes, "--base": args.base,
                                    "--task-data": args.task_data, "--task-probes": args.task_probes,
                                    "--base-model": args.base_model})
        if save_at[1].exists() and not args.force:
            raise exists_error(str(save_at[1]), "a directory or file", "--save-at ALPHA")
    if args.plot:
        args.plot = follow_link(args.plot, "--plot")
        try:
            import matplotlib  # noqa: F401  (an extra: known missing now, not after the scoring)
        except ImportError as e:
            raise ValueError(f"--plot {args.plot}: the plot is drawn with matplotlib, which cannot be imported ({e}): pip "
                             "install 'forgetwatch[report]', or leave out --plot") from None
    if args.plot and check_output(args.plot, (".png",), "front.png", {"--probes": args.probes, "--base": args.base,
                                  "--task-data": args.task_data, "--model": args.model}, option="--plot") and not args.force:
        raise exists_error(args.plot, "a file", "--plot")
    if args.task_max_length < 2:
        raise ValueError(f"--task-max-length {args.task_max_length}: an example needs at least 2 tokens to have a loss")
    task_rows = load_task_data(args.task_data, args.task_max_examples, args.task_split) if args.task_data else None
    task_probes = load_probes(args.task_probes, per_suite=args.task_per_suite, seed=args.seed) if args.task_probes else None
    if task_rows is not None and task_probes is not None:
        raise ValueError("give one task measure: --task-data (held-out loss) or --task-probes (accuracy), not both")
    probes = read_probes(args)
    base = read_base(args.base, probes)
    config, dtype, autocast = scoring_config(args, base.key)
    budget = Budget(parse_budget(args.budget), "alert", args.budget_bound, probes.groups) if args.budget else None
    base_name, base_dir = resolve_base_model(args.base_model, base, args.base, args.allow_other_model)
    if save_at is not None:
        _check_save_at(save_at[1], {"the base model's directory": str(base_dir)})
    sweep = InterpolationSweep(args.model, base_dir, probes, base, config, dtype=dtype, autocast=autocast,
                               device=args.device, base_name=base_name, cache_path=args.base, task_rows=task_rows,
                               task_probes=task_probes, task_max_length=args.task_max_length, task_source=args.task_data,
                               budget=budget, allow_other_model=args.allow_other_model)
    if sweep.differences:
        print(f"forgetwatch interpolate: warning: every α is scored with the checkpoint's tokenizer and generation "
              f"settings (θ(α) ships with them), and they differ from the base's in {'; '.join(sweep.differences)}: α = 0 "
              "is the base's weights under them, so its figures need not be zero (the cache scored the base under its own)",
              file=sys.stderr)
    steps = sweep.run(alphas, progress=lambda alpha, i, n: print(f"α = {alpha:g} ({i} of {n})", file=sys.stderr, flush=True))
    task_kind = sweep.task_kind
    # the rule rewind picks by (forgetwatch.remedies.alpha.RULE); with neither a budget nor a task measure, no pick
    pick = pick_alpha(front_points(steps), budget is not None, task_kind or "loss") if budget or task_kind else None
    chosen = pick.alpha if pick is not None else None
    # the figures first: a plot or a model that cannot be written must not take the scoring with it
    if args.json:
        print(strict_json({"model": args.model, "base": args.base, "base_model": str(base_dir), "task": task_kind,
                           "budget": budget.to_dict() if budget else None, "chosen_alpha": chosen,
                           "chosen_by": pick.why if pick is not None else None, "alphas": steps}, indent=1))
    else:
        print(format_interpolation(steps, task_kind))
        if pick is not None:
            limits = f" (budget {', '.join(f'{k}={v:g}' for k, v in budget.to_dict()['limits'].items())})" if budget else ""
            print(f"\npicked{limits}: α = {chosen:g}, {pick.why}")
    sys.stdout.flush()
    if args.plot:
        plot_interpolation(steps, task_kind, args.plot, chosen)
    if save_at is not None:
        sweep.save(*save_at)  # lets the scoring model go first: θ(α) is written from the two directories
        print(f"wrote the model at α = {save_at[0]:g} to {save_at[1]}", file=sys.stderr)
    return 0


def _check_save_at(out: Path, inputs: dict[str, str | None]) -> None:
    """Refuse a `--save-at` directory that is an input or holds one (the old one is removed when the new is in place,
    even with --force), or whose parent cannot be written: before any model is loaded, not after the scoring."""
    for flag, given in inputs.items():
        if not given or not Path(given).exists():  # a model name, not a path: nothing on this disk to lose
            continue
        given_path = Path(given)
        if same_file(out, given_path) or (out.exists() and out.resolve() in given_path.resolve().parents):
            raise ValueError(f"--save-at {out}: {'is' if same_file(out, given_path) else 'holds'} {flag} ({given}); "
                             "writing the model there would remove it. Choose another directory (this is refused even "
                             "with --force)")
    parent = out.absolute().parent
    if not parent.is_dir():
        raise ValueError(f"--save-at {out}: the directory {parent} does not exist. Create it first (mkdir -p "
                         f"{quote(parent)}) or choose another place")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"--save-at {out}: cannot write in {parent}; choose another place")
