"""The built-in retail customer-service world."""

from __future__ import annotations

from pathlib import Path

from components.worlds.base import stratified_split, write_benchmark
from components.worlds.retail.facts import facts_of
from components.worlds.retail.tasks import FAMILIES, generate, policy_text
from components.worlds.retail.tools import TOOLS, WRITE_TOOLS

VERSION = 1
# write tool -> the args that name what it acts on (meta.json "targets"; generic code reads it from there);
# [] = the session's account (one per conversation)
TARGETS = {"cancel_pending_order": ["order_id"], "return_delivered_order_items": ["order_id"],
           "exchange_delivered_order_items": ["order_id"], "modify_pending_order_address": ["order_id"],
           "modify_user_address": [], "issue_store_credit": ["order_id"]}


def materialize(out: str | Path, seed: int = 0, per_family: int | None = None,
                fractions: tuple[float, float] = (1 / 3, 1 / 3), facts: dict[str, str] | None = None) -> Path:
    """Write the benchmark files for `seed` atomically; the same arguments give the same bytes. `facts`: a changed
    world (rule id -> its statement here), kept in meta.json for the tools; None: the world's own rules."""
    rules = facts_of(facts)
    db, tasks = generate(seed, per_family, rules)
    splits = stratified_split(tasks, seed, FAMILIES, fractions)
    families = {f: per_family or n for f, n in FAMILIES.items()}
    meta = {"world": "retail", "version": VERSION, "seed": seed, "n_tasks": len(tasks), "families": families,
            "splits": {k: len(v) for k, v in splits.items()}, "write_tools": sorted(WRITE_TOOLS),
            "targets": {t: TARGETS[t] for t in sorted(WRITE_TOOLS)}}
    if facts:  # absent otherwise: the world's own benchmarks stay byte-identical
        meta["facts"] = {fid: rules[fid].statement for fid in sorted(facts)}
    return write_benchmark(out, meta, policy_text(rules), TOOLS, db, tasks, splits)  # checked by the data contract
