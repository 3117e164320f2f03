"""Every benchmark runs at its --quick size, so none can break unnoticed, and ends on its headline ratio."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT

HEADLINE = re.compile(r"^ratio [^:]+: (\d+\.\d+)$")


# each benchmark keeps its stores (task cache, MLflow) in a temp home of its own: a cold run must be cold
OWN = ("RATCHET_HOME", "PREFECT_HOME", "PREFECT_LOCAL_STORAGE_PATH", "MLFLOW_TRACKING_URI", "DVC_SITE_CACHE_DIR")


@pytest.mark.parametrize("script", ["bench_episodes.py", "bench_round.py", "bench_scaleout.py", "bench_memory.py"])
def test_benchmark_quick_runs_and_ends_on_its_ratio(script, tmp_path, prefect_server):
    # a subprocess, as a person runs it; it uses the session's Prefect server instead of starting its own
    env = {k: v for k, v in os.environ.items() if k not in OWN} | {"PREFECT_API_URL": prefect_server}
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), "--quick"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    last = r.stdout.strip().splitlines()[-1]
    m = HEADLINE.match(last)
    assert m, f"last line is not a headline ratio: {last!r}"
    assert float(m.group(1)) > 0
