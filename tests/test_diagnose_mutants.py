"""The diagnoser on small synthetic traces whose answer is worked out by hand (issue 15, mutation testing).

Each test states a property of components/evolution/diagnose.py that a mutant of it breaks: which step and owner a
failed episode gets, how a refusal's owner follows the corpus's evidence on its card (shares counted here), the turn
budget, the cards a rule is about, and how findings cluster into cited evidence packets. A package is a stand-in with
the one thing the diagnoser reads of it: its cards' ids and bodies."""

from __future__ import annotations

import hashlib
from types import SimpleNamespace

import pandas as pd
import pytest

from components.codes import CheckCode
from components.evolution import diagnose as dg
from components.evolution import findings as fd
from components.evolution.diagnose import TurnBudget, diagnose, diagnose_episode
from components.evolution.outcomes import TrainEvidence
from components.memory.strategies import BOUNCES
from components.runtime.trace import TraceStep, steps_frame
from components.worlds.base import Gold, GoldAction

CANCEL, RETURN = "cancel_pending_order", "return_delivered_order_items"
WRITES = frozenset({CANCEL, RETURN})
TARGETS = {CANCEL: ["order_id"], RETURN: ["order_id"]}
ASK = {"kind": "message", "content": "Anything else?"}
# a confirmation checker's bounce as the kernel records it (`blocked`: the checkers' reasons)
NEEDS_CONFIRM = BOUNCES[CheckCode.UNCONFIRMED].format(tool=CANCEL, confirm="confirm")
FINISH = {"kind": "finish", "tool": "finish", "args": {}}


def pkg(**cards: str):
    """A package stand-in: card id -> body."""
    return SimpleNamespace(cards={cid: SimpleNamespace(id=cid, body=body) for cid, body in cards.items()})


NO_CARDS = pkg()


def st(i, action, obs=None, pending=(), delivered=(), before=(), after=(), blocked=None, eid="t#0"):
    return TraceStep(
        episode_id=eid,
        step=i,
        incoming={},
        state_before=list(before),
        delivered=list(delivered),
        deliveries=[],
        action=action,
        checks=[],
        blocked=blocked,
        proposal={
            "pending": [p if isinstance(p, dict) else {"tool": p[0], "args": {"order_id": p[1]}} for p in pending],
            "next_tool": None,
        },
        observation=obs or {},
        state_after=list(after),
        fingerprint=[],
    ).sealed()


def call(tool, oid, ok=True, rule_id=None, rule=None, error="", blocking=False, code=None):
    content = {"order_id": oid} if ok else {"error": error}
    return (
        {"kind": "tool", "tool": tool, "args": {"order_id": oid}},
        {
            "role": "tool",
            "ok": ok,
            "code": code,
            "content": content,
            "rule_id": rule_id,
            "rule": rule,
            "blocking": blocking,
        },
    )


def confirm(tool, oid, granted=True):
    return (
        {"kind": "tool", "tool": "confirm", "args": {"tool": tool, "args": {"order_id": oid}, "summary": "s"}},
        {"role": "tool", "ok": True, "content": {"confirmed": granted}},
    )


def one(steps, package=NO_CARDS, helps=None, budget=None):
    return diagnose_episode(steps, "t", package, WRITES, episode_id="t#0", helps=helps, budget=budget, targets=TARGETS)


def confirmed_write(i, tool, oid, **kw):
    """Steps i, i+1: a granted confirmation, then the write."""
    return [st(i, *confirm(tool, oid), **kw), st(i + 1, *call(tool, oid), **kw)]


def ledger(status, oid, evidence=None, eid="e1", tool=CANCEL):
    return {"id": eid, "tool": tool, "args": {"order_id": oid}, "status": status, "evidence": evidence, "note": ""}


# -- small helpers ----------------------------------------------------------------------------------------------------


def test_rule_card_ids_are_ascii_slugs():
    assert fd.rule_card_id("Cancel_Reason") == "cancel-reason-rule"
    assert fd.rule_card_id("r2-window") == "r2-window-rule"
    assert fd.rule_card_id("--x y--") == "x-y-rule"
    assert fd.rule_card_id("règle") == "r-gle-rule"
    assert fd.rule_card_id("é!") == "unnamed-rule"


def test_cards_about_a_write_and_a_rule():
    p = pkg(
        **{
            "hand": f"Use `{CANCEL}` with care.",
            "cancel-reason-rule": f"`{CANCEL}` needs a reason.",
            "cancel-window-rule": f"`{CANCEL}` within a day.",
            "plain": f"{CANCEL} without backticks",
            "other": f"`{RETURN}` refunds.",
        }
    )
    assert fd.cards_about(p, CANCEL) == ["hand", "cancel-reason-rule", "cancel-window-rule"]
    assert fd.cards_about(p, CANCEL, "cancel_reason") == ["hand", "cancel-reason-rule"]
    assert fd.cards_about(p, CANCEL, "") == ["hand", "cancel-reason-rule", "cancel-window-rule"]
    assert fd.cards_about(p, RETURN, "cancel_reason") == ["other"]


def test_rule_refusal_needs_an_executed_refused_call_with_a_rule_id():
    refused = call(CANCEL, "1", ok=False, rule_id="r")
    assert dg.rule_refusal(st(0, *refused)) == "r"
    assert dg.rule_refusal(st(0, *refused, blocked="checker")) is None
    assert dg.rule_refusal(st(0, *call(CANCEL, "1", ok=False))) is None
    a, o = call(CANCEL, "1", ok=True)
    assert dg.rule_refusal(st(0, a, {**o, "rule_id": "r"})) is None


def refusal_detail(**observation) -> str:
    """The detail of the finding for a cancel refused on rule r with this receipt (no card: E policy_refusal)."""
    a = {"kind": "tool", "tool": CANCEL, "args": {"order_id": "1"}}
    f = one([st(0, a, {"role": "tool", "ok": False, "rule_id": "r", **observation}), st(1, FINISH)])
    assert (f.owner, f.kind, f.rule_id) == ("E", "policy_refusal", "r")
    return f.detail


def test_a_refusal_quotes_the_stated_rule_then_the_error_and_a_coded_one_nothing():
    assert refusal_detail(rule="  Only within a day.  ", content={"error": "x"}) == "Only within a day."
    assert refusal_detail(content={"error": " refused. "}) == "refused."
    assert refusal_detail(content="refused") == ""
    assert refusal_detail() == ""
    assert refusal_detail(content={}) == ""
    # a coded receipt (a rule id, its `rule` field empty) says only that a rule was broken: nothing to quote
    assert refusal_detail(rule="", content={"error": "x"}) == ""
    assert refusal_detail(rule=None, content={"error": "x"}) == ""


def test_a_refusal_names_its_target_by_the_identifying_args_only():
    def target(args, targets=TARGETS):
        a = {"kind": "tool", "tool": CANCEL, "args": args}
        f = diagnose_episode(
            [st(0, a, {"ok": False, "rule_id": "r"}), st(1, FINISH)], "t", NO_CARDS, WRITES, targets=targets
        )
        return f.extra["target"]

    assert target({"order_id": "1", "reason": "x"}) == (("order_id", "1"),)
    assert target({"reason": "x"}) == ()  # the identifying arg is absent: dropped, not None
    assert target(None, None) == ()


def work(steps, targets=TARGETS) -> int:
    """The writes of work `diagnose_episode` counts for an episode, read from its out_of_turns finding (a binding
    budget that no success ever met)."""
    f = diagnose_episode(steps, "t", NO_CARDS, WRITES, budget=TurnBudget(99, True, {}), targets=targets)
    assert f.kind == "out_of_turns" and f.detail.endswith(" write(s) of work within a 99-turn budget")
    return int(f.detail.split()[0])


def test_proposed_targets_count_once_whatever_their_order_or_spelling():
    one_target = [{"tool": CANCEL, "args": {"a": 1, "b": "x"}}, {"tool": CANCEL, "args": {"b": "x", "a": "1"}}]
    assert work([st(0, ASK, pending=one_target), st(1, FINISH)]) == 1
    assert work([st(0, ASK, pending=[(CANCEL, 1)]), st(1, ASK, pending=[(CANCEL, "1")]), st(2, FINISH)]) == 1
    bare = [{"tool": CANCEL, "args": None}, {"tool": CANCEL}]  # no args at all: one (session-level) target
    assert work([st(0, ASK, pending=bare), st(1, FINISH)]) == 1


def test_a_write_is_work_of_its_own_unless_a_proposal_names_it():
    written = call(CANCEL, "1")
    written = ({**written[0], "args": {"order_id": "1", "extra": 5}}, written[1])
    assert work([st(0, ASK, pending=[(CANCEL, 1)]), st(1, *written), st(2, FINISH)]) == 1  # its args are the write's
    assert work([st(0, ASK, pending=[(CANCEL, "1")]), st(1, *call(CANCEL, "2")), st(2, FINISH)]) == 2
    anything = [{"tool": CANCEL, "args": {}}]  # a proposal with no args names any write of its tool
    assert work([st(0, ASK, pending=anything), st(1, *call(CANCEL, "7")), st(2, FINISH)]) == 1


# -- one episode: owner, kind, step ---------------------------------------------------------------------------------


def test_a_model_fault_cites_the_last_step_or_nothing():
    steps = [st(0, ASK, eid="x#3"), st(1, ASK, eid="x#3")]
    f = diagnose_episode(steps, "x", NO_CARDS, WRITES, error="model: timeout")
    assert (f.episode_id, f.step, f.hash, f.owner, f.kind) == ("x#3", 1, steps[1].hash, "none", "model_fault")
    assert (f.detail, f.opportunity, f.patchability) == ("model: timeout", "unknown", "external")
    f = diagnose_episode([], "x", NO_CARDS, WRITES)
    assert (f.episode_id, f.step, f.hash, f.kind) == ("x#?", -1, "", "model_fault")


def test_a_blocking_refusal_is_external_and_a_blocked_one_is_not_read():
    a, o = call(CANCEL, "1", ok=False, blocking=True, code="invalid_state")
    steps = [st(0, ASK), st(1, a, o), st(2, FINISH)]
    f = one(steps)
    assert (f.step, f.hash, f.owner, f.kind, f.tool, f.detail) == (
        1,
        steps[1].hash,
        "none",
        "blocking_error",
        CANCEL,
        "invalid_state",
    )
    assert (f.opportunity, f.patchability) == ("absent", "external")
    a, o = call(CANCEL, "1", ok=False, blocking=True)
    assert one([st(0, a, o), st(1, FINISH)]).detail == ""
    # a blocked call never reached the world: its (stale) observation is not a world refusal (the checker's block
    # is the agent's: C)
    assert one([st(0, a, o, blocked=NEEDS_CONFIRM), st(1, FINISH)]).kind == "bounced_write"


def test_an_unconfirmed_write_is_c_at_its_step():
    steps = confirmed_write(0, CANCEL, "1") + [st(2, *call(RETURN, "2")), st(3, FINISH)]
    f = one(steps)
    assert (f.step, f.hash, f.owner, f.kind, f.tool, f.detail) == (
        2,
        steps[2].hash,
        "C",
        "unconfirmed_write",
        "*",
        RETURN,
    )
    assert (f.opportunity, f.patchability, f.rule_id) == ("present", "memory", "")
    assert one(confirmed_write(0, CANCEL, "1") + [st(2, FINISH)]).kind == "no_divergence"
    # a blocked write never ran: nothing to confirm; never redone, the checker's bounce is the finding
    f = one([st(0, *call(CANCEL, "1"), blocked=NEEDS_CONFIRM), st(1, FINISH)])
    assert (f.owner, f.kind, f.step, f.detail) == ("C", "bounced_write", 0, CANCEL)


def test_a_checker_bounce_is_c_and_the_work_dropped_after_it_is_not_w():
    """With a confirmation checker, the unconfirmed write is blocked, the agent gives up and drops the work: the
    earliest divergence is the bounce (C), not the drop (W). Redone successfully later, it is no finding."""
    blocked = st(1, *call(CANCEL, "1"), blocked=NEEDS_CONFIRM, pending=[(CANCEL, "1")])
    dropped = [st(0, ASK, pending=[(CANCEL, "1")]), blocked, st(2, ASK), st(3, FINISH)]
    f = one(dropped)
    assert (f.owner, f.kind, f.step, f.hash) == ("C", "bounced_write", 1, blocked.hash)
    assert f.extra == {"target": (("order_id", "1"),), "blocked": NEEDS_CONFIRM}
    redone = [st(0, ASK, pending=[(CANCEL, "1")]), blocked, *confirmed_write(2, CANCEL, "1"), st(4, FINISH)]
    assert one(redone).kind == "no_divergence"
    other = [st(0, ASK, pending=[(CANCEL, "1")]), blocked, *confirmed_write(2, CANCEL, "2"), st(4, FINISH)]
    assert one(other).kind == "bounced_write"  # another order's write does not redo this one


def test_a_checker_bounce_on_a_confirmed_write_is_a_false_alarm_not_c():
    """A write a granted confirmation covered did its part: a checker that still bounces it (and it is never done)
    fired on correct discipline, which no fault of the agent's explains (owner none). Unconfirmed, the bounce is C
    only when it says the confirmation is missing; a bounce for any other reason fired on the checker's own
    criterion, whatever the confirmation."""
    asked = confirmed_write(0, CANCEL, "1")[:1]  # the granted confirm, without the write that followed it
    blocked = st(1, *call(CANCEL, "1"), blocked="false_alarm: looks unusual", pending=[(CANCEL, "1")])
    f = one([*asked, blocked, st(2, FINISH)])
    assert (f.owner, f.kind, f.step, f.hash, f.detail) == ("none", "checker_false_alarm", 1, blocked.hash, CANCEL)
    assert f.extra == {"target": (("order_id", "1"),), "blocked": "false_alarm: looks unusual"}
    other = confirmed_write(0, CANCEL, "2")[:1]  # a confirmation of another order does not cover this write
    assert one([*other, blocked, st(2, FINISH)]).kind == "checker_false_alarm"
    unconfirmed = st(1, *call(CANCEL, "1"), blocked=f"false_alarm: looks unusual; {NEEDS_CONFIRM}")
    assert one([*other, unconfirmed, st(2, FINISH)]).kind == "bounced_write"
    assert one([*asked, unconfirmed, st(2, FINISH)]).kind == "checker_false_alarm"  # the trace shows it confirmed


def test_a_refusal_redone_right_later_is_no_finding():
    refused = call(CANCEL, "1", ok=False, rule_id="r", rule="R.")
    redo = confirmed_write(2, CANCEL, "1")
    assert one([st(0, ASK), st(1, *refused)] + redo + [st(4, FINISH)]).kind == "no_divergence"
    f = one([st(0, ASK), st(1, *refused)] + confirmed_write(2, CANCEL, "9") + [st(4, FINISH)])
    assert (f.owner, f.kind, f.step, f.rule_id, f.detail) == ("E", "policy_refusal", 1, "r", "R.")
    # done before the refusal, or redone but blocked, or redone and refused again: still a finding
    assert one(confirmed_write(0, CANCEL, "1") + [st(2, *refused), st(3, FINISH)]).kind == "policy_refusal"
    blocked = [st(2, *confirm(CANCEL, "1")), st(3, *call(CANCEL, "1"), blocked="checker")]
    assert one([st(0, ASK), st(1, *refused)] + blocked + [st(4, FINISH)]).kind == "policy_refusal"
    assert one([st(0, ASK), st(1, *refused), st(2, *refused), st(3, FINISH)]).step == 1
    # the same order through another write tool is another target
    other = confirmed_write(2, RETURN, "1")
    assert one([st(0, ASK), st(1, *refused)] + other + [st(4, FINISH)]).kind == "policy_refusal"


def test_a_refusal_finding_carries_its_target_cards_and_delivery():
    p = pkg(c=f"`{CANCEL}` ...", u="other")
    a, o = call(CANCEL, "1", ok=False, rule_id="r", rule="R.")
    f = one([st(0, ASK), st(1, a, o, delivered=("c", "u")), st(2, FINISH)], p, {(CANCEL, "r"): True})
    assert (f.owner, f.kind, f.tool, f.rule_id) == ("rho", "diluted_card", CANCEL, "r")
    assert f.extra == {"target": (("order_id", "1"),), "cards": ["c"], "delivered": ["c", "u"], "rule_id": "r"}
    assert f.signature == ("rho", "diluted_card", CANCEL, "r")
    # evidence is looked up for this write and this rule only
    f = one([st(0, ASK), st(1, a, o, delivered=("c",)), st(2, FINISH)], p, {(CANCEL, "other"): False})
    assert (f.owner, f.kind, f.opportunity, f.patchability) == ("unknown", "card_unobserved", "unknown", "unknown")


def test_a_premature_finish_counts_what_was_still_proposed():
    steps = confirmed_write(0, CANCEL, "1", pending=[(CANCEL, "1")]) + [
        st(2, FINISH, pending=[(CANCEL, "2"), (RETURN, "3")])
    ]
    f = one(steps)
    assert (f.owner, f.kind, f.step, f.detail, f.tool) == ("C", "premature_finish", 2, "2 item(s) still proposed", "*")
    blocked_finish = confirmed_write(0, CANCEL, "1") + [st(2, FINISH, pending=[(CANCEL, "2")], blocked="checker")]
    assert one(blocked_finish).kind != "premature_finish"


def test_dropped_work_is_w_one_step_after_it_was_last_listed():
    steps = [
        st(0, ASK, pending=[(CANCEL, "2")], after=[ledger("pending", "2")]),
        st(1, ASK, pending=[(CANCEL, "2")], after=[ledger("pending", "2")]),
        st(2, ASK),
        st(3, FINISH),
    ]
    f = one(steps)
    assert (f.owner, f.kind, f.step, f.hash, f.tool) == ("W", "dropped", 2, steps[2].hash, "*")
    assert f.detail == "left the agent's state without a receipt" and f.extra == {"proposed_max": 1}
    overflow = [
        st(0, ASK, pending=[(CANCEL, "2"), (RETURN, "3")]),
        st(1, ASK, pending=[(RETURN, "3")]),
        st(2, ASK),
        st(3, FINISH),
    ]
    f = one(overflow)
    assert (f.kind, f.step, f.extra["proposed_max"]) == ("overflow", 1, 2)
    assert f.detail == "proposed but never tracked by the ledger (full)"


def test_wrong_grounding_names_the_entry_and_its_receipt():
    steps = [
        st(0, ASK, pending=[(CANCEL, "2")], before=[ledger("done", "2", "call_9", eid="e7")]),
        st(1, ASK),
        st(2, FINISH),
    ]
    f = one(steps)
    assert (f.kind, f.detail) == ("wrong_grounding", "entry e7 settled by receipt call_9")
    assert f.extra == {"bind_args": ["order_id"], "proposed_max": 1}
    # a ledger entry for other args, or for another tool, or only seen two steps later, does not track it
    for later in (
        [st(0, ASK, pending=[(CANCEL, "2")], after=[ledger("done", "3", "c")]), st(1, ASK), st(2, FINISH)],
        [st(0, ASK, pending=[(CANCEL, "2")], after=[ledger("done", "2", "c", tool=RETURN)]), st(1, ASK), st(2, FINISH)],
        [st(0, ASK, pending=[(CANCEL, "2")]), st(1, ASK), st(2, ASK, after=[ledger("done", "2", "c")]), st(3, FINISH)],
    ):
        assert one(later).kind == "overflow"
    # tracked the step after it was last listed: still tracked
    nxt = [st(0, ASK, pending=[(CANCEL, "2")]), st(1, ASK, after=[ledger("pending", "2")]), st(2, FINISH)]
    assert one(nxt).kind == "dropped"


def test_work_done_listed_until_the_end_or_refused_is_not_w():
    done = [st(0, ASK, pending=[(CANCEL, "2")])] + confirmed_write(1, CANCEL, "2") + [st(3, FINISH)]
    assert one(done).kind == "no_divergence"
    until_finish = [st(0, ASK, pending=[(CANCEL, "2")]), st(1, ASK, pending=[(CANCEL, "2")])]
    assert one(until_finish).kind == "no_divergence"  # listed at the last step: cut off, not dropped
    a, o = call(CANCEL, "2", ok=False, rule_id="r")
    refused = [st(0, ASK, pending=[(CANCEL, "2")]), st(1, a, o, pending=[(CANCEL, "2")]), st(2, ASK), st(3, FINISH)]
    f = one(refused)
    assert (f.kind, f.step) == ("policy_refusal", 1)
    # work dropped from the state and then refused on a rule that no card knows: the refusal, not W
    a, o = call(CANCEL, "2", ok=False, rule_id="r")
    late = [
        st(0, ASK, pending=[(CANCEL, "2")]),
        st(1, ASK, pending=[(CANCEL, "2")]),
        st(2, ASK),
        st(3, a, o),
        st(4, FINISH),
    ]
    f = one(late, NO_CARDS)
    assert (f.owner, f.kind, f.step) == ("E", "policy_refusal", 3)


@pytest.mark.parametrize("helps,delivered", [(False, ("c",)), (True, ("c", "u")), (True, ()), (None, ())])
def test_a_refused_write_is_never_work_that_was_not_written(helps, delivered):
    """The same trace as above with a card about the rule in the package: the write was attempted and refused, so
    whatever the card evidence says, the finding is the refusal (E, rho or unknown), never W ("never wrote")."""
    p = pkg(c=f"`{CANCEL}` ...", u="other")
    a, o = call(CANCEL, "2", ok=False, rule_id="r")
    late = [
        st(0, ASK, pending=[(CANCEL, "2")]),
        st(1, ASK, pending=[(CANCEL, "2")]),
        st(2, ASK),
        st(3, a, o, delivered=delivered),
        st(4, FINISH),
    ]
    f = one(late, p, {(CANCEL, "r"): helps})
    assert f.owner != "W" and f.step == 3 and f.rule_id == "r"


def test_the_earliest_finding_wins_and_a_tie_goes_to_the_owner_first_in_order():
    refused = call(CANCEL, "1", ok=False, rule_id="r")
    # step 1: a W finding (work listed at step 0 only) and a refusal at the same step
    steps = [st(0, ASK, pending=[(RETURN, "5")]), st(1, *refused), st(2, FINISH)]
    f = one(steps)
    assert (f.step, f.owner) == (1, "E")
    steps = [st(0, ASK, pending=[(RETURN, "5")]), st(1, *call(CANCEL, "1")), st(2, FINISH)]
    assert (one(steps).step, one(steps).owner) == (1, "C")
    p = pkg(c=f"`{CANCEL}` ...")
    steps = [st(0, ASK, pending=[(RETURN, "5")]), st(1, *refused), st(2, FINISH)]
    f = one(steps, p, {(CANCEL, "r"): True})
    assert (f.step, f.owner) == (1, "W")  # "W" before "rho" (card_not_fired) at the same step


# -- the turn budget -------------------------------------------------------------------------------------------------


def episode(eid, n_steps, work=(), finish=True):
    """n_steps steps that propose `work` (write targets) at step 0 and end with finish (or are cut off)."""
    steps = [st(0, ASK, pending=work, eid=eid)] + [st(i, ASK, eid=eid) for i in range(1, n_steps - 1)]
    return steps + [st(n_steps - 1, FINISH if finish else ASK, eid=eid)]


def test_work_counts_proposed_targets_and_unproposed_writes():
    steps = [
        st(0, ASK, pending=[(CANCEL, "1"), (CANCEL, "1"), ("get_order_details", "1")]),
        st(1, *call(CANCEL, "1")),
        st(2, *call(RETURN, "2")),
        st(3, *call(RETURN, "3"), blocked="checker"),
        st(4, *call(CANCEL, "4", ok=False, rule_id="r")),
        st(5, FINISH),
    ]
    assert work(steps) == 2  # cancel #1 (proposed, written), return #2 (written only)
    assert work([st(0, ASK)], None) == 0


def test_turn_budget_read_from_the_corpus():
    eps = [
        episode("a#0", 4, [(CANCEL, "1")]),
        episode("b#0", 6, [(CANCEL, "1"), (CANCEL, "2")]),
        episode("c#0", 5, [(CANCEL, "1"), (CANCEL, "2")]),
        episode("d#0", 8, [(CANCEL, "1")], finish=False),
        episode("e#0", 8, [(CANCEL, "1")], finish=True),
        episode("f#0", 3, [(CANCEL, "1")]),
    ]
    success = {"a#0": True, "b#0": True, "c#0": True, "d#0": False, "e#0": False, "f#0": False}
    b = TurnBudget.of(eps, success, WRITES, TARGETS)
    assert b.cap == 8
    assert b.need == {1: 4, 2: 5}  # one write: the 4-step success; two: the shorter of the 5- and 6-step ones
    assert b.binding  # 1 of 6 cut off at the cap without finishing: above BINDING = 5%
    assert not TurnBudget.of(eps[:3], success, WRITES).binding  # nobody cut off
    empty = TurnBudget.of([], {}, WRITES)
    assert (empty.cap, empty.binding, empty.need) == (0, False, {})
    # need for k writes is the fewest turns among successes with at least k writes
    eps2 = [episode("a#0", 7, [(CANCEL, "1")]), episode("b#0", 5, [(CANCEL, "1"), (CANCEL, "2"), (CANCEL, "3")])]
    assert TurnBudget.of(eps2, {"a#0": True, "b#0": True}, WRITES).need == {1: 5, 2: 5, 3: 5}


def test_binding_needs_a_twentieth_cut_off():
    eps = [episode(f"s{i}#0", 3, [(CANCEL, "1")]) for i in range(19)] + [episode("x#0", 5, finish=False)]
    assert TurnBudget.of(eps, {}, WRITES).binding  # 1 of 20 = 5%: binding
    eps = [episode(f"s{i}#0", 3, [(CANCEL, "1")]) for i in range(20)] + [episode("x#0", 5, finish=False)]
    assert not TurnBudget.of(eps, {}, WRITES).binding  # 1 of 21 < 5%


def test_out_of_turns_when_no_success_did_that_much_work_within_the_cap():
    two = [st(0, ASK, pending=[(CANCEL, "1"), (CANCEL, "2")]), st(1, ASK), st(2, ASK)]
    assert TurnBudget(3, True, {1: 3}).out_of_turns(two, WRITES)  # no success with 2 writes
    assert TurnBudget(3, True, {1: 3, 2: 4}).out_of_turns(two, WRITES)  # it took 4 > cap 3
    assert not TurnBudget(3, True, {1: 3, 2: 3}).out_of_turns(two, WRITES)
    assert not TurnBudget(3, False, {1: 3}).out_of_turns(two, WRITES)
    assert not TurnBudget(3, True, {1: 3}).out_of_turns([], WRITES)
    f = one(two, budget=TurnBudget(3, True, {1: 3}))
    assert (f.owner, f.kind, f.step, f.hash) == ("none", "out_of_turns", 2, two[2].hash)
    assert f.detail == "2 write(s) of work within a 3-turn budget"
    assert (f.opportunity, f.patchability) == ("absent", "external")


# -- card evidence from the corpus -----------------------------------------------------------------------------------


def attempt(eid, outcome, card):
    """One episode: a first attempt at cancel #1 with (or without) card 'c' delivered; outcome ok | a rule id."""
    a, o = call(CANCEL, "1") if outcome == "ok" else call(CANCEL, "1", ok=False, rule_id=outcome)
    return [st(0, a, o, delivered=("c",) if card else (), eid=eid)]


def corpus(with_card: list[str], without: list[str]):
    return [attempt(f"w{i}#0", x, True) for i, x in enumerate(with_card)] + [
        attempt(f"n{i}#0", x, False) for i, x in enumerate(without)
    ]


P = pkg(c=f"`{CANCEL}` needs a reason.")


@pytest.mark.parametrize(
    "with_card,without,helps",
    [
        (["ok", "ok", "r", "r"], ["ok", "r", "r", "r", "r"], True),  # 0.5 >= 0.2 + 0.1
        (["ok", "ok", "r", "r"], ["ok", "ok", "ok", "r", "r"], False),  # 0.5 < 0.6 + 0.1
        (["ok", "ok", "r", "r"], ["ok", "ok", "r", "r", "r"], True),  # 0.5 >= 0.4 + 0.1 (exactly)
        (["ok", "r", "r"], ["r", "r", "r", "r"], True),  # no contrast (4 < 5), no reference: it cleared sometimes
        (["r", "r", "r"], ["r", "r", "r", "r"], False),  # no contrast, no reference: its turns never cleared it
        (["ok", "ok", "r", "r", "r"], ["ok", "ok", "ok", "r"], True),  # four without is no contrast: 0.4 > 0
        # refused on another rule is not judged on this one: 0 of 1 with the card (it would be 0.5 if it counted as
        # cleared), against 0 of 5 without
        (["other", "r"], ["r", "r", "r", "r", "r"], False),
        (["other", "ok", "r"], ["r", "r", "r", "r", "r"], True),  # 1 of 2 judged on it
        ([], ["r", "r", "ok"], None),  # never delivered: no evidence either way
    ],
)
def test_card_evidence_compares_shares_with_and_without_the_card(with_card, without, helps):
    ev = dg.card_evidence(corpus(with_card, without), P, WRITES, TARGETS)
    assert ev[(CANCEL, "r")] is helps


@pytest.mark.parametrize(
    "elsewhere,helps",
    [
        (["ok", "r", "r", "r", "r"], True),  # 0.33 >= 0.2 + 0.1
        (["ok", "ok", "ok", "r", "r"], False),
    ],
)  # 0.33 < 0.6 + 0.1
def test_a_card_never_absent_at_its_write_is_judged_against_the_corpus_rate_without_cards(elsewhere, helps):
    """Every cancel had its card in memory (no contrast): the reference is how often the corpus clears a rule with no
    card about it, here on returns (no constant standing in for it)."""
    eps = [attempt(f"w{i}#0", x, True) for i, x in enumerate(["ok", "r", "r"])]
    for i, x in enumerate(elsewhere):
        a, o = call(RETURN, "1") if x == "ok" else call(RETURN, "1", ok=False, rule_id="q")
        eps.append([st(0, a, o, eid=f"x{i}#0")])
    ev = dg.card_evidence(eps, P, WRITES, TARGETS)
    assert ev[(CANCEL, "r")] is helps
    assert ev[(RETURN, "q")] is None  # no card about returns was ever delivered


def test_card_evidence_reads_first_attempts_on_policy_only():
    refused = call(CANCEL, "1", ok=False, rule_id="r")
    ok = call(CANCEL, "1")
    eps = []
    for i in range(3):  # refused first with the card, then accepted: the first attempt alone counts
        eps.append([st(0, *refused, delivered=("c",), eid=f"a{i}#0"), st(1, *ok, delivered=("c",), eid=f"a{i}#0")])
    # a blocked attempt, a refusal with no rule, a read: not attempts judged on policy, so they do not come first
    for i in range(3):
        eps.append(
            [
                st(0, *ok, delivered=("c",), blocked="checker", eid=f"b{i}#0"),
                st(1, *call(CANCEL, "1", ok=False), delivered=("c",), eid=f"b{i}#0"),
                st(
                    2,
                    {"kind": "tool", "tool": "get_order_details", "args": {}},
                    {"ok": True},
                    delivered=("c",),
                    eid=f"b{i}#0",
                ),
                st(3, *refused, delivered=("c",), eid=f"b{i}#0"),
            ]
        )
    ev = dg.card_evidence(eps, P, WRITES, TARGETS)
    assert ev == {(CANCEL, "r"): False}  # 0 of 6 first attempts cleared the rule
    # rules are found per write tool; a tool never refused on a rule has no entry
    assert dg.card_evidence([[st(0, *ok, delivered=("c",))]], P, WRITES) == {}


def test_card_evidence_per_rule_and_per_target():
    """Two rules seen on one write: each judged on its own; a second target in an episode is a first attempt too."""
    eps = []
    for i in range(4):
        eps.append(
            [
                st(0, *call(CANCEL, "1", ok=False, rule_id="r1"), delivered=("c",), eid=f"e{i}#0"),
                st(1, *call(CANCEL, "2", ok=False, rule_id="r2"), delivered=("c",), eid=f"e{i}#0"),
            ]
        )
    ev = dg.card_evidence(eps, P, WRITES, TARGETS)
    # r1: judged on 4 attempts (its own refusals), cleared on none: the r2 refusals were stopped on r2 and say
    # nothing about r1 (the world stops at the first rule broken); r2 likewise
    assert ev == {(CANCEL, "r1"): False, (CANCEL, "r2"): False}
    eps += [[st(0, *call(CANCEL, "3"), delivered=("c",), eid=f"ok{i}#0")] for i in range(4)]
    # four accepted first attempts with the card: each rule cleared on 4 of the 8 judged on it
    assert dg.card_evidence(eps, P, WRITES, TARGETS) == {(CANCEL, "r1"): True, (CANCEL, "r2"): True}
    rule_cards = pkg(**{"r1-rule": f"`{CANCEL}` r1", "r2-rule": f"`{CANCEL}` r2"})
    eps = [[st(0, *call(CANCEL, "1", ok=False, rule_id="r1"), delivered=("r2-rule",), eid=f"e{i}#0")] for i in range(3)]
    # the card delivered is about the other rule: r1 was never seen with its own card
    assert dg.card_evidence(eps, rule_cards, WRITES, TARGETS) == {(CANCEL, "r1"): None}


# -- the whole corpus: clusters and packets -------------------------------------------------------------------------


def frames(episodes: dict[str, list[TraceStep]]) -> pd.DataFrame:
    return pd.concat(
        [
            steps_frame(
                [s.model_copy(update={"episode_id": eid}).sealed() for s in steps],
                item_id=eid.split("#")[0],
                seed=int(eid.split("#")[1]),
            ).assign(episode_id=eid)
            for eid, steps in episodes.items()
        ],
        ignore_index=True,
    )


def scores_of(rows):
    return pd.DataFrame(
        [{"item_id": i, "seed": s, "score": 0.0 if not ok else 1.0, "success": ok, "error": e} for i, s, ok, e in rows]
    )


def test_diagnose_clusters_failed_episodes_into_cited_packets():
    unconfirmed = [st(0, ASK), st(1, *call(CANCEL, "1")), st(2, FINISH)]
    refused = [st(0, ASK), st(1, *call(CANCEL, "1", ok=False, rule_id="r", rule="R.")), st(2, FINISH)]
    eps = {f"u{i}#0": unconfirmed for i in range(8)} | {"r0#0": refused, "r0#1": refused, "ok#0": unconfirmed}
    traces = frames(eps)
    scores = scores_of(
        [(f"u{i}", 0, False, "") for i in range(8)]
        + [("r0", 0, False, None), ("r0", 1, False, ""), ("ok", 0, True, ""), ("gone", 0, False, "boom")]
    )
    d = diagnose(traces, scores, NO_CARDS, WRITES, "corp", TARGETS)
    assert len(d.findings) == 11  # every failed episode once, the successful one never
    assert [(p.owner, p.kind, len(p.episodes)) for p in d.packets] == [
        ("C", "unconfirmed_write", 8),
        ("E", "policy_refusal", 2),
        ("none", "model_fault", 1),
    ]
    c, e, fault = d.packets
    # a packet without a rule: its id hashes the corpus, owner, kind and tool alone
    assert c.id == f"C-unconfirmed_write-{hashlib.sha256(b'corp|C|unconfirmed_write|*').hexdigest()[:10]}"
    key = "corp|E|policy_refusal|cancel_pending_order|r"
    assert e.id == f"E-policy_refusal-{hashlib.sha256(key.encode()).hexdigest()[:10]}"
    assert (e.rule_id, e.tool, e.detail, e.corpus, e.items) == ("r", CANCEL, "R.", "corp", ["r0"])
    assert c.rule_id is None and c.tool == "*" and c.detail == CANCEL
    assert len(c.claims) == 1 and len(c.claims[0].evidence) == dg.MAX_CITATIONS  # 8 episodes, 6 cited
    assert [(x.episode_id, x.step) for x in e.claims[0].evidence] == [("r0#0", 1), ("r0#1", 1)]
    assert e.claims[0].evidence[0].hash == frames({"r0#0": refused})["hash"][1]
    assert (
        e.claims[0].statement == "2 failed episode(s): `cancel_pending_order` was refused on rule r and never "
        "redone right — R."
    )
    assert c.unresolved == [] and c.patchability == "memory" and c.opportunity == "present"
    # the episode with no trace is a model fault with nothing to cite
    assert fault.claims == [] and fault.unresolved == ["no reachable intervention point found"]
    assert fault.episodes == ["gone#0"] and fault.detail == "boom" and fault.patchability == "external"
    frame = d.findings_frame()
    assert list(frame.columns) == [
        "episode_id",
        "item_id",
        "step",
        "owner",
        "kind",
        "tool",
        "opportunity",
        "patchability",
    ]
    assert len(frame) == 11 and set(frame["episode_id"]) == set(scores["item_id"] + "#" + "0") - {"ok#0"} | {"r0#1"}


def test_diagnose_ties_in_cluster_size_sort_by_signature_and_corpus_changes_ids():
    unconfirmed = [st(0, ASK), st(1, *call(CANCEL, "1")), st(2, FINISH)]
    refused = [st(0, ASK), st(1, *call(CANCEL, "1", ok=False, rule_id="r")), st(2, FINISH)]
    eps = {"a#0": refused, "b#0": unconfirmed}
    scores = scores_of([("a", 0, False, ""), ("b", 0, False, "")])
    d1 = diagnose(frames(eps), scores, NO_CARDS, WRITES, "one", TARGETS)
    d2 = diagnose(frames(eps), scores, NO_CARDS, WRITES, "two", TARGETS)
    assert [p.owner for p in d1.packets] == ["C", "E"]
    assert {p.id for p in d1.packets}.isdisjoint({p.id for p in d2.packets})
    assert [p.id.rsplit("-", 1)[0] for p in d1.packets] == [p.id.rsplit("-", 1)[0] for p in d2.packets]


def test_diagnose_uses_the_corpus_evidence_and_the_turn_budget():
    """Card evidence and the turn budget are read from every episode, successes included."""
    p = pkg(c=f"`{CANCEL}` needs a reason.")
    refused = [st(0, ASK), st(1, *call(CANCEL, "1", ok=False, rule_id="r"), delivered=("c",)), st(2, FINISH)]
    eps = {f"f{i}#0": refused for i in range(5)}
    scores = scores_of([(f"f{i}", 0, False, "") for i in range(5)])
    d = diagnose(frames(eps), scores, p, WRITES, "c", TARGETS)
    assert {(f.owner, f.kind) for f in d.findings} == {("E", "ineffective_card")}  # 0 of 5 cleared with the card
    # successes that clear the rule with the card delivered: the card helps; delivered alone, so still E
    good = [st(0, ASK)] + [
        st(1, *confirm(CANCEL, "1"), delivered=("c",)),
        st(2, *call(CANCEL, "1"), delivered=("c",)),
        st(3, FINISH),
    ]
    eps |= {f"s{i}#0": good for i in range(5)}
    scores = scores_of([(f"f{i}", 0, False, "") for i in range(5)] + [(f"s{i}", 0, True, "") for i in range(5)])
    d = diagnose(frames(eps), scores, p, WRITES, "c", TARGETS)
    assert {(f.owner, f.kind) for f in d.findings} == {("E", "policy_refusal")}
    assert len(d.findings) == 5


def test_diagnose_with_no_traces_reports_model_faults():
    d = diagnose(pd.DataFrame(), scores_of([("a", 0, False, float("nan")), ("b", 1, True, "")]), NO_CARDS, WRITES, "c")
    assert [(f.episode_id, f.kind, f.detail) for f in d.findings] == [("a#0", "model_fault", "")]
    assert d.packets[0].claims == [] and d.packets[0].detail == ""


CARD = pkg(c=f"`{CANCEL}` needs a reason.", u="other")
REFUSED = call(CANCEL, "1", ok=False, rule_id="R")


def refused_with(*delivered):
    return [st(0, ASK), st(1, *REFUSED, delivered=delivered), st(2, FINISH)]


CLEARED_WITH_CARD = [
    st(0, *confirm(CANCEL, "2"), delivered=("c",)),
    st(1, *call(CANCEL, "2"), delivered=("c",)),
    st(2, FINISH),
]

# kind -> (a failed episode that diagnoses to it, the package, a successful episode beside it or None, the error)
SCENARIOS = {
    "unconfirmed_write": ([st(0, ASK), st(1, *call(CANCEL, "1")), st(2, FINISH)], NO_CARDS, None, ""),
    "policy_refusal": (
        [st(0, ASK), st(1, *call(CANCEL, "1", ok=False, rule_id="R", rule="R.")), st(2, FINISH)],
        NO_CARDS,
        None,
        "",
    ),
    "card_not_fired": (refused_with(), CARD, CLEARED_WITH_CARD, ""),
    "diluted_card": (refused_with("c", "u"), CARD, CLEARED_WITH_CARD, ""),
    "ineffective_card": (refused_with("c"), CARD, None, ""),
    "card_unobserved": (refused_with(), CARD, None, ""),
    "bounced_write": ([st(0, *call(CANCEL, "1"), blocked=NEEDS_CONFIRM), st(1, FINISH)], NO_CARDS, None, ""),
    "checker_false_alarm": (
        [
            *confirmed_write(0, CANCEL, "1")[:1],
            st(1, *call(CANCEL, "1"), blocked="false_alarm: looks unusual"),
            st(2, FINISH),
        ],
        NO_CARDS,
        None,
        "",
    ),
    "premature_finish": (
        confirmed_write(0, CANCEL, "1") + [st(2, FINISH, pending=[(CANCEL, "2")])],
        NO_CARDS,
        None,
        "",
    ),
    "wrong_grounding": (
        [
            st(0, ASK, pending=[(CANCEL, "2")], before=[ledger("done", "2", "call_9", eid="e7")]),
            st(1, ASK),
            st(2, FINISH),
        ],
        NO_CARDS,
        None,
        "",
    ),
    "overflow": ([st(0, ASK, pending=[(CANCEL, "2")]), st(1, ASK), st(2, FINISH)], NO_CARDS, None, ""),
    "dropped": (
        [st(0, ASK, pending=[(CANCEL, "2")], after=[ledger("pending", "2")]), st(1, ASK), st(2, FINISH)],
        NO_CARDS,
        None,
        "",
    ),
    "blocking_error": (
        [st(0, *call(CANCEL, "1", ok=False, blocking=True, code="invalid_state")), st(1, FINISH)],
        NO_CARDS,
        None,
        "",
    ),
    "out_of_turns": ([st(0, ASK, pending=[(CANCEL, "1")]), st(1, ASK)], NO_CARDS, None, ""),  # cut off: binding
    "model_fault": ([st(0, ASK), st(1, FINISH)], NO_CARDS, None, "model: timeout"),
    "no_divergence": ([st(0, ASK), st(1, FINISH)], NO_CARDS, None, ""),
}
WRITTEN = confirmed_write(0, CANCEL, "1") + [st(2, FINISH)]
REASON = {"order_id": "1", "reason": "no longer needed"}
# kind -> (a failed episode, the gold of its item or None, the train evidence or None): findings from outcomes
OUTCOME_SCENARIOS = {
    "wrong_value": (WRITTEN, [GoldAction(tool=CANCEL, args=REASON)], None),
    "missing_write": ([st(0, ASK), st(1, FINISH)], [GoldAction(tool=CANCEL, args=REASON)], None),
    "extra_write": (WRITTEN, [], None),
    "unseen_value": (WRITTEN, None, TrainEvidence(wrong_rate={CANCEL: 0.5}, unexplained=2, unexplained_wrong=2)),
}


@pytest.mark.parametrize(
    "kind,words,detail",
    [
        ("unconfirmed_write", "a write ran without a granted confirmation covering it", CANCEL),
        ("policy_refusal", f"`{CANCEL}` was refused on rule R and never redone right", "R."),
        ("card_not_fired", f"`{CANCEL}` was refused on rule R while a card about it existed but was not delivered", ""),
        ("diluted_card", f"`{CANCEL}` was refused on rule R although its card was delivered among many others", ""),
        (
            "ineffective_card",
            f"`{CANCEL}` was refused on rule R; the package's card about it does not help where delivered",
            "",
        ),
        (
            "card_unobserved",
            f"`{CANCEL}` was refused on rule R; a card about it exists but was never seen at such a write",
            "",
        ),
        (
            "bounced_write",
            "a checker blocked a write and it was never done (the agent could not meet the check)",
            CANCEL,
        ),
        (
            "checker_false_alarm",
            "a checker blocked a confirmed write and it was never done (the check fired on work the agent did right)",
            CANCEL,
        ),
        (
            "premature_finish",
            "the agent declared done while its own state still listed work",
            "1 item(s) still proposed",
        ),
        (
            "wrong_grounding",
            "a ledger entry was settled by a receipt for other arguments",
            "entry e7 settled by receipt call_9",
        ),
        (
            "overflow",
            "proposed work was never tracked because the ledger was full",
            "proposed but never tracked by the ledger (full)",
        ),
        (
            "dropped",
            "proposed work left the agent's state without a receipt",
            "left the agent's state without a receipt",
        ),
        ("blocking_error", "the world refused the request as impossible (a blocking receipt)", "invalid_state"),
        (
            "out_of_turns",
            "more work than any successful episode did within the turn budget",
            "1 write(s) of work within a 2-turn budget",
        ),
        ("model_fault", "the model failed", "model: timeout"),
        ("no_divergence", "no divergence found", ""),
    ],
)
def test_each_kind_has_its_statement(kind, words, detail):
    """Two failed episodes that diagnose to `kind` (beside a success where the card evidence needs one): their
    packet's claim states the kind in words, then the finding's detail."""
    failed, package, success, error = SCENARIOS[kind]
    eps = {"t0#0": failed, "t1#0": failed} | ({"s#0": success} if success else {})
    scores = scores_of([("t0", 0, False, error), ("t1", 0, False, error)] + ([("s", 0, True, "")] if success else []))
    d = diagnose(frames(eps), scores, package, WRITES, "c", TARGETS)
    assert [(p.kind, len(p.episodes)) for p in d.packets] == [(kind, 2)]
    assert d.packets[0].claims[0].statement == f"2 failed episode(s): {words}" + (f" — {detail}" if detail else "")


@pytest.mark.parametrize(
    "kind,words,detail",
    [
        (
            "wrong_value",
            f"`{CANCEL}` was written with an argument its gold does not have",
            "`reason` None, gold 'no longer needed'",
        ),
        ("missing_write", f"a gold write on `{CANCEL}` was never made", f"missing write on `{CANCEL}`"),
        ("extra_write", f"`{CANCEL}` was written where no gold write asks for it", f"extra write on `{CANCEL}`"),
        (
            "unseen_value",
            f"no divergence in the trace; `{CANCEL}` is the write train most often got wrong",
            "no divergence in the trace; on train, 2 of 2 such failures held a wrong argument",
        ),
    ],
)
def test_each_outcome_kind_has_its_statement(kind, words, detail):
    """The same for the findings read from outcomes: the item's gold writes, or what train showed."""
    failed, actions, train = OUTCOME_SCENARIOS[kind]
    gold = (
        {"t0": Gold(task_id="t0", actions=actions), "t1": Gold(task_id="t1", actions=actions)}
        if actions is not None
        else None
    )
    scores = scores_of([("t0", 0, False, ""), ("t1", 0, False, "")])
    d = diagnose(
        frames({"t0#0": failed, "t1#0": failed}), scores, NO_CARDS, WRITES, "c", TARGETS, gold=gold, train=train
    )
    assert [(p.kind, len(p.episodes)) for p in d.packets] == [(kind, 2)]
    assert d.packets[0].claims[0].statement == f"2 failed episode(s): {words} — {detail}"


def test_work_matches_proposals_to_writes_of_the_same_tool_only():
    steps = [st(0, ASK, pending=[(CANCEL, "1")]), st(1, *call(RETURN, "1")), st(2, FINISH)]
    assert work(steps) == 2  # a cancel proposal does not name a return of the same order
    bare = {"kind": "tool", "tool": RETURN}  # a write with no args at all (a session-level write)
    steps = [st(0, ASK, pending=[(RETURN, "1")]), st(1, bare, {"ok": True}), st(2, FINISH)]
    assert work(steps, None) == 2  # the proposal's order is not among the write's (absent) args
    steps = [st(0, ASK), st(1, bare, {"ok": True}), st(2, FINISH)]
    assert work(steps, None) == 1


def test_card_evidence_reads_on_past_a_repeated_attempt():
    """An episode retries order 1 and then writes order 2: both first attempts count (1 of 2 cleared the rule)."""
    refused = call(CANCEL, "1", ok=False, rule_id="r")
    eps = [
        [
            st(0, *refused, delivered=("c",), eid=f"e{i}#0"),
            st(1, *refused, delivered=("c",), eid=f"e{i}#0"),
            st(2, *call(CANCEL, "2"), delivered=("c",), eid=f"e{i}#0"),
        ]
        for i in range(3)
    ]
    assert dg.card_evidence(eps, P, WRITES, TARGETS) == {(CANCEL, "r"): True}  # 0.5, and no reference but zero


def test_diagnose_reads_write_targets_for_the_evidence_and_the_budget():
    """Targets tell two orders apart: in the corpus's card evidence (a second order's write is a first attempt too)
    and in the turn budget (two writes of one tool to two orders are two writes of work)."""
    refused = call(CANCEL, "1", ok=False, rule_id="r")
    two = [st(0, ASK), st(1, *refused, delivered=("c",)), st(2, *call(CANCEL, "2"), delivered=("c",)), st(3, FINISH)]
    eps = {f"f{i}#0": two for i in range(5)}
    scores = scores_of([(f"f{i}", 0, False, "") for i in range(5)])
    d = diagnose(frames(eps), scores, P, WRITES, "c", TARGETS)
    assert {(f.owner, f.kind, f.step) for f in d.findings} == {("E", "policy_refusal", 1)}  # 5 of 10 cleared: helps
    success = [*confirmed_write(0, RETURN, "2"), *confirmed_write(2, RETURN, "3"), st(4, FINISH)]
    pend = [(CANCEL, "1"), (CANCEL, "2")]
    cut = [st(i, ASK, pending=pend) for i in range(5)]  # two writes of work, cut off at 5 steps
    eps = {"s#0": success, "x#0": cut}
    d = diagnose(frames(eps), scores_of([("s", 0, True, ""), ("x", 0, False, "")]), NO_CARDS, WRITES, "c", TARGETS)
    assert [f.kind for f in d.findings] == ["no_divergence"]  # a success did two writes in 5 turns: not out of turns


def test_turn_budget_counts_writes_to_distinct_targets():
    success = [
        *confirmed_write(0, RETURN, "2", eid="s#0"),
        *confirmed_write(2, RETURN, "3", eid="s#0"),
        st(4, FINISH, eid="s#0"),
    ]
    assert TurnBudget.of([success], {"s#0": True}, WRITES, TARGETS).need == {1: 5, 2: 5}


def test_a_blocking_receipt_on_a_step_that_names_no_tool_is_on_any_tool():
    gone = {"ok": False, "blocking": True, "code": "gone"}
    f = one([st(0, {"kind": "message", "content": "x"}, gone), st(1, FINISH)])
    assert (f.kind, f.tool, f.detail) == ("blocking_error", "*", "gone")


def test_out_of_turns_counts_the_work_with_the_benchmark_targets():
    """Two unproposed writes of one tool to two orders are two writes of work (per the targets), beyond a budget in
    which successes only ever did one; only the tools being written count."""
    budget = TurnBudget(5, True, {1: 3})
    steps = [*confirmed_write(0, RETURN, "2"), *confirmed_write(2, RETURN, "3"), st(4, ASK)]
    f = one(steps, budget=budget)
    assert (f.item_id, f.kind, f.detail) == ("t", "out_of_turns", "2 write(s) of work within a 5-turn budget")
    only_cancel = {CANCEL: ["order_id"]}
    pend = [(CANCEL, "1"), (RETURN, "2")]
    f = diagnose_episode(
        [st(i, ASK, pending=pend) for i in range(3)],
        "t",
        NO_CARDS,
        WRITES,
        episode_id="t#0",
        budget=TurnBudget(3, True, {1: 3}),
        targets=only_cancel,
    )
    assert (f.kind, f.detail) == ("out_of_turns", "2 write(s) of work within a 3-turn budget")


def test_a_confirmation_is_read_through_the_benchmark_targets():
    """Under targets only the order identifies a cancel: a confirmation that also carries a note covers it."""
    ask = (
        {
            "kind": "tool",
            "tool": "confirm",
            "args": {"tool": CANCEL, "args": {"order_id": "1", "note": "asap"}, "summary": "s"},
        },
        {"role": "tool", "ok": True, "content": {"confirmed": True}},
    )
    assert one([st(0, *ask), st(1, *call(CANCEL, "1")), st(2, FINISH)]).kind == "no_divergence"


def test_every_finding_names_its_episode_and_item():
    cases = {
        "premature_finish": confirmed_write(0, CANCEL, "1") + [st(2, FINISH, pending=[(CANCEL, "2")])],
        "overflow": [st(0, ASK, pending=[(CANCEL, "2")]), st(1, FINISH)],
        "no_divergence": [st(0, ASK), st(1, FINISH)],
        "unconfirmed_write": [st(0, *call(CANCEL, "1")), st(1, FINISH)],
    }
    for kind, steps in cases.items():
        f = diagnose_episode(steps, "item-7", NO_CARDS, WRITES, episode_id="item-7#2", targets=TARGETS)
        assert (f.kind, f.episode_id, f.item_id) == (kind, "item-7#2", "item-7")
    f = one(cases["no_divergence"])
    assert (f.step, f.hash, f.owner, f.opportunity, f.patchability) == (
        1,
        cases["no_divergence"][1].hash,
        "none",
        "unknown",
        "unknown",
    )
    # work listed at step 0 only and a finish at step 1: the divergence is the finish step, not the listing step
    f = one(cases["overflow"])
    assert (f.step, f.hash) == (1, cases["overflow"][1].hash)


def test_steps_without_a_proposal_are_read():
    steps = [
        TraceStep(
            episode_id="t#0",
            step=i,
            incoming={},
            state_before=[],
            delivered=[],
            deliveries=[],
            action=a,
            checks=[],
            observation={},
            proposal={},
            state_after=[],
            fingerprint=[],
        ).sealed()
        for i, a in enumerate([ASK, FINISH])
    ]
    assert one(steps).kind == "no_divergence"


# -- outcomes matched to the gold by target; the card evidence's corpus reference -----------------------------------


def cancel_with(i, oid, reason, **kw):
    """Steps i, i+1: a granted confirmation, then a cancel of order `oid` giving `reason`."""
    return [
        st(i, *confirm(CANCEL, oid), **kw),
        st(
            i + 1,
            {"kind": "tool", "tool": CANCEL, "args": {"order_id": oid, "reason": reason}},
            {"role": "tool", "ok": True, "content": {"order_id": oid}},
            **kw,
        ),
    ]


def gold_cancels(*oids):
    return {
        "t0": Gold(task_id="t0", actions=[GoldAction(tool=CANCEL, args={"order_id": o, "reason": "R"}) for o in oids])
    }


def test_an_outcome_matches_a_gold_write_by_its_target():
    """A cancel of another order than the gold's is an extra write (the gold's is then missing), not a wrong order id
    on the gold's write: writes meet their gold by the benchmark's identifying args."""
    ep = cancel_with(0, "2", "R") + [st(2, FINISH)]
    d = diagnose(
        frames({"t0#0": ep}), scores_of([("t0", 0, False, "")]), NO_CARDS, WRITES, "c", TARGETS, gold=gold_cancels("1")
    )
    assert [(f.owner, f.kind, f.step, f.tool) for f in d.findings] == [("unknown", "extra_write", 1, CANCEL)]


def test_the_value_evidence_counts_the_first_write_to_each_target():
    """With the card delivered, order 1 went out with a wrong reason and order 2 with the right one: one of two first
    writes (one per target) right, and no turn without the card to compare with, so the card helps (a share above
    zero) and the wrong reason, its card delivered alone, is E's missing knowledge (wrong_value), not an ineffective
    card (which counting only the episode's first cancel, 0 of 1, would say)."""
    ep = cancel_with(0, "1", "X", delivered=("c",)) + cancel_with(2, "2", "R", delivered=("c",)) + [st(4, FINISH)]
    d = diagnose(
        frames({"t0#0": ep}), scores_of([("t0", 0, False, "")]), P, WRITES, "c", TARGETS, gold=gold_cancels("1", "2")
    )
    assert [(f.owner, f.kind, f.step, f.detail) for f in d.findings] == [
        ("E", "wrong_value", 1, "`reason` 'X', gold 'R'")
    ]


@pytest.mark.parametrize("with_card,helps", [([1, 0], False), ([1, 1], True), ([1, 1, 0, 1, 1, 0, 1, 1, 1, 1], True)])
def test_card_helps_against_the_pooled_rate_needs_the_lift(with_card, helps):
    """Too few turns without the card for a contrast (one): the reference is the corpus's pooled no-card rate (0.5),
    and the card must beat it by CARD_LIFT: a share of 0.5 does not, 0.8 and 1.0 do."""
    assert fd.card_helps({True: with_card, False: [1]}, [1, 0] * 3) is helps


def test_a_bounced_step_that_is_no_write_is_no_bounced_write():
    """A checker bouncing the agent's finish (work still pending) is not a write the agent could not make."""
    steps = [st(0, ASK), st(1, FINISH, blocked="pending_work: L1 cancel"), st(2, FINISH)]
    assert one(steps).kind == "no_divergence"


def test_a_bounced_write_without_args_after_its_granted_confirmation_is_a_false_alarm():
    """A session-level write (no args at all), confirmed, then bounced: the confirmation covered it."""
    bare = {"kind": "tool", "tool": RETURN}
    asked = st(
        0,
        {"kind": "tool", "tool": "confirm", "args": {"tool": RETURN, "args": {}, "summary": "s"}},
        {"role": "tool", "ok": True, "content": {"confirmed": True}},
    )
    f = one([asked, st(1, bare, {}, blocked="false_alarm: looks unusual"), st(2, FINISH)])
    assert (f.owner, f.kind, f.step) == ("none", "checker_false_alarm", 1)


def test_a_bounced_write_clusters_across_tools_and_names_its_tool_in_the_detail():
    """A checker's bounce is a discipline fault, whatever the write: its finding's tool is `*` (one cluster for every
    write the checker guards) and the detail names the write."""
    for tool in (CANCEL, RETURN):
        f = one(
            [st(0, {"kind": "tool", "tool": tool, "args": {"order_id": "1"}}, {}, blocked=NEEDS_CONFIRM), st(1, FINISH)]
        )
        assert (f.owner, f.kind, f.tool, f.detail) == ("C", "bounced_write", "*", tool)


def test_work_dropped_is_not_done_by_a_write_to_another_target_of_the_same_tool():
    """Order 1 proposed, then dropped from the state before finish while a (confirmed) cancel ran: a cancel of order 2
    does not settle order 1's work (W); a cancel of order 1 itself does."""

    def episode(written):
        return [
            st(0, ASK, pending=[(CANCEL, "1")]),
            st(1, *confirm(CANCEL, written), pending=[(CANCEL, "1")]),
            st(2, *call(CANCEL, written), pending=[(CANCEL, "1")]),
            st(3, ASK),
            st(4, FINISH),
        ]

    f = one(episode("2"))
    assert (f.owner, f.step) == ("W", 3)
    assert one(episode("1")).kind == "no_divergence"


def test_packets_come_largest_cluster_first():
    """Clusters are ordered by size, then by key: two dropped (W) episodes come before one unconfirmed write (C),
    though "C" sorts before "W"."""
    unconfirmed = [st(0, ASK), st(1, *call(CANCEL, "1")), st(2, FINISH)]
    dropped = SCENARIOS["dropped"][0]
    eps = {"t0#0": unconfirmed, "t1#0": dropped, "t2#0": dropped}
    d = diagnose(
        frames(eps), scores_of([(i, 0, False, "") for i in ("t0", "t1", "t2")]), NO_CARDS, WRITES, "c", TARGETS
    )
    assert [(p.owner, len(p.episodes)) for p in d.packets] == [("W", 2), ("C", 1)]


def test_a_bounce_after_a_confirmation_of_another_target_is_the_agents_fault():
    """A granted confirmation covers the write of its own target (the benchmark's `targets`): order 2 confirmed, then
    order 1's cancel bounced for want of a confirmation is C, not the checker's false alarm; a confirmation of order 1
    covers it, whatever else it named. A false alarm, like a bounce, is clustered across writes (tool `*`), its detail
    naming the write."""
    bounced = [st(0, *confirm(CANCEL, "2")), st(1, *call(CANCEL, "1"), blocked=NEEDS_CONFIRM), st(2, FINISH)]
    assert (one(bounced).owner, one(bounced).kind) == ("C", "bounced_write")
    # the confirmation also named a reason the write then changed: it still covers order 1 (its target), so the
    # bounce fired on work the agent had confirmed
    asked = (
        {
            "kind": "tool",
            "tool": "confirm",
            "args": {"tool": CANCEL, "args": {"order_id": "1", "reason": "a"}, "summary": "s"},
        },
        {"role": "tool", "ok": True, "content": {"confirmed": True}},
    )
    write = ({"kind": "tool", "tool": CANCEL, "args": {"order_id": "1", "reason": "b"}}, {})
    f = one([st(0, *asked), st(1, *write, blocked=NEEDS_CONFIRM), st(2, FINISH)])
    assert (f.owner, f.kind, f.tool, f.detail) == ("none", "checker_false_alarm", "*", CANCEL)


def test_work_dropped_after_a_refused_target_is_still_found():
    """Orders 1 and 2 proposed; order 2 dropped from the state at step 1, order 1 refused on a rule at step 2: the
    refused order is the rule's finding, and the dropped one is still W (the earlier, at step 1)."""
    refused = call(CANCEL, "1", ok=False, rule_id="r")
    steps = [
        st(0, ASK, pending=[(CANCEL, "1"), (CANCEL, "2")]),
        st(1, ASK, pending=[(CANCEL, "1")]),
        st(2, *refused, pending=[(CANCEL, "1")]),
        st(3, ASK),
        st(4, FINISH),
    ]
    f = one(steps)
    assert (f.owner, f.step) == ("W", 1)
