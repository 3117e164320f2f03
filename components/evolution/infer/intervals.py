"""The intervals rounding leaves a factor (round(v * k) == y), and the points most of them share."""

from __future__ import annotations

from fractions import Fraction
from typing import Any, cast

import numpy as np

from components.evolution.infer.rows import K_REGIONS
from components.worlds.numbers import q, simplest


def _regions(lo: np.ndarray, hi: np.ndarray, k: int = K_REGIONS) -> list[np.ndarray]:
    """The supports of up to `k` most-covered points of the intervals [lo, hi] (each support: the rows whose
    interval holds that point; later ones among the rows left)."""
    left = np.ones(len(lo), dtype=bool)
    out = []
    for _ in range(k):
        idx = np.nonzero(left)[0]
        if not len(idx):
            break
        ev = sorted([(lo[i], 0, i) for i in idx] + [(hi[i], 1, i) for i in idx])
        best, cur, at = 0, 0, None
        for x, kind, _i in ev:
            if kind == 0:
                cur += 1
                if cur > best:
                    best, at = cur, x
            else:
                cur -= 1
        if at is None:
            break
        sup = left & (lo <= at) & (hi >= at)
        out.append(sup)
        left &= ~sup
    return out


def _exact_interval(ys: list[Any], vs: list[Fraction], half: Fraction) -> tuple[Fraction, Fraction] | None:
    """The factors k with round(v * k) == y on every (y, v): the intersection of [(y - h)/v, (y + h)/v)."""
    lo, hi = None, None
    for y, v in zip(ys, vs):
        if v == 0:
            if q(y) != 0:
                return None
            continue
        a, b = (q(y) - half) / v, (q(y) + half) / v
        a, b = (a, b) if v > 0 else (b, a)
        lo, hi = (a if lo is None else max(lo, a)), (b if hi is None else min(hi, b))
    if lo is None:
        return None
    hi = cast(Fraction, hi) - Fraction(1, 10**12)  # set with lo; the half-open interval's upper end excluded
    return (lo, hi) if lo <= hi else None


def _factor_for(ys: list[Any], vs: list[Fraction], half: Fraction) -> Fraction | None:
    got = _exact_interval(ys, vs, half)
    return simplest(*got) if got else None


def _f(x: Any) -> float:
    return float(q(x))
