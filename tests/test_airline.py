"""The airline world without an agent: materialization (contract, determinism), the facts' reading grammar
(negation included), stated vs unstated rules, receipts, the simulated member's confirmation, the weighted rubric,
external tasks, and the hand-written packages."""

from __future__ import annotations

from pathlib import Path

import pytest

from components.runtime.types import CONFIRM_TOOL, ToolCall, Turn
from components.worlds import load_benchmark
from fractions import Fraction

from components.worlds.airline import facts as F
from components.worlds.airline.rules import NO_SURCHARGE, Surcharge
from components.worlds.rules import Window
from components.worlds.airline import materialize
from components.worlds.airline.env import AirlineEnv
from components.worlds.airline.tasks import FAMILIES, policy_text
from components.worlds.airline.tools import TARGETS, WRITE_TOOLS

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ROOT / "data" / "packages" / "airline"


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    out = tmp_path_factory.mktemp("airline") / "bench"
    materialize(out, seed=3, per_family=9)
    return load_benchmark(out)


def correct_args(req: dict) -> tuple[str, dict]:
    """What a careful agent passes for a request (the rubric's own values)."""
    kind, rid = req["kind"], req["reservation_id"]
    args = {"reservation_id": rid}
    if kind == "cancel":
        return "cancel_reservation", {**args, "refund_to": req["refund_to"]}
    if kind == "change":
        return "change_flight", {**args, "new_flight_no": req["new_flight_no"], "fee": req["fee"]}
    if kind == "bags":
        return "add_checked_bags", {**args, "bags": req["bags"], "free_bags": req["free_bags"], "fee": req["fee"]}
    if kind == "compensation":
        return "issue_compensation", {**args, "amount": req["amount"], "form": req["form"]}
    if kind == "upgrade":
        return "upgrade_cabin", {**args, "cabin": "business", "payment_method_id": req["payment_method_id"]}
    return "update_passenger_name", {
        **args,
        "first_name": req["first_name"].upper(),
        "last_name": req["last_name"].upper(),
    }


def _call(env: AirlineEnv, name: str, args: dict, n: list = [0]):  # noqa: B006 - a call-id counter
    n[0] += 1
    return env.call(ToolCall(id=f"c{n[0]}", name=name, args=args))


def _line(tool: str, args: dict, ok: bool = True, granted: bool | None = None) -> Turn:
    """A tool line as the chat harness records it (what the rubric's confirmation check reads)."""
    return Turn(role="tool", text="", tool=tool, write=tool in WRITE_TOOLS, ok=ok, args=args, granted=granted)


def _asked(env: AirlineEnv, tool: str, args: dict) -> Turn:
    """The agent's `confirm` of a write, answered by the member, as a transcript line."""
    target = {k: args[k] for k in TARGETS[tool]}
    granted = env.confirm(tool, target, "ok")
    return _line(CONFIRM_TOOL, {"tool": tool, "args": target, "summary": "ok"}, granted=granted)


# -- materialization -------------------------------------------------------------------------------------------------


def test_materialize_contract_and_shape(small):
    assert small.world == "airline"
    assert small.meta["targets"] == TARGETS and set(TARGETS) == WRITE_TOOLS == small.write_tools
    assert set(small.meta["families"]) == set(FAMILIES) and len(FAMILIES) >= 6
    assert len(small.tasks) == 9 * len(FAMILIES)
    assert all(small.ids(s) for s in ("train", "dev", "test"))
    assert max(len(t.requests) for t in small.tasks.values()) == 5  # horizons up to 5 requests
    assert sum(FAMILIES.values()) >= 200  # the default size
    assert any(not t.possible for t in small.tasks.values())


def test_materialize_is_deterministic(tmp_path):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    materialize(a, seed=1, per_family=4)
    materialize(b, seed=1, per_family=4)
    materialize(c, seed=2, per_family=4)
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    assert all((a / n).read_bytes() == (b / n).read_bytes() for n in names)
    assert (a / "db.json").read_bytes() != (c / "db.json").read_bytes()


# -- facts and their reading -----------------------------------------------------------------------------------------


def test_facts_kinds():
    assert len(F.FACTS) >= 12
    assert len(F.UNSTATED) >= 3
    assert sum(len(v) >= 2 for v in F.BY_TOOL.values()) >= 3  # interacting rules on one write
    numeric = [f for f in F.FACTS if isinstance(f.value, (int, tuple, Fraction, Surcharge))]
    assert {"change_fee", "change_window", "comp_rate", "comp_gold"} <= {f.id for f in numeric}
    for f in F.FACTS:  # each statement names its tool and reads to its value, and to no other fact's
        assert f"`{f.tool}`" in f.statement and f.value is not None
        assert F.facts_read(f.statement) == {f.id: f.value}


def test_formulas():
    fees, window = F.BY_ID["change_fee"].value, F.BY_ID["change_window"].value
    assert F.change_fee("economy", 10, fees, window) == 75
    assert F.change_fee("economy", 7, fees, window) == 150  # inside the window: doubled
    assert F.change_fee("flex", 3, fees, window) == 50
    assert F.change_fee("business", 3, fees, window) == 0
    allowance, bonus = F.BY_ID["bag_allowance"].value, F.BY_ID["bag_business"].value
    assert F.free_bags("gold", "business", 2, allowance, bonus) == 6
    assert F.free_bags("regular", "economy", 2, allowance, bonus) == 0
    assert F.bag_total(5, 2, F.BY_ID["bag_fee"].value) == 105
    rate, gold = F.BY_ID["comp_rate"].value, F.BY_ID["comp_gold"].value
    assert F.compensation(179, "silver", rate, gold) == 0  # below the first band
    assert F.compensation(359, "silver", rate, gold) == 100
    assert F.compensation(360, "gold", rate, gold) == 500  # the 6-hour band, doubled for gold


def test_policy_states_only_the_stated_facts():
    policy = policy_text()
    read = F.facts_read(policy)
    assert read == {f.id: f.value for f in F.STATED}
    for f in F.UNSTATED:
        assert f.id not in read and f.rule not in policy


@pytest.mark.parametrize(
    "fact,text,value",
    [
        ("refund_original", "- `cancel_reservation`: refund to the original payment method.", "original"),
        ("refund_original", "- `cancel_reservation`: never refund to the original payment method.", "account"),
        ("refund_original", "- `cancel_reservation` refunds to the account's first method.", "account"),
        ("basic_credit", "- `cancel_reservation` of a basic fare refunds as travel credit.", "travel_credit"),
        ("basic_credit", "- `cancel_reservation` of a basic fare does not refund as travel credit.", "same"),
        ("change_fee", "- `change_flight`: $90 for economy and flex fares.", (("economy", 90), ("flex", 90))),
        ("change_fee", "- `change_flight` charges no fee for business fares.", (("business", 0),)),
        (
            "change_window",
            "- `change_flight` within 3 days of departure charges twice the fee.",
            Surcharge(when=Window(op="<=", value=3), factor=2),
        ),
        (
            "change_window",
            "- `change_flight` more than 10 days before departure takes 3/2 times the fee.",
            Surcharge(when=Window(op=">", value=10), factor=Fraction(3, 2)),
        ),
        (
            "change_window",
            "- `change_flight` 12 days or more before departure takes 1.5 times the fee.",
            Surcharge(when=Window(op=">=", value=12), factor=Fraction(3, 2)),
        ),
        ("change_window", "- `change_flight` within 7 days of departure does not double the fee.", NO_SURCHARGE),
        ("bag_allowance", "- `add_checked_bags`: gold members get 3, silver members 1.", (("gold", 3), ("silver", 1))),
        (
            "bag_allowance",
            "- `add_checked_bags`: no tier has free bags, regular members 2.",
            (("gold", 0), ("regular", 0), ("silver", 0)),
        ),
        ("bag_fee", "- `add_checked_bags` charges $40 for each extra bag.", 40),
        ("bag_fee", "- `add_checked_bags`: never $40 per bag.", 0),
        ("bag_business", "- `add_checked_bags` on business gives 2 extra free bags.", 2),
        ("bag_business", "- `add_checked_bags` on business gives no extra free bags.", 0),
        ("comp_rate", "- `issue_compensation` pays $20 after 2 hours, $90 after 5 hours.", ((2, 20), (5, 90))),
        ("comp_rate", "- `issue_compensation` never pays $20 for 2 hours of delay.", ()),
        ("comp_gold", "- `issue_compensation`: gold members get 3 times the amount.", 3),
        ("comp_gold", "- `issue_compensation`: gold members are not paid double.", 1),
        ("comp_form", "- `issue_compensation` is paid in cash.", "cash"),
        ("comp_form", "- `issue_compensation` is never paid as a certificate.", "cash"),
        ("upgrade_payment", "- `upgrade_cabin` is paid with a credit card.", "credit_card"),
        ("upgrade_payment", "- `upgrade_cabin` does not need a credit card.", "any"),
        ("name_upper", "- `update_passenger_name` takes names in capital letters.", "upper"),
        ("name_upper", "- `update_passenger_name`: do not use upper case.", "as_given"),
        # scope: a text that does not name the write tool in backticks is silent
        ("comp_rate", "- issue_compensation pays $20 after 2 hours.", None),
        ("refund_original", "- `change_flight`: refund to the original payment method.", None),
    ],
)
def test_fact_reading(fact, text, value):
    assert F.BY_ID[fact].read(text) == value


# -- tools, receipts, the member, the rubric --------------------------------------------------------------------------


def _task(bench, pred):
    return next(t for t in sorted(bench.tasks.values(), key=lambda t: t.id) if pred(t))


def test_unstated_rule_is_only_in_its_refusal_receipt(small):
    policy = small.policy
    t = _task(
        small, lambda t: t.family == "compensation" and t.possible and small.db["users"][t.user_id]["tier"] == "gold"
    )
    env = AirlineEnv(small, t)
    req = t.requests[0]
    plain = req["amount"] // 2  # the policy's rate without the unstated gold multiplier
    r = _call(
        env, "issue_compensation", {"reservation_id": req["reservation_id"], "amount": plain, "form": "certificate"}
    )
    assert not r.ok and r.code == "policy"
    fact = F.BY_ID["comp_gold"]
    assert not fact.stated and r.content["rule_id"] == "comp_gold" and r.content["rule"] == fact.rule
    assert fact.rule not in policy and fact.read(policy) is None
    assert fact.read(r.content["rule"]) == fact.value  # learnable from the receipt
    assert "blocking" not in r.content


def test_interacting_rules_on_one_write_name_the_broken_one(small):
    t = _task(
        small,
        lambda t: t.family == "bags"
        and t.possible
        and small.db["reservations"][t.requests[0]["reservation_id"]]["fare"] == "business",
    )
    req = t.requests[0]
    env = AirlineEnv(small, t)
    res = small.db["reservations"][req["reservation_id"]]
    tier_only = F.free_bags(
        small.db["users"][t.user_id]["tier"], "business", len(res["passengers"]), F.BY_ID["bag_allowance"].value, 0
    )
    base = {"reservation_id": req["reservation_id"], "bags": req["bags"]}
    r1 = _call(env, "add_checked_bags", {**base, "free_bags": tier_only, "fee": req["fee"]})
    r2 = _call(env, "add_checked_bags", {**base, "free_bags": req["free_bags"], "fee": req["fee"] + 35})
    assert (r1.content["rule_id"], r2.content["rule_id"]) == ("bag_business", "bag_fee")


def test_member_confirms_only_what_was_requested(small):
    t = _task(small, lambda t: t.family == "multi")
    env = AirlineEnv(small, t)
    req = t.requests[0]
    tool, args = correct_args(req)
    assert env.confirm(tool, {"reservation_id": req["reservation_id"]}, "as asked")
    other_tool = next(
        w
        for w in sorted(WRITE_TOOLS)
        if not any(correct_args(r)[0] == w and r["reservation_id"] == req["reservation_id"] for r in t.requests)
    )
    assert not env.confirm(other_tool, {"reservation_id": req["reservation_id"]}, "not asked")
    assert not env.confirm(tool, {"reservation_id": "ZZZZZZ"}, "another reservation")
    assert env.user_reply("I could not find an account with that email.") != env.user_reply("Anything else?")


def test_oracle_scores_one_and_the_rubric_weighs(small):
    for t in sorted(small.tasks.values(), key=lambda t: t.id):
        if not t.possible:
            continue
        env = AirlineEnv(small, t)
        transcript = []
        for req in t.requests:
            tool, args = correct_args(req)
            transcript.append(_asked(env, tool, args))
            assert transcript[-1].granted
            r = _call(env, tool, args)
            assert r.ok, (t.id, r.content)
            transcript.append(_line(tool, args))
        s = env.score(transcript)
        assert s.success and s.reward == 1.0, t.id
    # partial work: the first request done without confirmation, the rest untouched
    t = _task(small, lambda t: t.family == "multi" and len(t.requests) >= 3)
    env = AirlineEnv(small, t)
    tool, args = correct_args(t.requests[0])
    assert _call(env, tool, args).ok
    s = env.score([_line(tool, args)])
    weights = {c.id: c.weight for c in t.rubric}
    want = (weights["req1"] + weights["no_extra_writes"]) / sum(weights.values())
    assert not s.success and s.criteria["confirmed"] == 0.0 and s.reward == pytest.approx(want, abs=1e-6)
    assert len({c.weight for c in t.rubric}) > 1  # the rubric is weighted, not a count


def test_a_confirmation_covers_one_write_of_the_confirmed_action(small):
    t = _task(small, lambda t: t.family == "multi")
    env = AirlineEnv(small, t)
    a, b = t.requests[0], t.requests[1]
    asked = _asked(env, *correct_args(a))
    assert asked.granted and _call(env, *correct_args(b)).ok  # confirmed a, wrote b
    assert env.score([asked, _line(*correct_args(b))]).criteria["confirmed"] == 0.0


def test_external_tasks_are_impossible(small):
    external = [t for t in small.tasks.values() if not t.possible]
    assert {t.family for t in external} == set(FAMILIES) - {"multi"}
    for t in external:
        env = AirlineEnv(small, t)
        email = t.first_message.split("(email ")[1].split(")")[0]
        r = _call(env, "find_user_id_by_email", {"email": email})
        if not r.ok:  # the member's only email matches no account
            assert r.content.get("blocking") is True
            continue
        tool, args = correct_args(t.requests[0])
        for attempt in (args, {**args, **{k: v for k, v in args.items() if k == "reservation_id"}}):
            r = _call(env, tool, attempt)
            assert not r.ok and r.content.get("blocking") is True and "rule_id" not in r.content, (t.id, r.content)
        assert not env.score([]).success


# -- packages ----------------------------------------------------------------------------------------------------------


def test_packages_load_and_reference_states_every_fact():
    from components.memory import load_package

    pkgs = {n: load_package(PACKAGES / n) for n in ("none", "seed", "all-skills", "reference")}
    ref = pkgs["reference"]
    read: dict = {}
    for card in ref.cards.values():
        got = F.facts_read(card.body)
        assert set(got) == {f.id for f in F.BY_TOOL[card.meta.trigger.tool]}  # one card per write, all its rules
        read.update(got)
    assert read == {f.id: f.value for f in F.FACTS}
    assert {c.id for c in pkgs["all-skills"].cards.values()} == set(ref.cards)
    assert not pkgs["seed"].cards and not pkgs["none"].cards
    assert ref.wm.bind_on == ["reservation_id"]


# -- validation's leak guard: a rule's constant is not task data --------------------------------------------------


def test_leak_guard_passes_a_rules_constant_and_still_blocks_dev_and_test_values(tmp_path):
    """'travel_credit' (basic_credit, a rule the policy never states) is the constant the train gold gives every
    basic-fare cancellation: the card stating it is knowledge, not a leak. A value only dev or test items carry, an
    id, an account's data, and a word of the world's own data the train gold repeats stay blocked."""
    import shutil

    from components.evolution.validate import leak_tokens, leakage, rule_constants
    from components.memory import load_package
    from components.worlds.base import train_gold

    materialize(tmp_path / "bench", seed=0)  # the default size: basic fares among train's cancellations
    small = load_benchmark(tmp_path / "bench")
    gold = train_gold(small)
    basic = {
        g.task_id
        for g in gold.values()
        for a in g.actions
        if a.tool == "cancel_reservation" and a.args["refund_to"] == "travel_credit"
    }
    assert len(basic) >= 3  # the train gold shows it in several items
    assert "travel_credit" not in small.policy and "travel_credit" in rule_constants(small)
    assert "travel_credit" not in leak_tokens(small)
    pkg = tmp_path / "pkg"
    shutil.copytree(PACKAGES / "reference", pkg)
    assert "'travel_credit'" in (pkg / "em" / "procedure" / "cancel-refund.md").read_text()
    assert not [f for f in leakage(load_package(pkg), small) if "cancel-refund" in f]
    for card in (pkg / "em").rglob("*.md"):  # the rest of the reference (its name card's example is a task's name)
        if card.name != "cancel-refund.md":
            card.unlink()
    assert leakage(load_package(pkg), small) == []
    # still blocked: a dev item's reservation id, a test item's task id, a train account's email
    dev_rid = next(r["reservation_id"] for i in small.ids("dev") for r in small.tasks[i].requests)
    test_id = small.ids("test")[0]
    train_user = small.tasks[small.ids("train")[0]].user_id
    for value in (dev_rid, test_id, train_user):
        assert value in leak_tokens(small), value
        (pkg / "em" / "procedure" / "leaky.md").write_text(
            f"---\nid: leaky\ntype: procedure\ntrigger:\n  event: intent_recorded\n  tool: cancel_reservation\nsource: tests\n---\nRemember {value} for `cancel_reservation`.\n"
        )
        found = leakage(load_package(pkg), small)
        assert len(found) == 1 and "leaky.md: contains task data" in found[0], (value, found)
    # a digit-free word only dev or test rubrics carry is never a rule constant (their gold is not read)
    train_values = {str(v) for g in gold.values() for a in g.actions for v in a.args.values()}
    held_out = {
        str(v)
        for i in small.ids("dev") + small.ids("test")
        for c in small.tasks[i].rubric
        for v in c.args.values()
        if isinstance(v, str)
    } - train_values
    assert held_out and not held_out & rule_constants(small)
