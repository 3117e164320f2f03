"""What a diagnosis is made of, shared by the trace's findings (`diagnose`) and the outcome's (`outcomes`): a finding,
a write's target, the package's cards about a write and whether the corpus shows they help, and the owner a write
that went wrong gets from them. Nothing here reads a trace as a whole or a gold: the layers above do."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from components.codes import FindingKind, Owner
from components.memory.events import PRE_WRITE
from components.memory.package import MemoryPackage
from components.memory.strategies import bounce_codes
from components.runtime.confirm import Targets, identity
from components.runtime.trace import TraceStep


RULE_CARD = "{}-rule"  # the id of the E card written for a rule (meta.py); tells which rule such a card is about


@dataclass
class Finding:
    episode_id: str
    item_id: str
    step: int
    hash: str
    owner: str  # E | W | rho | C | none | unknown (cannot tell: reported, never patched)
    kind: str
    tool: str = "*"
    detail: str = ""
    opportunity: str = "present"
    patchability: str = "memory"
    extra: dict[str, Any] = field(default_factory=dict)
    rule_id: str = ""  # the rule a refusal was on ("" for every other finding)

    @property
    def signature(self) -> tuple[str, str, str, str]:
        return (self.owner, self.kind, self.tool, self.rule_id)


WriteTarget = tuple[tuple[str, str], ...]  # a write's identifying (arg, value) pairs: `write_target`
WriteKey = tuple[str, WriteTarget]  # a write target: (tool, its identifying pairs)


def write_target(tool: str, args: dict[str, Any], targets: Targets | None) -> WriteTarget:
    """A write's target: its identifying args per the benchmark's `targets` (the session alone when unlisted)."""
    return tuple((k, v) for k, v in identity(tool, args or {}, targets) if v is not None)


def rule_card_id(rule_id: str) -> str:
    """The id of the E card written for a rule: one card per rule, so two rules on the same write get two cards."""
    slug = "".join(ch if ch.isascii() and (ch.isalnum() or ch == "-") else "-" for ch in rule_id.lower()).strip("-")
    return RULE_CARD.format(slug or "unnamed")


def cards_about(package: MemoryPackage, tool: str, rule_id: str | None = None) -> list[str]:
    """The package's cards about a write (they name the tool in backticks); with `rule_id`, minus the cards written
    for another rule of that write (a hand-written card may be about any of its rules)."""
    mine = rule_card_id(rule_id) if rule_id else None
    return [
        c.id
        for c in package.cards.values()
        if f"`{tool}`" in c.body and (mine is None or c.id == mine or not c.id.endswith(RULE_CARD.format("")))
    ]


def keyed_elsewhere(package: MemoryPackage, cards: list[str], tool: str) -> bool:
    """Whether the package keys every one of `cards` (cards about write `tool`) on another tool than it: a trigger
    that names a tool, never this one. Such a card reaches the agent at the moments of that other tool (its intent,
    its pending work, its draft), never for this write: had it been in memory there, routing would have put it there
    (a routing fault, rho). A card with no trigger, or one keyed on no tool or on this one, says nothing of the kind."""
    triggers = [getattr(getattr(package.cards[c], "meta", None), "trigger", None) for c in cards]
    return bool(triggers) and all(t is not None and t.tool is not None and t.tool != tool for t in triggers)


def card_helps(tally: dict[bool, list[int]], pooled: list[int]) -> bool | None:
    """Whether turns with the card (tally[True]: 1 = right) come out right clearly more often than a reference
    measured from the same corpus: turns without it, else the corpus's pooled no-card turns, else zero. None: the card
    was never in memory there."""
    if not tally[True]:
        return None
    share = sum(tally[True]) / len(tally[True])
    if len(tally[False]) >= MIN_CONTRAST:
        return share >= sum(tally[False]) / len(tally[False]) + CARD_LIFT
    if len(pooled) >= MIN_CONTRAST:
        return share >= sum(pooled) / len(pooled) + CARD_LIFT
    return share > 0  # no turn anywhere without a card: a card whose turns never come out right is no help


CARD_LIFT, MIN_CONTRAST = 0.1, 5


def card_owner(
    cards: list[str], here: list[str], n_delivered: int, helps: bool | None, missing: str, states: bool | None = None
) -> tuple[str, str, str, str]:
    """(owner, kind, opportunity, patchability) of a write that went wrong, from the cards about its tool, those
    in memory at it (`here`, of `n_delivered`) and whether such a card helps (`card_helps`); `missing` is the kind
    for E with no card, or with a helpful card delivered alone. `states`: whether the cards' own text covers what
    went wrong at this write (`components.evolution.outcomes.card_states`), asked where none was in memory at it. It
    lacks what was wrong -> E (the knowledge is missing, whatever the routing; a card that helps elsewhere does not
    hold this write's rule); where the corpus never had such a card in memory at such a write (`helps` None), it
    covers it -> rho (routing kept it from the write), None -> unknown."""
    if not cards:
        return Owner.E, missing, "present", "memory"
    if helps is False:
        return Owner.E, FindingKind.INEFFECTIVE_CARD, "present", "memory"
    if states is False and not here:  # what went wrong here is in no card: routing one to it would not have helped
        return Owner.E, missing, "present", "memory"
    if helps is None and states is None:
        return Owner.UNKNOWN, FindingKind.CARD_UNOBSERVED, "unknown", "unknown"
    if here:
        owner, kind = (Owner.RHO, FindingKind.DILUTED_CARD) if n_delivered > len(here) else (Owner.E, missing)
        return owner, kind, "present", "memory"
    return Owner.RHO, FindingKind.CARD_NOT_FIRED, "present", "memory"


def own_bounce_rate(episodes: Iterable[list[TraceStep]], write_tools: frozenset[str]) -> float | None:
    """The share of an episode's distinct write drafts (tool and arguments) that a check bounced on its own criterion
    (a reason no `CheckCode` reads), over the drafts the pre-write checks judged; None when no check ever did so."""
    judged: dict[str, bool] = {}
    for steps in episodes:
        for s in steps:
            for c in s.checks:
                # a turn's first check ran on the draft it then redrafted (`first_draft`, when it did)
                draft = (
                    s.first_draft
                    if c.get("attempt") == 0 and "redraft" in s.fingerprint and s.first_draft
                    else s.action
                )
                if c.get("event") != PRE_WRITE or draft.get("tool") not in write_tools:
                    continue
                # once per episode: a draft retried after a bounce is judged the same way again
                key = json.dumps([s.episode_id, draft.get("tool"), draft.get("args")], sort_keys=True, default=str)
                own = not c.get("ok", True) and not bounce_codes(str(c.get("reason", "")))
                judged[key] = judged.get(key, False) or own
    bounced = sum(judged.values())
    return bounced / len(judged) if bounced else None
