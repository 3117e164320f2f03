"""What a round without a plan does (components/evolution/idle.py): the retry pool (which plans, best first, how many
times, on which fresh dev seeds) and the ablation of multi-part cards (the parts of a card, one dropped at a time,
and the candidates a promotion with several parts gives), on synthetic lineages."""

from __future__ import annotations

import json

import pytest

from components.evidence.packets import Citation
from components.evolution.idle import IdleKind, ablations, next_retry, parts, retry_pool, retry_seeds, without_part
from components.evolution.lineage import Lineage
from components.evolution.record import AblationInfo, RetryInfo, RoundRecord

GATE = {
    "accept": False,
    "net": 0.0,
    "ci_lo": -0.1,
    "ci_hi": 0.1,
    "n_items": 18,
    "n_improved": 0,
    "n_regressed": 0,
    "reason": "",
    "base_mean": 0.5,
    "cand_mean": 0.5,
    "dropped_errors": 0,
}
EVIDENCE = [Citation(episode_id="x#0", step=1, hash="0" * 64)]
LOOK = {"look": 1, "alpha": 0.01, "spent": 0.005, "campaign_alpha": 0.05}


def rec(round_no: int, key: str | None, verdict: str = "reject", net: float | None = None, **extra) -> RoundRecord:
    d = {"round": round_no, "verdict": verdict, "plan_key": key, **extra}
    if net is not None:
        d.update(gate={**GATE, "net": net, "accept": verdict == "accept"}, dev_look=LOOK)
    return RoundRecord.model_validate(d)


def test_the_pool_holds_plans_the_gate_rejected_with_a_positive_mean_best_first():
    rounds = [
        rec(1, "a", net=0.02),
        rec(2, "b", net=0.04),
        rec(3, "c", net=-0.01),
        rec(4, "d", net=0.0),
        rec(5, "e"),  # refused before the gate: not in the pool
        rec(6, "f", "accept", net=0.08),
        rec(7, "g", net=0.04),
    ]
    assert retry_pool(rounds, 1) == [("b", 0.04, 2), ("g", 0.04, 7), ("a", 0.02, 1)]
    assert retry_pool(rounds, 0) == []


def test_a_retried_plan_leaves_the_pool_after_its_retries_and_its_latest_gate_counts():
    info = RetryInfo(plan_key="b", of_round=2, net=0.04, attempt=1, seeds=[3, 4, 5])
    rounds = [rec(1, "a", net=0.02), rec(2, "b", net=0.04), rec(3, "b", net=0.03, retry=info)]
    assert retry_pool(rounds, 1) == [("a", 0.02, 1)]
    assert retry_pool(rounds, 2) == [("b", 0.03, 3), ("a", 0.02, 1)]
    rounds.append(
        rec(4, "a", net=-0.01, retry=RetryInfo(plan_key="a", of_round=1, net=0.02, attempt=1, seeds=[6, 7, 8]))
    )
    assert retry_pool(rounds, 2) == [("b", 0.03, 3)]  # a's latest gate has a non-positive net


def test_each_retry_gets_a_block_of_seeds_no_look_has_used():
    assert retry_seeds([], 3) == [3, 4, 5]
    used = [rec(1, "a", net=0.01, retry=RetryInfo(plan_key="a", of_round=0, net=0.01, attempt=1, seeds=[3, 4, 5]))]
    assert retry_seeds(used, 3) == [6, 7, 8]
    assert retry_seeds([], 1) == [1]


BODY = "Intro paragraph.\n\n- `t`, from train outcomes: `x` = 1\n- `t`, from train outcomes: `y` = 2\n\nLast words."


def test_a_card_s_parts_are_its_paragraphs_and_the_items_of_a_list():
    assert parts(BODY) == [
        "Intro paragraph.",
        "- `t`, from train outcomes: `x` = 1",
        "- `t`, from train outcomes: `y` = 2",
        "Last words.",
    ]
    assert without_part(BODY, "- `t`, from train outcomes: `x` = 1") == (
        "Intro paragraph.\n\n- `t`, from train outcomes: `y` = 2\n\nLast words."
    )
    assert without_part(BODY, "Intro paragraph.") == BODY.split("\n\n", 1)[1]
    one = "- only item\n- other item"
    assert without_part(without_part(one, "- only item"), "- other item") == ""
    assert parts("a\nb") == ["a\nb"]  # a paragraph of plain lines is one part


def test_ablations_drop_each_part_a_promotion_added_and_not_the_ones_its_parent_had(tmp_path, seed_package):
    """A promotion added two rules to a card that had an intro: one candidate per added rule (the intro is not
    one), each the champion with that rule dropped; a candidate tried before is not offered again."""
    from components.memory.package import load_package
    from components.evolution.patch import apply_plan
    from components.evolution.plan import AddCard, Plan, RemoveCard

    lin = Lineage(tmp_path / "lineage")
    m0 = lin.start(seed_package)
    card = {
        "id": "t-rules",
        "type": "procedure",
        "trigger": {"event": "intent_recorded", "tool": "t"},
        "source": "diagnosis d1",
    }
    before = "Intro paragraph."
    plan0 = Plan(
        owner="E",
        cluster="c",
        summary="s",
        rationale="r",
        evidence=EVIDENCE,
        mechanism="deliver:t-rules@",
        source_items=["i1"],
        operations=[AddCard(op="add_card", path="em/procedure/t-rules.md", meta=card, body=before)],
    )
    p1 = apply_plan(plan0, m0.path, tmp_path / "p1")
    # the promoted plan rewrites the card (remove + add), as the rules meta-agent does
    promoted = Plan(
        owner="E",
        cluster="c",
        summary="two rules",
        rationale="r",
        evidence=EVIDENCE,
        mechanism="deliver:t-rules@",
        source_items=["i1"],
        operations=[
            RemoveCard(op="remove_card", path="em/procedure/t-rules.md"),
            AddCard(op="add_card", path="em/procedure/t-rules.md", meta=card, body=BODY.rsplit("\n\n", 1)[0]),
        ],
    )
    v1 = lin.commit(p1, _digest(p1), 1, {"plan_key": plan0.key(), "reason": "ok"})
    p2 = apply_plan(promoted, v1.path, tmp_path / "p2")
    v2 = lin.commit(p2, _digest(p2), 2, {"plan_key": promoted.key(), "reason": "ok"})
    out = tmp_path / "campaign"
    for no, pl in ((1, plan0), (2, promoted)):
        (out / f"round_{no:03d}").mkdir(parents=True)
        (out / f"round_{no:03d}" / "plan.json").write_text(json.dumps(pl.model_dump()))
    got = ablations(_with_dirs(lin), out, v2.path)
    assert [g.kind for g in got] == [IdleKind.ABLATION] * 2
    assert all(isinstance(g.info, AblationInfo) and g.info.of_round == 2 and g.info.parts == 2 for g in got)
    assert [g.info.part for g in got] == BODY.split("\n\n")[1].split("\n")
    champ_card = load_package(v2.path).cards["t-rules"]
    for g in got:
        body = g.plan.operations[1].body
        assert g.info.part not in body and "Intro paragraph." in body
        assert len(parts(body)) == len(parts(champ_card.body)) - 1
    assert len({g.plan.key() for g in got}) == 2
    lin.reject(3, {"plan_key": got[0].plan.key(), "reason": "gate: kept"})  # tried: not offered again
    again = ablations(_with_dirs(lin), out, v2.path)
    assert [g.plan.key() for g in again] == [got[1].plan.key()]


def _digest(p):
    from components.memory.package import digest

    return digest(p)


def _with_dirs(lin: Lineage) -> Lineage:
    """The lineage with each round's round_dir set as a campaign writes it."""
    lines = [json.loads(x) for x in lin.log.read_text().splitlines() if x.strip()]
    for x in lines:
        if x.get("round", 0) > 0:
            x["round_dir"] = f"round_{x['round']:03d}"
    lin.log.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return Lineage(lin.root)


def test_no_retry_when_the_pool_is_empty(tmp_path, seed_package):
    lin = Lineage(tmp_path / "lineage")
    m0 = lin.start(seed_package)
    assert next_retry(lin, m0.path, 1, 3) is None


@pytest.fixture
def seed_package():
    from components.params import resolve_start

    return resolve_start("reference", "retail")
