"""A campaign's traces land in its own store (`campaign.tracking_uri`), with its runs, whatever the process's tracking
URI is; logging them again adds none twice. Logged in-process from the session's shared small campaign's files."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import mlflow
import pandas as pd
import pytest
from mlflow import MlflowClient
from mlflow.tracking._tracking_service import utils as tracking_utils

from components.tracking.mlflow_log import MAX_TRACES_PER_PACKET, CampaignTracker


def _cited(rd, cap: int) -> dict[str, str]:
    """The episodes round `rd` logs as traces, episode -> the packet that cites it first: each packet's first cited
    episodes, up to the round's cap (`campaign.traces_per_round`)."""
    chosen: dict[str, str] = {}
    for pk in json.loads((rd / "diagnosis.json").read_text()):
        eps = list(dict.fromkeys(c["episode_id"] for claim in pk["claims"] for c in claim["evidence"]))
        for ep in eps[:MAX_TRACES_PER_PACKET]:
            if ep not in chosen and len(chosen) < cap:
                chosen[ep] = pk["id"]
    return chosen


def _round_runs(client, exp_id: str) -> dict[int, object]:
    runs = client.search_runs([exp_id], "tags.`ratchet.kind` = 'round'", max_results=100)
    return {int(r.data.tags["ratchet.round"]): r for r in runs}


def _all_traces(client, exp_ids: list[str]) -> list:
    return client.search_traces(locations=exp_ids, max_results=1000) if exp_ids else []


def _traces_in_store(db) -> list:
    """Every trace in the SQLite store at `db` (none when nothing ever opened it)."""
    if not db.exists():
        return []
    client = MlflowClient(f"sqlite:///{db}")
    return _all_traces(client, [e.experiment_id for e in client.search_experiments()])


@pytest.fixture
def two_stores(tmp_path, monkeypatch):
    """The process's tracking URI is store A (env and mlflow's own setting, its trace exporter rebuilt for it); the
    campaign's is store B. Everything is put back afterwards."""
    a, b = f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path / 'b.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", a)
    monkeypatch.setattr(tracking_utils, "_tracking_uri", a)
    mlflow.tracing.reset()  # MLflow's exporter takes the process's URI when it is built: build it for A
    try:
        yield a, b
    finally:
        monkeypatch.undo()
        mlflow.tracing.reset()


def test_traces_land_in_the_campaigns_store_not_the_processs(small_campaign, tmp_path, two_stores):
    a, b = two_stores
    s, p = small_campaign.summary, small_campaign.params
    out = tmp_path / "camp"
    shutil.copytree(small_campaign.out, out, ignore=shutil.ignore_patterns(".state"))  # logged afresh into B

    def log() -> CampaignTracker:
        t = CampaignTracker(p.campaign.name, out, p.model_dump(), tracking_uri=b, artifact_root=tmp_path / "art")
        for rec in s["history"]:
            t.log_round(rec)
        t.log_versions()  # registering a version must not look its logged model up in the process's store
        return t

    t = log()
    assert mlflow.get_tracking_uri() == a  # the tracker did not move the process's URI
    cb = MlflowClient(b)
    exp_id = t.experiment_id
    assert cb.get_experiment(exp_id).name == s["mlflow"]["experiment"] == t.experiment_name
    versions = cb.search_model_versions(f"name = '{t.model_name}'")
    assert sorted(v.tags["ratchet.digest"] for v in versions) == sorted(v["digest"] for v in s["lineage"])
    rounds = _round_runs(cb, exp_id)
    expected = {}
    for n, run in rounds.items():
        rd = out / "rounds" / f"r{n:02d}"
        if (rd / "diagnosis.json").exists() and (rd / "train" / "traces.parquet").exists():
            expected[n] = _cited(rd, p.campaign.traces_per_round)
    assert any(expected.values()), "the small campaign cites no failed episode: nothing to test"
    # `campaign.traces_per_round` bounds them: a round citing more episodes logs that many, from more than one packet
    cap = p.campaign.traces_per_round
    assert any(
        len(_cited(out / "rounds" / f"r{n:02d}", 10**6)) > cap == len(c) and len(set(c.values())) > 1
        for n, c in expected.items()
    ), (cap, expected)

    # store B has every cited episode as a trace of its round run, with all its spans and its tags
    by_id = {}
    for n, cited in expected.items():
        run = rounds[n]
        traces = cb.search_traces(locations=[exp_id], run_id=run.info.run_id, max_results=100)
        got = {tr.info.tags["ratchet.episode"]: tr for tr in traces}
        assert set(got) == set(cited), n
        steps = pd.read_parquet(out / "rounds" / f"r{n:02d}" / "train" / "traces.parquet")
        for ep, tr in got.items():
            by_id[tr.info.trace_id] = (n, ep)
            assert tr.info.tags["ratchet.packet"] == cited[ep] and tr.info.tags["ratchet.round"] == str(n)
            assert tr.info.trace_metadata["mlflow.sourceRun"] == run.info.run_id
            assert tr.info.state.value == "ERROR" and tr.info.experiment_id == exp_id
            assert tr.info.trace_id in run.data.tags["mlflow.note.content"]  # the round's description links it
            spans = tr.data.spans
            root = [sp for sp in spans if sp.parent_id is None]
            assert [sp.name for sp in root] == [f"episode {ep}"]
            turns = [sp for sp in spans if sp.parent_id == root[0].span_id]
            assert len(turns) == int((steps["episode_id"] == ep).sum()) and any(
                x.name.endswith("(cited)") for x in turns
            )
            children = 0
            for turn in turns:  # every kernel phase under every turn, each as often as it ran (a redraft calls again)
                names = [sp.name for sp in spans if sp.parent_id == turn.span_id]
                assert set(names) == {"checker verdicts", "memory delivered", "model call", "tool call"}, names
                children += len(names)
            assert len(spans) == 1 + len(turns) + children
    # ... and no other trace; store A (the process's) has none at all
    assert set(by_id) == {tr.info.trace_id for tr in _all_traces(cb, [exp_id])}
    assert _traces_in_store(tmp_path / "a.db") == []

    # a forced rerun finds its runs again (in the store, by their key) and adds no trace
    again = log()
    assert again.run_id == t.run_id
    assert len(cb.search_model_versions(f"name = '{t.model_name}'")) == len(versions)
    assert {tr.info.trace_id for tr in _all_traces(cb, [exp_id])} == set(by_id)

    # a round half-logged by a killed process is logged again, its traces replaced rather than doubled
    n = next(n for n, cited in expected.items() if cited)
    old_run = rounds[n].info.run_id
    cb.update_run(old_run, status="RUNNING")
    new_run = CampaignTracker(p.campaign.name, out, p.model_dump(), tracking_uri=b).log_round(
        next(r for r in s["history"] if int(r["round"]) == n)
    )
    assert new_run != old_run
    now = _all_traces(cb, [exp_id])
    assert len(now) == len(by_id)
    relogged = {tr.info.tags["ratchet.episode"] for tr in cb.search_traces(locations=[exp_id], run_id=new_run)}
    assert relogged == set(expected[n])
    assert mlflow.get_tracking_uri() == a and _traces_in_store(tmp_path / "a.db") == []


def test_a_new_store_is_a_copy_of_a_migrated_one(tmp_path, monkeypatch):
    """A new SQLite store starts from the template (MLflow's own migrated store, its Default experiment removed):
    once MLflow opens the copy it has every table, index and row a store MLflow migrated itself has; an existing
    store is never replaced."""
    import sqlite3

    from components.tracking.mlflow_log import new_store_from_template

    db = tmp_path / "new" / "m.db"
    new_store_from_template(f"sqlite:///{db}")
    MlflowClient(f"sqlite:///{db}").search_experiments()  # MLflow opens it: adds its Default experiment
    template = next(
        (Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ratchet").glob(
            f"mlflow-{mlflow.__version__}-*.db"
        )
    )

    def dump(path) -> set[str]:
        with sqlite3.connect(path) as con:
            return set(con.iterdump())

    copy, made = dump(db), dump(template)
    # at MLflow's latest schema revision, with every table of its models
    from mlflow.store.db.base_sql_model import Base
    from mlflow.store.db.utils import _get_latest_schema_revision

    with sqlite3.connect(db) as con:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert con.execute("SELECT version_num FROM alembic_version").fetchall() == [(_get_latest_schema_revision(),)]
    assert set(Base.metadata.tables) <= tables and len(Base.metadata.tables) > 20
    default = [x for x in copy - made if x.startswith('INSERT INTO "experiments"')]
    assert copy - made == set(default) and made <= copy  # the schema and every other row are MLflow's
    assert len(default) == 1 and "VALUES(0,'Default'," in default[0]
    assert MlflowClient(f"sqlite:///{db}").get_experiment("0").name == "Default"
    # an existing store is left as it is
    MlflowClient(f"sqlite:///{db}").create_experiment("kept")
    before = db.read_bytes()
    new_store_from_template(f"sqlite:///{db}")
    assert db.read_bytes() == before
    # no cache to write (here: the cache dir is a file): nothing is made, MLflow makes the store as before
    (tmp_path / "not-a-dir").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "not-a-dir"))
    new_store_from_template(f"sqlite:///{tmp_path / 'other' / 'm.db'}")
    assert not (tmp_path / "other" / "m.db").exists()
