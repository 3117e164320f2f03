"""The evidence graph's records: nodes, edges and expiry keys (`graph.py` stores them, `graph_policy.py` rules on
them). Their own module, below both, so that the store and the policy each import them and neither imports the
other's models back."""

from __future__ import annotations

import hashlib
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Kind = Literal["source", "run", "claim", "artifact", "decision", "question"]
Confidence = Literal["unverified", "supported", "contested"]
Relation = Literal["supports", "contradicts", "derived_from", "used_in", "supersedes"]
Author = Literal["harness", "model", "meta_agent", "person"]
KINDS: tuple[str, ...] = Kind.__args__  # type: ignore[attr-defined]
RELATIONS: tuple[str, ...] = Relation.__args__  # type: ignore[attr-defined]


class Expiry(BaseModel):
    """What an observation is tied to: it expires when any key given here differs from the current context."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    benchmark: str | None = None  # benchmark digest
    model: str | None = None  # model backend and name
    backend: str | None = None  # backend / server version

    def keys(self) -> dict[str, str]:
        return {k: v for k, v in self.model_dump().items() if v is not None}


class Node(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    id: str
    kind: Kind
    key: str = Field(min_length=1, description="natural identity within the kind (a plan key, episode:step:hash...)")
    version: int = Field(ge=1)
    content: str = ""
    data: dict[str, Any] = Field(default_factory=dict)
    confidence: Confidence = "unverified"
    author: Author = "harness"
    campaign: str = ""
    expiry: Expiry | None = None
    created: float = 0.0

    def compact(self, chars: int = 160) -> dict[str, Any]:
        """The layer a projection shows: identity, status and a short content; the id fetches the rest."""
        out = {
            "id": self.id,
            "kind": self.kind,
            "confidence": self.confidence,
            "content": self.content if len(self.content) <= chars else self.content[: chars - 1] + "…",
        }
        if self.data.get("type"):
            out["type"] = self.data["type"]
        return out


class Edge(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    src: str
    relation: Relation
    dst: str
    campaign: str = ""
    created: float = 0.0


def node_id(kind: str, key: str) -> str:
    """Stable across campaigns and machines: the same observation is the same node."""
    return kind + ":" + hashlib.sha256((kind + "\0" + key).encode()).hexdigest()[:12]
