"""Which releases of the libraries forgetwatch leans on are installed, and how they differ from the tested lock.

`make setup` installs `requirements/locked.txt`, the set CI tested; `make test-latest` builds a second venv with the
newest releases and prints, before its tests, which of them moved past the lock. Paste the output of
`python -m forgetwatch.versions` into a bug report.

Example:
    $ python -m forgetwatch.versions --against requirements/locked.txt
    package          installed   locked
    transformers     5.25.0      5.24.0  differs from the lock
    ...
"""

from __future__ import annotations

import argparse
import re
import sys
from importlib.metadata import PackageNotFoundError, distributions, version
from pathlib import Path

# forgetwatch's own release (pyproject.toml's `version`), read by `forgetwatch --version` and the report page.
__version__ = "0.1.0"

__all__ = ["__version__", "LEANED_ON", "installed_versions", "release", "read_lock", "read_lock_text", "freeze"]

# The libraries whose releases can break forgetwatch: the core, the trainers and the loggers it hooks into, and the
# evaluation harness whose outputs it reads.
LEANED_ON = ("torch", "transformers", "accelerate", "datasets", "tokenizers", "huggingface_hub", "safetensors",
             "numpy", "pyarrow", "math-verify", "trl", "peft", "wandb", "trackio", "tensorboard", "mlflow-skinny",
             "lm_eval", "matplotlib", "if-verifiable")

# Never pinned by the lock: torch is chosen by the setup step (a CPU wheel here, the user's CUDA build elsewhere), and
# its CUDA runtime packages follow it; the project itself is installed editable.
_UNLOCKED = re.compile(r"^(torch|triton|nvidia-.*|forgetwatch)$")


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def installed_versions(packages: tuple[str, ...] = LEANED_ON) -> dict[str, str | None]:
    """`{package: installed version or None}` for each of `packages`."""
    found: dict[str, str | None] = {}
    for name in packages:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found


def release(version: str) -> tuple[int, ...]:
    """`(0, 20, 2)` from "0.20.2" (at most three numbers; pre-release and local parts dropped), for comparisons."""
    return tuple(int(x) for x in re.findall(r"\d+", version.split("+")[0])[:3])


def read_lock(path: str | Path) -> dict[str, str]:
    """`{canonical name: version}` from a constraints file of `name==version` lines (comments and blanks skipped).

    Raises ValueError naming the file and line for any other line.
    """
    return read_lock_text(Path(path).read_text(), str(path))


def read_lock_text(text: str, source: str = "<lock>") -> dict[str, str]:
    """`read_lock` on the text of a lock; `source` names it in errors."""
    pins: dict[str, str] = {}
    for i, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)", line)
        if m is None:
            raise ValueError(f"{source} line {i}: expected `name==version`, got {raw!r}")
        pins[_canonical(m.group(1))] = m.group(2)
    return pins


def freeze() -> str:
    """Every installed distribution but torch, its CUDA packages and forgetwatch, as sorted `name==version` lines."""
    pins = {}
    for dist in distributions():
        name = dist.metadata["Name"]
        if name and not _UNLOCKED.match(_canonical(name)):
            pins[_canonical(name)] = dist.version
    return "".join(f"{n}=={v}\n" for n, v in sorted(pins.items()))


def _table(against: str | None) -> str:
    pins = read_lock(against) if against else {}
    rows = [("package", "installed", "locked" if against else "", "")]
    for name, ver in installed_versions().items():
        locked = pins.get(_canonical(name), "")
        note = "" if not (against and ver and locked) or ver == locked else "differs from the lock"
        rows.append((name, ver or "-", locked, note))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    return "\n".join(f"{a:<{widths[0]}}  {b:<{widths[1]}}  {c:<{widths[2]}}  {d}".rstrip() for a, b, c, d in rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m forgetwatch.versions", description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", metavar="LOCK", help="mark the packages whose version differs from this lock file")
    parser.add_argument("--freeze", action="store_true", help="print a lock of everything installed (what `make lock` writes)")
    args = parser.parse_args(argv)
    if args.freeze:
        sys.stdout.write("# The versions CI tested: `make setup` installs them (pip -c). Written by `make lock`; torch is\n"
                         "# chosen by the setup step (TORCH in the Makefile), so it is not pinned here.\n")
        sys.stdout.write(f"# Python {sys.version.split()[0]}\n")
        sys.stdout.write(freeze())
        return 0
    print(f"python  {sys.version.split()[0]}")
    print(_table(args.against))
    return 0


if __name__ == "__main__":
    sys.exit(main())
