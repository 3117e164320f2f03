"""The meta-agent: turns the diagnosis into one scoped plan. Two backends behind one interface, registered by name.

`rules` (embedded, deterministic): takes the largest patchable cluster whose plan was not already rejected and writes
the smallest connected change for its owner:
    E    a card distilled from the policy rule that the refusal receipts quote, plus the tools successful episodes
         called before that write (never ids or values), triggered where the write is intended; wiring if missing
    rho  rebind the existing card's trigger to the write it concerns (or route instead of delivering everything)
    W    change the ledger option the evidence points at (bind_on, max_entries, board)
    C    add the checker that would have bounced the escaped action
`llm`: shows a model the packets, the package, the plan schema and the rules' draft, and validates the JSON it returns
with the same schema. Either way the plan is only a proposal: validation and the gate decide.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field

import pandas as pd

from components.evidence.packets import EvidencePacket
from components.evolution.diagnose import Finding
from components.evolution.plan import AddBinding, AddCard, Plan, RemoveBinding, SetTrigger, SetWM, parse_plan
from components.memory.package import MemoryPackage
from components.registry import Registry
from components.runtime import prompts
from components.runtime.trace import frame_steps
from components.worlds import Benchmark

META_AGENTS = Registry("meta_agent")


@dataclass
class PlanContext:
    packets: list[EvidencePacket]
    package: MemoryPackage
    bench: Benchmark
    traces: pd.DataFrame  # the working base's train traces (for contrasting successful episodes)
    scores: pd.DataFrame
    rejected: set[str] = field(default_factory=set)  # keys of plans already rejected in this campaign
    findings: list[Finding] = field(default_factory=list)


# -- rules -----------------------------------------------------------------------------------------------------------


# Repair upstream first (Recuris' dependency spine: state -> routing and experience -> checking): a checker added
# while the ledger still loses work would be judged on a state it cannot see.
LAYER = {"W": 0, "E": 1, "rho": 1, "C": 2}


@META_AGENTS.register("rules")
def rules(*, max_per_episode: int = 6, max_source_items: int = 12):
    """Deterministic attribution-to-patch rules."""

    def propose(ctx: PlanContext) -> Plan | None:
        for packet in sorted(ctx.packets, key=lambda p: (LAYER.get(p.owner, 9), -len(p.episodes), p.id)):
            if not packet.patchable:  # external, or `unknown`: the diagnoser could not tell, so nothing is guessed
                continue
            plan = rules_plan(packet, ctx, max_per_episode, max_source_items)
            if plan is not None and plan.key() not in ctx.rejected:
                return plan
        return None

    return propose


# C findings -> the checker that would have bounced the action that escaped
CHECKER_FOR = {
    "unconfirmed_write": ("confirm_before_write", "pre_write", "C: bounce writes that lack the customer's confirmation"),
    "premature_finish": ("completion_requires_receipts", "agent_declares_done",
                         "C: bounce `finish` while ledger entries are pending"),
}


def rules_plan(p: EvidencePacket, ctx: PlanContext, max_per_episode: int = 6, max_source_items: int = 12) -> Plan | None:
    pkg = ctx.package
    ops: list = []
    mechanism = ""
    routed = any(b.spec.use == "event_cards" and b.spec.at == "intent_recorded" for b in pkg.delivery)
    wiring = [] if routed else [AddBinding(op="add_binding", section="delivery", use="event_cards", at="intent_recorded",
                                           cfg={"max_per_episode": max_per_episode})]
    if p.owner == "E" and p.kind == "policy_refusal":
        card_id = f"{p.tool.replace('_', '-')}-rule"
        path = f"em/procedure/{card_id}.md"
        if card_id in pkg.cards or not p.detail:
            return None
        before = _calls_before(ctx, p.tool)
        body = p.detail.strip()
        if before:
            body += "\n\nIn successful episodes, the calls before `" + p.tool + "` were: " + \
                    ", ".join(f"`{t}`" for t in before) + "."
        meta = {"id": card_id, "type": "procedure", "trigger": {"event": "intent_recorded", "tool": p.tool},
                "source": f"diagnosis {p.id}: {len(p.episodes)} refusals of {p.tool} quoting policy.md"}
        ops = [AddCard(op="add_card", path=path, meta=meta, body=body), *wiring]
        mechanism = f"deliver:{card_id}@"
        summary = f"E: add card {card_id} (rule for {p.tool})"
    elif p.owner == "rho" and p.kind == "card_not_fired":
        cards = [c for c in pkg.cards.values() if f"`{p.tool}`" in c.body]
        card = cards[0]
        t = card.meta.trigger
        if t is not None and t.event == "intent_recorded" and t.tool == p.tool and routed:
            return None
        ops = [SetTrigger(op="set_trigger", path=card.path, event="intent_recorded", tool=p.tool), *wiring]
        mechanism = f"deliver:{card.id}@"
        summary = f"rho: rebind {card.id} to intent_recorded/{p.tool}"
    elif p.owner == "rho" and p.kind == "diluted_card":
        blanket = [b for b in pkg.delivery if b.strategy.ignores_triggers]
        if not blanket or any(c.meta.trigger is None for c in pkg.cards.values()):
            return None
        ops = [RemoveBinding(op="remove_binding", section="delivery", use=b.spec.use, at=b.spec.at) for b in blanket]
        ops += wiring
        mechanism = "deliver:"
        summary = "rho: route cards by trigger instead of delivering all of them"
    elif p.owner == "C" and p.kind in CHECKER_FOR:
        use, at, summary = CHECKER_FOR[p.kind]
        if any(b.spec.use == use for b in pkg.checkers):
            return None
        ops = [AddBinding(op="add_binding", section="checkers", use=use, at=at)]
        mechanism = f"check:{use}@{at}"
    elif p.owner == "W" and p.kind == "wrong_grounding":
        keys = sorted({k for f in _findings(ctx, p) for k in f.get("bind_args", [])} | set(pkg.wm.bind_on))
        if not keys or keys == sorted(pkg.wm.bind_on):
            return None
        ops = [SetWM(op="set_wm", field="bind_on", value=keys)]
        mechanism = "ground:"
        summary = f"W: bind receipts on {', '.join(keys)} as well as the tool"
    elif p.owner == "W" and p.kind == "overflow":
        want = min(64, max([f.get("proposed_max", 0) for f in _findings(ctx, p)] + [0]) + 2)
        if want <= pkg.wm.max_entries:
            return None
        ops = [SetWM(op="set_wm", field="max_entries", value=want)]
        mechanism = "ledger:add"
        summary = f"W: track up to {want} pending entries (was {pkg.wm.max_entries})"
    elif p.owner == "W" and p.kind == "dropped":
        if pkg.wm.board:
            return None
        ops = [SetWM(op="set_wm", field="board", value=True)]
        mechanism = "board"
        summary = "W: render the ledger board every turn"
    else:
        return None
    return Plan(owner=p.owner, cluster=p.id, summary=summary, rationale=p.claims[0].statement,
                evidence=p.citations(), operations=ops, mechanism=mechanism, source_items=p.items[:max_source_items])


def _findings(ctx: PlanContext, p: EvidencePacket) -> list[dict]:
    episodes = set(p.episodes)
    return [f.extra for f in ctx.findings if f.episode_id in episodes and f.signature == (p.owner, p.kind, p.tool)]


def _calls_before(ctx: PlanContext, tool: str) -> list[str]:
    """The most common sequence of distinct tools called before a successful `tool` call in successful episodes."""
    ok = ctx.scores[ctx.scores["success"].astype(bool)]
    if ok.empty or ctx.traces.empty:
        return []
    eids = {f"{i}#{s}" for i, s in zip(ok["item_id"], ok["seed"])}
    seqs: Counter = Counter()
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

@META_AGENTS.register("llm")
def llm(*, model: str = "sim", model_cfg: dict = {}, seed: int = 0):  # noqa: B006 - frozen by the options model
    """Ask a model (through the same chat interface as the agent) for a JSON plan; validate it like any plan."""
    from components.models import make_model

    chat = make_model(model, dict(model_cfg))

    def propose(ctx: PlanContext) -> Plan | None:
        patchable = [p for p in ctx.packets if p.patchable]
        draft = rules(max_per_episode=6, max_source_items=12)(ctx)
        if not patchable:
            return None
        messages = [{"role": "system", "content": f"{prompts.PLAN_MARK}\n" + LLM_INSTRUCTIONS},
                    {"role": "user", "content": _prompt(ctx, patchable[:3], draft)}]
        reply = chat.complete(messages, tools=None, seed=seed, json_mode=True)
        propose.usage.append(reply.usage)  # for the budget ledger's reconciliation
        raw = json.loads(reply.content or "null")
        if not raw or raw.get("owner") in (None, "none"):
            return None
        plan = parse_plan(raw, where="llm plan")
        return None if plan.key() in ctx.rejected else plan

    propose.usage = []
    return propose


LLM_INSTRUCTIONS = (
    "You improve an agent's memory package (cards, ledger options, routing, checkers) from failure evidence. "
    "Propose ONE plan for one owner (E knowledge, W working memory, rho routing, C checking): the smallest connected "
    "change. Never put ids, names or values from the tasks into a card. Reply with one JSON object matching the schema."
)


def _prompt(ctx: PlanContext, packets: list[EvidencePacket], draft: Plan | None) -> str:
    pkg = ctx.package
    listing = {"manifest": pkg.manifest.model_dump(), "cards": {c.path: c.meta.model_dump() for c in pkg.cards.values()}}
    parts = [
        "## Diagnosis packets (largest first)", json.dumps([p.model_dump() for p in packets], indent=1),
        "## Package", json.dumps(listing, indent=1),
        "## Plans already rejected (keys)", json.dumps(sorted(ctx.rejected)),
        "## Plan schema", json.dumps(Plan.model_json_schema()),
        "## Draft from the rules (use, edit or replace)",
        "```json\n" + (draft.model_dump_json() if draft else json.dumps({"owner": "none"})) + "\n```",
    ]
    return "\n\n".join(parts)


def make_meta_agent(name: str, cfg: dict | None = None):
    return META_AGENTS.make(name, cfg, where="meta_agent")
