"""The `rules` meta-agent, branch by branch, on synthetic evidence (most branches never run in the default campaign).

Each plan is also applied to a copy of its package: the candidate must load and show the change the plan names."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from components.evidence.packets import Citation, Claim, EvidencePacket
from components.evolution.findings import Finding
from components.evolution.meta import CHECKER_FOR, PlanContext, make_meta_agent, rules_plan
from components.evolution.patch import apply_plan
from components.memory import load_package
from components.runtime.trace import TraceStep, steps_frame
from tests.conftest import PACKAGES

WRITES = frozenset({"cancel_pending_order", "return_delivered_order_items", "modify_pending_order_address"})
BENCH = SimpleNamespace(write_tools=WRITES)  # the only thing the rules read from a benchmark
CITE = Citation(episode_id="i1#0", step=0, hash="a" * 64)


def packet(
    owner: str,
    kind: str,
    tool: str = "*",
    detail: str = "",
    pid: str = "k1",
    n: int = 1,
    opportunity: str = "present",
    patchability: str = "memory",
    rule_id: str | None = None,
) -> EvidencePacket:
    return EvidencePacket(
        id=pid,
        corpus="c",
        owner=owner,
        opportunity=opportunity,
        patchability=patchability,
        kind=kind,
        tool=tool,
        detail=detail,
        rule_id=rule_id,
        episodes=[f"i{k}#0" for k in range(1, n + 1)],
        items=[f"i{k}" for k in range(1, n + 1)],
        claims=[Claim(statement=f"{owner}/{kind} on {tool}", evidence=[CITE])],
    )


def ctx(package, *packets, traces=None, scores=None, findings=(), rejected=()) -> PlanContext:
    pkg = package if not isinstance(package, (str, Path)) else load_package(package)
    return PlanContext(
        list(packets),
        pkg,
        BENCH,
        traces if traces is not None else pd.DataFrame(),
        scores if scores is not None else pd.DataFrame(columns=["item_id", "seed", "success"]),
        set(rejected),
        list(findings),
    )


def copy(tmp_path: Path, name: str) -> Path:
    dst = tmp_path / name
    shutil.copytree(PACKAGES / name, dst)
    return dst


def applied(plan, base, tmp_path):
    """The plan written into a fresh candidate: it must load."""
    return load_package(apply_plan(plan, base, tmp_path / "cand"))


def check_schema(plan, p: EvidencePacket, max_source_items: int = 12) -> None:
    assert plan.owner == p.owner and plan.cluster == p.id
    assert plan.evidence == p.citations() and plan.rationale == p.claims[0].statement
    assert plan.source_items == p.items[:max_source_items]


def event_cards_at_intent(pkg) -> bool:
    return any(b.spec.use == "event_cards" and b.spec.at == "intent_recorded" for b in pkg.delivery)


# -- E: a card distilled from the refusals -----------------------------------------------------------------------


def _step(eid: str, i: int, tool: str, ok: bool = True) -> TraceStep:
    return TraceStep(
        episode_id=eid,
        step=i,
        incoming={},
        state_before=[],
        delivered=[],
        deliveries=[],
        proposal={},
        action={"kind": "tool", "content": "", "tool": tool, "args": {}},
        checks=[],
        observation={"ok": ok},
        state_after=[],
        fingerprint=[],
    ).sealed()


def _episodes(spec: dict[str, tuple[bool, list[tuple[str, bool]]]]):
    """Episodes as {episode id: (success, [(tool, ok), ...])} -> (traces, scores)."""
    frames, rows = [], []
    for eid, (success, calls) in spec.items():
        item, seed = eid.split("#")
        frames.append(
            steps_frame([_step(eid, i, t, ok) for i, (t, ok) in enumerate(calls)], item_id=item, seed=int(seed))
        )
        rows.append({"item_id": item, "seed": int(seed), "success": success})
    return pd.concat(frames, ignore_index=True), pd.DataFrame(rows)


POLICY = "`cancel_pending_order` takes a `reason` that must be exactly 'no longer needed' or 'ordered by mistake'."


def test_e_policy_refusal_adds_a_routed_card_with_the_calls_successful_episodes_made(tmp_path):
    traces, scores = _episodes(
        {
            # two successes looked the order up first (read tools only; writes, repeats and `finish` are not listed)
            "s1#0": (
                True,
                [
                    ("find_user", True),
                    ("get_order", True),
                    ("find_user", True),
                    ("return_delivered_order_items", True),
                    ("cancel_pending_order", True),
                    ("finish", True),
                ],
            ),
            "s2#0": (
                True,
                [
                    ("find_user", True),
                    ("get_order", True),
                    ("cancel_pending_order", False),
                    ("cancel_pending_order", True),
                ],
            ),
            "s3#0": (True, [("get_order", True), ("cancel_pending_order", True)]),  # a minority sequence
            "f1#0": (False, [("cancel_pending_order", True)]),  # a failed episode never counts
            "f2#0": (False, [("cancel_pending_order", True)]),
            "f3#0": (False, [("cancel_pending_order", True)]),
        }
    )
    p = packet("E", "policy_refusal", "cancel_pending_order", detail=f"  {POLICY}  ", n=3, rule_id="cancel_reason")
    plan = rules_plan(p, ctx(PACKAGES / "seed", p, traces=traces, scores=scores), max_per_episode=4, max_source_items=2)
    check_schema(plan, p, max_source_items=2)
    card = plan.operations[0]
    assert card.op == "add_card" and card.path == "em/procedure/cancel-pending-order-rules.md"  # one card per write
    assert card.meta["trigger"] == {"event": "intent_recorded", "tool": "cancel_pending_order"}
    assert (
        card.body == POLICY + "\n\nIn successful episodes, the calls before `cancel_pending_order` were: "
        "`find_user`, `get_order`."
    )
    assert "cancel_reason" in card.meta["source"] and "k1" in card.meta["source"]
    assert plan.mechanism == "deliver:cancel-pending-order-rules@"
    # seed has no routing: the card comes with the binding that delivers it
    cand = applied(plan, PACKAGES / "seed", tmp_path)
    assert event_cards_at_intent(cand) and "cancel-pending-order-rules" in cand.cards
    assert [b.spec.cfg for b in cand.delivery] == [{"max_per_episode": 4}]


WINDOW = "`cancel_pending_order` only within a day of ordering."


def test_e_card_states_every_rule_refused_on_its_write(tmp_path):
    """Two rules on one write (two clusters) are one card: a change large enough for the gate to see."""
    small = packet("E", "policy_refusal", "cancel_pending_order", detail=WINDOW, pid="k2", n=1, rule_id="cancel_window")
    big = packet("E", "policy_refusal", "cancel_pending_order", detail=POLICY, pid="k1", n=3, rule_id="cancel_reason")
    other = packet(
        "E",
        "policy_refusal",
        "return_delivered_order_items",
        detail="`return_delivered_order_items` x.",
        pid="k3",
        n=5,
        rule_id="ret",
    )
    c = ctx(PACKAGES / "seed", small, big, other)
    plan = rules_plan(small, c)
    assert plan.owner == "E" and plan.cluster == "k2"
    card = plan.operations[0]
    assert card.body.split("\n\n") == [
        WINDOW,
        POLICY,
    ]  # its own rule first, then the others on the write, largest first
    assert plan.source_items == ["i1", "i2", "i3"]  # the items of every rule it states
    assert rules_plan(big, c).operations[0].body.split("\n\n") == [POLICY, WINDOW]
    assert "x." not in card.body  # another write's rule stays on its own card


def test_e_new_rule_on_a_written_card_rewrites_that_card_whole(tmp_path):
    first = packet("E", "policy_refusal", "cancel_pending_order", detail=POLICY, pid="k1", rule_id="cancel_reason")
    base = apply_plan(rules_plan(first, ctx(PACKAGES / "seed", first)), PACKAGES / "seed", tmp_path / "m1")
    pkg = load_package(base)
    assert rules_plan(first, ctx(pkg, first)) is None  # the rule is written down: nothing to add
    # a rule the card does not state shows up later, judged against the card (ineffective, or diluted routing)
    for owner, kind in (("E", "ineffective_card"), ("rho", "diluted_card")):
        later = packet(owner, kind, "cancel_pending_order", detail=WINDOW, pid="k2", rule_id="cancel_window")
        plan = rules_plan(later, ctx(pkg, later))
        assert plan.owner == "E" and [o.op for o in plan.operations] == ["remove_card", "add_card"]  # routed already
        assert plan.operations[1].body.split("\n\n") == [POLICY, WINDOW]
        cand = load_package(apply_plan(plan, base, tmp_path / f"m2{owner}"))
        assert [c for c in cand.cards if c.endswith("-rules")] == ["cancel-pending-order-rules"]
        assert WINDOW in cand.cards["cancel-pending-order-rules"].body


def test_rho_about_a_hand_written_card_is_routing_not_a_new_card():
    later = packet("rho", "diluted_card", "cancel_pending_order", detail=WINDOW, pid="k2", rule_id="cancel_window")
    plan = rules_plan(later, ctx(PACKAGES / "reference", later))
    assert plan is None or all(o.op != "add_card" for o in plan.operations)


def test_e_policy_refusal_without_successes_or_routing_to_add(tmp_path):
    p = packet(
        "E",
        "policy_refusal",
        "modify_pending_order_address",
        detail="Validate the address first.",
        rule_id="Address.Validated",
    )
    plan = rules_plan(p, ctx(PACKAGES / "reference", p))
    assert [o.op for o in plan.operations] == ["add_card"]  # reference already routes at intent_recorded
    assert plan.operations[0].body == "Validate the address first."
    assert "modify-pending-order-address-rules" in applied(plan, PACKAGES / "reference", tmp_path).cards  # a valid id


@pytest.mark.parametrize("detail,rule_id", [("", "cancel_reason"), ("   ", "cancel_reason"), (POLICY, None)])
def test_e_policy_refusal_with_no_rule_text_or_id_plans_nothing(detail, rule_id):
    p = packet("E", "policy_refusal", "cancel_pending_order", detail=detail, rule_id=rule_id)
    assert rules_plan(p, ctx(PACKAGES / "seed", p)) is None


def test_e_policy_refusal_never_adds_a_card_twice(tmp_path):
    pkg = copy(tmp_path, "reference")
    src = pkg / "em/procedure/cancel-reason.md"
    src.write_text(src.read_text().replace("id: cancel-reason", "id: cancel-reason-rule"))
    src.rename(pkg / "em/procedure/cancel-reason-rule.md")
    p = packet("E", "policy_refusal", "cancel_pending_order", detail=POLICY, rule_id="cancel_reason")
    assert rules_plan(p, ctx(pkg, p)) is None


# -- rho: rebind a card that did not fire, or route instead of delivering everything -----------------------------


def test_rho_card_not_fired_rebinds_the_card_and_adds_routing(tmp_path):
    p = packet("rho", "card_not_fired", "cancel_pending_order")
    plan = rules_plan(p, ctx(PACKAGES / "all-skills", p), max_per_episode=3)
    check_schema(plan, p)
    assert [o.op for o in plan.operations] == ["set_trigger", "add_binding"]
    assert plan.operations[0].path == "em/procedure/cancel-reason.md" and plan.mechanism == "deliver:cancel-reason@"
    cand = applied(plan, PACKAGES / "all-skills", tmp_path)
    t = cand.cards["cancel-reason"].meta.trigger
    assert (t.event, t.tool) == ("intent_recorded", "cancel_pending_order") and event_cards_at_intent(cand)


def test_rho_card_not_fired_moves_a_misrouted_trigger(tmp_path):
    pkg = copy(tmp_path, "reference")
    card = pkg / "em/procedure/cancel-reason.md"
    card.write_text(card.read_text().replace("tool: cancel_pending_order", "tool: get_order_details"))
    p = packet("rho", "card_not_fired", "cancel_pending_order")
    plan = rules_plan(p, ctx(pkg, p))
    assert [o.op for o in plan.operations] == ["set_trigger"]  # routing is there already
    assert applied(plan, pkg, tmp_path).cards["cancel-reason"].meta.trigger.tool == "cancel_pending_order"


def test_rho_card_not_fired_when_the_card_is_already_routed_there_plans_nothing():
    p = packet("rho", "card_not_fired", "cancel_pending_order")
    assert rules_plan(p, ctx(PACKAGES / "reference", p)) is None


def test_rho_card_not_fired_with_no_card_about_the_tool_plans_nothing():
    p = packet("rho", "card_not_fired", "transfer_to_human_agents")
    assert rules_plan(p, ctx(PACKAGES / "reference", p)) is None


def test_rho_diluted_card_routes_instead_of_delivering_everything(tmp_path):
    p = packet("rho", "diluted_card")
    plan = rules_plan(p, ctx(PACKAGES / "all-skills", p))
    check_schema(plan, p)
    assert [(o.op, getattr(o, "use", None)) for o in plan.operations] == [
        ("remove_binding", "all_cards"),
        ("add_binding", "event_cards"),
    ]
    assert plan.mechanism == "deliver:"
    cand = applied(plan, PACKAGES / "all-skills", tmp_path)
    assert [b.label for b in cand.delivery] == ["event_cards@intent_recorded"]
    assert set(cand.cards) == set(load_package(PACKAGES / "all-skills").cards)  # every card still reachable


def test_rho_diluted_card_keeps_blanket_delivery_when_a_card_has_no_trigger(tmp_path):
    pkg = copy(tmp_path, "all-skills")
    card = pkg / "em/procedure/cancel-reason.md"
    card.write_text(card.read_text().replace("trigger:\n  event: intent_recorded\n  tool: cancel_pending_order\n", ""))
    assert load_package(pkg).cards["cancel-reason"].meta.trigger is None
    p = packet("rho", "diluted_card")
    assert rules_plan(p, ctx(pkg, p)) is None  # routing would strand it


def test_rho_diluted_card_without_blanket_delivery_plans_nothing():
    p = packet("rho", "diluted_card")
    assert rules_plan(p, ctx(PACKAGES / "reference", p)) is None


# -- C: the checker that would have bounced the escaped action ---------------------------------------------------


@pytest.mark.parametrize("kind", sorted(CHECKER_FOR))
def test_c_adds_the_checker_for_the_escape(tmp_path, kind):
    use, at, _ = CHECKER_FOR[kind]
    p = packet("C", kind, "cancel_pending_order")
    plan = rules_plan(p, ctx(PACKAGES / "seed", p))
    check_schema(plan, p)
    assert plan.mechanism == f"check:{use}@{at}"
    assert [b.label for b in applied(plan, PACKAGES / "seed", tmp_path).checkers] == [f"{use}@{at}"]
    assert rules_plan(p, ctx(PACKAGES / "reference", p)) is None  # reference has both checkers already


def test_c_unknown_escape_plans_nothing():
    p = packet("C", "something_else")
    assert rules_plan(p, ctx(PACKAGES / "seed", p)) is None


# -- W: the ledger option the evidence points at -----------------------------------------------------------------


def finding(eid: str, owner: str, kind: str, tool: str = "*", **extra) -> Finding:
    return Finding(
        episode_id=eid, item_id=eid.split("#")[0], step=0, hash="a" * 64, owner=owner, kind=kind, tool=tool, extra=extra
    )


def test_w_wrong_grounding_binds_on_the_arguments_the_findings_name(tmp_path):
    p = packet("W", "wrong_grounding", "cancel_pending_order", n=2)
    fs = [
        finding("i1#0", "W", "wrong_grounding", "cancel_pending_order", bind_args=["order_id"]),
        finding("i2#0", "W", "wrong_grounding", "cancel_pending_order", bind_args=["item_ids", "order_id"]),
        finding("i9#0", "W", "wrong_grounding", "cancel_pending_order", bind_args=["user_id"]),  # not this cluster
        finding("i1#0", "W", "wrong_grounding", "other_tool", bind_args=["zip"]),
    ]  # another signature
    plan = rules_plan(p, ctx(PACKAGES / "seed", p, findings=fs))
    check_schema(plan, p)
    assert plan.operations[0].value == ["item_ids", "order_id"] and plan.mechanism == "ground:"
    assert applied(plan, PACKAGES / "seed", tmp_path).wm.bind_on == ["item_ids", "order_id"]
    # reference binds on order_id already: the union keeps it and adds the new key
    plan = rules_plan(p, ctx(PACKAGES / "reference", p, findings=fs[1:2]))
    assert plan.operations[0].value == ["item_ids", "order_id"]


def test_w_wrong_grounding_with_nothing_new_to_bind_plans_nothing():
    p = packet("W", "wrong_grounding", "cancel_pending_order")
    no_args = [finding("i1#0", "W", "wrong_grounding", "cancel_pending_order")]
    same = [finding("i1#0", "W", "wrong_grounding", "cancel_pending_order", bind_args=["order_id"])]
    assert rules_plan(p, ctx(PACKAGES / "seed", p, findings=no_args)) is None
    assert rules_plan(p, ctx(PACKAGES / "reference", p, findings=same)) is None


def test_w_overflow_raises_max_entries_past_the_largest_proposal(tmp_path):
    p = packet("W", "overflow", n=2)
    fs = [
        finding("i1#0", "W", "overflow", proposed_max=3),
        finding("i2#0", "W", "overflow", proposed_max=5),
        finding("i3#0", "W", "overflow", proposed_max=40),
    ]  # another cluster's episode
    plan = rules_plan(p, ctx(PACKAGES / "seed", p, findings=fs))
    check_schema(plan, p)
    assert plan.operations[0].value == 8 and plan.mechanism == "ledger:add"  # 5 + 2 of headroom, to a power of two
    assert "was 2" in plan.summary and applied(plan, PACKAGES / "seed", tmp_path).wm.max_entries == 8
    fs[1] = finding("i2#0", "W", "overflow", proposed_max=4)  # one entry fewer seen: the same plan, not a new one
    assert rules_plan(p, ctx(PACKAGES / "seed", p, findings=fs)).key() == plan.key()


def test_w_overflow_is_capped_at_the_schema_limit(tmp_path):
    p = packet("W", "overflow")
    plan = rules_plan(p, ctx(PACKAGES / "seed", p, findings=[finding("i1#0", "W", "overflow", proposed_max=500)]))
    assert plan.operations[0].value == 64
    assert applied(plan, PACKAGES / "seed", tmp_path).wm.max_entries == 64


@pytest.mark.parametrize("proposed", [None, 5, 6])
def test_w_overflow_within_capacity_plans_nothing(proposed):
    p = packet("W", "overflow")  # reference tracks 8: 5 + 2 and 6 + 2 fit, no finding at all gives 2
    fs = [] if proposed is None else [finding("i1#0", "W", "overflow", proposed_max=proposed)]
    assert rules_plan(p, ctx(PACKAGES / "reference", p, findings=fs)) is None
    assert rules_plan(p, ctx(PACKAGES / "reference", p, findings=[finding("i1#0", "W", "overflow", proposed_max=7)]))


def test_w_dropped_renders_the_board(tmp_path):
    p = packet("W", "dropped")
    plan = rules_plan(p, ctx(PACKAGES / "none", p))
    check_schema(plan, p)
    assert plan.mechanism == "board" and applied(plan, PACKAGES / "none", tmp_path).wm.board is True
    assert rules_plan(p, ctx(PACKAGES / "seed", p)) is None  # seed renders it already


@pytest.mark.parametrize(
    "owner,kind",
    [("W", "policy_refusal"), ("E", "overflow"), ("rho", "dropped"), ("none", "external"), ("E", "unknown_kind")],
)
def test_an_owner_kind_pair_with_no_rule_plans_nothing(owner, kind):
    p = packet(owner, kind, "cancel_pending_order", detail=POLICY)
    assert rules_plan(p, ctx(PACKAGES / "seed", p)) is None


# -- the agent: upstream layers first, never a rejected plan, never an unpatchable cluster -----------------------


def test_rules_agent_repairs_upstream_first_and_skips_what_it_cannot_or_may_not_do():
    c = packet("C", "premature_finish", pid="c", n=9)  # the biggest cluster, but downstream of W
    w_small = packet("W", "dropped", pid="w1", n=1)
    w_big = packet("W", "overflow", pid="w2", n=3)
    absent = packet("W", "dropped", pid="w0", n=20, opportunity="absent")
    external = packet(
        "E", "policy_refusal", "cancel_pending_order", detail=POLICY, pid="e0", n=20, patchability="external"
    )
    fs = [finding(f"i{k}#0", "W", "overflow", proposed_max=10) for k in (1, 2, 3)]
    propose = make_meta_agent("rules", {})
    context = ctx(PACKAGES / "none", c, w_small, w_big, absent, external, findings=fs)
    first = propose(context)
    assert first.cluster == "w2"  # W before C; within W, the larger cluster first; unpatchable ones never
    context.rejected = {first.key()}
    assert propose(context).cluster == "w1"
    context.rejected.add(propose(context).key())
    assert propose(context).cluster == "c"
    context.rejected.add(propose(context).key())
    assert propose(context) is None


def test_a_card_plan_key_ignores_its_provenance():
    """The same card proposed again in a later round (more refusals counted in its `source`) is the same plan, so a
    rejected card is not retried; a different body is a different plan."""
    from components.evolution.plan import parse_plan

    def plan(source: str, body: str = "Before `w`, do it.") -> dict:
        card = {
            "op": "add_card",
            "path": "em/procedure/r-rule.md",
            "body": body,
            "meta": {"id": "r-rule", "type": "procedure", "source": source},
        }
        return {
            "owner": "E",
            "cluster": "c1",
            "summary": "s",
            "evidence": [{"episode_id": "t#0", "step": 1, "hash": "h" * 64}],
            "operations": [card],
            "mechanism": "deliver:r-rule@",
            "source_items": ["t"],
        }

    a, b = parse_plan(plan("diagnosis p1: 4 refusals")), parse_plan(plan("diagnosis p7: 9 refusals"))
    assert a.key() == b.key()
    assert parse_plan(plan("diagnosis p1: 4 refusals", "Never `w`.")).key() != a.key()


def test_a_rule_whose_text_validation_would_call_task_data_is_left_off_the_card(bench):
    """One leaking rule would sink the whole card at validation: it is left off, the write's other rules still go."""
    from components.evolution.validate import leak_tokens

    token = sorted(leak_tokens(bench))[0]
    leaky = packet(
        "E",
        "policy_refusal",
        "cancel_pending_order",
        detail=f"`cancel_pending_order` pass {token}.",
        pid="k2",
        n=4,
        rule_id="leaky",
    )
    clean = packet("E", "policy_refusal", "cancel_pending_order", detail=POLICY, pid="k1", n=1, rule_id="cancel_reason")
    c = PlanContext(
        [leaky, clean],
        load_package(PACKAGES / "seed"),
        bench,
        pd.DataFrame(),
        pd.DataFrame(columns=["item_id", "seed", "success"]),
        set(),
        [],
    )
    assert rules_plan(leaky, c) is None  # its own rule cannot be written
    assert rules_plan(clean, c).operations[0].body == POLICY  # the other rule of the write, without the leaky one


def test_a_plan_names_at_most_the_campaigns_repair_max_items_source_tasks():
    """`campaign.repair_max_items` reaches the meta-agents through the plan's context (the flow's plan stage sets
    it); at its default (12) a plan names every item of a small cluster."""
    from components.defaults import MAX_SOURCE_ITEMS
    from components.params import CampaignParams
    from flows.tasks import inputs_key, plan_stage

    assert CampaignParams().repair_max_items == MAX_SOURCE_ITEMS == 12
    p = packet("C", "unconfirmed_write", "*", detail="cancel_pending_order", n=5)
    c = ctx(PACKAGES / "seed", p)
    assert make_meta_agent("rules")(c).source_items == p.items
    c.max_source_items = 3
    assert make_meta_agent("rules")(c).source_items == p.items[:3]
    # the bound is an input of the plan stage's cache key (its default, when not given)
    key = {
        "package": str(PACKAGES / "seed"),
        "bench": str(PACKAGES / "seed"),
        "corpus": "c",
        "rejected": [],
        "meta_agent": "rules",
        "meta_cfg": {},
    }
    assert inputs_key(plan_stage.fn, key) == inputs_key(plan_stage.fn, {**key, "max_source_items": 12})
    assert inputs_key(plan_stage.fn, key) != inputs_key(plan_stage.fn, {**key, "max_source_items": 3})


def test_a_plan_rejected_here_is_tried_again_after_the_untried_ones_when_drafted_anew():
    """A card drafted again from a new champion's traces differs in a detail (another key) but acts at the same
    site (`Plan.site`); a rejected site is deferred behind every untried plan, and proposed when none is left."""
    w_big = packet("W", "overflow", pid="w2", n=3)
    w_small = packet("W", "dropped", pid="w1", n=1)
    fs = [finding(f"i{k}#0", "W", "overflow", proposed_max=10) for k in (1, 2, 3)]
    propose = make_meta_agent("rules", {})
    context = ctx(PACKAGES / "none", w_small, w_big, findings=fs)
    first = propose(context)
    assert first.cluster == "w2"
    redrafted = first.model_copy(
        update={"operations": [first.operations[0].model_copy(update={"value": first.operations[0].value + 1})]}
    )
    assert redrafted.key() != first.key() and redrafted.site() == first.site()
    context.later = {first.site()}
    assert propose(context).cluster == "w1"  # the untried plan first
    context.rejected = {propose(context).key()}
    assert propose(context).key() == first.key()  # nothing untried is left: the deferred one


def test_the_lineage_names_the_sites_of_its_rejected_plans(tmp_path):
    from components.evolution.lineage import Lineage
    from components.evolution.plan import parse_plan

    plan = parse_plan(
        {
            "owner": "W",
            "cluster": "w",
            "summary": "s",
            "evidence": [{"episode_id": "t#0", "step": 1, "hash": "h" * 64}],
            "operations": [{"op": "set_wm", "field": "max_entries", "value": 8}],
            "mechanism": "wm:",
            "source_items": ["t"],
        }
    )
    lin = Lineage(tmp_path / "lineage")
    lin.start(PACKAGES / "seed", "bench-digest")
    lin.reject(1, {"plan_key": plan.key(), "reason": "gate: test"}, plan.model_dump())
    assert lin.rejected_keys() == {plan.key()} and lin.rejected_sites() == {plan.site()}


def test_a_cards_site_is_its_path_with_or_without_the_delivery_wiring():
    """The first card of a package adds the delivery wiring, a card drafted after it finds the wiring in place: the
    same card at the same path is one site either way; another path, or a checker, is another."""
    from components.evolution.plan import parse_plan

    card = {"op": "add_card", "path": "em/procedure/w-rules.md", "body": "Before `w`, do it.", "meta": {"id": "w"}}
    wiring = {"op": "add_binding", "section": "delivery", "use": "event_cards", "at": "intent_recorded"}
    checker = {"op": "add_binding", "section": "checkers", "use": "confirm_before_write", "at": "pre_write"}

    def plan(owner: str, *ops: dict) -> object:
        evidence = [{"episode_id": "t#0", "step": 1, "hash": "h" * 64}]
        return parse_plan(
            {
                "owner": owner,
                "cluster": "c",
                "summary": "s",
                "evidence": evidence,
                "operations": list(ops),
                "mechanism": "m",
                "source_items": ["t"],
            }
        )

    first, later = plan("E", card, wiring), plan("E", card)
    assert first.key() != later.key() and first.site() == later.site()
    other = plan("E", card | {"path": "em/procedure/v-rules.md"})
    assert other.site() != later.site()
    assert plan("C", checker).site() != plan("C", checker | {"use": "pending_before_finish"}).site()
    assert plan("rho", wiring).site() != plan("E", card).site()  # wiring alone is a site of its own
