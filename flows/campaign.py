"""The `evolution_round` and `campaign` flows. A round reads like the loop:

    evaluate -> diagnose -> plan -> patch -> validate -> repair screen -> held-out gate -> commit | reject

and the campaign repeats rounds on the committed champion, then certifies the champion against the starting package
on the test split (touched once) and scores the diagnoser against the hidden causes. A round that already has a
lineage record is not run again, so rerunning the same command resumes an interrupted campaign.
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow
from rich.console import Console

from components.contracts import check_benchmark, check_paired_scores
from components.evolution.gate import GateConfig, gate
from components.evolution.lineage import Lineage
from components.evolution.localization import localization_from_rounds
from components.evolution.report import round_dir, write_csv, write_json
from components.evolution.validate import fired
from components.memory.package import digest
from components.params import Params
from components.runtime.evaluate import EvalTables, seed_map_hash, summary, write_eval
from components.tracking.mlflow_log import CampaignTracker
from components.worlds import load_benchmark
from flows.evaluate import submit_eval, task_runner
from flows.tasks import (commit_stage, diagnose_stage, gate_stage, patch_stage, plan_stage, reject_stage, repair_stage,
                         validate_stage)

console = Console(stderr=True)


class _Eval:
    """Evaluate packages with the campaign's seeds, model and shards, on the running flow's task runner."""

    def __init__(self, p: Params):
        self.p, self.seeds = p, list(range(p.campaign.seeds))

    def __call__(self, package: str | Path, label: str, split: str | None = None, items: list[str] | None = None) -> EvalTables:
        c = self.p.campaign
        return submit_eval(str(package), self.p.benchmark.out, self.seeds, split=split, items=items,
                           shard_size=c.shard_size, model=c.model, model_cfg=c.model_cfg, max_turns=c.max_turns,
                           label=label)


@flow(name="evolution_round", flow_run_name="round {round_no}", validate_parameters=False)
def evolution_round(round_no: int, params: dict) -> dict:
    p = Params.model_validate(params)
    c, bench = p.campaign, p.benchmark.out
    lineage = Lineage(Path(c.out) / "lineage")
    champ = lineage.champion()
    base, rd, ev = str(champ.path), round_dir(c.out, round_no), _Eval(p)
    b = load_benchmark(bench)
    record: dict = {"round": round_no, "round_dir": str(rd), "champion_before": champ.name}
    evals: list[dict] = []

    def note(split: str, arm: str, package: str, t: EvalTables) -> EvalTables:
        evals.append({"split": split, "arm": arm, "package_digest": digest(package), "summary": summary(t.scores)})
        write_json(rd / "evals.json", evals)
        return t

    def reject(reason: str, plan=None, verdict: str = "reject", **figures) -> dict:
        rec = {**record, **figures, "reason": reason, "verdict": verdict}
        if plan is not None:
            rec.update(plan_key=plan.key(), owner=plan.owner, summary=plan.summary)
        reject_stage(str(lineage.root), round_no, rec, plan.model_dump() if plan is not None else None)
        write_json(rd / "round.json", rec)
        return rec

    # 1. evaluate the working base on train
    train = note("train", "base", base, ev(base, f"r{round_no} train {champ.name}", split="train"))
    corpus = f"{champ.digest}:{b.digest}:{seed_map_hash(b.ids('train'), ev.seeds)}"
    write_eval(rd / "train", train, {"package_digest": champ.digest, "benchmark_digest": b.digest, "split": "train",
                                     "seeds": ev.seeds, "corpus": corpus})
    # 2. diagnose (traces and package only) into evidence packets with checked citations
    diagnosis = diagnose_stage(train, base, bench, corpus)
    write_json(rd / "diagnosis.json", [pk.model_dump() for pk in diagnosis.packets])
    write_csv(rd / "findings.csv", diagnosis.findings_frame().assign(champion=champ.digest[:12]))
    # 3. plan: one owner, the smallest connected change, never one already rejected
    plan = plan_stage(diagnosis, train, base, bench, corpus, sorted(lineage.rejected_keys()), c.meta_agent,
                      c.meta_agent_cfg)
    if plan is None:
        return reject("no patchable cluster left that was not already tried", verdict="no_plan")
    write_json(rd / "plan.json", plan.model_dump())
    # 4. patch a disposable copy;  5. validate it
    cand = patch_stage(plan, base, str(rd / "candidate"))
    validation = validate_stage(plan, cand, bench, plan.source_items[: c.probe_items], c.model, c.model_cfg, c.max_turns)
    write_json(rd / "validation.json", validation.as_dict())
    if not validation.ok:
        return reject("invalid: " + "; ".join(validation.problems), plan, validation=validation.checks)
    # 6. repair screen on the diagnosed source tasks
    rb = note("repair", "base", base, ev(base, f"r{round_no} repair base", items=plan.source_items))
    rc = note("repair", "cand", cand, ev(cand, f"r{round_no} repair cand", items=plan.source_items))
    repair, repair_items = repair_stage(rb.scores, rc.scores, p.gate.material)
    write_json(rd / "repair.json", repair.as_dict())
    write_csv(rd / "repair_items.csv", repair_items)
    if not repair.ok:
        return reject(f"repair screen: {repair.reason}", plan, repair=repair.as_dict())
    # 7. held-out gate: candidate vs champion on dev, paired seeds, identical benchmark bytes
    db = note("dev", "base", base, ev(base, f"r{round_no} dev {champ.name}", split="dev"))
    dc = note("dev", "cand", cand, ev(cand, f"r{round_no} dev candidate", split="dev"))
    write_csv(rd / "dev_base.csv", db.scores)
    write_csv(rd / "dev_cand.csv", dc.scores)
    verdict, per_item = gate_stage(db.scores, dc.scores, p.gate.model_dump(), fired(dc.traces, plan.mechanism),
                                   validation.checks.get("leakage") != "ok")
    write_json(rd / "gate.json", verdict.as_dict())
    write_csv(rd / "gate_items.csv", per_item)
    figures = {"repair": repair.as_dict(), "gate": verdict.as_dict(), "validation": validation.checks,
               "candidate_digest": digest(cand), "benchmark_digest": b.digest, "mechanism": plan.mechanism,
               "seed_map_hash": seed_map_hash(b.ids("dev"), ev.seeds),
               # what `ratchet reproduce` needs to re-run this gate on the same bytes
               "evaluation": {"benchmark": bench, "split": "dev", "seeds": ev.seeds, "model": c.model,
                              "model_cfg": c.model_cfg, "max_turns": c.max_turns, "gate": p.gate.model_dump()}}
    if not verdict.accept:
        return reject(f"gate: {verdict.reason}", plan, **figures)
    # 8. commit an immutable version (digest recomputed and compared to the one evaluated)
    rec = {**record, **figures, "plan_key": plan.key(), "owner": plan.owner, "summary": plan.summary,
           "reason": verdict.reason}
    version = commit_stage(str(lineage.root), cand, figures["candidate_digest"], round_no, rec)
    rec.update(verdict="accept", version=version)
    write_json(rd / "round.json", rec)
    return rec


@flow(name="campaign", flow_run_name="campaign {name}", validate_parameters=False)
def campaign(params: dict, name: str = "default") -> dict:
    p = Params.model_validate(params)
    c = p.campaign
    out = Path(c.out)
    check_benchmark(p.benchmark.out)  # the data contract, once per campaign
    lineage = Lineage(out / "lineage")
    start = lineage.start(c.start)
    tracker = CampaignTracker(c.name, out, p.model_dump(), c.tracking_uri)
    round_flow = evolution_round.with_options(task_runner=task_runner(c.task_runner, c.workers, c.dask_address))
    for r in range(1, c.rounds + 1):
        rec = lineage.round_record(r) or round_flow(r, p.model_dump())
        rec = lineage.round_record(r) or rec  # the lineage's record carries parent and child digests
        tracker.log_round(rec)
        _say(rec)
        if rec["verdict"] == "no_plan":
            break
    champion = lineage.champion()
    test = certify(p, start.path, champion.path)
    test_evals = test.pop("evals")
    result = {
        "campaign": c.name, "rounds": len([x for x in lineage.records() if x["round"] > 0]),
        "accepted": len(lineage.versions()) - 1, "start_digest": start.digest, "champion": champion.name,
        "champion_digest": champion.digest, "benchmark_digest": load_benchmark(p.benchmark.out).digest,
        "test": test, "localization": localization_from_rounds(out),
        "lineage": [{"version": v.name, "digest": v.digest} for v in lineage.versions()],
        "history": [x for x in lineage.records() if x["round"] > 0], "params": p.model_dump(),
    }
    write_json(out / "summary.json", result)
    tracker.finish(result, out / "summary.json", test_evals)
    return {**result, "mlflow": {"experiment_id": tracker.experiment_id, "run_id": tracker.run_id, "tracking_uri": tracker.uri}}


def certify(p: Params, start: Path, champion: Path) -> dict:
    """Champion vs the starting package on the test split, touched once per campaign, with its paired CI."""
    ev = _Eval(p)
    base = ev(start, "test start", split="test")
    cand = ev(champion, "test champion", split="test")
    check_paired_scores(base.scores, cand.scores, "test certification")
    verdict, _ = gate(base.scores, cand.scores, GateConfig(**p.gate.model_dump()))
    return {"base_mean": verdict.base_mean, "champion_mean": verdict.cand_mean, "net": verdict.net,
            "ci_lo": verdict.ci_lo, "ci_hi": verdict.ci_hi, "n_items": verdict.n_items,
            "n_improved": verdict.n_improved, "n_regressed": verdict.n_regressed,
            "evals": [{"split": "test", "arm": "start", "package_digest": digest(start), "summary": summary(base.scores)},
                      {"split": "test", "arm": "champion", "package_digest": digest(champion),
                       "summary": summary(cand.scores)}]}


def _say(rec: dict) -> None:
    g = rec.get("gate") or {}
    fig = f" net {g['net']:+.3f} CI [{g['ci_lo']:+.3f}, {g['ci_hi']:+.3f}]" if g else ""
    console.print(f"round {rec['round']}: {rec['verdict']:<7} {rec.get('summary') or rec.get('reason', '')}{fig}",
                  highlight=False, markup=False)


def run_campaign(p: Params) -> dict:
    """Run the campaign flow (materializing the benchmark first if it is missing).

    With task_runner `dask` and no scheduler address, one local cluster serves the whole campaign (a cluster per
    flow run would cost seconds each)."""
    from contextlib import ExitStack

    from components.worlds import world

    if not (Path(p.benchmark.out) / "meta.json").exists():
        world(p.benchmark.world).materialize(p.benchmark.out, p.benchmark.seed)
    c = p.campaign
    with ExitStack() as stack:
        if c.task_runner == "dask" and not c.dask_address:
            from distributed import LocalCluster

            cluster = stack.enter_context(LocalCluster(n_workers=c.workers, threads_per_worker=1, processes=True,
                                                       dashboard_address=None))
            p = p.model_copy(update={"campaign": c.model_copy(update={"dask_address": cluster.scheduler_address})})
            c = p.campaign
        flow_ = campaign.with_options(task_runner=task_runner(c.task_runner, c.workers, c.dask_address))
        return flow_(p.model_dump(), name=c.name)


