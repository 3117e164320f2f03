"""The evidence graph's write policy: the one home of what may enter durable campaign memory, and how.

    1. entry        a claim enters `unverified`, whoever makes it; a node a model or meta-agent authors enters
                    `unverified` whatever its kind. Only the harness records facts (sources, runs, artifacts, gate
                    verdicts) as `supported`, because it observed them.
    2. support      a claim becomes `supported` only when its citations resolve: every trace step it cites exists and
                    its recorded hash equals the cited one. A claim with no citation, or one that does not resolve,
                    is refused and stays as it was.
    3. promotion    a promotion decision needs an accepting gate verdict node, and every claim it rests on must be
                    `supported` (an unverified or contested claim cannot carry a promotion).
    4. contradiction  evidence that contradicts a node opens a contested branch: both sides get a new version marked
                    `contested`; neither is overwritten or removed (older versions stay readable). A side is settled
                    back to `supported` only when every opponent is revoked or expired for the current evidence,
                    and its citations still resolve.
    5. expiry       an observation tied to a benchmark digest, a model or a backend version expires when the current
                    one differs; expired nodes stay in the graph, and the projection leaves them out.
    6. revocation   a revoked node flags everything derived from it: nodes that are derived_from it, that it supports
                    or that it was used_in, transitively.

The graph (`graph.py`) calls these rules on every write; nothing else writes rows.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from components.errors import InputError

if TYPE_CHECKING:  # (graph_models imports nothing of this package: no circle either way)
    from components.evidence.graph_models import Confidence, Edge, Expiry, Node


class PolicyError(InputError):
    """A write the policy refuses; the message names the node and the rule."""


class CitationError(PolicyError):
    """A claim's citation does not resolve (no such step, or the hash differs)."""


# a trace step's recorded hash for (episode id, step), or None when there is no such step
Resolver = Callable[[str, int], "str | None"]

# edges along which a revocation propagates: (relation, direction) where "down" means src depends on dst
DERIVES = {"derived_from": "src", "supports": "dst", "used_in": "dst"}


class WritePolicy:
    # 1 -----------------------------------------------------------------------------------------------------------
    def entry(self, kind: str, author: str, requested: str | None, nid: str) -> str:
        """The confidence a new node (or version) enters with."""
        if kind == "claim" or author in ("model", "meta_agent"):
            if requested not in (None, "unverified"):
                raise PolicyError(
                    f"{nid}: confidence: a {kind} by {author} enters unverified; "
                    "a claim becomes supported only through resolved citations"
                )
            return "unverified"
        if requested == "contested":
            raise PolicyError(f"{nid}: confidence: contested is opened by contradicting evidence, not set")
        return requested or "supported"

    def addable(self, kind: str, data: dict, nid: str) -> None:
        if kind == "decision" and data.get("type") == "promotion":
            raise PolicyError(f"{nid}: a promotion is recorded through promote(), which checks its gate verdict")

    # 2 -----------------------------------------------------------------------------------------------------------
    def support(self, claim: Node, citations: list[Node], resolve: Resolver) -> None:
        if claim.kind != "claim":
            raise PolicyError(f"{claim.id}: only a claim is verified (this is a {claim.kind})")
        if not citations:
            raise CitationError(f"{claim.id}: no citation: a claim without a resolving trace step stays unverified")
        for a in citations:
            ep, step, h = a.data.get("episode_id"), a.data.get("step"), a.data.get("hash")
            if ep is None or step is None or not h:
                raise CitationError(f"{claim.id}: citation {a.id} is not a trace step (episode, step, hash)")
            recorded = resolve(str(ep), int(step))
            if recorded is None:
                raise CitationError(f"{claim.id}: citation {ep} step {step} does not resolve")
            if recorded != h:
                raise CitationError(
                    f"{claim.id}: citation {ep} step {step}: hash {str(h)[:12]} != recorded {recorded[:12]}"
                )

    # 3 -----------------------------------------------------------------------------------------------------------
    def promotion(self, nid: str, verdict: Node | None, supports: Iterable[Node]) -> None:
        if verdict is None:
            raise PolicyError(f"{nid}: a promotion needs a gate verdict node")
        if verdict.kind != "decision" or verdict.data.get("type") != "gate_verdict":
            raise PolicyError(f"{nid}: {verdict.id} is not a gate verdict")
        if not verdict.data.get("accept"):
            raise PolicyError(f"{nid}: gate verdict {verdict.id} did not accept")
        if verdict.confidence != "supported":
            raise PolicyError(f"{nid}: gate verdict {verdict.id} is {verdict.confidence}")
        supports = list(supports)
        if not any(c.kind == "claim" for c in supports):
            raise PolicyError(f"{nid}: a promotion rests on at least one claim whose citations resolve")
        for c in supports:
            if c.confidence != "supported":
                raise PolicyError(f"{nid}: claim {c.id} is {c.confidence}: only supported claims carry a promotion")

    # 4 -----------------------------------------------------------------------------------------------------------
    def contradiction(self, a: Node, b: Node) -> tuple[Confidence, Confidence]:
        """New confidences of both sides: each becomes contested (kept, never overwritten)."""
        if a.id == b.id:
            raise PolicyError(f"{a.id}: a node cannot contradict itself")
        return "contested", "contested"

    def settled(self, node: Node, opponents: list[Node], revoked: dict, now: Expiry | None) -> None:
        """A contested node may return to supported only when no opponent still stands on the current evidence
        (each is revoked, or expired for the current benchmark digest / model); its citations are then re-checked."""
        if node.confidence != "contested":
            raise PolicyError(f"{node.id}: not contested ({node.confidence})")
        standing = [o.id for o in opponents if o.id not in revoked and not self.expired(o, now)]
        if standing:
            raise PolicyError(f"{node.id}: still contested by {standing[0]} on the current evidence")

    # 5 -----------------------------------------------------------------------------------------------------------
    def expired(self, node: Node, now: Expiry | None) -> list[str]:
        """Why `node` no longer holds in the current context (empty: it holds)."""
        if node.expiry is None or now is None:
            return []
        out = []
        for k, v in node.expiry.keys().items():
            cur = getattr(now, k)
            if cur is not None and cur != v:
                out.append(f"{k} changed ({v[:12]} -> {cur[:12]})")
        return out

    # 6 -----------------------------------------------------------------------------------------------------------
    def flagged(self, revoked: Iterable[str], edges: Iterable[Edge]) -> dict[str, str]:
        """Every node derived (transitively) from a revoked one -> the revoked node it derives from."""
        dependents: dict[str, list[str]] = {}
        for e in edges:
            side = DERIVES.get(e.relation)
            if side == "src":  # src derived_from dst: src depends on dst
                dependents.setdefault(e.dst, []).append(e.src)
            elif side == "dst":  # src supports / is used_in dst: dst depends on src
                dependents.setdefault(e.src, []).append(e.dst)
        out: dict[str, str] = {}
        for root in revoked:
            queue = deque(dependents.get(root, []))
            while queue:
                n = queue.popleft()
                if n in out or n == root:
                    continue
                out[n] = root
                queue.extend(dependents.get(n, []))
        return out


POLICY = WritePolicy()
