"""The built-in retail customer-service world."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from components.contracts import check_benchmark
from components.io import atomic_dir, dumps
from components.worlds.retail.tasks import FAMILIES, generate, policy_text, split
from components.worlds.retail.tools import TOOLS, WRITE_TOOLS

VERSION = 1
# write tool -> the args that name what it acts on (meta.json "targets"; generic code reads it from there);
# [] = the session's account (one per conversation)
TARGETS = {"cancel_pending_order": ["order_id"], "return_delivered_order_items": ["order_id"],
           "exchange_delivered_order_items": ["order_id"], "modify_pending_order_address": ["order_id"],
           "modify_user_address": []}


def materialize(out: str | Path, seed: int = 0, per_family: int | None = None,
                fractions: tuple[float, float] = (1 / 3, 1 / 3)) -> Path:
    """Write the benchmark files for `seed` atomically; the same arguments give the same bytes."""
    db, tasks = generate(seed, per_family)
    splits = split(tasks, seed, fractions)
    where = {tid: name for name, ids in splits.items() for tid in ids}
    families = {f: per_family or n for f, n in FAMILIES.items()}
    meta = {"world": "retail", "version": VERSION, "seed": seed, "n_tasks": len(tasks), "families": families,
            "splits": {k: len(v) for k, v in splits.items()}, "write_tools": sorted(WRITE_TOOLS),
            "targets": {t: TARGETS[t] for t in sorted(WRITE_TOOLS)}}
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
