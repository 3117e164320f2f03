"""One evolution round three ways, in one run: plain calls doing the round's whole work, the Prefect flow cold (empty
task cache), and the Prefect flow again with the same bytes in a new campaign directory (everything cached).

The plain round is flows.round.run_round, the flow's own composition, given the stage functions themselves
instead of their Prefect tasks (`plain_steps`): the same stages in the same order (evaluations in the same shards on a
thread pool of the flow's size, with their budget holds; citation checks; data contracts; sequential looks; every file
the round writes; the commit). Both Prefect rounds must give the plain round's verdict and byte-identical files (each
hashed), or the benchmark fails.

    python benchmarks/bench_round.py [--quick]

Reports wall times and the ratios rerun / cold and (last line, the headline) Prefect-cold / plain. The temporary
Prefect server's start is measured separately and not in the round's time (a campaign starts it once). The Prefect
rounds use a result store of this run's own (an empty one for the cold round), whatever the environment sets.
`--quick` (the test's size: 60 tasks, one seed) does the same work on a round of about a second, where a flow run's
fixed costs outweigh its per-task overhead, so its last line says so: the 1.3x goal is for the full size."""

from __future__ import annotations

import argparse
import hashlib
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from components.env import quiet_offline  # noqa: E402

HOME = Path(tempfile.mkdtemp(prefix="ratchet-bench-"))
quiet_offline(HOME)


def setup(name: str, bench: Path, quick: bool):
    """Params, a started lineage and an open budget wallet for one arm, in its own output directory."""
    from components.evidence.budget import BudgetLedger
    from components.evolution.lineage import Lineage
    from components.params import load_params
    from flows.campaign import budget_spec

    # one campaign name for every arm (it is recorded in the round's files); each arm has its own output directory
    over = {"benchmark.out": str(bench), "campaign.out": str(HOME / name), "campaign.name": "bench"}
    if quick:
        over.update({"campaign.seeds": 1, "gate.n_boot": 1000})
    p = load_params(ROOT / "params.yaml", over)
    Lineage(HOME / name / "lineage").start(ROOT / p.campaign.start)
    budget = budget_spec(p)
    BudgetLedger(budget.db).open_wallet(
        p.campaign.name,
        p.budget.caps(),
        wall_seconds=p.budget.wall_seconds,
        max_concurrency=p.budget.max_concurrency,
        max_depth=p.budget.max_depth,
    )
    return p, budget


def round_files(p) -> dict[str, str]:
    """sha256 of every file the round wrote (its round directory and the lineage), by path inside the campaign; not
    the wall-clock span timings (`TIMINGS`), which DVC ignores too and which differ from run to run by nature."""
    from components.runtime.evaluate import TIMINGS

    out = Path(p.campaign.out)
    return {
        f.relative_to(out).as_posix(): hashlib.sha256(f.read_bytes()).hexdigest()
        for d in ("rounds", "lineage")
        for f in sorted((out / d).rglob("*"))
        if f.is_file() and f.name not in ("LOCK", TIMINGS)
    }


def cpu_seconds() -> float:
    """CPU time of this process (every thread) and of its children (the temporary Prefect server) so far."""
    try:
        import psutil

        kids = sum(c.cpu_times().user + c.cpu_times().system for c in psutil.Process().children(recursive=True))
    except Exception:  # psutil missing, or a child gone: this process only
        kids = 0.0
    return time.process_time() + kids


def warm_up(bench: Path, p) -> None:
    """First-use costs (imports, the world's caches) paid before any arm is timed, so the first arm is not charged them."""
    from components.runtime.evaluate import run_shard
    from components.worlds import load_benchmark

    b = load_benchmark(bench)
    run_shard(
        str(ROOT / p.campaign.start),
        b,
        b.ids("train")[:1],
        [0],
        p.campaign.model,
        p.campaign.model_cfg,
        p.campaign.max_turns,
        None,
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="a small benchmark and one seed (the test's size)")
    a = ap.parse_args(argv)

    from prefect.settings import PREFECT_LOCAL_STORAGE_PATH, temporary_settings

    from components.params import BenchmarkParams
    from flows.replay import play_round
    from flows.round import plain_steps, run_round

    bench = HOME / "bench"
    BenchmarkParams(out=str(bench), per_family=12 if a.quick else None).materialize()
    runs, cpu, recs, files = {}, {}, {}, {}

    def timed(name: str, p, call) -> None:
        t, c = time.perf_counter(), cpu_seconds()
        recs[name] = call()
        runs[name], cpu[name] = time.perf_counter() - t, cpu_seconds() - c
        files[name] = round_files(p)

    p, budget = setup("plain", bench, a.quick)
    warm_up(bench, p)
    timed("plain", p, lambda: run_round(1, p, budget, plain_steps(p.campaign.workers)))
    t = time.perf_counter()
    # a result store of this run's own, whatever the environment says: the cold round must find it empty
    from flows.prefect_setup import server_for_a_script  # after quiet_offline(HOME), like every flows import

    with server_for_a_script(), temporary_settings({PREFECT_LOCAL_STORAGE_PATH: HOME / "prefect-results"}):
        from prefect.client.orchestration import get_client

        with get_client(sync_client=True) as client:  # a campaign's first contact, once per process like the start
            client.raise_for_api_version_mismatch()
        server = time.perf_counter() - t
        for name in ("cold", "rerun"):
            p, budget = setup(name, bench, a.quick)
            # as a campaign runs a round: the whole round from the cache when every input is the same, else the flow
            timed(name, p, lambda: play_round(1, p, budget))
    for name in ("cold", "rerun"):  # like for like, or the ratios mean nothing
        if recs[name] != recs["plain"] or files[name] != files["plain"]:
            diff = sorted(
                k for k in files[name].keys() | files["plain"].keys() if files[name].get(k) != files["plain"].get(k)
            )
            sys.exit(
                f"bench_round: the Prefect {name} round and the plain round differ: verdict "
                f"{recs[name].verdict} vs {recs['plain'].verdict}; files {diff[:8]}"
            )
    what = f"{recs['plain'].verdict}: {recs['plain'].summary}; {len(files['plain'])} files, identical"
    for name in ("plain", "cold", "rerun"):
        print(
            f"  {'plain calls' if name == 'plain' else 'prefect ' + name:<13} round: {runs[name]:6.2f} s wall, "
            f"{cpu[name]:6.2f} s CPU"
        )
    print(f"  every arm: {what}")
    print(
        f"  Prefect server start (when this run starts one) and first contact: {server:.1f} s (once per process, not "
        f"in the round's time)"
    )
    print(
        f"  prefect-cold - plain: {runs['cold'] - runs['plain']:+.2f} s wall, {cpu['cold'] - cpu['plain']:+.2f} s CPU"
    )
    print(
        f"  ratio prefect-cold / plain in CPU time (this process and its children: the server when it started one): "
        f"{cpu['cold'] / cpu['plain']:.2f}"
    )
    print(f"ratio rerun / cold: {runs['rerun'] / runs['cold']:.3f}")
    # at the quick size a round is ~1 s of work, so a flow run's fixed costs (its start, each task run's records on
    # the server) are most of the difference: that ratio shows the script runs, not how the goal stands
    what = "prefect-cold / plain" + (
        " at the quick size, fixed costs of a flow run dominate, the goal is for the full size" if a.quick else ""
    )
    print(f"ratio {what}: {runs['cold'] / runs['plain']:.2f}")
    shutil.rmtree(HOME, ignore_errors=True)


if __name__ == "__main__":
    main()
