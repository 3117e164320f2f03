"""The codes modules exchange, each defined once: who a failure is attributed to (`Owner`), what a finding says went
wrong (`FindingKind`), what became of a round (`Verdict`) and what a checker said about a draft (`CheckCode`).

Every one is a `StrEnum`, so a member is its string: files, MLflow, the evidence graph and the reports keep their
spellings (`json.dumps(Owner.RHO)` is `"rho"`, `f"{Verdict.ACCEPT}"` is `accept`), and a string read back from a file
compares equal to its member (`"accept" == Verdict.ACCEPT`).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import AfterValidator


class Owner(StrEnum):
    """Who a failure is attributed to: one of the package's four parts, or no part of it."""

    E = "E"  # experience: the cards (knowledge, procedures)
    W = "W"  # working memory: the ledger of pending work
    RHO = "rho"  # routing: which cards are delivered where
    C = "C"  # checking: checkers that bounce a draft
    NONE = "none"  # the diagnoser: not the package's (a model fault, a blocking refusal, out of turns)
    EXTERNAL = "external"  # the hidden labels' (and the trace rule's) spelling of `none`
    UNKNOWN = "unknown"  # the diagnoser cannot tell: reported, never patched


PACKAGE_OWNERS = (Owner.E, Owner.W, Owner.RHO, Owner.C)  # the parts a plan may change, in the reports' order
CAUSE_OWNERS = (*PACKAGE_OWNERS, Owner.NONE)  # the columns of the reports' causes per round


def owner_field(*members: Owner):
    """A pydantic field type accepting these owners' strings (with pydantic's message naming them, as a Literal of
    strings would) and holding the member."""
    return Annotated[Literal[tuple(m.value for m in members)], AfterValidator(Owner)]


PlanOwner = owner_field(*PACKAGE_OWNERS)  # a plan's owner
PacketOwner = owner_field(*PACKAGE_OWNERS, Owner.NONE, Owner.UNKNOWN)  # an evidence packet's owner


class FindingKind(StrEnum):
    """What one failed episode's finding says went wrong (components/evolution/diagnose.py, outcomes.py)."""

    UNCONFIRMED_WRITE = "unconfirmed_write"
    POLICY_REFUSAL = "policy_refusal"
    CARD_NOT_FIRED = "card_not_fired"
    DILUTED_CARD = "diluted_card"
    INEFFECTIVE_CARD = "ineffective_card"
    CARD_UNOBSERVED = "card_unobserved"
    BOUNCED_WRITE = "bounced_write"
    CHECKER_FALSE_ALARM = "checker_false_alarm"
    PREMATURE_FINISH = "premature_finish"
    WRONG_GROUNDING = "wrong_grounding"
    OVERFLOW = "overflow"
    DROPPED = "dropped"
    BLOCKING_ERROR = "blocking_error"
    OUT_OF_TURNS = "out_of_turns"
    MODEL_FAULT = "model_fault"
    WRONG_VALUE = "wrong_value"
    UNSEEN_VALUE = "unseen_value"
    MISSING_WRITE = "missing_write"
    EXTRA_WRITE = "extra_write"
    NO_DIVERGENCE = "no_divergence"


class Verdict(StrEnum):
    """What became of a round (its lineage record's `verdict`)."""

    START = "start"  # the campaign's starting package (M0), the lineage's first record
    ACCEPT = "accept"  # the candidate passed every stage and is the new champion
    REJECT = "reject"  # a plan was made and failed validation, the repair screen or the gate
    NO_PLAN = "no_plan"  # nothing left to patch that was not already tried: the campaign stops
    REJECTED_PLAN = "rejected_plan"  # the meta-agent's plan was unusable (invalid, or it failed): the campaign stops


STOPS_CAMPAIGN = (Verdict.NO_PLAN, Verdict.REJECTED_PLAN)  # the same inputs would plan the same way again


class CheckCode(StrEnum):
    """Why a checker bounced a draft, as the agent reads it (beside the checker's message, which is for people)."""

    UNCONFIRMED = "unconfirmed"  # a write no granted confirmation covers
    PENDING_WORK = "pending_work"  # `finish` while the ledger still lists work
