"""Evaluation throughput on Prefect's task runners: threads, and Dask with 1 and 2 worker processes.

    python benchmarks/bench_scaleout.py [--split dev] [--seeds 3] [--shard-size 15] [--quick]

One Prefect server and one run: each configuration evaluates the same shards with the task cache bypassed (a fresh
result store per configuration), timed inside the flow run, and the scores are checked to be identical across runners. The simulated agent is
CPU-bound Python, so threads share one core (the GIL) while Dask worker processes use one core each. The last line is the headline: Dask x2 over Dask x1 throughput. `--quick` (the test's
size): a small benchmark, one seed, threads x2 and Dask x1 only (the same runner and cluster code with one worker
process to start instead of two; at that size a worker's first imports, inside the timed flow, are most of its time,
which its last line says)."""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from components.env import quiet_offline  # noqa: E402

HOME = Path(tempfile.mkdtemp(prefix="ratchet-scaleout-"))
quiet_offline(HOME)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--split", default="dev")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--shard-size", type=int, default=15)
    ap.add_argument("--quick", action="store_true", help="a small benchmark, one seed, threads x2 and dask x1")
    a = ap.parse_args(argv)

    from distributed import LocalCluster
    from prefect.settings import PREFECT_LOCAL_STORAGE_PATH, temporary_settings

    from prefect import flow

    from components.worlds import load_benchmark, world
    from flows.evaluate import submit_eval, task_runner

    @flow(name="scaleout", validate_parameters=False)
    def measure(bench: str, ids: list[str], seeds: list[int], shard_size: int):
        """Time the shards themselves (inside one flow run), not the flow run's start and stop."""
        t = time.perf_counter()
        tables = submit_eval(str(ROOT / "data/packages/reference"), bench, seeds, items=ids, shard_size=shard_size)
        return time.perf_counter() - t, tables

    bench = HOME / "bench"
    world("retail").materialize(bench, 0, 3 if a.quick else None)
    ids = load_benchmark(bench).ids(a.split)
    seeds = [0] if a.quick else list(range(a.seeds))
    configs = (("threads x2", 2), ("dask x1", 1)) if a.quick else (("threads x2", 2), ("dask x1", 1), ("dask x2", 2))
    n = len(ids) * len(seeds)
    results = {}
    from flows.prefect_setup import server_for_a_script  # after quiet_offline(HOME), like every flows import

    with server_for_a_script():
        for name, workers in configs:
            with temporary_settings({PREFECT_LOCAL_STORAGE_PATH: HOME / f"store-{name.replace(' ', '')}"}):
                if name.startswith("dask"):
                    with LocalCluster(
                        n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None
                    ) as cluster:
                        runner = task_runner("dask", workers, cluster.scheduler_address)
                        dt, tables = measure.with_options(task_runner=runner)(str(bench), ids, seeds, a.shard_size)
                else:
                    runner = task_runner("threads", workers)
                    dt, tables = measure.with_options(task_runner=runner)(str(bench), ids, seeds, a.shard_size)
            results[name] = (dt, tables.scores.to_csv(index=False))
            print(f"  {name:<11} {n / dt:7.1f} episodes/s  ({n} episodes in {dt:.2f} s)")
    shutil.rmtree(HOME, ignore_errors=True)
    same = len({csv for _, csv in results.values()}) == 1
    print(f"scores identical across runners: {same}")
    if not same:
        sys.exit("scores differ across runners")
    if a.quick:
        print(
            f"ratio dask x1 / threads x2 throughput at the quick size, a worker's first imports dominate: "
            f"{results['threads x2'][0] / results['dask x1'][0]:.2f}"
        )
        return
    print(f"ratio dask x2 / threads x2 throughput: {results['threads x2'][0] / results['dask x2'][0]:.2f}")
    print(f"ratio dask x2 / dask x1 throughput: {results['dask x1'][0] / results['dask x2'][0]:.2f}")


if __name__ == "__main__":
    main()
