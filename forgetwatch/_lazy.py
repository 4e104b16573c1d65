"""Names a package exports but loads on first use, so that importing the package stays light (no torch, no trl).

A package's `__init__` says `__getattr__, __dir__ = lazy(__name__, globals(), {"name": ".module"})`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy(
    package: str, namespace: dict[str, Any], names: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A module `__getattr__` that imports `names[name]` (relative to `package`) when `name` is first asked for, and a
    `__dir__` that lists them with the package's own names.

    Example:
        >>> getattr_, dir_ = lazy("forgetwatch", {}, {"score_probes": ".scoring.score"})
        >>> getattr_("score_probes").__name__  # doctest: +SKIP
        'score_probes'
    """

    def __getattr__(name: str) -> Any:
        if name in names:
            value = getattr(importlib.import_module(names[name], package), name)
            namespace[name] = value  # asked once: later lookups are plain attribute reads
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(names))

    return __getattr__, __dir__
