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

The package, by concern: `rows` (the rows, and judging a rule on one), `context` (the fit rows as arrays, a rule's
description length), the forms (`terms`, `products` with `exact` and `intervals`, `sums`, `picks`), `search` (every
form's candidates that fit, shortest first), `folds` (fit on one half, check on the other) and `tools` (per tool).
"""

from __future__ import annotations

from components.evolution.infer.context import description_bits
from components.evolution.infer.folds import infer_field, placed_on
from components.evolution.infer.rows import (
    BEAM,
    EXPLAIN,
    K_REGIONS,
    MAX_BASES,
    MAX_PAIRS,
    MIN_CHECK,
    MIN_FIT,
    MIN_PART,
    MIN_SIDE,
    Inference,
    Row,
    ext,
    features,
    fit_half,
    holds,
    rows_for,
)
from components.evolution.infer.search import FORMS, LIST_FORMS, fitting, smallest
from components.evolution.infer.tools import carried, fixable, infer_rows, infer_tool
from components.worlds.outcome_rules import Cond, FieldRule, Term, category, flatten, policy_today

__all__ = [
    "BEAM",
    "carried",
    "category",
    "Cond",
    "description_bits",
    "EXPLAIN",
    "ext",
    "features",
    "FieldRule",
    "fit_half",
    "fitting",
    "fixable",
    "flatten",
    "FORMS",
    "holds",
    "infer_field",
    "infer_rows",
    "infer_tool",
    "Inference",
    "K_REGIONS",
    "LIST_FORMS",
    "MAX_BASES",
    "MAX_PAIRS",
    "MIN_CHECK",
    "MIN_FIT",
    "MIN_PART",
    "MIN_SIDE",
    "placed_on",
    "policy_today",
    "Row",
    "rows_for",
    "smallest",
    "Term",
]
