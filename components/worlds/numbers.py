"""Exact numbers, as the worlds compute amounts and as inference reproduces them.

Amounts are exact rationals (`fractions.Fraction`): a price read as 12.34 is 1234/100, a factor of one third is 1/3,
never 0.3333. A world rounds a result to its quantum (a cent, a whole dollar) half up, and states where it rounds;
inference applies the same rounding, so a rule holds on a row only when it gives the amount exactly as the world
computes it. `simplest` is the rational with the smallest denominator in an interval: what a factor is taken to be
when the rows leave it an interval (rounding hides its last digits), and the criterion that prefers 1/3 to
0.33333 without preferring any one base of numbers.
"""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction
from functools import lru_cache
from typing import Any

CENT = Fraction(1, 100)
UNIT = Fraction(1)


def is_num(x: Any) -> bool:
    return (
        isinstance(x, (int, float, Fraction, Decimal))
        and not isinstance(x, bool)
        and (not isinstance(x, float) or math.isfinite(x))
    )


def q(x: Any) -> Fraction:
    """`x` as an exact rational: a float by its shortest decimal form (12.34 is 1234/100), a string as a decimal or
    `p/q`."""
    if isinstance(x, Fraction):
        return x
    if isinstance(x, bool):
        raise TypeError("a bool is not a number")
    if isinstance(x, int):
        return Fraction(x)
    if isinstance(x, float):
        if not math.isfinite(x):
            raise ValueError(f"{x} is not a finite number")
        return _from_float(float(x))
    if isinstance(x, (Decimal, str)):
        return Fraction(str(x).strip())
    raise TypeError(f"{x!r} is not a number")


@lru_cache(maxsize=1 << 16)  # the same amounts are read again and again (every rule judged on every row)
def _from_float(x: float) -> Fraction:
    return Fraction(repr(x))


def rnd(x: Fraction, quantum: Fraction = CENT) -> Fraction:
    """`x` rounded to a multiple of `quantum`, halves up (the worlds' rounding: 0.125 -> 0.13, 2.5 -> 3)."""
    return math.floor(x / quantum + Fraction(1, 2)) * quantum


def out(x: Fraction) -> int | float:
    """An exact amount as a tool argument or a JSON value: an int when whole, else the float of its decimal."""
    return int(x) if x.denominator == 1 else float(x)


def same(a: Any, b: Any) -> bool:
    """Equal values, numbers compared exactly (12.3 == 12.30 == 1230/100; 12.3 != 12.305)."""
    if is_num(a) and is_num(b):
        return q(a) == q(b)
    return a == b


def quantum_of(values: list[Any]) -> Fraction:
    """The coarsest of a whole unit and a cent that every value is a multiple of (a world's amounts in whole
    dollars, or in cents); finer values keep their own resolution."""
    qs = [q(v) for v in values if is_num(v)]
    if all(v.denominator == 1 for v in qs):
        return UNIT
    if all((v * 100).denominator == 1 for v in qs):
        return CENT
    return Fraction(1, max(v.denominator for v in qs))


def simplest(lo: Fraction, hi: Fraction) -> Fraction:
    """The rational with the smallest denominator (then the smallest magnitude) in the closed interval [lo, hi]."""
    if lo > hi:
        raise ValueError("empty interval")
    if lo <= 0 <= hi:
        return Fraction(0)
    if hi < 0:
        return -simplest(-hi, -lo)
    n = math.floor(lo)
    if n == lo:
        return Fraction(n)
    if n + 1 <= hi:
        return Fraction(n + 1)
    return n + 1 / simplest(1 / (hi - n), 1 / (lo - n))


def render(x: Fraction | int | float) -> str:
    """A number as a card states it: an integer, a decimal when it has at most six places, else `p/q`."""
    x = q(x)
    if x.denominator == 1:
        return str(x.numerator)
    if any((10**k) % x.denominator == 0 for k in range(1, 7)):
        return format(Decimal(x.numerator) / Decimal(x.denominator), "f")
    return f"{x.numerator}/{x.denominator}"


def bits(x: Fraction) -> float:
    """Description length of a constant: the bits of its numerator and denominator (1/3 is cheaper than 0.3333)."""
    return 1 + math.log2(1 + abs(x.numerator)) + math.log2(x.denominator)
