"""Per tool: every field some attempt got wrong, the rules that may read each other's fields, and the rules carried
over from another write."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import date
from typing import cast

from components.evolution.findings import write_target
from components.evolution.infer.context import _Ctx, description_bits
from components.evolution.infer.folds import infer_field
from components.evolution.infer.rows import Inference, Row, holds, rows_for
from components.runtime.confirm import Targets
from components.runtime.trace import TraceStep
from components.worlds.base import Gold
from components.worlds.numbers import same
from components.worlds.outcome_rules import FieldRule


def infer_tool(
    tool: str,
    episodes: Mapping[str, list[TraceStep]],
    gold: Mapping[str, Gold],
    write_tools: frozenset[str],
    targets: Targets | None = None,
    today: date | None = None,
) -> list[Inference]:
    """One inference per field of the tool's gold that some episode got wrong (identifying args excluded)."""
    return infer_rows(tool, rows_for(tool, episodes, gold, write_tools, targets, today), targets)


def infer_rows(tool: str, rows: list[Row], targets: Targets | None = None) -> list[Inference]:
    """Every field some attempt got wrong. A rule may read the write's own other arguments (`@<arg>`), but no two
    rules may read each other: each field is first inferred without the other wrong fields, then again (in name order)
    with every field whose rule does not read it, the second rule kept when there was none or it is the shorter
    description (a fee is 35 per bag beyond the free bags, not the free bags' own rule spelt out again)."""
    ident = {k for r in rows for k, _v in write_target(tool, r.gold, targets)}
    fields = sorted(
        {
            f
            for r in rows
            if r.agent is not None
            for f in r.gold
            if f not in ident and not same(r.agent.get(f), r.gold[f])
        }
    )
    infs = {f: infer_field(rows, f, frozenset(fields) - {f}) for f in fields}
    for f in fields:
        # a rule may read another wrong field only where that field has a rule (an agent computes it first) that
        # does not read this one
        blocked = frozenset(g for g in fields if g != f and (infs[g].rule is None or _reads(infs, g, f)))
        if blocked == frozenset(fields) - {f}:
            continue  # nothing more to read
        again = infer_field(rows, f, blocked)
        if again.rule is not None and (
            infs[f].rule is None
            or _bits(rows, again.rule, blocked) < _bits(rows, cast(FieldRule, infs[f].rule), blocked)
        ):  # not None: `or`
            infs[f] = again
    return [infs[f] for f in fields]


def _bits(rows: list[Row], rule: FieldRule, exclude: frozenset[str]) -> float:
    """A rule's description length on every row that has the field (two rules of one field compared alike)."""
    return description_bits(
        _Ctx([r for r in rows if rule.field in r.gold and r.agent is not None], rule.field, exclude), rule
    )


def _reads(infs: Mapping[str, Inference], g: str, f: str, seen: frozenset[str] = frozenset()) -> bool:
    """Whether g's rule reads field f, directly or through the rules of the fields it reads."""
    rule = infs[g].rule if g in infs else None
    if rule is None or g in seen:
        return False
    own = {p[1:] for p in rule.features() if p.startswith("@")}
    return f in own or any(_reads(infs, h, f, seen | {g}) for h in own if h in infs)


def fixable(rows: list[Row], infs: list[Inference]) -> int:
    """Attempts that the inferred rules would make right: every field the agent got wrong has a rule that gives its
    gold value there (what a card of these rules could fix, at most; a field without a rule keeps it wrong). A rule
    carried over from another write counts where the rows cannot judge it (they lack the read it names)."""
    by = {i.field: i for i in infs if i.rule is not None}
    n = 0
    for r in rows:
        if r.agent is None:
            continue
        wrong = [f for f in r.gold if f in {i.field for i in infs} and not same(r.agent.get(f), r.gold[f])]
        verdicts = [holds(cast(FieldRule, by[f].rule), r) if f in by else False for f in wrong]  # by: with a rule
        if wrong and all(v or (v is None and by[f].source) for f, v in zip(wrong, verdicts)):
            n += 1
    return n


def carried(
    tool: str, rows: list[Row], infs: list[Inference], others: Mapping[str, list[Inference]]
) -> list[Inference]:
    """A field left without a rule takes the rule another write (in name order) states for a field of the same name,
    when that rule is a value a read returns and no row of this write made that read: its rows cannot show the
    rule, only trying it can (the gate does). E.g. an address another write takes as a validation read returns it."""
    reads = {p.split(".", 1)[0] for r in rows for p in r.feats}
    out = []
    for inf in infs:
        src = None
        if inf.rule is None:
            src = next(
                (
                    (s, i.rule)
                    for s in sorted(others)
                    if s != tool
                    for i in others[s]
                    if i.field == inf.field
                    and i.rule is not None
                    and _read_value(i.rule)
                    and cast(str, i.rule.then.path).split(".", 1)[0] not in reads
                ),
                None,
            )  # equal: one path
        out.append(replace(inf, rule=src[1], why="ok", source=src[0]) if src else inf)
    return out


def _read_value(rule: FieldRule) -> bool:
    """The rule is a value one read returns, nothing else."""
    return (
        rule.cond is None
        and not rule.factors
        and rule.cap is None
        and rule.then.kind == "equal"
        and not str(rule.then.path).startswith("@")
    )
