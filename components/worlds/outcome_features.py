"""What successful reads showed before a write, as the features an outcome rule reads
(components/worlds/outcome_rules.py): every scalar of a read's content by its path, sums and picks over lists of
records, and a date's days from the policy's today. Exact: numbers are rationals."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from datetime import date
from fractions import Fraction
from typing import Any

from components.worlds.numbers import is_num, q

TODAY = re.compile(r"\b(?:today is|the current (?:date|time) is)\s+(\d{4}-\d{2}-\d{2})", re.I)
ISO_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
FROM_TODAY = "@days_from_today"


def policy_today(policy: str) -> date | None:
    """The date a written policy says today is (as real benchmarks' policies state the current time), else None."""
    m = TODAY.search(policy or "")
    return date.fromisoformat(m.group(1)) if m else None


def scalar(v: Any) -> bool:
    """A text or a number (not a boolean): what a feature, an id or a category can be."""
    return isinstance(v, (str, int, float)) and not isinstance(v, bool)


def category(v: Any) -> bool:
    """A value that names a kind rather than a thing (no digit: not an id, not an amount)."""
    return isinstance(v, str) and 0 < len(v) <= 40 and not any(ch.isdigit() for ch in v)


def flatten(
    obj: Any, prefix: str, write_args: Mapping[str, Any], out: dict[str, Any], today: date | None = None
) -> None:
    """Into `out`, the features a read's content shows under `prefix` (the feature grammar above): every scalar by
    its path (a date also as days from `today`), and for a list of records what `_records` reads off it."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            flatten(v, f"{prefix}.{k}", write_args, out, today)
    elif isinstance(obj, list) and obj and all(isinstance(e, dict) for e in obj):
        _records(obj, prefix, write_args, out)
    elif scalar(obj):
        out[prefix] = obj
        if today is not None and isinstance(obj, str) and ISO_DATE.fullmatch(obj):
            out[prefix + FROM_TODAY] = (date.fromisoformat(obj) - today).days


class Records(tuple):
    """A read's list of records, whole (a feature's value): what a `pick` term chooses its ids from."""


def _records(obj: list[dict], prefix: str, write_args: Mapping[str, Any], out: dict[str, Any]) -> None:
    """A list of records: the list itself, each number's sum over the list (`[].k`), its sum over the elements a
    write's list argument picks (`[k in arg].k2`), the fields of the element a scalar argument names (`[k=@arg].k2`),
    and of the one element of a kind (`[k=v].k2`); how many records it holds (`len(...)`). Sums are exact."""
    out[prefix] = Records(obj)
    out[f"len({prefix})"] = len(obj)
    keys = sorted(set().union(*obj))
    for k in keys:
        vals = [e.get(k) for e in obj]
        if all(is_num(v) for v in vals):
            out[f"{prefix}[].{k}"] = sum((q(v) for v in vals), Fraction(0))
    for arg, av in sorted(write_args.items()):  # the elements a write's list argument picks
        if isinstance(av, list) and av:
            _picked(obj, keys, prefix, arg, {str(x) for x in av}, out)
    _named(obj, keys, prefix, write_args, out)
    _kinds(obj, keys, prefix, out)


def _named(obj: list[dict], keys: list[str], prefix: str, write_args: Mapping[str, Any], out: dict[str, Any]) -> None:
    """The fields of the element a write's scalar argument names (`[k=@arg].k2`)."""
    for arg, av in sorted(write_args.items()):
        if not scalar(av):
            continue
        for k in keys:
            hit = [e for e in obj if str(e.get(k)) == str(av)]
            if len(hit) == 1:
                _fields(hit[0], k, f"{prefix}[{k}=@{arg}]", out)


def _kinds(obj: list[dict], keys: list[str], prefix: str, out: dict[str, Any]) -> None:
    """The fields of the one element of a kind (`[k=v].k2`)."""
    for k in keys:
        vals: list[Any] = [e.get(k) for e in obj]  # (what `category` keeps is text, never None)
        for v in sorted({x for x in vals if category(x)}):
            if vals.count(v) == 1:
                _fields(obj[vals.index(v)], k, f"{prefix}[{k}={v}]", out)


def _picked(obj: list[dict], keys: list[str], prefix: str, arg: str, chosen_ids: set[str], out: dict[str, Any]) -> None:
    for k in keys:
        chosen = [e for e in obj if str(e.get(k)) in chosen_ids]
        if not chosen:
            continue
        for k2 in keys:
            if all(is_num(e.get(k2)) for e in chosen):
                out[f"{prefix}[{k} in {arg}].{k2}"] = sum((q(e[k2]) for e in chosen), Fraction(0))


def _fields(element: dict, key: str, prefix: str, out: dict[str, Any]) -> None:
    for k2, v2 in element.items():
        if k2 != key and scalar(v2):
            out[f"{prefix}.{k2}"] = v2


def read_features(
    reads: Iterable[tuple[str, Mapping[str, Any], Any]],
    write_args: Mapping[str, Any],
    target: Mapping[str, str],
    today: date | None = None,
) -> dict[str, Any]:
    """What successful reads `(tool, args, content)` showed before a write: a read about the write's target (an arg
    of the target's name and value) wins over a general read; a read about another target (same arg, another value)
    is left out."""
    general: dict[str, Any] = {}
    mine: dict[str, Any] = {}
    for tool, args, content in reads:
        if not isinstance(content, dict):
            continue
        shared = [k for k in target if k in args]
        if any(str(args[k]) != target[k] for k in shared):
            continue
        f: dict[str, Any] = {}
        flatten(content, tool, write_args, f, today)
        (mine if shared else general).update(f)
    return {**general, **mine}
