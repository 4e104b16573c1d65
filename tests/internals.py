"""Where a test leans on another library's internals, a change there must fail with that library and version named.

The tests read wandb's offline run files, lift accelerate's CPU gate on FSDP, and check transformers' cache objects;
none of that is public API. When a new release moves it, `make test-latest` should say which release did it, not fail
with an assertion on a tensor shape or a parse error deep in a helper.

Example:
    >>> with relies_on("wandb", "the offline run file format"):
    ...     records = parse(path)
"""

from __future__ import annotations

from contextlib import contextmanager

from forgetwatch.versions import installed_versions


def installed(package: str) -> str:
    """`"wandb 0.31.0"`: the package and its installed version."""
    found = installed_versions((package,))[package]
    return f"{package} {found}" if found else f"{package} (not installed)"


class LibraryChanged(AssertionError):
    """A library's internals that a test relies on are not what they were in the locked versions."""


def library_changed(package: str, what: str, detail: str) -> LibraryChanged:
    return LibraryChanged(
        f"{installed(package)}: {what} is not what the tests were written for ({detail}). The tested versions are in "
        "requirements/locked.txt; see the README's 'Tested versions'."
    )


@contextmanager
def relies_on(package: str, what: str):
    """Re-raise any error inside the block as `LibraryChanged`, naming `package`, its version and `what` changed."""
    try:
        yield
    except LibraryChanged:
        raise
    except Exception as e:
        raise library_changed(package, what, f"{type(e).__name__}: {e}") from e
