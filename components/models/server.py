"""`ratchet serve-sim`: the simulated agent behind an OpenAI-compatible /v1/chat/completions on loopback.

The request's `seed` field carries the episode seed, so the HTTP path gives exactly the in-process scores.
With `fault_rate` > 0 the server injects the faults a real endpoint has (for tests): 500s, timeouts (a slow answer),
malformed JSON, calls to tools that do not exist, responses missing a field. Which request faults is a hash of the
request and the fault seed, so a rerun faults the same way; retries of a transient fault succeed."""

from __future__ import annotations

import asyncio
import hashlib
import json
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse

from components.models.simulated import NAME, SimulatedAgent

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


def create_app(agent: SimulatedAgent | None = None, fault_rate: float = 0.0, fault_seed: int = 0,
               slow_seconds: float = 2.0) -> FastAPI:
    agent = agent or SimulatedAgent()
    app = FastAPI(title="ratchet simulated agent", openapi_url=None, docs_url=None, redoc_url=None)
    attempts: dict[bytes, int] = {}
    app.state.faults = []

    @app.get("/v1/models")
    def models() -> dict:
        return {"object": "list", "data": [{"id": NAME, "object": "model", "owned_by": "ratchet"}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        raw = await request.body()
        body: dict[str, Any] = json.loads(raw)
        key = hashlib.sha256(raw).digest()
        attempt = attempts.get(key, 0)
        attempts[key] = attempt + 1
        fault = _fault(raw, attempt, fault_rate, fault_seed)
        if fault:
            app.state.faults.append(fault)
        if fault == "http_500":
            return JSONResponse({"error": {"message": "injected server error", "type": "server_error"}}, status_code=500)
        if fault == "slow":
            await asyncio.sleep(slow_seconds)
        if fault == "bad_json":
            return PlainTextResponse('{"id": "x", "choices": [', media_type="application/json")
        json_mode = (body.get("response_format") or {}).get("type") == "json_object"
        res = agent.complete(body["messages"], tools=body.get("tools"), seed=int(body.get("seed") or 0),
                             json_mode=json_mode)
        calls = [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": json.dumps(c.args, sort_keys=True)}}
                 for c in res.tool_calls]
        if fault == "unknown_tool":
            calls = [{"id": "call_x", "type": "function", "function": {"name": "delete_everything", "arguments": "{}"}}]
        message: dict[str, Any] = {"role": "assistant", "content": res.content or None}
        if calls:
            message["tool_calls"] = calls
        out = {
            "id": f"chatcmpl-{key.hex()[:12]}",
            "object": "chat.completion",
            "created": 0,
            "model": body.get("model", NAME),
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}],
            "usage": {"prompt_tokens": res.usage.tokens_in, "completion_tokens": res.usage.tokens_out,
                      "total_tokens": res.usage.tokens_in + res.usage.tokens_out},
        }
        if fault == "missing_field":
            del out["choices"]
        return JSONResponse(out)

    return app


def serve(port: int, host: str = "127.0.0.1", fault_rate: float = 0.0, fault_seed: int = 0,
          slow_seconds: float = 2.0) -> None:
    import uvicorn

    uvicorn.run(create_app(fault_rate=fault_rate, fault_seed=fault_seed, slow_seconds=slow_seconds), host=host,
                port=port, log_level="warning", access_log=False)
