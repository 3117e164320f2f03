"""One evolution round three ways, in one run: plain component calls, the Prefect flow cold (empty task cache),
and the Prefect flow again with the same bytes (everything cached).

    python benchmarks/bench_round.py

Reports wall time and the ratios Prefect-cold / plain and rerun / cold. The Prefect figures include the temporary
server's start, measured separately and reported."""

from __future__ import annotations

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


def plain_round(bench_dir: str, start: str, seeds: list[int]) -> float:
    """The same stages as flows.campaign.evolution_round, as direct calls."""
    from components.evolution.diagnose import diagnose
    from components.evolution.gate import GateConfig, gate, repair_screen
    from components.evolution.meta import PlanContext, make_meta_agent
    from components.evolution.patch import apply_plan
    from components.evolution.validate import fired, static_checks
    from components.memory import load_package
    from components.runtime.evaluate import run_shard
    from components.worlds import load_benchmark

    t = time.perf_counter()
    b = load_benchmark(bench_dir)
    pkg = load_package(start)
    train = run_shard(pkg, b, b.ids("train"), seeds)
    d = diagnose(train.traces, train.scores, pkg, b.write_tools, "bench")
    plan = make_meta_agent("rules")(PlanContext(d.packets, pkg, b, train.traces, train.scores, set(), d.findings))
    cand = apply_plan(plan, start, HOME / "plain-candidate")
    v, cpkg = static_checks(plan, cand, b)
    probe = run_shard(cpkg, b, plan.source_items[:4], [0])
    assert fired(probe.traces, plan.mechanism)
    repair_screen(run_shard(pkg, b, plan.source_items, seeds).scores, run_shard(cpkg, b, plan.source_items, seeds).scores)
    dc = run_shard(cpkg, b, b.ids("dev"), seeds)
    gate(run_shard(pkg, b, b.ids("dev"), seeds).scores, dc.scores, GateConfig(), mechanism_fired=fired(dc.traces, plan.mechanism))
    return time.perf_counter() - t


def main() -> None:
    from prefect.testing.utilities import prefect_test_harness

    from components.params import load_params
    from components.worlds import world

    bench = HOME / "bench"
    world("retail").materialize(bench, 0)
    seeds = [0, 1, 2]
    plain = plain_round(str(bench), str(ROOT / "data/packages/seed"), seeds)

    from flows.campaign import evolution_round
    from components.evolution.lineage import Lineage

    t = time.perf_counter()
    with prefect_test_harness(server_startup_timeout=180):
        server = time.perf_counter() - t
        runs = {}
        for name in ("cold", "rerun"):
            out = HOME / name
            p = load_params(ROOT / "params.yaml", {"benchmark.out": str(bench), "campaign.out": str(out)})
            Lineage(out / "lineage").start(ROOT / "data/packages/seed")
            t = time.perf_counter()
            rec = evolution_round(1, p.model_dump())
            runs[name] = time.perf_counter() - t
            print(f"  prefect {name:<5} round: {runs[name]:6.2f} s  ({rec['verdict']}: {rec.get('summary')})")
    print(f"  plain calls round:   {plain:6.2f} s")
    print(f"  temporary Prefect server start: {server:.1f} s (once per process)")
    print(f"ratio prefect-cold / plain: {runs['cold'] / plain:.2f}")
    print(f"ratio rerun / cold:         {runs['rerun'] / runs['cold']:.3f}")
    shutil.rmtree(HOME, ignore_errors=True)


if __name__ == "__main__":
    main()
