"""What a campaign writes into its memory, and what the meta-agent reads back before planning.

    record_round    once per finished round, from what the round left on disk (like the MLflow log, so a resumed
                    round records the same nodes again, which the graph turns into no-ops):
                      sources    the benchmark digest, the parent package (and the child, when promoted)
                      run        the train evaluation (tied to benchmark digest and model: it expires with them)
                      claims     each diagnosis packet, its cited trace steps as artifacts, verified against the
                                 round's traces (policy rule 2); `unknown` packets become open questions, and
                                 a later supported finding on the same kind and tool, or a promotion whose card
                                 acts on that tool, answers them (answer --supersedes--> question); a question
                                 expires with its benchmark digest and model
                      decisions  the plan, the verdict of the stage that decided it (validate, repair screen or gate),
                                 a promotion (policy rule 3) or a rejection; the same plan accepted on one benchmark
                                 digest and rejected on another contradict each other (rule 4)
    plan_memory     before planning: the budgeted projection (earlier verdicts on the same plan keys, contested
                    nodes, open questions, promotions in force), the plan keys already rejected on the same evidence
                    (same plan key, benchmark digest and model: not retried; other evidence: may be), and
                    revocation plans for promotions whose support the current data contradicts.
    chain           `ratchet evidence why`: a promotion back to its verdict, plan, claims, trace steps and sources.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from components.codes import FindingKind, Owner
from components.defaults import MAX_SOURCE_ITEMS
from components.evolution.record import RoundRecord, StartRecord
from components.env import default_db  # noqa: F401 (re-exported: where the graph lives is the environment's say)
from components.evidence.graph import EvidenceGraph, Expiry, Node, node_id
from components.evidence.graph_policy import CitationError, PolicyError
from components.evidence.packets import EvidencePacket
from components.io import confined
from components.runtime.trace import frame_steps

MAX_CITES = 8  # trace steps recorded per packet: enough to audit it; the round's diagnosis.json keeps them all




def model_id(model: str, model_cfg: dict) -> str:
    name = model_cfg.get("model")
    return f"{model}:{name}" if name else model


def trace_resolver(traces: pd.DataFrame):
    """(episode, step) -> the step's recorded hash, or None; a step whose content no longer hashes to its recorded
    hash resolves to a marker that matches nothing."""
    index = {(r.episode_id, int(r.step)): i for i, r in enumerate(traces[["episode_id", "step"]].itertuples(index=False))}

    def resolve(ep: str, step: int) -> str | None:
        at = index.get((ep, step))
        if at is None:
            return None
        s = frame_steps(traces.iloc[[at]])[0]
        return s.hash if s.content_hash() == s.hash else "content-changed"

    return resolve


def _read(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def _stated(body: str, packets: list[EvidencePacket]) -> list[dict]:
    """The rules (id, statement) of the round's packets that a card's body states word for word."""
    text = " ".join(body.split())
    got: dict[str, str] = {}
    for p in packets:
        if p.rule_id and p.detail.strip() and " ".join(p.detail.split()) in text:
            got.setdefault(p.rule_id, p.detail.strip())
    return [{"rule_id": k, "rule": v} for k, v in got.items()]


def _restated(card, old: str | None, new: str) -> str:
    """The card's body with its statement of a rule replaced by the rule as the world states it now (its other
    rules and guidance kept); the new statement alone when the card cannot be read or does not state it verbatim."""
    body, old = (card.body.strip() if card is not None else ""), (old or "").strip()
    return body.replace(old, new.strip()) if old and old in body else new.strip()


def _packet_claim(g: EvidenceGraph, p: EvidencePacket, bench: str, model: str, resolve, run: Node | None) -> Node:
    """A packet as a claim (keyed by what it says and what it rests on), its citations, verified when they resolve."""
    # keyed by the corpus its citations resolve against (package, benchmark, seed map) and by what it says: the
    # same finding on another package's traces is another claim, with citations of its own
    key = f"packet:{p.corpus}:{model}:{p.owner}:{p.kind}:{p.tool}:{p.detail.strip()}"
    text = f"{p.owner}/{p.kind} on {p.tool}: " + " ".join(c.statement for c in p.claims)
    c = g.add("claim", key, text[:2000], {"owner": p.owner, "kind": p.kind, "tool": p.tool, "rule_id": p.rule_id,
                                           "detail": p.detail, "packet": p.id, "n_episodes": len(p.episodes), "items": p.items[:12],
                                           "benchmark_digest": bench, "model": model},
              author="harness", expiry=Expiry(benchmark=bench, model=model))
    for cite in p.citations()[:MAX_CITES]:
        g.cite(c.id, cite.episode_id, cite.step, cite.hash)
    if run is not None:
        g.link(c.id, "derived_from", run.id)
    if resolve is not None and c.confidence == "unverified":
        try:
            c = g.verify(c.id, resolve)
        except CitationError:
            pass  # stays unverified: the policy refused it, and an unverified claim carries no promotion
    return c


@dataclass
class _Recording:
    """What recording one round's memory needs at every step: the graph, the round, and what it was evaluated on."""
    g: EvidenceGraph
    out: Path
    rec: RoundRecord
    bench: str  # the benchmark's digest
    parent: str  # the champion's digest
    model: str
    expiry: Expiry
    resolve: Callable | None  # the train traces' citation resolver (None: no traces)
    counts: dict[str, int]


def record_round(g: EvidenceGraph, out: str | Path, rec: RoundRecord | dict, model: str) -> dict:
    """Record one finished round (its lineage record `rec`, its round directory under `out`); returns counts."""
    out, rec = Path(out), RoundRecord.of(rec)
    # the round's directory under this campaign's rounds/, never a place a record names outside it
    rd = confined(out / "rounds", Path(rec.round_dir).name, f"{out / 'lineage'}: round_dir") if rec.round_dir else None
    if rd is None or not rd.is_dir():
        return {}
    meta = _read(rd / "train" / "meta.json") or {}
    bench = rec.benchmark_digest or meta.get("benchmark_digest", "")
    packets = [EvidencePacket.model_validate(x) for x in (_read(rd / "diagnosis.json") or [])]
    plan = _read(rd / "plan.json")
    tp = rd / "train" / "traces.parquet"
    traces = pd.read_parquet(tp) if tp.is_file() and packets else None
    r = _Recording(g, out, rec, bench, (rec.parent.digest if rec.parent else "") or meta.get("package_digest", ""), model,
                   Expiry(benchmark=bench, model=model), trace_resolver(traces) if traces is not None else None,
                   {"claims": 0, "supported": 0, "questions": 0})
    with g.batch():  # the round's memory lands whole or not at all
        src_bench = g.add("source", f"benchmark:{bench}", f"benchmark {bench[:12]}", {"type": "benchmark", "digest": bench})
        src_parent = g.add("source", f"package:{r.parent}", f"package {rec.parent.version if rec.parent else ''} "
                           f"{r.parent[:12]}", {"type": "package", "digest": r.parent})
        run = _train_run(r, meta, src_bench, src_parent) if meta else None
        claims = _round_claims(r, packets, run)
        if plan is None:
            return r.counts
        key = rec.plan_key or ""
        cards, pn = _plan_decision(r, plan, key, claims, packets, src_parent)
        verdict = _gate_verdict(r, key, pn, src_bench)
        if rec.accepted:
            _promotion(r, plan, key, cards, claims, pn, verdict, _read(rd / "memory.json") or {})
        else:
            rej = g.add("decision", f"rejection:{key}:{bench}:{model}", f"rejected at the {_stage(rec)}: "
                        f"{rec.reason}"[:1000], {"type": "rejection", "plan_key": key, "stage": _stage(rec),
                                                 "benchmark_digest": bench, "model": model},
                        expiry=r.expiry)
            g.link(rej.id, "derived_from", verdict.id)
        # the same plan judged both ways on other evidence: a contested branch, both verdicts kept
        for other in g.nodes("decision"):
            d = other.data
            if d.get("type") == "gate_verdict" and d.get("plan_key") == key and other.id != verdict.id and \
                    bool(d.get("accept")) != rec.accepted and d.get("benchmark_digest") != bench:
                g.link(verdict.id, "contradicts", other.id)
    return r.counts


def _stage(rec: RoundRecord) -> str:
    """The stage that decided the round's plan."""
    return "gate" if rec.gate else "repair" if rec.repair else "validate"


def _train_run(r: _Recording, meta: dict, src_bench: Node, src_parent: Node) -> Node:
    """The train evaluation the round's claims were read from."""
    run = r.g.add("run", f"eval:{meta.get('corpus', '')}:{r.model}", f"train evaluation of {r.parent[:12]} on "
                  f"{r.bench[:12]} with {r.model}", {"split": "train", "package_digest": r.parent,
                                                     "benchmark_digest": r.bench, "model": r.model,
                                                     "seeds": meta.get("seeds"), "round_dir": r.rec.round_dir},
                  expiry=r.expiry)
    r.g.link(src_bench.id, "used_in", run.id)
    r.g.link(src_parent.id, "used_in", run.id)
    return run


def _round_claims(r: _Recording, packets: list[EvidencePacket], run: Node | None) -> dict[str, Node]:
    """A claim per packet (verified against the traces where they resolve), a question per unexplained one."""
    g, counts = r.g, r.counts
    claims: dict[str, Node] = {}
    asking: set[str] = set()  # claims that are themselves unexplained: they answer nothing
    for p in packets:
        c = _packet_claim(g, p, r.bench, r.model, r.resolve, run)
        claims[p.id] = c
        counts["claims"] += 1
        counts["supported"] += c.confidence == "supported"
        if p.owner == Owner.UNKNOWN or (p.opportunity == "unknown" and p.patchability == "unknown"):
            q = g.add("question", f"unknown:{p.kind}:{p.tool}:{r.bench}", f"unexplained failures: {p.kind} on "
                      f"{p.tool} ({len(p.episodes)} episodes)", {"kind": p.kind, "tool": p.tool,
                                                                  "benchmark_digest": r.bench, "packet": p.id},
                      expiry=r.expiry)
            g.link(q.id, "derived_from", c.id)
            asking.add(c.id)
            counts["questions"] += 1
    counts["answered"] = answer_questions(g, [c for c in claims.values() if c.id not in asking], r.expiry)
    return claims


def _plan_decision(r: _Recording, plan: dict, key: str, claims: dict[str, Node], packets: list[EvidencePacket],
                   src_parent: Node) -> tuple[list[dict], Node]:
    """The plan as a decision (with the cards it adds), used by the claim of the cluster it answers."""
    about = claims.get(plan["cluster"])
    cards = [{"path": o["path"], "id": Path(o["path"]).stem, "tool": ((o.get("meta") or {}).get("trigger") or {})
              .get("tool"), "rule": about.data.get("detail", "") if about is not None else "",
              "rule_id": about.data.get("rule_id") if about is not None else None,
              "rules": _stated(o.get("body") or "", packets)}
             for o in plan["operations"] if o["op"] == "add_card"]
    pn = r.g.add("decision", f"plan:{key}", plan["summary"], {"type": "plan", "plan_key": key, "owner": plan["owner"],
                 "mechanism": plan["mechanism"], "operations": plan["operations"], "cards": cards},
                 author="meta_agent")
    if about is not None:
        r.g.link(about.id, "used_in", pn.id)
    r.g.link(src_parent.id, "used_in", pn.id)
    return cards, pn


def _gate_verdict(r: _Recording, key: str, pn: Node, src_bench: Node) -> Node:
    """The verdict of the stage that decided the plan, with the gate's figures when it reached the gate."""
    gate = r.rec.gate
    verdict = r.g.add("decision", f"verdict:{key}:{r.parent}:{r.bench}:{r.model}", r.rec.reason[:1000],
                      {"type": "gate_verdict", "stage": _stage(r.rec), "accept": r.rec.accepted, "plan_key": key,
                       "benchmark_digest": r.bench, "model": r.model, "parent_digest": r.parent,
                       **({k: getattr(gate, k) for k in ("net", "ci_lo", "ci_hi", "n_items", "n_improved",
                                                          "n_regressed")} if gate else {})}, expiry=r.expiry)
    r.g.link(verdict.id, "derived_from", pn.id)
    r.g.link(src_bench.id, "used_in", verdict.id)
    return verdict


def _promotion(r: _Recording, plan: dict, key: str, cards: list[dict], claims: dict[str, Node], pn: Node,
               verdict: Node, memory: dict) -> None:
    """An accepted plan's promotion (revoking the promotion it revises), or a question when memory cannot vouch."""
    g, rec, child = r.g, r.rec, r.rec.committed
    support = [claims[plan["cluster"]].id] if plan["cluster"] in claims else []
    revoked = (memory.get("revocations") or {}).get(key)
    if revoked and g.get(revoked) is not None:  # a revocation plan passed the gate: the old promotion goes
        g.revoke(revoked, f"revoked through the gate in round {rec.round} of {g.campaign}: "
                          f"{plan['summary']}", by="gate")
    for s in support:  # a contest this gate verdict settles on the current evidence (rule 4)
        if (n := g.get(s)) is not None and n.confidence == "contested" and r.resolve is not None:
            try:
                g.settle(s, r.resolve, r.expiry)
            except PolicyError:
                pass  # still contested: the promotion below is refused and becomes a question
    try:
        promo = g.promote(f"promotion:{child.digest}", f"{child.version}: {plan['summary']}", verdict.id,
                          support, {"version": child.version, "digest": child.digest, "plan_key": key,
                                    "round": rec.round, "campaign": g.campaign, "out": str(r.out.resolve()),
                                    "benchmark_digest": r.bench, "model": r.model, "parent_digest": r.parent,
                                    "cards": cards, "owner": plan["owner"]})
    except PolicyError as e:  # the lineage committed it, but memory will not vouch for it: ask, do not claim
        q = g.add("question", f"unsupported-promotion:{child.digest}", f"{child.version} was committed "
                  f"without a claim whose citations resolve ({e})", {"version": child.version},
                  expiry=r.expiry)  # asked about this evidence: it expires with the digest
        g.link(q.id, "derived_from", verdict.id)
        r.counts["questions"] += 1
        return
    g.link(pn.id, "used_in", promo.id)
    r.counts["answered"] += answer_questions(g, [promo], r.expiry)
    src_child = g.add("source", f"package:{child.digest}", f"package {child.version} {child.digest[:12]}",
                      {"type": "package", "digest": child.digest})
    g.link(src_child.id, "derived_from", promo.id)
    if revoked and g.get(revoked) is not None:
        g.link(promo.id, "supersedes", revoked)


# -- open questions ----------------------------------------------------------------------------------------------------

def open_questions(g: EvidenceGraph, now: Expiry | None) -> list[Node]:
    """Questions still open: not revoked, not answered (no `supersedes` edge into them from the finding or promotion
    that explains them) and not expired for the current evidence (`now`: benchmark digest and model; None: unknown,
    nothing expires)."""
    revoked = g.revoked()
    answered = {e.dst for e in g.edges(relation="supersedes")}
    return [q for q in g.nodes("question") if q.id not in revoked and q.id not in answered and not g.expired(q, now)]


def answer_questions(g: EvidenceGraph, answers: list[Node], now: Expiry) -> int:
    """Close the open questions on the current evidence that `answers` explain, by an edge answer --supersedes-->
    question (the question stays, with its answer): a supported finding of the same kind on the same tool (a later
    diagnosis told what the unexplained failures were), or a promotion whose card acts on that tool. Returns how many."""
    n = 0
    for q in open_questions(g, now):
        kind, tool = q.data.get("kind"), q.data.get("tool")
        if kind is None:
            continue  # a question about one promotion: it only expires
        by = next((a for a in answers if a.kind == "claim" and a.confidence == "supported"
                   and (a.data.get("kind"), a.data.get("tool")) == (kind, tool)), None)
        by = by or next((a for a in answers if a.data.get("type") == "promotion"
                         and any(c.get("tool") == tool for c in a.data.get("cards") or [])), None)
        if by is not None:
            g.link(by.id, "supersedes", q.id)
            n += 1
    return n


# -- before planning ---------------------------------------------------------------------------------------------------

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
        return {"rejected_here": self.rejected_here, "rejected_elsewhere": self.rejected_elsewhere,
                "revocations": self.revokes, **({"reused": self.reused} if self.reused else {}),
                "projection": self.projection, "chars": self.chars}


def _in_force(g: EvidenceGraph) -> list[Node]:
    revoked, flagged = g.revoked(), g.flagged()
    return [n for n in g.nodes("decision") if n.data.get("type") == "promotion" and n.id not in revoked
            and n.id not in flagged]


def plan_memory(g: EvidenceGraph, packets: list[EvidencePacket], traces: pd.DataFrame, package, bench: str,
                model: str, max_chars: int = 4000) -> Memory:
    """The projection and the decisions memory makes before planning (see the module docstring)."""
    now = Expiry(benchmark=bench, model=model)
    m = Memory()
    # only what other campaigns recorded: this campaign's own rejections are in its lineage already, and a forced rerun
    # of the same campaign must plan exactly as its first run did (the same bytes for `dvc repro --force`)
    elsewhere = g.from_elsewhere()
    # a decision derived from a revoked node is not evidence any more: no rejection or acceptance stands on it
    # (a person's revocation; the gate's revokes a promotion on other evidence only, see `reusable`)
    by_person = {k for k, r in g.revoked().items() if r.get("by") != "gate"}
    gone = by_person | {k for k, root in g.flagged().items() if root in by_person}
    decisions = [n for n in g.nodes("decision") if n.id in elsewhere and n.id not in gone]
    rejections = [n for n in decisions if n.data.get("type") == "rejection"]
    m.rejected_here = sorted({n.data["plan_key"] for n in rejections if not g.expired(n, now)})
    accepted = {n.data.get("plan_key") for n in decisions if n.data.get("type") == "gate_verdict" and n.data.get("accept")}
    m.rejected_elsewhere = sorted({n.data["plan_key"] for n in rejections} - set(m.rejected_here) - accepted)
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


def _revise_contradicted(g: EvidenceGraph, packets: list[EvidencePacket], traces: pd.DataFrame, package, bench: str,
                         model: str, m: Memory) -> None:
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
    if p.owner != Owner.E or p.kind not in (FindingKind.POLICY_REFUSAL, FindingKind.INEFFECTIVE_CARD) \
            or p.tool != card["tool"] or not p.detail.strip():
        return None
    stated = next((r["rule"] for r in card.get("rules") or [{"rule_id": card.get("rule_id"), "rule": card.get("rule")}]
                   if r.get("rule_id") and r["rule_id"] == p.rule_id), None)
    if stated is None or p.detail.strip() == (stated or "").strip():
        return None
    return stated


def _revocation(promo: Node, card: dict, p: EvidencePacket, package, bench: str, stated: str):
    """The plan that removes a contradicted card and adds it back with its rule restated as packet `p` quotes it."""
    from components.evolution.plan import AddCard, Plan, RemoveCard

    old_card = package.cards.get(card["id"]) or next((x for x in package.cards.values() if x.path == card["path"]), None)
    meta = old_card.meta.model_dump(mode="json", exclude_none=True) if old_card is not None else \
        {"id": card["id"], "type": "procedure", "trigger": {"event": "intent_recorded", "tool": card["tool"]}}
    meta["source"] = f"revision of {promo.id} after diagnosis {p.id} ({len(p.episodes)} refusals)"
    return Plan(owner=Owner.E, cluster=p.id, rationale=p.claims[0].statement, evidence=p.citations(),
                summary=f"E: revoke {card['id']} ({promo.data.get('version', '')} of {promo.data.get('campaign', '')}, "
                        f"contradicted on {bench[:12]}) and restate the rule",
                operations=[RemoveCard(op="remove_card", path=card["path"]),
                            AddCard(op="add_card", path=card["path"], meta=meta,
                                    body=_restated(old_card, stated, p.detail))],
                mechanism=f"deliver:{card['id']}@", source_items=p.items[:MAX_SOURCE_ITEMS])


def helped_elsewhere(g: EvidenceGraph, decisions: list[Node], now: Expiry) -> list[list[Any]]:
    """Findings (owner, kind, tool, rule id) whose plan another campaign's gate accepted with the current model on
    other evidence (another benchmark digest), in the order they were accepted; not those a person revoked."""
    revoked, flagged = g.revoked(), g.flagged()
    promos = {n.data.get("plan_key"): n for n in g.nodes("decision") if n.data.get("type") == "promotion"}
    out: list[list[Any]] = []  # [owner, kind, tool, rule id] as the claims record them
    for v in sorted((n for n in decisions if n.data.get("type") == "gate_verdict" and n.data.get("accept")
                     and n.data.get("model") == now.model and n.data.get("benchmark_digest") != now.benchmark),
                    key=lambda n: n.created):
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


def reusable(g: EvidenceGraph, decisions: list[Node], packets: list[EvidencePacket], package, now: Expiry,
             skip: set[str]) -> list[tuple[Any, Node]]:
    """Plans another campaign's gate accepted on this very evidence (benchmark digest and model) that apply to
    `package` as they are and that a current packet calls for: (plan, accepting verdict), in the order they were
    accepted. Each is the recorded change itself (same operations, so the same plan key), bound to the current packet
    of the same finding (owner, kind, write, rule; else the same owner and write), which gives it its rationale, cited
    evidence and the source items its repair screen runs on. A plan whose promotion a person revoked (or that derives
    from a revoked node) is not reused; one the gate revoked on other evidence still stands on this evidence."""
    import tempfile

    from components.evolution.patch import PatchError, apply_plan
    from components.evolution.plan import Plan

    revoked, flagged = g.revoked(), g.flagged()
    promos = {n.data.get("plan_key"): n for n in g.nodes("decision") if n.data.get("type") == "promotion"}
    found: list[tuple[tuple, Any, Node]] = []
    seen: set[str] = set(skip)
    live = [p for p in packets if p.patchable]
    for v in sorted((n for n in decisions if n.data.get("type") == "gate_verdict" and n.data.get("accept")
                     and n.data.get("model") == now.model and n.data.get("benchmark_digest") == now.benchmark),
                    key=lambda n: n.created):
        key = v.data.get("plan_key") or ""
        promo = promos.get(key)
        if not key or key in seen or promo is None or promo.id in flagged:
            continue
        if promo.id in revoked and revoked[promo.id].get("by") != "gate":
            continue
        pn = g.get(node_id("decision", f"plan:{key}"))
        if pn is None:
            continue
        claim = next((g.get(e.src) for e in g.edges(dst=pn.id, relation="used_in")
                      if (c := g.get(e.src)) is not None and c.kind == "claim"), None)
        if claim is None:
            continue
        sig = (claim.data.get("owner"), claim.data.get("kind"), claim.data.get("tool"), claim.data.get("rule_id"))
        bound = min((p for p in live if (p.owner, p.tool) == (sig[0], sig[2])), default=None,
                    key=lambda p: ((p.owner, p.kind, p.tool, p.rule_id) != sig, -len(p.episodes), p.id))
        if bound is None:
            continue  # nothing here calls for it: the failure it fixed is not among the current clusters
        ops = json.loads(json.dumps(pn.data.get("operations") or []))
        for o in ops:
            if o.get("op") == "add_card":
                o.setdefault("meta", {})["source"] = (f"plan {key} accepted on {str(v.data.get('benchmark_digest'))[:12]}"
                                                      f" ({v.id}), reused for diagnosis {bound.id}")
        try:
            plan = Plan(owner=pn.data["owner"], cluster=bound.id, rationale=bound.claims[0].statement,
                        evidence=bound.citations(), operations=ops, mechanism=pn.data.get("mechanism", ""),
                        summary=f"{pn.content.split(' (accepted on ')[0]} (accepted on "
                                f"{str(v.data.get('benchmark_digest'))[:12]} by "
                                f"{promo.data.get('campaign', '')}; reused)", source_items=bound.items[:12])
        except (ValueError, KeyError):
            continue
        if plan.key() != key:
            continue  # not the recorded change after all (a schema moved on): nothing to reuse
        with tempfile.TemporaryDirectory() as tmp:
            try:  # applies to this package as it is (a card it adds is not there yet, one it removes is)
                apply_plan(plan, package.root, Path(tmp) / "candidate")
            except PatchError:
                continue
        seen.add(key)
        found.append(((0, v.created), plan, v))
    return [(plan, v) for _, plan, v in sorted(found, key=lambda t: t[0])]


def project(g: EvidenceGraph, packets: list[EvidencePacket], now: Expiry, max_chars: int,
            among: set[str] | None = None) -> dict:
    """The budgeted projection: compact records with ids (so deeper evidence can be fetched), most decisive first:
    verdicts on plans for the current clusters' tools, contested nodes, open questions, promotions in force. Expired
    records are left out; what did not fit is counted, never silently cut. Its serialized length (compact separators)
    is at most `max_chars` (when that holds the empty wrapper, ~80 chars)."""
    tools = {p.tool for p in packets}
    revoked, flagged = g.revoked(), g.flagged()
    nodes = [n for n in g.nodes() if n.id not in revoked and (among is None or n.id in among)]
    live = [n for n in nodes if not g.expired(n, now)]
    verdicts = []
    for n in nodes:  # verdicts on other evidence are kept: a plan rejected elsewhere may be retried, knowingly
        if n.data.get("type") in ("gate_verdict",):
            here = not g.expired(n, now)
            plan = g.get(node_id("decision", f"plan:{n.data.get('plan_key', '')}"))
            touches = plan is not None and any((c.get("tool") in tools) for c in plan.data.get("cards") or [])
            verdicts.append((0 if here else 1, 0 if touches else 1, n, here))
    sections: dict[str, list[dict]] = {"verdicts": [], "contested": [], "open_questions": [], "promotions": []}

    def shown(n: Node) -> dict:
        # a record derived from a revoked node says so: its recorded confidence no longer stands on its own
        return {**n.compact(), "flagged": flagged[n.id]} if n.id in flagged else n.compact()

    ranked = [("verdicts", {**shown(n), "plan_key": n.data.get("plan_key"), "accept": n.data.get("accept"),
                            "stage": n.data.get("stage"), "same_evidence": here})
              for _, _, n, here in sorted(verdicts, key=lambda t: (t[0], t[1], -t[2].created))]
    ranked += [("contested", shown(n)) for n in live if n.confidence == "contested"]
    still_open = {q.id for q in open_questions(g, now)}
    ranked += [("open_questions", shown(n)) for n in live if n.id in still_open]
    ranked += [("promotions", {**n.compact(), "flagged": flagged.get(n.id, False)}) for n in nodes
               if n.data.get("type") == "promotion"]
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


# -- why ---------------------------------------------------------------------------------------------------------------

def promotions_for(g: EvidenceGraph, ref: str, campaign: str | None = None) -> list[Node]:
    """The promotions behind a version name (M3), a package digest (prefix), a card path, or a node id."""
    promos = [n for n in g.nodes("decision") if n.data.get("type") == "promotion"
              and (campaign is None or n.data.get("campaign") == campaign)]
    hit = [n for n in promos if ref in (n.id, n.data.get("version")) or
           (len(ref) >= 8 and str(n.data.get("digest", "")).startswith(ref))]
    if hit:
        # a version is its lineage: every promotion up to it, in the campaign that made it
        last = max(hit, key=lambda n: n.created)
        if last.data.get("version") == ref or str(last.data.get("digest", "")).startswith(ref):
            same = [n for n in promos if n.data.get("campaign") == last.data.get("campaign")
                    and n.data.get("round", 0) <= last.data.get("round", 0)]
            return sorted(same, key=lambda n: n.data.get("round", 0))
        return [last]
    path = ref.split("/em/", 1)[-1] if "/em/" in ref else ref
    path = path if path.startswith("em/") else path
    return sorted([n for n in promos if any(c.get("path") == path or c.get("id") == Path(ref).stem
                                            for c in n.data.get("cards") or [])], key=lambda n: n.created)[-1:]


def campaign_chains(g: EvidenceGraph, campaign_dir: str | Path, ref: str) -> list[dict]:
    """The chains behind version `ref` (a version name, a digest prefix, or a card path a promotion wrote) of the
    campaign in `campaign_dir`, found by that campaign's identity, its lineage: every promotion of the lineage up to
    `ref`, each as the graph recorded it for this campaign (the node version of its round, name and output), with
    the gate figures this campaign's lineage records. Campaigns that promoted the same bytes share a promotion node,
    and those that judged the same plan on the same parent share a verdict node, which holds the last one's figures:
    by name alone, `why` put another campaign's figures (a `dvc exp run`'s) inside this one's lineage."""
    from components.evolution.lineage import Lineage

    out = Path(campaign_dir)
    lineage = Lineage(out / "lineage")
    start = next((e for e in lineage.entries() if e.round == 0), None)
    name = str(((start.identity if isinstance(start, StartRecord) else None) or {}).get("campaign.name") or "")
    accepted = [r for r in lineage.rounds() if r.accepted and r.child is not None]
    target = next((r for r in accepted if r.committed.version == ref
                   or (len(ref) >= 8 and r.committed.digest.startswith(ref))), None)
    if target is None:  # a card path (or node id): the promotions that wrote it, among this lineage's
        digests = {r.committed.digest: r for r in accepted}
        hits = [digests[d] for n in promotions_for(g, ref)
                if isinstance(d := n.data.get("digest"), str) and d in digests]
        target = max(hits, key=lambda r: r.round) if hits else None
    if target is None:
        return []
    here = str(out.resolve())
    chains = []
    for rec in (r for r in accepted if r.round <= target.round):
        versions = g.versions(node_id("decision", f"promotion:{rec.committed.digest}"))
        ours = [v for v in versions if v.data.get("round") == rec.round and v.data.get("campaign") == name]
        ours = [v for v in ours if v.data.get("out") == here] or ours  # a moved campaign: its round and name
        if not ours:
            continue  # not recorded in this graph (another evidence.db)
        ch = chain(g, ours[-1])
        if ch["plan"] is not None and rec.summary:  # the plan as this campaign wrote it (another may reword it)
            ch["plan"]["content"] = next((v.content for v in g.versions(ch["plan"]["id"]) if v.content == rec.summary),
                                         ch["plan"]["content"])
        if ch["verdict"] is not None and rec.gate is not None:  # the figures this campaign's gate recorded
            ch["verdict"].update({k: getattr(rec.gate, k) for k in ("net", "ci_lo", "ci_hi", "n_items", "n_improved",
                                                                    "n_regressed")})
        chains.append(ch)
    return chains


def chain(g: EvidenceGraph, promo: Node) -> dict:
    """A promotion's chain: its verdict, plan, claims with their cited trace steps, the run and the sources."""
    revoked, flagged = g.revoked(), g.flagged()

    def mark(n: Node) -> dict:
        d = {"id": n.id, "kind": n.kind, "confidence": n.confidence, "content": n.content}
        if n.id in revoked:
            d["revoked"] = "; ".join(revoked[n.id].get("reasons") or [revoked[n.id]["reason"]])
        if n.id in flagged:
            d["flagged_by"] = flagged[n.id]
        return d

    supports = [g.get(e.src) for e in g.edges(dst=promo.id, relation="supports")]
    verdict = next((n for n in supports if n is not None and n.data.get("type") == "gate_verdict"), None)
    claims = [n for n in supports if n is not None and n.kind == "claim"]
    plan = g.get(node_id("decision", f"plan:{promo.data.get('plan_key', '')}"))
    out: dict[str, Any] = {"promotion": mark(promo), "version": promo.data.get("version"),
                           "campaign": promo.data.get("campaign"), "round": promo.data.get("round"),
                           "cards": [c["path"] for c in promo.data.get("cards") or []],
                           "benchmark_digest": promo.data.get("benchmark_digest"), "model": promo.data.get("model")}
    out["plan"] = {**mark(plan), "plan_key": plan.data.get("plan_key")} if plan else None
    out["verdict"] = {**mark(verdict), **{k: verdict.data.get(k) for k in ("stage", "net", "ci_lo", "ci_hi", "n_items",
                                                                            "n_improved", "n_regressed")}} if verdict else None
    out["claims"] = []
    for c in claims:
        steps = [{"id": a.id, "episode_id": a.data["episode_id"], "step": a.data["step"], "hash": a.data["hash"]}
                 for a in g.citations(c.id)]
        contra = [e.src if e.dst == c.id else e.dst for e in g.edges(relation="contradicts") if c.id in (e.src, e.dst)]
        out["claims"].append({**mark(c), "trace_steps": steps, "contradicted_by": contra})
    out["superseded_by"] = [e.src for e in g.edges(dst=promo.id, relation="supersedes")]
    return out


def chain_text(ch: dict) -> list[str]:
    """The chain as lines a person reads (the CLI prints them; MLflow gets them as an artifact)."""
    p = ch["promotion"]
    lines = [f"{ch['version']} (campaign {ch['campaign']}, round {ch['round']}): {p['content']}  [{p['id']}]"]
    if p.get("revoked"):
        lines.append(f"  REVOKED: {p['revoked']}")
    if p.get("flagged_by"):
        lines.append(f"  FLAGGED: derived from revoked {p['flagged_by']}")
    for s in ch.get("superseded_by") or []:
        lines.append(f"  superseded by {s}")
    if ch["cards"]:
        lines.append("  cards: " + ", ".join(ch["cards"]))
    if ch["plan"]:
        pl = ch["plan"]
        state = f" ({_standing(pl)})" if pl.get("revoked") or pl.get("flagged_by") else ""
        lines.append(f"  plan {pl['plan_key']}{state}: {pl['content']}  [{pl['id']}]")
    for c in ch["claims"]:
        lines.append(f"  packet claim ({_standing(c)}): {c['content'][:200]}  [{c['id']}]")
        for s in c["trace_steps"]:
            lines.append(f"    cites {s['episode_id']} step {s['step']} hash {s['hash'][:12]}")
        for x in c["contradicted_by"]:
            lines.append(f"    contradicted by {x}")
    v = ch["verdict"]
    if v:
        fig = f" net {v['net']:+.3f} CI [{v['ci_lo']:+.3f}, {v['ci_hi']:+.3f}]" if v.get("net") is not None else ""
        lines.append(f"  {v['stage']} verdict ({_standing(v)}):{fig}  [{v['id']}]")
    lines.append(f"  benchmark {str(ch['benchmark_digest'])[:12]}, model {ch['model']}")
    return lines


def _standing(d: dict) -> str:
    """A node's standing as `why` prints it: a revocation, or the revoked node it derives from, over its recorded
    confidence (which was written before the revocation)."""
    if d.get("revoked"):
        return f"REVOKED: {d['revoked']}"
    if d.get("flagged_by"):
        return f"FLAGGED: derived from revoked {d['flagged_by']}; recorded {d['confidence']}"
    return d["confidence"]


# -- the campaign's calls (one per round each; flows/campaign.py) ------------------------------------------------------

def open_graph(evidence, campaign: str, out: str | Path | None = None, check: bool = False) -> EvidenceGraph:
    """The graph, writing as this campaign; its scope (which records are its own) is its output directory. `check`:
    read every page first (a campaign's start), so a damaged graph is refused before the first round."""
    scope = f"{campaign}@{Path(out).resolve()}" if out is not None else campaign
    return EvidenceGraph(default_db(evidence.db), campaign=campaign, scope=scope, check=check)


def memory_for_round(evidence, campaign: str, packets: list[EvidencePacket], traces: pd.DataFrame, package: str,
                     bench: str, model: str, out: str | Path | None = None) -> Memory:
    """What planning reads this round; an empty Memory when `evidence.memory` is off (a stateless campaign)."""
    if not evidence.memory:
        return Memory()
    from components.memory.package import load_package

    with open_graph(evidence, campaign, out) as g:
        return plan_memory(g, packets, traces, load_package(package), bench, model, evidence.projection_chars)


def record_campaign_round(evidence, campaign: str, out: str | Path, rec: RoundRecord, model: str) -> dict:
    with open_graph(evidence, campaign, out) as g:
        return record_round(g, out, rec, model)


def champion_chain(evidence, campaign: str, version: str) -> tuple[str, list[dict]]:
    """The champion's chain (every promotion of its lineage) as text and as records."""
    with open_graph(evidence, campaign) as g:
        chains = [chain(g, n) for n in promotions_for(g, version, campaign=campaign)]
    text = "\n".join(line for ch in chains for line in chain_text(ch)) or f"{version}: no promotion (the start package)"
    return text + "\n", chains
