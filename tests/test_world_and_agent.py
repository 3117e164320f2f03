"""The retail world and the simulated agent's contract: determinism, memory that matters, the HTTP path."""

from __future__ import annotations

import filecmp
import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from components.memory import digest, load_package
from components.models.simulated import SimulatedAgent
from components.runtime.evaluate import run_shard
from components.worlds import world
from components.worlds.retail.facts import FACTS
from tests.conftest import PACKAGES, ROOT


def cli(*args, **kw):
    return subprocess.run([sys.executable, "-m", "flows.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, **kw)


# -- the world ---------------------------------------------------------------------------------------------------

def test_materialize_same_seed_same_bytes(tmp_path, bench_dir):
    again = world("retail").materialize(tmp_path / "again", 0)
    assert digest(again) == digest(bench_dir)
    other = world("retail").materialize(tmp_path / "other", 1)
    assert digest(other) != digest(bench_dir)


def test_benchmark_shape(bench):
    assert len(bench.tasks) >= 150
    families = {t.family for t in bench.tasks.values()}
    assert len(families) >= 5
    ids = [set(bench.ids(s)) for s in ("train", "dev", "test")]
    assert not (ids[0] & ids[1]) and not (ids[0] & ids[2]) and not (ids[1] & ids[2])
    assert set().union(*ids) == set(bench.tasks)
    for t in bench.tasks.values():
        assert all(c.weight > 0 for c in t.rubric)
    # horizons differ: multi-request tasks are longer than single-request ones
    n = {f: max(len(t.requests) for t in bench.tasks.values() if t.family == f) for f in families}
    assert n["multi"] >= 3 and n["cancel"] == 1


def test_the_knowledge_is_written_down(bench, bench_dir):
    """What the agent lacks is in the policy it is shown, and a violated rule comes back, stated, in the receipt."""
    policy = (bench_dir / "policy.md").read_text()
    env = world(bench.world).make_env(bench, bench.tasks[bench.ids("train")[0]])
    assert policy in env.system_prompt  # the policy on disk is what the agent reads
    for fact in FACTS:
        assert fact.value is not None and fact.read(policy) == fact.value
        without = policy.replace(fact.statement, "")
        assert without != policy and fact.read(without) is None  # the policy says it in that statement, nowhere else
    t = run_shard(PACKAGES / "seed", bench, bench.ids("train"), [0, 1, 2]).traces
    refused: dict[str, int] = {}
    for action, observation in zip(t["action"], t["observation"]):
        obs = json.loads(observation)
        if not obs.get("rule_id"):
            continue
        tool = json.loads(action)["tool"]
        fact = next(f for f in FACTS if f.id == obs["rule_id"])  # the receipt names the rule it refused on
        assert obs["ok"] is False and obs["genuine"] and obs["tool"] == tool == fact.tool and not obs["blocking"]
        assert fact.read(obs["rule"]) == fact.value  # ... and states it correctly
        if fact.id == "cancel_reason":
            assert obs["args"]["reason"] not in fact.value  # and it is refused for breaking it
        refused[fact.id] = refused.get(fact.id, 0) + 1
    assert set(refused) == {f.id for f in FACTS}, refused  # every rule the seed lacks comes back in some receipt


def test_reward_is_weighted_rubric(bench):
    """reward = sum(w_i * s_i) / sum(w_i): checked against hand-computed rubrics and against real episodes."""
    from components.models import make_model
    from components.runtime.episode import run_episode

    # an episode where the agent did nothing: every request criterion fails, the two conduct criteria hold
    spec = world(bench.world)
    for item in bench.ids("dev")[:30]:
        task = bench.tasks[item]
        conduct = [c for c in task.rubric if not c.id.startswith("req")]
        assert len(conduct) == 2 and len(task.rubric) == len(task.requests) + 2
        score = spec.make_env(bench, task).score([])
        total = sum(c.weight for c in task.rubric)
        assert score.reward == pytest.approx(sum(c.weight for c in conduct) / total, abs=1e-6)
        assert not score.success
    weights = {c.weight for t in bench.tasks.values() for c in t.rubric}
    assert len(weights) > 1  # requests and conduct weigh differently, so the weighting is observable

    chat, weighted_differs = make_model("sim", None), 0
    for name in ("seed", "reference"):
        pkg = load_package(PACKAGES / name)
        for item in bench.ids("dev")[:20]:
            r = run_episode(pkg, bench, item, 0, chat)
            task = bench.tasks[item]
            w = {c.id: c.weight for c in task.rubric}
            assert set(r.criteria) == set(w) and set(r.criteria.values()) <= {0.0, 1.0}
            expect = sum(w[k] * s for k, s in r.criteria.items()) / sum(w.values())
            assert r.score == pytest.approx(expect, abs=1e-6)
            assert r.success == (min(r.criteria.values()) == 1.0) == (r.score == 1.0)
            weighted_differs += abs(expect - sum(r.criteria.values()) / len(w)) > 1e-6
            if task.family == "cancel":  # the request criterion agrees with the trace: a genuine cancel receipt
                order = task.requests[0]["order_id"]
                done = any(s.observation.get("ok") and s.observation.get("genuine") and s.action.get("tool") ==
                           "cancel_pending_order" and s.action.get("args", {}).get("order_id") == order for s in r.steps)
                assert r.criteria["req1"] == float(done)
    assert weighted_differs > 0  # partial credit happened, and the weights decided it


# -- the simulated agent -------------------------------------------------------------------------------------------

def test_agent_is_a_pure_function_of_messages_and_seed():
    agent = SimulatedAgent()
    msgs = [{"role": "system", "content": "policy"}, {"role": "system", "content": "# Memory\n(empty)"},
            {"role": "user", "content": "Hi, I'm Ava Smith (email ava.smith1@example.com). Please cancel order #W1234567: I no longer need it."}]
    a = agent.complete(msgs, tools=None, seed=7)
    b = agent.complete(msgs, tools=None, seed=7)
    assert a == b
    assert a.tool_calls[0].name == "find_user_id_by_email"
    assert a.tool_calls[0].args == {"email": "ava.smith1@example.com"}


def test_evaluation_is_deterministic(bench):
    a = run_shard(PACKAGES / "seed", bench, bench.ids("dev")[:12], [0, 1])
    b = run_shard(PACKAGES / "seed", bench, bench.ids("dev")[:12], [0, 1])
    assert a.scores.to_csv() == b.scores.to_csv()
    assert list(a.traces["hash"]) == list(b.traces["hash"])


def mean_dev(bench, name):
    return run_shard(PACKAGES / name, bench, bench.ids("dev"), [0, 1, 2]).scores["score"].mean()


def test_memory_changes_the_scores_in_the_designed_order(bench):
    s = {name: mean_dev(bench, name) for name in ("none", "seed", "all-skills", "reference")}
    assert s["reference"] >= s["seed"] + 0.30, s
    assert s["reference"] >= s["all-skills"] + 0.10, s
    assert s["seed"] > s["none"], s
    assert s["reference"] < 1.0


def test_routed_cards_beat_the_same_cards_everywhere(bench, package_copy):
    """rho: the same cards and wm, delivered by trigger instead of every turn, score higher (attention)."""
    routed = package_copy("all-skills")
    text = (routed / "manifest.yaml").read_text().replace("use: all_cards\n    at: turn_start",
                                                          "use: event_cards\n    at: intent_recorded")
    (routed / "manifest.yaml").write_text(text)
    ids = bench.ids("dev")
    a = run_shard(PACKAGES / "all-skills", bench, ids, [0, 1, 2]).scores["score"].mean()
    b = run_shard(routed, bench, ids, [0, 1, 2]).scores["score"].mean()
    assert b > a + 0.05


# -- CLI eval and the HTTP path ----------------------------------------------------------------------------------

def test_cli_eval_writes_tables_byte_identically(tmp_path, bench_dir):
    args = ["eval", "--package", str(PACKAGES / "seed"), "--benchmark", str(bench_dir), "--split", "dev", "--seeds", "2"]
    r1 = cli(*args, "--out", str(tmp_path / "a"))
    r2 = cli(*args, "--out", str(tmp_path / "b"))
    assert r1.returncode == 0, r1.stderr
    assert r2.returncode == 0, r2.stderr
    assert filecmp.cmp(tmp_path / "a" / "scores.csv", tmp_path / "b" / "scores.csv", shallow=False)
    head = (tmp_path / "a" / "scores.csv").read_text().splitlines()[0].split(",")
    for col in ("item_id", "seed", "score", "success", "turns", "tokens_in", "tokens_out", "error"):
        assert col in head
    assert (tmp_path / "a" / "traces.parquet").stat().st_size > 0
    assert (tmp_path / "a" / "_hidden" / "causes.csv").exists()
    assert "mean score" in r1.stdout


def test_http_path_gives_identical_scores(tmp_path, bench_dir, free_port):
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "flows.cli", "serve-sim", "--port", str(port)], cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        else:
            pytest.fail("serve-sim did not start")
        items = ",".join(sorted(json.loads((bench_dir / "splits.json").read_text())["dev"])[::4])
        common = ["eval", "--package", str(PACKAGES / "reference"), "--benchmark", str(bench_dir), "--items", items,
                  "--seeds", "2"]
        local = cli(*common, "--out", str(tmp_path / "local"))
        remote = cli(*common, "--out", str(tmp_path / "http"), "--model", "openai", "--base-url",
                     f"http://127.0.0.1:{port}/v1")
        assert local.returncode == 0, local.stderr
        assert remote.returncode == 0, remote.stderr
        assert filecmp.cmp(tmp_path / "local" / "scores.csv", tmp_path / "http" / "scores.csv", shallow=False)
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_openai_backend_without_base_url_is_a_clear_error(tmp_path, bench_dir):
    r = cli("eval", "--package", str(PACKAGES / "seed"), "--benchmark", str(bench_dir), "--model", "openai",
            "--out", str(tmp_path / "x"))
    assert r.returncode == 2
    assert "--base-url" in r.stderr and "Traceback" not in r.stderr
