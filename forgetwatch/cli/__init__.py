"""The `forgetwatch` command line: build probe sets, score a base model once, compare any checkpoint with it.

    forgetwatch probes build arc_easy mmlu sciq triviaqa --per-suite 100 --seed 0 -o probes.jsonl
    forgetwatch probes show probes.jsonl
    forgetwatch cache   --model <dir or hub id> --probes probes.jsonl -o base.parquet
    forgetwatch compare --model <checkpoint>    --probes probes.jsonl --base base.parquet [--json]
    forgetwatch compare BEFORE AFTER            # two lm-eval --log_samples outputs, or two lighteval details
    forgetwatch report  <output_dir> [-o DIR]
    forgetwatch rewind  <output_dir> [--data FILE] [--budget ...]   # the final model stepped back toward its base
    forgetwatch llamafactory train config.yaml [key=value ...]   # a LLaMA-Factory YAML with forgetwatch_* keys
    forgetwatch options [--markdown]                             # every forgetwatch_* option and its meaning
    forgetwatch wandb-workspace --entity E --project P --run <output_dir> [--dry-run]   # a W&B workspace, overview first
    forgetwatch docs [TOPIC [SECTION]]                           # the docs pages (trainer, lora, options, ...)

One module per command group (probes, cache and base-outputs, compare, interpolate, rewind, watch and report,
llamafactory, options, docs), options they share in `common`. They parse, call the library, and print; torch and the rest load
when a command runs.
"""

from __future__ import annotations

import argparse
import logging
import sys
import traceback

from ..probes.probe_set import ProbeFormatError
from ..versions import __version__
from .cache import add_base_outputs, add_cache
from .compare import add_compare
from .docs import add_docs
from .interpolate import add_interpolate
from .llamafactory import add_llamafactory
from .options import add_options
from .probes import add_probes
from .rewind import add_rewind
from .watch import add_report, add_watch
from .workspace import add_workspace

__all__ = ["main", "build_parser"]


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if not getattr(args, "func", None):
        # `forgetwatch probes` alone prints the help of `probes`, not of the whole command
        (getattr(args, "help_parser", None) or parser).print_help()
        return 2
    try:
        return args.func(args) or 0
    except (ProbeFormatError, ValueError, OSError, ImportError) as e:  # OSError: also a Hub id that cannot be fetched
        if args.verbose:  # -v: the traceback too, for a bug report
            traceback.print_exc()
        print(f"forgetwatch: error: {e}", file=sys.stderr)
        return 2


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="forgetwatch", description="See what your model forgets: per-probe 1→0 / 0→1 tracking.")
    p.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    p.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = p.add_subparsers(title="commands", metavar="COMMAND")
    for add in (add_probes, add_cache, add_base_outputs, add_compare, add_report, add_interpolate, add_rewind, add_watch,
                add_llamafactory, add_options, add_workspace, add_docs):
        add(sub)
    return p


def _version() -> str:

    return __version__
