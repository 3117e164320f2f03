"""A model behind any OpenAI-compatible server (vLLM, llama.cpp, Ollama, a hosted API, or `ratchet serve-sim`).

Transient failures (connection resets, timeouts, 408/409/429/5xx) are retried by the openai SDK with exponential
backoff up to `max_retries`; anything still failing, and any malformed response (no choices, arguments that are not
JSON), ends the episode as a ModelError."""

from __future__ import annotations

import json
import os

import openai

from components.models.base import ChatResult, ModelError
from components.runtime.types import ToolCall, Usage


class OpenAIChat:
    def __init__(self, *, base_url: str, model: str, api_key_env: str = "OPENAI_API_KEY", timeout: float = 60.0,
                 max_retries: int = 4, temperature: float = 0.0):
        self.name = model
        self.temperature = temperature
        # local servers ignore the key, but the SDK requires one
        key = os.environ.get(api_key_env) or "not-needed"
        self.client = openai.OpenAI(base_url=base_url, api_key=key, timeout=timeout, max_retries=max_retries)

    def complete(self, messages: list[dict], *, tools: list[dict] | None, seed: int, json_mode: bool = False) -> ChatResult:
        kwargs: dict = {"model": self.name, "messages": messages, "seed": seed, "temperature": self.temperature}
        if tools:
            kwargs["tools"] = tools
        if json_mode:
            kwargs["response_format"] = {"type": "json_object"}
        try:
            resp = self.client.chat.completions.create(**kwargs)
        except openai.APIError as e:
            raise ModelError(f"{type(e).__name__}: {e}") from None
        if not resp.choices:
            raise ModelError("response has no choices")
        msg = resp.choices[0].message
        calls = []
        for tc in msg.tool_calls or []:
            try:
                args = json.loads(tc.function.arguments or "{}")
            except json.JSONDecodeError as e:
                raise ModelError(f"tool call {tc.function.name!r} has arguments that are not JSON: {e}") from None
            if not isinstance(args, dict):
                raise ModelError(f"tool call {tc.function.name!r} has arguments that are not an object")
            calls.append(ToolCall(id=tc.id, name=tc.function.name, args=args))
        u = resp.usage
        usage = Usage(tokens_in=u.prompt_tokens if u else 0, tokens_out=u.completion_tokens if u else 0, calls=1)
        return ChatResult(content=msg.content or "", tool_calls=calls, usage=usage)
