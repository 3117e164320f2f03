"""Episode throughput and the kernel's share of a simulated turn.

    python benchmarks/bench_episodes.py [--split dev] [--seeds 3] [--quick]

Reports episodes per second for each shipped package (in-process simulated agent) and, from one instrumented run,
the time the kernel spends outside the port (grounding, delivery, checkers, ledger, trace hashing) as a share of a
whole turn (the last line, the headline). Ratios come from one run on this machine; absolute numbers depend on the
machine. `--quick` (the test's size): a small benchmark in a temp dir, one seed."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from components.env import quiet_offline  # noqa: E402

quiet_offline()


def timed_harness():
    """The real harness, with the time spent in each port call accumulated (model + world + conversation)."""
    from components.runtime.chat import ChatHarness

    class TimedHarness(ChatHarness):
        spent = 0.0

        def _timed(name):  # noqa: N805
            def call(self, *a, **kw):
                t = time.perf_counter()
                try:
                    return getattr(ChatHarness, name)(self, *a, **kw)
                finally:
                    TimedHarness.spent += time.perf_counter() - t

            return call

        receipts = _timed("receipts")
        propose = _timed("propose")
        draft = _timed("draft")
        transcript = _timed("transcript")
        commit = _timed("commit")

    return TimedHarness


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--split", default="dev")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--bench", default=str(ROOT / "data/benchmarks/retail"))
    ap.add_argument("--quick", action="store_true", help="a small benchmark in a temp dir and one seed")
    a = ap.parse_args(argv)

    # imported here, so that --help needs none of the stack
    from components.memory import load_package
    from components.models.simulated import SimulatedAgent
    from components.runtime import episode as episode_mod
    from components.runtime.evaluate import run_shard
    from components.worlds import load_benchmark, world

    TimedHarness = timed_harness()  # noqa: N806
    real = episode_mod.ChatHarness
    if a.quick:
        import atexit
        import shutil
        import tempfile

        tmp = tempfile.mkdtemp(prefix="ratchet-bench-episodes-")
        atexit.register(shutil.rmtree, tmp, ignore_errors=True)
        a.bench, a.seeds = str(Path(tmp) / "bench"), 1
        world("retail").materialize(a.bench, 0, 3)
    elif not (Path(a.bench) / "meta.json").exists():
        world("retail").materialize(a.bench, 0)
    bench = load_benchmark(a.bench)
    ids, seeds = bench.ids(a.split), list(range(a.seeds))
    print(f"{len(ids)} items x {len(seeds)} seeds on {a.split}")
    for name in ("none", "seed", "all-skills", "reference"):
        pkg = load_package(ROOT / "data/packages" / name)
        t = time.perf_counter()
        tables = run_shard(pkg, bench, ids, seeds)
        dt = time.perf_counter() - t
        n, turns = len(tables.scores), int(tables.scores["turns"].sum())
        print(
            f"  {name:<11} {n / dt:7.1f} episodes/s  {turns / dt:8.0f} turns/s  (mean score {tables.scores['score'].mean():.3f})"
        )

    # kernel overhead: swap in the timed harness for one run of `reference`
    pkg = load_package(ROOT / "data/packages/reference")
    episode_mod.ChatHarness = TimedHarness
    TimedHarness.spent = 0.0
    t = time.perf_counter()
    agent = SimulatedAgent()
    turns = 0
    try:
        for item in ids:
            for s in seeds:
                turns += episode_mod.run_episode(pkg, bench, item, s, agent).turns
    finally:  # put the real harness back (the test calls main() inside its own process)
        episode_mod.ChatHarness = real
    total = time.perf_counter() - t
    kernel = total - TimedHarness.spent
    print(
        f"kernel overhead: {kernel / total:.1%} of a simulated turn "
        f"({kernel / turns * 1e6:.0f} us of {total / turns * 1e6:.0f} us per turn, {turns} turns)"
    )
    print(f"ratio kernel / simulated turn: {kernel / total:.3f}")


if __name__ == "__main__":
    main()
