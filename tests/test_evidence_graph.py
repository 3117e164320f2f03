"""The evidence graph and its write policy: one test per rule, append-only versions, and a kill -9 mid-write."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from components.evidence.graph import EvidenceGraph, Expiry, integrity
from components.evidence.graph_policy import CitationError, PolicyError
from tests.conftest import ROOT

H1, H2 = "a" * 64, "b" * 64


@pytest.fixture(scope="module")
def postgres(tmp_path_factory):
    """A real Postgres server from the `postgres` extra (pgserver ships its binaries; psycopg is the driver), for this
    module's tests; skipped when the extra is not installed, unless RATCHET_REQUIRE_POSTGRES=1 (CI: .ci/run), where
    a missing extra is an error like a server that fails to start, so the Postgres cases cannot silently not run."""
    if os.environ.get("RATCHET_REQUIRE_POSTGRES") == "1":
        import pgserver
        import psycopg  # noqa: F401
    else:
        pgserver = pytest.importorskip("pgserver")
        pytest.importorskip("psycopg")
    # run as root, pgserver starts the server as its own user, which must reach the data directory: pytest's
    # temporary directories are private to root, so this one is made under the system's temp dir, traversable
    home = Path(tempfile.mkdtemp(prefix="ratchet-pg-"))
    home.chmod(0o755)
    root = home / "data"
    srv = pgserver.get_server(root, cleanup_mode="stop")
    # a throwaway server on a shared 2-core machine: no fsync, so its shutdown checkpoint is quick
    srv.psql("ALTER SYSTEM SET fsync = off;")
    srv.psql("ALTER SYSTEM SET synchronous_commit = off;")
    srv.psql("SELECT pg_reload_conf();")
    try:
        yield srv, root
    finally:
        srv.cleanup()  # stops the server this fixture started
        shutil.rmtree(home, ignore_errors=True)


def _pg_url(request, tmp_path) -> str:
    srv, root = request.getfixturevalue("postgres")
    name = "t_" + tmp_path.name.lower().replace("-", "_")[:50]  # a fresh database per test
    srv.psql(f"CREATE DATABASE {name};")
    return f"postgresql+psycopg://postgres@/{name}?host={root}"


# the Postgres cases run on one xdist worker (tests/conftest.py), which starts the one server (~4 s, +2 s to stop)
@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.xdist_group("postgres"))])
def where(request, tmp_path):
    """The graph's store: the embedded SQLite file, and a shared Postgres server when the extra is installed."""
    return tmp_path / "evidence.db" if request.param == "sqlite" else _pg_url(request, tmp_path)


@pytest.fixture
def g(where):
    graph = EvidenceGraph(where, campaign="t")
    yield graph
    graph.close()


def _verdict(g, key="gate-1", accept=True):
    return g.add("decision", key, "gate verdict", {"type": "gate_verdict", "accept": accept})


def _claim(g, key="c1", steps=((("e#0", 2, H1)),)):
    c = g.add("claim", key, "refusals of a write quote a rule", author="meta_agent")
    for ep, step, h in steps:
        g.cite(c.id, ep, step, h)
    return c


def test_a_models_claim_enters_unverified_and_cannot_ask_for_more(g):
    assert g.add("claim", "c", "x", author="model").confidence == "unverified"
    assert g.add("claim", "h", "x", author="harness").confidence == "unverified"  # claims: whoever makes them
    with pytest.raises(PolicyError, match="enters unverified"):
        g.add("claim", "c2", "x", author="meta_agent", confidence="supported")
    assert g.add("run", "r", "eval").confidence == "supported"  # the harness observed it


def test_an_unverified_claim_cannot_support_a_promotion(g):
    c, v = _claim(g), _verdict(g)
    with pytest.raises(PolicyError, match="only supported claims"):
        g.promote("p1", "promote M1", v.id, [c.id])
    assert [n for n in g.nodes("decision") if n.data.get("type") == "promotion"] == []
    g.verify(c.id, lambda ep, step: H1)
    p = g.promote("p1", "promote M1", v.id, [c.id])
    assert {e.src for e in g.edges(dst=p.id, relation="supports")} == {c.id, v.id}


def test_a_promotion_needs_an_accepting_gate_verdict(g):
    c = _claim(g)
    g.verify(c.id, lambda ep, step: H1)
    with pytest.raises(PolicyError, match="did not accept"):
        g.promote("p", "x", _verdict(g, "g-no", accept=False).id, [c.id])
    with pytest.raises(PolicyError, match="not a gate verdict"):
        g.promote("p", "x", c.id, [c.id])
    with pytest.raises(PolicyError, match="through promote"):
        g.add("decision", "p", "x", {"type": "promotion"})


@pytest.mark.parametrize("recorded,match", [(None, "does not resolve"), (H2, "hash")])
def test_a_broken_citation_is_refused(g, recorded, match):
    c = _claim(g, steps=[("e#0", 2, H1), ("e#1", 5, H1)])
    table = {("e#0", 2): H1, ("e#1", 5): recorded}
    with pytest.raises(CitationError, match=match):
        g.verify(c.id, lambda ep, step: table[(ep, step)])
    assert g.get(c.id).confidence == "unverified" and len(g.versions(c.id)) == 1
    with pytest.raises(CitationError, match="no citation"):
        g.verify(g.add("claim", "bare", "no evidence").id, lambda ep, step: H1)


def test_contradicting_evidence_opens_a_contested_branch_and_keeps_both_sides(g):
    old = _claim(g, "accepted-on-d1")
    g.verify(old.id, lambda ep, step: H1)
    new = g.add("claim", "rejected-on-d2", "the same plan is rejected on d2", author="harness")
    g.link(new.id, "contradicts", old.id)
    assert g.get(old.id).confidence == "contested" and g.get(new.id).confidence == "contested"
    assert [v.confidence for v in g.versions(old.id)] == ["unverified", "supported", "contested"]
    assert g.get(old.id).content == old.content  # never overwritten
    assert [e.relation for e in g.edges(src=new.id)] == ["contradicts"]
    # a later re-recording of the same content changes nothing; other content is a new version, the old kept
    assert g.add("claim", "accepted-on-d1", old.content, author="meta_agent").version == 3
    changed = g.add("claim", "accepted-on-d1", "restated", author="meta_agent")
    assert changed.version == 4 and g.versions(old.id)[0].content == old.content


def test_observations_expire_when_their_digest_model_or_backend_changes(g):
    tied = g.add("run", "eval-1", "train eval", expiry=Expiry(benchmark="d1" * 32, model="sim"))
    assert g.expired(tied, Expiry(benchmark="d1" * 32, model="sim")) == []
    assert g.expired(tied, Expiry(benchmark="d1" * 32)) == []  # unknown now: not a change
    why = g.expired(tied, Expiry(benchmark="d2" * 32, model="sim"))
    assert len(why) == 1 and why[0].startswith("benchmark changed")
    assert g.expired(tied, Expiry(benchmark="d1" * 32, model="gpt")) == ["model changed (sim -> gpt)"]
    assert g.expired(g.add("source", "policy", "text"), Expiry(benchmark="d2" * 32)) == []  # tied to nothing


def test_a_revoked_node_flags_everything_derived_from_it(g):
    c = _claim(g)
    g.verify(c.id, lambda ep, step: H1)
    v = _verdict(g)
    promo = g.promote("p1", "M1", v.id, [c.id])
    card = g.add("artifact", "card:x", "card x", {"type": "card"})
    g.link(card.id, "derived_from", promo.id)
    later = g.add("decision", "plan-2", "a plan built on card x", {"type": "plan"}, author="meta_agent")
    g.link(card.id, "used_in", later.id)
    unrelated = g.add("source", "bench", "benchmark")
    flagged = g.revoke(c.id, "the rule changed")
    assert flagged == {promo.id: c.id, card.id: c.id, later.id: c.id}
    assert unrelated.id not in g.flagged() and v.id not in g.flagged()
    assert g.revoked()[c.id]["reason"] == "the rule changed"
    with pytest.raises(PolicyError, match="says why"):
        g.revoke(v.id, "  ")


WRITER = """
import os, sys, time
sys.path.insert(0, {root!r})
from components.evidence.graph import EvidenceGraph
g = EvidenceGraph({db!r}, campaign="w")
i = 0
while True:  # each transaction: a claim, its citation and the edge, all or nothing
    with g.batch():
        c = g.add("claim", f"c{{i}}", "x" * 2000, author="model")
        g.cite(c.id, f"e#{{i}}", 1, "a" * 64)
        if i == 0:
            print("ready", flush=True)
    i += 1
"""


def test_kill_9_during_graph_writes_leaves_the_graph_consistent(where):
    db = where
    env = {**os.environ}
    # a process killed with its transaction's rows written but not committed
    script = WRITER.format(root=str(ROOT), db=str(db))
    r = subprocess.run(
        [sys.executable, "-c", script],
        env={**env, "RATCHET_FAILPOINT": "evidence:before-commit"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == -signal.SIGKILL
    assert integrity(db) == [] and EvidenceGraph(db).nodes() == []
    # a writer killed at an arbitrary moment, mid-stream
    proc = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(0.5)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert integrity(db) == []
    g = EvidenceGraph(db)
    claims, arts = g.nodes("claim"), g.nodes("artifact")
    assert len(claims) >= 1 and len(claims) == len(arts)  # no claim without its citation, nor the reverse
    for c in claims:
        assert len(g.citations(c.id)) == 1
    g.add("claim", "after", "the graph takes writes again")


def test_concurrent_writers_queue_and_leave_no_version_gap(where):
    """Two writers re-versioning the same node at once: each write reads the latest version and appends the next, so
    without the write lock (BEGIN IMMEDIATE on SQLite, the advisory lock on Postgres) both would append the same
    version and one would fail on the primary key."""
    from concurrent.futures import ThreadPoolExecutor

    def writer(w: int) -> int:
        with EvidenceGraph(where, campaign=f"w{w}") as gw:
            for i in range(12):
                gw.add("claim", "shared", f"writer {w} statement {i}", author="model")
        return w

    EvidenceGraph(where).close()  # the tables exist: what races below is the versions
    with ThreadPoolExecutor(2) as pool:
        assert sorted(pool.map(writer, (1, 2))) == [1, 2]
    assert integrity(where) == []
    with EvidenceGraph(where) as g:
        (node,) = g.nodes("claim")
        assert [v.version for v in g.versions(node.id)] == list(range(1, 25))


@pytest.mark.parametrize("where,match", [("bogus://x", "not a database URL"), ("/proc/nope/e.db", "cannot create")])
def test_a_graph_that_cannot_be_opened_is_one_clear_error(where, match):
    from components.evidence.graph import GraphError

    with pytest.raises(GraphError, match=match):
        EvidenceGraph(where)
