"""The hidden ground-truth cause of a failed retail episode: E, W, rho, C or external.

This oracle has privileged knowledge no diagnoser gets: the task's requests, the facts behind each policy rule, and
which package cards state them. Its labels go to a sidecar file read only by diagnosis scoring.

For each way the episode fell short it finds the step where things went wrong, and keeps the earliest:
  - a write refused by policy and never redone right: E when no card stated the rule correctly in that turn's memory
    (none existed, or a wrong one was delivered); rho when a correct card existed but was not delivered then, or was
    delivered among irrelevant cards that diluted it;
  - a write executed without the customer's confirmation: C;
  - a request never written: C when the agent still listed it as pending when it finished (it declared victory with
    work it knew about), W when it had dropped it from its state (forgotten, wrongly settled, or never tracked);
  - a task impossible by construction: external.
"""

from __future__ import annotations

from components.memory.package import MemoryPackage
from components.runtime.trace import TraceStep
from components.worlds.base import Score, Task
from components.worlds.retail.facts import BY_TOOL
from components.worlds.retail.language import TOOL_OF, YES

E, W, RHO, C, EXTERNAL = "E", "W", "rho", "C", "external"


def _targets(step: TraceStep, tool: str, order_id: str | None) -> bool:
    a = step.action
    return a.get("tool") == tool and (order_id is None or a.get("args", {}).get("order_id") == order_id)


def _lists(step: TraceStep, tool: str, order_id: str | None) -> bool:
    return any(p.get("tool") == tool and (order_id is None or p.get("args", {}).get("order_id") == order_id)
               for p in step.proposal.get("pending", []))


def _knowledge_owner(step: TraceStep, tool: str, package: MemoryPackage) -> str:
    fact = BY_TOOL[tool]
    correct = fact.value
    said = {cid: fact.read(package.cards[cid].body) for cid in step.delivered if cid in package.cards}
    stating = [cid for cid, v in said.items() if v is not None]
    if any(said[c] == correct for c in stating):
        return RHO if len(step.delivered) > len(stating) else E
    if stating:
        return E  # a wrong card was followed
    if any(fact.read(c.body) == correct for c in package.cards.values()):
        return RHO  # the card existed but did not fire here
    return E


def hidden_cause(task: Task, steps: list[TraceStep], package: MemoryPackage, score: Score) -> str | None:
    if score.success:
        return None
    if not task.possible:
        return EXTERNAL
    faults: list[tuple[int, str]] = []
    confirmed = False
    for s in steps:  # the first write the customer had not confirmed
        if s.incoming.get("role") == "user":
            confirmed = s.incoming.get("text") == YES
        a, obs = s.action, s.observation
        if a.get("kind") == "message" and not s.blocked:
            confirmed = False
        if a.get("tool") in TOOL_OF.values() and not s.blocked and obs.get("ok"):
            if not confirmed:
                faults.append((s.step, C))
                break
            confirmed = False
    end = next((s for s in steps if s.action.get("kind") == "finish" and not s.blocked), steps[-1] if steps else None)
    for i, req in enumerate(task.requests, 1):
        if score.criteria.get(f"req{i}", 1.0) == 1.0:
            continue
        tool, oid = TOOL_OF[req["kind"]], req.get("order_id")
        attempts = [s for s in steps if _targets(s, tool, oid) and not s.blocked]
        refused = [s for s in attempts if s.observation.get("code") == "policy"]
        if refused:
            faults.append((refused[0].step, _knowledge_owner(refused[0], tool, package)))
        elif attempts:
            faults.append((attempts[0].step, E))  # executed but wrong: the agent's knowledge of the values
        elif end is not None:
            listed = [s.step for s in steps if s.step <= end.step and _lists(s, tool, oid)]
            if listed and listed[-1] == end.step:
                faults.append((end.step, C))  # still in its own state when it declared done
            else:  # dropped from its state: the step after it was last listed is where it went astray
                faults.append(((listed[-1] + 1) if listed else 0, W))
    if not faults:
        return W  # fell short without a visible fault: lost track of the task
    return min(faults)[1]
