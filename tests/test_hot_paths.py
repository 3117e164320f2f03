"""The campaign's hot paths give the same bytes as the plain computations they replace: memoized encodings of chat
messages and tool schemas (token meter, reply-store key), the trace step's field-by-field hash and frame, unhashed
counterfactual replays, and the memoized reads of the simulated agent."""

from __future__ import annotations

import hashlib
import json
import math

import pytest

from components.memory import load_package
from components.models.base import count_tokens, message_json, tools_json
from components.models.callcache import request_json
from components.models.simulated import SimulatedAgent, fact_read
from components.runtime.episode import run_episode
from components.runtime.trace import NESTED, steps_frame
from components.worlds import load_benchmark, world
from tests.conftest import ROOT


@pytest.fixture(scope="module")
def recorded(bench_dir):
    """Every request the simulated agent received in a few episodes (messages, tools, seed, json mode)."""
    calls = []

    class Recording(SimulatedAgent):
        def complete(self, messages, **kw):
            calls.append((messages, kw))
            return super().complete(messages, **kw)

    bench = load_benchmark(bench_dir)
    pkg = load_package(ROOT / "data/packages/seed")
    results = [run_episode(pkg, bench, item, 0, Recording()) for item in bench.ids("train")[:4]]
    return bench, pkg, calls, results


def test_message_and_request_encodings_are_the_plain_json(recorded):
    _, _, calls, _ = recorded
    assert len(calls) > 20
    ident = json.dumps({"model": "sim", "cfg": {}}, sort_keys=True)
    for messages, kw in calls:
        for m in messages:
            assert message_json(m) == json.dumps(m, sort_keys=True)
        for tools in (kw["tools"], None, []):
            plain = json.dumps([ident, messages, tools, kw["seed"], kw["json_mode"]], sort_keys=True, default=str)
            assert request_json(ident, messages, tools, kw["seed"], kw["json_mode"]) == plain
            chars = sum(len(json.dumps(m, sort_keys=True)) for m in messages) + (
                len(json.dumps(tools, sort_keys=True)) if tools else 0
            )
            assert count_tokens(messages, tools, "abcde").tokens_in == math.ceil(chars / 4)


def test_flat_message_memo_tells_values_apart():
    # equal-hashing values of other types must not share an encoding: only str/None fields are memoized by content
    assert message_json({"role": "user", "content": None}) == '{"content": null, "role": "user"}'
    assert message_json({"role": "user", "content": "None"}) == '{"content": "None", "role": "user"}'
    assert message_json({"role": "user", "n": 1}) == '{"n": 1, "role": "user"}'
    assert message_json({"role": "user", "n": True}) == '{"n": true, "role": "user"}'
    odd = [{"role": "user", "content": {1, 2}}]  # not JSON: encoded as json.dumps(default=str) does
    assert request_json("x", odd, None, 3, False) == json.dumps(["x", odd, None, 3, False], sort_keys=True, default=str)


def test_tools_memo_is_by_identity_of_the_list():
    a = [{"type": "function", "function": {"name": "x"}}]
    b = [{"type": "function", "function": {"name": "y"}}]
    assert tools_json(a) == json.dumps(a, sort_keys=True) and tools_json(b) == json.dumps(b, sort_keys=True)
    assert tools_json(a) == json.dumps(a, sort_keys=True)  # a hit returns the list's own JSON


def test_trace_hash_and_frame_are_the_plain_ones(recorded):
    _, _, _, results = recorded
    steps = [s for r in results for s in r.steps]
    assert steps and all(s._nested_json is not None for s in steps)
    for s in steps:
        plain = json.dumps(s.model_dump(exclude={"hash"}), sort_keys=True, default=str)
        assert s.hash == hashlib.sha256(plain.encode()).hexdigest() == s.content_hash()
    frame = steps_frame(steps, item_id="i", seed=0)
    rows = []
    for s in steps:
        rows.append(
            {
                "item_id": "i",
                "seed": 0,
                **{k: json.dumps(v, sort_keys=True) if k in NESTED else v for k, v in s.model_dump().items()},
            }
        )
    import pandas as pd

    assert frame.equals(pd.DataFrame(rows)) and list(frame.columns) == list(pd.DataFrame(rows).columns)
    # a changed copy drops the kept encodings: its frame row is its own
    changed = steps[0].model_copy(update={"fingerprint": ["other"]})
    assert changed._nested_json is None
    assert json.loads(steps_frame([changed])["fingerprint"][0]) == ["other"]


def test_unsealed_replay_has_the_same_outcome(recorded):
    bench, pkg, _, results = recorded
    for r in results:
        comp = world(bench.world).competence
        replay = run_episode(pkg, bench, r.item_id, r.seed, SimulatedAgent(competence=comp), sealed=False)
        assert (replay.success, replay.score, replay.turns) == (r.success, r.score, r.turns)
        assert all(s.hash == "" for s in replay.steps)
        assert [s.fingerprint for s in replay.steps] == [s.fingerprint for s in r.steps]


def test_fact_reads_are_memoized_and_the_same(recorded):
    bench, _, _, _ = recorded
    comp = world(bench.world).competence
    for f in comp.facts:
        for text in (bench.policy, f.statement, "nothing here"):
            assert fact_read(f, text) == f.read(text)

    class Counting:
        """A hashable fact that counts its reads."""

        def __init__(self):
            self.reads = 0

        def read(self, text):
            self.reads += 1
            return len(text)

    fact = Counting()
    assert [fact_read(fact, t) for t in ("abc", "abc", "de", "abc")] == [3, 3, 2, 3]
    assert fact.reads == 2  # read once per distinct text: the memo answered the repeats

    class Unhashable(Counting):
        __hash__ = None

    fact = Unhashable()
    assert [fact_read(fact, t) for t in ("abc", "abc")] == [3, 3] and fact.reads == 2  # read each time, still right


def test_reply_store_round_trips_replies_packed_or_pickled_whole(tmp_path):
    import pickle

    from components.models.base import ChatResult
    from components.models.callcache import CallStore
    from components.runtime.types import ToolCall, Usage

    reply = ChatResult(
        content="ok",
        tool_calls=[ToolCall(id="call_001", name="t", args={"a": [1, {"b": None}]})],
        usage=Usage(tokens_in=7, tokens_out=2, calls=1),
    )
    store = CallStore(tmp_path / "calls.sqlite")
    store.put("k", reply)
    assert store.get("k") == reply  # pending
    store.flush()
    store.db.execute("INSERT INTO reply (key, value) VALUES (?, ?)", ("old", pickle.dumps(reply)))  # an older store
    assert store.get("k") == reply and store.get("old") == reply and store.get("missing") is None
    store.close()
