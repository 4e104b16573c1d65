"""`forgetwatch rewind OUTPUT_DIR`: a finished run's final model moved back toward its base, α picked and saved
(`forgetwatch.remedies.rewind`)."""

from __future__ import annotations

import argparse
import sys

from .._io import strict_json
from ..docs import docs_hint
from ..measures.drift import RiskRule
from ..options import add_flag, count, describe
from ..remedies.rewind import rewind
from ..remedies.sweep import format_interpolation
from .common import device


def add_rewind(sub) -> None:
    """`rewind`."""
    rp = sub.add_parser(
        "rewind",
        help="a finished run's final model stepped back toward its base: θ(α) scored on the run's probes and a "
        "task loss, α picked by a stated rule, the model saved to OUTPUT_DIR/rewound/",
        description="Scores θ_base + α(θ_final − θ_base) at each α of the grid on the run's monitored probes (against its "
        f"base cache, in its precision) and on a task loss, picks α ({docs_hint('rewind', 'rule')}: the lowest task loss "
        "within the run's budget, else the knee of the front), saves that model to OUTPUT_DIR/rewound/ and "
        "writes the front and the pick to OUTPUT_DIR/forgetwatch/rewind.json (the report shows them). α = 1 "
        "must give the run's final evaluation: checked, and said loudly when it does not.",
    )
    rp.add_argument("output_dir", help="the trainer's output_dir of a finished run (inline or watched by `forgetwatch watch`)")
    rp.add_argument("--checkpoint", default=None, help="the model to rewind (default: the final model saved in OUTPUT_DIR, "
                                                       "else its latest checkpoint-N)")
    rp.add_argument("--base", default=None, help="the run's base cache (default: the record's base.parquet)")
    rp.add_argument("--base-model", default=None, help="the base model's directory or Hub id (default: the cache's model)")
    rp.add_argument("--alphas", default=describe("rewind_alphas").default, help=describe("rewind_alphas").help)
    rp.add_argument("--data", default=None, help="the task loss on this JSONL of held-out examples (text, messages, or "
                                                 "prompt + completion; nats per answer token)")
    rp.add_argument("--data-max-examples", type=count, default=200, help="with --data: at most this many examples (default 200)")
    rp.add_argument("--data-max-length", type=count, default=1024,
                    help="with --data: examples cut at this many tokens, as training cut them (default 1024)")
    rp.add_argument("--heldout", default=None, help=describe("rewind_heldout").help)
    add_flag(rp, "budget", default=None, note=" Default: the run's (its record's budget.json).")
    add_flag(rp, "budget_bound", default=None, note=" Default: the run's.")
    add_flag(rp, "batch_size", default=None, note=" Default: the run's where its record says it, else the option's.")
    add_flag(rp, "at_risk_margin", default=None, note=" Only the α = 1 check's at-risk count reads it: the run's "
             "(default: a sidecar run's, else the option's default).")
    add_flag(rp, "at_risk_drop", default=None, note=" As the run's.")
    rp.add_argument("--device", type=device, default=None, help="cuda, cpu, ... (default: cuda when available)")
    rp.add_argument("--no-save", action="store_true", help="score and pick only: no OUTPUT_DIR/rewound/ (refused while one "
                    "exists, which rewind.json would no longer describe, unless --force)")
    rp.add_argument("--force", action="store_true", help="replace an existing OUTPUT_DIR/rewound/ (with --no-save: remove it "
                    "with the decision that made it)")
    rp.add_argument("--allow-other-model", action="store_true",
                    help="the checkpoint's architecture differs from the base cache's model: rewind anyway")
    rp.add_argument("--json", action="store_true", help="print rewind.json")
    rp.set_defaults(func=cmd_rewind)


def cmd_rewind(args: argparse.Namespace) -> int:

    risk_rule = None
    if args.at_risk_margin is not None or args.at_risk_drop is not None:
        risk_rule = RiskRule(describe("at_risk_margin").default if args.at_risk_margin is None else args.at_risk_margin,
                             args.at_risk_drop)
    result = rewind(args.output_dir, checkpoint=args.checkpoint, base_cache=args.base, base_model=args.base_model,
                    alphas=args.alphas, task_data=args.data, task_max_examples=args.data_max_examples,
                    task_max_length=args.data_max_length, heldout=args.heldout, budget=args.budget,
                    budget_bound=args.budget_bound, batch_size=args.batch_size,
                    risk_rule=risk_rule, device=args.device,
                    save=not args.no_save, force=args.force, allow_other_model=args.allow_other_model,
                    progress=lambda alpha, i, n: print(f"α = {alpha:g} ({i} of {n})", file=sys.stderr, flush=True),
                    announce=lambda line: print(line, file=sys.stderr, flush=True))
    if args.json:
        print(strict_json(result.data, indent=1))
        return 0
    steps = [{"alpha": p["alpha"], "metrics": p["metrics"], "task": p["task"], "within_budget": p["within_budget"]}
             for p in result.data["front"]]
    task = result.data["task"]
    print(format_interpolation(steps, "loss" if task else None,  # the task measure as this command names it
                               "--data" if task and args.data else "the trainer's eval set"))
    print(f"\nrule: {result.data['rule']}")
    print(result.line())
    print(f"front and pick: {result.path}")
    return 0
