"""The product form's constants: a structure's base and factors fitted exactly on the rows, in each order the
factors can be applied in, with the cap the capped rows show."""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction
from typing import cast

import numpy as np

from components.evolution.infer.context import _Ctx, _fits
from components.evolution.infer.intervals import _f, _factor_for, _regions
from components.evolution.infer.rows import MIN_PART, _items
from components.worlds import outcome_rules as O
from components.worlds.numbers import is_num, q, same
from components.worlds.outcome_rules import Cond, FieldRule, Term


def _sides_of(ctx: _Ctx, c: Cond) -> tuple[Cond, ...]:
    """A condition and its other side: `> lo` and `<= lo`; a category of two values and the other value."""
    if c.op == ">":
        return c, Cond(c.path, "<=", c.value, c.seen)
    values = sorted({e[c.path] for e in ctx.ext if c.path in e})
    if len(values) == 2:
        return c, Cond(c.path, "is", values[1] if values[0] == c.value else values[0])
    return (c,)


def _exact_products(ctx: _Ctx, base: Term, conds: list[Cond], half: Fraction) -> list[FieldRule]:
    """The structure's rules with exact constants: each side of each threshold (the factor where it holds), each
    order of the factors (all of them up to three; else as found and reversed), and a cap where rows show one."""
    from itertools import permutations, product

    if len(conds) <= 2:
        sides = list(product(*[_sides_of(ctx, c) for c in conds]))
    else:  # each factor on the side that holds on fewer rows (the base cell the largest), and all turned round
        minority = tuple(
            min(_sides_of(ctx, c), key=lambda s: sum(1 for e in ctx.ext if s.path in e and s.true(e[s.path])))
            for c in conds
        )
        sides = [
            minority,
            tuple(
                _sides_of(ctx, c)[-1]
                if c in minority and len(_sides_of(ctx, c)) > 1 and _sides_of(ctx, c)[0] == c
                else _sides_of(ctx, c)[0]
                for c in minority
            ),
        ]
    out = []
    for chosen in sides:
        orders = list(permutations(chosen)) if len(chosen) <= 3 else [tuple(chosen), tuple(reversed(chosen))]
        for order in orders:
            rule = _fit_constants(ctx, base, list(order), half)
            if rule is None:
                continue
            if _fits(ctx, rule):
                out.append(rule)
            elif (capped := _with_cap(ctx, rule)) is not None:
                out.append(capped)
    return out


def _truths(ctx: _Ctx, conds: list[Cond]) -> list[tuple[bool, ...] | None]:
    """Per row, which conditions hold (None: a condition's feature is missing)."""
    out: list[tuple[bool, ...] | None] = []
    for e in ctx.ext:
        if any(c.path not in e for c in conds):
            out.append(None)
        else:
            out.append(tuple(c.true(e[c.path]) for c in conds))
    return out


def _fit_constants(ctx: _Ctx, base: Term, order: list[Cond], half: Fraction) -> FieldRule | None:
    """The base's constant (or table) from the rows where no condition holds, then each factor in `order` from the
    rows where it is the last of the conditions that hold, given the ones before it: each the simplest rational in
    the interval its rows leave (their most common one, where rows disagree)."""
    truths = _truths(ctx, order)
    none = [i for i, tr in enumerate(truths) if tr is not None and not any(tr)]
    fitted = _fit_head(ctx, base, none, half)
    if fitted is None:
        return None
    head: Term | None
    head, missing = fitted
    factors = _fit_factors(ctx, head, order, truths, half)
    if factors is None:
        return None
    if missing:
        head = _filled(ctx, head, missing, order, truths, factors, half)
        if head is None:
            return None
    if head.kind == "table" and len({n for _k, n in head.value}) < 2:
        return None  # one value for every category: not a table
    return FieldRule(ctx.fld, head, factors=tuple(factors), quantum=ctx.quantum)


def _fit_head(ctx: _Ctx, base: Term, none: list[int], half: Fraction) -> tuple[Term, list[tuple[str, ...]]] | None:
    """The base's constant, or its table's entries, from the rows where no condition holds (`none`), and the
    table's categories seen only with a factor (their base comes from the factor: `_filled`)."""
    if base.kind != "table":
        head = _fit_scalar_head(ctx, base, none, half)
        return (head, []) if head is not None else None
    return _fit_table_head(ctx, base, none, half)


def _fit_scalar_head(ctx: _Ctx, base: Term, none: list[int], half: Fraction) -> Term | None:
    """A constant base's value, or a number's share (itself when the share is 1)."""
    vs = _base_values(ctx, base)
    idx = [i for i in none if vs[i] is not None and vs[i] != 0]
    k0 = _most_common_factor(ctx, idx, cast(list[Fraction], [vs[i] for i in idx]), half)  # idx: rows with a value
    if k0 is None or k0 == 0:
        return None
    return (
        Term("const", k0)
        if base.kind == "const"
        else Term("equal", None, base.path)
        if k0 == 1
        else Term("share", k0, base.path)
    )


def _fit_table_head(
    ctx: _Ctx, base: Term, none: list[int], half: Fraction
) -> tuple[Term, list[tuple[str, ...]]] | None:
    """A table's entries, and the categories no row without a factor shows."""
    rk = [tuple(str(e[p]) for p in base.paths) if all(p in e for p in base.paths) else None for e in ctx.ext]
    entries, missing = [], []
    for key in sorted({k for k in rk if k is not None}):
        idx = [i for i in none if rk[i] == key]
        k = _most_common_factor(ctx, idx, [Fraction(1)] * len(idx), half) if idx else None
        if k is None:
            missing.append(key)
        else:
            entries.append((key, k))
    return (Term("table", tuple(entries), base.path), missing) if entries else None


def _fit_factors(
    ctx: _Ctx, head: Term, order: list[Cond], truths: list[tuple[bool, ...] | None], half: Fraction
) -> list[tuple[Cond, Fraction]] | None:
    """Each factor in `order` from the rows where it is the last of the conditions that hold, given the head and
    the factors before it; None where one is missing, 0 or 1."""
    factors: list[tuple[Cond, Fraction]] = []
    for j, c in enumerate(order):
        rule = FieldRule(ctx.fld, head, factors=tuple(factors), quantum=ctx.quantum)
        idx = [i for i, tr in enumerate(truths) if tr is not None and tr[j] and not any(tr[j + 1 :])]
        vs = []
        for i in idx:
            ok, v = O.evaluate(rule, ctx.ext[i])
            vs.append(q(v) if ok and is_num(v) else None)
        keep = [(i, v) for i, v in zip(idx, vs) if v is not None and v != 0]
        k = _most_common_factor(ctx, [i for i, _v in keep], [v for _i, v in keep], half)
        if k is None or k in (0, 1):
            return None
        factors.append((c, k))
    return factors


def _filled(
    ctx: _Ctx,
    head: Term,
    missing: list[tuple[str, ...]],
    order: list[Cond],
    truths: list[tuple[bool, ...] | None],
    factors: list[tuple[Cond, Fraction]],
    half: Fraction,
) -> Term | None:
    """A table's entries for the categories seen only where one factor applies: the simplest value that factor
    turns into their gold (the factor is the same for every category: the product's form)."""
    rk = [tuple(str(e[p]) for p in head.paths) if all(p in e for p in head.paths) else None for e in ctx.ext]
    entries = list(head.value)
    for key in missing:
        for j, (_c, k) in enumerate(factors):
            idx = [i for i, tr in enumerate(truths) if rk[i] == key and tr is not None and tr[j] and sum(tr) == 1]
            got = _most_common_factor(ctx, idx, [k] * len(idx), half) if idx else None
            if got is not None:
                entries.append((key, got))
                break
        else:
            return None
    return Term("table", tuple(sorted(entries)), head.path)


def _most_common_factor(ctx: _Ctx, idx: list[int], vs: list[Fraction], half: Fraction) -> Fraction | None:
    """The simplest k with round(v * k) equal to the gold on the most rows of `idx` (at least `MIN_PART` items)."""
    if _items([ctx.rows[i] for i in idx]) < MIN_PART:
        return None
    ys = [q(ctx.ys[i]) for i in idx]
    lo = np.array([_f(min((y - half) / v, (y + half) / v)) for y, v in zip(ys, vs)])
    hi = np.array([_f(max((y - half) / v, (y + half) / v)) for y, v in zip(ys, vs)])
    regions = _regions(lo, hi, 1)
    if not regions:
        return None
    sup = [j for j in np.nonzero(regions[0])[0]]
    if _items([ctx.rows[idx[j]] for j in sup]) < MIN_PART:
        return None
    return _factor_for([ys[j] for j in sup], [vs[j] for j in sup], half)


def _with_cap(ctx: _Ctx, rule: FieldRule) -> FieldRule | None:
    """The rule at most the value its wrong rows all hold, when each of them is below what the rule gives and no
    right row is above it."""
    over, below_ok = [], True
    for e, y in zip(ctx.ext, ctx.ys):
        ok, v = O.evaluate(rule, e)
        if not ok or not is_num(v):
            continue
        if same(v, y):
            continue
        if q(v) > q(y):
            over.append(q(y))
        else:
            below_ok = False
    if not over or not below_ok or len(set(over)) != 1:
        return None
    capped = replace(rule, cap=over[0])
    return capped if _fits(ctx, capped) else None


def _base_values(ctx: _Ctx, base: Term) -> list[Fraction | None]:
    """Each row's value of the base term before any factor (a number as it is: the factor multiplies it)."""
    out: list[Fraction | None] = []
    for e in ctx.ext:
        if base.kind == "const":
            out.append(Fraction(1))
        else:
            path = cast(str, base.path)  # a number's term (equal, share) reads one feature
            out.append(q(e[path]) if is_num(e.get(path)) else None)
    return out
