"""The meta-agent: turns the diagnosis into one scoped plan. Two backends behind one interface, registered by name.

`rules` (embedded, deterministic): takes the largest patchable cluster (W first) whose plan was not already rejected
(one acting where a rejected plan acted comes after the untried ones) and writes the smallest connected change for
its owner:
    E    one card per write (`<write>-rules`) stating every rule the diagnosis saw refused on it, written from the rule
         texts the refusal receipts carry, plus the tools successful episodes called before that write (never ids or
         values), triggered where the write is intended; a rule seen later rewrites that card; wiring if missing
    rho  rebind the existing card's trigger to the write it concerns (or route instead of delivering everything)
    W    change the ledger option the evidence points at (bind_on, max_entries, board)
    C    add the checker that would have bounced the escaped action
Each is a `MetaAgent`: `plan(ctx)` returns a `PlanOutcome` (the plan or none, why a plan failed, the model's raw
replies, the usage it cost); `spends` says whether planning asks a model, and so holds budget.

`llm`: shows a model a budgeted projection (the plan schema, the rules' draft, the largest clusters first, the package),
validates the JSON it returns with the same schema, feeds a validation error back once, and turns any failure into a
rejected plan with the raw replies kept. Either way the plan is only a proposal: validation and the gate decide.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, cast

import pandas as pd

from components.codes import FindingKind, Owner
from components.defaults import MAX_SOURCE_ITEMS
from components.evidence.packets import EvidencePacket
from components.evolution.findings import Finding, cards_about, rule_card_id
from components.evolution.plan import (
    AddBinding,
    AddCard,
    Operation,
    Plan,
    RemoveBinding,
    RemoveCard,
    SetTrigger,
    SetWM,
    parse_plan,
)
from components.evolution.validate import leak_tokens
from components.memory.package import MemoryPackage
from components.evolution.meta_agents import META_AGENTS  # the registry (and the plug-ins'); built-ins below
from components.runtime import prompts
from components.runtime.trace import frame_steps
from components.runtime.types import Usage
from components.worlds import Benchmark

if TYPE_CHECKING:  # inference and the models are imported where they are used
    from components.evolution.infer import Inference, Row
    from components.models.base import ChatModel
    from components.worlds.outcome_rules import FieldRule


@dataclass
class PlanContext:
    packets: list[EvidencePacket]
    package: MemoryPackage
    bench: Benchmark
    traces: pd.DataFrame  # the working base's train traces (for contrasting successful episodes)
    scores: pd.DataFrame
    rejected: set[str] = field(default_factory=set)  # keys of plans already rejected in this campaign
    findings: list[Finding] = field(default_factory=list)
    # campaign memory (components/evidence/graph_record.py): revocations of contradicted promotions come first;
    # the projection is what the llm meta-agent reads of earlier campaigns
    revocations: list[Plan] = field(default_factory=list)
    # plan keys rejected on other evidence, and sites (Plan.site) of plans rejected here: tried after the rest
    later: set[str] = field(default_factory=set)
    memory: dict[str, Any] = field(default_factory=dict)
    max_source_items: int = MAX_SOURCE_ITEMS  # a plan's source tasks at most (`campaign.repair_max_items`)


# -- rules -----------------------------------------------------------------------------------------------------------


# Repair upstream first (Recuris' dependency spine: state before routing, experience and checking): a checker added
# while the ledger still loses work would be judged on a state it cannot see. Knowledge and checking do not depend on
# each other (a card changes what is written, a checker whether it was confirmed or finished), so after W the largest
# cluster goes first: a checker for the most common escape is not held back behind every small rule cluster.
LAYER = {Owner.W: 0, Owner.E: 1, Owner.RHO: 1, Owner.C: 1}


@dataclass(frozen=True)
class RulesAgent:
    """Deterministic attribution-to-patch rules: spends nothing. Called, it returns the plan alone (or None); a plan
    names at most `ctx.max_source_items` source tasks (`campaign.repair_max_items`)."""

    max_per_episode: int = 6
    spends = False

    def plan(self, ctx: PlanContext) -> PlanOutcome:
        return PlanOutcome(plan=self(ctx))

    def __call__(self, ctx: PlanContext) -> Plan | None:
        for plan in ctx.revocations:  # a promotion the current data contradicts hurts now: remove it first
            if plan.key() not in ctx.rejected:
                return plan
        deferred = None
        # findings whose change another campaign's gate accepted (campaign memory) are planned for first
        helped = {tuple(x) for x in (ctx.memory or {}).get("helped_elsewhere", [])}
        for packet in sorted(
            ctx.packets,
            key=lambda p: (
                (p.owner, p.kind, p.tool, p.rule_id or "") not in helped,
                LAYER.get(p.owner, 9),
                -_size(p, ctx),
                p.id,
            ),
        ):
            if not packet.patchable:  # external, or `unknown`: the diagnoser could not tell, so nothing is guessed
                continue
            planned = rules_plan(packet, ctx, self.max_per_episode, ctx.max_source_items)
            if planned is not None and planned.key() not in ctx.rejected:
                if planned.key() in ctx.later or planned.site() in ctx.later:
                    deferred = deferred or planned
                    continue
                return planned
        return deferred


@META_AGENTS.register("rules")
def rules(*, max_per_episode: int = 6) -> RulesAgent:
    """Deterministic attribution-to-patch rules."""
    return RulesAgent(max_per_episode)


# C findings -> the checker that would have bounced the action that escaped
CHECKER_FOR: dict[str, tuple[str, str, str]] = {  # (FindingKind, a str: looked up by a packet's kind)
    FindingKind.UNCONFIRMED_WRITE: (
        "confirm_before_write",
        "pre_write",
        "C: bounce writes that lack the customer's confirmation",
    ),
    FindingKind.PREMATURE_FINISH: (
        "completion_requires_receipts",
        "agent_declares_done",
        "C: bounce `finish` while ledger entries are pending",
    ),
}


def rules_plan(
    p: EvidencePacket, ctx: PlanContext, max_per_episode: int = 6, max_source_items: int = MAX_SOURCE_ITEMS
) -> Plan | None:
    pkg = ctx.package
    routed = any(b.spec.use == "event_cards" and b.spec.at == "intent_recorded" for b in pkg.delivery)
    wiring = (
        []
        if routed
        else [
            AddBinding(
                op="add_binding",
                section="delivery",
                use="event_cards",
                at="intent_recorded",
                cfg={"max_per_episode": max_per_episode},
            )
        ]
    )
    # E: one card per write (`tool_card_id`), from the rule texts the refusal receipts carry, plus the tools
    # successful episodes called before that write (never ids or values), triggered where the write is intended
    if _from_outcomes(p):
        # a wrong value the gold shows, or a coded refusal (no statement to copy): infer the rule from outcomes
        inferred = _inferred_card(p, ctx)
        if inferred is None:
            return None
        card_id, ops, fields, items = inferred
        return Plan(
            owner=Owner.E,
            cluster=p.id,
            summary=f"E: card {card_id} on {p.tool} (inferred: {', '.join(fields)})",
            rationale=p.claims[0].statement,
            evidence=p.citations(),
            operations=[*ops, *wiring],
            mechanism=f"deliver:{card_id}@",
            source_items=items[:max_source_items],
        )
    merged = _write_card(p, ctx) if p.rule_id and p.detail.strip() else None
    if merged is not None:  # a rule no card about its write states yet: the knowledge is missing, whatever the kind
        card_id, ops, rules_in, items = merged
        ops = [*ops, *wiring]
        mechanism = f"deliver:{card_id}@"
        summary = f"E: card {card_id} on {p.tool} (rules {', '.join(rules_in)})"
        return Plan(
            owner=Owner.E,
            cluster=p.id,
            summary=summary,
            rationale=p.claims[0].statement,
            evidence=p.citations(),
            operations=ops,
            mechanism=mechanism,
            source_items=items[:max_source_items],
        )
    change = _CHANGES.get((p.owner, p.kind))
    made = change(p, ctx, wiring, routed) if change is not None else None
    if made is None:
        return None
    ops, mechanism, summary = made
    return Plan(
        owner=p.owner,
        cluster=p.id,
        summary=summary,
        rationale=p.claims[0].statement,
        evidence=p.citations(),
        operations=ops,
        mechanism=mechanism,
        source_items=_probe_first(p)[:max_source_items],
    )


# The smallest change per (owner, kind) of a cluster whose rules are already written down (or that is not about a
# rule): (operations, mechanism, summary), or None when the package already has it. `wiring`: the delivery binding
# the change needs when cards are not yet routed at intent_recorded (`routed`).
Change = tuple[list[Operation], str, str]


def _rebind(p: EvidencePacket, ctx: PlanContext, wiring: Sequence[Operation], routed: bool) -> Change | None:
    """rho card_not_fired: rebind the card about the rule to the write it concerns."""
    pkg = ctx.package
    cards = cards_about(pkg, p.tool, p.rule_id)
    if not cards:  # no card concerns the rule: nothing to rebind
        return None
    card = pkg.cards[cards[0]]
    t = card.meta.trigger
    if t is not None and t.event == "intent_recorded" and t.tool == p.tool and routed:
        return None
    return (
        [SetTrigger(op="set_trigger", path=card.path, event="intent_recorded", tool=p.tool), *wiring],
        f"deliver:{card.id}@",
        f"rho: rebind {card.id} to intent_recorded/{p.tool}",
    )


def _route(p: EvidencePacket, ctx: PlanContext, wiring: Sequence[Operation], routed: bool) -> Change | None:
    """rho diluted_card: route cards by trigger instead of delivering all of them."""
    pkg = ctx.package
    blanket = [b for b in pkg.delivery if b.strategy.ignores_triggers]
    if not blanket or any(c.meta.trigger is None for c in pkg.cards.values()):
        return None
    ops = [RemoveBinding(op="remove_binding", section="delivery", use=b.spec.use, at=b.spec.at) for b in blanket]
    return [*ops, *wiring], "deliver:", "rho: route cards by trigger instead of delivering all of them"


def _checker(p: EvidencePacket, ctx: PlanContext, wiring: Sequence[Operation], routed: bool) -> Change | None:
    """C: add the checker that would have bounced the action that escaped."""
    use, at, summary = CHECKER_FOR[p.kind]
    if any(b.spec.use == use for b in ctx.package.checkers):
        return None
    return [AddBinding(op="add_binding", section="checkers", use=use, at=at)], f"check:{use}@{at}", summary


def _bind_on(p: EvidencePacket, ctx: PlanContext, wiring: Sequence[Operation], routed: bool) -> Change | None:
    """W wrong_grounding: bind receipts on the arguments the misgrounded entries had, as well as the tool."""
    pkg = ctx.package
    keys = sorted({k for f in _findings(ctx, p) for k in f.get("bind_args", [])} | set(pkg.wm.bind_on))
    if not keys or keys == sorted(pkg.wm.bind_on):
        return None
    return (
        [SetWM(op="set_wm", field="bind_on", value=keys)],
        "ground:",
        f"W: bind receipts on {', '.join(keys)} as well as the tool",
    )


def _max_entries(p: EvidencePacket, ctx: PlanContext, wiring: Sequence[Operation], routed: bool) -> Change | None:
    """W overflow: track more pending entries."""
    pkg = ctx.package
    need = max([f.get("proposed_max", 0) for f in _findings(ctx, p)] + [0]) + 2
    want = min(64, 1 << (need - 1).bit_length())  # a power of two: a corpus that saw one more entry is not a new plan
    if want <= pkg.wm.max_entries:
        return None
    return (
        [SetWM(op="set_wm", field="max_entries", value=want)],
        "ledger:add",
        f"W: track up to {want} pending entries (was {pkg.wm.max_entries})",
    )


def _board(p: EvidencePacket, ctx: PlanContext, wiring: Sequence[Operation], routed: bool) -> Change | None:
    """W dropped: render the ledger board every turn."""
    if ctx.package.wm.board:
        return None
    return [SetWM(op="set_wm", field="board", value=True)], "board", "W: render the ledger board every turn"


# E policy_refusal has none: every rule refused on its write is already written down, nothing to add
# (owner, kind), looked up by a packet's owner and kind (strings)
_CHANGES: dict[tuple[str, str], Callable[[EvidencePacket, PlanContext, Sequence[Operation], bool], Change | None]] = {
    (Owner.RHO, FindingKind.CARD_NOT_FIRED): _rebind,
    (Owner.RHO, FindingKind.DILUTED_CARD): _route,
    **{(Owner.C, kind): _checker for kind in CHECKER_FOR},
    (Owner.W, FindingKind.WRONG_GROUNDING): _bind_on,
    (Owner.W, FindingKind.OVERFLOW): _max_entries,
    (Owner.W, FindingKind.DROPPED): _board,
}


def _probe_first(p: EvidencePacket) -> list[str]:
    """The cluster's items, those whose seed-0 episode is in it first: validation's activation probe replays the
    first source items at seed 0, and a slip drawn at another seed (an unconfirmed write, an early finish) need not
    recur there, so a checker would be refused as never firing."""
    at0 = {e.rsplit("#", 1)[0] for e in p.episodes if e.rsplit("#", 1)[-1] == "0"}
    return sorted(p.items, key=lambda i: (i not in at0, i))


CALLS_BEFORE = "In successful episodes, the calls before `"


def tool_card_id(tool: str) -> str:
    """The id of the E card the rules meta-agent writes for a write: one card per write, stating every rule refused
    on it (several rules on one write are one change to the gate, large enough to show, not several small ones)."""
    return rule_card_id(tool).removesuffix("-rule") + "-rules"


def _leak_tokens(bench: Benchmark) -> frozenset[str]:
    return leak_tokens(bench) if getattr(bench, "tasks", None) is not None else frozenset()


def _norm(text: str) -> str:
    return " ".join(text.split())


def _write_card(p: EvidencePacket, ctx: PlanContext) -> tuple[str, list[Operation], list[str], list[str]] | None:
    """The card for `p.tool` with every rule refused on it that no card about the write states yet: (card id,
    operations, the rules it adds, the items of their packets), or None when `p`'s rule is already written down.
    Rules come from every packet of the diagnosis on the same write (largest first); a card already written for the
    write keeps its rules and gains the new ones (replaced whole: one card per write). A rho packet about a
    hand-written card is routing, not knowledge."""
    pkg, tool, rule_id = ctx.package, p.tool, p.rule_id
    if not rule_id:  # (the caller's condition: a packet with a rule)
        return None
    card_id = tool_card_id(tool)
    about = cards_about(pkg, tool, rule_id)
    if p.owner not in (Owner.E, Owner.RHO) or (p.owner == Owner.RHO and any(c != card_id for c in about)):
        return None
    stated = _stated(ctx, tool)
    if stated(rule_id, p.detail):
        return None
    new, items = _rules_for_card(p, rule_id, ctx, stated)
    return card_id, _card_ops(p, ctx, card_id, new), list(new), items


def _stated(ctx: PlanContext, tool: str) -> Callable[[str, str], bool]:
    """Whether a rule on `tool` is written down already, or not writable: validation rejects a card with task data
    (a value of a request or rubric the policy never uses), and one such rule would sink the others on the card."""
    pkg = ctx.package
    bodies = [_norm(pkg.cards[c].body) for c in cards_about(pkg, tool)]

    leaks = _leak_tokens(ctx.bench)

    def stated(rule_id: str, text: str) -> bool:
        low = text.lower()
        return (
            rule_card_id(rule_id) in pkg.cards
            or any(_norm(text) in b for b in bodies)
            or any(t.lower() in low for t in leaks)
        )

    return stated


def _rules_for_card(
    p: EvidencePacket, rule_id: str, ctx: PlanContext, stated: Callable[[str, str], bool]
) -> tuple[dict[str, str], list[str]]:
    """(rule id -> statement, items) for `p`'s rule (`rule_id`) and every other rule a packet on the same write states that is
    not written down yet (largest packet first), with the items of their packets."""
    new: dict[str, str] = {rule_id: p.detail.strip()}
    items = list(p.items)
    for q in sorted(ctx.packets, key=lambda q: (-len(q.episodes), q.id)):
        if (
            q.tool != p.tool
            or not q.rule_id
            or not q.detail.strip()
            or q.owner not in (Owner.E, Owner.RHO)
            or q.rule_id in new
            or stated(q.rule_id, q.detail)
        ):
            continue
        new[q.rule_id] = q.detail.strip()
        items += [i for i in q.items if i not in items]
    return new, items


def _card_ops(p: EvidencePacket, ctx: PlanContext, card_id: str, new: dict[str, str]) -> list[Operation]:
    """The operations that write the write's card: its old card's paragraphs kept (but the calls-before line), the
    new rules added and the calls seen before the write stated, the old card replaced whole."""
    tool = p.tool
    path = f"em/procedure/{card_id}.md"
    old = ctx.package.cards.get(card_id)
    kept = (
        [para for para in old.body.strip().split("\n\n") if para and not para.startswith(CALLS_BEFORE)] if old else []
    )
    paras = kept + list(new.values())
    before = _calls_before(ctx, tool)
    if before:
        paras.append(CALLS_BEFORE + tool + "` were: " + ", ".join(f"`{t}`" for t in before) + ".")
    rules_in = list(new)
    meta = {
        "id": card_id,
        "type": "procedure",
        "trigger": {"event": "intent_recorded", "tool": tool},
        "source": f"diagnosis {p.id}: refusals of {tool} on rule(s) {', '.join(rules_in)}",
    }
    ops: list[Operation] = [RemoveCard(op="remove_card", path=old.path)] if old else []
    ops.append(AddCard(op="add_card", path=path, meta=meta, body="\n\n".join(paras)))
    return ops


OUTCOME_KINDS = (
    FindingKind.WRONG_VALUE,
    FindingKind.INEFFECTIVE_CARD,
)  # E findings whose fix is a rule the outcomes must show


def _from_outcomes(p: EvidencePacket) -> bool:
    """An E cluster only outcomes can fix: a wrong value against the gold (no rule id: no receipt named one), or a
    coded refusal (a rule id with no statement to copy)."""
    return p.owner == Owner.E and (
        (not p.rule_id and p.kind in OUTCOME_KINDS) or bool(p.rule_id and not p.detail.strip())
    )


def outcome_inferences(ctx: PlanContext, tool: str) -> list[Inference]:
    """The inference for every field of `tool` the train episodes got wrong (components/evolution/infer/), from
    the working base's train traces and the train items' gold; memoized per context."""
    return _inferred(ctx, tool)[0]


def _inferred(ctx: PlanContext, tool: str) -> tuple[list[Inference], int]:
    """(the inferences for `tool`, how many train attempts their rules would make right), memoized per context; a
    field left without a rule takes one another write's rows show where this write's cannot (`infer.carried`)."""
    from components.evolution.infer import carried, fixable

    memo: dict[str, tuple[list[Inference], int]] = ctx.__dict__.setdefault("_inferences", {})
    if tool not in memo:
        rows, infs = _own_inferences(ctx, tool)
        if any(i.rule is None for i in infs):
            others = {t: _own_inferences(ctx, t)[1] for t in sorted(ctx.bench.write_tools) if t != tool}
            infs = carried(tool, rows, infs, others)
        memo[tool] = (infs, fixable(rows, infs))
    return memo[tool]


def _own_inferences(ctx: PlanContext, tool: str) -> tuple[list[Row], list[Inference]]:
    """(the train rows of `tool`, the inference for each field they got wrong), from `tool`'s rows alone; memoized."""
    from components.evolution.infer import infer_rows, policy_today, rows_for
    from components.worlds.base import train_gold

    memo: dict[str, tuple[list[Row], list[Inference]]] = ctx.__dict__.setdefault("_own_inferences", {})
    if tool not in memo:
        if "_episodes" not in ctx.__dict__:
            gold = train_gold(ctx.bench) if hasattr(ctx.bench, "splits") else {}
            ctx.__dict__["_gold"] = gold
            ctx.__dict__["_episodes"] = (
                {eid: frame_steps(df.sort_values("step")) for eid, df in ctx.traces.groupby("episode_id")}
                if gold and len(ctx.traces)
                else {}
            )
        rows = (
            rows_for(
                tool,
                ctx.__dict__["_episodes"],
                ctx.__dict__["_gold"],
                ctx.bench.write_tools,
                ctx.bench.targets,
                policy_today(getattr(ctx.bench, "policy", "")),
            )
            if ctx.__dict__["_episodes"]
            else []
        )
        memo[tool] = (rows, infer_rows(tool, rows, ctx.bench.targets) if rows else [])
    return memo[tool]


def _size(p: EvidencePacket, ctx: PlanContext) -> int:
    """A cluster's size for ordering: its episodes; for a wrong value, at most the attempts its inferred rules would
    make right (a write whose other fields no rule explains gains little from a card of the ones that are)."""
    if _from_outcomes(p):
        return min(len(p.episodes), _inferred(ctx, p.tool)[1])
    return len(p.episodes)


def _inferred_card(p: EvidencePacket, ctx: PlanContext) -> tuple[str, list[Operation], list[str], list[str]] | None:
    """The write's card with the rules inferred from outcomes added (one item per field, the form of
    `components.worlds.outcome_rules`), or None when no field has a rule that passed its check, or every one is
    already on the card. Rules whose text holds task data are left out (validation would refuse the card)."""
    from components.worlds import outcome_rules as O

    pkg, tool = ctx.package, p.tool
    card_id = tool_card_id(tool)
    old = pkg.cards.get(card_id)
    have = O.parse(old.body, tool) if old else {}
    leaks = [t.lower() for t in _leak_tokens(ctx.bench)]
    new = _new_rules(ctx, tool, have, leaks)
    refusals = _refusals(p, ctx, tool, old.body if old else "", leaks)
    if not new and not refusals:
        return None
    rules = {**have, **new}
    source: dict[str, list[str]] = {}  # the write each carried rule on the card comes from
    for inf in outcome_inferences(ctx, tool):
        if inf.source and rules.get(inf.field) == inf.rule:
            source.setdefault(inf.source, []).append(inf.field)
    paras = _rule_paragraphs(tool, old.body if old else None, rules, source, refusals, _calls_before(ctx, tool))
    fields = sorted(set(new) | {f for _line, f in refusals})
    meta = {
        "id": card_id,
        "type": "procedure",
        "trigger": {"event": "intent_recorded", "tool": tool},
        "source": f"diagnosis {p.id}: outcomes of {tool} on field(s) {', '.join(fields)}",
    }
    ops: list[Operation] = [RemoveCard(op="remove_card", path=old.path)] if old else []
    ops.append(AddCard(op="add_card", path=f"em/procedure/{card_id}.md", meta=meta, body="\n\n".join(paras)))
    # the plan names what it carries: inferred rules by field, a field known only from the world's refusals as such
    return card_id, ops, sorted(new) + [f"{f} (refusals)" for f in fields if f not in new], list(p.items)


def _new_rules(ctx: PlanContext, tool: str, have: dict[str, FieldRule], leaks: list[str]) -> dict[str, FieldRule]:
    """The rules inferred for the write's fields that the card does not state yet, free of task data."""
    from components.worlds import outcome_rules as O

    new = {}
    for inf in outcome_inferences(ctx, tool):
        if inf.rule is None or have.get(inf.field) == inf.rule:
            continue
        if any(t in O.render(tool, inf.rule).lower() for t in leaks):
            continue
        new[inf.field] = inf.rule
    return new


def _rule_paragraphs(
    tool: str,
    old: str | None,
    rules: dict[str, FieldRule],
    source: dict[str, list[str]],
    refusals: list[tuple[str, str]],
    before: list[str],
) -> list[str]:
    """The card's paragraphs: the old card's own text (not its rules, carried notes or call order, written anew),
    one item per rule, where carried rules come from, the world's refusals, and the calls made before the write."""
    from components.worlds import outcome_rules as O

    kept = (
        [
            para
            for para in old.strip().split("\n\n")
            if para and not para.startswith(CALLS_BEFORE) and O.MARK not in para and CARRIED_MARK not in para
        ]
        if old
        else []
    )
    paras = kept + (["\n".join(O.render(tool, rules[f]) for f in sorted(rules))] if rules else [])
    paras += [CARRIED.format(tool=tool, fields=", ".join(f"`{f}`" for f in fs), source=s) for s, fs in source.items()]
    if refusals:
        paras.append("\n".join(line for line, _field in refusals))
    if before:
        paras.append(CALLS_BEFORE + tool + "` were: " + ", ".join(f"`{t}`" for t in before) + ".")
    return paras


# the provenance of rules carried over from another write (`infer.carried`); worded so that no world's grammar reads
# a value from it (no negation, no rule's phrase)
CARRIED_MARK = "which takes the same fields"
CARRIED = "- `{tool}`: {fields} as on `{source}`, " + CARRIED_MARK + " (its train outcomes show the rule)."
REFUSED = "- `{tool}`, refused in train when `{field}` was not the gold's: {why}"


def _refusals(p: EvidencePacket, ctx: PlanContext, tool: str, body: str, leaks: list[str]) -> list[tuple[str, str]]:
    """(line, field) for each refusal the world gave the cluster's wrong arguments (`outcomes.Diff.refused`: the
    world's own words on what was wrong, where the outcomes show which argument), most frequent first, not on the card
    yet and free of task data: knowledge a card can state where train is too small to infer the rule."""
    seen: Counter[tuple[str, str]] = Counter()
    for x in _findings(ctx, p):
        why = str(x.get("refused") or "").strip()
        for d in x.get("diffs") or []:
            if why:
                seen[(str(d.get("field")), why)] += 1
    out = []
    for (name, why), _n in sorted(seen.items(), key=lambda kv: (-kv[1], kv[0])):
        line = REFUSED.format(tool=tool, field=name, why=why)
        if line not in body and not any(t in line.lower() for t in leaks):
            out.append((line, name))
    return out


def _findings(ctx: PlanContext, p: EvidencePacket) -> list[dict[str, Any]]:
    episodes = set(p.episodes)
    return [
        f.extra
        for f in ctx.findings
        if f.episode_id in episodes and f.signature == (p.owner, p.kind, p.tool, p.rule_id or "")
    ]


def _calls_before(ctx: PlanContext, tool: str) -> list[str]:
    """The most common sequence of distinct tools called before a successful `tool` call in successful episodes."""
    ok = ctx.scores[ctx.scores["success"].astype(bool)]
    if ok.empty or ctx.traces.empty:
        return []
    eids = {f"{i}#{s}" for i, s in zip(ok["item_id"], ok["seed"])}
    seqs: Counter[tuple[str, ...]] = Counter()
    for eid, df in ctx.traces[ctx.traces["episode_id"].isin(eids)].groupby("episode_id", sort=True):
        seen: list[str] = []
        for s in frame_steps(df.sort_values("step")):
            t = s.action.get("tool")
            if t == tool and s.observation.get("ok"):
                seqs[tuple(seen)] += 1
                break
            if t and t != "finish" and t not in ctx.bench.write_tools and t not in seen:
                seen.append(t)
    return list(seqs.most_common(1)[0][0]) if seqs else []


# -- llm ---------------------------------------------------------------------------------------------------------------


@dataclass
class PlanOutcome:
    """What a meta-agent returned: a plan, nothing to patch (`plan` and `failure` both None), or a *rejected plan*:
    the model's reply failed (model error, not JSON, not the schema, already rejected) and `failure` says how.
    `replies` keeps every raw reply (and the error it met) for the round directory and MLflow; `usage` what every
    model call cost, failed ones included (settled against the budget; never recorded in the round's files)."""

    plan: Plan | None = None
    failure: str | None = None
    replies: list[dict[str, Any]] = field(default_factory=list)
    prompt_chars: int | None = None  # the planning prompt as sent (after the budget)
    prompt_tokens: int | None = None  # the same, in the server's tokens (with a token budget)
    usage: list[Usage] = field(default_factory=list)

    def record(self, cap: int = 8000) -> dict[str, Any]:
        out: dict[str, Any] = {
            "failure": self.failure,
            "replies": [{**r, "raw": None if r.get("raw") is None else r["raw"][:cap]} for r in self.replies],
        }
        if self.prompt_chars is not None:
            out["prompt"] = {"chars": self.prompt_chars, "tokens": self.prompt_tokens}
        return out


class MetaAgent(Protocol):
    """What the plan stage asks: one outcome per planning context; `spends`: planning asks a model (budget held)."""

    spends: bool

    def plan(self, ctx: PlanContext) -> PlanOutcome: ...


@dataclass(frozen=True)
class LlmAgent:
    """A model asked for a plan (see `llm`); called, it returns the whole outcome, as `plan` does."""

    propose: Callable[[PlanContext], PlanOutcome]
    spends = True

    def plan(self, ctx: PlanContext) -> PlanOutcome:
        return self.propose(ctx)

    def __call__(self, ctx: PlanContext) -> PlanOutcome:
        return self.propose(ctx)


@META_AGENTS.register("llm")
def llm(
    *,
    model: str = "sim",
    model_cfg: dict[str, Any] = {},
    seed: int = 0,  # noqa: B006 - frozen by the options model
    max_prompt_chars: int = 24_000,
    max_prompt_tokens: int | None = None,
    max_packets: int = 8,
    repair_turns: int = 1,
    structured: bool = True,
) -> LlmAgent:
    """Ask a model (through the same chat interface as the agent) for a JSON plan; validate it like any plan.

    The prompt is a budgeted projection (`_prompt`): the least useful evidence goes first until the prompt fits
    `max_prompt_tokens` (counted by the server's tokenizer where it has one, `/tokenize` as llama-server and
    `ratchet serve-local` serve it; else 4 characters a token) or, without it, `max_prompt_chars` (24,000 fits an
    8K context with room for the reply). With `structured`, the reply is constrained by the plan's JSON schema where
    the server supports it. A reply that fails gets `repair_turns` more turns with the validation error fed back; a
    reply that still fails is a rejected plan, never an exception and never "nothing to patch"."""
    from components.models import make_model
    from components.models.base import ModelError

    chat = make_model(model, dict(model_cfg))
    plan_schema = Plan.model_json_schema()

    def propose(ctx: PlanContext) -> PlanOutcome:
        patchable = [p for p in ctx.packets if p.patchable]
        if not patchable:
            return PlanOutcome()
        draft = RulesAgent(max_per_episode=6)(ctx)
        system = f"{prompts.PLAN_MARK}\n" + LLM_INSTRUCTIONS
        if max_prompt_tokens is not None:

            def fits(text: str) -> bool:
                return _tokens(chat, system + "\n" + text) <= max_prompt_tokens
        else:

            def fits(text: str) -> bool:
                return len(system) + len(text) <= max_prompt_chars

        user = _prompt(ctx, patchable, draft, fits, max_packets, schema_sent=structured)
        messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        out = PlanOutcome(
            prompt_chars=len(system) + len(user),
            prompt_tokens=_tokens(chat, system + "\n" + user) if max_prompt_tokens is not None else None,
        )
        for turn in range(repair_turns + 1):
            try:
                reply = chat.complete(messages, tools=None, seed=seed, json_mode=plan_schema if structured else True)
            except ModelError as e:  # the server failed or cut the reply: what it spent is still counted
                out.usage.append(e.usage)
                # a cut reply's text is the model's answer as far as it got: kept, as every reply is
                out.replies.append({"turn": turn, "raw": e.text or None, "error": str(e)})
                out.failure = f"model error: {e}"
                return out  # a model fault is not the model's answer: no repair turn on it
            out.usage.append(reply.usage)
            problem, plan = _check(reply.content, ctx, len(patchable))
            out.replies.append({"turn": turn, "raw": reply.content, "error": problem})
            if problem is None:
                out.plan, out.failure = plan, None
                return out
            out.failure = problem
            messages += [
                {"role": "assistant", "content": reply.content or ""},
                {"role": "user", "content": REPAIR.format(problem=problem)},
            ]
        return out

    return LlmAgent(propose)


LLM_INSTRUCTIONS = (
    "You improve an agent's memory package (cards, ledger options, routing, checkers) from failure evidence. "
    "Propose ONE plan for one owner (E knowledge, W working memory, rho routing, C checking): the smallest connected "
    "change. Never put ids, names or values from the tasks into a card. Reply with one JSON object matching the schema."
)
REPAIR = "Your reply was not a valid plan: {problem}\nReply again with one JSON object that matches the plan schema."


def _check(content: str | None, ctx: PlanContext, n_patchable: int) -> tuple[str | None, Plan | None]:
    """Validate a reply: (problem, None) or (None, plan)."""
    from components.errors import InputError

    try:
        raw = json.loads(content or "")
    except json.JSONDecodeError as e:
        return f"not JSON ({e})", None
    if not isinstance(raw, dict):
        return f"expected a JSON object, got {type(raw).__name__}", None
    if raw.get("owner") in (None, Owner.NONE):
        return f"no owner: the reply proposes no plan, but {n_patchable} cluster(s) are patchable", None
    try:
        plan = parse_plan(raw, where="plan")
    except InputError as e:
        return str(e), None
    if plan.key() in ctx.rejected:
        return f"this plan ({plan.key()}) was already rejected in this campaign; propose a different change", None
    return None, plan


def _prompt(
    ctx: PlanContext,
    packets: list[EvidencePacket],
    draft: Plan | None,
    fits: Callable[[str], bool],
    max_packets: int,
    schema_sent: bool = False,
) -> str:
    """The planning prompt as a budgeted projection: the largest that `fits`, shrunk by dropping the least useful
    evidence first (campaign memory, old rejected keys, full packets for compact ones, the smallest clusters, the
    card listing, the plan schema when the server is given it anyway, the rest of the rejected keys), keeping the
    rules' draft and the largest cluster. When even that does not fit, the smallest prompt goes (the server says)."""
    ranked = sorted(packets, key=lambda p: (-len(p.episodes), p.id))[:max_packets]
    diffs = _outcome_projection(ctx, packets)  # the same diffs the rules meta-agent infers from
    opts: dict[str, Any] = {
        "memory": bool(ctx.memory),
        "rejected": 50,
        "full": True,
        "n": len(ranked),
        "listing": 2,
        "schema": True,
        "diffs": diffs,
    }
    steps: list[dict[str, Any]] = [{"memory": False}, {"rejected": 10}, {"full": False}]
    steps += [{"n": n} for n in range(len(ranked) - 1, 0, -1)]
    steps += [{"listing": 1}] + ([{"schema": False}] if schema_sent else []) + [{"listing": 0}, {"rejected": 0}]
    steps += [{"diffs": diffs[: len(diffs) // 2]}, {"diffs": diffs[:1]}]
    text = _render(ctx, ranked, len(packets), draft, **opts)
    for step in steps:
        if fits(text):
            return text
        opts.update(step)
        text = _render(ctx, ranked, len(packets), draft, **opts)
    return text


def _render(
    ctx: PlanContext,
    ranked: list[EvidencePacket],
    n_patchable: int,
    draft: Plan | None,
    *,
    memory: bool,
    rejected: int,
    full: bool,
    n: int,
    listing: int,
    schema: bool,
    diffs: list[dict[str, Any]],
) -> str:
    pkg = ctx.package
    keys = sorted(ctx.rejected)[-rejected:] if rejected else []
    head = []
    if schema:
        head += ["## Plan schema", json.dumps(Plan.model_json_schema(), separators=(",", ":"))]
    head += [
        "## Draft from the rules (use, edit or replace)",
        "```json\n" + (draft.model_dump_json() if draft else json.dumps({"owner": Owner.NONE})) + "\n```",
    ]
    if diffs:  # agent value against gold value per field, and the rule inferred from them (or why none)
        head += [
            "## Outcome diffs (train episodes against their gold; the rule inferred per field, or why none)",
            json.dumps(diffs, separators=(",", ":"), default=str),
        ]
    shown = [_packet_json(p, full=full) for p in ranked[: max(1, n)]]
    if listing == 2:
        cards = json.dumps(
            {
                "manifest": pkg.manifest.model_dump(mode="json"),
                "cards": {c.path: c.meta.model_dump(mode="json") for c in pkg.cards.values()},
            },
            separators=(",", ":"),
            default=str,
        )
    elif listing == 1:
        cards = json.dumps(
            {"manifest": pkg.manifest.model_dump(mode="json"), "cards": sorted(c.path for c in pkg.cards.values())},
            separators=(",", ":"),
            default=str,
        )
    else:
        cards = f"(omitted for length: {len(pkg.cards)} cards)"
    body = [
        f"## Diagnosis packets (largest first; {len(shown)} of {n_patchable} patchable shown)",
        "\n".join(shown),
        "## Package",
        cards,
    ]
    tail = []
    if rejected:
        tail += ["## Plans already rejected (keys)", json.dumps(keys)]
    if memory and ctx.memory:  # earlier campaigns' verdicts, contested evidence, open questions: with node ids
        tail += ["## Campaign memory (evidence graph projection)", json.dumps(ctx.memory, separators=(",", ":"))]
    return "\n\n".join([*head, *body, *tail])


def _tokens(chat: ChatModel, text: str) -> int:
    """The prompt's tokens: the backend's own count (`count_tokens`, the server's tokenizer) when it has one."""
    count = getattr(chat, "count_tokens", None)
    got = count(text) if count is not None else None
    return got if got is not None else -(-len(text) // 4)


def _outcome_projection(ctx: PlanContext, packets: list[EvidencePacket], max_tools: int = 4) -> list[dict[str, Any]]:
    from components.worlds.outcome_rules import render

    tools = []
    for p in sorted(packets, key=lambda p: (-len(p.episodes), p.id)):
        if _from_outcomes(p) and p.tool not in tools:
            tools.append(p.tool)
    return [
        {
            "tool": t,
            "field": i.field,
            "wrong_rows": i.wrong,
            "examples": i.examples[:3],
            "rule": render(t, i.rule) if i.rule else None,
            "why": i.why,
        }
        for t in tools[:max_tools]
        for i in outcome_inferences(ctx, t)
    ]


def _packet_json(p: EvidencePacket, full: bool) -> str:
    d = {"n_episodes": len(p.episodes), **p.model_dump(mode="json")}
    if not full:
        d["items"], d["episodes"] = d["items"][:6], d["episodes"][:3]
        for c in d["claims"]:
            c["evidence"] = c["evidence"][:2]
    return json.dumps(d, separators=(",", ":"), default=str)


def make_meta_agent(name: str, cfg: dict[str, Any] | None = None) -> MetaAgent:
    # the registry builds whatever its factories return (models, strategies, ...); the meta-agents' return MetaAgents
    return cast(MetaAgent, META_AGENTS.make(name, cfg, where="meta_agent"))
