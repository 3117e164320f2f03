"""The built-in airline desk world: bookings, fare classes, changes and cancellations, baggage, delay
compensation, membership tiers. A second world of a different shape than retail: several rules on one write,
numeric formulas, and four rules that the written policy does not state (only refusal receipts and successful
episodes show them)."""

from __future__ import annotations

from pathlib import Path

from components.worlds.airline.tasks import FAMILIES, generate, policy_text
from components.worlds.airline.tools import TARGETS, TOOLS, WRITE_TOOLS
from components.worlds.base import stratified_split, write_benchmark

VERSION = 1


def materialize(out: str | Path, seed: int = 0, per_family: int | None = None,
                fractions: tuple[float, float] = (1 / 3, 1 / 3)) -> Path:
    """Write the benchmark files for `seed` atomically; the same arguments give the same bytes."""
    db, tasks = generate(seed, per_family)
    splits = stratified_split(tasks, seed, FAMILIES, fractions)
    families = {f: per_family or n for f, n in FAMILIES.items()}
    meta = {"world": "airline", "version": VERSION, "seed": seed, "n_tasks": len(tasks), "families": families,
            "splits": {k: len(v) for k, v in splits.items()}, "write_tools": sorted(WRITE_TOOLS), "targets": TARGETS}
    return write_benchmark(out, meta, policy_text(), TOOLS, db, tasks, splits)  # checked by the data contract
