"""The gold parity table: Ratchet's score of tau2's gold actions (and of three mutations of them), replayed through
Ratchet's kernel and port, against tau2's own `evaluate_simulation` run natively on the same messages.

    python benchmarks/bench_tau2_parity.py [--worlds tau2-retail,tau2-airline] [--variants gold,drop_write,...]
                                           [--splits train,dev,test]

Needs the `tau2` extra. Rows: world, split, variant (gold or a mutation); columns: tasks the variant applies to (a
mutation that edits a gold write skips a task with no write tau2 carries out) and the split's size,
agreement with tau2 (must be 100%), and how many score 1.0 (gold: all but the tasks named below the table, whose gold
is incomplete for their reward basis; a mutation: none). Every task of every split is run."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from components.env import quiet_offline  # noqa: E402

quiet_offline()

from components.worlds import load_benchmark, world  # noqa: E402
from components.worlds.taubench import DOMAINS  # noqa: E402
from tests.tau2_parity import MUTATIONS, parity_rows  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", default=",".join(DOMAINS))
    ap.add_argument("--variants", default=",".join(("gold", *MUTATIONS)), help="gold and/or mutations")
    ap.add_argument("--splits", default="train,dev,test")
    ap.add_argument("--no-header", action="store_true", help="rows only (to join the output of several runs)")
    args = ap.parse_args()
    variants = [None if v == "gold" else v for v in args.variants.split(",") if v]
    if not args.no_header:
        print("| world | split | variant | tasks run (of the split's) | agree with tau2 | score 1.0 |")
        print("|---|---|---|---|---|---|")
    notes = []
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.worlds.split(","):
            bench = load_benchmark(world(name).materialize(Path(tmp) / name, 0))
            for variant in variants:
                for split in args.splits.split(","):
                    rows = parity_rows(bench, DOMAINS[name], variant, bench.ids(split))
                    agree = sum(a == b for _, a, b in rows)
                    ones = [i for i, a, _ in rows if a >= 1.0]
                    print(f"| {name} | {split} | {variant or 'gold'} | {len(rows)} ({len(bench.ids(split))}) | "
                          f"{agree}/{len(rows)} "
                          f"({agree / max(1, len(rows)):.0%}) | {len(ones)} |", flush=True)
                    if variant is None and len(ones) < len(rows):
                        notes.append(f"{name} {split}: gold below 1.0: "
                                     + ", ".join(i for i, a, _ in rows if a < 1.0))
                    if variant is not None and ones:
                        notes.append(f"{name} {split}: {variant} still 1.0: " + ", ".join(ones))
                    bad = [(i, a, b) for i, a, b in rows if a != b]
                    if bad:
                        notes.append(f"{name} {split} {variant or 'gold'}: DISAGREE {bad}")
    for n in notes:
        print(n)
    print(f"({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
