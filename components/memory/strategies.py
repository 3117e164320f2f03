"""rho and C: the built-in deliverers and checkers, registered by name with typed options.

A deliverer decides what memory reaches the model at an event; a checker rules on a draft. Both only *propose*:
the kernel decides when they run (its phase order) and what a ruling does (one redraft, then block).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Annotated

from pydantic import Field

from components.memory.cards import Card, CardType
from components.memory.events import AGENT_DECLARES_DONE, DELIVERY_EVENTS, PRE_WRITE
from components.memory.ledger import Ledger
from components.registry import Registry
from components.runtime.types import Draft, Turn

DELIVERERS = Registry("deliverer")
CHECKERS = Registry("checker")


@dataclass
class DeliveryContext:
    event: str
    tools: frozenset[str]  # the tools this event concerns (pending work, the intended call, the drafted write)
    ledger: Ledger
    cards: dict[str, Card]
    delivered_counts: dict[str, int]  # per card, this episode


@dataclass(frozen=True)
class Delivery:
    card_ids: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


@dataclass
class CheckContext:
    event: str
    draft: Draft
    ledger: Ledger
    transcript: list[Turn]
    write_tools: frozenset[str]


@dataclass(frozen=True)
class Verdict:
    ok: bool
    reason: str = ""
    details: dict = field(default_factory=dict)


# -- deliverers -------------------------------------------------------------------------------------------


@DELIVERERS.register("state_reminder", events=DELIVERY_EVENTS)
def state_reminder(*, only_pending: bool = True):
    """Render the ledger board as a note at this event."""

    def deliver(ctx: DeliveryContext) -> Delivery:
        return Delivery(notes=(ctx.ledger.render(only_pending=only_pending),))

    return deliver


@DELIVERERS.register("event_cards", events=DELIVERY_EVENTS, delivers_cards=True)
def event_cards(*, max_per_episode: Annotated[int, Field(ge=1)] | None = None, types: list[CardType] | None = None):
    """Deliver the cards whose trigger names this event (and, if it names a tool, one of the event's tools)."""

    def deliver(ctx: DeliveryContext) -> Delivery:
        out = []
        for card in ctx.cards.values():
            t = card.meta.trigger
            if t is None or t.event != ctx.event or (t.tool is not None and t.tool not in ctx.tools):
                continue
            if types is not None and card.meta.type not in types:
                continue
            if max_per_episode is not None and ctx.delivered_counts.get(card.id, 0) >= max_per_episode:
                continue
            out.append(card.id)
        return Delivery(card_ids=tuple(out))

    return deliver


@DELIVERERS.register("all_cards", events=DELIVERY_EVENTS, delivers_cards=True, ignores_triggers=True)
def all_cards(*, types: list[CardType] | None = None):
    """Deliver every card at every firing, whatever its trigger: the all-skills baseline."""

    def deliver(ctx: DeliveryContext) -> Delivery:
        return Delivery(card_ids=tuple(c.id for c in ctx.cards.values() if types is None or c.meta.type in types))

    return deliver


# -- checkers ---------------------------------------------------------------------------------------------


@CHECKERS.register("completion_requires_receipts", events={AGENT_DECLARES_DONE})
def completion_requires_receipts(*, allow_blocked: bool = True):
    """Bounce a declaration of completion while ledger entries are still pending (or blocked, if not allowed)."""

    def check(ctx: CheckContext) -> Verdict:
        open_entries = [e for e in ctx.ledger.entries if e.status == "pending" or (e.status == "blocked" and not allow_blocked)]
        if not open_entries:
            return Verdict(True)
        items = "; ".join(f"{e.id} {e.tool} {' '.join(f'{k}={v}' for k, v in sorted(e.args.items()))}" for e in open_entries)
        return Verdict(False, f"cannot finish: no receipt yet for {items}", {"open": [e.id for e in open_entries]})

    return check


@CHECKERS.register("confirm_before_write", events={PRE_WRITE})
def confirm_before_write(
    *,
    tools: list[str] | None = None,
    affirmations: list[str] = ["yes", "confirm", "go ahead", "proceed"],  # noqa: B006 - frozen by the options model
    match_args: list[str] = [],  # noqa: B006
):
    """Bounce a write unless the user's latest message explicitly confirms it, with no write since.

    With `match_args`, the assistant's question just before the confirmation must name those arguments' values."""
    words = [re.compile(rf"\b{re.escape(a.lower())}\b") for a in affirmations]
    refusal = re.compile(r"\b(no|not|don'?t|do not|never|stop|wait|cancel that)\b|n't\b")

    def check(ctx: CheckContext) -> Verdict:
        call = ctx.draft.tool_call
        if call is None or call.name not in (set(tools) if tools is not None else ctx.write_tools):
            return Verdict(True)
        question = None
        for i in range(len(ctx.transcript) - 1, -1, -1):
            turn = ctx.transcript[i]
            if turn.role == "tool":
                if turn.write and turn.ok:
                    break  # a confirmation covers one write
                continue
            if turn.role == "user":
                said = turn.text.lower()
                if any(w.search(said) for w in words) and not refusal.search(said):
                    asked = [t for t in ctx.transcript[:i] if t.role == "assistant" and t.tool is None]
                    question = asked[-1].text if asked else ""
                break
            if turn.role == "assistant" and turn.tool is None:
                break  # the agent spoke after the user: no fresh confirmation
        if question is None:
            return Verdict(False, f"`{call.name}` needs the user's explicit confirmation (yes) of this action first")
        missing = [k for k in match_args if k in call.args
                   and not re.search(rf"(?<![\w#]){re.escape(str(call.args[k]))}(?!\w)", question)]
        if missing:
            return Verdict(False, f"the user confirmed a different action: the question did not name {', '.join(missing)}")
        return Verdict(True)

    return check
