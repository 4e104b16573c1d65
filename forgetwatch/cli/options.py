"""`forgetwatch options`: every forgetwatch_* option with its default and meaning, grouped (`--markdown`: the page)."""

from __future__ import annotations

import argparse

from ..docs import docs_hint
from ..options import GROUPS, format_options, options_markdown


def add_options(sub) -> None:
    """`options`."""
    o = sub.add_parser("options", help="list every forgetwatch_* option with its default and meaning",
                       description="Every option of ForgetWatchArguments: a YAML key of the recipes, the Axolotl plugin and "
                                   "`forgetwatch llamafactory train`, a --forgetwatch_* flag of recipes/*.py, and (without "
                                   "the prefix) a keyword argument of ForgetWatchCallback.")
    o.add_argument("--group", choices=GROUPS, default=None, help="only this group")
    o.add_argument(
        "--markdown",
        action="store_true",
        help=f"print the reference page as markdown instead ({docs_hint('options')} prints it as shipped)",
    )
    o.set_defaults(func=cmd_options)


def cmd_options(args: argparse.Namespace) -> int:
    if args.markdown and args.group:
        raise ValueError("--markdown prints the whole page: leave out --group")
    print(options_markdown() if args.markdown else format_options(args.group), end="")
    return 0
