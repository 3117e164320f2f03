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

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from components.codes import Owner
from components.evolution.record import RoundRecord
from components.env import default_db  # noqa: F401 (re-exported: where the graph lives is the environment's say)
from components.evidence.graph import EvidenceGraph, Expiry, Node
from components.evidence.graph_policy import PolicyError
from components.evidence.packets import EvidencePacket
from components.io import confined

# the parts of memory that live in their own modules, re-exported: callers import them from here
from components.evidence.graph_claims import (
    MAX_CITES,  # noqa: F401
    _packet_claim,
    _read,
    _stated,
    answer_questions,  # noqa: F401
    model_id,  # noqa: F401
    open_questions,  # noqa: F401
    trace_resolver,
)
from components.evidence.graph_memory import (
    Memory,
    helped_elsewhere,  # noqa: F401
    plan_memory,
    project,  # noqa: F401
    reusable,  # noqa: F401
)
from components.evidence.graph_why import campaign_chains, chain, chain_text, promotions_for  # noqa: F401


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
    packets = [EvidencePacket.model_validate(x) for x in (_read(rd / "diagnosis.json") or [])]
    plan = _read(rd / "plan.json")
    r = _recording(g, out, rec, model, meta, rd / "train" / "traces.parquet" if packets else None)
    with g.batch():  # the round's memory lands whole or not at all
        src_bench = g.add(
            "source", f"benchmark:{r.bench}", f"benchmark {r.bench[:12]}", {"type": "benchmark", "digest": r.bench}
        )
        src_parent = g.add(
            "source",
            f"package:{r.parent}",
            f"package {rec.parent.version if rec.parent else ''} {r.parent[:12]}",
            {"type": "package", "digest": r.parent},
        )
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
            _rejection(r, key, verdict)
        _contest(r, key, verdict)
    return r.counts


def _recording(g: EvidenceGraph, out: Path, rec: RoundRecord, model: str, meta: dict, tp: Path | None) -> _Recording:
    """What recording the round needs: its benchmark and parent digests (the lineage's, else the train evaluation's)
    and the resolver of the train traces `tp` (None: no packets to verify)."""
    bench = rec.benchmark_digest or meta.get("benchmark_digest", "")
    traces = pd.read_parquet(tp) if tp is not None and tp.is_file() else None
    return _Recording(
        g,
        out,
        rec,
        bench,
        (rec.parent.digest if rec.parent else "") or meta.get("package_digest", ""),
        model,
        Expiry(benchmark=bench, model=model),
        trace_resolver(traces) if traces is not None else None,
        {"claims": 0, "supported": 0, "questions": 0},
    )


def _rejection(r: _Recording, key: str, verdict: Node) -> None:
    """A rejected plan's rejection, at the stage that decided it."""
    rej = r.g.add(
        "decision",
        f"rejection:{key}:{r.bench}:{r.model}",
        f"rejected at the {_stage(r.rec)}: {r.rec.reason}"[:1000],
        {"type": "rejection", "plan_key": key, "stage": _stage(r.rec), "benchmark_digest": r.bench, "model": r.model},
        expiry=r.expiry,
    )
    r.g.link(rej.id, "derived_from", verdict.id)


def _contest(r: _Recording, key: str, verdict: Node) -> None:
    """The same plan judged both ways on other evidence: a contested branch, both verdicts kept."""
    for other in r.g.nodes("decision"):
        d = other.data
        if (
            d.get("type") == "gate_verdict"
            and d.get("plan_key") == key
            and other.id != verdict.id
            and bool(d.get("accept")) != r.rec.accepted
            and d.get("benchmark_digest") != r.bench
        ):
            r.g.link(verdict.id, "contradicts", other.id)


def _stage(rec: RoundRecord) -> str:
    """The stage that decided the round's plan."""
    return "gate" if rec.gate else "repair" if rec.repair else "validate"


def _train_run(r: _Recording, meta: dict, src_bench: Node, src_parent: Node) -> Node:
    """The train evaluation the round's claims were read from."""
    run = r.g.add(
        "run",
        f"eval:{meta.get('corpus', '')}:{r.model}",
        f"train evaluation of {r.parent[:12]} on {r.bench[:12]} with {r.model}",
        {
            "split": "train",
            "package_digest": r.parent,
            "benchmark_digest": r.bench,
            "model": r.model,
            "seeds": meta.get("seeds"),
            "round_dir": r.rec.round_dir,
        },
        expiry=r.expiry,
    )
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
            q = g.add(
                "question",
                f"unknown:{p.kind}:{p.tool}:{r.bench}",
                f"unexplained failures: {p.kind} on {p.tool} ({len(p.episodes)} episodes)",
                {"kind": p.kind, "tool": p.tool, "benchmark_digest": r.bench, "packet": p.id},
                expiry=r.expiry,
            )
            g.link(q.id, "derived_from", c.id)
            asking.add(c.id)
            counts["questions"] += 1
    counts["answered"] = answer_questions(g, [c for c in claims.values() if c.id not in asking], r.expiry)
    return claims


def _plan_decision(
    r: _Recording, plan: dict, key: str, claims: dict[str, Node], packets: list[EvidencePacket], src_parent: Node
) -> tuple[list[dict], Node]:
    """The plan as a decision (with the cards it adds), used by the claim of the cluster it answers."""
    about = claims.get(plan["cluster"])
    cards = [
        {
            "path": o["path"],
            "id": Path(o["path"]).stem,
            "tool": ((o.get("meta") or {}).get("trigger") or {}).get("tool"),
            "rule": about.data.get("detail", "") if about is not None else "",
            "rule_id": about.data.get("rule_id") if about is not None else None,
            "rules": _stated(o.get("body") or "", packets),
        }
        for o in plan["operations"]
        if o["op"] == "add_card"
    ]
    pn = r.g.add(
        "decision",
        f"plan:{key}",
        plan["summary"],
        {
            "type": "plan",
            "plan_key": key,
            "owner": plan["owner"],
            "mechanism": plan["mechanism"],
            "operations": plan["operations"],
            "cards": cards,
        },
        author="meta_agent",
    )
    if about is not None:
        r.g.link(about.id, "used_in", pn.id)
    r.g.link(src_parent.id, "used_in", pn.id)
    return cards, pn


def _gate_verdict(r: _Recording, key: str, pn: Node, src_bench: Node) -> Node:
    """The verdict of the stage that decided the plan, with the gate's figures when it reached the gate."""
    gate = r.rec.gate
    verdict = r.g.add(
        "decision",
        f"verdict:{key}:{r.parent}:{r.bench}:{r.model}",
        r.rec.reason[:1000],
        {
            "type": "gate_verdict",
            "stage": _stage(r.rec),
            "accept": r.rec.accepted,
            "plan_key": key,
            "benchmark_digest": r.bench,
            "model": r.model,
            "parent_digest": r.parent,
            **(
                {k: getattr(gate, k) for k in ("net", "ci_lo", "ci_hi", "n_items", "n_improved", "n_regressed")}
                if gate
                else {}
            ),
        },
        expiry=r.expiry,
    )
    r.g.link(verdict.id, "derived_from", pn.id)
    r.g.link(src_bench.id, "used_in", verdict.id)
    return verdict


def _promotion(
    r: _Recording,
    plan: dict,
    key: str,
    cards: list[dict],
    claims: dict[str, Node],
    pn: Node,
    verdict: Node,
    memory: dict,
) -> None:
    """An accepted plan's promotion (revoking the promotion it revises), or a question when memory cannot vouch."""
    g, rec, child = r.g, r.rec, r.rec.committed
    support = [claims[plan["cluster"]].id] if plan["cluster"] in claims else []
    revoked = (memory.get("revocations") or {}).get(key)
    if revoked and g.get(revoked) is not None:  # a revocation plan passed the gate: the old promotion goes
        g.revoke(
            revoked, f"revoked through the gate in round {rec.round} of {g.campaign}: {plan['summary']}", by="gate"
        )
    for s in support:  # a contest this gate verdict settles on the current evidence (rule 4)
        if (n := g.get(s)) is not None and n.confidence == "contested" and r.resolve is not None:
            try:
                g.settle(s, r.resolve, r.expiry)
            except PolicyError:
                pass  # still contested: the promotion below is refused and becomes a question
    try:
        promo = g.promote(
            f"promotion:{child.digest}",
            f"{child.version}: {plan['summary']}",
            verdict.id,
            support,
            {
                "version": child.version,
                "digest": child.digest,
                "plan_key": key,
                "round": rec.round,
                "campaign": g.campaign,
                "out": str(r.out.resolve()),
                "benchmark_digest": r.bench,
                "model": r.model,
                "parent_digest": r.parent,
                "cards": cards,
                "owner": plan["owner"],
            },
        )
    except PolicyError as e:  # the lineage committed it, but memory will not vouch for it: ask, do not claim
        q = g.add(
            "question",
            f"unsupported-promotion:{child.digest}",
            f"{child.version} was committed without a claim whose citations resolve ({e})",
            {"version": child.version},
            expiry=r.expiry,
        )  # asked about this evidence: it expires with the digest
        g.link(q.id, "derived_from", verdict.id)
        r.counts["questions"] += 1
        return
    g.link(pn.id, "used_in", promo.id)
    r.counts["answered"] += answer_questions(g, [promo], r.expiry)
    src_child = g.add(
        "source",
        f"package:{child.digest}",
        f"package {child.version} {child.digest[:12]}",
        {"type": "package", "digest": child.digest},
    )
    g.link(src_child.id, "derived_from", promo.id)
    if revoked and g.get(revoked) is not None:
        g.link(promo.id, "supersedes", revoked)


# -- the campaign's calls (one per round each; flows/campaign.py) ------------------------------------------------------


def open_graph(evidence, campaign: str, out: str | Path | None = None, check: bool = False) -> EvidenceGraph:
    """The graph, writing as this campaign; its scope (which records are its own) is its output directory. `check`:
    read every page first (a campaign's start), so a damaged graph is refused before the first round."""
    scope = f"{campaign}@{Path(out).resolve()}" if out is not None else campaign
    return EvidenceGraph(default_db(evidence.db), campaign=campaign, scope=scope, check=check)


def memory_for_round(
    evidence,
    campaign: str,
    packets: list[EvidencePacket],
    traces: pd.DataFrame,
    package: str,
    bench: str,
    model: str,
    out: str | Path | None = None,
) -> Memory:
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
