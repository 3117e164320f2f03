"""A content-addressed store of model replies: the same request to a deterministic model is paid for once.

A round's packages differ by one small patch, so most of what the next evaluation asks the model was asked before:
the new champion's train episodes are its parent's wherever the patch does not reach them (and its own repair
episodes on the diagnosed items), a candidate's dev episodes are the champion's up to the turn the patch first changes
what the model reads. A reply is keyed by everything the model sees (model name and options, the messages, the tools
offered, the seed, the output mode), so a hit returns the very reply the model would have produced: score tables are
byte-identical with or without the store, and only what was paid changes. Usage stays the logical usage in the score
tables (deterministic); `CachedModel.paid` is what the calls that missed cost, for the budget ledger.

Only for deterministic backends (`deterministic`): the simulator always; an OpenAI-compatible server at temperature 0.
One SQLite file (WAL) per campaign, safe for the shards of two threads or Dask processes at once.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import sqlite3
from pathlib import Path
from typing import Any

from components.models.base import ChatModel, ChatResult, ModelError, add_usage, message_json, tools_json
from components.runtime.types import ToolCall, Usage


def deterministic(model: str, cfg: dict[str, Any] | None) -> bool:
    """Does the same request always get the same reply? (A sampled model's replies must not be pinned.)"""
    return model == "sim" or float((cfg or {}).get("temperature", 0.0)) == 0.0


class CallStore:
    """request key -> pickled ChatResult. Writes are buffered and committed per episode (`flush`)."""

    def __init__(self, path: str | Path):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(str(path), timeout=120, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute("CREATE TABLE IF NOT EXISTS reply (key TEXT PRIMARY KEY, value BLOB NOT NULL)")
        # what the replies answered from the store would have cost (the campaign's books: paid + saved = used)
        self.db.execute("CREATE TABLE IF NOT EXISTS saved (name TEXT PRIMARY KEY, value INTEGER NOT NULL)")
        self.db.commit()
        self.pending: dict[str, bytes] = {}
        self.saved = Usage()  # not yet written

    def get(self, key: str) -> ChatResult | None:
        blob = self.pending.get(key)
        if blob is None:
            row = self.db.execute("SELECT value FROM reply WHERE key = ?", (key,)).fetchone()
            blob = row[0] if row else None
        return None if blob is None else _unpack(blob)

    def put(self, key: str, result: ChatResult) -> None:
        self.pending[key] = _pack(result)

    def flush(self) -> None:
        if self.pending or self.saved.calls:
            with self.db:
                self.db.executemany("INSERT OR IGNORE INTO reply (key, value) VALUES (?, ?)", self.pending.items())
                self.db.executemany(
                    "INSERT INTO saved (name, value) VALUES (?, ?) ON CONFLICT(name) DO UPDATE "
                    "SET value = value + excluded.value",
                    _fields(self.saved).items(),
                )
            self.pending.clear()
            self.saved = Usage()

    def totals(self) -> dict[str, int]:
        """Model calls and tokens the store answered so far (what they would have cost)."""
        got = dict.fromkeys(_fields(Usage()), 0)
        got.update(self.db.execute("SELECT name, value FROM saved").fetchall())
        return got

    def close(self) -> None:
        self.flush()
        self.db.close()


class CachedModel:
    """A ChatModel that answers a request it has seen from the store and pays only for the others."""

    def __init__(self, model: ChatModel, store: CallStore, ident: Any):
        self.model, self.store = model, store
        self.name = model.name
        self.ident = json.dumps(ident, sort_keys=True, default=str)
        self.paid, self.hits = Usage(), 0

    def complete(
        self, messages: list[dict], *, tools: list[dict] | None, seed: int, json_mode: bool | dict[str, Any] = False
    ) -> ChatResult:
        key = hashlib.sha256(request_json(self.ident, messages, tools, seed, json_mode).encode()).hexdigest()
        got = self.store.get(key)
        if got is not None:
            self.hits += 1
            self.store.saved = add_usage(self.store.saved, got.usage)
            return got
        try:
            got = self.model.complete(messages, tools=tools, seed=seed, json_mode=json_mode)
        except ModelError as e:  # a fault is not stored; what its attempts cost was paid all the same
            self.paid = add_usage(self.paid, e.usage)
            raise
        self.paid = add_usage(self.paid, got.usage)
        self.store.put(key, got)
        return got


def request_json(
    ident: str, messages: list[dict], tools: list[dict] | None, seed: int, json_mode: bool | dict[str, Any]
) -> str:
    """`json.dumps([ident, messages, tools, seed, json_mode], sort_keys=True, default=str)`, the same bytes, built
    from the memoized encodings of the messages and tools (`message_json`, `tools_json`): a list's JSON is its items'
    JSON joined by ", ", and the conversation and the tool schemas are re-sent on every call."""

    def enc(x, memo) -> str:
        try:
            return memo(x)
        except (TypeError, AttributeError):  # not a plain message, or a value JSON cannot encode: as json.dumps does
            return json.dumps(x, sort_keys=True, default=str)

    msgs = ", ".join(enc(m, message_json) for m in messages)
    return (
        f"[{json.dumps(ident)}, [{msgs}], {'null' if tools is None else enc(tools, tools_json)}, "
        f"{json.dumps(seed, default=str)}, {json.dumps(json_mode, sort_keys=True, default=str)}]"
    )


def _pack(r: ChatResult) -> bytes:
    """A reply as plain tuples: pickling the pydantic models themselves costs several times more, both ways."""
    u = r.usage
    return pickle.dumps(
        (r.content, [(c.id, c.name, c.args) for c in r.tool_calls], (u.tokens_in, u.tokens_out, u.calls)),
        protocol=pickle.HIGHEST_PROTOCOL,
    )


def _unpack(blob: bytes) -> ChatResult:
    got = pickle.loads(blob)
    if isinstance(got, ChatResult):  # a store written before replies were packed
        return got
    content, calls, (t_in, t_out, n) = got
    return ChatResult(
        content=content,
        tool_calls=[ToolCall(id=i, name=name, args=args) for i, name, args in calls],
        usage=Usage(tokens_in=t_in, tokens_out=t_out, calls=n),
    )


def _fields(u: Usage) -> dict[str, int]:
    return {"model_calls": u.calls, "tokens_in": u.tokens_in, "tokens_out": u.tokens_out}


def saved(path: str | Path | None) -> dict[str, int] | None:
    """What a campaign's reply store answered (None: no store)."""
    if path is None or not Path(path).is_file():
        return None
    store = CallStore(path)
    try:
        return store.totals()
    finally:
        store.close()
