"""The budget ledger: atomic reservations under concurrency, delegation, reconciliation, recovery after a crash."""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import signal
import subprocess
import sys
import threading

import pytest

from components.evidence.budget import BudgetExceeded, BudgetLedger, Estimate


def _reserve_many(path: str, wallet: str, n: int, seed: int, out) -> None:
    """A reserver: tries `n` random-sized reservations, settles each with a random actual below it."""
    ledger, rng, admitted = BudgetLedger(path), random.Random(seed), 0.0
    for i in range(n):
        ask = rng.randint(1, 40)
        try:
            hold = ledger.reserve(wallet, {"model_calls": ask}, key=f"{seed}-{i}")
        except BudgetExceeded:
            continue
        actual = rng.randint(0, ask)
        ledger.settle(hold, {"model_calls": actual})
        admitted += actual
    out.put(admitted) if hasattr(out, "put") else out.append(admitted)


def _processes():
    """Separate processes (own interpreter state and SQLite connections), forked from a server that imported this
    module's imports once: 48 spawned interpreters, each importing pytest and this module, cost most of the test and
    proved nothing more. A fork server is single-threaded, so forking it is safe where forking pytest is not. Its
    preload names pytest and the ledger too: Python 3.11's fork server does not apply the parent's sys.path, so this
    module (`test_budget`, importable through pytest's path only) fails to preload there, silently, and each child
    imported it, pytest included, itself (~4 of each trial's ~5 s under load)."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["pytest", "components.evidence.budget", __name__])
    return ctx


@pytest.fixture
def memory_dir(tmp_path):
    """A directory in memory (tmpfs) where the system has one, else `tmp_path`. SQLite's locking is the same there
    (file locks and the WAL index in shared memory); only its fsync at each commit is free. The reservers' ~120
    commits per trial, each an fsync of the shared disk (5-30 ms under load, the lock held meanwhile), were most of
    this test's time; what it checks is what concurrent transactions admit, not durability."""
    import shutil
    import tempfile
    from pathlib import Path

    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        yield tmp_path
        return
    d = Path(tempfile.mkdtemp(prefix="ratchet-budget-", dir=shm))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("mode", ["threads", "processes"])
def test_sixteen_concurrent_reservers_never_exceed_the_ceiling(memory_dir, mode):
    ctx = _processes()
    for trial in range(6 if mode == "threads" else 3):
        path = str(memory_dir / f"{mode}-{trial}.sqlite")
        ledger = BudgetLedger(path)
        cap = 500
        wallet = ledger.open_wallet("c", {"model_calls": cap})
        if mode == "threads":
            results: list[float] = []
            workers = [
                threading.Thread(target=_reserve_many, args=(path, wallet, 30, trial * 100 + k, results))
                for k in range(16)
            ]
        else:
            q = ctx.Queue()
            workers = [
                ctx.Process(target=_reserve_many, args=(path, wallet, 30, trial * 100 + k, q)) for k in range(16)
            ]
        for w in workers:
            w.start()
        for w in workers:
            w.join(timeout=300)
        admitted = sum(results) if mode == "threads" else sum(q.get(timeout=60) for _ in workers)
        report = ledger.report(wallet)
        assert report["spent"]["model_calls"] == admitted
        assert admitted <= cap
        assert report["held"]["model_calls"] == 0 and report["open_holds"] == 0
        assert admitted > cap * 0.5  # the ledger admitted real work, it did not just refuse everything


def test_reservation_is_refused_before_work_and_settled_after(tmp_path):
    ledger = BudgetLedger(tmp_path / "b.sqlite")
    w = ledger.open_wallet("c", {"tokens_in": 1000, "model_calls": 10})
    hold = ledger.reserve(w, {"tokens_in": 800, "model_calls": 5})
    with pytest.raises(BudgetExceeded, match="tokens_in"):
        ledger.reserve(w, {"tokens_in": 300})  # the 800 held still counts
    ledger.settle(hold, {"tokens_in": 120, "model_calls": 2})
    ledger.reserve(w, {"tokens_in": 800})  # reconciled: the unused part came back
    assert ledger.report(w)["spent"]["tokens_in"] == 120


def test_a_key_is_paid_for_once(tmp_path):
    ledger = BudgetLedger(tmp_path / "b.sqlite")
    w = ledger.open_wallet("c", {"model_calls": 100})
    h = ledger.reserve(w, {"model_calls": 50}, key="shard-1")
    ledger.settle(h, {"model_calls": 30})
    again = ledger.reserve(w, {"model_calls": 50}, key="shard-1")
    assert again.already_settled
    ledger.settle(again, {"model_calls": 30})
    assert ledger.report(w)["spent"]["model_calls"] == 30


def test_children_spend_only_what_was_transferred(tmp_path):
    ledger = BudgetLedger(tmp_path / "b.sqlite")
    root = ledger.open_wallet("c", {"model_calls": 100, "tokens_in": 1000}, max_depth=1)
    child = ledger.transfer(root, {"model_calls": 40}, key="shard")
    with pytest.raises(BudgetExceeded, match="model_calls"):
        ledger.reserve(child, {"model_calls": 41})
    with pytest.raises(BudgetExceeded, match="tokens_in"):
        ledger.reserve(child, {"tokens_in": 1})  # not transferred: not the child's to spend
    with pytest.raises(BudgetExceeded, match="depth"):
        ledger.transfer(child, {"model_calls": 1})  # deeper than max_depth
    h = ledger.reserve(child, {"model_calls": 30})
    ledger.settle(h, {"model_calls": 12})
    assert ledger.report(root)["available"]["model_calls"] == 60  # 40 still held for the child
    assert ledger.close(child) == {"model_calls": 12}
    assert ledger.report(root)["available"]["model_calls"] == 88  # the unspent 28 came back


def test_concurrency_limit_waits_for_a_free_slot(tmp_path):
    ledger = BudgetLedger(tmp_path / "b.sqlite")
    w = ledger.open_wallet("c", {"model_calls": 100}, max_concurrency=1)
    first = ledger.reserve(w, {"model_calls": 1})
    with pytest.raises(BudgetExceeded, match="concurrency"):
        ledger.reserve(w, {"model_calls": 1})
    threading.Timer(0.3, ledger.settle, args=(first, {"model_calls": 1})).start()
    second = ledger.reserve(w, {"model_calls": 1}, wait=10)
    assert second.id != first.id


def test_wall_time_ceiling(tmp_path):
    ledger = BudgetLedger(tmp_path / "b.sqlite")
    w = ledger.open_wallet("c", {}, wall_seconds=0.01)
    import time

    time.sleep(0.05)
    with pytest.raises(BudgetExceeded, match="wall-time"):
        ledger.reserve(w, {"model_calls": 1})


def test_holds_of_a_killed_process_are_recovered(tmp_path):
    path = tmp_path / "b.sqlite"
    ledger = BudgetLedger(path)
    w = ledger.open_wallet("c", {"model_calls": 100})
    code = (
        "import os, signal, sys; sys.path.insert(0, %r)\n"
        "from components.evidence.budget import BudgetLedger\n"
        "BudgetLedger(%r).reserve('c', {'model_calls': 70}, key='shard')\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    ) % (os.getcwd(), str(path))
    r = subprocess.run([sys.executable, "-c", code])
    assert r.returncode == -signal.SIGKILL
    assert ledger.report(w)["held"]["model_calls"] == 70
    assert ledger.recover(w) == 1
    report = ledger.report(w)
    # the dead process may have spent all it reserved: counted in full, so the ceiling stays true
    assert report["held"]["model_calls"] == 0 and report["spent"]["model_calls"] == 70
    with pytest.raises(BudgetExceeded):
        ledger.reserve(w, {"model_calls": 31}, key="shard")
    hold = ledger.reserve(w, {"model_calls": 30}, key="shard")  # redone as new work, not taken for paid
    assert not hold.already_settled
    ledger.settle(hold, {"model_calls": 9})
    assert ledger.report(w)["spent"]["model_calls"] == 79


@pytest.mark.parametrize("max_turns", [4, 40])
def test_estimate_is_an_upper_bound_on_calls(tmp_path, bench, max_turns):
    """A shard's reservation covers what its episodes really spend, as the ledger records it after settling:
    per episode, and in total, for packages whose checkers redraft (reference) and those that never do."""
    from components.evidence.budget import RESOURCES, usage
    from components.params import load_params
    from components.runtime.evaluate import run_shard
    from tests.conftest import PACKAGES, ROOT

    b = load_params(ROOT / "params.yaml", {}).budget  # the shipped reservation figures, not numbers picked to pass
    est = Estimate(
        max_turns=max_turns,
        tokens_in_per_call=b.est_tokens_in_per_call,
        tokens_out_per_call=b.est_tokens_out_per_call,
        price_in_per_1k=0.001,
        price_out_per_1k=0.002,
    )
    ledger = BudgetLedger(tmp_path / "budget.sqlite")
    w = ledger.open_wallet("w", {})
    items, seeds, reserved, redrafts = bench.ids("train")[:24], [0, 1], dict.fromkeys(RESOURCES, 0.0), 0
    actual = dict.fromkeys(("model_calls", "tool_calls", "tokens_in", "tokens_out"), 0)
    for name in ("seed", "reference"):
        ask = est.episodes(len(items) * len(seeds))
        hold = ledger.reserve(w, ask, key=name)
        scores = run_shard(PACKAGES / name, bench, items, seeds, max_turns=max_turns).scores
        ledger.settle(hold, usage(scores, est))
        one = est.episodes(1)
        for col in ("model_calls", "tool_calls", "tokens_in", "tokens_out"):
            assert (scores[col] <= one[col]).all(), (name, col, scores[col].max(), one[col])
        assert (scores["turns"] <= max_turns).all()
        for col in actual:
            actual[col] += int(scores[col].sum())
        redrafts += int((scores["model_calls"] > 2 * scores["turns"]).sum())  # propose + draft + a redraft
        for k in RESOURCES:
            reserved[k] += ask[k]
    report = ledger.report(w)
    assert report["open_holds"] == 0 and all(v == pytest.approx(0) for v in report["held"].values())
    for k in RESOURCES:
        assert 0 < report["spent"][k] <= reserved[k], k
    # what the ledger records is the episodes' actual usage, reconciled, not the estimate it reserved
    assert {k: report["spent"][k] for k in actual} == actual
    assert report["spent"]["money"] == pytest.approx(
        report["spent"]["tokens_in"] / 1000 * 0.001 + report["spent"]["tokens_out"] / 1000 * 0.002
    )
    # and the bound is not loose by construction: some turns really did make three calls
    assert redrafts > 0
