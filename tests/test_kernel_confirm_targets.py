"""The kernel hands the pre-write checker the benchmark's `targets` (which args identify a write's target): a
confirmation of the same order covers the write even when a non-identifying arg was worded differently, and one of
another order does not (found by mutation testing of components/runtime/kernel.py: no test ran the checker through
the kernel without `match_args`, so dropping `targets` went unnoticed)."""

from __future__ import annotations

import pytest

from components.memory import load_package
from components.runtime.kernel import Episode, run_turn
from components.runtime.types import Turn
from tests.test_runtime import WRITE, ScriptedPort, write_draft


@pytest.fixture
def confirm_only(tmp_path):
    (tmp_path / "manifest.yaml").write_text(
        "name: confirm-only\ncheckers:\n  - use: confirm_before_write\n    at: pre_write\n"
    )
    return load_package(tmp_path)


def granted(order: str, reason: str) -> list[Turn]:
    return [
        Turn(role="user", text=f"cancel {order}"),
        Turn(
            role="tool",
            text='{"confirmed": true}',
            tool="confirm",
            granted=True,
            args={"tool": WRITE, "args": {"order_id": order, "reason": reason}, "summary": f"cancel {order}"},
        ),
    ]


def turn(pkg, order: str, transcript: list[Turn], targets: dict) -> tuple:
    port = ScriptedPort([write_draft(order)], transcript=transcript)
    port.targets = targets
    step = run_turn(Episode.start("e#0", pkg), port)
    return step, port


def test_the_benchmarks_targets_decide_what_a_confirmation_must_match(confirm_only):
    # the write says reason 'no longer needed'; the customer confirmed the cancel of #W1 in other words
    said = granted("#W1", "changed my mind")
    step, port = turn(confirm_only, "#W1", said, {WRITE: ["order_id"]})
    assert step.blocked is None and port.calls.count("draft") == 1
    assert step.checks == [
        {"strategy": "confirm_before_write", "event": "pre_write", "ok": True, "reason": "", "attempt": 0}
    ]

    other, _ = turn(confirm_only, "#W2", said, {WRITE: ["order_id"]})  # the confirmed order is the target
    assert other.blocked and "confirm" in other.blocked

    # a tool the benchmark does not list: every arg the confirmation named must match the write's
    unlisted, _ = turn(confirm_only, "#W1", said, {})
    assert unlisted.blocked and "confirm" in unlisted.blocked
    # and a tool whose target is the session: any granted confirmation of that tool covers it
    session, _ = turn(confirm_only, "#W2", said, {WRITE: []})
    assert session.blocked is None
