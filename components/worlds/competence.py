"""Competence: what a careful agent does in a world, as the simulated agent needs it (docs/worlds.md, "Adding a world").

The simulated agent (`components.models.simulated`) is a generic fault engine: it decides WHEN the agent slips (a
fact followed or not, drift, a skipped confirmation, an early finish, recovery after a refusal, giving up). A world's
`Competence` says WHAT a careful agent does there: how it reads the customer's first message, how it opens the
session, which reads a request needs, and the write's arguments given what the agent believes about each rule.

A competence reads only the `View` (what the agent's messages say, parsed generically) and returns `Step`s; it never
draws a random number: every slip is the engine's. It is registered with its world (`WorldSpec.competence`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

Call = tuple[str, dict]  # (tool name, arguments)
Step = tuple[str, Call | None]  # (text to the user, tool call or None): one draft


@dataclass
class Request:
    """One unit of work the customer asked for."""

    kind: str  # the world's request kind
    tool: str  # the write that settles it
    target: dict[str, str] = field(default_factory=dict)  # its identifying args; {} = the account/session
    data: dict[str, Any] = field(default_factory=dict)  # whatever else the competence parsed (items, amounts...)

    @property
    def key(self) -> str:
        """Names the request in the engine's coins and in its state proposal."""
        return f"{self.kind}:{','.join(str(v) for v in self.target.values()) or 'account'}"

    def targets(self, args: dict) -> bool:
        """Whether a call with `args` acts on this request's target (any call of its tool does for {})."""
        return all(str(args.get(k)) == v for k, v in self.target.items())


def requests_from(parsed: list[dict[str, Any]], arg: str) -> list[Request]:
    """Requests from a world's parsed sentences: each a dict with `kind`, `tool`, the identifying `arg` when the
    request names its target (else it acts on the account), and whatever else as the request's data."""
    reqs = []
    for r in parsed:
        kind, tool, target = r.pop("kind"), r.pop("tool"), r.pop(arg, None)
        reqs.append(Request(kind, tool, {arg: target} if target else {}, r))
    return reqs


@runtime_checkable
class Fact(Protocol):
    """One rule the agent may or may not know. Several facts may share a write tool (interacting rules)."""

    id: str
    tool: str  # the write whose arguments the fact governs

    @property
    def value(self) -> object:
        """The truth: what a careful agent that knows the rule uses."""
        ...

    def read(self, text: str) -> object | None:
        """The value `text` (a card, the policy, a refusal's rule) instructs; None when it does not address the fact.
        Values are compared with == only (tuples, floats and strings are all fine)."""
        ...


@dataclass
class View:
    """Everything the agent can read in its messages, parsed without knowing the world (the competence reads it)."""

    policy: str  # the system prompt
    memory: str  # the harness's memory message
    cards: list[str]  # the cards in this turn's memory, as rendered
    board: list[tuple[str, dict[str, str], str]] | None  # ledger lines (tool, args, STATUS); None: no board rendered
    requests: list[Request]  # from `Competence.parse` of the first user message
    info: dict[str, Any]  # session info from `Competence.parse` (e.g. the customer's email)
    calls: list[tuple[dict, dict]]  # ({"name", "args"}, result) in order
    user_texts: list[str]
    assistant_texts: list[str]  # the agent's own messages to the user (drafts without a tool call)
    turn: int  # assistant turns so far
    feedback: str | None  # the reasons a bounced draft came back with
    mode: str  # draft | propose

    def results(self, tool: str) -> list[tuple[dict, dict]]:
        return [(c, r) for c, r in self.calls if c["name"] == tool]

    def latest(self, tool: str, arg: str, value: object) -> dict | None:
        """The latest result of `tool` called with `arg` == `value`, or None when it was not called so."""
        got = [r for c, r in self.results(tool) if c["args"].get(arg) == value]
        return got[-1] if got else None


Beliefs = dict[str, tuple[bool, object]]  # fact id -> (follows, believed value), for each fact on the request's tool


class Competence(Protocol):
    """How a careful agent acts in one world. Every method is pure in the View (no randomness, no state)."""

    facts: tuple[Fact, ...]  # every rule the engine may let the agent slip on
    writes: frozenset[str]  # the write tools that settle requests (an early finish follows one of these)

    def parse(self, first_message: str) -> tuple[list[Request], dict[str, Any]]:
        """The requests in the customer's first message, in order, and session info (e.g. an email)."""
        ...

    def opening(self, view: View, plan_only: bool = False) -> Step | None:
        """Session-level steps before any request (authenticate, load the account); None = ready. With plan_only,
        the step the agent names as its next intent in its state proposal (bookkeeping reads may be skipped)."""
        ...

    def prepare(self, view: View, request: Request) -> Step | None:
        """The next read this request needs before its write; None = ready to write."""
        ...

    def write(self, view: View, request: Request, beliefs: Beliefs) -> Step:
        """The write call given the agent's beliefs, or a read that a followed rule requires first."""
        ...

    def give_up(self, request: Request) -> str:
        """What the agent says when it abandons a request (the engine also reads it back to know it gave up)."""
        ...

    def summary(self, request: Request) -> str:
        """One line describing the write, for the confirmation."""
        ...
