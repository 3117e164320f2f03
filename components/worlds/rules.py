"""A built-in world's rules as data: the values and forms of its rules in one typed record, read from a YAML file.

Each built-in world declares its rules once (`<world>/rules.yaml`, the world's own values) as a pydantic model whose
fields are the rules; its tools, task generator, gold, written policy, shipped `reference` and `all-skills` packages
and the simulated agent's reading all take that record. A variant of the world is a file that changes some of them
(`ratchet bench materialize --rules FILE`, or `benchmark.rules` in params.yaml): the keys it gives replace the
world's own, validated at load, and the whole record is written to the benchmark's `meta.json` (so its digest).

The pieces rules are made of:
  Rational  an exact number: 5, 0.95, "31/12" (`components.worlds.numbers`)
  Window    a threshold on a number in one of four directions: `>` "more than N", `>=` "N or more" / "at least N",
            `<` "under N" / "less than N", `<=` "within N" / "N or less"
  Fee       an amount due when a window holds (none: always)
Reading those phrases back from text (`window_in`) is the grammar the simulated agent reads a card or a policy with.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from fractions import Fraction
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Generic, Literal, TypeVar

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, PlainSerializer, ValidationError, WithJsonSchema

from components.errors import InputError
from components.worlds.numbers import is_num, q
from components.worlds.numbers import render as num


def _rational(v: Any) -> Fraction:
    if isinstance(v, bool):
        raise ValueError("a number, not a boolean")
    if isinstance(v, (int, float, Fraction)) or (isinstance(v, str) and re.fullmatch(r"\s*-?\d+(\.\d+)?(/\d+)?\s*", v)):
        x = q(v)
        return x
    raise ValueError(f"{v!r} is not a number (an integer, a decimal or p/q)")


Rational = Annotated[
    Fraction,
    BeforeValidator(_rational),
    PlainSerializer(lambda x: _plain(x), return_type=Any),
    WithJsonSchema({"type": ["number", "string"]}),
]


def _plain(x: Fraction) -> int | float | str:
    """A rational as YAML and JSON write it: an int, a short decimal, else "p/q"."""
    s = num(x)
    return int(s) if re.fullmatch(r"-?\d+", s) else float(s) if "/" not in s else s


class _Data(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    def __hash__(self) -> int:  # rules hold tables (dicts): hashed by their data, so facts can be memoized per record
        return hash(self.model_dump_json())


OP = Literal[">", ">=", "<", "<="]


class Window(_Data):
    """A threshold on a number (an age in hours or days, a count of days): `op` its direction, `value` the bound."""

    op: OP
    value: int

    def holds(self, x: Any) -> bool:
        if not is_num(x):
            return False
        x = q(x)
        return {">": x > self.value, ">=": x >= self.value, "<": x < self.value, "<=": x <= self.value}[self.op]

    def phrase(self, unit: str) -> str:
        """ "more than 24 hours", "24 hours or more", "under 24 hours", "within 24 hours"."""
        n = f"{self.value} {unit}"
        return {">": f"more than {n}", ">=": f"{n} or more", "<": f"under {n}", "<=": f"within {n}"}[self.op]

    def otherwise(self, unit: str) -> str:
        """The other side, as a phrase: "within 24 hours" for "more than 24 hours", and so on."""
        n = f"{self.value} {unit}"
        return {">": f"within {n}", ">=": f"under {n}", "<": f"{n} or more", "<=": f"more than {n}"}[self.op]


class Fee(_Data):
    """An amount (a percent or dollars, per rule) due when `when` holds on an age; `when` null: always due."""

    amount: Rational
    when: Window | None = None

    def due(self, age: Any) -> bool:
        return self.amount > 0 and (self.when is None or self.when.holds(age))


NO_FEE = Fee(amount=Fraction(0))

# -- reading a direction back from text (the grammar the simulated agent reads with) ------------------------------

_DIRECTION = (
    (">=", r"(?:at least|no less than) (\d+)\s*{u}|(\d+)\s*{u} or (?:more|longer|older)"),
    ("<=", r"(?:within(?: the last)?|up to|at most) (\d+)\s*{u}|(\d+)\s*{u} or (?:less|fewer|sooner)"),
    (">", r"(?:more than|over|after|older than|longer than|beyond) (\d+)\s*{u}"),
    ("<", r"(?:under|less than|fewer than|before|younger than) (\d+)\s*{u}"),
)


def window_in(text: str, unit: str) -> tuple[int, Window, bool] | None:
    """The first threshold phrase on `unit` (a regex: `hours?`, `days?`) in `text`: (its position, the Window,
    whether a direction was said); a bare "N hours" reads as "more than N" (an age past which something applies)."""
    hits = []
    for op, pat in _DIRECTION:
        for m in re.finditer(pat.format(u=rf"(?:{unit})\b"), text, re.I):
            hits.append((m.start(), op, int(next(g for g in m.groups() if g is not None))))
    if not hits:
        m = re.search(rf"\b(\d+)\s*(?:{unit})\b", text, re.I)
        return (m.start(), Window(op=">", value=int(m.group(1))), False) if m else None
    at, op, n = min(hits)
    return at, Window(op=op, value=n), True


# -- loading a world's rules ----------------------------------------------------------------------------------------

R = TypeVar("R", bound=BaseModel)


def load(
    model: type[R],
    defaults: Path,
    changes: Mapping[str, Any] | str | Path | None = None,
    where: str = "benchmark.rules",
) -> R:
    """The world's own rules (`defaults`, its rules.yaml) with `changes` (a mapping, or a YAML file's path) in place of
    the rules it names; a bad key or value is one line naming `where` (the file or the param) and the field."""
    own = yaml.safe_load(defaults.read_text(encoding="utf-8"))
    if isinstance(changes, (str, Path)):
        where = str(changes)
        try:
            changes = yaml.safe_load(Path(changes).read_text(encoding="utf-8")) or {}
        except OSError as e:
            raise InputError(f"{where}: cannot read the rules file ({e.strerror or e})") from None
        except yaml.YAMLError as e:
            raise InputError(f"{where}: not YAML ({str(e).splitlines()[0]})") from None
    changes = dict(changes or {})
    if not isinstance(changes, dict):
        raise InputError(f"{where}: must map rule ids to their values")
    changes.pop("world", None)  # a rules file may name its world; the benchmark's world decides
    unknown = sorted(set(changes) - set(model.model_fields))
    if unknown:
        raise InputError(f"{where}: {unknown[0]}: no such rule (one of {', '.join(model.model_fields)})")
    try:
        return model.model_validate({**own, **changes})
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        raise InputError(f"{where}: {loc}: {err['msg']}") from None


class Source(Generic[R]):
    """One world's rules: its typed record and its own rules.yaml. `of(changes)` is the world's `rules_of`."""

    def __init__(self, model: type[R], defaults: Path) -> None:
        self.model, self.defaults = model, defaults
        self.own: R = load(model, defaults, None, str(defaults))
        # every episode's environment asks for its benchmark's rules: a mapping is loaded once per content
        self._by_content = lru_cache(maxsize=64)(self._load_json)

    def of(self, changes: Mapping[str, Any] | str | Path | None = None, where: str = "benchmark.rules") -> R:
        """The world's rules with `changes` (a mapping or a YAML file's path) in place of the ones it names."""
        if changes is None:
            return self.own
        if isinstance(changes, (str, Path)):
            return load(self.model, self.defaults, changes, where)
        return self._by_content(json.dumps(changes, sort_keys=True, default=str), where)

    def _load_json(self, key: str, where: str) -> R:
        return load(self.model, self.defaults, json.loads(key), where)


def dump(rules: BaseModel) -> dict[str, Any]:
    """The rules as plain data (meta.json, a rules file): rationals as ints, short decimals or "p/q"."""
    return rules.model_dump(mode="json")
