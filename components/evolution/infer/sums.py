"""The sum form: factors times numbers plus a constant, the numbers chosen one at a time by least squares."""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from components.evolution.infer.context import _Ctx, _fits
from components.evolution.infer.intervals import _f
from components.evolution.infer.products import _table_keys
from components.evolution.infer.rows import BEAM, MIN_FIT, _items
from components.worlds import outcome_rules as O
from components.worlds.numbers import is_num, q, simplest
from components.worlds.outcome_rules import FieldRule, Term


def _sums(ctx: _Ctx) -> list[FieldRule]:
    """Factors times numbers plus a constant: sets of numbers grown one at a time (the `BEAM` that leave the least
    error by least squares at each size; a set whose rule already fits is a candidate and grows no more), each factor
    the simplest rational within a quantum's worth of its estimate. Searched twice: over the numbers the reads showed
    (and the write's own), then with each category's values as indicators too (a beam of its own, so that the
    indicators, which lower the error of many sets, never crowd out a sum of numbers alone)."""
    if not ctx.numeric:
        return []
    y = np.array([_f(v) for v in ctx.ys])
    pool = [
        p
        for p in ctx.paths
        if all(is_num(e.get(p)) for e in ctx.ext if p in e)
        and ctx.readable(p)
        and ("[" not in p or "[]" in p or " in " in p)
    ]
    cols = {p: np.array([_f(e[p]) if is_num(e.get(p)) else np.nan for e in ctx.ext]) for p in pool}
    indicators = _category_indicators(ctx, cols)
    out = _sum_search(ctx, y, pool, cols)
    return out + (_sum_search(ctx, y, pool + indicators, cols) if indicators else [])


def _category_indicators(ctx: _Ctx, cols: dict[str, np.ndarray]) -> list[str]:
    """Each value of a category a table may be by, as an indicator a sum may take (its column added to `cols`)."""
    indicators = []
    for _kind, key in _table_keys(ctx):
        if len(key) > 1:
            continue
        for v in sorted({str(e[key[0]]) for e in ctx.ext if key[0] in e}):
            ind = O.indicator(key[0], v)
            indicators.append(ind)
            cols[ind] = np.array([float(str(e[key[0]]) == v) if key[0] in e else np.nan for e in ctx.ext])
    return indicators


def _sum_search(ctx: _Ctx, y: np.ndarray, pool: list[str], cols: dict[str, np.ndarray]) -> list[FieldRule]:
    out: list[FieldRule] = []
    frontier: list[tuple[str, ...]] = [()]
    tried: set[tuple[str, ...]] = set()
    for _size in range(min(len(pool), max(1, len(ctx.rows) // 3))):
        scored = []
        for base in frontier:
            for p in pool:
                chosen = tuple(sorted(set(base) | {p}))
                if chosen in tried or len(chosen) == len(base):
                    continue
                tried.add(chosen)
                got = _lsq(ctx, y, [cols[c] for c in chosen])
                if got is None:
                    continue
                err, coef, scale = got
                rule = _sum_rule(ctx, chosen, coef, scale)
                if rule is not None and _fits(ctx, rule):
                    out.append(rule)
                else:
                    scored.append((err, chosen))
        if not scored:
            break
        frontier = [c for _e, c in sorted(scored)[:BEAM]]
    return out


def _lsq(ctx: _Ctx, y: np.ndarray, xs: list[np.ndarray]) -> tuple[float, np.ndarray, list[Fraction]] | None:
    ok = np.all([~np.isnan(x) for x in xs], axis=0)
    if _items([r for r, m in zip(ctx.rows, ok) if m]) < max(MIN_FIT, (3 * _items(ctx.rows)) // 4):
        return None
    x = np.column_stack([*(v[ok] for v in xs), np.ones(int(ok.sum()))])
    if np.linalg.matrix_rank(x[:, :-1]) < len(xs):
        return None  # numbers that move together: no way to tell their factors apart
    coef, *_ = np.linalg.lstsq(x, y[ok], rcond=None)
    scale = [q(max(1.0, float(np.abs(v[ok]).max()))) for v in xs]
    return float(np.abs(x @ coef - y[ok]).sum()), coef, scale


def _sum_rule(ctx: _Ctx, chosen: tuple[str, ...], coef: np.ndarray, scale: list[Fraction]) -> FieldRule | None:
    """The sum with each factor the simplest rational within a quantum's worth of its estimate (its constant too, or
    none); None for one number and no constant (a share) or a factor of zero (a number that does not count)."""
    ks = [simplest(q(c) - ctx.quantum / (2 * s), q(c) + ctx.quantum / (2 * s)) for c, s in zip(coef[:-1], scale)]
    if any(k == 0 for k in ks):
        return None
    const = simplest(q(float(coef[-1])) - ctx.quantum / 2, q(float(coef[-1])) + ctx.quantum / 2)
    for c in (const, Fraction(0)):
        if len(chosen) < 2 and c == 0:
            continue
        rule = FieldRule(ctx.fld, Term("sum", (c, tuple(zip(ks, chosen)))), quantum=ctx.quantum)
        if _fits(ctx, rule):
            return rule
    return None
