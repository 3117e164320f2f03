"""The record of one evolution round: what `flows/round.py` builds, writes (round.json, the lineage) and hands to
every reader (the report, MLflow, the evidence graph, `ratchet reproduce`, the notebook through MLflow's tags).

A round ends in one of four verdicts, and its record holds what the stages it reached produced:

    no_plan, rejected_plan   round, round_dir, champion_before, reason, verdict (+ meta_agent: the failed replies)
    reject at validation     + plan_key, owner, summary, validation, candidate_digest, benchmark_digest
    reject at the repair     + repair, sequential.repair
    reject at the gate       + gate, dev_look, sequential.gate, mechanism, seed_map_hash, evaluation
    accept                   the gate's fields + version (and, in the lineage, the child it committed);
                             promoted_as ("better" | "cheaper") when the gate weighs cost

Any round with an evaluated candidate has `tokens` (prompt tokens per episode of both arms, per stage); a round
the meta-agent had no plan for that gated a pool candidate again has `retry`, one that dropped a part of a
multi-part card has `ablation` (components/evolution/idle.py).

The lineage adds `parent` and `child`. A field a round did not reach is absent, not null: `dump()` gives exactly the
fields that were set, so round.json and the lineage keep the bytes they had when the record was a plain dict (both are
written with sorted keys). The stages' results are held typed: `gate` a `GateResult`, `repair` a `RepairResult`
(both in components/evolution/gate_config.py, read and written in their file form: `from_dict`, `as_dict`), `sequential`
the looks each stage took, `evaluation` what `ratchet reproduce` re-runs (its gate config a `GateConfig`). Numbers
keep the type they were recorded with (an int stays an int), so the bytes do not move.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, ConfigDict, PlainSerializer, PlainValidator

from components.codes import PlanOwner, Verdict
from components.errors import InputError
from components.evolution.gate import PromotedAs, GateConfig, GateResult, RepairResult


T = TypeVar("T")


def _held(cls: type[T], read: Callable[[dict[str, Any]], T]) -> PlainValidator:
    """The validator of a field holding `cls` (a plain dataclass of gate.py: no pydantic there, `ratchet gate` stays
    light), read from its file form with `read`, values as recorded (no int-to-float coercion); the field's
    `PlainSerializer` writes it back."""

    def validate(v: Any) -> T:
        if isinstance(v, cls):
            return v
        if not isinstance(v, dict):
            raise ValueError(f"expected a {cls.__name__} mapping, got {type(v).__name__}")
        try:
            return read(v)
        except (TypeError, InputError) as e:  # a field missing or unknown; a value GateConfig refuses
            raise ValueError(str(e)) from None

    return PlainValidator(validate)


GateFigures = Annotated[GateResult, _held(GateResult, GateResult.from_dict), PlainSerializer(GateResult.as_dict)]
RepairFigures = Annotated[
    RepairResult, _held(RepairResult, RepairResult.from_dict), PlainSerializer(RepairResult.as_dict)
]


def _gate_settings(cfg: GateConfig) -> dict[str, Any]:
    """A gate's config as recorded; `cheaper` only when on (records from before the cost objective keep their bytes)."""
    return {k: v for k, v in asdict(cfg).items() if k != "cheaper" or v}


GateSettings = Annotated[GateConfig, _held(GateConfig, lambda d: GateConfig(**d)), PlainSerializer(_gate_settings)]


class _Record(BaseModel):
    model_config = ConfigDict(extra="allow")  # a record written by an older Ratchet may hold more: kept as read

    def dump(self) -> dict[str, Any]:
        """The record as written: the fields set, nothing else (round.json, the lineage, summary.json)."""
        return self.model_dump(exclude_unset=True)


Number = int | float  # a figure as recorded: an int stays an int, so a record re-dumps to the bytes it was read from


class LookFigures(_Record):
    """One look's figures (`gate.look_verdict`): which look of how many, the items it saw, the one-sided level it
    decided at, the interval that level gives, the net and the regressed items."""

    look: int
    n_looks: int
    n_items: int
    level: Number
    lo: Number
    hi: Number
    net: Number
    regressed: int
    futility: bool | None = None  # the look stopped for futility (net so far not positive)


class DevLook(_Record):
    """A round's look at dev (`flows.round.dev_look`): its number among the campaign's looks, the alpha it may
    spend, the one-sided alpha the looks so far have spent, and the campaign's whole alpha."""

    look: int
    alpha: Number
    spent: Number  # one-sided, once this look's share is counted (a promotion under `wealth` gives it back after)
    campaign_alpha: Number
    rule: str | None = None  # gate.campaign_spending when not linear (absent: linear, as before)
    wealth: Number | None = None  # under `wealth`: the one-sided wealth left before this look
    # with gate.futility_refund: the one-sided share the look reserved (its test runs at alpha / 2, lower), and,
    # once the gate decided, what it was charged (less than the share after a futility stop; alpha.py)
    reserved: Number | None = None
    charge: Number | None = None


class Looks(_Record):
    """The looks a stage took (gate.json's and repair.json's `sequential`): one look unless the design has more."""

    looks: int
    looks_used: int
    stopped_early: bool
    why: str
    spending: str | None = None  # a sequential design's (absent for one look)
    by: str | None = None
    per_look: list[LookFigures] | None = None  # the gate's: each look's figures
    futile_at: int | None = None  # the look a futility stop ended it at (the gate's)


class StageLooks(_Record):
    """`sequential`: the looks of the repair screen (every round that ran it) and of the gate (a gated round)."""

    repair: Looks | None = None
    gate: Looks | None = None

    def stages(self) -> dict[str, Looks | None]:
        """The stages recorded, by name, in the order they ran."""
        return {k: getattr(self, k) for k in ("repair", "gate") if k in self.model_fields_set}


class EvaluationLooks(_Record):
    """The gate's sequential design and the looks it used (what a reproduction evaluates again)."""

    looks: int
    spending: str
    by: str
    looks_used: int


class Evaluation(_Record):
    """What `ratchet reproduce` needs to re-run a round's gate on the same bytes."""

    benchmark: str  # as recorded: relative to the project root
    split: str
    seeds: list[int]
    model: str
    model_cfg: dict[str, Any]
    max_turns: int
    gate: GateSettings  # the gate's config at this look's alpha
    sequential: EvaluationLooks | None = None  # absent in records from before sequential looks


class RetryInfo(_Record):
    """A round the meta-agent had no plan for that gated a plan of the retry pool again (components/evolution/
    idle.py): which plan, the round and net of its last gate, which attempt, and the fresh dev seeds it was gated on.
    Its look spends its own share of the campaign's alpha like any look."""

    plan_key: str
    of_round: int
    net: Number
    attempt: int
    seeds: list[int]


class AblationInfo(_Record):
    """A round that dropped one part of a card a promotion wrote with several: the round that promoted it, the
    card, the part, its number among the parts that promotion added. The gate's net is the part's contribution
    with the sign turned (the champion without it minus the champion), gated under the same alpha."""

    of_round: int
    card: str
    part: str
    part_no: int
    parts: int


class ArmTokens(_Record):
    """Mean prompt tokens per episode of the two arms over the same cells (errored episodes left out)."""

    base: Number
    cand: Number


class StageTokens(_Record):
    """Prompt tokens per episode of the arms a candidate was evaluated beside, per stage."""

    repair: ArmTokens | None = None
    dev: ArmTokens | None = None


class VersionRef(_Record):
    """A committed version as the lineage names it."""

    version: str
    digest: str


class RoundRecord(_Record):
    """One round's record (see the module doc for which fields each verdict has)."""

    round: int
    round_dir: str = ""  # relative to the campaign output (an absolute one from older records stays)
    champion_before: str = ""  # the champion's version when the round started
    verdict: Verdict
    reason: str = ""
    # the plan (any verdict but no_plan / rejected_plan)
    plan_key: str | None = None
    owner: PlanOwner | None = None
    summary: str | None = None
    meta_agent: dict[str, Any] | None = None  # a rejected plan: the meta-agent's failure and its raw replies
    # the candidate
    candidate_digest: str | None = None
    benchmark_digest: str | None = None
    validation: dict[str, str] | None = None  # check -> "ok" or the problem
    repair: RepairFigures | None = None
    sequential: StageLooks | None = None  # the looks each stage took
    gate: GateFigures | None = None
    dev_look: DevLook | None = None  # this round's look at dev
    mechanism: str | None = None
    seed_map_hash: str | None = None
    evaluation: Evaluation | None = None
    version: str | None = None  # accept: the committed version
    promoted_as: PromotedAs | None = None  # accept with the cost objective: the claim the gate certified
    tokens: StageTokens | None = None  # prompt tokens per episode of both arms, per stage
    retry: RetryInfo | None = None  # a retry from the pool
    ablation: AblationInfo | None = None  # one part of a multi-part card dropped
    # written by the lineage
    parent: VersionRef | None = None
    child: VersionRef | None = None  # None: a rejected round (the lineage writes it null)

    @classmethod
    def of(cls, rec: RoundRecord | dict[str, Any]) -> RoundRecord:
        """A record as read from round.json, the lineage or summary.json's history (or one already typed)."""
        return rec if isinstance(rec, RoundRecord) else cls.model_validate(rec)

    @property
    def accepted(self) -> bool:
        return self.verdict == Verdict.ACCEPT

    @property
    def stops_campaign(self) -> bool:
        """no_plan, rejected_plan: the same inputs would plan the same way again."""
        return self.verdict in (Verdict.NO_PLAN, Verdict.REJECTED_PLAN)

    @property
    def champion_after(self) -> VersionRef | None:
        """The champion once the round is over: the version it committed, else the one it started from."""
        return self.child or self.parent

    @property
    def committed(self) -> VersionRef:
        """The version an accepted round committed (the lineage's `child`); a record without one is damaged."""
        if self.child is None:
            raise InputError(f"round {self.round}: child: the record names no committed version")
        return self.child

    @property
    def gated(self) -> GateResult:
        """The gate's figures of a round that reached the gate; a record without them is damaged."""
        if self.gate is None:
            raise InputError(f"round {self.round}: gate: the record holds no gate figures")
        return self.gate


class StartRecord(_Record):
    """The lineage's first line: the starting package committed as M0, with what the campaign was started on."""

    round: int = 0
    verdict: Verdict  # Verdict.START
    parent: None = None
    child: VersionRef
    source: str = ""  # the start package's path as the campaign was given it
    benchmark_digest: str | None = None  # absent in lineages from before the check
    identity: dict[str, Any] | None = None  # the params a rerun must not change (`Params.identity`)

    @property
    def committed(self) -> VersionRef:
        """The starting package, committed as M0 (`RoundRecord.committed` of an accepted round)."""
        return self.child


def lineage_entry(rec: dict[str, Any]) -> StartRecord | RoundRecord:
    """A lineage line, typed by its verdict."""
    return StartRecord.model_validate(rec) if rec.get("verdict") == Verdict.START else RoundRecord.model_validate(rec)
