"""One error tree: every public error forgetwatch defines is a `ForgetWatchError`, keeps its builtin base, and is
still importable from the module that raises it."""

import ast
import importlib
import inspect
import pickle
import pkgutil
from pathlib import Path

import pytest

import forgetwatch
import forgetwatch.errors as errors
from forgetwatch.errors import ForgetWatchError

# Each error's builtin base (kept so that `except ValueError` code written before the root existed still works) and
# the modules it was defined in before it moved to errors.py, which still import it.
BUILTIN_BASE = {
    "CacheFormatError": (ValueError, ["record.cache"]),
    "CacheMismatchError": (ValueError, ["record.cache"]),
    "ConfigKeyError": (ValueError, ["integrations.config"]),
    "EngineUnavailableError": (ValueError, []),
    "InstructionFormatError": (ValueError, ["answers.instructions"]),
    "InterpolationError": (ValueError, ["remedies.interpolate"]),
    "ProbeFormatError": (ValueError, ["probes.probe_set"]),
    "ProbeSetChangedError": (ValueError, ["record.segments"]),
    "ProbeSetError": (ValueError, ["scoring.requests", "scoring.score"]),
    "RecordError": (ValueError, ["record.store"]),
    "RecordInUseError": (BlockingIOError, ["record.lock"]),
    "RecordUnwritableError": (OSError, ["record.lock"]),
    "RecordWriteError": (OSError, ["run.monitor"]),
    "RobustnessError": (ValueError, ["probes.variants"]),
    "SamplesFormatError": (ValueError, ["measures.samples"]),
    "SidecarError": (ValueError, ["run.watcher"]),
}


def _modules():
    """Every module of the package, imported; one that needs an optional package not installed here is left out."""
    found = []
    for info in pkgutil.walk_packages(forgetwatch.__path__, "forgetwatch."):
        if info.name.endswith(".__main__"):  # `python -m` entry points run the command when imported
            continue
        try:
            found.append(importlib.import_module(info.name))
        except ModuleNotFoundError as e:
            if (e.name or "").split(".")[0] == "forgetwatch":  # a broken import of our own is a failure, not a skip
                raise
    return found


def _public_errors(modules):
    """{qualified name: class} of the public exception classes defined (not imported) in `modules`."""
    found = {}
    for module in modules:
        for name, obj in vars(module).items():
            if (inspect.isclass(obj) and issubclass(obj, BaseException) and not name.startswith("_")
                    and obj.__module__ == module.__name__):
                found[f"{module.__name__}.{name}"] = obj
    return found


def test_every_public_error_is_a_forgetwatch_error():
    modules = _modules()
    assert len(modules) > 40  # the walk found the package (and integrations/, engines/), not an empty path
    found = _public_errors(modules)
    stray = sorted(name for name, cls in found.items() if not issubclass(cls, ForgetWatchError))
    assert stray == [], f"errors outside the tree: derive them from forgetwatch.errors.ForgetWatchError: {stray}"
    # and they all live in errors.py, where the tree is drawn
    assert sorted(found) == sorted(f"forgetwatch.errors.{name}" for name in [*BUILTIN_BASE, "ForgetWatchError"])


def test_the_error_tree_catches_what_it_does_without_the_root():
    """Code written before the root existed (`except ValueError`, `except BlockingIOError`, `except OSError`) still
    catches each error."""
    assert ForgetWatchError.__bases__ == (Exception,)
    for name, (builtin, _) in BUILTIN_BASE.items():
        cls = getattr(errors, name)
        assert cls.__bases__ == (ForgetWatchError, builtin), name
        with pytest.raises(builtin, match="what went wrong"):
            raise cls("what went wrong")
    with pytest.raises(OSError):
        raise errors.RecordInUseError("held by run-a")


def test_errors_are_reachable_where_they_are_raised():
    for name, (_, modules) in BUILTIN_BASE.items():
        for module in modules:
            assert getattr(importlib.import_module(f"forgetwatch.{module}"), name) is getattr(errors, name), (module, name)
        assert getattr(forgetwatch, name) is getattr(errors, name)
    assert forgetwatch.ForgetWatchError is ForgetWatchError
    assert sorted(errors.__all__) == sorted([*BUILTIN_BASE, "ForgetWatchError"])


def test_errors_pickle_and_print_as_before():
    for name in errors.__all__:
        cls = getattr(errors, name)
        e = pickle.loads(pickle.dumps(cls("bad line 3")))
        assert type(e) is cls and str(e) == "bad line 3" and e.args == ("bad line 3",)


def test_the_docstring_tree_names_every_error():
    drawn = {line.split()[1] for line in errors.__doc__.splitlines() if line.lstrip().startswith(("* ", "+ "))}
    assert drawn == set(errors.__all__)


def test_errors_module_imports_nothing_from_forgetwatch():
    tree = ast.parse(Path(errors.__file__).read_text())
    imported = [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]
    assert all(isinstance(node, ast.ImportFrom) and node.module == "__future__" for node in imported)
