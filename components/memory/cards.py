"""E: experiential cards. One Markdown file per card at em/<type>/<id>.md with YAML front matter."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

CardType = Literal["knowledge", "procedure", "action_result"]
CARD_TYPES: tuple[str, ...] = ("knowledge", "procedure", "action_result")


class Trigger(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    event: str
    tool: str | None = None


class CardMeta(BaseModel):
    """The front matter. Cards say how to handle a class of situation, never a task's answer."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    id: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]*$")
    type: CardType
    trigger: Trigger | None = None
    source: str = Field(min_length=1, description="provenance: the failure or document it came from")


class Card(BaseModel):
    model_config = ConfigDict(frozen=True)
    meta: CardMeta
    body: str
    path: str  # relative to the package root

    @property
    def id(self) -> str:
        return self.meta.id

    def render(self) -> str:
        return f"### card {self.meta.id} ({self.meta.type})\n{self.body.strip()}"
