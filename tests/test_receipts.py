"""Receipt modes (explained | coded | silent) as a benchmark setting, the simulated agent's consistency with what a
receipt says, and the train-only gold a labelled benchmark carries."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from components.memory.package import digest
from components.runtime.evaluate import run_shard
from components.runtime.types import ToolCall
from components.worlds import BenchmarkError, load_benchmark, world
from components.worlds.base import GOLD_FILE, ReceiptMode, train_gold


@pytest.fixture(scope="module")
def benches(tmp_path_factory):
    """Both worlds in the three modes, small (the same seed: the same tasks, splits and database)."""
    root = tmp_path_factory.mktemp("modes")
    return {
        (w, m): load_benchmark(world(w).materialize(root / f"{w}-{m.value}", 0, 3, receipts=m))
        for w in ("retail", "airline")
        for m in ReceiptMode
    }


def _task_with(bench, tool):
    gold = train_gold(bench)
    for tid in bench.ids("train"):
        for a in gold[tid].actions:
            if a.tool == tool:
                return bench.tasks[tid], a
    raise AssertionError(f"no train task writes {tool}")


def test_mode_in_meta_and_digest(benches):
    for w in ("retail", "airline"):
        metas = {m: benches[(w, m)].meta for m in ReceiptMode}
        assert "receipts" not in metas[ReceiptMode.explained]  # explained benchmarks keep their bytes
        assert metas[ReceiptMode.coded]["receipts"] == "coded" and metas[ReceiptMode.silent]["receipts"] == "silent"
        assert len({digest(benches[(w, m)].root) for m in ReceiptMode}) == 3
        assert {benches[(w, m)].receipts for m in ReceiptMode} == set(ReceiptMode)
        tasks = {m: (benches[(w, m)].root / "tasks.jsonl").read_bytes() for m in ReceiptMode}
        assert len(set(tasks.values())) == 1  # only the receipts differ


def test_bad_mode_is_one_line(benches, tmp_path):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(benches[("retail", ReceiptMode.explained)].root, bad)
    meta = json.loads((bad / "meta.json").read_text())
    (bad / "meta.json").write_text(json.dumps({**meta, "receipts": "mute"}))
    with pytest.raises(BenchmarkError, match=r"meta.json: receipts: 'mute' is not a receipt mode"):
        load_benchmark(bad)
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "flows.cli",
            "bench",
            "materialize",
            "--out",
            str(tmp_path / "x"),
            "--receipts",
            "mute",
            "--per-family",
            "3",
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode != 0 and "Traceback" not in r.stderr and "receipts" in (r.stderr + r.stdout)


@pytest.mark.parametrize(
    "w,tool,field,bad",
    [
        ("retail", "cancel_pending_order", "refund_amount", 1.0),
        ("airline", "issue_compensation", "form", "cash"),
    ],
)
def test_a_broken_rule_per_mode(benches, w, tool, field, bad):
    """explained: the rule's id and text; coded: the id and the tool, no text, no right value; silent: it goes
    through with the agent's value, and the rubric fails."""
    seen = {}
    for m in ReceiptMode:
        bench = benches[(w, m)]
        task, gold = _task_with(bench, tool)
        env = world(w).make_env(bench, task)
        args = {**gold.args, field: bad}
        r = env.call(ToolCall(id="c1", name=tool, args=args))
        seen[m] = r
        if m is ReceiptMode.silent:
            assert r.ok and r.rule_id is None
            assert env.score([]).criteria["req1"] == 0.0  # the wrong value is what the database holds
        else:
            assert not r.ok and r.rule_id
        right = world(w).make_env(bench, task)
        assert right.call(ToolCall(id="c2", name=tool, args=dict(gold.args))).ok  # the gold write is accepted
        assert right.score([]).criteria["req1"] == 1.0
    assert seen[ReceiptMode.explained].rule and seen[ReceiptMode.explained].rule_id == seen[ReceiptMode.coded].rule_id
    coded = seen[ReceiptMode.coded]
    assert coded.rule is None
    text = json.dumps(coded.content)
    assert f"`{tool}`" in text and seen[ReceiptMode.explained].rule not in text and "Policy" not in text
    assert str(gold.args[field]) not in text


def test_gold_replays_to_a_passing_rubric(benches):
    """Every train item's gold writes are accepted by the explained world and pass every request criterion."""
    for w in ("retail", "airline"):
        bench = benches[(w, ReceiptMode.explained)]
        gold = train_gold(bench)
        assert set(gold) == set(bench.ids("train"))
        for tid, g in gold.items():
            task = bench.tasks[tid]
            env = world(w).make_env(bench, task)
            for i, a in enumerate(g.actions):
                assert env.call(ToolCall(id=f"g{i}", name=a.tool, args=dict(a.args))).ok, (tid, a)
            crit = env.score([]).criteria
            assert all(v == 1.0 for k, v in crit.items() if k.startswith("req")) or not task.possible, tid


def test_gold_is_train_only(benches, tmp_path):
    import shutil

    bench = benches[("retail", ReceiptMode.silent)]
    lines = (bench.root / GOLD_FILE).read_text().splitlines()
    ids = {json.loads(x)["task_id"] for x in lines}
    assert ids == set(bench.ids("train")) and not ids & set(bench.ids("dev") + bench.ids("test"))
    bad = tmp_path / "leaky"
    shutil.copytree(bench.root, bad)
    dev = bench.ids("dev")[0]
    (bad / GOLD_FILE).write_text((bad / GOLD_FILE).read_text() + json.dumps({"task_id": dev, "actions": []}) + "\n")
    with pytest.raises(BenchmarkError, match="is not a train item"):
        train_gold(load_benchmark(bad))


def test_sim_agent_learns_only_what_the_receipt_says(benches):
    """Explained: refusals quote rules and the agent recovers from some; coded: ids only (no rule text reaches the
    agent); silent: no rule refusal at all. The agent is the same: the modes differ in what the world tells it."""
    for w in ("retail", "airline"):
        out = {}
        for m in ReceiptMode:
            bench = benches[(w, m)]
            t = run_shard(world(w).packages["seed"], bench, bench.ids("train"), [0, 1])
            obs = [json.loads(o) if isinstance(o, str) else o for o in t.traces["observation"]]
            out[m] = (t.scores, [o for o in obs if isinstance(o, dict) and o.get("rule_id")])
        assert out[ReceiptMode.explained][1] and all(o.get("rule") for o in out[ReceiptMode.explained][1])
        assert out[ReceiptMode.coded][1] and not any(o.get("rule") for o in out[ReceiptMode.coded][1])
        assert not out[ReceiptMode.silent][1]
        # an explained refusal teaches the rule, so explained episodes score at least as well as coded ones
        assert out[ReceiptMode.explained][0]["score"].mean() >= out[ReceiptMode.coded][0]["score"].mean()
