"""The gate's bootstrap against a plain-Python item bootstrap, side by side in one run; its size limits; and the
wall time of `ratchet gate` on a 60-item table.

    python benchmarks/bench_gate.py [--quick]

Score tables are rubric fractions (multiples of 1/6) over 3 seeds, as the gate sees them: d_i = mean cand - mean
base sits on a lattice, so the gate draws resample means exactly from the convolution of that lattice's pmf.
"continuous" d_i (all distinct reals) take the index-drawing path instead; both are reported.
Each large size runs in a fresh process so its peak memory (max RSS) is its own. Last line: the headline ratio.
`--quick` (the test's size) times the per-resample costs in CPU time, as the test runs beside others on a busy machine.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402


def rubric_d(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 7, (n, 3)) / 6
    cand = np.clip(base + rng.integers(-1, 3, (n, 3)) / 6, 0, 1)
    return cand.mean(axis=1) - base.mean(axis=1)


def continuous_d(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(0.03, 0.2, n)


def plain_python(d: list[float], n_boot: int, seed: int = 0) -> list[float]:
    """The textbook item bootstrap: draw n items with replacement, take the mean, n_boot times."""
    rng, n, means = random.Random(seed), len(d), []
    for _ in range(n_boot):
        total = 0.0
        for _ in range(n):
            total += d[rng.randrange(n)]
        means.append(total / n)
    return means


def old_gather(d: np.ndarray, n_boot: int, seed: int = 0) -> np.ndarray:
    """The gate's previous bootstrap: one (n_boot, n) index array."""
    idx = np.random.default_rng(seed).integers(0, len(d), size=(n_boot, len(d)))
    return d[idx].mean(axis=1)


CLOCK = time.perf_counter  # --quick: time.process_time (the test's size runs beside other tests on a busy machine)


def per_resample(f, n_boot: int, repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = CLOCK()
        f(n_boot)
        best = min(best, (CLOCK() - t) / n_boot)
    return best


def one_size(kind: str, n: int, n_boot: int) -> dict:
    """Run in a child process: time and max RSS of one gate CI at this size."""
    from components.evolution.gate import bootstrap_ci

    d = (rubric_d if kind == "rubric" else continuous_d)(n)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t, cpu = time.perf_counter(), time.process_time()
    lo, hi = bootstrap_ci(d, n_boot, 0.05, 0)
    dt, cpu = time.perf_counter() - t, time.process_time() - cpu
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "kind": kind,
        "n": n,
        "n_boot": n_boot,
        "seconds": dt,
        "cpu_seconds": cpu,
        "peak_rss_mb": peak / 1024,
        "rss_before_mb": before / 1024,
        "ci": [lo, hi],
    }


def cli_wall(n_items: int, repeat: int) -> float:
    """Median wall time of `python -m flows.entry gate` (what the `ratchet` script runs) on an n_items table
    (benchmarks/bench_startup.py sets it against `import numpy`)."""
    import pandas as pd

    rng = np.random.default_rng(1)
    rows = [
        {"item_id": f"t{i:03d}", "seed": s, "score": int(rng.integers(0, 7)) / 6}
        for i in range(n_items)
        for s in range(3)
    ]
    base = pd.DataFrame(rows)
    cand = base.assign(score=np.clip(base["score"] + rng.integers(-1, 3, len(base)) / 6, 0, 1))
    with tempfile.TemporaryDirectory() as tmp:
        b, c = Path(tmp) / "base.csv", Path(tmp) / "cand.csv"
        base.to_csv(b, index=False)
        cand.to_csv(c, index=False)
        times = []
        for _ in range(repeat):
            t = time.perf_counter()
            p = subprocess.run(
                [sys.executable, "-m", "flows.entry", "gate", "--base", str(b), "--cand", str(c), "--json"],
                cwd=ROOT,
                capture_output=True,
                text=True,
            )
            times.append(time.perf_counter() - t)
            if p.returncode not in (0, 1):
                raise SystemExit(f"ratchet gate failed: {p.stderr}")
    return float(np.median(times))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="small sizes (what the test runs)")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # kind:n:n_boot, run in a child process
    a = ap.parse_args()
    if a.one:
        kind, n, n_boot = a.one.split(":")
        print(json.dumps(one_size(kind, int(n), int(n_boot))))
        return
    from components.evolution.gate import boot_means

    global CLOCK
    if a.quick:  # CPU time: a descheduling on a loaded machine is not the code's (single-threaded either way)
        CLOCK = time.process_time
    n = 1000
    plain_boots = 20 if a.quick else 200
    ours_boots = 2000 if a.quick else 10_000
    d = rubric_d(n)
    dc = continuous_d(n)
    # the best of three even at the quick size (20 resamples take milliseconds)
    t_plain = per_resample(lambda b: plain_python(d.tolist(), b), plain_boots, repeat=3 if a.quick else 2)
    t_ours = per_resample(lambda b: boot_means(d, b, 0), ours_boots)
    t_ours_c = per_resample(lambda b: boot_means(dc, b, 0), ours_boots)
    t_old = per_resample(lambda b: old_gather(d, b, 0), ours_boots)
    print(f"bootstrap per resample at {n} items (rubric d: {len(np.unique(d))} distinct values):")
    print(f"  plain Python      {t_plain * 1e6:10.2f} us")
    print(f"  previous gather   {t_old * 1e6:10.2f} us   ({t_plain / t_old:7.1f}x plain)")
    print(f"  gate, rubric d    {t_ours * 1e6:10.2f} us   ({t_plain / t_ours:7.1f}x plain)")
    print(f"  gate, continuous  {t_ours_c * 1e6:10.2f} us   ({t_plain / t_ours_c:7.1f}x plain)")

    big = 20_000 if a.quick else 100_000
    boots = 2000 if a.quick else 10_000
    for kind in ("rubric", "continuous"):
        p = subprocess.run(
            [sys.executable, __file__, "--one", f"{kind}:{big}:{boots}"], capture_output=True, text=True, check=True
        )
        r = json.loads(p.stdout.strip().splitlines()[-1])
        print(
            f"{kind:>10} d, {big} items, {boots} resamples: {r['seconds']:.2f} s wall "
            f"({r['cpu_seconds']:.2f} s CPU, all threads; load {os.getloadavg()[0]:.1f}), peak RSS {r['peak_rss_mb']:.0f} MB "
            f"(process before the CI: {r['rss_before_mb']:.0f} MB), CI [{r['ci'][0]:+.5f}, {r['ci'][1]:+.5f}]"
        )
    print(f"ratchet gate on a 60-item table: {cli_wall(60, 1 if a.quick else 5):.2f} s wall (median)")
    print(f"bootstrap speedup vs plain Python at {n} items (rubric d): {t_plain / t_ours:.0f}x")


if __name__ == "__main__":
    main()
