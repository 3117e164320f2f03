"""The built-in airline desk world: bookings, fare classes, changes and cancellations, baggage, delay
compensation, membership tiers. A second world of a different shape than retail: several rules on one write,
numeric formulas, and four rules that the written policy does not state (only refusal receipts and successful
episodes show them)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from components.contracts import check_benchmark
from components.io import atomic_dir, dumps
from components.worlds.airline.tasks import FAMILIES, generate, policy_text, split
from components.worlds.airline.tools import TARGETS, TOOLS, WRITE_TOOLS

VERSION = 1
PACKAGES_DIR = Path(__file__).resolve().parents[3] / "data" / "packages" / "airline"


def materialize(out: str | Path, seed: int = 0, per_family: int | None = None,
                fractions: tuple[float, float] = (1 / 3, 1 / 3)) -> Path:
    """Write the benchmark files for `seed` atomically; the same arguments give the same bytes."""
    db, tasks = generate(seed, per_family)
    splits = split(tasks, seed, fractions)
    where = {tid: name for name, ids in splits.items() for tid in ids}
    families = {f: per_family or n for f, n in FAMILIES.items()}
    meta = {"world": "airline", "version": VERSION, "seed": seed, "n_tasks": len(tasks), "families": families,
            "splits": {k: len(v) for k, v in splits.items()}, "write_tools": sorted(WRITE_TOOLS), "targets": TARGETS}
    rows = [{"task_id": t.id, "family": t.family, "split": where[t.id], "n_requests": len(t.requests),
             "possible": t.possible, "n_criteria": len(t.rubric), "min_weight": min(c.weight for c in t.rubric),
             "total_weight": sum(c.weight for c in t.rubric)} for t in tasks]
    with atomic_dir(out) as tmp:
        (tmp / "meta.json").write_text(dumps(meta))
        (tmp / "policy.md").write_text(policy_text())
        (tmp / "tools.json").write_text(dumps(TOOLS))
        (tmp / "db.json").write_text(json.dumps(db, sort_keys=True) + "\n")
        (tmp / "tasks.jsonl").write_text("".join(t.model_dump_json() + "\n" for t in tasks))
        (tmp / "splits.json").write_text(dumps(splits))
        pd.DataFrame(rows).to_csv(tmp / "tasks.csv", index=False, lineterminator="\n")
        check_benchmark(tmp)  # the data contract, before anything is moved into place
    return Path(out)
