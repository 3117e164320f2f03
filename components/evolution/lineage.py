"""Commit: the campaign's lineage of immutable package versions M0, M1, ... and the record of every decision.

    <lineage>/versions/M<k>/       an accepted package, byte for byte what the gate evaluated
    <lineage>/lineage.jsonl        one record per round: verdict, parent -> child digest, figures, reason, plan key
    <lineage>/rejected/<key>.json  every rejected plan with its reason (so it is not proposed again)

`commit` recomputes the candidate's digest and refuses it if it differs from the digest that was evaluated, builds the
version in a temp directory and renames it into place (atomic), and refuses to overwrite an existing version. Records
are appended by rewriting the file atomically, so a reader never sees half a line. A commit repeated after a crash
(version on disk, record missing) is recognised by its digest and completed, not duplicated.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components.errors import InputError
from components.io import atomic_dir, atomic_write_json, atomic_write_text
from components.memory.package import digest


class CommitError(InputError):
    pass


@dataclass(frozen=True)
class Version:
    name: str
    path: Path
    digest: str


class Lineage:
    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.versions_dir = self.root / "versions"
        self.log = self.root / "lineage.jsonl"
        self.rejected_dir = self.root / "rejected"

    # -- reading ------------------------------------------------------------------------------------------------
    def records(self) -> list[dict]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text(encoding="utf-8").splitlines() if line.strip()]

    def versions(self) -> list[Version]:
        out = []
        for r in self.records():
            if r.get("verdict") in ("start", "accept"):
                name = r["child"]["version"]
                out.append(Version(name, self.versions_dir / name, r["child"]["digest"]))
        return out

    def champion(self) -> Version:
        vs = self.versions()
        if not vs:
            raise CommitError(f"{self.log}: no committed version (start the campaign first)")
        return vs[-1]

    def rejected_keys(self) -> set[str]:
        return {r["plan_key"] for r in self.records() if r.get("verdict") == "reject" and r.get("plan_key")}

    def round_record(self, round_no: int) -> dict | None:
        return next((r for r in self.records() if r.get("round") == round_no), None)

    # -- writing ------------------------------------------------------------------------------------------------
    def _append(self, record: dict) -> None:
        lines = [json.dumps(r, sort_keys=True) for r in self.records()] + [json.dumps(record, sort_keys=True)]
        atomic_write_text(self.log, "\n".join(lines) + "\n")

    def start(self, package: str | Path) -> Version:
        """Commit the starting package as M0 (idempotent)."""
        if self.versions():
            return self.versions()[0]
        d = digest(package)
        v = self._materialize("M0", package, d)
        self._append({"round": 0, "verdict": "start", "parent": None, "child": {"version": v.name, "digest": d},
                      "source": str(package)})
        return v

    def commit(self, candidate: str | Path, evaluated_digest: str, round_no: int, record: dict[str, Any]) -> Version:
        actual = digest(candidate)
        if actual != evaluated_digest:
            raise CommitError(f"{candidate}: digest {actual[:12]} differs from the evaluated {evaluated_digest[:12]}; refusing to commit")
        parent = self.champion()
        name = f"M{len(self.versions())}"
        v = self._materialize(name, candidate, actual)
        self._append({**record, "round": round_no, "verdict": "accept",
                      "parent": {"version": parent.name, "digest": parent.digest},
                      "child": {"version": v.name, "digest": actual}})
        return v

    def reject(self, round_no: int, record: dict[str, Any], plan: dict | None = None) -> None:
        parent = self.champion()
        rec = {**record, "round": round_no, "verdict": record.get("verdict", "reject"),
               "parent": {"version": parent.name, "digest": parent.digest}, "child": None}
        if plan is not None and rec.get("plan_key"):
            atomic_write_json(self.rejected_dir / f"{rec['plan_key']}.json", {"plan": plan, "reason": rec.get("reason")})
        self._append(rec)

    def _materialize(self, name: str, src: str | Path, expected: str) -> Version:
        dst = self.versions_dir / name
        if dst.exists():
            if digest(dst) == expected:  # a commit interrupted after the rename: finish it, do not duplicate
                return Version(name, dst, expected)
            raise CommitError(f"{dst}: version exists with other bytes; refusing to overwrite")
        with atomic_dir(dst, replace=False) as tmp:
            shutil.copytree(src, tmp, dirs_exist_ok=True)
            if digest(tmp) != expected:
                raise CommitError(f"{src}: changed while being committed")
        return Version(name, dst, expected)


class LineageLocked(InputError):
    pass


class LineageLock:
    """Exclusive use of a lineage directory by one campaign process.

    An OS file lock (flock) on `<lineage>/LOCK`: the kernel drops it when the holder dies, however it dies, so a
    stale lock from a killed process is recovered by the next taker; the file also names the holder, so a second
    campaign fails at once saying who has it. (flock is per machine: on a shared filesystem use one runner.)"""

    def __init__(self, root: str | Path):
        self.path = Path(root) / "LOCK"
        self._fd: int | None = None
        self.recovered: dict | None = None  # holder info left by a dead process, if any

    def __enter__(self) -> LineageLock:
        import fcntl
        import os
        import socket
        import time

        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = self.path.read_text(encoding="utf-8", errors="replace").strip() or "unknown"
            os.close(fd)
            raise LineageLocked(f"{self.path.parent}: lineage is locked by another campaign ({holder})") from None
        previous = os.read(fd, 4096).decode(errors="replace").strip()
        if previous:
            self.recovered = json.loads(previous) if previous.startswith("{") else {"holder": previous}
        holder = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%dT%H:%M:%S")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(holder).encode(), 0)
        self._fd = fd
        return self

    def __exit__(self, *exc) -> None:
        import fcntl
        import os

        if self._fd is not None:
            os.ftruncate(self._fd, 0)  # a clean exit leaves no holder behind
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
