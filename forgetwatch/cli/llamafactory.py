"""`forgetwatch llamafactory train`: a LLaMA-Factory YAML with forgetwatch_* keys, trained with the callback."""

from __future__ import annotations

import argparse
import sys

from ..docs import docs_hint
from ..integrations import llamafactory


def add_llamafactory(sub) -> None:
    """`llamafactory` and its command."""
    lf_parser = sub.add_parser("llamafactory", help="run a LLaMA-Factory YAML with forgetwatch_* keys (training needs "
                                                    f"llamafactory 0.9.5 installed; {docs_hint('llamafactory')})")
    lf_parser.set_defaults(help_parser=lf_parser)
    lf = lf_parser.add_subparsers(title="llamafactory commands", metavar="COMMAND")
    t = lf.add_parser("train", help="train as `llamafactory-cli train` does, with the forgetwatch callback",
                      description="Reads the config and key=value overrides as `llamafactory-cli train` does, checks the "
                                  "forgetwatch_* keys (a misspelt key or a wrong type is named with its file and line "
                                  "before anything is trained), takes them out and runs LLaMA-Factory's run_exp with "
                                  "ForgetWatchCallback. Several GPUs: re-runs itself under torchrun, as "
                                  "`torchrun --nproc_per_node N -m forgetwatch.integrations.llamafactory config.yaml`.")
    t.add_argument("config", help="a LLaMA-Factory .yaml (or .json) config; `model_name_or_path: smollm2` is the offline "
                                  "SmolLM2-135M-Instruct")
    t.add_argument("overrides", nargs="*", metavar="key=value", help="overrides, as `llamafactory-cli train` takes them")
    t.add_argument("--check", action="store_true", help="check the config (forgetwatch's keys, then LLaMA-Factory's own "
                                                        "parser) and train nothing; without LLaMA-Factory installed, "
                                                        "forgetwatch's keys only (the output says so)")
    t.set_defaults(func=cmd_llamafactory_train)


def cmd_llamafactory_train(args: argparse.Namespace) -> int:

    if args.check:
        llamafactory.check(args.config, args.overrides)
        return 0
    fw_args, rest = llamafactory.prepare(args.config, args.overrides)  # bad keys: one line from main(), nothing trained
    try:
        return llamafactory.launch(fw_args, rest, args.config, args.overrides)
    except Exception:  # LLaMA-Factory's own errors while training keep their traceback
        import traceback

        traceback.print_exc()
        print("forgetwatch: LLaMA-Factory stopped with the error above", file=sys.stderr)
        return 1
