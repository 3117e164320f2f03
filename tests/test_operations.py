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
from tests.conftest import EXPLAINED, PACKAGES, ROOT, run_cli
from tests.zygote import Zygote

CAP = 2500  # model calls: one round and the certification on crash_setup's benchmark cost ~1500
STAGES = ["evaluate", "diagnose", "patch", "validate", "repair", "gate", "commit"]


def small(bench_dir, *extra, start=PACKAGES / "seed"):
    """`crash_setup`'s campaign (its benchmark: 6 tasks per family, explained receipts)."""
    return [
        "--rounds",
        "1",
        "--out",
        "camp",
        "--set",
        f"benchmark.out={bench_dir}",
        "--set",
        "benchmark.per_family=6",
        "--set",
        f"campaign.start={start}",
        "--set",
        "campaign.seeds=2",
        "--set",
        "gate.n_boot=1000",
        *EXPLAINED,
        *extra,
    ]


def child_env(home: Path, api: str, **env) -> dict:
    """A `ratchet` process of its own: its own Prefect home and task cache and MLflow store, the session's server."""
    return {
        **os.environ,
        "PREFECT_API_URL": api,
        "RATCHET_HOME": str(home),
        "PREFECT_HOME": str(home / "prefect"),
        "PREFECT_LOCAL_STORAGE_PATH": str(home / "prefect" / "storage"),
        "MLFLOW_TRACKING_URI": f"sqlite:///{home / 'mlflow.db'}",
        **env,
    }


# What `campaign run/resume` and `worker` import lazily (the flows, the data contract, the MLflow store, the worlds,
# then what a run imports on its way: ~0.5 CPU-s a command, `python -X importtime`): imported once by the zygote
# (tests/zygote.py), which forks a real process per `ratchet` command.
PRELOAD = [
    "flows.campaign",
    "flows.schedule",
    "great_expectations",
    "mlflow.store.tracking.sqlalchemy_store",
    "components.worlds.retail",
    "components.worlds.airline",
    "git",
    "prefect.flow_engine",
    "prefect.task_engine",
    "prefect.utilities.visualization",
    "anyio.streams.tls",
    "anyio._core._sockets",
    "alembic.command",
    "mlflow.store.tracking.sqlalchemy_workspace_store",
    "mlflow.tracing.processor.base_mlflow",
    "pyarrow.vendored.version",
    "components.models.simulated",
    "components.worlds.retail.env",
    "components.worlds.airline.env",
]


class Ratchet:
    """`ratchet(cwd, *args)`: `ratchet <args>` run in `cwd` as a child process with its own home `cwd/home` (its own
    Prefect home and task cache and MLflow store, the session's server; see tests/zygote.py); returns a
    CompletedProcess (returncode -9 when a failpoint killed it). `start(cwd, *args)`: the same in the background."""

    def __init__(self, api: str, mlflow_db: Path, where: Path):
        self.api, self.mlflow_db = api, mlflow_db
        self.zygote = Zygote(where, {**os.environ, "PREFECT_API_URL": api}, PRELOAD)

    def _env(self, cwd: Path, env: dict) -> dict:
        home = Path(cwd) / "home"
        home.mkdir(parents=True, exist_ok=True)
        if not (home / "mlflow.db").exists():
            shutil.copyfile(self.mlflow_db, home / "mlflow.db")  # an empty store, migrated once per module
        return {**child_env(home, self.api), **env}

    def __call__(self, cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
        return self.zygote(cwd, args, self._env(cwd, env))

    def start(self, cwd: Path, *args: str, **env: str) -> int:
        return self.zygote.start(cwd, args, self._env(cwd, env))

    def close(self) -> None:
        self.zygote.close()


@pytest.fixture(scope="module")
def mlflow_db(tmp_path_factory) -> Path:
    """An empty MLflow store (creating one runs its migrations, ~2.5 CPU-s), copied into every child's home."""
    from mlflow import MlflowClient

    db = tmp_path_factory.mktemp("mlflow") / "mlflow.db"
    MlflowClient(tracking_uri=f"sqlite:///{db}").search_experiments()
    return db


@pytest.fixture(scope="module")
def ratchet(prefect_server, mlflow_db, tmp_path_factory):
    r = Ratchet(prefect_server, mlflow_db, tmp_path_factory.mktemp("zygote"))
    yield r
    r.close()


def own_cache(home: Path) -> None:
    """The command's Prefect results went to its own home (a shared cache would hide work: spent, kills): its
    evaluations, not only what `contract_verdict` put there."""
    assert any(f.name.startswith("eval_shard-") for f in (home / "prefect" / "storage").iterdir())


def contract_verdict(clean: Path, cwd: Path) -> None:
    """The benchmark's data-contract verdict that crash_setup's clean run cached, copied into the task cache of the
    command about to run in `cwd`: the same bytes get the same verdict (flows/tasks.py), so that command does not
    validate the benchmark again (~1 CPU-s of great-expectations per process). Nothing else is shared: the contract
    is no stage and costs no budget, and every stage and evaluation still runs in the command's own cache."""
    storage = Path(cwd) / "home" / "prefect" / "storage"
    storage.mkdir(parents=True, exist_ok=True)
    verdicts = list((clean / "home" / "prefect" / "storage").glob("benchmark_contract-*"))
    assert len(verdicts) == 1, verdicts
    shutil.copyfile(verdicts[0], storage / verdicts[0].name)


@pytest.fixture(scope="module")
def crash_setup(ratchet, tmp_path_factory):
    """A small benchmark (6 tasks per family: the smallest on which the first round of this start package commits),
    and a start package whose first round commits (the ledger fixes already in place)."""
    from components.params import BenchmarkParams

    root = tmp_path_factory.mktemp("crash")
    bench = BenchmarkParams(out=str(root / "bench"), per_family=6, receipts="explained")  # a refusal that commits
    bench.materialize()
    start = root / "start"
    shutil.copytree(PACKAGES / "seed", start)
    manifest = start / "manifest.yaml"
    manifest.write_text(
        manifest.read_text().replace("max_entries: 2", "max_entries: 6").replace("bind_on: []", "bind_on: [order_id]")
    )
    clean = root / "clean"
    r = ratchet(clean, "campaign", "run", *small(bench.out, start=start))
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads((clean / "camp" / "summary.json").read_text())["accepted"] == 1, (
        "the test needs a round that commits"
    )
    own_cache(clean / "home")
    return bench.out, start, clean


def test_kill_at_every_stage_boundary_then_resume_gives_the_clean_result(ratchet, crash_setup, tmp_path):
    """SIGKILL after each stage of a round in turn; each resume continues from the kill and is killed at the next
    boundary; the last resume finishes. The lineage and the summary (budget spent included) equal a clean run's."""
    bench, start, clean = crash_setup
    contract_verdict(clean, tmp_path)
    first = ratchet(tmp_path, "campaign", "run", *small(bench, start=start), RATCHET_FAILPOINT=f"round1:{STAGES[0]}")
    assert first.returncode == -signal.SIGKILL, first.stderr[-2000:]
    for i, stage in enumerate(STAGES):
        state = json.loads((tmp_path / "camp" / ".state" / "state.json").read_text())
        assert (state["round"], state["stage"]) == (1, stage)
        nxt = {"RATCHET_FAILPOINT": f"round1:{STAGES[i + 1]}"} if i + 1 < len(STAGES) else {}
        resumed = ratchet(tmp_path, "campaign", "resume", "--out", "camp", **nxt)
        assert resumed.returncode == (-signal.SIGKILL if nxt else 0), (stage, resumed.stderr[-3000:])
    own_cache(tmp_path / "home")
    for name in ("lineage/lineage.jsonl", "summary.json"):  # byte for byte
        assert (tmp_path / "camp" / name).read_bytes() == (clean / "camp" / name).read_bytes(), name
    spent = [json.loads((d / "camp" / ".state" / "budget.json").read_text())["spent"] for d in (tmp_path, clean)]
    assert spent[0] == spent[1] and spent[0]["model_calls"] > 0  # no work paid for twice across the kills
    versions = tmp_path / "camp" / "lineage" / "versions"
    assert sorted(p.name for p in versions.iterdir()) == ["M0", "M1"]  # no duplicate, no half-written version
    for v in Lineage(tmp_path / "camp" / "lineage").versions():
        assert digest(v.path) == v.digest


def test_a_second_campaign_on_the_same_lineage_fails_at_once(
    prefect_server, tmp_path, crash_setup, capsys, monkeypatch
):
    """In this process: the lock is an OS file lock (flock), which a second open of the file conflicts with in the
    same process as in another one (the stale-lock test below kills a real holder)."""
    monkeypatch.chdir(tmp_path)
    with LineageLock(tmp_path / "camp" / "lineage"):
        t = time.monotonic()
        code, _, err = run_cli(capsys, "campaign", "run", *small(crash_setup[0]))
        assert code == 2 and time.monotonic() - t < 120
        assert "locked by another campaign" in err and f'"pid": {os.getpid()}' in err
        with pytest.raises(LineageLocked):
            LineageLock(tmp_path / "camp" / "lineage").__enter__()


def test_a_stale_lock_from_a_dead_process_is_recovered(tmp_path):
    code = (
        "import os, signal, sys; sys.path.insert(0, %r)\n"
        "from components.evolution.lineage import LineageLock\n"
        "LineageLock(%r).__enter__(); os.kill(os.getpid(), signal.SIGKILL)\n"
    ) % (str(ROOT), str(tmp_path / "lin"))
    dead = subprocess.run([sys.executable, "-c", code])
    assert dead.returncode == -signal.SIGKILL
    with LineageLock(tmp_path / "lin") as lock:
        assert lock.recovered and lock.recovered["pid"] != os.getpid()


def test_a_budget_too_small_stops_the_campaign_cleanly(ratchet, tmp_path, crash_setup):
    """A ceiling that cannot pay for three rounds and the certification: the campaign stops between stages with
    exit 0, never spends past the ceiling, names what stopped it, and leaves records that agree with each other."""
    bench, start, clean = crash_setup
    contract_verdict(clean, tmp_path)
    # shards of 10 items: CAP is sized so that some shards are paid before the stop (auto shards are coarser)
    r = ratchet(
        tmp_path,
        "campaign",
        "run",
        *small(
            bench,
            "--set",
            f"budget.model_calls={CAP}",
            "--set",
            "campaign.rounds=3",
            "--set",
            "campaign.shard_size=10",
            start=start,
        ),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    own_cache(tmp_path / "home")
    out = tmp_path / "camp"
    s = json.loads((out / "summary.json").read_text())
    m = re.fullmatch(r"(round (\d+)|certification): budget: cannot admit: model_calls (\S+) > (\S+) left", s["stopped"])
    assert m, s["stopped"]
    assert float(m.group(3)) > float(m.group(4))  # refused because the reservation did not fit what was left
    assert f"stopped: {s['stopped']}" in r.stderr
    spent = json.loads((out / ".state" / "budget.json").read_text())
    assert spent["open_holds"] == 0 and s["budget"]["caps"] == {"model_calls": CAP}
    assert 0 < spent["spent"]["model_calls"] <= CAP
    # what the recorded evidence cost was paid for; what the stopped stage had consumed was paid for too
    # (the reply store answers repeated requests unpaid: what it answered counts as used, not paid)
    assert s["budget"]["evidence_cost"]["model_calls"] <= spent["spent"]["model_calls"] + (
        spent.get("reply_store") or {}
    ).get("model_calls", 0)
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
    from components.models.server import FAULTS, TRANSIENT
    from components.params import BenchmarkParams
    from flows.campaign import run_campaign

    url, app = faulty_server
    bench = BenchmarkParams(out=str(tmp_path / "bench"), per_family=3, receipts="explained")  # the smallest
    bench.materialize()
    p = load_params(
        ROOT / "params.yaml",
        {
            "benchmark.out": bench.out,
            "benchmark.per_family": 3,
            "benchmark.receipts": "explained",
            "campaign.out": str(tmp_path / "camp"),
            "campaign.rounds": 1,
            "campaign.seeds": 1,
            "campaign.model": "openai",
            "gate.n_boot": 1000,
            "campaign.shard_size": 3,  # a shard on each of the two workers: their timeouts overlap
            "campaign.model_cfg": {"base_url": url, "timeout": 0.3, "backoff": 0.01, "max_retries": 4},
        },
    )
    s = run_campaign(p)  # completes
    faults = app.state.faults
    transient = sum(f in TRANSIENT for f in faults)
    assert transient > 0 and len(faults) > transient  # both kinds were injected
    assert set(faults) == {kind for kind, _ in FAULTS}  # and every fault there is
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
        retry = next((x for x in seen[i + 1 :] if x[0] == h), None)
        assert retry is not None and retry[1] == attempt + 1 and retry[2] is None, (seen[i], retry)
        assert retry[3] - at < 5.0, "a replay by a later evaluation, not a retry"


@pytest.fixture
def dask_forkserver():
    """Dask's worker processes forked from one server that imported Dask and the evaluation code once, instead of
    each spawned interpreter importing them (~3 CPU-s a worker): still processes of their own, sent pickled shards.
    A fork server is single-threaded, so forking it is safe where forking pytest is not (as in tests/test_budget.py).
    The process's one fork server is stopped before and after, so no other test forks from this one's preload."""
    import multiprocessing
    import multiprocessing.forkserver

    import dask
    from distributed.utils import get_mp_context

    multiprocessing.forkserver._forkserver._stop()
    with dask.config.set({"distributed.worker.multiprocessing-method": "forkserver"}):
        get_mp_context()  # Dask sets its own preload the first time: ours replaces it, not the other way round
        multiprocessing.get_context("forkserver").set_forkserver_preload(["distributed", "flows.evaluate"])
        try:
            yield
        finally:
            multiprocessing.forkserver._forkserver._stop()


def test_dask_gives_the_same_scores_as_threads(prefect_server, bench_dir, dask_forkserver):
    from distributed import LocalCluster
    from prefect.settings import PREFECT_TASKS_REFRESH_CACHE, temporary_settings

    from flows.evaluate import evaluate, task_runner

    items = sorted(json.loads((bench_dir / "splits.json").read_text())["dev"])[:6]  # a shard for each worker
    args = (str(PACKAGES / "reference"), str(bench_dir), [0, 1])
    # each run computes its shards: from the task cache (same key: the label is not in it), the Dask run would
    # return the threads run's tables without running an episode, and compare a table with itself
    with temporary_settings({PREFECT_TASKS_REFRESH_CACHE: True}):
        threads = evaluate.with_options(task_runner=task_runner("threads", 2))(*args, items=items, shard_size=3)
        with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
            dask = evaluate.with_options(task_runner=task_runner("dask", 2, cluster.scheduler_address))(
                *args, items=items, shard_size=3, label="dask"
            )
    assert dask.scores.to_csv(index=False) == threads.scores.to_csv(index=False)
    assert list(dask.traces["hash"]) == list(threads.traces["hash"])


def test_a_scheduled_deployment_runs_through_the_worker(
    prefect_server, tmp_path, capsys, monkeypatch, mlflow_db, ratchet, crash_setup
):
    """`campaign schedule` registers a deployment, a real `ratchet worker` process serves it (the run in its own
    subprocess), and `campaign runs` lists it. schedule and runs are run in this process: they only talk to the
    server, which a subprocess would reach the same way.

    What is scheduled is any campaign: crash_setup's, with a copy of its task cache in the worker's home, so the run
    the worker starts replays the round and the certification from the cache. Prefect 3.9.1 starts that run as a
    fresh `python -m prefect.engine` interpreter (the runner's command is not configurable), which then imports
    Prefect, the flows and MLflow, but neither great-expectations (every data contract's verdict is cached) nor
    anything an episode needs: scheduling is what this test is about, not the campaign's work."""
    from prefect.deployments import run_deployment

    bench, start, clean = crash_setup
    home = tmp_path / "home"
    shutil.copytree(clean / "home" / "prefect" / "storage", home / "prefect" / "storage")
    shutil.copyfile(mlflow_db, home / "mlflow.db")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RATCHET_HOME", str(home))  # where `schedule` records what `worker` serves
    over = ["--set", "campaign.rounds=1", "--set", f"campaign.out={tmp_path / 'camp'}", *small(bench, start=start)[4:]]
    code, _, err = run_cli(capsys, "campaign", "schedule", "--cron", "0 3 * * *", "--name", "nightly-test", *over)
    assert code == 0, err[-2000:]
    # a real `ratchet worker` process (forked by the zygote: its imports are done), polling for runs every second
    worker = ratchet.start(tmp_path, "worker", PREFECT_RUNNER_POLL_FREQUENCY="1")
    try:
        try:
            run = run_deployment("campaign/nightly-test", timeout=600, poll_interval=0.5)
        finally:
            os.kill(worker, signal.SIGINT)  # it shuts down (seconds) while this process checks what it did
        assert run.state.is_completed(), run.state
        # the campaign the worker ran is crash_setup's campaign, whole
        summary = json.loads((tmp_path / "camp" / "summary.json").read_text())
        assert summary["accepted"] == 1 and summary["test"] is not None
        assert (tmp_path / "camp" / "lineage" / "lineage.jsonl").read_bytes() == (
            clean / "camp" / "lineage" / "lineage.jsonl"
        ).read_bytes()
        code, out, err = run_cli(capsys, "campaign", "runs")
        assert code == 0, err[-2000:]
        assert "nightly-test" in out and "Completed" in out, out
        import asyncio

        from prefect.client.orchestration import get_client

        async def schedules():
            async with get_client() as client:
                dep = await client.read_deployment_by_name("campaign/nightly-test")
                return [s.schedule.cron for s in dep.schedules]

        # the schedule is registered (a persistent server fires it)
        assert asyncio.run(schedules()) == ["0 3 * * *"]
    finally:
        ratchet.zygote.wait(worker, timeout=30)  # SIGKILLed if it has not stopped by then


def test_with_a_configured_server_the_temporary_one_is_not_tied_nor_imported(monkeypatch):
    """Against a configured server (the CLI with PREFECT_API_URL, a worker), Prefect starts no temporary server, so
    `tie_temporary_server_to_this_process` neither patches it nor imports its code (half of a campaign's imports)."""
    import prefect.server.api
    from prefect.server.api import server as server_module
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.prefect_setup import tie_temporary_server_to_this_process

    cls = server_module.SubprocessASGIServer
    monkeypatch.delattr(cls, "_ratchet_tied", raising=False)
    monkeypatch.setattr(cls, "_run_uvicorn_command", cls._run_uvicorn_command)  # restored after the test
    with monkeypatch.context() as m, temporary_settings({PREFECT_API_URL: "http://127.0.0.1:9/api"}):
        m.delattr(prefect.server.api, "server")
        m.setitem(sys.modules, "prefect.server.api.server", None)  # importing it now raises ImportError
        tie_temporary_server_to_this_process()
    assert not getattr(cls, "_ratchet_tied", False)
    with temporary_settings(restore_defaults={PREFECT_API_URL}):
        tie_temporary_server_to_this_process()  # no server configured: Prefect would start one, tied to us
    assert getattr(cls, "_ratchet_tied", False)
