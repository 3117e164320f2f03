"""The card form of a rule inferred from outcomes, shared by the writer (the `rules` meta-agent), the readers (each
world's facts, so the simulated agent) and the judge (`holds`, which inference and diagnosis use): one grammar, one
evaluation, exact arithmetic (`components.worlds.numbers`).

One list item per field of a write, naming the write in backticks (the grammar's scope rule) and the field:

    - `<tool>`, from train outcomes: `<field>` = <term>[ when <condition>, else <term>][<factor>...][, at most <n>]
      [, for each of `<count>`][, rounded to <quantum>].

    term       'text' (a constant) | 12.5 or 31/12 (a constant) | `<feature>` (equal to it) | 19/20 * `<feature>` (a
               share of it) | one of 'a', 'b', ... (the allowed values) | the value as given, in upper case |
               'a' 10, 'b' 20 by `<feature>` (a table: the number its category names) | 'a'/'x' 10, ... by `<f1>`,
               `<f2>` (a table by several categories, keys joined by /) | 35 * `<feature>` + -35 * `<feature>` [+ 10]
               (a sum of terms: each a factor times a feature, and a constant; a feature may be an indicator,
               `<feature> is '<value>'`, 1 when the category holds and 0 when not: 2 * `tier is 'gold'` + 1 *
               `fare is 'business'`) | the `<key>` of elements of
               `<read list>` with `<attr>` = true (a list of ids, each the key of a record the read listed whose
               attributes have those values: a choice among records, such as a variant that is available)
    condition  `<feature>` > 24 | >= | < | <= (a threshold, in either direction) | `<feature>` is 'basic' (a
               category); a threshold may carry what the train rows showed: `<feature>` > 24 [seen 22 / 27] (no row
               between 22 and 27: the threshold is placed in that gap, at its middle)
    factor     `, times <k> when <condition>`: applied in turn, each rounded to the quantum, when its condition holds
               (any number of them: a fee after some days, a bonus on a kind, ...)
    each       `, for each of `<count>``: the value so far (one unit's) times a count a read showed (free bags per
               passenger: the allowance by tier for each of `len(get_reservation_details.passengers)`)
    cap        `, at most <n>`: the smaller of the value and n (a credit with a ceiling)
    quantum    what every amount is rounded to, halves up: a cent unless the item says otherwise
    feature    what a read showed before the write: `<read tool>.<key>[.<key>...]`; `<read tool>.<list>[].<key>` is the
               sum of that key over the list; `<read tool>.<list>[<key> in <arg>].<k2>` the sum of k2 over the
               elements whose key is among the write's list argument <arg>; `<read tool>.<list>[<key>=<value>].<k2>` the
               k2 of the one element whose key has that value; `<read tool>.<list>[<key>=@<arg>].<k2>` the k2 of the
               element whose key is the write's argument <arg>;
               `<read tool>.<key>@days_from_today` the days from the policy's date to the date a key holds;
               `@<arg>` the write's own argument <arg> (a count the customer gave, or another field of the write);
               `<read tool>.<list>` the list of records itself (what a `pick` term chooses from);
               `len(<read tool>.<list>)` how many records it holds.

Nothing here knows a world: a world's facts read a card into the values of their rules where a rule is a choice the
agent makes (`with_outcomes`); any other field rule the agent applies as written (`Formula`, `evaluate`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Callable, Literal

from components.worlds.grammar import paragraphs
from components.worlds.numbers import CENT, is_num, q, rnd, same
from components.worlds.numbers import out as as_number
from components.worlds.numbers import render as num

# what reads showed (the features) lives in its own module, re-exported: callers import it from here
from components.worlds.outcome_features import (
    FROM_TODAY,  # noqa: F401
    ISO_DATE,  # noqa: F401
    TODAY,  # noqa: F401
    Records,
    category,  # noqa: F401
    flatten,  # noqa: F401
    policy_today,  # noqa: F401
    read_features,  # noqa: F401
    scalar,
)

MARK = "from train outcomes"
UPPER = "the value as given, in upper case"
OPS = (">=", "<=", ">", "<")  # longest first: how they are parsed


@dataclass(frozen=True)
class Term:
    kind: Literal["const", "equal", "share", "one_of", "upper", "table", "sum", "pick"]
    value: Any = None  # const: the value (Fraction or str); share: the factor; one_of: the tuple of values;
    # table: ((key, n), ...), key a tuple of categories (one per path); sum: (constant, ((factor, feature), ...));
    # pick: (the records' key the ids are, ((attribute, value), ...) every picked record has)
    path: str | tuple[str, ...] = ""  # equal, share: the feature; table: the features its keys are read from;
    # pick: the list of records

    @property
    def paths(self) -> tuple[str, ...]:
        if self.kind == "table":
            return self.path if isinstance(self.path, tuple) else (self.path,)
        if self.kind == "sum":
            return tuple(p for _k, p in self.value[1])
        return (self.path,) if self.path else ()


@dataclass(frozen=True)
class Cond:
    path: str
    op: Literal[">", ">=", "<", "<=", "is"]
    value: Any
    seen: tuple[Fraction, Fraction] | None = field(default=None, compare=False)  # the gap the train rows left

    def true(self, x: Any) -> bool:
        if self.op == "is":
            return x == self.value
        if not is_num(x):
            return False
        if isinstance(x, float):  # a decimal as written, not its binary float (24.1 is 241/10)
            x = q(x)
        v = self.value if isinstance(self.value, (int, Fraction)) else q(self.value)
        return x > v if self.op == ">" else x >= v if self.op == ">=" else x < v if self.op == "<" else x <= v


@dataclass(frozen=True)
class FieldRule:
    field: str
    then: Term
    cond: Cond | None = None
    other: Term | None = None  # the value when `cond` does not hold
    factors: tuple[tuple[Cond, Fraction], ...] = ()  # applied to `then` in turn, each when its condition holds
    cap: Fraction | None = None  # the value is at most this (after the factors)
    quantum: Fraction = CENT  # every amount rounded to a multiple of this, halves up
    each: str = ""  # a count the value (one unit's, after the factors) is multiplied by, before the cap

    def terms(self) -> tuple[Term, ...]:
        return (self.then,) if self.other is None else (self.then, self.other)

    def features(self) -> set[str]:
        """Every feature the rule reads (its terms', conditions' and factors')."""
        out = {p for t in self.terms() for p in t.paths}
        if self.cond is not None:
            out.add(self.cond.path)
        if self.each:
            out.add(self.each)
        return out | {c.path for c, _k in self.factors}


@dataclass(frozen=True)
class Formula:
    """What an inferred card instructs for one rule of a world: the field rules of the write that rule governs, which
    an agent applies as written (`evaluate`) where the world has no value of its own to read them into."""

    tool: str
    rules: tuple[FieldRule, ...]


# -- writing --------------------------------------------------------------------------------------------------------


def _val(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return f"'{v}'" if isinstance(v, str) else num(v)


def _key(k: tuple) -> str:
    return "'" + "/".join(str(c) for c in k) + "'"


def render_term(t: Term) -> str:
    if t.kind == "const":
        return _val(t.value)
    if t.kind == "equal":
        return f"`{t.path}`"
    if t.kind == "share":
        return f"{num(t.value)} * `{t.path}`"
    if t.kind == "upper":
        return UPPER
    if t.kind == "table":
        return ", ".join(f"{_key(k)} {num(n)}" for k, n in t.value) + " by " + ", ".join(f"`{p}`" for p in t.paths)
    if t.kind == "sum":
        const, parts = t.value
        return " + ".join([f"{num(k)} * `{p}`" for k, p in parts] + ([num(const)] if const else []))
    if t.kind == "pick":
        key, where = t.value
        return f"the `{key}` of elements of `{t.path}` with " + " and ".join(f"`{a}` = {_val(v)}" for a, v in where)
    return "one of " + ", ".join(_val(v) for v in t.value)


def render_cond(c: Cond) -> str:
    text = f"`{c.path}` {c.op} {_val(c.value)}"
    if c.seen is not None:
        text += f" [seen {num(c.seen[0])} / {num(c.seen[1])}]"
    return text


def render(tool: str, rule: FieldRule) -> str:
    """One list item of a card (see the module doc)."""
    text = f"- `{tool}`, {MARK}: `{rule.field}` = {render_term(rule.then)}"
    if rule.cond is not None:
        text += f" when {render_cond(rule.cond)}, else {render_term(rule.other)}"
    for c, k in rule.factors:
        text += f", times {num(k)} when {render_cond(c)}"
    if rule.each:
        text += f", for each of `{rule.each}`"
    if rule.cap is not None:
        text += f", at most {num(rule.cap)}"
    if rule.quantum != CENT and _numeric(rule):
        text += f", rounded to {num(rule.quantum)}"
    return text + "."


def _numeric(rule: FieldRule) -> bool:
    return bool(rule.each) or any(
        t.kind in ("share", "table", "sum") or (t.kind == "const" and is_num(t.value)) for t in rule.terms()
    )


# -- reading --------------------------------------------------------------------------------------------------------

_NUM = r"-?\d+(?:\.\d+)?(?:/\d+)?"
_SEEN = re.compile(rf" \[seen ({_NUM}) / ({_NUM})\]")
_CONDX = (
    rf"`(?P<path>[^`]+)` (?:(?P<op>>=|<=|>|<) (?P<num>{_NUM})|is '(?P<cat>[^']*)')(?P<seen> \[seen {_NUM} / {_NUM}\])?"
)
_ITEM = re.compile(rf"{re.escape(MARK)}: `(?P<field>[^`]+)` = (?P<expr>.+?)\.?$")
_COND = re.compile(rf"^(?P<then>.+?) when {_CONDX}, else (?P<other>.+)$")
_CAP = re.compile(rf", at most (?P<cap>{_NUM})$")
_EACH = re.compile(r", for each of `(?P<each>[^`]+)`$")
_QUANTUM = re.compile(rf", rounded to (?P<q>{_NUM})$")
_TABLE = re.compile(rf"^((?:'[^']*' {_NUM}, )*'[^']*' {_NUM}) by ((?:`[^`]+`, )*`[^`]+`)$")
_SUM = re.compile(rf"^((?:{_NUM} \* `[^`]+` \+ )*{_NUM} \* `[^`]+`)(?: \+ ({_NUM}))?$")
_FACTOR = re.compile(rf"^times (?P<k>{_NUM}) when {_CONDX}$")


_PICK = re.compile(r"^the `([^`]+)` of elements of `([^`]+)` with ((?:`[^`]+` = [^`]+? and )*`[^`]+` = [^`]+)$")


def _parse_value(s: str) -> Any:
    s = s.strip()
    if s in ("true", "false"):
        return s == "true"
    if re.fullmatch(_NUM, s):
        return q(s)
    m = re.fullmatch(r"'([^']*)'", s)
    return m.group(1) if m else None


def parse_term(s: str) -> Term | None:
    s = s.strip()
    if s == UPPER:
        return Term("upper")
    if m := _TABLE.fullmatch(s):
        return _table_term(m)
    if (m := _SUM.fullmatch(s)) and (t := _sum_term(m)) is not None:
        return t
    if m := _PICK.fullmatch(s):
        return _pick_term(m)
    return _simple_term(s)


def _table_term(m: re.Match) -> Term | None:
    paths = tuple(re.findall(r"`([^`]+)`", m.group(2)))
    entries = tuple(
        (tuple(c.split("/")) if len(paths) > 1 else (c,), q(n))
        for c, n in re.findall(rf"'([^']*)' ({_NUM})", m.group(1))
    )
    if any(len(k) != len(paths) for k, _n in entries):
        return None
    return Term("table", entries, paths if len(paths) > 1 else paths[0])


def _sum_term(m: re.Match) -> Term | None:
    """A sum of several shares, or of one and a constant (one share alone: None, a `share` term)."""
    parts = tuple((q(k), p) for k, p in re.findall(rf"({_NUM}) \* `([^`]+)`", m.group(1)))
    if len(parts) > 1 or m.group(2):
        return Term("sum", (q(m.group(2)) if m.group(2) else Fraction(0), parts))
    return None


def _pick_term(m: re.Match) -> Term | None:
    where = tuple((a, _parse_value(v)) for a, v in re.findall(r"`([^`]+)` = ([^`]+?)(?: and |$)", m.group(3)))
    if any(v is None for _a, v in where):
        return None
    return Term("pick", (m.group(1), where), m.group(2))


def _simple_term(s: str) -> Term | None:
    """One of a set, a share of a feature, a feature's value, or a constant."""
    if s.startswith("one of "):
        vals = tuple(re.findall(r"'([^']*)'", s))
        return Term("one_of", vals) if vals else None
    if m := re.fullmatch(rf"({_NUM}) \* `([^`]+)`", s):
        return Term("share", q(m.group(1)), m.group(2))
    if m := re.fullmatch(r"`([^`]+)`", s):
        return Term("equal", None, m.group(1))
    v = _parse_value(s)
    return None if v is None else Term("const", v)


def _cond(m: re.Match) -> Cond:
    seen = None
    if m.group("seen"):
        a, b = _SEEN.search(m.group("seen")).groups()
        seen = (q(a), q(b))
    if m.group("num") is not None:
        return Cond(m.group("path"), m.group("op"), q(m.group("num")), seen)
    return Cond(m.group("path"), "is", m.group("cat"))


def parse_rule(field_: str, expr: str) -> FieldRule | None:
    """A field's rule from the text after `= ` (see the module doc), or None when it is not in the form."""
    quantum, cap = CENT, None
    if c := _QUANTUM.search(expr):
        quantum, expr = q(c.group("q")), expr[: c.start()]
    if c := _CAP.search(expr):
        cap, expr = q(c.group("cap")), expr[: c.start()]
    each = ""
    if c := _EACH.search(expr):
        each, expr = c.group("each"), expr[: c.start()]
    head, *tail = expr.split(", times ")
    factors = []
    for part in tail:
        f = _FACTOR.match("times " + part)
        if f is None:
            return None
        factors.append((_cond(f), q(f.group("k"))))
    if (c := _COND.match(head)) is not None:
        then, other = parse_term(c.group("then")), parse_term(c.group("other"))
        if then is None or other is None:
            return None
        return FieldRule(field_, then, _cond(c), other, tuple(factors), cap, quantum, each)
    t = parse_term(head)
    return None if t is None else FieldRule(field_, t, factors=tuple(factors), cap=cap, quantum=quantum, each=each)


def parse(text: str, tool: str) -> dict[str, FieldRule]:
    """Field -> the rule a text's items on `tool` state in the form above (the first item per field wins)."""
    out: dict[str, FieldRule] = {}
    for p in paragraphs(text, tool):
        m = _ITEM.search(p)
        if not m or m.group("field") in out:
            continue
        rule = parse_rule(m.group("field"), m.group("expr"))
        if rule is not None:
            out[m.group("field")] = rule
    return out


def with_outcomes(read, tool: str, fields: Iterable[str], value_of=None):
    """A fact's reader that also reads the inferred form: `read(text)` first (the world's own phrases); else, when the
    text's items on `tool` state a rule for one of the fact's `fields`, `value_of(rules)` (the world's value of the
    fact, for a rule that is a choice the agent makes) or, when that is None, the `Formula` of those fields' rules."""
    fields = tuple(fields)

    def either(text: str):
        v = read(text)
        if v is not None or MARK not in text:
            return v
        rules = parse(text, tool)
        mine = tuple(rules[f] for f in fields if f in rules)
        if not mine:
            return None
        v = value_of(rules) if value_of is not None else None
        return v if v is not None else Formula(tool, mine)

    return either


def ends(path: str, *suffixes: str) -> bool:
    return any(path.endswith(s) for s in suffixes)


# -- evaluating -----------------------------------------------------------------------------------------------------


def own(args: Mapping[str, Any], fld: str) -> dict[str, Any]:
    """A write's other numeric arguments, as a rule names them (`@<arg>`)."""
    return {f"@{k}": v for k, v in args.items() if k != fld and is_num(v)}


def term_value(t: Term, feats: Mapping[str, Any], quantum: Fraction = CENT, given: Any = None) -> tuple[bool, Any]:
    """(evaluable, value) of a term on one row's features (numbers exact, rounded to the quantum)."""
    if t.kind == "const":
        return True, t.value
    if t.kind == "upper":
        return (True, given.upper()) if isinstance(given, str) else (False, None)
    if t.kind in ("one_of", "pick"):  # a choice the agent makes, not a value
        return False, None
    if t.kind == "sum":
        const, parts = t.value
        xs = [number(feats, p) for _k, p in parts]
        if any(x is None for x in xs):
            return False, None
        return True, rnd(const + sum(k * x for (k, _p), x in zip(parts, xs)), quantum)
    if t.kind == "table":
        if not all(p in feats for p in t.paths):
            return False, None
        key = tuple(str(feats[p]) for p in t.paths)
        hit = [n for k, n in t.value if k == key]
        return (True, hit[0]) if hit else (False, None)
    if t.path not in feats:
        return False, None
    x = feats[t.path]
    if t.kind == "equal":
        return True, x
    return (True, rnd(t.value * q(x), quantum)) if is_num(x) else (False, None)


INDICATOR = re.compile(r"^(?P<path>.+) is '(?P<value>[^']*)'$")


def indicator(path: str, value: str) -> str:
    """The feature that is 1 when a category holds and 0 when not (a term of a sum)."""
    return f"{path} is '{value}'"


def number(feats: Mapping[str, Any], path: str) -> Fraction | None:
    """A feature's number on a row (an indicator's 0 or 1), or None when the row lacks it."""
    if is_num(feats.get(path)):
        return q(feats[path])
    m = INDICATOR.match(path)
    if m is None or m.group("path") not in feats:
        return None
    return Fraction(int(str(feats[m.group("path")]) == m.group("value")))


def evaluate(rule: FieldRule, feats: Mapping[str, Any], given: Any = None) -> tuple[bool, Any]:
    """(evaluable, value) of a rule on a row: `feats` what the reads showed (with the write's own arguments as
    `@<arg>`), `given` the agent's own value of the field (what `upper` transforms). A `one_of` rule names no value."""
    t = rule.then
    if rule.cond is not None:
        if rule.cond.path not in feats:
            return False, None
        t = rule.then if rule.cond.true(feats[rule.cond.path]) else rule.other
    ok, v = term_value(t, feats, rule.quantum, given)
    if not ok:
        return False, None
    for c, k in rule.factors:
        if c.path not in feats or not is_num(v):
            return False, None
        if c.true(feats[c.path]):
            v = rnd(q(v) * k, rule.quantum)
    if rule.each:
        if not is_num(v) or not is_num(feats.get(rule.each)):
            return False, None
        v = q(v) * q(feats[rule.each])
    if rule.cap is not None:
        if not is_num(v):
            return False, None
        v = min(q(v), rule.cap)
    return True, v


def holds(rule: FieldRule, feats: Mapping[str, Any], gold: Any, given: Any = None) -> bool | None:
    """Whether the rule gives `gold` exactly on a row (None: the row lacks a feature the rule reads)."""
    t = rule.then
    if rule.cond is not None and rule.cond.path in feats:
        t = rule.then if rule.cond.true(feats[rule.cond.path]) else rule.other
    if t.kind == "one_of" and not rule.factors and rule.cap is None and not rule.each:
        return (gold in t.value) if rule.cond is None or rule.cond.path in feats else None
    if t.kind == "pick" and not rule.factors and rule.cap is None:
        return picked(t, feats, gold) if rule.cond is None or rule.cond.path in feats else None
    ok, v = evaluate(rule, feats, given)
    return same(v, gold) if ok else None


def picked(t: Term, feats: Mapping[str, Any], value: Any) -> bool | None:
    """Whether every id of `value` (a list, or one id) is the key of a record of the term's list whose attributes
    have the term's values (None: no such read, or the value is not ids)."""
    records = feats.get(t.path)
    ids = value if isinstance(value, list) else [value]
    if not isinstance(records, Records) or not ids or not all(scalar(x) for x in ids):
        return None
    key, where = t.value
    for x in ids:
        hit = [e for e in records if str(e.get(key)) == str(x)]
        if len(hit) != 1 or not all(equal(hit[0].get(a), v) for a, v in where):
            return False
    return True


def equal(a: Any, b: Any) -> bool:
    """Equal as a feature's value: booleans only to booleans, numbers exactly (`numbers.same`), else as given."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return same(a, b)


def apply_formulas(
    rules: Iterable[FieldRule], args: Mapping[str, Any], feats_of: Callable[[Mapping[str, Any]], Mapping[str, Any]]
) -> dict[str, Any]:
    """A write's arguments with each field a rule states set to what it gives on the features `feats_of(args)`
    (rules that read none of the write's own arguments first, each later one on the arguments set so far); a field
    its rule cannot evaluate, or that an allowed set governs, keeps its value."""
    out = dict(args)
    for rule in sorted(rules, key=lambda r: (any("@" in p for p in r.features()), r.field)):
        if rule.field not in out or rule.then.kind == "one_of":
            continue
        ok, v = evaluate(rule, {**feats_of(out), **own(out, rule.field)}, given=out.get(rule.field))
        if ok and v is not None:
            out[rule.field] = as_number(v) if is_num(v) and not isinstance(v, (int, float)) else v
    return out
