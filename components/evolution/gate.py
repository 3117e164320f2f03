"""The held-out gate: whether a candidate is kept is decided by arithmetic, not by the model that proposed it.

    pair     base and candidate score tables -> one row per item: mean over seeds of each arm, d_i = cand - base
             (refused, before any statistic, unless every (item, seed) is in both arms exactly once, with a score)
    ci       bootstrap over items (not trials): resample the n items with replacement, n_boot times, seeded
    decide   accept iff ci_lo > 0 (the CI excludes zero on the improving side), regressed items <= reg_cap,
             the prescribed mechanism fired, and no leakage. Anything else, ties included, keeps the parent.

An item counts as improved (regressed) when d_i > material (d_i < -material). Errored episodes are paired
symmetrically: an (item, seed) that errored in either arm is dropped from both arms, so one arm's faults can never
pass for the other arm's regressions; if more than `max_error_share` of pairs are dropped, the gate refuses.
Pure functions over arrays; no I/O.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from components.errors import InputError


class PairingError(InputError):
    """The two arms are not a complete pairing; no statistic is computed."""


class TooManyErrors(PairingError):
    """So many (item, seed) pairs errored that what is left cannot stand for the benchmark: the gate refuses."""


@dataclass(frozen=True)
class GateConfig:
    alpha: float = 0.05
    n_boot: int = 10_000
    seed: int = 0
    reg_cap: int = 2
    material: float = 0.05
    max_error_share: float = 0.25

    def __post_init__(self) -> None:
        if not 0 < self.alpha < 1:
            raise InputError(f"gate: alpha: {self.alpha} is not in (0, 1)")
        if self.n_boot < 1:
            raise InputError(f"gate: n_boot: {self.n_boot} must be at least 1")
        if self.reg_cap < 0 or self.material < 0:
            raise InputError("gate: reg_cap and material must be >= 0")


@dataclass(frozen=True)
class GateResult:
    accept: bool
    net: float
    ci_lo: float
    ci_hi: float
    n_items: int
    n_improved: int
    n_regressed: int
    reason: str
    base_mean: float = 0.0
    cand_mean: float = 0.0
    dropped_errors: int = 0

    def as_dict(self) -> dict:
        return asdict(self)


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


def pair(base: pd.DataFrame, cand: pd.DataFrame, max_error_share: float = 1.0) -> tuple[pd.DataFrame, int]:
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
    return per, dropped


def bootstrap_ci(d: np.ndarray, n_boot: int = 10_000, alpha: float = 0.05, seed: int = 0) -> tuple[float, float]:
    """Percentile CI of the mean of d, resampling items with replacement (vectorized: one (n_boot, n) draw)."""
    d = np.asarray(d, dtype=float)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(d), size=(n_boot, len(d)))
    means = d[idx].mean(axis=1)
    lo, hi = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    return float(lo), float(hi)


def decide(per_item: pd.DataFrame, cfg: GateConfig = GateConfig(), *, mechanism_fired: bool = True,
           leakage: bool = False, dropped_errors: int = 0) -> GateResult:
    d = per_item["d"].to_numpy(dtype=float)
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
    elif regressed > cfg.reg_cap:
        reason = f"{regressed} regressed items > reg_cap {cfg.reg_cap}"
    else:
        reason = f"net {net:+.4f}, CI [{lo:+.4f}, {hi:+.4f}], {improved} improved, {regressed} regressed"
    accept = not leakage and mechanism_fired and lo > 0 and regressed <= cfg.reg_cap
    return GateResult(accept, net, lo, hi, len(d), improved, regressed, reason,
                      float(per_item["base"].mean()), float(per_item["cand"].mean()), dropped_errors)


def gate(base: pd.DataFrame, cand: pd.DataFrame, cfg: GateConfig = GateConfig(), *, mechanism_fired: bool = True,
         leakage: bool = False) -> tuple[GateResult, pd.DataFrame]:
    """Pair, then decide. Returns the verdict and the per-item table. Too many errored pairs is a refusal (keep the
    parent), not a crash; any other pairing problem raises PairingError."""
    try:
        per, dropped = pair(base, cand, cfg.max_error_share)
    except TooManyErrors as e:
        return GateResult(False, 0.0, 0.0, 0.0, 0, 0, 0, f"refused: {e}", dropped_errors=-1), \
            pd.DataFrame(columns=["item_id", "base", "cand", "d"])
    return decide(per, cfg, mechanism_fired=mechanism_fired, leakage=leakage, dropped_errors=dropped), per


@dataclass(frozen=True)
class RepairResult:
    ok: bool
    repaired: int
    broken: int
    base_mean: float
    cand_mean: float
    n_items: int
    reason: str

    def as_dict(self) -> dict:
        return asdict(self)


def repair_screen(base: pd.DataFrame, cand: pd.DataFrame, material: float = 0.05) -> tuple[RepairResult, pd.DataFrame]:  # noqa: E501
    """Base and candidate on the diagnosed source tasks, same seeds: held-out budget is spent only if the candidate
    repairs more items than it breaks and its mean is higher."""
    try:
        per, _ = pair(base, cand, max_error_share=0.5)
    except TooManyErrors as e:
        return RepairResult(False, 0, 0, 0.0, 0.0, 0, f"refused: {e}"), pd.DataFrame(columns=["item_id", "base", "cand", "d"])
    d = per["d"].to_numpy(dtype=float)
    repaired, broken = int((d > material).sum()), int((d < -material).sum())
    ok = repaired > broken and float(d.mean()) > 0
    reason = f"repaired {repaired}, broke {broken} of {len(d)} source items (mean {per['base'].mean():.3f} -> {per['cand'].mean():.3f})"
    return RepairResult(ok, repaired, broken, float(per["base"].mean()), float(per["cand"].mean()), len(d), reason), per
