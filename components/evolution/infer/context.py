"""The fitting context (the fit rows as arrays, the features a condition may read), a rule's description length,
and the stumps a condition is searched with."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np

from components.evolution.infer.rows import MIN_FIT, MIN_SIDE, Row, _conds, _explains, _items, ext
from components.worlds import outcome_rules as O
from components.worlds.numbers import bits, is_num, q, quantum_of
from components.worlds.outcome_rules import Cond, FieldRule, Term, category


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
        self.ext = [
            {k: (q(v) if isinstance(v, float) else v) for k, v in ext(r, self.fld, self.exclude).items()}
            for r in self.rows
        ]
        self.w = _item_weights(self.rows)
        self.ys = [r.gold.get(self.fld) for r in self.rows]
        self.numeric = bool(self.ys) and all(is_num(y) for y in self.ys)
        self.quantum = quantum_of(self.ys) if self.numeric else Fraction(1, 100)
        whole = {p for e in self.ext for p, v in e.items() if isinstance(v, O.Records)}
        self.paths = sorted({p for e in self.ext for p in e} - whole)
        self.lists = sorted(p for p in whole if self.readable(p))
        self._sort_paths()

    def _sort_paths(self) -> None:
        """Each path's count of distinct values, and which readable paths are numbers or categories (what a
        condition may read)."""
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
        memo: dict[FieldRule, list[bool | None]] = self.__dict__.setdefault("_verdicts", {})
        try:
            key = rule if hash(rule) is not None else None
        except TypeError:  # a constant that is a list (the gold's list argument): not memoized
            key = None
        if key is None or key not in memo:
            got = [
                O.holds(rule, e, y, r.agent.get(self.fld) if r.agent else None)
                for r, e, y in zip(self.rows, self.ext, self.ys)
            ]
            if key is None:
                return got
            memo[key] = got
        return memo[key]

    @property
    def stumps(self) -> "_Stumps":
        if "_stumps" not in self.__dict__:
            self.__dict__["_stumps"] = _Stumps(self)
        stumps: _Stumps = self.__dict__["_stumps"]
        return stumps

    def readable(self, p: str) -> bool:
        return _items([r for r, e in zip(self.rows, self.ext) if p in e]) >= max(MIN_FIT, (3 * _items(self.rows)) // 4)

    @property
    def path_bits(self) -> float:
        return math.log2(1 + len(self.paths))


def _item_weights(rows: list[Row]) -> list[float]:
    """Each row's weight: an item's rows (its seeds) weigh one item together."""
    per_item: dict[str, int] = {}
    for r in rows:
        per_item[r.item] = per_item.get(r.item, 0) + 1
    return [1 / per_item[r.item] for r in rows]


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
            seen = [e.get(p) for e in ctx.ext]
            for v in sorted({x for x in seen if x is not None}):
                self.category.append((p, v, np.array([x == v for x in seen])))
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
