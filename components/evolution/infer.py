"""Inferring a write's rule from outcomes: which value the gold gives one field of a write, as the smallest rule over
what the agent's reads showed before that write.

Rows: every train episode with gold (`components.worlds.base.train_gold`), one per gold write on the tool: the gold
arguments, the agent's first attempt at that target (if any), and the features its successful reads showed before it
(`features`: scalars by path, list sums, a list's elements selected by the write's list argument or keyed by a
category; the form is `components.worlds.outcome_rules`). A field is inferred when some episode got it wrong.

Forms, smallest first (the first that fits the fit half and holds on the check half is the rule: a form refused on
the check items gives way to the next form that fits, which its own check then judges):
    const    one value everywhere
    equal    the value of one feature
    share    a fixed factor times one feature (to the cent)
    upper    a string field whose gold is the agent's own value in upper case (a transformation of what it was given)
    one_of   a string field that takes two or three values (the allowed set)
    cap      a share of one feature, at most a constant (the rows above the ceiling all hold that constant)
    cond     a condition on one feature (a threshold on a number, or a category), each side const/equal/share
    product  a constant or a feature times two factors, each when its condition holds
    table    a number chosen by a category of the task's data (one value per category seen), alone or times one
             factor when a condition holds (a fee table by fare, doubled inside a window)
    sum      a sum of terms: two factors times two numbers (what reads showed, or the write's own other arguments,
             `@<arg>`: a count the customer gave, another field of the write), plus a constant (a fee per bag
             beyond an allowance: 35 * bags - 35 * free bags); the factors are least squares on the fit rows,
             rounded to the cent, and must give the gold value in most rows
The rule is fitted on the items of one half and checked on the other half's items, which it never saw (every other
item in sorted order); when it fails, the halves swap (two-fold: a rule whose evidence sits in one half can still be
found there, and must then hold on the other). A rule that fits its half but not the check items it can be evaluated
on is refused. A threshold is then placed on every row: the roundest value in the gap the rows leave (a whole number
of the feature's unit: days for weeks or months, hours for days, minutes for hours; else 100, 50, 10, ...; ties go to
the gap's middle), so a boundary no train row sits on is not guessed from the nearest row. It never sees a rule's
statement: only gold values, the agent's values, what reads returned, and the policy's date (for days from today).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import date
from typing import Any

import numpy as np

from components.evolution.diagnose import write_target
from components.evolution.outcomes import same_value
from components.runtime.confirm import Targets
from components.runtime.trace import TraceStep
from components.runtime.types import CONFIRM_TOOL, FINISH_TOOL
from components.worlds.base import Gold
from components.worlds.outcome_rules import Cond, FieldRule, Term

MIN_FIT, MIN_CHECK = 4, 2  # distinct items: fewer cannot tell a rule from a coincidence
MIN_SIDE = 2  # items on each side of a condition
MIN_CELL = 1  # items in each of three cells of a two-factor rule (its check items judge a factor seen once)
MAX_ONE_OF = 3
EXPLAIN = 0.9  # the share of rows a feature-reading rule must give the gold value in (fit and check alike)


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
    examples: list[dict] = field(default_factory=list)  # a few diffs (agent value, gold value) for the projection


def _scalar(v: Any) -> bool:
    return isinstance(v, (str, int, float)) and not isinstance(v, bool)


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _category(v: Any) -> bool:
    """A value that names a kind rather than a thing (no digit: not an id, not an amount)."""
    return isinstance(v, str) and 0 < len(v) <= 40 and not any(ch.isdigit() for ch in v)


TODAY = re.compile(r"\b(?:today is|the current (?:date|time) is)\s+(\d{4}-\d{2}-\d{2})", re.I)
ISO_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
FROM_TODAY = "@days_from_today"


def policy_today(policy: str) -> date | None:
    """The date a written policy says today is (as real benchmarks' policies state the current time), else None."""
    m = TODAY.search(policy or "")
    return date.fromisoformat(m.group(1)) if m else None


def flatten(obj: Any, prefix: str, write_args: Mapping[str, Any], out: dict[str, Any],
            today: date | None = None) -> None:
    """Into `out`, the features a read's content shows under `prefix` (the feature grammar of
    components/worlds/outcome_rules.py): every scalar by its path (a date also as days from `today`), and for a list
    of records what `_records` reads off it."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            flatten(v, f"{prefix}.{k}", write_args, out, today)
    elif isinstance(obj, list) and obj and all(isinstance(e, dict) for e in obj):
        _records(obj, prefix, write_args, out)
    elif _scalar(obj):
        out[prefix] = obj
        if today is not None and isinstance(obj, str) and ISO_DATE.fullmatch(obj):
            out[prefix + FROM_TODAY] = (date.fromisoformat(obj) - today).days


def _records(obj: list[dict], prefix: str, write_args: Mapping[str, Any], out: dict[str, Any]) -> None:
    """A list of records: each number's sum over the list (`[].k`), its sum over the elements a write's list argument
    picks (`[k in arg].k2`), the fields of the element a scalar argument names (`[k=@arg].k2`), and of the one
    element of a kind (`[k=v].k2`)."""
    keys = sorted(set().union(*obj))
    for k in keys:
        vals = [e.get(k) for e in obj]
        if all(_num(v) for v in vals):
            out[f"{prefix}[].{k}"] = round(float(sum(vals)), 2)
    for arg, av in sorted(write_args.items()):  # the elements a write's list argument picks
        if isinstance(av, list) and av:
            _picked(obj, keys, prefix, arg, {str(x) for x in av}, out)
    for arg, av in sorted(write_args.items()):  # the element a write's scalar argument names
        if not _scalar(av):
            continue
        for k in keys:
            hit = [e for e in obj if str(e.get(k)) == str(av)]
            if len(hit) == 1:
                _fields(hit[0], k, f"{prefix}[{k}=@{arg}]", out)
    for k in keys:  # the one element of a kind
        vals = [e.get(k) for e in obj]
        for v in sorted({x for x in vals if _category(x)}):
            if vals.count(v) == 1:
                _fields(obj[vals.index(v)], k, f"{prefix}[{k}={v}]", out)


def _picked(obj: list[dict], keys: list[str], prefix: str, arg: str, chosen_ids: set[str], out: dict[str, Any]) -> None:
    """Each number's sum over the elements whose key `k` is among a write's list argument `arg`."""
    for k in keys:
        chosen = [e for e in obj if str(e.get(k)) in chosen_ids]
        if not chosen:
            continue
        for k2 in keys:
            if all(_num(e.get(k2)) for e in chosen):
                out[f"{prefix}[{k} in {arg}].{k2}"] = round(float(sum(e[k2] for e in chosen)), 2)


def _fields(element: dict, key: str, prefix: str, out: dict[str, Any]) -> None:
    """One element's scalar fields but the one that picked it (`key`), under `prefix`."""
    for k2, v2 in element.items():
        if k2 != key and _scalar(v2):
            out[f"{prefix}.{k2}"] = v2


def features(steps: list[TraceStep], before: int, write_args: Mapping[str, Any], target: Mapping[str, str],
             write_tools: frozenset[str], today: date | None = None) -> dict[str, Any]:
    """What the episode's successful reads showed before step `before`: a read about the write's target (an arg
    of the target's name and value) wins over a general read; a read about another target (same arg, another value)
    is left out."""
    general: dict[str, Any] = {}
    mine: dict[str, Any] = {}
    for s in steps:
        if s.step >= before:
            break
        a, obs = s.action, s.observation
        tool = a.get("tool")
        if not tool or tool in write_tools or tool in (CONFIRM_TOOL, FINISH_TOOL) or a.get("kind") == "finish" \
                or s.blocked is not None or not obs.get("ok") or not isinstance(obs.get("content"), dict):
            continue
        args = a.get("args") or {}
        shared = [k for k in target if k in args]
        if any(str(args[k]) != target[k] for k in shared):
            continue
        f: dict[str, Any] = {}
        flatten(obs["content"], tool, write_args, f, today)
        (mine if shared else general).update(f)
    return {**general, **mine}


def rows_for(tool: str, episodes: Mapping[str, list[TraceStep]], gold: Mapping[str, Gold],
             write_tools: frozenset[str], targets: Targets | None = None, today: date | None = None) -> list[Row]:
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
            first = next((s for s in steps if s.action.get("tool") == tool and s.blocked is None
                          and write_target(tool, s.action.get("args", {}), targets) == ident), None)
            at = first.step if first is not None else steps[-1].step + 1
            feats = features(steps, at, a.args, {k: str(v) for k, v in ident}, write_tools, today)
            rows.append(Row(item, eid, feats, dict(a.args), dict(first.action.get("args") or {}) if first else None))
    return rows


def fit_half(items: list[str]) -> set[str]:
    """The fit half of the items: every other one in sorted order (stable; balanced across families, whose items
    sort together); the others are the check half."""
    return set(sorted(set(items))[::2])


# -- the forms -----------------------------------------------------------------------------------------------------

def _cents(x: float) -> float:
    return round(x + 1e-9, 2)


def value_of(t: Term, feats: Mapping[str, Any]) -> tuple[bool, Any]:
    """(evaluable, value) of a term on one row's features."""
    if t.kind == "const":
        return True, t.value
    if t.path not in feats:
        return False, None
    x = feats[t.path]
    if t.kind == "equal":
        return True, x
    if t.kind == "share":
        return (True, _cents(t.value * x)) if _num(x) else (False, None)
    if t.kind == "table":
        hit = [n for c, n in t.value if c == x]
        return (True, hit[0]) if hit else (False, None)
    return False, None


def own(row: Row, fld: str) -> dict[str, Any]:
    """The write's other numeric arguments, as a sum's terms name them (`@<arg>`): the gold's, which the check rows
    and a card's reader both have when they come to this field (a count the customer gave, a field set before it)."""
    return {f"@{k}": v for k, v in row.gold.items() if k != fld and _num(v)}


def sum_value(t: Term, feats: Mapping[str, Any]) -> tuple[bool, Any]:
    const, parts = t.value
    if not all(_num(feats.get(p)) for _k, p in parts):
        return False, None
    return True, _cents(const + sum(k * feats[p] for k, p in parts))


def holds(rule: FieldRule, row: Row, gap: tuple[float, float] | None = None,
          factor_gaps: Mapping[int, tuple[float, float]] | None = None) -> bool | None:
    """Whether the rule gives the row's gold value (None: the row lacks a feature the rule reads, or its condition's
    number lies in `gap`, the open interval between the fit rows on either side, where the fit saw nothing)."""
    y = row.gold.get(rule.field)
    t = rule.then
    if rule.cond is not None:
        c = rule.cond
        if c.path not in row.feats:
            return None
        g = row.feats[c.path]
        if gap is not None and _num(g) and gap[0] < g < gap[1]:
            return None
        on = (_num(g) and g > c.value) if c.op == ">" else g == c.value
        t = rule.then if on else rule.other
    if t.kind == "one_of":
        return y in t.value
    if t.kind == "sum":
        ok, v = sum_value(t, {**row.feats, **own(row, rule.field)})
        return same_value(v, y) if ok else None
    if t.kind == "upper":
        given = row.agent.get(rule.field) if row.agent else None
        return given.upper() == y if isinstance(given, str) else None
    ok, v = value_of(t, row.feats)
    if not ok:
        return None
    for n, (c, k) in enumerate(rule.factors):
        if c.path not in row.feats or not _num(v):
            return None
        fg = (factor_gaps or {}).get(n)
        if fg is not None and _num(row.feats[c.path]) and fg[0] < row.feats[c.path] < fg[1]:
            return None  # between the fit rows on either side of this factor's threshold: not judged
        if _true(c, row.feats[c.path]):
            v = _cents(v * k)
    if rule.cap is not None:
        if not _num(v):
            return None
        v = min(v, rule.cap)
    return same_value(v, y)


def _true(c: Cond, g: Any) -> bool:
    return (_num(g) and g > c.value) if c.op == ">" else g == c.value


def _explains(verdicts: list[bool]) -> bool:
    """A term read off a feature explains the rows when it gives the gold value in all but a few: a read an agent
    made for another write of the same episode (a second address validated, or not) can stand where this write's
    would; a constant reads no feature, so it must give every row's value (see `_simple`)."""
    return bool(verdicts) and sum(verdicts) >= EXPLAIN * len(verdicts)


def _items(rows: list[Row]) -> int:
    return len({r.item for r in rows})


def _simple(rows: list[Row], fld: str, paths: list[str]) -> Term | None:
    """const, else equal, else share: the first that fits every row it can be evaluated on, on enough items."""
    ys = [r.gold.get(fld) for r in rows]
    if ys and all(same_value(y, ys[0]) for y in ys):
        return Term("const", ys[0])
    best: tuple | None = None
    for p in paths:
        on = [r for r in rows if p in r.feats]
        if _items(on) < max(MIN_SIDE, _items(rows) // 2) \
                or not _explains([same_value(r.feats[p], r.gold.get(fld)) for r in on]):
            continue
        key = (-len(on), p)
        best = min(best, (key, Term("equal", None, p))) if best else (key, Term("equal", None, p))
    if best:
        return best[1]
    if not all(_num(y) for y in ys):
        return None
    for p in paths:
        on = [r for r in rows if _num(r.feats.get(p)) and r.feats[p] != 0]
        if _items(on) < max(MIN_SIDE, _items(rows) // 2):
            continue
        k = round(float(np.median([r.gold[fld] / r.feats[p] for r in on])), 4)
        if k in (0.0, 1.0) or not _explains([same_value(_cents(k * r.feats[p]), r.gold[fld]) for r in on]):
            continue
        key = (-len(on), p)
        best = min(best, (key, Term("share", k, p))) if best else (key, Term("share", k, p))
    return best[1] if best else None


def _complexity(t: Term) -> int:
    return {"const": 0, "equal": 1, "share": 2, "one_of": 3, "upper": 1, "table": 3, "sum": 4}[t.kind]


def smallest(rows: list[Row], fld: str) -> FieldRule | None:
    """The smallest rule of the forms above that fits every fit row it can be evaluated on."""
    return next(fitting(rows, fld), None)


def fitting(rows: list[Row], fld: str) -> Iterator[FieldRule]:
    """The rule of each form above that fits the fit rows, smallest form first (each form's smallest), made only
    when asked for: the check takes the first that also holds on the check items (`_fold`)."""
    paths = sorted({p for r in rows for p in r.feats})
    t = _simple(rows, fld, paths)
    if t is not None:
        yield FieldRule(fld, t)
    for form in (_upper, _one_of, _capped, _conditional, _product, _table, _sum):
        rule = form(rows, fld, paths)
        if rule is not None:
            yield rule


def _upper(rows: list[Row], fld: str, paths: list[str]) -> FieldRule | None:
    """The agent's own value, transformed: what it wrote, in upper case (where that differs from what it wrote)."""
    cased = [r for r in rows if isinstance(r.agent.get(fld) if r.agent else None, str) and isinstance(r.gold.get(fld), str)]
    if cased and len(cased) == len(rows) and any(r.agent[fld] != r.gold[fld] for r in cased) \
            and all(r.agent[fld].upper() == r.gold[fld] for r in cased):
        return FieldRule(fld, Term("upper"))
    return None


def _one_of(rows: list[Row], fld: str, paths: list[str]) -> FieldRule | None:
    """The allowed values: a few texts, each seen at least twice on average."""
    ys = [r.gold.get(fld) for r in rows]
    values = sorted({y for y in ys if isinstance(y, str)})
    if all(isinstance(y, str) for y in ys) and 2 <= len(values) <= MAX_ONE_OF and len(ys) >= 2 * len(values):
        return FieldRule(fld, Term("one_of", tuple(values)))
    return None


def _conditional(rows: list[Row], fld: str, paths: list[str]) -> FieldRule | None:
    """One simple rule where a condition on a record's own field holds, another where it does not: the simplest pair
    (then by feature and threshold)."""
    found: list[tuple] = []
    for g in paths:
        if "[" in g:  # conditions on a record's own fields, not on sums or picks from its lists
            continue
        on = [r for r in rows if g in r.feats]
        if _items(on) < max(MIN_FIT, (3 * _items(rows)) // 4):  # readable on most rows (reads an agent skipped: not)
            continue
        vals = [r.feats[g] for r in on]
        if all(_num(v) for v in vals):
            # "more than lo": the largest value seen on the other side (refined on all rows)
            conds = [Cond(g, ">", lo) for lo in sorted(set(vals))[:-1]]
        elif all(_category(v) for v in vals):
            conds = [Cond(g, "is", v) for v in sorted(set(vals))]
        else:
            continue
        for c in conds:
            yes = [r for r in on if (r.feats[g] > c.value if c.op == ">" else r.feats[g] == c.value)]
            no = [r for r in on if r not in yes]
            if _items(yes) < MIN_SIDE or _items(no) < MIN_SIDE:
                continue
            a, b = _simple(yes, fld, paths), _simple(no, fld, paths)
            if a is None or b is None or a == b:
                continue
            found.append(((_complexity(a) + _complexity(b), g, c.value if c.op == ">" else 0, str(c.value)),
                          FieldRule(fld, a, c, b)))
    return min(found, key=lambda x: x[0])[1] if found else None


MAX_SUM_PATHS = 40  # numeric features tried in pairs (the readable ones, fewest first by name)


def _sum(rows: list[Row], fld: str, paths: list[str]) -> FieldRule | None:
    """`a * x + b * y + c` over two numbers readable on most rows (features or the write's own other arguments):
    least squares on the rows, the factors and the constant rounded to the cent; both factors non-zero (one alone is
    a share), and the rule must give the gold value in most rows (`EXPLAIN`). Among those that do, the one that
    explains most rows, then without a constant, then by name."""
    ys = [r.gold.get(fld) for r in rows]
    if not rows or not all(_num(y) for y in ys):
        return None
    ext = [{**r.feats, **own(r, fld)} for r in rows]
    cands = sorted({p for e in ext for p in e})
    numeric = [p for p in cands if "[" not in p or "[]" in p or " in " in p]
    numeric = [p for p in numeric if _items([r for r, e in zip(rows, ext) if _num(e.get(p))])
               >= max(MIN_FIT, (3 * _items(rows)) // 4)][:MAX_SUM_PATHS]
    y = np.array(ys, dtype=float)
    found = []
    for i, p in enumerate(numeric):
        for q in numeric[i + 1:]:
            ok = np.array([_num(e.get(p)) and _num(e.get(q)) for e in ext])
            if _items([r for r, m in zip(rows, ok) if m]) < max(MIN_FIT, (3 * _items(rows)) // 4):
                continue
            x = np.array([[float(e[p]), float(e[q]), 1.0] if m else [0.0, 0.0, 0.0] for e, m in zip(ext, ok)])
            if np.linalg.matrix_rank(x[ok][:, :2]) < 2:
                continue  # the two numbers move together: no way to tell their factors apart
            coef = np.linalg.lstsq(x[ok], y[ok], rcond=None)[0]
            a, b, c = (_tidy(round(float(v), 2)) for v in coef)
            if a == 0 or b == 0:
                continue
            t = Term("sum", (c, ((a, p), (b, q))))
            rule = FieldRule(fld, t)
            verdicts = [v for v in (holds(rule, r) for r in rows) if v is not None]
            if len(verdicts) >= (3 * len(rows)) // 4 and _explains(verdicts):
                found.append(((-sum(verdicts), c != 0, p, q), rule))
    return min(found, key=lambda x: x[0])[1] if found else None


def _capped(rows: list[Row], fld: str, paths: list[str]) -> FieldRule | None:
    """A share of one feature, at most a constant: the rows the share gives the gold value in hold at most the
    ceiling, and every other row (one item at least) holds the ceiling itself, below its share."""
    ys = [r.gold.get(fld) for r in rows]
    if not rows or not all(_num(y) for y in ys):
        return None
    found = []
    for p in paths:
        on = [r for r in rows if _num(r.feats.get(p)) and r.feats[p] != 0]
        if _items(on) < max(MIN_FIT, (3 * _items(rows)) // 4):
            continue
        ratios, counts = np.unique(np.round([r.gold[fld] / r.feats[p] for r in on], 4), return_counts=True)
        k = float(ratios[int(np.argmax(counts))])  # the most common ratio: the share where no ceiling bites
        if k in (0.0, 1.0):
            continue
        free = [r for r in on if same_value(_cents(k * r.feats[p]), r.gold[fld])]
        over = [r for r in on if r not in free]
        if not over or _items(free) < max(MIN_SIDE, _items(on) // 2):
            continue
        cap = over[0].gold[fld]
        if not all(same_value(r.gold[fld], cap) and _cents(k * r.feats[p]) > cap for r in over) \
                or any(_cents(k * r.feats[p]) > cap + AMOUNT_EPS for r in free):
            continue
        found.append(((-len(on), p), FieldRule(fld, Term("share", k, p), cap=cap)))
    return min(found, key=lambda x: x[0])[1] if found else None


AMOUNT_EPS = 0.005
MAX_TABLE = 6  # categories in a table (more is a lookup of ids, not a rule)


def _table(rows: list[Row], fld: str, paths: list[str]) -> FieldRule | None:
    """A number chosen by a category of the task's data (`table`), alone or times one factor when a condition on
    another feature holds: the table is read off the rows the condition leaves alone (one value per category, the
    median), the factor off the others; it must give the gold value in most rows, and name every category seen, each
    (but a zero) on both sides of the condition."""
    ys = [r.gold.get(fld) for r in rows]
    if not rows or not all(_num(y) for y in ys):
        return None
    cats = [g for g in paths if "[" not in g and _readable(rows, g) and all(_category(r.feats[g]) for r in rows
                                                                             if g in r.feats)
            and 2 <= len({r.feats[g] for r in rows if g in r.feats}) <= MAX_TABLE]
    conds: list[Cond | None] = [None, *_table_conditions(rows, paths)]
    fits = (_table_fit(rows, fld, g, c) for g in cats for c in conds if c is None or c.path != g)
    found = [f for f in fits if f is not None]
    return min(found, key=lambda x: x[0])[1] if found else None


def _table_conditions(rows: list[Row], paths: list[str]) -> list[Cond]:
    """The conditions a table's factor may take: a threshold between every two values a readable number shows, and
    every value a readable category shows."""
    conds: list[Cond] = []
    for g in paths:
        if "[" in g or not _readable(rows, g):
            continue
        vals = [r.feats[g] for r in rows if g in r.feats]
        if all(_num(v) for v in vals):
            conds += [Cond(g, ">", lo) for lo in sorted(set(vals))[:-1]]
        elif all(_category(v) for v in vals):
            conds += [Cond(g, "is", v) for v in sorted(set(vals))]
    return conds


def _table_fit(rows: list[Row], fld: str, g: str, c: Cond | None) -> tuple[tuple, FieldRule] | None:
    """The table by category `g` (times a factor where `c` holds) with its rank among the fits, if it fits: the
    fewest conditions, then the most rows right, the fewest entries and the fewest choices."""
    on = [r for r in rows if g in r.feats and (c is None or c.path in r.feats)]
    base = [r for r in on if c is None or not _true(c, r.feats[c.path])]
    hit = [r for r in on if r not in base]
    if c is not None and (_items(base) < MIN_SIDE or _items(hit) < MIN_SIDE):
        return None
    by: dict[Any, list[float]] = {}
    for r in base:
        by.setdefault(r.feats[g], []).append(float(r.gold[fld]))
    if {r.feats[g] for r in on} - set(by):  # a category only the factor's side shows: no base value
        return None
    if c is not None and {r.feats[g] for r in base if r.gold[fld]} - {r.feats[g] for r in hit}:
        return None  # a category (of a non-zero value) seen on one side only: the factor on it would be a guess
    entries = tuple(sorted((v, _tidy(float(np.median(xs)))) for v, xs in by.items()))
    if len({n for _v, n in entries}) < 2:
        return None  # one value for every category: not a table
    factors: tuple = ()
    if c is not None:
        ks = [r.gold[fld] / dict(entries)[r.feats[g]] for r in hit if dict(entries)[r.feats[g]]]
        if not ks:
            return None
        k = round(float(np.median(ks)), 4)
        if k in (0.0, 1.0):
            return None
        factors = ((c, k),)
    rule = FieldRule(fld, Term("table", entries, g), factors=factors)
    verdicts = [v for v in (holds(rule, r) for r in on) if v is not None]
    if len(verdicts) < (3 * len(rows)) // 4 or not _explains(verdicts):
        return None
    return (c is not None, -sum(verdicts), len(entries), _choices(rows, c.path) if c else 0, g, c.path if c else "",
            str(c.value) if c else ""), rule


def _readable(rows: list[Row], g: str) -> bool:
    return _items([r for r in rows if g in r.feats]) >= max(MIN_FIT, (3 * _items(rows)) // 4)


def _tidy(x: float) -> float | int:
    return int(x) if float(x).is_integer() else round(x, 2)


MAX_CONDS, MAX_CUTS = 200, 12  # candidate conditions for the two-factor form (pairs are checked with numpy)


def _product(rows: list[Row], fld: str, paths: list[str]) -> FieldRule | None:
    """A number or a feature times up to two factors, each when its condition holds: the four cells of the two
    conditions must each hold one ratio to the base, and the fourth be the product of the other two's factors."""
    ys = [r.gold.get(fld) for r in rows]
    if not rows or not all(_num(y) for y in ys):
        return None
    conds = _product_conditions(rows, paths)
    if len(conds) < 2:
        return None
    grid = _Grid(rows, fld, conds, np.array(ys, dtype=float))
    bases: list[str | None] = [None] + [p for p in paths if all(_num(r.feats.get(p)) and r.feats[p] for r in rows)]
    for base in bases:  # the smallest base that works: a constant before a feature
        b = np.ones(len(rows)) if base is None else np.array([float(r.feats[base]) for r in rows])
        ratio = grid.y / b
        _vals, counts = np.unique(np.round(ratio, 2), return_counts=True)
        top = np.sort(counts)[::-1][:4]
        if top.sum() < EXPLAIN * len(rows):  # four ratios at most (two factors): else this base cannot be it
            continue
        fits = (grid.fit(base, b, ratio, i, j) for i in range(len(conds)) for j in range(i + 1, len(conds))
                if conds[i].path != conds[j].path)
        found = [f for f in fits if f is not None]
        if found:
            return min(found, key=lambda x: x[0])[1]
    return None


def _product_conditions(rows: list[Row], paths: list[str]) -> list[Cond]:
    """The two-factor form's candidate conditions (at most `MAX_CONDS`): thresholds on a coarse grid of a number most
    rows read (placed on every row afterwards), and every value of such a category; no sum over a list."""
    conds: list[Cond] = []
    for g in paths:
        if "[]" in g or " in " in g:
            continue
        vals = [r.feats[g] for r in rows if g in r.feats]
        if len(vals) < (3 * len(rows)) // 4:
            continue
        if all(_num(v) for v in vals) and "[" not in g:
            uniq = sorted(set(vals))[:-1]
            step = max(1, len(uniq) // MAX_CUTS)
            conds += [Cond(g, ">", lo) for lo in uniq[::step]]
        elif all(_category(v) for v in vals):
            conds += [Cond(g, "is", v) for v in sorted(set(vals))]
    return conds[:MAX_CONDS]


@dataclass
class _Grid:
    """The two-factor form's candidate conditions over the rows: per condition, the rows where it holds (`truth`)
    and the rows that read its feature (`seen`), checked pairwise with numpy."""

    rows: list[Row]
    fld: str
    conds: list[Cond]
    y: np.ndarray  # the gold values
    truth: np.ndarray = field(init=False)
    seen: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.truth = np.array([[c.path in r.feats and _true(c, r.feats[c.path]) for r in self.rows] for c in self.conds])
        self.seen = np.array([[c.path in r.feats for r in self.rows] for c in self.conds])

    def fit(self, base: str | None, b: np.ndarray, ratio: np.ndarray, i: int, j: int) -> tuple[tuple, FieldRule] | None:
        """The rule of conditions i and j on `base` (values `b`, the gold's `ratio` to them) with its rank among the
        fits, if it fits: each of three cells one ratio, the fourth their product, most rows right."""
        rows, conds = self.rows, self.conds
        ok = self.seen[i] & self.seen[j]
        a, c = self.truth[i] & ok, self.truth[j] & ok
        cells = [ok & ~a & ~c, ok & a & ~c, ok & ~a & c, ok & a & c]
        if any(m.sum() < MIN_CELL for m in cells[:3]):
            return None
        meds = [float(np.median(ratio[m])) for m in cells[:3]]
        if meds[0] == 0:
            return None
        k1, k2 = round(meds[1] / meds[0], 4), round(meds[2] / meds[0], 4)
        if k1 in (0.0, 1.0) or k2 in (0.0, 1.0):
            return None
        pred = meds[0] * b * np.where(a, k1, 1.0) * np.where(c, k2, 1.0)
        if (np.abs(pred - self.y)[ok] <= 0.011).sum() < EXPLAIN * ok.sum() \
                or any(_cell_items(rows, m) < MIN_CELL for m in cells[:3]):
            return None
        r00 = round(meds[0], 4)
        head = Term("const", r00 if not float(r00).is_integer() else int(r00)) if base is None else \
            Term("equal", None, base) if r00 == 1.0 else Term("share", r00, base)
        rule = FieldRule(self.fld, head, factors=((conds[i], k1), (conds[j], k2)))
        verdicts = [v for v in (holds(rule, r) for r in rows) if v is not None]
        if len(verdicts) < (3 * len(rows)) // 4 or not _explains(verdicts):
            return None
        return (base is not None, base or "", -sum(verdicts), _choices(rows, conds[i].path)
                + _choices(rows, conds[j].path), conds[i].path, conds[j].path), rule


def _choices(rows: list[Row], path: str) -> int:
    """How many conditions a feature offers: among rules that explain as many rows, the one whose conditions had the
    fewest to choose from is the least likely to fit by chance. A category names one of its values (a member's tier:
    3; an airport: as many as seen); a threshold on a number is one cut in an order, placed afterwards on every row
    (2: the smallest category)."""
    vals = {r.feats[path] for r in rows if path in r.feats}
    return 2 if all(_num(v) for v in vals) else len(vals)


def _cell_items(rows: list[Row], mask) -> int:
    return len({r.item for r, m in zip(rows, mask) if m})


def infer_field(rows: list[Row], fld: str) -> Inference:
    """Fit on one half of the items, check on the other (then the other way round when that fails); the rule or why
    there is none (the first fold's reason when both fail)."""
    usable = [r for r in rows if fld in r.gold and r.agent is not None]  # what the agent saw when it wrote
    wrong = [r for r in usable if r.agent is not None and not same_value(r.agent.get(fld), r.gold[fld])]
    examples = [{"item": r.item, "agent": r.agent.get(fld), "gold": r.gold[fld]} for r in wrong[:4]]
    half = fit_half([r.item for r in usable])
    first: Inference | None = None
    for fold in (half, {r.item for r in usable} - half):
        fit = [r for r in usable if r.item in fold]
        check = [r for r in usable if r.item not in fold]
        out = Inference(fld, None, "", _items(fit), _items(check), len(wrong), examples)
        _fold(out, fit, check, usable)
        if out.rule is not None:
            return out
        first = first or out
        if out.why.startswith("too few items"):
            break  # the other fold has the same items the other way round: no more to fit on
    return first


def _fold(out: Inference, fit: list[Row], check: list[Row], usable: list[Row]) -> None:
    """One fold: the smallest rule on `fit` that holds on `check` (a form refused there gives way to the next form
    that fits, its own check deciding it), its thresholds placed on every row (sets out; refused: the first refused
    form's reason)."""
    fld = out.field
    if out.n_fit < MIN_FIT or out.n_check < MIN_CHECK:
        out.why = f"too few items ({out.n_fit} to fit, {out.n_check} to check; need {MIN_FIT} and {MIN_CHECK})"
        return
    refused = ""
    for rule in fitting(fit, fld):
        why = _checked(out, rule, fit, check, usable)
        if why == "ok":
            return
        refused = refused or why
    out.why = refused or "no rule of the known forms fits the fit items"


def _checked(out: Inference, rule: FieldRule, fit: list[Row], check: list[Row], usable: list[Row]) -> str:
    """Judge one fitted rule on the check rows: "ok" (out set) or why it is refused."""
    gap = _gap(rule, fit)
    fgaps = _factor_gaps(rule, fit)
    verdicts = [holds(rule, r, gap, fgaps) for r in check]
    judged = [v for v in verdicts if v is not None]
    checked_items = _items([r for r, v in zip(check, verdicts) if v is not None])
    if checked_items < MIN_CHECK:
        return f"the rule can be checked on {checked_items} check item(s) only"
    if not _explains(judged):
        return f"fits the fit items but not {judged.count(False)} of {len(judged)} check rows"
    if gap is not None:  # the form held on the check items: place the threshold on every row (narrower gap)
        whole = _gap(rule, usable)
        if whole is None or whole[0] >= whole[1]:
            return "the condition's two sides overlap once the check items are added"
        at = boundary(whole[0], whole[1], rule.cond.path, _values(usable, rule.cond.path))
        rule = FieldRule(rule.field, rule.then, Cond(rule.cond.path, ">", at), rule.other)
    if rule.factors:
        rule = _placed(rule, usable)
    out.rule, out.why = rule, "ok"
    return "ok"


def _values(rows: list[Row], path: str) -> list:
    return [r.feats[path] for r in rows if _num(r.feats.get(path))]


# round steps per unit, roundest first: a boundary is a whole number of the next larger unit where it can be
UNITS = (("minute", (60, 30, 15, 10, 5)), ("hour", (24, 12, 6, 10, 5)), ("day", (30, 7, 10, 5)))
DECIMAL = (1000, 500, 100, 50, 25, 10, 5, 2)


def boundary(lo: float, hi: float, path: str, values: list) -> float:
    """Where to place `x > t` given that every row it must not hold on has x <= lo and every row it must hold on has
    x >= hi (lo < hi): the roundest t consistent with both, "more than R" (t = R) or, for whole numbers, "R or more"
    (t = R - 1), R a multiple of the first step of the feature's unit (its name: minutes, hours, days) that has one
    in the gap; "more than" before "or more", then the nearest to the gap's middle. Without one: lo (the largest
    value seen on the side it must not hold on), as before."""
    steps = next((st for unit, st in UNITS if unit in path.rsplit(".", 1)[-1].lower()), ()) + DECIMAL
    whole = all(float(v).is_integer() for v in values) and float(lo).is_integer() and float(hi).is_integer()
    mid = (lo + hi) / 2
    for step in steps:
        cands = []
        for r in range(int(math.ceil(lo / step)) * step, int(hi) + 1, step):
            if lo <= r < hi:
                cands.append((0, abs(r - mid), r, r))  # more than r
            if whole and lo <= r - 1 < hi and r - 1 >= lo:
                cands.append((1, abs(r - mid), r, r - 1))  # r or more
        if cands:
            t = min(cands)[3]
            return int(t) if float(t).is_integer() else t
    return lo


def _factor_gaps(rule: FieldRule, rows: list[Row]) -> dict[int, tuple[float, float]]:
    """Per numeric factor: (the largest value among rows it must not apply to, the smallest among rows it must)."""
    out = {}
    for n, (c, _k) in enumerate(rule.factors):
        if c.op == ">":
            yes, no = _sides(rule, n, rows)
            if yes and no:
                out[n] = (max(no), min(yes))
    return out


def _sides(rule: FieldRule, n: int, rows: list[Row]) -> tuple[list, list]:
    """Values of factor n's feature on rows only the rule with it (yes) or only the rule without it (no) explains."""
    c, k = rule.factors[n]
    on = FieldRule(rule.field, rule.then, factors=tuple(f if i != n else (Cond(c.path, ">", -math.inf), k)
                                                        for i, f in enumerate(rule.factors)))
    off = FieldRule(rule.field, rule.then, factors=tuple(f for i, f in enumerate(rule.factors) if i != n))
    yes, no = [], []
    for r in rows:
        g = r.feats.get(c.path)
        if not _num(g):
            continue
        a, b = holds(on, r), holds(off, r)
        if a and not b:
            yes.append(g)
        elif b and not a:
            no.append(g)
    return yes, no


def _placed(rule: FieldRule, rows: list[Row]) -> FieldRule:
    """A factor's threshold placed on every row once the form has passed its check: the largest value among rows
    the factor must not apply to (the rule without it gives their gold value, with it not)."""
    factors = list(rule.factors)
    for n, (c, k) in enumerate(factors):
        if c.op != ">":
            continue
        yes, no = _sides(FieldRule(rule.field, rule.then, factors=tuple(factors), cap=rule.cap), n, rows)
        if yes and no and max(no) < min(yes):
            factors[n] = (Cond(c.path, ">", boundary(max(no), min(yes), c.path, _values(rows, c.path))), k)
    return FieldRule(rule.field, rule.then, factors=tuple(factors), cap=rule.cap)


def _gap(rule: FieldRule, rows: list[Row]) -> tuple[float, float] | None:
    """For a threshold rule: (the largest value of the condition's feature among rows only the else-side explains,
    the smallest among rows only the then-side explains). None for any other rule."""
    c = rule.cond
    if c is None or c.op != ">":
        return None
    yes, no = [], []
    for r in rows:
        g = r.feats.get(c.path)
        if not _num(g):
            continue
        a = holds(FieldRule(rule.field, rule.then), r)
        b = holds(FieldRule(rule.field, rule.other), r)
        if a and not b:
            yes.append(g)
        elif b and not a:
            no.append(g)
    if not yes or not no:
        return None
    return max(no), min(yes)


def infer_tool(tool: str, episodes: Mapping[str, list[TraceStep]], gold: Mapping[str, Gold],
               write_tools: frozenset[str], targets: Targets | None = None, today: date | None = None) -> list[Inference]:
    """One inference per field of the tool's gold that some episode got wrong (identifying args excluded)."""
    return infer_rows(tool, rows_for(tool, episodes, gold, write_tools, targets, today), targets)


def infer_rows(tool: str, rows: list[Row], targets: Targets | None = None) -> list[Inference]:
    ident = {k for r in rows for k, _v in write_target(tool, r.gold, targets)}
    fields = sorted({f for r in rows if r.agent is not None for f in r.gold
                     if f not in ident and not same_value(r.agent.get(f), r.gold[f])})
    return [infer_field(rows, f) for f in fields]


def fixable(rows: list[Row], infs: list[Inference]) -> int:
    """Attempts that the inferred rules would make right: every field the agent got wrong has a rule that gives its
    gold value there (what a card of these rules could fix, at most; a field without a rule keeps it wrong)."""
    rules = {i.field: i.rule for i in infs if i.rule is not None}
    n = 0
    for r in rows:
        if r.agent is None:
            continue
        wrong = [f for f in r.gold if f in {i.field for i in infs} and not same_value(r.agent.get(f), r.gold[f])]
        if wrong and all(f in rules and holds(rules[f], r) for f in wrong):
            n += 1
    return n
