"""The record of one evolution round: what `flows/campaign.py` builds, writes (round.json, the lineage) and hands to
every reader (the report, MLflow, the evidence graph, `ratchet reproduce`, the notebook through MLflow's tags).

A round ends in one of four verdicts, and its record holds what the stages it reached produced:

    no_plan, rejected_plan   round, round_dir, champion_before, reason, verdict (+ meta_agent: the failed replies)
    reject at validation     + plan_key, owner, summary, validation, candidate_digest, benchmark_digest
    reject at the repair     + repair, sequential.repair
    reject at the gate       + gate, dev_look, sequential.gate, mechanism, seed_map_hash, evaluation
    accept                   the gate's fields + version (and, in the lineage, the child it committed)

The lineage adds `parent` and `child`. A field a round did not reach is absent, not null: `dump()` gives exactly the
fields that were set, so round.json and the lineage keep the bytes they had when the record was a plain dict (both are
written with sorted keys). The stages' own results (`gate`, `repair`, `evaluation`, ...) stay the dicts their stages
dumped (`GateResult.as_dict()`, ...); their typed forms are in components/evolution/gate.py.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from components.codes import PlanOwner, Verdict


class RoundRecord(BaseModel):
    """One round's record (see the module doc for which fields each verdict has)."""

    model_config = ConfigDict(extra="allow")  # a lineage written by an older Ratchet may hold more: kept as read

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
    repair: dict[str, Any] | None = None  # RepairResult.as_dict()
    sequential: dict[str, Any] | None = None  # {"repair": ..., "gate": ...}: the looks each stage took
    gate: dict[str, Any] | None = None  # GateResult.as_dict()
    dev_look: dict[str, Any] | None = None  # this round's look at dev: look, alpha, spent, campaign_alpha
    mechanism: str | None = None
    seed_map_hash: str | None = None
    evaluation: dict[str, Any] | None = None  # what `ratchet reproduce` needs to re-run the gate on the same bytes
    version: str | None = None  # accept: the committed version
    # written by the lineage
    parent: dict[str, Any] | None = None
    child: dict[str, Any] | None = None

    @classmethod
    def of(cls, rec: RoundRecord | dict[str, Any]) -> RoundRecord:
        """A record as read from round.json, the lineage or summary.json's history (or one already typed)."""
        return rec if isinstance(rec, RoundRecord) else cls.model_validate(rec)

    def dump(self) -> dict[str, Any]:
        """The record as written: the fields set, nothing else (round.json, the lineage, summary.json)."""
        return self.model_dump(exclude_unset=True)

    @property
    def accepted(self) -> bool:
        return self.verdict == Verdict.ACCEPT

    @property
    def stops_campaign(self) -> bool:
        """no_plan, rejected_plan: the same inputs would plan the same way again."""
        return self.verdict in (Verdict.NO_PLAN, Verdict.REJECTED_PLAN)

    @property
    def gate_figures(self) -> dict[str, Any]:
        return self.gate or {}
