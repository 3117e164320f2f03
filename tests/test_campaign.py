"""The campaign as Prefect flows: a real (temporary) Prefect server, real task caching, real files."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import flows.tasks
from components.evolution.lineage import Lineage
from components.evolution.plan import parse_plan
from components.memory import digest
from components.params import load_params
from flows.campaign import run_campaign
from tests.conftest import ROOT


@pytest.fixture(scope="module")
def camp(tmp_path_factory, bench_dir):
    root = tmp_path_factory.mktemp("campaigns")

    def params(name: str, **over):
        base = {"benchmark.out": str(bench_dir), "campaign.out": str(root / name), "campaign.rounds": 3,
                "campaign.seeds": 2, "gate.n_boot": 2000}
        return load_params(ROOT / "params.yaml", {**base, **over})

    return params


@pytest.fixture
def episodes(monkeypatch):
    """Count the episodes the flow actually runs (the real run_shard still runs)."""
    calls = []
    real = flows.tasks.run_shard

    def counting(package, bench, items, seeds, *a, **kw):
        calls.append(len(items) * len(seeds))
        return real(package, bench, items, seeds, *a, **kw)

    monkeypatch.setattr(flows.tasks, "run_shard", counting)
    return calls


def test_campaign_promotes_and_records(prefect_server, camp, episodes):
    p = camp("a")
    s = run_campaign(p)
    assert sum(episodes) > 0
    assert s["rounds"] == 3 and 1 <= s["accepted"] <= 3
    lineage = Lineage(p.campaign.out + "/lineage")
    versions = lineage.versions()
    assert [v.name for v in versions] == [f"M{i}" for i in range(s["accepted"] + 1)]
    for v in versions:  # every version on disk is the bytes that were evaluated
        assert digest(v.path) == v.digest
    assert s["champion_digest"] == versions[-1].digest
    for rec in s["history"]:
        assert rec["verdict"] in ("accept", "reject", "no_plan")
        if rec["verdict"] == "accept":
            g = rec["gate"]
            assert g["ci_lo"] > 0 and g["n_regressed"] <= p.gate.reg_cap
            assert rec["child"]["digest"] == rec["candidate_digest"]
    t = s["test"]
    assert t["champion_mean"] > t["base_mean"] and t["ci_lo"] > 0
    assert set(s["localization"]) >= {"accuracy", "outcome_only_accuracy", "n"}
    on_disk = json.loads((ROOT / p.campaign.out / "summary.json").read_text())
    assert on_disk["champion_digest"] == s["champion_digest"]
    plan = parse_plan((ROOT / p.campaign.out / "rounds/r01/plan.json").read_text())
    assert plan.owner in ("E", "W", "rho", "C") and plan.evidence


def test_rerun_with_the_same_bytes_runs_no_episode(prefect_server, camp, episodes):
    first = json.loads((ROOT / camp("a").campaign.out / "summary.json").read_text())
    s = run_campaign(camp("a-again"))
    assert episodes == []  # every evaluation, probe included, came from the task cache
    assert s["test"] == first["test"]
    assert [v["digest"] for v in s["lineage"]] == [v["digest"] for v in first["lineage"]]


def test_a_changed_input_recomputes_only_what_depends_on_it(prefect_server, camp, episodes):
    first = json.loads((ROOT / camp("a").campaign.out / "summary.json").read_text())
    s = run_campaign(camp("a-probe", **{"campaign.probe_items": 2}))
    # only the activation probes (validate stage) ran again: at most 2 items x 1 seed per round with a plan
    planned = sum(1 for r in s["history"] if r["verdict"] != "no_plan")
    assert 0 < len(episodes) <= planned and all(n <= 2 for n in episodes)
    assert s["test"] == first["test"]


def test_a_rejected_plan_is_not_tried_again(prefect_server, camp):
    s = run_campaign(camp("strict", **{"gate.reg_cap": 0, "gate.material": 0.0, "campaign.rounds": 3}))
    keys = [r.get("plan_key") for r in s["history"] if r.get("plan_key")]
    assert len(keys) == len(set(keys))
    rejected = [r for r in s["history"] if r["verdict"] == "reject"]
    for r in rejected:
        assert (ROOT / camp("strict").campaign.out / "lineage/rejected" / f"{r['plan_key']}.json").exists()


def test_llm_meta_agent_goes_through_the_model_and_the_same_schema(prefect_server, camp):
    s = run_campaign(camp("llm", **{"campaign.meta_agent": "llm", "campaign.rounds": 1}))
    plan = parse_plan((ROOT / camp("llm").campaign.out / "rounds/r01/plan.json").read_text())
    rules = parse_plan((ROOT / camp("a").campaign.out / "rounds/r01/plan.json").read_text())
    assert plan.key() == rules.key()  # the simulated model returns the rules' draft; a real model may not
    assert s["history"][0]["plan_key"] == plan.key()


def test_cli_campaign_prints_rounds_and_certification(tmp_path, bench_dir):
    r = subprocess.run([sys.executable, "-m", "flows.cli", "campaign", "run", "--rounds", "1", "--out",
                        str(tmp_path / "c"), "--set", f"benchmark.out={bench_dir}", "--set", "campaign.seeds=1",
                        "--set", "gate.n_boot=1000"], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "round 1:" in r.stderr
    assert "test (touched once)" in r.stdout and "summary:" in r.stdout
    assert (tmp_path / "c" / "summary.json").exists()


def test_bad_params_are_one_clear_line(tmp_path):
    bad = tmp_path / "params.yaml"
    bad.write_text("campaign:\n  rounds: lots\n")
    r = subprocess.run([sys.executable, "-m", "flows.cli", "campaign", "run", "--params", str(bad)], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "campaign.rounds" in r.stderr and str(bad) in r.stderr and "Traceback" not in r.stderr
