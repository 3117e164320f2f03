"""The `gold` agent: replays a tau2 task's gold actions through Ratchet's kernel and port, then says the task's
`communicate_info` and finishes. It is the instrument of the parity check against tau2's own grader (docs/tau2.md),
not a model: it knows the task from the scripted user's first message (unique per task) and the benchmark it is given.

    make_model("gold", {"benchmark": "data/benchmarks/tau2-retail"})
    make_model("gold", {"benchmark": ..., "mutation": "drop_write" | "change_arg" | "extra_write"})

The tau2 world registers it as a model through the `ratchet.models` entry point (pyproject.toml): `model` below.

Mutations, each a deterministic edit of the gold plan: `drop_write` leaves out the first gold write that tau2 carries
out (some golds hold a write tau2's own tool refuses, which changes nothing: found by replaying the gold in a scratch
tau2 environment) and that no later gold write of the same tool on the same target overwrites; `change_arg` changes that
write's last argument (a string gets "-x" appended, a number +1, a list loses its last element); `extra_write` adds an unrequested write on the customer's account that tau2 carries out for
any existing customer (`EXTRA`: retail changes the account address, airline sends a certificate), after the gold
actions but before a transfer to a human (which ends the call). A plan that `drop_write` or `change_arg` cannot edit
(no gold write that tau2 carries out) is not played: `plan` returns None for it.
"""

from __future__ import annotations

import json
from enum import Enum
from functools import lru_cache
from pathlib import Path
from typing import Literal

from components.models.base import ChatResult, ModelError
from components.runtime.types import FINISH_TOOL, ToolCall

NAME = "ratchet-gold"
TRANSFER = "transfer_to_human_agents"  # ends the call (`Tau2Env.terminal_tools`)
EMPTY_PROPOSAL = json.dumps({"pending": [], "next_tool": None})
CLOSING = "Is there anything else I can help you with?"


class Mutation(str, Enum):
    drop_write = "drop_write"
    change_arg = "change_arg"
    extra_write = "extra_write"


# the `extra_write` mutation's write, given the customer's user id: one tau2 refuses only for an unknown user
EXTRA = {
    "retail": lambda user: (
        "modify_user_address",
        {
            "user_id": user,
            "address1": "1 Extra Street",
            "address2": "",
            "city": "Springfield",
            "state": "IL",
            "country": "USA",
            "zip": "62701",
        },
    ),
    "airline": lambda user: ("send_certificate", {"user_id": user, "amount": 100}),
}


@lru_cache(maxsize=4)
def _plans(root: str, digest: str) -> dict[str, tuple[str, list[tuple[str, dict]], list[str], str, str]]:
    """First message -> (task id, gold actions, communicate_info, world, customer) for every task of the benchmark;
    the customer is the user id the gold actions name, else the database's first user."""
    from components.worlds import load_benchmark
    from components.worlds.taubench.world import CRITERION

    bench = load_benchmark(root)
    anyone = next(iter(bench.db.get("users") or {}), "")
    out: dict = {}
    for t in bench.tasks.values():
        crit = next(c for c in t.rubric if c.check == CRITERION)
        ec = crit.args["task"].get("evaluation_criteria") or {}
        actions = [(a["name"], dict(a.get("arguments") or {})) for a in ec.get("actions") or []]
        if t.first_message in out:
            raise ModelError(f"gold: two tasks open with the same message ({out[t.first_message][0]}, {t.id})")
        out[t.first_message] = (t.id, actions, list(ec.get("communicate_info") or []), bench.world, t.user_id or anyone)
    return out


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


def mutate(
    plan: list[tuple[str, dict]], mutation: Mutation | None, world: str, user: str, carried: list[bool] | None = None
) -> list[tuple[str, dict]] | None:
    """The gold plan under `mutation`; None when the mutation does not apply to this plan. `carried[i]`: tau2 carries
    out action i of the gold (default: every action)."""
    from components.worlds.taubench import DOMAINS, TARGETS

    if mutation is None:
        return list(plan)
    if mutation is Mutation.extra_write:
        end = next((i for i, (name, _) in enumerate(plan) if name == TRANSFER), len(plan))
        return plan[:end] + [EXTRA[DOMAINS[world]](user)] + plan[end:]
    writes = TARGETS[DOMAINS[world]]
    carried = carried or [True] * len(plan)
    # the first write tau2 carries out that no later gold write of the same tool on the same target overwrites
    # (dropping or changing an overwritten write leaves the final database as gold: retail-22 sets the account's
    # address twice)
    key = lambda name, args: (name, tuple(str(args.get(a)) for a in writes.get(name, [])))  # noqa: E731
    first = next(
        (
            i
            for i, (name, args) in enumerate(plan)
            if name in writes and carried[i] and key(name, args) not in {key(n, a) for n, a in plan[i + 1 :]}
        ),
        None,
    )
    if first is None:
        return None
    if mutation is Mutation.drop_write:
        return plan[:first] + plan[first + 1 :]
    name, args = plan[first]
    new = _changed(args[list(args)[-1]]) if args else None
    if new is None:
        return None
    return plan[:first] + [(name, {**args, list(args)[-1]: new})] + plan[first + 1 :]


@lru_cache(maxsize=256)
def _carried(root: str, digest: str, first_message: str) -> tuple[bool, ...]:
    """Which of a task's gold actions tau2 carries out: the gold replayed in a scratch tau2 environment."""
    from components.runtime.types import ToolCall as Call
    from components.worlds import load_benchmark, world
    from components.worlds.taubench.world import Tau2Env

    bench = load_benchmark(root)
    task_id, actions, _, _, _ = _plans(root, digest)[first_message]
    env = world(bench.world).make_env(bench, bench.tasks[task_id])
    assert isinstance(env, Tau2Env)
    return tuple(env.call(Call(id=str(i), name=n, args=a)).ok for i, (n, a) in enumerate(actions))


class GoldAgent:
    name = NAME

    def __init__(self, benchmark: str | Path, mutation: Mutation | None = None):
        from components.errors import InputError
        from components.worlds import load_benchmark
        from components.worlds.taubench import DOMAINS

        self.root = str(Path(benchmark))
        bench = load_benchmark(self.root)
        if bench.world not in DOMAINS:  # its tasks carry no tau2 gold to replay
            raise InputError(
                f"--model: gold: replays tau2-bench's gold actions, and {self.root} is a {bench.world} "
                f"benchmark (one of {', '.join(DOMAINS)} is needed)"
            )
        self.digest = bench.digest
        self.mutation = mutation

    def plan(self, first_message: str) -> tuple[str, list[tuple[str, dict]] | None, list[str]]:
        plans = _plans(self.root, self.digest)
        if first_message not in plans:
            raise ModelError("gold: the first user message is no task's of this benchmark", "malformed")
        task_id, actions, communicate, world, user = plans[first_message]
        carried = None
        if self.mutation in (Mutation.drop_write, Mutation.change_arg):
            carried = list(_carried(self.root, self.digest, first_message))
        return task_id, mutate(actions, self.mutation, world, user, carried), communicate

    def complete(
        self, messages: list[dict], *, tools: list[dict] | None, seed: int, json_mode: bool | dict = False
    ) -> ChatResult:
        if json_mode:  # the kernel's state proposal: the gold agent keeps no pending state of its own
            return ChatResult(content=EMPTY_PROPOSAL)
        first = next((m.get("content") or "" for m in messages if m.get("role") == "user"), "")
        _, plan, communicate = self.plan(first)
        plan = plan or []
        done = sum(
            1
            for m in messages
            if m.get("role") == "assistant"
            for c in m.get("tool_calls") or []
            if str(c.get("id", "")).startswith("gold-")
        )
        if done < len(plan):
            name, args = plan[done]
            return ChatResult(tool_calls=[ToolCall(id=f"gold-{done}", name=name, args=args)])
        text = communicate_text(communicate)
        said = any(m.get("role") == "assistant" and m.get("content") == text for m in messages)
        if communicate and not said:
            return ChatResult(content=text)
        if not any(t["function"]["name"] == FINISH_TOOL for t in tools or []):
            # tau2's own protocol offers no `finish`: the agent talks on until the customer ends the call
            return ChatResult(content=CLOSING)
        return ChatResult(tool_calls=[ToolCall(id="done", name=FINISH_TOOL, args={"summary": "All requests handled."})])


def communicate_text(infos: list[str]) -> str:
    return "To confirm the details: " + "; ".join(infos) + "." if infos else ""


def model(*, benchmark: str, mutation: Literal["drop_write", "change_arg", "extra_write"] | None = None) -> GoldAgent:
    """Replays each tau2 task's gold actions and says its communicate_info: the instrument of the parity check
    against tau2's grader. `benchmark`: the tau2 benchmark directory it plays (an evaluation fills in its own)."""
    return GoldAgent(benchmark, Mutation(mutation) if mutation else None)
