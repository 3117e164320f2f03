"""The retail world's family-specific procedure knowledge, the formulas it feeds, and the one grammar in which it
can be read.

Thirteen facts govern the six writes, two or three on most of them (they interact: a write must satisfy every rule
on it). Each fact is enforced by its write (a violation returns a `policy` refusal receipt that cites the fact's id
and quotes its statement) and visible in successful episodes. Most are also stated in the written policy; the
`stated=False` ones are NOT: they can be learned only from the refusal receipts that quote them, or from successful
episodes. `read(text)` reads a piece of text (a card, the policy, a receipt's rule) into the value it *instructs*, or
None when the text does not address the fact. The simulated agent reads its context with it, so this module is also
the definition of what the simulated agent understands. The tools and the task generator compute the correct
amounts with the same formulas (`cancel_refund`, `return_refund`, ...) from the facts' true values; an agent computes
them from the values it believes. Nothing else reads this module: a diagnoser has only the policy, receipts and
traces; the hidden causes come from replay, not from here.

The grammar (what the simulated agent understands; anything else is ignored, as if the card were not there):

  1. Scope. Only a paragraph or list item that names the fact's write tool in backticks addresses the fact
     (`cancel_pending_order`, `return_delivered_order_items`, `exchange_delivered_order_items`,
     `modify_pending_order_address`, `modify_user_address`, `issue_store_credit`). A card that describes the rule
     without naming the tool this way is ignored.
  2. Clauses. The paragraph is split into clauses at `.`, `;`, `:`, `!`, `?` (followed by a space or the end) and at
     `, but` / `, while`. A clause instructs a value when it contains one of that fact's value phrases (below).
  3. Negation. A clause is negated when it contains `not`, `never`, `no`, `don't`/`do not`/`doesn't`, `cannot`,
     `avoid`, `instead of`, `rather than`, `other than` or `without` before the value phrase. A negated clause
     instructs the fact's opposite value ("never refund to the original payment method" reads as: refund to the
     account's method; "there is no restocking fee" reads as: a fee of 0). Several clauses: the first one that
     instructs a value wins.
  4. Value phrases, per fact (on its tool):
     - cancel_reason: a clause naming the `reason` (or "reason") with a modal (must, should, has to, only, exactly,
       one of, either, allowed, accepted) and quoted values ('no longer needed'): the quoted values are the allowed
       reasons; negated ("must not be 'no longer needed'"): pass the customer's own words.
     - refund_original: "original payment method", "payment method of the order", "order's `payment_method_id`",
       "method the order was paid with", "paid with" -> original; "gift card" -> gift card; "account's first/
       preferred/default method", "first method on the account" -> the account's first method. Opposites:
       original <-> account; gift card -> original.
     - exchange_available: "`available`", "availab(le|ility)", "in stock" -> check availability and fall back to the
       customer's alternative; negated -> ignore availability.
     - address_validated, user_address_validated: "`validate_address`", "normaliz(e|ed)", "validat(e|ed)" ->
       validate first and pass the normalized fields; negated -> pass the customer's address as given.
     - Fees (value `Fee(threshold, amount)`; the fee is due when the order is older than the threshold, 0 = always):
       the clause naming the fee gives the amount (`N%` or `$N`, else the first one in its paragraph), and the first
       `N hours`/`N days` of that clause (else of the paragraph) the threshold; negated -> `Fee(0, 0)`, no fee.
         cancel_fee: "cancellation fee" (percent of the order total; hours since the order was placed);
         restocking_fee: "restocking fee" (percent of the returned items' price; days since delivery);
         exchange_fee: "exchange fee" / "`exchange_fee`" (dollars per exchanged item; days since delivery);
         reroute_fee: "re-routing fee" / "`reroute_fee`" (dollars; hours since the order was placed).
     - gift_card_bonus: "bonus" with `N%` -> a refund to a gift card is raised by N%; negated -> 0.
     - credit_rate: "for each day late" / "per day late" / "a day late" with `$N` -> N dollars per day late;
       negated -> 0.
     - credit_cap: "capped" / "a cap of" / "maximum" / "at most" with `$N` -> the credit is at most N; negated ("not
       capped", "no maximum") -> no cap (infinity).
     - credit_gift_card: "gift card" / "`gift_card`" -> credit onto the account's gift card; "original payment
       method", "paid with", "payment method of the order" -> onto the order's method. Opposites of each other.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Callable, NamedTuple

from components.worlds.grammar import Fact, changed, clauses, first, keyed, negated, on_tool
from components.worlds.outcome_rules import ends, with_outcomes
from components.worlds.grammar import facts_read as read_all

REASONS = ("no longer needed", "ordered by mistake")
VERBATIM = ("<customer's words>",)  # the negated cancel rule: pass the customer's sentence through

QUOTED = re.compile(r"['\"“‘]([a-z][a-z ]+?)['\"”’]")
MODAL = re.compile(r"\b(must|should|has to|have to|needs? to|only|exactly|one of|either|allowed|accepted)\b")


def _read_reason(text: str) -> tuple[str, ...] | None:
    for clause in clauses(text, "cancel_pending_order"):
        low = clause.lower()
        if "reason" not in low or not MODAL.search(low):
            continue
        quoted = tuple(q.strip() for q in QUOTED.findall(low))
        if quoted:
            return VERBATIM if negated(low, low.index(QUOTED.search(low).group(0))) else quoted
    return None


REFUND = {
    "original": re.compile(r"original payment method|payment method of the order|order's `?payment_method_id|"
                           r"method the order was paid with|paid with", re.I),
    "gift_card": re.compile(r"gift card", re.I),
    "account": re.compile(r"account's (first|preferred|default)|(first|preferred|default) (payment )?method "
                          r"(on|of) the account", re.I),
}


def _read_refund(text: str) -> str | None:
    return first(text, "return_delivered_order_items", REFUND,
                  {"original": "account", "account": "original", "gift_card": "original"})


AVAILABLE = {"check_available": re.compile(r"`available`|availab(le|ility)|in stock", re.I)}


def _read_available(text: str) -> str | None:
    return first(text, "exchange_delivered_order_items", AVAILABLE, {"check_available": "ignore_available"})


VALIDATE = {"validate": re.compile(r"`validate_address`|normaliz(e|ed)|validat(e|ed)", re.I)}


def _read_validate(tool: str) -> Callable[[str], str | None]:
    def read(text: str) -> str | None:
        return first(text, tool, VALIDATE, {"validate": "raw"})

    return read


# -- numbers: fees, bonuses, rates and caps --------------------------------------------------------------------

class Fee(NamedTuple):
    threshold: int  # the fee is due when the order is older than this (hours or days); 0 = always
    amount: float  # percent or dollars, per fact


NUM = r"(\d+(?:\.\d+)?)"
AMOUNT = {"pct": re.compile(NUM + r"\s*(?:%|percent\b)", re.I),
          "usd": re.compile(r"\$\s*" + NUM + "|" + NUM + r" dollars\b", re.I)}
AGE = {"hours": re.compile(r"\b(\d+)\s*hours?\b", re.I), "days": re.compile(r"\b(\d+)\s*days?\b", re.I)}


def _number(pattern: re.Pattern, *texts: str) -> float | None:
    for t in texts:
        m = pattern.search(t)
        if m:
            return float(next(g for g in m.groups() if g is not None))
    return None


def _read_fee(tool: str, key: str, unit: str, age: str) -> Callable[[str], Fee | None]:
    pat = re.compile(key, re.I)

    def read(text: str) -> Fee | None:
        for clause, para, negated in keyed(text, tool, pat):
            if negated:
                return Fee(0, 0.0)
            amount = _number(AMOUNT[unit], clause, para)
            if amount is None:
                continue  # names the fee but not how much: says nothing
            threshold = _number(AGE[age], clause, para)
            return Fee(int(threshold or 0), amount)
        return None

    return read


def _read_amount(tool: str, key: str, unit: str, negated_value: float) -> Callable[[str], float | None]:
    pat = re.compile(key, re.I)

    def read(text: str) -> float | None:
        for clause, para, negated in keyed(text, tool, pat):
            if negated:
                return negated_value
            amount = _number(AMOUNT[unit], clause, para)
            if amount is not None:
                return amount
        return None

    return read


CREDIT_TO = {
    "gift_card": re.compile(r"gift card|`gift_card`", re.I),
    "original": re.compile(r"original payment method|payment method of the order|paid with", re.I),
}


def _read_credit_to(text: str) -> str | None:
    return first(text, "issue_store_credit", CREDIT_TO, {"gift_card": "original", "original": "gift_card"})


# -- the facts ------------------------------------------------------------------------------------------------------

FACTS: tuple[Fact, ...] = (
    Fact(
        "cancel_reason",
        "cancel_pending_order",
        "- `cancel_pending_order` takes a `reason` that must be exactly 'no longer needed' or 'ordered by mistake'. "
        "Map the customer's own words onto one of these two values; any other reason is refused.",
        _read_reason,
    ),
    Fact(
        "cancel_fee",
        "cancel_pending_order",
        "- `cancel_pending_order` on an order placed more than 24 hours ago (`placed_hours_ago` in "
        "`get_order_details`) refunds the order's total minus a 5% cancellation fee; within 24 hours, the full "
        "total. Pass it as `refund_amount`, rounded to cents.",
        _read_fee("cancel_pending_order", r"cancell?ation fee", "pct", "hours"),
        stated=False,
    ),
    Fact(
        "refund_original",
        "return_delivered_order_items",
        "- `return_delivered_order_items` refunds only to the original payment method of the order: pass the "
        "`payment_method_id` that `get_order_details` shows for that order, not another method on the account.",
        _read_refund,
    ),
    Fact(
        "restocking_fee",
        "return_delivered_order_items",
        "- `return_delivered_order_items`: items delivered more than 30 days ago (`delivered_days_ago` in "
        "`get_order_details`) are refunded their price minus a 10% restocking fee; within 30 days, their full price. "
        "Pass the sum over the returned items as `refund_amount`, rounded to cents.",
        _read_fee("return_delivered_order_items", r"restocking fee", "pct", "days"),
    ),
    Fact(
        "gift_card_bonus",
        "return_delivered_order_items",
        "- `return_delivered_order_items` into a `gift_card` method earns a 5% bonus: multiply the `refund_amount` "
        "by 1.05 as the last step, rounded to cents.",
        _read_amount("return_delivered_order_items", r"\bbonus\b", "pct", 0.0),
        stated=False,
    ),
    Fact(
        "exchange_available",
        "exchange_delivered_order_items",
        "- `exchange_delivered_order_items` accepts only a new item whose variant is available: check `available` "
        "in `get_product_variants` and, when the customer's first choice is unavailable, use their stated alternative.",
        _read_available,
    ),
    Fact(
        "exchange_fee",
        "exchange_delivered_order_items",
        "- `exchange_delivered_order_items` is free within 14 days of delivery (`delivered_days_ago` in "
        "`get_order_details`); after that, pass an `exchange_fee` of $8 for each exchanged item (else 0).",
        _read_fee("exchange_delivered_order_items", r"exchange[ _]fee", "usd", "days"),
    ),
    Fact(
        "address_validated",
        "modify_pending_order_address",
        "- `modify_pending_order_address` accepts only a normalized address: call `validate_address` first and pass "
        "the normalized fields it returns, exactly.",
        _read_validate("modify_pending_order_address"),
    ),
    Fact(
        "reroute_fee",
        "modify_pending_order_address",
        "- `modify_pending_order_address` on an order placed more than 48 hours ago (`placed_hours_ago`) carries a "
        "$6 re-routing fee: pass it as `reroute_fee` (0 within 48 hours).",
        _read_fee("modify_pending_order_address", r"re-?rout(?:e|ing)[ _]fee", "usd", "hours"),
        stated=False,
    ),
    Fact(
        "user_address_validated",
        "modify_user_address",
        "- `modify_user_address` stores only a normalized address as well: call `validate_address` first and pass "
        "the normalized fields it returns, exactly.",
        _read_validate("modify_user_address"),
        stated=False,
    ),
    Fact(
        "credit_rate",
        "issue_store_credit",
        "- `issue_store_credit` grants a late-delivery credit of $5 for each day late (`days_late` in "
        "`get_order_details`): pass it as `amount`.",
        _read_amount("issue_store_credit", r"(?:for each|per|a) day late", "usd", 0.0),
    ),
    Fact(
        "credit_cap",
        "issue_store_credit",
        "- `issue_store_credit`: a late-delivery credit is capped at $25 per order.",
        _read_amount("issue_store_credit", r"\bcap(?:ped)?\b|\bmaximum\b|\bat most\b", "usd", math.inf),
        stated=False,
    ),
    Fact(
        "credit_gift_card",
        "issue_store_credit",
        "- `issue_store_credit` puts the credit onto the gift card on the customer's account: pass that gift card's "
        "`payment_method_id`, whatever method the order was paid with.",
        _read_credit_to,
    ),
)


# -- the same rules inferred from outcomes (components/worlds/outcome_rules.py): what such a card instructs ---------------

TOTAL = "get_order_details.items[].price"  # the order's total, as the inferred form names it


def _fee_of(field: str, age: str, share_of_total: bool):
    """A fee as a conditional rule on `age`: for an amount, a share of the total above the threshold and the total
    below (the fee is the missing share, in percent); for a fee field, a constant above and 0 below."""

    def value(rules: dict) -> Fee | None:
        r = rules.get(field)
        if r is None:
            return None
        if r.cond is None:  # one value whatever the age: no fee
            plain = r.then.kind == "equal" and ends(r.then.path, TOTAL) if share_of_total else \
                r.then.kind == "const" and r.then.value == 0
            return Fee(0, 0.0) if plain else None
        if r.cond.op != ">" or not ends(r.cond.path, age):
            return None
        if share_of_total:
            if r.then.kind == "share" and ends(r.then.path, TOTAL) and r.other.kind == "equal" and ends(r.other.path, TOTAL):
                return Fee(int(r.cond.value), round((1 - r.then.value) * 100, 6))
            return None
        if r.then.kind == "const" and r.other.kind == "const" and r.other.value == 0:
            return Fee(int(r.cond.value), float(r.then.value))
        return None

    return value


def _one_of(field: str):
    def value(rules: dict):
        r = rules.get(field)
        return tuple(r.then.value) if r is not None and r.cond is None and r.then.kind == "one_of" else None

    return value


def _method(field: str, paths: dict[str, str]):
    """Which payment method a rule names: the value whose feature the field equals."""

    def value(rules: dict):
        r = rules.get(field)
        if r is None or r.cond is not None or r.then.kind != "equal":
            return None
        return next((v for v, suffix in paths.items() if ends(r.then.path, suffix)), None)

    return value


def _validated(rules: dict):
    hits = [r for r in rules.values() if r.cond is None and r.then.kind == "equal" and ".normalized." in r.then.path]
    return "validate" if hits else None


def _credit(part: str):
    """The per-day rate (the share of `days_late`) or the cap (the rule's ceiling, or the constant above a threshold
    on `days_late`)."""

    def value(rules: dict):
        r = rules.get("amount")
        if r is None:
            return None
        shares = [t.value for t in r.terms() if t.kind == "share" and ends(t.path, "days_late")]
        if part == "rate":
            return shares[0] if shares else None
        if r.cond is None and not r.factors and r.cap is not None:
            return float(r.cap) if shares else None  # a per-day credit, at most the ceiling
        if r.cond is None:
            return math.inf if shares else None  # a plain per-day credit: no cap
        if r.cond.op == ">" and ends(r.cond.path, "days_late") and r.then.kind == "const" and shares:
            return float(r.then.value)
        return None

    return value


def _return(part: str):
    """The return's amount: the selected items' prices, times (1 - fee) after a number of days since delivery, times
    (1 + bonus) when the refund's method is a gift card."""

    def value(rules: dict):
        r = rules.get("refund_amount")
        if r is None or not r.factors or r.then.kind != "equal" or not ends(r.then.path, "price"):
            return None
        for c, k in r.factors:
            if part == "fee" and c.op == ">" and ends(c.path, "delivered_days_ago"):
                return Fee(int(c.value), round((1 - k) * 100, 6))
            if part == "bonus" and c.op == "is" and c.value == "gift_card":
                return round((k - 1) * 100, 6)
        return Fee(0, 0.0) if part == "fee" else 0.0  # an amount rule with no such factor: none of it

    return value


OUTCOME_VALUES = {
    "restocking_fee": _return("fee"),
    "gift_card_bonus": _return("bonus"),
    "cancel_reason": _one_of("reason"),
    "cancel_fee": _fee_of("refund_amount", "placed_hours_ago", True),
    "refund_original": _method("payment_method_id", {"original": "get_order_details.payment_method_id",
                                                     "gift_card": "[kind=gift_card].id"}),
    "exchange_fee": _fee_of("exchange_fee", "delivered_days_ago", False),
    "address_validated": _validated,
    "reroute_fee": _fee_of("reroute_fee", "placed_hours_ago", False),
    "user_address_validated": _validated,
    "credit_rate": _credit("rate"),
    "credit_cap": _credit("cap"),
    "credit_gift_card": _method("payment_method_id", {"gift_card": "[kind=gift_card].id",
                                                      "original": "get_order_details.payment_method_id"}),
}  # exchange_available is a property of the catalog the write's new item does not carry: it has no inferred form
FACTS = tuple(replace(f, read=with_outcomes(f.read, f.tool, OUTCOME_VALUES[f.id])) if f.id in OUTCOME_VALUES else f
              for f in FACTS)
BY_ID: dict[str, Fact] = {f.id: f for f in FACTS}


def facts_of(statements: dict[str, str] | None, where: str = "benchmark.facts") -> Mapping[str, Fact]:
    """The rules of a benchmark: the world's own, or a changed world's (`meta.json` "facts": rule id -> statement)."""
    return changed(BY_ID, statements, where)
ON_TOOL: dict[str, tuple[Fact, ...]] = on_tool(FACTS)
# the first fact on each write (the one each write had before the world grew); kept for callers that know one per tool
BY_TOOL: dict[str, Fact] = {tool: fs[0] for tool, fs in ON_TOOL.items()}


def facts_read(text: str) -> dict[str, object]:
    """Every fact `text` addresses, with the value it instructs."""
    return read_all(FACTS, text)


# -- the formulas: one home for the tools (true values), the task generator (truth) and the agent (beliefs) ---------
# A value of None is the rule not known: the naive agent's default (no fee, no bonus, no cap, a flat courtesy credit).

NAIVE_CREDIT = 10.0  # what an agent that does not know the per-day rate offers for a late delivery


def cents(x: float) -> float:
    return round(x + 1e-9, 2)


def _due(fee: Fee | None, age: int) -> bool:
    return fee is not None and fee.amount > 0 and age > fee.threshold


def cancel_refund(order: dict, fee: Fee | None) -> float:
    total = sum(i["price"] for i in order["items"])
    return cents(total * (1 - fee.amount / 100) if _due(fee, order.get("placed_hours_ago", 0)) else total)


def return_refund(order: dict, item_ids: list[str], fee: Fee | None, bonus: float | None, to_gift_card: bool) -> float:
    price = sum(i["price"] for i in order["items"] if i["item_id"] in item_ids)
    if _due(fee, order.get("delivered_days_ago", 0)):
        price *= 1 - fee.amount / 100
    if to_gift_card and bonus:
        price = cents(price) * (1 + bonus / 100)
    return cents(price)


def exchange_fee(order: dict, n_items: int, fee: Fee | None) -> float:
    return cents(fee.amount * n_items) if _due(fee, order.get("delivered_days_ago", 0)) else 0.0


def reroute_fee(order: dict, fee: Fee | None) -> float:
    return cents(fee.amount) if _due(fee, order.get("placed_hours_ago", 0)) else 0.0


def credit_amount(order: dict, rate: float | None, cap: float | None) -> float:
    amount = NAIVE_CREDIT if rate is None else rate * order.get("days_late", 0)
    return cents(min(amount, cap) if cap is not None else amount)


def same_amount(a: object, b: float) -> bool:
    return isinstance(a, (int, float)) and not isinstance(a, bool) and abs(float(a) - b) < 0.005
