"""A campaign that promotes, its shards on threads and on 1, 2 and 4 Dask worker processes in another directory:
episodes per second of wall per configuration, and the lineage (every version's digest) and test certification,
which must be identical.

    python benchmarks/bench_campaign_scaleout.py [--quick] [--workers 1,2,4] [--per-family 6] [--rounds 2]

One Prefect server for all (`ratchet server`, started here unless PREFECT_API_URL names one). Each configuration runs
`ratchet campaign run` in a fresh process with its own $RATCHET_HOME (no task cache, reply store or MLflow store
shared) on one benchmark materialized first. The Dask workers are `dask worker` processes (one thread each) started in
a directory of their own with their own Prefect home and result storage and no PYTHONPATH, as on another machine
sharing only the paths they are given, and connected to a scheduler this script runs; they are stopped after their
configuration. `campaign.shard_size` is small (2 items) so that a look is several tasks for the workers to share.
Throughput counts the campaign's wall from start to summary, its fixed costs included (imports, the flow runs, the
records), which do not shrink with workers. `--quick`: 1 round, per_family 3, workers 1 only.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_fixed_cost import ratchet, start_server  # noqa: E402


def run_campaign(env: dict, tmp: Path, tag: str, bench: Path, rounds: int, runner: list[str], per_family: int) -> dict:
    out = tmp / f"camp-{tag}"
    args = [
        "campaign",
        "run",
        "--set",
        f"campaign.rounds={rounds}",
        "--set",
        f"benchmark.out={bench}",
        "--set",
        f"benchmark.per_family={per_family}",  # what made it (an existing benchmark must match)
        "--set",
        f"campaign.out={out}",
        "--set",
        f"evidence.db={tmp / f'evidence-{tag}.sqlite'}",
        "--set",
        "campaign.shard_size=2",
        "--set",
        "campaign.traces_per_round=0",
        *runner,
    ]
    env = {**env, "RATCHET_HOME": str(tmp / f"home-{tag}")}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    p = subprocess.run(ratchet() + args, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        raise SystemExit(f"campaign {tag} exited {p.returncode}: {p.stderr[-3000:]}")
    s = json.loads((out / "summary.json").read_text())
    return {
        "tag": tag,
        "wall": wall,
        "cpu": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
        "episodes": s["episodes"]["total"],
        "accepted": s["accepted"],
        "lineage": [v["digest"] for v in s["lineage"]],
        "test": s["test"],
    }


def dask_workers(address: str, n: int, where: Path, api_url: str) -> subprocess.Popen:
    where.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith(("RATCHET_", "MLFLOW_"))}
    env.update(
        PREFECT_API_URL=api_url, PREFECT_HOME=str(where / "prefect"), PREFECT_LOCAL_STORAGE_PATH=str(where / "storage")
    )
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "distributed.cli.dask_worker",
            address,
            "--nworkers",
            str(n),
            "--nthreads",
            "1",
            "--no-dashboard",
        ],
        cwd=where,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=(where / "worker.log").open("wb"),
        start_new_session=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="1 round, per_family 3, workers 1 (what a test runs)")
    ap.add_argument("--workers", default=None, help="Dask worker counts (default 1,2,4)")
    ap.add_argument("--per-family", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=None)
    a = ap.parse_args()
    counts = [int(x) for x in (a.workers or ("1" if a.quick else "1,2,4")).split(",")]
    per_family, rounds = a.per_family or (3 if a.quick else 6), a.rounds or (1 if a.quick else 2)
    from distributed import Client, LocalCluster

    with tempfile.TemporaryDirectory(prefix="ratchet-camp-scaleout-") as t:
        tmp = Path(t)
        env = {**os.environ}
        env.pop("DVC_ROOT", None)
        server = None
        if not env.get("PREFECT_API_URL"):
            server, env["PREFECT_API_URL"] = start_server(
                {**env, "RATCHET_HOME": str(tmp / "server-home")}, tmp / "server.log"
            )
        bench = tmp / "bench"
        rows = []
        try:
            m = subprocess.run(
                ratchet()
                + [
                    "bench",
                    "materialize",
                    "--world",
                    "retail",
                    "--out",
                    str(bench),
                    "--seed",
                    "0",
                    "--per-family",
                    str(per_family),
                ],
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
            )
            if m.returncode != 0:
                raise SystemExit(f"materialize exited {m.returncode}: {m.stderr[-2000:]}")
            rows.append(
                run_campaign(
                    env,
                    tmp,
                    "threads x2",
                    bench,
                    rounds,
                    ["--set", "campaign.task_runner=threads", "--set", "campaign.workers=2"],
                    per_family,
                )
            )
            for n in counts:
                with LocalCluster(n_workers=0, processes=True, dashboard_address=None) as cluster:
                    proc = dask_workers(cluster.scheduler_address, n, tmp / f"elsewhere-{n}", env["PREFECT_API_URL"])
                    try:
                        with Client(cluster.scheduler_address) as client:
                            client.wait_for_workers(n, timeout=600)
                        rows.append(
                            run_campaign(
                                env,
                                tmp,
                                f"dask x{n}",
                                bench,
                                rounds,
                                [
                                    "--set",
                                    "campaign.task_runner=dask",
                                    "--set",
                                    f"campaign.workers={n}",
                                    "--set",
                                    f"campaign.dask_address={cluster.scheduler_address}",
                                ],
                                per_family,
                            )
                        )
                    finally:
                        os.killpg(proc.pid, signal.SIGTERM)  # the worker processes started here
                        proc.wait(timeout=120)
        finally:
            if server is not None:
                os.killpg(server.pid, signal.SIGTERM)
                server.wait(timeout=60)
    same = all(r["lineage"] == rows[0]["lineage"] and r["test"] == rows[0]["test"] for r in rows)
    print(
        f"campaign of {rounds} round(s) on retail per_family {per_family}, shards of 2 items, one shared server "
        f"(load {os.getloadavg()[0]:.1f}); Dask workers in another directory"
    )
    print(f"{'runner':<11} {'episodes':>8} {'wall s':>8} {'episodes/s':>11} {'campaign CPU s':>15} {'promotions':>10}")
    for r in rows:
        print(
            f"{r['tag']:<11} {r['episodes']:>8} {r['wall']:>8.1f} {r['episodes'] / r['wall']:>11.2f} "
            f"{r['cpu']:>15.1f} {r['accepted']:>10}"
        )
    print(
        f"lineage and test certification identical across runners: {same} "
        f"({len(rows[0]['lineage'])} versions, test net {rows[0]['test'].get('net', 0):+.3f})"
    )
    if not same:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
