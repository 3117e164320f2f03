"""W's ledger at its edges (found by mutation testing): one bad receipt never stops the others from settling,
overflow is counted per entry, and the board the model reads is rendered exactly."""

from __future__ import annotations

from components.memory.ledger import Ledger, WMOptions
from components.runtime.types import Intent, Proposal, Receipt

CANCEL = "cancel_pending_order"


def ledger(max_entries: int = 8, bind_on: tuple[str, ...] = ()) -> Ledger:
    return Ledger(WMOptions(max_entries=max_entries, bind_on=list(bind_on)))


def intent(order: str, tool: str = CANCEL, note: str = "", **args: str) -> Intent:
    return Intent(tool=tool, args={"order_id": order, **args}, note=note)


def receipt(
    order: str, *, ok: bool = True, genuine: bool = True, write: bool = True, content=None, call_id: str = "c1"
) -> Receipt:
    return Receipt(
        call_id=call_id, tool=CANCEL, args={"order_id": order}, ok=ok, genuine=genuine, write=write, content=content
    )


def test_a_receipt_that_cannot_settle_does_not_hide_the_ones_after_it():
    led = ledger(bind_on=("order_id",))
    led.apply_proposal(Proposal(pending=[intent("#1"), intent("#2"), intent("#3")]))
    settled = led.settle(
        [
            receipt("#1", genuine=False, call_id="fake"),  # synthetic: skipped
            receipt("#2", ok=False, content={"error": "try again"}, call_id="failed"),  # not final
            receipt("#2", write=False, call_id="read"),  # a read: skipped
            receipt("#3", call_id="real3"),
            receipt("#1", call_id="real1"),
        ]
    )
    assert settled == [("e3", "done"), ("e1", "done")]
    assert [(e.status, e.evidence) for e in led.entries] == [("done", "real1"), ("pending", None), ("done", "real3")]


def test_overflow_counts_every_entry_left_out():
    led = ledger(max_entries=2)
    result = led.apply_proposal(Proposal(pending=[intent(f"#{i}") for i in range(5)]))
    assert result.added == ["e1", "e2"] and result.overflow == 3


def test_tracked_intents_before_new_ones_do_not_stop_the_new_ones():
    led = ledger()
    led.apply_proposal(Proposal(pending=[intent("#1")]))
    result = led.apply_proposal(Proposal(pending=[intent("#1"), intent("#2"), intent("#3")]))
    assert result.added == ["e2", "e3"] and [e.args["order_id"] for e in led.pending()] == ["#1", "#2", "#3"]


def test_the_board_is_rendered_exactly():
    led = ledger(bind_on=("order_id",))
    assert led.render() == "## Working memory (ledger)\n- (no tracked work)"
    led.apply_proposal(Proposal(pending=[intent("#1", item_ids="i1"), intent("#2", note="customer asked twice")]))
    led.settle([receipt("#1", call_id="call_7")])
    assert led.render() == (
        "## Working memory (ledger)\n"
        "- [DONE] e1 cancel_pending_order item_ids=i1 order_id=#1 (receipt call_7)\n"
        "- [PENDING] e2 cancel_pending_order order_id=#2 customer asked twice"
    )
    assert led.render(only_pending=True) == (
        "## Working memory (ledger)\n- [PENDING] e2 cancel_pending_order order_id=#2 customer asked twice"
    )
