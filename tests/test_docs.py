"""`forgetwatch docs`: the docs pages a wheel user has, and the pointers messages give to them."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import forgetwatch
from forgetwatch.cli import main
from forgetwatch.docs import REPOSITORY, _absolute_links, docs_hint, read_page, section, topics

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = Path(forgetwatch.__file__).parent


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_every_page_is_a_topic_with_its_title():
    pages = sorted(p.stem for p in (ROOT / "docs").glob("*.md"))
    assert list(topics()) == pages and "lora" in pages
    assert topics()["trainer"] == "The callback in your own Trainer / TRL code"
    assert all(topics().values()), topics()


def test_docs_alone_lists_the_topics(capsys):
    code, out, _ = run(capsys, "docs")
    assert code == 0
    for topic, title in topics().items():
        assert re.search(rf"^  {topic} +{re.escape(title)}$", out, re.M), topic
    assert f"{REPOSITORY}/tree/main/docs" in out


def test_docs_prints_a_page_with_links_a_wheel_user_can_open(capsys):
    code, out, _ = run(capsys, "docs", "rewind")
    assert code == 0 and out.startswith("# Rewind")
    assert f"]({REPOSITORY}/blob/main/docs/cli.md#interpolate-" in out  # docs/rewind.md links cli.md
    assert not re.findall(r"\]\((?!https?:|#)[^)]*\)", out)  # no relative link left


def test_links_are_made_absolute():
    text = "[a](rewind.md#the-rule) [b](../benchmarks/RESULTS.md#s) [c](https://x.org/y.md) [d](#here) [e](./cli.md)"
    assert _absolute_links(text) == (
        f"[a]({REPOSITORY}/blob/main/docs/rewind.md#the-rule) [b]({REPOSITORY}/blob/main/benchmarks/RESULTS.md#s) "
        f"[c](https://x.org/y.md) [d](#here) [e]({REPOSITORY}/blob/main/docs/cli.md)")


def test_a_section_alone(capsys):
    code, out, _ = run(capsys, "docs", "cli", "interpolate")
    assert code == 0 and out.startswith("## Interpolate") and "\n## " not in out
    assert run(capsys, "docs", "rewind", "the", "rule")[1].startswith("## The rule")


def test_unknown_topic_names_the_nearest_and_lists_them(capsys):
    code, _, err = run(capsys, "docs", "trainr")
    assert code == 2
    assert "no docs page 'trainr'; the nearest is 'trainer'" in err
    assert all(t in err for t in topics())


def test_unknown_section_lists_the_sections(capsys):
    code, _, err = run(capsys, "docs", "rewind", "nosuch")
    assert code == 2 and "docs page 'rewind': no section 'nosuch'" in err and "The rule" in err


def _hints() -> list[tuple[str, str, str | None]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "docs_hint":
                args = [a.value for a in node.args]
                found.append((path.relative_to(PACKAGE).as_posix(), args[0], args[1] if len(args) > 1 else None))
    return found


def test_every_docs_hint_names_a_page_and_a_section_that_exist():
    hints = _hints()
    assert len(hints) >= 8, hints
    for where, topic, name in hints:
        page = read_page(topic)
        if name:
            assert " " not in name, f"{where}: a one-word section reads as one argument of `forgetwatch docs`"
            section(page, name)


def test_no_message_points_to_a_docs_file():
    """A wheel has no docs/ folder: messages, help texts and docstrings point to `forgetwatch docs TOPIC`
    (`docs_hint`). Only the maintainers' lines about generating docs/options.md and docs.py itself name the folder."""
    stray = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "docs.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                for m in re.finditer(r"docs/\w+\.md", node.value):
                    if "options --markdown > docs/options.md" not in node.value:
                        stray.append(f"{path.relative_to(PACKAGE)}: {m.group(0)}")
    assert not stray, stray


def test_docs_hint():
    assert docs_hint("trainer") == "`forgetwatch docs trainer`"
    assert docs_hint("cli", "interpolate") == "`forgetwatch docs cli interpolate`"
    assert docs_hint("lora", url=True) == f"`forgetwatch docs lora` or {REPOSITORY}/blob/main/docs/lora.md"


def test_pyproject_ships_the_pages_and_lists_every_package():
    tomllib = pytest.importorskip("tomllib")
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    tool = config["tool"]["setuptools"]
    folders = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "forgetwatch").rglob("__init__.py")}
    assert sorted(tool["packages"]) == sorted(folders | {"forgetwatch._docs"})
    assert tool["package-dir"] == {"forgetwatch._docs": "docs"} and tool["package-data"]["forgetwatch._docs"] == ["*.md"]
    urls = config["project"]["urls"]
    assert urls["Repository"] == REPOSITORY and urls["Documentation"] == f"{REPOSITORY}/tree/main/docs"


def test_docs_help_exits_0_and_is_in_the_command_list(capsys):
    with pytest.raises(SystemExit) as e:
        main(["docs", "--help"])
    assert e.value.code == 0 and capsys.readouterr().out.startswith("usage: forgetwatch docs")
    with pytest.raises(SystemExit):
        main(["--help"])
    assert re.search(r"^    docs +print a docs page", capsys.readouterr().out, re.M)
