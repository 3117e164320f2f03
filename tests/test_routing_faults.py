"""Routing faults told from missing knowledge (issue 40, item 5): a card that exists but is delivered where it cannot
help is rho; a missing or wrong card is E.

Hand-built traces first (the package a stand-in with its cards' ids, bodies and triggers, as tests/test_card_content),
then the same on the simulated agent: the world's `reference` with every card keyed on another write's intent
(`benchmarks/bench_diagnosis.py::rotated_triggers`), its failures replayed for their hidden cause and diagnosed from
dev's traces and train's outcomes alone."""

from __future__ import annotations

import importlib.util
from fractions import Fraction
from types import SimpleNamespace

import pytest

from components.evolution.diagnose import TurnBudget
from components.evolution.findings import keyed_elsewhere
from components.evolution.outcomes import (
    Gap,
    TrainEvidence,
    inferred_rules,
    mentions,
    recurring,
    rule_constants,
    unseen_value_finding,
    write_needs,
)
from components.worlds.outcome_rules import Cond, FieldRule, Term
from tests.conftest import PACKAGES, ROOT
from tests.test_card_content import FEE, _refund
from tests.test_diagnose_mutants import CANCEL, FINISH, RETURN, TARGETS, WRITES, call, confirmed_write, st

PLAIN = f"A refund made with `{RETURN}` goes back to the method the order was paid with."
WITH_FEE = f"`{RETURN}`: refund the total less a 5% fee when the order is older than 24 hours."


def card(cid: str, body: str, tool: str | None = None, event: str = "intent_recorded"):
    trigger = None if tool is None else SimpleNamespace(event=event, tool=tool)
    return SimpleNamespace(id=cid, body=body, meta=SimpleNamespace(trigger=trigger))


def package(**cards):
    """A package stand-in: card id -> (body, the tool its trigger names, or None for no trigger)."""
    return SimpleNamespace(cards={cid: card(cid, body, tool) for cid, (body, tool) in cards.items()})


def bench_module():
    spec = importlib.util.spec_from_file_location("bench_diagnosis", ROOT / "benchmarks" / "bench_diagnosis.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# -- the package's triggers ---------------------------------------------------------------------------------------


def test_a_card_is_keyed_elsewhere_only_when_every_trigger_names_another_tool():
    p = package(own=(PLAIN, RETURN), other=(PLAIN, CANCEL), none=(PLAIN, None), toolless=(PLAIN, None))
    p.cards["toolless"].meta.trigger = SimpleNamespace(event="turn_start", tool=None)
    assert keyed_elsewhere(p, ["other"], RETURN)
    assert not keyed_elsewhere(p, ["own"], RETURN)
    assert not keyed_elsewhere(p, ["other", "own"], RETURN)  # one of them is keyed on this write
    assert not keyed_elsewhere(p, ["none"], RETURN)  # no trigger: says nothing of routing
    assert not keyed_elsewhere(p, ["toolless"], RETURN)  # every turn_start: may reach the write
    assert not keyed_elsewhere(p, [], RETURN)
    assert not keyed_elsewhere(SimpleNamespace(cards={"c": SimpleNamespace(id="c", body=PLAIN)}), ["c"], RETURN)


# -- a write no train rule judges: the routing tells ----------------------------------------------------------------


EV = TrainEvidence(value_helps={RETURN: None}, wrong_rate={RETURN: 1.0}, unexplained=3, unexplained_wrong=3)


def test_a_card_keyed_on_another_write_is_a_routing_fault_and_a_missing_card_is_e():
    """Dev, no gold, no rule train's gold shows: the card about the refund exists but is keyed on cancels, so it never
    reached the refund (rho). The same card keyed on refunds but not in memory there tells nothing (unknown); no card
    about refunds at all is missing knowledge (E)."""
    steps = _refund(method="card_1", amount=100.0)
    f = unseen_value_finding("t#0", "t", steps, package(c=(PLAIN, CANCEL)), WRITES, EV, TARGETS)
    assert (f.owner, f.kind, f.tool) == ("rho", "card_not_fired", RETURN)
    f = unseen_value_finding("t#0", "t", steps, package(c=(PLAIN, RETURN)), WRITES, EV, TARGETS)
    assert (f.owner, f.kind) == ("unknown", "card_unobserved")
    f = unseen_value_finding("t#0", "t", steps, package(c=(f"`{CANCEL}` takes a reason.", RETURN)), WRITES, EV, TARGETS)
    assert (f.owner, f.kind) == ("E", "unseen_value")  # the only card is about another write
    f = unseen_value_finding("t#0", "t", steps, package(), WRITES, EV, TARGETS)
    assert (f.owner, f.kind) == ("E", "unseen_value")


def test_a_misrouted_card_is_still_judged_by_its_text_first():
    """With train's rule for the amount (5% off after 24 hours), a card keyed elsewhere that lacks the fee could not
    have fixed the write (E, whatever the routing); one that carries it is a routing fault (rho)."""
    ev = EV.model_copy(update={"rules": {RETURN: {"refund_amount": FEE}}})
    steps = _refund(method="card_1", amount=100.0, placed=30)
    assert unseen_value_finding("t#0", "t", steps, package(c=(PLAIN, CANCEL)), WRITES, ev, TARGETS).owner == "E"
    assert unseen_value_finding("t#0", "t", steps, package(c=(WITH_FEE, CANCEL)), WRITES, ev, TARGETS).owner == "rho"


# -- what stating a rule takes ------------------------------------------------------------------------------------


def test_exact_fractions_and_the_gap_a_threshold_left_are_read_in_a_cards_text():
    assert mentions("a $25 cap", {Fraction(25)}) and mentions("5% off", {Fraction(19, 20)})
    assert not mentions("a $30 cap", {Fraction(25)})
    assert mentions("after 24 hours", {Gap(20.5, 30.0)}) and mentions("after 30 hours", {Gap(20.5, 30.0)})
    assert not mentions("after 48 hours", {Gap(20.5, 30.0)}) and not mentions("within a day", {Gap(20.5, 30.0)})
    seen = FieldRule(
        "refund_amount", FEE.then, Cond(FEE.cond.path, ">", Fraction(25), (Fraction(20), Fraction(30))), FEE.other
    )
    assert rule_constants(seen) == {0.95, Gap(20.0, 30.0)}  # the threshold as the gap, not as 25


def test_a_write_takes_the_constants_of_its_own_case():
    """A refund to travel credit for basic fares, else to the reservation's method: a non-basic write's rule takes
    no constant; a basic one takes 'travel_credit'. A fee after 24 hours: the threshold always, the factor only
    where it is due."""
    to = FieldRule(
        "refund_to",
        Term("const", "travel_credit"),
        Cond("get_reservation_details.fare", "is", "basic"),
        Term("equal", path="get_reservation_details.payment_method_id"),
    )
    assert rule_constants(to) == {"travel_credit"}
    assert rule_constants(to, {"get_reservation_details.fare": "basic"}) == {"travel_credit"}
    assert rule_constants(to, {"get_reservation_details.fare": "flex"}) == frozenset()
    assert rule_constants(to, {}) == {"travel_credit"}  # the case unknown: every constant
    placed = "get_order_details.placed_hours_ago"
    assert rule_constants(FEE, {placed: 30}) == {0.95, 24}
    assert rule_constants(FEE, {placed: 10}) == {24}
    bonus = FieldRule("amount", Term("const", Fraction(100)), factors=((Cond("tier", "is", "gold"), Fraction(2)),))
    assert rule_constants(bonus, {"tier": "gold"}) == {100, 2}
    assert rule_constants(bonus, {"tier": "silver"}) == {100}


def test_a_refund_is_judged_on_what_its_own_case_takes():
    """Train's rule: the fee after 24 hours. The order was placed 10 hours ago, so the write takes the full total and
    a card without the fee could have stated it (the timing of a card delivered later then says rho); 30 hours ago,
    the fee was due and the same card lacks it (E)."""
    ev = EV.model_copy(update={"rules": {RETURN: {"refund_amount": FEE}}})
    early = _refund(delivered_at=(3,), method="card_1", amount=95.0, placed=10)
    assert write_needs(early[2], early, ev.rules[RETURN], WRITES, TARGETS) == [{24}]
    assert unseen_value_finding("t#0", "t", early, package(c=(PLAIN, RETURN)), WRITES, ev, TARGETS).owner == "E"
    hours = f"`{RETURN}`: no fee within 24 hours."
    assert unseen_value_finding("t#0", "t", early, package(c=(hours, RETURN)), WRITES, ev, TARGETS).owner == "rho"


def test_values_that_recur_across_items_are_a_fields_allowed_set():
    assert recurring({("a", ()): 100.0, ("b", ()): 250.0, ("c", ()): 100.0, ("d", ()): 250.0}) == (100.0, 250.0)
    assert recurring({("a", ()): 100.0, ("b", ()): 250.0, ("c", ()): 80.0, ("d", ()): 250.0}) == ()  # 3 of 4
    assert recurring({("a", ()): "x", ("b", ()): "x", ("c", ()): "x"}) == ()  # too few writes
    assert recurring({(i, ()): ["id"] for i in "abcd"}) == ()  # a list: no constant
    assert recurring({(i, ()): True for i in "abcd"}) == ()


def test_a_field_with_no_rule_is_stated_by_the_values_its_gold_recurs_on():
    """Train's compensation amounts are 100 or 250 by something no read shows: no rule, but the values recur. A dev
    write that no rule finds wrong is then judged on them: a card about it that names none cannot have stated the
    amount (E); one that names them is a routing fault (rho)."""
    from components.worlds.base import Gold, GoldAction

    def credited(i, amount):
        eid = f"g{i}#0"
        write = (
            {"kind": "tool", "tool": RETURN, "args": {"order_id": str(i), "refund_amount": 1.0}},
            {"role": "tool", "ok": True, "content": {}},
        )
        return eid, [
            s.model_copy(update={"episode_id": eid}).sealed()
            for s in [*confirmed_write(0, CANCEL, str(i))[:1], st(1, *write), st(2, FINISH)]
        ]

    amounts = [100.0, 250.0, 100.0, 250.0, 250.0, 100.0]
    eps = dict(credited(i, a) for i, a in enumerate(amounts))
    gold = {
        f"g{i}": Gold(task_id=f"g{i}", actions=[GoldAction(tool=RETURN, args={"order_id": str(i), "refund_amount": a})])
        for i, a in enumerate(amounts)
    }
    rules = inferred_rules([RETURN], eps, gold, WRITES, TARGETS)
    assert rules == {RETURN: {"refund_amount": FieldRule("refund_amount", Term("one_of", (100.0, 250.0)))}}
    ev = EV.model_copy(update={"rules": rules})
    steps = _refund(method="card_1", amount=100.0)
    assert unseen_value_finding("t#0", "t", steps, package(c=(PLAIN, CANCEL)), WRITES, ev, TARGETS).owner == "E"
    stated = f"`{RETURN}` refunds $100, or $250 for a damaged item."
    assert unseen_value_finding("t#0", "t", steps, package(c=(stated, CANCEL)), WRITES, ev, TARGETS).owner == "rho"


# -- the turn budget ----------------------------------------------------------------------------------------------


def test_more_work_than_any_success_did_is_priced_by_the_fewest_turns_between_confirmed_writes():
    """A success with one write took 4 steps (confirm, write, then two more); another episode made two confirmed
    writes two steps apart. Two writes then take 2 (up to the success's write) + 2 = 4 turns: within a budget of 4,
    beyond one of 3. Without a pair of confirmed writes the corpus prices nothing, and more work than any success did
    stays beyond the budget."""
    one = [*confirmed_write(0, CANCEL, "1", eid="s#0"), st(2, FINISH, eid="s#0"), st(3, FINISH, eid="s#0")]
    two = [*confirmed_write(0, CANCEL, "1", eid="f#0"), *confirmed_write(2, CANCEL, "2", eid="f#0")]
    cut = [st(i, {"kind": "message", "content": "x"}, eid="c#0") for i in range(4)]
    b = TurnBudget.of([one, two, cut], {"s#0": True, "f#0": False, "c#0": False}, WRITES, TARGETS)
    assert (b.cap, b.binding, b.need, b.per_write, b.base) == (4, True, {1: 4}, 2, 2)
    assert b.turns_for(1) == 4 and b.turns_for(2) == 4 and b.turns_for(3) == 6 and b.turns_for(0) is None
    assert not b.out_of_turns(two, WRITES, TARGETS)
    three = two + confirmed_write(4, CANCEL, "3", eid="f#0")
    assert b.out_of_turns(three, WRITES, TARGETS)
    assert TurnBudget(3, True, {1: 4}, 2, 2).out_of_turns(two, WRITES, TARGETS)  # 4 > 3
    unconfirmed = [st(0, *call(CANCEL, "1"), eid="u#0"), st(1, *call(CANCEL, "2"), eid="u#0")]
    b = TurnBudget.of([one, cut, unconfirmed], {"s#0": True}, WRITES, TARGETS)
    assert b.per_write is None and b.turns_for(2) is None and b.out_of_turns(two, WRITES, TARGETS)


# -- the perturbation: every card keyed on another write ------------------------------------------------------------


@pytest.mark.parametrize("world", ["", "airline"])
def test_rotated_triggers_move_every_card_to_another_write_and_keep_its_text(tmp_path, world):
    from components.memory import load_package

    shipped = PACKAGES / world / "reference" if world else PACKAGES / "reference"
    before = load_package(shipped)
    after = load_package(bench_module().rotated_triggers(tmp_path, "rotated", shipped))
    assert before.cards.keys() == after.cards.keys()
    for cid, c in after.cards.items():
        old = before.cards[cid]
        assert c.body == old.body and c.meta.trigger.event == old.meta.trigger.event
        assert c.meta.trigger.tool != old.meta.trigger.tool
    # every write that had a card keyed on it still has exactly one
    assert sorted(c.meta.trigger.tool for c in after.cards.values()) == sorted(
        c.meta.trigger.tool for c in before.cards.values()
    )


def test_a_rotated_reference_fails_on_routing_and_is_diagnosed_rho(tmp_path):
    """The retail reference, every card keyed on another write's intent, in a silent world: most failures' hidden
    cause is rho, and the diagnoser, from dev's traces and train's outcomes, names rho on them."""
    from components.params import BenchmarkParams
    from components.worlds import load_benchmark
    from components.worlds.base import ReceiptMode

    mod = bench_module()
    bench = load_benchmark(
        BenchmarkParams(world="retail", receipts=ReceiptMode.silent, out=str(tmp_path / "bench")).materialize()
    )
    pkg = mod.rotated_triggers(tmp_path, "rotated", PACKAGES / "reference")
    r = mod.row("rotated triggers", pkg, bench, 12, [0, 1])
    truth_rho = r["confusion"].get("rho", {})
    assert sum(truth_rho.values()) >= r["n"] / 2  # the perturbation is a routing fault
    assert truth_rho.get("rho", 0) >= 0.85 * sum(truth_rho.values())
    assert r["coverage"] == 1.0 and r["accuracy"] >= 0.85
