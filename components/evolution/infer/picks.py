"""The pick form: a list of ids, each the key of a record a read listed with the attribute every gold pick shares."""

from __future__ import annotations

from typing import Any, cast

from components.evolution.infer.context import _Ctx
from components.evolution.infer.rows import MIN_SIDE
from components.worlds import outcome_rules as O
from components.worlds.outcome_rules import FieldRule, Term


def _ids(y: Any) -> bool:
    return isinstance(y, list) and bool(y) and all(isinstance(x, (str, int)) and not isinstance(x, bool) for x in y)


def _picks(ctx: _Ctx) -> list[FieldRule]:
    """pick: for each read's list in which every gold id is one record's key, the attribute value every gold pick
    has that most of the agent's other picks lack (at least one item's; a value no record lacks filters nothing)."""
    if not ctx.ys or not all(_ids(y) for y in ctx.ys):
        return []
    out = []
    for path in ctx.lists:
        on = [i for i, e in enumerate(ctx.ext) if isinstance(e.get(path), O.Records)]
        for key in _id_keys(ctx, path, on):
            best = None
            for attr, value in _shared(ctx, path, key, on):
                rule = FieldRule(ctx.fld, Term("pick", (key, ((attr, value),)), path))
                turned = _turned(ctx, rule, on)
                filters = sum(1 for i in on if any(not O.equal(e.get(attr), value) for e in ctx.ext[i][path]))
                if turned and filters >= MIN_SIDE and (best is None or (turned, filters) > best[:2]):
                    best = (turned, filters, rule)
            if best is not None:
                out.append(best[2])
    return out


def _id_keys(ctx: _Ctx, path: str, on: list[int]) -> list[str]:
    """The record keys under which every gold id names exactly one record of the list, on every row that has it."""
    keys = None
    for i in on:
        recs = ctx.ext[i][path]
        here = {
            k for k in set().union(*recs) if all(sum(str(e.get(k)) == str(x) for e in recs) == 1 for x in ctx.ys[i])
        }
        keys = here if keys is None else keys & here
    return sorted(keys or ())


def _shared(ctx: _Ctx, path: str, key: str, on: list[int]) -> list[tuple[str, Any]]:
    """(attribute, value) pairs that every gold pick has (scalars and booleans, not the key)."""
    common: dict[str, Any] | None = None
    for i in on:
        recs = ctx.ext[i][path]
        for x in ctx.ys[i]:
            e = next(e for e in recs if str(e.get(key)) == str(x))
            here = {a: v for a, v in e.items() if a != key and (isinstance(v, bool) or O.scalar(v))}
            common = here if common is None else {a: v for a, v in common.items() if a in here and O.equal(here[a], v)}
    return sorted((common or {}).items())


def _turned(ctx: _Ctx, rule: FieldRule, on: list[int]) -> int:
    """Items whose agent picked a record the rule rules out."""
    return len(
        {
            ctx.rows[i].item
            for i in on
            if ctx.rows[i].agent
            and O.picked(rule.then, ctx.ext[i], cast(dict[str, Any], ctx.rows[i].agent).get(ctx.fld)) is False
        }
    )
