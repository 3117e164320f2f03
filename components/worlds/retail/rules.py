"""The retail world's rules as data (`rules.yaml`, `components.worlds.rules`): the typed record, the statement each
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
from components.worlds.rules import Fee, Rational, Source, _Data

DEFAULTS = Path(__file__).with_name("rules.yaml")

# What customers say when they cancel, by the reason it means (the world's language; `cancel_reason` allows some)
REASONS: dict[str, tuple[str, ...]] = {
    "no longer needed": ("I no longer need it", "I don't need it anymore"),
    "ordered by mistake": ("I ordered it by mistake", "I bought it by accident"),
    "found a better price": ("I found it cheaper elsewhere", "I saw a better price somewhere else"),
    "delivery too slow": ("the delivery takes too long", "it will arrive too late for me"),
    "changed my mind": ("I changed my mind", "I decided against it"),
}
REASON_OF = {phrase: reason for reason, phrases in REASONS.items() for phrase in phrases}


class Reasons(_Data):
    allowed: tuple[str, ...]

    @field_validator("allowed")
    @classmethod
    def _known(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if not v:
            raise ValueError("at least one reason")
        bad = [r for r in v if r not in REASONS]
        if bad:
            raise ValueError(f"{bad[0]!r} is no reason a customer gives (one of {', '.join(REASONS)})")
        if len(set(v)) != len(v):
            raise ValueError("a reason listed twice")
        return v


class RetailRules(_Data):
    cancel_reason: Reasons
    cancel_fee: Fee
    refund_original: Literal["original", "account"]
    restocking_fee: Fee
    gift_card_bonus: Rational
    exchange_available: Literal["check_available", "ignore_available"]
    exchange_fee: Fee
    address_validated: Literal["validate", "raw"]
    reroute_fee: Fee
    user_address_validated: Literal["validate", "raw"]
    credit_rate: Rational
    credit_cap: Rational | None
    credit_gift_card: Literal["gift_card", "original"]
    unstated: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _sane(self) -> "RetailRules":
        for name in ("cancel_fee", "restocking_fee"):
            fee = getattr(self, name)
            if not 0 <= fee.amount < 100:
                raise ValueError(f"{name}.amount: a percent from 0 to under 100")
        for name in ("cancel_fee", "restocking_fee", "exchange_fee", "reroute_fee"):
            fee = getattr(self, name)
            if fee.amount < 0 or (fee.when is not None and fee.when.value < 0):
                raise ValueError(f"{name}: amounts and windows are never negative")
        if self.gift_card_bonus < 0 or self.credit_rate <= 0 or (self.credit_cap is not None and self.credit_cap <= 0):
            raise ValueError("gift_card_bonus >= 0, credit_rate > 0 and credit_cap > 0 (or null)")
        unknown = [u for u in self.unstated if u not in type(self).model_fields or u == "unstated"]
        if unknown:
            raise ValueError(f"unstated: {unknown[0]!r} is not a rule")
        return self


SOURCE: Source[RetailRules] = Source(RetailRules, DEFAULTS)
OWN = SOURCE.own
rules_of = SOURCE.of  # the world's rules with a variant's changes (`components.worlds.rules.Source.of`)


# -- statements -----------------------------------------------------------------------------------------------------

WORDS = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five"}


def _alternatives(values: tuple[str, ...]) -> str:
    quoted = [f"'{v}'" for v in values]
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " or " + quoted[-1]


def statements(r: RetailRules) -> dict[str, str]:
    """Each rule's statement, as the policy, the shipped packages and a refusal's receipt write it."""
    s: dict[str, str] = {}
    n = len(r.cancel_reason.allowed)
    onto = "this value" if n == 1 else f"one of these {WORDS.get(n, str(n))} values"
    s["cancel_reason"] = (
        f"- `cancel_pending_order` takes a `reason` that must be exactly "
        f"{_alternatives(r.cancel_reason.allowed)}. Map the customer's own words onto {onto}; any "
        "other reason is refused."
    )
    s["cancel_fee"] = _cancel_fee(r.cancel_fee)
    s["refund_original"] = (
        "- `return_delivered_order_items` refunds only to the original payment method of the order: pass the "
        "`payment_method_id` that `get_order_details` shows for that order, not another method on the account."
        if r.refund_original == "original"
        else "- `return_delivered_order_items` refunds to the account's first payment method: pass the first "
        "`payment_method_id` that `get_user_details` lists."
    )
    s["restocking_fee"] = _restocking_fee(r.restocking_fee)
    bonus = r.gift_card_bonus
    s["gift_card_bonus"] = (
        f"- `return_delivered_order_items` into a `gift_card` method earns a {num(bonus)}% bonus: multiply the "
        f"`refund_amount` by {num(1 + bonus / 100)} as the last step, rounded to cents."
        if bonus
        else "- `return_delivered_order_items` into a `gift_card` method earns no bonus."
    )
    s["exchange_available"] = (
        "- `exchange_delivered_order_items` accepts only a new item whose variant is available: check `available` "
        "in `get_product_variants` and, when the customer's first choice is unavailable, use their stated alternative."
        if r.exchange_available == "check_available"
        else "- `exchange_delivered_order_items` does not check availability: pass the variant the customer asked for."
    )
    s["exchange_fee"] = _exchange_fee(r.exchange_fee)
    s["address_validated"] = _validated("modify_pending_order_address", r.address_validated, "")
    s["reroute_fee"] = _reroute_fee(r.reroute_fee)
    s["user_address_validated"] = _validated("modify_user_address", r.user_address_validated, " as well")
    s["credit_rate"] = (
        f"- `issue_store_credit` grants a late-delivery credit of ${num(r.credit_rate)} for each day "
        "late (`days_late` in `get_order_details`): pass it as `amount`."
    )
    s["credit_cap"] = (
        f"- `issue_store_credit`: a late-delivery credit is capped at ${num(r.credit_cap)} per order."
        if r.credit_cap is not None
        else "- `issue_store_credit`: a late-delivery credit is not capped."
    )
    s["credit_gift_card"] = (
        "- `issue_store_credit` puts the credit onto the gift card on the customer's account: pass that gift card's "
        "`payment_method_id`, whatever method the order was paid with."
        if r.credit_gift_card == "gift_card"
        else "- `issue_store_credit` puts the credit onto the payment method the order was paid with: pass the order's "
        "`payment_method_id`."
    )
    return s


def _cancel_fee(fee: Fee) -> str:
    tail = "Pass it as `refund_amount`, rounded to cents."
    if fee.amount == 0:
        return f"- `cancel_pending_order` refunds the order's full total: there is no cancellation fee. {tail}"
    p = num(fee.amount)
    if fee.when is None:
        return f"- `cancel_pending_order` refunds the order's total minus a {p}% cancellation fee, whatever its age. {tail}"
    w = fee.when
    return (
        f"- `cancel_pending_order` on an order placed {w.phrase('hours')} ago (`placed_hours_ago` in "
        f"`get_order_details`) refunds the order's total minus a {p}% cancellation fee; {w.otherwise('hours')}, the "
        f"full total. {tail}"
    )


def _restocking_fee(fee: Fee) -> str:
    tail = "Pass the sum over the returned items as `refund_amount`, rounded to cents."
    if fee.amount == 0:
        return f"- `return_delivered_order_items` refunds the returned items' full price: there is no restocking fee. {tail}"
    p = num(fee.amount)
    if fee.when is None:
        return (
            f"- `return_delivered_order_items` refunds the returned items' price minus a {p}% restocking fee, "
            f"whatever the time since delivery. {tail}"
        )
    w = fee.when
    return (
        f"- `return_delivered_order_items`: items delivered {w.phrase('days')} ago (`delivered_days_ago` in "
        f"`get_order_details`) are refunded their price minus a {p}% restocking fee; {w.otherwise('days')}, their "
        f"full price. {tail}"
    )


def _exchange_fee(fee: Fee) -> str:
    if fee.amount == 0:
        return "- `exchange_delivered_order_items` charges no `exchange_fee`: pass 0."
    amt = num(fee.amount)
    if fee.when is None:
        return (
            f"- `exchange_delivered_order_items` takes an `exchange_fee` of ${amt} for each exchanged item, "
            "whatever the days since delivery."
        )
    if fee.when.op == ">":
        return (
            f"- `exchange_delivered_order_items` is free {fee.when.otherwise('days')} of delivery "
            f"(`delivered_days_ago` in `get_order_details`); after that, pass an `exchange_fee` of ${amt} for each "
            "exchanged item (else 0)."
        )
    return (
        f"- `exchange_delivered_order_items` {fee.when.phrase('days')} of delivery (`delivered_days_ago` in "
        f"`get_order_details`) takes an `exchange_fee` of ${amt} for each exchanged item; otherwise it is free (0)."
    )


def _reroute_fee(fee: Fee) -> str:
    if fee.amount == 0:
        return "- `modify_pending_order_address` carries no re-routing fee: pass `reroute_fee` 0."
    amt = num(fee.amount)
    if fee.when is None:
        return f"- `modify_pending_order_address` always carries a ${amt} re-routing fee: pass it as `reroute_fee`."
    return (
        f"- `modify_pending_order_address` on an order placed {fee.when.phrase('hours')} ago (`placed_hours_ago`) "
        f"carries a ${amt} re-routing fee: pass it as `reroute_fee` (0 {fee.when.otherwise('hours')})."
    )


def _validated(tool: str, value: str, also: str) -> str:
    if value == "validate":
        return (
            f"- `{tool}` {'stores' if also else 'accepts'} only a normalized address{also}: call "
            "`validate_address` first and pass the normalized fields it returns, exactly."
        )
    return f"- `{tool}` takes the address as the customer gives it: do not call `validate_address`."


# -- random variants --------------------------------------------------------------------------------------------------


def _window(rng: random.Random, lo: int, hi: int) -> dict:
    return {"op": rng.choice([">", ">=", "<", "<="]), "value": rng.randint(lo, hi)}


def _percent(rng: random.Random, lo: int, hi: int) -> Any:
    """A percent: a whole number, or half of an odd one (12.5), or a third of a number (100/3)."""
    kind = rng.random()
    if kind < 0.6:
        return rng.randint(lo, hi)
    if kind < 0.8:
        return str(Fraction(2 * rng.randint(lo, hi) + 1, 2))
    return f"{3 * rng.randint(lo, hi) + rng.choice([1, 2])}/3"


def random_rules(seed: int) -> dict[str, Any]:
    """A variant of the world drawn at random: every numeric rule a new value (thresholds anywhere, either
    direction; percents whole, halves or thirds; odd dollar amounts and caps), another set of allowed reasons, and
    where the credit goes. Validated like a user's file."""
    rng = random.Random(seed)
    reasons = list(REASONS)
    allowed = rng.sample(reasons, k=rng.randint(1, 4))
    rate = rng.randint(2, 12)
    changes = {
        "cancel_reason": {"allowed": allowed},
        "cancel_fee": {"amount": _percent(rng, 3, 20), "when": _window(rng, 10, 60)},
        "restocking_fee": {"amount": _percent(rng, 5, 25), "when": _window(rng, 12, 60)},
        "gift_card_bonus": _percent(rng, 2, 15),
        "exchange_fee": {"amount": rng.randint(3, 19), "when": _window(rng, 6, 30)},
        "reroute_fee": {"amount": rng.randint(2, 15), "when": _window(rng, 20, 90)},
        "credit_rate": rate,
        "credit_cap": rate * rng.randint(3, 6) + rng.choice([-1, 1, 2, 3]) if rng.random() < 0.85 else None,
        "credit_gift_card": rng.choice(["gift_card", "original"]),
    }
    rules_of(changes)  # a variant that would not load is a bug here
    return changes
