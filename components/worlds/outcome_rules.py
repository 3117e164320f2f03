"""The card form of a rule inferred from outcomes, shared by the writer (the `rules` meta-agent) and the readers (each
world's facts, so the simulated agent).

One list item per field of a write, naming the write in backticks (the grammar's scope rule) and the field:

    - `<tool>`, from train outcomes: `<field>` = <term>[ when <condition>, else <term>].

    term       'text' (a constant) | 12.5 (a constant) | `<feature>` (equal to it) | 0.95 * `<feature>` (a share of
               it) | one of 'a', 'b' (the allowed values) | the value as given, in upper case | 'a' 10, 'b' 20 by
               `<feature>` (a table: the number its category names; a category it does not name has no value) |
               35 * `<feature>` + -35 * `<feature>` [+ 10] (a sum of terms: each a factor times a feature, and a
               constant)
    condition  `<feature>` > 24 (a threshold) | `<feature>` is 'basic' (a category)
    factors    a number term followed by up to two `, times <k> when <condition>` (each applied in turn, to the cent,
               when its condition holds): two rules on one amount, e.g. a fee after some days and a bonus on a kind
    cap        a number rule followed by `, at most <n>`: the smaller of its value and n (a credit with a ceiling)
    feature    what a read showed before the write: `<read tool>.<key>[.<key>...]`; `<read tool>.<list>[].<key>` is the
               sum of that key over the list; `<read tool>.<list>[<key> in <arg>].<k2>` the sum of k2 over the
               elements whose key is among the write's list argument <arg>; `<read tool>.<list>[<key>=<value>].<k2>` the
               k2 of the one element whose key has that value; `<read tool>.<list>[<key>=@<arg>].<k2>` the k2 of the
               element whose key is the write's argument <arg>;
               `<read tool>.<key>@days_from_today` the days from the policy's date to the date a key holds;
               `@<arg>` (in a sum only) the write's own argument <arg> (a count the customer gave, or another field
               of the same write).

Nothing here knows a world: each world's facts map a parsed `FieldRule` onto the value of the rule it is about.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from components.worlds.grammar import paragraphs

MARK = "from train outcomes"
UPPER = "the value as given, in upper case"


@dataclass(frozen=True)
class Term:
    kind: Literal["const", "equal", "share", "one_of", "upper", "table", "sum"]
    value: Any = None  # const: the value; share: the factor; one_of: the tuple of values; table: ((category, n), ...);
    # sum: (constant, ((factor, feature), ...))
    path: str = ""  # equal, share: the feature


@dataclass(frozen=True)
class Cond:
    path: str
    op: Literal[">", "is"]
    value: Any


@dataclass(frozen=True)
class FieldRule:
    field: str
    then: Term
    cond: Cond | None = None
    other: Term | None = None  # the value when `cond` does not hold
    factors: tuple[tuple[Cond, float], ...] = ()  # applied to `then` in turn, each when its condition holds
    cap: float | None = None  # the value is at most this (after the factors)

    def terms(self) -> tuple[Term, ...]:
        return (self.then,) if self.other is None else (self.then, self.other)


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _val(v: Any) -> str:
    return f"'{v}'" if isinstance(v, str) else _num(v)


def render_term(t: Term) -> str:
    if t.kind == "const":
        return _val(t.value)
    if t.kind == "equal":
        return f"`{t.path}`"
    if t.kind == "share":
        return f"{_num(t.value)} * `{t.path}`"
    if t.kind == "upper":
        return UPPER
    if t.kind == "table":
        return ", ".join(f"{_val(c)} {_num(n)}" for c, n in t.value) + f" by `{t.path}`"
    if t.kind == "sum":
        const, parts = t.value
        return " + ".join([f"{_num(k)} * `{p}`" for k, p in parts] + ([_num(const)] if const else []))
    return "one of " + ", ".join(_val(v) for v in t.value)


def render(tool: str, rule: FieldRule) -> str:
    """One list item of a card (see the module doc)."""
    text = f"- `{tool}`, {MARK}: `{rule.field}` = {render_term(rule.then)}"
    if rule.cond is not None:
        text += f" when {_cond(rule.cond)}, else {render_term(rule.other)}"
    for c, k in rule.factors:
        text += f", times {_num(k)} when {_cond(c)}"
    if rule.cap is not None:
        text += f", at most {_num(rule.cap)}"
    return text + "."


def _cond(c: Cond) -> str:
    return f"`{c.path}` {'>' if c.op == '>' else 'is'} {_val(c.value)}"


_NUM = r"-?\d+(?:\.\d+)?"
_ITEM = re.compile(rf"{re.escape(MARK)}: `(?P<field>[^`]+)` = (?P<expr>.+?)\.?$")
_COND = re.compile(rf"^(?P<then>.+?) when `(?P<path>[^`]+)` (?:> (?P<num>{_NUM})|is '(?P<cat>[^']*)'), else (?P<other>.+)$")
_CAP = re.compile(rf", at most (?P<cap>{_NUM})$")
_TABLE = re.compile(rf"^((?:'[^']*' {_NUM}, )*'[^']*' {_NUM}) by `([^`]+)`$")
_SUM = re.compile(rf"^((?:{_NUM} \* `[^`]+` \+ )+{_NUM} \* `[^`]+`)(?: \+ ({_NUM}))?$")
_FACTOR = re.compile(rf"^times (?P<k>{_NUM}) when `(?P<path>[^`]+)` (?:> (?P<num>{_NUM})|is '(?P<cat>[^']*)')$")


def _parse_value(s: str) -> Any:
    s = s.strip()
    if re.fullmatch(_NUM, s):
        x = float(s)
        return int(x) if x.is_integer() and "." not in s else x
    m = re.fullmatch(r"'([^']*)'", s)
    return m.group(1) if m else None


def parse_term(s: str) -> Term | None:
    s = s.strip()
    if s == UPPER:
        return Term("upper")
    if m := _TABLE.fullmatch(s):
        entries = tuple((c, _parse_value(n)) for c, n in re.findall(rf"'([^']*)' ({_NUM})", m.group(1)))
        return Term("table", entries, m.group(2))
    if m := _SUM.fullmatch(s):
        parts = tuple((_parse_value(k), p) for k, p in re.findall(rf"({_NUM}) \* `([^`]+)`", m.group(1)))
        return Term("sum", (_parse_value(m.group(2)) if m.group(2) else 0, parts))
    if s.startswith("one of "):
        vals = tuple(re.findall(r"'([^']*)'", s))
        return Term("one_of", vals) if vals else None
    if m := re.fullmatch(rf"({_NUM}) \* `([^`]+)`", s):
        return Term("share", float(m.group(1)), m.group(2))
    if m := re.fullmatch(r"`([^`]+)`", s):
        return Term("equal", None, m.group(1))
    v = _parse_value(s)
    return None if v is None else Term("const", v)


def parse(text: str, tool: str) -> dict[str, FieldRule]:
    """Field -> the rule a text's items on `tool` state in the form above (the first item per field wins)."""
    out: dict[str, FieldRule] = {}
    for p in paragraphs(text, tool):
        m = _ITEM.search(p)
        if not m or m.group("field") in out:
            continue
        expr = m.group("expr")
        cap = None
        if c := _CAP.search(expr):
            cap, expr = _parse_value(c.group("cap")), expr[:c.start()]
        if ", times " in expr:
            head, *tail = expr.split(", times ")
            base = parse_term(head)
            factors = []
            for part in tail:
                f = _FACTOR.match("times " + part)
                if f is None:
                    break
                num = f.group("num")
                cond = Cond(f.group("path"), ">" if num is not None else "is",
                            float(num) if num is not None else f.group("cat"))
                factors.append((cond, float(f.group("k"))))
            if base is not None and len(factors) == len(tail):
                out[m.group("field")] = FieldRule(m.group("field"), base, factors=tuple(factors), cap=cap)
            continue
        c = _COND.match(expr)
        if c:
            then, other = parse_term(c.group("then")), parse_term(c.group("other"))
            value = float(c.group("num")) if c.group("num") is not None else c.group("cat")
            cond = Cond(c.group("path"), ">" if c.group("num") is not None else "is", value)
            if then is not None and other is not None:
                out[m.group("field")] = FieldRule(m.group("field"), then, cond, other)
            continue
        t = parse_term(expr)
        if t is not None:
            out[m.group("field")] = FieldRule(m.group("field"), t, cap=cap)
    return out


def with_outcomes(read, tool: str, value_of):
    """A fact's reader that also reads the inferred form: `read(text)` first (the world's own phrases), else
    `value_of(rules)` over the text's items on `tool` (None when they do not settle the fact)."""

    def either(text: str):
        v = read(text)
        if v is not None or MARK not in text:
            return v
        rules = parse(text, tool)
        return value_of(rules) if rules else None

    return either


def ends(path: str, *suffixes: str) -> bool:
    return any(path.endswith(s) for s in suffixes)
