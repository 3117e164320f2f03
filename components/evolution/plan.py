"""A patch plan: one owner, the evidence it rests on, and a few operations confined to the package's own files.

Both meta-agent backends (rules, llm) emit this schema; the same validation applies to both. Operations name
cards by package-relative paths (em/<type>/<id>.md); the manifest is changed only through typed fields.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Annotated, Any, Literal, Union

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from components.codes import PlanOwner
from components.errors import InputError
from components.evidence.packets import Citation

CARD_PATH = re.compile(r"em/(knowledge|procedure|action_result)/[a-z0-9][a-z0-9_-]*\.md")


def _card_path(v: str) -> str:
    if v.startswith("/") or "\\" in v or ".." in v.split("/") or not CARD_PATH.fullmatch(v):
        raise ValueError(f"path {v!r} escapes the package or is not em/<type>/<id>.md")
    return v


CardPath = Annotated[str, AfterValidator(_card_path)]


class _Op(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AddCard(_Op):
    op: Literal["add_card"]
    path: CardPath
    meta: dict[str, Any]
    body: str = Field(min_length=1)


class RemoveCard(_Op):
    """Take a card out (a revocation: the change a promotion made is removed in a candidate, then gated)."""

    op: Literal["remove_card"]
    path: CardPath


class SetTrigger(_Op):
    op: Literal["set_trigger"]
    path: CardPath
    event: str
    tool: str | None = None


class SetWM(_Op):
    op: Literal["set_wm"]
    field: Literal["board", "max_entries", "bind_on"]
    value: Any


class AddBinding(_Op):
    op: Literal["add_binding"]
    section: Literal["delivery", "checkers"]
    use: str
    at: str
    cfg: dict[str, Any] = Field(default_factory=dict)


class RemoveBinding(_Op):
    op: Literal["remove_binding"]
    section: Literal["delivery", "checkers"]
    use: str
    at: str


Operation = Annotated[
    Union[AddCard, RemoveCard, SetTrigger, SetWM, AddBinding, RemoveBinding], Field(discriminator="op")
]


class Plan(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    owner: PlanOwner
    cluster: str = Field(min_length=1, description="the diagnosis packet this plan answers")
    summary: str = Field(min_length=1)
    rationale: str = ""
    evidence: list[Citation] = Field(min_length=1)
    operations: list[Operation] = Field(min_length=1, max_length=4)
    mechanism: str = Field(min_length=1, description="fingerprint prefix that shows the change fired")
    source_items: list[str] = Field(min_length=1)

    def key(self) -> str:
        """Identity of the change itself (owner + operations): equal plans are not tried twice. A card's `source` is
        provenance (which packet, how many refusals), not the change: it differs every round for the same card."""
        ops = [o.model_dump() for o in self.operations]
        for o in ops:
            if o["op"] == "add_card":
                o["meta"] = {k: v for k, v in o["meta"].items() if k != "source"}
        return hashlib.sha256(json.dumps([self.owner, ops], sort_keys=True).encode()).hexdigest()[:16]

    def site(self) -> str:
        """Where the change acts, not what it writes: the owner and the cards, ledger fields and checkers its
        operations change. A card drafted again from a new champion's traces can differ in a detail (its key
        changes) and still be the change the gate rejected there: it is tried after the untried ones. The delivery
        wiring a first card adds, and a later one finds in place, is a site only of a plan that changes nothing
        else."""
        spots = {_spot(o) for o in self.operations}
        changed = sorted(s for s in spots if not s.startswith("delivery:")) or sorted(spots)
        return "site:" + hashlib.sha256(json.dumps([self.owner, changed]).encode()).hexdigest()[:16]


def _spot(o: Operation) -> str:
    """What one operation changes: a card (by path), a ledger field, or a binding of a section."""
    if isinstance(o, (AddBinding, RemoveBinding)):
        return f"{o.section}:{o.use}@{o.at}"
    if isinstance(o, SetWM):
        return f"wm:{o.field}"
    return f"card:{o.path}"


def parse_plan(raw: str | dict[str, Any], where: str = "plan") -> Plan:
    """Validate a plan from JSON text or a dict; errors name the field."""
    try:
        return Plan.model_validate_json(raw) if isinstance(raw, str) else Plan.model_validate(raw)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(p) for p in err["loc"]) or "-"
        raise InputError(f"{where}: {loc}: {err['msg']}") from None
