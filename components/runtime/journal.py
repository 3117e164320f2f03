"""Finished episodes of an evaluation, written one file each as each ends, so a killed evaluation leaves them readable
and a rerun of the same evaluation resumes them instead of paying for them again.

    <root>/<sha256(item#seed)[:16]>.json   {"key", "result": {the scores row, criteria, steps}}

`key` names what produced the episode (package and benchmark digests, model and its settings, turn limit): an
episode recorded under another key is not reused. Each file is written atomically; an unreadable one (a crash mid-
rename cannot make one, but a user can) is run again. Reloaded steps keep their content hashes, so the tables of a
resumed evaluation are the bytes an uninterrupted one writes."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from components.io import atomic_write_text
from components.runtime.episode import EpisodeResult
from components.runtime.trace import TraceStep


# how requests travel, not what the model writes: a rerun with a longer timeout still resumes
TRANSPORT = frozenset({"timeout", "max_retries", "backoff", "backoff_cap", "headers", "api_key_env"})
PARTIAL = "partial"  # under `ratchet eval --out`: the finished episodes of a run not yet complete


def journal_key(**what: Any) -> str:
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()


class Journal:
    def __init__(self, root: str | Path, key: str):
        self.root, self.key = Path(root), key
        self.resumed = 0  # episodes answered from the journal in this run

    def _path(self, item_id: str, seed: int) -> Path:
        return self.root / f"{hashlib.sha256(f'{item_id}#{seed}'.encode()).hexdigest()[:16]}.json"

    def get(self, item_id: str, seed: int) -> EpisodeResult | None:
        p = self._path(item_id, seed)
        try:
            raw = json.loads(p.read_text(encoding="utf-8"))
            if raw.get("key") != self.key:
                return None
            r = raw["result"]
            if (r["item_id"], r["seed"]) != (item_id, seed):
                return None
            out = EpisodeResult(**{**r, "steps": [TraceStep.model_validate(s) for s in r["steps"]], "resumed": True})
        except (OSError, ValueError, KeyError, TypeError):
            return None
        self.resumed += 1
        return out

    def put(self, r: EpisodeResult) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        body = {**r.row(), "criteria": r.criteria, "steps": [s.model_dump() for s in r.steps]}
        atomic_write_text(
            self._path(r.item_id, r.seed), json.dumps({"key": self.key, "result": body}, sort_keys=True) + "\n"
        )

    def finished(self) -> list[dict[str, Any]]:
        """The scores rows of the episodes recorded under this key (what a killed evaluation had finished)."""
        rows = []
        for p in sorted(self.root.glob("*.json")):
            try:
                raw = json.loads(p.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            if raw.get("key") == self.key:
                rows.append({k: v for k, v in raw["result"].items() if k not in ("criteria", "steps")})
        return rows
