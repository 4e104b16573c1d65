"""The public surface: a pinned `__all__`, lazy heavy imports, and the console script."""

import ast
import subprocess
import sys
from pathlib import Path

import forgetwatch


def test_all_is_pinned():
    assert sorted(forgetwatch.__all__) == [
        "BaseCache", "Budget", "CacheFormatError", "CacheMismatchError", "ConfigKeyError", "DriftStats", "EngineUnavailableError",
        "ForgetWatchArguments", "ForgetWatchCallback", "ForgetWatchError", "ForgettingMetrics", "InstructionFormatError",
        "InterpolationError", "NoiseFloor", "Probe", "ProbeFormatError", "ProbeResults", "ProbeSet",
        "ProbeSetChangedError", "ProbeSetError", "RecordError", "RecordInUseError", "RecordUnwritableError",
        "RecordWriteError", "RiskRule",
        "RobustnessError", "SamplesFormatError", "ScoringConfig",
        "SidecarError", "compute_drift", "compute_metrics", "compute_report", "load_probes", "load_record",
        "make_cache_key", "score_probes",
    ]
    for name in forgetwatch.__all__:
        assert getattr(forgetwatch, name) is not None


def test_import_is_light():
    # torch, transformers, trl and wandb load only when the callback or scoring is used
    code = "import sys, forgetwatch; print(sorted(m for m in ('torch', 'transformers', 'trl', 'wandb') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"


def test_scoring_modes_are_plain_python():
    # the seam of issue 28: modes build requests and judge results without torch; engines hold the torch code.
    # Robustness variants and figures (issue 29) too.
    code = ("import sys, forgetwatch.requests, forgetwatch.modes, forgetwatch.robustness, forgetwatch.robust_metrics; "
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"


def test_unknown_attribute_raises():
    try:
        forgetwatch.NoSuchThing  # noqa: B018
    except AttributeError as e:
        assert "NoSuchThing" in str(e)
    else:
        raise AssertionError("expected AttributeError")


def test_no_import_circle():
    """No two modules of the package import each other, directly or through others (lazy imports in functions count)."""
    pkg = Path(forgetwatch.__file__).parent
    graph = {}
    for path in pkg.rglob("*.py"):
        parts = path.relative_to(pkg).with_suffix("").parts  # a subpackage (engines/) is one node, named by its folder
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == len(parts):  # from the package's top level
                if node.module:
                    deps.add(node.module.split(".")[0])
                else:  # from . import x
                    deps.update(alias.name for alias in node.names)
        graph.setdefault(parts[0], set()).update(deps - {"__init__", parts[0]})
    graph.pop("__init__")  # the package's front door imports everything, and nothing imports it back

    def visit(node, stack):
        assert node not in stack, "import circle: " + " -> ".join([*stack, node])
        for dep in graph.get(node, ()):
            visit(dep, [*stack, node])

    for module in graph:
        visit(module, [])


def test_only_the_axolotl_plugin_imports_axolotl():
    """`import forgetwatch` and `forgetwatch.integrations` (with its shared config module) need no front-end installed;
    axolotl is imported by forgetwatch/integrations/axolotl.py alone."""
    code = ("import sys, forgetwatch, forgetwatch.integrations, forgetwatch.integrations.config; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'axolotl'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"
    pkg = Path(forgetwatch.__file__).parent
    importers = []
    for path in sorted(pkg.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            if any(n.split(".")[0] == "axolotl" for n in names):
                importers.append(path.relative_to(pkg).as_posix())
    assert sorted(set(importers)) == ["integrations/axolotl.py"]
