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
            self._pending.append(Receipt(call_id=draft.tool_call.id, tool=draft.tool_call.name,
                                         args=draft.tool_call.args, ok=True, genuine=self.receipt_genuine,
                                         write=draft.tool_call.name in self.write_tools))
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
    port = ScriptedPort([write_draft(), Draft(content="To confirm: I will cancel order #W1. Shall I proceed? (yes/no)")])
    step = run_turn(Episode.start("e#0", reference), port)
    assert step.blocked is None and step.action["kind"] == "message"
    assert step.first_draft["tool"] == WRITE


def test_only_genuine_receipts_settle_the_ledger(reference, tmp_path):
    pkg_dir = tmp_path / "p"
    shutil.copytree("data/packages/reference", pkg_dir)
    text = (pkg_dir / "manifest.yaml").read_text().replace("  - use: confirm_before_write\n    at: pre_write\n    cfg:\n      match_args: [order_id]\n", "")
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


def test_model_claims_never_settle(reference):
    ep = Episode.start("e#0", reference)
    port = ScriptedPort([Draft(content="All done, order cancelled!")])
    for _ in range(3):
        run_turn(ep, port)
    assert [e.status for e in ep.ledger.entries] == ["pending"]


def test_trace_steps_are_content_hashed(reference):
    ep = Episode.start("e#0", reference)
    step = run_turn(ep, ScriptedPort([Draft(content="hello")]))
    assert step.hash == step.content_hash() and len(step.hash) == 64
    assert (step.episode_id, step.step) == ("e#0", 0)
    tampered = step.model_copy(update={"delivered": []})
    assert tampered.content_hash() != step.hash
