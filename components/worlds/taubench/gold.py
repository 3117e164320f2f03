"""The `gold` agent: replays a tau2 task's gold actions through Ratchet's kernel and port, then says the task's
`communicate_info` and finishes. It is the instrument of the parity check against tau2's own grader (README "τ²-bench"),
not a model: it knows the task from the scripted user's first message (unique per task) and the benchmark it is given.

    make_model("gold", {"benchmark": "data/benchmarks/tau2-retail"})
    make_model("gold", {"benchmark": ..., "mutation": "drop_write" | "change_arg" | "extra_write"})

Mutations, each a deterministic edit of the gold plan: `drop_write` leaves out the first gold write; `change_arg` changes
the last argument of the first gold write (a string gets "-x" appended, a number +1, a list loses its last element);
`extra_write` adds, after the gold actions, the first write of the nearest following task (in benchmark order) whose
target the gold writes do not touch. A plan a mutation cannot edit (no gold write) is replayed unchanged, and
`applies(...)` says so.
"""

from __future__ import annotations

import json
from enum import Enum
from functools import lru_cache
from pathlib import Path

from components.models.base import ChatResult, ModelError
from components.runtime.types import FINISH_TOOL, ToolCall

NAME = "ratchet-gold"
EMPTY_PROPOSAL = json.dumps({"pending": [], "next_tool": None})


class Mutation(str, Enum):
    drop_write = "drop_write"
    change_arg = "change_arg"
    extra_write = "extra_write"


@lru_cache(maxsize=4)
def _plans(root: str, digest: str) -> dict[str, tuple[str, list[tuple[str, dict]], list[str], str]]:
    """First message -> (task id, gold actions, communicate_info, world) for every task of the benchmark."""
    from components.worlds import load_benchmark
    from components.worlds.taubench.world import CRITERION

    bench = load_benchmark(root)
    out: dict = {}
    for t in bench.tasks.values():
        crit = next(c for c in t.rubric if c.check == CRITERION)
        ec = crit.args["task"].get("evaluation_criteria") or {}
        actions = [(a["name"], dict(a.get("arguments") or {})) for a in ec.get("actions") or []]
        if t.first_message in out:
            raise ModelError(f"gold: two tasks open with the same message ({out[t.first_message][0]}, {t.id})")
        out[t.first_message] = (t.id, actions, list(ec.get("communicate_info") or []), bench.world)
    return out


def _writes(world: str) -> dict[str, list[str]]:
    from components.worlds.taubench import DOMAINS, TARGETS

    return TARGETS[DOMAINS[world]]


def _changed(v):
    if isinstance(v, bool):
        return not v
    if isinstance(v, (int, float)):
        return v + 1
    if isinstance(v, str):
        return v + "-x"
    if isinstance(v, list) and v:
        return v[:-1]
    return None


def mutate(plan: list[tuple[str, dict]], mutation: Mutation | None, world: str, task_id: str,
           others: list[tuple[str, list[tuple[str, dict]]]]) -> list[tuple[str, dict]] | None:
    """The gold plan under `mutation`; None when the mutation does not apply to this plan."""
    if mutation is None:
        return list(plan)
    writes = _writes(world)
    first = next((i for i, (name, _) in enumerate(plan) if name in writes), None)
    if mutation is Mutation.drop_write:
        return None if first is None else plan[:first] + plan[first + 1:]
    if mutation is Mutation.change_arg:
        if first is None or not plan[first][1]:
            return None
        name, args = plan[first]
        key = list(args)[-1]
        new = _changed(args[key])
        if new is None:
            return None
        return plan[:first] + [(name, {**args, key: new})] + plan[first + 1:]
    touched = {(n, json.dumps({k: a[k] for k in writes[n]}, sort_keys=True)) for n, a in plan if n in writes}
    ids = [tid for tid, _ in others]
    start = ids.index(task_id) + 1 if task_id in ids else 0
    for tid, other in others[start:] + others[:start]:
        if tid == task_id:
            continue
        w = next(((n, a) for n, a in other if n in writes), None)
        if w and writes[w[0]] and (w[0], json.dumps({k: w[1][k] for k in writes[w[0]]}, sort_keys=True)) not in touched:
            return list(plan) + [w]
    return None


class GoldAgent:
    name = NAME

    def __init__(self, benchmark: str | Path, mutation: Mutation | None = None):
        from components.worlds import load_benchmark

        self.root = str(Path(benchmark))
        self.digest = load_benchmark(self.root).digest
        self.mutation = mutation

    def plan(self, first_message: str) -> tuple[str, list[tuple[str, dict]] | None, list[str]]:
        plans = _plans(self.root, self.digest)
        if first_message not in plans:
            raise ModelError("gold: the first user message is no task's of this benchmark", "malformed")
        task_id, actions, communicate, world = plans[first_message]
        others = [(tid, acts) for tid, acts, _, _ in plans.values()]
        return task_id, mutate(actions, self.mutation, world, task_id, others), communicate

    def complete(self, messages: list[dict], *, tools: list[dict] | None, seed: int,
                 json_mode: bool | dict = False) -> ChatResult:
        if json_mode:  # the kernel's state proposal: the gold agent keeps no pending state of its own
            return ChatResult(content=EMPTY_PROPOSAL)
        first = next((m.get("content") or "" for m in messages if m.get("role") == "user"), "")
        _, plan, communicate = self.plan(first)
        plan = plan or []
        done = sum(1 for m in messages if m.get("role") == "assistant" for c in m.get("tool_calls") or []
                   if str(c.get("id", "")).startswith("gold-"))
        if done < len(plan):
            name, args = plan[done]
            return ChatResult(tool_calls=[ToolCall(id=f"gold-{done}", name=name, args=args)])
        text = communicate_text(communicate)
        said = any(m.get("role") == "assistant" and m.get("content") == text for m in messages)
        if communicate and not said:
            return ChatResult(content=text)
        return ChatResult(tool_calls=[ToolCall(id="done", name=FINISH_TOOL, args={"summary": "All requests handled."})])


def communicate_text(infos: list[str]) -> str:
    return "To confirm the details: " + "; ".join(infos) + "." if infos else ""
