"""Confirmation is one structured event with one implementation (`components.runtime.confirm`): the chat harness
routes `confirm` to the world, and the checker, the world's rubric check and the diagnoser agree on every transcript.
Receipts follow one schema: a rule refusal carries `rule_id` and `rule`, an external one `blocking`."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from components.evolution.diagnose import diagnose_episode
from components.memory import load_package
from components.memory.events import PRE_WRITE
from components.memory.ledger import Ledger, WMOptions
from components.memory.strategies import CHECKERS, CheckContext
from components.runtime.chat import ChatHarness
from components.runtime.trace import TraceStep
from components.runtime.types import Draft, ToolCall, Turn
from components.worlds import world
from components.worlds.base import Criterion
from components.worlds.retail.env import CHECKS
from tests.conftest import PACKAGES

CANCEL, RETURN, READ = "cancel_pending_order", "return_delivered_order_items", "get_order_details"
WRITES = frozenset({CANCEL, RETURN})
TARGETS = {CANCEL: ["order_id"], RETURN: ["order_id"]}
A, B = "#W0000001", "#W0000002"


# -- one transcript, three readers -------------------------------------------------------------------------------
# events: ("confirm", tool, order, granted) | ("write", tool, order, ok) | ("read", order) | ("user", text)
#         | ("say", text). Every row ends in a successful write; earlier writes in a row are covered, so the
#         rubric's verdict on the whole conversation is the verdict on that last write.

TABLE = {
    "granted-same-order": ([("confirm", CANCEL, A, True)], True),
    "no-confirmation": ([], False),
    "words-are-not-a-confirmation": (
        [("say", "Shall I cancel order #W0000001? (yes/no)"), ("user", "Yes, go ahead.")],
        False,
    ),
    "no-dont-go-ahead": ([("confirm", CANCEL, A, False), ("user", "No, don't go ahead.")], False),
    "denied": ([("confirm", CANCEL, A, False)], False),
    "another-order": ([("confirm", CANCEL, B, True)], False),
    "another-tool": ([("confirm", RETURN, A, True)], False),
    "latest-confirmation-decides": ([("confirm", CANCEL, A, True), ("confirm", CANCEL, B, True)], False),
    "regranted-after-a-denial": ([("confirm", CANCEL, A, False), ("confirm", CANCEL, A, True)], True),
    "write-after-a-write": ([("confirm", CANCEL, A, True), ("write", CANCEL, A, True)], False),
    "fresh-after-a-write": (
        [("confirm", RETURN, B, True), ("write", RETURN, B, True), ("confirm", CANCEL, A, True)],
        True,
    ),
    "reads-talk-and-refusals-keep-it": (
        [
            ("confirm", CANCEL, A, True),
            ("read", A),
            ("say", "One moment."),
            ("user", "ok"),
            ("write", CANCEL, A, False),
        ],
        True,
    ),
}
LAST = ("write", CANCEL, A, True)


def _args(tool: str, order: str) -> dict:
    return (
        {"order_id": order, "reason": "no longer needed"} if tool == CANCEL else {"order_id": order, "item_ids": ["1"]}
    )


def as_turns(events) -> list[Turn]:
    """The conversation as the chat harness records it."""
    out = []
    for e in events:
        if e[0] in ("user", "say"):
            out.append(Turn(role="user" if e[0] == "user" else "assistant", text=e[1]))
            continue
        if e[0] == "confirm":
            tool, args, body, extra = (
                "confirm",
                {"tool": e[1], "args": {"order_id": e[2]}, "summary": "s"},
                {"confirmed": e[3]},
                {"granted": e[3]},
            )
        elif e[0] == "read":
            tool, args, body, extra = READ, {"order_id": e[1]}, {}, {}
        else:
            tool, args, body, extra = (
                e[1],
                _args(e[1], e[2]),
                {} if e[3] else {"error": "no"},
                {"write": True, "ok": e[3]},
            )
        out += [
            Turn(role="assistant", text="", tool=tool),
            Turn(role="tool", text=json.dumps(body), tool=tool, args=args, **extra),
        ]
    return out


def as_steps(events) -> list[TraceStep]:
    """The same conversation as the kernel's trace records it (one step per agent action)."""
    steps, incoming = [], {}
    for e in events:
        if e[0] == "user":
            incoming = {"role": "user", "text": e[1]}
            continue
        if e[0] == "say":
            action, obs = {"kind": "message", "content": e[1]}, {"role": "user", "text": "ok"}
        elif e[0] == "confirm":
            action = {
                "kind": "tool",
                "tool": "confirm",
                "args": {"tool": e[1], "args": {"order_id": e[2]}, "summary": "s"},
            }
            obs = {"role": "tool", "ok": True, "content": {"confirmed": e[3]}, "write": False}
        elif e[0] == "read":
            action, obs = {"kind": "tool", "tool": READ, "args": {"order_id": e[1]}}, {"role": "tool", "ok": True}
        else:
            action = {"kind": "tool", "tool": e[1], "args": _args(e[1], e[2])}
            obs = {
                "role": "tool",
                "ok": e[3],
                "write": True,
                "content": {} if e[3] else {"error": "no"},
                "rule_id": None if e[3] else "some_rule",
                "rule": None if e[3] else "a rule",
            }
        steps.append(
            TraceStep(
                episode_id="t#0",
                step=len(steps),
                incoming=incoming,
                state_before=[],
                delivered=[],
                deliveries=[],
                proposal={"pending": [], "next_tool": None},
                action=action,
                checks=[],
                observation=obs,
                state_after=[],
                fingerprint=[],
            ).sealed()
        )
        incoming = obs
    return steps


def checker_says(events) -> bool:
    check = CHECKERS.get("confirm_before_write").build({})
    draft = Draft(tool_call=ToolCall(id="w", name=LAST[1], args=_args(LAST[1], LAST[2])))
    ctx = CheckContext(PRE_WRITE, draft, Ledger(WMOptions()), as_turns(events), WRITES, TARGETS)
    return check(ctx).ok


def rubric_says(events) -> bool:
    env = SimpleNamespace(targets=TARGETS)
    crit = Criterion(id="confirmed", weight=1.0, check="writes_confirmed")
    return CHECKS["writes_confirmed"](env, crit, as_turns([*events, LAST]))


def diagnoser_says(events) -> bool:
    steps = as_steps([*events, LAST])
    f = diagnose_episode(steps, "t", load_package(PACKAGES / "seed"), WRITES, episode_id="t#0", targets=TARGETS)
    return not (f.kind == "unconfirmed_write" and f.step == steps[-1].step)


@pytest.mark.parametrize("name", list(TABLE))
def test_checker_rubric_and_diagnoser_agree(name):
    events, covered = TABLE[name]
    assert (checker_says(events), rubric_says(events), diagnoser_says(events)) == (covered, covered, covered)


# -- the harness routes `confirm` to the world; receipts carry the schema -------------------------------------------


@pytest.fixture
def harness(bench):
    task = next(
        bench.tasks[t] for t in bench.ids("train") if bench.tasks[t].family == "cancel" and bench.tasks[t].possible
    )
    env = world(bench.world).make_env(bench, task)
    return ChatHarness(env, model=None, seed=0, targets=bench.meta.get("targets")), task


def call(port, name, args, cid="c1"):
    return port.commit(Draft(tool_call=ToolCall(id=cid, name=name, args=args)))


def test_confirm_is_offered_and_answered_by_the_world(harness, bench):
    port, task = harness
    assert bench.meta["targets"][CANCEL] == ["order_id"]
    assert [t["function"]["name"] for t in port.tools][-2:] == ["confirm", "finish"]
    order = task.requests[0]["order_id"]
    yes = call(port, "confirm", {"tool": CANCEL, "args": {"order_id": order}, "summary": f"cancel {order}"})
    no = call(port, "confirm", {"tool": CANCEL, "args": {"order_id": "#W9999999"}, "summary": "cancel another"}, "c2")
    wrong_tool = call(port, "confirm", {"tool": RETURN, "args": {"order_id": order}, "summary": "return"}, "c3")
    assert [o["content"] for o in (yes, no, wrong_tool)] == [
        {"confirmed": True},
        {"confirmed": False},
        {"confirmed": False},
    ]
    assert all(o["genuine"] and not o["write"] and o["ok"] for o in (yes, no, wrong_tool))
    bad = call(port, "confirm", {"tool": READ, "args": {}, "summary": "x"}, "c4")  # not a write: malformed
    assert not bad["ok"] and bad["code"] == "invalid_args"
    seen = [json.loads(m["content"]) for m in port.messages if m["role"] == "tool"]
    assert seen[:3] == [{"confirmed": True}, {"confirmed": False}, {"confirmed": False}]  # what the model reads
    assert [t.granted for t in port.transcript() if t.role == "tool"] == [True, False, False, None]


def test_a_rule_refusal_and_an_external_one_carry_the_receipt_schema(harness):
    port, task = harness
    order = task.requests[0]["order_id"]
    refused = call(port, CANCEL, {"order_id": order, "reason": "changed my mind", "refund_amount": 0.0})
    assert (refused["ok"], refused["rule_id"], refused["blocking"]) == (False, "cancel_reason", False)
    assert f"`{CANCEL}`" in refused["rule"]  # the rule's text, as a card would state it
    model_sees = json.loads(port.messages[-1]["content"])
    assert model_sees["rule_id"] == "cancel_reason" and model_sees["rule"] == refused["rule"]
    assert "error" in model_sees and "blocking" not in model_sees
    external = call(port, CANCEL, {"order_id": "#W0000000", "reason": "no longer needed", "refund_amount": 0.0}, "c2")
    assert (external["ok"], external["rule_id"], external["blocking"]) == (False, None, True)
    model_sees = json.loads(port.messages[-1]["content"])
    assert model_sees["blocking"] is True and "rule_id" not in model_sees
