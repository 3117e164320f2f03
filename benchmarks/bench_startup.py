"""`ratchet gate` on a 60-item table against `python -c "import numpy"`, measured in one run, interleaved.

    python benchmarks/bench_startup.py [--quick] [--repeat N]

Three commands, each a fresh interpreter, run in turn `--repeat` times (5; 3 with --quick) so that the machine's load
falls on all of them alike:
    numpy      python -c "import numpy"                          the floor the target is set against
    gate       ratchet gate --base B --cand C --json             the console script: flows/entry.py, the light path
    typer      python -m flows.cli gate --base B --cand C --json  the same command through the typer app
Both bytecode cases are reported: "bytecode" is an installed package's case (every module's .pyc exists: a fresh
PYTHONPYCACHEPREFIX, warmed by one run of each command); "no bytecode" is this machine's editable install under
PYTHONDONTWRITEBYTECODE=1 (numpy's .pyc exist, Ratchet's sources are compiled at every start).
Figures: median wall and median CPU (user + sys of the child) per command, and the ratios gate / numpy and typer /
numpy of the medians. Every run's stdout is checked: the gate's JSON line must be the typer path's, byte for byte.
Last line: the headline ratio (CPU, with bytecode).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def write_tables(d: Path, n_items: int = 60, seeds: int = 3) -> tuple[Path, Path]:
    """Rubric fractions over `seeds` seeds, as a campaign's score tables hold them (written as pandas writes them)."""
    import random

    rng = random.Random(1)
    b, c = d / "base.csv", d / "cand.csv"
    rows_b, rows_c = ["item_id,seed,score"], ["item_id,seed,score"]
    for i in range(n_items):
        for s in range(seeds):
            x = rng.randint(0, 6) / 6
            y = min(max(x + rng.randint(-1, 2) / 6, 0.0), 1.0)
            rows_b.append(f"t{i:03d},{s},{x!r}")
            rows_c.append(f"t{i:03d},{s},{y!r}")
    b.write_text("\n".join(rows_b) + "\n")
    c.write_text("\n".join(rows_c) + "\n")
    return b, c


def ratchet_script() -> list[str]:
    """The installed console script beside this interpreter, else what it runs."""
    script = Path(sys.executable).parent / "ratchet"
    return [str(script)] if script.exists() else [sys.executable, "-m", "flows.entry"]


def run(cmd: list[str], env: dict) -> tuple[float, float, str, int]:
    """(wall s, CPU s of the child, stdout, exit code)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, p.stdout, p.returncode


def measure(commands: dict[str, list[str]], env: dict, repeat: int) -> dict[str, dict]:
    res = {k: {"wall": [], "cpu": [], "out": set(), "rc": set()} for k in commands}
    for k, cmd in commands.items():  # warm-up: writes the bytecode where it may be written; not counted
        run(cmd, env)
    for _ in range(repeat):
        for k, cmd in commands.items():
            wall, cpu, out, rc = run(cmd, env)
            res[k]["wall"].append(wall)
            res[k]["cpu"].append(cpu)
            res[k]["out"].add(out)
            res[k]["rc"].add(rc)
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="3 repeats (what the test runs)")
    ap.add_argument("--repeat", type=int, default=None)
    a = ap.parse_args()
    repeat = a.repeat or (3 if a.quick else 5)
    with tempfile.TemporaryDirectory() as tmp:
        b, c = write_tables(Path(tmp))
        args = ["gate", "--base", str(b), "--cand", str(c), "--json"]
        commands = {
            "numpy": [sys.executable, "-c", "import numpy"],
            "gate": ratchet_script() + args,
            "typer": [sys.executable, "-m", "flows.cli"] + args,
        }
        base_env = {**os.environ, "RATCHET_HOME": str(Path(tmp) / "home")}
        cases = {}
        pycache = Path(tmp) / "pycache"
        env = {k: v for k, v in base_env.items() if k != "PYTHONDONTWRITEBYTECODE"}
        cases["bytecode"] = measure(commands, {**env, "PYTHONPYCACHEPREFIX": str(pycache)}, repeat)
        shutil.rmtree(pycache, ignore_errors=True)
        env = {k: v for k, v in base_env.items() if k != "PYTHONPYCACHEPREFIX"}
        cases["no bytecode"] = measure(commands, {**env, "PYTHONDONTWRITEBYTECODE": "1"}, repeat)
    outs = {o for case in cases.values() for k in ("gate", "typer") for o in case[k]["out"]}
    codes = {rc for case in cases.values() for k in ("gate", "typer") for rc in case[k]["rc"]}
    if len(outs) != 1 or not codes <= {0, 1} or len(codes) != 1:
        raise SystemExit(f"the gate's output or exit code differs between runs or paths: {outs} {codes}")
    print(
        f"ratchet gate on a 60-item table (3 seeds), {repeat} runs each, interleaved; load "
        f"{os.getloadavg()[0]:.1f}; verdict: {outs.pop().strip()} (exit {codes.pop()}), the same on both paths"
    )
    print(
        f"{'case':<12} {'command':<7} {'wall median':>12} {'CPU median':>11} {'wall / numpy':>13} {'CPU / numpy':>12}"
    )
    for case, res in cases.items():
        w0, c0 = statistics.median(res["numpy"]["wall"]), statistics.median(res["numpy"]["cpu"])
        for k in commands:
            w, cpu = statistics.median(res[k]["wall"]), statistics.median(res[k]["cpu"])
            print(f"{case:<12} {k:<7} {w:>11.3f}s {cpu:>10.3f}s {w / w0:>12.2f}x {cpu / c0:>11.2f}x")
    r = {k: {m: statistics.median(v[m]) for m in ("wall", "cpu")} for k, v in cases["bytecode"].items()}
    print(
        f"ratchet gate / import numpy (bytecode): wall {r['gate']['wall'] / r['numpy']['wall']:.2f}x, "
        f"CPU {r['gate']['cpu'] / r['numpy']['cpu']:.2f}x"
    )


if __name__ == "__main__":
    main()
