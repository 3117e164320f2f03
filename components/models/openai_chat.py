"""A model behind any OpenAI-compatible server (vLLM, llama.cpp, Ollama, a hosted API, or `ratchet serve-sim`).

Transient failures (connection errors and resets, timeouts, 408/409/429 and 5xx) are retried with exponential backoff
(`backoff` doubling up to `backoff_cap`) at most `max_retries` times. A failure that persists, any other error, and
any malformed response (no choices, arguments that are not a JSON object) end the episode as a ModelError, which the
episode records as its error: an errored episode is never a success."""

from __future__ import annotations

import json
import os
import time

import openai

from components.models.base import ChatResult, ModelError
from components.runtime.types import ToolCall, Usage

TRANSIENT = (openai.APIConnectionError, openai.APITimeoutError, openai.InternalServerError, openai.RateLimitError)


def _transient(e: Exception) -> bool:
    return isinstance(e, TRANSIENT) or (isinstance(e, openai.APIStatusError) and e.status_code in (408, 409))


class OpenAIChat:
    def __init__(self, *, base_url: str, model: str, api_key_env: str = "OPENAI_API_KEY", timeout: float = 60.0,
                 max_retries: int = 4, backoff: float = 0.5, backoff_cap: float = 8.0, temperature: float = 0.0):
        self.name = model
        self.temperature = temperature
        self.max_retries, self.backoff, self.backoff_cap = max_retries, backoff, backoff_cap
        self.retries = 0  # transient failures retried so far (for reports)
        # local servers ignore the key, but the SDK requires one; retries are ours, not the SDK's
        key = os.environ.get(api_key_env) or "not-needed"
        self.client = openai.OpenAI(base_url=base_url, api_key=key, timeout=timeout, max_retries=0)

    def complete(self, messages: list[dict], *, tools: list[dict] | None, seed: int, json_mode: bool = False) -> ChatResult:
        kwargs: dict = {"model": self.name, "messages": messages, "seed": seed, "temperature": self.temperature}
        if tools:
            kwargs["tools"] = tools
        if json_mode:
            kwargs["response_format"] = {"type": "json_object"}
        for attempt in range(self.max_retries + 1):
            try:
                resp = self.client.chat.completions.create(**kwargs)
                break
            except openai.APIError as e:
                if not _transient(e) or attempt == self.max_retries:
                    kind = "gave up after retries" if _transient(e) else "failed"
                    raise ModelError(f"{kind}: {type(e).__name__}: {str(e)[:200]}") from None
                self.retries += 1
                time.sleep(min(self.backoff_cap, self.backoff * 2**attempt))
            except (ValueError, TypeError, KeyError, AttributeError) as e:  # a body the SDK cannot parse
                raise ModelError(f"malformed response: {type(e).__name__}: {str(e)[:200]}") from None
        if not getattr(resp, "choices", None):
            raise ModelError("malformed response: no choices")
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
