"""`forgetwatch probes build | show | suites`: probe sets from the built-in suites, and what a probe file holds."""

from __future__ import annotations

import argparse
import json
from collections import Counter

from ..options import count
from ..probes.probe_set import ProbeSet
from ..probes.suites import from_suites, list_suites
from .common import check_output, exists_error, follow_link


def add_probes(sub) -> None:
    """`probes` and its commands."""
    probes_parser = sub.add_parser("probes", help="build, inspect and list probe sets")
    probes_parser.set_defaults(help_parser=probes_parser)
    probes = probes_parser.add_subparsers(title="probes commands", metavar="COMMAND")
    b = probes.add_parser("build", help="build a probe set from built-in suites")
    b.add_argument("suites", nargs="+", help="suite names (see `forgetwatch probes suites`)")
    b.add_argument("--per-suite", type=count, default=None, help="probes per suite, stratified by category (default: all)")
    b.add_argument("--seed", type=int, default=0, help="subsampling seed (default 0)")
    b.add_argument("-o", "--output", required=True, help="the .jsonl file to write; an existing file is kept unless --force")
    b.add_argument("--force", action="store_true", help="replace the -o file if it exists")
    b.set_defaults(func=cmd_probes_build)
    s = probes.add_parser("show", help="summarise a probe file and print a few probes")
    s.add_argument("path", help="a probe JSONL file")
    s.add_argument("-n", type=count, default=3, help="probes to print (default 3)")
    s.set_defaults(func=cmd_probes_show)
    ls = probes.add_parser("suites", help="list the built-in suites")
    ls.set_defaults(func=cmd_probes_suites)


def cmd_probes_build(args: argparse.Namespace) -> int:
    args.output = follow_link(args.output)
    if check_output(args.output, (".jsonl",), "probes.jsonl") and not args.force:
        raise exists_error(args.output, "a probe file")
    probes = from_suites(args.suites, per_suite=args.per_suite, seed=args.seed)
    probes.to_jsonl(args.output)
    print(f"wrote {len(probes)} probes to {args.output} (fingerprint {probes.fingerprint})")
    _print_summary(probes)
    return 0


def cmd_probes_show(args: argparse.Namespace) -> int:
    probes = ProbeSet.from_jsonl(args.path)
    print(f"{args.path}: {len(probes)} probes, fingerprint {probes.fingerprint}")
    _print_summary(probes)
    for p in list(probes)[: args.n]:
        print()
        print(json.dumps(p.to_dict(), ensure_ascii=False, indent=1))
    return 0


def cmd_probes_suites(args: argparse.Namespace) -> int:

    for name in list_suites():
        print(name)
    return 0


def _print_summary(probes: ProbeSet) -> None:
    by_cat = Counter(p.category for p in probes)
    kinds = Counter(p.kind if p.kind != "mcq" else f"mcq k={p.num_choices}" for p in probes)
    print("kinds: " + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())))
    print("categories: " + ", ".join(f"{c} {n}" for c, n in sorted(by_cat.items())))
