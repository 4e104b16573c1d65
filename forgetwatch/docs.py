"""The docs pages shipped in the package (`docs/*.md` of the repository, installed as `forgetwatch._docs`).

A wheel user has no `docs/` folder, so messages and `--help` texts point to `forgetwatch docs TOPIC` (which prints the
page) through `docs_hint`, and the printed page's relative links are made absolute links into the repository.

Example:
    >>> from forgetwatch.docs import docs_hint
    >>> docs_hint("cli", "interpolate")
    '`forgetwatch docs cli interpolate`'
    >>> docs_hint("rewind", url=True)
    '`forgetwatch docs rewind` or https://github.com/forgetwatch/forgetwatch/blob/main/docs/rewind.md'
"""

from __future__ import annotations

import difflib
import importlib.resources
import re
from pathlib import Path

__all__ = ["DOCS_URL", "REPOSITORY", "docs_hint", "page_url", "read_page", "results_url", "section", "topics"]

REPOSITORY = "https://github.com/forgetwatch/forgetwatch"
DOCS_URL = f"{REPOSITORY}/tree/main/docs"
_BLOB = f"{REPOSITORY}/blob/main"


def docs_hint(topic: str, section: str | None = None, *, url: bool = False) -> str:
    """The pointer a message gives to a docs page: the command that prints it, and with `url=True` the page online.

    A test checks that every `docs_hint` call in the package names a page and a section that exist.
    """
    hint = f"`forgetwatch docs {topic}{f' {section}' if section else ''}`"
    return f"{hint} or {page_url(topic)}" if url else hint


def results_url(section: int) -> str:
    """A section of benchmarks/RESULTS.md on GitHub (where a figure a message quotes was measured; a wheel has no
    benchmarks/)."""
    return f"{_BLOB}/benchmarks/RESULTS.md#s{section}"


def page_url(topic: str) -> str:
    """The page in the repository on GitHub."""
    return f"{_BLOB}/docs/{topic}.md"


def _pages() -> dict[str, Path]:
    # a wheel holds them as forgetwatch._docs (pyproject maps docs/ there); an editable install (setuptools' finder
    # cannot map a subpackage without __init__.py) and a clone on PYTHONPATH read docs/ beside the package
    try:
        root = importlib.resources.files("forgetwatch._docs")
        found = {p.name[:-3]: p for p in root.iterdir() if p.name.endswith(".md")}
    except ModuleNotFoundError:
        found = {}
    if not found:
        checkout = Path(__file__).resolve().parents[1]
        if (checkout / "pyproject.toml").is_file():
            found = {p.stem: p for p in (checkout / "docs").glob("*.md")}
    return dict(sorted(found.items()))


def topics() -> dict[str, str]:
    """Every page's topic (its file name) and its one-line description (its title)."""
    return {t: _title(p.read_text(encoding="utf-8")) for t, p in _pages().items()}


def _title(text: str) -> str:
    return next((line[2:].replace("`", "").strip() for line in text.splitlines() if line.startswith("# ")), "")


def read_page(topic: str) -> str:
    """The page's markdown, with its relative links made links into the repository (a wheel has no clone to open).

    Raises:
        ValueError: an unknown topic, naming the nearest and listing them all.
    """
    pages = _pages()
    if topic not in pages:
        if not pages:
            raise ValueError(f"no docs pages are installed with this forgetwatch: read them at {DOCS_URL}")
        close = difflib.get_close_matches(topic.lower(), pages, n=1, cutoff=0.0)
        raise ValueError(f"no docs page {topic!r}; the nearest is {close[0]!r}. The pages: {', '.join(pages)} "
                         "(`forgetwatch docs` lists them with their titles)")
    return _absolute_links(pages[topic].read_text(encoding="utf-8"))


def section(text: str, name: str) -> str:
    """The section of a page whose heading starts with `name` (case and backticks aside), down to the next heading of
    its level or above; a ValueError lists the page's sections when none does."""
    lines = text.splitlines(keepends=True)
    heads = [(i, len(m.group(1)), m.group(2)) for i, line in enumerate(lines)
             if (m := re.match(r"(#{2,6}) (.*)", line))]
    key = _plain(name)
    hit = (next((h for h in heads if _plain(h[2]).startswith(key)), None)
           or next((h for h in heads if key in _plain(h[2])), None))
    if hit is None:
        names = "; ".join(h[2] for h in heads)
        raise ValueError(f"no section {name!r} on this page; its sections: {names}")
    start, level, _ = hit
    end = next((i for i, lvl, _ in heads if i > start and lvl <= level), len(lines))
    return "".join(lines[start:end])


def _plain(heading: str) -> str:
    return heading.replace("`", "").strip().lower()


def _absolute_links(text: str) -> str:
    # [text](page.md#anchor) and [text](../benchmarks/RESULTS.md) -> the same file on GitHub; URLs and #anchors are kept
    def fix(m: re.Match) -> str:
        target = m.group(2)
        if re.match(r"[a-z]+:|#|/", target):
            return m.group(0)
        parts = []
        for part in ("docs/" + target).split("/"):
            if part == "..":
                parts = parts[:-1]
            elif part not in ("", "."):
                parts.append(part)
        return f"{m.group(1)}({_BLOB}/{'/'.join(parts)})"

    return re.sub(r"(\]\s?)\(([^)\s]+)\)", fix, text)
