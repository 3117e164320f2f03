"""`ratchet evidence why`: a promotion back to its verdict, plan, claims, trace steps and sources, and the chains
behind a campaign's version."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from components.evolution.record import RoundRecord, StartRecord
from components.evidence.graph import EvidenceGraph, Node, node_id


def promotions_for(g: EvidenceGraph, ref: str, campaign: str | None = None) -> list[Node]:
    """The promotions behind a version name (M3), a package digest (prefix), a card path, or a node id."""
    promos = [
        n
        for n in g.nodes("decision")
        if n.data.get("type") == "promotion" and (campaign is None or n.data.get("campaign") == campaign)
    ]
    hit = [
        n
        for n in promos
        if ref in (n.id, n.data.get("version")) or (len(ref) >= 8 and str(n.data.get("digest", "")).startswith(ref))
    ]
    return _lineage_up_to(promos, ref, max(hit, key=lambda n: n.created)) if hit else _card_writers(promos, ref)


def _lineage_up_to(promos: list[Node], ref: str, last: Node) -> list[Node]:
    """A version is its lineage: every promotion up to it, in the campaign that made it (a node id: that one alone)."""
    if last.data.get("version") == ref or str(last.data.get("digest", "")).startswith(ref):
        same = [
            n
            for n in promos
            if n.data.get("campaign") == last.data.get("campaign")
            and n.data.get("round", 0) <= last.data.get("round", 0)
        ]
        return sorted(same, key=lambda n: n.data.get("round", 0))
    return [last]


def _card_writers(promos: list[Node], ref: str) -> list[Node]:
    """The last promotion that wrote the card at path `ref` (or with its id)."""
    path = ref.split("/em/", 1)[-1] if "/em/" in ref else ref
    path = path if path.startswith("em/") else path
    return sorted(
        [
            n
            for n in promos
            if any(c.get("path") == path or c.get("id") == Path(ref).stem for c in n.data.get("cards") or [])
        ],
        key=lambda n: n.created,
    )[-1:]


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
    target = _target_round(g, accepted, ref)
    if target is None:
        return []
    here = str(out.resolve())
    chains = [_campaign_chain(g, rec, name, here) for rec in accepted if rec.round <= target.round]
    return [ch for ch in chains if ch is not None]


def _target_round(g: EvidenceGraph, accepted: list[RoundRecord], ref: str) -> RoundRecord | None:
    """The accepted round of the lineage that `ref` names: its version, a digest prefix, or a card path (or node id)
    whose promotions are among this lineage's (the last of them)."""
    target = next(
        (r for r in accepted if r.committed.version == ref or (len(ref) >= 8 and r.committed.digest.startswith(ref))),
        None,
    )
    if target is None:  # a card path (or node id): the promotions that wrote it, among this lineage's
        digests = {r.committed.digest: r for r in accepted}
        hits = [
            digests[d] for n in promotions_for(g, ref) if isinstance(d := n.data.get("digest"), str) and d in digests
        ]
        target = max(hits, key=lambda r: r.round) if hits else None
    return target


def _campaign_chain(g: EvidenceGraph, rec: RoundRecord, name: str, here: str) -> dict | None:
    """One accepted round's chain as this campaign recorded it (None: not recorded in this graph)."""
    versions = g.versions(node_id("decision", f"promotion:{rec.committed.digest}"))
    ours = [v for v in versions if v.data.get("round") == rec.round and v.data.get("campaign") == name]
    ours = [v for v in ours if v.data.get("out") == here] or ours  # a moved campaign: its round and name
    if not ours:
        return None  # not recorded in this graph (another evidence.db)
    ch = chain(g, ours[-1])
    if ch["plan"] is not None and rec.summary:  # the plan as this campaign wrote it (another may reword it)
        ch["plan"]["content"] = next(
            (v.content for v in g.versions(ch["plan"]["id"]) if v.content == rec.summary), ch["plan"]["content"]
        )
    if ch["verdict"] is not None and rec.gate is not None:  # the figures this campaign's gate recorded
        ch["verdict"].update(
            {k: getattr(rec.gate, k) for k in ("net", "ci_lo", "ci_hi", "n_items", "n_improved", "n_regressed")}
        )
    return ch


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
    out: dict[str, Any] = {
        "promotion": mark(promo),
        "version": promo.data.get("version"),
        "campaign": promo.data.get("campaign"),
        "round": promo.data.get("round"),
        "cards": [c["path"] for c in promo.data.get("cards") or []],
        "benchmark_digest": promo.data.get("benchmark_digest"),
        "model": promo.data.get("model"),
    }
    out["plan"] = {**mark(plan), "plan_key": plan.data.get("plan_key")} if plan else None
    out["verdict"] = (
        {
            **mark(verdict),
            **{
                k: verdict.data.get(k)
                for k in ("stage", "net", "ci_lo", "ci_hi", "n_items", "n_improved", "n_regressed")
            },
        }
        if verdict
        else None
    )
    out["claims"] = []
    for c in claims:
        steps = [
            {"id": a.id, "episode_id": a.data["episode_id"], "step": a.data["step"], "hash": a.data["hash"]}
            for a in g.citations(c.id)
        ]
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
