"""W: the working-memory ledger, and the law of write authority.

    the model proposes pending work  ->  the ledger keeps it (up to `max_entries`)
    a genuine receipt bound to an entry  ->  `settle` marks it DONE (or BLOCKED)

Only `settle` changes an entry's status, and it accepts only genuine receipts from the world: a model's claim,
a bounced call or any synthetic result can never mark work done. Settled entries are protected from later proposals;
pending entries the model stops proposing move to history (they are what "the agent forgot" looks like in a trace).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from components.runtime.types import Intent, Proposal, Receipt

Status = Literal["pending", "done", "blocked"]
# what identifies a unit of work: its tool and its arguments, sorted, as text
IntentKey = tuple[str, tuple[tuple[str, str], ...]]


class WMOptions(BaseModel):
    """The manifest's `wm:` section."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    board: bool = Field(False, description="render the ledger board into every turn's memory")
    max_entries: int = Field(8, ge=1, le=64, description="pending entries the ledger tracks; more are not tracked")
    bind_on: list[str] = Field(
        default_factory=list,
        description="argument names a receipt must match (besides its tool) to settle an entry",
    )


class Entry(BaseModel):
    model_config = ConfigDict(frozen=True)
    id: str
    tool: str
    args: dict[str, str]
    note: str = ""
    status: Status = "pending"
    evidence: str | None = None  # call id of the receipt that settled it

    def key(self) -> IntentKey:
        return intent_key(self.tool, self.args)


def intent_key(tool: str, args: dict[str, str]) -> IntentKey:
    return (tool, tuple(sorted((k, str(v)) for k, v in args.items())))


class ProposalResult(BaseModel):
    added: list[str] = Field(default_factory=list)
    retired: list[str] = Field(default_factory=list)
    overflow: int = 0  # proposed entries not tracked because the ledger was full


class Ledger:
    def __init__(self, options: WMOptions):
        self.options = options
        self.entries: list[Entry] = []  # active: pending and settled
        self.history: list[Entry] = []  # pending entries the model stopped proposing
        self._next = 1

    # -- reading -----------------------------------------------------------------------------------------
    def pending(self) -> list[Entry]:
        return [e for e in self.entries if e.status == "pending"]

    def snapshot(self) -> list[dict[str, Any]]:
        return [e.model_dump() for e in self.entries]

    def render(self, only_pending: bool = False) -> str:
        rows = [e for e in self.entries if not only_pending or e.status == "pending"]
        lines = ["## Working memory (ledger)"]
        if not rows:
            lines.append("- (no tracked work)")
        for e in rows:
            args = " ".join(f"{k}={v}" for k, v in sorted(e.args.items()))
            proof = f" (receipt {e.evidence})" if e.evidence else ""
            lines.append(f"- [{e.status.upper()}] {e.id} {e.tool} {args}{proof} {e.note}".rstrip())
        return "\n".join(lines)

    # -- the model proposes ------------------------------------------------------------------------------
    def apply_proposal(self, proposal: Proposal) -> ProposalResult:
        result = ProposalResult()
        settled = {e.key() for e in self.entries if e.status != "pending"}
        current = {e.key(): e for e in self.pending()}
        wanted: list[Intent] = []
        seen: set[IntentKey] = set()
        for intent in proposal.pending:
            k = intent_key(intent.tool, intent.args)
            if k in settled or k in seen:  # settled truth is not the model's to reopen
                continue
            seen.add(k)
            wanted.append(intent)
        # Tracked entries the model still proposes stay; new ones take the free places in proposal order.
        keep = [current.pop(k) for k in [intent_key(i.tool, i.args) for i in wanted] if k in current]
        tracked = {e.key() for e in keep}
        for intent in wanted:
            if intent_key(intent.tool, intent.args) in tracked:
                continue
            if len(keep) >= self.options.max_entries:
                result.overflow += 1
                continue
            entry = Entry(id=f"e{self._next}", tool=intent.tool, args=dict(intent.args), note=intent.note)
            self._next += 1
            keep.append(entry)
            result.added.append(entry.id)
        for stale in current.values():
            self.history.append(stale)
            result.retired.append(stale.id)
        self.entries = [e for e in self.entries if e.status != "pending"] + keep
        return result

    # -- only the harness settles ------------------------------------------------------------------------
    def settle(self, receipts: list[Receipt]) -> list[tuple[str, str]]:
        """Ground receipts: each genuine write receipt settles the pending entries it binds to.

        A receipt binds to an entry when the tool matches and every `bind_on` argument matches. Success settles
        DONE; a failure the world marks final (`content.blocking`) settles BLOCKED; any other failure leaves the
        entry pending. Returns (entry id, new status) pairs."""
        settled: list[tuple[str, str]] = []
        for r in receipts:
            if not (r.genuine and r.write):
                continue
            blocking = isinstance(r.content, dict) and bool(r.content.get("blocking"))
            if not r.ok and not blocking:
                continue
            status: Status = "done" if r.ok else "blocked"
            for i, e in enumerate(self.entries):
                if e.status == "pending" and self._binds(e, r):
                    self.entries[i] = e.model_copy(update={"status": status, "evidence": r.call_id})
                    settled.append((e.id, status))
        return settled

    def _binds(self, e: Entry, r: Receipt) -> bool:
        if e.tool != r.tool:
            return False
        return all(str(r.args.get(k)) == str(e.args.get(k)) for k in self.options.bind_on)
