"""The names the figures are logged under (W&B, TensorBoard, MLflow, trackio): one rule, used by the logging and by
the W&B workspace template alike.

W&B's automatic workspace makes one section per key prefix (up to the last "/" by default; a workspace setting can
use the first "/" instead), and a run cannot order sections or panels: only the names are the run's to choose. So
the names put the overview in a section of its own and keep the rest to few sections:

    forgetwatch/<figure>                          overview: F, BT, their chance-adjusted forms, the behaviour and
                                                  robustness headlines, the budget's state, the flips table
    forgetwatch_by_category/<figure>/<category>   the overview's figures per category (a section per figure, every
                                                  category side by side in it)
    forgetwatch_details/<figure>                  every other figure, overall ...
    forgetwatch_details/<figure>_in_<category>    ... and per category, in one section

Example:
    >>> figure_key("overall", "forgetting"), figure_key("sciq", "forgetting")
    ('forgetwatch/forgetting', 'forgetwatch_by_category/forgetting/sciq')
    >>> figure_key("overall", "kl"), figure_key("sciq", "kl")
    ('forgetwatch_details/kl', 'forgetwatch_details/kl_in_sciq')
"""

from __future__ import annotations

__all__ = ["PREFIX", "OVERVIEW", "BY_CATEGORY", "DETAILS", "OVERALL", "figure_key", "final_key", "table_key"]

PREFIX = "forgetwatch"
BY_CATEGORY = f"{PREFIX}_by_category"
DETAILS = f"{PREFIX}_details"
OVERALL = "overall"  # the group of all probes (`forgetwatch.measures.metrics.OVERALL`)

# The overview's curves, in the order the workspace template shows them: forgetting and backward transfer first.
OVERVIEW = (
    "forgetting", "backward_transfer", "forgetting_adjusted", "backward_transfer_adjusted",
    "instruct_forgetting", "runaway", "over_refusal", "length_log_ratio",  # behaviour (generated answers)
    "robust_forgetting",  # robustness (variants scored)
    "over_budget",  # the budget's state: how many of its limits are exceeded now (0: within budget)
    "partial", "share_scored",  # max_share: a partial evaluation (its figures estimates), and the share of probes scored
)
# Tables: the probes that flipped at this evaluation belong to the overview; the at-risk probes to the details.
_OVERVIEW_TABLES = ("flips",)


def figure_key(group: str, figure: str) -> str:
    """The key `figure` of `group` ("overall", a category, or a kind group such as "all_knowledge") is logged under."""
    if figure in OVERVIEW:
        return f"{PREFIX}/{figure}" if group == OVERALL else f"{BY_CATEGORY}/{figure}/{group}"
    return f"{DETAILS}/{figure}" if group == OVERALL else f"{DETAILS}/{figure}_in_{group}"


def table_key(name: str) -> str:
    """The key of a table logged at each evaluation ("flips", "at_risk_probes"), or for an evaluation scored after a
    later step ("late_evaluations": its figures, logged at the last step, where W&B and trackio keep them)."""
    return f"{PREFIX}/{name}" if name in _OVERVIEW_TABLES else f"{DETAILS}/{name}"


def final_key(key: str) -> str:
    """The run summary's key for a figure's value at the last evaluation: "final/" after the section's first part
    (`forgetwatch/final/forgetting`, `forgetwatch_details/final/kl_in_sciq`)."""
    return key.replace("/", "/final/", 1)
