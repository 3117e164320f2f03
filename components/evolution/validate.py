"""Static validation of a patched candidate, before any episode is spent on it:

schema        the plan parsed (it reached here as a Plan)
lint          the candidate loads as a package
leakage       no task id, account id, value of a request or rubric, or plain value of the account's record
              (of ANY split) appears in a card; a rule's constant is not task data (`rule_constants`: a word
              the train gold gives in several items and the world's data never holds, such as a refund's
              'travel_credit' where the policy never names it)
reachability  every card trigger's event is one the kernel raises with a binding that delivers cards there,
              and its tool exists in the world
activation    (after a probe run on the source tasks) the plan's mechanism shows in the fingerprints
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import pandas as pd

from components.evolution.plan import Plan
from components.memory.events import DELIVERY_EVENTS
from components.memory.package import MemoryPackage, lint, load_package
from components.runtime.types import CONFIRM_TOOL, FINISH_TOOL
from components.worlds import Benchmark
from components.worlds.base import train_gold

MIN_TOKEN = 5  # shorter values (a state code, a size) are ordinary words
MIN_SHARED = (
    2  # distinct train items whose gold gives one value to one field: a rule's constant, not an item's data (as
)
# many items as an inferred rule rests on, `components.evolution.infer.MIN_SIDE`)


@dataclass
class Validation:
    ok: bool
    checks: dict[str, str] = field(default_factory=dict)  # check -> "ok" or the problem

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def problems(self) -> list[str]:
        return [f"{k}: {v}" for k, v in self.checks.items() if v != "ok"]


def _strings(obj: object) -> list[str]:
    if isinstance(obj, dict):
        return [s for v in obj.values() for s in _strings(v)]
    if isinstance(obj, list):
        return [s for v in obj for s in _strings(v)]
    return [str(obj)] if isinstance(obj, (str, int)) and not isinstance(obj, bool) else []


@lru_cache(maxsize=8)
def _leak_tokens(bench_root: str, digest: str) -> frozenset[str]:
    from components.worlds import load_benchmark

    bench = load_benchmark(bench_root)
    tokens: set[str] = set()
    for t in bench.tasks.values():
        tokens |= {t.id, t.user_id}
        tokens |= set(_strings(t.requests)) | set(_strings([c.args for c in t.rubric]))
        # the account's own record, wherever the world keeps it (a collection keyed by account id): its plain values
        for records in bench.db.values():
            account = records.get(t.user_id) if isinstance(records, dict) else None
            if isinstance(account, dict):
                tokens |= {v for v in account.values() if isinstance(v, str)}
    # vocabulary the policy itself uses (tool names, the allowed reasons) is knowledge, not a leak; so is a constant a
    # rule puts in a write, which the train gold shows (an account's, a task's or the world's own data never is one)
    policy = bench.policy.lower()
    ids = {x for t in bench.tasks.values() for x in (t.id, t.user_id)}
    constants = rule_constants(bench) - ids
    # and so is the tools' own vocabulary (their names and parameters, public in tools.json), which a policy need not
    # name (a benchmark's policy may not), though a task's gold actions carry it
    public = {t["function"]["name"] for t in bench.tools} | {
        p for t in bench.tools for p in ((t["function"].get("parameters") or {}).get("properties") or {})
    }
    return frozenset(
        x for x in tokens if len(x) >= MIN_TOKEN and x.lower() not in policy and x not in constants and x not in public
    )


def rule_constants(bench: Benchmark) -> frozenset[str]:
    """Words a rule writes, read off the train gold (`train_gold`: what a campaign may learn from): a string argument
    with no digit (not an id, not an amount) that the gold gives to the same tool's field in at least `MIN_SHARED`
    train items and that appears nowhere in the world's database (not a name, a city, a product: the world's data).
    A value only dev or test items carry is never one (their gold is not read), so a card carrying it is still a leak."""
    items: dict[tuple[str, str, str], set[str]] = {}
    for g in train_gold(bench).values():
        for a in g.actions:
            for k, v in a.args.items():
                if isinstance(v, str) and v and not any(ch.isdigit() for ch in v):
                    items.setdefault((a.tool, k, v), set()).add(g.task_id)
    shared = {v for (_tool, _k, v), ts in items.items() if len(ts) >= MIN_SHARED}
    if not shared:
        return frozenset()
    data = {s.lower() for s in _strings(bench.db)}
    return frozenset(v for v in shared if v.lower() not in data)


def leak_tokens(bench: Benchmark) -> frozenset[str]:
    return _leak_tokens(str(bench.root), bench.digest)


def leakage(pkg: MemoryPackage, bench: Benchmark) -> list[str]:
    tokens = leak_tokens(bench)
    found = []
    for card in pkg.cards.values():
        text = (card.body + " " + card.meta.model_dump_json()).lower()
        hits = sorted(t for t in tokens if t.lower() in text)
        if hits:
            found.append(f"{card.path}: contains task data {', '.join(repr(h) for h in hits[:3])}")
    return found


def reachability(pkg: MemoryPackage, bench: Benchmark) -> list[str]:
    routed = {b.spec.at for b in pkg.delivery if b.strategy.delivers_cards}
    blanket = any(b.strategy.ignores_triggers for b in pkg.delivery)
    tools = set(bench.tool_names) | {FINISH_TOOL, CONFIRM_TOOL}
    out = []
    for card in pkg.cards.values():
        t = card.meta.trigger
        if t is None:
            continue
        if t.event not in DELIVERY_EVENTS:
            out.append(f"{card.path}: trigger.event {t.event!r} is not an event cards are delivered at")
        elif t.event not in routed and not blanket:
            out.append(f"{card.path}: no binding delivers cards at {t.event!r}")
        if t.tool is not None and t.tool not in tools:
            out.append(f"{card.path}: trigger.tool {t.tool!r} is not a tool of world {bench.world!r}")
    return out


def foreign_tools(pkg: MemoryPackage, bench: Benchmark) -> list[str]:
    """Cards triggered by a tool this benchmark's world does not have (a package written for another world): they
    could never be delivered, so an evaluation would silently measure a package without them."""
    tools = set(bench.tool_names) | {FINISH_TOOL, CONFIRM_TOOL}
    return [
        f"{(pkg.root / card.path).as_posix()}: trigger.tool: {card.meta.trigger.tool!r} is not a tool of the "
        f"{bench.world} world of {bench.root}"
        for card in pkg.cards.values()
        if card.meta.trigger is not None and card.meta.trigger.tool not in (None, *tools)
    ]


def static_checks(plan: Plan, candidate: str | Path, bench: Benchmark) -> tuple[Validation, MemoryPackage | None]:
    v = Validation(ok=True, checks={"schema": "ok"})
    problems = lint(candidate)
    v.checks["lint"] = "; ".join(str(p) for p in problems) if problems else "ok"
    pkg = load_package(candidate) if not problems else None
    if pkg is not None:
        leaks = leakage(pkg, bench)
        v.checks["leakage"] = "; ".join(leaks) if leaks else "ok"
        unreachable = reachability(pkg, bench)
        v.checks["reachability"] = "; ".join(unreachable) if unreachable else "ok"
    v.ok = all(x == "ok" for x in v.checks.values())
    return v, pkg


def fired(traces: pd.DataFrame, mechanism: str) -> bool:
    """Did any step's fingerprint show the mechanism: one of its entries (each a mechanism that fired, e.g.
    `deliver:<card>@<event>`) is the plan's mechanism or starts with it, read entry by entry from the recorded list
    (never as a substring of its JSON text)."""
    if traces.empty:
        return False
    return any(entry.startswith(mechanism) for fp in traces["fingerprint"] for entry in _entries(fp))


def _entries(fingerprint: str | list[str]) -> list[str]:
    """A step's fingerprint entries (a trace table holds the list as JSON text)."""
    return json.loads(fingerprint) if isinstance(fingerprint, str) else list(fingerprint)
