"""One evolution round three ways, in one run: plain component calls doing the round's whole work (evaluations in the
same shards with their budget holds, citation checks, data contracts, every file the round writes, the commit), the
Prefect flow cold (empty task cache), and the Prefect flow again with the same bytes (everything cached).

    python benchmarks/bench_round.py [--quick]

Reports wall times and the ratios rerun / cold and (last line, the headline) Prefect-cold / plain. The temporary
Prefect server's start is measured separately and not in the round's time (a campaign starts it once)."""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from components.env import quiet_offline  # noqa: E402

def prefect_server():
    """The Prefect server at $PREFECT_API_URL when one is set (the tests pass theirs), else a temporary one."""
    import contextlib
    import os

    from prefect.testing.utilities import prefect_test_harness

    if os.environ.get("PREFECT_API_URL"):
        return contextlib.nullcontext()
    return prefect_test_harness(server_startup_timeout=180)


HOME = Path(tempfile.mkdtemp(prefix="ratchet-bench-"))
quiet_offline(HOME)


def plain_round(p, budget: dict) -> tuple[float, str]:
    """flows.campaign.evolution_round's stages as direct calls, writing the same files."""
    from components.contracts import check_paired_scores
    from components.evidence.packets import verify_citations
    from components.evolution.diagnose import diagnose
    from components.evolution.gate import gate, repair_screen
    from components.evolution.lineage import Lineage
    from components.evolution.meta import PlanContext, make_meta_agent
    from components.evolution.patch import apply_plan
    from components.evolution.report import round_dir, write_csv, write_json
    from components.evolution.validate import fired, static_checks
    from components.memory import digest, load_package
    from components.runtime.evaluate import EvalTables, run_shard, seed_map_hash, shards, summary, write_eval
    from components.worlds import load_benchmark
    from flows.tasks import _charged  # the budget hold each shard takes: plain code, no Prefect

    c = p.campaign
    t = time.perf_counter()
    lineage = Lineage(Path(c.out) / "lineage")
    champ = lineage.champion()
    base, rd, seeds = str(champ.path), round_dir(c.out, 1), list(range(c.seeds))
    b = load_benchmark(p.benchmark.out)
    evals: list[dict] = []

    def ev(package: str, split: str, arm: str, items: list[str] | None = None) -> EvalTables:
        ids = items if items is not None else b.ids(split)
        parts = [_charged(budget, f"plain-{package}-{i}-{split}-{arm}", len(s) * len(seeds),
                          lambda check, s=s: run_shard(package, b, s, seeds, c.model, c.model_cfg, c.max_turns, check))
                 for i, s in enumerate(shards(ids, c.shard_size))]
        tables = EvalTables.concat(parts)
        evals.append({"split": split, "arm": arm, "package_digest": digest(package), "summary": summary(tables.scores)})
        write_json(rd / "evals.json", evals)
        return tables

    train = ev(base, "train", "base")
    corpus = f"{champ.digest}:{b.digest}:{seed_map_hash(b.ids('train'), seeds)}"
    write_eval(rd / "train", train, {"package_digest": champ.digest, "benchmark_digest": b.digest, "split": "train",
                                     "seeds": seeds, "corpus": corpus})
    pkg = load_package(base)
    d = diagnose(train.traces, train.scores, pkg, b.write_tools, corpus, targets=b.meta.get("targets"))
    assert not any(verify_citations(pk, train.traces) for pk in d.packets)
    write_json(rd / "diagnosis.json", [pk.model_dump() for pk in d.packets])
    write_csv(rd / "findings.csv", d.findings_frame().assign(champion=champ.digest[:12]))
    plan = make_meta_agent(c.meta_agent, c.meta_agent_cfg)(
        PlanContext(d.packets, pkg, b, train.traces, train.scores, set(), d.findings))
    write_json(rd / "plan.json", plan.model_dump())
    cand = str(apply_plan(plan, base, rd / "candidate"))
    v, cpkg = static_checks(plan, cand, b)
    probe_items = plan.source_items[: c.probe_items]
    probe = _charged(budget, "plain-probe", len(probe_items),
                     lambda check: run_shard(cpkg, b, probe_items, [0], c.model, c.model_cfg, c.max_turns, check))
    assert v.ok and fired(probe.traces, plan.mechanism)
    write_json(rd / "validation.json", v.as_dict())
    rb, rc = ev(base, "repair", "base", plan.source_items), ev(cand, "repair", "cand", plan.source_items)
    check_paired_scores(rb.scores, rc.scores, "repair screen")
    repair, repair_items = repair_screen(rb.scores, rc.scores, p.gate.material)
    write_json(rd / "repair.json", repair.as_dict())
    write_csv(rd / "repair_items.csv", repair_items)
    db, dc = ev(base, "dev", "base"), ev(cand, "dev", "cand")
    write_csv(rd / "dev_base.csv", db.scores)
    write_csv(rd / "dev_cand.csv", dc.scores)
    check_paired_scores(db.scores, dc.scores, "held-out gate")
    verdict, per_item = gate(db.scores, dc.scores, p.gate.config(),
                             mechanism_fired=fired(dc.traces, plan.mechanism))
    write_json(rd / "gate.json", verdict.as_dict())
    write_csv(rd / "gate_items.csv", per_item)
    rec = {"round": 1, "gate": verdict.as_dict(), "plan_key": plan.key(), "owner": plan.owner, "summary": plan.summary}
    if verdict.accept:
        lineage.commit(cand, digest(cand), 1, rec)
    else:
        lineage.reject(1, {**rec, "verdict": "reject", "reason": verdict.reason}, plan.model_dump())
    write_json(rd / "round.json", rec)
    return time.perf_counter() - t, f"{'accept' if verdict.accept else 'reject'}: {plan.summary}"


def setup(name: str, bench: Path, quick: bool):
    """Params, a started lineage and an open budget wallet for one arm, in its own output directory."""
    from components.evidence.budget import BudgetLedger
    from components.evolution.lineage import Lineage
    from components.params import load_params
    from flows.campaign import budget_spec

    over = {"benchmark.out": str(bench), "campaign.out": str(HOME / name), "campaign.name": name}
    if quick:
        over.update({"campaign.seeds": 1, "gate.n_boot": 1000})
    p = load_params(ROOT / "params.yaml", over)
    Lineage(HOME / name / "lineage").start(ROOT / p.campaign.start)
    budget = budget_spec(p)
    BudgetLedger(budget["db"]).open_wallet(p.campaign.name, p.budget.caps(), wall_seconds=p.budget.wall_seconds,
                                           max_concurrency=p.budget.max_concurrency, max_depth=p.budget.max_depth)
    return p, budget


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="a small benchmark and one seed (the test's size)")
    a = ap.parse_args()

    from components.params import BenchmarkParams

    bench = HOME / "bench"
    BenchmarkParams(out=str(bench), per_family=12 if a.quick else None).materialize()
    p, budget = setup("plain", bench, a.quick)
    plain, what = plain_round(p, budget)

    from flows.campaign import evolution_round

    t = time.perf_counter()
    with prefect_server():
        server = time.perf_counter() - t
        runs = {}
        for name in ("cold", "rerun"):
            p, budget = setup(name, bench, a.quick)
            t = time.perf_counter()
            rec = evolution_round(1, p.model_dump(), budget)
            runs[name] = time.perf_counter() - t
            print(f"  prefect {name:<5} round: {runs[name]:6.2f} s  ({rec['verdict']}: {rec.get('summary')})")
    print(f"  plain calls round:   {plain:6.2f} s  ({what})")
    print(f"  temporary Prefect server start: {server:.1f} s (once per process, not in the round's time)")
    print(f"ratio rerun / cold: {runs['rerun'] / runs['cold']:.3f}")
    print(f"ratio prefect-cold / plain: {runs['cold'] / plain:.2f}")
    shutil.rmtree(HOME, ignore_errors=True)


if __name__ == "__main__":
    main()
