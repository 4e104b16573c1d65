"""Every link in the README and the docs lands: the file exists and, with an anchor, so does the heading or `<a id>`.

GitHub's heading anchors: lower case, punctuation dropped (letters, digits, `_`, `-` and spaces kept), spaces to `-`,
a repeated heading gets `-1`, `-2`. Links to the repository's own GitHub URL are checked as local paths; other URLs
are not fetched (no network here). A link to a section of benchmarks/RESULTS.md ("§N") must carry its anchor (`#sN`):
the file is over a thousand lines, and a link to its top makes the reader search.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REPO_URL = re.compile(r"https://github\.com/forgetwatch/forgetwatch/(?:blob|tree)/main/([^#?]*)(#.*)?$")
PAGES = sorted([ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "recipes" / "README.md",
                ROOT / "benchmarks" / "RESULTS.md", *(ROOT / "docs").glob("*.md")])
LINK = re.compile(
    r"!?\[(?P<text>[^\]]*)\]\((?P<target>[^)\s]+)(?:\s+\"[^\"]*\")?\)|<(?:img|a)\s[^>]*?(?:src|href)=\"(?P<html>[^\"]+)\""
)


def _prose(text: str) -> str:
    """The text without fenced code blocks and inline code, where brackets are not links."""
    text = re.sub(r"^(```|~~~).*?^\1", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def slug(heading: str) -> str:
    heading = re.sub(r"<[^>]+>", "", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", heading).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = page.read_text()
    found, seen = set(), {}
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*$", re.sub(r"^(```|~~~).*?^\1", "", text, flags=re.S | re.M), re.M):
        base = slug(heading)
        n = seen.get(base, 0)
        found.add(base if n == 0 else f"{base}-{n}")
        seen[base] = n + 1
    found.update(re.findall(r"<a\s+(?:id|name)=\"([^\"]+)\"", text))
    return found


def links(page: Path) -> list[tuple[int, str, str]]:
    out = []
    for lineno, line in enumerate(_prose(page.read_text()).splitlines(), 1):
        for m in LINK.finditer(line):
            out.append((lineno, m.group("text") or "", m.group("target") or m.group("html")))
    return out


def resolve(page: Path, target: str) -> tuple[Path | None, str | None]:
    """(the file, the anchor) a link points to; (None, None) for a URL outside the repository."""
    if m := REPO_URL.match(target):
        return ROOT / m.group(1), (m.group(2) or "#")[1:] or None
    if re.match(r"^[a-z]+:", target):
        return None, None
    path, _, anchor = target.partition("#")
    return (page.parent / path).resolve() if path else page, anchor or None


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_lands(page):
    broken = []
    for lineno, text, target in links(page):
        file, anchor = resolve(page, target)
        if file is None:
            continue
        where = f"{page.relative_to(ROOT)}:{lineno}: [{text}]({target})"
        if not file.exists():
            broken.append(f"{where}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{where}: no heading or <a id> {anchor!r} in {file.relative_to(ROOT)}")
        elif file.name == "RESULTS.md" and "§" in text and not anchor:
            broken.append(f"{where}: name the section (RESULTS.md#sN), not the top of the file")
    assert not broken, "\n".join(broken)


def test_the_checker_sees_a_broken_anchor_and_a_missing_file(tmp_path):
    (tmp_path / "a.md").write_text("# Title\n\n## Scoring beside training: `watch`\n\n<a id=\"s3\"></a>\n")
    page = tmp_path / "b.md"
    page.write_text("[ok](a.md#scoring-beside-training-watch) [ok](a.md#s3) [bad](a.md#nope) [gone](c.md)\n"
                    "`[code](nowhere.md)`\n```\n[in a block](nowhere.md)\n```\n")
    assert anchors(tmp_path / "a.md") == {"title", "scoring-beside-training-watch", "s3"}
    found = [(t, resolve(page, t)) for _, _, t in links(page)]
    assert [t for t, _ in found] == ["a.md#scoring-beside-training-watch", "a.md#s3", "a.md#nope", "c.md"]
    assert [a for _, (_, a) in found] == ["scoring-beside-training-watch", "s3", "nope", None]


def test_the_readme_is_a_short_path():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) < 150, f"README.md has {len(lines)} lines: move detail to docs/ (the issue's limit is 150)"


def test_every_test_the_guarantees_name_exists():
    """docs/guarantees.md holds each promise to a named test: a renamed or removed test must not leave a promise that
    no test keeps."""
    text = (ROOT / "docs" / "guarantees.md").read_text()
    named = set(re.findall(r"\b(test_\w+)\b", text)) - {f.stem for f in (ROOT / "tests").rglob("test_*.py")}
    defined = set()
    for path in (ROOT / "tests").rglob("*.py"):
        defined.update(re.findall(r"^\s*def (test_\w+)\(", path.read_text(), re.M))
    assert named, "docs/guarantees.md names no test"
    assert not sorted(named - defined), f"docs/guarantees.md names tests that do not exist: {sorted(named - defined)}"
