"""Campaign memory in the loop: what a campaign records, what planning reads back, revocation, and the CLI."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd

from components.evidence.graph import EvidenceGraph, Expiry
from components.evidence.graph_record import (
    chain,
    default_db,
    memory_for_round,
    plan_memory,
    project,
    promotions_for,
    record_round,
    trace_resolver,
)
from components.evidence.packets import Citation, Claim, EvidencePacket
from components.evolution.meta import PlanContext, make_meta_agent
from components.evolution.patch import apply_plan
from components.evolution.plan import parse_plan
from components.memory import load_package
from components.params import EvidenceParams
from components.runtime.trace import TraceStep, steps_frame
from components.worlds import load_benchmark
from tests.conftest import run_cli as cli, small_params


def _bench(campaign):
    """The benchmark the shared small campaign ran on (its evidence)."""
    return load_benchmark(campaign.params.benchmark.out)


def _round(out: Path, n: int):
    rd = out / "rounds" / f"r{n:02d}"
    packets = [EvidencePacket.model_validate(x) for x in json.loads((rd / "diagnosis.json").read_text())]
    return rd, packets, pd.read_parquet(rd / "train" / "traces.parquet")


def test_the_campaign_is_recorded_and_every_supported_claim_resolves(small_campaign, tmp_path):
    s = small_campaign.summary
    with EvidenceGraph(default_db(small_campaign.params.evidence.db)) as g:
        promos = promotions_for(g, s["champion"], campaign="small")
        assert [p.data["version"] for p in promos] == [v["version"] for v in s["lineage"][1:]]
        for p in promos:
            ch = chain(g, p)
            assert ch["verdict"]["stage"] == "gate" and ch["verdict"]["net"] > 0
            assert ch["benchmark_digest"] == s["benchmark_digest"]
            assert ch["claims"] and all(c["confidence"] == "supported" for c in ch["claims"])
            _, _, traces = _round(small_campaign.out, ch["round"])
            resolve = trace_resolver(traces)
            for c in ch["claims"]:  # checked again here, independently of the policy that admitted them
                assert c["trace_steps"]
                assert all(resolve(t["episode_id"], t["step"]) == t["hash"] for t in c["trace_steps"])
    # the champion's chain is an artifact of the campaign's MLflow run
    from mlflow import MlflowClient

    client = MlflowClient(s["mlflow"]["tracking_uri"])
    text = Path(
        client.download_artifacts(s["mlflow"]["run_id"], "evidence/champion_chain.txt", str(tmp_path))
    ).read_text()
    assert all(f"{v['version']} (campaign small" in text for v in s["lineage"][1:]) and "gate verdict" in text


def test_recording_a_round_again_adds_nothing(small_campaign, tmp_path):
    rec = small_campaign.summary["history"][0]
    with EvidenceGraph(tmp_path / "e.db", campaign="small") as g:
        record_round(g, small_campaign.out, rec, "sim")
        before = (len(g.nodes()), len(g.edges()), sum(len(g.versions(n.id)) for n in g.nodes()))
        record_round(g, small_campaign.out, rec, "sim")  # a resumed campaign records the same round again
        assert (len(g.nodes()), len(g.edges()), sum(len(g.versions(n.id)) for n in g.nodes())) == before


def test_a_plan_rejected_on_the_same_evidence_is_not_retried_on_other_evidence_it_may_be(small_campaign, tmp_path):
    out, bench = small_campaign.out, _bench(small_campaign)
    rec = small_campaign.summary["history"][0]
    rejected = {**rec, "verdict": "reject", "child": None, "reason": "gate: recorded as rejected for this test"}
    db = tmp_path / "e.db"
    with EvidenceGraph(db, campaign="earlier") as g:
        record_round(g, out, rejected, "sim")
    rd, packets, traces = _round(out, 1)
    m0 = str(out / "lineage" / "versions" / "M0")
    ev = EvidenceParams(db=str(db))
    same = memory_for_round(ev, "later", packets, traces, m0, bench.digest, "sim")
    assert same.rejected_here == [rec["plan_key"]]
    # a campaign's own records are its lineage's business: a forced rerun of it plans exactly as its first run did
    assert memory_for_round(ev, "earlier", packets, traces, m0, bench.digest, "sim").rejected_here == []
    other = memory_for_round(ev, "later", packets, traces, m0, "0" * 64, "sim")
    assert other.rejected_here == [] and other.rejected_elsewhere == [rec["plan_key"]]  # may be retried, after the rest
    assert memory_for_round(ev, "later", packets, traces, m0, bench.digest, "openai:other").rejected_here == []
    assert (
        memory_for_round(
            ev.model_copy(update={"memory": False}), "later", packets, traces, m0, bench.digest, "sim"
        ).rejected_here
        == []
    )
    # the projection keeps the verdict's id and says whether it was on the same evidence, within its size limit
    shown = same.projection["verdicts"]
    assert (
        shown[0]["plan_key"] == rec["plan_key"] and shown[0]["same_evidence"] and shown[0]["id"].startswith("decision:")
    )
    tight = memory_for_round(
        ev.model_copy(update={"projection_chars": 200}), "later", packets, traces, m0, bench.digest, "sim"
    )
    assert tight.chars <= 200 + 80 and tight.projection["omitted"] >= 1
    # the rules meta-agent, given what memory rejected, proposes another change
    ctx = PlanContext(
        packets,
        load_package(m0),
        bench,
        traces,
        pd.read_csv(rd / "train" / "scores.csv", dtype={"item_id": str}),
        set(same.rejected_here),
    )
    plan = make_meta_agent("rules")(ctx)
    assert plan is None or plan.key() != rec["plan_key"]
    # rejected only elsewhere: deferred behind every other plan, and still proposed when nothing else is left
    ctx.rejected, ctx.later = set(), {rec["plan_key"]}
    deferred = make_meta_agent("rules")(ctx)
    assert deferred.key() == (plan.key() if plan is not None else rec["plan_key"])


def test_a_second_campaign_does_not_retry_what_the_first_rejected_on_the_same_evidence(
    small_campaign, prefect_server, tmp_path
):
    from flows.campaign import run_campaign

    rec = small_campaign.summary["history"][0]
    db = tmp_path / "e.db"
    with EvidenceGraph(db, campaign="earlier") as g:
        record_round(g, small_campaign.out, {**rec, "verdict": "reject", "child": None, "reason": "gate: test"}, "sim")
    b = small_campaign.params.benchmark  # the first campaign's benchmark (path and size): the same evidence
    p = small_params(
        Path(b.out),
        tmp_path / "later",
        **{
            "benchmark.per_family": b.per_family,
            "benchmark.train_share": b.train_share,
            "benchmark.dev_share": b.dev_share,
            "campaign.name": "small-later",
            "campaign.rounds": 1,
            # the first campaign's shards (its task cache answers what this round shares with it); no trace is read here
            "campaign.shard_size": small_campaign.params.campaign.shard_size,
            "campaign.traces_per_round": 0,
            "evidence.memory": True,
            "evidence.db": str(db),
        },
    )
    s = run_campaign(p)
    memory = json.loads((tmp_path / "later" / "rounds" / "r01" / "memory.json").read_text())
    assert memory["rejected_here"] == [rec["plan_key"]]
    assert s["history"][0].get("plan_key") != rec["plan_key"]
    with EvidenceGraph(db) as g:  # and the second campaign recorded its round too
        assert any(n.data.get("plan_key") == s["history"][0].get("plan_key") for n in g.nodes("decision"))


def test_a_plan_accepted_elsewhere_is_proposed_first_bound_to_the_current_evidence(small_campaign, tmp_path):
    out, hist, bench = small_campaign.out, small_campaign.summary["history"], _bench(small_campaign)
    rec = next(r for r in hist if r["verdict"] == "accept")
    rd, packets, traces = _round(out, rec["round"])
    parent = str(out / "lineage" / "versions" / rec["parent"]["version"])
    db = tmp_path / "e.db"
    ev = EvidenceParams(db=str(db))
    with EvidenceGraph(db, campaign="earlier") as g:  # a fresh graph: nothing to reuse, memory.json as it always was
        pass
    fresh = memory_for_round(ev, "later", packets, traces, parent, "0" * 64, "sim")
    assert fresh.revocations == [] and "reused" not in fresh.record() and "helped_elsewhere" not in fresh.projection
    with EvidenceGraph(db, campaign="earlier") as g:
        for r in hist:
            record_round(g, out, r, "sim")
    digest = small_campaign.summary["benchmark_digest"]
    # on the same evidence (digest and model): the accepted change itself comes back first (same key)
    same = memory_for_round(ev, "later", packets, traces, parent, digest, "sim")
    keys = [parse_plan(x).key() for x in same.revocations]
    assert keys and keys[0] == rec["plan_key"] and set(same.reused) == set(keys)
    reused = parse_plan(same.revocations[0])
    assert reused.cluster in {p.id for p in packets} and reused.source_items  # bound to a current packet
    assert all(c.episode_id in {e for p in packets for e in p.episodes} for c in reused.evidence)
    scores = pd.read_csv(rd / "train" / "scores.csv", dtype={"item_id": str})
    ctx = PlanContext(packets, load_package(parent), bench, traces, scores, set(), revocations=[reused])
    assert make_meta_agent("rules")(ctx).key() == rec["plan_key"]  # tried before any new plan
    ctx.rejected = {rec["plan_key"]}  # once rejected here, it is not proposed again
    assert make_meta_agent("rules")(ctx) is None or make_meta_agent("rules")(ctx).key() != rec["plan_key"]
    # on other evidence (another digest, same model): the finding it fixed is planned for first, from current data
    other = memory_for_round(ev, "later", packets, traces, parent, "0" * 64, "sim")
    assert other.reused == {} and other.revocations == []
    helped = other.projection["helped_elsewhere"]
    tight = memory_for_round(
        ev.model_copy(update={"projection_chars": 300}), "later", packets, traces, parent, "0" * 64, "sim"
    )
    assert tight.projection["helped_elsewhere"] == helped and tight.chars <= 300 + 80  # within the limit
    cluster = next(p for p in packets if p.id == json.loads((rd / "plan.json").read_text())["cluster"])
    assert helped[0] == [cluster.owner, cluster.kind, cluster.tool, cluster.rule_id or ""]
    last = sorted(packets, key=lambda p: p.id)  # the order the agent would use without memory, reversed
    ctx = PlanContext(last[::-1], load_package(parent), bench, traces, scores, set(), memory=other.projection)
    first = make_meta_agent("rules")(ctx)
    assert first is not None and first.cluster in {
        p.id for p in packets if [p.owner, p.kind, p.tool, p.rule_id or ""] == helped[0]
    } | {p.id for p in packets if p.tool == cluster.tool}
    # another model: nothing; a campaign's own records: nothing (a rerun plans as its first run did)
    assert memory_for_round(ev, "later", packets, traces, parent, digest, "openai:other").reused == {}
    assert (
        "helped_elsewhere"
        not in memory_for_round(ev, "later", packets, traces, parent, "0" * 64, "openai:other").projection
    )
    assert memory_for_round(ev, "earlier", packets, traces, parent, digest, "sim").reused == {}
    # a package that already carries the change: nothing to reuse (the plan no longer applies)
    child = str(out / "lineage" / "versions" / rec["child"]["version"])
    assert rec["plan_key"] not in memory_for_round(ev, "later", packets, traces, child, digest, "sim").reused
    # a promotion a person revoked is not reused
    with EvidenceGraph(db, campaign="someone") as g:
        promo = next(
            n
            for n in g.nodes("decision")
            if n.data.get("type") == "promotion" and n.data.get("plan_key") == rec["plan_key"]
        )
        g.revoke(promo.id, "wrong", by="person")
    assert rec["plan_key"] not in memory_for_round(ev, "later", packets, traces, parent, digest, "sim").reused
    assert "helped_elsewhere" not in memory_for_round(ev, "later", packets, traces, parent, "0" * 64, "sim").projection


R1 = "- `cancel_pending_order` takes a `reason` that must be exactly 'no longer needed' or 'ordered by mistake'."
R2 = "- `cancel_pending_order` takes a `reason` that must be exactly 'changed my mind'."


def _step(ep: str) -> TraceStep:
    return TraceStep(
        episode_id=ep,
        step=3,
        incoming={},
        state_before=[],
        delivered=["cancel-reason"],
        deliveries=[],
        proposal={},
        action={"tool": "cancel_pending_order"},
        checks=[],
        observation={"ok": False},
        state_after=[],
        fingerprint=[],
    ).sealed()


def _packet(detail: str, step: TraceStep, rule_id: str = "cancel_reason") -> EvidencePacket:
    return EvidencePacket(
        id=f"E-policy_refusal-cancel-{rule_id}",
        corpus="c",
        owner="E",
        opportunity="present",
        patchability="memory",
        kind="policy_refusal",
        tool="cancel_pending_order",
        detail=detail,
        rule_id=rule_id,
        episodes=[step.episode_id],
        items=["cancel-001"],
        claims=[
            Claim(
                statement="refusals of cancel_pending_order quote a rule",
                evidence=[Citation(episode_id=step.episode_id, step=3, hash=step.hash)],
            )
        ],
    )


def test_a_promotion_contradicted_on_current_data_is_revoked_through_a_plan(tmp_path, package_copy):
    pkg_dir = package_copy("reference")
    step = _step("cancel-001#0")
    traces = steps_frame([step], item_id="cancel-001", seed=0)
    card = {
        "path": "em/procedure/cancel-reason.md",
        "id": "cancel-reason",
        "tool": "cancel_pending_order",
        "rule": R1,
        "rule_id": "cancel_reason",
    }
    with EvidenceGraph(tmp_path / "e.db", campaign="first") as g:
        old = g.add("claim", "old-rule", R1, expiry=Expiry(benchmark="a" * 64, model="sim"))  # the first world
        g.cite(old.id, step.episode_id, 3, step.hash)
        g.verify(old.id, trace_resolver(traces))
        v = g.add("decision", "v1", "gate", {"type": "gate_verdict", "accept": True})
        promo = g.promote(
            "promotion:x",
            "M1: add cancel-reason",
            v.id,
            [old.id],
            {"version": "M1", "campaign": "first", "cards": [card]},
        )
        pkg = load_package(pkg_dir)
        assert plan_memory(g, [_packet(R1, step)], traces, pkg, "b" * 64, "sim").revocations == []  # same rule
        # another rule of the same write, refused with its own text, does not contradict what the card states
        fee = "- `cancel_pending_order` keeps a 5% cancellation fee on orders placed more than 24 hours ago."
        assert plan_memory(g, [_packet(fee, step, "cancel_fee")], traces, pkg, "b" * 64, "sim").revocations == []
        # the card delivered and refused anyway, quoting another statement of its rule: contradicted too
        wrong = _packet(R2, step).model_copy(update={"kind": "ineffective_card"})
        assert len(plan_memory(g, [wrong], traces, pkg, "b" * 64, "sim").revocations) == 1
        m = plan_memory(g, [_packet(R2, step)], traces, pkg, "b" * 64, "sim")
        assert len(m.revocations) == 1 and m.revokes == {parse_plan(m.revocations[0]).key(): promo.id}
        assert g.get(old.id).confidence == "contested"  # both sides kept
        assert [n for n in g.nodes("claim") if n.data.get("detail") == R2][0].confidence == "contested"
        plan = parse_plan(m.revocations[0])
        assert [o.op for o in plan.operations] == ["remove_card", "add_card"]
        cand = apply_plan(plan, pkg_dir, tmp_path / "cand")
        assert (
            "changed my mind" in (cand / card["path"]).read_text()
            and "no longer needed" not in (cand / card["path"]).read_text()
        )
        # the rules meta-agent takes the revocation first; once it is rejected, it is not proposed again
        ctx = PlanContext([_packet(R2, step)], pkg, None, traces, pd.DataFrame(), set(), revocations=[plan])
        assert make_meta_agent("rules")(ctx).key() == plan.key()
        # the revocation passes the gate: recorded, the old promotion is revoked and what derives from it flagged
        rd = tmp_path / "camp" / "rounds" / "r02"
        (rd / "train").mkdir(parents=True)
        traces.to_parquet(rd / "train" / "traces.parquet", index=False)
        (rd / "diagnosis.json").write_text(json.dumps([_packet(R2, step).model_dump()]))
        (rd / "plan.json").write_text(plan.model_dump_json())
        (rd / "memory.json").write_text(json.dumps(m.record()))
        child = g.add("source", "package:old-child", "M1 package")
        g.link(child.id, "derived_from", promo.id)
        record_round(
            g,
            tmp_path / "camp",
            {
                "round": 2,
                "round_dir": "rounds/r02",
                "verdict": "accept",
                "plan_key": plan.key(),
                "reason": "gate: accept",
                "benchmark_digest": "b" * 64,
                "gate": {
                    "accept": True,
                    "net": 0.1,
                    "ci_lo": 0.05,
                    "ci_hi": 0.15,
                    "n_items": 40,
                    "n_improved": 5,
                    "n_regressed": 0,
                    "reason": "accept",
                },
                "parent": {"version": "M1", "digest": "p" * 64},
                "child": {"version": "M2", "digest": "c" * 64},
            },
            "sim",
        )
        assert promo.id in g.revoked() and g.flagged()[child.id] == promo.id
        new = promotions_for(g, "M2")[-1]  # the new side settled: the old one stands only on the old benchmark
        assert chain(g, promo)["superseded_by"] == [new.id]
        assert all(c["confidence"] == "supported" for c in chain(g, new)["claims"])


def test_a_card_stating_several_rules_is_revoked_for_the_one_that_changed_and_keeps_the_others(tmp_path, package_copy):
    pkg_dir = package_copy("reference")
    step = _step("cancel-001#0")
    traces = steps_frame([step], item_id="cancel-001", seed=0)
    fee = "- `cancel_pending_order` keeps a 5% cancellation fee on orders placed more than 24 hours ago."
    card = {
        "path": "em/procedure/cancel-pending-order-rules.md",
        "id": "cancel-pending-order-rules",
        "tool": "cancel_pending_order",
        "rule": R1,
        "rule_id": "cancel_reason",
        "rules": [{"rule_id": "cancel_reason", "rule": R1}, {"rule_id": "cancel_fee", "rule": fee}],
    }
    cand = tmp_path / "with-card"
    from components.evolution.plan import AddCard, Plan

    add = Plan(
        owner="E",
        cluster="x",
        rationale="r",
        evidence=_packet(R1, step).citations(),
        summary="s",
        mechanism="deliver:x@",
        source_items=["cancel-001"],
        operations=[
            AddCard(
                op="add_card",
                path=card["path"],
                body=R1 + "\n\n" + fee,
                meta={
                    "id": card["id"],
                    "type": "procedure",
                    "source": "test",
                    "trigger": {"event": "intent_recorded", "tool": card["tool"]},
                },
            )
        ],
    )
    apply_plan(add, pkg_dir, cand)
    pkg = load_package(cand)
    with EvidenceGraph(tmp_path / "e.db", campaign="first") as g:
        old = g.add("claim", "old-rule", R1, expiry=Expiry(benchmark="a" * 64, model="sim"))
        g.cite(old.id, step.episode_id, 3, step.hash)
        g.verify(old.id, trace_resolver(traces))
        v = g.add("decision", "v1", "gate", {"type": "gate_verdict", "accept": True})
        first = g.promote(
            "promotion:y",
            "M1: card on cancel_pending_order",
            v.id,
            [old.id],
            {"version": "M1", "campaign": "first", "cards": [card]},
        )
        g.promote(
            "promotion:z",
            "M1: the same card, promoted by another campaign",
            v.id,
            [old.id],
            {"version": "M1", "campaign": "other", "cards": [card]},
        )
        # both rules as the card states them: nothing contradicted
        assert plan_memory(g, [_packet(fee, step, "cancel_fee")], traces, pkg, "b" * 64, "sim").revocations == []
        new_fee = fee.replace("5%", "10%")
        m = plan_memory(g, [_packet(new_fee, step, "cancel_fee")], traces, pkg, "b" * 64, "sim")
        assert len(m.revocations) == 1  # the card's second rule changed: contradicted, though not its cluster's rule
        assert list(m.revokes.values()) == [first.id]  # one plan, aimed at the oldest promotion of that card
        body = [o for o in parse_plan(m.revocations[0]).operations if o.op == "add_card"][0].body
        assert "10%" in body and "5%" not in body and "no longer needed" in body  # the other rule is kept


def test_evidence_cli(small_campaign, capsys, tmp_path):
    s = small_campaign.summary
    own = ("--db", small_campaign.params.evidence.db)
    code, out, err = cli(capsys, "evidence", "why", s["champion"], "--campaign", "small", *own)
    assert code == 0, err
    assert "plan " in out and "cites " in out and "gate verdict" in out and s["benchmark_digest"][:12] in out
    card = next(
        (
            c
            for r in s["history"]
            if r["verdict"] == "accept"
            for c in json.loads((small_campaign.out / r["round_dir"] / "plan.json").read_text())["operations"]
            if c["op"] == "add_card"
        ),
        None,
    )
    if card is not None:
        code, out, _ = cli(capsys, "evidence", "why", card["path"], "--campaign", "small", *own)
        assert code == 0 and card["path"] in out
    code, out, err = cli(capsys, "evidence", "why", "M999", "--campaign", "small", *own)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    # revoke on a copy of the graph (the shared one stays as the campaign left it)
    db = tmp_path / "e.db"
    with EvidenceGraph(db, campaign="small") as g:
        for rec in s["history"]:
            record_round(g, small_campaign.out, rec, "sim")
        promo = promotions_for(g, s["champion"], campaign="small")[0]
        claim = next(e.src for e in g.edges(dst=promo.id, relation="supports") if e.src.startswith("claim:"))
    code, out, err = cli(capsys, "evidence", "revoke", claim, "--reason", "the rule changed", "--db", str(db))
    assert code == 0, err
    assert f"flagged {promo.id}" in out
    code, out, _ = cli(capsys, "evidence", "show", "--db", str(db), "--kind", "decision")
    assert code == 0 and "flagged" in out
    code, out, _ = cli(capsys, "evidence", "show", "--db", str(db), "--contested")
    assert code == 0 and "0 node(s)" in out
    code, _, err = cli(capsys, "evidence", "revoke", "claim:nope", "--reason", "x", "--db", str(db))
    assert code == 2 and "no such node" in err
    code, _, err = cli(capsys, "evidence", "show", "--db", str(tmp_path / "missing.db"))
    assert code == 2 and "no evidence graph" in err and not (tmp_path / "missing.db").exists()


def _unknown(step: TraceStep, owner: str = "unknown", tool: str = "issue_store_credit") -> EvidencePacket:
    return EvidencePacket(
        id=f"{owner}-wrong_args-{tool}",
        corpus="c",
        owner=owner,
        opportunity="unknown" if owner == "unknown" else "present",
        patchability="unknown" if owner == "unknown" else "memory",
        kind="wrong_args",
        tool=tool,
        detail="" if owner == "unknown" else "the credit is capped",
        episodes=[step.episode_id],
        items=["credit-001"],
        claims=[
            Claim(
                statement="failed writes of issue_store_credit",
                evidence=[Citation(episode_id=step.episode_id, step=3, hash=step.hash)],
            )
        ],
    )


def _diagnosed_round(out: Path, n: int, packets: list[EvidencePacket], traces: pd.DataFrame, bench: str) -> dict:
    rd = out / "rounds" / f"r{n:02d}"
    (rd / "train").mkdir(parents=True)
    traces.to_parquet(rd / "train" / "traces.parquet", index=False)
    (rd / "diagnosis.json").write_text(json.dumps([p.model_dump() for p in packets]))
    return {
        "round": n,
        "round_dir": f"rounds/r{n:02d}",
        "verdict": "reject",
        "benchmark_digest": bench,
        "parent": {"version": "M0", "digest": "p" * 64},
    }


def test_an_open_question_is_answered_by_a_later_finding_or_expires_with_its_digest(tmp_path, capsys):
    from components.evidence.graph_record import open_questions

    step = _step("credit-001#0")
    traces = steps_frame([step], item_id="credit-001", seed=0)
    out, db, b1, b2 = tmp_path / "camp", tmp_path / "e.db", "b" * 64, "c" * 64
    here = Expiry(benchmark=b1, model="sim")
    with EvidenceGraph(db, campaign="c") as g:
        record_round(
            g,
            out,
            _diagnosed_round(out, 1, [_unknown(step), _unknown(step, tool="modify_user_address")], traces, b1),
            "sim",
        )
        asked = open_questions(g, here)
        assert sorted(q.data["tool"] for q in asked) == ["issue_store_credit", "modify_user_address"]
    code, shown, _ = cli(capsys, "evidence", "show", "--open", "--db", str(db), "--benchmark", b1)
    assert code == 0 and all(q.id in shown for q in asked)
    with EvidenceGraph(db, campaign="c") as g:
        # a later round explains the store-credit failures: that question is answered by the finding, kept, closed
        counts = record_round(g, out, _diagnosed_round(out, 2, [_unknown(step, owner="E")], traces, b1), "sim")
        assert counts["answered"] == 1
        (left,) = open_questions(g, here)
        assert left.data["tool"] == "modify_user_address"
        credit = next(q for q in asked if q.data["tool"] == "issue_store_credit")
        (edge,) = g.edges(dst=credit.id, relation="supersedes")
        assert g.get(edge.src).data["owner"] == "E" and g.get(credit.id) is not None
        # the same finding in a later round answers nothing twice
        assert (
            record_round(g, out, _diagnosed_round(out, 3, [_unknown(step, owner="E")], traces, b1), "sim")["answered"]
            == 0
        )
        # a question on the previous benchmark digest is not open on the new one; an unknown model changes nothing
        assert open_questions(g, Expiry(benchmark=b2, model="sim")) == []
        assert [q.id for q in open_questions(g, Expiry(benchmark=b1))] == [left.id]
        # nor does the projection show answered or expired questions
        shown_q = project(g, [], here, 4000)["open_questions"]
        assert [q["id"] for q in shown_q] == [left.id]
        assert project(g, [], Expiry(benchmark=b2, model="sim"), 4000)["open_questions"] == []
    code, shown, _ = cli(capsys, "evidence", "show", "--open", "--db", str(db), "--benchmark", b1)
    assert code == 0 and left.id in shown and credit.id not in shown and "1 node(s)" in shown
    code, shown, _ = cli(capsys, "evidence", "show", "--open", "--db", str(db), "--benchmark", b2)
    assert code == 0 and "0 node(s)" in shown


def test_a_promotion_whose_card_acts_on_the_tool_answers_the_question(tmp_path):
    from components.evidence.graph_record import answer_questions, open_questions

    step = _step("credit-001#0")
    traces = steps_frame([step], item_id="credit-001", seed=0)
    out, now = tmp_path / "camp", Expiry(benchmark="b" * 64, model="sim")
    with EvidenceGraph(tmp_path / "e.db", campaign="c") as g:
        record_round(g, out, _diagnosed_round(out, 1, [_unknown(step)], traces, "b" * 64), "sim")
        (q,) = open_questions(g, now)
        c = g.add("claim", "credit-rule", "the credit is capped")
        g.cite(c.id, step.episode_id, 3, step.hash)
        g.verify(c.id, trace_resolver(traces))
        v = g.add("decision", "v", "gate", {"type": "gate_verdict", "accept": True})
        other = g.promote("promotion:o", "M1", v.id, [c.id], {"cards": [{"tool": "cancel_pending_order"}]})
        assert answer_questions(g, [other], now) == 0  # a card on another tool explains nothing here
        promo = g.promote("promotion:p", "M2", v.id, [c.id], {"cards": [{"tool": "issue_store_credit"}]})
        assert answer_questions(g, [promo], now) == 1
        assert open_questions(g, now) == [] and [e.src for e in g.edges(dst=q.id, relation="supersedes")] == [promo.id]


def test_evidence_why_by_campaign_directory_shows_that_campaigns_figures(small_campaign, capsys, tmp_path):
    """After a `dvc exp run` of the same name, `evidence why` put the experiment's gate figures inside the default's
    lineage (campaigns that judged the same plan on the same parent share a verdict node, which holds the last
    one's figures). By its directory, a campaign's chain holds its own figures."""
    import copy

    s = small_campaign.summary
    db = tmp_path / "e.db"
    exp_out = tmp_path / "exp"
    shutil.copytree(small_campaign.out, exp_out)
    with EvidenceGraph(db, campaign=s["campaign"]) as g:
        for rec in s["history"]:
            record_round(g, small_campaign.out, rec, "sim")
    with EvidenceGraph(db, campaign=s["campaign"]) as g:  # the experiment, recorded after it: other figures
        for rec in s["history"]:
            other = copy.deepcopy(rec)
            if other.get("gate"):
                other["gate"].update(net=0.777, ci_lo=0.666, ci_hi=0.888)
            plan = exp_out / rec["round_dir"] / "plan.json"
            if plan.is_file():  # its plan reworded, as a campaign that reuses another's plan words it
                reworded = {**json.loads(plan.read_text()), "summary": "REWORDED by the experiment"}
                plan.write_text(json.dumps(reworded))
            record_round(g, exp_out, other, "sim")
    by_name = cli(capsys, "evidence", "why", s["champion"], "--campaign", s["campaign"], "--db", str(db))
    assert by_name[0] == 0 and "net +0.777" in by_name[1]  # what a name finds: the last campaign recorded
    code, out, err = cli(
        capsys, "evidence", "why", s["champion"], "--campaign", str(small_campaign.out), "--db", str(db)
    )
    assert code == 0, err
    promoted = [r for r in s["history"] if r["verdict"] == "accept"]
    assert "+0.777" not in out and all(f"net {r['gate']['net']:+.3f}" in out for r in promoted), out
    assert "REWORDED" not in out and "REWORDED" in by_name[1]
    assert out.count(" verdict (") == len(promoted)
