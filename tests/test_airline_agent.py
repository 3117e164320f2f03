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
        assert [(r.kind, r.target["reservation_id"]) for r in reqs] == \
               [(q["kind"], q["reservation_id"]) for q in t.requests]
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
