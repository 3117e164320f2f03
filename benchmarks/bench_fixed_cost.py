"""Fixed cost per campaign: CPU-seconds of `ratchet campaign run` at three sizes against one shared Prefect server,
and a least-squares fit CPU = fixed + per_episode * episodes.

    python benchmarks/bench_fixed_cost.py [--quick] [--sizes 1:4,2:8,3:12]

Each size is `rounds:per_family`: a campaign of that many rounds on a benchmark of that many tasks per family (its
own benchmark, materialized first by `ratchet bench materialize` as DVC's benchmark stage does and counted apart, as
a sweep's variants share it; its own output, evidence graph, campaign name and $RATCHET_HOME, so
no campaign reads another's task cache, reply store or MLflow store), run as the console script runs it, in a fresh
process, one after another. What is counted is the campaign process's CPU (user + sys,
with every child it waited for), not the shared server's (a server serves many campaigns; `ratchet server` is started
here unless PREFECT_API_URL names one, and stopped at the end). Episodes are the summary's `episodes.total`.
`--quick` (the test's size): sizes 1:3,1:4,1:5 (one round each; per_family is at least 3), so the fit's slope is
loose; the intercept is the point. Last line: the fit.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ratchet() -> list[str]:
    script = Path(sys.executable).parent / "ratchet"
    return [str(script)] if script.exists() else [sys.executable, "-m", "flows.entry"]


def start_server(env: dict, log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen(
        ratchet() + ["server", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}/api"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"ratchet server exited {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as r:
                if r.status == 200:
                    return proc, url
        except OSError:
            time.sleep(1)
    proc.terminate()
    raise SystemExit("ratchet server did not answer within 600 s")


def timed(cmd: list[str], env: dict) -> tuple[subprocess.CompletedProcess, float, float]:
    """(process, CPU s of it and every child it waited for, wall s)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return p, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall


def campaign(env: dict, tmp: Path, rounds: int, per_family: int) -> dict:
    """The benchmark first (`ratchet bench materialize`, as DVC's benchmark stage runs it, counted apart: a sweep
    shares it), then the campaign on it."""
    from components.params import load_params

    tag = f"r{rounds}-f{per_family}"
    env = {**env, "RATCHET_HOME": str(tmp / ("home-" + tag))}
    b = load_params(None, {"benchmark.per_family": per_family}).benchmark
    mat, mat_cpu, _ = timed(
        ratchet()
        + [
            "bench",
            "materialize",
            "--world",
            b.world,
            "--out",
            str(tmp / ("bench-" + tag)),
            "--seed",
            str(b.seed),
            "--per-family",
            str(b.per_family),
            "--train-share",
            repr(b.train_share),
            "--dev-share",
            repr(b.dev_share),
            "--receipts",
            b.receipts,
        ],
        env,
    )
    if mat.returncode != 0:
        raise SystemExit(f"materialize {tag} exited {mat.returncode}: {mat.stderr[-3000:]}")
    args = [
        "campaign",
        "run",
        "--set",
        f"campaign.rounds={rounds}",
        "--set",
        f"benchmark.per_family={per_family}",
        "--set",
        f"benchmark.out={tmp / ('bench-' + tag)}",
        "--set",
        f"campaign.out={tmp / ('camp-' + tag)}",
        "--set",
        f"evidence.db={tmp / ('evidence-' + tag + '.sqlite')}",
        "--set",
        f"campaign.name=fixed-{tag}",
        "--set",
        "campaign.traces_per_round=0",
    ]
    p, cpu, wall = timed(ratchet() + args, env)
    if p.returncode != 0:
        raise SystemExit(f"campaign {tag} exited {p.returncode}: {p.stderr[-3000:]}")
    summary = json.loads((tmp / ("camp-" + tag) / "summary.json").read_text())
    return {
        "size": tag,
        "rounds": rounds,
        "per_family": per_family,
        "episodes": summary["episodes"]["total"],
        "cpu": cpu,
        "wall": wall,
        "materialize_cpu": mat_cpu,
    }


def fit(rows: list[dict]) -> tuple[float, float]:
    """(fixed CPU-s, CPU-s per episode): least squares over the sizes."""
    import numpy as np

    x = np.array([r["episodes"] for r in rows], dtype=float)
    y = np.array([r["cpu"] for r in rows], dtype=float)
    slope, intercept = np.polyfit(x, y, 1)
    return float(intercept), float(slope)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="sizes 1:3,1:4,1:5 (what the test runs)")
    ap.add_argument("--sizes", default=None, help="rounds:per_family,... (default 1:4,2:8,3:12)")
    a = ap.parse_args()
    sizes = [
        tuple(int(v) for v in s.split(":"))
        for s in (a.sizes or ("1:3,1:4,1:5" if a.quick else "1:4,2:8,3:12")).split(",")
    ]
    with tempfile.TemporaryDirectory(prefix="ratchet-fixed-") as t:
        tmp = Path(t)
        env = {**os.environ, "RATCHET_HOME": str(tmp / "home")}
        env.pop("DVC_ROOT", None)
        server = None
        if not env.get("PREFECT_API_URL"):
            server, env["PREFECT_API_URL"] = start_server(env, tmp / "server.log")
        try:
            rows = [campaign(env, tmp, r, f) for r, f in sizes]
        finally:
            if server is not None:
                os.killpg(server.pid, signal.SIGTERM)  # the server's session: the process started here, with its child
                server.wait(timeout=60)
    print(f"campaigns against one shared Prefect server (load {os.getloadavg()[0]:.1f}); CPU of the campaign process:")
    print(
        f"{'size':<10} {'rounds':>6} {'per_family':>10} {'episodes':>9} {'CPU s':>8} {'wall s':>8} "
        f"{'materialize CPU s':>18}"
    )
    for r in rows:
        print(
            f"{r['size']:<10} {r['rounds']:>6} {r['per_family']:>10} {r['episodes']:>9} {r['cpu']:>8.1f} "
            f"{r['wall']:>8.1f} {r['materialize_cpu']:>18.1f}"
        )
    fixed, per = fit(rows)
    print(f"fixed cost per campaign: {fixed:.1f} CPU-s + {per * 1000:.1f} ms per episode (fit over {len(rows)} sizes)")


if __name__ == "__main__":
    main()
