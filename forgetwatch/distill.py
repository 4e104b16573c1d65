"""Moved to `forgetwatch.remedies.base_outputs`. This name stays only for `forgetwatch base-outputs` (forgetwatch/cli.py
imports `make_base_outputs` from here) until the CLI imports it from `forgetwatch.remedies`: then delete this file."""

from .remedies.base_outputs import make_base_outputs

__all__ = ["make_base_outputs"]
