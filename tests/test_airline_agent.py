"""The airline world with the simulated agent: registration, world selection in params, the competence, and a
few episodes (deterministic; memory helps; external tasks never succeed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from components.memory import load_package
from components.models.simulated import SimulatedAgent
from components.runtime.episode import run_episode
from components.worlds import load_benchmark, world
from components.worlds.airline import facts as F

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ROOT / "data" / "packages" / "airline"


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    out = tmp_path_factory.mktemp("airline-agent") / "bench"
    world("airline").materialize(out, seed=0, per_family=9)
    return load_benchmark(out)


def test_registered_and_selected_by_params(monkeypatch):
    from components.params import load_params

    spec = world("airline")
    assert spec.name == "airline" and set(spec.competence.writes) == {f.tool for f in F.FACTS}
    monkeypatch.chdir(ROOT)
    p = load_params(ROOT / "params.yaml", {"benchmark.world": "airline"})
    assert p.benchmark.out == "data/benchmarks/airline"
    assert p.campaign.start == "data/packages/airline/seed"  # the world's built-in package, relative as before
    d = load_params(ROOT / "params.yaml")
    assert (d.benchmark.out, d.campaign.start) == ("data/benchmarks/retail", "data/packages/seed")
    assert load_params(ROOT / "params.yaml", {"campaign.start": "somewhere/pkg"}).campaign.start == "somewhere/pkg"


def test_competence_parses_every_request(bench):
    comp = world("airline").competence
    for t in bench.tasks.values():
        reqs, info = comp.parse(t.first_message)
        assert [(r.kind, r.target["reservation_id"]) for r in reqs] == [
            (q["kind"], q["reservation_id"]) for q in t.requests
        ]
        assert info["email"] and len({r.key for r in reqs}) == len(reqs)


def _run(bench, pkg, item, seed=0):
    return run_episode(pkg, bench, item, seed, SimulatedAgent(competence=world("airline").competence), 40)


def test_episodes_deterministic_memory_helps_external_never(bench):
    ref, seed_pkg = load_package(PACKAGES / "reference"), load_package(PACKAGES / "seed")
    ids = sorted(bench.tasks)
    possible = [i for i in ids if bench.tasks[i].possible][::4]
    a = [_run(bench, ref, i).score for i in possible]
    assert a == [_run(bench, ref, i).score for i in possible]  # same inputs, same episodes
    b = [_run(bench, seed_pkg, i).score for i in possible]
    assert sum(a) > sum(b) and max(a) == 1.0
    for i in [i for i in ids if not bench.tasks[i].possible][:3]:
        assert not _run(bench, ref, i).success


# -- the fault engine on a write with several rules (engine requests 4 and 7) ----------------------------------------


def _refusal(fact_id: str) -> tuple[dict, dict]:
    return (
        {"name": F.BY_ID[fact_id].tool, "args": {"reservation_id": "R1"}},
        {"error": "refused.", "rule_id": fact_id, "rule": F.BY_ID[fact_id].rule},
    )


def test_a_refusal_on_a_new_rule_is_retried_a_repeated_one_is_not():
    from components.models.simulated import _gives_up

    n = len(F.BY_TOOL["change_flight"])  # fee and window
    assert not _gives_up([_refusal("change_fee")], n)
    assert not _gives_up([_refusal("change_window"), _refusal("change_fee")], n)  # each rule refused once: learnable
    assert _gives_up([_refusal("change_fee"), _refusal("change_fee")], n)  # the same rule again: nothing new to read
    assert _gives_up([_refusal("change_window"), _refusal("change_fee"), _refusal("change_window")], n)
    assert _gives_up([_refusal("upgrade_payment"), _refusal("name_upper")], 1)  # one rule on the write: 2 attempts
    assert _gives_up([_refusal("bag_fee"), _refusal("bag_allowance"), _refusal("bag_business")], 3) is False
    assert _gives_up([_refusal("bag_fee")] + [_refusal(f) for f in ("bag_allowance", "bag_business", "comp_form")], 3)


def test_a_retry_rereads_every_earlier_refusal_latest_wins():
    from components.models.simulated import SimulatedAgent
    from components.worlds.competence import Request, View

    comp = world("airline").competence
    r = Request("change", "change_flight", {"reservation_id": "R1"})
    v = View("", "", [], None, [r], {}, [], [], [], 3, None, "draft")  # no policy, no card: nothing known up front
    agent = SimulatedAgent(competence=comp)
    truth = {f.id: (True, f.value) for f in F.BY_TOOL["change_flight"]}
    # refused on the fee, then on the window: the third attempt applies both rules, not only the last one
    assert agent.beliefs(v, r, 0, comp, [_refusal("change_fee"), _refusal("change_window")]) == truth
    assert agent.beliefs(v, r, 0, comp, [_refusal("change_window"), _refusal("change_fee")]) == truth
    # a last refusal that names no rule of this write is retried plainly, as before
    plain = ({"name": "change_flight", "args": {}}, {"error": "no such flight"})
    assert set(agent.beliefs(v, r, 0, comp, [_refusal("change_fee"), plain]).values()) == {(True, None)}
