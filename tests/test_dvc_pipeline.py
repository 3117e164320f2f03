"""The DVC pipeline in a temp copy of the project: repro, a no-op repro, a param change that re-runs only the
downstream stages, an experiment, and reproducing a promotion after checking an older commit back out."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, run_cli

BIN = Path(sys.executable).parent
_SKIP = shutil.ignore_patterns(".git", ".venv", ".ratchet", "runs", "__pycache__", ".pytest_cache", "*.egg-info")


def SKIP(directory: str, names: list[str]) -> set[str]:
    """What a fresh clone would not have: local stores, caches, and the DVC outputs (the benchmark, the campaign)."""
    skip = set(_SKIP(directory, names))
    if Path(directory).as_posix().endswith("data/benchmarks"):
        skip |= {n for n in names if n != ".gitignore"}
    return skip


# The smallest pipeline that still shows every claim below: 12 tasks per family, one seed, the smallest n_boot, from
# the stateless package, whose first plan (render the ledger board) is promoted in round 1 on this benchmark
# (deterministically: the simulated agent and every seed are fixed), so the 1-round commit has a promotion to reproduce.
TINY = {"benchmark": {"per_family": 12}, "campaign": {"start": "none", "rounds": 1, "seeds": 1, "shard_size": 30},
        "gate": {"n_boot": 1000}}


@pytest.fixture(scope="module")
def project(tmp_path_factory, prefect_server) -> "Project":
    root = tmp_path_factory.mktemp("dvcproj") / "ratchet"
    shutil.copytree(ROOT, root, ignore=SKIP)
    home = root.parent / "home"
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "RATCHET_HOME": str(home),
           "PREFECT_HOME": str(home / "prefect"), "PREFECT_LOCAL_STORAGE_PATH": str(home / "prefect" / "storage"),
           "MLFLOW_TRACKING_URI": f"sqlite:///{home / 'mlflow.db'}", "DVC_NO_ANALYTICS": "1",
           "DVC_SITE_CACHE_DIR": str(home / "dvc-site"), "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    # the stage commands use the session's Prefect server: each would otherwise start (and stop) its own
    env["PREFECT_API_URL"] = prefect_server

    def run(*cmd, check=True):
        r = subprocess.run(list(cmd), cwd=root, env=env, capture_output=True, text=True, timeout=900)
        if check and r.returncode != 0:
            raise AssertionError(f"{cmd} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
        return r

    def set_rounds(n: int) -> None:
        params = yaml.safe_load((root / "params.yaml").read_text())
        params["campaign"]["rounds"] = n
        (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))

    params = yaml.safe_load((root / "params.yaml").read_text())
    for section, values in TINY.items():
        params[section].update(values)
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    (root / "dvc.lock").unlink(missing_ok=True)
    run("git", "init", "-q", "-b", "main")
    run("git", "add", "-A")
    run("git", "commit", "-qm", "small params")
    # the history every test starts from: a 1-round campaign committed, then a 2-round one (one param changed; its
    # round 1 comes from the task cache the first campaign filled). Most of this module's time: these five stages are
    # fresh interpreters, and their imports dominate at these sizes (each `ratchet campaign` ~9 CPU-s before any
    # work: great-expectations, MLflow, Prefect, scipy), so the tests below start no campaign interpreter of their own
    first = run("dvc", "repro").stdout
    run("git", "add", "-A")
    run("git", "commit", "-qm", "campaign with 1 round")
    set_rounds(2)
    changed = run("dvc", "repro").stdout
    run("git", "add", "-A")
    run("git", "commit", "-qm", "campaign with 2 rounds")
    return Project(root, run, env, {"first": first, "changed": changed})


class Project:
    def __init__(self, root: Path, run, env: dict[str, str], logs: dict[str, str]):
        self.root, self.run, self.env, self.logs = root, run, env, logs

    def commit(self, subject: str) -> str:
        log = self.run("git", "log", "main", "--format=%H %s").stdout.splitlines()
        return next(line.split()[0] for line in log if line.split(" ", 1)[1] == subject)

    def reset(self, rev: str = "main") -> None:
        """Every test starts from a clean checkout of `rev` with its DVC outputs, whatever ran before it."""
        self.run("git", "checkout", "-q", "-f", rev)
        self.run("git", "clean", "-qfd", "-e", "runs/", "-e", "data/benchmarks/")
        self.run("dvc", "checkout", "--force")


def run_stage_in_process(project: Project, monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """A stage's `ratchet` command in this process, in the project and with the environment `dvc repro` gives its
    stages (the same stores: the campaign sees the project's evidence graph and Prefect result storage), through the
    real entry point. A fresh interpreter would add its imports (~9 CPU-s for `ratchet campaign`) and prove nothing
    more about the bytes it writes."""
    from prefect.settings import PREFECT_LOCAL_STORAGE_PATH, temporary_settings

    for key in ("RATCHET_HOME", "PREFECT_HOME", "PREFECT_LOCAL_STORAGE_PATH", "MLFLOW_TRACKING_URI", "RATCHET_EVIDENCE_DB"):
        if key in project.env:
            monkeypatch.setenv(key, project.env[key])
        else:  # this test's own graph (tests/conftest.py): the stages have none, so $RATCHET_HOME/evidence.db
            monkeypatch.delenv(key, raising=False)
    monkeypatch.chdir(project.root)
    # Prefect read its settings at import: the result storage (task cache, kept rounds) is switched here
    with temporary_settings(updates={PREFECT_LOCAL_STORAGE_PATH: project.env["PREFECT_LOCAL_STORAGE_PATH"]}):
        return run_cli(capsys, *args)


def stages_run(out: str) -> set[str]:
    return {line.split("'")[1] for line in out.splitlines() if line.startswith("Running stage '")}


def test_repro_then_nothing_then_only_downstream(project, capsys, monkeypatch):
    root, run = project.root, project.run
    assert stages_run(project.logs["first"]) == {"benchmark", "campaign", "report"}
    # one campaign param changed: only campaign and report ran again
    assert stages_run(project.logs["changed"]) == {"campaign", "report"}
    assert "Stage 'benchmark' didn't change" in project.logs["changed"]
    project.reset()
    assert json.loads((root / "reports" / "metrics.json").read_text())["rounds"] == 2
    again = run("dvc", "repro")
    assert stages_run(again.stdout) == set()
    assert "Data and pipelines are up to date" in again.stdout
    # same inputs, same bytes: the campaign stage run again (as `dvc repro --force --single-item campaign` does: its
    # output removed, then its command) leaves every output's hash in dvc.lock as it was
    shutil.rmtree(root / "runs" / "campaign")
    code, out, err = run_stage_in_process(project, monkeypatch, capsys, "campaign", "run", "--params", "params.yaml")
    assert code == 0, out + err
    status = run("dvc", "status")
    assert "Data and pipelines are up to date" in status.stdout, status.stdout
    metrics = run("dvc", "metrics", "show", "--json")
    assert "test_net" in metrics.stdout
    # the plots are images: the page `dvc plots show` writes loads nothing from the network
    run("dvc", "plots", "show", "-o", "plots-page")
    page = (root / "plots-page" / "index.html").read_text()
    assert "<script src=" not in page and "https://" not in page
    for name in ("rounds", "champion", "causes", "families"):
        assert f"{name}.png" in page and (root / "reports" / f"{name}.png").stat().st_size > 1000


def test_experiments_vary_a_param(project):
    root, run = project.root, project.run
    project.reset()
    # main runs 2 rounds; the experiment sets campaign.rounds back to 1. The campaign stage then has the signature of
    # the first commit's run, which DVC's run-cache restores instead of running it again (a fresh interpreter's
    # imports, ~9 CPU-s); the report stage (cache: false outputs, so no run-cache) runs on the restored campaign
    exp = run("dvc", "exp", "run", "-S", "campaign.rounds=1")
    assert "campaign" in exp.stdout
    shown = json.loads(run("dvc", "exp", "show", "--json").stdout)
    base = next(row for row in shown if row["name"] == "main")
    assert varied(base["data"]) == (2, 2)
    experiments = [rev["data"] for e in base["experiments"] or [] for rev in e["revs"]]
    # the experiment's param and the metrics its outputs produced: 1 round, not main's 2
    assert (1, 1) in [varied(x) for x in experiments], experiments
    assert all("test_net" in x["metrics"]["reports/metrics.json"]["data"] for x in experiments)


def varied(data: dict) -> tuple[int, int]:
    """(campaign.rounds in params.yaml, rounds in reports/metrics.json) of one `dvc exp show --json` row."""
    return (data["params"]["params.yaml"]["data"]["campaign"]["rounds"],
            data["metrics"]["reports/metrics.json"]["data"]["rounds"])


def test_reproduce_a_promotion_from_an_older_commit(project, capsys, monkeypatch):
    root = project.root
    project.reset(project.commit("campaign with 1 round"))  # every test starts with its own reset: none after it
    record = [json.loads(x) for x in (root / "runs/campaign/lineage/lineage.jsonl").read_text().splitlines()]
    assert max(r["round"] for r in record) == 1  # the older commit's bytes, not the newer campaign's
    promoted = [r["child"]["version"] for r in record if r["verdict"] == "accept"]
    assert promoted, "the 1-round campaign promoted nothing"
    # `ratchet reproduce` in the checked-out project, in-process through the real entry point: it reads only the
    # files DVC checked out (no store, no server), so a subprocess would prove nothing more
    monkeypatch.chdir(root)
    code, out, err = run_cli(capsys, "reproduce", "--version", promoted[-1], "--json")
    assert code == 0, out + err
    assert json.loads(out)["identical"] is True
