"""The built-in retail customer-service world."""

from __future__ import annotations

from components.worlds import PACKAGES
from components.worlds import packages as P
from components.worlds.base import materializer
from components.worlds.retail.facts import facts_of
from components.worlds.retail.rules import rules_of
from components.worlds.retail.tasks import FAMILIES, generate, gold_of, policy_text
from components.worlds.retail.tools import TOOLS

VERSION = 1
# write tool -> the args that name what it acts on (meta.json "targets"; generic code reads it from there);
# [] = the session's account (one per conversation)
TARGETS = {
    "cancel_pending_order": ["order_id"],
    "return_delivered_order_items": ["order_id"],
    "exchange_delivered_order_items": ["order_id"],
    "modify_pending_order_address": ["order_id"],
    "modify_user_address": [],
    "issue_store_credit": ["order_id"],
}
# the shipped packages' cards: card id -> the write whose rules it states
CARDS = {
    "cancel-reason": "cancel_pending_order",
    "refund-original-payment": "return_delivered_order_items",
    "exchange-available-variant": "exchange_delivered_order_items",
    "normalize-shipping-address": "modify_pending_order_address",
    "account-address": "modify_user_address",
    "late-delivery-credit": "issue_store_credit",
}


def packages(facts) -> dict[str, str]:
    """A variant's own `reference` and `all-skills` (relative path -> text)."""
    return P.render(facts, CARDS, PACKAGES)


materialize = materializer(
    "retail", VERSION, generate, FAMILIES, policy_text, TOOLS, TARGETS, rules_of, facts_of, packages, gold_of=gold_of
)
