"""Inferring a write's rule from outcomes: which value the gold gives one field of a write, as the shortest rule over
what the agent's reads showed before that write.

Rows: every train episode with gold (`components.worlds.base.train_gold`), one per gold write on the tool: the gold
arguments, the agent's first attempt at that target (if any), and the features its successful reads showed before it
(`features`; the grammar and the evaluation are `components.worlds.outcome_rules`). A field is inferred when some
episode got it wrong. Arithmetic is exact (`components.worlds.numbers`): a rule holds on a row only when it gives
the gold amount exactly, rounded as the world rounds (to the coarsest of a unit or a cent that every gold value of
the field is a multiple of, halves up).

Forms (each fitted on the fit rows; every one that fits is a candidate):
    const    one value everywhere
    equal    the value of one feature
    upper    a string field whose gold is the agent's own value in upper case
    one_of   a string field that takes a set of values, each seen more than once on average
    product  a base times any number of factors, each when its condition holds, optionally at most a constant: the
             base a constant, a feature, or a table by one or two categories; each factor and the base the simplest
             rational in the interval the rows leave it (rounding hides its last digits), the conditions thresholds
             in either direction or categories, found one at a time (the one that best splits the rows the factor
             fixes from the rows it would break)
    cond     a condition, each side a const, equal or share
    pick     a list of ids (the gold's list argument), each the key of a record a read listed whose attribute has
             one value on every gold pick and another on a record the agent picked instead (an available variant)
    each     any numeric form above for one unit, times a count a read showed (`len(<list>)`: free bags per passenger),
             fitted on the gold divided by the count
    sum      a sum of factors times numbers (what reads showed, or the write's own other arguments, `@<arg>`) and a
             constant, found one number at a time by least squares, each factor the simplest rational near it
Choice: among the candidates that fit, the one with the shortest description (`description_bits`: the bits of its
constants, features and conditions, plus the bits of the fit rows it does not explain) is checked on the other half's
items, which it never saw; a candidate refused there gives way to the next shortest. The halves are every other item in
sorted order; when no candidate holds, they swap (two folds). A threshold is placed from the data alone: in the
middle of the gap the rows leave between its two sides, and the card states that gap. Inference never sees a
rule's statement: only gold values, the agent's values, what reads returned, and the policy's date.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import date
from fractions import Fraction
from typing import Any

import numpy as np

from components.evolution.findings import write_target
from components.runtime.confirm import Targets
from components.runtime.trace import TraceStep
from components.runtime.types import CONFIRM_TOOL, FINISH_TOOL
from components.worlds import outcome_rules as O
from components.worlds.base import Gold
from components.worlds.numbers import bits, is_num, q, quantum_of, same, simplest
from components.worlds.outcome_rules import Cond, FieldRule, Term, category, flatten, policy_today  # noqa: F401

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
    examples: list[dict] = field(default_factory=list)  # a few diffs (agent value, gold value) for the projection
    source: str = ""  # the write this field's rule was carried over from (`carried`), where no row could show it


def features(steps: list[TraceStep], before: int, write_args: Mapping[str, Any], target: Mapping[str, str],
             write_tools: frozenset[str], today: date | None = None) -> dict[str, Any]:
    """What the episode's successful reads showed before step `before` (`outcome_rules.read_features`)."""
    reads = []
    for s in steps:
        if s.step >= before:
            break
        a, obs = s.action, s.observation
        tool = a.get("tool")
        if not tool or tool in write_tools or tool in (CONFIRM_TOOL, FINISH_TOOL) or a.get("kind") == "finish" \
                or s.blocked is not None or not obs.get("ok"):
            continue
        reads.append((tool, a.get("args") or {}, obs.get("content")))
    return O.read_features(reads, write_args, target, today)


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


# -- the fitting context: the rows as arrays, the features the conditions may read --------------------------------

@dataclass
class _Ctx:
    rows: list[Row]
    fld: str
    exclude: frozenset[str] = frozenset()
    ext: list[dict[str, Any]] = field(init=False)
    ys: list[Any] = field(init=False)
    numeric: bool = field(init=False)
    quantum: Fraction = field(init=False)
    paths: list[str] = field(init=False)
    nums: list[str] = field(init=False)  # numbers readable on most rows
    cats: list[str] = field(init=False)  # categories readable on most rows
    lists: list[str] = field(init=False)  # reads' lists of records readable on most rows (what a pick chooses from)
    distinct: dict[str, int] = field(init=False)

    def __post_init__(self) -> None:
        # numbers as exact rationals once (a float as the decimal it was written as), so judging a rule on a row
        # is rational arithmetic only
        self.ext = [{k: (q(v) if isinstance(v, float) else v) for k, v in ext(r, self.fld, self.exclude).items()}
                    for r in self.rows]
        per_item: dict[str, int] = {}
        for r in self.rows:
            per_item[r.item] = per_item.get(r.item, 0) + 1
        self.w = [1 / per_item[r.item] for r in self.rows]  # an item's rows (its seeds) weigh one item together
        self.ys = [r.gold.get(self.fld) for r in self.rows]
        self.numeric = bool(self.ys) and all(is_num(y) for y in self.ys)
        self.quantum = quantum_of(self.ys) if self.numeric else Fraction(1, 100)
        whole = {p for e in self.ext for p, v in e.items() if isinstance(v, O.Records)}
        self.paths = sorted({p for e in self.ext for p in e} - whole)
        self.lists = sorted(p for p in whole if self.readable(p))
        self.distinct = {}
        self.nums, self.cats = [], []
        for p in self.paths:
            vals = [e[p] for e in self.ext if p in e]
            self.distinct[p] = len({str(v) for v in vals})
            if not self.readable(p):
                continue
            if all(is_num(v) for v in vals):
                self.nums.append(p)
            elif all(category(v) for v in vals):
                self.cats.append(p)

    def verdicts(self, rule: FieldRule) -> list[bool | None]:
        """`holds` on every fit row (memoized: the search asks about the same rules often)."""
        memo = self.__dict__.setdefault("_verdicts", {})
        try:
            key = rule if hash(rule) is not None else None
        except TypeError:  # a constant that is a list (the gold's list argument): not memoized
            key = None
        if key is None or key not in memo:
            got = [O.holds(rule, e, y, r.agent.get(self.fld) if r.agent else None)
                   for r, e, y in zip(self.rows, self.ext, self.ys)]
            if key is None:
                return got
            memo[key] = got
        return memo[key]

    @property
    def stumps(self) -> "_Stumps":
        if "_stumps" not in self.__dict__:
            self.__dict__["_stumps"] = _Stumps(self)
        return self.__dict__["_stumps"]

    def readable(self, p: str) -> bool:
        return _items([r for r, e in zip(self.rows, self.ext) if p in e]) >= max(MIN_FIT, (3 * _items(self.rows)) // 4)

    @property
    def path_bits(self) -> float:
        return math.log2(1 + len(self.paths))


def _value_bits(ctx: _Ctx, v: Any) -> float:
    return bits(q(v)) if is_num(v) else math.log2(2 + len({str(y) for y in ctx.ys}))


def _term_bits(ctx: _Ctx, t: Term) -> float:
    if t.kind == "const":
        return _value_bits(ctx, t.value)
    if t.kind == "equal":
        return ctx.path_bits
    if t.kind == "share":
        return ctx.path_bits + bits(t.value)
    if t.kind == "upper":
        return 1.0
    if t.kind == "one_of":
        return sum(_value_bits(ctx, v) for v in t.value)
    if t.kind == "table":
        return ctx.path_bits * len(t.paths) + sum(bits(n) + 1 for _k, n in t.value)
    if t.kind == "pick":  # the list, its key, and each attribute with its value
        return ctx.path_bits * (2 + 2 * len(t.value[1]))
    const, parts = t.value
    return sum(ctx.path_bits + bits(k) + _indicator_bits(ctx, p) for k, p in parts) + (bits(const) if const else 0)


def _indicator_bits(ctx: _Ctx, p: str) -> float:
    """An indicator term names its category's value too (as a condition on a category does)."""
    m = O.INDICATOR.match(p)
    return math.log2(1 + ctx.distinct.get(m.group("path"), 1)) if m and p not in ctx.distinct else 0.0


def _cond_bits(ctx: _Ctx, c: Cond) -> float:
    """A condition: its feature, and which of its cuts (a threshold: direction and place among the values seen) or
    values (a category) it takes."""
    n = ctx.distinct.get(c.path, 1)
    return ctx.path_bits + (math.log2(1 + n) if c.op == "is" else 1 + math.log2(1 + n))


def description_bits(ctx: _Ctx, rule: FieldRule) -> float:
    """The rule's bits plus the bits of the fit rows it does not give (each: which row, and its value)."""
    model = sum(_term_bits(ctx, t) for t in rule.terms())
    model += sum(_cond_bits(ctx, c) for c in _conds(rule)) + sum(bits(k) for _c, k in rule.factors)
    model += bits(rule.cap) if rule.cap is not None else 0
    model += ctx.path_bits if rule.each else 0
    misses = sum(w for v, w in zip(ctx.verdicts(rule), ctx.w) if v is not True)
    per = math.log2(1 + _items(ctx.rows)) + (sum(_value_bits(ctx, y) for y in ctx.ys) / len(ctx.ys) if ctx.ys else 0)
    return model + misses * per


def _fits(ctx: _Ctx, rule: FieldRule) -> bool:
    """Giving the gold value in most of the fit rows it can be evaluated on, on `MIN_SIDE` items at least (a rule a
    read it needs was missing on most rows, such as a value a lookup returns, still fits where it was made; the
    rows it cannot judge count against its description); a constant reads nothing: every row."""
    verdicts = ctx.verdicts(rule)
    judged = [v for v in verdicts if v is not None]
    if rule.then.kind == "const" and rule.cond is None and not rule.factors:
        return bool(judged) and all(judged) and len(judged) == len(verdicts)
    right = {r.item for r, v in zip(ctx.rows, verdicts) if v}
    return len(right) >= MIN_SIDE and _explains(judged)


# -- searching conditions: stumps over the fit rows ---------------------------------------------------------------

class _Stumps:
    """Every feature's candidate conditions over the rows, searched with numpy: for a label per row (+1: the
    condition should hold, -1: it should not, 0: either), each feature's best threshold (either direction) or
    category value."""

    def __init__(self, ctx: _Ctx):
        n = len(ctx.rows)
        self.numeric = []
        for p in ctx.nums:
            on = np.array([p in e for e in ctx.ext])
            vals = np.array([float(q(e[p])) if p in e else np.nan for e in ctx.ext])
            order = np.argsort(np.where(on, vals, np.inf), kind="stable")[: int(on.sum())]
            sv = vals[order]
            cuts = np.nonzero(np.diff(sv) > 0)[0]  # cut after position i: sv[i] < sv[i+1]
            if len(cuts):
                self.numeric.append((p, order, sv, cuts))
        self.category = []
        for p in ctx.cats:
            vals = [e.get(p) for e in ctx.ext]
            for v in sorted({x for x in vals if x is not None}):
                self.category.append((p, v, np.array([x == v for x in vals])))
        self.n = n

    def best(self, labels: np.ndarray, top: int = 6) -> list[tuple[float, Cond]]:
        out: list[tuple[float, Cond]] = []
        for p, order, sv, cuts in self.numeric:
            lab = labels[order]
            pre = np.cumsum(lab)
            total = pre[-1]
            above = total - pre[cuts]  # rows after the cut: "> lo"
            below = pre[cuts]  # rows up to the cut: "<= lo"
            i, j = int(np.argmax(above)), int(np.argmax(below))
            out.append((float(above[i]), Cond(p, ">", q(sv[cuts[i]]), (q(sv[cuts[i]]), q(sv[cuts[i] + 1])))))
            out.append((float(below[j]), Cond(p, "<=", q(sv[cuts[j]]), (q(sv[cuts[j]]), q(sv[cuts[j] + 1])))))
        for p, v, mask in self.category:
            out.append((float(labels[mask].sum()), Cond(p, "is", v)))
        out = [o for o in out if o[0] > 0]
        out.sort(key=lambda o: (-o[0], o[1].path, o[1].op, str(o[1].value)))
        return out[:top]


# -- the forms ------------------------------------------------------------------------------------------------------

def _regions(lo: np.ndarray, hi: np.ndarray, k: int = K_REGIONS) -> list[np.ndarray]:
    """The supports of up to `k` most-covered points of the intervals [lo, hi] (each support: the rows whose
    interval holds that point; later ones among the rows left)."""
    left = np.ones(len(lo), dtype=bool)
    out = []
    for _ in range(k):
        idx = np.nonzero(left)[0]
        if not len(idx):
            break
        ev = sorted([(lo[i], 0, i) for i in idx] + [(hi[i], 1, i) for i in idx])
        best, cur, at = 0, 0, None
        for x, kind, _i in ev:
            if kind == 0:
                cur += 1
                if cur > best:
                    best, at = cur, x
            else:
                cur -= 1
        if at is None:
            break
        sup = left & (lo <= at) & (hi >= at)
        out.append(sup)
        left &= ~sup
    return out


def _exact_interval(ys: list[Any], vs: list[Fraction], half: Fraction) -> tuple[Fraction, Fraction] | None:
    """The factors k with round(v * k) == y on every (y, v): the intersection of [(y - h)/v, (y + h)/v)."""
    lo, hi = None, None
    for y, v in zip(ys, vs):
        if v == 0:
            if q(y) != 0:
                return None
            continue
        a, b = (q(y) - half) / v, (q(y) + half) / v
        a, b = (a, b) if v > 0 else (b, a)
        lo, hi = (a if lo is None else max(lo, a)), (b if hi is None else min(hi, b))
    if lo is None:
        return None
    hi -= Fraction(1, 10 ** 12)  # the half-open interval's upper end excluded
    return (lo, hi) if lo <= hi else None


def _factor_for(ys: list[Any], vs: list[Fraction], half: Fraction) -> Fraction | None:
    got = _exact_interval(ys, vs, half)
    return simplest(*got) if got else None


def _f(x: Any) -> float:
    return float(q(x))


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
        return self.__dict__["_by_path"]


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
        vals = [e.get(p) for e in ctx.ext]
        for v in sorted({x for x in vals if x is not None}):
            conds.append(Cond(p, "is", v))
            cols.append(np.array([x == v for x in vals], dtype=float))
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
    keys = [("table", (p,)) for p in ones]
    for i, a in enumerate(ones):
        for b in ones[i + 1:]:
            pairs = {(e.get(a), e.get(b)) for e in ctx.ext if a in e and b in e}
            if len(pairs) <= max(2, n // 3):
                keys.append(("table", (a, b)))
    return keys


def _base_design(ctx: _Ctx, base: Term) -> tuple[np.ndarray, np.ndarray, list[tuple]] | None:
    """For the log-linear search: each row's log(gold / base value) target, the base's columns (an intercept, or a
    category's one-hot), and the table's keys; rows where either is not positive are left out (NaN)."""
    y = np.array([_f(v) for v in ctx.ys])
    keys: list[tuple] = []
    if base.kind == "table":
        rk = [tuple(str(e[p]) for p in base.paths) if all(p in e for p in base.paths) else None for e in ctx.ext]
        keys = sorted({k for k in rk if k is not None})
        design = np.array([[float(k == key) for key in keys] for k in rk])
        b = np.ones(len(y))
        missing = np.array([k is None for k in rk])
    else:
        b = np.array([_f(e[base.path]) if base.path in e else np.nan for e in ctx.ext]) if base.kind == "equal" \
            else np.ones(len(y))
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
    got = _base_design(ctx, base)
    if got is None:
        return []
    t, design, _keys = got
    ok = ~np.isnan(t)
    t, design, m = t[ok], design[ok], ind.matrix[ok]
    y = np.array([_f(v) for v in ctx.ys])[ok]
    noise = np.log((y + _f(ctx.quantum)) / np.maximum(y - _f(ctx.quantum), 1e-12))  # what rounding can do to a log
    centered = m - m.mean(axis=0)
    norm = np.sqrt((centered ** 2).sum(axis=0))
    seen: set[tuple[int, ...]] = set()
    frontier: list[list[int]] = [[]]
    fitting_sets: list[list[int]] = []  # the sets whose log-linear fit explains the rows up to twice rounding's noise
    noise = 2 * noise
    for _step in range(min(len(ind.conds), max(1, len(t) // 4))):
        grown: list[tuple[float, list[int]]] = []
        for chosen in frontier:
            x = np.column_stack([design] + [m[:, j] for j in chosen]) if chosen else design
            coef, *_ = np.linalg.lstsq(x, t, rcond=None)
            r = t - x @ coef
            if np.mean(np.abs(r) <= noise) >= EXPLAIN:
                fitting_sets.append(chosen)
                continue  # explains the rows up to rounding: more conditions would fit noise
            if _capped_shape(x, t, noise) and chosen not in fitting_sets:
                fitting_sets.append(chosen)  # a cap may explain the rest
            with np.errstate(divide="ignore", invalid="ignore"):
                score = np.where(norm > 0, np.abs(centered.T @ r) / norm, 0.0)
            used = {ind.conds[j].path for j in chosen}
            picks = [int(j) for j in np.argsort(-score, kind="stable") if score[j] > 1e-9
                     and ind.conds[j].path not in used]
            taken: set[str] = set()
            for j in picks:
                if ind.conds[j].path in taken:
                    continue
                taken.add(ind.conds[j].path)
                refined = _refined(ind, chosen + [j], design, m, t)
                key = tuple(sorted(refined))
                if key not in seen:
                    seen.add(key)
                    grown.append((_sse(np.column_stack([design] + [m[:, k] for k in refined]), t), refined))
                if len(taken) >= BEAM:
                    break
        if not grown:
            break
        grown.sort(key=lambda g: (g[0], g[1]))
        frontier = [g[1] for g in grown[:BEAM]]
    for chosen in frontier:  # the last sets grown, if they were not judged yet
        x = np.column_stack([design] + [m[:, j] for j in chosen]) if chosen else design
        coef, *_ = np.linalg.lstsq(x, t, rcond=None)
        if np.mean(np.abs(t - x @ coef) <= noise) >= EXPLAIN and chosen not in fitting_sets:
            fitting_sets.append(chosen)
    return [[ind.conds[j] for j in chosen] for chosen in fitting_sets]  # only these can fit exactly


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
        minority = tuple(min(_sides_of(ctx, c), key=lambda s: sum(1 for e in ctx.ext if s.path in e
                                                                 and s.true(e[s.path]))) for c in conds)
        sides = [minority, tuple(_sides_of(ctx, c)[-1] if c in minority and len(_sides_of(ctx, c)) > 1
                                 and _sides_of(ctx, c)[0] == c else _sides_of(ctx, c)[0] for c in minority)]
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
    out = []
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


def _fit_head(ctx: _Ctx, base: Term, none: list[int], half: Fraction) -> tuple[Term, list[tuple]] | None:
    """The base's constant, or its table's entries, from the rows where no condition holds (`none`), and the
    table's categories seen only with a factor (their base comes from the factor: `_filled`)."""
    if base.kind != "table":
        vs = _base_values(ctx, base)
        idx = [i for i in none if vs[i] is not None and vs[i] != 0]
        k0 = _most_common_factor(ctx, idx, [vs[i] for i in idx], half)
        if k0 is None or k0 == 0:
            return None
        return (Term("const", k0) if base.kind == "const" else
                Term("equal", None, base.path) if k0 == 1 else Term("share", k0, base.path)), []
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


def _fit_factors(ctx: _Ctx, head: Term, order: list[Cond], truths: list,
                 half: Fraction) -> list[tuple[Cond, Fraction]] | None:
    """Each factor in `order` from the rows where it is the last of the conditions that hold, given the head and
    the factors before it; None where one is missing, 0 or 1."""
    factors: list[tuple[Cond, Fraction]] = []
    for j, c in enumerate(order):
        rule = FieldRule(ctx.fld, head, factors=tuple(factors), quantum=ctx.quantum)
        idx = [i for i, tr in enumerate(truths) if tr is not None and tr[j] and not any(tr[j + 1:])]
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


def _filled(ctx: _Ctx, head: Term, missing: list[tuple], order: list[Cond], truths: list, factors: list,
            half: Fraction) -> Term | None:
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
            out.append(q(e[base.path]) if is_num(e.get(base.path)) else None)
    return out


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
        elif ctx.numeric and p in ctx.nums:
            vs = [q(ctx.ext[i][p]) for i in on if is_num(ctx.ext[i][p]) and q(ctx.ext[i][p]) != 0]
            ys = [ctx.ys[i] for i in on if is_num(ctx.ext[i][p]) and q(ctx.ext[i][p]) != 0]
            if len(vs) >= MIN_SIDE:
                k = _factor_for(ys, vs, ctx.quantum / 2)
                if k is not None and k not in (0, 1):
                    terms.append(Term("share", k, p))
    return terms


def _conditionals(ctx: _Ctx) -> list[FieldRule]:
    """A condition and a simple term on each side: for every pair of terms that each explain some rows the other
    does not, the conditions that best split them."""
    cands = _side_terms(ctx)
    masks = {O.render_term(t): np.array([v is True for v in ctx.verdicts(FieldRule(ctx.fld, t, quantum=ctx.quantum))])
             for t in cands}
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
    pairs = sorted(((-union[i, j], names[i], names[j], i, j) for i in range(len(cands)) for j in range(len(cands))
                    if i != j and both[i, j] < min(m[i].sum(), m[j].sum())))[:MAX_PAIRS]
    return [(cands[i], cands[j]) for _u, _na, _nb, i, j in pairs]


def _sums(ctx: _Ctx) -> list[FieldRule]:
    """Factors times numbers plus a constant: sets of numbers grown one at a time (the `BEAM` that leave the least
    error by least squares at each size; a set whose rule already fits is a candidate and grows no more), each factor
    the simplest rational within a quantum's worth of its estimate. Searched twice: over the numbers the reads showed
    (and the write's own), then with each category's values as indicators too (a beam of its own, so that the
    indicators, which lower the error of many sets, never crowd out a sum of numbers alone)."""
    if not ctx.numeric:
        return []
    y = np.array([_f(v) for v in ctx.ys])
    pool = [p for p in ctx.paths if all(is_num(e.get(p)) for e in ctx.ext if p in e) and ctx.readable(p)
            and ("[" not in p or "[]" in p or " in " in p)]
    cols = {p: np.array([_f(e[p]) if is_num(e.get(p)) else np.nan for e in ctx.ext]) for p in pool}
    indicators = []
    for _kind, key in _table_keys(ctx):  # the categories a table may be by
        if len(key) > 1:
            continue
        for v in sorted({str(e[key[0]]) for e in ctx.ext if key[0] in e}):
            ind = O.indicator(key[0], v)
            indicators.append(ind)
            cols[ind] = np.array([float(str(e[key[0]]) == v) if key[0] in e else np.nan for e in ctx.ext])
    out = _sum_search(ctx, y, pool, cols)
    return out + (_sum_search(ctx, y, pool + indicators, cols) if indicators else [])


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


def _strings(ctx: _Ctx) -> list[FieldRule]:
    """upper, one_of: what a string field can be without a feature holding it."""
    out = []
    rows = ctx.rows
    cased = [r for r in rows if isinstance(r.agent.get(ctx.fld) if r.agent else None, str)
             and isinstance(r.gold.get(ctx.fld), str)]
    if cased and len(cased) == len(rows) and any(r.agent[ctx.fld] != r.gold[ctx.fld] for r in cased) \
            and all(r.agent[ctx.fld].upper() == r.gold[ctx.fld] for r in cased):
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
        here = {k for k in set().union(*recs)
                if all(sum(str(e.get(k)) == str(x) for e in recs) == 1 for x in ctx.ys[i])}
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
    return len({ctx.rows[i].item for i in on if ctx.rows[i].agent
                and O.picked(rule.then, ctx.ext[i], ctx.rows[i].agent.get(ctx.fld)) is False})


FORMS = (_consts_and_equals, _strings, _products, _conditionals, _sums)
LIST_FORMS = (_consts_and_equals, _picks)  # a list argument (of ids)


def fitting(rows: list[Row], fld: str, exclude: frozenset[str] = frozenset()) -> Iterator[FieldRule]:
    """Every rule of the forms above that fits the fit rows, shortest description first (ties by the card's text)."""
    if not rows:
        return iter(())
    ctx = _Ctx(rows, fld, exclude)
    found: dict[str, tuple[float, FieldRule]] = {}
    for form in (LIST_FORMS if any(isinstance(y, list) for y in ctx.ys) else FORMS):
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
        if _items([ctx.rows[i] for i in on]) < MIN_FIT \
                or any((u / ctx.quantum).denominator != 1 for u in units.values()):
            continue
        rows = [replace(ctx.rows[i], gold={**ctx.rows[i].gold, ctx.fld: _plain(units[i])}) for i in on]
        yield p, _Ctx(rows, ctx.fld, ctx.exclude)


def _plain(x: Fraction) -> int | float:
    return int(x) if x.denominator == 1 else float(x)


def smallest(rows: list[Row], fld: str) -> FieldRule | None:
    """The shortest rule of the forms above that fits the rows."""
    return next(fitting(rows, fld), None)


# -- two folds ----------------------------------------------------------------------------------------------------

def infer_field(rows: list[Row], fld: str, exclude: frozenset[str] = frozenset()) -> Inference:
    """Fit on one half of the items, check on the other (then the other way round when that fails); the rule or why
    there is none (the first fold's reason when both fail)."""
    usable = [r for r in rows if fld in r.gold and r.agent is not None]  # what the agent saw when it wrote
    wrong = [r for r in usable if r.agent is not None and not same(r.agent.get(fld), r.gold[fld])]
    examples = [{"item": r.item, "agent": r.agent.get(fld), "gold": r.gold[fld]} for r in wrong[:4]]
    if any((not isinstance(r.gold[fld], (str, int, float)) or isinstance(r.gold[fld], bool))
           and not _ids(r.gold[fld]) for r in usable):
        return Inference(fld, None, "a record value: no rule of the known forms states one", 0, 0,
                         len(wrong), examples)
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
    return first


def _fold(out: Inference, fit: list[Row], check: list[Row], usable: list[Row],
          exclude: frozenset[str] = frozenset()) -> None:
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
            items[f"`{rule.cond.path}` {rule.cond.op} {rule.cond.value}" if side
                  else f"the other side of `{rule.cond.path}`"].add(r.item)
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
        yes, no = _sides(rows, rule, lambda r: FieldRule(r.field, r.then, quantum=r.quantum),
                         lambda r: FieldRule(r.field, r.other, quantum=r.quantum), rule.cond.path)
        c = _place(rule.cond, yes, no)
        if c is None:
            return None
        rule = replace(rule, cond=c)
    factors = list(rule.factors)
    for n, (c, k) in enumerate(factors):
        if c.op == "is":
            continue
        always = (Cond(c.path, ">", Fraction(-(10 ** 18))), k)
        yes, no = _sides(rows, rule, lambda r, n=n: replace(r, factors=tuple(always if i == n else f for i, f in
                                                                             enumerate(r.factors))),
                         lambda r, n=n: replace(r, factors=tuple(f for i, f in enumerate(r.factors) if i != n)), c.path)
        placed = _place(c, yes, no)
        if placed is None:
            return None
        factors[n] = (placed, k)
    return replace(rule, factors=tuple(factors))


def _sides(rows: list[Row], rule: FieldRule, on, off, path: str) -> tuple[list[Fraction], list[Fraction]]:
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
    op = ">" if c.op in (">", ">=") else "<="
    return Cond(c.path, op, t, (lo, hi))


# -- per tool ------------------------------------------------------------------------------------------------------

def infer_tool(tool: str, episodes: Mapping[str, list[TraceStep]], gold: Mapping[str, Gold],
               write_tools: frozenset[str], targets: Targets | None = None, today: date | None = None) -> list[Inference]:
    """One inference per field of the tool's gold that some episode got wrong (identifying args excluded)."""
    return infer_rows(tool, rows_for(tool, episodes, gold, write_tools, targets, today), targets)


def infer_rows(tool: str, rows: list[Row], targets: Targets | None = None) -> list[Inference]:
    """Every field some attempt got wrong. A rule may read the write's own other arguments (`@<arg>`), but no two
    rules may read each other: each field is first inferred without the other wrong fields, then again (in name order)
    with every field whose rule does not read it, the second rule kept when there was none or it is the shorter
    description (a fee is 35 per bag beyond the free bags, not the free bags' own rule spelt out again)."""
    ident = {k for r in rows for k, _v in write_target(tool, r.gold, targets)}
    fields = sorted({f for r in rows if r.agent is not None for f in r.gold
                     if f not in ident and not same(r.agent.get(f), r.gold[f])})
    infs = {f: infer_field(rows, f, frozenset(fields) - {f}) for f in fields}
    for f in fields:
        # a rule may read another wrong field only where that field has a rule (an agent computes it first) that
        # does not read this one
        blocked = frozenset(g for g in fields if g != f and (infs[g].rule is None or _reads(infs, g, f)))
        if blocked == frozenset(fields) - {f}:
            continue  # nothing more to read
        again = infer_field(rows, f, blocked)
        if again.rule is not None and (infs[f].rule is None or _bits(rows, again.rule, blocked) <
                                       _bits(rows, infs[f].rule, blocked)):
            infs[f] = again
    return [infs[f] for f in fields]


def _bits(rows: list[Row], rule: FieldRule, exclude: frozenset[str]) -> float:
    """A rule's description length on every row that has the field (two rules of one field compared alike)."""
    return description_bits(_Ctx([r for r in rows if rule.field in r.gold and r.agent is not None], rule.field,
                                 exclude), rule)


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
        verdicts = [holds(by[f].rule, r) if f in by else False for f in wrong]
        if wrong and all(v or (v is None and by[f].source) for f, v in zip(wrong, verdicts)):
            n += 1
    return n


def carried(tool: str, rows: list[Row], infs: list[Inference],
            others: Mapping[str, list[Inference]]) -> list[Inference]:
    """A field left without a rule takes the rule another write (in name order) states for a field of the same name,
    when that rule is a value a read returns and no row of this write made that read: its rows cannot show the
    rule, only trying it can (the gate does). E.g. an address another write takes as a validation read returns it."""
    reads = {p.split(".", 1)[0] for r in rows for p in r.feats}
    out = []
    for inf in infs:
        src = None
        if inf.rule is None:
            src = next(((s, i.rule) for s in sorted(others) if s != tool for i in others[s]
                        if i.field == inf.field and i.rule is not None and _read_value(i.rule)
                        and i.rule.then.path.split(".", 1)[0] not in reads), None)
        out.append(replace(inf, rule=src[1], why="ok", source=src[0]) if src else inf)
    return out


def _read_value(rule: FieldRule) -> bool:
    """The rule is a value one read returns, nothing else."""
    return rule.cond is None and not rule.factors and rule.cap is None and rule.then.kind == "equal" \
        and not str(rule.then.path).startswith("@")
