"""A changed world (bench_memory's scenario b): a benchmark whose data changes one rule's value (`benchmark.facts`),
read by the world's policy text, tools and rubric, so the rule a card learned on the old world becomes wrong."""

from __future__ import annotations

import json

import pytest

from components.errors import InputError
from components.params import BenchmarkParams
from components.runtime.types import ToolCall
from components.worlds import load_benchmark, world
from components.worlds.retail import facts as F

FEE = F.BY_ID["cancel_fee"].statement.replace("5% cancellation fee", "10% cancellation fee")
RESTOCK = F.BY_ID["restocking_fee"].statement.replace("10% restocking fee", "20% restocking fee")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """The same seed and size, as built (the world's own rules) and changed in two rules (one unstated, one stated)."""
    root = tmp_path_factory.mktemp("changed")
    own = BenchmarkParams(seed=0, out=str(root / "own"), per_family=6, receipts="explained").materialize()
    changed = BenchmarkParams(seed=0, out=str(root / "changed"), per_family=6, receipts="explained",
                              facts={"cancel_fee": FEE, "restocking_fee": RESTOCK}).materialize()
    return load_benchmark(own), load_benchmark(changed)


def _cancels(b):
    return {t.id: t for t in b.tasks.values() if t.family == "cancel" and t.possible}


def test_the_changed_rule_is_data_and_changes_the_digest(pair):
    own, changed = pair
    assert "facts" not in own.meta  # the world's own rules: meta.json as it always was
    assert changed.meta["facts"] == {"cancel_fee": FEE, "restocking_fee": RESTOCK}
    assert changed.digest != own.digest
    # the stated rule is what the written policy says; the unstated one stays unwritten
    assert RESTOCK in changed.policy and F.BY_ID["restocking_fee"].statement not in changed.policy
    assert "cancellation fee" not in changed.policy and changed.db == own.db
    # the rubric holds the amounts the changed value gives: the fee is doubled where it is due, equal elsewhere
    due = 0
    for tid, t in _cancels(changed).items():
        req, was = t.requests[0], _cancels(own)[tid].requests[0]
        order = changed.db["orders"][req["order_id"]]
        assert req["refund_amount"] == F.cancel_refund(order, F.Fee(24, 10.0))
        due += req["refund_amount"] != was["refund_amount"]
    assert due >= 1


def test_the_changed_worlds_tools_refuse_the_old_value_quoting_the_new_rule(pair):
    own, changed = pair
    tid, t = next((tid, t) for tid, t in _cancels(changed).items()
                  if t.requests[0]["refund_amount"] != _cancels(own)[tid].requests[0]["refund_amount"])
    req = t.requests[0]
    old_amount = _cancels(own)[tid].requests[0]["refund_amount"]
    args = {"order_id": req["order_id"], "reason": req["reason"]}
    env = world("retail").make_env(changed, t)
    r = env.call(ToolCall(id="c1", name="cancel_pending_order", args={**args, "refund_amount": old_amount}))
    assert not r.ok and r.rule_id == "cancel_fee" and "10% cancellation fee" in r.rule
    assert env.call(ToolCall(id="c2", name="cancel_pending_order", args={**args, "refund_amount": req["refund_amount"]})).ok
    # the world's own benchmark takes the old amount
    env = world("retail").make_env(own, own.tasks[tid])
    assert env.call(ToolCall(id="c3", name="cancel_pending_order", args={**args, "refund_amount": old_amount})).ok


@pytest.mark.parametrize("facts,match", [({"no_such_rule": "x"}, "no_such_rule: no such rule"),
                                         ({"cancel_fee": "Be kind to customers."}, "cancel_fee: .*does not state")])
def test_a_change_that_is_not_a_rule_of_the_world_is_one_clear_error(tmp_path, facts, match):
    with pytest.raises(InputError, match=match):
        BenchmarkParams(seed=0, out=str(tmp_path / "b"), per_family=3, facts=facts).materialize()
    assert not (tmp_path / "b").exists()  # nothing half-written


def test_a_changed_benchmark_on_disk_with_a_bad_rule_is_refused_at_load(pair, tmp_path):
    import shutil

    _, changed = pair
    bad = tmp_path / "bad"
    shutil.copytree(changed.root, bad)
    meta = json.loads((bad / "meta.json").read_text())
    meta["facts"] = {"cancel_fee": "nothing about fees"}
    (bad / "meta.json").write_text(json.dumps(meta))
    b = load_benchmark(bad)
    with pytest.raises(InputError, match="meta.json: facts.cancel_fee"):
        world("retail").make_env(b, next(iter(b.tasks.values())))
