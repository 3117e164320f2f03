"""Structured traces: one step per turn, Γt = (state_before, delivered cards, action, observation, proposed state,
checker results, state_after, fingerprint), addressable as (episode id, step) and content-hashed so a diagnosis can
cite it and a validator can check the citation."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

NESTED = ("incoming", "state_before", "delivered", "deliveries", "proposal", "first_draft", "action", "checks",
          "observation", "state_after", "fingerprint")


class TraceStep(BaseModel):
    model_config = ConfigDict(frozen=True)
    episode_id: str
    step: int
    incoming: dict[str, Any]  # what the turn reacted to: the user's message or the last receipt
    state_before: list[dict[str, Any]]  # the ledger after grounding, before this turn's proposal
    delivered: list[str]  # card ids that reached the model this turn, any event
    deliveries: list[dict[str, Any]]  # per firing: event, strategy, cards, whether notes were rendered
    proposal: dict[str, Any]  # the model's proposed pending state and next tool
    first_draft: dict[str, Any] | None = None  # the bounced draft, when the turn redrafted
    action: dict[str, Any]  # the committed draft (or the blocked one)
    checks: list[dict[str, Any]]  # strategy, event, ok, reason, attempt
    blocked: str | None = None  # why the action was not executed
    observation: dict[str, Any]  # the receipt, or the user's reply
    state_after: list[dict[str, Any]]
    fingerprint: list[str]  # mechanisms that fired: deliver:<card>, check:<name>@<event>:bounce, ground:<entry>:done...
    hash: str = Field(default="", description="sha256 of the step's canonical JSON, without this field")

    def content_hash(self) -> str:
        payload = self.model_dump(exclude={"hash"})
        return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()

    def sealed(self) -> TraceStep:
        return self.model_copy(update={"hash": self.content_hash()})


def steps_frame(steps: list[TraceStep], **columns: Any) -> pd.DataFrame:
    """Traces as a table: nested fields as canonical JSON strings, plus any constant columns (item_id, seed...)."""
    rows = []
    for s in steps:
        row = {k: v for k, v in columns.items()}
        d = s.model_dump()
        for k, v in d.items():
            row[k] = json.dumps(v, sort_keys=True) if k in NESTED else v
        rows.append(row)
    return pd.DataFrame(rows)


def frame_steps(df: pd.DataFrame) -> list[TraceStep]:
    out = []
    fields = set(TraceStep.model_fields)
    for row in df.to_dict("records"):
        d = {k: (json.loads(v) if k in NESTED and isinstance(v, str) else v) for k, v in row.items()
             if k in fields and not (isinstance(v, float) and v != v)}  # NaN: a missing optional field
        out.append(TraceStep.model_validate(d))
    return out
