"""What a round and a campaign leave on disk (besides the lineage): artifacts a user or a reproduction can read.

    <out>/rounds/r<N>/train/             the diagnosed evaluation (scores, traces, hidden-cause sidecar)
    <out>/rounds/r<N>/diagnosis.json     evidence packets;  findings.csv  one row per failed episode
    <out>/rounds/r<N>/plan.json          validation.json   repair.json   repair_items.csv
    <out>/rounds/r<N>/gate.json          gate_items.csv    dev_base.csv  dev_cand.csv
    <out>/rounds/r<N>/round.json         the round's record (what the lineage says, with paths)
    <out>/summary.json                   the campaign's result
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from components.io import atomic_write_bytes, atomic_write_json

SCORE_COLS = ["item_id", "seed", "score", "success", "error"]


def round_dir(out: str | Path, round_no: int) -> Path:
    return Path(out) / "rounds" / f"r{round_no:02d}"


def write_csv(path: str | Path, df: pd.DataFrame) -> None:
    atomic_write_bytes(path, df.to_csv(index=False, lineterminator="\n").encode())


def write_json(path: str | Path, obj: Any) -> None:
    atomic_write_json(path, obj)


def round_rows(summary: dict) -> list[dict]:
    """Rows for the per-round table the CLI prints."""
    rows = []
    for r in summary.get("history", []):
        g = r.get("gate") or {}
        rep = r.get("repair") or {}
        rows.append({
            "round": r["round"], "owner": r.get("owner") or "-", "plan": r.get("summary") or r.get("reason", "-"),
            "repair": f"{rep.get('repaired', '-')}/{rep.get('broken', '-')}" if rep else "-",
            "verdict": r["verdict"], "net": g.get("net"), "ci": (g.get("ci_lo"), g.get("ci_hi")) if g else None,
            "regressed": g.get("n_regressed"), "champion": (r.get("champion") or "")[:12], "reason": r.get("reason", ""),
        })
    return rows
