"""The module map in CONTRIBUTING.md, made from the package itself: each folder and module with the first sentence of
its docstring, in the order of the stages.

    python tools/module_map.py            # print it
    python tools/module_map.py --write    # replace the map between the markers in CONTRIBUTING.md

tests/test_package.py fails when CONTRIBUTING.md's map differs from what this prints.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "forgetwatch"
CONTRIBUTING = ROOT / "CONTRIBUTING.md"
BEGIN, END = "<!-- module map: tools/module_map.py -->", "<!-- end of module map -->"
# The stages in the order data flows through them: a folder imports only from folders before it (tests/test_package.py).
STAGES = ("answers", "probes", "scoring", "measures", "record", "run", "remedies", "report", "integrations", "cli")
WIDTH = 118


def summary(path: Path) -> str:
    """The first sentence of a module's docstring, on one line."""
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    para = " ".join(doc.split("\n\n")[0].split())
    m = re.match(r"(.+?[\w)`'\"][.!?])(\s+[A-Z`(]|$)", para)  # a sentence's end, not "et al." or "e.g."
    return (m.group(1) if m else para).rstrip(".")


def _lines(name: str, text: str, indent: int) -> list[str]:
    lead = " " * indent + name.ljust(max(28 - indent, len(name) + 1))
    words, out, line = text.split(), [], lead
    for w in words:
        if len(line) + 1 + len(w) > WIDTH and line.strip() != name:
            out.append(line.rstrip())
            line = " " * len(lead) + w
        else:
            line = f"{line} {w}" if line != lead else lead + w
    out.append(line.rstrip())
    return out


def module_map() -> str:
    out = ["forgetwatch/"]
    top = sorted(p for p in PACKAGE.glob("*.py"))
    for p in top:
        out += _lines(p.name, summary(p), 2)
    for stage in STAGES:
        folder = PACKAGE / stage
        out += _lines(f"{stage}/", summary(folder / "__init__.py"), 2)
        for p in sorted(folder.rglob("*.py")):
            rel = p.relative_to(folder)
            if rel.name == "__init__.py" and rel.parent == Path("."):
                continue
            name = (rel.parent.as_posix() + "/") if rel.name == "__init__.py" else rel.as_posix()
            out += _lines(name, summary(p), 4)
    return "\n".join(out) + "\n"


def block() -> str:
    return f"{BEGIN}\n```\n{module_map()}```\n{END}"


def main(argv: list[str]) -> int:
    if "--write" in argv:
        text = CONTRIBUTING.read_text()
        start, end = text.index(BEGIN), text.index(END) + len(END)
        CONTRIBUTING.write_text(text[:start] + block() + text[end:])
        return 0
    print(module_map(), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
