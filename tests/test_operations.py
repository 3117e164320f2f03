"""Operating campaigns: kill -9 at every stage boundary then resume, the exclusive lineage lock, injected model
faults, Dask scale-out, a budget that stops a campaign cleanly, and a scheduled deployment served by a worker."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pandas as pd
import pytest

from components.evolution.lineage import Lineage, LineageLock, LineageLocked
from components.memory import digest
from components.params import load_params
from tests.conftest import PACKAGES, ROOT

STAGES = ["evaluate", "diagnose", "patch", "validate", "repair", "gate", "commit"]


def small(bench_dir, *extra, start=PACKAGES / "seed"):
    return ["--rounds", "1", "--out", "camp", "--set", f"benchmark.out={bench_dir}", "--set",
            f"campaign.start={start}", "--set", "campaign.seeds=2", "--set", "gate.n_boot=1000", *extra]


def cli(args, cwd, api, **env):
    home = Path(cwd) / "home"
    full = {**os.environ, "PREFECT_API_URL": api, "RATCHET_HOME": str(home), "PREFECT_HOME": str(home / "prefect"),
            "PREFECT_LOCAL_STORAGE_PATH": str(home / "prefect" / "storage"),
            "MLFLOW_TRACKING_URI": f"sqlite:///{home / 'mlflow.db'}", **env}
    return subprocess.run([sys.executable, "-m", "flows.cli", *args], cwd=cwd, env=full, capture_output=True, text=True,
                          timeout=900)


@pytest.fixture(scope="module")
def crash_setup(prefect_server, tmp_path_factory):
    """A small benchmark, and a start package whose first round commits (the ledger fixes already in place)."""
    from components.params import BenchmarkParams

    root = tmp_path_factory.mktemp("crash")
    bench = BenchmarkParams(out=str(root / "bench"), per_family=12)
    bench.materialize()
    start = root / "start"
    shutil.copytree(PACKAGES / "seed", start)
    manifest = start / "manifest.yaml"
    manifest.write_text(manifest.read_text().replace("max_entries: 2", "max_entries: 6").replace("bind_on: []", "bind_on: [order_id]"))
    clean = root / "clean"
    clean.mkdir()
    r = cli(["campaign", "run", *small(bench.out, start=start)], clean, prefect_server)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads((clean / "camp" / "summary.json").read_text())["accepted"] == 1, "the test needs a round that commits"
    return bench.out, start, clean


def test_kill_at_every_stage_boundary_then_resume_gives_the_clean_result(prefect_server, crash_setup, tmp_path):
    """SIGKILL after each stage of a round in turn; each resume continues from the kill and is killed at the next
    boundary; the last resume finishes. The lineage and the summary (budget spent included) equal a clean run's."""
    bench, start, clean = crash_setup
    first = cli(["campaign", "run", *small(bench, start=start)], tmp_path, prefect_server,
                RATCHET_FAILPOINT=f"round1:{STAGES[0]}")
    assert first.returncode == -signal.SIGKILL, first.stderr[-2000:]
    for i, stage in enumerate(STAGES):
        state = json.loads((tmp_path / "camp" / ".state" / "state.json").read_text())
        assert (state["round"], state["stage"]) == (1, stage)
        nxt = {"RATCHET_FAILPOINT": f"round1:{STAGES[i + 1]}"} if i + 1 < len(STAGES) else {}
        resumed = cli(["campaign", "resume", "--out", "camp"], tmp_path, prefect_server, **nxt)
        assert resumed.returncode == (-signal.SIGKILL if nxt else 0), (stage, resumed.stderr[-3000:])
    for name in ("lineage/lineage.jsonl", "summary.json"):  # byte for byte
        assert (tmp_path / "camp" / name).read_bytes() == (clean / "camp" / name).read_bytes(), name
    spent = [json.loads((d / "camp" / ".state" / "budget.json").read_text())["spent"] for d in (tmp_path, clean)]
    assert spent[0] == spent[1] and spent[0]["model_calls"] > 0  # no work paid for twice across the kills
    versions = tmp_path / "camp" / "lineage" / "versions"
    assert sorted(p.name for p in versions.iterdir()) == ["M0", "M1"]  # no duplicate, no half-written version
    for v in Lineage(tmp_path / "camp" / "lineage").versions():
        assert digest(v.path) == v.digest


def test_a_second_campaign_on_the_same_lineage_fails_at_once(prefect_server, tmp_path, crash_setup):
    with LineageLock(tmp_path / "camp" / "lineage"):
        t = time.monotonic()
        r = cli(["campaign", "run", *small(crash_setup[0])], tmp_path, prefect_server)
        assert r.returncode == 2 and time.monotonic() - t < 120
        assert "locked by another campaign" in r.stderr and f'"pid": {os.getpid()}' in r.stderr
        with pytest.raises(LineageLocked):
            LineageLock(tmp_path / "camp" / "lineage").__enter__()


def test_a_stale_lock_from_a_dead_process_is_recovered(tmp_path):
    code = ("import os, signal, sys; sys.path.insert(0, %r)\n"
            "from components.evolution.lineage import LineageLock\n"
            "LineageLock(%r).__enter__(); os.kill(os.getpid(), signal.SIGKILL)\n") % (str(ROOT), str(tmp_path / "lin"))
    dead = subprocess.run([sys.executable, "-c", code])
    assert dead.returncode == -signal.SIGKILL
    with LineageLock(tmp_path / "lin") as lock:
        assert lock.recovered and lock.recovered["pid"] != os.getpid()


def test_a_budget_too_small_stops_the_campaign_cleanly(prefect_server, tmp_path, crash_setup):
    bench, start, _ = crash_setup
    r = cli(["campaign", "run", *small(bench, "--set", "budget.model_calls=5000", "--set", "campaign.rounds=3",
                                     start=start)], tmp_path, prefect_server)
    assert r.returncode == 0, r.stderr[-3000:]
    s = json.loads((tmp_path / "camp" / "summary.json").read_text())
    assert s["stopped"] and "budget" in s["stopped"]
    spent = json.loads((tmp_path / "camp" / ".state" / "budget.json").read_text())["spent"]
    assert 0 < spent["model_calls"] <= 5000 and s["budget"]["caps"] == {"model_calls": 5000}
    assert s["test"] is None or s["accepted"] >= 0  # stopped before or after certification, never half-way
    for v in Lineage(tmp_path / "camp" / "lineage").versions():  # what was committed stays valid
        assert digest(v.path) == v.digest


@pytest.fixture
def faulty_server(free_port, tmp_path):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "flows.cli", "serve-sim", "--port", str(port), "--fault-rate", "0.2",
                             "--slow-seconds", "0.6"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(200):
        try:
            httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=1)
            break
        except httpx.HTTPError:
            time.sleep(0.1)
    yield f"http://127.0.0.1:{port}/v1"
    proc.terminate()
    proc.wait(timeout=10)


def test_twenty_percent_model_faults(prefect_server, faulty_server, tmp_path):
    from components.params import BenchmarkParams
    from flows.campaign import run_campaign

    bench = BenchmarkParams(out=str(tmp_path / "bench"), per_family=6)
    bench.materialize()
    p = load_params(ROOT / "params.yaml", {
        "benchmark.out": bench.out, "benchmark.per_family": 6, "campaign.out": str(tmp_path / "camp"),
        "campaign.rounds": 1, "campaign.seeds": 2, "campaign.model": "openai", "gate.n_boot": 1000,
        "campaign.model_cfg": {"base_url": faulty_server, "timeout": 0.3, "backoff": 0.01, "max_retries": 4}})
    s = run_campaign(p)  # completes
    assert s["episodes"]["errors"] > 0  # errored episodes are reported ...
    scores = pd.read_csv(tmp_path / "camp" / "rounds" / "r01" / "train" / "scores.csv", dtype={"error": str})
    errored = scores[scores["error"].fillna("") != ""]
    assert len(errored) > 0 and not errored["success"].any() and (errored["score"] == 0).all()  # ... none a success
    assert errored["error"].str.startswith("model: ").all()
    assert len(errored) < len(scores)  # transient faults were retried: most episodes went through


def test_dask_gives_the_same_scores_as_threads(prefect_server, bench_dir):
    from distributed import LocalCluster

    from flows.evaluate import evaluate, task_runner

    items = sorted(json.loads((bench_dir / "splits.json").read_text())["dev"])[:12]
    args = (str(PACKAGES / "reference"), str(bench_dir), [0, 1])
    threads = evaluate.with_options(task_runner=task_runner("threads", 2))(*args, items=items, shard_size=3)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        dask = evaluate.with_options(task_runner=task_runner("dask", 2, cluster.scheduler_address))(
            *args, items=items, shard_size=3, label="dask")
    assert dask.scores.to_csv(index=False) == threads.scores.to_csv(index=False)
    assert list(dask.traces["hash"]) == list(threads.traces["hash"])


def test_a_scheduled_deployment_runs_through_the_worker(prefect_server, tmp_path, crash_setup):
    bench_dir = crash_setup[0]
    from prefect.deployments import run_deployment

    over = ["--set", "campaign.rounds=1", "--set", f"campaign.out={tmp_path / 'camp'}", *small(bench_dir)[4:]]
    sched = cli(["campaign", "schedule", "--cron", "0 3 * * *", "--name", "nightly-test", *over], tmp_path, prefect_server)
    assert sched.returncode == 0, sched.stderr[-2000:]
    home = tmp_path / "home"
    worker = subprocess.Popen([sys.executable, "-m", "flows.cli", "worker"], cwd=tmp_path, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL,
                              env={**os.environ, "PREFECT_API_URL": prefect_server, "RATCHET_HOME": str(home),
                                   "PREFECT_HOME": str(home / "prefect"), "PREFECT_RUNNER_POLL_FREQUENCY": "1",
                                   "PREFECT_LOCAL_STORAGE_PATH": str(home / "prefect" / "storage"),
                                   "MLFLOW_TRACKING_URI": f"sqlite:///{home / 'mlflow.db'}"})
    try:
        run = run_deployment("campaign/nightly-test", timeout=600)
        assert run.state.is_completed(), run.state
    finally:
        worker.send_signal(signal.SIGINT)
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
    assert (tmp_path / "camp" / "summary.json").exists()
    runs = cli(["campaign", "runs"], tmp_path, prefect_server)
    assert runs.returncode == 0, runs.stderr[-2000:]
    assert "nightly-test" in runs.stdout and "Completed" in runs.stdout, runs.stdout
    import asyncio

    from prefect.client.orchestration import get_client

    async def schedules():
        async with get_client() as client:
            dep = await client.read_deployment_by_name("campaign/nightly-test")
            return [s.schedule.cron for s in dep.schedules]

    assert asyncio.run(schedules()) == ["0 3 * * *"]  # the schedule is registered (a persistent server fires it)
