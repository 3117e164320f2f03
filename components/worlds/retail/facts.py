"""The retail world's family-specific procedure knowledge.

Each fact is stated in prose in the written policy, enforced by a tool (a violation returns a `policy` error receipt
that quotes the rule), and visible in successful episodes. `read(text)` is how a reader recognizes the fact in a
piece of text (a card, the policy, an error): it returns the value the text instructs, or None when the text does not
address the fact. The simulated agent uses it to read its context; the hidden-cause oracle uses it to tell whether a
package holds a card stating the fact. Nothing else reads it; a diagnoser has only the policy, receipts and traces.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

REASONS = ("no longer needed", "ordered by mistake")


def _paragraphs(text: str, tool: str) -> list[str]:
    """Paragraphs or list items that name `tool` in backticks."""
    parts = re.split(r"\n\s*\n|\n(?=\s*[-*] )", text)
    return [p for p in parts if f"`{tool}`" in p]


def _read_reason(text: str) -> tuple[str, ...] | None:
    """The allowed reasons: the quoted values of the sentence that says what the `reason` must be."""
    for p in _paragraphs(text, "cancel_pending_order"):
        for sentence in re.split(r"(?<=[.!?])\s+", p):
            if "reason" in sentence.lower() and "must be" in sentence.lower():
                quoted = tuple(q.strip().lower() for q in re.findall(r"['\"“‘]([a-z][a-z ]+?)['\"”’]", sentence))
                if quoted:
                    return quoted
    return None


def _read_refund(text: str) -> str | None:
    for p in _paragraphs(text, "return_delivered_order_items"):
        low = p.lower()
        if "original payment method" in low:
            return "original"
        if "gift card" in low and ("refund" in low or "payment" in low):
            return "gift_card"
    return None


def _read_available(text: str) -> str | None:
    for p in _paragraphs(text, "exchange_delivered_order_items"):
        low = p.lower()
        if "available" in low and "get_product_variants" in low:
            return "check_available"
    return None


def _read_validate(text: str) -> str | None:
    for p in _paragraphs(text, "modify_pending_order_address"):
        if "`validate_address`" in p:
            return "validate"
    return None


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
