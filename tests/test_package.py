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


def test_the_stages_before_the_model_load_no_torch():
    """answers, probes, measures and record (and the run's monitor) are plain Python and NumPy: importing every one of
    their modules loads no torch or transformers, so the figures and the record test in milliseconds."""
    code = (
        "import importlib, pkgutil, sys, forgetwatch\n"
        "for stage in ('answers', 'probes', 'measures', 'record'):\n"
        "    pkg = importlib.import_module('forgetwatch.' + stage)\n"
        "    for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + '.'):\n"
        "        importlib.import_module(m.name)\n"
        "import forgetwatch.run.monitor, forgetwatch.run.rows, forgetwatch.run.watcher, forgetwatch.scoring.engines\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"


def test_scoring_modes_are_plain_python():
    # the seam of issue 28: modes build requests and judge results without torch; engines hold the torch code.
    # Robustness variants and figures (issue 29) too.
    code = (
        "import sys, forgetwatch.scoring.requests, forgetwatch.scoring.modes, forgetwatch.probes.variants, "
        "forgetwatch.measures.robustness; "
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"


def test_unknown_attribute_raises():
    try:
        forgetwatch.NoSuchThing  # noqa: B018
    except AttributeError as e:
        assert "NoSuchThing" in str(e)
    else:
        raise AssertionError("expected AttributeError")


# The package's stages, in the order data flows through them: a folder imports only from folders before it (and from the
# top-level utilities), never from one after it. `forgetwatch/__init__.py` and `__main__.py` are the front door.
STAGES = ("answers", "probes", "scoring", "measures", "record", "run", "remedies", "report", "integrations", "cli")
UTILITIES = ("_io", "_lazy", "_warnings", "commands", "docs", "errors", "options", "versions")


def _package_imports():
    """{module: {imported module}} for every module of the package, imports inside functions included."""
    pkg = Path(forgetwatch.__file__).parent
    modules = {}
    for path in pkg.rglob("*.py"):
        parts = ("forgetwatch", *path.relative_to(pkg).with_suffix("").parts)
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for name, path in modules.items():
        here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = ".".join(here[: len(here) - node.level + 1]) if node.level else ""
                target = ".".join(x for x in (base, node.module or "") if x)
                for alias in node.names:  # `from . import x` imports the module x
                    deps.add(f"{target}.{alias.name}" if f"{target}.{alias.name}" in modules else target)
            elif isinstance(node, ast.Import):
                deps.update(alias.name for alias in node.names)
        graph[name] = {d for d in deps if d in modules and d != name}
    return graph


def _stage(module: str) -> int:
    part = module.split(".")[1] if "." in module else "__init__"
    return -1 if part in UTILITIES else STAGES.index(part) if part in STAGES else len(STAGES)


def test_the_tree_is_stages_and_utilities():
    pkg = Path(forgetwatch.__file__).parent
    folders = sorted(p.name for p in pkg.iterdir() if p.is_dir() and (p / "__init__.py").exists())
    modules = sorted(p.stem for p in pkg.glob("*.py"))
    assert folders == sorted(STAGES)
    assert modules == sorted(("__init__", "__main__", *UTILITIES))


def test_stages_import_only_earlier_stages():
    upward = sorted(f"{m} -> {d}" for m, deps in _package_imports().items() for d in deps
                    if m.count(".") and _stage(d) > _stage(m))
    assert upward == []


def test_no_import_circle():
    """No module imports itself back through others (lazy imports in functions count; a package's `__init__` face is
    left out, as it only re-exports)."""
    graph = {m: {d for d in deps if not _is_face(d)} for m, deps in _package_imports().items() if not _is_face(m)}

    def visit(node, stack, done):
        assert node not in stack, "import circle: " + " -> ".join([*stack, node])
        if node in done:
            return
        for dep in sorted(graph.get(node, ())):
            visit(dep, [*stack, node], done)
        done.add(node)

    done = set()
    for module in sorted(graph):
        visit(module, [], done)


def test_no_module_imports_another_modules_private_name():
    """A name with a leading underscore is its module's own: what another module needs is made public (the private
    modules `_io`, `_lazy` and `_warnings` hold public names)."""
    pkg = Path(forgetwatch.__file__).parent
    private = []
    for path in sorted(pkg.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("forgetwatch")):
                private += [f"{path.relative_to(pkg)}:{node.lineno} {alias.name}" for alias in node.names
                            if alias.name.startswith("_") and not alias.name.startswith("__")]
    assert private == []


def test_no_module_over_600_lines():
    """One idea per module: none grows past 600 lines (split it by what it holds, in the folder of its stage)."""
    pkg = Path(forgetwatch.__file__).parent
    sizes = {p.relative_to(pkg).as_posix(): len(p.read_text().splitlines()) for p in pkg.rglob("*.py")}
    assert {name: n for name, n in sizes.items() if n > 600} == {}


def test_the_module_map_is_current():
    """CONTRIBUTING.md's module map is the one tools/module_map.py makes from the docstrings (`--write` mends it)."""
    sys.path.insert(0, str(Path(__file__).parent.parent / "tools"))
    try:
        import module_map
    finally:
        sys.path.pop(0)
    assert module_map.block() in module_map.CONTRIBUTING.read_text()
    assert module_map.STAGES == STAGES


def test_every_docstring_example_runs():
    """The examples in the package's docstrings are run, module by module (those marked `+SKIP` need a model, a run
    or the Hub), and every stage's face has a docstring and names only what it has."""
    import doctest
    import importlib
    import io
    import pkgutil
    from contextlib import redirect_stdout

    failed, attempted = [], 0
    for info in pkgutil.walk_packages(forgetwatch.__path__, "forgetwatch."):
        # vllm's and axolotl's modules need those installed (their own venvs run them); __main__ runs the command
        if info.name.endswith("__main__") or info.name.split(".")[-1] in ("vllm", "vllm_worker", "axolotl"):
            continue
        module = importlib.import_module(info.name)
        with redirect_stdout(io.StringIO()) as out:
            result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        attempted += result.attempted
        if result.failed:
            failed.append(f"{info.name}: {result.failed} of {result.attempted}\n{out.getvalue()}")
    assert failed == [] and attempted > 250
    for stage in STAGES:
        face = importlib.import_module(f"forgetwatch.{stage}")
        assert face.__doc__ and all(hasattr(face, name) for name in getattr(face, "__all__", ())), stage


def _is_face(module: str) -> bool:
    return (Path(forgetwatch.__file__).parent.joinpath(*module.split(".")[1:], "__init__.py")).exists()


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
