"""A model behind any OpenAI-compatible server (vLLM, llama.cpp, Ollama, a hosted API, or `ratchet serve-sim`).

Every request carries a cap on the reply's tokens (a runaway reply stops there): `max_tokens`, or
`max_completion_tokens` where the server wants it (`max_tokens_field`; `auto` switches for good the first time a server
refuses `max_tokens` and names `max_completion_tokens`, as OpenAI's reasoning models do); and, when tools are offered,
`tool_choice` (llama-cpp-python's function-calling formats render the tools only when it is sent). `reasoning: true`
asks as a reasoning model wants: `max_completion_tokens`, no `temperature`, `reasoning_effort` when given.
`extra_body` adds fields the SDK does not name (vLLM's `chat_template_kwargs`, e.g. `{enable_thinking: false}`);
`parallel_tool_calls` is sent when set (the harness runs every call of a reply, in order, either way).

Failures, by what they are:
    transient   connection errors, timeouts, 408, 429, 502/503/504 (and a 500 that does not read as a validation error,
                once): retried with exponential backoff and jitter, honouring Retry-After, at most `max_retries` times;
                then `retries_exhausted`.
    rejected    any other 4xx, a validation 500 (llama-cpp-python answers a request it cannot validate with a 500), a
                500 that repeats: the same request would fail again, so it is one episode error at once.
    length / content_filter   the reply's finish_reason: a truncated reply is never parsed as if it were whole; its
                text is kept (bounded) on the error, which says whether max_tokens or the context window cut it.
    malformed   a body the SDK cannot parse, no choices, tool arguments that are not a JSON object.
Each attempt is counted (calls, and tokens: the server's own usage when it answered; otherwise the prompt estimate,
plus `max_tokens` for a timed-out attempt, which the server may still be generating), and a ModelError carries
what the failed call spent so the episode and the budget ledger count it.

JSON-action mode (`json_actions: true`) is for models without native tool calling: the tools are described in a
system message, the history's tool calls and results become plain turns, and the reply is one JSON object,
`{"tool": name, "args": {...}}` or `{"message": text}`, constrained by a JSON schema derived from the offered tools
(`schema_format` says how the server takes a schema: `json_schema` for OpenAI, vLLM, Ollama and llama-server;
`json_object` for llama-cpp-python's `{"type": "json_object", "schema": ...}`; `none` for plain JSON mode)."""

from __future__ import annotations

import json
import os
import random
import re
import time
from typing import Any, Literal

import openai
from openai.types import CompletionUsage
from openai.types.chat import ChatCompletionMessage

from components.models.base import ChatResult, ModelError, add_usage, count_tokens
from components.runtime.types import ToolCall, Usage

RETRY_STATUS = frozenset({408, 429, 502, 503, 504})
# llama-cpp-python wraps a request it cannot validate (e.g. `content: null`) in a 500 whose message is the error
VALIDATION = re.compile(
    r"validation|input should be|field required|'loc':|\btype_error|typeerror|valueerror|keyerror", re.I
)
MAX_RETRY_AFTER = 120.0
SchemaFormat = Literal["json_schema", "json_object", "none"]
MaxTokensField = Literal["auto", "max_tokens", "max_completion_tokens"]


class OpenAIChat:
    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        api_key_env: str = "OPENAI_API_KEY",
        timeout: float = 60.0,
        max_retries: int = 4,
        backoff: float = 0.5,
        backoff_cap: float = 8.0,
        temperature: float = 0.0,
        max_tokens: int = 512,
        tool_choice: str = "auto",
        headers: dict[str, str] | None = None,
        json_actions: bool = False,
        schema_format: SchemaFormat = "json_schema",
        max_tokens_field: MaxTokensField = "auto",
        reasoning: bool = False,
        reasoning_effort: str | None = None,
        parallel_tool_calls: bool | None = None,
        extra_body: dict[str, Any] | None = None,
    ):
        self.name = model
        self.temperature, self.max_tokens, self.tool_choice = temperature, max_tokens, tool_choice
        # which field carries the reply's token cap: `max_tokens`, or `max_completion_tokens` (OpenAI's reasoning
        # models refuse the other); `auto`: max_tokens, switching to max_completion_tokens for good the first time the
        # server says so (a reasoning model: max_completion_tokens from the start)
        self.max_tokens_field = max_tokens_field
        self._limit = (
            "max_completion_tokens"
            if max_tokens_field == "max_completion_tokens" or (max_tokens_field == "auto" and reasoning)
            else "max_tokens"
        )
        self.reasoning, self.reasoning_effort = reasoning, reasoning_effort
        self.parallel_tool_calls, self.extra_body = parallel_tool_calls, dict(extra_body or {})
        self.max_retries, self.backoff, self.backoff_cap = max_retries, backoff, backoff_cap
        self.json_actions, self.schema_format = json_actions, schema_format
        self.retries = 0  # transient failures retried so far (for reports)
        self._tokenize: bool | None = None  # False: the server has no /tokenize
        # local servers ignore the key, but the SDK requires one; retries are ours (per-attempt accounting and a
        # status policy the SDK's loop does not expose), with the same backoff law: doubling, capped, 0-25% jitter
        key = os.environ.get(api_key_env) or "not-needed"
        self.client = openai.OpenAI(
            base_url=base_url,
            api_key=key,
            timeout=timeout,
            max_retries=0,
            default_headers=dict(headers) if headers else None,
        )

    # -- one call ------------------------------------------------------------------------------------------------
    def complete(
        self, messages: list[dict], *, tools: list[dict] | None, seed: int, json_mode: bool | dict[str, Any] = False
    ) -> ChatResult:
        offered = tools or []  # (the tools, when `actions`)
        actions = bool(tools) and self.json_actions
        kwargs, messages = self._request(messages, tools, seed, json_mode, actions)
        resp, spent = self._send(kwargs, messages, tools if not actions else None)
        return self._reply(resp, spent, offered, actions, tools)

    def _request(
        self, messages: list[dict], tools: list[dict] | None, seed: int, json_mode: bool | dict[str, Any], actions: bool
    ) -> tuple[dict, list[dict]]:
        """The request's arguments, and the messages it sends (with JSON actions: the tools described in them)."""
        schema = json_mode if isinstance(json_mode, dict) else None
        if actions:
            schema, messages = action_schema(tools or []), action_messages(messages, tools or [])
        kwargs: dict = {"model": self.name, "messages": messages, "seed": seed}
        if not self.reasoning:  # a reasoning model takes no sampling temperature (OpenAI's refuse any but the default)
            kwargs["temperature"] = self.temperature
        kwargs[self._limit] = self.max_tokens
        if self.reasoning_effort is not None:
            kwargs["reasoning_effort"] = self.reasoning_effort
        if tools and not actions:
            kwargs["tools"] = tools
            kwargs["tool_choice"] = self.tool_choice
            if self.parallel_tool_calls is not None:
                kwargs["parallel_tool_calls"] = self.parallel_tool_calls
        if self.extra_body:  # fields the SDK does not name, sent as they are (vLLM's chat_template_kwargs, ...)
            kwargs["extra_body"] = dict(self.extra_body)
        if schema is not None and self.schema_format == "json_schema":
            kwargs["response_format"] = {"type": "json_schema", "json_schema": {"name": "reply", "schema": schema}}
        elif schema is not None and self.schema_format == "json_object":
            kwargs["response_format"] = {"type": "json_object", "schema": schema}
        elif json_mode or actions:
            kwargs["response_format"] = {"type": "json_object"}
        return kwargs, messages

    def _send(self, kwargs: dict, messages: list[dict], tools: list[dict] | None) -> tuple[Any, Usage]:
        """The server's response and what it cost, asked again with max_completion_tokens when it wants that."""
        try:
            return self._create(kwargs, messages, tools)
        except ModelError as e:
            if not self._limit_refused(e):
                raise
            # the server wants max_completion_tokens (a reasoning model): asked again with it, and from now on
            self._limit = "max_completion_tokens"
            kwargs["max_completion_tokens"] = kwargs.pop("max_tokens")
            resp, again = self._create(kwargs, messages, tools)
            return resp, add_usage(e.usage, again)

    def _reply(
        self, resp: Any, spent: Usage, offered: list[dict], actions: bool, tools: list[dict] | None
    ) -> ChatResult:
        """The response as a reply: its text and tool calls, or the ModelError that says what is wrong with it."""

        def fail(kind: str, message: str) -> ModelError:
            return ModelError(message, kind, spent)

        choices = getattr(resp, "choices", None)
        if not choices:
            raise fail("malformed", "no choices in the response")
        choice = choices[0]
        if choice.finish_reason == "length":
            raise ModelError(self._cut(spent), "length", spent, text=_written(choice.message))
        if choice.finish_reason == "content_filter":
            raise fail("content_filter", "the server withheld the reply (finish_reason content_filter)")
        msg = choice.message
        # the SDK builds a 200's body without validating it: a null or non-object message, non-text content
        if not isinstance(msg, ChatCompletionMessage) or not isinstance(msg.content, (str, type(None))):
            raise fail("malformed", f"the reply's message is not a message object: {_shown(msg)}")
        content = msg.content or ""
        if actions:
            return self._action(content, offered, spent, fail)
        # (a function call each: no custom tool is offered, so none comes back)
        calls = [
            _call(tc.id, tc.function.name, tc.function.arguments, fail)  # type: ignore[union-attr]
            for tc in (msg.tool_calls or [])
        ]
        if not calls and tools:
            recovered = call_in_text(content, tools)
            if recovered is not None:
                return ChatResult(content="", tool_calls=[recovered], usage=spent)
            if choice.finish_reason == "tool_calls":
                raise fail("malformed", "finish_reason tool_calls but no tool call in the reply")
        return ChatResult(content=content, tool_calls=calls, usage=spent)

    def _limit_refused(self, e: ModelError) -> bool:
        """The server refused `max_tokens` and asked for `max_completion_tokens` (OpenAI's reasoning models do)."""
        text = e.message.lower()
        return (
            self.max_tokens_field == "auto"
            and self._limit == "max_tokens"
            and e.kind == "rejected"
            and "max_tokens" in text
            and "max_completion_tokens" in text
        )

    def _cut(self, spent: Usage) -> str:
        """Which limit cut the reply: max_tokens when the server generated that many, else the context window (the
        prompt and the reply filled it first). Without the server's usage, which one is unknown."""
        got = spent.tokens_out
        if got >= self.max_tokens:
            return f"reply cut at max_tokens={self.max_tokens} ({got} tokens generated)"
        if got:
            return (
                f"reply cut by the context window after {got} tokens (max_tokens={self.max_tokens} not reached; "
                f"prompt {spent.tokens_in} tokens)"
            )
        return f"reply cut at max_tokens={self.max_tokens} or the context window (the server reported no usage)"

    def _action(self, content: str, tools: list[dict], spent: Usage, fail) -> ChatResult:
        try:
            raw = json.loads(content)
        except json.JSONDecodeError as e:
            raise fail("malformed", f"JSON action is not JSON: {e}") from None
        if isinstance(raw, dict) and isinstance(raw.get("tool"), str):
            if raw["tool"] not in _names(tools):
                raise fail("unknown_tool", f"call to a tool that does not exist: {raw['tool']!r}")
            return ChatResult(
                tool_calls=[_call(f"call_{spent.calls}_{raw['tool']}", raw["tool"], raw.get("args") or {}, fail)],
                usage=spent,
            )
        if isinstance(raw, dict) and isinstance(raw.get("message"), str):
            return ChatResult(content=raw["message"], usage=spent)
        raise fail("malformed", "JSON action is neither {tool, args} nor {message}")

    def count_tokens(self, text: str) -> int | None:
        """`text`'s tokens by the server's own tokenizer (`POST /tokenize {"content"}`, as llama-server and
        `ratchet serve-local` serve it), or None where the server has none (asked once)."""
        if self._tokenize is False:
            return None
        import httpx

        root = str(self.client.base_url).rstrip("/").removesuffix("/v1")
        try:
            # (the SDK's timeout: a float or its own httpx Timeout, which httpx takes as it is)
            r = httpx.post(
                f"{root}/tokenize",
                json={"content": text},
                timeout=self.client.timeout,  # type: ignore[arg-type]
                headers={k: v for k, v in self.client.default_headers.items() if isinstance(v, str)},
            )
            tokens = r.json().get("tokens") if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError, AttributeError):  # no such endpoint, or not JSON: the 4-char meter
            tokens = None
        if not isinstance(tokens, list):
            self._tokenize = False
            return None
        return len(tokens)

    # -- attempts ------------------------------------------------------------------------------------------------
    def _create(self, kwargs: dict, messages: list[dict], tools: list[dict] | None):
        spent = Usage()
        prompt = count_tokens(messages, tools, "").tokens_in  # what a failed attempt sent, by the 4-char meter
        for attempt in range(self.max_retries + 1):
            try:
                resp = self.client.chat.completions.create(**kwargs)
            except openai.APIResponseValidationError as e:  # a 2xx whose body is not a chat completion
                spent = add_usage(spent, Usage(tokens_in=prompt, calls=1))
                raise ModelError(f"unparseable response: {str(e)[:200]}", "malformed", spent) from None
            except openai.APIError as e:
                timed_out = isinstance(e, openai.APITimeoutError)
                sent = not isinstance(e, openai.APIConnectionError) or timed_out
                spent = add_usage(
                    spent,
                    Usage(tokens_in=prompt if sent else 0, tokens_out=self.max_tokens if timed_out else 0, calls=1),
                )
                retry, why = self._retry(e, attempt)
                if not retry:
                    kind = "retries_exhausted" if why == "transient" else "rejected"
                    raise ModelError(f"{_describe(e)} after {attempt + 1} attempt(s)", kind, spent) from None
                self.retries += 1
                time.sleep(self._delay(e, attempt))
                continue
            except (ValueError, TypeError, KeyError, AttributeError) as e:  # a body the SDK cannot parse
                spent = add_usage(spent, Usage(tokens_in=prompt, calls=1))
                raise ModelError(
                    f"unparseable response: {type(e).__name__}: {str(e)[:200]}", "malformed", spent
                ) from None
            u = getattr(resp, "usage", None)
            counts = _usage_counts(u)
            if counts is None:  # never credited: a negative count would lower the budget's spend
                spent = add_usage(spent, Usage(tokens_in=prompt, calls=1))
                raise ModelError(f"the reply's usage is not token counts (>= 0): {_shown(u)}", "malformed", spent)
            spent = add_usage(spent, Usage(tokens_in=counts[0], tokens_out=counts[1], calls=1))
            return resp, spent
        raise AssertionError("unreachable")

    def _retry(self, e: openai.APIError, attempt: int) -> tuple[bool, str]:
        """(retry?, transient|rejected) for a failed attempt."""
        last = attempt >= self.max_retries
        if isinstance(e, (openai.APIConnectionError, openai.APITimeoutError)):
            return not last, "transient"
        status = getattr(e, "status_code", None)
        if status in RETRY_STATUS:
            return not last, "transient"
        if status == 500 and not VALIDATION.search(_message(e)):
            return attempt == 0 and not last, "transient" if attempt == 0 else "rejected"  # a repeated 500 is ours
        return False, "rejected"

    def _delay(self, e: openai.APIError, attempt: int) -> float:
        resp = getattr(e, "response", None)
        after = resp.headers.get("retry-after") if resp is not None else None
        try:
            if after is not None and 0 < float(after) <= MAX_RETRY_AFTER:
                return float(after)
        except ValueError:
            pass
        return min(self.backoff_cap, self.backoff * 2**attempt) * (1 - 0.25 * random.random())


# -- helpers -----------------------------------------------------------------------------------------------------------


def _usage_counts(u: Any) -> tuple[int, int] | None:
    """(prompt, completion) tokens from a reply's usage; (0, 0) when the server sent none; None when it sent
    something that is not two counts >= 0 (a string, a bool, a negative number)."""
    if u is None:
        return 0, 0
    if not isinstance(u, CompletionUsage):
        return None
    out = []
    for field in ("prompt_tokens", "completion_tokens"):
        v = getattr(u, field, None)
        v = 0 if v is None else v
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            return None
        out.append(v)
    return out[0], out[1]


def _shown(value: Any) -> str:
    raw = value.model_dump(warnings=False) if hasattr(value, "model_dump") else value
    return repr(raw)[:200]


def _message(e: openai.APIError) -> str:
    body = getattr(e, "body", None)
    return json.dumps(body) if body is not None else str(e)


def _describe(e: openai.APIError) -> str:
    status = getattr(e, "status_code", None)
    head = f"HTTP {status}" if status else type(e).__name__
    return f"{head}: {_message(e)[:300]}"


def _written(msg: Any) -> str:
    """The text of a (cut) reply: its content and any tool call's name and raw arguments."""
    if msg is None:
        return ""
    parts = [msg.content or ""] if isinstance(getattr(msg, "content", None), str) else []
    for tc in getattr(msg, "tool_calls", None) or []:
        fn = getattr(tc, "function", None)
        parts.append(f"[tool call] {getattr(fn, 'name', '')} {getattr(fn, 'arguments', '') or ''}")
    return "\n".join(p for p in parts if p)


def _names(tools: list[dict]) -> set[str]:
    return {t["function"]["name"] for t in tools}


def _call(call_id: str | None, name: str, arguments: Any, fail) -> ToolCall:
    """Arguments arrive as a JSON string (the spec), as an object (some servers), or JSON inside a JSON string."""
    args = arguments if arguments not in (None, "") else {}
    for _ in range(2):
        if not isinstance(args, str):
            break
        try:
            args = json.loads(args)
        except json.JSONDecodeError as e:
            raise fail("malformed", f"tool call {name!r} has arguments that are not JSON: {e}") from None
    if not isinstance(args, dict):
        raise fail("malformed", f"tool call {name!r} has arguments that are not an object")
    return ToolCall(id=call_id or f"call_{name}", name=name, args=args)


TEXT_CALL = re.compile(r"^\s*(?:<tool_call>|```(?:json)?)?\s*(\{.*\})\s*(?:</tool_call>|```)?\s*$", re.S)


def call_in_text(content: str, tools: list[dict]) -> ToolCall | None:
    """A tool call the server left in the text (templates without a tool parser do this): recovered only when the
    whole reply is one JSON object naming an offered tool, so a message to the user is never mistaken for a call."""
    m = TEXT_CALL.match(content or "")
    if not m:
        return None
    try:
        raw = json.loads(m.group(1))
    except json.JSONDecodeError:
        return None
    if not isinstance(raw, dict):
        return None
    name = raw.get("name") or raw.get("tool")
    args = raw.get("arguments", raw.get("args", raw.get("parameters", {})))
    if not isinstance(name, str) or name not in _names(tools):
        return None
    try:
        return _call(None, name, args, lambda kind, msg: ValueError(msg))
    except ValueError:
        return None


def action_schema(tools: list[dict]) -> dict:
    """One JSON object: a call of one offered tool with its parameters, or a message to the user."""
    calls = [
        {
            "type": "object",
            "properties": {
                "tool": {"const": t["function"]["name"]},
                "args": t["function"].get("parameters") or {"type": "object"},
            },
            "required": ["tool", "args"],
            "additionalProperties": False,
        }
        for t in tools
    ]
    message = {
        "type": "object",
        "properties": {"message": {"type": "string"}},
        "required": ["message"],
        "additionalProperties": False,
    }
    return {"anyOf": [*calls, message]}


ACTIONS_HEADER = (
    '# How to act\nReply with ONE JSON object and nothing else: either {"tool": <name>, "args": {...}} '
    'to call one of these tools, or {"message": <text>} to write to the customer.\n'
)


def action_messages(messages: list[dict], tools: list[dict]) -> list[dict]:
    """The conversation for a model without native tool calling: tools described in text, calls and results as
    plain assistant and user turns (many chat templates know no `tool` role)."""
    listing = "\n".join(
        f"- {t['function']['name']}: {t['function'].get('description', '')} "
        f"args {json.dumps(t['function'].get('parameters', {}).get('properties', {}), sort_keys=True)}"
        for t in tools
    )
    out: list[dict] = []
    for m in messages:
        if m.get("role") == "assistant" and m.get("tool_calls"):
            fn = m["tool_calls"][0]["function"]
            out.append(
                {
                    "role": "assistant",
                    "content": json.dumps({"tool": fn["name"], "args": json.loads(fn["arguments"] or "{}")}),
                }
            )
        elif m.get("role") == "tool":
            out.append({"role": "user", "content": f"[tool result] {m.get('content') or ''}"})
        elif m.get("role") == "assistant":
            out.append({"role": "assistant", "content": json.dumps({"message": m.get("content") or ""})})
        else:
            out.append({"role": m["role"], "content": m.get("content") or ""})
    # into the one system message (templates refuse a second one): the tools and the reply's form after the prompt
    if out and out[0]["role"] == "system":
        return [{"role": "system", "content": out[0]["content"] + "\n\n" + ACTIONS_HEADER + listing}, *out[1:]]
    return [{"role": "system", "content": ACTIONS_HEADER + listing}, *out]
