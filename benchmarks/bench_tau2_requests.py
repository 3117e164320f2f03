"""What Ratchet sends a model server per τ²-bench episode: requests and prompt tokens, over HTTP, against an
OpenAI-compatible fake server that plays tau2's gold actions (the `gold` agent behind `ratchet serve-sim`'s app) and
counts each request's prompt at four characters a token (Ratchet's own meter), with the scripted user.

    python benchmarks/bench_tau2_requests.py [--worlds tau2-retail,tau2-airline] [--split test] [--items N]
                                             [--protocols standard,custom] [--strict-system] [--package none]

With --strict-system the server refuses any request whose system message is not first, as the chat templates of
Qwen3, Gemma 3 and Mistral do under vLLM: a run that completes every episode is a run such a server accepts. Rows:
world, protocol, episodes, episodes refused by the server, scored 1.0, kernel turns per episode, requests and prompt
tokens per turn and per episode (under tau2's standard protocol the agent cannot end the call, so the scripted user's
twelve replies make its episodes longer: per turn is the like-for-like figure). The same script runs on an older checkout (without --protocols), which is how the figures before the
request change were measured (benchmarks/README.md)."""

from __future__ import annotations

import argparse
import inspect
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from components.env import quiet_offline  # noqa: E402

quiet_offline()


class Metered:
    """A chat model whose replies carry usage by Ratchet's four-characters-a-token meter (`count_tokens`)."""

    def __init__(self, agent):
        self.agent, self.name = agent, "gold"

    def complete(self, messages, *, tools, seed, json_mode=False):
        from dataclasses import replace

        from components.models.base import count_tokens

        # a state proposal (its instruction in a system message, wherever the harness puts it): an older server app
        # passes no JSON mode on for a json_schema request
        proposal = any(m.get("role") == "system" and "# Ledger update" in (m.get("content") or "") for m in messages)
        res = self.agent.complete(messages, tools=tools, seed=seed, json_mode=json_mode or proposal)
        out = (res.content or "") + "".join(c.name + str(c.args) for c in res.tool_calls)
        return replace(res, usage=count_tokens(messages, tools, out))


def serve(agent, strict: bool) -> tuple[str, object]:
    import uvicorn

    from components.models.server import create_app

    takes = "strict_system" in inspect.signature(create_app).parameters
    app = create_app(agent=agent, **({"strict_system": True} if strict and takes else {}))
    if strict and not takes:  # an older checkout's app: the same refusal, in front of it
        app = _strict(app)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error", access_log=False))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    return f"http://127.0.0.1:{port}/v1", server


def _strict(app):
    """An ASGI app that answers 400 to a request with a system message anywhere but first, else passes it on."""
    import json

    from starlette.responses import JSONResponse

    async def strict(scope, receive, send):
        if scope["type"] != "http":
            return await app(scope, receive, send)
        chunks, more = [], True
        while more:
            msg = await receive()
            chunks.append(msg.get("body", b""))
            more = msg.get("more_body", False)
        body = b"".join(chunks)
        try:
            roles = [m.get("role") for m in json.loads(body).get("messages", [])]
        except (ValueError, AttributeError):
            roles = []
        if "system" in roles[1:]:
            resp = JSONResponse(
                {"error": {"message": "System message must be at the beginning.", "type": "invalid_request_error"}},
                status_code=400,
            )
            return await resp(scope, receive, send)
        sent = False

        async def replay():
            nonlocal sent
            if sent:
                return {"type": "http.disconnect"}
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        return await app(scope, replay, send)

    return strict


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--quick",
        action="store_true",
        help="tau2-airline, 2 tasks, the standard protocol, a strict-template server (the test's size)",
    )
    ap.add_argument("--worlds", default="tau2-retail,tau2-airline")
    ap.add_argument("--split", default="test")
    ap.add_argument("--items", type=int, default=0, help="the first N tasks of the split (0: all)")
    ap.add_argument("--protocols", default="", help="standard,custom (an older checkout has none: leave empty)")
    ap.add_argument("--strict-system", action="store_true")
    ap.add_argument("--package", default="none")
    args = ap.parse_args(argv)
    if args.quick:
        args.worlds, args.items, args.protocols, args.strict_system = "tau2-airline", 2, "standard", True

    from components.memory.package import load_package
    from components.models import make_model
    from components.params import BenchmarkParams
    from components.runtime.episode import run_episode
    from components.worlds import load_benchmark, world

    print(
        "| world | protocol | episodes | refused by the server | score 1.0 | turns / episode | requests / turn | "
        "prompt tokens / turn | requests / episode | prompt tokens / episode |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.worlds.split(","):
            for protocol in [p for p in args.protocols.split(",") if p] or [""]:
                extra = {"protocol": protocol} if protocol else {}
                out = Path(tmp) / f"{name}-{protocol or 'as-built'}"
                BenchmarkParams(world=name, seed=0, out=str(out), per_family=None, **extra).materialize()
                bench = load_benchmark(out)
                pkg = load_package(world(name).packages[args.package])
                gold = make_model("gold", {"benchmark": str(out)})
                url, server = serve(Metered(gold), args.strict_system)
                model = make_model("openai", {"base_url": url, "model": "gold", "max_retries": 0, "timeout": 60})
                ids = bench.ids(args.split)[: args.items or None]
                results = [run_episode(pkg, bench, i, 0, model) for i in ids]
                server.should_exit = True
                refused = sum(1 for r in results if "rejected" in r.error)
                n = len(results)
                turns = sum(r.turns for r in results)
                calls, tokens = sum(r.model_calls for r in results), sum(r.tokens_in for r in results)
                print(
                    f"| {name} | {protocol or bench.meta.get('protocol', 'as built')} | {n} | {refused} | "
                    f"{sum(r.score == 1.0 for r in results)} | {turns / n:.1f} | {calls / max(1, turns):.2f} | "
                    f"{tokens / max(1, turns):,.0f} | {calls / n:.1f} | {tokens / n:,.0f} |",
                    flush=True,
                )
                bad = next((r.error for r in results if r.error), "")
                if bad:
                    print(f"first error: {bad[:300]}")


if __name__ == "__main__":
    main()
