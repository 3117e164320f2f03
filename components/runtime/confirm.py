"""Confirmation: one kernel-level structured event, and the one rule that says whether a write is covered by it.

The agent asks with the harness tool `confirm` ({"tool": <write tool>, "args": {<its identifying args>},
"summary": <what will be done>}); the chat harness routes it to the world (`Environment.confirm`), whose user grants
it only for an action the customer asked for; the receipt is genuine, not a write, content {"confirmed": true|false}.

A write is covered when the latest `confirm` since the last successful write was granted for the same tool and the
same identifying args. Which args identify a write's target is the benchmark's `targets` ({write tool: [arg names]};
`[]` = the session/account); `also` adds args a caller wants matched too. For a tool that `targets` does not list,
the confirmation's own args must all match the write's.

The pre-write checker (`confirm_before_write`), the world's rubric check (retail `writes_confirmed`) and the
diagnoser (`unconfirmed_write`) all call `covered`/`uncovered`, through the adapters for what each one holds:
the conversation as `Turn`s or the trace's steps. No word list, no reading of the user's text.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from components.runtime.types import CONFIRM_TOOL, Turn

Targets = Mapping[str, Sequence[str]]


@dataclass(frozen=True)
class Act:
    """One executed call, as confirmation reads it."""

    tool: str
    args: dict[str, Any] = field(default_factory=dict)
    ok: bool = True
    write: bool = False
    granted: bool | None = None  # a `confirm`: the world's answer


def _value(v: Any) -> str | None:
    if v is None:
        return None
    return v if isinstance(v, str) else json.dumps(v, sort_keys=True)


def identifying_keys(tool: str, targets: Targets | None, also: Iterable[str] = ()) -> list[str] | None:
    """The arg names that identify `tool`'s target, or None when `targets` does not list the tool."""
    if targets is None or tool not in targets:
        return sorted(set(also)) or None
    return sorted(set(targets[tool]) | set(also))


def identity(tool: str, args: Mapping[str, Any], targets: Targets | None) -> tuple[tuple[str, str | None], ...]:
    """A write's target as a hashable key: its identifying args (the session alone when `targets` does not list it)."""
    keys = identifying_keys(tool, targets) or []
    return tuple((k, _value(args.get(k))) for k in keys)


def grants(
    confirmation: Act, tool: str, args: Mapping[str, Any], targets: Targets | None = None, also: Iterable[str] = ()
) -> bool:
    """Does this `confirm` act grant a write of `tool` with `args`?"""
    if confirmation.tool != CONFIRM_TOOL or confirmation.granted is not True or not confirmation.ok:
        return False
    asked = confirmation.args.get("tool")
    said = confirmation.args.get("args")
    if asked != tool or not isinstance(said, Mapping):
        return False
    keys = identifying_keys(tool, targets, also)
    if keys is None:
        keys = sorted(said)
    return all(_value(said.get(k)) == _value(args.get(k)) for k in keys)


def covered(
    acts: Sequence[Act], tool: str, args: Mapping[str, Any], targets: Targets | None = None, also: Iterable[str] = ()
) -> bool:
    """Is a write of `tool` with `args`, made after `acts`, covered by a granted confirmation?

    Walks back to the latest `confirm` since the last successful write: that one alone decides."""
    for act in reversed(acts):
        if act.write and act.ok:
            return False  # a confirmation covers one write
        if act.tool == CONFIRM_TOOL:
            return grants(act, tool, args, targets, also)
    return False


def uncovered(acts: Sequence[Act], targets: Targets | None = None) -> list[int]:
    """Indices in `acts` of the successful writes that no granted confirmation covered."""
    return [i for i, a in enumerate(acts) if a.write and a.ok and not covered(acts[:i], a.tool, a.args, targets)]


# -- adapters: what each caller holds -------------------------------------------------------------------------


def acts_from_turns(transcript: Iterable[Turn]) -> list[Act]:
    """The executed calls of a conversation (the checker's and the world's view)."""
    return [Act(t.tool, dict(t.args), t.ok, t.write, t.granted) for t in transcript if t.role == "tool" and t.tool]


def step_act(
    action: Mapping[str, Any], observation: Mapping[str, Any], blocked: str | None, write_tools: frozenset[str]
) -> Act | None:
    """One trace step's call as an act (None when the step made no call). A blocked call never ran: never ok."""
    tool = action.get("tool")
    if not tool or action.get("kind") == "finish":
        return None
    content = observation.get("content")
    granted = content.get("confirmed") if isinstance(content, dict) and tool == CONFIRM_TOOL else None
    ok = blocked is None and bool(observation.get("ok"))
    return Act(tool, dict(action.get("args") or {}), ok, tool in write_tools, granted if ok else None)
