"""The pieces of campaign memory that both recording a round and planning from memory use: a diagnosis packet as a
claim (its citations verified against the traces), and the open questions a later finding or promotion answers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from components.evidence.graph import EvidenceGraph, Expiry, Node
from components.evidence.graph_policy import CitationError
from components.evidence.packets import EvidencePacket
from components.runtime.trace import frame_steps

MAX_CITES = 8  # trace steps recorded per packet: enough to audit it; the round's diagnosis.json keeps them all


def model_id(model: str, model_cfg: dict) -> str:
    name = model_cfg.get("model")
    return f"{model}:{name}" if name else model


def trace_resolver(traces: pd.DataFrame):
    """(episode, step) -> the step's recorded hash, or None; a step whose content no longer hashes to its recorded
    hash resolves to a marker that matches nothing."""
    index = {
        (r.episode_id, int(r.step)): i for i, r in enumerate(traces[["episode_id", "step"]].itertuples(index=False))
    }

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
    c = g.add(
        "claim",
        key,
        text[:2000],
        {
            "owner": p.owner,
            "kind": p.kind,
            "tool": p.tool,
            "rule_id": p.rule_id,
            "detail": p.detail,
            "packet": p.id,
            "n_episodes": len(p.episodes),
            "items": p.items[:12],
            "benchmark_digest": bench,
            "model": model,
        },
        author="harness",
        expiry=Expiry(benchmark=bench, model=model),
    )
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
        by = next(
            (
                a
                for a in answers
                if a.kind == "claim"
                and a.confidence == "supported"
                and (a.data.get("kind"), a.data.get("tool")) == (kind, tool)
            ),
            None,
        )
        by = by or next(
            (
                a
                for a in answers
                if a.data.get("type") == "promotion" and any(c.get("tool") == tool for c in a.data.get("cards") or [])
            ),
            None,
        )
        if by is not None:
            g.link(by.id, "supersedes", q.id)
            n += 1
    return n
