"""Report: a run's record as PNG plots, one HTML page and a summary, no W&B needed (`forgetwatch report`).

Example:
    >>> from forgetwatch.report import make_report
    >>> page = make_report("outputs/my-run")  # doctest: +SKIP
"""

from .render import make_report, summarize_run

__all__ = ["make_report", "summarize_run"]
