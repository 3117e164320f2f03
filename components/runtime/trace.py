"""Structured traces: one step per turn, Γt = (state_before, delivered cards, action, observation, proposed state,
checker results, state_after, fingerprint), addressable as (episode id, step) and content-hashed so a diagnosis can
cite it and a validator can check the citation."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

NESTED = (
    "incoming",
    "state_before",
    "delivered",
    "deliveries",
    "proposal",
    "first_draft",
    "action",
    "checks",
    "observation",
    "state_after",
    "fingerprint",
)


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
    # each nested field's canonical JSON, kept from sealing for `steps_frame` (the same bytes it would write)
    _nested_json: dict[str, str] | None = PrivateAttr(default=None)

    def _encoded(self) -> tuple[str, dict[str, str]]:
        """The canonical JSON of the step without `hash` (`json.dumps(model_dump(exclude={"hash"}), sort_keys=True,
        default=str)`, the same bytes, assembled field by field: an object's JSON is its sorted "key": value pairs
        joined by ", "), and each nested field's JSON as `steps_frame` writes it (strict: no default)."""
        fields = self.model_dump(exclude={"hash"})
        enc, nested = {}, {}
        for k, v in fields.items():
            try:
                enc[k] = json.dumps(v, sort_keys=True)
                if k in NESTED:
                    nested[k] = enc[k]
            except TypeError:  # not JSON: the hash reads it as str(); steps_frame would refuse it, so keep none
                enc[k] = json.dumps(v, sort_keys=True, default=str)
        body = ", ".join(f"{json.dumps(k)}: {enc[k]}" for k in sorted(enc))
        return "{" + body + "}", nested

    def content_hash(self) -> str:
        return hashlib.sha256(self._encoded()[0].encode()).hexdigest()

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> TraceStep:
        out = super().model_copy(update=update, deep=deep)
        if update:  # changed fields: the kept encodings no longer describe it
            out._nested_json = None
        return out

    def sealed(self) -> TraceStep:
        payload, nested = self._encoded()
        out = self.model_copy(update={"hash": hashlib.sha256(payload.encode()).hexdigest()})
        out._nested_json = nested if len(nested) == len(NESTED) else None
        return out


def steps_frame(steps: list[TraceStep], **columns: Any) -> pd.DataFrame:
    """Traces as a table: nested fields as canonical JSON strings, plus any constant columns (item_id, seed...)."""
    rows = []
    for s in steps:
        row = {k: v for k, v in columns.items()}
        nested = s._nested_json
        if nested is not None and s.hash:  # sealed: its fields are as they were encoded (the model is frozen)
            for k in TraceStep.model_fields:
                row[k] = nested[k] if k in NESTED else getattr(s, k)
        else:
            for k, v in s.model_dump().items():
                row[k] = json.dumps(v, sort_keys=True) if k in NESTED else v
        rows.append(row)
    return pd.DataFrame(rows)


def frame_steps(df: pd.DataFrame) -> list[TraceStep]:
    out = []
    fields = set(TraceStep.model_fields)
    for row in df.to_dict("records"):
        d = {
            k: (json.loads(v) if k in NESTED and isinstance(v, str) else v)
            for k, v in row.items()
            if k in fields and not (isinstance(v, float) and v != v)
        }  # NaN: a missing optional field
        out.append(TraceStep.model_validate(d))
    return out
