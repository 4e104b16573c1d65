"""Warnings said once per process: a capability missing on this installation is worth one line, not one per step."""

from __future__ import annotations

import logging

_warned: set[str] = set()


def warn_once(logger: logging.Logger, key: str, message: str) -> None:
    """Log `message` on `logger` as a warning the first time `key` is seen in this process."""
    if key not in _warned:
        _warned.add(key)
        logger.warning(message)
