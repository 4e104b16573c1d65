"""`forgetwatch docs [TOPIC [SECTION]]`: the docs pages shipped in the package, for a user who has no clone."""

from __future__ import annotations

import argparse

from ..docs import DOCS_URL, read_page, section, topics


def add_docs(sub) -> None:
    """`docs`."""
    d = sub.add_parser("docs", help="print a docs page (the pages of the repository's docs/, shipped in the package); "
                                    "alone, list the pages",
                       description="Prints a docs page as markdown, its links made links into the repository "
                                   f"({DOCS_URL}). Without a topic, lists the pages with their titles.")
    d.add_argument("topic", nargs="?", default=None, help="the page, e.g. trainer, options, rewind, lora")
    d.add_argument("section", nargs="*", help="only the section whose heading starts with (or else holds) these words, "
                                                "e.g. `forgetwatch docs cli interpolate`")
    d.set_defaults(func=cmd_docs)


def cmd_docs(args: argparse.Namespace) -> int:
    if args.topic is None:
        pages = topics()
        width = max(map(len, pages), default=0)
        for topic, title in pages.items():
            print(f"  {topic:<{width}}  {title}")
        print(f"\n`forgetwatch docs TOPIC` prints a page; online: {DOCS_URL}")
        return 0
    page = read_page(args.topic)
    if args.section:
        try:
            page = section(page, " ".join(args.section))
        except ValueError as e:
            raise ValueError(f"docs page {args.topic!r}: {e}") from None
    print(page, end="")
    return 0
