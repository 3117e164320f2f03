"""The simple forms (const, equal, upper, one_of) and the conditional one (a condition with a simple term on each
side)."""

from __future__ import annotations

from typing import Any, cast

import numpy as np

from components.evolution.infer.context import _Ctx, _fits
from components.evolution.infer.intervals import _f, _factor_for, _regions
from components.evolution.infer.rows import MAX_PAIRS, MIN_PART, MIN_SIDE, _explains, _items
from components.worlds import outcome_rules as O
from components.worlds.numbers import is_num, q, same
from components.worlds.outcome_rules import FieldRule, Term, category


def _simple_terms(ctx: _Ctx, rows_idx: list[int]) -> list[Term]:
    """const, equal and share terms that give the gold value in most of the given rows."""
    sub = [ctx.ys[i] for i in rows_idx]
    terms: list[Term] = []
    vals = [str(y) for y in sub]
    for v in sorted(set(vals)):
        if vals.count(v) == len(vals):
            terms.append(Term("const", sub[0] if not is_num(sub[0]) else q(sub[0])))
    for p in ctx.paths:
        on = [i for i in rows_idx if p in ctx.ext[i]]
        if len(on) < max(MIN_SIDE, len(rows_idx) // 2):
            continue
        if _explains([same(ctx.ext[i][p], ctx.ys[i]) for i in on]):
            terms.append(Term("equal", None, p))
        elif ctx.numeric and p in ctx.nums and (share := _share_on(ctx, on, p)) is not None:
            terms.append(share)
    return terms


def _share_on(ctx: _Ctx, on: list[int], p: str) -> Term | None:
    """The share of number `p` that gives the gold on the rows `on` where `p` is not zero (None: too few such rows,
    or a factor of 0 or 1, which other terms state)."""
    vs = [q(ctx.ext[i][p]) for i in on if is_num(ctx.ext[i][p]) and q(ctx.ext[i][p]) != 0]
    ys = [ctx.ys[i] for i in on if is_num(ctx.ext[i][p]) and q(ctx.ext[i][p]) != 0]
    if len(vs) < MIN_SIDE:
        return None
    k = _factor_for(ys, vs, ctx.quantum / 2)
    return Term("share", k, p) if k is not None and k not in (0, 1) else None


def _conditionals(ctx: _Ctx) -> list[FieldRule]:
    """A condition and a simple term on each side: for every pair of terms that each explain some rows the other
    does not, the conditions that best split them."""
    cands = _side_terms(ctx)
    masks = {
        O.render_term(t): np.array([v is True for v in ctx.verdicts(FieldRule(ctx.fld, t, quantum=ctx.quantum))])
        for t in cands
    }
    cands = [t for t in cands if _items([r for r, m in zip(ctx.rows, masks[O.render_term(t)]) if m]) >= MIN_PART]
    out = []
    for a, b in _complementary(cands, masks):  # the pairs that together give the most rows their value, each split
        labels = masks[O.render_term(a)].astype(float) - masks[O.render_term(b)].astype(float)
        for _score, c in ctx.stumps.best(labels, 3):
            rule = FieldRule(ctx.fld, a, c, b, quantum=ctx.quantum)
            on = [row for row, e in zip(ctx.rows, ctx.ext) if c.path in e]
            yes = [row for row, e in zip(ctx.rows, ctx.ext) if c.path in e and c.true(e[c.path])]
            if _items(yes) >= MIN_PART and _items(on) - _items(yes) >= MIN_PART and _fits(ctx, rule):
                out.append(rule)
    return out


def _side_terms(ctx: _Ctx) -> list[Term]:
    """The terms a side of a condition may take: the simple terms over all rows, the constants that name a kind (no
    digit: not an id) and the most common numbers, a read's value wherever it gives enough rows theirs, and shares
    of a number fitted on the regions of rows one factor can give (`_share_terms`)."""
    every = list(range(len(ctx.rows)))
    cands = _simple_terms(ctx, every)
    vals = [str(y) for y in ctx.ys]
    kinds = [v for v in sorted(set(vals)) if category(ctx.ys[vals.index(v)])]
    numbers = sorted({v for v in vals if is_num(ctx.ys[vals.index(v)])}, key=lambda v: (-vals.count(v), v))[:8]
    for v in kinds + numbers:
        y = ctx.ys[vals.index(v)]
        t = Term("const", q(y) if is_num(y) else y)
        if t not in cands:
            cands.append(t)
    for p in ctx.paths:
        t = Term("equal", None, p)
        if t not in cands and sum(1 for i in every if p in ctx.ext[i] and same(ctx.ext[i][p], ctx.ys[i])) >= MIN_PART:
            cands.append(t)
    if ctx.numeric:
        for t in _share_terms(ctx):
            if t not in cands:
                cands.append(t)
    return cands


def _share_terms(ctx: _Ctx) -> list[Term]:
    """Per number a read showed, the factor each region of rows that one factor can give (`_regions`) takes."""
    half = ctx.quantum / 2
    out: list[Term] = []
    for p in ctx.nums:
        idx = [i for i in range(len(ctx.rows)) if is_num(ctx.ext[i].get(p)) and q(ctx.ext[i][p]) != 0]
        if len(idx) < MIN_SIDE:
            continue
        lo = np.array([_f((q(ctx.ys[i]) - half) / q(ctx.ext[i][p])) for i in idx])
        hi = np.array([_f((q(ctx.ys[i]) + half) / q(ctx.ext[i][p])) for i in idx])
        lo, hi = np.minimum(lo, hi), np.maximum(lo, hi)
        for sup in _regions(lo, hi, 2):
            chosen = [idx[j] for j in np.nonzero(sup)[0]]
            if len(chosen) < MIN_SIDE:
                continue
            k = _factor_for([ctx.ys[i] for i in chosen], [q(ctx.ext[i][p]) for i in chosen], half)
            if k is not None and k not in (0, 1) and Term("share", k, p) not in out:
                out.append(Term("share", k, p))
    return out


def _complementary(cands: list[Term], masks: dict[str, np.ndarray]) -> list[tuple[Term, Term]]:
    """The ordered pairs of terms where each gives some rows their value the other does not, those that together
    give the most rows theirs first (ties by name), at most `MAX_PAIRS`."""
    names = [O.render_term(t) for t in cands]
    m = np.array([masks[n] for n in names], dtype=float) if cands else np.zeros((0, 0))
    both = m @ m.T
    union = m.sum(axis=1)[:, None] + m.sum(axis=1)[None, :] - both
    pairs = sorted(
        (
            (-union[i, j], names[i], names[j], i, j)
            for i in range(len(cands))
            for j in range(len(cands))
            if i != j and both[i, j] < min(m[i].sum(), m[j].sum())
        )
    )[:MAX_PAIRS]
    return [(cands[i], cands[j]) for _u, _na, _nb, i, j in pairs]


def _strings(ctx: _Ctx) -> list[FieldRule]:
    """upper, one_of: what a string field can be without a feature holding it."""
    out = []
    rows = ctx.rows
    cased = [
        r
        for r in rows
        if isinstance(r.agent.get(ctx.fld) if r.agent else None, str) and isinstance(r.gold.get(ctx.fld), str)
    ]
    agent = [cast(dict[str, Any], r.agent) for r in cased]  # cased: rows with an attempt (r.agent set)
    if (
        cased
        and len(cased) == len(rows)
        and any(a[ctx.fld] != r.gold[ctx.fld] for a, r in zip(agent, cased))
        and all(a[ctx.fld].upper() == r.gold[ctx.fld] for a, r in zip(agent, cased))
    ):
        out.append(FieldRule(ctx.fld, Term("upper")))
    if all(isinstance(y, str) for y in ctx.ys):
        values = sorted(set(ctx.ys))
        if 2 <= len(values) and _items(ctx.rows) >= 2 * len(values):  # each value shown by two items on average
            out.append(FieldRule(ctx.fld, Term("one_of", tuple(values))))
    return out


def _consts_and_equals(ctx: _Ctx) -> list[FieldRule]:
    out = []
    if ctx.ys and all(same(y, ctx.ys[0]) for y in ctx.ys):
        y = ctx.ys[0]
        out.append(FieldRule(ctx.fld, Term("const", q(y) if is_num(y) else y), quantum=ctx.quantum))
    for p in ctx.paths:
        on = [i for i, e in enumerate(ctx.ext) if p in e]
        if _items([ctx.rows[i] for i in on]) < MIN_SIDE:
            continue
        if _explains([same(ctx.ext[i][p], ctx.ys[i]) for i in on]):
            out.append(FieldRule(ctx.fld, Term("equal", None, p), quantum=ctx.quantum))
    return out
