"""The built-in airline desk world: bookings, fare classes, changes and cancellations, baggage, delay
compensation, membership tiers. A second world of a different shape than retail: several rules on one write,
numeric formulas, and four rules that the written policy does not state (only refusal receipts and successful
episodes show them)."""

from __future__ import annotations

from components.worlds import PACKAGES
from components.worlds import packages as P
from components.worlds.airline.facts import facts_of
from components.worlds.airline.rules import rules_of
from components.worlds.airline.tasks import FAMILIES, generate, gold_of, policy_text
from components.worlds.airline.tools import TARGETS, TOOLS
from components.worlds.base import materializer

VERSION = 1
# the shipped packages' cards: card id -> the write whose rules it states
CARDS = {
    "cancel-refund": "cancel_reservation",
    "change-fee": "change_flight",
    "checked-bags": "add_checked_bags",
    "delay-compensation": "issue_compensation",
    "upgrade-payment": "upgrade_cabin",
    "passenger-name": "update_passenger_name",
}


def packages(facts) -> dict[str, str]:
    """A variant's own `reference` and `all-skills` (relative path -> text)."""
    return P.render(facts, CARDS, PACKAGES / "airline")


materialize = materializer(
    "airline", VERSION, generate, FAMILIES, policy_text, TOOLS, TARGETS, rules_of, facts_of, packages, gold_of=gold_of
)
