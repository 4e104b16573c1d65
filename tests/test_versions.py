"""forgetwatch.versions and the version files: the lock `make setup` installs, the floors `make test-oldest` checks."""

from __future__ import annotations

import re
from importlib.metadata import version
from pathlib import Path

import pytest

from forgetwatch import versions

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

REPO = Path(__file__).resolve().parents[1]


def floors() -> dict[str, str]:
    """`{name: floor}` of pyproject's dependencies and optional dependencies that have one."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    deps = project["dependencies"] + [d for group in project["optional-dependencies"].values() for d in group]
    found = {}
    for dep in deps:
        m = re.match(r"([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?>=([^,;\s]+)", dep)
        if m:
            found[versions._canonical(m.group(1))] = m.group(2)
    return found


# Floors below the oldest set's, tested by another CI target because TRL 1.0 (in the oldest set) needs more:
# {name: (floor, the Makefile target that installs that version)}.
TESTED_ELSEWHERE = {"datasets": ("4.0", "check-llamafactory")}  # llamafactory 0.9.5 pins datasets <= 4.0.0


def test_pyprojects_floors_are_the_oldest_versions_tested():
    """Every package pinned in requirements/oldest.txt is pyproject's floor for it: the floor is what CI tests."""
    oldest = versions.read_lock(REPO / "requirements" / "oldest.txt")
    declared = floors()
    assert {"transformers", "trl", "accelerate", "datasets"} <= oldest.keys()
    makefile = (REPO / "Makefile").read_text()
    for name, pinned in oldest.items():
        floor = declared.get(name)
        if name in TESTED_ELSEWHERE:
            low, target = TESTED_ELSEWHERE[name]
            assert floor == low and f"\n{target}:" in makefile, f"pyproject.toml's {name}>={floor}: where is it tested?"
            continue
        assert floor is not None and re.fullmatch(rf"{re.escape(floor)}(\.0)*", pinned), (
            f"requirements/oldest.txt tests {name}=={pinned} but pyproject.toml says >={floor}")


def test_the_lock_pins_a_whole_set_without_torch():
    lock = versions.read_lock(REPO / "requirements" / "locked.txt")
    assert {"transformers", "trl", "accelerate", "datasets", "wandb", "peft", "lm-eval", "tokenizers"} <= lock.keys()
    assert not any(re.match(r"torch$|nvidia-|triton$|forgetwatch$", n) for n in lock)  # chosen by the setup step
    # the lock satisfies pyproject's own floors
    from packaging.version import Version

    for name, floor in floors().items():
        if name in lock:
            assert Version(lock[name]) >= Version(floor), f"locked {name}=={lock[name]} is below pyproject's >={floor}"


def test_read_lock_names_the_line_it_cannot_read(tmp_path):
    path = tmp_path / "lock.txt"
    path.write_text("# comment\n\nnumpy==2.4.6  # why\ntransformers>=5\n")
    with pytest.raises(ValueError, match=r"lock.txt line 4: expected `name==version`"):
        versions.read_lock(path)
    path.write_text("Math_Verify==0.9.0\n")
    assert versions.read_lock(path) == {"math-verify": "0.9.0"}


def test_freeze_pins_what_is_installed_but_torch_and_the_project():
    frozen = versions.read_lock_text(versions.freeze())
    assert frozen["transformers"] == version("transformers") and frozen["numpy"] == version("numpy")
    assert "torch" not in frozen and "forgetwatch" not in frozen


def test_versions_table_marks_what_differs_from_the_lock(tmp_path, capsys):
    lock = tmp_path / "locked.txt"
    lock.write_text(f"transformers=={version('transformers')}\nnumpy==0.0.1\n")
    assert versions.main(["--against", str(lock)]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert lines["numpy"].endswith("differs from the lock") and "0.0.1" in lines["numpy"]
    assert not lines["transformers"].endswith("differs from the lock")
    assert version("trl") in lines["trl"]
