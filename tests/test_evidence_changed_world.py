"""A changed world (bench_memory's scenario b): a benchmark whose rules data changes a rule's value
(`benchmark.rules`), read by the world's policy text, tools and rubric, so the rule a card learned on the old world
becomes wrong."""

from __future__ import annotations

import json

import pytest

from components.errors import InputError
from components.params import BenchmarkParams
from components.runtime.types import ToolCall
from components.worlds import load_benchmark, world
from components.worlds.retail import facts as F
from components.worlds.retail.rules import rules_of
from components.worlds.rules import Fee, Window

CHANGES = {
    "cancel_fee": {"amount": 10, "when": {"op": ">", "value": 24}},
    "restocking_fee": {"amount": 20, "when": {"op": ">", "value": 30}},
}
RESTOCK = F.facts_of(rules_of(CHANGES))["restocking_fee"].statement


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """The same seed and size, as built (the world's own rules) and changed in two rules (one unstated, one stated)."""
    root = tmp_path_factory.mktemp("changed")
    own = BenchmarkParams(seed=0, out=str(root / "own"), per_family=6, receipts="explained").materialize()
    changed = BenchmarkParams(
        seed=0, out=str(root / "changed"), per_family=6, receipts="explained", rules=CHANGES
    ).materialize()
    return load_benchmark(own), load_benchmark(changed)


def _cancels(b):
    return {t.id: t for t in b.tasks.values() if t.family == "cancel" and t.possible}


def test_the_changed_rule_is_data_and_changes_the_digest(pair):
    own, changed = pair
    assert own.meta["rules"] == rules_of().model_dump(mode="json")  # the whole record, in the digest
    assert changed.meta["rules"] == {**own.meta["rules"], **CHANGES}
    assert changed.digest != own.digest
    assert not (own.root / "packages").exists() and (changed.root / "packages" / "reference").is_dir()
    # the stated rule is what the written policy says; the unstated one stays unwritten
    assert RESTOCK in changed.policy and F.BY_ID["restocking_fee"].statement not in changed.policy
    assert "cancellation fee" not in changed.policy and changed.db == own.db
    # the rubric holds the amounts the changed value gives: the fee is doubled where it is due, equal elsewhere
    due = 0
    for tid, t in _cancels(changed).items():
        req, was = t.requests[0], _cancels(own)[tid].requests[0]
        order = changed.db["orders"][req["order_id"]]
        assert req["refund_amount"] == F.cancel_refund(order, Fee(amount=10, when=Window(op=">", value=24)))
        due += req["refund_amount"] != was["refund_amount"]
    assert due >= 1


def test_the_changed_worlds_tools_refuse_the_old_value_quoting_the_new_rule(pair):
    own, changed = pair
    tid, t = next(
        (tid, t)
        for tid, t in _cancels(changed).items()
        if t.requests[0]["refund_amount"] != _cancels(own)[tid].requests[0]["refund_amount"]
    )
    req = t.requests[0]
    old_amount = _cancels(own)[tid].requests[0]["refund_amount"]
    args = {"order_id": req["order_id"], "reason": req["reason"]}
    env = world("retail").make_env(changed, t)
    r = env.call(ToolCall(id="c1", name="cancel_pending_order", args={**args, "refund_amount": old_amount}))
    assert not r.ok and r.rule_id == "cancel_fee" and "10% cancellation fee" in r.rule
    assert env.call(
        ToolCall(id="c2", name="cancel_pending_order", args={**args, "refund_amount": req["refund_amount"]})
    ).ok
    # the world's own benchmark takes the old amount
    env = world("retail").make_env(own, own.tasks[tid])
    assert env.call(ToolCall(id="c3", name="cancel_pending_order", args={**args, "refund_amount": old_amount})).ok


@pytest.mark.parametrize(
    "rules,match",
    [
        ({"no_such_rule": 1}, "benchmark.rules: no_such_rule: no such rule"),
        ({"cancel_fee": {"amount": "lots"}}, "benchmark.rules: cancel_fee.amount: .*not a number"),
        ({"cancel_fee": {"amount": 5, "when": {"op": "after", "value": 3}}}, "benchmark.rules: cancel_fee.when.op: "),
        ({"cancel_reason": {"allowed": ["because"]}}, "benchmark.rules: cancel_reason.allowed: .*no reason a customer"),
    ],
)
def test_a_change_that_is_not_a_rule_of_the_world_is_one_clear_error(tmp_path, rules, match):
    with pytest.raises(InputError, match=match):
        BenchmarkParams(seed=0, out=str(tmp_path / "b"), per_family=3, rules=rules).materialize()
    assert not (tmp_path / "b").exists()  # nothing half-written


def test_a_rules_file_is_read_and_named_in_its_errors(tmp_path):
    f = tmp_path / "rules.yaml"
    f.write_text("world: retail\nreroute_fee: {amount: 7, when: {op: '<=', value: 31}}\n")
    b = load_benchmark(BenchmarkParams(seed=0, out=str(tmp_path / "b"), per_family=3, rules=str(f)).materialize())
    assert b.meta["rules"]["reroute_fee"] == {"amount": 7, "when": {"op": "<=", "value": 31}}
    f.write_text("reroute_fee: {amount: 7, when: {op: '<=', value: x}}\n")
    with pytest.raises(InputError, match=f"{f}: reroute_fee.when.value: "):
        BenchmarkParams(seed=0, out=str(tmp_path / "c"), per_family=3, rules=str(f)).materialize()
    with pytest.raises(InputError, match="airline world's rules|no such rule"):
        BenchmarkParams(
            world="airline", seed=0, out=str(tmp_path / "d"), per_family=3, rules={"reroute_fee": {"amount": 7}}
        ).materialize()


def test_a_changed_benchmark_on_disk_with_a_bad_rule_is_refused_at_load(pair, tmp_path):
    import shutil

    _, changed = pair
    bad = tmp_path / "bad"
    shutil.copytree(changed.root, bad)
    meta = json.loads((bad / "meta.json").read_text())
    meta["rules"]["cancel_fee"] = {"amount": "nothing about fees"}
    (bad / "meta.json").write_text(json.dumps(meta))
    b = load_benchmark(bad)
    with pytest.raises(InputError, match="meta.json: rules: cancel_fee.amount: "):
        world("retail").make_env(b, next(iter(b.tasks.values())))
