"""Campaign memory: a typed, versioned, append-only evidence graph (docs/memory.md).

    node   source | run | claim | artifact | decision | question, each with a version, a confidence
           (unverified | supported | contested) and optional expiry keys (benchmark digest, model, backend version)
    edge   src --supports | contradicts | derived_from | used_in | supersedes--> dst
    revocation   a person's or the loop's "this node is wrong", with a reason; everything derived from it is flagged

Append-only: nothing is ever updated or deleted. A changed node is a new row with version + 1 (the old one stays and
can be read); a revocation is a row of its own. Every write is one transaction, so a process killed in the middle of
a write (kill -9) leaves the graph as it was before that write.

Every write goes through the write policy (`graph_policy.py`, the one home of the rules); this module is the store.

The store is SQLAlchemy Core over a URL: a path or `sqlite:///...` is an embedded SQLite file (WAL, IMMEDIATE
transactions, so concurrent writers serialize instead of interleaving); `postgresql://...` (any SQLAlchemy URL with an
installed driver) is a shared server database with the same tables and statements; its writers serialize on an
advisory lock (tests/test_evidence_postgres.py runs the graph against a real server when the `postgres` extra is
installed).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import sqlalchemy as sa

from components.errors import InputError, StorageError, storage_problem
from components.failpoints import failpoint

# the records, re-exported: callers import them from here, as before the split
from components.evidence.graph_models import (
    KINDS,
    RELATIONS,
    Author,
    Confidence,
    Edge,
    Expiry,  # noqa: F401
    Kind,
    Node,
    Relation,
    node_id,
)
from components.evidence.graph_policy import POLICY, PolicyError


META = sa.MetaData()
NODE = sa.Table(
    "evidence_node",
    META,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("version", sa.Integer, primary_key=True),
    sa.Column("kind", sa.String(16), nullable=False),
    sa.Column("key", sa.Text, nullable=False),
    sa.Column("content", sa.Text, nullable=False),
    sa.Column("data", sa.Text, nullable=False),
    sa.Column("confidence", sa.String(16), nullable=False),
    sa.Column("author", sa.String(16), nullable=False),
    sa.Column("campaign", sa.Text, nullable=False),
    sa.Column("expiry", sa.Text, nullable=True),
    sa.Column("created", sa.Float, nullable=False),
    sa.CheckConstraint("confidence IN ('unverified', 'supported', 'contested')", name="ck_confidence"),
)
EDGE = sa.Table(
    "evidence_edge",
    META,
    sa.Column("src", sa.String(64), primary_key=True),
    sa.Column("relation", sa.String(16), primary_key=True),
    sa.Column("dst", sa.String(64), primary_key=True),
    sa.Column("campaign", sa.Text, nullable=False),
    sa.Column("created", sa.Float, nullable=False),
)
REVOCATION = sa.Table(
    "evidence_revocation",
    META,
    sa.Column("node", sa.String(64), primary_key=True),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("by", sa.Text, nullable=False),
    sa.Column("created", sa.Float, nullable=False),
)
REVOCATION_NOTE = sa.Table(  # every later reason given for a node already revoked (the first is in evidence_revocation)
    "evidence_revocation_note",
    META,
    sa.Column("node", sa.String(64), primary_key=True),
    sa.Column("created", sa.Float, primary_key=True),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("by", sa.Text, nullable=False),
)
MENTION = sa.Table(  # which campaign recorded (or re-recorded) a node: memory reads what *other* campaigns learned
    "evidence_mention",
    META,
    sa.Column("node", sa.String(64), primary_key=True),
    sa.Column("scope", sa.String(64), primary_key=True),
)
sa.Index("evidence_node_kind", NODE.c.kind)
sa.Index("evidence_edge_dst", EDGE.c.dst, EDGE.c.relation)


WRITE_LOCK = 0x52415443  # the advisory lock id of the graph's writers on a shared Postgres server ("RATC")


class GraphError(InputError):
    """The graph cannot be opened or read (a bad URL, a damaged file)."""


def _url(where: str | Path) -> str:
    s = str(where)
    return s if "://" in s else f"sqlite:///{Path(s).resolve()}"


def _engine(url: str) -> sa.Engine:
    if url.startswith("sqlite"):
        eng = sa.create_engine(url, connect_args={"timeout": 60})

        @sa.event.listens_for(eng, "connect")
        def _connect(dbapi, _record):  # let SQLAlchemy own BEGIN, and make it IMMEDIATE below
            dbapi.isolation_level = None
            dbapi.execute("PRAGMA journal_mode=WAL")
            dbapi.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: a crash loses no committed transaction's order
            dbapi.execute("PRAGMA busy_timeout=60000")

        @sa.event.listens_for(eng, "begin")
        def _begin(conn):  # take the write lock at BEGIN: a read-then-write cannot race another writer
            conn.exec_driver_sql("BEGIN IMMEDIATE")

        return eng
    # a shared server: writers serialize on one transaction-scoped advisory lock taken at BEGIN (as BEGIN IMMEDIATE
    # does on SQLite), and READ COMMITTED lets each statement after the lock see every earlier writer's commit; under
    # SERIALIZABLE the snapshot would predate the lock wait and concurrent writers would fail instead of queueing
    eng = sa.create_engine(url, isolation_level="READ COMMITTED")
    if eng.dialect.name == "postgresql":

        @sa.event.listens_for(eng, "begin")
        def _lock(conn):
            conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({WRITE_LOCK})")

    return eng


DAMAGED = ("malformed", "not a database", "file is encrypted", "database corrupt")


def damage(e: BaseException) -> str | None:
    """What a SQLite error says about a damaged file (None when it is about something else)."""
    text = str(getattr(e, "orig", None) or e)
    return text if any(d in text.lower() for d in DAMAGED) else None


def damaged_graph(where: str | Path, what: str) -> GraphError:
    what = " ".join(what.split())  # quick_check's findings come a line each
    what = what if len(what) <= 160 else what[:157] + "..."
    return GraphError(
        f"{where}: evidence.db: the evidence graph is damaged ({what}); nothing was read from it or "
        "written to it: restore it from a copy, or point evidence.db (--db) at another graph"
    )


def read_only_uri(path: Path) -> str:
    """A URI that reads a SQLite file without creating anything beside it: `immutable=1` when no WAL is pending
    (the main file then holds every committed page, and SQLite makes no -wal or -shm for it); `mode=ro` when one
    is (a campaign that runs, or was killed before a checkpoint: the WAL holds its latest commits)."""
    uri = path.resolve().as_uri()
    return f"{uri}?mode=ro" if Path(f"{path}-wal").exists() else f"{uri}?mode=ro&immutable=1"


def check_intact(path: Path, where: str | Path) -> None:
    """Refuse (GraphError, one line) a graph file whose pages are damaged, before anything opens it for writing: a
    writer would set up its WAL (-wal and -shm files beside it) and then fail on the first read."""
    import sqlite3

    if not path.is_file():
        return
    try:
        with contextlib.closing(sqlite3.connect(read_only_uri(path), uri=True)) as con:
            found = [r[0] for r in con.execute("PRAGMA quick_check(3)")]
    except sqlite3.DatabaseError as e:
        raise damaged_graph(where, str(e)) from None
    if found != ["ok"]:
        raise damaged_graph(where, "; ".join(found))


def _refuse_foreign(path: Path, where: str | Path) -> None:
    """Opening creates the graph's tables: never in a file that is something else (SQLite took a short text file for
    an empty database and rewrote it; another program's database, MLflow's say, would get the tables added)."""
    import sqlite3

    if not path.is_file() or path.stat().st_size == 0:
        return
    with open(path, "rb") as f:
        if f.read(16) != b"SQLite format 3\x00":
            raise GraphError(f"{where}: evidence.db: not a SQLite database (a file of something else); left as it is")
    try:
        with contextlib.closing(sqlite3.connect(read_only_uri(path), uri=True)) as con:
            tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.Error as e:  # not readable this way (a locked or read-only WAL file): opening it says what is wrong
        if damage(e):
            raise damaged_graph(where, str(e)) from None
        return
    if tables and NODE.name not in tables:
        raise GraphError(
            f"{where}: evidence.db: a database of something else (tables {', '.join(sorted(tables)[:3])}"
            f"{', ...' if len(tables) > 3 else ''}); left as it is"
        )


class Store:
    """Rows in, rows out. Inserts only (append-only); the write policy decides what may be inserted."""

    def __init__(self, where: str | Path, read_only: bool = False, check: bool = False):
        self.url = _url(where)
        self.where = where
        self.notes: bool | None = True  # the revocation-note table exists (create_all below makes sure)
        if self.url.startswith("sqlite:///"):
            _refuse_foreign(Path(self.url.removeprefix("sqlite:///")), where)
            if check:  # a command's door (the CLI, a campaign's start): every page read once, nothing written
                check_intact(Path(self.url.removeprefix("sqlite:///")), where)
        if read_only:
            self._open_read_only(where)
            return
        try:
            if self.url.startswith("sqlite:///"):
                Path(self.url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
            self.engine = _engine(self.url)
            META.create_all(self.engine)
        except sa.exc.ArgumentError as e:
            raise GraphError(f"{where}: evidence.db: not a database URL or path ({e})") from None
        except ImportError as e:
            raise GraphError(f"{where}: evidence.db: the database driver is not installed ({e})") from None
        except OSError as e:
            raise GraphError(f"{where}: evidence.db: cannot create the evidence graph ({e.strerror})") from None
        except sa.exc.DatabaseError as e:
            if damage(e):
                raise damaged_graph(where, str(e.orig)) from None
            raise GraphError(f"{where}: evidence.db: cannot open the evidence graph ({e.orig})") from None

    def _open_read_only(self, where: str | Path) -> None:
        """A SQLite graph this process may not write (a read-only file or directory, a read-only mount): read as it
        is, without the WAL setup or table creation a writer does. immutable=1 when even SQLite's shared-memory file
        cannot be made next to it (a WAL graph in a read-only directory)."""
        import sqlite3

        path = Path(self.url.removeprefix("sqlite:///"))
        uri = path.resolve().as_uri()
        try:
            with contextlib.closing(sqlite3.connect(f"{uri}?mode=ro", uri=True)) as con:
                con.execute("SELECT count(*) FROM sqlite_master").fetchone()
            target = f"{uri}?mode=ro"
        except sqlite3.Error as e:
            if damage(e):
                raise damaged_graph(where, str(e)) from None
            target = f"{uri}?mode=ro&immutable=1"
        self.engine = sa.create_engine(
            "sqlite://", creator=lambda: sqlite3.connect(target, uri=True, check_same_thread=False)
        )
        self.notes = None

    @contextmanager
    def begin(self) -> Iterator[sa.Connection]:
        try:
            with self.engine.begin() as conn:
                yield conn
                failpoint(
                    "evidence:before-commit"
                )  # crash tests: kill -9 with the transaction's rows written, uncommitted
        except sa.exc.DatabaseError as e:  # SQLite's "disk I/O error" names no file: this one line does
            if damage(e):
                raise damaged_graph(self.where, str(e.orig)) from None
            what = storage_problem(e) if isinstance(e, sa.exc.OperationalError) else None
            if what is None:
                raise
            raise StorageError(
                self.url.removeprefix("sqlite:///"),
                f"cannot write the evidence graph ({what}); "
                "free space or make it writable, then rerun the same command",
            ) from None

    def connect(self) -> sa.Connection:
        return self.engine.connect()

    # -- reads ------------------------------------------------------------------------------------------------------
    @staticmethod
    def _node(r) -> Node:
        return Node(
            id=r.id,
            kind=r.kind,
            key=r.key,
            version=r.version,
            content=r.content,
            data=json.loads(r.data),
            confidence=r.confidence,
            author=r.author,
            campaign=r.campaign,
            expiry=Expiry.model_validate_json(r.expiry) if r.expiry else None,
            created=r.created,
        )

    def latest(self, conn: sa.Connection, nid: str) -> Node | None:
        r = conn.execute(sa.select(NODE).where(NODE.c.id == nid).order_by(NODE.c.version.desc()).limit(1)).first()
        return self._node(r) if r is not None else None

    def versions(self, conn: sa.Connection, nid: str) -> list[Node]:
        return [self._node(r) for r in conn.execute(sa.select(NODE).where(NODE.c.id == nid).order_by(NODE.c.version))]

    def current(self, conn: sa.Connection, kind: str | None = None) -> list[Node]:
        """The latest version of every node (of a kind), oldest first."""
        last = sa.select(NODE.c.id, sa.func.max(NODE.c.version).label("v")).group_by(NODE.c.id).subquery()
        q = sa.select(NODE).join(last, sa.and_(NODE.c.id == last.c.id, NODE.c.version == last.c.v))
        if kind is not None:
            q = q.where(NODE.c.kind == kind)
        return [self._node(r) for r in conn.execute(q.order_by(NODE.c.created, NODE.c.id))]

    def edges(
        self, conn: sa.Connection, src: str | None = None, dst: str | None = None, relation: str | None = None
    ) -> list[Edge]:
        q = sa.select(EDGE)
        if src is not None:
            q = q.where(EDGE.c.src == src)
        if dst is not None:
            q = q.where(EDGE.c.dst == dst)
        if relation is not None:
            q = q.where(EDGE.c.relation == relation)
        return [
            Edge(src=r.src, relation=r.relation, dst=r.dst, campaign=r.campaign, created=r.created)
            for r in conn.execute(q.order_by(EDGE.c.created, EDGE.c.src, EDGE.c.dst))
        ]

    def revocations(self, conn: sa.Connection) -> dict[str, dict]:
        out = {
            r.node: {"reason": r.reason, "by": r.by, "created": r.created, "reasons": [r.reason]}
            for r in conn.execute(sa.select(REVOCATION).order_by(REVOCATION.c.created))
        }
        if self.has_notes(conn):
            for r in conn.execute(sa.select(REVOCATION_NOTE).order_by(REVOCATION_NOTE.c.created)):
                if r.node in out:
                    out[r.node]["reasons"].append(r.reason)
        return out

    def has_notes(self, conn: sa.Connection) -> bool:
        # a graph written before the table existed, opened read-only, does not have it (and cannot be given it)
        if self.notes is None:
            self.notes = sa.inspect(conn).has_table(REVOCATION_NOTE.name)
        return self.notes

    # -- appends (called by the graph, after the policy said yes) ---------------------------------------------------
    def insert_node(self, conn: sa.Connection, n: Node) -> Node:
        conn.execute(
            NODE.insert().values(
                id=n.id,
                version=n.version,
                kind=n.kind,
                key=n.key,
                content=n.content,
                data=json.dumps(n.data, sort_keys=True, default=str),
                confidence=n.confidence,
                author=n.author,
                campaign=n.campaign,
                expiry=n.expiry.model_dump_json() if n.expiry else None,
                created=n.created,
            )
        )
        return n

    def insert_edge(self, conn: sa.Connection, e: Edge) -> bool:
        exists = conn.execute(
            sa.select(EDGE.c.src).where(EDGE.c.src == e.src, EDGE.c.dst == e.dst, EDGE.c.relation == e.relation)
        ).first()
        if exists:
            return False
        conn.execute(EDGE.insert().values(**e.model_dump()))
        return True

    def insert_mention(self, conn: sa.Connection, nid: str, scope: str) -> None:
        if (
            scope
            and not conn.execute(
                sa.select(MENTION.c.node).where(MENTION.c.node == nid, MENTION.c.scope == scope)
            ).first()
        ):
            conn.execute(MENTION.insert().values(node=nid, scope=scope))

    def mentioned_outside(self, conn: sa.Connection, scope: str) -> set[str]:
        return {r[0] for r in conn.execute(sa.select(MENTION.c.node).where(MENTION.c.scope != scope).distinct())}

    def insert_revocation(self, conn: sa.Connection, nid: str, reason: str, by: str) -> bool:
        if conn.execute(sa.select(REVOCATION.c.node).where(REVOCATION.c.node == nid)).first():
            # revoked already: the node stays revoked once, and this reason is kept beside the first
            conn.execute(REVOCATION_NOTE.insert().values(node=nid, reason=reason, by=by, created=time.time()))
            return False
        conn.execute(REVOCATION.insert().values(node=nid, reason=reason, by=by, created=time.time()))
        return True


def integrity(where: str | Path) -> list[str]:
    """Problems with a graph on disk: SQLite's own check, then edges and revocations that point at no node."""
    store = Store(where)
    problems: list[str] = []
    with store.connect() as conn:
        if store.url.startswith("sqlite"):
            problems += [r[0] for r in conn.exec_driver_sql("PRAGMA integrity_check") if r[0] != "ok"]
        ids = {r[0] for r in conn.execute(sa.select(NODE.c.id))}
        for e in store.edges(conn):
            for end in (e.src, e.dst):
                if end not in ids:
                    problems.append(f"edge {e.src} -{e.relation}-> {e.dst}: no node {end}")
        for nid in store.revocations(conn):
            if nid not in ids:
                problems.append(f"revocation of {nid}: no such node")
        for nid in ids:  # versions are 1..n without a gap
            vs = [
                r[0] for r in conn.execute(sa.select(NODE.c.version).where(NODE.c.id == nid).order_by(NODE.c.version))
            ]
            if vs != list(range(1, len(vs) + 1)):
                problems.append(f"node {nid}: versions {vs} have a gap")
    store.engine.dispose()
    return problems


class EvidenceGraph:
    """The campaign memory. Every write method is one transaction (or joins the open `batch()`), and every write is
    decided by the write policy (`graph_policy.POLICY`)."""

    def __init__(
        self,
        where: str | Path,
        campaign: str = "",
        policy=None,
        scope: str | None = None,
        read_only: bool = False,
        check: bool = False,
    ):
        self.store = Store(where, read_only=read_only, check=check)
        self.campaign = campaign
        self.scope = scope if scope is not None else campaign  # who is writing: one campaign output
        self.policy = policy or POLICY
        self._conn: sa.Connection | None = None

    def close(self) -> None:
        self.store.engine.dispose()

    def __enter__(self) -> EvidenceGraph:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @contextmanager
    def batch(self) -> Iterator[EvidenceGraph]:
        """Many writes as one transaction: all of them land, or (error, kill -9) none."""
        if self._conn is not None:
            yield self
            return
        with self.store.begin() as conn:
            self._conn = conn
            try:
                yield self
            finally:
                self._conn = None

    @contextmanager
    def _tx(self) -> Iterator[sa.Connection]:
        with self.batch():  # joins the open transaction, or opens one that nested writes join
            conn = self._conn
            assert conn is not None  # (batch() holds one open)
            yield conn

    @contextmanager
    def _read(self) -> Iterator[sa.Connection]:
        if self._conn is not None:
            yield self._conn
            return
        try:
            with self.store.connect() as conn:
                yield conn
        except sa.exc.DatabaseError as e:  # pages damaged since the graph was opened: one line, not SQLAlchemy's
            if damage(e):
                raise damaged_graph(self.store.where, str(e.orig)) from None
            raise

    # -- writes ------------------------------------------------------------------------------------------------------
    def add(
        self,
        kind: Kind,
        key: str,
        content: str = "",
        data: dict | None = None,
        *,
        author: Author = "harness",
        confidence: Confidence | None = None,
        expiry: Expiry | None = None,
    ) -> Node:
        """Record a node. The same (kind, key) with the same content is the node already there (idempotent: a
        resumed campaign records nothing twice); with other content it is a new version, the old one kept."""
        if kind not in KINDS:
            raise PolicyError(f"{key}: kind: {kind!r} is not one of {', '.join(KINDS)}")
        nid, data = node_id(kind, key), dict(data or {})
        self.policy.addable(kind, data, nid)
        return self._put(kind, key, nid, content, data, author, confidence, expiry)

    def _put(self, kind, key, nid, content, data, author, confidence, expiry, force_new: bool = False) -> Node:
        with self._tx() as conn:
            self.store.insert_mention(conn, nid, self.scope)
            cur = self.store.latest(conn, nid)
            data = json.loads(json.dumps(data, sort_keys=True, default=str))  # as it will read back
            if (
                cur is not None
                and not force_new
                and (cur.content, cur.data, cur.expiry, cur.author) == (content, data, expiry, author)
                and confidence in (None, cur.confidence)
            ):
                return cur
            conf = self.policy.entry(kind, author, confidence, nid)
            n = Node(
                id=nid,
                kind=kind,
                key=key,
                version=(cur.version + 1) if cur else 1,
                content=content,
                data=data,
                confidence=conf,
                author=author,
                campaign=self.campaign,
                expiry=expiry,
                created=time.time(),
            )
            return self.store.insert_node(conn, n)

    def _reversion(self, conn: sa.Connection, n: Node, confidence: Confidence) -> Node:
        """A new version of `n` that differs only in confidence (decided by the policy, never requested)."""
        if n.confidence == confidence:
            return n
        new = n.model_copy(
            update={
                "version": n.version + 1,
                "confidence": confidence,
                "created": time.time(),
                "campaign": self.campaign or n.campaign,
            }
        )
        return self.store.insert_node(conn, new)

    def link(self, src: str, relation: Relation, dst: str) -> None:
        """src --relation--> dst. `contradicts` also opens a contested branch (policy rule 4)."""
        if relation not in RELATIONS:
            raise PolicyError(f"{src}: relation: {relation!r} is not one of {', '.join(RELATIONS)}")
        with self._tx() as conn:
            a, b = self.store.latest(conn, src), self.store.latest(conn, dst)
            if a is None or b is None:
                raise PolicyError(f"{src if a is None else dst}: no such node (an edge joins two recorded nodes)")
            if src == dst:
                raise PolicyError(f"{src}: an edge joins two different nodes")
            new = self.store.insert_edge(
                conn, Edge(src=src, relation=relation, dst=dst, campaign=self.campaign, created=time.time())
            )
            if relation == "contradicts" and new:
                ca, cb = self.policy.contradiction(a, b)
                self._reversion(conn, a, ca)
                self._reversion(conn, b, cb)

    def cite(self, claim: str, episode_id: str, step: int, hash: str) -> Node:
        """A trace step as an artifact that supports `claim` (its citation)."""
        with self._tx():
            a = self.add(
                "artifact",
                f"trace:{episode_id}:{step}:{hash}",
                f"trace step {episode_id} #{step}",
                {"type": "trace_step", "episode_id": episode_id, "step": int(step), "hash": hash},
            )
            self.link(a.id, "supports", claim)
            return a

    def citations(self, claim: str) -> list[Node]:
        with self._read() as conn:
            return [
                n
                for e in self.store.edges(conn, dst=claim, relation="supports")
                if (n := self.store.latest(conn, e.src)) is not None and n.data.get("type") == "trace_step"
            ]

    def verify(self, claim: str, resolve) -> Node:
        """Policy rule 2: supported only when every citation resolves; else CitationError and nothing changes."""
        with self._tx() as conn:
            c = self.store.latest(conn, claim)
            if c is None:
                raise PolicyError(f"{claim}: no such node")
            self.policy.support(c, self.citations(claim), resolve)
            return self._reversion(conn, c, "supported") if c.confidence == "unverified" else c

    def settle(self, nid: str, resolve, now: Expiry | None) -> Node:
        """Policy rule 4's way out of a contest: supported again once no opponent stands on the current evidence."""
        with self._tx() as conn:
            n = self.store.latest(conn, nid)
            if n is None:
                raise PolicyError(f"{nid}: no such node")
            opp = [
                self.store.latest(conn, e.src if e.dst == nid else e.dst)
                for e in self.store.edges(conn, relation="contradicts")
                if nid in (e.src, e.dst)
            ]
            self.policy.settled(n, [o for o in opp if o is not None], self.store.revocations(conn), now)
            self.policy.support(n, self.citations(nid), resolve)
            return self._reversion(conn, n, "supported")

    def promote(self, key: str, content: str, verdict: str, supports: list[str], data: dict | None = None) -> Node:
        """Policy rule 3: a promotion with its accepting gate verdict and supported claims."""
        nid = node_id("decision", key)
        with self._tx() as conn:
            v = self.store.latest(conn, verdict)
            claims = [self.store.latest(conn, s) for s in supports]
            missing = [s for s, c in zip(supports, claims) if c is None]
            if missing:
                raise PolicyError(f"{nid}: supporting node {missing[0]} does not exist")
            self.policy.promotion(nid, v, [c for c in claims if c is not None])  # (every one: none is missing)
            n = self._put("decision", key, nid, content, {**(data or {}), "type": "promotion"}, "harness", None, None)
            self.link(verdict, "supports", nid)
            for s in supports:
                self.link(s, "supports", nid)
            return n

    def revoke(self, nid: str, reason: str, by: str = "person") -> dict[str, str]:
        """Policy rule 6: mark `nid` revoked; returns what is now flagged because of it (nothing when it was revoked
        already: the reason is kept with the revocation, the flags were reported the first time)."""
        if not reason.strip():
            raise PolicyError(f"{nid}: --reason: a revocation says why")
        with self._tx() as conn:
            if self.store.latest(conn, nid) is None:
                raise PolicyError(f"{nid}: no such node")
            new = self.store.insert_revocation(conn, nid, reason.strip(), by)
        return {k: v for k, v in self.flagged().items() if v == nid} if new else {}

    # -- reads -------------------------------------------------------------------------------------------------------
    def get(self, nid: str) -> Node | None:
        with self._read() as conn:
            return self.store.latest(conn, nid)

    def versions(self, nid: str) -> list[Node]:
        with self._read() as conn:
            return self.store.versions(conn, nid)

    def nodes(self, kind: str | None = None) -> list[Node]:
        with self._read() as conn:
            return self.store.current(conn, kind)

    def edges(self, src: str | None = None, dst: str | None = None, relation: str | None = None) -> list[Edge]:
        with self._read() as conn:
            return self.store.edges(conn, src, dst, relation)

    def revoked(self) -> dict[str, dict]:
        with self._read() as conn:
            return self.store.revocations(conn)

    def flagged(self) -> dict[str, str]:
        """Nodes derived from a revoked node -> that revoked node."""
        with self._read() as conn:
            return self.policy.flagged(self.store.revocations(conn), self.store.edges(conn))

    def from_elsewhere(self) -> set[str]:
        """Ids of nodes some other campaign (scope) recorded: what this campaign can learn from."""
        with self._read() as conn:
            return self.store.mentioned_outside(conn, self.scope)

    def expired(self, node: Node, now: Expiry | None) -> list[str]:
        return self.policy.expired(node, now)

    def find(self, ref: str) -> Node | None:
        """A node by id, by a unique id prefix, or by its key."""
        n = self.get(ref)
        if n is not None:
            return n
        with self._read() as conn:
            hits = conn.execute(
                sa.select(NODE.c.id)
                .where(sa.or_(NODE.c.id.startswith(ref, autoescape=True), NODE.c.key == ref))
                .distinct()
            ).all()
        ids = sorted({h[0] for h in hits})
        if len(ids) > 1:  # "no such node" would send the user looking for a node that is there, several times
            raise PolicyError(
                f"{ref}: ambiguous: matches {len(ids)} nodes ({', '.join(ids[:4])}"
                f"{', ...' if len(ids) > 4 else ''}); give more of the id"
            )
        return self.get(ids[0]) if ids else None
