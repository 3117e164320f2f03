"""The invariant turn kernel. Every turn runs the same phases in the same order:

    ground -> deliver@turn_start -> propose state -> deliver@intent_recorded -> draft
           -> check@draft_ready|agent_declares_done -> review@pre_write -> commit -> trace

A port that asks the model for no state (`port.proposes` false: a benchmark's reference protocol) drafts first and
takes the draft's tool as the intent; the cards delivered at intent_recorded for it earn one redraft.

The order is engine law; a package chooses which strategies run at each event but cannot reorder the phases.
Strategies only propose: a delivery adds memory, a checker's bounce earns at most one redraft per turn, and a draft
still bounced after that is blocked (never executed; its synthetic result can never ground W). Only genuine receipts,
grounded in phase 1, settle the ledger (see `components.memory.ledger`).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar

from components.memory.events import AGENT_DECLARES_DONE, DRAFT_READY, INTENT_RECORDED, PRE_WRITE, TURN_START
from components.memory.ledger import Ledger
from components.memory.package import MemoryPackage
from components.memory.strategies import CheckContext, DeliveryContext
from components.runtime.port import HarnessPort
from components.runtime.trace import TraceStep
from components.runtime.types import Draft, Proposal


# the phases a turn's timings name (components.tracking.mlflow_traces draws them as a trace's spans)
TURN, MEMORY, MODEL, CHECKS, TOOL = "turn", "memory delivered", "model call", "checker verdicts", "tool call"


@dataclass
class Episode:
    """The kernel's state across one episode's turns."""

    episode_id: str
    package: MemoryPackage
    ledger: Ledger
    delivered_counts: Counter[str] = field(default_factory=Counter)
    steps: list[TraceStep] = field(default_factory=list)
    sealed: bool = True  # content-hash each step; False only for a replay whose trace is discarded (a counterfactual)
    # when each turn and its phases ran: (step, phase, start ns, end ns), wall clock. Kept beside the steps, never in
    # them: a step's content (its hash, the traces table) is the same on every run; only the clock differs
    timings: list[tuple[int, str, int, int]] = field(default_factory=list)

    @classmethod
    def start(cls, episode_id: str, package: MemoryPackage, sealed: bool = True) -> Episode:
        return cls(episode_id, package, Ledger(package.wm), sealed=sealed)


P = ParamSpec("P")
T = TypeVar("T")


def _timed(spans: list[tuple[str, int, int]], phase: str, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    start = time.time_ns()
    try:
        return fn(*args, **kwargs)
    finally:
        spans.append((phase, start, time.time_ns()))


def run_turn(ep: Episode, port: HarnessPort) -> TraceStep:
    ledger = ep.ledger
    started = time.time_ns()
    spans: list[tuple[str, int, int]] = []
    turn = _TurnMemory(ep)

    # 1. ground: real receipts from the last actions settle ledger entries
    for entry_id, status in ledger.settle(port.receipts()):
        turn.fingerprint.append(f"ground:{entry_id}:{status}")
    state_before = ledger.snapshot()
    transcript = port.transcript()
    incoming = transcript[-1].model_dump() if transcript else {}

    # 2. deliver at turn_start
    _timed(spans, MEMORY, turn.deliver, TURN_START, frozenset(e.tool for e in ledger.pending()))

    first_draft, blocked = None, None
    if port.proposes:
        # 3. the model proposes pending state; settled entries stay, stale pending ones move to history
        proposal = _timed(spans, MODEL, port.propose, turn.memory())
        applied = ledger.apply_proposal(proposal)
        turn.fingerprint += [f"ledger:add:{e}" for e in applied.added] + [f"ledger:retire:{e}" for e in applied.retired]
        if applied.overflow:
            turn.fingerprint.append(f"ledger:overflow:{applied.overflow}")

        # 4. deliver at intent_recorded
        _timed(
            spans,
            MEMORY,
            turn.deliver,
            INTENT_RECORDED,
            frozenset({proposal.next_tool}) if proposal.next_tool else frozenset(),
        )

        # 5. draft
        draft = _timed(spans, MODEL, port.draft, turn.memory())
    else:
        # 3-5 where the port asks for no state (a reference protocol): the draft's own tool is the intent; the
        # cards it calls up at intent_recorded arrive with one redraft (the draft before them is `first_draft`)
        draft = _timed(spans, MODEL, port.draft, turn.memory())
        proposal = Proposal(next_tool=draft.tool_call.name if draft.tool_call else None)
        if proposal.next_tool and _timed(spans, MEMORY, turn.deliver, INTENT_RECORDED, frozenset({proposal.next_tool})):
            first_draft = draft
            turn.fingerprint.append("redraft:intent")
            draft = _timed(spans, MODEL, port.draft, turn.memory())

    # 6-7. checkers, then pre-write review; one redraft at most, then block
    for attempt in (0, 1):
        reasons = _timed(spans, CHECKS, turn.review, draft, port, attempt)
        if not reasons:
            break
        if attempt == 0:
            first_draft = draft
            turn.fingerprint.append("redraft")
            draft = _timed(spans, MODEL, port.draft, turn.memory(), feedback="\n".join(reasons))
        else:
            blocked = "; ".join(reasons)
            turn.fingerprint.append("block")

    # 8. commit the action; append the trace step
    observation = _timed(spans, TOOL, port.commit, draft, blocked)
    # built by this function from typed values every turn: constructed without re-validating them
    step = TraceStep.model_construct(
        episode_id=ep.episode_id,
        step=len(ep.steps),
        incoming=incoming,
        state_before=state_before,
        delivered=turn.card_ids,
        deliveries=turn.firings,
        proposal=proposal.model_dump(),
        first_draft=_draft(first_draft) if first_draft else None,
        action=_draft(draft),
        checks=turn.checks,
        blocked=blocked,
        observation=observation,
        state_after=ledger.snapshot(),
        fingerprint=turn.fingerprint,
    )
    if ep.sealed:
        step = step.sealed()
    ep.steps.append(step)
    ep.timings += [(step.step, TURN, started, time.time_ns())] + [(step.step, *span) for span in spans]
    return step


def _draft(d: Draft) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": d.kind, "content": d.content}
    if d.tool_call:
        out["tool"] = d.tool_call.name
        out["args"] = d.tool_call.args
    return out


class _TurnMemory:
    """What reaches the model this turn: the board (if W renders it), deliverer notes, and delivered cards."""

    def __init__(self, ep: Episode):
        self.ep = ep
        self.card_ids: list[str] = []
        self.notes: list[str] = []
        self.firings: list[dict[str, Any]] = []  # TraceStep.deliveries: event, strategy, cards, notes (a count)
        self.checks: list[dict[str, Any]] = []  # TraceStep.checks: strategy, event, ok, reason, attempt
        self.fingerprint: list[str] = ["board"] if ep.package.wm.board else []

    def deliver(self, event: str, tools: frozenset[str]) -> list[str]:
        new: list[str] = []
        for b in self.ep.package.delivery:
            if b.spec.at != event:
                continue
            ctx = DeliveryContext(event, tools, self.ep.ledger, self.ep.package.cards, self.ep.delivered_counts)
            out = b.run(ctx)
            cards = [c for c in out.card_ids if c not in self.card_ids and c not in new]
            for c in cards:
                self.ep.delivered_counts[c] += 1
                self.fingerprint.append(f"deliver:{c}@{event}")
            if out.notes:
                self.fingerprint.append(f"note:{b.label}")
            new += cards
            self.notes += list(out.notes)
            if cards or out.notes:
                self.firings.append({"event": event, "strategy": b.spec.use, "cards": cards, "notes": len(out.notes)})
        self.card_ids += new
        return new

    def memory(self) -> str:
        parts = [self.ep.ledger.render()] if self.ep.package.wm.board else []
        parts += self.notes
        parts += [self.ep.package.cards[c].render() for c in self.card_ids]
        return "\n\n".join(parts)

    def review(self, draft: Draft, port: HarnessPort, attempt: int) -> list[str]:
        call = draft.tool_call
        events = [DRAFT_READY]
        if draft.kind == "finish":
            events.append(AGENT_DECLARES_DONE)
        if call is not None and call.name in port.write_tools:
            events.append(PRE_WRITE)
        reasons: list[str] = []
        for event in events:
            if event == PRE_WRITE and call is not None:  # (pre_write is an event only for a drafted write)
                cards = self.deliver(PRE_WRITE, frozenset({call.name}))
                if cards:  # a card arriving at the write boundary bounces the draft so the model can use it
                    reasons.append(f"before `{call.name}`, read the delivered card(s): {', '.join(cards)}")
                    self.fingerprint.append("bounce:pre_write:cards")
            transcript = port.transcript() if any(b.spec.at == event for b in self.ep.package.checkers) else []
            for b in self.ep.package.checkers:
                if b.spec.at != event:
                    continue
                v = b.run(CheckContext(event, draft, self.ep.ledger, transcript, port.write_tools, port.targets))
                self.checks.append(
                    {"strategy": b.spec.use, "event": event, "ok": v.ok, "reason": v.reason, "attempt": attempt}
                )
                if not v.ok:
                    reasons.append(v.reason)
                    self.fingerprint.append(f"check:{b.label}:bounce")
        return reasons
