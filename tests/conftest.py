"""Test setup: the quiet/offline environment in a temp home, a benchmark materialized once per session."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from components.env import quiet_offline

HOME = Path(tempfile.mkdtemp(prefix="ratchet-test-home-"))
quiet_offline(HOME)  # before anything imports prefect or mlflow

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ROOT / "data" / "packages"


@pytest.fixture(scope="session")
def bench_dir(tmp_path_factory) -> Path:
    from components.worlds import world

    out = tmp_path_factory.mktemp("bench") / "retail"
    world("retail").materialize(out, 0)
    return out


@pytest.fixture(scope="session")
def bench(bench_dir):
    from components.worlds import load_benchmark

    return load_benchmark(bench_dir)


@pytest.fixture
def package_copy(tmp_path):
    """Copy a shipped package into a temp dir so a test can break it."""
    import shutil

    def make(name: str = "reference") -> Path:
        dst = tmp_path / name
        shutil.copytree(PACKAGES / name, dst)
        return dst

    return make


@pytest.fixture(scope="session")
def prefect_server():
    """One temporary Prefect server (and database) for the whole session: starting one costs seconds."""
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):
        yield PREFECT_API_URL.value()  # subprocesses (CLI, worker) reach the same server through this URL


@pytest.fixture(scope="session")
def free_port():
    import socket

    def get() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    return get
