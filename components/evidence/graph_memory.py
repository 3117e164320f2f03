"""Campaign memory before planning: the budgeted projection, the plan keys rejected on the same evidence, revocation
plans for promotions the current data contradicts, and plans another campaign's gate accepted that apply here
(components/evidence/graph_record.py has the overview)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from components.codes import FindingKind, Owner
from components.defaults import MAX_SOURCE_ITEMS
from components.evidence.graph import EvidenceGraph, Expiry, Node, node_id
from components.evidence.graph_claims import _packet_claim, _restated, open_questions, trace_resolver
from components.evidence.packets import EvidencePacket


@dataclass
class Memory:
    """What the meta-agent gets from the graph for this round."""

    rejected_here: list[str] = field(default_factory=list)  # plan keys rejected on this benchmark digest and model
    rejected_elsewhere: list[str] = field(default_factory=list)  # rejected only on other evidence: tried after the rest
    revocations: list[dict] = field(default_factory=list)  # plans (as dicts) that remove a contradicted promotion
    revokes: dict[str, str] = field(default_factory=dict)  # revocation plan key -> the promotion node it removes
    # plans another campaign's gate accepted (same model), bound to a current packet; appended to `revocations`,
    # the plans memory proposes before the meta-agent's own (the meta-agent reads them as one list, revocations first)
    reused: dict[str, str] = field(default_factory=dict)  # reused plan key -> the accepting verdict node
    projection: dict = field(default_factory=dict)  # the budgeted view shown to the llm meta-agent
    chars: int = 0

    def record(self) -> dict:
        # `reused` only when memory reused something: a campaign on a fresh graph writes what it always wrote
        return {
            "rejected_here": self.rejected_here,
            "rejected_elsewhere": self.rejected_elsewhere,
            "revocations": self.revokes,
            **({"reused": self.reused} if self.reused else {}),
            "projection": self.projection,
            "chars": self.chars,
        }


def _in_force(g: EvidenceGraph) -> list[Node]:
    revoked, flagged = g.revoked(), g.flagged()
    return [
        n
        for n in g.nodes("decision")
        if n.data.get("type") == "promotion" and n.id not in revoked and n.id not in flagged
    ]


def plan_memory(
    g: EvidenceGraph,
    packets: list[EvidencePacket],
    traces: pd.DataFrame,
    package,
    bench: str,
    model: str,
    max_chars: int = 4000,
) -> Memory:
    """The projection and the decisions memory makes before planning (see the module docstring)."""
    now = Expiry(benchmark=bench, model=model)
    m = Memory()
    # only what other campaigns recorded: this campaign's own rejections are in its lineage already, and a forced rerun
    # of the same campaign must plan exactly as its first run did (the same bytes for `dvc repro --force`)
    elsewhere = g.from_elsewhere()
    decisions = _standing_decisions(g, elsewhere)
    m.rejected_here, m.rejected_elsewhere = _rejected(g, decisions, now)
    # a promoted card whose rule the current refusals contradict: record the contradiction, propose its revocation
    _revise_contradicted(g, packets, traces, package, bench, model, m)
    # plans another campaign's gate accepted are the likeliest to help again: on this very evidence the change itself
    # is proposed before any new plan (after revocations); on other evidence (another digest, same model) the finding
    # it fixed is planned for first, with a plan built from the current data (a card from another benchmark's
    # refusals may miss rules this one shows)
    for plan, verdict in reusable(g, decisions, packets, package, now, set(m.rejected_here) | set(m.revokes)):
        m.revocations.append(plan.model_dump(mode="json"))
        m.reused[plan.key()] = verdict.id
    # within the projection's limit: the rest of it gets what these findings leave (nothing: it is as it always was)
    helped = helped_elsewhere(g, decisions, now)
    extra = len(json.dumps({"helped_elsewhere": helped}, separators=(",", ":"))) if helped else 0
    m.projection = project(g, [p for p in packets if p.patchable], now, max(0, max_chars - extra), elsewhere)
    if helped:  # only when there is something: a campaign on a fresh graph reads what it always read
        m.projection["helped_elsewhere"] = helped
    m.chars = len(json.dumps(m.projection, separators=(",", ":")))
    return m


def _standing_decisions(g: EvidenceGraph, elsewhere: set[str]) -> list[Node]:
    """Other campaigns' decisions that still stand: a decision derived from a revoked node is not evidence any more,
    no rejection or acceptance stands on it (a person's revocation; the gate's revokes a promotion on other evidence
    only, see `reusable`)."""
    by_person = {k for k, r in g.revoked().items() if r.get("by") != "gate"}
    gone = by_person | {k for k, root in g.flagged().items() if root in by_person}
    return [n for n in g.nodes("decision") if n.id in elsewhere and n.id not in gone]


def _rejected(g: EvidenceGraph, decisions: list[Node], now: Expiry) -> tuple[list[str], list[str]]:
    """Plan keys rejected on this evidence, and those rejected only on other evidence (and never accepted)."""
    rejections = [n for n in decisions if n.data.get("type") == "rejection"]
    here = sorted({n.data["plan_key"] for n in rejections if not g.expired(n, now)})
    accepted = {
        n.data.get("plan_key") for n in decisions if n.data.get("type") == "gate_verdict" and n.data.get("accept")
    }
    return here, sorted({n.data["plan_key"] for n in rejections} - set(here) - accepted)


def _revise_contradicted(
    g: EvidenceGraph, packets: list[EvidencePacket], traces: pd.DataFrame, package, bench: str, model: str, m: Memory
) -> None:
    """For each card in force (promoted elsewhere) that the current refusals contradict: link the new claim as
    contradicting the claims the promotion stood on, and add to `m` the plan that revokes the card and restates its
    rule (once per card: the oldest promotion, when the same card was promoted again elsewhere)."""
    resolve = trace_resolver(traces) if len(traces) else None
    paths = {c.path for c in package.cards.values()}
    for promo in _in_force(g):
        for card in promo.data.get("cards") or []:
            if card["path"] not in paths or not card.get("tool"):
                continue
            for p in packets:
                stated = _contradicted_rule(card, p)
                if stated is None:
                    continue
                with g.batch():
                    c = _packet_claim(g, p, bench, model, resolve, None)
                    for s in g.edges(dst=promo.id, relation="supports"):
                        old = g.get(s.src)
                        if old is not None and old.kind == "claim":
                            g.link(c.id, "contradicts", old.id)
                plan = _revocation(promo, card, p, package, bench, stated)
                if plan.key() not in m.revokes:
                    m.revocations.append(plan.model_dump(mode="json"))
                    m.revokes[plan.key()] = promo.id
                break


def _contradicted_rule(card: dict, p: EvidencePacket) -> str | None:
    """The rule a promoted card states that packet `p` contradicts, else None. Refusals of the card's rule while it is
    delivered (ineffective_card: the card does not help where delivered) or while it is not (policy_refusal) quote
    the rule as the world has it now; the card's statement of that rule (a card may state several rules of its
    write: another rule of the same write is not what the card states) is contradicted when the quote differs (the
    same rule refused again: the card was not followed, not contradicted)."""
    if (
        p.owner != Owner.E
        or p.kind not in (FindingKind.POLICY_REFUSAL, FindingKind.INEFFECTIVE_CARD)
        or p.tool != card["tool"]
        or not p.detail.strip()
    ):
        return None
    stated = next(
        (
            r["rule"]
            for r in card.get("rules") or [{"rule_id": card.get("rule_id"), "rule": card.get("rule")}]
            if r.get("rule_id") and r["rule_id"] == p.rule_id
        ),
        None,
    )
    if stated is None or p.detail.strip() == (stated or "").strip():
        return None
    return stated


def _revocation(promo: Node, card: dict, p: EvidencePacket, package, bench: str, stated: str):
    """The plan that removes a contradicted card and adds it back with its rule restated as packet `p` quotes it."""
    from components.evolution.plan import AddCard, Plan, RemoveCard

    old_card = package.cards.get(card["id"]) or next(
        (x for x in package.cards.values() if x.path == card["path"]), None
    )
    meta = (
        old_card.meta.model_dump(mode="json", exclude_none=True)
        if old_card is not None
        else {"id": card["id"], "type": "procedure", "trigger": {"event": "intent_recorded", "tool": card["tool"]}}
    )
    meta["source"] = f"revision of {promo.id} after diagnosis {p.id} ({len(p.episodes)} refusals)"
    return Plan(
        owner=Owner.E,
        cluster=p.id,
        rationale=p.claims[0].statement,
        evidence=p.citations(),
        summary=f"E: revoke {card['id']} ({promo.data.get('version', '')} of {promo.data.get('campaign', '')}, "
        f"contradicted on {bench[:12]}) and restate the rule",
        operations=[
            RemoveCard(op="remove_card", path=card["path"]),
            AddCard(op="add_card", path=card["path"], meta=meta, body=_restated(old_card, stated, p.detail)),
        ],
        mechanism=f"deliver:{card['id']}@",
        source_items=p.items[:MAX_SOURCE_ITEMS],
    )


def helped_elsewhere(g: EvidenceGraph, decisions: list[Node], now: Expiry) -> list[list[Any]]:
    """Findings (owner, kind, tool, rule id) whose plan another campaign's gate accepted with the current model on
    other evidence (another benchmark digest), in the order they were accepted; not those a person revoked."""
    revoked, flagged = g.revoked(), g.flagged()
    promos = {n.data.get("plan_key"): n for n in g.nodes("decision") if n.data.get("type") == "promotion"}
    out: list[list[Any]] = []  # [owner, kind, tool, rule id] as the claims record them
    for v in sorted(
        (
            n
            for n in decisions
            if n.data.get("type") == "gate_verdict"
            and n.data.get("accept")
            and n.data.get("model") == now.model
            and n.data.get("benchmark_digest") != now.benchmark
        ),
        key=lambda n: n.created,
    ):
        promo = promos.get(v.data.get("plan_key"))
        if promo is None or promo.id in flagged or (promo.id in revoked and revoked[promo.id].get("by") != "gate"):
            continue
        pn = g.get(node_id("decision", f"plan:{v.data.get('plan_key')}"))
        for e in g.edges(dst=pn.id, relation="used_in") if pn is not None else []:
            c = g.get(e.src)
            if c is not None and c.kind == "claim":
                sig = [c.data.get("owner"), c.data.get("kind"), c.data.get("tool"), c.data.get("rule_id") or ""]
                if sig not in out:
                    out.append(sig)
    return out


def reusable(
    g: EvidenceGraph, decisions: list[Node], packets: list[EvidencePacket], package, now: Expiry, skip: set[str]
) -> list[tuple[Any, Node]]:
    """Plans another campaign's gate accepted on this very evidence (benchmark digest and model) that apply to
    `package` as they are and that a current packet calls for: (plan, accepting verdict), in the order they were
    accepted. Each is the recorded change itself (same operations, so the same plan key), bound to the current packet
    of the same finding (owner, kind, write, rule; else the same owner and write), which gives it its rationale, cited
    evidence and the source items its repair screen runs on. A plan whose promotion a person revoked (or that derives
    from a revoked node) is not reused; one the gate revoked on other evidence still stands on this evidence."""
    revoked, flagged = g.revoked(), g.flagged()
    promos = {n.data.get("plan_key"): n for n in g.nodes("decision") if n.data.get("type") == "promotion"}
    found: list[tuple[tuple, Any, Node]] = []
    seen: set[str] = set(skip)
    live = [p for p in packets if p.patchable]
    for v in _accepted_here(decisions, now):
        key = v.data.get("plan_key") or ""
        promo = promos.get(key)
        if not key or key in seen or promo is None or promo.id in flagged:
            continue
        if promo.id in revoked and revoked[promo.id].get("by") != "gate":
            continue
        plan = _reused_plan(g, key, v, promo, live)
        if plan is None or not _applies(plan, package):
            continue
        seen.add(key)
        found.append(((0, v.created), plan, v))
    return [(plan, v) for _, plan, v in sorted(found, key=lambda t: t[0])]


def _accepted_here(decisions: list[Node], now: Expiry) -> list[Node]:
    """The gate verdicts among `decisions` that accepted on this very evidence (benchmark digest and model), oldest
    first."""
    return sorted(
        (
            n
            for n in decisions
            if n.data.get("type") == "gate_verdict"
            and n.data.get("accept")
            and n.data.get("model") == now.model
            and n.data.get("benchmark_digest") == now.benchmark
        ),
        key=lambda n: n.created,
    )


def _reused_plan(g: EvidenceGraph, key: str, v: Node, promo: Node, live: list[EvidencePacket]) -> Any:
    """The plan that verdict `v` accepted, rebuilt with its recorded operations and bound to the current packet of
    the same finding; None when its plan or claim is not recorded, nothing here calls for it, or it no longer
    rebuilds to the same plan key."""
    from components.evolution.plan import Plan

    pn = g.get(node_id("decision", f"plan:{key}"))
    if pn is None:
        return None
    claim = next(
        (
            g.get(e.src)
            for e in g.edges(dst=pn.id, relation="used_in")
            if (c := g.get(e.src)) is not None and c.kind == "claim"
        ),
        None,
    )
    if claim is None:
        return None
    sig = (claim.data.get("owner"), claim.data.get("kind"), claim.data.get("tool"), claim.data.get("rule_id"))
    bound = min(
        (p for p in live if (p.owner, p.tool) == (sig[0], sig[2])),
        default=None,
        key=lambda p: ((p.owner, p.kind, p.tool, p.rule_id) != sig, -len(p.episodes), p.id),
    )
    if bound is None:
        return None  # nothing here calls for it: the failure it fixed is not among the current clusters
    ops = json.loads(json.dumps(pn.data.get("operations") or []))
    for o in ops:
        if o.get("op") == "add_card":
            o.setdefault("meta", {})["source"] = (
                f"plan {key} accepted on {str(v.data.get('benchmark_digest'))[:12]}"
                f" ({v.id}), reused for diagnosis {bound.id}"
            )
    try:
        plan = Plan(
            owner=pn.data["owner"],
            cluster=bound.id,
            rationale=bound.claims[0].statement,
            evidence=bound.citations(),
            operations=ops,
            mechanism=pn.data.get("mechanism", ""),
            summary=f"{pn.content.split(' (accepted on ')[0]} (accepted on "
            f"{str(v.data.get('benchmark_digest'))[:12]} by "
            f"{promo.data.get('campaign', '')}; reused)",
            source_items=bound.items[:12],
        )
    except (ValueError, KeyError):
        return None
    return plan if plan.key() == key else None  # else not the recorded change after all (a schema moved on)


def _applies(plan: Any, package) -> bool:
    """Whether `plan` applies to this package as it is (a card it adds is not there yet, one it removes is)."""
    import tempfile

    from components.evolution.patch import PatchError, apply_plan

    with tempfile.TemporaryDirectory() as tmp:
        try:
            apply_plan(plan, package.root, Path(tmp) / "candidate")
        except PatchError:
            return False
    return True


def project(
    g: EvidenceGraph, packets: list[EvidencePacket], now: Expiry, max_chars: int, among: set[str] | None = None
) -> dict:
    """The budgeted projection: compact records with ids (so deeper evidence can be fetched), most decisive first:
    verdicts on plans for the current clusters' tools, contested nodes, open questions, promotions in force. Expired
    records are left out; what did not fit is counted, never silently cut. Its serialized length (compact separators)
    is at most `max_chars` (when that holds the empty wrapper, ~80 chars)."""
    tools = {p.tool for p in packets}
    revoked, flagged = g.revoked(), g.flagged()
    nodes = [n for n in g.nodes() if n.id not in revoked and (among is None or n.id in among)]
    live = [n for n in nodes if not g.expired(n, now)]

    def shown(n: Node) -> dict:
        # a record derived from a revoked node says so: its recorded confidence no longer stands on its own
        return {**n.compact(), "flagged": flagged[n.id]} if n.id in flagged else n.compact()

    ranked = [
        (
            "verdicts",
            {
                **shown(n),
                "plan_key": n.data.get("plan_key"),
                "accept": n.data.get("accept"),
                "stage": n.data.get("stage"),
                "same_evidence": here,
            },
        )
        for _, _, n, here in sorted(_verdicts(g, nodes, tools, now), key=lambda t: (t[0], t[1], -t[2].created))
    ]
    ranked += [("contested", shown(n)) for n in live if n.confidence == "contested"]
    still_open = {q.id for q in open_questions(g, now)}
    ranked += [("open_questions", shown(n)) for n in live if n.id in still_open]
    ranked += [
        ("promotions", {**n.compact(), "flagged": flagged.get(n.id, False)})
        for n in nodes
        if n.data.get("type") == "promotion"
    ]
    return _within(ranked, max_chars)


def _verdicts(g: EvidenceGraph, nodes: list[Node], tools: set[str], now: Expiry) -> list[tuple[int, int, Node, bool]]:
    """The gate verdicts among `nodes`, each with its rank keys (on this evidence first, then those whose plan's cards
    act on the current clusters' tools) and whether it was reached on this evidence. Verdicts on other evidence are
    kept: a plan rejected elsewhere may be retried, knowingly."""
    verdicts = []
    for n in nodes:
        if n.data.get("type") in ("gate_verdict",):
            here = not g.expired(n, now)
            plan = g.get(node_id("decision", f"plan:{n.data.get('plan_key', '')}"))
            touches = plan is not None and any((c.get("tool") in tools) for c in plan.data.get("cards") or [])
            verdicts.append((0 if here else 1, 0 if touches else 1, n, here))
    return verdicts


def _within(ranked: list[tuple[str, dict]], max_chars: int) -> dict:
    """The ranked records by section, as many as fit in `max_chars`, with the count of those left out."""
    sections: dict[str, list[dict]] = {"verdicts": [], "contested": [], "open_questions": [], "promotions": []}
    # the limit counts what is emitted: the wrapper (its omitted count at most len(ranked)) plus each record and a
    # comma (one too many per non-empty section: it errs short, never over); the empty wrapper is always emitted
    used, omitted = len(json.dumps({**sections, "omitted": len(ranked)}, separators=(",", ":"))), 0
    for sec, item in ranked:
        size = len(json.dumps(item, separators=(",", ":"))) + 1
        if used + size > max_chars:
            omitted += 1
            continue
        sections[sec].append(item)
        used += size
    return {**sections, "omitted": omitted}
