"""What a round does when the meta-agent has no plan left: a retry from the pool, else an ablation.

    retry     the pool: plans the gate rejected with a positive mean (net > 0 on dev), each at most `retries` times.
              The best (highest net, then the earliest round) is applied again to the current champion and gated
              on dev seeds no look has used (the campaign's seeds shifted by a block per retry), as a new look
              with its own share of campaign_alpha (components/evolution/alpha.py)
    ablation  a card a promotion wrote with several parts (paragraphs, or the items of a list paragraph, that its
              parent's card did not have) is reduced by one part at a time: the candidate is the champion with
              that part dropped, gated like any change (promoted as "cheaper" when the score stays within the
              margin and the prompt tokens drop, or "better"); a part whose drop was tried is not tried again

Pure functions over the lineage and the round directories (plan.json); no Prefect.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING

from components.codes import Verdict
from components.errors import InputError
from components.evolution.lineage import Lineage
from components.evolution.plan import AddCard, Plan, RemoveCard, parse_plan
from components.evolution.record import AblationInfo, RetryInfo, RoundRecord

if TYPE_CHECKING:
    from components.memory.cards import Card

LIST_MARKS = ("- ", "* ")


class IdleKind(StrEnum):
    RETRY = "retry"
    ABLATION = "ablation"


@dataclass(frozen=True)
class Idle:
    """A plan for a round without one: what it is and what the round's record says about it."""

    kind: IdleKind
    plan: Plan
    info: RetryInfo | AblationInfo
    seeds: list[int] | None = None  # a retry's fresh dev seeds (None: the campaign's)


# -- retry pool --------------------------------------------------------------------------------------------------------


def retry_pool(rounds: list[RoundRecord], max_retries: int) -> list[tuple[str, float, int]]:
    """(plan key, net of its latest gate, round of that gate), best first: plans whose latest dev gate rejected them
    with a positive mean (not refused), never accepted, retried fewer than `max_retries` times."""
    latest: dict[str, RoundRecord] = {}
    accepted: set[str] = set()
    tries: dict[str, int] = {}
    for r in rounds:
        if not r.plan_key:
            continue
        if r.accepted:
            accepted.add(r.plan_key)
        if r.retry:
            tries[r.plan_key] = tries.get(r.plan_key, 0) + 1
        if r.gate is not None and r.dev_look is not None:
            latest[r.plan_key] = r
    pool = [
        (k, float(r.gated.net), r.round)
        for k, r in latest.items()
        if k not in accepted
        and r.verdict == Verdict.REJECT
        and not r.gated.refused
        and r.gated.net > 0
        and tries.get(k, 0) < max_retries
    ]
    return sorted(pool, key=lambda x: (-x[1], x[2], x[0]))


def retry_seeds(rounds: list[RoundRecord], seeds: int) -> list[int]:
    """The dev seeds of the next retry: a block of `seeds` past every block used (the campaign's are 0..seeds-1)."""
    used = max([max(r.retry.seeds) for r in rounds if r.retry and r.retry.seeds] + [seeds - 1])
    start = (used // seeds + 1) * seeds
    return list(range(start, start + seeds))


def applies(plan: Plan, champion: Path) -> bool:
    """Whether the plan can be applied to the champion and changes it (a plan written on an older champion)."""
    from components.evolution.patch import apply_plan
    from components.memory.package import digest, load_package

    with tempfile.TemporaryDirectory(prefix="ratchet-retry-") as tmp:
        try:
            out = apply_plan(plan, champion, Path(tmp) / "cand")
            load_package(out)
        except (InputError, OSError, ValueError):
            return False
        return digest(out) != digest(champion)


def next_retry(lineage: Lineage, champion: Path, max_retries: int, seeds: int) -> Idle | None:
    rounds = lineage.rounds()
    for key, net, rnd in retry_pool(rounds, max_retries):
        f = lineage.rejected_dir / f"{key}.json"
        if not f.is_file():
            continue
        plan = parse_plan(json.loads(f.read_text(encoding="utf-8"))["plan"], where=str(f))
        if not applies(plan, champion):
            continue
        fresh = retry_seeds(rounds, seeds)
        attempt = 1 + sum(1 for r in rounds if r.retry and r.plan_key == key)
        return Idle(
            IdleKind.RETRY, plan, RetryInfo(plan_key=key, of_round=rnd, net=net, attempt=attempt, seeds=fresh), fresh
        )
    return None


# -- ablation ----------------------------------------------------------------------------------------------------------


def parts(body: str) -> list[str]:
    """A card body's parts: each paragraph, except that a paragraph which is a list gives one part per item (an
    inferred rule is one list item: `components.worlds.outcome_rules.render`)."""
    out: list[str] = []
    for para in body.strip().split("\n\n"):
        para = para.strip()
        if not para:
            continue
        lines = para.split("\n")
        if len(lines) > 1 and all(x.lstrip().startswith(LIST_MARKS) for x in lines):
            out += lines
        else:
            out.append(para)
    return out


def without_part(body: str, part: str) -> str:
    """The body with one part (as `parts` gives it) left out; the rest byte for byte."""
    paras = []
    for para in body.strip().split("\n\n"):
        para = para.strip()
        if not para or para == part:
            continue
        lines = para.split("\n")
        if len(lines) > 1 and part in lines and all(x.lstrip().startswith(LIST_MARKS) for x in lines):
            lines = [x for x in lines if x != part]
            if not lines:
                continue
            para = "\n".join(lines)
        paras.append(para)
    return "\n\n".join(paras)


def _label(part: str, width: int = 60) -> str:
    text = " ".join(part.split())
    return text if len(text) <= width else text[: width - 3] + "..."


def ablations(lineage: Lineage, campaign_out: Path, champion: Path) -> list[Idle]:
    """Every ablation not tried yet, the latest promotion's first: for each card a promoted plan added with two or
    more parts its parent's card did not have, one candidate per such part still on the champion's card."""
    from components.memory.package import load_package

    rounds = lineage.rounds()
    tried = {r.plan_key for r in rounds if r.plan_key}
    champ = load_package(champion)
    by_path = {c.path: c for c in champ.cards.values()}
    out: list[Idle] = []
    for r in sorted((r for r in rounds if r.accepted), key=lambda r: -r.round):
        got = _promotion(lineage, campaign_out, r)
        if got is None:
            continue
        plan, parent = got
        for op in plan.operations:
            if not isinstance(op, AddCard) or op.path not in by_path:
                continue
            out += _part_ablations(r, plan, op, by_path[op.path], parent, tried)
    return out


def _promotion(lineage: Lineage, campaign_out: Path, r: RoundRecord) -> tuple[Plan, dict[str, Card]] | None:
    """A promoted round's plan and its parent's cards by path (none when the parent's directory is gone); None for
    a round without a parent or a plan file."""
    from components.memory.package import load_package

    if r.parent is None:
        return None
    plan_file = Path(campaign_out) / r.round_dir / "plan.json"
    if not plan_file.is_file():
        return None
    plan = parse_plan(json.loads(plan_file.read_text(encoding="utf-8")), where=str(plan_file))
    parent_dir = lineage.versions_dir / r.parent.version
    parent = {c.path: c for c in load_package(parent_dir).cards.values()} if parent_dir.is_dir() else {}
    return plan, parent


def _part_ablations(
    r: RoundRecord, plan: Plan, op: AddCard, card: Card, parent: dict[str, Card], tried: set[str]
) -> list[Idle]:
    """For a card the plan added with two or more parts its parent's card did not have, one candidate per such part
    still on the champion's `card` (without it), but those tried already."""
    old = set(parts(parent[op.path].body)) if op.path in parent else set()
    new = [x for x in parts(op.body) if x not in old]
    now = parts(card.body)
    if len(new) < 2 or len(now) < 2:
        return []
    out: list[Idle] = []
    for k, part in enumerate(new):
        if part not in now:
            continue
        meta = card.meta.model_dump(mode="json", exclude_none=True)
        body = without_part(card.body, part)
        ops = [
            RemoveCard(op="remove_card", path=card.path),
            AddCard(op="add_card", path=card.path, meta=meta, body=body),
        ]
        cand = Plan(
            owner=plan.owner,
            cluster=plan.cluster,
            summary=f"ablation: {card.id} without part {k + 1} of {len(new)} ({_label(part)})",
            rationale=f"round {r.round} promoted {card.id} with {len(new)} parts; does it need this one?",
            evidence=plan.evidence,
            operations=ops,
            mechanism=f"deliver:{card.id}@",
            source_items=plan.source_items,
        )
        if cand.key() in tried:
            continue
        out.append(
            Idle(
                IdleKind.ABLATION,
                cand,
                AblationInfo(of_round=r.round, card=card.path, part=part, part_no=k + 1, parts=len(new)),
            )
        )
    return out
