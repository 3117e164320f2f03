"""The chat interface every model backend implements (OpenAI chat-completions semantics, plain data)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
import threading
from functools import lru_cache
from typing import Any, Protocol

from components.runtime.types import ToolCall, Usage

# Why a model call ended an episode; the first word of an episode's `error` after "model: ".
ERROR_KINDS = (
    "rejected",  # the server refused the request (a 4xx, or a 500 that is a request validation error)
    "retries_exhausted",  # transient failures (connection, timeout, 429, 502/503/504) persisted past max_retries
    "length",  # the reply was cut at max_tokens (finish_reason `length`)
    "content_filter",  # the server withheld the reply (finish_reason `content_filter`)
    "malformed",  # a reply Ratchet cannot use: no choices, bad JSON, a state proposal that breaks its schema
    "unknown_tool",  # a call to a tool that was not offered
    "empty",  # a draft with neither a tool call nor text, when tools were offered
)


KEPT_CHARS = 2000  # a cut reply can be the whole context long; its head shows the loop it was stuck in


def kept(text: str) -> str:
    """`text`, bounded to KEPT_CHARS (with how much was left out)."""
    if len(text) <= KEPT_CHARS:
        return text
    return f"{text[:KEPT_CHARS]}... [{len(text) - KEPT_CHARS} more characters not kept]"


class ModelError(Exception):
    """A model fault that ends the episode as an error. `usage` is what the failed call(s) spent all the same
    (every attempt counts), so the episode's and the budget's books include work that produced nothing."""

    def __init__(self, message: str, kind: str = "malformed", usage: Usage | None = None, text: str = ""):
        assert kind in ERROR_KINDS, kind
        super().__init__(message)
        self.kind, self.message, self.usage = kind, message, usage or Usage()
        self.text = kept(text)  # what the model did write (a cut reply): a failing model's output stays readable

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}"


@dataclass(frozen=True)
class ChatResult:
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    usage: Usage = Usage()


class ChatModel(Protocol):
    name: str

    def complete(
        self, messages: list[dict], *, tools: list[dict] | None, seed: int, json_mode: bool | dict[str, Any] = False
    ) -> ChatResult:
        """`json_mode`: False (free text / tool calls), True (one JSON object), or a JSON schema the reply must match
        (servers that support structured output are constrained by it; others get plain JSON mode)."""
        ...


def add_usage(a: Usage, b: Usage) -> Usage:
    # sums of two validated Usages' ints need no validation (called several times a turn)
    return Usage.model_construct(
        tokens_in=a.tokens_in + b.tokens_in, tokens_out=a.tokens_out + b.tokens_out, calls=a.calls + b.calls
    )


@lru_cache(maxsize=1 << 12)
def _flat_json(items: tuple[tuple[str, str | None], ...]) -> str:
    return json.dumps(dict(items), sort_keys=True)


def message_json(m: dict) -> str:
    """`json.dumps(m, sort_keys=True)` of one chat message. Every call re-sends the whole conversation (and the same
    long system prompt), so the encoding of a message whose fields are all strings (or null) is memoized by content;
    other messages (tool calls) are encoded afresh."""
    if all(type(k) is str and (type(v) is str or v is None) for k, v in m.items()):
        return _flat_json(tuple(sorted(m.items())))
    return json.dumps(m, sort_keys=True)


_tools_lock = threading.Lock()
_tools_memo: dict[int, tuple[object, str]] = {}  # id -> (the list itself, pinned so its id is not reused; JSON)


def tools_json(tools: list[dict] | None) -> str:
    """`json.dumps(tools, sort_keys=True)`, memoized by identity: a harness offers one fixed list of tool schemas for a
    whole episode (a list must not be changed once offered), and its JSON is ~5 kB, asked on every draft."""
    key = id(tools)
    with _tools_lock:
        hit = _tools_memo.get(key)
    if hit is not None and hit[0] is tools:
        return hit[1]
    enc = json.dumps(tools, sort_keys=True)
    with _tools_lock:
        _tools_memo[key] = (tools, enc)
        while len(_tools_memo) > 64:
            _tools_memo.pop(next(iter(_tools_memo)))
    return enc


def count_tokens(messages: list[dict], tools: list[dict] | None, output: str) -> Usage:
    """The simulated agent's token meter: four characters a token, deterministic on both sides of HTTP."""
    chars_in = sum(len(message_json(m)) for m in messages)
    if tools:
        chars_in += len(tools_json(tools))
    return Usage(tokens_in=math.ceil(chars_in / 4), tokens_out=math.ceil(len(output) / 4), calls=1)
