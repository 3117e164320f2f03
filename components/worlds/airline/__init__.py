"""The built-in airline desk world: bookings, fare classes, changes and cancellations, baggage, delay
compensation, membership tiers. A second world of a different shape than retail: several rules on one write,
numeric formulas, and four rules that the written policy does not state (only refusal receipts and successful
episodes show them)."""

from __future__ import annotations

from components.worlds.airline.tasks import FAMILIES, generate, gold_of, policy_text
from components.worlds.airline.tools import TARGETS, TOOLS
from components.worlds.base import materializer

VERSION = 1

materialize = materializer("airline", VERSION, generate, FAMILIES, policy_text, TOOLS, TARGETS, gold_of=gold_of)
