"""The invariant kernel: phase order, one redraft then block, write authority, trace hashing."""

from __future__ import annotations

import shutil

import pytest

from components.memory import load_package
from components.runtime.kernel import Episode, run_turn
from components.runtime.types import Draft, Intent, Proposal, Receipt, ToolCall, Turn

WRITE = "cancel_pending_order"


class ScriptedPort:
    """A test double for a world + model: scripted proposals and drafts, records every call the kernel makes."""

    write_tools = frozenset({WRITE})
    proposes = True
    targets = {WRITE: ["order_id"]}

    def __init__(self, drafts, proposal=None, receipt_genuine=True, transcript=None):
        self.calls: list[str] = []
        self.drafts = list(drafts)
        self.proposal = proposal or Proposal(pending=[Intent(tool=WRITE, args={"order_id": "#W1"})], next_tool=WRITE)
        self.receipt_genuine = receipt_genuine
        self._pending: list[Receipt] = []
        self._turns = transcript or [Turn(role="user", text="cancel #W1")]
        self.memories: list[str] = []
        self.feedback: list[str | None] = []
        self.committed: list[tuple[Draft, str | None]] = []

    ended = False

    def receipts(self):
        self.calls.append("receipts")
        out, self._pending = self._pending, []
        return out

    def propose(self, memory):
        self.calls.append("propose")
        self.memories.append(memory)
        return self.proposal

    def draft(self, memory, feedback=None):
        self.calls.append("draft")
        self.memories.append(memory)
        self.feedback.append(feedback)
        return self.drafts.pop(0) if len(self.drafts) > 1 else self.drafts[0]

    def transcript(self):
        return list(self._turns)

    def commit(self, draft, blocked=None):
        self.calls.append("commit")
        self.committed.append((draft, blocked))
        if draft.tool_call and not blocked:
            self._pending.append(
                Receipt(
                    call_id=draft.tool_call.id,
                    tool=draft.tool_call.name,
                    args=draft.tool_call.args,
                    ok=True,
                    genuine=self.receipt_genuine,
                    write=draft.tool_call.name in self.write_tools,
                )
            )
        return {"ok": True}


def write_draft(oid="#W1", cid="c1"):
    return Draft(tool_call=ToolCall(id=cid, name=WRITE, args={"order_id": oid, "reason": "no longer needed"}))


FINISH = Draft(tool_call=ToolCall(id="f", name="finish", args={"summary": "done"}))


@pytest.fixture
def reference():
    return load_package("data/packages/reference")


def test_phase_order_is_fixed(reference):
    port = ScriptedPort([Draft(content="Shall I cancel order #W1? (yes/no)")])
    step = run_turn(Episode.start("e#0", reference), port)
    assert port.calls == ["receipts", "propose", "draft", "commit"]
    # the card routed at intent_recorded reached the draft, not the proposal
    assert "cancel-reason" in step.delivered
    assert "card cancel-reason" in port.memories[1] and "card cancel-reason" not in port.memories[0]


def test_a_port_that_asks_no_state_takes_the_drafts_tool_as_the_intent(reference):
    """Under a reference protocol (`port.proposes` false) there is no state call: the draft comes first, its tool is
    the intent, and a card routed to that tool at intent_recorded earns one redraft with the card in memory."""
    # a message draft calls up nothing: no redraft for it
    port = ScriptedPort([Draft(content="Shall I cancel order #W1? (yes/no)")])
    port.proposes = False
    step = run_turn(Episode.start("e#0", reference), port)
    assert port.calls == ["receipts", "draft", "commit"] and step.proposal == {"pending": [], "next_tool": None}
    # a write draft: the card about it arrives, and the model drafts again with it in memory
    port = ScriptedPort([write_draft(), write_draft(), write_draft()])
    port.proposes = False
    step = run_turn(Episode.start("e#0", reference), port)
    assert port.calls[:3] == ["receipts", "draft", "draft"] and "redraft:intent" in step.fingerprint
    assert step.proposal["next_tool"] == WRITE and "cancel-reason" in step.delivered
    assert "card cancel-reason" not in port.memories[0] and "card cancel-reason" in port.memories[1]
    assert step.first_draft["tool"] == WRITE


def test_one_redraft_then_block(reference):
    # the write is never confirmed: confirm_before_write bounces the draft and its redraft
    port = ScriptedPort([write_draft(), write_draft()])
    step = run_turn(Episode.start("e#0", reference), port)
    assert port.calls.count("draft") == 2  # at most one redraft per turn
    assert port.feedback[0] is None and "confirmation" in port.feedback[1]
    assert step.blocked and "confirmation" in step.blocked
    assert port.committed[-1][1] == step.blocked  # committed as blocked: never executed
    assert "redraft" in step.fingerprint and "block" in step.fingerprint


def test_redraft_that_fixes_the_draft_is_committed(reference):
    ask = Draft(
        tool_call=ToolCall(
            id="k1", name="confirm", args={"tool": WRITE, "args": {"order_id": "#W1"}, "summary": "cancel #W1"}
        )
    )
    port = ScriptedPort([write_draft(), ask])
    step = run_turn(Episode.start("e#0", reference), port)
    assert step.blocked is None and step.action["tool"] == "confirm"  # asking is not a write: never bounced
    assert step.first_draft["tool"] == WRITE


def test_a_granted_confirmation_in_the_transcript_lets_the_write_through(reference):
    granted = [
        Turn(role="user", text="cancel #W1"),
        Turn(role="assistant", text="", tool="confirm"),
        Turn(
            role="tool",
            text='{"confirmed": true}',
            tool="confirm",
            granted=True,
            args={"tool": WRITE, "args": {"order_id": "#W1"}, "summary": "cancel #W1"},
        ),
    ]
    step = run_turn(Episode.start("e#0", reference), ScriptedPort([write_draft()], transcript=granted))
    assert step.blocked is None and step.action["tool"] == WRITE
    other = run_turn(Episode.start("e#0", reference), ScriptedPort([write_draft("#W2")], transcript=granted))
    assert other.blocked and "confirm" in other.blocked  # granted for #W1, not for #W2


def test_only_genuine_receipts_settle_the_ledger(reference, tmp_path):
    pkg_dir = tmp_path / "p"
    shutil.copytree("data/packages/reference", pkg_dir)
    text = (
        (pkg_dir / "manifest.yaml")
        .read_text()
        .replace("  - use: confirm_before_write\n    at: pre_write\n    cfg:\n      match_args: [order_id]\n", "")
    )
    (pkg_dir / "manifest.yaml").write_text(text)
    pkg = load_package(pkg_dir)
    for genuine, expect in ((False, "pending"), (True, "done")):
        ep = Episode.start("e#0", pkg)
        port = ScriptedPort([write_draft(), FINISH], receipt_genuine=genuine)
        run_turn(ep, port)  # writes
        second = run_turn(ep, port)  # grounds the receipt first, then finishes
        assert ep.ledger.entries[0].status == expect
        if genuine:
            assert "ground:e1:done" in second.fingerprint and second.blocked is None
        else:  # completion_requires_receipts keeps bouncing: a synthetic receipt is no evidence
            assert second.blocked and "cannot finish" in second.blocked


@pytest.fixture
def unchecked(tmp_path):
    """The reference package without confirm_before_write, so a drafted write is committed and produces a receipt."""
    pkg_dir = tmp_path / "unchecked"
    shutil.copytree("data/packages/reference", pkg_dir)
    text = (pkg_dir / "manifest.yaml").read_text()
    gone = "  - use: confirm_before_write\n    at: pre_write\n    cfg:\n      match_args: [order_id]\n"
    assert gone in text
    (pkg_dir / "manifest.yaml").write_text(text.replace(gone, ""))
    return load_package(pkg_dir)


def test_model_claims_never_settle(unchecked):
    """Claims of success (messages, a receipt for another order) leave the entry pending; the genuine receipt for the
    entry's own write, from the same port, settles it at the next turn's grounding."""
    ep = Episode.start("e#0", unchecked)
    claim = Draft(content="All done, order #W1 cancelled!")
    port = ScriptedPort([write_draft("#W2", "c0"), claim, claim, write_draft("#W1", "c1"), claim])
    steps = [run_turn(ep, port) for _ in range(4)]
    assert [d.tool_call.args["order_id"] for d, blocked in port.committed if d.tool_call and not blocked] == [
        "#W2",
        "#W1",
    ]
    for step in steps:  # the receipt for #W2 was grounded at turn 1 and bound nothing (bind_on: order_id)
        assert [(e["args"]["order_id"], e["status"]) for e in step.state_after] == [("#W1", "pending")]
        assert not any(f.startswith("ground:") for f in step.fingerprint)
    settled = run_turn(ep, port)  # grounds the receipt of #W1 written in the previous turn
    assert "ground:e1:done" in settled.fingerprint
    assert [(e.status, e.evidence) for e in ep.ledger.entries] == [("done", "c1")]


# -- the pre-write bounce: a card that arrives at the write boundary sends the draft back once --------------------

PRE_WRITE_MANIFEST = """name: pre-write
wm:
  board: false
delivery:
  - use: event_cards
    at: pre_write
    cfg:
      max_per_episode: {max_per_episode}
checkers: []
"""
PRE_WRITE_CARD = """---
id: cancel-reason
type: procedure
trigger:
  event: pre_write
  tool: cancel_pending_order
source: test
---
The `reason` of `cancel_pending_order` must be exactly 'no longer needed' or 'ordered by mistake'.
"""


def pre_write_package(tmp_path, max_per_episode=6):
    root = tmp_path / f"pw{max_per_episode}"
    (root / "em/procedure").mkdir(parents=True)
    (root / "manifest.yaml").write_text(PRE_WRITE_MANIFEST.format(max_per_episode=max_per_episode))
    (root / "em/procedure/cancel-reason.md").write_text(PRE_WRITE_CARD)
    return load_package(root)


def test_a_card_delivered_at_pre_write_bounces_the_write_once(tmp_path):
    ep = Episode.start("e#0", pre_write_package(tmp_path))
    port = ScriptedPort([write_draft(cid="c1"), write_draft(cid="c2")])
    step = run_turn(ep, port)
    assert port.calls == ["receipts", "propose", "draft", "draft", "commit"]
    assert port.feedback == [None, "before `cancel_pending_order`, read the delivered card(s): cancel-reason"]
    assert (
        "card cancel-reason" not in port.memories[1] and "card cancel-reason" in port.memories[2]
    )  # the redraft sees it
    assert step.first_draft["tool"] == WRITE and step.blocked is None  # the redraft is committed, not blocked
    assert port.committed == [(write_draft(cid="c2"), None)]
    assert [f for f in step.fingerprint if not f.startswith("ledger:")] == [
        "deliver:cancel-reason@pre_write",
        "bounce:pre_write:cards",
        "redraft",
    ]
    assert step.delivered == ["cancel-reason"]
    assert step.deliveries == [
        {"event": "pre_write", "strategy": "event_cards", "cards": ["cancel-reason"], "notes": 0}
    ]
    # the next write in the episode: the card is delivered again (up to max_per_episode), and bounces again
    again = run_turn(ep, ScriptedPort([write_draft(cid="c3"), write_draft(cid="c4")]))
    assert "bounce:pre_write:cards" in again.fingerprint and ep.delivered_counts["cancel-reason"] == 2


def test_no_pre_write_bounce_when_nothing_new_arrives(tmp_path):
    # once max_per_episode is spent, the card no longer arrives, so the write goes through on the first draft
    ep = Episode.start("e#0", pre_write_package(tmp_path, max_per_episode=1))
    run_turn(ep, ScriptedPort([write_draft(cid="c1"), write_draft(cid="c2")]))
    port = ScriptedPort([write_draft(cid="c3")])
    step = run_turn(ep, port)
    assert port.calls.count("draft") == 1 and step.first_draft is None and step.delivered == []
    assert "bounce:pre_write:cards" not in step.fingerprint and port.committed[0][1] is None
    # a read (not a write tool) and a message never reach pre_write at all
    fresh_pkg = pre_write_package(tmp_path / "x")
    for draft in (
        Draft(tool_call=ToolCall(id="r", name="get_order_details", args={"order_id": "#W1"})),
        Draft(content="Shall I cancel #W1?"),
    ):
        fresh = Episode.start("e#1", fresh_pkg)
        p = ScriptedPort([draft])
        s = run_turn(fresh, p)
        assert p.calls.count("draft") == 1 and s.delivered == []
        assert not any(f.startswith(("deliver:", "bounce:", "redraft")) for f in s.fingerprint)


def test_a_pre_write_card_already_in_context_does_not_bounce(tmp_path):
    # the same card delivered earlier in the turn (at intent_recorded) is already in front of the model
    root = tmp_path / "both"
    (root / "em/procedure").mkdir(parents=True)
    (root / "manifest.yaml").write_text(
        PRE_WRITE_MANIFEST.format(max_per_episode=6).replace(
            "delivery:\n", "delivery:\n  - use: all_cards\n    at: intent_recorded\n"
        )
    )
    (root / "em/procedure/cancel-reason.md").write_text(PRE_WRITE_CARD)
    ep = Episode.start("e#0", load_package(root))
    port = ScriptedPort([write_draft(cid="c1")])
    step = run_turn(ep, port)
    assert "card cancel-reason" in port.memories[1]
    assert (
        port.calls.count("draft") == 1 and step.first_draft is None and "bounce:pre_write:cards" not in step.fingerprint
    )
    assert step.delivered == ["cancel-reason"] and ep.delivered_counts["cancel-reason"] == 1


def test_trace_steps_are_content_hashed(reference):
    ep = Episode.start("e#0", reference)
    step = run_turn(ep, ScriptedPort([Draft(content="hello")]))
    assert step.hash == step.content_hash() and len(step.hash) == 64
    assert (step.episode_id, step.step) == ("e#0", 0)
    tampered = step.model_copy(update={"delivered": []})
    assert tampered.content_hash() != step.hash
