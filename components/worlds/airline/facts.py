"""The airline world's procedure knowledge (12 facts), and the one grammar in which it can be read.

Eight facts are stated in the written policy (policy.md); four are NOT (`unstated`): the world enforces them, a
refusal receipt carries their `rule_id` and text, and successful episodes follow them, but no agent can read them in
the policy. Several facts govern the same write (their effects combine: the change fee is the fare's fee, doubled
inside the window; the free bag allowance is the tier's plus the business bonus).

`read(text)` reads a piece of text (a card, the policy, a receipt's `rule`) into the value it *instructs*, or None
when the text does not address the fact. The simulated agent reads its context with it, so this module is also the
definition of what the simulated agent understands in this world.

The grammar (anything else is ignored, as if the card were not there):

  1. Scope. Only a paragraph or list item that names the fact's write tool in backticks addresses the fact
     (`cancel_reservation`, `change_flight`, `add_checked_bags`, `issue_compensation`, `upgrade_cabin`,
     `update_passenger_name`).
  2. Clauses. The paragraph is split into clauses at `.`, `;`, `:`, `!`, `?` and at `, but` / `, while`.
  3. Negation. A clause is negated when `not`, `never`, `no`, `don't`/`do not`/`doesn't`, `cannot`, `avoid`,
     `instead of`, `rather than`, `other than` or `without` comes before the value phrase. A negated clause instructs
     the fact's opposite (below). The first clause that instructs a value wins, except for the two tables
     (change fee, bag allowance), whose entries are merged over the paragraph's clauses (the first entry per key wins).
  4. Value phrases, per fact:
     - refund_original: "original payment method", "payment method of the reservation", "paid with",
       "reservation's `payment_method_id`" -> original; "account's first/default/preferred method", "first method on
       the account" -> account. Opposites: original <-> account.
     - basic_credit: "travel credit" / "travel_credit" -> travel_credit (a basic fare is refunded as travel credit);
       negated -> same (basic fares are refunded like any other).
     - change_fee: a table fare -> fee. "$N for economy (and ...) fares" gives each fare named after `$N` (up to the
       next `$`) that fee; "<fares> ... free" or a negated "fee" clause naming fares gives them 0.
     - change_window: "within N days" with "doubl"/"twice" (or "K times") -> (N, 2 or K); negated -> (0, 1): no
       surcharge.
     - bag_allowance: a table tier -> free bags per passenger, "regular members 0, silver members 1, gold 2" (a
       tier followed by a count); negated ("no free bags") -> every tier 0.
     - bag_fee: "$N per/for each (extra) bag" -> N; negated ("no fee per bag") -> 0.
     - bag_business: "business" with "N more/extra/additional free bag(s)" -> N; negated -> 0.
     - comp_rate: a table of bands, "$A ... N hours" pairs -> ((N, A), ...) (the amount from N hours of delay on);
       negated -> () (no compensation).
     - comp_gold: "gold" with "double(s|d)"/"twice"/"N times" -> 2 or N; negated -> 1.
     - comp_form: "certificate" -> certificate; "cash" -> cash. Opposites: certificate <-> cash.
     - upgrade_payment: "credit card" / "`credit_card`" -> credit_card; negated -> any (the reservation's method).
     - name_upper: "upper case", "uppercase", "capital letters", "as printed on the passport" -> upper; negated ->
       as_given.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from fractions import Fraction
from functools import lru_cache

from components.worlds.airline.rules import OWN, TIERS, AirlineRules, NO_SURCHARGE, Surcharge, statements
from components.worlds.grammar import NEGATION, Fact, clauses, first, negated, on_tool
from components.worlds.grammar import facts_read as read_all
from components.worlds.numbers import UNIT, q, rnd
from components.worlds.outcome_rules import with_outcomes
from components.worlds.rules import window_in

NUMBER_WORDS = {"no": 0, "zero": 0, "one": 1, "two": 2, "three": 3, "four": 4}
FARES = ("basic", "economy", "flex", "business")
RATIO = r"(\d+(?:\.\d+)?(?:/\d+)?)"


def _num(s: str) -> int:
    return NUMBER_WORDS[s.lower()] if s.lower() in NUMBER_WORDS else int(s)


# -- cancel_reservation ---------------------------------------------------------------------------------------------

REFUND = {
    "original": re.compile(
        r"original payment method|payment method of the reservation|paid with|"
        r"reservation's `?payment_method_id",
        re.I,
    ),
    "account": re.compile(
        r"account's (first|preferred|default)|(first|preferred|default) (payment )?method "
        r"(on|of) the account",
        re.I,
    ),
}


def _read_refund(text: str) -> object | None:
    return first(text, "cancel_reservation", REFUND, {"original": "account", "account": "original"})


CREDIT = {"travel_credit": re.compile(r"travel[ _]credit", re.I)}


def _read_credit(text: str) -> object | None:
    return first(text, "cancel_reservation", CREDIT, {"travel_credit": "same"})


# -- change_flight ------------------------------------------------------------------------------------------------

DOLLARS = re.compile(r"\$(\d+)")
FARE_RE = re.compile(r"\b(basic|economy|flex|business)\b", re.I)


def _read_change_fee(text: str) -> tuple | None:
    table: dict[str, int] = {}
    for clause in clauses(text, "change_flight"):
        low = clause.lower()
        if "fee" not in low and "$" not in low and "free" not in low:
            continue
        amounts = list(DOLLARS.finditer(low))
        for m in FARE_RE.finditer(low):
            before = [a for a in amounts if a.start() < m.start()]
            if before:
                fee = int(before[-1].group(1))
            elif re.search(r"\bfree\b", low) or (NEGATION.search(low) and "fee" in low):
                fee = 0
            else:
                continue
            table.setdefault(m.group(1), fee)
    return tuple(sorted(table.items())) if table else None


FACTOR = re.compile(r"doubl|twice|" + RATIO + r" times", re.I)


def _read_window(text: str) -> Surcharge | None:
    """A surcharge on the change fee: a threshold on the days to departure ("within 7 days of departure", "more
    than 10 days before departure") and a factor ("doubles", "3 times", "3/2 times"); negated ("never doubled"):
    no surcharge."""
    for clause in clauses(text, "change_flight"):
        f = FACTOR.search(clause)
        if not f:
            continue
        if negated(clause, f.start()):
            return NO_SURCHARGE
        w = window_in(clause, "days?")
        if w:
            return Surcharge(when=w[1], factor=q(f.group(1)) if f.group(1) else Fraction(2))
    return None


# -- add_checked_bags ---------------------------------------------------------------------------------------------

TIER_COUNT = re.compile(r"\b(regular|silver|gold)\b(?: members?)?(?: get| have)?:? (\d+|no|zero|one|two|three)\b", re.I)


def _read_allowance(text: str) -> tuple | None:
    table: dict[str, int] = {}
    for clause in clauses(text, "add_checked_bags"):
        hits = list(TIER_COUNT.finditer(clause))
        if not hits:
            if (
                re.search(r"\bfree (checked )?bags?\b", clause, re.I)
                and re.search(r"\bno free", clause, re.I)
                and not re.search(r"business", clause, re.I)
            ):
                return tuple(sorted((t, 0) for t in TIERS))
            continue
        if negated(clause, hits[0].start()):
            return tuple(sorted((t, 0) for t in TIERS))
        for m in hits:
            table.setdefault(m.group(1).lower(), _num(m.group(2)))
    return tuple(sorted(table.items())) if table else None


PER_BAG = re.compile(r"\$(\d+) (?:per|for each|for every|a) (?:extra |additional )?(?:checked )?bag", re.I)
NO_BAG_FEE = re.compile(r"\bfee\b.*\b(per|each) (?:extra |additional )?bag|\bbags?\b.*\bfee\b", re.I)


def _read_bag_fee(text: str) -> int | None:
    for clause in clauses(text, "add_checked_bags"):
        m = PER_BAG.search(clause)
        if m:
            return 0 if negated(clause, m.start()) else int(m.group(1))
        n = NO_BAG_FEE.search(clause)
        if n and negated(clause, n.end()) and "business" not in clause.lower() and not TIER_COUNT.search(clause):
            return 0
    return None


BONUS = re.compile(r"(\d+|one|two|three) (?:more|extra|additional) free (?:checked )?bags?", re.I)


def _read_business(text: str) -> int | None:
    for clause in clauses(text, "add_checked_bags"):
        if "business" not in clause.lower():
            continue
        m = BONUS.search(clause)
        if m:
            return 0 if negated(clause, m.start()) else _num(m.group(1))
        if re.search(r"\bno (more|extra|additional) free", clause, re.I):
            return 0
    return None


# -- issue_compensation -------------------------------------------------------------------------------------------

TIER_AMOUNT = re.compile(r"\$(\d+)[^$]*?\b(\d+) hours", re.I)


def _read_rate(text: str) -> tuple | None:
    """A table of (hours of delay from which it applies, amount): "$100 for a delay of 3 hours or more and $250
    for a delay of 6 hours or more" -> ((3, 100), (6, 250)); negated ("never pays $100 ...") -> () (nothing)."""
    for clause in clauses(text, "issue_compensation"):
        hits = list(TIER_AMOUNT.finditer(clause))
        if hits:
            if negated(clause, hits[0].start()):
                return ()
            return tuple(sorted((int(m.group(2)), int(m.group(1))) for m in hits))
    return None


GOLD_FACTOR = re.compile(r"doubl\w*|twice|" + RATIO + r" times", re.I)


def _read_gold(text: str) -> Fraction | None:
    for clause in clauses(text, "issue_compensation"):
        if not re.search(r"\bgold\b", clause, re.I):
            continue
        m = GOLD_FACTOR.search(clause)
        if m:
            return Fraction(1) if negated(clause, m.start()) else (q(m.group(1)) if m.group(1) else Fraction(2))
    return None


FORM = {"certificate": re.compile(r"certificate", re.I), "cash": re.compile(r"\bcash\b", re.I)}


def _read_form(text: str) -> object | None:
    return first(text, "issue_compensation", FORM, {"certificate": "cash", "cash": "certificate"})


# -- upgrade_cabin, update_passenger_name -------------------------------------------------------------------------

CARD = {"credit_card": re.compile(r"credit[ _]card", re.I)}


def _read_upgrade(text: str) -> object | None:
    return first(text, "upgrade_cabin", CARD, {"credit_card": "any"})


UPPER = {"upper": re.compile(r"upper ?case|capital letters|as printed on the passport", re.I)}


def _read_upper(text: str) -> object | None:
    return first(text, "update_passenger_name", UPPER, {"upper": "as_given"})


# -- the inferred form's values, where the rule is a choice the agent makes -------------------------------------------
# Every other rule's field rule an agent applies as written (a `Formula`, `components.worlds.outcome_rules`).

# rule id -> (write, the arguments it governs, reader of the world's phrases, value of the inferred form or None)
READERS = {
    "refund_original": ("cancel_reservation", ("refund_to",), _read_refund, None),
    "basic_credit": ("cancel_reservation", ("refund_to",), _read_credit, None),
    "change_fee": ("change_flight", ("fee",), _read_change_fee, None),
    "change_window": ("change_flight", ("fee",), _read_window, None),
    "bag_allowance": ("add_checked_bags", ("free_bags",), _read_allowance, None),
    "bag_fee": ("add_checked_bags", ("fee",), _read_bag_fee, None),
    "bag_business": ("add_checked_bags", ("free_bags",), _read_business, None),
    "comp_rate": ("issue_compensation", ("amount",), _read_rate, None),
    "comp_gold": ("issue_compensation", ("amount",), _read_gold, None),
    "comp_form": ("issue_compensation", ("form",), _read_form, None),
    "upgrade_payment": ("upgrade_cabin", ("payment_method_id",), _read_upgrade, None),
    "name_upper": ("update_passenger_name", ("first_name", "last_name"), _read_upper, None),
}


def _truth(rules: AirlineRules, fid: str) -> object:
    v = getattr(rules, fid)
    if fid in ("change_fee", "bag_allowance"):
        return tuple(sorted(v.items()))
    if fid == "comp_rate":
        return tuple(tuple(b) for b in v)
    if fid == "change_window":
        return v if v.applies else NO_SURCHARGE
    return v


@lru_cache(maxsize=32)  # every episode's tools read them: built once per benchmark's rules
def facts_of(rules: AirlineRules = OWN) -> Mapping[str, Fact]:
    """The rules of a world (the world's own, or a variant's) as facts: statement, reader and true value each."""
    said = statements(rules)
    return {
        fid: Fact(
            fid,
            tool,
            said[fid],
            with_outcomes(read, tool, fields, value_of),
            stated=fid not in rules.unstated,
            fields=fields,
            truth=_truth(rules, fid),
        )
        for fid, (tool, fields, read, value_of) in READERS.items()
    }


BY_ID: Mapping[str, Fact] = facts_of(OWN)
FACTS: tuple[Fact, ...] = tuple(BY_ID.values())
BY_TOOL: dict[str, tuple[Fact, ...]] = on_tool(FACTS)
STATED = tuple(f for f in FACTS if f.stated)
UNSTATED = tuple(f for f in FACTS if not f.stated)


def facts_read(text: str) -> dict[str, object]:
    """Every fact `text` addresses, with the value it instructs."""
    return read_all(FACTS, text)


# -- what the rules make of a request (the world's truth; the tools and the rubric use these) ------------------------


def table(value: object) -> dict:
    return dict(value) if isinstance(value, tuple) else {}


def change_fee(fare: str, days: int, fee_table: object, window: object) -> int:
    """The change fee for a fare `days` before departure, under a fee table and a surcharge (whole dollars, halves
    up)."""
    fee = q(table(fee_table).get(fare, 0))
    if isinstance(window, Surcharge) and window.applies and window.when.holds(days):
        fee *= window.factor
    return int(rnd(fee, UNIT))


def free_bags(tier: str, fare: str, passengers: int, allowance: object, business: object) -> int:
    per = table(allowance).get(tier, 0) + (business if fare == "business" and isinstance(business, int) else 0)
    return per * passengers


def bag_total(bags: int, free: int, per_bag: object) -> int:
    return max(0, bags - free) * (per_bag if isinstance(per_bag, int) else 0)


def compensation(delay_minutes: int, tier: str, rate: object, gold: object) -> int:
    """The amount of the highest band of `rate` ((hours, amount), ...) the delay reaches, times the gold factor
    (whole dollars, halves up)."""
    hours = Fraction(delay_minutes, 60)
    bands = [amount for h, amount in (rate if isinstance(rate, tuple) else ()) if hours >= h]
    mult = q(gold) if tier == "gold" and isinstance(gold, (int, Fraction)) and not isinstance(gold, bool) else 1
    return int(rnd(q(max(bands) if bands else 0) * mult, UNIT))
