"""The `evaluate` flow: a package on a benchmark split, sharded into coarse tasks (a shard of items per task)."""

from __future__ import annotations

from prefect import flow
from prefect.task_runners import ThreadPoolTaskRunner

from components.defaults import MAX_TURNS
from components.evidence.budget import BudgetSpec
from components.runtime.evaluate import EvalTables, eval_items, shards
from flows.tasks import eval_shard


def task_runner(kind: str = "threads", workers: int = 2, address: str | None = None):
    """Threads by default; `dask` runs shards on a Dask cluster through prefect-dask (an address, or a local one)."""
    if kind == "dask":
        from prefect_dask import DaskTaskRunner

        if address:
            return DaskTaskRunner(address=address)
        return DaskTaskRunner(
            cluster_class="distributed.LocalCluster",
            cluster_kwargs={
                "n_workers": workers,
                "threads_per_worker": 1,
                "processes": True,
                "dashboard_address": None,
            },
        )
    return ThreadPoolTaskRunner(max_workers=workers)


AUTO_MIN_EPISODES = 30  # so a task's Prefect bookkeeping (engine, state events, persisted result) stays small beside it
AUTO_TASKS_PER_WORKER = 2  # shards differ in cost: two per worker keep every worker busy to the end


def auto_shard(n_items: int, n_seeds: int, workers: int) -> int:
    """Items per task when `campaign.shard_size` is null: the look cut into about two tasks per worker, but no task
    under AUTO_MIN_EPISODES episodes (a small look is one or a few tasks). Shards never change a score table (the
    tables are gathered sorted by item and seed), only how the work is spread."""
    per_task = -(-max(1, n_items) // (AUTO_TASKS_PER_WORKER * max(1, workers)))
    return max(1, per_task, -(-AUTO_MIN_EPISODES // max(1, n_seeds)))


def submit_eval(
    package: str,
    bench: str,
    seeds: list[int],
    split: str | None = None,
    items: list[str] | None = None,
    shard_size: int = 10,
    model: str = "sim",
    model_cfg: dict | None = None,
    max_turns: int = MAX_TURNS,
    label: str = "",
    budget: BudgetSpec | None = None,
) -> EvalTables:
    """Submit one eval_shard task per shard to the running flow's task runner and gather the tables.

    Rounds call this directly rather than the `evaluate` subflow: a subflow run costs about a second of Prefect
    bookkeeping (its heartbeat thread joins on exit), a task a few milliseconds."""
    ids = eval_items(bench, split, items)
    n = -(-len(ids) // shard_size)
    futures = [
        eval_shard.submit(
            package, bench, shard, seeds, model, model_cfg or {}, max_turns, label=f"{label} {i + 1}/{n}", budget=budget
        )
        for i, shard in enumerate(shards(ids, shard_size))
    ]
    return EvalTables.concat([f.result() for f in futures])


@flow(name="evaluate", flow_run_name="evaluate {label}", validate_parameters=False)
def evaluate(
    package: str,
    bench: str,
    seeds: list[int],
    split: str | None = None,
    items: list[str] | None = None,
    shard_size: int = 10,
    model: str = "sim",
    model_cfg: dict | None = None,
    max_turns: int = MAX_TURNS,
    label: str = "",
) -> EvalTables:
    """A package on a benchmark split (or a list of items), as a standalone flow run."""
    return submit_eval(package, bench, seeds, split, items, shard_size, model, model_cfg, max_turns, label)
