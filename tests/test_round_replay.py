"""A whole round from the cache (flows.replay.play_round): replayed byte for byte on the same inputs, run again when
what the plan read from the campaign memory differs."""

from __future__ import annotations

import hashlib
from pathlib import Path

import flows.campaign
import flows.replay
import flows.round
from tests.conftest import small_params


def _files(out: Path) -> dict[str, str]:
    return {
        f.relative_to(out).as_posix(): hashlib.sha256(f.read_bytes()).hexdigest()
        for f in sorted((out / "rounds").rglob("*"))
        if f.is_file()
    }


def test_a_round_is_replayed_whole_only_on_the_same_inputs_and_memory(prefect_server, tmp_path, monkeypatch):
    from components.evidence.graph_record import Memory
    from components.worlds import world

    # a sixth of the session's benchmark (6 tasks per family): replaying a round does not depend on its size. No MLflow
    # traces: a replay does not depend on them either, and no claim here reads them
    bench_dir = world("retail").materialize(tmp_path / "bench", 0, 6)

    runs = []
    real = flows.replay.run_round
    monkeypatch.setattr(flows.replay, "run_round", lambda *a, **k: runs.append(a[0]) or real(*a, **k))
    camp = lambda name: small_params(  # noqa: E731
        bench_dir,
        tmp_path / name,
        **{  # noqa: E731
            "campaign.name": f"replay-{name}",
            "campaign.rounds": 1,
            "campaign.seeds": 1,
            "gate.n_boot": 1000,
            "benchmark.per_family": 6,
            "evidence.memory": True,
            "evidence.db": str(tmp_path / f"{name}.db"),
            "campaign.traces_per_round": 0,
        },
    )

    first = flows.campaign.run_campaign(camp("a"))
    ran = len(runs)  # 1, or 0 when another test in this process already ran a round on the same inputs
    assert runs == [1] * ran and ran <= 1
    again = flows.campaign.run_campaign(camp("b"))  # a new campaign on the same bytes: the round is not run
    assert len(runs) == ran
    assert _files(tmp_path / "b") == _files(tmp_path / "a")
    assert again["lineage"] == first["lineage"] and again["history"][0]["verdict"] == first["history"][0]["verdict"]

    # the same inputs, but the campaign memory now tells the plan something else: the round runs
    other = lambda *a, **k: Memory(rejected_elsewhere=["other"])  # noqa: E731
    monkeypatch.setattr(flows.replay, "memory_for_round", other)  # what the replay asks again
    monkeypatch.setattr(flows.round, "memory_for_round", other)  # and what the round's plan reads
    flows.campaign.run_campaign(camp("c"))
    assert runs == [1] * (ran + 1)


def test_an_unreadable_kept_round_is_a_miss_and_a_bug_raises(monkeypatch):
    """What a damaged record raises when read (a file cut short, bad JSON or base64, a broken zlib stream or pickle)
    is a miss: the round runs. Any other exception is a bug and reaches the caller."""
    import pickle
    import zlib

    import pytest

    class Store:
        def __init__(self, exc: BaseException):
            self.exc = exc

        def exists(self, key):
            return True

        def read(self, key):
            raise self.exc

    for exc in (
        zlib.error("incomplete stream"),
        EOFError("ran out of input"),
        pickle.UnpicklingError("truncated"),
        ValueError("not JSON"),
        FileNotFoundError("gone"),
    ):
        monkeypatch.setattr(flows.replay, "_round_store", lambda exc=exc: Store(exc))
        assert flows.replay.replay_round("k", 1, None, None) is None
    monkeypatch.setattr(flows.replay, "_round_store", lambda: Store(TypeError("a bug")))
    with pytest.raises(TypeError, match="a bug"):
        flows.replay.replay_round("k", 1, None, None)
