"""Every knob of a campaign, read from params.yaml (the file DVC tracks) and validated; errors name the field."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)


from components.defaults import MAX_SOURCE_ITEMS, MAX_TRACES_PER_ROUND, MAX_TURNS, SPLIT_SHARES
from components.errors import InputError
from components.evolution.alpha import Spending
from components.evolution.gate import MAX_BOOT, MIN_BOOT, GateConfig, SequentialDesign
from components.io import recorded_path, strict_yaml, yaml_problem  # noqa: F401 (recorded_path: params' own)
from components.worlds.base import ReceiptMode

# A free-form options dict (meta_agent_cfg, model_cfg) is data a strategy reads, not a store: bounded so that a
# hostile or mistaken file cannot make serializing the params explode.
CFG_MAX_NODES, CFG_MAX_DEPTH = 1000, 8


def _bounded(cfg: dict[str, Any]) -> dict[str, Any]:
    seen = 0
    stack: list[tuple[Any, int]] = [(cfg, 1)]
    while stack:  # counts visits, not distinct objects: shared references cost what they would serialize to
        node, depth = stack.pop()
        seen += 1
        if seen > CFG_MAX_NODES:
            raise ValueError(f"more than {CFG_MAX_NODES} values")
        if depth > CFG_MAX_DEPTH:
            raise ValueError(f"nested deeper than {CFG_MAX_DEPTH} levels")
        if isinstance(node, dict):
            for k, v in node.items():
                if not isinstance(k, str):
                    raise ValueError(f"key {k!r} is not a string")
                stack.append((v, depth + 1))
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)
        elif isinstance(node, float) and not math.isfinite(node):
            raise ValueError(f"{node} is not a finite number")
        elif node is not None and not isinstance(node, (str, int, float, bool)):
            raise ValueError(f"{type(node).__name__} is not a plain value")
    return cfg


Cfg = Annotated[dict[str, Any], AfterValidator(_bounded)]


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)  # every number finite

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_a_number(cls, v: Any, info: ValidationInfo) -> Any:
        # pydantic reads `true` as 1 for an int or float field: `seeds: true` would be one seed, silently
        if isinstance(v, bool) and info.field_name and not _takes_bool(cls.model_fields[info.field_name].annotation):
            raise ValueError(f"{v!r} is a yes/no value, not a {_kind(cls.model_fields[info.field_name].annotation)}")
        return v


def _takes_bool(annotation: Any) -> bool:
    return annotation is bool or annotation is Any or any(_takes_bool(a) for a in get_args(annotation))


def _kind(annotation: Any) -> str:
    names = [a.__name__ for a in (annotation, *get_args(annotation)) if a in (int, float)]
    return " or ".join(dict.fromkeys(names)) or "value of this kind"


def world_bench_dir(world: str) -> str:
    """Where a world's benchmark lives when `benchmark.out` is not given (dvc.yaml uses the same path)."""
    return f"data/benchmarks/{world}"


class BenchmarkParams(_M):
    world: str = "retail"
    seed: int = 0
    out: str = Field(world_bench_dir("retail"), description="null: data/benchmarks/<world>")
    per_family: int | None = Field(None, ge=3, le=1000, description="tasks per family; null: the world's default (36)")
    train_share: float = Field(SPLIT_SHARES[0], gt=0, lt=1)
    dev_share: float = Field(SPLIT_SHARES[1], gt=0, lt=1)
    # a variant of the world: the rules to change (rule id -> value, as in the world's rules.yaml), or the path of a
    # YAML file of them (`ratchet bench materialize --rules FILE`); validated at load, the whole record written to
    # meta.json (so the digest); empty: the world's own rules
    rules: dict[str, Any] | str = Field(default_factory=dict)
    # what a rule refusal tells the agent (components.worlds.base.ReceiptMode); in meta.json, so in the digest
    receipts: ReceiptMode = ReceiptMode.silent
    # how episodes run (components.runtime.protocol): standard (a reference orchestrator's rules: tau2-bench's) or
    # custom (Ratchet's harness); null: the world's default (standard where the world has one); in meta.json
    protocol: Literal["standard", "custom"] | None = None

    def protocol_for(self) -> str:
        """The protocol the benchmark is materialized with: `protocol`, else the world's default."""
        from components.worlds import world

        return self.protocol or world(self.world).protocols[0]

    @model_validator(mode="before")
    @classmethod
    def _out_follows_world(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("out") is None:
            data = {**data, "out": world_bench_dir(str(data.get("world", "retail")))}
        return data

    @field_validator("world")
    @classmethod
    def _known_world(cls, v: str) -> str:
        from components.worlds import WORLDS, world

        try:
            world(v)
        except InputError:
            raise ValueError(f"unknown world {v!r} (one of {', '.join(WORLDS.names())})") from None
        return v

    @field_validator("dev_share")
    @classmethod
    def _test_share(cls, v: float, info: ValidationInfo) -> float:
        if v + info.data.get("train_share", 0) >= 1:
            raise ValueError("train_share + dev_share must leave a share for the test split (< 1)")
        return v

    def materialize(self, inputs: dict[str, str | Path] | None = None) -> Path:
        """Write the benchmark at `out` (refused unless `out` is new, empty or a benchmark), with no empty split."""
        import json

        from components.io import atomic_dir, claim_output
        from components.worlds import BenchmarkError, world

        import inspect

        spec = world(self.world)
        if self.rules and "rules" not in inspect.signature(spec.materialize).parameters:
            raise BenchmarkError(f"benchmark.rules: the {self.world} world's rules are not data a benchmark can change")
        out = claim_output(self.out, "benchmark", option="benchmark.out", inputs=inputs)
        with atomic_dir(out) as tmp:  # built and checked aside: a refused benchmark replaces nothing
            changed: dict[str, Any] = {"rules": self.rules} if self.rules else {}  # a world whose rules are data
            if self.receipts not in spec.receipts:  # the modes the world declares (checked when it was loaded)
                raise BenchmarkError(
                    f"benchmark.receipts: {self.receipts.value!r}: the {self.world} world's receipts "
                    f"are {' | '.join(m.value for m in spec.receipts)} only "
                    f"(set benchmark.receipts: {spec.receipts[0].value})"
                )
            if spec.receipts != (ReceiptMode.explained,):  # such a world's materialize takes them (`world()` checks)
                changed["receipts"] = self.receipts
            if self.protocol_for() not in spec.protocols:
                raise BenchmarkError(
                    f"benchmark.protocol: {self.protocol!r}: the {self.world} world's episodes run "
                    f"under {' | '.join(spec.protocols)} only"
                )
            if spec.protocols != ("custom",):  # such a world's materialize takes it (`world()` checks)
                changed["protocol"] = self.protocol_for()
            spec.materialize(tmp, self.seed, self.per_family, (self.train_share, self.dev_share), **changed)
            sizes = {k: len(v) for k, v in json.loads((tmp / "splits.json").read_text(encoding="utf-8")).items()}
            empty = [k for k, n in sizes.items() if n == 0]
            if empty:
                raise BenchmarkError(
                    f"{self.out}: train_share/dev_share: the {', '.join(empty)} split would be empty "
                    f"({', '.join(f'{k} {n}' for k, n in sizes.items())} tasks)"
                )
        return out

    def check_existing(self, root: str | Path) -> None:
        """Refuse (InputError) a benchmark at `root` that these params would not have made: a run on it would record
        params it did not use. The params' own benchmark is built aside (a temporary directory; ~0.3 s) and its
        meta.json compared with the one here, key by key: every key a world records there (world, seed, tasks per
        family, split sizes, facts, receipts, and any key a world adds later) is compared, none by name."""
        import json
        import tempfile

        here = Path(root) / "meta.json"
        have = json.loads(here.read_text(encoding="utf-8"))
        key = json.dumps([have, self.model_dump(mode="json", exclude={"out"})], sort_keys=True)
        if key in _MADE_HERE:
            return
        with tempfile.TemporaryDirectory(prefix="ratchet-bench-") as tmp:
            aside = str(Path(tmp) / "b")
            try:
                built = self.model_copy(update={"out": aside}).materialize()
            except InputError as e:  # what these params cannot make, said of the benchmark they name
                raise InputError(str(e).replace(aside, str(root))) from None
            want = json.loads((built / "meta.json").read_text(encoding="utf-8"))
        for k in sorted(set(have) | set(want)):
            if have.get(k) != want.get(k):
                raise InputError(
                    f"{here}: {k}: {_brief(have.get(k))} here, but the benchmark.* params make "
                    f"{_brief(want.get(k))}: the benchmark at benchmark.out was made with other "
                    "settings; materialize it again with these (`ratchet bench materialize`), or set "
                    "benchmark.out to a new directory"
                )
        _MADE_HERE.add(key)


_MADE_HERE: set[str] = set()  # (meta.json, params) pairs already checked in this process


def _brief(value: Any) -> str:
    import json

    text = "absent" if value is None else json.dumps(value, sort_keys=True)
    return text if len(text) <= 80 else text[:77] + "..."


class SequentialParams(_M):
    """Early stopping of the round's dev evaluation (and repair screen): looks: 1 evaluates in full."""

    looks: int = Field(1, ge=1, le=20)
    spending: Literal["pocock", "obf"] = "pocock"
    by: Literal["seeds", "items"] = "seeds"
    repair: bool = True  # the repair screen stops early with the same looks

    def design(self) -> SequentialDesign:
        return SequentialDesign(self.looks, self.spending, self.by)


class GateParams(_M):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)  # nan passes no comparison: refuse it

    alpha: float = Field(GateConfig.alpha, gt=0, lt=1)
    n_boot: int = Field(GateConfig.n_boot, ge=MIN_BOOT, le=MAX_BOOT)
    seed: int = Field(GateConfig.seed, ge=0)  # numpy refuses a negative seed: refused here, before a campaign starts
    reg_cap: int = Field(GateConfig.reg_cap, ge=0)
    material: float = Field(GateConfig.material, ge=0, le=1)
    max_error_share: float = Field(GateConfig.max_error_share, ge=0, le=1)
    min_items: int = Field(GateConfig.min_items, ge=2)
    campaign_alpha: float = Field(GateConfig.campaign_alpha, gt=0, lt=0.5)
    reg_share: float = Field(GateConfig.reg_share, ge=0, le=1)
    sequential: SequentialParams = Field(default_factory=SequentialParams)
    # cost as a second objective: a change that keeps the score within `material` and cuts prompt tokens is
    # promoted as "cheaper" (GateConfig.cheaper)
    # off by default: each claim then tests at half the look's alpha (GateConfig.route_alpha), a loss of power for
    # the "better" claim the default campaign lives on
    cheaper: bool = False
    # how a campaign's looks share campaign_alpha (components/evolution/alpha.py): linear (campaign_alpha / rounds
    # a look) | wealth (the wealth left over the rounds left; a promotion gives its share back)
    campaign_spending: Spending = Spending.WEALTH
    # a round stopped for futility is charged only what its spending function reached; its test runs at a lower
    # level to pay for it (alpha.py: a trade under no effect, a gain when the changes gated are harmful). Off: a
    # look is charged its whole share
    futility_refund: bool = False
    # the retry pool: a plan the gate rejected with a positive mean is gated again, on dev seeds it was not
    # evaluated on, in a round the meta-agent has no plan for; at most this many times (0: no pool)
    retries: int = Field(1, ge=0, le=20)

    @model_validator(mode="after")
    def _refund_needs_wealth(self) -> GateParams:
        # under the linear rule a look's share does not depend on what was spent: a refund would only lower levels
        if self.futility_refund and self.campaign_spending == Spending.LINEAR:
            raise ValueError("futility_refund: needs campaign_spending: wealth (the linear rule gives nothing back)")
        return self

    def config(self) -> GateConfig:
        return GateConfig(**self.model_dump(exclude={"sequential", "campaign_spending", "retries", "futility_refund"}))


class BudgetParams(_M):
    """Ceilings for one campaign; null means unlimited."""

    tokens_in: int | None = Field(None, ge=0)
    tokens_out: int | None = Field(None, ge=0)
    model_calls: int | None = Field(None, ge=0)
    tool_calls: int | None = Field(None, ge=0)
    wall_seconds: float | None = Field(None, ge=0)
    money: float | None = Field(None, ge=0)
    price_in_per_1k: float = Field(0.0, ge=0)
    price_out_per_1k: float = Field(0.0, ge=0)
    max_concurrency: int = Field(4, ge=1)
    max_depth: int = Field(2, ge=0)
    # conservative per-call estimates for reservations (a turn makes at most 3 calls; max_turns bounds the turns)
    est_tokens_in_per_call: float = Field(4000, gt=0)
    est_tokens_out_per_call: float = Field(512, gt=0)

    def caps(self) -> dict[str, float | None]:
        return {
            "tokens_in": self.tokens_in,
            "tokens_out": self.tokens_out,
            "model_calls": self.model_calls,
            "tool_calls": self.tool_calls,
            "money": self.money,
        }


TRACKING_SCHEMES = (
    "",
    "file",
    "sqlite",
    "http",
    "https",
    "postgresql",
    "mysql",
    "mssql",
    "databricks",
    "databricks-uc",
    "uc",
)  # what MLflow 3 accepts as a tracking and model registry store


# A param marked PLACE says where and how a campaign runs, what it is called or what it may spend, never what a round
# computes: a completed round is kept for a replay under its other params (`Params.round_inputs`). A round's files
# never name its campaign; the campaign memory it read (per campaign name and evidence.db) is compared on replay.
PLACE: dict[str, Any] = {"place": True}


def _without_place(m: BaseModel, dumped: dict[str, Any]) -> dict[str, Any]:
    for name, f in type(m).model_fields.items():
        if isinstance(f.json_schema_extra, dict) and f.json_schema_extra.get("place"):
            dumped.pop(name, None)
        elif isinstance(getattr(m, name), BaseModel):
            _without_place(getattr(m, name), dumped[name])
    return dumped


class CampaignParams(_M):
    name: str = Field("default", json_schema_extra=PLACE)
    start: str = "data/packages/seed"
    out: str = Field("runs/campaign", json_schema_extra=PLACE)
    rounds: int = Field(10, ge=0, le=100)
    seeds: int = Field(3, ge=1, le=20)
    shard_size: int | None = Field(None, ge=1)
    # a registered meta-agent and model backend: the built-ins (rules | llm; sim | openai | local) or an installed
    # plug-in's (the `ratchet.meta_agents` and `ratchet.models` entry points), checked against the live registries
    meta_agent: str = "rules"
    meta_agent_cfg: Cfg = Field(default_factory=dict)
    model: str = "sim"
    model_cfg: Cfg = Field(default_factory=dict)
    task_runner: Literal["threads", "dask"] = Field("threads", json_schema_extra=PLACE)
    workers: int = Field(2, ge=1, json_schema_extra=PLACE)
    dask_address: str | None = Field(None, json_schema_extra=PLACE)
    repair_max_items: int = Field(MAX_SOURCE_ITEMS, ge=1)
    # ablation: in a round the meta-agent has no plan for (and no retry is due), drop one part of a card a
    # promotion wrote with several parts (a rule, a list item), gated as "cheaper" or "better" like any change
    ablate: bool = True
    probe_items: int = Field(4, ge=1)
    max_turns: int = Field(MAX_TURNS, ge=1)
    # MLflow; null: $MLFLOW_TRACKING_URI (sqlite under .ratchet/ by default)
    tracking_uri: str | None = Field(None, json_schema_extra=PLACE)
    # cited failed episodes logged to MLflow as traces per round: a record only, no result depends on it
    traces_per_round: int = Field(MAX_TRACES_PER_ROUND, ge=0, le=1000, json_schema_extra=PLACE)

    # Checked here, not where they are used: a bad one otherwise failed inside the first round, in Prefect's traceback
    @field_validator("meta_agent")
    @classmethod
    def _registered_meta_agent(cls, v: str) -> str:
        from components.evolution.meta_agents import META_AGENTS

        return META_AGENTS.check(v)

    @field_validator("model")
    @classmethod
    def _registered_model(cls, v: str) -> str:
        from components.models import MODELS

        return MODELS.check(v)

    @field_validator("tracking_uri")
    @classmethod
    def _tracking_scheme(cls, v: str | None) -> str | None:
        scheme = v.split("://", 1)[0].split("+", 1)[0].lower() if v and "://" in v else ""
        if scheme not in TRACKING_SCHEMES:
            raise ValueError(
                f"{v!r}: not a store MLflow can use (a path, or a URL of {', '.join(TRACKING_SCHEMES[1:])})"
            )
        return v

    @field_validator("dask_address")
    @classmethod
    def _dask_address(cls, v: str | None) -> str | None:
        from urllib.parse import urlsplit

        if v is None or v.startswith("inproc://"):
            return v
        u = urlsplit(v if "://" in v else f"tcp://{v}")
        try:
            port = u.port
        except ValueError:
            port = None
        if u.scheme not in ("tcp", "tls", "ws", "wss", "ucx") or not u.hostname or port is None:
            raise ValueError(f"{v!r}: not a Dask scheduler address (e.g. tcp://127.0.0.1:8786)")
        return v


class EvidenceParams(_M):
    """Campaign memory (components/evidence/graph*.py): where the evidence graph lives and what planning reads."""

    # a path or a SQLAlchemy URL; null: $RATCHET_HOME/evidence.db, next to the MLflow store
    db: str | None = Field(None, json_schema_extra=PLACE)
    memory: bool = True  # read the graph before planning; false: a stateless campaign (it still records)
    projection_chars: int = Field(4000, ge=200, le=200_000)  # size limit of the projection the meta-agent reads


# What a rerun on an existing campaign output may change. Everything else that decides the campaign's results (its
# name, seeds, meta-agent, model, turn limit, probe and repair sizes, the gate) must equal what its lineage recorded, as
# must the bytes of the start package and of the benchmark (their digests; their paths may change).
RERUN_MAY_CHANGE = (
    "campaign.rounds",
    "campaign.out",
    "campaign.start",
    "campaign.shard_size",
    "campaign.task_runner",
    "campaign.workers",
    "campaign.dask_address",
    "campaign.tracking_uri",
    "campaign.traces_per_round",
    "benchmark.*",
    "budget.*",
    "evidence.*",
    "campaign.model_cfg.{base_url,timeout,max_retries,backoff,backoff_cap,api_key_env}",
)
_TRANSPORT = ("base_url", "timeout", "max_retries", "backoff", "backoff_cap", "api_key_env")


BUILTIN_PACKAGES = ("none", "seed", "all-skills", "reference")


def _builtin_packages(world_name: str) -> dict[str, Path]:
    """Where the built-in packages lie for a world spec that does not list them: retail's at data/packages/<name>,
    another world's at data/packages/<world>/<name>."""
    root = Path(__file__).resolve().parents[1] / "data" / "packages"
    base = root if world_name == "retail" else root / world_name
    return {n: base / n for n in BUILTIN_PACKAGES if (base / n).is_dir()}


def resolve_start(start: str, world_name: str) -> str:
    """`campaign.start` as a path: a built-in package name (`none`, `seed`, `all-skills`, `reference`) names the
    world's own package, unless a directory of that name exists here (a path always works). A relative path to the
    project's shipped packages (`data/packages/...`, the default) that does not exist here is the installed
    project's: a campaign runs from any working directory."""
    if Path(start).exists():
        return start
    shipped = Path(__file__).resolve().parents[1]
    if not Path(start).is_absolute() and Path(start).parts[:2] == ("data", "packages") and (shipped / start).is_dir():
        return str(shipped / start)
    if "/" in start or "\\" in start:
        return start
    from components.worlds import world

    try:
        spec = world(world_name)
    except InputError:
        return start  # the unknown world is reported on benchmark.world
    packages = getattr(spec, "packages", None) or _builtin_packages(world_name)
    where = packages.get(start)
    if where is None:
        return start
    where = Path(where).resolve()
    try:  # relative to the project when it is inside it: the default campaign records the same path as before
        return where.relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return str(where)


class Params(_M):
    benchmark: BenchmarkParams = Field(default_factory=BenchmarkParams)
    campaign: CampaignParams = Field(default_factory=CampaignParams)
    gate: GateParams = Field(default_factory=GateParams)
    budget: BudgetParams = Field(default_factory=BudgetParams, json_schema_extra=PLACE)  # a budget stop keeps no round
    evidence: EvidenceParams = Field(default_factory=EvidenceParams)

    @model_validator(mode="before")
    @classmethod
    def _start_follows_world(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not isinstance(data.get("campaign", {}), dict):
            return data
        campaign = data.get("campaign", {})
        start = campaign.get("start", CampaignParams.model_fields["start"].default)  # the default too: from anywhere
        bench = b if isinstance(b := data.get("benchmark"), dict) else {}
        if isinstance(start, str) and start:
            resolved = resolve_start(start, str(bench.get("world", "retail")))
            if resolved != start or "start" in campaign:
                data = {**data, "campaign": {**campaign, "start": resolved}}
        return data

    def resolved(self) -> "Params":
        """The params with every path a task may receive absolute (a URL stays a URL), against this process's working
        directory: called once at a flow's door, so that a shard run by a worker in another directory (another
        machine with a shared filesystem) reads and writes the same files. Idempotent."""
        return self._paths(_absolute)

    def round_inputs(self) -> dict[str, Any]:
        """The params a round reads, as records show them (`recorded`: a moved or cloned project gives the same), the
        ones marked PLACE left out."""
        rec = self.recorded()
        return _without_place(rec, rec.model_dump())

    def recorded(self) -> "Params":
        """The params as a record shows them (summary.json, the lineage, MLflow): a path inside this working
        directory relative to it (as the default campaign and dvc.yaml name it, so a moved or cloned project records
        the same bytes), any other absolute. `recorded()` of `resolved()` is the params as given, normalized."""
        return self._paths(recorded_path)

    def _paths(self, fix) -> "Params":
        c, e = self.campaign, self.evidence
        return self.model_copy(
            update={
                "benchmark": self.benchmark.model_copy(
                    update={
                        "out": fix(self.benchmark.out),
                        "rules": fix(self.benchmark.rules)
                        if isinstance(self.benchmark.rules, str)
                        else self.benchmark.rules,
                    }
                ),
                "campaign": c.model_copy(
                    update={"out": fix(c.out), "start": fix(c.start), "tracking_uri": _store(c.tracking_uri, fix)}
                ),
                "evidence": e.model_copy(update={"db": _store(e.db, fix)}),
            }
        )

    def identity(self) -> dict[str, Any]:
        """The evolution params a rerun must keep (dotted name -> value); see RERUN_MAY_CHANGE."""
        c = self.campaign
        ident = {
            f"campaign.{k}": getattr(c, k)
            for k in (
                "name",
                "seeds",
                "meta_agent",
                "meta_agent_cfg",
                "model",
                "repair_max_items",
                "probe_items",
                "max_turns",
                "ablate",
            )
        }
        ident["campaign.model_cfg"] = {k: v for k, v in c.model_cfg.items() if k not in _TRANSPORT}
        ident.update({f"gate.{k}": v for k, v in self.gate.model_dump().items()})
        return ident


def _absolute(path: str) -> str:
    import os

    return os.path.abspath(path)  # not resolve(): a symlinked directory keeps the name it was given


def _store(where: str | None, fix) -> str | None:
    """A store named by a path or a URL (evidence.db, campaign.tracking_uri): a path, or the file of a `sqlite:///`
    URL, through `fix`; any other URL (a server, `sqlite://` in memory) as it is."""
    if where is None:
        return None
    if where.startswith("sqlite:///") and len(where) > len("sqlite:///"):
        file, _, query = where.removeprefix("sqlite:///").partition("?")
        if file == ":memory:":
            return where
        return f"sqlite:///{fix(file)}" + (f"?{query}" if query else "")
    if "://" in where or where.startswith("file:"):
        return where
    return fix(where)


def parse_set(items: list[str]) -> dict[str, Any]:
    """`--set key.path=value` overrides; values are YAML (aliases refused)."""
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise InputError(f"--set: {item!r}: expected key.path=value")
        k, v = item.split("=", 1)
        if not k or any(not part for part in k.split(".")):
            raise InputError(f"--set: {item!r}: expected key.path=value")
        try:
            out[k] = strict_yaml(v)
        except yaml.YAMLError as e:
            raise InputError(f"--set: {k}: malformed YAML value: {yaml_problem(e)}") from None
        except RecursionError:
            raise InputError(f"--set: {k}: nested too deeply to read") from None
    return out


def load_params(path: str | Path | None = "params.yaml", overrides: dict[str, Any] | None = None) -> Params:
    """The params in `path` (None: the built-in defaults) with dotted overrides; every error one line, naming the
    file and the field."""
    raw: Any = {}
    if path is not None:
        path = Path(path)
        if not path.exists():
            raise InputError(f"{path}: -: no such file")
        if not path.is_file():
            raise InputError(f"{path}: -: not a file")
        try:
            raw = strict_yaml(path.read_text(encoding="utf-8")) or {}
        except UnicodeDecodeError as e:
            raise InputError(f"{path}: -: not UTF-8 text (byte {e.start})") from None
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f"line {mark.line + 1}" if mark else "-"
            raise InputError(f"{path}: {where}: malformed YAML: {yaml_problem(e)}") from None
        except OSError as e:
            raise InputError(f"{path}: -: cannot read ({e.strerror})") from None
        except RecursionError:
            raise InputError(f"{path}: -: nested too deeply to read") from None
        if not isinstance(raw, dict):
            raise InputError(f"{path}: -: must be a mapping")
    for dotted, value in (overrides or {}).items():
        node = raw
        *parents, leaf = dotted.split(".")
        for i, k in enumerate(parents):
            node = node.setdefault(k, {})
            if not isinstance(node, dict):
                raise InputError(f"--set: {dotted}: {'.'.join(parents[: i + 1])} is not a mapping")
        node[leaf] = value
    try:
        return Params.model_validate(raw)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(p) for p in err["loc"]) or "-"
        raise InputError(f"{path or 'params'}: {loc}: {err['msg'].removeprefix('Value error, ')}") from None
