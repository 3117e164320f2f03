"""The manifest (`manifest.yaml`): the package's name, W's options, and the rho/C strategy bindings."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from components.memory.ledger import WMOptions


class BindingSpec(BaseModel):
    """`{use, at, cfg}`: run the registered strategy `use` at runtime event `at` with options `cfg`."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    use: str
    at: str
    cfg: dict[str, Any] = Field(default_factory=dict)


class Manifest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    name: str = Field(min_length=1)
    description: str = ""
    wm: WMOptions = Field(default_factory=WMOptions)
    delivery: list[BindingSpec] = Field(default_factory=list)
    checkers: list[BindingSpec] = Field(default_factory=list)
