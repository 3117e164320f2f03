"""Campaign memory: stateless campaigns against recursive ones on a sequence of related campaigns (the evaluation the
recursive-context source proposes: reuse prior failures, update after conflicting evidence, reproduce).

    python benchmarks/bench_memory.py [--quick]

    first       world seed 0, from the seed package; it fills the recursive arm's evidence graph
    (a) seed    the same world with benchmark seed 1, from the seed package
    (b) drift   a changed world: world seed 0 with ONE rule changed (`benchmark.rules`: the rule's value in this
                benchmark, so its digest differs), the rule of a card the first campaign promoted (an amount doubled,
                or the allowed values replaced); from the first campaign's champion, which carries that card, now
                wrong. The recursive arm is expected to see the card contradicted by the new refusals and to propose
                its revocation, a plan the gate judges like any other
    (c) repeat  world seed 0 again, from the seed package

Each of (a), (b) and (c) runs twice: stateless (`evidence.memory: false`, a graph of its own) and recursive (memory
on, the graph every earlier campaign of the sequence wrote). Reported per campaign:

    repeated    plans tried that an earlier campaign of the sequence rejected on the same benchmark digest and model
                (computed from the campaigns' own lineages, not from the graph)
    calls       model calls (the agent's, from every evaluation's score table) until the champion's dev mean first
                reached the stateless arm's final champion dev mean; `-` when it never did
    total       model calls of the whole campaign
    revoked     revocation plans (memory's, removing a promoted card) that the gate accepted
    resolve     share of the graph's supported claims whose every cited trace step exists in the campaign's traces
                with the same hash (checked here against the trace files, independently of the write policy)
    projection  the largest projection the meta-agent read (characters; the limit is evidence.projection_chars)

    reused      plans memory put first: another campaign's accepted plan itself (on the same benchmark digest and
                model), or a plan for a finding whose fix another campaign's gate accepted on other evidence (same
                model); in brackets, how many of them this campaign's gate accepted

"Model calls" are LOGICAL calls: every call the campaign's evaluations asked the model, read from the score tables of
every evaluation its rounds made (what its evidence cost, the same with or without any store). They are not the calls
paid after the reply store (components/models/callcache.py): that store is per campaign (`.state/calls.sqlite` in its
output directory), so the two arms never share one, and a saving here is memory's (fewer rounds, better plans first),
not the store's. The campaigns of one run do share the Prefect task cache, which only makes this script faster (a
shard already evaluated is not run again) and changes no score table, hence no logical count; paid calls are not
reported because that shared cache would make them depend on which campaign ran first.
Last line: the headline ratio, recursive / stateless model calls to reach the same champion score on the first
scenario run (the second seed by default; total model calls when the stateless arm gated nothing).

The first campaign runs stateless (`evidence.memory: false`; it still records into the recursive arm's graph), and it
is also (c)'s stateless arm: a repeat without memory is that campaign again (same benchmark, start, seeds and params;
plans and score tables are deterministic), so it is not run twice. --quick (the test's size) runs only (c), small.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from components.env import quiet_offline  # noqa: E402

HOME = Path(tempfile.mkdtemp(prefix="ratchet-bench-memory-"))
quiet_offline(HOME)
MADE: dict = {}  # benchmark path -> the BenchmarkParams that made it (a campaign on it records those)


def run(name: str, bench: Path, start: Path, db: Path, memory: bool, size: dict) -> dict:
    """One campaign in its own output directory."""
    import ratchet

    out = HOME / "campaigns" / name
    made = {f"benchmark.{k}": v for k, v in MADE[str(bench)].model_dump(mode="json").items()}  # what made it
    p = ratchet.campaign_params(
        ROOT / "params.yaml",
        out=out,
        rounds=size["rounds"],
        overrides={
            **made,
            "campaign.name": name,
            "campaign.start": str(start),
            "campaign.seeds": size["seeds"],
            "gate.n_boot": size["n_boot"],
            "evidence.db": str(db),
            "evidence.memory": memory,
        },
    )
    s = ratchet.campaign(ratchet.CampaignRequest(params=p)).summary
    return {"name": name, "out": out, "summary": s, "memory": memory}


def rounds(c: dict) -> list[dict]:
    """Per round: plan key, verdict, model calls, the champion's dev mean after it."""
    out, champ = [], None
    from components.evolution.report import history

    for rec in history(c["summary"]):
        rd = c["out"] / rec.round_dir
        evals = json.loads((rd / "evals.json").read_text()) if (rd / "evals.json").exists() else []
        if rec.gate:
            champ = rec.gate.cand_mean if rec.accepted else rec.gate.base_mean
        mem = json.loads((rd / "memory.json").read_text()) if (rd / "memory.json").exists() else {}
        key = rec.plan_key or ""
        out.append(
            {
                "plan_key": rec.plan_key,
                "verdict": str(rec.verdict),
                "champion_dev": champ,
                "calls": sum(e["summary"]["model_calls"] for e in evals),
                "projection": mem.get("chars", 0),
                "revocation": bool((mem.get("revocations") or {}).get(key)),
                "reused": bool((mem.get("reused") or {}).get(key)) or _helped(rd, mem),
            }
        )
    return out


def _helped(rd: Path, mem: dict) -> bool:
    """Did this round plan for a finding memory put first (its fix accepted by another campaign on other evidence)?"""
    helped = (mem.get("projection") or {}).get("helped_elsewhere") or []
    if not helped or not (rd / "plan.json").exists():
        return False
    cluster = json.loads((rd / "plan.json").read_text())["cluster"]
    p = next((x for x in json.loads((rd / "diagnosis.json").read_text()) if x["id"] == cluster), None)
    return p is not None and [p["owner"], p["kind"], p["tool"], p.get("rule_id") or ""] in helped


def calls_to(rs: list[dict], target: float | None) -> int | None:
    spent = 0
    for r in rs:
        spent += r["calls"]
        if target is not None and r["champion_dev"] is not None and r["champion_dev"] >= target - 1e-12:
            return spent
    return None


def repeated(c: dict, earlier: list[dict]) -> int:
    """Plans tried here that an earlier campaign rejected on the same benchmark digest (same model throughout)."""
    bench = c["summary"]["benchmark_digest"]
    known = {
        r["plan_key"]
        for e in earlier
        if e["summary"]["benchmark_digest"] == bench
        for r in e["summary"]["history"]
        if r["verdict"] != "accept" and r.get("plan_key")
    }
    return sum(1 for r in c["summary"]["history"] if r.get("plan_key") in known)


def resolution(db: Path, campaigns: list[dict]) -> tuple[int, int]:
    """(supported claims whose citations all resolve in the trace files, supported claims)."""
    import pandas as pd

    from components.evidence.graph import EvidenceGraph

    steps = set()
    for c in campaigns:
        for tp in sorted(c["out"].glob("rounds/r*/train/traces.parquet")):
            t = pd.read_parquet(tp, columns=["episode_id", "step", "hash"])
            steps |= set(zip(t["episode_id"], t["step"].astype(int), t["hash"]))
    with EvidenceGraph(db) as g:
        claims = [n for n in g.nodes("claim") if n.confidence == "supported"]
        ok = sum(
            1
            for n in claims
            if (cites := g.citations(n.id))
            and all((a.data["episode_id"], int(a.data["step"]), a.data["hash"]) in steps for a in cites)
        )
    return ok, len(claims)


def changed_rule(first: dict, db: Path) -> tuple[str, str, dict, str] | None:
    """(rule id, card path, the rules change, the rule's changed statement) for the first card the first campaign
    promoted whose rule can be changed here (an amount doubled, or other allowed values); None when it promoted no
    such card."""
    from components.evidence.graph import EvidenceGraph
    from components.worlds.retail.facts import BY_ID, facts_of
    from components.worlds.retail.rules import OWN, rules_of

    def change(fid: str) -> dict | None:
        if fid not in BY_ID:
            return None
        v = getattr(OWN, fid)
        if fid == "cancel_reason":
            return {fid: {"allowed": ["found a better price", "changed my mind"]}}
        if hasattr(v, "amount"):  # a fee: its amount doubled (5% -> 10%, $8 -> $16)
            return {fid: {**v.model_dump(mode="json"), "amount": str(2 * v.amount)}}
        if v is not None and not isinstance(v, str):  # a rate, a bonus or a cap
            return {fid: str(2 * v)}
        return None

    with EvidenceGraph(db) as g:
        promos = sorted(
            (
                n
                for n in g.nodes("decision")
                if n.data.get("type") == "promotion" and n.data.get("campaign") == first["name"]
            ),
            key=lambda n: n.data.get("round", 0),
        )
        for n in promos:
            for card in n.data.get("cards") or []:  # every rule the card states (one card per write may state several)
                for rule in card.get("rules") or [{"rule_id": card.get("rule_id")}]:
                    changes = change(rule.get("rule_id") or "")
                    if changes:
                        fid = rule["rule_id"]
                        return fid, card["path"], changes, facts_of(rules_of(changes))[fid].statement
    return None


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="(c) only, small: one round, one seed (the test's size)")
    ap.add_argument("--per-family", type=int, help="tasks per family (default 36; quick 3)")
    ap.add_argument("--rounds", type=int, help="rounds of every campaign (default 3; quick 1)")
    ap.add_argument("--seeds", type=int, help="seeds per item (default 1; quick 1)")
    ap.add_argument("--scenarios", help="which of (a) seed, (b) drift, (c) repeat to run (default abc; quick c)")
    args = ap.parse_args(argv)
    args.scenarios = args.scenarios or ("c" if args.quick else "abc")
    size = (
        {"per_family": 3, "rounds": 1, "seeds": 1, "n_boot": 1000}
        if args.quick
        else {"per_family": 36, "rounds": 3, "seeds": 1, "n_boot": 2000}
    )
    size |= {
        k: v
        for k, v in (("per_family", args.per_family), ("rounds", args.rounds), ("seeds", args.seeds))
        if v is not None
    }
    from components.params import BenchmarkParams

    benches = {}
    for seed in (0, 1) if "a" in args.scenarios else (0,):
        benches[seed] = HOME / f"bench-s{seed}"
        MADE[str(benches[seed])] = BenchmarkParams(seed=seed, out=str(benches[seed]), per_family=size["per_family"])
        MADE[str(benches[seed])].materialize()
    seed_pkg = ROOT / "data" / "packages" / "seed"
    memory_db, rows, notes = HOME / "memory.db", [], []
    from flows.prefect_setup import server_for_a_script  # after quiet_offline(HOME), like every flows import

    with server_for_a_script():
        first = run("first", benches[0], seed_pkg, memory_db, False, size)  # stateless; it records into memory_db
        done = [first]
        drift = changed_rule(first, memory_db) if "b" in args.scenarios else None
        sequence = [("(a) seed", benches[1], seed_pkg)] if "a" in args.scenarios else []
        if drift is not None:
            rule, card, changes, statement = drift
            benches["b"] = HOME / "bench-b"
            MADE[str(benches["b"])] = BenchmarkParams(
                seed=0, out=str(benches["b"]), per_family=size["per_family"], rules=changes
            )
            MADE[str(benches["b"])].materialize()
            champion = first["out"] / "lineage" / "versions" / first["summary"]["champion"]
            sequence.append(("(b) drift", benches["b"], champion))
            notes.append(f"(b) drift: rule {rule} (card {card}, promoted by the first campaign) now reads: {statement}")
        elif "b" in args.scenarios:
            notes.append("(b) drift: not run: the first campaign promoted no card whose rule this script can change")
        if "c" in args.scenarios:
            sequence.append(("(c) repeat", benches[0], seed_pkg))
        for label, bench, start in sequence:
            tag = label.split()[0].strip("()")
            # the stateless repeat is the first campaign itself (the same inputs without memory)
            stateless = (
                first
                if tag == "c"
                else run(f"{tag}-stateless", bench, start, HOME / f"{tag}-stateless.db", False, size)
            )
            recursive = run(f"{tag}-recursive", bench, start, memory_db, True, size)
            rs, rr = rounds(stateless), rounds(recursive)
            target = next((r["champion_dev"] for r in reversed(rs) if r["champion_dev"] is not None), None)
            for arm, c, rws in (("stateless", stateless, rs), ("recursive", recursive, rr)):
                rows.append(
                    {
                        "campaign": label,
                        "arm": arm,
                        "repeated": repeated(c, done),
                        "calls": calls_to(rws, target),
                        "reused": f"{sum(r['reused'] for r in rws)} "
                        f"({sum(r['reused'] and r['verdict'] == 'accept' for r in rws)})",
                        "total": sum(r["calls"] for r in rws),
                        "promotions": c["summary"]["accepted"],
                        "revoked": sum(r["revocation"] and r["verdict"] == "accept" for r in rws),
                        "projection": max([r["projection"] for r in rws] + [0]),
                        "plans": " ".join(
                            (r["plan_key"] or "-")[:6] + ("+" if r["verdict"] == "accept" else "x") for r in rws
                        ),
                    }
                )
            done += [c for c in (stateless, recursive) if c not in done]
            if label == "(b) drift":  # does each arm's champion still carry the card with the old, now wrong, value?
                from components.worlds.retail.facts import BY_ID

                rule, card, _changes, _statement = drift
                for arm, c in (("stateless", stateless), ("recursive", recursive)):
                    f = c["out"] / "lineage" / "versions" / c["summary"]["champion"] / card
                    body = f.read_text(encoding="utf-8") if f.is_file() else ""
                    state = (
                        "no such card"
                        if not body
                        else "the OLD (wrong) value"
                        if BY_ID[rule].read(body) == BY_ID[rule].value
                        else "the new value"
                        if BY_ID[rule].read(body) == BY_ID[rule].read(drift[3])
                        else "another value"
                    )
                    notes.append(f"(b) {arm}: champion {c['summary']['champion']}: {card} states {state}")
        ok, n = resolution(memory_db, [first] + [c for c in done if c["memory"] and c is not first])
    print(
        f"campaign memory, {'quick' if args.quick else 'full'}: {size}; first campaign: "
        f"{first['summary']['accepted']} promotion(s) in {first['summary']['rounds']} round(s)"
    )
    print(
        "| campaign | arm | repeated plans | model calls to the stateless champion's dev score | model calls, total "
        "| promotions | revoked | reused plans (accepted) | projection chars | plans (+ accepted, x not) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        calls = "-" if r["calls"] is None else f"{r['calls']:,}"
        print(
            f"| {r['campaign']} | {r['arm']} | {r['repeated']} | {calls} | {r['total']:,} | {r['promotions']} | "
            f"{r['revoked']} | {r['reused']} | {r['projection']:,} | {r['plans']} |"
        )
    print(f"citation resolution: {ok}/{n} supported claims resolve ({(ok / n if n else 1):.0%})")
    for line in notes:
        print(line)
    if args.quick:  # nothing to look into afterwards: leave no temp home behind
        shutil.rmtree(HOME, ignore_errors=True)
    else:
        print(
            f"evidence graph: {memory_db} (ratchet evidence why ... --db {memory_db}); "
            f"campaigns in {HOME / 'campaigns'}"
        )
    label = "(a) seed" if "a" in args.scenarios else rows[0]["campaign"] if rows else None
    a = {r["arm"]: r for r in rows if r["campaign"] == label}
    if not a:
        print("ratio recursive / stateless: no scenario run: 1.000")
        return
    num, den = a["recursive"]["calls"], a["stateless"]["calls"]
    name = {"(a) seed": "second seed", "(b) drift": "changed world", "(c) repeat": "repeat"}[label]
    if num is not None and den:
        print(f"ratio recursive / stateless model calls to the same champion score, {name}: {num / den:.3f}")
    else:  # the stateless arm gated nothing (or the recursive one never got there): the whole campaigns
        print(
            f"ratio recursive / stateless model calls in total, {name}: "
            f"{a['recursive']['total'] / max(1, a['stateless']['total']):.3f}"
        )


if __name__ == "__main__":
    main()
