"""Counterfactual ground truth (each fault switch on an episode whose cause is known by construction), the
simulated agent's grammar (negation, paraphrase, text outside it), and the diagnoser on synthetic traces."""

from __future__ import annotations

import shutil
from itertools import combinations
from dataclasses import replace

import pandas as pd
import pytest

from components.evolution.diagnose import diagnose, diagnose_episode
from components.memory import load_package
from components.memory.package import MemoryPackage
from components.models.counterfactual import Replayer, causes_table
from components.models.simulated import OWNERS, RATES, SimulatedAgent
from components.runtime.episode import run_episode
from components.runtime.trace import TraceStep, steps_frame
from components.worlds.retail.facts import BY_ID, BY_TOOL
from tests.conftest import PACKAGES

# items decided by the written policy's rules only (no fee due, no gift card): one fault at a time below
CANCEL, IMPOSSIBLE, RETURN = "retail-cancel-002", "retail-cancel-008", "retail-return-000"
# one fault at a time: everything else done right
CLEAN = replace(RATES, p_base=1.0, p_skip_confirm=0.0, p_early_done=0.0, drift=0.0, p_recover=0.0)
CANCEL_CARD = (
    "When you call `cancel_pending_order`, the `reason` must be exactly 'no longer needed' or 'ordered by mistake'."
)


def with_card(tmp_path, body: str, trigger_tool: str = "cancel_pending_order", name: str = "pkg") -> MemoryPackage:
    dst = tmp_path / name
    shutil.copytree(PACKAGES / "seed", dst)
    text = (
        (dst / "manifest.yaml")
        .read_text()
        .replace("delivery: []", "delivery:\n  - use: event_cards\n    at: intent_recorded")
    )
    (dst / "manifest.yaml").write_text(text)
    (dst / "em" / "procedure").mkdir(parents=True)
    (dst / "em" / "procedure" / "rule.md").write_text(
        f"---\nid: rule\ntype: procedure\ntrigger:\n  event: intent_recorded\n  tool: {trigger_tool}\nsource: test\n---\n{body}\n"
    )
    return load_package(dst)


def cause(pkg, bench, item, rates, seed=0) -> dict:
    return Replayer(pkg, bench, rates=rates).cause(item, seed)


# -- each switch, on an episode whose cause is known ---------------------------------------------------------------


def test_e_switch_fixes_a_missing_rule(bench):
    row = cause(load_package(PACKAGES / "seed"), bench, CANCEL, replace(CLEAN, p_base=0.0))
    assert row["cause"] == "E" and row["E_off"] == 1
    assert row["rho_off"] == 0 and "rho" not in row["fired"]  # no card anywhere: routing cannot help


def test_c_switch_fixes_an_unconfirmed_write(bench):
    row = cause(load_package(PACKAGES / "seed"), bench, CANCEL, replace(CLEAN, p_skip_confirm=1.0))
    assert row["cause"] == "C" and row["C_off"] == 1 and row["E_off"] == 0


def test_w_switch_fixes_forgotten_work(bench):
    drifting = replace(CLEAN, drift=1.0, drift_after=0, drift_max=1.0, board_factor=1.0)
    row = cause(load_package(PACKAGES / "seed"), bench, CANCEL, drifting)
    assert row["cause"] == "W" and row["W_off"] == 1 and row["C_off"] == 0


def test_rho_switch_fixes_a_misrouted_right_card(tmp_path, bench):
    pkg = with_card(tmp_path, CANCEL_CARD, trigger_tool="get_order_details")
    row = cause(pkg, bench, CANCEL, replace(CLEAN, p_base=0.0, p_card=1.0))
    fired = dict(f.split("@") for f in row["fired"].split())
    assert fired["rho"] == fired["E"]  # both faults fire at the write: routing is the narrower fix, tried first
    assert row["cause"] == "rho" and row["rho_off"] == 1
    assert Replayer(pkg, bench, rates=replace(CLEAN, p_base=0.0, p_card=1.0)).run(CANCEL, 0, frozenset({"E"}))[0]


def test_a_wrong_card_in_front_is_e_not_rho(tmp_path, bench):
    wrong = "When you call `cancel_pending_order`, the `reason` must be exactly 'customer request'."
    row = cause(with_card(tmp_path, wrong), bench, CANCEL, replace(CLEAN, p_card=1.0))
    assert row["cause"] == "E" and row["rho_off"] == 0 and row["E_off"] == 1


def test_two_faults_are_compound_with_the_pair_that_fixes_them(bench):
    row = cause(load_package(PACKAGES / "seed"), bench, CANCEL, replace(CLEAN, p_base=0.0, p_skip_confirm=1.0))
    assert row["cause"] == "compound"
    assert "E+C" in row["fixing_sets"].split(";")


def test_three_faults_are_compound_with_the_minimal_triple_that_fixes_them(bench):
    """E, C and W all slip: no pair of switches fixes the episode, the three together do. The pruned search (a set is
    replayed only when each of its switches fires with the others off) agrees with replaying every set."""
    drifting = dict(drift=1.0, drift_after=0, drift_max=1.0, board_factor=1.0)
    rates = replace(CLEAN, p_base=0.0, p_skip_confirm=1.0, **drifting)
    pkg = load_package(PACKAGES / "seed")
    rep = Replayer(pkg, bench, rates=rates)
    row = rep.cause(CANCEL, 0)
    assert row["cause"] == "compound" and row["fixing_sets"] == "E+W+C" and row["all_off"] == ""
    brute = Replayer(pkg, bench, rates=rates)
    fixes = {frozenset(s) for k in (1, 2, 3) for s in combinations(OWNERS, k) if brute.run(CANCEL, 0, frozenset(s))[0]}
    minimal = {f for f in fixes if not any(g < f for g in fixes)}
    assert minimal == {frozenset({"E", "W", "C"})}
    assert row["replays"] < brute.replays  # the pruned search replayed fewer episodes


def test_a_triple_is_not_listed_when_a_pair_inside_it_fixes(bench):
    pkg = load_package(PACKAGES / "seed")
    row = Replayer(pkg, bench, rates=replace(CLEAN, p_base=0.0, p_skip_confirm=1.0)).cause(CANCEL, 0)
    assert row["fixing_sets"].split(";") == ["E+C"]


def test_an_impossible_task_is_external(bench):
    row = cause(load_package(PACKAGES / "reference"), bench, IMPOSSIBLE, CLEAN)
    assert row["cause"] == "external"


def test_only_failed_episodes_are_replayed_and_faults_that_never_fired_are_skipped(bench):
    pkg = load_package(PACKAGES / "seed")
    scores = pd.DataFrame(
        [
            {"item_id": CANCEL, "seed": 0, "success": True, "error": ""},
            {"item_id": IMPOSSIBLE, "seed": 0, "success": False, "error": ""},
        ]
    )
    t = causes_table(pkg, bench, scores, rates=CLEAN)
    assert list(t["item_id"]) == [IMPOSSIBLE]
    # the probe replay, then all four off (no single fault fired, so no single replay ran)
    assert t["replays"].iloc[0] <= 2


# -- the grammar: meaning, not keywords ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text,value",
    [
        ("`return_delivered_order_items` refunds only to the original payment method of the order.", "original"),
        ("`return_delivered_order_items` must never refund to the original payment method of the order.", "account"),
        (
            "A refund made with `return_delivered_order_items` goes back to the method the order was paid with.",
            "original",
        ),
        ("Do not use the account's first method for `return_delivered_order_items`.", "original"),
        ("Refunds go back to the original payment method of the order.", None),  # the tool is not named: outside
    ],
)
def test_refund_reading(text, value):
    assert BY_ID["refund_original"].read(text) == value


def test_negated_and_paraphrased_rules_of_every_fact():
    negated = {
        "cancel_reason": "For `cancel_pending_order`, the `reason` must not be 'no longer needed' or 'ordered by mistake'.",
        "exchange_available": "For `exchange_delivered_order_items` there is no need to check `available`.",
        "address_validated": "`modify_pending_order_address` takes the address as given; do not call `validate_address`.",
    }
    paraphrased = {
        "cancel_reason": "With `cancel_pending_order`, the reason has to be one of 'no longer needed' and 'ordered by mistake'.",
        "exchange_available": "Ahead of `exchange_delivered_order_items`, see whether the variant is in stock.",
        "address_validated": "For `modify_pending_order_address`, normalize the address with `validate_address` first.",
    }
    for fid, text in negated.items():
        assert BY_ID[fid].read(text) not in (None, BY_ID[fid].value), fid
    for fid, text in paraphrased.items():
        assert BY_ID[fid].read(text) == BY_ID[fid].value, fid


def test_the_agent_follows_what_a_card_means(tmp_path, bench):
    """Only the card can teach the rule here (p_base 0): the paraphrase works, the negation is followed and fails,
    and a card outside the grammar changes nothing."""
    rates = replace(CLEAN, p_base=0.0, p_card=1.0)
    tool = "return_delivered_order_items"

    def run(body, name):
        return run_episode(with_card(tmp_path, body, tool, name), bench, RETURN, 0, SimulatedAgent(rates))

    paraphrase = run(
        "A refund made with `return_delivered_order_items` goes back to the method the order was paid with.", "p"
    )
    negated = run("`return_delivered_order_items` must never refund to the original payment method of the order.", "n")
    outside = run("Refunds always go back to the original payment method of the order.", "o")
    nothing = run_episode(load_package(PACKAGES / "seed"), bench, RETURN, 0, SimulatedAgent(rates))
    assert paraphrase.success and not negated.success
    refused = [
        s for s in negated.steps if s.action.get("tool") == tool and s.observation.get("rule_id") == "refund_original"
    ]
    assert refused
    assert [s.action for s in outside.steps] == [s.action for s in nothing.steps]
    assert BY_TOOL[tool].read(bench.policy) == "original"


# -- the diagnoser on synthetic traces ---------------------------------------------------------------------------

W1, W2 = "#W0000001", "#W0000002"
WRITES = frozenset({"cancel_pending_order", "return_delivered_order_items"})


def st(i, action, obs=None, incoming=None, pending=(), delivered=(), before=(), after=(), blocked=None):
    return TraceStep(
        episode_id="t#0",
        step=i,
        incoming=incoming or {},
        state_before=list(before),
        delivered=list(delivered),
        deliveries=[],
        action=action,
        checks=[],
        blocked=blocked,
        proposal={"pending": [{"tool": t, "args": {"order_id": o}} for t, o in pending], "next_tool": None},
        observation=obs or {},
        state_after=list(after),
        fingerprint=[],
    ).sealed()


def write(tool, oid, ok=True, code=None, error="", rule_id=None, rule=None, blocking=False):
    """A write's action and observation as the kernel records them (the receipt's fields, `components.runtime.types`)."""
    content = {"order_id": oid} if ok else {"error": error}
    return {"kind": "tool", "tool": tool, "args": {"order_id": oid}}, {
        "role": "tool",
        "ok": ok,
        "code": code,
        "content": content,
        "rule_id": rule_id,
        "rule": rule,
        "blocking": blocking,
    }


def confirm(tool, oid, granted=True):
    """A `confirm` call and the world's answer."""
    return (
        {"kind": "tool", "tool": "confirm", "args": {"tool": tool, "args": {"order_id": oid}, "summary": "s"}},
        {"role": "tool", "ok": True, "content": {"confirmed": granted}},
    )


ASK = {"kind": "message", "content": "Anything else I can do?"}  # a turn that confirms nothing
FINISH = {"kind": "finish", "tool": "finish", "args": {}}
# a rule refusal: told by its rule id alone (no "Policy:" in the message, a world-specific code)
RULE = "`cancel_pending_order` takes a `reason` of 'no longer needed' or 'ordered by mistake'."
REFUSED = dict(ok=False, code="refused", error="reason refused.", rule_id="cancel_reason", rule=RULE)
TARGETS = {t: ["order_id"] for t in WRITES}


def pkg_with(tmp_path, cards: dict[str, str] | None = None) -> MemoryPackage:
    if not cards:
        return load_package(PACKAGES / "seed")
    dst = tmp_path / "p"
    shutil.copytree(PACKAGES / "seed", dst)
    (dst / "manifest.yaml").write_text(
        (dst / "manifest.yaml").read_text().replace("delivery: []", "delivery:\n  - use: all_cards\n    at: turn_start")
    )
    (dst / "em" / "procedure").mkdir(parents=True)
    for cid, body in cards.items():
        (dst / "em" / "procedure" / f"{cid}.md").write_text(
            f"---\nid: {cid}\ntype: procedure\nsource: t\n---\n{body}\n"
        )
    return load_package(dst)


def one(steps, pkg, helps=None):
    return diagnose_episode(steps, "t", pkg, WRITES, episode_id="t#0", helps=helps, targets=TARGETS)


def refused_episode(delivered=()):
    a, o = write("cancel_pending_order", W1, **REFUSED)
    return [
        st(0, ASK, pending=[("cancel_pending_order", W1)]),
        st(1, a, o, delivered=delivered, pending=[("cancel_pending_order", W1)]),
        st(2, FINISH, incoming=o),
    ]


def test_unconfirmed_write_is_c(tmp_path):
    a, o = write("cancel_pending_order", W1)
    f = one([st(0, a, o, pending=[("cancel_pending_order", W1)]), st(1, FINISH)], pkg_with(tmp_path))
    assert (f.owner, f.kind, f.step) == ("C", "unconfirmed_write", 0)


def test_premature_finish_is_c(tmp_path):
    a, o = write("cancel_pending_order", W1)
    steps = [
        st(0, *confirm("cancel_pending_order", W1)),
        st(1, a, o, pending=[("cancel_pending_order", W1)]),
        st(2, FINISH, pending=[("cancel_pending_order", W2)]),
    ]
    f = one(steps, pkg_with(tmp_path))
    assert (f.owner, f.kind, f.step) == ("C", "premature_finish", 2)


def test_a_granted_confirmation_covers_only_its_own_write(tmp_path):
    """The diagnoser reads confirmation through `components.runtime.confirm`: granted, same tool and order, one write."""
    pkg = pkg_with(tmp_path)
    a1, o1 = write("cancel_pending_order", W1)
    a2, o2 = write("cancel_pending_order", W2)
    other = [st(0, *confirm("cancel_pending_order", W2)), st(1, a1, o1), st(2, FINISH)]
    assert (one(other, pkg).kind, one(other, pkg).step) == ("unconfirmed_write", 1)
    denied = [st(0, *confirm("cancel_pending_order", W1, granted=False)), st(1, a1, o1), st(2, FINISH)]
    assert one(denied, pkg).kind == "unconfirmed_write"
    twice = [st(0, *confirm("cancel_pending_order", W1)), st(1, a1, o1), st(2, a2, o2), st(3, FINISH)]
    assert (one(twice, pkg).kind, one(twice, pkg).step) == ("unconfirmed_write", 2)  # a write after a write
    fresh = [
        st(0, *confirm("cancel_pending_order", W1)),
        st(1, a1, o1),
        st(2, *confirm("cancel_pending_order", W2)),
        st(3, a2, o2),
        st(4, FINISH),
    ]
    assert one(fresh, pkg).kind == "no_divergence"


def test_a_rule_refusal_is_told_by_its_rule_id_not_by_its_words(tmp_path):
    pkg = pkg_with(tmp_path)
    f = one(refused_episode(), pkg)
    assert (f.owner, f.kind, f.rule_id, f.detail) == ("E", "policy_refusal", "cancel_reason", RULE)
    # the same words and a `policy` code, but no rule id: not a rule refusal, so not a knowledge finding
    a, o = write("cancel_pending_order", W1, ok=False, code="policy", error=f"reason refused. Policy: {RULE}")
    assert one([st(0, ASK), st(1, a, o), st(2, FINISH)], pkg).kind == "no_divergence"


def test_two_rules_on_one_write_are_two_clusters_and_one_card(tmp_path, bench):
    from components.evolution.meta import PlanContext, rules_plan

    pkg = pkg_with(tmp_path)
    frames, scores = [], []
    for n, (rule_id, rule) in enumerate(
        [("cancel_reason", RULE), ("cancel_window", "`cancel_pending_order` only within a day of ordering.")] * 2
    ):
        a, o = write("cancel_pending_order", W1, ok=False, code="refused", error="refused.", rule_id=rule_id, rule=rule)
        steps = [
            s.model_copy(update={"episode_id": f"i{n}#0"}).sealed() for s in [st(0, ASK), st(1, a, o), st(2, FINISH)]
        ]
        frames.append(steps_frame(steps, item_id=f"i{n}", seed=0).assign(episode_id=f"i{n}#0"))
        scores.append({"item_id": f"i{n}", "seed": 0, "score": 0.5, "success": False, "error": ""})
    traces, scores = pd.concat(frames, ignore_index=True), pd.DataFrame(scores)
    d = diagnose(traces, scores, pkg, WRITES, "t", targets=TARGETS)
    assert sorted((p.kind, p.rule_id, len(p.episodes)) for p in d.packets) == [
        ("policy_refusal", "cancel_reason", 2),
        ("policy_refusal", "cancel_window", 2),
    ]
    ctx = PlanContext(d.packets, pkg, bench, traces, scores, set(), d.findings)
    plans = {p.rule_id: rules_plan(p, ctx) for p in d.packets}
    cards = {r: plan.operations[0] for r, plan in plans.items()}
    # one card per write, stating both rules (each cluster alone may be too small for the gate)
    assert {c.meta["id"] for c in cards.values()} == {"cancel-pending-order-rules"}
    assert cards["cancel_reason"].body.startswith(RULE) and "within a day" in cards["cancel_reason"].body


@pytest.mark.parametrize(
    "cards,delivered,helps,expect",
    [
        ({}, (), None, ("E", "policy_refusal")),  # nothing in memory knows the rule
        ({"c": "`cancel_pending_order` ..."}, ("c",), False, ("E", "ineffective_card")),  # the card does not help
        ({"c": "`cancel_pending_order` ...", "u": "other"}, ("c", "u"), True, ("rho", "diluted_card")),
        ({"c": "`cancel_pending_order` ..."}, ("c",), True, ("E", "policy_refusal")),  # right card, alone, not enough
        ({"c": "`cancel_pending_order` ..."}, (), True, ("rho", "card_not_fired")),
        # never at such a write: its text lacks the refused rule's values, so it cannot have stated it
        ({"c": "`cancel_pending_order` ..."}, (), None, ("E", "policy_refusal")),
        (
            {"c": "`cancel_pending_order`: 'no longer needed' or 'ordered by mistake'."},
            (),
            None,
            ("rho", "card_not_fired"),
        ),
    ],
)
def test_policy_refusals(tmp_path, cards, delivered, helps, expect):
    f = one(refused_episode(delivered), pkg_with(tmp_path, cards), {("cancel_pending_order", "cancel_reason"): helps})
    assert (f.owner, f.kind) == expect
    assert f.step == 1
    assert (f.opportunity == "present") == (expect[0] != "unknown")


def test_card_evidence_is_read_from_the_corpus(tmp_path):
    """A card whose turns clear the rule no more often than turns without it is judged unhelpful (E)."""
    pkg = pkg_with(tmp_path, {"c": "`cancel_pending_order` ..."})
    rows, scores = [], []
    for n in range(10):  # ten refusals with the card in memory, nothing else in the corpus
        steps = [s.model_copy(update={"episode_id": f"i{n}#0"}).sealed() for s in refused_episode(("c",))]
        rows.append(steps_frame(steps, item_id=f"i{n}", seed=0).assign(episode_id=f"i{n}#0"))
        scores.append({"item_id": f"i{n}", "seed": 0, "score": 0.5, "success": False, "error": ""})
    d = diagnose(pd.concat(rows, ignore_index=True), pd.DataFrame(scores), pkg, WRITES, "t")
    assert {(f.owner, f.kind) for f in d.findings} == {("E", "ineffective_card")}


def _ledger(status, args, evidence=None):
    return {
        "id": "e1",
        "tool": "cancel_pending_order",
        "args": args,
        "status": status,
        "evidence": evidence,
        "note": "",
    }


def test_w_kinds(tmp_path):
    pkg = pkg_with(tmp_path)
    listed = [("cancel_pending_order", W2)]
    dropped = [st(0, ASK, pending=listed, after=[_ledger("pending", {"order_id": W2})]), st(1, ASK), st(2, FINISH)]
    assert (one(dropped, pkg).owner, one(dropped, pkg).kind) == ("W", "dropped")
    overflow = [st(0, ASK, pending=listed), st(1, ASK), st(2, FINISH)]
    assert one(overflow, pkg).kind == "overflow"
    grounded = [
        st(0, ASK, pending=listed, after=[_ledger("done", {"order_id": W2}, "call_9")]),
        st(1, ASK),
        st(2, FINISH),
    ]
    assert one(grounded, pkg).kind == "wrong_grounding"
    f = one(dropped, pkg)
    assert f.step == 1  # the step after it was last listed: where it went astray


def test_external_and_fallbacks(tmp_path):
    pkg = pkg_with(tmp_path)
    a, _ = write("cancel_pending_order", W1)
    _, blocking = write("cancel_pending_order", W1, ok=False, code="invalid_state", error="x", blocking=True)
    f = one([st(0, a, blocking), st(1, FINISH)], pkg)
    assert (f.owner, f.kind, f.patchability) == ("none", "blocking_error", "external")
    assert diagnose_episode([], "t", pkg, WRITES, error="model: broken", episode_id="t#0").kind == "model_fault"
    assert one([st(0, ASK), st(1, FINISH)], pkg).kind == "no_divergence"


def test_the_earliest_divergence_wins(tmp_path):
    """An unconfirmed write at step 1 comes before a refusal at step 3; a refusal at step 1 before an unconfirmed
    write at step 3: the earliest finding is the diagnosis, whichever owner it has."""
    pkg = pkg_with(tmp_path)
    ok_a, ok_o = write("return_delivered_order_items", W2)
    bad_a, bad_o = write("cancel_pending_order", W1, **REFUSED)
    pend = [("cancel_pending_order", W1), ("return_delivered_order_items", W2)]
    c_first = [
        st(0, ASK, pending=pend),
        st(1, ok_a, ok_o, pending=pend),
        st(2, ASK, pending=pend),
        st(3, bad_a, bad_o, pending=pend),
        st(4, FINISH),
    ]
    e_first = [
        st(0, ASK, pending=pend),
        st(1, bad_a, bad_o, pending=pend),
        st(2, ASK, pending=pend),
        st(3, ok_a, ok_o, pending=pend),
        st(4, FINISH),
    ]
    assert (one(c_first, pkg).owner, one(c_first, pkg).step) == ("C", 1)
    assert (one(e_first, pkg).owner, one(e_first, pkg).step) == ("E", 1)


def test_unknown_is_reported_and_never_planned(tmp_path, bench):
    """A card that was never in memory at a refused write whose receipt states no rule (coded), with no rules from
    train and no later delivery: nothing tells, the diagnoser says `unknown` and the rules plan nothing."""
    from components.evolution.meta import PlanContext, make_meta_agent

    pkg = pkg_with(tmp_path, {"c": "`cancel_pending_order` ..."})
    frames, scores = [], []
    a, o = write("cancel_pending_order", W1, **(REFUSED | {"rule": None}))
    coded = [
        st(0, ASK, pending=[("cancel_pending_order", W1)]),
        st(1, a, o, pending=[("cancel_pending_order", W1)]),
        st(2, FINISH, incoming=o),
    ]
    for n in range(3):
        steps = [s.model_copy(update={"episode_id": f"i{n}#0"}).sealed() for s in coded]
        frames.append(steps_frame(steps, item_id=f"i{n}", seed=0).assign(episode_id=f"i{n}#0"))
        scores.append({"item_id": f"i{n}", "seed": 0, "score": 0.5, "success": False, "error": ""})
    traces, scores = pd.concat(frames, ignore_index=True), pd.DataFrame(scores)
    d = diagnose(traces, scores, pkg, WRITES, "t")
    assert [(p.owner, p.kind, p.patchable) for p in d.packets] == [("unknown", "card_unobserved", False)]
    ctx = PlanContext(d.packets, pkg, bench, traces, scores, set(), d.findings)
    assert make_meta_agent("rules")(ctx) is None


@pytest.mark.parametrize("fact", list(BY_ID.values()), ids=list(BY_ID))
def test_cards_the_rules_distil_from_receipts_are_understood(fact):
    """The rules meta-agent writes an E card from the rule text a refusal receipt carries, plus the calls that
    preceded the write in successful episodes; the agent must read it as the rule's correct value."""
    from components.worlds.retail.tools import RetailTools

    _, _, content = RetailTools({})._policy(fact.id, "refused.")
    assert content["rule_id"] == fact.id
    body = content["rule"] + (
        f"\n\nIn successful episodes, the calls before `{fact.tool}` were: "
        "`find_user_id_by_email`, `get_order_details`, `validate_address`."
    )
    assert fact.read(body) == fact.value


def test_work_beyond_a_binding_turn_budget_is_external(tmp_path):
    """When many episodes are cut off at the same length, an episode with more work than any success ever did in
    that many turns is `out_of_turns` (owner none), even though a fault happened on the way; below that, it is not."""
    from components.evolution.diagnose import TurnBudget

    pkg = pkg_with(tmp_path)
    ok_a, ok_o = write("return_delivered_order_items", W2)
    two = [("cancel_pending_order", W1), ("return_delivered_order_items", W2)]
    cut = [st(0, ok_a, ok_o, pending=two), st(1, ASK, pending=two[:1]), st(2, ASK, pending=two[:1])]  # unconfirmed, cut
    success_one = [
        st(0, *confirm("return_delivered_order_items", W2), pending=two[1:]),
        st(1, ok_a, ok_o, pending=two[1:]),
        st(2, FINISH),
    ]
    success_one = [s.model_copy(update={"episode_id": "s#0"}).sealed() for s in success_one]
    budget = TurnBudget.of([cut, success_one], {"t#0": False, "s#0": True}, WRITES)
    assert budget.binding and budget.cap == 3 and budget.need == {1: 3}
    f = diagnose_episode(cut, "t", pkg, WRITES, episode_id="t#0", budget=budget)
    assert (f.owner, f.kind, f.patchability) == ("none", "out_of_turns", "external")
    roomy = TurnBudget(cap=3, binding=True, need={1: 3, 2: 3})  # a success did two writes in three turns
    assert diagnose_episode(cut, "t", pkg, WRITES, episode_id="t#0", budget=roomy).kind == "unconfirmed_write"
    loose = TurnBudget(cap=3, binding=False, need={1: 3})  # nobody is cut off: the budget explains nothing
    assert diagnose_episode(cut, "t", pkg, WRITES, episode_id="t#0", budget=loose).kind == "unconfirmed_write"
