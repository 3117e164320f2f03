"""Stage cache keys: a benchmark edited in place in a long-lived process (a `ratchet worker`) gets a new key."""

from __future__ import annotations

import os
import shutil
import time

import pytest

from components.memory import digest


@pytest.mark.parametrize("name", ["tasks.jsonl", "policy.md", "db.json"])
def test_an_in_place_edit_changes_the_benchmark_key(tmp_path, bench_dir, monkeypatch, name):
    import flows.tasks as tasks

    monkeypatch.setattr(tasks, "RACY_NS", 200_000_000)  # the racy window, shortened so the test waits 0.25 s, not 2
    bench = tmp_path / "bench"
    shutil.copytree(bench_dir, bench)
    assert tasks.tree_digest(bench) == digest(bench)  # just written: racy, hashed in full
    time.sleep(0.25)
    before = tasks.tree_digest(bench)
    hits = tasks._tree_digest.cache_info().hits
    assert tasks.tree_digest(bench) == before and tasks._tree_digest.cache_info().hits == hits + 1  # memoized now
    key_before = tasks.inputs_key(
        tasks.diagnose_stage.fn, {"package": "data/packages/seed", "bench": str(bench), "corpus": "c"}
    )

    # flip one byte in place: same size, and every mtime in the tree (meta.json's and the file's own) restored
    stamps = {p: os.stat(bench / p).st_mtime_ns for p in ("meta.json", name)}
    data = bytearray((bench / name).read_bytes())
    i = data.index(b"e")
    data[i : i + 1] = b"E"
    with open(bench / name, "r+b") as f:
        f.write(bytes(data))
    for p, ns in stamps.items():
        os.utime(bench / p, ns=(ns, ns))
    assert (bench / name).stat().st_size == len(data)

    now = tasks.tree_digest(bench)
    assert now != before and now == digest(bench)
    time.sleep(0.25)  # out of the racy window: the memo is consulted again, and must not serve the old digest
    assert tasks.tree_digest(bench) == now
    assert (
        tasks.inputs_key(tasks.diagnose_stage.fn, {"package": "data/packages/seed", "bench": str(bench), "corpus": "c"})
        != key_before
    )


def test_a_package_key_follows_its_cards(tmp_path, package_copy, monkeypatch):
    import flows.tasks as tasks

    monkeypatch.setattr(tasks, "RACY_NS", 0)  # memoize at once: only the stat key can tell the trees apart
    pkg = package_copy("reference")
    card = next((pkg / "em").rglob("*.md"))
    time.sleep(0.05)  # past one tick of the file system's coarse clock
    before = tasks.tree_digest(pkg)
    card.write_text(card.read_text() + "\nOne more line.\n")
    assert tasks.tree_digest(pkg) == digest(pkg) != before
    card.unlink()
    (pkg / "em" / "extra.md").write_text("x")  # a file removed and another added
    assert tasks.tree_digest(pkg) == digest(pkg)


def test_results_persisted_before_level_1_still_load(tmp_path):
    """Task results are now packed by flows/resultzip.py; a result store written with Prefect's plain "zlib" (before)
    must still load on a resume (each record names the serializer that wrote it), and the new records round-trip."""
    import pandas as pd
    from prefect.filesystems import LocalFileSystem
    from prefect.results import ResultStore
    from prefect.serializers import CompressedSerializer, PickleSerializer

    from flows.tasks import PERSIST

    storage = LocalFileSystem(basepath=str(tmp_path))
    frame = pd.DataFrame({"item_id": [f"t{i}" for i in range(200)], "score": [i / 7 for i in range(200)]})
    old = ResultStore(
        result_storage=storage, serializer=CompressedSerializer(serializer=PickleSerializer(), compressionlib="zlib")
    )
    old.write(frame, key="before")
    new = ResultStore(result_storage=storage, serializer=PERSIST["result_serializer"])
    new.write(frame, key="after")
    for key in ("before", "after"):
        pd.testing.assert_frame_equal(new.read(key).result, frame)
    assert new.read("after").metadata.serializer.compressionlib == "flows.resultzip"
    assert (tmp_path / "after").stat().st_size < (tmp_path / "before").stat().st_size  # raw bytes pack smaller


def test_a_stage_key_is_derived_from_its_own_signature(tmp_path, bench_dir):
    """Each parameter enters the key as its annotation says: a directory by its bytes (a copy elsewhere: the same
    key), a table by its rows, a parameter marked OFF not at all (the budget, a label); any other by value."""
    import pandas as pd

    import flows.tasks as tasks
    from components.evidence.budget import BudgetSpec, Estimate
    from tests.conftest import PACKAGES

    pkg = tmp_path / "pkg"
    shutil.copytree(PACKAGES / "seed", pkg)
    args = {
        "package": str(PACKAGES / "seed"),
        "bench": str(bench_dir),
        "items": ["a"],
        "seeds": [0],
        "model": "sim",
        "model_cfg": {},
        "max_turns": 40,
    }
    key = tasks.inputs_key(tasks.eval_shard.fn, args)
    assert tasks.inputs_key(tasks.eval_shard.fn, {**args, "package": str(pkg)}) == key  # the same bytes elsewhere
    spec = BudgetSpec(
        db="b.sqlite", wallet="w", estimate=Estimate(max_turns=40, tokens_in_per_call=1, tokens_out_per_call=1)
    )
    assert tasks.inputs_key(tasks.eval_shard.fn, {**args, "label": "x", "budget": spec}) == key  # OFF
    for name, other in (
        ("items", ["b"]),
        ("seeds", [1]),
        ("model", "openai"),
        ("model_cfg", {"t": 1}),
        ("max_turns", 8),
    ):
        assert tasks.inputs_key(tasks.eval_shard.fn, {**args, name: other}) != key, name
    (pkg / "instructions.md").write_text("another package")
    assert tasks.inputs_key(tasks.eval_shard.fn, {**args, "package": str(pkg)}) != key
    a = pd.DataFrame({"item_id": ["a"], "seed": [0], "score": [1.0]})
    look = {"base": a, "cand": a, "where": "w"}
    assert tasks.inputs_key(tasks.paired_contract.fn, look) == tasks.inputs_key(
        tasks.paired_contract.fn, {**look, "cand": a.copy()}
    )
    assert tasks.inputs_key(tasks.paired_contract.fn, look) != tasks.inputs_key(
        tasks.paired_contract.fn, {**look, "cand": a.assign(score=[0.0])}
    )
