"""One episode: a task, a memory package, a model and a seed, run turn by turn through the kernel."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from components.defaults import MAX_TURNS
from components.memory.package import MemoryPackage
from components.models.base import ChatModel, ModelError
from components.runtime.chat import ChatHarness
from components.runtime.kernel import Episode, run_turn
from components.runtime.protocol import CUSTOM, Protocol
from components.runtime.trace import TraceStep
from components.runtime.types import Usage
from components.worlds import Benchmark, world
from components.worlds.base import Environment


def episode_seed(item_id: str, seed: int) -> int:
    """The seed the model sees for (item, seed index): the seed map is a pure function, recorded with every run."""
    return int(hashlib.sha256(f"{item_id}#{seed}".encode()).hexdigest()[:8], 16)


@dataclass
class EpisodeResult:
    item_id: str
    seed: int
    score: float
    success: bool
    turns: int
    tokens_in: int
    tokens_out: int
    model_calls: int
    tool_calls: int
    error: str
    # what the simulated party's own model spent (an LLM user on a server: `Environment.party_usage`); 0 otherwise
    user_tokens_in: int = 0
    user_tokens_out: int = 0
    user_model_calls: int = 0
    criteria: dict[str, float] = field(default_factory=dict)
    steps: list[TraceStep] = field(default_factory=list)
    resumed: bool = False  # read back from a journal: finished (and paid for) by an earlier run
    # when each turn and phase ran (`Episode.timings`); not part of the result's value: two runs of an episode are
    # equal whatever the clock said. Empty when read back from a journal.
    timings: list[tuple[int, str, int, int]] = field(default_factory=list, compare=False)

    @property
    def episode_id(self) -> str:
        return f"{self.item_id}#{self.seed}"

    def row(self) -> dict[str, Any]:
        return {
            "item_id": self.item_id,
            "seed": self.seed,
            "score": self.score,
            "success": self.success,
            "turns": self.turns,
            "tokens_in": self.tokens_in,
            "tokens_out": self.tokens_out,
            "model_calls": self.model_calls,
            "tool_calls": self.tool_calls,
            "user_tokens_in": self.user_tokens_in,
            "user_tokens_out": self.user_tokens_out,
            "user_model_calls": self.user_model_calls,
            "error": self.error,
        }


def failed_step(ep: Episode, port: ChatHarness, e: ModelError) -> TraceStep:
    """The turn a model fault cut short, as a trace step: what it reacted to, the ledger, and the error."""
    transcript = port.transcript()
    state = ep.ledger.snapshot()
    return TraceStep(
        episode_id=ep.episode_id,
        step=len(ep.steps),
        incoming=transcript[-1].model_dump() if transcript else {},
        state_before=state,
        delivered=[],
        deliveries=[],
        proposal={},
        action={"kind": "error", "content": ""},
        checks=[],
        observation={"error": str(e), "kind": e.kind, **({"text": e.text} if e.text else {})},
        state_after=state,
        fingerprint=[f"error:{e.kind}"],
    ).sealed()


def party_usage(env: Environment) -> Usage:
    """What the episode's other party spent on a model of its own: `Environment.party_usage`, which a world whose
    user is simulated by a model provides (none: Usage(), a scripted party spends nothing)."""
    got = getattr(env, "party_usage", None)
    if got is None:
        return Usage()
    if not isinstance(got, Usage):
        raise TypeError(f"{type(env).__name__}.party_usage: must be a Usage, got {type(got).__name__}")
    return got


def protocol_of(env: Environment) -> Protocol:
    """How the episode runs (`components.runtime.protocol`): the environment's `protocol` (a world whose benchmark
    follows a reference orchestrator sets it), else Ratchet's own harness."""
    got: Protocol | None = getattr(env, "protocol", None)
    return CUSTOM if got is None else got


def turn_cap(protocol: Protocol, max_turns: int) -> int:
    """The turns an episode may take: `max_turns` under Ratchet's harness; under a reference protocol, whose own
    limits end the episode, a safety net far above them (turns whose drafts the harness blocked count no step)."""
    return max_turns if protocol.max_steps is None else SAFETY * protocol.max_steps


SAFETY = 4


def run_episode(
    package: MemoryPackage,
    bench: Benchmark,
    item_id: str,
    seed: int,
    model: ChatModel,
    max_turns: int = MAX_TURNS,
    sealed: bool = True,
) -> EpisodeResult:
    """`sealed=False`: the steps are not content-hashed (a counterfactual replay reads only the outcome).
    `max_turns` applies under Ratchet's harness; a reference protocol's own limits end its episodes (`turn_cap`)."""
    spec = world(bench.world)
    task = bench.tasks[item_id]
    env = spec.make_env(bench, task)
    protocol = protocol_of(env)
    port = ChatHarness(env, model, episode_seed(item_id, seed), targets=bench.targets, protocol=protocol)
    ep = Episode.start(f"{item_id}#{seed}", package, sealed=sealed)
    cap = turn_cap(protocol, max_turns)
    error = ""
    try:
        port.start()  # the user's first line: a user simulated by a model may fail here too
        while not port.ended and len(ep.steps) < cap:
            run_turn(ep, port)
    except ModelError as e:  # a model fault ends the episode as an error, never as a success
        error = f"model: {e}"
        ep.steps.append(failed_step(ep, port, e))
    score = env.score(port.transcript())
    ok = score.success and not error
    party = party_usage(env)
    result = EpisodeResult(
        item_id=item_id,
        seed=seed,
        score=0.0 if error else score.reward,
        success=ok,
        turns=len(ep.steps),
        tokens_in=port.usage.tokens_in,
        tokens_out=port.usage.tokens_out,
        model_calls=port.usage.calls,
        tool_calls=port.tool_calls,
        error=error,
        user_tokens_in=party.tokens_in,
        user_tokens_out=party.tokens_out,
        user_model_calls=party.calls,
        criteria=score.criteria,
        steps=ep.steps,
        timings=ep.timings,
    )
    return result
