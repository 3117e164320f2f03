"""One kernel turn recorded exactly: what reached the model at each phase, and every field of the trace step
(found by mutation testing: the phase tests alone left the trace's contents unchecked)."""

from __future__ import annotations

import pytest

from components.memory import load_package
from components.runtime.kernel import Episode, run_turn
from components.runtime.types import Draft, Intent, Proposal, ToolCall, Turn
from tests.test_runtime import FINISH, ScriptedPort

CANCEL, READ = "cancel_pending_order", "get_order_details"
MANIFEST = """name: traced
wm:
  board: true
  max_entries: 1
  bind_on: [order_id]
delivery:
  - use: state_reminder
    at: turn_start
  - use: event_cards
    at: turn_start
  - use: event_cards
    at: intent_recorded
checkers:
  - use: completion_requires_receipts
    at: agent_declares_done
"""


def card(cid: str, event: str, tool: str) -> str:
    return (
        f"---\nid: {cid}\ntype: procedure\ntrigger:\n  event: {event}\n  tool: {tool}\nsource: test\n---\n"
        f"How to use `{tool}`.\n"
    )


@pytest.fixture
def traced(tmp_path):
    (tmp_path / "em/procedure").mkdir(parents=True)
    (tmp_path / "manifest.yaml").write_text(MANIFEST)
    (tmp_path / "em/procedure/pending-cancel.md").write_text(card("pending-cancel", "turn_start", CANCEL))
    (tmp_path / "em/procedure/read-order.md").write_text(card("read-order", "intent_recorded", READ))
    return load_package(tmp_path)


def entry(order: str, eid: str = "e1", status: str = "pending") -> dict:
    return {"id": eid, "tool": CANCEL, "args": {"order_id": order}, "note": "", "status": status, "evidence": None}


def test_every_field_of_a_turn_is_recorded(traced):
    read = Draft(tool_call=ToolCall(id="r1", name=READ, args={"order_id": "#W1"}))
    proposal = Proposal(
        pending=[Intent(tool=CANCEL, args={"order_id": "#W1"}), Intent(tool=CANCEL, args={"order_id": "#W2"})],
        next_tool=READ,
    )
    hello = Turn(role="user", text="cancel #W1 and #W2")
    port = ScriptedPort([read], proposal=proposal, transcript=[Turn(role="system", text="hi"), hello])
    ep = Episode.start("e#3", traced)
    step = run_turn(ep, port)

    board_empty = "## Working memory (ledger)\n- (no tracked work)"
    board = "## Working memory (ledger)\n- [PENDING] e1 cancel_pending_order order_id=#W1"
    # the proposal saw the board and the turn_start note; the draft also saw the card routed at intent_recorded
    assert port.memories[0] == f"{board_empty}\n\n{board_empty}"
    assert port.memories[1] == f"{board}\n\n{board_empty}\n\n" + traced.cards["read-order"].render()
    assert step.episode_id == "e#3" and step.step == 0
    assert step.incoming == hello.model_dump()  # the last line of the conversation, not the first
    assert step.state_before == [] and step.state_after == [entry("#W1")]
    assert step.proposal == proposal.model_dump()
    assert step.delivered == ["read-order"]
    assert step.deliveries == [
        {"event": "turn_start", "strategy": "state_reminder", "cards": [], "notes": 1},
        {"event": "intent_recorded", "strategy": "event_cards", "cards": ["read-order"], "notes": 0},
    ]
    assert step.fingerprint == [
        "board",
        "note:state_reminder@turn_start",
        "ledger:add:e1",
        "ledger:overflow:1",
        "deliver:read-order@intent_recorded",
    ]
    assert step.first_draft is None and step.blocked is None and step.checks == []
    assert step.action == {"kind": "tool", "content": "", "tool": READ, "args": {"order_id": "#W1"}}
    assert step.observation == {"ok": True} and step.hash == step.content_hash()
    assert port.committed == [(read, None)]

    # turn 2: the pending cancel routes its card at turn_start; `finish` is bounced twice, then blocked
    port.drafts = [FINISH]
    second = run_turn(ep, port)
    assert second.step == 1 and second.state_before == [entry("#W1")]
    assert second.delivered == ["pending-cancel", "read-order"]
    assert [d["event"] for d in second.deliveries] == ["turn_start", "turn_start", "intent_recorded"]
    assert traced.cards["pending-cancel"].render() in port.memories[2]  # reached the proposal this time
    reason = "cannot finish: no receipt yet for e1 cancel_pending_order order_id=#W1"
    assert second.checks == [
        {
            "strategy": "completion_requires_receipts",
            "event": "agent_declares_done",
            "ok": False,
            "reason": reason,
            "attempt": 0,
        },
        {
            "strategy": "completion_requires_receipts",
            "event": "agent_declares_done",
            "ok": False,
            "reason": reason,
            "attempt": 1,
        },
    ]
    bounce = "check:completion_requires_receipts@agent_declares_done:bounce"
    assert second.fingerprint == [
        "board",
        "note:state_reminder@turn_start",
        "deliver:pending-cancel@turn_start",
        "ledger:overflow:1",
        "deliver:read-order@intent_recorded",
        bounce,
        "redraft",
        bounce,
        "block",
    ]
    assert second.blocked == reason and port.committed[-1] == (FINISH, reason)
    assert port.feedback[-1] == reason
    assert second.first_draft == {"kind": "finish", "content": "", "tool": "finish", "args": {"summary": "done"}}
    assert dict(ep.delivered_counts) == {"read-order": 2, "pending-cancel": 1}
    assert [s.step for s in ep.steps] == [0, 1]


def test_a_message_draft_is_recorded_without_tool_fields(traced):
    port = ScriptedPort([Draft(content="Which order?")], proposal=Proposal())
    step = run_turn(Episode.start("e#0", traced), port)
    assert step.action == {"kind": "message", "content": "Which order?"}
    assert step.fingerprint == ["board", "note:state_reminder@turn_start"] and step.delivered == []
    assert step.incoming == Turn(role="user", text="cancel #W1").model_dump()


def test_an_empty_transcript_is_an_empty_incoming(traced):
    port = ScriptedPort([Draft(content="Hello")], proposal=Proposal(), transcript=[])
    port._turns = []
    assert run_turn(Episode.start("e#0", traced), port).incoming == {}


def package(tmp_path, manifest: str, *cards: tuple[str, str, str, str]):
    """cards: (id, type, event, tool)"""
    (tmp_path / "manifest.yaml").write_text(manifest)
    for cid, ctype, event, tool in cards:
        (tmp_path / "em" / ctype).mkdir(parents=True, exist_ok=True)
        (tmp_path / "em" / ctype / f"{cid}.md").write_text(
            card(cid, event, tool).replace("type: procedure", f"type: {ctype}")
        )
    return load_package(tmp_path)


def write(cid: str = "w1") -> Draft:
    return Draft(tool_call=ToolCall(id=cid, name=CANCEL, args={"order_id": "#W1", "reason": "no longer needed"}))


def test_every_reason_reaches_the_redraft_and_the_block(tmp_path):
    pkg = package(
        tmp_path,
        """name: two-reasons
wm:
  board: false
delivery:
  - use: event_cards
    at: pre_write
checkers:
  - use: confirm_before_write
    at: pre_write
  - use: confirm_before_write
    at: pre_write
    cfg:
      tools: [cancel_pending_order]
""",
        ("c-one", "procedure", "pre_write", CANCEL),
        ("c-two", "procedure", "pre_write", CANCEL),
    )
    port = ScriptedPort([write("w1"), write("w2")])
    step = run_turn(Episode.start("e#0", pkg), port)
    confirm = (
        "`cancel_pending_order` needs the customer's confirmation first: call `confirm` with this tool and its "
        "arguments, and write only if it is granted"
    )
    cards = "before `cancel_pending_order`, read the delivered card(s): c-one, c-two"
    assert port.feedback == [None, "\n".join([cards, confirm, confirm])]
    assert step.blocked == f"{confirm}; {confirm}" and port.committed == [(write("w2"), step.blocked)]
    assert step.delivered == ["c-one", "c-two"]


def test_checkers_read_the_conversation_and_no_board_means_no_board(tmp_path):
    pkg = package(
        tmp_path,
        """name: confirm-only
wm:
  board: false
delivery: []
checkers:
  - use: confirm_before_write
    at: pre_write
""",
    )
    asked = [
        Turn(role="user", text="Please cancel #W1."),
        Turn(role="assistant", text="", tool="confirm"),
        Turn(
            role="tool",
            text='{"confirmed": true}',
            tool="confirm",
            granted=True,
            args={"tool": CANCEL, "args": {"order_id": "#W1"}, "summary": "cancel order #W1"},
        ),
    ]
    port = ScriptedPort([write()], transcript=asked)
    step = run_turn(Episode.start("e#0", pkg), port)
    assert step.blocked is None and step.checks == [
        {"strategy": "confirm_before_write", "event": "pre_write", "ok": True, "reason": "", "attempt": 0}
    ]
    assert port.committed == [(write(), None)] and port.memories == ["", ""]


def test_two_bindings_at_one_event_both_deliver(tmp_path):
    pkg = package(
        tmp_path,
        """name: by-type
wm:
  board: false
delivery:
  - use: event_cards
    at: intent_recorded
    cfg:
      types: [procedure]
  - use: event_cards
    at: intent_recorded
    cfg:
      types: [knowledge]
checkers: []
""",
        ("p1", "procedure", "intent_recorded", READ),
        ("k1", "knowledge", "intent_recorded", READ),
    )
    port = ScriptedPort([Draft(content="ok")], proposal=Proposal(next_tool=READ))
    step = run_turn(Episode.start("e#0", pkg), port)
    assert step.delivered == ["p1", "k1"]
    assert port.memories[1] == pkg.cards["p1"].render() + "\n\n" + pkg.cards["k1"].render()


def test_each_turn_records_when_it_and_its_phases_ran(tmp_path):
    """`Episode.timings`: per turn, the turn itself, then each phase in the order the kernel ran it (memory, model,
    memory, model, checkers, and a redraft and the second review when a checker bounced the draft, the tool), each
    a (start, end) in wall-clock nanoseconds inside the turn's; a second turn adds its own, the first's kept."""
    from components.runtime.kernel import CHECKS, MEMORY, MODEL, TOOL, TURN

    pkg = package(
        tmp_path,
        """name: one-checker
wm:
  board: false
checkers:
  - use: confirm_before_write
    at: pre_write
""",
    )
    port = ScriptedPort([write("w1"), write("w2"), FINISH])
    ep = Episode.start("e#0", pkg)
    run_turn(ep, port)
    first = list(ep.timings)
    assert [(s, phase) for s, phase, _, _ in first] == [
        (0, p) for p in (TURN, MEMORY, MODEL, MEMORY, MODEL, CHECKS, MODEL, CHECKS, TOOL)
    ]
    (_, _, t0, t1), spans = first[0], first[1:]
    assert all(isinstance(x, int) for _, _, a, b in first for x in (a, b))
    assert all(t0 <= a <= b <= t1 for _, _, a, b in spans)
    assert all(b <= a2 for (_, _, _, b), (_, _, a2, _) in zip(spans, spans[1:]))  # one after another
    run_turn(ep, port)
    assert ep.timings[: len(first)] == first
    assert [(s, phase) for s, phase, _, _ in ep.timings[len(first) :]] == [
        (1, p) for p in (TURN, MEMORY, MODEL, MEMORY, MODEL, CHECKS, TOOL)
    ]


def test_an_unsealed_episode_leaves_its_steps_unhashed(traced):
    port = ScriptedPort([FINISH])
    assert Episode.start("e#0", traced).sealed
    ep = Episode.start("e#0", traced, sealed=False)
    assert not ep.sealed and run_turn(ep, port).hash == ""
    assert run_turn(Episode.start("e#1", traced), ScriptedPort([FINISH])).hash != ""
