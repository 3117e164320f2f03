"""The retail world's procedure knowledge: its thirteen rules (values from `rules.py`, the world's data), the one
grammar in which a text states them, and the formulas that compute the amounts they govern.

Each rule governs some arguments of one write (`fields`), is enforced by that write (in `explained` and `coded`
receipts a violation is a `policy` refusal citing the rule; in `silent` ones it goes through and only the rubric
fails) and is visible in successful episodes. Most are stated in the written policy; the `unstated` ones are not.
`read(text)` reads a piece of text (a card, the policy, a receipt's rule) into the value it *instructs*, or None
when the text does not address the rule. The simulated agent reads its context with it, so this module is also the
definition of what the simulated agent understands. The tools and the task generator compute the correct amounts
with the same formulas (`cancel_refund`, `return_refund`, ...) from the rules' true values, exactly
(`components.worlds.numbers`, cents rounded halves up); an agent computes them from the values it believes.

The grammar (what the simulated agent understands; anything else is ignored, as if the card were not there):

  1. Scope. Only a paragraph or list item that names the rule's write tool in backticks addresses the rule
     (`cancel_pending_order`, `return_delivered_order_items`, `exchange_delivered_order_items`,
     `modify_pending_order_address`, `modify_user_address`, `issue_store_credit`).
  2. Clauses. The paragraph is split into clauses at `.`, `;`, `:`, `!`, `?` (followed by a space or the end) and at
     `, but` / `, while`. A clause instructs a value when it contains one of that rule's value phrases (below).
  3. Negation. A clause is negated when it contains `not`, `never`, `no`, `don't`/`do not`/`doesn't`, `cannot`,
     `avoid`, `instead of`, `rather than`, `other than` or `without` before the value phrase. A negated clause
     instructs the rule's opposite value ("never refund to the original payment method" reads as: refund to the
     account's method; "there is no restocking fee" reads as: no fee). The first clause that instructs a value wins.
  4. Numbers: an integer, a decimal or p/q (12.5%, 100/3%). Thresholds in four directions
     (`components.worlds.rules.window_in`): "more than N" / "over" / "after" (>), "N or more" / "at least N" (>=),
     "under N" / "less than N" (<), "within N" / "up to N" / "N or less" (<=), in hours or days.
  5. Value phrases, per rule (on its tool):
     - cancel_reason: a clause naming the `reason` (or "reason") with a modal (must, should, has to, only, exactly,
       one of, either, allowed, accepted) and quoted values: the quoted values are the allowed reasons; negated
       ("must not be 'no longer needed'"): pass the customer's own words.
     - refund_original: "original payment method", "payment method of the order", "order's `payment_method_id`",
       "method the order was paid with", "paid with" -> original; "gift card" -> gift card; "account's first/
       preferred/default method", "first method on the account" -> the account's first method. Opposites:
       original <-> account; gift card -> original.
     - exchange_available: "`available`", "availab(le|ility)", "in stock" -> check availability and fall back to the
       customer's alternative; negated -> ignore availability.
     - address_validated, user_address_validated: "`validate_address`", "normaliz(e|ed)", "validat(e|ed)" ->
       validate first and pass the normalized fields; negated -> pass the customer's address as given.
     - Fees (value a `Fee`: an amount due when a window holds on an age; none: always): the clause naming the fee
       gives the amount (`N%` or `$N`, else the first one in its paragraph) and, with the threshold phrase it holds,
       when it is due; without one there, the first threshold phrase of the paragraph says when it is due, or, when
       that clause says the write is free (or "no fee", "full price"), when it is not; no phrase at all: always due.
       Negated -> no fee.
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
  6. A card item in the inferred form (`components.worlds.outcome_rules`) states a field's rule outright: the reason
     rule reads its allowed values, the address rules read "validate" from a field equal to the normalized address,
     and any other rule on the field is applied as written (a `Formula`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from fractions import Fraction
from functools import lru_cache
from typing import Any, Callable

from components.worlds.grammar import Fact, clauses, first, keyed, negated, on_tool, split
from components.worlds.grammar import facts_read as read_all
from components.worlds.numbers import q, rnd
from components.worlds.outcome_rules import with_outcomes
from components.worlds.retail.rules import OWN, REASON_OF, REASONS, RetailRules, statements
from components.worlds.rules import NO_FEE, Fee, Window, window_in

VERBATIM = ("<customer's words>",)  # the negated cancel rule: pass the customer's sentence through

QUOTED = re.compile(r"['\"“‘]([a-z][a-z ]+?)['\"”’]")
MODAL = re.compile(r"\b(must|should|has to|have to|needs? to|only|exactly|one of|either|allowed|accepted)\b")


def _read_reason(text: str) -> tuple[str, ...] | None:
    for clause in clauses(text, "cancel_pending_order"):
        low = clause.lower()
        if "reason" not in low or not MODAL.search(low):
            continue
        quoted = tuple(q_.strip() for q_ in QUOTED.findall(low))
        if quoted:
            return VERBATIM if negated(low, low.index(QUOTED.search(low).group(0))) else quoted
    return None


REFUND = {
    "original": re.compile(
        r"original payment method|payment method of the order|order's `?payment_method_id|"
        r"method the order was paid with|paid with",
        re.I,
    ),
    "gift_card": re.compile(r"gift card", re.I),
    "account": re.compile(
        r"account's (first|preferred|default)|(first|preferred|default) (payment )?method "
        r"(on|of) the account",
        re.I,
    ),
}


def _read_refund(text: str) -> str | None:
    return first(
        text,
        "return_delivered_order_items",
        REFUND,
        {"original": "account", "account": "original", "gift_card": "original"},
    )


AVAILABLE = {"check_available": re.compile(r"`available`|availab(le|ility)|in stock", re.I)}


def _read_available(text: str) -> str | None:
    return first(text, "exchange_delivered_order_items", AVAILABLE, {"check_available": "ignore_available"})


VALIDATE = {"validate": re.compile(r"`validate_address`|normaliz(e|ed)|validat(e|ed)", re.I)}


def _read_validate(tool: str) -> Callable[[str], str | None]:
    def read(text: str) -> str | None:
        return first(text, tool, VALIDATE, {"validate": "raw"})

    return read


# -- numbers: fees, bonuses, rates and caps --------------------------------------------------------------------

NUM = r"(\d+(?:\.\d+)?(?:/\d+)?)"
AMOUNT = {
    "pct": re.compile(NUM + r"\s*(?:%|percent\b)", re.I),
    "usd": re.compile(r"\$\s*" + NUM + "|" + NUM + r" dollars\b", re.I),
}
AGE = {"hours": "hours?", "days": "days?"}
FREE = re.compile(r"\bfree\b|\bno [\w-]* ?fee\b|\bfull (?:price|total)\b", re.I)
OPPOSITE = {">": "<=", "<=": ">", ">=": "<", "<": ">="}


def _number(pattern: re.Pattern, *texts: str) -> Fraction | None:
    for t in texts:
        m = pattern.search(t)
        if m:
            return q(next(g for g in m.groups() if g is not None))
    return None


def _when(clause: str, paragraph: str, age: str) -> Window | None:
    """When a fee is due: the threshold phrase of the fee's own clause; else the paragraph's first, turned round
    when its clause says the write is free there ("free within 14 days", or a bare "free for 14 days"); none:
    always."""
    got = window_in(clause, AGE[age])
    if got:
        return got[1]
    for c in split(paragraph):
        got = window_in(c, AGE[age])
        if got:
            _at, w, said = got
            if not FREE.search(c):
                return w
            return Window(op=OPPOSITE[w.op], value=w.value) if said else w  # a bare free period: due after it
    return None


def _read_fee(tool: str, key: str, unit: str, age: str) -> Callable[[str], Fee | None]:
    pat = re.compile(key, re.I)

    def read(text: str) -> Fee | None:
        for clause, para, neg in keyed(text, tool, pat):
            if neg:
                return NO_FEE
            amount = _number(AMOUNT[unit], clause, para)
            if amount is None:
                continue  # names the fee but not how much: says nothing
            return Fee(amount=amount, when=_when(clause, para, age))
        return None

    return read


def _read_amount(tool: str, key: str, unit: str, negated_value: object) -> Callable[[str], object]:
    pat = re.compile(key, re.I)

    def read(text: str) -> object:
        for clause, para, neg in keyed(text, tool, pat):
            if neg:
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


# -- the inferred form's values, where the rule is a choice the agent makes -------------------------------------------


def _one_of(field: str):
    def value(rules: dict):
        r = rules.get(field)
        return tuple(r.then.value) if r is not None and r.cond is None and r.then.kind == "one_of" else None

    return value


def _validated(rules: dict):
    hits = [r for r in rules.values() if r.cond is None and r.then.kind == "equal" and ".normalized." in r.then.path]
    return "validate" if hits else None


ADDRESS = ("address1", "city", "state", "zip")
# rule id -> (write, the arguments it governs, reader of the world's phrases, value of the inferred form or None)
READERS: dict[str, tuple[str, tuple[str, ...], Callable[[str], object], Callable | None]] = {
    "cancel_reason": ("cancel_pending_order", ("reason",), _read_reason, _one_of("reason")),
    "cancel_fee": (
        "cancel_pending_order",
        ("refund_amount",),
        _read_fee("cancel_pending_order", r"cancell?ation fee", "pct", "hours"),
        None,
    ),
    "refund_original": ("return_delivered_order_items", ("payment_method_id",), _read_refund, None),
    "restocking_fee": (
        "return_delivered_order_items",
        ("refund_amount",),
        _read_fee("return_delivered_order_items", r"restocking fee", "pct", "days"),
        None,
    ),
    "gift_card_bonus": (
        "return_delivered_order_items",
        ("refund_amount",),
        _read_amount("return_delivered_order_items", r"\bbonus\b", "pct", Fraction(0)),
        None,
    ),
    "exchange_available": ("exchange_delivered_order_items", ("new_item_ids",), _read_available, None),
    "exchange_fee": (
        "exchange_delivered_order_items",
        ("exchange_fee",),
        _read_fee("exchange_delivered_order_items", r"exchange[ _]fee", "usd", "days"),
        None,
    ),
    "address_validated": (
        "modify_pending_order_address",
        ADDRESS,
        _read_validate("modify_pending_order_address"),
        _validated,
    ),
    "reroute_fee": (
        "modify_pending_order_address",
        ("reroute_fee",),
        _read_fee("modify_pending_order_address", r"re-?rout(?:e|ing)[ _]fee", "usd", "hours"),
        None,
    ),
    "user_address_validated": ("modify_user_address", ADDRESS, _read_validate("modify_user_address"), _validated),
    "credit_rate": (
        "issue_store_credit",
        ("amount",),
        _read_amount("issue_store_credit", r"(?:for each|per|a) day late", "usd", Fraction(0)),
        None,
    ),
    "credit_cap": (
        "issue_store_credit",
        ("amount",),
        _read_amount("issue_store_credit", r"\bcap(?:ped)?\b|\bmaximum\b|\bat most\b", "usd", math.inf),
        None,
    ),
    "credit_gift_card": ("issue_store_credit", ("payment_method_id",), _read_credit_to, None),
}


def _truth(rules: RetailRules, fid: str) -> object:
    v = getattr(rules, fid)
    if fid == "cancel_reason":
        return tuple(v.allowed)
    if fid == "credit_cap" and v is None:
        return math.inf
    return v


@lru_cache(maxsize=32)  # every episode's tools read them: built once per benchmark's rules
def facts_of(rules: RetailRules = OWN) -> Mapping[str, Fact]:
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
ON_TOOL: dict[str, tuple[Fact, ...]] = on_tool(FACTS)
# the first fact on each write (the one each write had before the world grew); kept for callers that know one per tool
BY_TOOL: dict[str, Fact] = {tool: fs[0] for tool, fs in ON_TOOL.items()}


def facts_read(text: str) -> dict[str, object]:
    """Every fact `text` addresses, with the value it instructs."""
    return read_all(FACTS, text)


def reason_of(phrase: str) -> str | None:
    """The reason a customer's words mean (the world's language), or None."""
    return REASON_OF.get(phrase)


# -- the formulas: one home for the tools (true values), the task generator (truth) and the agent (beliefs) ---------
# A value of None is the rule not known: the naive agent's default (no fee, no bonus, no cap, a flat courtesy credit).

NAIVE_CREDIT = Fraction(10)  # what an agent that does not know the per-day rate offers for a late delivery


def _due(fee: object, age: Any) -> bool:
    return isinstance(fee, Fee) and fee.due(age)


def cancel_refund(order: dict, fee: Fee | None) -> float:
    total = sum((q(i["price"]) for i in order["items"]), Fraction(0))
    if _due(fee, order.get("placed_hours_ago", 0)):
        total *= 1 - fee.amount / 100
    return float(rnd(total))


def return_refund(order: dict, item_ids: list[str], fee: Fee | None, bonus: object, to_gift_card: bool) -> float:
    price = sum((q(i["price"]) for i in order["items"] if i["item_id"] in item_ids), Fraction(0))
    if _due(fee, order.get("delivered_days_ago", 0)):
        price *= 1 - fee.amount / 100
    if to_gift_card and bonus:
        price = rnd(price) * (1 + q(bonus) / 100)
    return float(rnd(price))


def exchange_fee(order: dict, n_items: int, fee: Fee | None) -> float:
    return float(rnd(fee.amount * n_items)) if _due(fee, order.get("delivered_days_ago", 0)) else 0.0


def reroute_fee(order: dict, fee: Fee | None) -> float:
    return float(rnd(fee.amount)) if _due(fee, order.get("placed_hours_ago", 0)) else 0.0


def credit_amount(order: dict, rate: object, cap: object) -> float:
    amount = NAIVE_CREDIT if rate is None else q(rate) * order.get("days_late", 0)
    if cap is not None and not (isinstance(cap, float) and math.isinf(cap)):
        amount = min(amount, q(cap))
    return float(rnd(amount))


def same_amount(a: object, b: float) -> bool:
    return isinstance(a, (int, float)) and not isinstance(a, bool) and abs(float(a) - b) < 0.005


__all__ = [
    "BY_ID",
    "BY_TOOL",
    "FACTS",
    "Fee",
    "NO_FEE",
    "ON_TOOL",
    "REASONS",
    "VERBATIM",
    "cancel_refund",
    "credit_amount",
    "exchange_fee",
    "facts_of",
    "facts_read",
    "reason_of",
    "return_refund",
    "reroute_fee",
    "same_amount",
]
