"""The budget ledger: one ceiling per campaign, atomic reservations before work is admitted, reconciliation after.

    wallet   a ceiling per resource (tokens_in, tokens_out, model_calls, tool_calls, money) plus a wall-clock deadline,
             a concurrency limit and a delegation depth. A campaign has one root wallet.
    hold     a reservation in a wallet: a conservative estimate (input and maximum output) taken *before* work is
             admitted. `settle` replaces it by the actual usage; `release` returns it unspent. A hold's key makes
             settling idempotent, so work already paid for is never paid for twice (a resumed campaign).
    child    `transfer` moves part of a wallet's balance into a child wallet (a shard, a diagnosis worker): the child
             spends only what was transferred, never a new wallet; closing it gives back what it did not spend.

Reservations are atomic across threads and processes: every check-and-reserve is one SQLite IMMEDIATE transaction,
so two reservers cannot spend the same balance. On a shared database (Postgres) the same statements run in a
SERIALIZABLE transaction, or with `SELECT ... FOR UPDATE` on the wallet row.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sqlite3
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from components.errors import InputError, StorageError, storage_problem

RESOURCES = ("tokens_in", "tokens_out", "model_calls", "tool_calls", "money")

SCHEMA = """
CREATE TABLE IF NOT EXISTS wallet (
    id TEXT PRIMARY KEY, parent TEXT, parent_hold TEXT, depth INTEGER NOT NULL, caps TEXT NOT NULL,
    deadline REAL, max_concurrency INTEGER NOT NULL, max_depth INTEGER NOT NULL, closed INTEGER NOT NULL DEFAULT 0,
    created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS hold (
    id TEXT PRIMARY KEY, wallet TEXT NOT NULL, key TEXT, amounts TEXT NOT NULL, actual TEXT,
    status TEXT NOT NULL CHECK (status IN ('held', 'settled', 'released')), owner TEXT, created REAL NOT NULL,
    UNIQUE (wallet, key));
CREATE INDEX IF NOT EXISTS hold_wallet ON hold (wallet, status);
"""


class BudgetExceeded(InputError):
    """The work cannot be admitted: it would exceed a ceiling, the deadline, the concurrency or the depth limit."""


@dataclass(frozen=True)
class Hold:
    id: str
    wallet: str
    key: str | None
    amounts: dict[str, float]
    already_settled: bool = False  # the key was paid for before: nothing to do


def _owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _alive(owner: str | None) -> bool:
    if not owner:
        return False
    host, _, pid = owner.rpartition(":")
    if host != socket.gethostname():
        return True  # cannot tell for another machine: assume alive
    try:
        os.kill(int(pid), 0)
    except (ProcessLookupError, ValueError):
        return False
    except PermissionError:
        return True
    return True


class BudgetLedger:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._storage():
            db = sqlite3.connect(self.path, timeout=60)
            try:
                db.execute("PRAGMA journal_mode=WAL")  # readers do not block the writer
                db.executescript(SCHEMA)
            finally:
                db.close()

    @contextmanager
    def _storage(self) -> Iterator[None]:
        """A disk that is full or cannot be written, as the one line that names the ledger (SQLite says only "disk
        I/O error"); the transaction rolled back, so a rerun after freeing space continues."""
        try:
            yield
        except sqlite3.Error as e:
            what = storage_problem(e)
            if what is None:
                raise
            raise StorageError(
                str(self.path),
                f"cannot write the budget ledger ({what}); free space or make it writable, then rerun the same command",
            ) from None

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._storage():
            db = sqlite3.connect(self.path, timeout=60, isolation_level=None)
            try:
                db.execute("BEGIN IMMEDIATE")  # take the write lock before reading balances
                try:
                    yield db
                    db.execute("COMMIT")
                except BaseException:
                    with contextlib.suppress(sqlite3.Error):  # a failed COMMIT may have rolled back already
                        db.execute("ROLLBACK")
                    raise
            finally:
                db.close()

    # -- wallets --------------------------------------------------------------------------------------------------
    def open_wallet(
        self,
        wallet_id: str,
        caps: dict[str, float | None],
        *,
        wall_seconds: float | None = None,
        max_concurrency: int = 1_000_000,
        max_depth: int = 8,
    ) -> str:
        """Create the root wallet (idempotent: reopening keeps its spending and its original deadline)."""
        caps = {k: v for k, v in caps.items() if k in RESOURCES and v is not None}
        with self._tx() as db:
            row = db.execute("SELECT id FROM wallet WHERE id = ?", (wallet_id,)).fetchone()
            if row is None:
                now = time.time()
                db.execute(
                    "INSERT INTO wallet VALUES (?, NULL, NULL, 0, ?, ?, ?, ?, 0, ?)",
                    (
                        wallet_id,
                        json.dumps(caps),
                        now + wall_seconds if wall_seconds else None,
                        max_concurrency,
                        max_depth,
                        now,
                    ),
                )
        return wallet_id

    def _available(self, db: sqlite3.Connection, wallet: str) -> tuple[dict[str, float], dict]:
        w = db.execute(
            "SELECT caps, deadline, max_concurrency, max_depth, depth, closed FROM wallet WHERE id = ?", (wallet,)
        ).fetchone()
        if w is None:  # not a ceiling: a shard opened another ledger than its campaign's (never a clean stop)
            raise StorageError(
                str(self.path),
                f"budget: wallet {wallet!r} does not exist in this ledger (every "
                "worker must open the campaign's own ledger file)",
            )
        caps = json.loads(w[0])
        used = {k: 0.0 for k in RESOURCES}
        n_held = 0
        for amounts, actual, status in db.execute(
            "SELECT amounts, actual, status FROM hold WHERE wallet = ? AND status != 'released'", (wallet,)
        ):
            src = json.loads(actual if status == "settled" else amounts)
            n_held += status == "held"
            for k in RESOURCES:
                used[k] += float(src.get(k, 0))
        avail = {k: caps[k] - used[k] for k in caps}
        meta = {
            "deadline": w[1],
            "max_concurrency": w[2],
            "max_depth": w[3],
            "depth": w[4],
            "closed": w[5],
            "n_held": n_held,
            "caps": caps,
            "used": used,
        }
        return avail, meta

    def _admit(self, db: sqlite3.Connection, wallet: str, amounts: dict[str, float]) -> None:
        avail, meta = self._available(db, wallet)
        if meta["closed"]:
            raise BudgetExceeded(f"budget: wallet {wallet} is closed")
        if meta["deadline"] is not None and time.time() > meta["deadline"]:
            raise BudgetExceeded("budget: wall-time ceiling reached")
        if meta["n_held"] >= meta["max_concurrency"]:
            raise BudgetExceeded(f"budget: concurrency limit {meta['max_concurrency']} reached")
        over = [f"{k} {amounts[k]:g} > {avail[k]:g} left" for k in avail if amounts.get(k, 0) > avail[k] + 1e-9]
        if over:
            raise BudgetExceeded("budget: cannot admit: " + ", ".join(over))

    # -- holds ----------------------------------------------------------------------------------------------------
    def reserve(self, wallet: str, amounts: dict[str, float], key: str | None = None, wait: float = 0.0) -> Hold:
        """Atomically reserve `amounts` (a conservative estimate) in `wallet`, or raise BudgetExceeded.

        With `wait`, a reservation refused only by the concurrency limit is retried until a slot frees."""
        deadline = time.monotonic() + wait
        while True:
            try:
                return self._reserve(wallet, amounts, key)
            except BudgetExceeded as e:
                if "concurrency" not in str(e) or time.monotonic() >= deadline:
                    raise
                time.sleep(0.05)

    def _reserve(self, wallet: str, amounts: dict[str, float], key: str | None) -> Hold:
        amounts = {k: float(v) for k, v in amounts.items() if k in RESOURCES}
        with self._tx() as db:
            if key is not None:
                row = db.execute(
                    "SELECT id, status, owner FROM hold WHERE wallet = ? AND key = ?", (wallet, key)
                ).fetchone()
                if row is not None and row[1] == "settled":
                    return Hold(row[0], wallet, key, amounts, already_settled=True)
                if row is not None and row[1] == "held" and _alive(row[2]) and row[2] != _owner():
                    raise BudgetExceeded(f"budget: {key} is already being worked on by {row[2]}")
                if row is not None:  # released, or held by a dead process: this attempt replaces it
                    db.execute("DELETE FROM hold WHERE id = ?", (row[0],))
            self._admit(db, wallet, amounts)
            hid = uuid.uuid4().hex
            db.execute(
                "INSERT INTO hold VALUES (?, ?, ?, ?, NULL, 'held', ?, ?)",
                (hid, wallet, key, json.dumps(amounts), _owner(), time.time()),
            )
        return Hold(hid, wallet, key, amounts)

    def settle(self, hold: Hold, actual: dict[str, float], completed: bool = True) -> None:
        """Replace the reservation by the actual usage (idempotent). Work that did not complete is still paid for,
        but its key is dropped, so redoing it is charged as the new work it is."""
        if hold.already_settled:
            return
        actual = {k: float(v) for k, v in actual.items() if k in RESOURCES}
        with self._tx() as db:
            db.execute(
                "UPDATE hold SET actual = ?, status = 'settled', key = CASE WHEN ? THEN key END "
                "WHERE id = ? AND status = 'held'",
                (json.dumps(actual), completed, hold.id),
            )

    def release(self, hold: Hold) -> None:
        with self._tx() as db:
            db.execute("UPDATE hold SET status = 'released' WHERE id = ? AND status = 'held'", (hold.id,))

    def recover(self, wallet: str) -> int:
        """Settle the holds of processes that died (a killed campaign) at their full reservation: what a killed shard
        spent is unknown, and counting all it was allowed keeps the ceiling true. Their keys are dropped, so the
        redone work is charged as new work. Returns how many."""
        with self._tx() as db:
            dead = [
                (hid, amounts)
                for hid, owner, amounts in db.execute(
                    "SELECT id, owner, amounts FROM hold WHERE wallet = ? AND status = 'held'", (wallet,)
                )
                if not _alive(owner)
            ]
            for hid, amounts in dead:
                db.execute("UPDATE hold SET status = 'settled', actual = ?, key = NULL WHERE id = ?", (amounts, hid))
        return len(dead)

    # -- delegation -----------------------------------------------------------------------------------------------
    def transfer(self, parent: str, amounts: dict[str, float], key: str | None = None) -> str:
        """A child wallet funded by `amounts` taken (atomically) from `parent`; one level deeper."""
        amounts = {k: float(v) for k, v in amounts.items() if k in RESOURCES}
        with self._tx() as db:
            avail, meta = self._available(db, parent)
            if meta["depth"] + 1 > meta["max_depth"]:
                raise BudgetExceeded(f"budget: delegation depth {meta['depth'] + 1} > {meta['max_depth']}")
            self._admit(db, parent, amounts)
            hid, child = uuid.uuid4().hex, f"{parent}/{key or uuid.uuid4().hex[:8]}"
            db.execute(
                "INSERT INTO hold VALUES (?, ?, ?, ?, NULL, 'held', ?, ?)",
                (hid, parent, key, json.dumps(amounts), _owner(), time.time()),
            )
            caps = {**{k: 0.0 for k in meta["caps"]}, **amounts}  # what was not transferred cannot be spent
            db.execute(
                "INSERT INTO wallet VALUES (?, ?, ?, ?, ?, ?, ?, ?, 0, ?)",
                (
                    child,
                    parent,
                    hid,
                    meta["depth"] + 1,
                    json.dumps(caps),
                    meta["deadline"],
                    meta["max_concurrency"],
                    meta["max_depth"],
                    time.time(),
                ),
            )
        return child

    def close(self, child: str) -> dict[str, float]:
        """Close a child wallet: its parent's hold becomes what the child actually spent; the rest returns."""
        with self._tx() as db:
            _avail, meta = self._available(db, child)
            parent_hold = db.execute("SELECT parent_hold FROM wallet WHERE id = ?", (child,)).fetchone()[0]
            db.execute("UPDATE hold SET status = 'released' WHERE wallet = ? AND status = 'held'", (child,))
            spent = {k: v for k, v in self._available(db, child)[1]["used"].items() if v}
            db.execute("UPDATE wallet SET closed = 1 WHERE id = ?", (child,))
            if parent_hold:
                db.execute(
                    "UPDATE hold SET actual = ?, status = 'settled' WHERE id = ?", (json.dumps(spent), parent_hold)
                )
        return spent

    # -- reading --------------------------------------------------------------------------------------------------
    def report(self, wallet: str) -> dict:
        with self._tx() as db:
            avail, meta = self._available(db, wallet)
            spent = {k: 0.0 for k in RESOURCES}
            for (actual,) in db.execute("SELECT actual FROM hold WHERE wallet = ? AND status = 'settled'", (wallet,)):
                for k, v in json.loads(actual).items():
                    spent[k] += v
            held = {k: meta["used"][k] - spent[k] for k in RESOURCES}
        return {"caps": meta["caps"], "spent": spent, "held": held, "available": avail, "open_holds": meta["n_held"]}


@dataclass(frozen=True)
class Estimate:
    """A conservative reservation for episodes: the turn limit and the calls a turn can make are hard bounds;
    the per-call token figures are the configured upper estimates."""

    max_turns: int
    tokens_in_per_call: float
    tokens_out_per_call: float
    price_in_per_1k: float = 0.0
    price_out_per_1k: float = 0.0
    calls_per_turn: int = 3  # propose, draft, at most one redraft
    tool_calls_per_turn: int = 1
    party_calls_per_turn: int = 0  # the episode's other party's own model (a user simulated by one): a reply a turn

    def episodes(self, n: int) -> dict[str, float]:
        calls = n * self.max_turns * (self.calls_per_turn + self.party_calls_per_turn)
        t_in, t_out = calls * self.tokens_in_per_call, calls * self.tokens_out_per_call
        return {
            "model_calls": calls,
            "tool_calls": n * self.max_turns * self.tool_calls_per_turn,
            "tokens_in": t_in,
            "tokens_out": t_out,
            "money": self.cost(t_in, t_out),
        }

    def cost(self, tokens_in: float, tokens_out: float) -> float:
        return tokens_in / 1000 * self.price_in_per_1k + tokens_out / 1000 * self.price_out_per_1k


class BudgetSpec(BaseModel):
    """What an evaluation charges its work to and how it reserves it: the campaign's ledger (`db`) and wallet, the
    reservation estimate, and the stores a shard keeps (a deterministic model's replies, a served model's finished
    episodes; None when not kept)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    db: str
    wallet: str
    estimate: Estimate
    call_cache: str | None = None
    episodes: str | None = None


def usage(scores, estimate: Estimate) -> dict[str, float]:
    """Actual usage of a set of episodes (a scores table): the agent's model and, where the table has them, the
    other party's (`user_tokens_in`, ...: a user simulated by a model spends from the same budget)."""

    def total(col: str) -> float:
        return float(scores[col].sum()) if col in scores else 0.0

    t_in, t_out = total("tokens_in") + total("user_tokens_in"), total("tokens_out") + total("user_tokens_out")
    return {
        "tokens_in": t_in,
        "tokens_out": t_out,
        "model_calls": total("model_calls") + total("user_model_calls"),
        "tool_calls": total("tool_calls"),
        "money": estimate.cost(t_in, t_out),
    }
