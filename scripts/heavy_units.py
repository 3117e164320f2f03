"""Print tests/conftest.py's HEAVY table from a suite log: `scripts/heavy_units.py LOG [MIN_SECONDS]`.

LOG is the output of `./test.sh --all --durations=0 --durations-min=0.3 -vv` (on an idle machine, for figures that compare).
A scheduling unit is what pytest-xdist hands a worker whole: a group (the part of a test id after "@") or one test.
Its figure is the sum of its tests' setup, call and teardown; also printed: the worker seconds per worker, and which
worker ran each unit, to check that the heaviest units started first on different workers."""

from __future__ import annotations

import collections
import re
import sys

REPORT = re.compile(r"\[(gw\d+)\] \[ *\d+%\] [A-Z]+ (\S+)")
DURATION = re.compile(r"\s*([\d.]+)s (?:setup|call|teardown)\s+(\S+)")


def unit(nodeid: str) -> str:
    if nodeid.rfind("@") > nodeid.rfind("]"):  # as pytest-xdist's loadgroup scheduler splits it
        return nodeid.rsplit("@", 1)[1]
    return nodeid


def main() -> None:
    lines = open(sys.argv[1], encoding="utf-8", errors="replace").read().splitlines()
    least = float(sys.argv[2]) if len(sys.argv) > 2 else 2.0
    worker, started = {}, []
    for line in lines:
        if m := REPORT.match(line):
            worker[m[2]] = m[1]
            if unit(m[2]) not in (u for _, u in started):
                started.append((m[1], unit(m[2])))
    seconds, workers, per_worker = collections.Counter(), collections.defaultdict(set), collections.Counter()
    for line in lines:
        if m := DURATION.match(line):
            s, nodeid = float(m[1]), m[2]
            seconds[unit(nodeid)] += s
            workers[unit(nodeid)].add(worker.get(nodeid, "?"))
            per_worker[worker.get(nodeid, "?")] += s
    print("# worker seconds (listed durations):", ", ".join(f"{w} {s:.0f}" for w, s in sorted(per_worker.items())))
    print("# units in the order their first test finished:", ", ".join(f"{u} ({w})" for w, u in started[:4]))
    print("HEAVY = {")
    for u, s in seconds.most_common():
        if s >= least:
            print(f"    {u!r}: {s:.1f},  # {','.join(sorted(workers[u]))}")
    print("}")


if __name__ == "__main__":
    main()
