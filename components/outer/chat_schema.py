"""The OpenAI chat fine-tuning record, as a schema: what `ratchet export` writes to sft.jsonl and checks before it
writes (and what the export test checks again on the file).

    {"messages": [...], "tools": [...]}     (nothing else: the fine-tuning API refuses unknown keys)

    system / user   {"role", "content": str}
    assistant       {"role", "content": str | null, "tool_calls"?: [{"id", "type": "function",
                     "function": {"name", "arguments": <a JSON object, as a string>}}], "weight"?: 0 | 1}
    tool            {"role", "tool_call_id", "content": str}
    tools           [{"type": "function", "function": {"name", "description"?, "parameters"?: <JSON schema>}}]

Order: every tool call is answered by exactly one tool message carrying its id, after it and before the next assistant
message; every tool message answers such a call; a called tool is one of `tools`; at least one assistant message is
trained on (weight absent or 1).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Function(_Strict):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    arguments: str


class ToolCall(_Strict):
    id: str = Field(min_length=1)
    type: Literal["function"]
    function: Function


class SystemMessage(_Strict):
    role: Literal["system"]
    content: str


class UserMessage(_Strict):
    role: Literal["user"]
    content: str


class AssistantMessage(_Strict):
    role: Literal["assistant"]
    content: str | None = None
    tool_calls: list[ToolCall] | None = None
    weight: Literal[0, 1] | None = None


class ToolMessage(_Strict):
    role: Literal["tool"]
    tool_call_id: str = Field(min_length=1)
    content: str


Message = Annotated[Union[SystemMessage, UserMessage, AssistantMessage, ToolMessage], Field(discriminator="role")]


class FunctionDef(_Strict):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Strict):
    type: Literal["function"]
    function: FunctionDef


class ChatRecord(_Strict):
    messages: list[Message] = Field(min_length=1)
    tools: list[Tool] | None = None
    parallel_tool_calls: bool | None = None


_messages = TypeAdapter(list[Message])


def problems(record: Any) -> list[str]:
    """Every way `record` is not a fine-tuning chat record ([] when it is one); each names the field."""
    try:
        rec = ChatRecord.model_validate(record)
    except ValidationError as e:
        return [f"{'.'.join(str(x) for x in err['loc']) or '-'}: {err['msg']}" for err in e.errors()]
    out: list[str] = []
    names = {t.function.name for t in rec.tools or []} if rec.tools is not None else None
    open_calls: dict[str, int] = {}  # call id -> index of its assistant message, until answered
    answered: set[str] = set()
    for i, m in enumerate(rec.messages):
        if isinstance(m, AssistantMessage):
            for cid, at in open_calls.items():
                out.append(f"messages.{at}.tool_calls: call {cid} has no tool message before messages.{i}")
            open_calls = {}
            out += _assistant_problems(i, m, names, open_calls, answered)
        elif isinstance(m, ToolMessage):
            if m.tool_call_id not in open_calls:
                out.append(f"messages.{i}.tool_call_id: {m.tool_call_id} answers no open tool call")
            else:
                del open_calls[m.tool_call_id]
                answered.add(m.tool_call_id)
    for cid, at in open_calls.items():
        out.append(f"messages.{at}.tool_calls: call {cid} has no tool message")
    if not any(isinstance(m, AssistantMessage) and m.weight != 0 for m in rec.messages):
        out.append("messages: no assistant message to train on")
    return out


def _assistant_problems(
    i: int, m: AssistantMessage, names: set[str] | None, open_calls: dict[str, int], answered: set[str]
) -> list[str]:
    """What is wrong with assistant message `i` and its calls (`names`: the record's tools, None when it lists
    none); its calls are opened in `open_calls`."""
    out = []
    if m.content is None and not m.tool_calls:
        out.append(f"messages.{i}: an assistant message needs content or tool_calls")
    for c in m.tool_calls or []:
        if c.id in answered or c.id in open_calls:
            out.append(f"messages.{i}.tool_calls: id {c.id} used twice")
        open_calls[c.id] = i
        if names is not None and c.function.name not in names:
            out.append(f"messages.{i}.tool_calls: {c.function.name} is not one of tools")
        try:
            args = json.loads(c.function.arguments)
        except json.JSONDecodeError:
            args = None
        if not isinstance(args, dict):
            out.append(f"messages.{i}.tool_calls.function.arguments: not a JSON object string")
    return out


def message_problems(messages: Any, field: str) -> list[str]:
    """A list of messages (a preference pair's prompt, chosen or rejected) as the chat schema reads them."""
    try:
        _messages.validate_python(messages)
    except ValidationError as e:
        return [f"{field}.{'.'.join(str(x) for x in err['loc'])}: {err['msg']}" for err in e.errors()]
    return []
