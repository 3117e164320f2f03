"""Every benchmark runs at its --quick size, so none can break unnoticed, and ends on its headline ratio."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT

HEADLINE = re.compile(r"^ratio [^:]+: (\d+\.\d+)$")


@pytest.mark.parametrize("script", ["bench_episodes.py", "bench_round.py", "bench_scaleout.py"])
def test_benchmark_quick_runs_and_ends_on_its_ratio(script, tmp_path):
    # a subprocess: each benchmark sets up its own environment and Prefect server, as when a person runs it
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), "--quick"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    last = r.stdout.strip().splitlines()[-1]
    m = HEADLINE.match(last)
    assert m, f"last line is not a headline ratio: {last!r}"
    assert float(m.group(1)) > 0
