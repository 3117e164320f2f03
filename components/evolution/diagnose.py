"""Diagnosis: from traces and the package alone, find each failed episode's first reachable divergence and its owner.

For every failed episode, the earliest of:
  - a write no granted `confirm` covered (`components.runtime.confirm`), where the benchmark's
    grading asks for one (`confirmation`; not where the gold never confirms)                     -> C, unconfirmed_write
  - a write refused by a rule (its receipt carries a `rule_id`) and never redone successfully for
    that target (the write's identifying args, from the benchmark's `targets`)                  -> E, rho or unknown
        whether the package's card about the rule helps is judged from the corpus (`card_evidence`: turns with the
        card in memory clear the rule more often than turns without), never by reading the card like the model:
        E:   no card mentions the tool, the card does not help, or a helpful card alone in memory was not enough
        rho: a helpful card was not delivered at that step, or was drowned among other cards
        unknown: a card exists but was never in memory at such a write, and neither its text nor the routing tells
        (with the rules train's gold shows, `outcomes.card_states`: a card lacking the constants of what went wrong
        -> E; one carrying them, or, with no rule to check, delivered later in the episode than the write or keyed
        by the package on another tool (`keyed_elsewhere`) -> rho)
  - a write a checker blocked (bounced twice, never executed) and never redone successfully      -> C, bounced_write
        (the checker's bounce is the trace of the discipline fault it guards; with it installed, the unconfirmed
        write never happens, and without this the work dropped after it would read as W); when a granted
        confirmation covered that write, or the bounce names no discipline fault (no confirmation code), the check
        fired on its own criterion                                                            -> none, checker_false_alarm
  - `finish` while the agent's own proposed state still listed work                               -> C, premature_finish
  - work the agent proposed, never wrote, and dropped from its state                              -> W
        wrong_grounding: its ledger entry was settled by a receipt for other arguments
        overflow: the ledger was full and never tracked it
        dropped: it left the agent's state with no receipt (forgotten)
  - a blocking refusal from the world (its receipt is marked `blocking`) or a model fault         -> none, external
  - more work than any successful episode did within a binding turn budget                      -> none, out_of_turns
        (`TurnBudget`: read from the corpus, the fewest turns successful episodes needed per amount of work; an
        episode the user ended was not cut off)

Opportunity O is present when the divergence is an agent action at a kernel event; patchability P is memory for
E/W/rho/C findings and external for world refusals. Findings are clustered by (owner, kind, tool, rule id), so two
rules on the same write are two clusters; each cluster is an evidence packet whose claims cite the divergent steps by
(episode id, step, content hash). Nothing here knows a world: rules by `rule_id`, externals by `blocking`, targets
from the benchmark's meta, confirmation from `components.runtime.confirm`.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import date
from typing import Any, cast

import pandas as pd

from components.codes import CheckCode, FindingKind, Owner
from components.evidence.packets import Citation, Claim, EvidencePacket
from components.evolution.findings import (
    Finding,
    WriteKey,
    card_helps,
    card_owner,
    cards_about,
    keyed_elsewhere,
    own_bounce_rate,
    write_target,
)
from components.evolution.outcomes import (
    TrainEvidence,
    card_states,
    inferred_rules,
    outcome_diffs,
    outcome_finding,
    predicted_wrong,
    statement_constants,
    train_evidence,
    unseen_value_finding,
    value_evidence,
    write_needs,
)
from components.evolution.own_checks import MadeRight, against_checks, gold_write, right_forms
from components.memory.events import PRE_WRITE
from components.memory.package import MemoryPackage
from components.memory.strategies import bounce_codes
from components.runtime.confirm import Act, Targets, covered, step_act
from components.runtime.trace import TraceStep, frame_steps
from components.worlds.base import Gold
from components.worlds.outcome_rules import FieldRule

MAX_CITATIONS = 6


def _target(args: Mapping[str, Any] | None) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, str(v)) for k, v in (args or {}).items()))


def _matches(entry_args: Mapping[str, Any] | None, call_args: Mapping[str, Any]) -> bool:
    return all(str(call_args.get(k)) == str(v) for k, v in (entry_args or {}).items())


def rule_refusal(step: TraceStep) -> str | None:
    """The rule id a step's executed call was refused on, if it was a rule refusal."""
    obs = step.observation
    return obs.get("rule_id") if step.blocked is None and not obs.get("ok") and obs.get("rule_id") else None


def _rule_text(observation: Mapping[str, Any]) -> str:
    """The rule's text as the receipt states it (its human message when a world gave no text); "" for a coded
    refusal (a rule id with no statement): its message says only that a rule was broken, never how to keep it."""
    if observation.get("rule_id") and not observation.get("rule") and "rule" in observation:
        return ""
    if observation.get("rule"):
        return str(observation["rule"]).strip()
    content = observation.get("content")
    return str(content.get("error", "")).strip() if isinstance(content, dict) else ""


def diagnose_episode(
    steps: list[TraceStep],
    item_id: str,
    package: MemoryPackage,
    write_tools: frozenset[str],
    error: str = "",
    episode_id: str | None = None,
    helps: dict[tuple[str, str], bool | None] | None = None,
    budget: TurnBudget | None = None,
    targets: Targets | None = None,
    rules: Mapping[str, Mapping[str, FieldRule]] | None = None,
    today: date | None = None,
    confirmation: bool = True,
) -> Finding:
    """`rules`: per write tool, the rules train's gold shows (`outcomes.inferred_rules`), to judge a card's text
    against a refused write it was not at (`outcomes.card_states`); `today`: the policy's date, for their features.
    `confirmation`: whether the benchmark's grading asks writes to be confirmed (`Benchmark.confirmation`); where it
    does not (the gold never confirms), no failure is put down to a missing confirmation."""
    eid = episode_id or (steps[0].episode_id if steps else f"{item_id}#?")
    outside = _external(steps, item_id, eid, error, budget, write_tools, targets)
    if outside is not None:
        return outside
    findings = _step_findings(
        steps, item_id, eid, package, write_tools, helps or {}, targets, rules or {}, today, confirmation
    )
    findings += _dropped_work(steps, item_id, eid, write_tools, findings)
    if not findings:
        last = steps[-1]
        return Finding(
            eid,
            item_id,
            last.step,
            last.hash,
            Owner.NONE,
            FindingKind.NO_DIVERGENCE,
            opportunity="unknown",
            patchability="unknown",
        )
    return min(findings, key=lambda f: (f.step, f.owner))


def _external(
    steps: list[TraceStep],
    item_id: str,
    eid: str,
    error: str,
    budget: TurnBudget | None,
    write_tools: frozenset[str],
    targets: Targets | None,
) -> Finding | None:
    """A failure no memory change could fix, if the episode had one: a model fault, a world refusal marked
    `blocking`, or more work than the corpus ever did within a binding turn budget."""
    if error or not steps:  # a model fault: nothing memory could change; cite the last step there is, if any
        last = steps[-1] if steps else None
        return Finding(
            eid,
            item_id,
            last.step if last else -1,
            last.hash if last else "",
            Owner.NONE,
            FindingKind.MODEL_FAULT,
            detail=error,
            opportunity="unknown",
            patchability="external",
        )
    for s in steps:
        obs = s.observation
        if s.blocked is None and obs.get("blocking"):
            return Finding(
                eid,
                item_id,
                s.step,
                s.hash,
                Owner.NONE,
                FindingKind.BLOCKING_ERROR,
                s.action.get("tool", "*"),
                detail=obs.get("code") or "",
                opportunity="absent",
                patchability="external",
            )
    if budget is not None and budget.out_of_turns(steps, write_tools, targets):
        last = steps[-1]
        return Finding(
            eid,
            item_id,
            last.step,
            last.hash,
            Owner.NONE,
            FindingKind.OUT_OF_TURNS,
            detail=f"{_work(steps, write_tools, targets)} write(s) of work within a {budget.cap}-turn budget",
            opportunity="absent",
            patchability="external",
        )
    return None


def _step_findings(
    steps: list[TraceStep],
    item_id: str,
    eid: str,
    package: MemoryPackage,
    write_tools: frozenset[str],
    helps: Mapping[tuple[str, str], bool | None],
    targets: Targets | None,
    rules: Mapping[str, Mapping[str, FieldRule]],
    today: date | None,
    confirmation: bool = True,
) -> list[Finding]:
    """The divergences at single steps, in step order: each write's (`_write_finding`), and a `finish` while the
    agent's own proposed state still listed work."""
    findings: list[Finding] = []
    acts: list[Act] = []  # the calls made so far, for the confirmations that cover a write
    for s in steps:
        a = s.action
        if a.get("tool") in write_tools:
            f = _write_finding(s, steps, acts, item_id, eid, package, helps, targets, rules, today, confirmation)
            if f is not None:
                findings.append(f)
        if (act := step_act(a, s.observation, s.blocked, write_tools)) is not None:
            acts.append(act)
        if a.get("kind") == "finish" and s.blocked is None and s.proposal.get("pending"):
            findings.append(
                Finding(
                    eid,
                    item_id,
                    s.step,
                    s.hash,
                    Owner.C,
                    FindingKind.PREMATURE_FINISH,
                    "*",
                    f"{len(s.proposal['pending'])} item(s) still proposed",
                )
            )
    return findings


def _write_finding(
    s: TraceStep,
    steps: list[TraceStep],
    acts: list[Act],
    item_id: str,
    eid: str,
    package: MemoryPackage,
    helps: Mapping[tuple[str, str], bool | None],
    targets: Targets | None,
    rules: Mapping[str, Mapping[str, FieldRule]],
    today: date | None,
    confirmation: bool = True,
) -> Finding | None:
    """A write's divergence, if any: it ran with no granted confirmation covering it (C, where the benchmark's
    grading asks for one); or it was refused on a rule (`_knowledge`) or bounced by a checker, and never redone for
    its target."""
    tool, args = s.action["tool"], s.action.get("args", {})
    if s.blocked is None and s.observation.get("ok"):
        if not confirmation or covered(acts, tool, args, targets):
            return None
        return Finding(eid, item_id, s.step, s.hash, Owner.C, FindingKind.UNCONFIRMED_WRITE, "*", tool)
    rule = rule_refusal(s)
    if (s.blocked is None and rule is None) or _redone(s, steps, targets):
        return None
    if rule is not None:
        return _knowledge(
            eid, item_id, s, tool, rule, package, helps.get((tool, rule)), targets, steps, rules.get(tool, {}), today
        )
    # a checker bounced the draft twice and it never ran: the agent could not meet the check (with a confirmation
    # checker, it never asked); the work it later drops is this failure's consequence. The bounce is the agent's
    # discipline fault only when it says so (a confirmation it lacked, as the trace shows): a write a granted
    # confirmation covered, or a bounce for any other reason, is the checker firing on its own criterion (a false
    # alarm), which no fault of the agent's explains
    extra = {"target": write_target(tool, args, targets), "blocked": s.blocked}
    if not confirmation or covered(acts, tool, args, targets) or CheckCode.UNCONFIRMED not in bounce_codes(s.blocked):
        return Finding(
            eid, item_id, s.step, s.hash, Owner.NONE, FindingKind.CHECKER_FALSE_ALARM, "*", tool, extra=extra
        )
    return Finding(eid, item_id, s.step, s.hash, Owner.C, FindingKind.BOUNCED_WRITE, "*", tool, extra=extra)


def _redone(s: TraceStep, steps: list[TraceStep], targets: Targets | None) -> bool:
    """Was the write at `s` made successfully later in the episode, for the same target?"""
    tool = s.action["tool"]
    mine = write_target(tool, s.action.get("args", {}), targets)
    return any(
        t.step > s.step
        and t.action.get("tool") == tool
        and t.blocked is None
        and t.observation.get("ok")
        and write_target(tool, t.action.get("args", {}), targets) == mine
        for t in steps
    )


def _dropped_work(
    steps: list[TraceStep], item_id: str, eid: str, write_tools: frozenset[str], findings: list[Finding]
) -> list[Finding]:
    """Work the agent proposed, never wrote, and dropped from its own state before it finished (W). A write refused
    on a rule is owned by that rule's finding (among `findings`), whatever its kind (policy_refusal, ineffective_card...)."""
    done_ok = {
        (s.action["tool"], _target(s.action.get("args", {})))
        for s in steps
        if s.action.get("tool") in write_tools and s.blocked is None and s.observation.get("ok")
    }
    last_listed: dict[tuple[str, tuple[tuple[str, str], ...]], int] = {}
    proposed_max = 0
    for s in steps:
        pend = s.proposal.get("pending", [])
        proposed_max = max(proposed_max, len(pend))
        for p in pend:
            last_listed[(p["tool"], _target(p.get("args", {})))] = s.step
    finish = next((s.step for s in steps if s.action.get("kind") == "finish" and s.blocked is None), steps[-1].step)
    refused = {(f.tool, f.extra.get("target")) for f in findings if f.rule_id}
    by_step = {s.step: s for s in steps}
    dropped = []
    for (tool, target), last in last_listed.items():
        if last >= finish or any(t == tool and _matches(dict(target), dict(k)) for t, k in done_ok):
            continue
        if (tool, target) in refused:
            continue
        at = min(last + 1, steps[-1].step)
        kind, detail, extra = _w_kind(steps, tool, dict(target), last)
        extra["proposed_max"] = proposed_max
        dropped.append(Finding(eid, item_id, at, by_step[at].hash, Owner.W, kind, "*", detail, extra=extra))
    return dropped


def _work(steps: list[TraceStep], write_tools: frozenset[str], targets: Targets | None = None) -> int:
    """How many writes the episode's work takes: every write target the agent ever proposed, plus every successful
    write that no proposal names (a proposal names a write when its args are among the write's)."""
    proposed = {
        (p["tool"], _target(p.get("args", {})))
        for s in steps
        for p in s.proposal.get("pending", [])
        if p.get("tool") in write_tools
    }
    written = [
        (s.action["tool"], s.action.get("args", {}))
        for s in steps
        if s.action.get("tool") in write_tools and s.blocked is None and s.observation.get("ok")
    ]
    extra = {
        (t, write_target(t, args, targets))
        for t, args in written
        if not any(pt == t and _matches(dict(pk), args) for pt, pk in proposed)
    }
    return len(proposed | extra)


@dataclass
class TurnBudget:
    """What the corpus shows about the turn budget: the length at which episodes are cut off (binding when at least
    `BINDING` of them end there without finishing), and for each amount of work the fewest turns any successful
    episode with at least that much took. Under a binding budget, an episode with more work than any success ever
    did within it failed for want of turns, whatever else went wrong on the way: no memory change fixes that. More
    work than any success did is priced from the successes that did the most (`base`: the fewest turns they took up
    to their last write; what follows it, a finish, is not work), plus, per write beyond it, the fewest turns the
    corpus ever took from one successful write to the next one done with a granted confirmation covering it
    (`per_write`: a write as a careful agent makes it); with no such pair in the corpus, it is beyond the budget."""

    cap: int
    binding: bool
    need: dict[int, int]  # writes of work -> fewest turns a successful episode with at least that much took
    per_write: int | None = None  # fewest turns from one successful write to the next, confirmed, one
    base: int | None = None  # fewest turns up to the last write among the successes with the most work

    @classmethod
    def of(
        cls,
        episodes: list[list[TraceStep]],
        success: dict[str, bool],
        write_tools: frozenset[str],
        targets: Targets | None = None,
    ) -> TurnBudget:
        cap = max((len(st) for st in episodes), default=0)
        cut = sum(
            1 for st in episodes if len(st) == cap and st[-1].action.get("kind") != "finish" and not user_ended(st[-1])
        )
        best: dict[int, int] = {}
        upto: dict[int, int] = {}  # work -> fewest turns up to the last successful write, among successes
        for st in episodes:
            if st and success.get(st[0].episode_id):
                k = _work(st, write_tools, targets)
                best[k] = min(best.get(k, len(st)), len(st))
                if (last := max((s.step for s in st if _written(s, write_tools)), default=None)) is not None:
                    upto[k] = min(upto.get(k, last + 1), last + 1)
        need = {k: min(v for j, v in best.items() if j >= k) for k in range(1, max(best, default=0) + 1)}
        gaps = [g for st in episodes for g in _confirmed_gaps(st, write_tools, targets)]
        return cls(
            cap,
            bool(episodes) and cut >= BINDING * len(episodes),
            need,
            min(gaps, default=None),
            upto.get(max(best, default=0)),
        )

    def turns_for(self, work: int) -> int | None:
        """The fewest turns `work` writes take, as the corpus shows it (None: it shows nothing to price it by)."""
        if work in self.need:
            return self.need[work]
        top = max(self.need, default=0)
        if not top or work < top or self.per_write is None or self.base is None:
            return None
        return self.base + (work - top) * self.per_write

    def out_of_turns(self, steps: list[TraceStep], write_tools: frozenset[str], targets: Targets | None = None) -> bool:
        if not self.binding or not steps:
            return False
        need = self.turns_for(_work(steps, write_tools, targets))
        return need is None or need > self.cap


def _written(s: TraceStep, write_tools: frozenset[str]) -> bool:
    return s.action.get("tool") in write_tools and s.blocked is None and bool(s.observation.get("ok"))


def _confirmed_gaps(steps: list[TraceStep], write_tools: frozenset[str], targets: Targets | None) -> list[int]:
    """Turns from each successful write to the next successful one, where a granted confirmation covered the later."""
    acts, last, out = [], None, []
    for s in steps:
        a = s.action
        if _written(s, write_tools):
            if last is not None and covered(acts, a["tool"], a.get("args", {}), targets):
                out.append(s.step - last)
            last = s.step
        if (act := step_act(a, s.observation, s.blocked, write_tools)) is not None:
            acts.append(act)
    return out


BINDING = 0.05


def user_ended(step: TraceStep) -> bool:
    """The user ended the call at this step (their reply was the end of it): an episode that ended so was not cut off."""
    obs = step.observation
    return obs.get("role") == "user" and "text" in obs and obs["text"] is None


def card_evidence(
    steps_by_episode: list[list[TraceStep]],
    package: MemoryPackage,
    write_tools: frozenset[str],
    targets: Targets | None = None,
) -> dict[tuple[str, str], bool | None]:
    """Per (write tool, rule): does a card about it help, judged from the whole corpus rather than from any one episode?

    Over every first attempt at a write (per episode and target) that the world judged on policy (accepted, or
    refused on a rule), and for each rule the corpus saw refused on that write, compare the share that cleared the
    rule (accepted) among the attempts judged on it (accepted, or refused on it: one refused on another rule was
    stopped there, and says nothing about this one) when a card about it was in that turn's memory with the share
    without one. Judged per rule because a write may carry several: a card can state one rule well while the write still fails
    on another. A card that helps is one whose turns clear the rule clearly more often (by `CARD_LIFT`) than a
    reference measured in the same corpus: turns at that write without the card (at least `MIN_CONTRAST` of them);
    else, for a card never absent at its write, the corpus's turns with no card about the rule they were judged on,
    pooled over every refused rule; else zero (no turn anywhere lacked a card). No constant stands in for the model's
    follow rate, which depends on how crowded memory is. One that does not help is wrong, or written in a way the
    model does not take in. None: no attempt with the card delivered, so no evidence either way."""
    attempts: list[tuple[str, set[str], str | None]] = []  # (tool, delivered cards, rule refused on or None)
    rules: dict[str, set[str]] = {}
    for steps in steps_by_episode:
        seen: set[WriteKey] = set()
        for s in steps:
            a, obs = s.action, s.observation
            tool = a.get("tool")
            refused = rule_refusal(s)
            if tool not in write_tools or s.blocked is not None or not (obs.get("ok") or refused):
                continue
            if refused:
                rules.setdefault(tool, set()).add(refused)
            key = (tool, write_target(tool, a.get("args", {}), targets))
            if key in seen:
                continue
            seen.add(key)
            attempts.append((tool, set(s.delivered), None if obs.get("ok") else refused))
    tallies: dict[tuple[str, str], dict[bool, list[int]]] = {}
    for tool, ids in rules.items():
        for rule in sorted(ids):
            about = set(cards_about(package, tool, rule))
            tally: dict[bool, list[int]] = {True: [], False: []}
            for t, delivered, refused in attempts:
                # judged on this rule: accepted (it cleared every rule) or refused on it; a write refused on another
                # rule says nothing about this one (a world stops at the first rule broken, in an order unknown here)
                if t == tool and refused in (None, rule):
                    tally[bool(delivered & about)].append(int(refused is None))
            tallies[(tool, rule)] = tally
    # the corpus's own rate of clearing a rule with no card about it in memory, over every rule it saw refused: the
    # reference for a card never seen absent at its own write (a package that delivers it every turn)
    pooled = [x for tally in tallies.values() for x in tally[False]]
    return {key: card_helps(tally, pooled) for key, tally in tallies.items()}


def _knowledge(
    eid: str,
    item_id: str,
    s: TraceStep,
    tool: str,
    rule_id: str,
    package: MemoryPackage,
    helps: bool | None = None,
    targets: Targets | None = None,
    steps: list[TraceStep] | None = None,
    rules: Mapping[str, FieldRule] | None = None,
    today: date | None = None,
) -> Finding:
    """A refused write: whose fix would have avoided it, from the package's cards and the corpus's evidence on them.

    no card about the tool and rule           -> E   policy_refusal  (the knowledge is missing)
    a card that does not help where delivered -> E   ineffective_card (wrong, or not taken in: rewrite it)
    a helpful card, delivered among others    -> rho diluted_card    (routing: deliver it alone)
    a helpful card, delivered alone           -> E   policy_refusal  (even the right card in front was not enough)
    a helpful card, not delivered here        -> rho card_not_fired  (routing: deliver it at this write)
    a card never seen at a write              -> unknown             (no evidence whether routing it would help)"""
    cards = cards_about(package, tool, rule_id)
    here = [c for c in s.delivered if c in cards]
    target = write_target(tool, s.action.get("args", {}), targets)
    extra = {"target": target, "cards": cards, "delivered": list(s.delivered), "rule_id": rule_id}
    quote = _rule_text(s.observation)
    states = None
    if cards and not here and helps is None:
        # no turn in the corpus had such a card at such a write (the corpus's evidence on a rule is per rule, and
        # stands where it exists): does its text state the refused rule (the receipt's constants), and every field
        # train's rules say this write got wrong (the world stops at the first rule broken: not the only one)?
        needs = ([statement_constants(quote)] if quote else []) + write_needs(
            s, steps or [s], rules or {}, frozenset({tool}), targets, today
        )
        states = card_states(
            [package.cards[c].body for c in cards],
            needs,
            steps or [],
            s.step,
            cards,
            keyed_elsewhere(package, cards, tool),
        )
    owner, kind, opportunity, patchability = card_owner(
        cards, here, len(s.delivered), helps, FindingKind.POLICY_REFUSAL, states
    )
    return Finding(eid, item_id, s.step, s.hash, owner, kind, tool, quote, opportunity, patchability, extra, rule_id)


def _w_kind(steps: list[TraceStep], tool: str, target: dict[str, str], last: int) -> tuple[str, str, dict[str, Any]]:
    tracked = False
    for s in steps:
        if s.step > last + 1:
            break
        for e in s.state_after + s.state_before:
            if e["tool"] == tool and _matches(e["args"], target) and _matches(target, e["args"]):
                tracked = True
                if e["status"] == "done":
                    return (
                        FindingKind.WRONG_GROUNDING,
                        f"entry {e['id']} settled by receipt {e['evidence']}",
                        {"bind_args": sorted(e["args"])},
                    )
    if not tracked:
        return FindingKind.OVERFLOW, "proposed but never tracked by the ledger (full)", {}
    return FindingKind.DROPPED, "left the agent's state without a receipt", {}


# -- clustering into evidence packets -------------------------------------------------------------------------------


@dataclass
class Diagnosis:
    findings: list[Finding]
    packets: list[EvidencePacket]

    def findings_frame(self) -> pd.DataFrame:
        cols = ["episode_id", "item_id", "step", "owner", "kind", "tool", "opportunity", "patchability"]
        return pd.DataFrame([{k: asdict(f)[k] for k in cols} for f in self.findings], columns=cols)


def diagnose(
    traces: pd.DataFrame,
    scores: pd.DataFrame,
    package: MemoryPackage,
    write_tools: frozenset[str],
    corpus: str,
    targets: Targets | None = None,
    gold: Mapping[str, Gold] | None = None,
    train: TrainEvidence | None = None,
    today: date | None = None,
    confirmation: bool = True,
) -> Diagnosis:
    """`targets`: the benchmark's write tool -> identifying args (`Benchmark.targets`); a tool it does not
    list is identified by the session alone. `gold`: the train items' gold (`components.worlds.base.train_gold`);
    a failed episode of an item that has one is also compared with it (`with_outcomes`). `train`: what a labelled
    train corpus showed (`train_evidence`), for failures with no gold the trace cannot explain
    (`components.evolution.outcomes.unseen_value_finding`). `today`: the policy's date (`infer.policy_today`), for
    the rules the gold shows (`outcomes.card_states`). `confirmation`: the benchmark's (`Benchmark.confirmation`):
    false where its gold never confirms, and no failure is then put down to a missing confirmation."""
    failed = scores[~scores["success"].astype(bool)]
    findings: list[Finding] = []
    episodes = (
        {eid: frame_steps(df.sort_values("step")) for eid, df in traces.groupby("episode_id", sort=False)}
        if len(traces)
        else {}
    )
    helps = card_evidence(list(episodes.values()), package, write_tools, targets)
    budget = TurnBudget.of(
        list(episodes.values()),
        {f"{r.item_id}#{r.seed}": bool(r.success) for r in scores.itertuples(index=False)},
        write_tools,
        targets,
    )
    value_helps, rules = _value_evidence(episodes, package, write_tools, targets, gold, train, today)
    # a check that fired on its own criterion, in this corpus or train's: each finding is judged against it
    own_bounces = any(b.spec.at == PRE_WRITE for b in getattr(package, "checkers", ())) and (
        (train is not None and train.own_bounce_rate is not None)
        or own_bounce_rate(episodes.values(), write_tools) is not None
    )
    solved = _solved(episodes, scores, write_tools, targets) if own_bounces else {}
    for row in failed.itertuples(index=False):
        eid = f"{row.item_id}#{row.seed}"
        steps = episodes.get(eid, [])
        error = "" if pd.isna(row.error) else str(row.error)
        f = diagnose_episode(
            steps, row.item_id, package, write_tools, error, eid, helps, budget, targets, rules, today, confirmation
        )
        if gold and row.item_id in gold:
            f = with_outcomes(f, steps, gold[row.item_id], package, write_tools, targets, value_helps, rules, today)
        elif train is not None and f.kind == FindingKind.NO_DIVERGENCE:
            f = unseen_value_finding(eid, row.item_id, steps, package, write_tools, train, targets) or f
        if own_bounces:
            f = _against_checks(
                f,
                steps,
                package,
                write_tools,
                targets,
                (gold or {}).get(row.item_id),
                train,
                value_helps,
                rules,
                today,
                solved.get(str(row.item_id), {}),
            )
        findings.append(f)
    return Diagnosis(findings, _packets(findings, corpus))


def _value_evidence(
    episodes: Mapping[str, list[TraceStep]],
    package: MemoryPackage,
    write_tools: frozenset[str],
    targets: Targets | None,
    gold: Mapping[str, Gold] | None,
    train: TrainEvidence | None,
    today: date | None,
) -> tuple[dict[str, bool | None], dict[str, dict[str, FieldRule]]]:
    """Whether each write's cards help its arguments (`value_evidence`, with gold) and the rules the gold shows: this
    corpus's own (read only to judge a card's text against a write it was not at, `card_states`), else train's."""
    if gold:
        helps = value_evidence(episodes, gold, package, write_tools, targets)
        return helps, inferred_rules(
            [t for t in write_tools if helps.get(t) is not False and cards_about(package, t)],
            episodes,
            gold,
            write_tools,
            targets,
            today,
        )
    return {}, dict(train.rules) if train is not None else {}


def _solved(
    episodes: Mapping[str, list[TraceStep]], scores: pd.DataFrame, write_tools: frozenset[str], targets: Targets | None
) -> dict[str, dict[WriteKey, dict[str, Any]]]:
    """Per item, the writes its successful episodes made, by target: right, as their success says (the right forms of
    its other episodes' writes, `own_checks.save_chance`)."""
    solved: dict[str, dict[WriteKey, dict[str, Any]]] = defaultdict(dict)
    for row in scores[scores["success"].astype(bool)].itertuples(index=False):
        for s in episodes.get(f"{row.item_id}#{row.seed}", []):
            if _written(s, write_tools):
                tool, args = s.action["tool"], dict(s.action.get("args") or {})
                solved[str(row.item_id)][(tool, write_target(tool, args, targets))] = args
    return solved


def _packets(findings: list[Finding], corpus: str) -> list[EvidencePacket]:
    """The findings clustered by (owner, kind, tool, rule id), largest first: one evidence packet each, citing up to
    `MAX_CITATIONS` of its steps."""
    clusters: dict[tuple[str, str, str, str], list[Finding]] = defaultdict(list)
    for f in findings:
        clusters[f.signature].append(f)
    packets = []
    for (owner, kind, tool, rule), fs in sorted(clusters.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        key = f"{corpus}|{owner}|{kind}|{tool}" + (f"|{rule}" if rule else "")
        cid = hashlib.sha256(key.encode()).hexdigest()[:10]
        sample = [f for f in fs if f.hash][:MAX_CITATIONS]  # an episode that failed before its first turn has no step
        f0 = fs[0]
        claims = (
            [
                Claim(
                    statement=_statement(f0, len(fs)),
                    evidence=[Citation(episode_id=f.episode_id, step=f.step, hash=f.hash) for f in sample],
                )
            ]
            if sample
            else []
        )
        packets.append(
            EvidencePacket(
                id=f"{owner}-{kind}-{cid}",
                corpus=corpus,
                owner=owner,
                opportunity=f0.opportunity,
                patchability=f0.patchability,
                kind=kind,
                tool=tool,
                rule_id=rule or None,
                detail=f0.detail,
                episodes=[f.episode_id for f in fs],
                items=sorted({f.item_id for f in fs}),
                claims=claims,
                unresolved=[] if f0.opportunity == "present" else ["no reachable intervention point found"],
            )
        )
    return packets


def evidence_from_train(
    traces: Any,
    scores: Any,
    package: MemoryPackage,
    write_tools: frozenset[str],
    gold: Mapping[str, Gold],
    targets: Targets | None = None,
    today: date | None = None,
    confirmation: bool = True,
) -> TrainEvidence:
    """`train_evidence` of an evaluated train corpus (its traces and scores frames) against its items' gold; which
    failures the trace cannot explain is the trace-only diagnosis's call (as an unlabelled corpus gets it)."""
    d = diagnose(traces, scores, package, write_tools, "train-evidence", targets=targets, confirmation=confirmation)
    episodes = (
        {eid: frame_steps(df.sort_values("step")) for eid, df in traces.groupby("episode_id", sort=False)}
        if len(traces)
        else {}
    )
    failed = {f.episode_id: str(f.item_id) for f in d.findings}
    unexplained = frozenset(f.episode_id for f in d.findings if f.kind == FindingKind.NO_DIVERGENCE)
    return train_evidence(episodes, failed, gold, package, write_tools, targets, unexplained, today)


# -- evidence from outcomes (train items with gold; components/evolution/outcomes.py) ----------------------------------


def with_outcomes(
    f: Finding,
    steps: list[TraceStep],
    gold: Gold,
    package: MemoryPackage,
    write_tools: frozenset[str],
    targets: Targets | None,
    value_helps: Mapping[str, bool | None],
    rules: Mapping[str, Mapping[str, FieldRule]] | None = None,
    today: date | None = None,
) -> Finding:
    """The trace's finding, or the outcome's when the trace saw nothing or saw it later: a write whose argument
    differs from the gold (a silent world's broken rule leaves no other trace). An external finding stands, but for
    a world's refusal as impossible (`blocking`) where the gold shows a wrong argument: the gold made the write, so
    the request was possible, and the argument is what failed it (a refusal of the agent's own wrong argument, or a
    refusal the agent went past to a wrong write)."""
    if f.owner == Owner.NONE and f.kind not in (FindingKind.NO_DIVERGENCE, FindingKind.BLOCKING_ERROR):
        return f
    o = outcome_finding(
        f.episode_id,
        f.item_id,
        outcome_diffs(steps, gold, write_tools, targets),
        steps,
        package,
        value_helps,
        rules,
        write_tools,
        targets,
        today,
    )
    if o is None:
        return f
    if f.kind == FindingKind.BLOCKING_ERROR:  # the gold made the write: the request was not impossible
        return o if o.owner != Owner.UNKNOWN else f
    if f.kind == FindingKind.NO_DIVERGENCE:
        return o
    if o.owner == Owner.UNKNOWN or (f.step, f.owner) <= (o.step, o.owner):
        return f
    return o


def _against_checks(
    f: Finding,
    steps: list[TraceStep],
    package: MemoryPackage,
    write_tools: frozenset[str],
    targets: Targets | None,
    gold: Gold | None,
    train: TrainEvidence | None,
    value_helps: Mapping[str, bool | None],
    rules: Mapping[str, Mapping[str, FieldRule]],
    today: date | None,
    solved: Mapping[WriteKey, dict[str, Any]],
) -> Finding:
    """`own_checks.against_checks`, each write made right by its gold where the item has one, else by the rules
    train's gold shows (none known: nothing is judged)."""
    if not steps:
        return f
    if gold is not None:

        def right(s: TraceStep) -> list[dict[str, Any]] | None:
            return [w] if (w := gold_write(s, gold, targets)) is not None else None

        made = MadeRight(right, needed=[(a.tool, dict(a.args)) for a in gold.actions])
        return against_checks(f, steps, package, write_tools, made, value_helps, rules, targets, today)
    if train is None or train.own_bounce_rate is None:
        return f
    ev = train

    def forms(s: TraceStep) -> list[dict[str, Any]] | None:
        tool = s.action["tool"]
        return (
            None
            if tool in ev.unruled
            else right_forms(s, steps, ev.rules.get(tool, {}), write_tools, targets, ev.today)
        )

    def wrong(s: TraceStep) -> float:  # for sure where a rule of train's says so, else as often as on train
        tool = s.action["tool"]
        return (
            1.0
            if predicted_wrong(s, steps, ev.rules.get(tool, {}), write_tools, targets, ev.today)
            else ev.wrong_rate.get(tool, 0.0)
        )

    made = MadeRight(forms, wrong, 1 - cast(float, ev.own_bounce_rate), solved=solved)  # not None: checked above
    return against_checks(f, steps, package, write_tools, made, ev.value_helps, ev.rules, targets, ev.today)


def _statement(f: Finding, n: int) -> str:
    words: dict[str, str] = {
        FindingKind.UNCONFIRMED_WRITE: "a write ran without a granted confirmation covering it",
        FindingKind.POLICY_REFUSAL: f"`{f.tool}` was refused on rule {f.rule_id} and never redone right",
        FindingKind.CARD_NOT_FIRED: f"`{f.tool}` was refused on rule {f.rule_id} while a card about it existed but was not delivered",
        FindingKind.DILUTED_CARD: f"`{f.tool}` was refused on rule {f.rule_id} although its card was delivered among many others",
        FindingKind.INEFFECTIVE_CARD: f"`{f.tool}` was refused on rule {f.rule_id}; the package's card about it does not help where delivered",
        FindingKind.CARD_UNOBSERVED: f"`{f.tool}` was refused on rule {f.rule_id}; a card about it exists but was never seen at such a write",
        FindingKind.BOUNCED_WRITE: "a checker blocked a write and it was never done (the agent could not meet the check)",
        FindingKind.CHECKER_FALSE_ALARM: "a checker blocked a confirmed write and it was never done (the check fired on "
        "work the agent did right)",
        FindingKind.PREMATURE_FINISH: "the agent declared done while its own state still listed work",
        FindingKind.WRONG_GROUNDING: "a ledger entry was settled by a receipt for other arguments",
        FindingKind.OVERFLOW: "proposed work was never tracked because the ledger was full",
        FindingKind.DROPPED: "proposed work left the agent's state without a receipt",
        FindingKind.BLOCKING_ERROR: "the world refused the request as impossible (a blocking receipt)",
        FindingKind.OUT_OF_TURNS: "more work than any successful episode did within the turn budget",
        FindingKind.MODEL_FAULT: "the model failed",
        FindingKind.WRONG_VALUE: f"`{f.tool}` was written with an argument its gold does not have",
        FindingKind.UNSEEN_VALUE: f"no divergence in the trace; `{f.tool}` is the write train most often got wrong",
        FindingKind.MISSING_WRITE: f"a gold write on `{f.tool}` was never made",
        FindingKind.EXTRA_WRITE: f"`{f.tool}` was written where no gold write asks for it",
        FindingKind.NO_DIVERGENCE: "no divergence found",
    }
    what = words[
        f.kind
    ]  # every kind a finding can have is here: a new kind without its words fails, never reads as its name
    return f"{n} failed episode(s): {what}" + (f" — {f.detail}" if f.detail else "")
