"""The simple trace reading the diagnoser is measured against: a handful of yes/no signals any reader of a trace sees
at a glance, and the three-line rule over them (blocking -> external; any rule refusal -> E; an unconfirmed write or
a finish with work pending -> C; else W).

`components.evolution.localization` fits the best owner per pattern of these signals on labelled train episodes (the
three-line rule where train has no episode with that pattern): the strongest rule a reader of these signals could
reach. The diagnoser has to beat it by a margin, or its owner logic adds nothing a glance would not. The signals read
traces only, never a hidden cause; in a world whose refusals state no rule (or that refuses nothing) `refusal` is
simply never set, and the rule falls back on the others.
"""

from __future__ import annotations

import pandas as pd
from pydantic import BaseModel, ConfigDict

from components.codes import Owner
from components.runtime.confirm import Act, Targets, covered, step_act
from components.runtime.trace import TraceStep, frame_steps


class Signals(BaseModel):
    """What a glance at one failed episode's trace shows."""

    model_config = ConfigDict(frozen=True)
    blocking: bool  # the world refused something as impossible (a `blocking` receipt), or the model failed
    refusal: bool  # a write was refused on a rule (its receipt has a `rule_id`)
    unconfirmed: bool  # a write went through without a granted confirmation covering it
    early_finish: bool  # `finish` while the agent's own proposed state still listed work
    bounced: bool  # a checker bounced a draft
    unfinished: bool  # the episode ended without a `finish` the world accepted (cut off, or given up)

    def pattern(self) -> str:
        """The signals as one key (a fitted rule's cell)."""
        return "".join("1" if getattr(self, k) else "0" for k in type(self).model_fields)


def three_line(s: Signals) -> Owner:
    if s.blocking:
        return Owner.EXTERNAL
    if s.refusal:
        return Owner.E
    if s.unconfirmed or s.early_finish:
        return Owner.C
    return Owner.W


def signals(
    steps: list[TraceStep], write_tools: frozenset[str], targets: Targets | None = None, error: str = ""
) -> Signals:
    return Signals(
        blocking=bool(error) or not steps or any(s.blocked is None and s.observation.get("blocking") for s in steps),
        refusal=any(s.blocked is None and not s.observation.get("ok") and s.observation.get("rule_id") for s in steps),
        unconfirmed=_unconfirmed(steps, write_tools, targets),
        early_finish=any(
            s.action.get("kind") == "finish" and s.blocked is None and s.proposal.get("pending") for s in steps
        ),
        bounced=any(s.first_draft is not None or s.blocked is not None for s in steps),
        unfinished=not any(s.action.get("kind") == "finish" and s.blocked is None for s in steps),
    )


def _unconfirmed(steps: list[TraceStep], write_tools: frozenset[str], targets: Targets | None) -> bool:
    """Whether a write went through that no confirmation before it covered."""
    acts: list[Act] = []
    unconfirmed = False
    for s in steps:
        a, obs = s.action, s.observation
        if (
            a.get("tool") in write_tools
            and s.blocked is None
            and obs.get("ok")
            and not covered(acts, a["tool"], a.get("args", {}), targets)
        ):
            unconfirmed = True
        if (act := step_act(a, obs, s.blocked, write_tools)) is not None:
            acts.append(act)
    return unconfirmed


def signals_frame(
    traces: pd.DataFrame, scores: pd.DataFrame, write_tools: frozenset[str], targets: Targets | None = None
) -> pd.DataFrame:
    """One row per failed episode of `scores`: episode_id and the pattern of its signals."""
    grouped = (
        {eid: frame_steps(df.sort_values("step")) for eid, df in traces.groupby("episode_id", sort=False)}
        if len(traces)
        else {}
    )
    rows = []
    for r in scores[~scores["success"].astype(bool)].itertuples(index=False):
        eid = f"{r.item_id}#{r.seed}"
        err = "" if pd.isna(getattr(r, "error", None)) else str(r.error)
        rows.append({"episode_id": eid, "pattern": signals(grouped.get(eid, []), write_tools, targets, err).pattern()})
    return pd.DataFrame(rows, columns=["episode_id", "pattern"])


def from_pattern(pattern: str) -> Signals:
    return Signals(**{k: c == "1" for k, c in zip(Signals.model_fields, pattern)})
