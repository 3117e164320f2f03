"""The held-out gate: whether a candidate is kept is decided by arithmetic, not by the model that proposed it.

    pair     base and candidate score tables -> one row per item: mean over seeds of each arm, d_i = cand - base
             (refused, before any statistic, unless every (item, seed) is in both arms exactly once, with a score,
             and at least `min_items` items are left)
    ci       bootstrap over items (not trials): resample the n items with replacement, n_boot times, seeded;
             percentile interval. O(n_items) memory, exact at any size: d_i on a lattice -> the resample sum's
             distribution by one FFT; few distinct values -> multinomial counts; else item indices in bounded chunks
    decide   accept iff ci_lo > 0 (the CI excludes zero on the improving side), regressed items <= the cap
             (reg_cap, or reg_share of the items compared when that is more),
             the prescribed mechanism fired, and no leakage. Anything else, ties included, keeps the parent.
    sequential  the same gate with looks: after each look (by seeds: every item, one more seed; by items: more items,
             every seed) a group-sequential efficacy boundary from a pre-declared Lan-DeMets spending function
             (exact crossing probabilities) accepts, a non-positive net so far rejects (futility), final regressions
             over the cap reject; the last look is the full gate at its level. The round flow evaluates dev (and
             the repair screen) look by look and stops at the first verdict (`sequential_gate`, `sequential_repair`)
    spend    held-out reuse: a campaign looks at the same dev items every round, so the k-th look gets its share
             alpha_k of one campaign budget (linear alpha spending over the declared maximum number of looks);
             P(any false promotion in the campaign) <= sum of the one-sided alpha_k / 2 <= campaign_alpha

An item counts as improved (regressed) when d_i > material (d_i < -material). Errored episodes are paired
symmetrically: an (item, seed) that errored in either arm is dropped from both arms, so one arm's faults can never
pass for the other arm's regressions; if more than `max_error_share` of pairs are dropped, the gate refuses.
Pure functions over arrays; no I/O.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace
from fractions import Fraction
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from components.errors import InputError

# the gate's errors, bounds, config and results (numpy- and pandas-free), re-exported: callers import them from here
from components.evolution.gate_config import COST_FIELDS as COST_FIELDS
from components.evolution.gate_config import MAX_BOOT as MAX_BOOT
from components.evolution.gate_config import MIN_BOOT as MIN_BOOT
from components.evolution.gate_config import MIN_ITEMS as MIN_ITEMS
from components.evolution.gate_config import REFUSED_DROPPED as REFUSED_DROPPED
from components.evolution.gate_config import GateConfig as GateConfig
from components.evolution.gate_config import GateResult as GateResult
from components.evolution.gate_config import PairingError as PairingError
from components.evolution.gate_config import PromotedAs as PromotedAs
from components.evolution.gate_config import RemovalResult as RemovalResult
from components.evolution.gate_config import RepairResult as RepairResult
from components.evolution.gate_config import SequentialResult as SequentialResult
from components.evolution.gate_config import TooFewItems as TooFewItems
from components.evolution.gate_config import TooManyErrors as TooManyErrors
from components.lazy import LazyModule

# components.params and the CLI's option defaults read this module's limits and GateConfig: without numpy or pandas
# (the type checker reads the modules themselves)
if TYPE_CHECKING:
    from collections.abc import Callable
    from statistics import NormalDist

    import numpy as np
    import pandas as pd
else:
    np = LazyModule("numpy")
    pd = LazyModule("pandas")


_CHUNK = 1 << 18  # index draws per bootstrap chunk (<= 2 MB): bounds memory at any n_items, stays in cache
_PAR_MIN_DRAWS = 1 << 26  # above this many index draws (~0.1 s), chunks run on threads (see _boot_parallel)
_PAR_CHUNK = 1 << 20  # index draws per threaded chunk (8 MB of indices, 8 MB gathered)
_PAR_THREADS = 4
_LATTICE_MAX_DEN = 10_000  # scores' denominators (rubric weight sums x seeds) stay far below this
_LATTICE_MAX_VALUES = 4_096
_FFT_MAX = 1 << 25  # support of the resample sum on the lattice: 32 M points (~0.8 GB transient at the cap)


def _check_arm(df: pd.DataFrame, name: str) -> pd.DataFrame:
    missing = [c for c in ("item_id", "seed", "score") if c not in df.columns]
    if missing:
        raise PairingError(f"{name}: missing column(s) {', '.join(missing)}")

    def rowid(mask: pd.Series) -> list[str]:
        return [f"{i}#{s}" for i, s in zip(df.loc[mask, "item_id"], df.loc[mask, "seed"])]

    seeds = pd.to_numeric(df["seed"], errors="coerce")
    bad_seed = seeds.isna() | (seeds != seeds.round())
    if bad_seed.any():
        raise PairingError(f"{name}: seed is missing or not an integer for {', '.join(rowid(bad_seed)[:5])}")
    scores = pd.to_numeric(df["score"], errors="coerce")
    if scores.isna().any():
        raise PairingError(f"{name}: score is missing or not a number for {', '.join(rowid(scores.isna())[:5])}")
    if ((scores < 0) | (scores > 1)).any():
        raise PairingError(f"{name}: score outside [0, 1] for {', '.join(rowid((scores < 0) | (scores > 1))[:5])}")
    out = df.assign(score=scores.astype(float), seed=seeds.astype(int), item_id=df["item_id"].astype(str))
    dup = out.duplicated(["item_id", "seed"], keep=False)
    if dup.any():
        rows = sorted({f"{i}#{sd}" for i, sd in zip(out.loc[dup, "item_id"], out.loc[dup, "seed"])})
        raise PairingError(f"{name}: duplicate (item_id, seed) rows: {', '.join(rows[:5])}")
    errors = out["error"] if "error" in out.columns else pd.Series("", index=out.index)
    out["error"] = errors.astype(object).where(errors.notna(), "").astype(str)  # an empty CSV cell reads as NaN
    return out


def pair(
    base: pd.DataFrame, cand: pd.DataFrame, max_error_share: float = 1.0, min_items: int = 1
) -> tuple[pd.DataFrame, int]:
    """Per-item paired table (item_id, base, cand, d) and the number of (item, seed) pairs dropped for errors."""
    b, c = _check_arm(base, "base"), _check_arm(cand, "cand")
    kb = set(zip(b["item_id"], b["seed"]))
    kc = set(zip(c["item_id"], c["seed"]))
    if kb != kc:
        only_b = sorted(f"{i}#{s}" for i, s in kb - kc)
        only_c = sorted(f"{i}#{s}" for i, s in kc - kb)
        parts = []
        if only_b:
            parts.append(f"{len(only_b)} (item, seed) only in base: {', '.join(only_b[:5])}")
        if only_c:
            parts.append(f"{len(only_c)} only in cand: {', '.join(only_c[:5])}")
        raise PairingError("incomplete pairing: " + "; ".join(parts))
    if not kb:
        raise PairingError("no (item, seed) pairs to compare")
    m = b.merge(c, on=["item_id", "seed"], suffixes=("_b", "_c"))
    errored = (m["error_b"] != "") | (m["error_c"] != "")
    dropped = int(errored.sum())
    if dropped / len(m) > max_error_share or dropped == len(m):
        raise TooManyErrors(f"{dropped} of {len(m)} (item, seed) pairs errored in one arm or both: too many to compare")
    m = m[~errored]
    per = m.groupby("item_id", sort=True).agg(base=("score_b", "mean"), cand=("score_c", "mean")).reset_index()
    per["d"] = per["cand"] - per["base"]
    if len(per) < min_items:
        if dropped:  # errors took the comparison below its minimum: a refusal, like too many errors
            raise TooManyErrors(
                f"{dropped} errored pair(s) leave {len(per)} item(s); the gate needs at least {min_items}"
            )
        raise TooFewItems(f"{len(per)} item(s) to compare; the gate needs at least {min_items}")
    return per, dropped


def _lattice(vals: np.ndarray) -> tuple[float, np.ndarray] | None:
    """(h, j) with vals == vals[0] + h * j for small integers j, or None. Scores are rubric fractions averaged over
    seeds, so the d_i of a real table sit on such a lattice; arbitrary reals do not (and are bootstrapped by index)."""
    if len(vals) > _LATTICE_MAX_VALUES:
        return None
    offs = vals - vals[0]
    den = 1
    for x in offs[1:]:
        f = Fraction(float(x)).limit_denominator(_LATTICE_MAX_DEN)
        if abs(float(f) - x) > 1e-9:
            return None
        den = math.lcm(den, f.denominator)
        if den > _LATTICE_MAX_DEN:
            return None
    j = np.rint(offs * den).astype(np.int64)
    g = int(np.gcd.reduce(j)) or 1
    h, j = g / den, j // g
    return (h, j) if np.allclose(vals[0] + h * j, vals, rtol=0, atol=1e-9) else None


def boot_means(d: np.ndarray, n_boot: int = 10_000, seed: int = 0) -> np.ndarray:
    """n_boot means of d over items resampled with replacement, in O(n_items + n_boot) memory at any size.

    A resample's mean depends only on how often it draws each distinct value of d. Three exact ways to draw it,
    all with the distribution of resampling the n items one by one:
      lattice   d_i = v0 + h * j_i with small integers j (the usual case): the resample sum of j is a sum of n
                i.i.d. draws, whose whole distribution is the n-th convolution power of the pmf of j (one FFT);
                each resample is then one inverse-CDF draw from it;
      few       Multinomial(n, share of each distinct value) counts, O(distinct values) per resample;
      else      item indices, drawn in chunks of bounded size (large sizes: on threads, `_boot_parallel`)."""
    d = np.asarray(d, dtype=float)
    n = len(d)
    if n == 0:
        raise ValueError("bootstrap over zero items")
    rng = np.random.default_rng(seed)
    vals, counts = np.unique(d, return_counts=True)
    if len(vals) == 1:
        return np.full(n_boot, vals[0])
    lat = _lattice(vals)
    # the FFT costs ~10 index draws per support point: take it when the support is small next to n_boot * n
    if lat is not None and n * int(lat[1][-1]) + 1 <= min(_FFT_MAX, n_boot * n // 8):
        h, j = lat
        pmf = np.zeros(int(j[-1]) + 1)
        np.add.at(pmf, j, counts / n)
        size = n * (len(pmf) - 1) + 1
        m = 1 << (size - 1).bit_length()  # numpy's FFT (scipy.fft costs a third of a second to import)
        total = np.fft.irfft(np.fft.rfft(pmf, m) ** n, m)[:size]
        cdf = np.cumsum(np.clip(total, 0.0, None))
        k = np.searchsorted(cdf, rng.random(n_boot) * cdf[-1], side="right")
        means: np.ndarray = vals[0] + h * np.minimum(k, size - 1) / n
        return means
    out = np.empty(n_boot)
    if len(vals) * 8 <= n:  # a binomial draw costs several index draws: worth it only when values repeat a lot
        step = max(1, _CHUNK // len(vals))
        for i in range(0, n_boot, step):
            m_ = rng.multinomial(n, counts / n, size=min(step, n_boot - i))
            out[i : i + len(m_)] = m_ @ vals / n
        return out
    if n * n_boot > _PAR_MIN_DRAWS:
        return _boot_parallel(d, n_boot, seed)
    step = max(1, _CHUNK // n)
    dtype = np.uint16 if n <= 2**16 else np.intp  # small: narrow draws are faster; large: no index conversion pass
    for i in range(0, n_boot, step):
        idx = rng.integers(0, n, size=(min(step, n_boot - i), n), dtype=dtype)
        out[i : i + len(idx)] = d[idx].mean(axis=1)
    return out


def _boot_parallel(d: np.ndarray, n_boot: int, seed: int) -> np.ndarray:
    """Item indices for a large bootstrap, on threads: each chunk of resamples has its own generator spawned from
    `seed` (SeedSequence), so the result is the same whatever the number of threads; numpy draws, gathers and sums
    without the GIL. Values are gathered as float32 and summed in float64. Memory: a few chunks of _PAR_CHUNK
    indices (8 MB each) whatever the size."""
    from concurrent.futures import ThreadPoolExecutor

    n = len(d)
    d32 = d.astype(np.float32)  # half the bytes gathered; |error| of a mean < 6e-8 * max|d|, far below the CI's noise
    step = max(1, _PAR_CHUNK // n)
    starts = list(range(0, n_boot, step))
    gens = [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(len(starts))]
    out = np.empty(n_boot)

    def chunk(k: int) -> None:
        i = starts[k]
        idx = gens[k].integers(0, n, size=(min(step, n_boot - i), n), dtype=np.intp)
        out[i : i + len(idx)] = np.take(d32, idx).sum(axis=1, dtype=np.float64) / n

    with ThreadPoolExecutor(max_workers=max(1, min(_PAR_THREADS, os.cpu_count() or 1))) as pool:
        list(pool.map(chunk, range(len(starts))))
    return out


def bootstrap_ci(d: np.ndarray, n_boot: int = 10_000, alpha: float = 0.05, seed: int = 0) -> tuple[float, float]:
    """Percentile CI of the mean of d, resampling items with replacement."""
    lo, hi = np.quantile(boot_means(d, n_boot, seed), [alpha / 2, 1 - alpha / 2])
    return float(lo), float(hi)


def look_alpha(campaign_alpha: float, max_looks: int, look: int) -> float:
    """The two-sided CI alpha of the `look`-th dev look (1-based) under linear alpha spending.

    The gate accepts only when the CI's lower end is above zero, so one look falsely promotes with probability at
    most alpha_k / 2. Spending campaign_alpha / max_looks of one-sided error per look bounds the campaign's chance of
    any false promotion by campaign_alpha (a union bound: it holds however the looks depend on each other, and they do,
    through the shared dev items and the unchanged champion). Linear spending because every round's candidate deserves
    the same power; the number of looks is declared before the campaign starts (campaign.rounds)."""
    if max_looks < 1:
        raise InputError(f"gate: max_looks: {max_looks} must be at least 1")
    if not 1 <= look <= max_looks:
        raise InputError(f"gate: dev look {look} is beyond the {max_looks} declared looks: no alpha left to spend")
    return 2.0 * campaign_alpha / max_looks


def decide(
    per_item: pd.DataFrame,
    cfg: GateConfig = GateConfig(),
    *,
    mechanism_fired: bool = True,
    leakage: bool = False,
    dropped_errors: int = 0,
) -> GateResult:
    return decide_d(
        per_item["d"].to_numpy(dtype=float),
        cfg,
        float(per_item["base"].mean()),
        float(per_item["cand"].mean()),
        mechanism_fired=mechanism_fired,
        leakage=leakage,
        dropped_errors=dropped_errors,
    )


def decide_d(
    d: np.ndarray,
    cfg: GateConfig = GateConfig(),
    base_mean: float = 0.0,
    cand_mean: float = 0.0,
    *,
    mechanism_fired: bool = True,
    leakage: bool = False,
    dropped_errors: int = 0,
) -> GateResult:
    """The verdict on the per-item differences d (items in sorted order) and the arms' means: `decide` without
    pandas (`ratchet gate`'s light path, components/evolution/gate_files.py, pairs with numpy and lands here)."""
    if len(d) < cfg.min_items:
        raise TooFewItems(f"{len(d)} item(s) to compare; the gate needs at least {cfg.min_items}")
    net = float(d.mean())
    lo, hi = bootstrap_ci(d, cfg.n_boot, cfg.alpha, cfg.seed)
    improved = int((d > cfg.material).sum())
    regressed = int((d < -cfg.material).sum())
    if leakage:
        reason = "leakage"
    elif not mechanism_fired:
        reason = "the prescribed mechanism did not fire"
    elif not lo > 0:
        reason = f"CI [{lo:+.4f}, {hi:+.4f}] does not exclude zero on the improving side (ties keep the parent)"
    elif regressed > cfg.cap(len(d)):
        reason = f"{regressed} regressed items > reg_cap {cfg.cap(len(d))}"
    else:
        reason = f"net {net:+.4f}, CI [{lo:+.4f}, {hi:+.4f}], {improved} improved, {regressed} regressed"
    accept = not leakage and mechanism_fired and lo > 0 and regressed <= cfg.cap(len(d))
    return GateResult(accept, net, lo, hi, len(d), improved, regressed, reason, base_mean, cand_mean, dropped_errors)


def token_diffs(base: pd.DataFrame, cand: pd.DataFrame, per: pd.DataFrame) -> np.ndarray | None:
    """Per item (in `per`'s order): the candidate's mean prompt tokens per episode minus the parent's, over the
    (item, seed) pairs neither arm errored on; None when a table has no `tokens_in`."""
    if "tokens_in" not in base.columns or "tokens_in" not in cand.columns or per.empty:
        return None

    def mean_tokens(df: pd.DataFrame, bad: set[tuple[str, int]]) -> pd.Series:
        keys = list(zip(df["item_id"].astype(str), df["seed"].astype(int)))
        keep = [k not in bad for k in keys]
        df = df[keep]
        return pd.to_numeric(df["tokens_in"], errors="coerce").groupby(df["item_id"].astype(str)).mean()

    def errored(df: pd.DataFrame) -> set[tuple[str, int]]:
        if "error" not in df.columns:
            return set()
        e = df["error"].astype(object).where(df["error"].notna(), "").astype(str) != ""
        return set(zip(df.loc[e, "item_id"].astype(str), df.loc[e, "seed"].astype(int)))

    bad = errored(base) | errored(cand)
    items = per["item_id"].astype(str)
    t = mean_tokens(cand, bad).reindex(items).to_numpy(dtype=float) - mean_tokens(base, bad).reindex(items).to_numpy(
        dtype=float
    )
    return None if not np.isfinite(t).all() else t


def cheaper_verdict(
    result: GateResult,
    d: np.ndarray,
    t: np.ndarray | None,
    cfg: GateConfig,
    lo: float,
    tlo: float,
    thi: float,
    *,
    mechanism_fired: bool,
    leakage: bool,
) -> GateResult:
    """The verdict with cost as a second objective (cfg.cheaper): an accept is "better"; else a score bound above
    -material with a token bound below 0, the regressions within the cap and the mechanism fired is "cheaper"."""
    if t is None:
        return result
    cost = replace(result, tokens_net=float(t.mean()), tokens_ci_lo=tlo, tokens_ci_hi=thi)
    if result.accept:
        return replace(cost, promoted_as=PromotedAs.BETTER)
    regressed = int((d < -cfg.material).sum())
    if not leakage and mechanism_fired and lo > -cfg.material and thi < 0 and regressed <= cfg.cap(len(d)):
        why = (
            f"cheaper: net {float(d.mean()):+.4f}, lower bound {lo:+.4f} within -{cfg.material}; prompt tokens "
            f"{float(t.mean()):+.1f} per episode, upper bound {thi:+.1f}; {regressed} regressed"
        )
        return replace(cost, accept=True, reason=why, promoted_as=PromotedAs.CHEAPER)
    return cost


def gate(
    base: pd.DataFrame,
    cand: pd.DataFrame,
    cfg: GateConfig = GateConfig(),
    *,
    mechanism_fired: bool = True,
    leakage: bool = False,
) -> tuple[GateResult, pd.DataFrame]:
    """Pair, then decide. Returns the verdict and the per-item table. Too many errored pairs is a refusal (keep the
    parent), not a crash; any other pairing problem raises PairingError. With `cfg.cheaper`, a candidate that does
    not clear zero may still be promoted as cheaper (`cheaper_verdict`)."""
    try:
        per, dropped = pair(base, cand, cfg.max_error_share, cfg.min_items)
    except TooManyErrors as e:
        return GateResult(False, 0.0, 0.0, 0.0, 0, 0, 0, f"refused: {e}", dropped_errors=None), pd.DataFrame(
            columns=["item_id", "base", "cand", "d"]
        )
    routed = replace(cfg, alpha=cfg.route_alpha)  # with the cost objective, each claim at half the alpha
    result = decide(per, routed, mechanism_fired=mechanism_fired, leakage=leakage, dropped_errors=dropped)
    if cfg.cheaper:
        t = token_diffs(base, cand, per)
        if t is not None:
            tlo, thi = bootstrap_ci(t, cfg.n_boot, routed.alpha, cfg.seed)
            result = cheaper_verdict(
                result,
                per["d"].to_numpy(dtype=float),
                t,
                cfg,
                result.ci_lo,
                tlo,
                thi,
                mechanism_fired=mechanism_fired,
                leakage=leakage,
            )
    return result, per


def repair_screen(base: pd.DataFrame, cand: pd.DataFrame, material: float = 0.05) -> tuple[RepairResult, pd.DataFrame]:  # noqa: E501
    """Base and candidate on the diagnosed source tasks, same seeds: held-out budget is spent only if the candidate
    repairs more items than it breaks and its mean is higher."""
    try:
        per, _ = pair(base, cand, max_error_share=0.5)
    except TooManyErrors as e:
        return RepairResult(False, 0, 0, 0.0, 0.0, 0, f"refused: {e}"), pd.DataFrame(
            columns=["item_id", "base", "cand", "d"]
        )
    d = per["d"].to_numpy(dtype=float)
    repaired, broken = int((d > material).sum()), int((d < -material).sum())
    ok = repaired > broken and float(d.mean()) > 0
    reason = f"repaired {repaired}, broke {broken} of {len(d)} source items (mean {per['base'].mean():.3f} -> {per['cand'].mean():.3f})"
    return RepairResult(ok, repaired, broken, float(per["base"].mean()), float(per["cand"].mean()), len(d), reason), per


# -- sequential looks ------------------------------------------------------------------------------------------


@lru_cache(maxsize=1)
def _n01() -> NormalDist:
    """The standard normal; `statistics` is imported on first use (`ratchet gate`'s one look never needs it)."""
    from statistics import NormalDist

    return NormalDist()


# cumulative one-sided alpha spent at information fraction t (Lan-DeMets), declared by name
SPENDING: dict[str, Callable[[float, float], float]] = {
    "obf": lambda t, a: 2 * (1 - _n01().cdf(_n01().inv_cdf(1 - a / 2) / math.sqrt(t))) if t > 0 else 0.0,
    "pocock": lambda t, a: a * math.log(1 + (math.e - 1) * t),
}


def efficacy_levels(fractions: list[float], alpha: float, spending: str = "obf") -> list[float]:
    """Nominal one-sided levels p_g for looks at increasing information fractions (the last 1.0), so that under no
    effect the chance of crossing at look g is exactly spend(t_g) - spend(t_g-1): recursive numerical integration of
    the z-statistics' joint law (a Brownian motion observed at t_g), not a Bonferroni split."""
    return list(_efficacy_levels(tuple(float(f) for f in fractions), float(alpha), spending))


@lru_cache(maxsize=64)
def _efficacy_levels(fractions: tuple[float, ...], alpha: float, spending: str) -> tuple[float, ...]:
    if spending not in SPENDING:
        raise InputError(f"gate: spending: {spending!r} is not one of {', '.join(sorted(SPENDING))}")
    if not fractions or any(b <= a for a, b in zip(fractions, fractions[1:])) or abs(fractions[-1] - 1) > 1e-12:
        raise InputError(f"gate: looks: fractions {fractions} must increase to 1")
    spend = SPENDING[spending]
    z = np.linspace(-8, 8, 1601)
    h = z[1] - z[0]
    dens = np.exp(-z * z / 2) / math.sqrt(2 * math.pi)  # density of the z-statistic at the current look
    levels, prev_t, prev_spent = [], None, 0.0
    for t in fractions:
        if prev_t is not None:
            dt = t - prev_t
            kern = np.exp(-((z[None, :] * math.sqrt(t) - z[:, None] * math.sqrt(prev_t)) ** 2) / (2 * dt))
            dens = (dens[:, None] * kern).sum(axis=0) * h * math.sqrt(t / dt) / math.sqrt(2 * math.pi)
        target = spend(t, alpha) - prev_spent
        tail = np.cumsum((dens * h)[::-1])[::-1] - dens * h / 2  # P(Z >= z_k, not stopped before), trapezoid
        k = min(max(int(np.searchsorted(-tail, -target)), 1), len(z) - 1)  # first grid point with tail <= target
        w = (tail[k - 1] - target) / (tail[k - 1] - tail[k]) if tail[k - 1] > tail[k] else 1.0
        c = float(z[k - 1] + w * h)  # interpolated between grid points
        levels.append(1 - _n01().cdf(c))
        dens = np.where(z < c, dens, 0.0)
        prev_t, prev_spent = t, prev_spent + target
    return tuple(levels)


SEQUENTIAL_BY = ("seeds", "items")


@dataclass(frozen=True)
class SequentialDesign:
    """Pre-declared before any look: how many looks, what each adds, and how alpha is spent over them.

    by seeds  look g adds the next group of seeds on EVERY item (each look sees every task family; the per-item means
              sharpen). The running mean over items keeps the canonical group-sequential covariance (the later
              estimate contains the earlier data), and the information fraction is at least the seeds' share, so
              spending at the seeds' share is conservative (higher correlation between looks than assumed only
              lowers the chance of crossing anywhere: Slepian). Regressions seen at an interim look are not final.
    by items  look g adds the next group of items (in a hash order of their ids, so a look is not one family), all
              seeds: exact information fractions, and a regression seen is final."""

    looks: int = 1
    spending: str = "pocock"
    by: str = "seeds"

    def __post_init__(self) -> None:
        if isinstance(self.looks, bool) or not isinstance(self.looks, (int, np.integer)) or self.looks < 1:
            raise InputError(f"gate: sequential.looks: {self.looks!r} is not an integer >= 1")
        if self.spending not in SPENDING:
            raise InputError(
                f"gate: sequential.spending: {self.spending!r} is not one of {', '.join(sorted(SPENDING))}"
            )
        if self.by not in SEQUENTIAL_BY:
            raise InputError(f"gate: sequential.by: {self.by!r} is not one of {', '.join(SEQUENTIAL_BY)}")

    @property
    def on(self) -> bool:
        return self.looks > 1

    def groups(self, items: list[str], seeds: list[int]) -> list[tuple[list[str], list[int]]]:
        """The (items, seeds) cells each look adds, in order; fewer looks than declared when there are fewer seeds
        (by seeds) or items (by items) to split."""
        if self.by == "seeds":
            parts = [list(x) for x in np.array_split(np.asarray(seeds, dtype=int), min(self.looks, len(seeds)))]
            return [(list(items), [int(s) for s in part]) for part in parts]
        import hashlib  # here: OpenSSL's load is a tenth of `ratchet gate`'s light path

        order = sorted(items, key=lambda i: hashlib.sha256(str(i).encode()).hexdigest())
        parts = [list(x) for x in np.array_split(np.asarray(order, dtype=object), min(self.looks, len(order)))]
        return [([str(i) for i in part], list(seeds)) for part in parts]

    def fractions(self, items: list[str], seeds: list[int]) -> list[float]:
        groups = self.groups(items, seeds)
        sizes = np.cumsum([len(g[0]) * len(g[1]) for g in groups])
        return [float(x / sizes[-1]) for x in sizes]


def look_verdict(
    d: np.ndarray,
    look: int,
    levels: list[float],
    cfg: GateConfig,
    *,
    final_items: bool = True,
    mechanism_fired: bool = True,
    leakage: bool = False,
    n_total: int | None = None,
    tokens: np.ndarray | None = None,
) -> tuple[bool | None, str, dict[str, Any]]:
    """One look of the group-sequential gate over the per-item d seen so far: (True accept | False reject | None go
    on, why, the look's figures).

    Interim look: accept when the z-statistic of the mean d clears the efficacy boundary (a bootstrap cannot resolve
    levels like 1e-6 with 10^4 draws) with the regressions seen within the cap and the mechanism seen firing;
    reject when the net so far is not positive (futility, non-binding: it only ever keeps the parent, so it cannot
    raise the false-promotion rate), or, when the d seen are final (`final_items`), when they already hold more
    regressions than the cap (for `n_total` items). The last look is the ordinary bootstrap gate at that look's level.
    Ties keep the parent.

    With `cfg.cheaper` and the per-item prompt-token differences `tokens`: a look that does not accept may promote
    as "cheaper" when the score's bound is above -material and the tokens' bound (same level, same test) below 0;
    while the tokens so far drop, futility waits for a net at or below -material."""
    n_looks, p = len(levels), levels[look - 1]
    cap_now, cap_end = cfg.cap(len(d)), cfg.cap(len(d) if n_total is None else n_total)
    last = look == n_looks
    cheap = cfg.cheaper and tokens is not None and len(tokens) == len(d)
    fig = _look_figures(d, look, n_looks, p, cfg, tokens if cheap else None)
    regressed = fig["regressed"]
    where = f"at look {look} of {n_looks}"
    if leakage:
        return False, "leakage", fig
    if regressed > (cap_now if last else cap_end) and (last or final_items):
        return False, f"{regressed} regressed items > reg_cap {cap_now if last else cap_end} {where}", fig
    if last and not mechanism_fired:
        return False, "the prescribed mechanism did not fire", fig
    if regressed <= cap_now and mechanism_fired and (why := _promoted(fig, bool(cheap), cfg, where)):
        return True, why, fig
    return _stopped(fig, bool(cheap), last, cfg, where)


def _look_figures(
    d: np.ndarray, look: int, n_looks: int, p: float, cfg: GateConfig, tokens: np.ndarray | None
) -> dict[str, Any]:
    """A look's figures: its level, the net and regressions so far and the net's bounds (the prompt tokens' too when
    `tokens` is given: the cost objective)."""
    last = look == n_looks
    net, regressed = float(d.mean()), int((d < -cfg.material).sum())
    lo, hi = _look_bounds(d, p, last, cfg)
    fig: dict[str, Any] = {
        "look": look,
        "n_looks": n_looks,
        "n_items": int(len(d)),
        "level": p,
        "lo": lo,
        "hi": hi,
        "net": net,
        "regressed": regressed,
    }
    if tokens is not None:
        tok = np.asarray(tokens, dtype=float)
        tlo, thi = _look_bounds(tok, p, last, cfg)
        fig.update(tokens_net=float(tok.mean()), tokens_lo=tlo, tokens_hi=thi)
    return fig


def _promoted(fig: dict[str, Any], cheap: bool, cfg: GateConfig, where: str) -> str:
    """Why the look promotes, better or (with the cost objective) cheaper, marked in `fig`; "" when it does not.
    The regressions and the mechanism are the caller's to check."""
    net, lo, p, regressed = fig["net"], fig["lo"], fig["level"], fig["regressed"]
    if lo > 0:
        if cheap:
            fig["promoted_as"] = PromotedAs.BETTER
        return f"net {net:+.4f}, lower bound {lo:+.4f} at one-sided level {p:.5f} {where}, {regressed} regressed"
    if cheap and lo > -cfg.material and fig["tokens_hi"] < 0:
        fig["promoted_as"] = PromotedAs.CHEAPER
        return (
            f"cheaper: net {net:+.4f}, lower bound {lo:+.4f} within -{cfg.material}; prompt tokens "
            f"{fig['tokens_net']:+.1f} per episode, upper bound {fig['tokens_hi']:+.1f}, at one-sided "
            f"level {p:.5f} {where}, {regressed} regressed"
        )
    return ""


def _stopped(
    fig: dict[str, Any], cheap: bool, last: bool, cfg: GateConfig, where: str
) -> tuple[bool | None, str, dict[str, Any]]:
    """A look that does not promote: a reject at the last look or for futility (while the prompt tokens so far
    drop, futility waits for a net at or below -material), else (None: go on)."""
    net, lo = fig["net"], fig["lo"]
    floor = -cfg.material if cheap and fig["tokens_net"] < 0 else 0.0
    if not (last or net <= floor):
        return None, "", fig
    why = "does not clear zero (ties keep the parent)" if last else "net so far is not positive (futility)"
    if last and cheap:
        why = "does not clear zero, and is not shown cheaper within the margin (ties keep the parent)"
    elif floor < 0:
        why = f"net so far is at or below -material {cfg.material} (futility)"
    if not last:
        fig["futility"] = True  # a futility stop: what a refund of the round's alpha reads (alpha.py)
    return False, f"net {net:+.4f}, lower bound {lo:+.4f} {where}: {why}", fig


def _look_bounds(x: np.ndarray, p: float, last: bool, cfg: GateConfig) -> tuple[float, float]:
    """The one-sided level-p bounds of mean(x) at a look: the bootstrap's at the last look, the z-test's before it
    (a bootstrap cannot resolve such levels with 10^4 draws); unbounded with too few items."""
    net = float(x.mean())
    if last:
        lo, hi = (float(v) for v in np.quantile(boot_means(x, cfg.n_boot, cfg.seed), [p, 1 - p]))
        return lo, hi
    if len(x) < max(cfg.min_items, 2):
        return -math.inf, math.inf
    se = float(x.std(ddof=1)) / math.sqrt(len(x))
    z = _n01().inv_cdf(1 - p)
    return (net - z * se, net + z * se) if se > 0 else (net if net != 0 else -0.0, net)


def sequential_decide(
    per_item: pd.DataFrame,
    cfg: GateConfig,
    group_sizes: list[int],
    spending: str = "obf",
    *,
    mechanism_fired: bool = True,
    leakage: bool = False,
) -> SequentialResult:
    """The gate with a look after each group of items (in evaluation order, which must not follow the items' kind:
    shuffle it once, before looking); `look_verdict` at each. Used to replay recorded full evaluations."""
    d_all = per_item["d"].to_numpy(dtype=float)
    n = len(d_all)
    if sum(group_sizes) != n or min(group_sizes) < 1:
        raise InputError(f"gate: looks: group sizes {group_sizes} do not add up to {n} items")
    ends = np.cumsum(group_sizes)
    levels = efficacy_levels([e / n for e in ends], cfg.route_alpha / 2, spending)
    looks = []
    for g, end in enumerate(ends, start=1):
        verdict, why, fig = look_verdict(
            d_all[:end], g, levels, cfg, mechanism_fired=mechanism_fired, leakage=leakage, n_total=n
        )
        looks.append({k: fig[k] for k in ("look", "level", "lo", "net", "regressed")} | {"n": int(end)})
        if verdict is not None:
            return SequentialResult(verdict, g, len(ends), int(end), n, f"{why} ({end} of {n} items)", tuple(looks))
    raise AssertionError("unreachable")


def _cells(scores: pd.DataFrame, items: list[str], seeds: list[int]) -> pd.DataFrame:
    return scores[scores["item_id"].astype(str).isin(set(items)) & scores["seed"].isin(set(seeds))]


def sequential_gate(
    base: pd.DataFrame,
    cand: pd.DataFrame,
    cfg: GateConfig,
    design: SequentialDesign,
    items: list[str],
    seeds: list[int],
    *,
    fired_by_look: list[bool] | None = None,
    leakage: bool = False,
) -> tuple[GateResult | None, pd.DataFrame, dict[str, Any]]:
    """The group-sequential gate over the looks whose cells the two score tables hold (cells of later looks absent:
    not evaluated yet). Replays the looks in order and stops at the first decision: (the verdict, or None when the
    looks seen leave it open and the next look must be evaluated; the per-item table of the cells seen at the
    deciding look; the record: design, looks used, whether it stopped early and why, each look's figures).
    `fired_by_look[g]`: whether the prescribed mechanism fired in the candidate's traces up to look g+1."""
    groups = design.groups(items, seeds)
    levels = efficacy_levels(design.fractions(items, seeds), cfg.route_alpha / 2, design.spending)
    record: dict[str, Any] = {
        "looks": len(groups),
        "spending": design.spending,
        "by": design.by,
        "looks_used": 0,
        "stopped_early": False,
        "why": "",
        "per_look": [],
    }
    seen_i: list[str] = []
    seen_s: list[int] = []
    for g, (its, sds) in enumerate(groups, start=1):
        seen_i, seen_s = list(dict.fromkeys(seen_i + its)), sorted(set(seen_s) | set(sds))
        if _cells(base, its, sds).empty or _cells(cand, its, sds).empty:  # this look is not evaluated yet
            return None, pd.DataFrame(columns=["item_id", "base", "cand", "d"]), record
        try:
            per, dropped = pair(
                _cells(base, seen_i, seen_s), _cells(cand, seen_i, seen_s), cfg.max_error_share, cfg.min_items
            )
        except TooManyErrors as e:
            record.update(looks_used=g, stopped_early=g < len(groups), why=f"refused: {e}")
            return (
                GateResult(False, 0.0, 0.0, 0.0, 0, 0, 0, f"refused: {e}", dropped_errors=None),
                pd.DataFrame(columns=["item_id", "base", "cand", "d"]),
                record,
            )
        d = per["d"].to_numpy(dtype=float)
        fired = True if fired_by_look is None else bool(fired_by_look[min(g, len(fired_by_look)) - 1])
        tokens = token_diffs(_cells(base, seen_i, seen_s), _cells(cand, seen_i, seen_s), per) if cfg.cheaper else None
        verdict, why, fig = look_verdict(
            d,
            g,
            levels,
            cfg,
            final_items=design.by == "items",
            mechanism_fired=fired,
            leakage=leakage,
            n_total=len(items),
            tokens=tokens,
        )
        record["per_look"].append(fig)
        if verdict is None:
            continue
        record.update(looks_used=g, stopped_early=g < len(groups), why=why)
        if fig.get("futility"):
            record["futile_at"] = g
        cost = (
            {
                "promoted_as": fig.get("promoted_as"),
                "tokens_net": fig["tokens_net"],
                "tokens_ci_lo": fig["tokens_lo"],
                "tokens_ci_hi": fig["tokens_hi"],
            }
            if "tokens_net" in fig
            else {}
        )
        result = GateResult(
            verdict,
            fig["net"],
            fig["lo"],
            fig["hi"],
            len(d),
            int((d > cfg.material).sum()),
            fig["regressed"],
            why,
            float(per["base"].mean()),
            float(per["cand"].mean()),
            dropped,
            **cost,
        )
        return result, per, record
    raise AssertionError("unreachable: the last look always decides")


def repair_look(d: np.ndarray, look: int, levels: list[float], material: float) -> tuple[bool | None, str]:
    """One look of the sequential repair screen. The last look is the full screen (repaired > broken and a positive
    mean). Interim: a clear pass when repaired > broken and the z lower bound of the mean gain clears the level from
    the same spending function; a clear fail when the mean so far is not positive. A wrong early pass costs held-out
    budget only (the gate still decides), a wrong early fail a round."""
    repaired, broken, net = int((d > material).sum()), int((d < -material).sum()), float(d.mean())
    if look == len(levels):
        return repaired > broken and net > 0, f"look {look} of {len(levels)} (full screen)"
    if net <= 0:
        return False, f"mean gain {net:+.3f} not positive at look {look} of {len(levels)} (futility)"
    se = float(d.std(ddof=1)) / math.sqrt(len(d)) if len(d) > 1 else math.inf
    lo = net - _n01().inv_cdf(1 - levels[look - 1]) * se
    if repaired > broken and lo > 0:
        return True, f"clear repair at look {look} of {len(levels)}: mean gain {net:+.3f}, lower bound {lo:+.3f}"
    return None, ""


def sequential_repair(
    base: pd.DataFrame,
    cand: pd.DataFrame,
    material: float,
    alpha: float,
    design: SequentialDesign,
    items: list[str],
    seeds: list[int],
) -> tuple[RepairResult | None, pd.DataFrame, dict[str, Any]]:
    """The repair screen with the gate's looks (`repair_look` at each; one-sided `alpha` / 2 spent over them): the
    verdict (None: the looks seen leave it open), the per-item table of the cells seen, and the looks' record."""
    groups = design.groups(items, seeds)
    levels = efficacy_levels(design.fractions(items, seeds), alpha / 2, design.spending)
    record: dict[str, Any] = {
        "looks": len(groups),
        "spending": design.spending,
        "by": design.by,
        "looks_used": 0,
        "stopped_early": False,
        "why": "",
    }
    seen_i: list[str] = []
    seen_s: list[int] = []
    for g, (its, sds) in enumerate(groups, start=1):
        if _cells(base, its, sds).empty or _cells(cand, its, sds).empty:  # this look is not evaluated yet
            return None, pd.DataFrame(columns=["item_id", "base", "cand", "d"]), record
        seen_i, seen_s = list(dict.fromkeys(seen_i + its)), sorted(set(seen_s) | set(sds))
        b, c = _cells(base, seen_i, seen_s), _cells(cand, seen_i, seen_s)
        last = g == len(groups)
        if last:
            result, per = repair_screen(b, c, material)
            why = f"look {g} of {len(groups)} (full screen)"
        else:
            try:
                per, _ = pair(b, c, max_error_share=0.5)
            except TooManyErrors:
                continue  # the full screen at the last look refuses it with its reason
            ok, why = repair_look(per["d"].to_numpy(dtype=float), g, levels, material)
            if ok is None:
                continue
            result, per = repair_screen(b, c, material)
            result = RepairResult(
                ok,
                result.repaired,
                result.broken,
                result.base_mean,
                result.cand_mean,
                result.n_items,
                f"{result.reason}; {why}",
            )
        record.update(looks_used=g, stopped_early=not last, why=why)
        return result, per, record
    raise AssertionError("unreachable: the last look always decides")


# -- removal: a second objective ----------------------------------------------------------------------------------------


def removal_decide(base: pd.DataFrame, cand: pd.DataFrame, cfg: GateConfig = GateConfig()) -> RemovalResult:
    """`base`/`cand`: score tables with `tokens_in` (prompt tokens of each episode). Pure; see `RemovalResult`."""
    for name, df in (("base", base), ("cand", cand)):
        if "tokens_in" not in df.columns:
            raise PairingError(f"{name}: missing column tokens_in")
    per, _ = pair(base, cand, cfg.max_error_share, cfg.min_items)

    def ok(df: pd.DataFrame) -> pd.DataFrame:
        return df[df["error"].fillna("").astype(str) == ""] if "error" in df.columns else df

    tb = ok(base).groupby(base["item_id"].astype(str))["tokens_in"].mean()
    tc = ok(cand).groupby(cand["item_id"].astype(str))["tokens_in"].mean()
    items = per["item_id"].astype(str)
    t = tc.reindex(items).to_numpy(dtype=float) - tb.reindex(items).to_numpy(dtype=float)
    d = per["d"].to_numpy(dtype=float)
    lo, hi = bootstrap_ci(d, cfg.n_boot, cfg.alpha, cfg.seed)
    tlo, thi = bootstrap_ci(t, cfg.n_boot, cfg.alpha, cfg.seed)
    regressed = int((d < -cfg.material).sum())
    if not lo > -cfg.material:
        reason = f"score CI [{lo:+.4f}, {hi:+.4f}] reaches below -material {cfg.material} (the parent is kept)"
    elif not thi < 0:
        reason = f"prompt tokens CI [{tlo:+.1f}, {thi:+.1f}] per episode does not show a drop (ties keep the parent)"
    elif regressed > cfg.cap(len(d)):
        reason = f"{regressed} regressed items > reg_cap {cfg.cap(len(d))}"
    else:
        reason = (
            f"score net {float(d.mean()):+.4f} CI [{lo:+.4f}, {hi:+.4f}] within -{cfg.material}; prompt tokens "
            f"{float(t.mean()):+.1f} per episode CI [{tlo:+.1f}, {thi:+.1f}]"
        )
    accept = lo > -cfg.material and thi < 0 and regressed <= cfg.cap(len(d))
    return RemovalResult(
        accept,
        reason,
        float(d.mean()),
        lo,
        hi,
        float(t.mean()),
        tlo,
        thi,
        float(tb.mean()),
        float(tc.mean()),
        len(d),
        regressed,
        float(per["base"].mean()),
        float(per["cand"].mean()),
    )
