"""Power for issue 30's remedy experiment: how many held-out probes and training seeds detect a 30% cut in held-out F?

From RESULTS §12 (SmolLM2, SFT on GSM8K, lr 1e-4, 200 steps, 200 held-out probes): the end-point held-out F of the six
runs without replay (`none` and its order-matched control `none_stream`, seeds 0-2 each) is 0.080, 0.110, 0.045, 0.065,
0.100, 0.065. Their variance is binomial noise over the probes (F(1 − F)/n) plus run-to-run variance (another draw of
data order and of every replay draw): the excess over the binomial part is the run-to-run variance, σ_run², which more
probes do not shrink.

The test fixed in the protocol: per seed, the difference in held-out F between the control and the remedy (the same
seed: the same training rows and order), and an exact sign-flip permutation test over the seeds (two-sided, α = 0.05).
Power is estimated by simulation: per seed and arm a true F drawn around the arm's mean with σ_run (the remedy's scaled
by its mean, the coefficient of variation held), then the count of forgotten probes drawn binomially over n held-out
probes. Conservative: the two arms' run-to-run deviations are independent (pairing by seed may correlate them, which
would only raise the power).

    python benchmarks/power_remedies.py      # -> benchmarks/results/power_remedies.json (seed 0, 4,000 simulations)

Plain NumPy.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
# RESULTS §12: end-point held-out F on 200 probes, no replay and its order-matched control, seeds 0, 1, 2 each
CONTROL_RUNS = [0.080, 0.110, 0.045, 0.065, 0.100, 0.065]
N_SECTION_12 = 200
CUT = 0.30
ALPHA = 0.05


def run_variance(runs: list[float], n: int) -> tuple[float, float, float]:
    """(mean, observed variance, run-to-run variance: the observed minus the binomial part, at least 0)."""
    x = np.asarray(runs)
    mean, observed = float(x.mean()), float(x.var(ddof=1))
    return mean, observed, max(observed - mean * (1 - mean) / n, 0.0)


def sign_flip_p(d: np.ndarray) -> np.ndarray:
    """Exact two-sided sign-flip p-values of the mean of each row of `d` (seeds in columns)."""
    k = d.shape[1]
    if k == 0:  # no seed: no test
        return np.full(d.shape[0], np.nan)
    signs = np.array(list(itertools.product((-1, 1), repeat=k)), float)  # 2^k
    observed = np.abs(d.mean(1))
    null = np.abs(d @ signs.T / k)  # [sims, 2^k]
    return (null >= observed[:, None] - 1e-12).mean(1)


def power(f_control: float, sigma_run: float, n: int, seeds: int, sims: int, rng: np.random.Generator) -> float:
    f_remedy = f_control * (1 - CUT)
    cv = sigma_run / f_control
    true_c = np.clip(rng.normal(f_control, sigma_run, (sims, seeds)), 0, 1)
    true_r = np.clip(rng.normal(f_remedy, cv * f_remedy, (sims, seeds)), 0, 1)
    obs_c = rng.binomial(n, true_c) / n
    obs_r = rng.binomial(n, true_r) / n
    d = obs_c - obs_r
    return float(((sign_flip_p(d) <= ALPHA) & (d.mean(1) > 0)).mean())


def main() -> None:
    rng = np.random.default_rng(0)
    mean, observed, var_run = run_variance(CONTROL_RUNS, N_SECTION_12)
    sigma_run = var_run ** 0.5
    grid = {}
    for n in (200, 500, 1000, 2000, 4000):
        for seeds in (3, 5, 6, 8, 10, 12):
            grid[f"n={n},seeds={seeds}"] = round(power(mean, sigma_run, n, seeds, 4000, rng), 3)
    out = {
        "control_runs": CONTROL_RUNS, "n_section_12": N_SECTION_12, "mean_F": round(mean, 4),
        "observed_sd": round(observed ** 0.5, 4), "binomial_sd_at_200": round((mean * (1 - mean) / N_SECTION_12) ** 0.5, 4),
        "run_to_run_sd": round(sigma_run, 4), "cut": CUT, "alpha": ALPHA, "test": "exact sign-flip over seeds, two-sided",
        "simulations": 4000, "seed": 0, "power": grid,
    }
    path = REPO / "benchmarks" / "results" / "power_remedies.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
