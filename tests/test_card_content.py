"""E or rho for a card the corpus never had in memory at its write (components/evolution/outcomes.py `card_states`,
read by `findings.card_owner`): the card's own text against the rules train's gold shows, then the delivery timing.

Small hand-built traces; the package is a stand-in with its cards' ids and bodies (as tests/test_diagnose_mutants)."""

from __future__ import annotations

import pandas as pd

from components.evolution.diagnose import diagnose, diagnose_episode
from components.evolution.findings import card_owner
from components.evolution.outcomes import (
    Diff,
    TrainEvidence,
    WRONG_ARG,
    card_states,
    mentions,
    outcome_finding,
    predicted_wrong,
    rule_constants,
    statement_constants,
    unseen_value_finding,
)
from components.runtime.trace import steps_frame
from components.worlds.outcome_rules import Cond, FieldRule, Term
from tests.test_diagnose_mutants import ASK, CANCEL, FINISH, RETURN, TARGETS, WRITES, call, confirm, pkg, st

FEE = FieldRule(
    "refund_amount",
    Term("share", 0.95, "get_order_details.total"),
    Cond("get_order_details.placed_hours_ago", ">", 24),
    Term("equal", path="get_order_details.total"),
)
REASON = FieldRule("reason", Term("one_of", ("no longer needed", "ordered by mistake")))
ORIGINAL = FieldRule("payment_method_id", Term("equal", path="get_order_details.payment_method_id"))
BONUS = FieldRule(
    "refund_amount",
    Term("equal", path="get_order_details.total"),
    factors=((Cond("get_user_details.payment_methods[id=@payment_method_id].kind", "is", "gift_card"), 1.05),),
)


def test_a_rules_constants_are_what_stating_it_takes():
    assert rule_constants(FEE) == {0.95, 24}
    assert rule_constants(REASON) == {"no longer needed", "ordered by mistake"}
    assert rule_constants(ORIGINAL) == frozenset()  # a value a read showed: no constant to state
    assert rule_constants(BONUS) == {1.05}  # a category condition's value is the task's data, not the rule's
    capped = FieldRule("amount", Term("share", 5.0, "get_order_details.days_late"), cap=25.0)
    assert rule_constants(capped) == {5.0, 25.0}
    summed = FieldRule("fee", Term("sum", (10.0, ((35.0, "@bags"), (-35.0, "@free")))))
    assert rule_constants(summed) == {35.0, -35.0, 10.0}
    assert rule_constants(FieldRule("x", Term("upper"))) == frozenset()


def test_a_text_mentions_a_constant_as_written_or_as_a_percentage():
    assert mentions("The reason must be 'No Longer Needed'.", {"no longer needed"})
    assert mentions("a 5% cancellation fee", {0.95})  # a factor that takes 5% off
    assert mentions("a bonus of 5 percent", {1.05}) and mentions("raised by 5%", {0.05})
    assert mentions("after 24 hours", {24}) and not mentions("after 48 hours", {24})
    assert not mentions("send it to address1 as given", {1.0, 0.99})  # a digit inside a word is no number
    assert not mentions("the method the order was paid with", {0.95, "gift card"})
    assert not mentions("", {"x"}) and not mentions("anything", set())


def test_a_statement_carries_its_quoted_values_and_numbers():
    got = statement_constants(
        "`cancel_pending_order` takes a `reason` that must be exactly 'no longer needed' or "
        "'ordered by mistake'. Map the customer's own words; after 24 hours, a 5% fee."
    )
    assert got == {"no longer needed", "ordered by mistake", 24.0, 5.0}


def _refund(delivered_at=(), amount=100.0, method="gift_1", placed=30):
    """Reads (the customer's methods, the order), then a refund write at step 2, and a finish at step 3."""
    user = (
        {"kind": "tool", "tool": "get_user_details", "args": {"user_id": "u"}},
        {
            "ok": True,
            "content": {
                "payment_methods": [{"id": "gift_1", "kind": "gift_card"}, {"id": "card_1", "kind": "credit_card"}]
            },
        },
    )
    order = (
        {"kind": "tool", "tool": "get_order_details", "args": {"order_id": "1"}},
        {"ok": True, "content": {"payment_method_id": "card_1", "total": 100.0, "placed_hours_ago": placed}},
    )
    write = (
        {
            "kind": "tool",
            "tool": RETURN,
            "args": {"order_id": "1", "payment_method_id": method, "refund_amount": amount},
        },
        {"ok": True, "content": {}},
    )
    return [
        st(0, *user, delivered=["c"] if 0 in delivered_at else []),
        st(1, *order, delivered=["c"] if 1 in delivered_at else []),
        st(2, *write, delivered=["c"] if 2 in delivered_at else []),
        st(3, FINISH, delivered=["c"] if 3 in delivered_at else []),
    ]


def test_predicted_wrong_reads_the_rules_on_what_the_reads_showed():
    steps = _refund(method="card_1", amount=100.0, placed=30)
    assert predicted_wrong(steps[2], steps, {"refund_amount": FEE}, WRITES, TARGETS) == ["refund_amount"]
    steps = _refund(method="card_1", amount=95.0, placed=30)
    assert predicted_wrong(steps[2], steps, {"refund_amount": FEE}, WRITES, TARGETS) == []
    steps = _refund(method="card_1", amount=100.0, placed=10)
    assert predicted_wrong(steps[2], steps, {"refund_amount": FEE}, WRITES, TARGETS) == []
    # a rule whose feature no read showed is not judged
    assert predicted_wrong(steps[2], steps[2:], {"refund_amount": FEE}, WRITES, TARGETS) == []


def test_a_field_whose_rule_reads_another_argument_is_judged_on_that_argument_set_right():
    """Refunded to the gift card (wrong: the order's method is card_1) with no bonus: by the agent's own choice the
    amount lacks its 5% bonus, but on the method the write should have had there is none: one fault, not two."""
    steps = _refund(method="gift_1", amount=100.0)
    rules = {"payment_method_id": ORIGINAL, "refund_amount": BONUS}
    assert predicted_wrong(steps[2], steps, rules, WRITES, TARGETS) == ["payment_method_id"]
    assert predicted_wrong(steps[2], steps, {"refund_amount": BONUS}, WRITES, TARGETS) == ["refund_amount"]
    right = _refund(method="card_1", amount=100.0)
    assert predicted_wrong(right[2], right, rules, WRITES, TARGETS) == []


def test_card_states_by_the_constants_then_by_the_timing():
    steps = _refund(delivered_at=(3,))
    no_number = ["A refund made with `return_delivered_order_items` goes back to the method the order was paid with."]
    with_fee = ["`return_delivered_order_items`: refund the total less a 5% fee after 24 hours."]
    assert card_states(no_number, [rule_constants(FEE)], steps, 2, ["c"]) is False
    assert card_states(with_fee, [rule_constants(FEE)], steps, 2, ["c"]) is True
    assert card_states(with_fee, [rule_constants(FEE), rule_constants(REASON)], steps, 2, ["c"]) is False
    # nothing to check: the card delivered later in the episode than the write says routing
    assert card_states(no_number, [frozenset()], steps, 2, ["c"]) is True
    assert card_states(no_number, [], _refund(delivered_at=(0, 1)), 2, ["c"]) is None  # before it, not after
    assert card_states(no_number, [], _refund(delivered_at=(3,)), 2, ["other"]) is None  # another card
    assert card_states(no_number, [], _refund(), 2, ["c"]) is None


def test_card_owner_with_the_cards_text():
    def owner(helps, states, here=()):
        return card_owner(["c"], list(here), len(here), helps, "wrong_value", states)[:2]

    assert owner(None, None) == ("unknown", "card_unobserved")
    assert owner(None, True) == ("rho", "card_not_fired")
    assert owner(None, False) == ("E", "wrong_value")
    assert owner(True, False) == ("E", "wrong_value")  # helps elsewhere, but not with what went wrong here
    assert owner(True, None) == ("rho", "card_not_fired")
    assert owner(False, True) == ("E", "ineffective_card")
    assert owner(None, False, ["c"]) == ("E", "wrong_value")
    assert card_owner([], [], 0, None, "wrong_value", True)[:2] == ("E", "wrong_value")  # no card at all


def test_a_wrong_argument_on_train_is_owned_by_what_the_card_says():
    """With gold: the diffs name the wrong fields; the card lacking the fee's constants cannot have fixed the
    amount (E), one stating the allowed reasons would have fixed the reason (rho)."""
    steps = _refund(method="card_1", amount=100.0)
    amount = [Diff(WRONG_ARG, RETURN, (("order_id", "1"),), 2, steps[2].hash, "refund_amount", 100.0, 95.0)]
    plain = pkg(c=f"A refund made with `{RETURN}` goes back to the method the order was paid with.")
    f = outcome_finding("t#0", "t", amount, steps, plain, {RETURN: None}, {RETURN: {"refund_amount": FEE}})
    assert (f.owner, f.kind) == ("E", "wrong_value")
    with_fee = pkg(c=f"`{RETURN}` refunds the total less 5% when the order is older than 24 hours.")
    f = outcome_finding("t#0", "t", amount, steps, with_fee, {RETURN: None}, {RETURN: {"refund_amount": FEE}})
    assert (f.owner, f.kind) == ("rho", "card_not_fired")
    assert outcome_finding("t#0", "t", amount, steps, plain, {RETURN: None}).owner == "unknown"  # no rule, no timing
    late = _refund(delivered_at=(3,), method="card_1", amount=100.0)
    assert outcome_finding("t#0", "t", amount, late, plain, {RETURN: None}).owner == "rho"


def test_an_unseen_value_on_dev_is_owned_by_the_rules_train_showed():
    """Dev has no gold: the rules train's gold shows say which field of the episode's write is wrong."""
    plain = pkg(c=f"A refund made with `{RETURN}` goes back to the method the order was paid with.")
    ev = TrainEvidence(
        value_helps={RETURN: None},
        wrong_rate={RETURN: 1.0},
        unexplained=3,
        unexplained_wrong=3,
        rules={RETURN: {"refund_amount": FEE, "payment_method_id": ORIGINAL}},
    )
    fee_due = _refund(method="card_1", amount=100.0, placed=30)
    f = unseen_value_finding("t#0", "t", fee_due, plain, WRITES, ev, TARGETS)
    assert (f.owner, f.kind, f.tool) == ("E", "unseen_value", RETURN)  # the fee: no card states it
    wrong_method = _refund(method="gift_1", amount=100.0, placed=10)
    f = unseen_value_finding("t#0", "t", wrong_method, plain, WRITES, ev, TARGETS)
    assert (f.owner, f.kind) == ("rho", "card_not_fired")  # the method: a value a read showed, no constant to state
    nothing_wrong = _refund(method="card_1", amount=100.0, placed=10)
    assert unseen_value_finding("t#0", "t", nothing_wrong, plain, WRITES, ev, TARGETS).owner == "unknown"
    late = _refund(delivered_at=(3,), method="card_1", amount=100.0, placed=10)
    assert unseen_value_finding("t#0", "t", late, plain, WRITES, ev, TARGETS).owner == "rho"  # the card came after


def test_an_explained_refusal_is_owned_by_whether_the_card_states_the_rule():
    """No write had the card in memory: a card without the refused rule's constants is E, one with them rho; a
    statement with none to check falls back on the timing."""
    refused = call(CANCEL, "1", ok=False, rule_id="fee", rule="After 24 hours a 5% cancellation fee applies.")
    steps = [st(0, ASK), st(1, *refused), st(2, FINISH, delivered=["c"])]
    helps = {(CANCEL, "fee"): None}

    def one(card, trace=steps):
        return diagnose_episode(trace, "t", pkg(c=card), WRITES, episode_id="t#0", helps=helps, targets=TARGETS)

    assert (one(f"`{CANCEL}` takes a reason.").owner, one(f"`{CANCEL}` takes a reason.").kind) == (
        "E",
        "policy_refusal",
    )
    assert one(f"`{CANCEL}`: 5% off after 24 hours.").kind == "card_not_fired"
    # a statement with no constant to check is taken as stated by a card about its write
    plain = call(CANCEL, "1", ok=False, rule_id="fee", rule="Refund to the original method.")
    assert one(f"`{CANCEL}` takes a reason.", [st(0, ASK), st(1, *plain), st(2, FINISH)]).owner == "rho"
    # a coded refusal states nothing: only the timing tells
    coded = call(CANCEL, "1", ok=False, rule_id="fee", rule=None)
    assert (
        one(f"`{CANCEL}` takes a reason.", [st(0, ASK), st(1, *coded), st(2, FINISH, delivered=["c"])]).owner == "rho"
    )
    assert one(f"`{CANCEL}` takes a reason.", [st(0, ASK), st(1, *coded), st(2, FINISH)]).owner == "unknown"


def test_a_refusal_is_read_with_the_rules_train_showed():
    """A coded refusal (no statement), the card never at a write: train's rules say the refused write's amount is
    wrong (a fee is due), which a card with no number cannot state (E); with the fee's numbers it could (rho). Rules
    that find nothing wrong, or none, leave it unknown."""
    reads = _refund(method="card_1", amount=100.0, placed=30)[:2]
    refused = (
        {
            "kind": "tool",
            "tool": RETURN,
            "args": {"order_id": "1", "payment_method_id": "card_1", "refund_amount": 100.0},
        },
        {
            "role": "tool",
            "ok": False,
            "content": {"error": "refused"},
            "rule_id": "fee",
            "rule": None,
            "blocking": False,
        },
    )
    steps = [*reads, st(2, *refused), st(3, FINISH)]
    traces = steps_frame(steps)
    scores = pd.DataFrame([{"item_id": "t", "seed": 0, "score": 0.0, "success": False, "error": None}])

    def owner(card, rules):
        ev = TrainEvidence(rules={RETURN: rules} if rules else {})
        f = diagnose(traces, scores, pkg(c=card), WRITES, "d", TARGETS, train=ev).findings[0]
        return f.owner, f.kind

    plain = f"A refund made with `{RETURN}` goes back to the method the order was paid with."
    assert owner(plain, None) == ("unknown", "card_unobserved")
    assert owner(plain, {"refund_amount": FEE}) == ("E", "policy_refusal")
    assert owner(f"`{RETURN}`: 5% off the total after 24 hours.", {"refund_amount": FEE}) == ("rho", "card_not_fired")
    assert owner(plain, {"payment_method_id": ORIGINAL}) == ("unknown", "card_unobserved")  # it was right


def test_a_rule_on_the_days_from_the_policys_date_is_read_with_that_date():
    """A fee due when the order ships more than two days after the policy's date: only with that date does the refused
    write read as lacking the fee (E for a card with no number); without it, nothing is judged (unknown)."""
    from datetime import date

    late = FieldRule(
        "refund_amount",
        Term("share", 0.95, "get_order_details.total"),
        Cond("get_order_details.ships_on@days_from_today", ">", 2),
        Term("equal", path="get_order_details.total"),
    )
    order = (
        {"kind": "tool", "tool": "get_order_details", "args": {"order_id": "1"}},
        {"ok": True, "content": {"total": 100.0, "ships_on": "2026-01-05"}},
    )
    refused = (
        {"kind": "tool", "tool": RETURN, "args": {"order_id": "1", "refund_amount": 100.0}},
        {
            "role": "tool",
            "ok": False,
            "content": {"error": "refused"},
            "rule_id": "fee",
            "rule": None,
            "blocking": False,
        },
    )
    traces = steps_frame([st(0, *order), st(1, *refused), st(2, FINISH)])
    scores = pd.DataFrame([{"item_id": "t", "seed": 0, "score": 0.0, "success": False, "error": None}])
    plain = pkg(c=f"A refund made with `{RETURN}` goes back to the method the order was paid with.")
    ev = TrainEvidence(rules={RETURN: {"refund_amount": late}})

    def owner(today):
        return diagnose(traces, scores, plain, WRITES, "d", TARGETS, train=ev, today=today).findings[0].owner

    assert owner(date(2026, 1, 1)) == "E"  # it ships 4 days after: the fee was due, and the card lacks it
    assert owner(date(2026, 1, 4)) == "unknown"  # 1 day after: no fee due, nothing wrong
    assert owner(None) == "unknown"


def test_rules_are_inferred_only_for_tools_whose_cards_may_help():
    """Train shows a card about cancels in memory at every cancel, each written with a wrong reason: the cards do not
    help its values (E, ineffective), so no rule is inferred for it, and a coded refusal of a dev cancel whose rule
    card was never at a write stays unknown rather than being judged on the reason's rule."""
    from components.worlds.base import Gold, GoldAction

    def cancelled(i):
        write = (
            {"kind": "tool", "tool": CANCEL, "args": {"order_id": str(i), "reason": "whatever"}},
            {"role": "tool", "ok": True, "content": {"order_id": str(i)}},
        )
        return [st(0, *confirm(CANCEL, str(i))), st(1, *write, delivered=["tone-rule"]), st(2, FINISH)]

    refused = (
        {"kind": "tool", "tool": CANCEL, "args": {"order_id": "9", "reason": "whatever"}},
        {"role": "tool", "ok": False, "content": {"error": "refused"}, "rule_id": "r", "rule": None, "blocking": False},
    )
    eps = {f"g{i}#0": cancelled(i) for i in range(8)} | {"t#0": [st(0, ASK), st(1, *refused), st(2, FINISH)]}
    traces = pd.concat(
        [
            steps_frame(
                [s.model_copy(update={"episode_id": e}).sealed() for s in steps], item_id=e.split("#")[0], seed=0
            ).assign(episode_id=e)
            for e, steps in eps.items()
        ],
        ignore_index=True,
    )
    scores = pd.DataFrame(
        [{"item_id": e.split("#")[0], "seed": 0, "score": 0.0, "success": False, "error": None} for e in eps]
    )
    gold = {
        f"g{i}": Gold(
            task_id=f"g{i}", actions=[GoldAction(tool=CANCEL, args={"order_id": str(i), "reason": "no longer needed"})]
        )
        for i in range(8)
    }
    cards = pkg(**{"tone-rule": f"Be polite when you use `{CANCEL}`.", "r-rule": f"`{CANCEL}` takes a reason."})
    d = diagnose(traces, scores, cards, WRITES, "d", TARGETS, gold=gold)
    assert {(f.owner, f.kind) for f in d.findings if f.item_id != "t"} == {("E", "ineffective_card")}
    assert [(f.owner, f.kind) for f in d.findings if f.item_id == "t"] == [("unknown", "card_unobserved")]


def test_an_outcome_earlier_than_the_traces_finding_replaces_it():
    """The trace's finding comes after the write whose amount was wrong (E: the card lacks the fee): the earlier
    outcome is the first divergence. An outcome no one can own (unknown) never replaces a trace's finding."""
    from components.codes import FindingKind, Owner
    from components.evolution.diagnose import with_outcomes
    from components.evolution.findings import Finding
    from components.worlds.base import Gold, GoldAction

    steps = _refund(method="card_1", amount=100.0)
    gold = Gold(
        task_id="t",
        actions=[GoldAction(tool=RETURN, args={"order_id": "1", "payment_method_id": "card_1", "refund_amount": 95.0})],
    )
    plain = pkg(c=f"A refund made with `{RETURN}` goes back to the method the order was paid with.")
    later = Finding("t#0", "t", 3, steps[3].hash, Owner.W, FindingKind.DROPPED)
    f = with_outcomes(later, steps, gold, plain, WRITES, TARGETS, {RETURN: None}, {RETURN: {"refund_amount": FEE}})
    assert (f.owner, f.kind, f.step) == ("E", "wrong_value", 2)
    f = with_outcomes(later, steps, gold, plain, WRITES, TARGETS, {RETURN: None})  # no rule, no timing: unknown
    assert (f.owner, f.kind, f.step) == ("W", "dropped", 3)
    earlier = Finding("t#0", "t", 1, steps[1].hash, Owner.W, FindingKind.DROPPED)
    f = with_outcomes(earlier, steps, gold, plain, WRITES, TARGETS, {RETURN: None}, {RETURN: {"refund_amount": FEE}})
    assert (f.owner, f.step) == ("W", 1)
