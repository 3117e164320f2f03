"""Evidence from outcomes (components/evolution/outcomes.py): a failed train episode against its gold, and the
diagnoser's use of it in a silent world, where no receipt names a broken rule."""

from __future__ import annotations

import pytest

from components.evidence.packets import verify_citations
from components.evolution.diagnose import diagnose
from components.evolution.outcomes import outcome_diffs, same_value
from components.memory.package import load_package
from components.runtime.evaluate import run_shard
from components.runtime.trace import frame_steps
from components.worlds import load_benchmark, world
from components.worlds.base import Gold, GoldAction, ReceiptMode, train_gold


@pytest.fixture(scope="module")
def silent(tmp_path_factory):
    bench = load_benchmark(world("retail").materialize(tmp_path_factory.mktemp("s") / "b", 0, 9,
                                                       receipts=ReceiptMode.silent))
    pkg = load_package(world("retail").packages["seed"])
    train = run_shard(pkg, bench, bench.ids("train"), [0, 1])
    dev = run_shard(pkg, bench, bench.ids("dev"), [0])
    return bench, pkg, train, dev


def _episodes(traces):
    return {eid: frame_steps(df.sort_values("step")) for eid, df in traces.groupby("episode_id")}


def test_same_value():
    assert same_value(10.001, 10.0) and not same_value(10.01, 10.0)
    assert same_value(["b", "a"], ["a", "b"]) and not same_value("1", 1) and not same_value(True, 1)


def test_diffs_name_field_agent_and_gold(silent):
    bench, _pkg, train, _dev = silent
    gold = train_gold(bench)
    kinds, wrong = set(), []
    for eid, steps in _episodes(train.traces).items():
        for d in outcome_diffs(steps, gold[eid.split("#")[0]], bench.write_tools, bench.targets):
            kinds.add(d.kind)
            if d.kind == "wrong_arg":
                wrong.append(d)
                s = next(x for x in steps if x.step == d.step)
                assert s.action["tool"] == d.tool and s.action["args"][d.field] == d.agent  # the agent's write
                assert not same_value(d.agent, d.gold)
    assert "wrong_arg" in kinds and "missing_write" in kinds
    assert {d.field for d in wrong} >= {"refund_amount", "reason"}
    # a made-up gold write the agent never made is missing; its own writes are then extra
    steps = next(iter(_episodes(train.traces).values()))
    fake = Gold(task_id="x", actions=[GoldAction(tool="issue_store_credit", args={"order_id": "#nope", "amount": 1})])
    got = outcome_diffs(steps, fake, bench.write_tools, bench.targets)
    assert got[-1].kind == "missing_write" and all(d.kind in ("extra_write", "missing_write") for d in got)


def test_silent_diagnosis_needs_outcomes(silent):
    """Without gold a silent world's wrong values leave no trace finding; with the train gold they are E findings
    (no card about the write) whose packets cite resolvable steps."""
    bench, pkg, train, _dev = silent
    blind = diagnose(train.traces, train.scores, pkg, bench.write_tools, "t", bench.targets)
    seeing = diagnose(train.traces, train.scores, pkg, bench.write_tools, "t", bench.targets, gold=train_gold(bench))
    assert not any(f.kind == "wrong_value" for f in blind.findings)
    assert sum(f.kind == "no_divergence" for f in seeing.findings) < sum(f.kind == "no_divergence" for f in blind.findings)
    values = [f for f in seeing.findings if f.kind == "wrong_value"]
    assert values and all(f.owner == "E" and f.extra["diffs"] for f in values)
    for p in seeing.packets:
        assert not verify_citations(p, train.traces)


def test_dev_episodes_get_no_outcome_evidence(silent):
    """Gold exists for train items only: diagnosing dev episodes with it changes nothing."""
    bench, pkg, _train, dev = silent
    gold = train_gold(bench)
    assert not set(gold) & set(bench.ids("dev"))
    a = diagnose(dev.traces, dev.scores, pkg, bench.write_tools, "d", bench.targets)
    b = diagnose(dev.traces, dev.scores, pkg, bench.write_tools, "d", bench.targets, gold=gold)
    assert [(f.owner, f.kind, f.step) for f in a.findings] == [(f.owner, f.kind, f.step) for f in b.findings]


def test_train_evidence_lets_dev_name_silent_failures_the_trace_cannot_explain(silent):
    """Dev has no gold. Train's failures with no trace divergence mostly held a wrong argument (the silent world let
    the broken rule's write through), so dev's such failures are read as a wrong argument on a write the episode
    made: E, the seed having no card. Without the train evidence they stay unexplained (`none`)."""
    from components.evolution.outcomes import evidence_from_train

    bench, pkg, train, dev = silent
    ev = evidence_from_train(train.traces, train.scores, pkg, bench.write_tools, train_gold(bench), bench.targets)
    assert ev.unexplained > 0 and ev.unexplained_are_values
    assert ev.wrong_rate and all(0.0 <= r <= 1.0 for r in ev.wrong_rate.values())
    blind = diagnose(dev.traces, dev.scores, pkg, bench.write_tools, "d", bench.targets)
    told = diagnose(dev.traces, dev.scores, pkg, bench.write_tools, "d", bench.targets, train=ev)
    was = {f.episode_id: f for f in blind.findings}
    changed = [f for f in told.findings if f.kind != was[f.episode_id].kind]
    assert changed and all(was[f.episode_id].kind == "no_divergence" and f.kind == "unseen_value" and f.owner == "E"
                           for f in changed)
    episodes = _episodes(dev.traces)
    for f in changed:  # the write named is one the episode made, of the tool train got wrong most often among them
        tools = {s.action["tool"] for s in episodes[f.episode_id] if s.action.get("tool") in bench.write_tools}
        assert f.tool in tools and ev.wrong_rate.get(f.tool, 0) == max(ev.wrong_rate.get(t, 0) for t in tools)
    # train evidence that such failures were not wrong values leaves them unexplained
    no = ev.model_copy(update={"unexplained_wrong": 0})
    assert not no.unexplained_are_values
    kept = diagnose(dev.traces, dev.scores, pkg, bench.write_tools, "d", bench.targets, train=no)
    assert [(f.owner, f.kind) for f in kept.findings] == [(f.owner, f.kind) for f in blind.findings]


def test_unseen_value_owner_follows_the_cards_as_a_wrong_argument_would():
    """A card about the write that train says helps, not delivered at it: routing (rho, card_not_fired); delivered
    alone: E; one that does not help: E (ineffective_card); no evidence either way: unknown."""
    from components.evolution.outcomes import TrainEvidence, unseen_value_finding
    from tests.test_diagnose_mutants import CANCEL as tool, call, pkg as stand_in, st

    pkg = stand_in(c=f"`{tool}` needs a reason.")

    def step(delivered):
        return st(0, *call(tool, "#1"), delivered=delivered, eid="e#0")

    base = TrainEvidence(wrong_rate={tool: 0.5}, unexplained=4, unexplained_wrong=3)
    got = lambda helps, delivered: unseen_value_finding(  # noqa: E731
        "e#0", "e", [step(delivered)], pkg, frozenset({tool}), base.model_copy(update={"value_helps": {tool: helps}}))
    assert (got(True, []).owner, got(True, []).kind) == ("rho", "card_not_fired")
    assert (got(True, ["c"]).owner, got(True, ["c"]).kind) == ("E", "unseen_value")
    assert (got(False, ["c"]).owner, got(False, ["c"]).kind) == ("E", "ineffective_card")
    assert got(None, ["c"]).owner == "unknown"
    assert unseen_value_finding("e#0", "e", [], pkg, frozenset({tool}), base) is None  # nothing written
