"""Many campaigns, workers elsewhere (issue 29): every path a task receives is absolute, resolved once at the flow's
door; a worker in another directory gets identical results; a ledger that is not the campaign's is an error, never a
clean budget stop."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import PACKAGES


def test_the_door_makes_every_task_path_absolute_and_records_them_as_given(tmp_path, monkeypatch):
    from components.params import load_params, recorded_path
    from flows.campaign import budget_spec

    monkeypatch.chdir(tmp_path)
    given = load_params(
        None,
        {
            "benchmark.out": "bench",
            "campaign.out": "runs/c",
            "campaign.start": "pkgs/seed",
            "evidence.db": "ev/evidence.db",
            "campaign.tracking_uri": "sqlite:///ml/mlflow.db",
        },
    )
    p = given.resolved()
    assert p.benchmark.out == str(tmp_path / "bench") and p.campaign.out == str(tmp_path / "runs/c")
    assert p.campaign.start == str(tmp_path / "pkgs/seed") and p.evidence.db == str(tmp_path / "ev/evidence.db")
    assert p.campaign.tracking_uri == f"sqlite:///{tmp_path / 'ml/mlflow.db'}"
    spec = budget_spec(p)
    assert spec.call_cache is not None and all(Path(x).is_absolute() for x in (spec.db, spec.call_cache))
    assert p.resolved() == p  # idempotent: a subflow resolving again changes nothing
    assert p.recorded() == given  # records show the paths as given (inside the working directory: relative)
    assert recorded_path(str(tmp_path.parent / "x")) == str(tmp_path.parent / "x")  # outside it: absolute
    # a URL is not a path
    urls = load_params(None, {"evidence.db": "postgresql+psycopg://h/db", "campaign.tracking_uri": "http://h:5000"})
    assert urls.resolved().evidence.db == "postgresql+psycopg://h/db"
    assert urls.resolved().campaign.tracking_uri == "http://h:5000"


def test_a_ledger_without_the_campaign_wallet_is_an_error_not_a_budget_stop(tmp_path):
    """What a shard saw when it opened a ledger relative to its own directory: before, a BudgetExceeded, which the
    campaign took for a clean stop (0 rounds, exit 0)."""
    from components.errors import StorageError
    from components.evidence.budget import BudgetExceeded, BudgetLedger

    ledger = BudgetLedger(tmp_path / "budget.sqlite")
    with pytest.raises(StorageError) as e:
        ledger.reserve("default", {"model_calls": 1.0})
    assert not isinstance(e.value, BudgetExceeded) and e.value.filename == str(tmp_path / "budget.sqlite")
    assert "wallet 'default' does not exist" in e.value.strerror


@pytest.fixture
def worker_elsewhere(prefect_server, tmp_path):
    """A Dask scheduler, and one worker process in a directory of its own with its own Prefect home and result
    storage (as on another machine sharing only the filesystem paths it is given) and no PYTHONPATH: the installed
    package only."""
    from distributed import Client, LocalCluster

    where = tmp_path / "elsewhere"
    where.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith(("RATCHET_", "MLFLOW_"))}
    env.update(
        PREFECT_API_URL=prefect_server,
        PREFECT_HOME=str(where / "prefect"),
        PREFECT_LOCAL_STORAGE_PATH=str(where / "storage"),
    )
    with LocalCluster(n_workers=0, processes=True, dashboard_address=None) as cluster:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "distributed.cli.dask_worker",
                cluster.scheduler_address,
                "--nworkers",
                "1",
                "--nthreads",
                "1",
                "--no-dashboard",
            ],
            cwd=where,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=open(tmp_path / "worker.log", "wb"),
        )
        try:
            with Client(cluster.scheduler_address) as client:
                client.wait_for_workers(1, timeout=180)
            yield cluster, where
        finally:
            proc.terminate()
            proc.wait(timeout=60)


def test_a_worker_in_another_directory_gives_identical_results(worker_elsewhere, tmp_path, monkeypatch):
    """A campaign given relative paths, its shards run by a worker in another directory: the same certification
    (scores, CI) as the same campaign on threads in this process, and nothing written where the worker runs."""
    from components.params import load_params
    from components.worlds import world
    from flows.campaign import run_campaign

    cluster, where = worker_elsewhere
    address = cluster.scheduler_address
    project = tmp_path / "project"
    project.mkdir()
    monkeypatch.chdir(project)
    world("retail").materialize(project / "bench", 0, 3)
    common = {
        "benchmark.out": "bench",
        "benchmark.receipts": "explained",
        "benchmark.per_family": 3,
        "campaign.start": str(PACKAGES / "reference"),
        "campaign.rounds": 0,
        "campaign.seeds": 2,
        "campaign.shard_size": 2,
        "gate.n_boot": 1000,
        "evidence.db": "evidence.db",
    }
    threads = run_campaign(load_params(None, {**common, "campaign.out": "threads"}))
    dask = run_campaign(
        load_params(
            None, {**common, "campaign.out": "dask", "campaign.task_runner": "dask", "campaign.dask_address": address}
        )
    )
    assert dask["stopped"] is None and dask["test"] is not None, dask["stopped"]
    assert dask["test"] == threads["test"]
    assert (project / "dask/test_evals.json").read_bytes() == (project / "threads/test_evals.json").read_bytes()
    # the shards ran on the worker (the cluster has no other), which wrote no file in its own directory outside its
    # Prefect home: no ledger, benchmark or output resolved against it
    assert cluster.scheduler.task_prefixes, "no task ran on the Dask worker"
    written = [f for f in where.rglob("*") if f.is_file() and f.relative_to(where).parts[0] != "prefect"]
    assert not written, written
    recorded = json.loads((project / "dask/summary.json").read_text())["params"]
    assert recorded["benchmark"]["out"] == "bench" and recorded["campaign"]["out"] == "dask"  # as given


def test_a_finished_unchanged_campaign_is_recognized_and_any_change_runs_it(small_campaign):
    """A finished campaign that nothing has changed since is recognized (flows/finished.py: `ratchet campaign run`
    then prints its summary without Prefect, MLflow or pandas); one more round, or another trace count, runs it."""
    from flows.finished import unchanged

    p = small_campaign.params.resolved()
    assert unchanged(p) == {
        "budget_spent": small_campaign.summary["budget_spent"],
        "mlflow": small_campaign.summary["mlflow"],
    }
    for change in ({"rounds": p.campaign.rounds + 1}, {"traces_per_round": p.campaign.traces_per_round + 1}):
        assert unchanged(p.model_copy(update={"campaign": p.campaign.model_copy(update=change)})) is None, change


def test_dask_workers_that_outlive_the_campaign_need_a_server_that_does(tmp_path, bench_dir):
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from components.errors import InputError
    from components.params import load_params
    from flows.campaign import prepare

    p = load_params(
        None,
        {
            "benchmark.out": str(bench_dir),
            "campaign.out": str(tmp_path / "c"),
            "campaign.task_runner": "dask",
            "campaign.dask_address": "tcp://127.0.0.1:8786",
        },
    )
    with temporary_settings(restore_defaults={PREFECT_API_URL}), pytest.raises(InputError, match="ratchet server"):
        prepare(p)


def test_a_running_ratchet_server_is_used_by_every_command_of_its_home(tmp_path, monkeypatch):
    from components.env import SERVER_NOTE, quiet_offline, running_server

    import socket

    note = tmp_path / SERVER_NOTE
    with socket.socket() as listening:  # the server's port answers
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        url = f"http://127.0.0.1:{listening.getsockname()[1]}/api"
        note.write_text(json.dumps({"url": url, "pid": os.getpid()}))
        assert running_server(tmp_path) == url
        monkeypatch.delenv("PREFECT_API_URL", raising=False)
        quiet_offline(tmp_path)
        assert os.environ["PREFECT_API_URL"] == url
    # its process lives but its port no longer answers (the server under it died): a stale note, no server; every
    # command used it and failed (httpx.ConnectError, RuntimeError)
    assert running_server(tmp_path) is None
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    quiet_offline(tmp_path)
    assert "PREFECT_API_URL" not in os.environ
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    note.write_text(json.dumps({"url": url, "pid": int(gone.stdout)}))
    assert running_server(tmp_path) is None  # its process is gone: a temporary server, as without a note
    note.write_text("{")
    assert running_server(tmp_path) is None


def test_campaigns_of_one_identity_in_two_directories_have_two_registered_models():
    """Issue 29 part 6: the same identity with another `campaign.out` used to share `ratchet-<name>-<identity>`, so
    each campaign added versions to the other's model and moved its @champion."""
    from components.params import load_params
    from components.tracking.mlflow_log import tracking_names

    def summary(out: str) -> dict:
        params = load_params(None, {"campaign.out": out}).recorded().model_dump()
        return {"campaign": "default", "params": params, "start_digest": "s" * 64, "benchmark_digest": "b" * 64}

    a, b, a_again = (
        tracking_names(summary("runs/a")),
        tracking_names(summary("runs/b")),
        tracking_names(summary("runs/a")),
    )
    assert a["identity"] == b["identity"] and a["experiment"] == b["experiment"]  # one identity: one experiment
    assert a["registered_model"] != b["registered_model"]  # ... but each campaign its own model and @champion
    assert a == a_again and a["registered_model"].startswith(f"ratchet-default-{a['identity']}-")


def test_bench_fixed_cost_quick_fits_three_campaigns_on_one_server(prefect_server):
    """benchmarks/bench_fixed_cost.py at its quick size, against the run's server: three one-round campaigns, each
    summarized, and a fit whose line names the sizes (no timing is asserted: CPU-seconds belong to the benchmark)."""
    import re

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PREFECT_API_URL": prefect_server}
    p = subprocess.run(
        [sys.executable, "benchmarks/bench_fixed_cost.py", "--quick"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    lines = p.stdout.strip().splitlines()
    rows = [ln.split() for ln in lines if re.match(r"r1-f[345] ", ln)]
    assert [r[0] for r in rows] == ["r1-f3", "r1-f4", "r1-f5"], p.stdout
    episodes = [int(r[3]) for r in rows]
    assert min(episodes) > 0 and episodes[0] < episodes[2]  # a bigger benchmark runs more episodes
    assert re.fullmatch(
        r"fixed cost per campaign: -?[0-9.]+ CPU-s \+ -?[0-9.]+ ms per episode \(fit over 3 sizes\)", lines[-1]
    ), p.stdout


def test_bench_campaign_scaleout_quick_gives_one_lineage_on_threads_and_dask(prefect_server):
    """benchmarks/bench_campaign_scaleout.py at its quick size, against the run's server: the same campaign on threads
    and on a Dask worker in another directory, each a fresh `ratchet campaign run`; the script itself compares the
    lineage (every version's digest) and the test certification. The quick campaign promotes, so the lineage compared
    holds a version the round made, not only the start. No timing is asserted (throughput belongs to the benchmark)."""
    import re

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PREFECT_API_URL": prefect_server}
    p = subprocess.run(
        [sys.executable, "benchmarks/bench_campaign_scaleout.py", "--quick"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    lines = p.stdout.strip().splitlines()
    rows = {" ".join(ln.split()[:2]): ln.split()[2:] for ln in lines if re.match(r"(threads|dask) x\d+ ", ln)}
    assert list(rows) == ["threads x2", "dask x1"], p.stdout
    assert len({r[0] for r in rows.values()}) == 1 and int(rows["dask x1"][0]) > 0  # the same episodes, some
    assert all(int(r[-1]) >= 1 for r in rows.values()), p.stdout  # promotions: the lineage has a child version
    m = re.fullmatch(
        r"lineage and test certification identical across runners: (\w+) \((\d+) versions, .*\)", lines[-1]
    )
    assert m and m.group(1) == "True" and int(m.group(2)) >= 2, p.stdout


@pytest.mark.parametrize(
    "n_items,seeds,workers,want",
    [
        (60, 3, 2, 15),  # dev of the default campaign: two tasks per worker
        (60, 3, 4, 10),  # four workers: 8 items would be 24 episodes, under the 30-episode floor
        (180, 3, 4, 23),
        (12, 3, 2, 10),  # a small look: one or two tasks
        (4, 1, 2, 30),  # the floor in episodes: one seed, 30 items a task
        (1, 3, 8, 10),
    ],
)
def test_auto_shards_are_two_per_worker_with_a_floor(n_items, seeds, workers, want):
    import math

    from flows.evaluate import AUTO_MIN_EPISODES, auto_shard

    got = auto_shard(n_items, seeds, workers)
    assert got == want
    assert got * seeds >= AUTO_MIN_EPISODES  # no task is mostly Prefect bookkeeping
    if n_items >= 2 * workers * got:  # a big look keeps every worker in work until the end
        assert math.ceil(n_items / got) >= 2 * workers


def test_shard_size_null_is_a_valid_param_and_changes_no_identity():
    from components.params import load_params

    auto, fixed = load_params(None, {"campaign.shard_size": None}), load_params(None, {"campaign.shard_size": 7})
    assert auto.campaign.shard_size is None and auto.identity() == fixed.identity()
