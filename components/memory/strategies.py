"""rho and C: the built-in deliverers and checkers, registered by name with typed options.

A deliverer decides what memory reaches the model at an event; a checker rules on a draft. Both only *propose*:
the kernel decides when they run (its phase order) and what a ruling does (one redraft, then block).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from string import Formatter
from typing import Annotated, Any

from pydantic import AfterValidator, Field

from components.codes import CheckCode
from components.memory.cards import Card, CardType
from components.memory.events import AGENT_DECLARES_DONE, DELIVERY_EVENTS, PRE_WRITE
from components.memory.ledger import Ledger
from components.registry import Registry
from components.runtime.confirm import acts_from_turns, covered
from components.runtime.types import CONFIRM_TOOL, Draft, Turn

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
    targets: dict[str, list[str]] = field(default_factory=dict)  # write tool -> identifying args (benchmark meta)


@dataclass(frozen=True)
class Verdict:
    ok: bool
    reason: str = ""
    details: dict[str, Any] = field(default_factory=dict)
    code: CheckCode | None = None  # why it bounced, as a code (the reason is its message, `BOUNCES[code]` filled in)


# what a deliverer's and a checker's factory build from their options: the callable the kernel runs at an event
Deliver = Callable[[DeliveryContext], Delivery]
Check = Callable[[CheckContext], Verdict]


# What a bounce says, per code. The reason a checker gives is its template filled in; a model reads the reason (the
# redraft's feedback), and the simulated agent reads it back to codes through these same templates (`bounce_codes`),
# so rewording a message here changes no behaviour.
BOUNCES: dict[CheckCode, str] = {
    CheckCode.PENDING_WORK: "cannot finish: no receipt yet for {items}",
    CheckCode.UNCONFIRMED: "`{tool}` needs the customer's confirmation first: call `{confirm}` with this tool and its "
    "arguments, and write only if it is granted",
}


def bounce(code: CheckCode, details: dict[str, Any] | None = None, **fields: str) -> Verdict:
    """A bounce with `code`, its reason the code's message with `fields` filled in."""
    return Verdict(False, BOUNCES[code].format(**fields), details or {}, code)


@cache
def _pattern(template: str) -> re.Pattern[str]:
    """A message template as a regex: its literal text, any text in place of each field (within one line)."""
    return re.compile(
        "".join(
            re.escape(text) + (".*?" if name is not None else "")
            for text, name, _spec, _conv in Formatter().parse(template)
        )
    )


def bounce_codes(feedback: str | None) -> frozenset[CheckCode]:
    """The codes of the bounces whose messages a redraft's feedback carries."""
    if not feedback:
        return frozenset()
    return frozenset(code for code, template in BOUNCES.items() if _pattern(template).search(feedback))


# -- deliverers -------------------------------------------------------------------------------------------


@DELIVERERS.register("state_reminder", events=DELIVERY_EVENTS)
def state_reminder(*, only_pending: bool = True) -> Deliver:
    """Render the ledger board as a note at this event."""

    def deliver(ctx: DeliveryContext) -> Delivery:
        return Delivery(notes=(ctx.ledger.render(only_pending=only_pending),))

    return deliver


@DELIVERERS.register("event_cards", events=DELIVERY_EVENTS, delivers_cards=True)
def event_cards(
    *, max_per_episode: Annotated[int, Field(ge=1)] | None = None, types: list[CardType] | None = None
) -> Deliver:
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
def all_cards(*, types: list[CardType] | None = None) -> Deliver:
    """Deliver every card at every firing, whatever its trigger: the all-skills baseline."""

    def deliver(ctx: DeliveryContext) -> Delivery:
        return Delivery(card_ids=tuple(c.id for c in ctx.cards.values() if types is None or c.meta.type in types))

    return deliver


# -- checkers ---------------------------------------------------------------------------------------------


@CHECKERS.register("completion_requires_receipts", events={AGENT_DECLARES_DONE})
def completion_requires_receipts(*, allow_blocked: bool = True) -> Check:
    """Bounce a declaration of completion while ledger entries are still pending (or blocked, if not allowed)."""

    def check(ctx: CheckContext) -> Verdict:
        open_entries = [
            e for e in ctx.ledger.entries if e.status == "pending" or (e.status == "blocked" and not allow_blocked)
        ]
        if not open_entries:
            return Verdict(True)
        items = "; ".join(
            f"{e.id} {e.tool} {' '.join(f'{k}={v}' for k, v in sorted(e.args.items()))}" for e in open_entries
        )
        return bounce(CheckCode.PENDING_WORK, {"open": [e.id for e in open_entries]}, items=items)

    return check


def _removed_affirmations(v: list[str] | None) -> None:
    # a loud load error, not accept-and-ignore: a manifest that set its own words expects them to count, and
    # silently dropping them would be a mechanism disabled without notice
    if v is not None:
        raise ValueError(
            "option removed: confirmation is the structured `confirm` tool event, not words in the "
            "user's reply; delete `affirmations`"
        )
    return None


@CHECKERS.register("confirm_before_write", events={PRE_WRITE})
def confirm_before_write(
    *,
    tools: list[str] | None = None,
    match_args: list[str] = [],  # noqa: B006 - frozen by the options model
    affirmations: Annotated[list[str] | None, AfterValidator(_removed_affirmations)] = None,
) -> Check:
    """Bounce a write unless a granted `confirm` covers it (`components.runtime.confirm.covered`): the latest
    confirmation since the last successful write, for the same tool and identifying args.

    `tools` limits the guarded writes; `match_args` names args the confirmation must match as well as the
    benchmark's identifying ones. `affirmations` (the old word list) is refused: confirmation is a structured event."""

    def check(ctx: CheckContext) -> Verdict:
        call = ctx.draft.tool_call
        if call is None or call.name not in (set(tools) if tools is not None else ctx.write_tools):
            return Verdict(True)
        if covered(acts_from_turns(ctx.transcript), call.name, call.args, ctx.targets, match_args):
            return Verdict(True)
        return bounce(CheckCode.UNCONFIRMED, tool=call.name, confirm=CONFIRM_TOOL)

    return check
