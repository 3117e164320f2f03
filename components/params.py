"""Every knob of a campaign, read from params.yaml (the file DVC tracks) and validated; errors name the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from components.errors import InputError
from components.evolution.gate import GateConfig


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BenchmarkParams(_M):
    world: str = "retail"
    seed: int = 0
    out: str = "data/benchmarks/retail"
    per_family: int | None = Field(None, ge=3, description="tasks per family; null: the world's default (36)")
    train_share: float = Field(1 / 3, gt=0, lt=1)
    dev_share: float = Field(1 / 3, gt=0, lt=1)

    def materialize(self) -> None:
        from components.worlds import world

        world(self.world).materialize(self.out, self.seed, self.per_family, (self.train_share, self.dev_share))


class GateParams(_M):
    alpha: float = Field(0.05, gt=0, lt=1)
    n_boot: int = Field(10_000, ge=100)
    seed: int = 0
    reg_cap: int = Field(2, ge=0)
    material: float = Field(0.05, ge=0, le=1)
    max_error_share: float = Field(0.25, ge=0, le=1)

    def config(self) -> GateConfig:
        return GateConfig(**self.model_dump())


class BudgetParams(_M):
    """Ceilings for one campaign; null means unlimited."""

    tokens_in: int | None = None
    tokens_out: int | None = None
    model_calls: int | None = None
    tool_calls: int | None = None
    wall_seconds: float | None = None
    money: float | None = None
    price_in_per_1k: float = 0.0
    price_out_per_1k: float = 0.0
    max_concurrency: int = Field(4, ge=1)
    max_depth: int = Field(2, ge=0)
    # conservative per-call estimates for reservations (a turn makes at most 3 calls; max_turns bounds the turns)
    est_tokens_in_per_call: float = Field(4000, gt=0)
    est_tokens_out_per_call: float = Field(512, gt=0)

    def caps(self) -> dict[str, float | None]:
        return {"tokens_in": self.tokens_in, "tokens_out": self.tokens_out, "model_calls": self.model_calls,
                "tool_calls": self.tool_calls, "money": self.money}


class CampaignParams(_M):
    name: str = "default"
    start: str = "data/packages/seed"
    out: str = "runs/campaign"
    rounds: int = Field(10, ge=0, le=100)
    seeds: int = Field(3, ge=1, le=20)
    shard_size: int = Field(10, ge=1)
    meta_agent: Literal["rules", "llm"] = "rules"
    meta_agent_cfg: dict[str, Any] = Field(default_factory=dict)
    model: Literal["sim", "openai", "local"] = "sim"
    model_cfg: dict[str, Any] = Field(default_factory=dict)
    task_runner: Literal["threads", "dask"] = "threads"
    workers: int = Field(2, ge=1)
    dask_address: str | None = None
    repair_max_items: int = Field(12, ge=1)
    probe_items: int = Field(4, ge=1)
    max_turns: int = Field(40, ge=1)
    tracking_uri: str | None = None  # MLflow; null: $MLFLOW_TRACKING_URI (sqlite under .ratchet/ by default)


class Params(_M):
    benchmark: BenchmarkParams = Field(default_factory=BenchmarkParams)
    campaign: CampaignParams = Field(default_factory=CampaignParams)
    gate: GateParams = Field(default_factory=GateParams)
    budget: BudgetParams = Field(default_factory=BudgetParams)


def load_params(path: str | Path | None = "params.yaml", overrides: dict[str, Any] | None = None) -> Params:
    raw: dict[str, Any] = {}
    if path is not None and Path(path).exists():
        try:
            raw = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as e:
            raise InputError(f"{path}: -: malformed YAML: {getattr(e, 'problem', e)}") from None
        if not isinstance(raw, dict):
            raise InputError(f"{path}: -: must be a mapping")
    elif path is not None and Path(path).name != "params.yaml":
        raise InputError(f"{path}: -: no such file")
    for dotted, value in (overrides or {}).items():
        node = raw
        *parents, leaf = dotted.split(".")
        for k in parents:
            node = node.setdefault(k, {})
        node[leaf] = value
    try:
        return Params.model_validate(raw)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(p) for p in err["loc"]) or "-"
        raise InputError(f"{path}: {loc}: {err['msg']}") from None
