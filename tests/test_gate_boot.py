"""The gate's threaded bootstrap for large all-distinct d (components/evolution/gate.py::_boot_parallel): the same
result for a seed whatever the number of threads, and the same distribution as the serial index bootstrap."""

from __future__ import annotations

import numpy as np
import pytest

from components.evolution import gate as gate_mod
from components.evolution.gate import boot_means


@pytest.fixture
def d() -> np.ndarray:
    return np.random.default_rng(3).normal(0.02, 0.2, 4000)  # all distinct: the index path


def test_the_threaded_path_is_deterministic_whatever_the_thread_count(d, monkeypatch):
    monkeypatch.setattr(gate_mod, "_PAR_MIN_DRAWS", 0)  # every size takes the threaded path
    monkeypatch.setattr(gate_mod, "_PAR_CHUNK", 1 << 16)  # many chunks, so threads really interleave
    monkeypatch.setattr(gate_mod, "_PAR_THREADS", 4)
    four = boot_means(d, 3000, seed=7)
    monkeypatch.setattr(gate_mod, "_PAR_THREADS", 1)
    one = boot_means(d, 3000, seed=7)
    assert np.array_equal(four, one)
    assert not np.array_equal(one, boot_means(d, 3000, seed=8))  # the seed matters
    assert len(one) == 3000 and np.isfinite(one).all()


def test_the_threaded_path_draws_the_same_distribution_as_the_serial_one(d, monkeypatch):
    serial = boot_means(d, 4000, seed=1)  # 4000 x 4000 draws: under the threshold, the serial chunks
    monkeypatch.setattr(gate_mod, "_PAR_MIN_DRAWS", 0)
    threaded = boot_means(d, 4000, seed=1)
    assert not np.array_equal(serial, threaded)  # really another path
    se = d.std() / np.sqrt(len(d))
    assert threaded.mean() == pytest.approx(d.mean(), abs=0.05 * se)  # resample means centre on the mean
    assert threaded.std() == pytest.approx(serial.std(), rel=0.06)  # both have the bootstrap's spread
    assert threaded.std() == pytest.approx(se, rel=0.06)
    for q in (0.025, 0.975):
        assert np.quantile(threaded, q) == pytest.approx(np.quantile(serial, q), abs=0.25 * se)


@pytest.mark.parametrize("chunk,n_boot", [(25, 7), (5, 3)])  # 2 resamples a chunk (the last one short); 1 a chunk
def test_the_threaded_path_is_each_chunks_own_spawned_draw(monkeypatch, chunk, n_boot):
    """What the docstring promises, draw for draw: chunk k of the resamples is drawn by the k-th generator spawned
    from the seed, item values gathered as float32 and averaged in float64."""
    d = np.random.default_rng(5).normal(0.0, 1.0, 10)
    monkeypatch.setattr(gate_mod, "_PAR_MIN_DRAWS", 0)
    monkeypatch.setattr(gate_mod, "_PAR_CHUNK", chunk)
    got = boot_means(d, n_boot, seed=11)
    step = max(1, chunk // len(d))
    starts = list(range(0, n_boot, step))
    want = []
    for k, seq in enumerate(np.random.SeedSequence(11).spawn(len(starts))):
        idx = np.random.default_rng(seq).integers(0, len(d), size=(min(step, n_boot - starts[k]), len(d)))
        want.extend(np.take(d.astype(np.float32), idx).sum(axis=1, dtype=np.float64) / len(d))
    assert got.shape == (n_boot,) and got.tolist() == want


def test_the_threaded_path_starts_above_its_threshold_of_draws(monkeypatch):
    d = np.random.default_rng(5).normal(0.0, 1.0, 10)
    serial = boot_means(d, 7, seed=11)  # 70 draws: far below the threshold
    monkeypatch.setattr(gate_mod, "_PAR_CHUNK", 25)
    monkeypatch.setattr(gate_mod, "_PAR_MIN_DRAWS", 70)  # exactly n x n_boot: not above it, still serial
    assert boot_means(d, 7, seed=11).tolist() == serial.tolist()
    monkeypatch.setattr(gate_mod, "_PAR_MIN_DRAWS", 69)
    threaded = boot_means(d, 7, seed=11)
    monkeypatch.setattr(gate_mod, "_PAR_MIN_DRAWS", 0)
    assert threaded.tolist() == boot_means(d, 7, seed=11).tolist() != serial.tolist()
