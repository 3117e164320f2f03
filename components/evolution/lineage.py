"""Commit: the campaign's lineage of immutable package versions M0, M1, ... and the record of every decision.

    <lineage>/versions/M<k>/       an accepted package, byte for byte what the gate evaluated
    <lineage>/lineage.jsonl        one record per round: verdict, parent -> child digest, figures, reason, plan key
    <lineage>/rejected/<key>.json  every rejected plan with its reason (so it is not proposed again)

`commit` recomputes the candidate's digest and refuses it if it differs from the digest that was evaluated, builds the
version in a temp directory and renames it into place (atomic), and refuses to overwrite an existing version. Records
are appended by rewriting the file atomically, so a reader never sees half a line. A commit repeated after a crash
(version on disk, record missing) is recognised by its digest and completed, not duplicated.

The start record also pins the campaign's identity: the benchmark digest and the evolution params a rerun must keep
(`check_rerun` refuses a rerun whose start package, benchmark or those params differ, naming the field). Paths in
round records are relative to the campaign directory, so a moved or copied campaign resumes where it now is.
A last line without its newline was never committed (a record is written whole by rename, so it can only come from
a foreign writer or a damaged disk): it is ignored; a damaged line before it is refused, naming the line.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components.evolution.record import RoundRecord, StartRecord, lineage_entry
from components.codes import Verdict
from components.errors import InputError
from components.io import atomic_dir, atomic_write_json, atomic_write_text, confined
from components.memory.package import digest


class CommitError(InputError):
    pass


class CampaignMismatch(InputError):
    """A rerun on an existing campaign with other inputs or evolution params than its lineage records."""


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
        self.torn: str | None = None  # a torn last line that records() ignored (the next append drops it)

    # -- reading ------------------------------------------------------------------------------------------------
    def records(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        try:
            text = self.log.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise CommitError(f"{self.log}: -: not UTF-8 text (byte {e.start}); the lineage is damaged") from None
        lines = text.split("\n")
        if lines[-1].strip():  # no trailing newline: torn, never committed unless it is a whole record
            try:
                json.loads(lines[-1])
            except json.JSONDecodeError:
                self.torn = lines.pop()
        out = []
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise CommitError(
                    f"{self.log}: line {n}: not a JSON record ({e.msg}); the lineage is damaged"
                ) from None
            if not isinstance(rec, dict) or "round" not in rec or "verdict" not in rec:
                raise CommitError(f"{self.log}: line {n}: not a lineage record (needs round and verdict)")
            out.append(rec)
        return out

    def versions(self) -> list[Version]:
        committed = [lineage_entry(r) for r in self.records() if r.get("verdict") in (Verdict.START, Verdict.ACCEPT)]
        return [
            Version(
                r.committed.version,
                self.version_dir(r.committed.version, f"round {r.round}: child.version"),
                r.committed.digest,
            )
            for r in committed
        ]

    def version_dir(self, name: str, field: str = "version") -> Path:
        """Where version `name` (as a record names it) lives: under versions/, never outside on a record's say-so."""
        return confined(self.versions_dir, name, f"{self.log}: {field}")

    def check_bytes(self, v: Version) -> None:
        """Refuse (CommitError) a version whose bytes on disk are not the digest its record pins: edited after it was
        committed, or missing (a checkout without `dvc checkout`)."""
        if not v.path.is_dir():
            raise CommitError(f"{v.path}: -: version {v.name} is missing (run `dvc checkout` at the recording commit)")
        have = digest(v.path)
        if have != v.digest:
            raise CommitError(
                f"{v.path}: digest: {v.name}'s bytes on disk are {have[:12]}, the lineage pins "
                f"{v.digest[:12]} (edited after it was committed; `dvc checkout` restores it)"
            )

    def champion(self) -> Version:
        vs = self.versions()
        if not vs:
            raise CommitError(f"{self.log}: no committed version (start the campaign first)")
        return vs[-1]

    def rejected_keys(self) -> set[str]:
        return {r.plan_key for r in self.rounds() if r.verdict == Verdict.REJECT and r.plan_key}

    def rejected_sites(self) -> set[str]:
        """Where the rejected plans acted (`Plan.site`), from the plans kept beside the lineage."""
        from components.evolution.plan import Plan

        return {
            Plan.model_validate(json.loads((self.rejected_dir / f"{key}.json").read_text())["plan"]).site()
            for key in self.rejected_keys()
            if (self.rejected_dir / f"{key}.json").exists()
        }

    def round_record(self, round_no: int) -> dict[str, Any] | None:
        return next((r for r in self.records() if r.get("round") == round_no), None)

    def entries(self) -> list[StartRecord | RoundRecord]:
        """Every line, typed: the start record, then the rounds."""
        return [lineage_entry(r) for r in self.records()]

    def rounds(self) -> list[RoundRecord]:
        """Every round's record (not the start's), typed."""
        return [RoundRecord.of(r) for r in self.records() if r.get("round", 0) > 0]

    # -- writing ------------------------------------------------------------------------------------------------
    def _append(self, record: dict[str, Any]) -> None:
        lines = [json.dumps(r, sort_keys=True) for r in self.records()] + [json.dumps(record, sort_keys=True)]
        atomic_write_text(self.log, "\n".join(lines) + "\n")

    def start(
        self,
        package: str | Path,
        benchmark_digest: str | None = None,
        identity: dict[str, Any] | None = None,
        source: str | None = None,
    ) -> Version:
        """Commit the starting package as M0 (idempotent), with the campaign's identity; `source`: the package's
        path as the record shows it (default: `package`)."""
        if self.versions():
            return self.versions()[0]
        d = digest(package)
        v = self._materialize("M0", package, d)
        rec: dict[str, Any] = {
            "round": 0,
            "verdict": Verdict.START,
            "parent": None,
            "child": {"version": v.name, "digest": d},
            "source": str(package) if source is None else source,
        }
        if benchmark_digest is not None:
            rec["benchmark_digest"] = benchmark_digest
        if identity is not None:
            rec["identity"] = identity
        self._append(rec)
        return v

    def check_rerun(
        self,
        start_digest: str | None,
        benchmark_digest: str | None,
        identity: dict[str, Any],
        where: str = "campaign",
        legacy_identity: dict[str, Any] | None = None,
    ) -> None:
        """Refuse (CampaignMismatch) a rerun whose start bytes, benchmark bytes or evolution params differ from what
        this lineage recorded. `legacy_identity`: the params of a campaign whose start record predates identities."""
        records = self.records()
        first = next((StartRecord.model_validate(r) for r in records if r.get("verdict") == Verdict.START), None)
        if first is None:
            return
        hint = "; choose a new --out, or pass --force to start this campaign over"
        m0 = first.child.digest
        if start_digest is not None and start_digest != m0:
            raise CampaignMismatch(
                f"{where}: campaign.start: the start package's digest is {start_digest[:12]}, "
                f"this campaign's M0 is {m0[:12]}{hint}"
            )
        bench = first.benchmark_digest or next(
            (r["benchmark_digest"] for r in records if r.get("benchmark_digest")), None
        )
        if benchmark_digest is not None and bench is not None and benchmark_digest != bench:
            raise CampaignMismatch(
                f"{where}: benchmark: the benchmark's digest is {benchmark_digest[:12]}, "
                f"this campaign ran on {bench[:12]}{hint}"
            )
        recorded = first.identity or legacy_identity or {}
        for key in sorted(set(identity) | set(recorded)):
            if key in recorded and identity.get(key) != recorded[key]:
                raise CampaignMismatch(
                    f"{where}: {key}: {_short(identity.get(key))} now, "
                    f"{_short(recorded[key])} in this campaign's lineage{hint}"
                )

    def commit(self, candidate: str | Path, evaluated_digest: str, round_no: int, record: dict[str, Any]) -> Version:
        actual = digest(candidate)
        if actual != evaluated_digest:
            raise CommitError(
                f"{candidate}: digest {actual[:12]} differs from the evaluated {evaluated_digest[:12]}; refusing to commit"
            )
        parent = self.champion()
        name = f"M{len(self.versions())}"
        v = self._materialize(name, candidate, actual)
        self._append(
            {
                **record,
                "round": round_no,
                "verdict": Verdict.ACCEPT,
                "parent": {"version": parent.name, "digest": parent.digest},
                "child": {"version": v.name, "digest": actual},
            }
        )
        return v

    def reject(self, round_no: int, record: dict[str, Any], plan: dict[str, Any] | None = None) -> None:
        parent = self.champion()
        rec = {
            **record,
            "round": round_no,
            "verdict": record.get("verdict", Verdict.REJECT),
            "parent": {"version": parent.name, "digest": parent.digest},
            "child": None,
        }
        if plan is not None and rec.get("plan_key"):
            atomic_write_json(
                self.rejected_dir / f"{rec['plan_key']}.json", {"plan": plan, "reason": rec.get("reason")}
            )
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


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 60 else text[:57] + "..."


class LineageLocked(InputError):
    pass


@dataclass
class _Hold:
    """A lineage lock this process holds: its file descriptor, how many takings are open, the dead holder's info."""

    fd: int
    depth: int
    recovered: dict[str, Any] | None


class LineageLock:
    """Exclusive use of a lineage directory by one campaign process.

    An OS file lock (flock) on `<lineage>/LOCK`: the kernel drops it when the holder dies, however it dies, so a
    stale lock from a killed process is recovered by the next taker; the file also names the holder, so a second
    campaign fails at once saying who has it. (flock is per machine: on a shared filesystem use one runner.)"""

    # what this process holds: lock path -> _Hold (fd, depth, recovered). The CLI takes the lock as soon as a campaign's
    # checks pass (before Prefect's server starts, so a second campaign on the same output is refused at once, not
    # after the first one's start-up), and the campaign flow joins it (`join=True`); any other taking conflicts, in
    # this process as in another one (flock).
    _held: dict[str, _Hold] = {}

    def __init__(self, root: str | Path, join: bool = False):
        self.path = Path(root) / "LOCK"
        self._fd: int | None = None
        self._join, self._nested = join, False
        self.recovered: dict[str, Any] | None = None  # holder info left by a dead process, if any

    def _key(self) -> str:
        import os

        return os.path.abspath(self.path)

    def probe(self) -> None:
        """Raise LineageLocked now if another process holds the lock (a check before starting work; takes nothing)."""
        import fcntl
        import os

        if not self.path.is_file() or self._key() in LineageLock._held:
            return
        fd = os.open(self.path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = self.path.read_text(encoding="utf-8", errors="replace").strip() or "unknown"
            raise LineageLocked(f"{self.path.parent}: lineage is locked by another campaign ({holder})") from None
        finally:
            os.close(fd)  # closing drops the probe's lock

    def __enter__(self) -> LineageLock:
        import fcntl
        import os
        import socket
        import time

        held = LineageLock._held.get(self._key()) if self._join else None
        if held is not None:  # this process holds it already (the CLI, then the flow)
            held.depth += 1
            self.recovered, self._nested = held.recovered, True
            return self
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            other = self.path.read_text(encoding="utf-8", errors="replace").strip() or "unknown"
            os.close(fd)
            raise LineageLocked(f"{self.path.parent}: lineage is locked by another campaign ({other})") from None
        previous = os.read(fd, 4096).decode(errors="replace").strip()
        if previous:
            self.recovered = json.loads(previous) if previous.startswith("{") else {"holder": previous}
        holder = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%dT%H:%M:%S")}
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(holder).encode(), 0)
        except OSError as e:  # a full disk: pwrite(2) names no file
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
            raise type(e)(e.errno, e.strerror, str(self.path)) from None
        self._fd = fd
        LineageLock._held[self._key()] = _Hold(fd, 1, self.recovered)
        return self

    def __exit__(self, *exc: object) -> None:
        import fcntl
        import os

        if self._nested:
            self._nested = False
            LineageLock._held[self._key()].depth -= 1
            return
        LineageLock._held.pop(self._key(), None)
        if self._fd is not None:
            os.ftruncate(self._fd, 0)  # a clean exit leaves no holder behind
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
