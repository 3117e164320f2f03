"""The rows inference reads (one per gold write: the gold, the agent's first attempt, what its reads showed
before it), the bounds a rule must meet, and judging a rule on a row."""

from __future__ import annotations

import math
from collections.abc import Mapping
import dataclasses
from dataclasses import dataclass
from datetime import date
from fractions import Fraction
from typing import Any

from components.evolution.findings import write_target
from components.runtime.confirm import Targets
from components.runtime.trace import TraceStep
from components.runtime.types import CONFIRM_TOOL, FINISH_TOOL
from components.worlds import outcome_rules as O
from components.worlds.base import Gold
from components.worlds.numbers import is_num, q
from components.worlds.outcome_rules import Cond, FieldRule

MIN_FIT, MIN_CHECK = 4, 2  # distinct items: fewer cannot tell a rule from a coincidence
MIN_SIDE = 2  # items a rule must give their value in on the fit half
MIN_PART = 1  # items that show each part of a rule (a side of a condition, a factor) in each half: the fit half
# shows it, the check half confirms it
EXPLAIN = 0.9  # the share of rows a rule must give the gold value in (fit and check alike): a read the agent made
# for another write of the same episode can stand where this write's would
K_REGIONS = 3  # alternative base values tried (the most, second and third most common ratios of the rows)
MAX_BASES = 4  # numbers tried as a product's base: those whose most common ratio to the gold holds on the most items
MAX_PAIRS = 40  # pairs of simple terms a condition may choose between: those that together give the most rows
BEAM = 3  # sets a search keeps at each size (a sum's numbers, a product's conditions), and indicators tried from each


@dataclass
class Row:
    item: str
    episode: str
    feats: dict[str, Any]
    gold: dict[str, Any]
    agent: dict[str, Any] | None  # the agent's first attempt at this target (None: never attempted)


@dataclass
class Inference:
    field: str
    rule: FieldRule | None
    why: str  # "ok", or why no rule was written
    n_fit: int = 0
    n_check: int = 0
    wrong: int = 0  # rows the agent got this field wrong in
    # a few diffs (agent value, gold value) for the projection (`dataclasses.field`: the class's own `field` would
    # shadow the function for the checker)
    examples: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    source: str = ""  # the write this field's rule was carried over from (`carried`), where no row could show it


def features(
    steps: list[TraceStep],
    before: int,
    write_args: Mapping[str, Any],
    target: Mapping[str, str],
    write_tools: frozenset[str],
    today: date | None = None,
) -> dict[str, Any]:
    """What the episode's successful reads showed before step `before` (`outcome_rules.read_features`)."""
    reads = []
    for s in steps:
        if s.step >= before:
            break
        a, obs = s.action, s.observation
        tool = a.get("tool")
        if (
            not tool
            or tool in write_tools
            or tool in (CONFIRM_TOOL, FINISH_TOOL)
            or a.get("kind") == "finish"
            or s.blocked is not None
            or not obs.get("ok")
        ):
            continue
        reads.append((tool, a.get("args") or {}, obs.get("content")))
    return O.read_features(reads, write_args, target, today)


def rows_for(
    tool: str,
    episodes: Mapping[str, list[TraceStep]],
    gold: Mapping[str, Gold],
    write_tools: frozenset[str],
    targets: Targets | None = None,
    today: date | None = None,
) -> list[Row]:
    rows = []
    for eid in sorted(episodes):
        steps = episodes[eid]
        item = eid.split("#", 1)[0]
        g = gold.get(item)
        if g is None or not steps:
            continue
        for a in g.actions:
            if a.tool != tool:
                continue
            ident = write_target(tool, a.args, targets)
            first = next(
                (
                    s
                    for s in steps
                    if s.action.get("tool") == tool
                    and s.blocked is None
                    and write_target(tool, s.action.get("args", {}), targets) == ident
                ),
                None,
            )
            at = first.step if first is not None else steps[-1].step + 1
            feats = features(steps, at, a.args, {k: str(v) for k, v in ident}, write_tools, today)
            rows.append(Row(item, eid, feats, dict(a.args), dict(first.action.get("args") or {}) if first else None))
    return rows


def fit_half(items: list[str]) -> set[str]:
    """The fit half of the items: every other one in sorted order (stable; balanced across families, whose items
    sort together); the others are the check half."""
    return set(sorted(set(items))[::2])


# -- judging a rule on a row ----------------------------------------------------------------------------------------


def ext(row: Row, fld: str, exclude: frozenset[str] = frozenset()) -> dict[str, Any]:
    """A row's features and the write's other numeric arguments (`@<arg>`, the gold's: what the check rows and a
    card's reader both have when they come to this field), but those in `exclude` (fields whose own rules would
    read this one: a rule may not read a field that is computed from it)."""
    own = O.own({k: v for k, v in row.gold.items() if k not in exclude}, fld)
    return {**row.feats, **own}


def holds(rule: FieldRule, row: Row, gaps: Mapping[str, tuple[Fraction, Fraction]] | None = None) -> bool | None:
    """Whether the rule gives the row's gold value exactly (None: the row lacks a feature the rule reads, or a
    threshold's number lies inside `gaps[path]`, the open gap between the fit rows on either side of it, where the
    fit saw nothing)."""
    feats = ext(row, rule.field)
    for c in _conds(rule):
        if gaps and c.op != "is" and c.path in gaps and is_num(feats.get(c.path)):
            lo, hi = gaps[c.path]
            if lo < q(feats[c.path]) < hi:
                return None
    given = row.agent.get(rule.field) if row.agent else None
    return O.holds(rule, feats, row.gold.get(rule.field), given)


def _conds(rule: FieldRule) -> list[Cond]:
    return ([rule.cond] if rule.cond is not None else []) + [c for c, _k in rule.factors]


def _items(rows: list[Row]) -> int:
    return len({r.item for r in rows})


def _explains(verdicts: list[bool]) -> bool:
    """A rule explains the rows when it gives the gold value in all but a tenth of them (rounded: one row in five
    to fourteen): a read the agent made for another write of the same episode can stand where this write's would."""
    misses = verdicts.count(False)
    return bool(verdicts) and misses <= math.floor((1 - EXPLAIN) * len(verdicts) + 0.5)
