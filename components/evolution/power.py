"""The minimum detectable effect (MDE) of the held-out gate: the smallest true mean improvement the gate accepts with
probability `power`, for a split's size, the trials (seeds) per item and the variance of the paired differences.

The gate (`gate.py`) pairs the arms per item, d_i = mean over trials of (cand - base), and accepts when the lower end
of the percentile bootstrap CI at level 1 - alpha is above zero. That lower end is, to first order,
mean(d) - z_{1-alpha/2} * s/sqrt(n) with s the plug-in SD (divisor n) the bootstrap resamples; under a true effect
delta, mean(d) ~ N(delta, sigma^2/n). So the gate accepts with probability `power` when

    delta = (z_{1-alpha/2} * sqrt((n-1)/n) + z_{power}) * sigma / sqrt(n),     sigma^2 = sd_item^2 + sd_trial^2 / trials

where sd_item is the SD of the items' true effects (trials do not average it away) and sd_trial the SD of one trial's
paired difference within an item (trials do). Both are estimated from two paired score tables (`components`) or
given. The regression cap and the error drops are not modelled: the MDE is the CI's, a floor for the whole gate.
A test checks the formula against the gate's own bootstrap by simulation."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from statistics import NormalDist
from typing import Any

import numpy as np
import pandas as pd

from components.errors import InputError
from components.evolution.gate import _check_arm


@dataclass(frozen=True)
class Variance:
    sd_item: float  # SD of the items' true paired effects (between items)
    sd_trial: float  # SD of one trial's paired difference around its item's effect (within an item)
    source: str  # where the figures come from: "given", or the tables and what could be separated

    def sigma(self, trials: int) -> float:
        """SD of one item's d_i when it is the mean over `trials` trials."""
        return math.sqrt(self.sd_item**2 + self.sd_trial**2 / trials)


def mde(n_items: int, trials: int, var: Variance, alpha: float = 0.05, power: float = 0.8) -> float:
    """The smallest true net improvement the gate's CI detects with probability `power` (see the module doc)."""
    if n_items < 2:
        raise InputError(f"power: items: {n_items} must be at least 2")
    if trials < 1:
        raise InputError(f"power: trials: {trials} must be at least 1")
    if not 0 < alpha < 1:
        raise InputError(f"power: alpha: {alpha} is not in (0, 1)")
    if not 0 < power < 1:
        raise InputError(f"power: power: {power} is not in (0, 1)")
    z = NormalDist().inv_cdf
    return (z(1 - alpha / 2) * math.sqrt((n_items - 1) / n_items) + z(power)) * var.sigma(trials) / math.sqrt(n_items)


def components(base: pd.DataFrame, cand: pd.DataFrame) -> Variance:
    """sd_item and sd_trial from two paired score tables (item_id, seed, score; errored pairs dropped as the gate
    drops them). With two or more trials per item they are separated (one-way random effects, method of moments);
    with one trial they cannot be, and all the variance is put between items, so more trials do not shrink the MDE:
    the cautious reading."""
    b, c = _check_arm(base, "base"), _check_arm(cand, "cand")
    m = b.merge(c, on=["item_id", "seed"], suffixes=("_b", "_c"))
    if len(m) != len(b) or len(m) != len(c):
        raise InputError("power: base and cand are not the same (item, seed) pairs")
    m = m[(m["error_b"] == "") & (m["error_c"] == "")]
    if m["item_id"].nunique() < 2:
        raise InputError("power: fewer than two items with a paired score")
    m = m.assign(d=m["score_c"] - m["score_b"])
    per = m.groupby("item_id")["d"]
    k = per.size()
    if int(k.max()) < 2:
        return Variance(float(per.mean().std(ddof=1)), 0.0, "tables, one trial per item: all variance between items")
    within = float((per.var(ddof=1).fillna(0) * (k - 1)).sum() / max(1, int((k - 1).sum())))
    k_bar = float(k.mean())
    between = float(per.mean().var(ddof=1)) - within / k_bar  # Var(d_i) = sd_item^2 + sd_trial^2 / k
    return Variance(math.sqrt(max(0.0, between)), math.sqrt(within), f"tables, {k_bar:g} trials per item")


def power_table(
    n_items: int, trials: list[int], var: Variance, alpha: float = 0.05, power: float = 0.8
) -> list[dict[str, Any]]:
    return [
        {
            "n_items": n_items,
            "trials": k,
            "alpha": alpha,
            "power": power,
            "mde": round(mde(n_items, k, var, alpha, power), 6),
            "sigma": round(var.sigma(k), 6),
            **asdict(var),
        }
        for k in trials
    ]


def simulated_power(
    delta: float,
    n_items: int,
    trials: int,
    var: Variance,
    alpha: float = 0.05,
    reps: int = 400,
    n_boot: int = 2000,
    seed: int = 0,
) -> float:
    """The share of simulated paired tables (normal effects and trial noise) the gate's own CI accepts: the check
    on `mde`."""
    from components.evolution.gate import bootstrap_ci

    rng = np.random.default_rng(seed)
    hits = 0
    for r in range(reps):
        effect = delta + var.sd_item * rng.standard_normal(n_items)
        d = effect + var.sd_trial * rng.standard_normal((n_items, trials)).mean(axis=1)
        lo, _ = bootstrap_ci(d, n_boot, alpha, seed + r)
        hits += lo > 0
    return hits / reps
