"""Two folds: a rule fitted on one half of the items and checked on the other, its thresholds placed from the data
alone."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import replace
from fractions import Fraction
from typing import Any, Literal, cast

from components.evolution.infer.picks import _ids
from components.evolution.infer.rows import (
    MIN_CHECK,
    MIN_FIT,
    MIN_PART,
    Inference,
    Row,
    _conds,
    _explains,
    _items,
    ext,
    fit_half,
    holds,
)
from components.evolution.infer.search import fitting
from components.worlds import outcome_rules as O
from components.worlds.numbers import is_num, q, same
from components.worlds.outcome_rules import Cond, FieldRule, Term


def infer_field(rows: list[Row], fld: str, exclude: frozenset[str] = frozenset()) -> Inference:
    """Fit on one half of the items, check on the other (then the other way round when that fails); the rule or why
    there is none (the first fold's reason when both fail)."""
    usable = [r for r in rows if fld in r.gold and r.agent is not None]  # what the agent saw when it wrote
    wrong = [r for r in usable if r.agent is not None and not same(r.agent.get(fld), r.gold[fld])]
    # wrong: rows with an attempt (r.agent set)
    examples = [
        {"item": r.item, "agent": cast(dict[str, Any], r.agent).get(fld), "gold": r.gold[fld]} for r in wrong[:4]
    ]
    if any(_record(r.gold[fld]) for r in usable):
        return Inference(fld, None, "a record value: no rule of the known forms states one", 0, 0, len(wrong), examples)
    half = fit_half([r.item for r in usable])
    first: Inference | None = None
    for fold in (half, {r.item for r in usable} - half):
        fit = [r for r in usable if r.item in fold]
        check = [r for r in usable if r.item not in fold]
        out = Inference(fld, None, "", _items(fit), _items(check), len(wrong), examples)
        _fold(out, fit, check, usable, exclude)
        if out.rule is not None:
            return out
        first = first or out
        if out.why.startswith("too few items"):
            break  # the other fold has the same items the other way round: no more to fit on
    return cast(Inference, first)  # the first fold set it


def _record(v: Any) -> bool:
    """A value no form states: neither a string nor a number (a bool is neither) nor a list of ids."""
    return (not isinstance(v, (str, int, float)) or isinstance(v, bool)) and not _ids(v)


def _fold(
    out: Inference, fit: list[Row], check: list[Row], usable: list[Row], exclude: frozenset[str] = frozenset()
) -> None:
    """One fold: the shortest rule on `fit` that holds on `check` (a rule refused there gives way to the next
    shortest), its thresholds placed on every row (sets out; refused: the first refused rule's reason)."""
    if out.n_fit < MIN_FIT or out.n_check < MIN_CHECK:
        out.why = f"too few items ({out.n_fit} to fit, {out.n_check} to check; need {MIN_FIT} and {MIN_CHECK})"
        return
    refused = ""
    for rule in fitting(fit, out.field, exclude):
        why = _checked(out, rule, check, usable)
        if why == "ok":
            return
        refused = refused or why
    out.why = refused or "no rule of the known forms fits the fit items"


def _checked(out: Inference, rule: FieldRule, check: list[Row], usable: list[Row]) -> str:
    """Judge one fitted rule on the check rows: "ok" (out set) or why it is refused."""
    gaps = {c.path: c.seen for c in _conds(rule) if c.seen is not None}
    verdicts = [holds(rule, r, gaps) for r in check]
    judged = [v for v in verdicts if v is not None]
    checked_items = _items([r for r, v in zip(check, verdicts) if v is not None])
    if checked_items < MIN_CHECK:
        return f"the rule can be checked on {checked_items} check item(s) only"
    if not _explains(judged):
        return f"fits the fit items but not {judged.count(False)} of {len(judged)} check rows"
    unseen = _unconfirmed(rule, [r for r, v in zip(check, verdicts) if v])  # a part is shown where it gives the gold
    if unseen:
        return f"{unseen} is never shown by the check items"
    placed = placed_on(rule, usable)
    if placed is None:
        return "a condition's two sides overlap once the check items are added"
    out.rule, out.why = placed, "ok"
    return "ok"


def _unconfirmed(rule: FieldRule, check: list[Row]) -> str:
    """The first part of the rule (a side of its condition, a factor) that no judged check row shows, or ""."""
    need: dict[str, int] = {}
    if rule.cond is not None:
        need[f"`{rule.cond.path}` {rule.cond.op} {rule.cond.value}"] = 0
        need[f"the other side of `{rule.cond.path}`"] = 0
    for c, _k in rule.factors:
        need[f"the factor when `{c.path}` {c.op} {c.value}"] = 0
    if rule.then.kind == "pick":
        need["a pick the rule rules out"] = 0
    items: dict[str, set[str]] = {k: set() for k in need}
    for r in check:
        feats = ext(r, rule.field)
        if rule.then.kind == "pick" and r.agent and O.picked(rule.then, feats, r.agent.get(rule.field)) is False:
            items["a pick the rule rules out"].add(r.item)
        if rule.cond is not None and rule.cond.path in feats:
            side = rule.cond.true(feats[rule.cond.path])
            items[
                f"`{rule.cond.path}` {rule.cond.op} {rule.cond.value}"
                if side
                else f"the other side of `{rule.cond.path}`"
            ].add(r.item)
        for n, (c, _k) in enumerate(rule.factors):
            if c.path in feats and c.true(feats[c.path]) and _moves(rule, n, feats, r):
                items[f"the factor when `{c.path}` {c.op} {c.value}"].add(r.item)
    return next((k for k, v in items.items() if len(v) < MIN_PART), "")


def _moves(rule: FieldRule, n: int, feats: Mapping[str, Any], r: Row) -> bool:
    """Whether the rule's n-th factor changes its value on the row (a factor on a zero amount shows nothing)."""
    given = r.agent.get(rule.field) if r.agent else None
    with_it = O.evaluate(rule, feats, given)
    without = O.evaluate(replace(rule, factors=tuple(f for i, f in enumerate(rule.factors) if i != n)), feats, given)
    return with_it[0] and without[0] and not same(with_it[1], without[1])


# -- thresholds placed from the data alone ------------------------------------------------------------------------


def placed_on(rule: FieldRule, rows: list[Row]) -> FieldRule | None:
    """The rule with each threshold placed in the middle of the gap every row leaves between its two sides (the
    card states the gap), or None when the sides overlap."""
    if rule.cond is not None and rule.cond.op != "is":
        yes, no = _sides(
            rows,
            rule,
            lambda r: FieldRule(r.field, r.then, quantum=r.quantum),
            # a conditional rule has both sides: `other` is set
            lambda r: FieldRule(r.field, cast(Term, r.other), quantum=r.quantum),
            rule.cond.path,
        )
        c = _place(rule.cond, yes, no)
        if c is None:
            return None
        rule = replace(rule, cond=c)
    factors = list(rule.factors)
    for n, (c, k) in enumerate(factors):
        if c.op == "is":
            continue
        always = (Cond(c.path, ">", Fraction(-(10**18))), k)

        def forced(r: FieldRule, n: int = n, always: tuple[Cond, Fraction] = always) -> FieldRule:
            return replace(r, factors=tuple(always if i == n else f for i, f in enumerate(r.factors)))

        def removed(r: FieldRule, n: int = n) -> FieldRule:
            return replace(r, factors=tuple(f for i, f in enumerate(r.factors) if i != n))

        yes, no = _sides(rows, rule, forced, removed, c.path)
        placed = _place(c, yes, no)
        if placed is None:
            return None
        factors[n] = (placed, k)
    return replace(rule, factors=tuple(factors))


def _sides(
    rows: list[Row],
    rule: FieldRule,
    on: Callable[[FieldRule], FieldRule],
    off: Callable[[FieldRule], FieldRule],
    path: str,
) -> tuple[list[Fraction], list[Fraction]]:
    """Values of `path` on rows only the rule with the condition forced true (`on`) or only with it removed or
    forced false (`off`) explains."""
    a_rule, b_rule = on(rule), off(rule)
    yes, no = [], []
    for r in rows:
        g = ext(r, rule.field).get(path)
        if not is_num(g):
            continue
        a, b = holds(a_rule, r), holds(b_rule, r)
        if a and not b:
            yes.append(q(g))
        elif b and not a:
            no.append(q(g))
    return yes, no


def _place(c: Cond, yes: list[Fraction], no: list[Fraction]) -> Cond | None:
    """The condition's threshold in the middle of the gap between the values it must hold on (`yes`) and those it
    must not (`no`), at the values' own resolution; the gap stated."""
    if not yes or not no:
        return c
    if c.op in (">", ">="):
        lo, hi = max(no), min(yes)
    else:
        lo, hi = max(yes), min(no)
    if lo >= hi:
        return None
    res = Fraction(1, max(v.denominator for v in yes + no))
    t = math.floor((lo + hi) / 2 / res) * res
    t = min(max(t, lo), hi - res) if hi - res >= lo else lo
    op: Literal[">", "<="] = ">" if c.op in (">", ">=") else "<="
    return Cond(c.path, op, t, (lo, hi))
