"""`ratchet serve-sim`: the simulated agent behind an OpenAI-compatible /v1/chat/completions on loopback.

The request's `seed` field carries the episode seed, so the HTTP path gives exactly the in-process scores.
With `fault_rate` > 0 the server injects the faults a real endpoint has (for tests): 500s, timeouts (a slow answer),
malformed JSON, calls to tools that do not exist, responses missing a field. Which request faults is a hash of the
request and the fault seed, so a rerun faults the same way; retries of a transient fault succeed.

Outside injected faults it behaves like an OpenAI-compatible server: a malformed or unsupported request gets a 400
(422 when it is well formed but the agent cannot answer it) with an OpenAI-style body
`{"error": {"message", "type", "param", "code"}}` and the connection stays usable; bodies over `max_body` bytes get a
413; a connection that has not sent its request headers within `header_timeout` seconds is closed, and a body that
has not arrived within as long after them gets a 408 and the connection closed; the agent calls
only tools the request offers, as `tool_choice` allows."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.exceptions import HTTPException

from components.models.simulated import NAME, SimulatedAgent

MAX_BODY = 8 * 1024 * 1024  # a 40-turn conversation with its memory is a few hundred KB
HEADER_TIMEOUT = 10.0


class _Loose(BaseModel):
    model_config = ConfigDict(extra="allow")  # fields the agent does not use are accepted and ignored, as servers do


class _TextPart(BaseModel):
    type: Literal["text"]
    text: str


class _Function(_Loose):
    name: str
    arguments: str


class _ToolCall(_Loose):
    id: str
    type: Literal["function"] = "function"
    function: _Function


class _Message(_Loose):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[_TextPart] | None = None
    tool_calls: list[_ToolCall] | None = None
    tool_call_id: str | None = None


class _ToolFunction(_Loose):
    name: str = Field(min_length=1)


class _Tool(_Loose):
    type: Literal["function"]
    function: _ToolFunction


class _Named(BaseModel):
    name: str


class _NamedChoice(BaseModel):
    type: Literal["function"]
    function: _Named


class ChatRequest(_Loose):
    """What the simulated agent accepts of the OpenAI chat-completions request."""

    model: str = NAME
    messages: list[_Message] = Field(min_length=1)
    tools: list[_Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | _NamedChoice | None = None
    seed: int | None = Field(default=None, strict=True)
    stream: bool | None = None
    n: int | None = None
    # the agent ignores them, but a value no server would take is refused, not answered as if it were sound
    temperature: float | None = Field(default=None, strict=True, ge=0, le=2, allow_inf_nan=False)
    top_p: float | None = Field(default=None, strict=True, ge=0, le=1, allow_inf_nan=False)
    max_tokens: int | None = Field(default=None, strict=True, ge=1)
    max_completion_tokens: int | None = Field(default=None, strict=True, ge=1)
    response_format: dict[str, Any] | None = None


class _Refusal(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        kind: str = "invalid_request_error",
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind

    def response(self) -> JSONResponse:
        return _error(self.status, self.message, self.param, self.code, self.kind)


def _error(
    status: int, message: str, param: str | None = None, code: str | None = None, kind: str = "invalid_request_error"
) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": code}}, status_code=status)


STRICT_SYSTEM = "System message must be at the beginning."  # what Qwen's and Gemma's chat templates raise


def _parse(raw: bytes, strict_system: bool = False) -> tuple[ChatRequest, list[dict]]:
    """The validated request and its messages as the agent reads them (text parts joined), or a 400. `strict_system`:
    a system message anywhere but first is refused, as the chat templates of current open models refuse it under
    vLLM (their Jinja raises, and the server answers 400)."""
    body = _body(raw)
    try:
        req = ChatRequest.model_validate(body)
    except ValidationError as e:
        first = e.errors()[0]
        param = ".".join(str(x) for x in first["loc"]) or None
        code = "missing_required_parameter" if first["type"] == "missing" else "invalid_value"
        raise _Refusal(400, f"{param}: {first['msg']}", param=param, code=code) from None
    _served(req, strict_system)
    messages = []
    for m, src in zip(req.messages, body["messages"]):
        msg = dict(src)
        if isinstance(m.content, list):
            msg["content"] = "".join(part.text for part in m.content)
        messages.append(msg)
    return req, messages


def _body(raw: bytes) -> dict:
    """The request body as a JSON object, or a 400."""
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise _Refusal(400, f"the request body is not valid JSON ({e})", code="invalid_json") from None
    if not isinstance(body, dict):
        raise _Refusal(400, "the request body must be a JSON object", code="invalid_type")
    return body


def _served(req: ChatRequest, strict_system: bool) -> None:
    """A 400 for a valid request this server does not serve: streaming, several choices, no system prompt first (or,
    `strict_system`, one later), a tool choice the request's tools cannot meet."""
    if req.stream:
        raise _Refusal(400, "stream: streaming is not supported by this server", "stream", "unsupported_value")
    if req.n not in (None, 1):
        raise _Refusal(400, f"n: only one choice per request is supported (got {req.n})", "n", "unsupported_value")
    if req.messages[0].role not in ("system", "developer"):
        raise _Refusal(
            400,
            "messages: the first message must be the system prompt (the agent's policy and memory)",
            "messages",
            "invalid_value",
        )
    if strict_system and any(m.role in ("system", "developer") for m in req.messages[1:]):
        at = next(i for i, m in enumerate(req.messages) if i and m.role in ("system", "developer"))
        raise _Refusal(400, f"messages.{at}: {STRICT_SYSTEM}", f"messages.{at}", "invalid_value")
    offered = {t.function.name for t in req.tools or []}
    if isinstance(req.tool_choice, _NamedChoice) and req.tool_choice.function.name not in offered:
        raise _Refusal(
            400,
            f"tool_choice: {req.tool_choice.function.name!r} is not one of the request's tools",
            "tool_choice",
            "invalid_value",
        )
    if req.tool_choice == "required" and not offered:
        raise _Refusal(400, "tool_choice: 'required' needs tools", "tool_choice", "invalid_value")


def _allowed_calls(req: ChatRequest, calls: list) -> tuple[list, str | None]:
    """The agent's calls that the request lets it make; and why a call was withheld, if one was."""
    offered = {t.function.name for t in req.tools or []}
    choice = req.tool_choice or "auto"
    if choice == "none":
        allowed = set()
    elif isinstance(choice, _NamedChoice):
        allowed = {choice.function.name}
    else:
        allowed = offered
    kept = [c for c in calls if c.name in allowed]
    withheld = [c.name for c in calls if c.name not in allowed]
    if (choice == "required" or isinstance(choice, _NamedChoice)) and not kept:
        want = f"a call to {choice.function.name!r}" if isinstance(choice, _NamedChoice) else "a tool call"
        raise _Refusal(
            422,
            f"tool_choice: the simulated agent's next step is not {want}"
            f"{f' (it wants {withheld[0]!r})' if withheld else ''}",
            "tool_choice",
            "unsatisfiable",
        )
    return kept, (f"(I would call `{withheld[0]}` next, but this request does not offer it.)" if withheld else None)


# What real endpoints do, roughly in proportion: mostly transient errors, sometimes a broken answer.
FAULTS = (("http_500", 0.5), ("slow", 0.2), ("bad_json", 0.1), ("unknown_tool", 0.1), ("missing_field", 0.1))
TRANSIENT = ("http_500", "slow")


def _fault(body: bytes, attempt: int, rate: float, seed: int) -> str | None:
    """Which fault (if any) this request gets: a pure function of its bytes and the fault seed."""
    if rate <= 0:
        return None
    h = hashlib.blake2b(body + f"|{seed}".encode(), digest_size=8).digest()
    u = int.from_bytes(h, "big") / 2**64
    if u >= rate:
        return None
    x, kind = u / rate, FAULTS[-1][0]
    for name, share in FAULTS:
        if x < share:
            kind = name
            break
        x -= share
    if kind in TRANSIENT and attempt > 0:
        return None  # a retry of a transient fault goes through
    return kind


def create_app(
    agent: SimulatedAgent | None = None,
    fault_rate: float = 0.0,
    fault_seed: int = 0,
    slow_seconds: float = 2.0,
    max_body: int = MAX_BODY,
    body_timeout: float = HEADER_TIMEOUT,
    strict_system: bool = False,
) -> FastAPI:
    """The app; `agent` is any chat model (the simulated agent by default); `strict_system`: refuse a system message
    that is not first (`_parse`)."""
    agent = agent or SimulatedAgent()
    app = FastAPI(title="ratchet simulated agent", openapi_url=None, docs_url=None, redoc_url=None)
    attempts: dict[bytes, int] = {}
    app.state.faults = []

    @app.exception_handler(HTTPException)
    async def http_error(_request: Request, exc: HTTPException) -> JSONResponse:  # 404, 405: the same error shape
        return _error(exc.status_code, str(exc.detail), code="not_found" if exc.status_code == 404 else None)

    async def body_of(request: Request) -> bytes:
        declared = request.headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > max_body):
            raise _Refusal(413, f"the request body exceeds {max_body} bytes", code="request_too_large")
        chunks, size = [], 0
        stream, deadline = request.stream().__aiter__(), time.monotonic() + body_timeout
        while True:
            # a client that sent its headers and stalls its body would otherwise hold the connection forever
            try:
                chunk = await asyncio.wait_for(stream.__anext__(), max(0.0, deadline - time.monotonic()))
            except StopAsyncIteration:
                break
            except asyncio.TimeoutError:
                raise _Refusal(
                    408, f"the request body did not arrive within {body_timeout:g} s", code="request_timeout"
                ) from None
            size += len(chunk)
            if size > max_body:
                raise _Refusal(413, f"the request body exceeds {max_body} bytes", code="request_too_large")
            chunks.append(chunk)
        return b"".join(chunks)

    @app.get("/v1/models")
    def models() -> dict:
        return {"object": "list", "data": [{"id": NAME, "object": "model", "owned_by": "ratchet"}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        try:
            return await answer(request)
        except _Refusal as e:
            out = e.response()
            if e.status == 408:  # the rest of that body may still come: the connection cannot be reused
                out.headers["connection"] = "close"
            return out
        except Exception as e:  # noqa: BLE001 - a well-formed request the agent cannot read: say so, keep the connection
            return _error(
                422,
                f"the simulated agent cannot answer this conversation ({type(e).__name__}: {e})",
                "messages",
                "unprocessable_conversation",
            )

    async def answer(request: Request):
        raw = await body_of(request)
        req, messages = _parse(raw, strict_system)
        key = hashlib.sha256(raw).digest()
        attempt = attempts.get(key, 0)
        attempts[key] = attempt + 1
        fault = _fault(raw, attempt, fault_rate, fault_seed)
        if fault:
            app.state.faults.append(fault)
        if fault == "http_500":
            return JSONResponse(
                {"error": {"message": "injected server error", "type": "server_error"}}, status_code=500
            )
        if fault == "slow":
            await asyncio.sleep(slow_seconds)
        if fault == "bad_json":
            return PlainTextResponse('{"id": "x", "choices": [', media_type="application/json")
        json_mode = (req.response_format or {}).get("type") in ("json_object", "json_schema")
        tools = [t.model_dump() for t in req.tools] if req.tools else None
        res = agent.complete(messages, tools=tools, seed=req.seed or 0, json_mode=json_mode)
        kept, withheld = _allowed_calls(req, res.tool_calls)
        calls = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": json.dumps(c.args, sort_keys=True)},
            }
            for c in kept
        ]
        if fault == "unknown_tool":
            calls = [{"id": "call_x", "type": "function", "function": {"name": "delete_everything", "arguments": "{}"}}]
        content = res.content or (withheld if not calls else None)
        message: dict[str, Any] = {"role": "assistant", "content": content or None}
        if calls:
            message["tool_calls"] = calls
        out = {
            "id": f"chatcmpl-{key.hex()[:12]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": req.model,
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}],
            "usage": {
                "prompt_tokens": res.usage.tokens_in,
                "completion_tokens": res.usage.tokens_out,
                "total_tokens": res.usage.tokens_in + res.usage.tokens_out,
            },
        }
        if fault == "missing_field":
            del out["choices"]
        return JSONResponse(out)

    return app


def _header_timeout_protocol(seconds: float):
    """uvicorn's h11 protocol, closing a connection whose request headers have not arrived within `seconds` of it
    opening (or of the last response): uvicorn's keep-alive timer restarts on every byte, so a slow trickle would
    hold a connection forever."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class HeaderTimeout(H11Protocol):
        def connection_made(self, transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm(None)

        def on_response_complete(self) -> None:
            cycle = self.cycle
            super().on_response_complete()
            self._arm(cycle)

        def _arm(self, cycle) -> None:
            self.loop.call_later(seconds, self._expire, cycle)

        def _expire(self, cycle) -> None:
            if self.cycle is cycle and not self.transport.is_closing():  # no new request since: drop it
                self.transport.close()

    return HeaderTimeout


def serve(
    port: int,
    host: str = "127.0.0.1",
    fault_rate: float = 0.0,
    fault_seed: int = 0,
    slow_seconds: float = 2.0,
    max_body: int = MAX_BODY,
    header_timeout: float = HEADER_TIMEOUT,
    strict_system: bool = False,
) -> None:
    import uvicorn

    uvicorn.run(
        create_app(
            fault_rate=fault_rate,
            fault_seed=fault_seed,
            slow_seconds=slow_seconds,
            max_body=max_body,
            body_timeout=header_timeout,
            strict_system=strict_system,
        ),
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        http=_header_timeout_protocol(header_timeout),
    )
