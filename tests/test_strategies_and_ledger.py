"""Behaviour of W (the ledger and its law of write authority) and of the built-in deliverers and checkers."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from components.memory.cards import Card, CardMeta, Trigger
from components.memory.events import AGENT_DECLARES_DONE, INTENT_RECORDED, PRE_WRITE, TURN_START
from components.memory.ledger import Ledger, WMOptions
from components.memory.strategies import CHECKERS, DELIVERERS, CheckContext, DeliveryContext
from components.runtime.types import Draft, Intent, Proposal, Receipt, ToolCall, Turn

CANCEL = "cancel_pending_order"
RETURN = "return_delivered_order_items"
MODIFY = "modify_pending_order_address"
READ = "get_order_details"
WRITE_TOOLS = frozenset({CANCEL, RETURN, MODIFY})


# -- helpers -----------------------------------------------------------------------------------------------------


def ledger(max_entries: int = 8, bind_on: list[str] | None = None) -> Ledger:
    return Ledger(WMOptions(max_entries=max_entries, bind_on=bind_on or []))


def intent(order: str, tool: str = CANCEL, note: str = "") -> Intent:
    return Intent(tool=tool, args={"order_id": order}, note=note)


def propose(led: Ledger, *intents: Intent):
    return led.apply_proposal(Proposal(pending=list(intents)))


def receipt(
    order: str,
    tool: str = CANCEL,
    *,
    ok: bool = True,
    genuine: bool = True,
    write: bool = True,
    content=None,
    call_id: str = "call-1",
) -> Receipt:
    return Receipt(
        call_id=call_id, tool=tool, args={"order_id": order}, ok=ok, genuine=genuine, write=write, content=content
    )


def statuses(led: Ledger) -> dict[str, str]:
    return {e.args.get("order_id"): e.status for e in led.entries}


def card(id: str, event: str | None = None, tool: str | None = None, type: str = "procedure") -> Card:
    trigger = Trigger(event=event, tool=tool) if event else None
    meta = CardMeta(id=id, type=type, trigger=trigger, source="tests")
    return Card(meta=meta, body=f"body of {id}", path=f"em/{type}/{id}.md")


def deliverer(name: str, **cfg):
    return DELIVERERS.get(name).build(cfg)


def checker(name: str, **cfg):
    return CHECKERS.get(name).build(cfg)


def dctx(event: str, cards: list[Card], tools=(), led: Ledger | None = None, counts=None) -> DeliveryContext:
    return DeliveryContext(
        event=event,
        tools=frozenset(tools),
        ledger=led or ledger(),
        cards={c.id: c for c in cards},
        delivered_counts=dict(counts or {}),
    )


def write_draft(order: str = "#W0000001", tool: str = CANCEL) -> Draft:
    return Draft(
        content="", tool_call=ToolCall(id="d1", name=tool, args={"order_id": order, "reason": "no longer needed"})
    )


def cctx(draft: Draft, transcript: list[Turn], event: str = PRE_WRITE, led: Ledger | None = None) -> CheckContext:
    return CheckContext(
        event=event, draft=draft, ledger=led or ledger(), transcript=transcript, write_tools=WRITE_TOOLS
    )


def user(text: str) -> Turn:
    return Turn(role="user", text=text)


def agent(text: str) -> Turn:
    return Turn(role="assistant", text=text)


def tool_turns(tool: str, *, write: bool, ok: bool = True) -> list[Turn]:
    """How the chat port records an executed call: the assistant's call line, then the tool's result line."""
    return [Turn(role="assistant", text="", tool=tool), Turn(role="tool", text="{}", tool=tool, write=write, ok=ok)]


ASKED = [
    user("Please cancel order #W0000001, I don't need it."),
    agent("I can cancel order #W0000001 (reason: no longer needed). Shall I proceed? (yes/no)"),
]


# -- ledger: the model proposes, only genuine receipts settle ----------------------------------------------------


def test_proposals_never_mark_an_entry_done():
    led = ledger()
    for _ in range(5):
        res = propose(led, intent("#W1", note="done, already cancelled"))
        assert res.overflow == 0
    assert [(e.id, e.status, e.evidence) for e in led.entries] == [("e1", "pending", None)]
    assert [e.id for e in led.pending()] == ["e1"]
    assert led.history == []


def test_proposal_cannot_smuggle_a_status():
    led = ledger()
    led.apply_proposal(
        Proposal.model_validate(
            {"pending": [{"tool": CANCEL, "args": {"order_id": "#W1"}, "status": "done", "evidence": "fake"}]}
        )
    )
    assert statuses(led) == {"#W1": "pending"}
    assert led.entries[0].evidence is None


def test_genuine_write_receipt_settles_done():
    led = ledger()
    propose(led, intent("#W1"))
    assert led.settle([receipt("#W1", call_id="c-42")]) == [("e1", "done")]
    e = led.entries[0]
    assert (e.status, e.evidence) == ("done", "c-42")
    assert led.pending() == []
    assert "[DONE] e1" in led.render() and "receipt c-42" in led.render()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"genuine": False},  # synthetic (a bounce, a block, a made-up result)
        {"genuine": False, "ok": False, "content": {"blocking": True}},
        {"write": False},  # a genuine read
        {"write": False, "tool": CANCEL},
        {"genuine": False, "write": False},
    ],
    ids=["synthetic-ok", "synthetic-blocking", "read", "read-same-tool", "synthetic-read"],
)
def test_non_genuine_or_read_receipts_never_settle(kwargs):
    led = ledger()
    propose(led, intent("#W1"))
    r = receipt("#W1", **kwargs)
    assert led.settle([r, r]) == []
    assert statuses(led) == {"#W1": "pending"}
    assert led.entries[0].evidence is None


def test_harness_blocked_receipt_never_settles():
    """The receipt the chat port makes up for a call the kernel blocked."""
    led = ledger()
    propose(led, intent("#W1"))
    blocked = Receipt(
        call_id="c1",
        tool=CANCEL,
        args={"order_id": "#W1"},
        ok=False,
        code="blocked",
        content={"error": "blocked by the harness: ..."},
        genuine=False,
        write=True,
    )
    assert led.settle([blocked]) == []
    assert statuses(led) == {"#W1": "pending"}


def test_failed_blocking_receipt_settles_blocked():
    led = ledger()
    propose(led, intent("#W1"))
    assert led.settle([receipt("#W1", ok=False, content={"blocking": True}, call_id="c9")]) == [("e1", "blocked")]
    assert (led.entries[0].status, led.entries[0].evidence) == ("blocked", "c9")
    assert led.pending() == []


@pytest.mark.parametrize(
    "content",
    [{"error": "order is not pending"}, {"blocking": False}, None, "blocking"],
    ids=["error", "blocking-false", "none", "string"],
)
def test_failed_non_blocking_receipt_leaves_pending(content):
    led = ledger()
    propose(led, intent("#W1"))
    assert led.settle([receipt("#W1", ok=False, content=content)]) == []
    assert statuses(led) == {"#W1": "pending"}


def test_bind_on_empty_settles_every_pending_entry_of_the_tool():
    led = ledger(bind_on=[])
    propose(led, intent("#W1"), intent("#W2"), intent("#W3", tool=RETURN))
    settled = led.settle([receipt("#W9")])  # any order id: only the tool binds
    assert sorted(settled) == [("e1", "done"), ("e2", "done")]
    assert statuses(led) == {"#W1": "done", "#W2": "done", "#W3": "pending"}


def test_bind_on_order_id_settles_only_the_matching_entry():
    led = ledger(bind_on=["order_id"])
    propose(led, intent("#W1"), intent("#W2"), intent("#W1", tool=RETURN))
    assert led.settle([receipt("#W9")]) == []
    assert led.settle([receipt("#W2", call_id="c2")]) == [("e2", "done")]
    assert [(e.tool, e.args["order_id"], e.status) for e in sorted(led.entries, key=lambda e: e.id)] == [
        (CANCEL, "#W1", "pending"),
        (CANCEL, "#W2", "done"),
        (RETURN, "#W1", "pending"),
    ]


def test_settle_does_not_resettle():
    led = ledger()
    propose(led, intent("#W1"))
    led.settle([receipt("#W1", call_id="first")])
    assert led.settle([receipt("#W1", call_id="second"), receipt("#W1", ok=False, content={"blocking": True})]) == []
    assert (led.entries[0].status, led.entries[0].evidence) == ("done", "first")


def test_max_entries_caps_pending_and_reports_overflow():
    led = ledger(max_entries=2)
    res = propose(led, intent("#W1"), intent("#W2"), intent("#W3"))
    assert res.added == ["e1", "e2"] and res.overflow == 1
    assert [e.args["order_id"] for e in led.pending()] == ["#W1", "#W2"]
    # tracked entries the model still proposes keep their places, a new one overflows
    res = propose(led, intent("#W3"), intent("#W1"), intent("#W2"))
    assert res.added == [] and res.overflow == 1 and res.retired == []
    assert [e.args["order_id"] for e in led.pending()] == ["#W1", "#W2"]


def test_settled_entries_free_pending_places():
    led = ledger(max_entries=2, bind_on=["order_id"])
    propose(led, intent("#W1"), intent("#W2"))
    led.settle([receipt("#W1")])
    res = propose(led, intent("#W2"), intent("#W3"))
    assert res.overflow == 0 and res.added == ["e3"]
    assert len(led.pending()) == 2 and statuses(led) == {"#W1": "done", "#W2": "pending", "#W3": "pending"}


def test_duplicate_intents_in_one_proposal_are_one_entry():
    led = ledger(max_entries=2)
    res = propose(led, intent("#W1"), intent("#W1", note="again"), intent("#W2"))
    assert res.overflow == 0 and res.added == ["e1", "e2"]
    assert len(led.entries) == 2


def test_entry_no_longer_proposed_moves_to_history():
    led = ledger()
    propose(led, intent("#W1"), intent("#W2"))
    res = propose(led, intent("#W1"))
    assert res.retired == ["e2"]
    assert [(e.id, e.status, e.args["order_id"]) for e in led.history] == [("e2", "pending", "#W2")]
    assert [e.id for e in led.pending()] == ["e1"]
    assert "#W2" not in led.render()
    res = propose(led)  # proposing nothing retires everything pending
    assert res.retired == ["e1"] and led.pending() == [] and [e.id for e in led.history] == ["e2", "e1"]


def test_settled_entries_are_not_reopened_by_later_proposals():
    led = ledger(bind_on=["order_id"])
    propose(led, intent("#W1"))
    led.settle([receipt("#W1", call_id="c1")])
    for _ in range(3):
        res = propose(led, intent("#W1"), intent("#W2"))
        assert "e1" not in res.added and res.retired == []
    assert [(e.id, e.args["order_id"], e.status) for e in led.entries] == [
        ("e1", "#W1", "done"),
        ("e2", "#W2", "pending"),
    ]
    # a proposal that omits a settled entry does not retire it either
    res = propose(led)
    assert res.retired == ["e2"]
    assert [(e.id, e.status, e.evidence) for e in led.entries] == [("e1", "done", "c1")]
    assert led.history[-1].id == "e2"


def test_blocked_entries_are_not_reopened():
    led = ledger()
    propose(led, intent("#W1"))
    led.settle([receipt("#W1", ok=False, content={"blocking": True})])
    res = propose(led, intent("#W1"))
    assert res.added == [] and statuses(led) == {"#W1": "blocked"}


# -- deliverers ----------------------------------------------------------------------------------------------------


CARDS = [
    card("cancel-rule", INTENT_RECORDED, CANCEL),
    card("return-rule", INTENT_RECORDED, RETURN),
    card("any-intent", INTENT_RECORDED),
    card("greeting", TURN_START, type="knowledge"),
    card("cancel-at-start", TURN_START, CANCEL),
    card("write-guard", PRE_WRITE, CANCEL, type="action_result"),
    card("untriggered", type="knowledge"),
]


@pytest.mark.parametrize(
    "event, tools, expected",
    [
        (INTENT_RECORDED, {CANCEL}, ("cancel-rule", "any-intent")),
        (INTENT_RECORDED, {RETURN, READ}, ("return-rule", "any-intent")),
        (INTENT_RECORDED, set(), ("any-intent",)),
        (INTENT_RECORDED, {CANCEL, RETURN}, ("cancel-rule", "return-rule", "any-intent")),
        (TURN_START, {CANCEL}, ("greeting", "cancel-at-start")),
        (TURN_START, set(), ("greeting",)),
        (PRE_WRITE, {CANCEL}, ("write-guard",)),
        (PRE_WRITE, {MODIFY}, ()),
    ],
)
def test_event_cards_delivers_matching_event_and_tool(event, tools, expected):
    out = deliverer("event_cards")(dctx(event, CARDS, tools))
    assert out.card_ids == expected
    assert out.notes == ()


def test_event_cards_respects_max_per_episode():
    run = deliverer("event_cards", max_per_episode=2)
    ctx = lambda counts: dctx(INTENT_RECORDED, CARDS, {CANCEL}, counts=counts)  # noqa: E731
    assert run(ctx({})) == run(ctx({"cancel-rule": 1})) == deliverer("event_cards")(ctx({}))
    assert run(ctx({"cancel-rule": 1})).card_ids == ("cancel-rule", "any-intent")
    assert run(ctx({"cancel-rule": 2})).card_ids == ("any-intent",)
    assert run(ctx({"cancel-rule": 3, "any-intent": 2})).card_ids == ()
    # counts of other cards do not matter; without a cap nothing is ever withheld
    assert run(ctx({"return-rule": 9})).card_ids == ("cancel-rule", "any-intent")
    assert deliverer("event_cards")(ctx({"cancel-rule": 100})).card_ids == ("cancel-rule", "any-intent")


def test_event_cards_types_filter():
    out = deliverer("event_cards", types=["knowledge"])(dctx(TURN_START, CARDS, {CANCEL}))
    assert out.card_ids == ("greeting",)


def test_all_cards_delivers_every_card_whatever_its_trigger():
    run = deliverer("all_cards")
    every = tuple(c.id for c in CARDS)
    for event in (TURN_START, INTENT_RECORDED, PRE_WRITE):
        assert run(dctx(event, CARDS, set(), counts={c.id: 50 for c in CARDS})).card_ids == every
    assert deliverer("all_cards", types=["knowledge", "action_result"])(dctx(TURN_START, CARDS)).card_ids == (
        "greeting",
        "write-guard",
        "untriggered",
    )


def test_state_reminder_renders_pending_entries():
    led = ledger(bind_on=["order_id"])
    propose(led, intent("#W0000001"), intent("#W0000002", tool=RETURN, note="refund to card"))
    led.settle([receipt("#W0000001", call_id="c7")])

    out = deliverer("state_reminder")(dctx(TURN_START, CARDS, led=led))
    assert out.card_ids == ()
    (note,) = out.notes
    assert "[PENDING] e2 return_delivered_order_items order_id=#W0000002 refund to card" in note
    assert "#W0000001" not in note and "DONE" not in note

    (full,) = deliverer("state_reminder", only_pending=False)(dctx(TURN_START, CARDS, led=led)).notes
    assert "[DONE] e1 cancel_pending_order order_id=#W0000001 (receipt c7)" in full
    assert "[PENDING] e2" in full


def test_state_reminder_with_empty_ledger():
    (note,) = deliverer("state_reminder")(dctx(INTENT_RECORDED, [])).notes
    assert "(no tracked work)" in note


def test_strategy_options_are_typed():
    with pytest.raises(ValidationError):
        DELIVERERS.get("event_cards").build({"max_per_episode": "three"})
    with pytest.raises(ValidationError):
        DELIVERERS.get("event_cards").build({"max_per_episod": 3})
    with pytest.raises(ValidationError):
        CHECKERS.get("confirm_before_write").build({"match_args": "order_id"})
    assert DELIVERERS.get("no_such_thing") is None


# -- checkers: completion_requires_receipts ------------------------------------------------------------------------


FINISH = Draft(content="All done!", tool_call=ToolCall(id="f1", name="finish"))


def test_completion_bounces_while_an_entry_is_pending_and_passes_when_settled():
    check = checker("completion_requires_receipts")
    led = ledger(bind_on=["order_id"])
    propose(led, intent("#W0000001"), intent("#W0000002"))

    v = check(cctx(FINISH, [], AGENT_DECLARES_DONE, led))
    assert not v.ok
    assert v.details == {"open": ["e1", "e2"]}
    assert "order_id=#W0000001" in v.reason and "order_id=#W0000002" in v.reason

    led.settle([receipt("#W0000001")])
    v = check(cctx(FINISH, [], AGENT_DECLARES_DONE, led))
    assert not v.ok and v.details == {"open": ["e2"]}

    led.settle([receipt("#W0000002", ok=False, content={"blocking": True})])
    assert check(cctx(FINISH, [], AGENT_DECLARES_DONE, led)).ok


def test_completion_passes_with_nothing_tracked():
    assert checker("completion_requires_receipts")(cctx(FINISH, [], AGENT_DECLARES_DONE)).ok


def test_completion_ignores_a_model_claim_of_completion():
    check = checker("completion_requires_receipts")
    led = ledger()
    propose(led, intent("#W1", note="DONE"))
    propose(led, intent("#W1", note="DONE - confirmed cancelled"))
    assert not check(cctx(FINISH, [], AGENT_DECLARES_DONE, led)).ok


def test_completion_blocked_entries_when_not_allowed():
    led = ledger()
    propose(led, intent("#W1"))
    led.settle([receipt("#W1", ok=False, content={"blocking": True})])
    assert checker("completion_requires_receipts")(cctx(FINISH, [], AGENT_DECLARES_DONE, led)).ok
    v = checker("completion_requires_receipts", allow_blocked=False)(cctx(FINISH, [], AGENT_DECLARES_DONE, led))
    assert not v.ok and v.details == {"open": ["e1"]}


# -- checkers: confirm_before_write (the structured `confirm` event; runtime/confirm.py is the rule) ---------------


def confirmed(order: str = "#W0000001", tool: str = CANCEL, granted: bool = True, **extra) -> list[Turn]:
    """How the chat port records a `confirm`: the assistant's call line, then the world's answer."""
    args = {"tool": tool, "args": {"order_id": order, **extra}, "summary": f"{tool} {order}"}
    return [
        Turn(role="assistant", text="", tool="confirm"),
        Turn(role="tool", text=f'{{"confirmed": {str(granted).lower()}}}', tool="confirm", args=args, granted=granted),
    ]


TARGETS = {CANCEL: ["order_id"], RETURN: ["order_id"], MODIFY: ["order_id"]}


def tctx(draft: Draft, transcript: list[Turn], targets=TARGETS) -> CheckContext:
    return CheckContext(
        event=PRE_WRITE,
        draft=draft,
        ledger=ledger(),
        transcript=transcript,
        write_tools=WRITE_TOOLS,
        targets=dict(targets),
    )


def test_confirm_passes_after_a_granted_confirmation_of_this_write():
    assert checker("confirm_before_write")(tctx(write_draft(), ASKED + confirmed())).ok


@pytest.mark.parametrize("reply", ["yes", "Yes, please proceed.", "I confirm.", "No, don't go ahead."])
def test_words_in_the_users_reply_are_not_a_confirmation(reply):
    """Whatever the customer types, only the structured event counts: "No, don't go ahead" is no yes, and no
    "yes" is one either."""
    v = checker("confirm_before_write")(tctx(write_draft(), ASKED + [user(reply)]))
    assert not v.ok and CANCEL in v.reason and "`confirm`" in v.reason


def test_confirm_bounces_a_denied_confirmation_and_one_never_asked():
    check = checker("confirm_before_write")
    assert not check(tctx(write_draft(), ASKED + confirmed(granted=False))).ok
    assert not check(tctx(write_draft(), [])).ok


def test_a_confirmation_for_another_order_or_tool_does_not_cover_the_write():
    check = checker("confirm_before_write")
    assert not check(tctx(write_draft("#W0000001"), confirmed("#W0000002"))).ok
    assert not check(tctx(write_draft("#W0000001"), confirmed("#W0000001", tool=RETURN))).ok
    # the latest confirmation decides: an older grant for this order is superseded by a newer one for another
    assert not check(tctx(write_draft("#W0000001"), confirmed("#W0000001") + confirmed("#W0000002"))).ok
    assert check(tctx(write_draft("#W0000002"), confirmed("#W0000001") + confirmed("#W0000002"))).ok


def test_a_write_after_a_write_needs_a_fresh_confirmation():
    check = checker("confirm_before_write")
    assert not check(tctx(write_draft(), confirmed() + tool_turns(CANCEL, write=True))).ok
    assert not check(tctx(write_draft(tool=MODIFY), confirmed() + tool_turns(CANCEL, write=True))).ok
    assert check(tctx(write_draft(), confirmed() + tool_turns(CANCEL, write=True) + confirmed())).ok


def test_confirm_is_not_consumed_by_reads_messages_or_failed_writes():
    check = checker("confirm_before_write")
    assert check(tctx(write_draft(), confirmed() + tool_turns(READ, write=False))).ok
    assert check(tctx(write_draft(), confirmed() + tool_turns(CANCEL, write=True, ok=False))).ok
    assert check(tctx(write_draft(), confirmed() + [agent("One more thing..."), user("sure")])).ok


def test_confirm_identifies_the_target_by_the_benchmarks_targets_only():
    # the write's other args (here `reason`) need not be in the confirmation; an unlisted tool falls back to
    # matching every arg the confirmation names; `[]` (the session) is covered by any confirmation of the tool
    check = checker("confirm_before_write")
    assert check(tctx(write_draft(), confirmed(), targets={})).ok
    assert not check(tctx(write_draft(), confirmed(reason="other"), targets={})).ok
    assert check(tctx(write_draft(), confirmed(reason="other"))).ok
    assert check(tctx(write_draft("#W0000001"), confirmed("#W0000002"), targets={CANCEL: []})).ok


def test_confirm_match_args_must_match_as_well():
    check = checker("confirm_before_write", match_args=["reason"])
    assert not check(tctx(write_draft(), confirmed(reason="other"))).ok
    assert check(tctx(write_draft(), confirmed(reason="no longer needed"))).ok


@pytest.mark.parametrize(
    "draft",
    [
        Draft(content="Shall I cancel it?"),
        Draft(tool_call=ToolCall(id="r1", name=READ, args={"order_id": "#W0000001"})),
        Draft(tool_call=ToolCall(id="c1", name="confirm", args={"tool": CANCEL, "args": {}, "summary": "x"})),
        FINISH,
    ],
    ids=["message", "read-tool", "confirm", "finish"],
)
def test_confirm_ignores_non_write_drafts(draft):
    assert checker("confirm_before_write")(tctx(draft, [user("cancel it")])).ok
    assert checker("confirm_before_write")(tctx(draft, [])).ok


def test_confirm_tools_option_limits_the_guarded_tools():
    check = checker("confirm_before_write", tools=[CANCEL])
    assert check(tctx(write_draft(tool=MODIFY), [user("change my address")])).ok  # a write, but not guarded
    assert not check(tctx(write_draft(tool=CANCEL), [user("cancel it")])).ok


def test_the_removed_affirmations_option_is_a_clear_load_error():
    from components.errors import InputError

    with pytest.raises(InputError, match=r"checkers\[0\]\.cfg\.affirmations: .*option removed.*`confirm`"):
        CHECKERS.make("confirm_before_write", {"affirmations": ["do it"]}, where="manifest.yaml: checkers[0].cfg")
