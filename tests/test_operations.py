"""Operating campaigns: kill -9 at every stage boundary then resume, the exclusive lineage lock, injected model
faults, Dask scale-out, a budget that stops a campaign cleanly, and a scheduled deployment served by a worker."""

from __future__ import annotations

import json
import os
import re
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
    """A ceiling that cannot pay for three rounds and the certification: the campaign stops between stages with
    exit 0, never spends past the ceiling, names what stopped it, and leaves records that agree with each other."""
    bench, start, _ = crash_setup
    r = cli(["campaign", "run", *small(bench, "--set", "budget.model_calls=5000", "--set", "campaign.rounds=3",
                                     start=start)], tmp_path, prefect_server)
    assert r.returncode == 0, r.stderr[-3000:]
    out = tmp_path / "camp"
    s = json.loads((out / "summary.json").read_text())
    m = re.fullmatch(r"(round (\d+)|certification): budget: cannot admit: model_calls (\S+) > (\S+) left", s["stopped"])
    assert m, s["stopped"]
    assert float(m.group(3)) > float(m.group(4))  # refused because the reservation did not fit what was left
    assert f"stopped: {s['stopped']}" in r.stderr
    spent = json.loads((out / ".state" / "budget.json").read_text())
    assert spent["open_holds"] == 0 and s["budget"]["caps"] == {"model_calls": 5000}
    assert 0 < spent["spent"]["model_calls"] <= 5000
    # what the recorded evidence cost was paid for; what the stopped stage had consumed was paid for too
    # (the reply store answers repeated requests unpaid: what it answered counts as used, not paid)
    assert s["budget"]["evidence_cost"]["model_calls"] <= spent["spent"]["model_calls"] + \
        (spent.get("reply_store") or {}).get("model_calls", 0)
    # the stop point and the records agree: every round before it finished and was recorded, nothing after it was
    records = [json.loads(line) for line in (out / "lineage" / "lineage.jsonl").read_text().splitlines()]
    rounds = sorted(x["round"] for x in records if x["round"] > 0)
    stopped_in = int(m.group(2)) if m.group(2) else None
    finished = (stopped_in - 1) if stopped_in else 3
    assert rounds == list(range(1, finished + 1)) and s["rounds"] == finished
    if stopped_in:
        assert not (out / "rounds" / f"r{stopped_in:02d}" / "round.json").exists()
    assert s["test"] is None and not (out / "test_evals.json").exists()  # certification never half-done
    state = json.loads((out / ".state" / "state.json").read_text())
    assert state == {"round": finished, "stage": "done", "stopped": s["stopped"]}
    versions = Lineage(out / "lineage").versions()
    assert s["accepted"] == len(versions) - 1 == sum(x.get("verdict") == "accept" for x in records)
    for v in versions:  # what was committed stays valid
        assert digest(v.path) == v.digest


@pytest.fixture
def faulty_server(free_port, monkeypatch):
    """The simulated agent over HTTP with 20% injected faults, in this process so the test can see every request:
    (request hash, attempt, fault, time). Fails if the server does not come up."""
    import hashlib
    import threading

    import uvicorn

    import components.models.server as server_module

    seen: list[tuple[str, int, str | None, float]] = []
    fault = server_module._fault

    def spy(body: bytes, attempt: int, rate: float, seed: int) -> str | None:
        kind = fault(body, attempt, rate, seed)
        seen.append((hashlib.sha256(body).hexdigest(), attempt, kind, time.monotonic()))
        return kind

    monkeypatch.setattr(server_module, "_fault", spy)
    port = free_port()
    app = server_module.create_app(fault_rate=0.2, slow_seconds=0.6)
    app.state.seen = seen
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "serve-sim did not start"
        time.sleep(0.05)
    assert httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5).status_code == 200
    yield f"http://127.0.0.1:{port}/v1", app
    server.should_exit = True
    thread.join(timeout=30)
    assert not thread.is_alive()


def test_twenty_percent_model_faults(prefect_server, faulty_server, tmp_path):
    from components.models.server import TRANSIENT
    from components.params import BenchmarkParams
    from flows.campaign import run_campaign

    url, app = faulty_server
    bench = BenchmarkParams(out=str(tmp_path / "bench"), per_family=6)
    bench.materialize()
    p = load_params(ROOT / "params.yaml", {
        "benchmark.out": bench.out, "benchmark.per_family": 6, "campaign.out": str(tmp_path / "camp"),
        "campaign.rounds": 1, "campaign.seeds": 2, "campaign.model": "openai", "gate.n_boot": 1000,
        "campaign.model_cfg": {"base_url": url, "timeout": 0.3, "backoff": 0.01, "max_retries": 4}})
    s = run_campaign(p)  # completes
    faults = app.state.faults
    transient = sum(f in TRANSIENT for f in faults)
    assert transient > 0 and len(faults) > transient  # both kinds were injected
    assert s["episodes"]["errors"] > 0  # errored episodes are reported ...
    scores = pd.read_csv(tmp_path / "camp" / "rounds" / "r01" / "train" / "scores.csv", dtype={"error": str})
    errored = scores[scores["error"].fillna("") != ""]
    assert len(errored) > 0 and not errored["success"].any() and (errored["score"] == 0).all()  # ... none a success
    assert errored["error"].str.startswith("model: ").all()
    # every request that met a transient fault (a 500, a timeout) was sent again at once (not replayed by a later
    # evaluation), and went through
    seen = app.state.seen
    hits = [i for i, (_, _, kind, _) in enumerate(seen) if kind in TRANSIENT]
    assert hits
    for i in hits:
        h, attempt, _, at = seen[i]
        retry = next((x for x in seen[i + 1:] if x[0] == h), None)
        assert retry is not None and retry[1] == attempt + 1 and retry[2] is None, (seen[i], retry)
        assert retry[3] - at < 5.0, "a replay by a later evaluation, not a retry"


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
