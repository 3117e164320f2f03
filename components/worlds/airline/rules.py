"""The airline world's rules as data (`rules.yaml`, `components.worlds.rules`): the typed record, the statement each
rule's value is written as (the policy, the shipped packages, a refusal's receipt), and random variants.

A statement is rendered from the value and read back by the rule's reader (`facts`): `read(statement) == value` for
every value the record allows, which `tests/test_rules_data.py` checks on random variants.
"""

from __future__ import annotations

import random
from fractions import Fraction
from pathlib import Path
from typing import Any, Literal

from pydantic import field_validator, model_validator

from components.worlds.numbers import render as num
from components.worlds.rules import Rational, Source, Window, _Data

DEFAULTS = Path(__file__).with_name("rules.yaml")
FARES = ("basic", "economy", "flex", "business")
CHANGEABLE = ("economy", "flex", "business")  # basic fares cannot be changed (a general rule)
TIERS = ("regular", "silver", "gold")


class Surcharge(_Data):
    """The change fee times `factor` when the days from today to departure meet `when` (none: no surcharge)."""

    when: Window | None = None
    factor: Rational = Fraction(1)

    @property
    def applies(self) -> bool:
        return self.when is not None and self.factor != 1


NO_SURCHARGE = Surcharge()


class AirlineRules(_Data):
    refund_original: Literal["original", "account"]
    basic_credit: Literal["travel_credit", "same"]
    change_fee: dict[Literal["economy", "flex", "business"], int]
    change_window: Surcharge
    bag_allowance: dict[Literal["regular", "silver", "gold"], int]
    bag_fee: int
    bag_business: int
    comp_rate: tuple[tuple[int, int], ...]
    comp_gold: Rational
    comp_form: Literal["certificate", "cash"]
    upgrade_payment: Literal["credit_card", "any"]
    name_upper: Literal["upper", "as_given"]
    unstated: tuple[str, ...] = ()

    @field_validator("comp_rate")
    @classmethod
    def _bands(cls, v: tuple) -> tuple:
        if not v:
            raise ValueError("at least one band [hours, dollars]")
        hours = [h for h, _a in v]
        if hours != sorted(set(hours)) or any(h < 0 for h in hours) or any(a <= 0 for _h, a in v):
            raise ValueError("bands in increasing hours, each a positive number of dollars")
        return v

    @model_validator(mode="after")
    def _sane(self) -> "AirlineRules":
        if any(n < 0 for n in self.change_fee.values()) or any(n < 0 for n in self.bag_allowance.values()):
            raise ValueError("fees and allowances are never negative")
        if set(self.bag_allowance) != set(TIERS):
            raise ValueError(f"bag_allowance: one count per tier ({', '.join(TIERS)})")
        if self.bag_fee < 0 or self.bag_business < 0 or self.comp_gold <= 0 or self.change_window.factor <= 0:
            raise ValueError("bag_fee and bag_business >= 0; comp_gold and change_window.factor > 0")
        unknown = [u for u in self.unstated if u not in type(self).model_fields or u == "unstated"]
        if unknown:
            raise ValueError(f"unstated: {unknown[0]!r} is not a rule")
        return self


SOURCE: Source[AirlineRules] = Source(AirlineRules, DEFAULTS)
OWN = SOURCE.own
rules_of = SOURCE.of  # the world's rules with a variant's changes (`components.worlds.rules.Source.of`)


# -- statements -----------------------------------------------------------------------------------------------------


def _and(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def _times(k: Fraction, what: str, double: str) -> str:
    return double if k == 2 else f"takes {num(k)} times {what}"


def statements(r: AirlineRules) -> dict[str, str]:
    """Each rule's statement, as the policy, the shipped packages and a refusal's receipt write it."""
    return {
        **_cancel_statements(r),
        **_change_statements(r),
        **_bag_statements(r),
        **_comp_statements(r),
        **_account_statements(r),
    }


def _cancel_statements(r: AirlineRules) -> dict[str, str]:
    s: dict[str, str] = {}
    s["refund_original"] = (
        "- `cancel_reservation` refunds to the original payment method of the reservation: pass its "
        "`payment_method_id` as `refund_to`, not the account's first method."
        if r.refund_original == "original"
        else "- `cancel_reservation` refunds to the account's first payment method: pass its id as `refund_to`."
    )
    s["basic_credit"] = (
        "- `cancel_reservation` of a basic fare refunds as travel credit only: pass `refund_to` 'travel_credit' "
        "for basic fares."
        if r.basic_credit == "travel_credit"
        else "- `cancel_reservation` of a basic fare refunds like any other fare, never as travel credit."
    )
    return s


def _change_statements(r: AirlineRules) -> dict[str, str]:
    s: dict[str, str] = {}
    fees = {f: r.change_fee.get(f, 0) for f in CHANGEABLE}
    paid = [f"${n} for {f} fares" for f, n in fees.items() if n > 0]
    free = [f for f, n in fees.items() if n == 0]
    if not paid:
        s["change_fee"] = f"- `change_flight` charges no change fee: {_and(free)} fares change free."
    else:
        s["change_fee"] = f"- `change_flight` charges a change fee, passed as `fee`: {_and(paid)}" + (
            f", while {_and(free)} fares change free." if free else "."
        )
    w = r.change_window
    if not w.applies:
        s["change_window"] = (
            "- `change_flight` charges the same change fee whatever the days to departure: it is never doubled."
        )
    else:
        where = (
            f"within {w.when.value} days of departure"
            if w.when.op == "<="
            else f"{w.when.phrase('days')} before departure"
        )
        s["change_window"] = (
            f"- `change_flight` {where} (days from today to the departure date) "
            f"{_times(w.factor, 'the change fee', 'doubles the change fee')}."
        )
    return s


def _bag_statements(r: AirlineRules) -> dict[str, str]:
    s: dict[str, str] = {}
    tiers = ", ".join(f"{t} members {r.bag_allowance[t]}" for t in TIERS)
    s["bag_allowance"] = (
        f"- `add_checked_bags` takes the free allowance as `free_bags`, per passenger by tier: "
        f"{tiers} (times the number of passengers)."
    )
    s["bag_fee"] = (
        f"- `add_checked_bags` charges ${r.bag_fee} per bag beyond the free allowance, passed as the total `fee`."
        if r.bag_fee
        else "- `add_checked_bags` charges no fee per bag beyond the free allowance: pass `fee` 0."
    )
    n = r.bag_business
    s["bag_business"] = (
        f"- `add_checked_bags` on a business fare gives {n} more free bag{'s' if n > 1 else ''} per "
        "passenger on top of the tier allowance."
        if n
        else "- `add_checked_bags` on a business fare gives no more free bags than the tier allowance."
    )
    return s


def _comp_statements(r: AirlineRules) -> dict[str, str]:
    s: dict[str, str] = {}
    bands = [f"${a} for a delay of {h} hours or more" for h, a in r.comp_rate]
    s["comp_rate"] = f"- `issue_compensation` pays {_and(bands)}, passed as `amount`."
    s["comp_gold"] = (
        "- `issue_compensation` pays gold members the same amount, never doubled."
        if r.comp_gold == 1
        else f"- `issue_compensation` {_times(r.comp_gold, 'the amount', 'doubles the amount')} for gold members."
    )
    s["comp_form"] = (
        "- `issue_compensation` is paid as a travel certificate (`form` 'certificate'), never as cash."
        if r.comp_form == "certificate"
        else "- `issue_compensation` is paid in cash (`form` 'cash'), not as a certificate."
    )
    return s


def _account_statements(r: AirlineRules) -> dict[str, str]:
    s: dict[str, str] = {}
    s["upgrade_payment"] = (
        "- `upgrade_cabin` is paid only with a credit card on the account: pass a `credit_card` payment method, "
        "not the gift card or certificate the reservation was paid with."
        if r.upgrade_payment == "credit_card"
        else "- `upgrade_cabin` is paid with the reservation's own payment method, not necessarily a credit card."
    )
    s["name_upper"] = (
        "- `update_passenger_name` takes names in upper case, exactly as printed on the passport."
        if r.name_upper == "upper"
        else "- `update_passenger_name` takes names as the member gives them, not in upper case."
    )
    return s


# -- random variants --------------------------------------------------------------------------------------------------


def random_rules(seed: int) -> dict[str, Any]:
    """A variant of the world drawn at random: every numeric rule a new value (fees and bands not round, the window
    in either direction, factors that are ratios of small integers). Validated like a user's file."""
    rng = random.Random(seed)
    economy = rng.randint(30, 150)
    regular = rng.randint(0, 1)
    silver = regular + rng.randint(0, 1)
    a1 = rng.choice([a for a in range(60, 201) if a != 100])
    changes = {
        "change_fee": {
            "economy": economy,
            "flex": rng.randint(10, economy - 5),
            "business": rng.choice([0, rng.randint(5, 30)]),
        },
        "change_window": {
            "when": {"op": rng.choice([">", ">=", "<", "<="]), "value": rng.randint(3, 12)},
            "factor": rng.choice([2, 3, "3/2", "5/2", "4/3"]),
        },
        "bag_allowance": {"regular": regular, "silver": silver, "gold": max(2, silver + rng.randint(1, 2))},
        "bag_fee": rng.choice([a for a in range(20, 81) if a != 50]),
        "bag_business": rng.randint(1, 2),
        "comp_rate": [[3, a1], [rng.randint(5, 9), a1 + rng.randint(40, 300)]],
        "comp_gold": rng.choice([2, 3, "3/2", "5/2"]),
    }
    rules_of(changes)  # a variant that would not load is a bug here
    return changes
