"""MLflow records of a campaign (nested runs, tags, lineage) and `ratchet reproduce` of a promotion."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from mlflow import MlflowClient

from components.params import load_params
from flows.campaign import run_campaign
from tests.conftest import ROOT

ROUND_TAGS = ("ratchet.parent_digest", "ratchet.candidate_digest", "ratchet.benchmark_digest", "ratchet.git_commit",
              "ratchet.dvc_lock", "ratchet.seed_map_hash", "ratchet.verdict")


@pytest.fixture(scope="module")
def campaign(prefect_server, tmp_path_factory, bench_dir):
    out = tmp_path_factory.mktemp("records") / "camp"
    p = load_params(ROOT / "params.yaml", {"benchmark.out": str(bench_dir), "campaign.out": str(out),
                                           "campaign.rounds": 2, "campaign.seeds": 2, "campaign.name": "records",
                                           "gate.n_boot": 2000})
    return out, run_campaign(p)


def test_mlflow_has_nested_runs_tags_and_lineage(campaign):
    out, s = campaign
    client = MlflowClient()
    exp = client.get_experiment_by_name("ratchet/records")
    assert exp is not None and exp.experiment_id == s["mlflow"]["experiment_id"]
    runs = client.search_runs([exp.experiment_id], max_results=500)
    by_parent: dict[str, list] = {}
    for r in runs:
        by_parent.setdefault(r.data.tags.get("mlflow.parentRunId"), []).append(r)
    top = client.get_run(s["mlflow"]["run_id"])
    assert top.data.tags["ratchet.kind"] == "campaign"
    rounds = [r for r in by_parent[top.info.run_id] if r.data.tags["ratchet.kind"] == "round"]
    assert sorted(int(r.data.tags["ratchet.round"]) for r in rounds) == [1, 2]
    for r in rounds:
        for tag in ROUND_TAGS:
            assert r.data.tags.get(tag), (tag, r.info.run_name)
        evals = by_parent.get(r.info.run_id, [])
        assert {(e.data.tags["ratchet.split"], e.data.tags["ratchet.arm"]) for e in evals} >= {("train", "base")}
        if r.data.tags["ratchet.verdict"] == "accept":
            assert {"net", "ci_lo", "ci_hi", "n_improved", "n_regressed", "dev_base_mean", "dev_cand_mean"} <= set(r.data.metrics)
            assert {("dev", "base"), ("dev", "cand")} <= {(e.data.tags["ratchet.split"], e.data.tags["ratchet.arm"]) for e in evals}
            artifacts = {a.path for a in client.list_artifacts(r.info.run_id)}
            assert {"plan.json", "diagnosis.json", "gate_items.csv", "validation.json"} <= artifacts
    # the champion's lineage M0 -> M1 -> ... is on the campaign run
    lineage = top.data.tags["ratchet.lineage"]
    assert lineage.startswith("M0 (") and all(v["digest"][:12] in lineage for v in s["lineage"])
    assert top.data.metrics["test_net"] == pytest.approx(s["test"]["net"])
    assert {e.data.tags["ratchet.arm"] for e in by_parent[top.info.run_id] if e.data.tags["ratchet.kind"] == "evaluation"} == {"start", "champion"}


def reproduce(*args, **env):
    return subprocess.run([sys.executable, "-m", "flows.cli", "reproduce", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, env={**os.environ, **env})


def test_reproduce_a_promotion_is_identical(campaign):
    out, s = campaign
    promoted = [v["version"] for v in s["lineage"][1:]]
    assert promoted
    r = reproduce("--version", promoted[-1], "--campaign", str(out), "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    result = json.loads(r.stdout)
    assert result["identical"] and result["verdict_matches"] and result["differences"] == []
    assert result["n_items"] == 60


def test_reproduce_by_mlflow_round_run_id(campaign):
    out, s = campaign
    run_id = json.loads((out / ".state" / "round-01.json").read_text())["run_id"]
    r = reproduce("--run-id", run_id, "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout)["version"] == "M1"


def test_tampered_version_is_refused_naming_the_digest(campaign, tmp_path):
    import shutil

    out, s = campaign
    copy = tmp_path / "camp"
    shutil.copytree(out, copy)
    card_dir = copy / "lineage" / "versions" / "M1"
    manifest = card_dir / "manifest.yaml"
    manifest.write_text(manifest.read_text() + "\n")
    r = reproduce("--version", "M1", "--campaign", str(copy))
    assert r.returncode == 2
    assert "digest mismatch" in r.stderr and str(card_dir) in r.stderr and "Traceback" not in r.stderr


def test_reproduce_an_unknown_version_is_a_clear_error(campaign):
    out, _ = campaign
    r = reproduce("--version", "M99", "--campaign", str(out))
    assert r.returncode == 2 and "M99" in r.stderr and "promoted" in r.stderr
