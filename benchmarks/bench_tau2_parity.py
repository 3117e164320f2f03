"""The parity table: the same scripted plans played through Ratchet (its kernel, port and harness) and through tau2's
own Orchestrator (its limits, step counting and environment), each graded: Ratchet by its tau2 world, tau2 by its
own `evaluate_simulation` (tests/tau2_parity.py).

    python benchmarks/bench_tau2_parity.py [--worlds tau2-retail,tau2-airline] [--protocols standard,custom]
                                           [--variants gold,errors_first,...] [--splits train,dev,test]

Needs the `tau2` extra. Rows: world, protocol, variant; columns: tasks the variant applies to (of the tasks of the
splits named), agreement of the score with tau2's reward (must be 100%), agreement of how the episode ended (Ratchet's
harness against tau2's termination reason), and how many score 1.0. Every task of the splits named is run."""

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

from components.worlds.taubench import DOMAINS  # noqa: E402
from tests.tau2_parity import CUSTOM_VARIANTS, STANDARD_VARIANTS, materialized, parity_rows  # noqa: E402

# how Ratchet's harness names the end tau2 calls by its termination reason
SAME_END = {
    ("user_stop", "user_stop"),
    ("max_errors", "too_many_errors"),
    ("max_steps", "max_steps"),
    ("finish", "agent_stop"),
    ("terminal_tool", "agent_stop"),
    ("terminal_tool", "user_stop"),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", default=",".join(DOMAINS))
    ap.add_argument("--protocols", default="standard,custom")
    ap.add_argument("--variants", default="", help="plans (default: every plan of the protocol)")
    ap.add_argument("--splits", default="train,dev,test")
    ap.add_argument("--no-header", action="store_true", help="rows only (to join the output of several runs)")
    args = ap.parse_args()
    if not args.no_header:
        print("| world | protocol | plan | tasks run (of) | score agrees with tau2 | end agrees | score 1.0 |")
        print("|---|---|---|---|---|---|---|")
    notes = []
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.worlds.split(","):
            for protocol in args.protocols.split(","):
                bench = materialized(tmp, name, protocol)
                ids = [i for s in args.splits.split(",") for i in bench.ids(s)]
                plans = STANDARD_VARIANTS if protocol == "standard" else CUSTOM_VARIANTS
                for variant in [v for v in args.variants.split(",") if v] or plans:
                    if variant not in plans:
                        continue
                    rows = parity_rows(bench, variant, ids)
                    agree = sum(a == b for _, a, b, _, _ in rows)
                    ends = sum((e, t) in SAME_END for *_, e, t in rows)
                    ones = sum(a >= 1.0 for _, a, *_ in rows)
                    kinds = sorted({t for *_, t in rows})
                    print(
                        f"| {name} | {protocol} | {variant} | {len(rows)} ({len(ids)}) | {agree}/{len(rows)} | "
                        f"{ends}/{len(rows)} ({', '.join(kinds)}) | {ones} |",
                        flush=True,
                    )
                    bad = [r for r in rows if r[1] != r[2] or (r[3], r[4]) not in SAME_END]
                    if bad:
                        notes.append(f"{name} {protocol} {variant}: DISAGREE {bad}")
    for n in notes:
        print(n)
    print(f"({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
