"""The product form's structures: the bases a product may start from, and which conditions carry a factor (a
log-linear search over the fit rows)."""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from components.evolution.infer.context import _Ctx
from components.evolution.infer.exact import _exact_products
from components.evolution.infer.intervals import _f, _regions
from components.evolution.infer.rows import BEAM, EXPLAIN, MAX_BASES, MIN_FIT, _items
from components.worlds.numbers import is_num, q
from components.worlds.outcome_rules import Cond, FieldRule, Term


def _products(ctx: _Ctx) -> list[FieldRule]:
    """A base times factors: for each base (a constant, a number the reads showed, a table by one or two categories),
    which conditions carry a factor is found as a linear model of the gold's logarithm (the base's and each
    condition's indicator, the indicators added one at a time, the one most correlated with what is left); then
    each structure's constants are fitted exactly, in each order its factors can be applied in (rounding after each
    factor makes the order matter), and with the cap the capped rows show."""
    if not ctx.numeric:
        return []
    half = ctx.quantum / 2
    out: list[FieldRule] = []
    cands = _indicators(ctx)
    for base in _product_bases(ctx):
        for conds in _structures(ctx, base, cands):
            out += _exact_products(ctx, base, conds, half)
    return out


@dataclass
class _Indicators:
    """Every condition a factor may take on the fit rows (thresholds between two values a number shows, in the
    direction `>`, and each value of a category), as a 0/1 matrix (rows x conditions)."""

    conds: list[Cond]
    matrix: np.ndarray

    @property
    def by_path(self) -> dict[str, list[int]]:
        if "_by_path" not in self.__dict__:
            out: dict[str, list[int]] = {}
            for j, c in enumerate(self.conds):
                out.setdefault(c.path, []).append(j)
            self.__dict__["_by_path"] = out
        by_path: dict[str, list[int]] = self.__dict__["_by_path"]
        return by_path


def _indicators(ctx: _Ctx) -> _Indicators:
    conds: list[Cond] = []
    cols: list[np.ndarray] = []
    for p in ctx.nums:
        vals = sorted({q(e[p]) for e in ctx.ext if p in e})
        x = np.array([_f(e[p]) if p in e else np.nan for e in ctx.ext])
        for lo, hi in zip(vals, vals[1:]):
            conds.append(Cond(p, ">", lo, (lo, hi)))
            cols.append(np.nan_to_num(x > float(lo)).astype(float))
    for p in ctx.cats:
        seen = [e.get(p) for e in ctx.ext]
        for v in sorted({x for x in seen if x is not None}):
            conds.append(Cond(p, "is", v))
            cols.append(np.array([x == v for x in seen], dtype=float))
    matrix = np.column_stack(cols) if cols else np.zeros((len(ctx.rows), 0))
    return _Indicators(conds, matrix)


def _product_bases(ctx: _Ctx) -> list[Term]:
    """The bases a product may start from: the constant 1 (the constant is fitted), the `MAX_BASES` numbers most rows
    read (never zero) whose most common ratio to the gold holds on the most items, and tables by one or two
    categories (fitted)."""
    bases = [Term("const", Fraction(1))]
    half = ctx.quantum / 2
    ranked = []
    for p in ctx.nums:
        idx = [i for i, e in enumerate(ctx.ext) if p in e and is_num(ctx.ys[i]) and q(ctx.ys[i]) > 0]
        if not idx or not all(q(e[p]) > 0 for e in ctx.ext if p in e):
            continue
        lo = np.array([_f((q(ctx.ys[i]) - half) / ctx.ext[i][p]) for i in idx])
        hi = np.array([_f((q(ctx.ys[i]) + half) / ctx.ext[i][p]) for i in idx])
        top = _regions(lo, hi, 1)
        support = _items([ctx.rows[idx[j]] for j in np.nonzero(top[0])[0]]) if top else 0
        ranked.append((-support, p))
    bases += [Term("equal", None, p) for _s, p in sorted(ranked)[:MAX_BASES]]
    for _kind, key in _table_keys(ctx):
        bases.append(Term("table", (), key if len(key) > 1 else key[0]))
    return bases


def _table_keys(ctx: _Ctx) -> list[tuple[str, tuple[str, ...]]]:
    """Tables by one category, or by two whose pairs are few against the items (a lookup of ids is no rule)."""
    n = _items(ctx.rows)
    ones = [p for p in ctx.cats if 2 <= ctx.distinct[p] <= max(2, n // 2)]
    keys: list[tuple[str, tuple[str, ...]]] = [("table", (p,)) for p in ones]
    for i, a in enumerate(ones):
        for b in ones[i + 1 :]:
            pairs = {(e.get(a), e.get(b)) for e in ctx.ext if a in e and b in e}
            if len(pairs) <= max(2, n // 3):
                keys.append(("table", (a, b)))
    return keys


def _base_design(ctx: _Ctx, base: Term) -> tuple[np.ndarray, np.ndarray, list[tuple[str, ...]]] | None:
    """For the log-linear search: each row's log(gold / base value) target, the base's columns (an intercept, or a
    category's one-hot), and the table's keys; rows where either is not positive are left out (NaN)."""
    y = np.array([_f(v) for v in ctx.ys])
    keys: list[tuple[str, ...]] = []
    if base.kind == "table":
        rk = [tuple(str(e[p]) for p in base.paths) if all(p in e for p in base.paths) else None for e in ctx.ext]
        keys = sorted({k for k in rk if k is not None})
        design = np.array([[float(k == key) for key in keys] for k in rk])
        b = np.ones(len(y))
        missing = np.array([k is None for k in rk])
    else:
        b = (
            np.array([_f(e[base.path]) if base.path in e else np.nan for e in ctx.ext])
            if base.kind == "equal"
            else np.ones(len(y))
        )
        design = np.ones((len(y), 1))
        missing = np.isnan(b)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where((y > 0) & (b > 0) & ~missing, np.log(np.where(y > 0, y, 1) / np.where(b > 0, b, 1)), np.nan)
    if np.isnan(t).sum() > len(t) - max(MIN_FIT, len(t) // 2):
        return None
    return t, design, keys


def _structures(ctx: _Ctx, base: Term, ind: _Indicators) -> list[list[Cond]]:
    """The sets of conditions with a factor, grown one at a time: from each of the `BEAM` best sets so far, the
    `BEAM` indicators most correlated with the residual of its log-linear fit (one condition per feature; with few
    items a coincidence can correlate as well as the cause, and the check half tells them apart); each set along
    the way a structure to fit exactly."""
    ll = _log_linear(ctx, base, ind)
    if ll is None:
        return []
    seen: set[tuple[int, ...]] = set()
    frontier: list[list[int]] = [[]]
    fitting_sets: list[list[int]] = []  # the sets whose log-linear fit explains the rows up to twice rounding's noise
    for _step in range(min(len(ind.conds), max(1, len(ll.t) // 4))):
        grown: list[tuple[float, list[int]]] = []
        for chosen in frontier:
            x = ll.columns(chosen)
            r = ll.residual(x)
            if np.mean(np.abs(r) <= ll.noise) >= EXPLAIN:
                fitting_sets.append(chosen)
                continue  # explains the rows up to rounding: more conditions would fit noise
            if _capped_shape(x, ll.t, ll.noise) and chosen not in fitting_sets:
                fitting_sets.append(chosen)  # a cap may explain the rest
            grown += _grown(ll, ind, chosen, r, seen)
        if not grown:
            break
        grown.sort(key=lambda g: (g[0], g[1]))
        frontier = [g[1] for g in grown[:BEAM]]
    for chosen in frontier:  # the last sets grown, if they were not judged yet
        if np.mean(np.abs(ll.residual(ll.columns(chosen))) <= ll.noise) >= EXPLAIN and chosen not in fitting_sets:
            fitting_sets.append(chosen)
    return [[ind.conds[j] for j in chosen] for chosen in fitting_sets]  # only these can fit exactly


@dataclass
class _LogLinear:
    """What a structure search fits, on the rows where the gold and the base are positive: the log target `t`, the
    base's columns, the indicators `m` (and, centred, their norms: their correlation with a residual), and twice
    what rounding can do to a log."""

    t: np.ndarray
    design: np.ndarray
    m: np.ndarray
    noise: np.ndarray
    centered: np.ndarray
    norm: np.ndarray

    def columns(self, chosen: list[int]) -> np.ndarray:
        return np.column_stack([self.design] + [self.m[:, j] for j in chosen]) if chosen else self.design

    def residual(self, x: np.ndarray) -> np.ndarray:
        coef, *_ = np.linalg.lstsq(x, self.t, rcond=None)
        res: np.ndarray = self.t - x @ coef
        return res


def _log_linear(ctx: _Ctx, base: Term, ind: _Indicators) -> _LogLinear | None:
    got = _base_design(ctx, base)
    if got is None:
        return None
    t, design, _keys = got
    ok = ~np.isnan(t)
    t, design, m = t[ok], design[ok], ind.matrix[ok]
    y = np.array([_f(v) for v in ctx.ys])[ok]
    noise = np.log((y + _f(ctx.quantum)) / np.maximum(y - _f(ctx.quantum), 1e-12))  # what rounding can do to a log
    centered = m - m.mean(axis=0)
    norm = np.sqrt((centered**2).sum(axis=0))
    return _LogLinear(t, design, m, 2 * noise, centered, norm)


def _grown(
    ll: _LogLinear, ind: _Indicators, chosen: list[int], r: np.ndarray, seen: set[tuple[int, ...]]
) -> list[tuple[float, list[int]]]:
    """The sets one condition larger than `chosen` (its residual `r`): the `BEAM` indicators most correlated with
    the residual, one per feature not chosen yet, each set's thresholds refined; (squared error, set) for each set
    not seen before."""
    with np.errstate(divide="ignore", invalid="ignore"):
        score = np.where(ll.norm > 0, np.abs(ll.centered.T @ r) / ll.norm, 0.0)
    used = {ind.conds[j].path for j in chosen}
    picks = [int(j) for j in np.argsort(-score, kind="stable") if score[j] > 1e-9 and ind.conds[j].path not in used]
    taken: set[str] = set()
    out: list[tuple[float, list[int]]] = []
    for j in picks:
        if ind.conds[j].path in taken:
            continue
        taken.add(ind.conds[j].path)
        refined = _refined(ind, chosen + [j], ll.design, ll.m, ll.t)
        key = tuple(sorted(refined))
        if key not in seen:
            seen.add(key)
            out.append((_sse(np.column_stack([ll.design] + [ll.m[:, k] for k in refined]), ll.t), refined))
        if len(taken) >= BEAM:
            break
    return out


def _capped_shape(x: np.ndarray, t: np.ndarray, noise: np.ndarray) -> bool:
    """Whether the rows a fit misses could be a cap's: fitted on the rows it explains best, every other row lies
    below it (a ceiling takes off the top), and they are a minority."""
    coef, *_ = np.linalg.lstsq(x, t, rcond=None)
    r = t - x @ coef
    inside = np.abs(r) <= noise
    if inside.mean() >= EXPLAIN or inside.sum() < len(t) / 2:
        keep = inside if inside.sum() >= len(t) / 2 else r >= np.median(r)
    else:
        keep = inside
    coef, *_ = np.linalg.lstsq(x[keep], t[keep], rcond=None)
    r = t - x @ coef
    off = np.abs(r) > noise
    return bool(off.any()) and off.mean() < 0.5 and bool((r[off] < 0).all())


def _sse(x: np.ndarray, t: np.ndarray) -> float:
    coef, *_ = np.linalg.lstsq(x, t, rcond=None)
    return float(((t - x @ coef) ** 2).sum())


def _refined(ind: _Indicators, chosen: list[int], design: np.ndarray, m: np.ndarray, t: np.ndarray) -> list[int]:
    """Each chosen threshold moved to the cut of its feature that leaves the least squared error with the others
    fixed (a cut picked alone can sit off where factors interact), twice over. Every cut of a feature is judged at
    once: the error of adding a column z to a fit with residual r is |r|^2 - (z'r)^2/|z'|^2, z' what the other
    columns leave of z."""
    chosen = list(chosen)
    for _pass in range(2):
        for n, j in enumerate(chosen):
            c = ind.conds[j]
            if c.op != ">":
                continue
            others = np.column_stack([design] + [m[:, k] for i, k in enumerate(chosen) if i != n])
            basis, _ = np.linalg.qr(others)
            r = t - basis @ (basis.T @ t)
            alts = ind.by_path[c.path]
            z = m[:, alts]
            z = z - basis @ (basis.T @ z)
            den = (z * z).sum(axis=0)
            gain = np.where(den > 1e-12, (z.T @ r) ** 2 / np.where(den > 1e-12, den, 1.0), 0.0)
            chosen[n] = alts[int(np.argmax(gain))]
    return chosen
