"""`forgetwatch wandb-workspace`: save a W&B workspace laid out for forgetwatch's figures (`forgetwatch.run.wandb_workspace`)."""

from __future__ import annotations

import argparse
import json
import sys

from ..run.wandb_workspace import describe, save_workspace, sections_of_record


def add_workspace(sub) -> None:
    """`wandb-workspace`."""
    w = sub.add_parser(
        "wandb-workspace", help="save a W&B workspace that opens on forgetting and backward transfer",
        description="Build a W&B workspace for the runs of ENTITY/PROJECT: an overview section first (forgetting, "
                    "backward transfer, their chance-adjusted forms, behaviour, the budget's state, the flips table), then "
                    "each overview figure with every category on one chart, then the other figures. Its panels are the "
                    "keys the run in --run logs (its record's figures; the base evaluation is enough). Saving needs "
                    "network and a logged-in W&B (`wandb login`); --dry-run prints what it would save, offline. Needs "
                    "wandb-workspaces: pip install 'forgetwatch[workspace]'.")
    w.add_argument("--entity", required=True, help="the W&B entity (user or team) of the project")
    w.add_argument("--project", required=True, help="the W&B project whose runs the workspace shows")
    w.add_argument("--name", default="forgetwatch", help="the workspace's name (default: forgetwatch)")
    w.add_argument("--run", required=True, metavar="OUTPUT_DIR",
                   help="a training output directory with a forgetwatch record: its figures and categories decide the panels")
    w.add_argument("--dry-run", action="store_true", help="print the sections and panels it would save; save nothing")
    w.add_argument("--json", action="store_true", help="like --dry-run, as JSON")
    w.set_defaults(func=cmd_workspace)


def cmd_workspace(args: argparse.Namespace) -> int:

    sections = sections_of_record(args.run)
    if args.json:
        print(json.dumps(describe(sections, args.entity, args.project, args.name), indent=1))
        return 0
    if args.dry_run:
        print(f"workspace {args.name!r} for {args.entity}/{args.project} (x axis: train/global_step)")
        for s in sections:
            print(f"  section {s.name!r}{' (pinned)' if s.pinned else ''}{'' if s.is_open else ' (closed)'}")
            for p in s.panels:
                print(f"    {'table' if p.table else 'plot'} {p.title}: {', '.join(p.keys)}")
        return 0
    try:
        url = save_workspace(sections, args.entity, args.project, args.name)
    except ImportError:
        raise  # the extra to install: said by the command line as any missing package
    except Exception as e:  # W&B's own errors (no login, no network, no such entity): a line, not a traceback
        print(f"forgetwatch: error: could not save the workspace to W&B ({type(e).__name__}: {e}). Log in (`wandb "
              "login`) and check the entity and the network; --dry-run or --json shows it without W&B", file=sys.stderr)
        return 2
    print(f"saved: {url}")
    return 0
