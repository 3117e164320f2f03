"""The identity of a model a training step produced: what the next inner campaign runs with.

A trainer (any command: `ratchet outer learn-sim` offline, a TRL script on a GPU) reads an export and writes
`model.json`, one `ModelSpec`: the backend and options the campaign's `campaign.model` / `campaign.model_cfg` take
(for a served model: `openai` with its base_url and model name), a name, and what it was trained on. A name is
required: it is the model's identity in the records (`components.evidence.graph_record.model_id` reads
`model_cfg.model`), so the evidence graph's model-specific findings do not carry over to a model that learned.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from components.errors import InputError
from components.io import atomic_write_json, read_json_object

MODEL_FILE = "model.json"


class ModelSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(min_length=1, max_length=200)
    model: str = Field(min_length=1)  # a registered backend: sim | openai | local
    model_cfg: dict[str, Any] = Field(default_factory=dict)
    trained_on: str = Field(min_length=1)  # the export's digest (`ExportManifest.digest`)
    base: str = ""  # the identity of the model it was trained from
    notes: dict[str, Any] = Field(default_factory=dict)  # what the trainer wants recorded (counts, facts, ...)

    @model_validator(mode="after")
    def _named(self) -> ModelSpec:
        if self.model_cfg.get("model") not in (None, self.name):
            raise ValueError(f"model_cfg.model {self.model_cfg['model']!r} differs from name {self.name!r}")
        return self

    def campaign_cfg(self) -> dict[str, Any]:
        """`campaign.model_cfg` for the inner campaign: the name travels as `model`, the identity records read."""
        return {**self.model_cfg, "model": self.name}

    def check_backend(self, where: str) -> None:
        from components.models import MODELS

        MODELS.make(self.model, self.campaign_cfg(), where=f"{where}: model_cfg")


def read_model(path: str | Path) -> ModelSpec:
    p = Path(path)
    raw = read_json_object(p)
    try:
        spec = ModelSpec.model_validate(raw)
    except ValidationError as e:
        first = e.errors()[0]
        raise InputError(f"{p}: {'.'.join(str(x) for x in first['loc']) or '-'}: {first['msg']}") from None
    spec.check_backend(str(p))
    return spec


def write_model(path: str | Path, spec: ModelSpec) -> None:
    atomic_write_json(path, spec.model_dump())
