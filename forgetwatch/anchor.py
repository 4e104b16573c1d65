"""Moved to `forgetwatch.remedies.anchor`. This name stays only for `ForgetWatchArguments.__post_init__` (which imports
`check_beta` from here) until that class moves to forgetwatch/options.py and imports it from `forgetwatch.remedies`:
then delete this file."""

from .remedies.anchor import check_beta

__all__ = ["check_beta"]
