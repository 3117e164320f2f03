"""Evidence packets: a diagnosis with claims that cite trace steps by (episode id, step, content hash).

A consumer checks every citation before using the packet: the step exists in the traces it names, its recorded hash
equals the cited one, and the step's content still hashes to that value. A hash certifies the reference, not the
interpretation; the claims stay the diagnoser's."""

from __future__ import annotations

from typing import Literal

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from components.codes import Owner, PacketOwner
from components.runtime.trace import frame_steps


class Citation(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    episode_id: str
    step: int = Field(ge=0)
    hash: str = Field(min_length=64, max_length=64)


class Claim(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    statement: str
    evidence: list[Citation] = Field(min_length=1)


class EvidencePacket(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    id: str
    status: Literal["complete", "partial", "blocked"] = "complete"
    corpus: str  # what the citations resolve against: package digest : benchmark digest : seed map hash
    owner: PacketOwner  # unknown: the diagnoser cannot tell; never patched
    opportunity: Literal["present", "absent", "unknown"]
    patchability: Literal["memory", "external", "unknown"]
    kind: str
    tool: str = "*"
    rule_id: str | None = None  # a rule refusal's cluster: the rule (two rules on one write are two packets)
    detail: str = ""
    episodes: list[str]
    items: list[str]
    claims: list[Claim]
    unresolved: list[str] = Field(default_factory=list)

    @property
    def patchable(self) -> bool:
        return (
            self.opportunity == "present"
            and self.patchability == "memory"
            and self.owner not in (Owner.NONE, Owner.UNKNOWN)
        )

    def citations(self) -> list[Citation]:
        return [c for claim in self.claims for c in claim.evidence]


def verify_citations(packet: EvidencePacket, traces: pd.DataFrame) -> list[str]:
    """Problems with the packet's citations; empty when every one resolves and its hash matches."""
    problems = []
    index = {
        (r.episode_id, int(r.step)): i for i, r in enumerate(traces[["episode_id", "step"]].itertuples(index=False))
    }
    for c in packet.citations():
        at = index.get((c.episode_id, c.step))
        if at is None:
            problems.append(f"{packet.id}: citation {c.episode_id} step {c.step} does not resolve")
            continue
        step = frame_steps(traces.iloc[[at]])[0]
        if step.hash != c.hash:
            problems.append(
                f"{packet.id}: citation {c.episode_id} step {c.step}: hash {c.hash[:12]} != recorded {step.hash[:12]}"
            )
        elif step.content_hash() != step.hash:
            problems.append(
                f"{packet.id}: citation {c.episode_id} step {c.step}: step content no longer matches its hash"
            )
    return problems
