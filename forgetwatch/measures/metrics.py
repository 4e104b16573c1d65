"""Sample-wise forgetting metrics: what flipped between the base model and now, probe by probe.

Every probe has an outcome before post-training (`pre`, the base model) and now (`post`), coded as int8:
1 = correct, 0 = wrong, -1 = invalid (the answer could not be parsed). Invalid counts as not correct for
every rate below and is reported separately, because forgetting the answer format is a different problem
from forgetting the fact.

    transition   name                  rate (always divided by N, the number of probes)
    1 -> 1       retained
    1 -> 0       forgotten             F  = #(1->0) / N
    0 -> 1       learned               BT = #(0->1) / N      (backward transfer)
    0 -> 0       never known
                                       BT - F = acc_post - acc_pre

Chance adjustment (multiple choice only). An item is either known or answered by a uniform guess among
its k options, pre and post independently, so some flips are luck. Items are grouped by category and k and
the expected lucky flips of each cell are summed (so "overall" is the sum of its categories, not a pooling of
every k-item, which would mix a 0.9-accurate category with a 0.3-accurate one); short-answer probes (k = 0) add
no expected flips but count in N:

    chance = sum_g n_g * (1 - acc_pre_g) * (1 - acc_post_g) / (k_g - 1) / N
    F_adj  = max(F  - chance, 0)             BT_adj = max(BT - chance, 0)
    F_max  = max((sum_g n_g * (k_g * acc_pre_g - 1) / (k_g - 1) + #correct_pre(short)) / N, 0)
    BT_max = the same with acc_post

    # k = 4, 1000 items, 700 x 1->1, 100 x 1->0, 200 x 0->0 (accuracy 0.80 -> 0.70):
    # F = 100 / 1000 = 0.10, chance = 0.2 * 0.3 / 3 = 0.02, F_adj = 0.08, F_max = (4 * 0.8 - 1) / 3 = 0.7333

Unlike the reference study's code, k is never assumed (each probe carries its own), and nothing is clipped
before aggregating: groups and categories are summed first, the clip to 0 is applied last.

Uncertainty: a Wilson 95% interval for F and BT (binomial in N) and McNemar's exact test on the discordant
pairs (#1->0 vs #0->1) for "did accuracy really change".

For a run evaluated every few steps, `forgetting_events` counts 1->0 changes between consecutive
evaluations per probe (Toneva et al. 2019) and `first_forgotten_index` finds when each base-correct probe
was first lost.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

__all__ = ["OUTCOME_CORRECT", "OUTCOME_WRONG", "OUTCOME_INVALID", "ForgettingMetrics", "compute_metrics",
           "compute_report", "wilson_interval", "mcnemar_exact", "forgetting_events", "first_forgotten_index",
           "format_report", "format_figure"]

OUTCOME_CORRECT, OUTCOME_WRONG, OUTCOME_INVALID = 1, 0, -1

_Z95 = 1.959963984540054  # two-sided 95% normal quantile
OVERALL = "overall"


@dataclass(frozen=True)
class ForgettingMetrics:
    """Forgetting metrics of one group of probes (all probes, or one category).

    Counts are numbers of probes; every rate is divided by `n`. Invalid outcomes count as not correct.

    Example:
        >>> m = compute_metrics([1, 1, 0, 0], [1, 0, 1, 0], [2, 2, 2, 2])
        >>> m.forgotten, m.learned, m.forgetting, m.net_change
        (1, 1, 0.25, 0.0)
        >>> sorted(m.scalars())
        ['accuracy', 'backward_transfer', 'backward_transfer_adjusted', 'forgetting', 'forgetting_adjusted', 'invalid_rate', ...]
    """

    n: int
    retained: int  # 1 -> 1
    forgotten: int  # 1 -> 0
    learned: int  # 0 -> 1
    never: int  # 0 -> 0
    forgetting: float  # forgotten / n
    backward_transfer: float  # learned / n
    chance: float  # expected lucky flips (either way) per probe; 0 without multiple-choice probes
    forgetting_adjusted: float  # max(forgetting - chance, 0)
    backward_transfer_adjusted: float  # max(backward_transfer - chance, 0)
    forgetting_max: float  # ceiling on forgetting_adjusted: chance-corrected accuracy before
    backward_transfer_max: float  # ceiling on backward_transfer_adjusted: chance-corrected accuracy now
    accuracy_pre: float
    accuracy_post: float
    net_change: float  # accuracy_post - accuracy_pre = backward_transfer - forgetting
    invalid_rate_pre: float
    invalid_rate_post: float
    forgetting_ci: tuple[float, float]  # Wilson 95%
    backward_transfer_ci: tuple[float, float]  # Wilson 95%
    mcnemar_p: float  # exact two-sided p-value of forgotten vs learned
    n_mcq: int  # probes with k >= 2; short-answer probes get no chance term
    adjusted: bool  # n_mcq > 0; when False the adjusted values equal the raw ones
    # Nothing the base knew beyond chance: multiple choice with a chance-corrected base accuracy of 0, short answers
    # with fewer than 2 and under 2% correct at base. Such a group can only show backward transfer.
    nothing_to_forget: bool

    def to_dict(self) -> dict[str, float | int | bool]:
        """All fields as a flat dict; intervals become `<name>_ci_low` / `<name>_ci_high`."""
        out: dict[str, float | int | bool] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, tuple):
                out[f"{f.name}_low"], out[f"{f.name}_high"] = value
            else:
                out[f.name] = value
        return out

    def scalars(self) -> dict[str, float]:
        """The headline numbers for logging: F, BT (raw and chance-adjusted), accuracy, net change, invalid rate.

        A group of short-answer probes only has no chance term, so its "adjusted" values would only repeat the raw
        ones under a name that promises more: they are left out."""
        out = {"forgetting": self.forgetting, "backward_transfer": self.backward_transfer}
        if self.adjusted:
            out.update(forgetting_adjusted=self.forgetting_adjusted, backward_transfer_adjusted=self.backward_transfer_adjusted)
        out.update(accuracy=self.accuracy_post, net_change=self.net_change, invalid_rate=self.invalid_rate_post)
        return out


def compute_metrics(pre: ArrayLike, post: ArrayLike, num_choices: ArrayLike) -> ForgettingMetrics:
    """Forgetting metrics of one group of probes.

    Args:
        pre: outcome of each probe for the base model: 1 correct, 0 wrong, -1 invalid.
        post: outcome of each probe now, same order and length as `pre`.
        num_choices: number of options k of each probe (>= 2) for multiple choice, 0 for short answer.

    Returns:
        A `ForgettingMetrics`.

    Raises:
        ValueError: empty input, unequal lengths, an outcome outside {-1, 0, 1} or k equal to 1 or negative;
            the message names the argument and the first bad index.

    Example:
        >>> pre = [1] * 800 + [0] * 200  # k = 4, accuracy 0.80 -> 0.70
        >>> post = [1] * 700 + [0] * 300
        >>> m = compute_metrics(pre, post, [4] * 1000)
        >>> round(m.forgetting, 4), round(m.chance, 4), round(m.forgetting_adjusted, 4), round(m.forgetting_max, 4)
        (0.1, 0.02, 0.08, 0.7333)
    """
    pre_a, post_a, k = _validate(pre, post, num_choices)
    return _compute_report(pre_a, post_a, k, None)[OVERALL]


def compute_report(
    pre: ArrayLike, post: ArrayLike, num_choices: ArrayLike, categories: Sequence[str] | None = None,
    groups: Mapping[str, ArrayLike] | None = None,
) -> dict[str, ForgettingMetrics]:
    """Forgetting metrics over all probes and per category.

    Each category is computed like a group of its own (chance term per k inside the category); "overall"
    is computed from the pooled counts, never by averaging per-category values.

    Args:
        pre: outcome of each probe for the base model: 1 correct, 0 wrong, -1 invalid.
        post: outcome of each probe now, same order and length as `pre`.
        num_choices: number of options k of each probe (>= 2) for multiple choice, 0 for short answer.
        categories: optional category name of each probe. "overall" is reserved.
        groups: optional further groups by name, each a boolean mask over the probes (e.g. `ProbeSet.kind_groups()`),
            computed like "overall" over their probes (chance summed over their category and k cells); after the
            categories.

    Returns:
        `{"overall": ..., <category>: ..., <group>: ...}` with the categories in sorted order after "overall".

    Example:
        >>> report = compute_report([1, 1, 0, 1], [0, 1, 1, 1], [2, 2, 0, 0], ["math", "math", "trivia", "trivia"])
        >>> list(report), report["math"].forgotten, report["trivia"].learned, report["overall"].n
        (['overall', 'math', 'trivia'], 1, 1, 4)
    """
    pre_a, post_a, k = _validate(pre, post, num_choices)
    report = _compute_report(pre_a, post_a, k, categories)
    for name, mask in (groups or {}).items():
        m = np.asarray(mask, dtype=bool)
        cats = None if categories is None else [c for c, keep in zip(categories, m, strict=True) if keep]
        report[name] = _compute_report(pre_a[m], post_a[m], k[m], cats)[OVERALL]
    return report


def _compute_report(
    pre: np.ndarray, post: np.ndarray, k: np.ndarray, categories: Sequence[str] | None
) -> dict[str, ForgettingMetrics]:
    names, cat_codes = _factorize_categories(categories, len(pre))
    k_values, k_codes = np.unique(k, return_inverse=True)
    n_k = len(k_values)
    # One bincount over a combined code: cell = ((category * n_k + k_group) * 3 + pre + 1) * 3 + post + 1,
    # reshaped to (category, k_group, pre + 1, post + 1); e.g. 20 categories x 3 k values -> 540 cells.
    code = (pre.astype(np.intp) + 1) * 3 + (post.astype(np.intp) + 1)
    code += k_codes.reshape(-1).astype(np.intp, copy=False) * 9
    if cat_codes is not None:
        code += cat_codes * (n_k * 9)
    n_cats = max(len(names), 1)
    table = np.bincount(code, minlength=n_cats * n_k * 9).reshape(n_cats, n_k, 3, 3)
    # Overall sums the expected lucky flips of every (category, k) cell, so that it agrees with the categories: grouping
    # all k = 4 items across categories would mix a 0.9-accurate category with a 0.3-accurate one.
    report = {OVERALL: _metrics_from_table(table, k_values)}
    for i, name in enumerate(names):
        report[name] = _metrics_from_table(table[i : i + 1], k_values)
    return report


def _metrics_from_table(cells: np.ndarray, k_values: np.ndarray) -> ForgettingMetrics:
    """Metrics from a (category, k_group, pre + 1, post + 1) count table; index 0 = invalid, 1 = wrong, 2 = correct.

    The chance term is summed over (category, k) cells; everything else is linear in the counts."""
    t = cells.sum(axis=0)
    n_g = t.sum(axis=(1, 2))
    pre_ok_g = t[:, 2, :].sum(axis=1)
    post_ok_g = t[:, :, 2].sum(axis=1)
    n = int(n_g.sum())
    retained = int(t[:, 2, 2].sum())
    forgotten = int(t[:, 2, :2].sum())  # 1 -> 0 and 1 -> invalid
    learned = int(t[:, :2, 2].sum())  # 0 -> 1 and invalid -> 1
    never = n - retained - forgotten - learned
    pre_ok, post_ok = int(pre_ok_g.sum()), int(post_ok_g.sum())

    is_mcq = k_values >= 2
    n_mcq = int(n_g[is_mcq].sum())
    # Expected lucky flips of a (category, k) cell: n * (1 - acc_pre) * (1 - acc_post) / (k - 1)
    #   = (n - #pre_ok) * (n - #post_ok) / (n * (k - 1)); e.g. 1000 * 0.2 * 0.3 / 3 = 20 flips.
    sub = cells[:, is_mcq].astype(np.float64)  # (category, k >= 2, pre, post)
    cn, ca, cb = sub.sum(axis=(2, 3)), sub[:, :, 2, :].sum(axis=-1), sub[:, :, :, 2].sum(axis=-1)
    ck = np.broadcast_to(k_values[is_mcq].astype(np.float64), cn.shape)
    filled = cn > 0
    expected_flips = float(((cn - ca) * (cn - cb) / (np.where(filled, cn, 1) * (ck - 1)))[filled].sum())
    present = is_mcq & (n_g > 0)
    kf = k_values[present].astype(np.float64)
    ng, a, b = (x[present].astype(np.float64) for x in (n_g, pre_ok_g, post_ok_g))
    # Chance-corrected correct counts, summed over groups before the clip:
    # k-group: n * (k * acc - 1) / (k - 1) = (k * #ok - n) / (k - 1); short answer: #ok as is.
    short_pre_ok = int(pre_ok_g[~is_mcq].sum())
    short_post_ok = int(post_ok_g[~is_mcq].sum())
    known_mcq_pre = float(((kf * a - ng) / (kf - 1)).sum())
    known_pre = known_mcq_pre + short_pre_ok
    n_short = n - n_mcq
    nothing_to_forget = (n_mcq == 0 or known_mcq_pre <= 1e-9) and (
        n_short == 0 or (short_pre_ok < 2 and short_pre_ok < 0.02 * n_short)
    )
    known_post = float(((kf * b - ng) / (kf - 1)).sum()) + short_post_ok

    forgetting, backward_transfer = forgotten / n, learned / n
    chance = expected_flips / n
    return ForgettingMetrics(
        n=n,
        retained=retained,
        forgotten=forgotten,
        learned=learned,
        never=never,
        forgetting=forgetting,
        backward_transfer=backward_transfer,
        chance=chance,
        forgetting_adjusted=max(forgetting - chance, 0.0),
        backward_transfer_adjusted=max(backward_transfer - chance, 0.0),
        forgetting_max=max(known_pre / n, 0.0),
        backward_transfer_max=max(known_post / n, 0.0),
        accuracy_pre=pre_ok / n,
        accuracy_post=post_ok / n,
        net_change=(post_ok - pre_ok) / n,
        invalid_rate_pre=int(t[:, 0, :].sum()) / n,
        invalid_rate_post=int(t[:, :, 0].sum()) / n,
        forgetting_ci=wilson_interval(forgotten, n),
        backward_transfer_ci=wilson_interval(learned, n),
        mcnemar_p=mcnemar_exact(forgotten, learned),
        n_mcq=n_mcq,
        adjusted=n_mcq > 0,
        nothing_to_forget=nothing_to_forget,
    )


def wilson_interval(successes: int, n: int, z: float = _Z95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (95% by default).

    Args:
        successes: number of successes, 0 <= successes <= n.
        n: number of trials, > 0.
        z: normal quantile; the default gives a two-sided 95% interval.

    Returns:
        `(low, high)`, inside [0, 1].

    Example:
        >>> low, high = wilson_interval(100, 500)  # F = 0.20 on 500 probes
        >>> round(low, 3), round(high, 3)
        (0.167, 0.237)
    """
    if n <= 0:
        raise ValueError(f"`n` must be positive, got {n}")
    if not 0 <= successes <= n:
        raise ValueError(f"`successes` must be in [0, n={n}], got {successes}")
    p = successes / n
    z2 = z * z
    # center = (p + z²/2n) / (1 + z²/n), half = z · sqrt(p(1 - p)/n + z²/4n²) / (1 + z²/n)
    denom = 1.0 + z2 / n
    center = (p + z2 / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / denom
    low = 0.0 if successes == 0 else max(0.0, center - half)  # exact at the edges, not 1e-17 off
    high = 1.0 if successes == n else min(1.0, center + half)
    return low, high


def mcnemar_exact(b: int, c: int) -> float:
    """Exact two-sided McNemar test: p-value of the discordant counts `b` (1 -> 0) and `c` (0 -> 1).

    Under "no change" each discordant pair is 1 -> 0 or 0 -> 1 with probability 1/2, so
    p = min(1, 2 · P(X <= min(b, c))) with X ~ Binomial(b + c, 1/2). Exact integer sums up to b + c = 256,
    log space above, so b + c in the hundreds of thousands does not overflow.

    Args:
        b: number of probes that went 1 -> 0.
        c: number of probes that went 0 -> 1.

    Returns:
        The p-value; 1.0 when b + c == 0.

    Example:
        >>> mcnemar_exact(10, 0)  # 2 · 0.5^10
        0.001953125
        >>> mcnemar_exact(7, 7)
        1.0
    """
    if b < 0 or c < 0:
        raise ValueError(f"`b` and `c` must be non-negative counts, got b={b}, c={c}")
    n, m = b + c, min(b, c)
    if 2 * m == n:  # b == c, including b + c == 0
        return 1.0
    if n <= 256:  # exact integer arithmetic; the division rounds correctly
        return min(1.0, 2 * sum(math.comb(n, i) for i in range(m + 1)) / 2**n)
    # Largest tail term C(n, m) / 2^n in log space; the others follow from C(n, i-1) / C(n, i) = i / (n - i + 1):
    # P(X <= m) = term_m · (1 + r_m + r_m·r_(m-1) + ...), each r < 1 because m < n/2.
    log_top = math.lgamma(n + 1) - math.lgamma(m + 1) - math.lgamma(n - m + 1) - n * math.log(2.0)
    i = np.arange(m, 0, -1, dtype=np.float64)
    tail = 1.0 + float(np.cumprod(i / (n - i + 1)).sum())
    return min(1.0, 2.0 * math.exp(log_top + math.log(tail)))


def forgetting_events(history: ArrayLike) -> np.ndarray:
    """Number of forgetting events per probe: 1 -> not-1 changes between consecutive evaluations.

    Toneva et al. 2019; an invalid outcome counts as not correct.

    Args:
        history: (n_evals, n_probes) outcome matrix, rows in time order (row 0 may be the base model).

    Returns:
        int64 array of shape (n_probes,).

    Example:
        >>> forgetting_events([[1, 1, 0], [0, 1, 1], [1, 1, 0], [0, -1, 0]])
        array([2, 1, 1])
    """
    h = _as_codes(history, "history", ndim=2)
    ok = h == OUTCOME_CORRECT
    return (ok[:-1] & ~ok[1:]).sum(axis=0, dtype=np.int64)


def first_forgotten_index(base: ArrayLike, history: ArrayLike) -> np.ndarray:
    """Per probe, the first row of `history` where a base-correct probe is not correct; -1 if never.

    Probes the base model got wrong are always -1.

    Args:
        base: (n_probes,) outcomes of the base model.
        history: (n_evals, n_probes) outcome matrix, rows in time order.

    Returns:
        int64 array of shape (n_probes,).

    Example:
        >>> first_forgotten_index([1, 1, 0], [[1, 1, 1], [0, 1, 0], [1, -1, 1]])
        array([ 1,  2, -1])
    """
    b = _as_codes(base, "base", ndim=1)
    h = _as_codes(history, "history", ndim=2)
    if h.shape[1] != len(b):
        raise ValueError(f"`history` has {h.shape[1]} columns but `base` has {len(b)} probes")
    lost = h != OUTCOME_CORRECT
    first = np.argmax(lost, axis=0) if len(h) else np.zeros(len(b), dtype=np.intp)
    found = lost[first, np.arange(len(b))] if len(h) else np.zeros(len(b), dtype=bool)
    return np.where((b == OUTCOME_CORRECT) & found, first, -1).astype(np.int64)


def _as_codes(x: ArrayLike, name: str, ndim: int) -> np.ndarray:
    """`x` as an array of outcome codes, or a ValueError naming `name` and the first bad index."""
    a = np.asarray(x)
    if a.size == 0:  # [] comes in as float64
        a = a.astype(np.int8)
    if a.ndim != ndim:
        raise ValueError(f"`{name}` must be {ndim}-D, got shape {a.shape}")
    if a.dtype == np.bool_:
        return a.astype(np.int8)
    if a.dtype.kind not in "iu":
        raise ValueError(
            f"`{name}` must hold integer outcome codes (1 correct, 0 wrong, -1 invalid), got dtype {a.dtype}"
        )
    bad = a > 1 if a.dtype.kind == "u" else (a < -1) | (a > 1)
    if bad.any():
        idx = tuple(int(j) for j in np.argwhere(bad)[0])
        where = idx[0] if ndim == 1 else idx
        raise ValueError(
            f"`{name}` must hold outcome codes 1 (correct), 0 (wrong) or -1 (invalid); "
            f"first bad index {where}: {a[idx]}"
        )
    return a


def _validate(
    pre: ArrayLike, post: ArrayLike, num_choices: ArrayLike
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    pre_a = _as_codes(pre, "pre", ndim=1)
    post_a = _as_codes(post, "post", ndim=1)
    k = np.asarray(num_choices)
    if len(pre_a) == 0:
        raise ValueError("`pre` is empty: need at least one probe")
    for name, arr in (("post", post_a), ("num_choices", k)):
        if arr.ndim != 1 or len(arr) != len(pre_a):
            raise ValueError(f"`{name}` has shape {arr.shape} but `pre` has {len(pre_a)} probes")
    if k.dtype.kind not in "iu":
        raise ValueError(
            f"`num_choices` must hold integers (k >= 2, or 0 for short answer), got dtype {k.dtype}"
        )
    bad = (k == 1) if k.dtype.kind == "u" else (k == 1) | (k < 0)
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(
            f"`num_choices` must be k >= 2 for multiple choice or 0 for short answer; first bad index {i}: {k[i]}"
        )
    return pre_a, post_a, k


def _factorize_categories(categories: Sequence[str] | None, n: int) -> tuple[list[str], np.ndarray | None]:
    """Sorted category names and each probe's index into them."""
    if categories is None:
        return [], None
    if len(categories) != n:
        raise ValueError(f"`categories` has {len(categories)} entries but `pre` has {n} probes")
    seq = categories.tolist() if isinstance(categories, np.ndarray) else categories
    # A set plus a C-level map is ~4 ms for 100k str; np.unique on a string array sorts them (~20 ms).
    names = set(seq)
    if not all(isinstance(name, str) for name in names):
        i = next(j for j, c in enumerate(seq) if not isinstance(c, str))
        raise ValueError(f"`categories` must hold strings; first bad index {i}: {seq[i]!r}")
    if OVERALL in names:
        i = next(j for j, c in enumerate(seq) if c == OVERALL)
        raise ValueError(f"`categories` may not use the reserved name {OVERALL!r}; first bad index {i}")
    ordered = sorted(names)
    lookup = {name: j for j, name in enumerate(ordered)}
    codes = np.fromiter(map(lookup.__getitem__, seq), dtype=np.intp, count=n)
    return ordered, codes


def row_scalars(row: Mapping[str, Any], names: Mapping[str, str]) -> dict[str, float]:
    """The curves `names` lists (logged name -> metrics.jsonl field) from one group's metrics.jsonl row; a figure that
    is absent or NaN (no such probe in the group) is left out.

    Example:
        >>> row_scalars({"a": 0.5, "b": float("nan")}, {"x": "a", "y": "b", "z": "c"})
        {'x': 0.5}
    """
    out = {}
    for name, field_name in names.items():
        v = row.get(field_name)
        if v is not None and not (isinstance(v, float) and math.isnan(v)):
            out[name] = float(v)
    return out


# group sizes, not figures over the probes' answers: kept when some of those answers are missing
_SIZES = frozenset({"n", "robust_n", "robust_variants"})


def mark_missing(rows: dict[str, dict[str, Any]], bad: np.ndarray, members: Callable[[str], np.ndarray],
                 ids: Sequence[str], *, keys: set[str] | None = None, field: str = "missing",
                 what: str = "scored NaN or inf", count: str = "nonfinite_probes") -> None:
    """Blank, in place, every figure (or those in `keys`) of each group in `rows` that holds a `bad` probe (one scored
    NaN / inf: a count over a NaN is not a number, and argmax over NaN picks an option as if it were one), and say why
    in the row's `field`; group sizes are kept. `members(name)` is a group's probe mask, aligned with `bad`; `ids` are
    the bad probes' ids, first ones first; the overall row gets their number in `count`.

    Example:
        >>> rows = {"overall": {"n": 2, "forgetting": 0.5}, "a": {"n": 1, "forgetting": 1.0}, "b": {"n": 1, "forgetting": 0.0}}
        >>> groups = {"overall": np.array([True, True]), "a": np.array([True, False]), "b": np.array([False, True])}
        >>> mark_missing(rows, np.array([False, True]), groups.__getitem__, ["q2"])
        >>> rows["a"]["forgetting"], rows["b"]["forgetting"], rows["overall"]["nonfinite_probes"]
        (1.0, nan, 1)
        >>> rows["b"]["missing"]
        '1 of 1 probes scored NaN or inf (first: q2): the scores overflowed or are not numbers'
    """
    if not bad.any():
        return
    for name, row in rows.items():
        n_bad = int((bad & members(name)).sum())
        if not n_bad:
            continue
        for k, v in row.items():
            if k not in _SIZES and (keys is None or k in keys) and isinstance(v, (int, float)) and not isinstance(v, bool):
                row[k] = float("nan")
        row[field] = (f"{n_bad} of {row.get('n', row.get('robust_n', '?'))} probes {what} (first: "
                      f"{', '.join(list(ids)[:3])}): the scores overflowed or are not numbers")
    if OVERALL in rows:
        rows[OVERALL][count] = len(ids)


def format_report(report: dict, label: str = "category", footer: bool = True) -> str:
    """A fixed-width table, one row per category (or task) and one for all probes; `footer`: the net change, McNemar
    and what the columns mean (the nothing-to-forget mark is explained either way)."""
    w = max([22] + [len(k) + 4 for k in report])  # mmlu subtasks and lighteval's suite|task|k are long
    head = (f"{label:<{w}}{'n':>6}{'acc base':>10}{'acc now':>9}{'1→0':>6}{'0→1':>6}{'F':>8}{'F adj':>8}{'F 95% CI':>16}"
            f"{'BT':>8}{'BT adj':>8}{'invalid':>9}")
    lines = [head, "-" * len(head)]
    names = [k for k in report if k != "overall"] + ["overall"]
    for name in names:
        m = report[name]
        ci = f"[{m.forgetting_ci[0]:.3f}, {m.forgetting_ci[1]:.3f}]"
        adj = (lambda v: f"{v:.3f}") if m.adjusted else (lambda v: "n/a")
        if name == "overall":
            lines.append("-" * len(head))
        row = f"{name} *" if m.nothing_to_forget and name != "overall" else name
        lines.append(
            f"{row:<{w}}{m.n:>6}{m.accuracy_pre:>10.3f}{m.accuracy_post:>9.3f}{m.forgotten:>6}{m.learned:>6}"
            f"{m.forgetting:>8.3f}{adj(m.forgetting_adjusted):>8}{ci:>16}{m.backward_transfer:>8.3f}"
            f"{adj(m.backward_transfer_adjusted):>8}{m.invalid_rate_post:>9.3f}"
        )
    overall = report["overall"]
    if footer:
        lines.append(f"\nnet change {overall.net_change:+.3f} (= BT − F); McNemar exact p = {overall.mcnemar_p:.3g}")
        lines.append(
            "F adj / BT adj subtract flips expected from guessing among each item's own k options; short-answer and generative "
            "items have no chance term (n/a)."
        )
    nothing = [k for k in names if k != "overall" and report[k].nothing_to_forget]
    if nothing:
        lines.append(
            f"* nothing to forget ({', '.join(nothing)}): the base model knew nothing there beyond chance "
            "(chance-corrected base accuracy 0, or fewer than 2 and under 2% of short answers right); only backward transfer "
            "can show."
        )
    return "\n".join(lines)



def format_figure(value: Any) -> str:
    """A figure for a table: three decimals, "n/a" where there is none (None or NaN).

    Example:
        >>> format_figure(0.12345), format_figure(float("nan")), format_figure(None)
        ('0.123', 'n/a', 'n/a')
    """
    return "n/a" if value is None or (isinstance(value, float) and value != value) else f"{value:.3f}"
