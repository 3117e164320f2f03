"""The retail world's family-specific procedure knowledge, and the one grammar in which it can be read.

Each fact is stated in prose in the written policy, enforced by a tool (a violation returns a `policy` error receipt
that quotes the rule), and visible in successful episodes. `read(text)` reads a piece of text (a card, the policy,
an error receipt) into the value it *instructs*, or None when the text does not address the fact. The simulated agent
reads its context with it, so this module is also the definition of what the simulated agent understands. Nothing
else reads it: a diagnoser has only the policy, receipts and traces; the hidden causes come from replay, not from here.

The grammar (what the simulated agent understands; anything else is ignored, as if the card were not there):

  1. Scope. Only a paragraph or list item that names the fact's write tool in backticks addresses the fact
     (`cancel_pending_order`, `return_delivered_order_items`, `exchange_delivered_order_items`,
     `modify_pending_order_address`). A card that describes the rule without naming the tool this way is ignored.
  2. Clauses. The paragraph is split into clauses at `.`, `;`, `:`, `!`, `?` and at `, but` / `, while`. A clause
     instructs a value when it contains one of that fact's value phrases (below).
  3. Negation. A clause is negated when it contains `not`, `never`, `no`, `don't`/`do not`/`doesn't`, `cannot`,
     `avoid`, `instead of`, `rather than`, `other than` or `without` before the value phrase. A negated clause
     instructs the fact's opposite value ("never refund to the original payment method" reads as: refund to the
     account's method). Several clauses: the first one that instructs a value wins.
  4. Value phrases, per fact:
     - cancel_reason: a clause naming the `reason` (or "reason") with a modal (must, should, has to, only, exactly,
       one of, either, allowed, accepted) and quoted values ('no longer needed'): the quoted values are the allowed
       reasons; negated ("must not be 'no longer needed'"): pass the customer's own words.
     - refund_original: "original payment method", "payment method of the order", "order's `payment_method_id`",
       "method the order was paid with", "paid with" -> original; "gift card" -> gift card; "account's first/
       preferred/default method", "first method on the account" -> the account's first method. Opposites:
       original <-> account; gift card -> original.
     - exchange_available: "`available`", "availab(le|ility)", "in stock" -> check availability and fall back to the
       customer's alternative; negated -> ignore availability.
     - address_validated: "`validate_address`", "normaliz(e|ed)", "validat(e|ed)" -> validate first and pass the
       normalized fields; negated -> pass the customer's address as given.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

REASONS = ("no longer needed", "ordered by mistake")
VERBATIM = ("<customer's words>",)  # the negated cancel rule: pass the customer's sentence through

NEGATION = re.compile(r"\b(not|never|no|don't|do not|doesn't|does not|cannot|can't|avoid|instead of|rather than|"
                      r"other than|without)\b", re.I)
CLAUSE_SPLIT = re.compile(r"[.;:!?](?:\s+|$)|,\s+(?=but\b|while\b)")


def _paragraphs(text: str, tool: str) -> list[str]:
    """Paragraphs or list items that name `tool` in backticks (rule 1)."""
    parts = re.split(r"\n\s*\n|\n(?=\s*[-*] )", text)
    return [p for p in parts if f"`{tool}`" in p]


def _clauses(text: str, tool: str) -> list[str]:
    out = []
    for p in _paragraphs(text, tool):
        # a backticked name holds no clause boundary: `a.b` is one token
        out += [c for c in CLAUSE_SPLIT.split(" ".join(p.split())) if c and c.strip()]
    return out


def _negated(clause: str, at: int) -> bool:
    return bool(NEGATION.search(clause[:at]))


def _first(text: str, tool: str, phrases: dict[str, re.Pattern], opposite: dict[str, str]) -> str | None:
    """The value of the first clause that names one of the value phrases (rules 2-3)."""
    for clause in _clauses(text, tool):
        hits = [(m.start(), value) for value, pat in phrases.items() if (m := pat.search(clause))]
        if hits:
            at, value = min(hits)
            return opposite[value] if _negated(clause, at) else value
    return None


QUOTED = re.compile(r"['\"“‘]([a-z][a-z ]+?)['\"”’]")
MODAL = re.compile(r"\b(must|should|has to|have to|needs? to|only|exactly|one of|either|allowed|accepted)\b")


def _read_reason(text: str) -> tuple[str, ...] | None:
    for clause in _clauses(text, "cancel_pending_order"):
        low = clause.lower()
        if "reason" not in low or not MODAL.search(low):
            continue
        quoted = tuple(q.strip() for q in QUOTED.findall(low))
        if quoted:
            return VERBATIM if _negated(low, low.index(QUOTED.search(low).group(0))) else quoted
    return None


REFUND = {
    "original": re.compile(r"original payment method|payment method of the order|order's `?payment_method_id|"
                           r"method the order was paid with|paid with", re.I),
    "gift_card": re.compile(r"gift card", re.I),
    "account": re.compile(r"account's (first|preferred|default)|(first|preferred|default) (payment )?method "
                          r"(on|of) the account", re.I),
}


def _read_refund(text: str) -> str | None:
    return _first(text, "return_delivered_order_items", REFUND,
                  {"original": "account", "account": "original", "gift_card": "original"})


AVAILABLE = {"check_available": re.compile(r"`available`|availab(le|ility)|in stock", re.I)}


def _read_available(text: str) -> str | None:
    return _first(text, "exchange_delivered_order_items", AVAILABLE, {"check_available": "ignore_available"})


VALIDATE = {"validate": re.compile(r"`validate_address`|normaliz(e|ed)|validat(e|ed)", re.I)}


def _read_validate(text: str) -> str | None:
    return _first(text, "modify_pending_order_address", VALIDATE, {"validate": "raw"})


@dataclass(frozen=True)
class Fact:
    id: str
    tool: str  # the write whose arguments the fact governs
    statement: str  # how the written policy states it
    read: Callable[[str], object]

    @property
    def value(self) -> object:
        """The correct value: what the policy's own statement instructs."""
        return self.read(self.statement)


FACTS: tuple[Fact, ...] = (
    Fact(
        "cancel_reason",
        "cancel_pending_order",
        "- `cancel_pending_order` takes a `reason` that must be exactly 'no longer needed' or 'ordered by mistake'. "
        "Map the customer's own words onto one of these two values; any other reason is refused.",
        _read_reason,
    ),
    Fact(
        "refund_original",
        "return_delivered_order_items",
        "- `return_delivered_order_items` refunds only to the original payment method of the order: pass the "
        "`payment_method_id` that `get_order_details` shows for that order, not another method on the account.",
        _read_refund,
    ),
    Fact(
        "exchange_available",
        "exchange_delivered_order_items",
        "- `exchange_delivered_order_items` accepts only a new item whose variant is available: check `available` "
        "in `get_product_variants` and, when the customer's first choice is unavailable, use their stated alternative.",
        _read_available,
    ),
    Fact(
        "address_validated",
        "modify_pending_order_address",
        "- `modify_pending_order_address` accepts only a normalized address: call `validate_address` first and pass "
        "the normalized fields it returns, exactly.",
        _read_validate,
    ),
)

BY_TOOL: dict[str, Fact] = {f.tool: f for f in FACTS}
BY_ID: dict[str, Fact] = {f.id: f for f in FACTS}


def facts_read(text: str) -> dict[str, object]:
    """Every fact `text` addresses, with the value it instructs."""
    out = {}
    for f in FACTS:
        v = f.read(text)
        if v is not None:
            out[f.id] = v
    return out
