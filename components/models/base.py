"""The chat interface every model backend implements (OpenAI chat-completions semantics, plain data)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Protocol

from components.runtime.types import ToolCall, Usage


class ModelError(Exception):
    """A model fault that ends the episode as an error: malformed output, unknown tool, exhausted retries."""


@dataclass(frozen=True)
class ChatResult:
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    usage: Usage = Usage()


class ChatModel(Protocol):
    name: str

    def complete(self, messages: list[dict], *, tools: list[dict] | None, seed: int, json_mode: bool = False) -> ChatResult:
        ...


def count_tokens(messages: list[dict], tools: list[dict] | None, output: str) -> Usage:
    """The simulated agent's token meter: four characters a token, deterministic on both sides of HTTP."""
    chars_in = sum(len(json.dumps(m, sort_keys=True)) for m in messages)
    if tools:
        chars_in += len(json.dumps(tools, sort_keys=True))
    return Usage(tokens_in=math.ceil(chars_in / 4), tokens_out=math.ceil(len(output) / 4), calls=1)
