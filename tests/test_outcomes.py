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
    bench = load_benchmark(
        world("retail").materialize(tmp_path_factory.mktemp("s") / "b", 0, 9, receipts=ReceiptMode.silent)
    )
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
    assert sum(f.kind == "no_divergence" for f in seeing.findings) < sum(
        f.kind == "no_divergence" for f in blind.findings
    )
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
    from components.evolution.diagnose import evidence_from_train

    bench, pkg, train, dev = silent
    ev = evidence_from_train(train.traces, train.scores, pkg, bench.write_tools, train_gold(bench), bench.targets)
    assert ev.unexplained > 0 and ev.unexplained_are_values
    assert ev.wrong_rate and all(0.0 <= r <= 1.0 for r in ev.wrong_rate.values())
    blind = diagnose(dev.traces, dev.scores, pkg, bench.write_tools, "d", bench.targets)
    told = diagnose(dev.traces, dev.scores, pkg, bench.write_tools, "d", bench.targets, train=ev)
    was = {f.episode_id: f for f in blind.findings}
    changed = [f for f in told.findings if f.kind != was[f.episode_id].kind]
    assert changed and all(
        was[f.episode_id].kind == "no_divergence" and f.kind == "unseen_value" and f.owner == "E" for f in changed
    )
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
        "e#0", "e", [step(delivered)], pkg, frozenset({tool}), base.model_copy(update={"value_helps": {tool: helps}})
    )
    assert (got(True, []).owner, got(True, []).kind) == ("rho", "card_not_fired")
    assert (got(True, ["c"]).owner, got(True, ["c"]).kind) == ("E", "unseen_value")
    assert (got(False, ["c"]).owner, got(False, ["c"]).kind) == ("E", "ineffective_card")
    assert got(None, ["c"]).owner == "unknown"
    assert unseen_value_finding("e#0", "e", [], pkg, frozenset({tool}), base) is None  # nothing written


# -- a world whose refusals say the request is impossible, and whose gold never confirms (tau2-bench's) -------------

WRITE, TARGETS = "pay_order", {"pay_order": ["order_id"]}


def _step(i, action, observation, eid="t-1#0"):
    from components.runtime.trace import TraceStep

    return TraceStep(
        episode_id=eid,
        step=i,
        incoming={},
        state_before=[],
        delivered=[],
        deliveries=[],
        proposal={},
        action=action,
        checks=[],
        observation=observation,
        state_after=[],
        fingerprint=[],
    ).sealed()


def _write(i, method, ok=True, blocking=False, error=""):
    obs = {
        "role": "tool",
        "ok": ok,
        **({"blocking": True} if blocking else {}),
        **({} if ok else {"code": "refused", "content": {"error": error}}),
    }
    return _step(i, {"kind": "tool", "tool": WRITE, "args": {"order_id": "#1", "method": method}}, obs)


def test_lists_of_records_are_the_same_value_whatever_their_keys_order():
    assert same_value([{"date": "d", "flight": "F1"}], [{"flight": "F1", "date": "d"}])
    assert not same_value([{"date": "d", "flight": "F1"}], [{"flight": "F2", "date": "d"}])


def test_a_refused_write_whose_argument_differs_from_the_gold_is_the_agents_wrong_argument():
    """A write the world refused as impossible (`blocking`) for an argument the gold write does not have is a
    wrong_arg diff at that write, carrying the refusal's words, and not also a missing write; a refusal of the gold's
    own arguments is not the agent's (a missing write); a refusal the agent fixed later says nothing."""
    gold = Gold(task_id="t-1", actions=[GoldAction(tool=WRITE, args={"order_id": "#1", "method": "card_1"})])
    wrong = [_write(0, "cert_9", ok=False, blocking=True, error="Certificate cannot be used")]
    (d,) = outcome_diffs(wrong, gold, frozenset({WRITE}), TARGETS)
    assert (d.kind, d.field, d.agent, d.gold, d.refused, d.step) == (
        "wrong_arg",
        "method",
        "cert_9",
        "card_1",
        "Certificate cannot be used",
        0,
    )
    own = [_write(0, "card_1", ok=False, blocking=True, error="not possible")]
    assert [x.kind for x in outcome_diffs(own, gold, frozenset({WRITE}), TARGETS)] == ["missing_write"]
    fixed = [*wrong, _write(1, "card_1")]
    assert outcome_diffs(fixed, gold, frozenset({WRITE}), TARGETS) == []
    rule = [_write(0, "cert_9", ok=False, error="a rule")]  # not blocking: a refusal of another kind, as before
    assert [x.kind for x in outcome_diffs(rule, gold, frozenset({WRITE}), TARGETS)] == ["missing_write"]


def test_where_the_gold_never_confirms_no_failure_is_a_missing_confirmation_and_refusals_read_as_wrong_values():
    """With `confirmation` false (a benchmark whose gold never confirms: tau2-bench), an unconfirmed write is no
    divergence, so a wrong argument the gold shows is the finding (E wrong_value); a blocking refusal of the agent's
    own wrong argument is that wrong argument, not an external failure; one of the gold's own arguments stays
    external."""
    import pandas as pd

    from components.runtime.trace import steps_frame

    pkg = load_package(world("retail").packages["none"])
    gold = {"t-1": Gold(task_id="t-1", actions=[GoldAction(tool=WRITE, args={"order_id": "#1", "method": "card_1"})])}
    scores = pd.DataFrame({"item_id": ["t-1"], "seed": [0], "success": [False], "error": [""]})

    def diagnosed(steps, confirmation):
        done = _step(len(steps), {"kind": "finish", "tool": "finish", "args": {}}, {"role": "tool", "ok": True})
        traces = steps_frame([*steps, done], item_id="t-1", seed=0)
        return diagnose(
            traces, scores, pkg, frozenset({WRITE}), "c", TARGETS, gold=gold, confirmation=confirmation
        ).findings[0]

    silent = [_write(0, "gift_2")]
    assert (diagnosed(silent, True).owner, diagnosed(silent, True).kind) == ("C", "unconfirmed_write")
    f = diagnosed(silent, False)
    assert (f.owner, f.kind, f.tool, f.extra["diffs"]) == (
        "E",
        "wrong_value",
        WRITE,
        [{"field": "method", "agent": "gift_2", "gold": "card_1"}],
    )
    refused = [_write(0, "cert_9", ok=False, blocking=True, error="Certificate cannot be used")]
    f = diagnosed(refused, False)
    assert (f.owner, f.kind) == ("E", "wrong_value") and f.extra["refused"] == "Certificate cannot be used"
    assert "(refused: Certificate cannot be used)" in f.detail
    f = diagnosed([_write(0, "card_1", ok=False, blocking=True, error="closed")], False)
    assert (f.owner, f.kind) == ("none", "blocking_error")


def test_an_episode_the_user_ended_was_not_cut_off_by_the_turn_budget():
    from components.evolution.diagnose import TurnBudget

    def talk(eid, n, ended):
        steps = [
            _step(i, {"kind": "message", "content": "more?"}, {"role": "user", "text": "yes"}, eid)
            for i in range(n - 1)
        ]
        return steps + [
            _step(
                n - 1, {"kind": "message", "content": "more?"}, {"role": "user", "text": None if ended else "yes"}, eid
            )
        ]

    ended = [talk(f"e{i}#0", 5, True) for i in range(4)]
    assert not TurnBudget.of(ended, {}, frozenset({WRITE}), TARGETS).binding
    assert TurnBudget.of([talk(f"c{i}#0", 5, False) for i in range(4)], {}, frozenset({WRITE}), TARGETS).binding
