"""Every form's candidates that fit the fit rows, shortest description first (per unit of a count too)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from fractions import Fraction

from components.evolution.infer.context import _Ctx, _fits, description_bits
from components.evolution.infer.picks import _picks
from components.evolution.infer.products import _products
from components.evolution.infer.rows import MIN_FIT, Row, _items
from components.evolution.infer.sums import _sums
from components.evolution.infer.terms import _conditionals, _consts_and_equals, _strings
from components.worlds import outcome_rules as O
from components.worlds.numbers import is_num, q
from components.worlds.outcome_rules import FieldRule

FORMS = (_consts_and_equals, _strings, _products, _conditionals, _sums)
LIST_FORMS = (_consts_and_equals, _picks)  # a list argument (of ids)


def fitting(rows: list[Row], fld: str, exclude: frozenset[str] = frozenset()) -> Iterator[FieldRule]:
    """Every rule of the forms above that fits the fit rows, shortest description first (ties by the card's text)."""
    if not rows:
        return iter(())
    ctx = _Ctx(rows, fld, exclude)
    found: dict[str, tuple[float, FieldRule]] = {}
    for form in LIST_FORMS if any(isinstance(y, list) for y in ctx.ys) else FORMS:
        for rule in form(ctx):
            if not _fits(ctx, rule):
                continue
            text = O.render("t", rule)
            if text not in found:
                found[text] = (description_bits(ctx, rule), rule)
    for count, unit in _per_unit(ctx):
        for form in FORMS:
            for rule in form(unit):
                rule = replace(rule, each=count)
                if rule.cap is not None or not _fits(ctx, rule):
                    continue
                text = O.render("t", rule)
                if text not in found:
                    found[text] = (description_bits(ctx, rule), rule)
    return iter(r for _b, _t, r in sorted((b, t, r) for t, (b, r) in found.items()))


def _per_unit(ctx: _Ctx) -> Iterator[tuple[str, _Ctx]]:
    """(count, the fit rows with the gold divided by it) for each count of records (`len(...)`) that most rows read,
    that differs between items and divides every gold value into amounts the gold's own quantum holds."""
    if not ctx.numeric:
        return
    for p in ctx.nums:
        if not p.startswith("len(") or ctx.distinct.get(p, 0) < 2:
            continue
        on = [i for i, e in enumerate(ctx.ext) if is_num(e.get(p)) and q(e[p]) > 0]
        units = {i: q(ctx.ys[i]) / q(ctx.ext[i][p]) for i in on}
        if _items([ctx.rows[i] for i in on]) < MIN_FIT or any(
            (u / ctx.quantum).denominator != 1 for u in units.values()
        ):
            continue
        rows = [replace(ctx.rows[i], gold={**ctx.rows[i].gold, ctx.fld: _plain(units[i])}) for i in on]
        yield p, _Ctx(rows, ctx.fld, ctx.exclude)


def _plain(x: Fraction) -> int | float:
    return int(x) if x.denominator == 1 else float(x)


def smallest(rows: list[Row], fld: str) -> FieldRule | None:
    """The shortest rule of the forms above that fits the rows."""
    return next(fitting(rows, fld), None)
