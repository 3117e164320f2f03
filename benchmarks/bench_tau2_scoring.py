"""CPU seconds Ratchet spends scoring one τ²-bench episode (tau2's three evaluators on the converted messages), for
the gold replay of every task of a split: the first score of each task, and a second score of the same episode
(where the gold side of tau2's environment evaluator, which depends on the task alone, can be reused).

    python benchmarks/bench_tau2_scoring.py [--worlds tau2-retail,tau2-airline] [--split test]

CPU time of this process (`time.process_time`), so other load on the machine does not count. The same script runs
on an older checkout, which is how the figure before the gold side was cached was measured (benchmarks/README.md)."""

from __future__ import annotations

import argparse
import inspect
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from components.env import quiet_offline  # noqa: E402

quiet_offline()


def played(bench, item, model):
    """The gold episode's environment and transcript (through Ratchet's kernel and port)."""
    from components.memory.package import load_package
    from components.runtime import episode as ep_mod
    from components.runtime.chat import ChatHarness
    from components.runtime.kernel import Episode, run_turn
    from components.worlds import world

    env = world(bench.world).make_env(bench, bench.tasks[item])
    kw = {}
    if "protocol" in inspect.signature(ChatHarness).parameters:
        kw["protocol"] = ep_mod.protocol_of(env)
    port = ChatHarness(env, model, 0, targets=bench.meta.get("targets"), **kw)
    if hasattr(port, "start"):
        port.start()
    ep = Episode.start(f"{item}#0", load_package(ROOT / "data" / "packages" / "none"), sealed=False)
    while not port.ended and len(ep.steps) < 800:
        run_turn(ep, port)
    return env, port.transcript()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tau2-airline, the first 3 tasks (the test's size)")
    ap.add_argument("--worlds", default="tau2-retail,tau2-airline")
    ap.add_argument("--split", default="test")
    ap.add_argument("--items", type=int, default=0, help="the first N tasks of the split (0: all)")
    args = ap.parse_args(argv)
    if args.quick:
        args.worlds, args.items = "tau2-airline", 3

    from components.models import make_model
    from components.worlds import load_benchmark, world

    print(
        "| world | episodes | CPU s / episode, first score of a task | CPU s / episode, the task scored again | "
        "all 1.0 |"
    )
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.worlds.split(","):
            bench = load_benchmark(world(name).materialize(Path(tmp) / name, 0))
            model = make_model("gold", {"benchmark": str(bench.root)})
            ids = bench.ids(args.split)[: args.items or None]
            first = again = 0.0
            ok = True
            for item in ids:
                env, transcript = played(bench, item, model)
                t0 = time.process_time()
                a = env.score(transcript)
                t1 = time.process_time()
                b = env.score(transcript)
                t2 = time.process_time()
                first, again = first + t1 - t0, again + t2 - t1
                ok = ok and a.reward == b.reward == 1.0
            print(f"| {name} | {len(ids)} | {first / len(ids):.3f} | {again / len(ids):.3f} | {ok} |", flush=True)


if __name__ == "__main__":
    main()
