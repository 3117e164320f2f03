"""A package's check that fires on its own criterion (`components.evolution.own_checks.against_checks`): the
diagnosis asks what the check does to each write made right, by running the package's own checkers on it."""

from __future__ import annotations

from fractions import Fraction

from components.codes import FindingKind, Owner
from components.evolution.findings import Finding
from components.evolution.findings import own_bounce_rate
from components.evolution.own_checks import MadeRight, against_checks, own_bounces, right_forms, save_chance
from components.memory.events import PRE_WRITE
from components.memory.package import load_package
from components.memory.strategies import CHECKERS, CheckContext, Verdict
from components.runtime.trace import TraceStep
from components.worlds.outcome_rules import Cond, FieldRule, Term

TOOL, TARGETS = "exchange", {"exchange": ["order_id"]}
WRITES = frozenset({TOOL})


def house_limit(*, over: float = 5.0):
    """Bounces any write whose fee is above `over` (a house rule of the package's, no agent's fault: no code)."""

    def check(ctx: CheckContext) -> Verdict:
        call = ctx.draft.tool_call
        if call is None or call.name not in ctx.write_tools or float(call.args.get("fee", 0)) <= over:
            return Verdict(True)
        return Verdict(False, "the fee looks unusual: review it")

    return check


def _package(tmp_path, over: float):
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "manifest.yaml").write_text(
        "name: limited\nwm:\n  board: true\n  max_entries: 2\n  bind_on: []\n"
        f"delivery: []\ncheckers:\n  - use: house_limit\n    at: pre_write\n"
        f"    cfg:\n      over: {over}\n"
    )
    return load_package(tmp_path)


def _step(
    i: int,
    tool: str,
    args: dict,
    content: dict | None = None,
    checks: list | None = None,
    blocked: str | None = None,
    eid: str = "e#0",
) -> TraceStep:
    return TraceStep(
        episode_id=eid,
        step=i,
        incoming={},
        state_before=[],
        delivered=[],
        deliveries=[],
        proposal={},
        action={"kind": "tool", "tool": tool, "args": args},
        checks=checks or [],
        blocked=blocked,
        observation={"role": "tool", "ok": blocked is None, "content": content or {}},
        state_after=[],
        fingerprint=["redraft"] if blocked else [],
    ).sealed()


def _write(i: int, fee: float, blocked: bool = False, eid: str = "e#0") -> TraceStep:
    reason = "the fee looks unusual: review it" if blocked else ""
    check = {"strategy": "house_limit", "event": PRE_WRITE, "ok": not blocked, "reason": reason, "attempt": 0}
    return _step(i, TOOL, {"order_id": "#1", "fee": fee}, checks=[check], blocked=reason or None, eid=eid)


RULES = {"fee": FieldRule("fee", Term("const", Fraction(8)))}  # the fee is 8, whatever the order


def test_the_package_checks_run_on_a_write_made_right(tmp_path):
    with CHECKERS.scoped("house_limit", house_limit, events={PRE_WRITE}):
        pkg = _package(tmp_path, over=5.0)
        assert own_bounces(pkg, TOOL, {"order_id": "#1", "fee": 8.0}, WRITES, TARGETS) == ["house_limit@pre_write"]
        assert own_bounces(pkg, TOOL, {"order_id": "#1", "fee": 0.0}, WRITES, TARGETS) == []
        # made right, in the form of the agent's own argument (a float stays a float)
        assert right_forms(_write(0, 0.0), [_write(0, 0.0)], RULES, WRITES, TARGETS) == [{"order_id": "#1", "fee": 8.0}]


def test_a_rule_reading_another_field_of_the_write_reads_it_made_right():
    """The refund goes back to the order's own method, and is 5% more when that method is a gift card. The agent
    refunded 105 to the gift card; the order was paid by credit card: made right, the method is the card and the
    refund 100 (before, the bonus was read off the method the agent wrongly chose, and the form was 105)."""
    methods = [{"id": "gift_1", "kind": "gift"}, {"id": "card_1", "kind": "card"}]
    gift = Cond(path="get_order.methods[id=@method].kind", op="is", value="gift")
    rules = {
        "method": FieldRule("method", Term("equal", None, "get_order.method")),
        "refund": FieldRule("refund", Term("const", Fraction(100)), factors=((gift, Fraction(21, 20)),)),
    }
    for paid, drafted, right in (("card_1", ("gift_1", 105.0), 100.0), ("gift_1", ("card_1", 100.0), 105.0)):
        read = _step(0, "get_order", {"order_id": "#1"}, {"method": paid, "methods": methods})
        draft = _step(1, TOOL, {"order_id": "#1", "method": drafted[0], "refund": drafted[1]})
        assert right_forms(draft, [read, draft], rules, WRITES, TARGETS) == [
            {"order_id": "#1", "method": paid, "refund": right}
        ]


def test_a_wrong_write_whose_right_form_the_check_bounces_is_the_checks_not_the_agents(tmp_path):
    """The fee was wrong (0 for 8) and went through; made right, the package's own check bounces it: fixing the
    agent would not have saved the episode (owner none). With a check that lets 8 through, it stays the agent's."""
    steps = [_write(0, 0.0)]
    e = Finding("e#0", "e", 0, steps[0].hash, Owner.E, FindingKind.UNSEEN_VALUE, TOOL)
    with CHECKERS.scoped("house_limit", house_limit, events={PRE_WRITE}):
        for over, owner in ((5.0, Owner.NONE), (10.0, Owner.E)):
            pkg = _package(tmp_path / str(over), over)

            def right(s):
                return right_forms(s, steps, RULES, WRITES, TARGETS)

            got = against_checks(e, steps, pkg, WRITES, MadeRight(right), {}, {TOOL: RULES}, TARGETS)
            assert got.owner == owner
            assert (got.kind == FindingKind.CHECKER_FALSE_ALARM) == (owner == Owner.NONE)


def test_a_bounced_wrong_draft_whose_right_form_passes_is_the_wrong_argument(tmp_path):
    """The check bounced the agent's draft (a fee of 9, over the limit of 8.5) and it was never redone: a false
    alarm at a glance. Made right (8), the draft passes the check: the wrong fee failed the episode (E)."""
    steps = [_write(0, 9.0, blocked=True)]
    alarm = Finding("e#0", "e", 0, steps[0].hash, Owner.NONE, FindingKind.CHECKER_FALSE_ALARM, "*", TOOL)
    with CHECKERS.scoped("house_limit", house_limit, events={PRE_WRITE}):
        pkg = _package(tmp_path, over=8.5)

        def right(s):
            return right_forms(s, steps, RULES, WRITES, TARGETS)

        got = against_checks(alarm, steps, pkg, WRITES, MadeRight(right), {}, {TOOL: RULES}, TARGETS)
        assert (got.owner, got.kind, got.tool) == (Owner.E, FindingKind.WRONG_VALUE, TOOL)
        assert "`fee` 9.0, right 8.0" in got.detail
        # a draft that was right already and still bounced is the check's own
        right_already = [_write(0, 8.0, blocked=True)]
        assert (
            against_checks(
                alarm,
                right_already,
                _package(tmp_path / "b", over=7.0),
                WRITES,
                MadeRight(lambda s: right_forms(s, right_already, RULES, WRITES, TARGETS)),
                {},
                {TOOL: RULES},
                TARGETS,
            ).owner
            == Owner.NONE
        )


def test_unknown_right_forms_count_by_how_often_the_check_bounces(tmp_path):
    """A write whose right form is unknown passes made right with the chance the corpus shows a check lets a
    draft through; the episode's chance is the product over its writes."""
    steps = [_write(0, 0.0), _write(1, 0.0, eid="e#0").model_copy(update={"step": 1}).sealed()]
    with CHECKERS.scoped("house_limit", house_limit, events={PRE_WRITE}):
        pkg = _package(tmp_path, over=5.0)
        chance, bounced = save_chance(steps, pkg, WRITES, MadeRight(lambda s: None, lambda s: 1.0, 0.6), TARGETS)
        assert bounced is None and abs(chance - 0.6) < 1e-9  # one target, drafted twice: counted once
        chance, _ = save_chance(steps, pkg, WRITES, MadeRight(lambda s: None, lambda s: 0.0, 0.6), TARGETS)
        assert chance == 1.0  # right already, and it went through: it goes through again


def test_the_bounce_rate_counts_an_episodes_distinct_drafts_and_ignores_coded_bounces():
    passed, bounced = _write(0, 1.0), _write(1, 9.0, blocked=True)
    retried = _write(2, 9.0, blocked=True)
    assert own_bounce_rate([[passed, bounced, retried]], WRITES) == 0.5
    coded = bounced.model_copy(
        update={
            "checks": [
                {
                    **bounced.checks[0],
                    "reason": (
                        "`exchange` needs the customer's confirmation first: call `confirm` with this tool and its arguments, and "
                        "write only if it is granted"
                    ),
                }
            ]
        }
    )
    assert own_bounce_rate([[passed, coded]], WRITES) is None


def test_a_successful_episode_of_the_item_gives_its_writes_right_forms(tmp_path):
    """With no rule to make the write right, the write a successful episode of the same item made is its right
    form: the check bounces it (chance 0) or lets it through (chance 1), where the unknown form was priced."""
    steps = [_write(0, 0.0)]
    target = (TOOL, (("order_id", "#1"),))
    with CHECKERS.scoped("house_limit", house_limit, events={PRE_WRITE}):
        pkg = _package(tmp_path, over=5.0)
        unknown, _ = save_chance(steps, pkg, WRITES, MadeRight(lambda s: None, lambda s: 1.0, 0.6), TARGETS)
        assert abs(unknown - 0.6) < 1e-9
        for fee, chance in ((8.0, 0.0), (4.0, 1.0)):
            got, bounced = save_chance(
                steps,
                pkg,
                WRITES,
                MadeRight(lambda s: None, lambda s: 1.0, 0.6, solved={target: {"order_id": "#1", "fee": fee}}),
                TARGETS,
            )
            assert got == chance and (bounced is not None) == (chance == 0.0)
        # a write the item's success made that this episode never drafted is needed all the same
        other = (TOOL, (("order_id", "#2"),))
        got, bounced = save_chance(
            steps,
            pkg,
            WRITES,
            MadeRight(lambda s: None, lambda s: 0.0, 0.6, solved={other: {"order_id": "#2", "fee": 9.0}}),
            TARGETS,
        )
        assert got == 0.0 and bounced == (TOOL, {"order_id": "#2", "fee": 9.0})
