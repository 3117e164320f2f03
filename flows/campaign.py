"""The `evolution_round` and `campaign` flows. A round reads like the loop:

    evaluate -> diagnose -> plan -> patch -> validate -> repair screen -> held-out gate -> commit | reject

and the campaign repeats rounds on the committed champion, then certifies the champion against the starting package
on the test split (touched once) and scores the diagnoser against the hidden causes.

Operating it safely: the campaign holds an exclusive lock on its lineage; every evaluation shard reserves budget
before it runs and reconciles after; after each stage the campaign's state is written atomically to
`<out>/.state/state.json`. A round that already has a lineage record is not run again, and the stages of an
interrupted round come back from Prefect's task cache, so rerunning the same command (or `ratchet campaign resume`)
finishes a killed campaign with the lineage a clean run would have produced. A completed round is also kept whole,
under a key of every input it reads, so a round rerun on the same inputs is one lookup and a replay (`play_round`).

The round's composition (`run_round`) takes its stage calls as `Steps`: the Prefect tasks for the flow, the same
functions called directly for the plain-calls baseline that benchmarks/bench_round.py measures the flow against.

A campaign owns its output directory (marked `campaign`): `prepare` refuses, before any work, an output that is a file,
an input, or a directory Ratchet did not write, and a rerun whose start package, benchmark or evolution params
differ from what the lineage recorded (`Params.identity`; what may change is `RERUN_MAY_CHANGE`). Paths recorded in
the campaign are relative to it, so a moved or copied campaign resumes and reproduces where it now is.
"""

from __future__ import annotations

import pickle
import zlib
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any
from uuid import UUID

from prefect import flow
from rich.console import Console

from components.evidence.budget import BudgetExceeded, BudgetLedger
from components.evidence.graph_record import (champion_chain, memory_for_round, model_id, open_graph,
                                              record_campaign_round)
from components.errors import InputError, Unavailable
from components.codes import Verdict
from components.evolution.diagnose import Diagnosis
from components.evolution.alpha import Spending, account, refund_design
from components.evolution.gate import PromotedAs, GateResult, RepairResult, SequentialDesign, gate
from components.evolution.idle import Idle, IdleKind, ablations, next_retry
from components.evolution.lineage import CampaignMismatch, Lineage, LineageLock, Version
from components.evolution.meta import PlanOutcome
from components.evolution.plan import Plan
from components.evolution.record import ArmTokens, DevLook, RoundRecord, StageTokens
from components.evolution.localization import localization_from_rounds
from components.evolution.power import components as power_components, mde
from components.evolution.report import round_dir, write_csv, write_json
from components.evolution.validate import Validation, fired, foreign_tools
from components.failpoints import failpoint
from components.version import code_version
from components.io import atomic_write_bytes, claim_output, mark_output, output_kind, remove_output
from components.memory.package import digest, load_package
from components.models.callcache import deterministic, saved
from components.params import Params, recorded_path
from components.runtime.evaluate import EvalTables, benchmark_at, eval_items, seed_map_hash, summary, write_eval
from components.tracking.mlflow_log import CampaignTracker
from components.worlds import Benchmark, load_benchmark, party_model, run_settings, world
from flows.evaluate import auto_shard, submit_eval, task_runner
from flows.prefect_setup import quiet_expected_failures, tie_temporary_server_to_this_process
from flows.tasks import (PERSIST, benchmark_contract, causes_stage, commit_stage, diagnose_stage, gate_look_stage,
                         paired_contract, patch_stage, plain_eval,
                         plan_stage, reject_stage, repair_look_stage, stage_key, tree_digest, validate_stage)

quiet_expected_failures()
console = Console(stderr=True, soft_wrap=True)  # one line per round, however narrow the terminal
STATE = ".state"  # under the campaign's output dir; excluded from DVC (ids, timestamps, the budget ledger)


def state_dir(out: str | Path) -> Path:
    return Path(out) / STATE


def _stage_done(p: Params, round_no: int, stage: str, **extra) -> None:
    """Record progress atomically, then honour a failpoint at this boundary (crash tests)."""
    write_json(state_dir(p.campaign.out) / "state.json", {"round": round_no, "stage": stage, **extra})
    failpoint(f"round{round_no}:{stage}")


def budget_spec(p: Params) -> dict:
    b, c = p.budget, p.campaign
    # a deterministic model's replies are stored per campaign: a request asked again (the same champion's episodes,
    # a candidate's up to its patch's first effect) is not paid twice, and the tables stay byte-identical
    return {"db": str(state_dir(c.out) / "budget.sqlite"), "wallet": c.name,
            "call_cache": str(state_dir(c.out) / "calls.sqlite") if deterministic(c.model, c.model_cfg) else None,
            # a served model's finished episodes, one file each while a shard runs: a killed shard resumes them
            "episodes": str(state_dir(c.out) / "episodes") if c.model != "sim" else None,
            "estimate": {"max_turns": c.max_turns, "tokens_in_per_call": b.est_tokens_in_per_call,
                         "tokens_out_per_call": b.est_tokens_out_per_call, "price_in_per_1k": b.price_in_per_1k,
                         "price_out_per_1k": b.price_out_per_1k,
                         # a user simulated by a model answers every turn, from the same budget
                         **({"party_calls_per_turn": 1} if party_model(run_settings(p.benchmark.world)) else {})}}


def identity(p: Params) -> dict:
    """The campaign's identity (`Params.identity`) and the world's settings outside the benchmark that change its
    episodes (`components.worlds.run_settings`: a user simulator's model, read where the campaign runs): a rerun with
    another user is another campaign. Absent for a world that has none (its identity as before)."""
    ident = p.identity()
    settings = run_settings(p.benchmark.world)
    if settings:
        ident["world.settings"] = settings
    return ident


def run_key(p: Params) -> str:
    """What the train corpus's name adds to the package, benchmark and seeds: the agent's model and the world's
    settings, when not the offline default (sim, no settings): a diagnosis of another model's or another user's
    episodes is another diagnosis (its stage is cached by the corpus). "" for the default (its names as before)."""
    import hashlib
    import json

    c = p.campaign
    settings = run_settings(p.benchmark.world)
    if c.model == "sim" and not c.model_cfg and not settings:
        return ""
    ident = identity(p)
    what = {k: ident.get(k) for k in ("campaign.model", "campaign.model_cfg", "world.settings")}
    return ":" + hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:12]


@dataclass(frozen=True)
class Steps:
    """The stage calls a round makes. The flow's are Prefect tasks (cached, persisted, observable); `plain_steps()`
    are the very same functions called directly. One composition (`run_round`) takes either, so the flow and the
    plain-calls baseline of benchmarks/bench_round.py cannot drift apart."""
    evaluate: Callable[..., EvalTables]
    causes: Callable
    diagnose: Callable
    plan: Callable
    patch: Callable
    validate: Callable
    repair_look: Callable
    gate_look: Callable
    commit: Callable
    reject: Callable


PREFECT_STEPS = Steps(submit_eval, causes_stage, diagnose_stage, plan_stage, patch_stage, validate_stage,
                      repair_look_stage, gate_look_stage, commit_stage, reject_stage)


def plain_steps(workers: int) -> Steps:
    """The same stage functions without Prefect: shards on a plain thread pool of the flow's size."""
    return Steps(partial(plain_eval, workers=workers),
                 *(t.fn for t in (causes_stage, diagnose_stage, plan_stage, patch_stage, validate_stage,
                                  repair_look_stage, gate_look_stage, commit_stage, reject_stage)))


class _Eval:
    """Evaluate packages with the campaign's seeds, model, shards and budget (on the running flow's task runner when
    the steps are Prefect's)."""

    def __init__(self, p: Params, budget: dict, steps: Steps = PREFECT_STEPS):
        self.p, self.budget, self.seeds, self.steps = p, budget, list(range(p.campaign.seeds)), steps

    def __call__(self, package: str | Path, label: str, split: str | None = None, items: list[str] | None = None,
                 seeds: list[int] | None = None) -> EvalTables:
        c, seeds = self.p.campaign, self.seeds if seeds is None else seeds
        n_items = None if c.shard_size is not None else (  # only `shard_size: null` sizes shards to the look
            len(eval_items(self.p.benchmark.out, split, items)))
        return self.steps.evaluate(str(package), self.p.benchmark.out, seeds, split=split, items=items,
                                   shard_size=self.shard_items(seeds, n_items), model=c.model,
                                   model_cfg=c.model_cfg, max_turns=c.max_turns, label=label, budget=self.budget)

    def shard_items(self, seeds: list[int], n_items: int | None = None) -> int:
        """Items per task: `campaign.shard_size` at the campaign's seeds, more when a look runs fewer seeds, so every
        task holds about shard_size x seeds episodes. A look at one seed of three would otherwise be three times the
        tasks for the same episodes, and each task run costs Prefect's bookkeeping (its engine, three state events
        the server records, a persisted result). The shards a look is cut into never change a score table: the
        tables are sorted by (item, seed) when gathered. Deterministic, so a champion's cells keep their cache keys.
        `shard_size: null`: sized to the look's items and the workers (`flows.evaluate.auto_shard`)."""
        c = self.p.campaign
        if c.shard_size is None:
            return auto_shard(n_items or 1, len(seeds), c.workers)
        return max(1, c.shard_size * len(self.seeds) // max(1, len(seeds)))


def by_looks(groups: list[tuple[list[str], list[int]]], arms: dict, judge):
    """Evaluate the arms look by look, each look's (items, seeds) cells in shards, and ask `judge(tables so far,
    look)` after each; stop at its first answer that is not None. `arms[name](items, seeds, look)` evaluates one
    arm's cells. Returns (the arms' tables over the cells evaluated, the judge's answer)."""
    got: dict[str, list[EvalTables]] = {k: [] for k in arms}
    for g, (items, seeds) in enumerate(groups, start=1):
        for k, run in arms.items():
            got[k].append(run(items, seeds, g))
        tables = {k: EvalTables.concat(v) for k, v in got.items()}
        answer = judge(tables, g)
        if answer is not None:
            return tables, answer
    raise AssertionError("unreachable: the last look always decides")


def _reused(train: EvalTables, items: list[str], seeds: list[int]) -> EvalTables | None:
    """The champion's train episodes on `items` (every seed), if the train evaluation holds them all: the same
    (package, item, seed) episodes a new evaluation would run, at no cost."""
    s = train.scores
    rows = s[s["item_id"].isin(set(items)) & s["seed"].isin(set(seeds))]
    if len(rows) != len(items) * len(seeds) or len(set(items)) != len(items):
        return None
    keep = lambda df: df[df["item_id"].isin(set(items)) & df["seed"].isin(set(seeds))]  # noqa: E731
    return EvalTables(rows.reset_index(drop=True), keep(train.traces).reset_index(drop=True),
                      keep(train.causes).reset_index(drop=True) if len(train.causes) else train.causes)


def dev_look(lineage: Lineage, round_no: int, p: Params) -> DevLook:
    """This round's look at dev: its number among the campaign's looks and the alpha it may spend
    (`gate.campaign_spending`, components/evolution/alpha.py: linear, or the wealth left over the rounds left).
    Counted from the lineage records, so a resumed campaign numbers looks and shares alpha the same way."""
    g = p.gate
    earlier = [r for r in lineage.rounds() if r.round < round_no]
    k = 1 + sum(1 for r in earlier if r.dev_look)
    w = account(earlier, g.campaign_alpha, p.campaign.rounds, g.campaign_spending)
    share = w.share(round_no)
    extra = {} if g.campaign_spending == Spending.LINEAR else {"rule": str(g.campaign_spending), "wealth": w.wealth}
    return DevLook(look=k, alpha=2 * share, spent=w.spent + share, campaign_alpha=g.campaign_alpha, **extra)


def dev_looks(history: Sequence[RoundRecord | dict[str, Any]], campaign_alpha: float) -> dict[str, Any]:
    """Every look at dev (round, plan, verdict, alpha, what it promoted as) and the one-sided alpha they spent of the
    campaign's budget (under the wealth rule, a promotion's share is given back: `alpha_returned`)."""
    rounds = [(r, r.dev_look) for r in map(RoundRecord.of, history) if r.dev_look is not None]
    looks: list[dict[str, Any]] = [
        {"round": r.round, "look": x.look, "plan": r.plan_key or "", "verdict": r.verdict, "alpha": x.alpha,
         **({"kind": "retry" if r.retry else "ablation"} if r.retry or r.ablation else {}),
         **({"promoted_as": r.promoted_as} if r.promoted_as else {})} for r, x in rounds]
    rule = next((x.rule for _, x in rounds if x.rule), None)
    if rule is None and not any(x.reserved is not None for _, x in rounds):
        return {"looks": looks, "n": len(looks), "alpha_spent": sum(x.alpha / 2 for _, x in rounds),
                "campaign_alpha": campaign_alpha}
    w = account([r for r, _ in rounds], campaign_alpha, max([1] + [r.round for r, _ in rounds]), rule or "linear")
    return {"looks": looks, "n": len(looks), "alpha_spent": w.spent, "alpha_returned": w.returned,
            "rule": rule or "linear", "campaign_alpha": campaign_alpha}


@flow(name="evolution_round", flow_run_name="round {round_no}", validate_parameters=False)
def evolution_round(round_no: int, params: dict, budget: dict) -> RoundRecord:
    p = Params.model_validate(params)
    key, trail = round_key(round_no, p, Lineage(Path(p.campaign.out) / "lineage")), Trail()
    rec = run_round(round_no, p, budget, PREFECT_STEPS, trail)
    keep_round(key, round_dir(p.campaign.out, round_no), trail)  # for a rerun on the same inputs: see play_round
    return rec


@dataclass
class Trail:
    """What a round did besides writing its round directory: the progress it recorded, its lineage write, and what its
    plan read from the campaign memory. Kept with the round's files so that a rerun on the same inputs replays it."""
    stages: list[tuple[str, dict]] = field(default_factory=list)
    action: tuple = ()
    memory: dict | None = None
    memory_inputs: tuple | None = None  # (packets, train traces): to ask the campaign memory again on a replay


@dataclass
class RoundFiles:
    """Everything a round writes, in one place: its round directory's files, the evaluations it noted (evals.json,
    rewritten as each is added), and its progress (`.state/state.json`, a failpoint after each stage), which the
    trail keeps for a replay."""
    p: Params
    round_no: int
    rd: Path
    trail: Trail
    evals: list[dict] = field(default_factory=list)

    def json(self, name: str, obj) -> None:
        write_json(self.rd / name, obj)

    def csv(self, name: str, df) -> None:
        write_csv(self.rd / name, df)

    def note(self, split: str, arm: str, package: str, t: EvalTables, **extra) -> EvalTables:
        self.evals.append({"split": split, "arm": arm, "package_digest": digest(package), "summary": summary(t.scores),
                           **extra})
        self.json("evals.json", self.evals)
        return t

    def done(self, stage: str, **extra) -> None:
        self.trail.stages.append((stage, extra))
        _stage_done(self.p, self.round_no, stage, **extra)


@dataclass
class Round:
    """One round's fixed inputs: the campaign's params, the champion it starts from, the benchmark, the stage calls,
    and where it writes."""
    no: int
    p: Params
    steps: Steps
    lineage: Lineage
    champ: Version
    bench: Benchmark
    ev: _Eval
    files: RoundFiles

    @classmethod
    def open(cls, round_no: int, p: Params, budget: dict, steps: Steps, trail: Trail) -> Round:
        lineage = Lineage(Path(p.campaign.out) / "lineage")
        rd = round_dir(p.campaign.out, round_no)
        return cls(round_no, p, steps, lineage, lineage.champion(), benchmark_at(p.benchmark.out),
                   _Eval(p, budget, steps), RoundFiles(p, round_no, rd, trail))

    @property
    def base(self) -> str:
        return str(self.champ.path)

    @property
    def c(self):
        return self.p.campaign

    def record(self, **fields) -> RoundRecord:
        return RoundRecord(round=self.no, round_dir=self.files.rd.relative_to(self.c.out).as_posix(),  # the campaign moves
                           champion_before=self.champ.name, **fields)


@dataclass
class Train:
    """The champion's train evaluation (with the hidden causes beside it) and the corpus its citations resolve in."""
    tables: EvalTables
    corpus: str


@dataclass
class Candidate:
    path: str
    digests: dict  # candidate_digest, benchmark_digest: recorded by every round with a candidate


@dataclass
class Repair:
    result: RepairResult
    sequential: dict
    tokens: ArmTokens | None = None  # prompt tokens per episode of both arms on the cells screened


@dataclass
class Gate:
    result: GateResult
    sequential: dict
    look: DevLook  # this round's look at dev
    cfg: dict  # the gate's config at this look's alpha
    seeds: list[int] = field(default_factory=list)  # the dev seeds (the campaign's, or a retry's fresh block)
    tokens: ArmTokens | None = None  # prompt tokens per episode of both arms on the dev cells the gate saw


def tokens_per_episode(base: EvalTables | None, cand: EvalTables | None) -> ArmTokens | None:
    """Mean prompt tokens per episode of each arm over the same (item, seed) cells (the candidate's cells: a reused
    base side holds every look), episodes that errored in either arm left out; None without the column."""
    if base is None or cand is None or "tokens_in" not in cand.scores.columns or cand.scores.empty:
        return None
    keys = ["item_id", "seed"]
    c = cand.scores
    b = base.scores.merge(c[keys], on=keys)
    bad = set()
    for df in (b, c):
        if "error" in df.columns:
            e = df["error"].fillna("").astype(str) != ""
            bad |= set(zip(df.loc[e, "item_id"], df.loc[e, "seed"]))
    ok = lambda df: df[[(i, s) not in bad for i, s in zip(df["item_id"], df["seed"])]]  # noqa: E731
    b, c = ok(b), ok(c)
    if b.empty or c.empty:
        return None
    return ArmTokens(base=round(float(b["tokens_in"].mean()), 2), cand=round(float(c["tokens_in"].mean()), 2))


def evaluate_train(r: Round) -> Train:
    """1. evaluate the working base on train; the hidden causes beside it (ignored by DVC: drawn on MLflow traces)."""
    c, ev = r.c, r.ev
    train = r.files.note("train", "base", r.base, ev(r.base, f"r{r.no} train {r.champ.name}", split="train"))
    corpus = f"{r.champ.digest}:{r.bench.digest}:{seed_map_hash(r.bench.ids('train'), ev.seeds)}{run_key(r.p)}"
    learned = tuple(c.model_cfg.get("learned") or ()) if c.model == "sim" else ()
    causes = r.steps.causes(train.scores, r.base, r.p.benchmark.out, c.max_turns,
                            **({"learned": learned} if learned else {}))
    write_eval(r.files.rd / "train", EvalTables(train.scores, train.traces, causes, timings=train.timings),
               {"package_digest": r.champ.digest, "benchmark_digest": r.bench.digest, "split": "train",
                "seeds": ev.seeds, "corpus": corpus})
    r.files.done("evaluate")
    return Train(train, corpus)


def diagnose_train(r: Round, train: Train) -> Diagnosis:
    """2. diagnose (traces and package only) into evidence packets with checked citations."""
    diagnosis = r.steps.diagnose(train.tables, r.base, r.p.benchmark.out, train.corpus)
    r.files.json("diagnosis.json", [pk.model_dump() for pk in diagnosis.packets])
    r.files.csv("findings.csv", diagnosis.findings_frame().assign(champion=r.champ.digest[:12]))
    r.files.done("diagnose")
    return diagnosis


def plan_round(r: Round, train: Train, diagnosis: Diagnosis) -> PlanOutcome:
    """3. plan: one owner, the smallest connected change, never one already rejected (in this campaign, or on the same
    evidence in the campaign memory); a promotion the current data contradicts is proposed for revocation."""
    c, p, trail = r.c, r.p, r.files.trail
    memory = memory_for_round(p.evidence, c.name, diagnosis.packets, train.tables.traces, r.base, r.bench.digest,
                              model_id(c.model, c.model_cfg), c.out)
    r.files.json("memory.json", memory.record())
    trail.memory = memory.record()
    if p.evidence.memory:
        trail.memory_inputs = (diagnosis.packets, train.tables.traces)
    outcome = r.steps.plan(diagnosis, train.tables, r.base, p.benchmark.out, train.corpus,
                           sorted(r.lineage.rejected_keys() | set(memory.rejected_here)), c.meta_agent,
                           c.meta_agent_cfg, r.ev.budget,
                           memory={"revocations": memory.revocations, "later": memory.rejected_elsewhere,
                                   "projection": memory.projection}, max_source_items=c.repair_max_items)
    if outcome.replies:  # the llm meta-agent's raw replies, kept whatever became of them
        r.files.json("meta_agent.json", outcome.record(cap=1_000_000))
    if outcome.plan is not None and not outcome.failure:
        r.files.json("plan.json", outcome.plan.model_dump())
    return outcome


def patch_candidate(r: Round, plan: Plan) -> Candidate:
    """4. patch a disposable copy of the champion."""
    cand = r.steps.patch(plan, r.base, str(r.files.rd / "candidate"))
    made = Candidate(cand, {"candidate_digest": digest(cand), "benchmark_digest": r.bench.digest})
    r.files.done("patch")
    return made


def validate_candidate(r: Round, plan: Plan, cand: Candidate) -> Validation:
    """5. validate it: schema, lint, leakage, reachability, activation probe."""
    c = r.c
    validation = r.steps.validate(plan, cand.path, r.p.benchmark.out, plan.source_items[: c.probe_items], c.model,
                                  c.model_cfg, c.max_turns, r.ev.budget)
    r.files.json("validation.json", validation.as_dict())
    r.files.done("validate")
    return validation


@dataclass(frozen=True)
class _Arm:
    """One arm of a look-by-look evaluation: `package`'s cells at each look, noted under (split, arm)."""
    r: Round
    split: str
    arm: str
    package: str
    label: str
    looks_named: bool  # the label and the note name the look (a sequential design), or not

    def __call__(self, items: list[str], seeds: list[int], look: int) -> EvalTables:
        label = self.label + (f" look {look}" if self.looks_named else "")
        t = self.r.ev(self.package, label, items=items, seeds=seeds)
        return self.r.files.note(self.split, self.arm, self.package, t, **({"look": look} if self.looks_named else {}))


@dataclass(frozen=True)
class _RepairJudge:
    """After each look of the repair screen: the screen's answer, or None to look again."""
    r: Round
    base: EvalTables
    design: SequentialDesign
    items: list[str]

    def __call__(self, t: dict, look: int):
        g = self.r.p.gate
        got = self.r.steps.repair_look(self.base.scores, t["cand"].scores, g.material, g.alpha, asdict(self.design),
                                       self.items, self.r.ev.seeds)
        return got if got[0] is not None else None


@dataclass(frozen=True)
class _GateJudge:
    """After each look at dev: the gate's answer, or None to look again (whether the mechanism fired, per look)."""
    r: Round
    mechanism: str
    cfg: dict
    design: SequentialDesign
    dev_ids: list[str]
    leak: bool
    fired_by_look: list[bool] = field(default_factory=list)
    seeds: list[int] | None = None  # the dev seeds (None: the campaign's)

    def __call__(self, t: dict, look: int):
        self.fired_by_look.append(fired(t["cand"].traces, self.mechanism))
        got = self.r.steps.gate_look(t["base"].scores, t["cand"].scores, self.cfg, asdict(self.design), self.dev_ids,
                                     self.seeds or self.r.ev.seeds, self.fired_by_look, self.leak)
        return got if got[0] is not None else None


def repair_screen(r: Round, plan: Plan, cand: Candidate, train: Train) -> Repair:
    """6. repair screen on the diagnosed source tasks. The champion's side is its train evaluation (the same
    episodes: package, item, seed), so only the candidate runs, look by look when sequential."""
    seq, ev = r.p.gate.sequential, r.ev
    rb = _reused(train.tables, plan.source_items, ev.seeds)
    if rb is None:
        rb = r.files.note("repair", "base", r.base, ev(r.base, f"r{r.no} repair base", items=plan.source_items))
    else:
        r.files.note("repair", "base", r.base, rb, reused="train")
    design = seq.design() if seq.repair else SequentialDesign()
    arm = _Arm(r, "repair", "cand", cand.path, f"r{r.no} repair cand", looks_named=True)
    seen, (result, items, sequential) = by_looks(design.groups(plan.source_items, ev.seeds), {"cand": arm},
                                                 _RepairJudge(r, rb, design, plan.source_items))
    r.files.json("repair.json", {**result.as_dict(), "sequential": sequential})
    r.files.csv("repair_items.csv", items)
    r.files.done("repair")
    return Repair(result, sequential, tokens_per_episode(rb, seen["cand"]))


def dev_gate(r: Round, plan: Plan, cand: Candidate, validation: Validation, seeds: list[int] | None = None,
             cheaper: bool = False) -> Gate:
    """7. held-out gate: candidate vs champion on dev, paired seeds, identical benchmark bytes; this look at dev
    spends its share of the campaign's alpha (the same dev items are looked at every round). Sequential: both arms
    look by look, stopping at the first clear verdict; the champion's cells come from the Prefect task cache when it
    was last round's accepted candidate (same package bytes, items, seeds: same shard keys). `seeds`: a retry's
    fresh dev seeds (cells neither arm was evaluated on in any look). `cheaper`: the look may promote as cheaper
    whatever `gate.cheaper` says (an ablation's claim). With `gate.futility_refund`, a look without the cheaper
    claim tests at the refund's lower level and is charged less after a futility stop (alpha.py)."""
    p, ev = r.p, r.ev
    seeds = list(seeds) if seeds else ev.seeds
    look = dev_look(r.lineage, r.no, p)
    design, dev_ids = p.gate.sequential.design(), r.bench.ids("dev")
    gcfg = p.gate.config()
    if cheaper:
        gcfg = replace(gcfg, cheaper=True)
    refund = None
    # the refund is calibrated on futility at a non-positive net; the cheaper claim waits for -material instead
    if p.gate.futility_refund and design.on and not gcfg.cheaper:
        share = look.alpha / 2
        refund = refund_design(tuple(design.fractions(dev_ids, seeds)), design.spending, share)
        look = look.model_copy(update={"reserved": share, "alpha": 2 * refund.level})
    cfg = {**gcfg.__dict__, "alpha": look.alpha}
    arms = {"base": _Arm(r, "dev", "base", r.base, f"r{r.no} dev {r.champ.name}", looks_named=design.on),
            "cand": _Arm(r, "dev", "cand", cand.path, f"r{r.no} dev candidate", looks_named=design.on)}
    judge = _GateJudge(r, plan.mechanism, cfg, design, dev_ids, validation.checks.get("leakage") != "ok",
                       seeds=seeds)
    tables, (result, per_item, sequential) = by_looks(design.groups(dev_ids, seeds), arms, judge)
    r.files.csv("dev_base.csv", tables["base"].scores)
    r.files.csv("dev_cand.csv", tables["cand"].scores)
    r.files.json("gate.json", {**result.as_dict(), "sequential": sequential})
    r.files.csv("gate_items.csv", per_item)
    r.files.done("gate")
    if refund is not None:
        look = look.model_copy(update={"charge": refund.charge(sequential.get("futile_at"))})
    return Gate(result, sequential, look, cfg, seeds, tokens_per_episode(tables["base"], tables["cand"]))


def _tokens(repair: Repair | None, gate: Gate | None) -> dict[str, Any]:
    got = {k: v for k, v in (("repair", repair.tokens if repair else None), ("dev", gate.tokens if gate else None))
           if v is not None}
    return {"tokens": StageTokens(**got)} if got else {}


def gate_figures(r: Round, plan: Plan, cand: Candidate, validation: Validation, repair: Repair | None,
                 gate: Gate) -> dict:
    """What a gated round records, accepted or not (an ablation has no repair screen)."""
    c, design = r.c, r.p.gate.sequential.design()
    looks = {"repair": repair.sequential, "gate": gate.sequential} if repair else {"gate": gate.sequential}
    return {**({"repair": repair.result} if repair else {}), "gate": gate.result, "dev_look": gate.look,
            "validation": validation.checks, "sequential": looks,
            **cand.digests, "mechanism": plan.mechanism, "seed_map_hash": seed_map_hash(r.bench.ids("dev"), gate.seeds),
            # what `ratchet reproduce` needs to re-run this gate on the same bytes (and the same looks)
            "evaluation": {"benchmark": recorded_path(r.p.benchmark.out), "split": "dev", "seeds": gate.seeds,
                           "model": c.model, "model_cfg": c.model_cfg, "max_turns": c.max_turns, "gate": gate.cfg,
                           "sequential": {**asdict(design), "looks_used": gate.sequential["looks_used"]}},
            **_tokens(repair, gate),
            **({"promoted_as": gate.result.promoted_as} if gate.result.accept and gate.result.promoted_as else {})}


def _plan_fields(plan: Plan | None) -> dict:
    return {} if plan is None else {"plan_key": plan.key(), "owner": plan.owner, "summary": plan.summary}


def reject(r: Round, reason: str, plan: Plan | None = None, verdict: Verdict = Verdict.REJECT, **figures) -> RoundRecord:
    """The round ends without a new champion: its lineage record (and the rejected plan), round.json, progress."""
    rec = r.record(**figures, reason=reason, verdict=verdict, **_plan_fields(plan))
    trail = r.files.trail
    trail.action = (Verdict.REJECT, rec.dump(), plan.model_dump() if plan is not None else None)
    r.steps.reject(str(r.lineage.root), r.no, *trail.action[1:])
    r.files.json("round.json", trail.action[1])
    r.files.done("commit", verdict=verdict)
    return rec


def commit(r: Round, plan: Plan, cand: Candidate, figures: dict, reason: str) -> RoundRecord:
    """8. commit an immutable version (digest recomputed and compared to the one evaluated)."""
    fields = {**figures, **_plan_fields(plan), "reason": reason}
    committing = r.record(**fields, verdict=Verdict.ACCEPT).dump()
    del committing["verdict"]  # the lineage's commit sets it
    r.files.trail.action = (Verdict.ACCEPT, cand.digests["candidate_digest"], dict(committing))
    version = r.steps.commit(str(r.lineage.root), cand.path, cand.digests["candidate_digest"], r.no, committing)
    rec = r.record(**fields, verdict=Verdict.ACCEPT, version=version)
    r.files.json("round.json", rec.dump())
    r.files.done("commit", verdict=Verdict.ACCEPT, version=version)
    return rec


def idle_plan(r: Round) -> Idle | None:
    """3b. the meta-agent has no plan: the best plan of the retry pool (gated again on fresh dev seeds), else one
    part of a multi-part card dropped (an ablation), else nothing (components/evolution/idle.py)."""
    p = r.p
    got = next_retry(r.lineage, r.champ.path, p.gate.retries, p.campaign.seeds) if p.gate.retries > 0 else None
    if got is None and p.campaign.ablate:
        got = next(iter(ablations(r.lineage, Path(r.c.out), r.champ.path)), None)
    if got is not None:
        r.files.json("plan.json", got.plan.model_dump())
        r.files.json("idle.json", {"kind": str(got.kind), **got.info.dump()})
    return got


def run_round(round_no: int, p: Params, budget: dict, steps: Steps, trail: Trail | None = None) -> RoundRecord:
    """One round: the stages in order, each through `steps`, writing the round's files and its lineage record."""
    r = Round.open(round_no, p, budget, steps, Trail() if trail is None else trail)
    train = evaluate_train(r)
    diagnosis = diagnose_train(r, train)
    outcome = plan_round(r, train, diagnosis)
    if outcome.failure:
        return reject(r, f"meta-agent: {outcome.failure}", verdict=Verdict.REJECTED_PLAN, meta_agent=outcome.record())
    plan, idle = outcome.plan, None
    if plan is None:
        idle = idle_plan(r)
        if idle is None:
            return reject(r, "no patchable cluster left that was not already tried", verdict=Verdict.NO_PLAN)
        plan = idle.plan
    about: dict[str, Any] = {str(idle.kind): idle.info} if idle else {}
    cand = patch_candidate(r, plan)
    validation = validate_candidate(r, plan, cand)
    if not validation.ok:
        return reject(r, "invalid: " + "; ".join(validation.problems), plan, validation=validation.checks,
                      **cand.digests, **about)
    repair = None
    ablation = idle is not None and idle.kind == IdleKind.ABLATION
    if not ablation:  # an ablation claims no repair: the gate alone judges it
        repair = repair_screen(r, plan, cand, train)
        if not repair.result.ok:
            return reject(r, f"repair screen: {repair.result.reason}", plan, repair=repair.result,
                          sequential={"repair": repair.sequential}, **cand.digests, **_tokens(repair, None), **about)
    gate = dev_gate(r, plan, cand, validation, seeds=idle.seeds if idle else None, cheaper=ablation)
    figures = {**gate_figures(r, plan, cand, validation, repair, gate), **about}
    if not gate.result.accept:
        return reject(r, f"gate: {gate.result.reason}", plan, **figures)
    return commit(r, plan, cand, figures, gate.result.reason)


# -- a whole round from the cache -----------------------------------------------------------------------------------
# A rerun of a round on the same inputs (a resumed or repeated campaign, a new campaign on the same bytes) would find
# every stage in the task cache, but each lookup still costs a task run, and the round a flow run. One lookup of the
# whole round skips them all: its files, progress records and lineage write are kept (compressed, in Prefect's result
# storage) under a key of every input the round reads, and replayed in order. What the plan read from the campaign
# memory is asked again and compared, since the evidence graph changes under the same key.

def round_key(round_no: int, p: Params, lineage: Lineage) -> str:
    """Every input of a round: the code (components/ and flows/), the champion's bytes, the benchmark's bytes, the
    params that shape a round, and what the round reads from the lineage (rejected plans, earlier dev looks)."""
    round_params = p.recorded().model_dump()  # a moved or cloned project's paths: the same key
    # where things run and what they are called, not what they compute (a round's files never name its campaign;
    # the campaign memory, which is per campaign name, is compared on replay)
    for k in ("out", "name", "tracking_uri", "traces_per_round", "task_runner", "workers", "dask_address"):
        round_params["campaign"].pop(k)
    round_params.pop("budget")  # a budget stop leaves no completed round to keep
    round_params["evidence"].pop("db")  # the memory it reads is compared on replay instead
    # what a round without a plan reads (the retry pool, the parts tried): each round's verdict, plan, net, retry
    idle = [(x.round, str(x.verdict), x.plan_key, x.gate.net if x.gate else None, bool(x.retry), bool(x.ablation))
            for x in lineage.rounds() if x.round < round_no]
    return stage_key("round", flows=code_version(Path(__file__).resolve().parent), round=round_no, champion=lineage.champion().digest,
                     bench=tree_digest(p.benchmark.out), params=round_params, rejected=sorted(lineage.rejected_keys()),
                     dev_look=dev_look(lineage, round_no, p).dump(), idle=idle)


def _round_store():
    from prefect.results import ResultStore

    return ResultStore(serializer=PERSIST["result_serializer"], cache_result_in_memory=False)


def keep_round(key: str, rd: Path, trail: Trail) -> None:
    files = {f.relative_to(rd).as_posix(): f.read_bytes() for f in sorted(rd.rglob("*"))
             if f.is_file() and f.name != "round.json"}  # round.json names the committed version: written again
    _round_store().write({"files": files, "stages": trail.stages, "action": trail.action, "memory": trail.memory,
                          "memory_inputs": trail.memory_inputs}, key=key)


# what reading a damaged record raises: the file (OSError), its JSON or base64 (ValueError, pydantic's errors among
# them), the zlib stream, the pickle; anything else is a bug and propagates
UNREADABLE_RECORD = (OSError, ValueError, EOFError, zlib.error, pickle.UnpicklingError)


def replay_round(key: str, round_no: int, p: Params, lineage: Lineage) -> RoundRecord | None:
    """The round kept under `key`, written again: its files, its progress records in order, its lineage write and
    round.json. None when no round is kept there (or it cannot be read, or the campaign memory now says otherwise)."""
    store = _round_store()
    try:
        if not store.exists(key):
            return None
        kept = store.read(key).result
    except UNREADABLE_RECORD:  # a record cut short by a kill is a miss, not an error: the round runs
        return None
    c, rd = p.campaign, round_dir(p.campaign.out, round_no)
    if kept["memory_inputs"] is not None or p.evidence.memory:
        if kept["memory_inputs"] is None:
            return None
        packets, traces = kept["memory_inputs"]
        champ, b = lineage.champion(), load_benchmark(p.benchmark.out)
        now = memory_for_round(p.evidence, c.name, packets, traces, str(champ.path), b.digest,
                               model_id(c.model, c.model_cfg), c.out)
        if now.record() != kept["memory"]:
            return None
    for name, data in kept["files"].items():
        atomic_write_bytes(rd / name, data)
    for stage, extra in kept["stages"][:-1]:
        _stage_done(p, round_no, stage, **extra)
    action = kept["action"]
    if action[0] == Verdict.ACCEPT:
        version = lineage.commit(rd / "candidate", action[1], round_no, action[2]).name
        rec = RoundRecord(**action[2], verdict=Verdict.ACCEPT, version=version)
    else:
        rec = RoundRecord(**action[1])
        lineage.reject(round_no, action[1], action[2])
    write_json(rd / "round.json", rec.dump())
    stage, extra = kept["stages"][-1]
    _stage_done(p, round_no, stage, **{**extra, **({"version": rec.version} if "version" in extra else {})})
    return rec


def play_round(round_no: int, p: Params, budget: dict, round_flow=None) -> RoundRecord:
    """A round as the campaign runs it: replayed whole from the cache when every input is the same, else the round
    flow (whose stages still come from the task cache one by one where their own inputs are the same)."""
    lineage = Lineage(Path(p.campaign.out) / "lineage")
    key = round_key(round_no, p, lineage)
    rec = replay_round(key, round_no, p, lineage)
    if rec is not None:
        return rec
    return (round_flow or evolution_round)(round_no, p.model_dump(), budget)


@flow(name="campaign", flow_run_name="campaign {name}", validate_parameters=False)
def campaign(params: dict, name: str = "default") -> dict:
    # the door: every path below (and every path a task receives, on whichever worker) is absolute from here
    p = Params.model_validate(params).resolved()
    c, out = p.campaign, Path(p.campaign.out)
    prepare(p)
    if not (Path(p.benchmark.out) / "meta.json").exists():
        p.benchmark.materialize(inputs={"start package": c.start, "campaign output": c.out})
    benchmark_contract(str(p.benchmark.out))  # the data contract, once per campaign (cached on the bytes)
    lineage = Lineage(out / "lineage")
    with ExitStack() as stack:
        lock = stack.enter_context(LineageLock(lineage.root, join=True))  # the CLI may hold it: this process's
        _check_rerun(p, lineage)  # again under the lock, now that the benchmark exists
        mark_output(out, "campaign")
        if lock.recovered:
            console.print(f"recovered a stale lineage lock left by {lock.recovered}", highlight=False, markup=False)
        if c.task_runner == "dask" and not c.dask_address:  # one local cluster for the whole campaign
            from distributed import LocalCluster

            cluster = stack.enter_context(LocalCluster(n_workers=c.workers, threads_per_worker=1, processes=True,
                                                       dashboard_address=None))
            c = c.model_copy(update={"dask_address": cluster.scheduler_address})
            p = p.model_copy(update={"campaign": c})
        return _campaign(p, lineage)


def prepare(p: Params, *, force: bool = False) -> None:
    """May this campaign run at `campaign.out`? Checked before any work, one line when not (InputError).

    The output must be new, empty, or this campaign's own; the start package must load; a rerun must keep the
    start bytes, the benchmark bytes and the evolution params its lineage recorded. With `force`, Ratchet's own
    output that does not match is deleted and the campaign starts over (never anything Ratchet did not write)."""
    c = p.campaign
    if c.task_runner == "dask" and c.dask_address:
        from prefect.settings import get_current_settings

        if not get_current_settings().api.url:  # workers that outlive the campaign report to a server that does not
            raise InputError("campaign.dask_address: the Dask workers outlive this campaign, so the Prefect server "
                             "they report to must too: start `ratchet server` (or export PREFECT_API_URL) first")
    bench = _existing_benchmark(p)
    out = claim_output(c.out, "campaign", option="campaign.out", force=force,
                       inputs={"start package": c.start, "benchmark": p.benchmark.out})
    lineage = Lineage(out / "lineage")
    start, started = Path(c.start), lineage.log.exists()
    if not start.is_dir() and not started:  # a started campaign has its M0; the start path is only compared then
        raise InputError(f"{c.start}: campaign.start: {'not a directory' if start.exists() else 'no such directory'}")
    if start.is_dir():
        pkg = load_package(start)  # one line per problem, before anything runs
        foreign = foreign_tools(pkg, bench) if bench is not None else []
        if foreign:  # a start written for another world: refused as eval does
            raise InputError(f"campaign.start: {foreign[0]}")
    if out.is_dir() and any(out.iterdir()):
        LineageLock(lineage.root).probe()  # a running campaign here: say so now, not from inside a flow
        if force and output_kind(out) != "campaign":
            remove_output(out, "Ratchet")
            return
    try:
        _check_rerun(p, lineage)
    except CampaignMismatch:
        if not force:
            raise
        remove_output(out, "campaign")


def _existing_benchmark(p: Params):
    """The benchmark at benchmark.out, used as it is when it exists (None when it is yet to be materialized): one of
    another world than benchmark.world would run the campaign on it silently (the start package follows
    benchmark.world, the tasks follow the files)."""
    meta = Path(p.benchmark.out) / "meta.json"
    if not meta.is_file():
        return None
    bench = load_benchmark(p.benchmark.out)
    if bench.world != p.benchmark.world:
        raise InputError(f"{meta}: world: {bench.world!r}, but benchmark.world is {p.benchmark.world!r} (a benchmark "
                         "of another world at benchmark.out)")
    if bench.receipts != p.benchmark.receipts:  # the same tasks, another world's receipts: refused, never mixed up
        raise InputError(f"{meta}: receipts: {bench.receipts.value!r}, but benchmark.receipts is "
                         f"{p.benchmark.receipts.value!r} (materialize it with --receipts, or set benchmark.out)")
    if bench.protocol != p.benchmark.protocol_for():  # likewise: episodes run another way than asked
        raise InputError(f"{meta}: protocol: {bench.protocol!r}, but benchmark.protocol is "
                         f"{p.benchmark.protocol_for()!r} (materialize it with --protocol, or set benchmark.out)")
    p.benchmark.check_existing(p.benchmark.out)  # every other benchmark.* param: what made it, or refused
    check_items = world(bench.world).check
    if check_items is not None:  # the world's own reading of its files (tau2's database and tasks)
        check_items(bench, sorted(bench.tasks))
    return bench


def _check_rerun(p: Params, lineage: Lineage) -> None:
    if not lineage.log.exists():
        return
    c, bench = p.campaign, Path(p.benchmark.out)
    legacy = None
    summary_file = Path(c.out) / "summary.json"
    if summary_file.is_file():  # a campaign from before identities were recorded
        import json

        try:
            legacy = Params.model_validate(json.loads(summary_file.read_text())["params"]).identity()
        except (ValueError, KeyError, TypeError):
            legacy = None
    lineage.check_rerun(digest(c.start) if Path(c.start).is_dir() else None,
                        digest(bench) if (bench / "meta.json").is_file() else None, identity(p), where=str(c.out),
                        legacy_identity=legacy)


def _campaign(p: Params, lineage: Lineage) -> dict:
    c, out = p.campaign, Path(p.campaign.out)
    open_graph(p.evidence, c.name, check=True).close()  # one that cannot be opened (or is damaged): refused now
    write_json(state_dir(out) / "params.json", p.recorded().model_dump())  # what `ratchet campaign resume` reruns
    budget = budget_spec(p)
    ledger = BudgetLedger(budget["db"])
    wallet = ledger.open_wallet(c.name, p.budget.caps(), wall_seconds=p.budget.wall_seconds,
                                max_concurrency=p.budget.max_concurrency, max_depth=p.budget.max_depth)
    if (released := ledger.recover(wallet)):
        console.print(f"settled {released} budget hold(s) left by a killed process at their full reservation", highlight=False)
    # the ledger is the campaign output's, kept across processes (a resume adds to it): what this process spends is
    # the difference from here
    spent_before = ledger.report(wallet)["spent"]
    start = lineage.start(c.start, load_benchmark(p.benchmark.out).digest, identity(p), source=recorded_path(c.start))
    tracker = CampaignTracker(c.name, out, p.recorded().model_dump(), c.tracking_uri)
    _link_flow_run(tracker)
    round_flow = evolution_round.with_options(task_runner=task_runner(c.task_runner, c.workers, c.dask_address))
    stopped = None
    for r in range(1, c.rounds + 1):
        if lineage.round_record(r) is None:
            try:
                play_round(r, p, budget, round_flow)
            except BudgetExceeded as e:  # stop cleanly between stages; the committed lineage is untouched
                stopped = f"round {r}: {e}"
                break
        kept = lineage.round_record(r)
        assert kept is not None, f"round {r}: played, yet not in the lineage"
        rec = RoundRecord.of(kept)  # as the lineage has it (with its parent and child)
        tracker.log_round(rec)
        record_campaign_round(p.evidence, c.name, out, rec, model_id(c.model, c.model_cfg))  # campaign memory
        _say(rec)
        if rec.stops_campaign:  # the same inputs would plan the same way again
            break
    champion = lineage.champion()
    test = None
    if stopped is None:
        try:
            certification = certify.with_options(task_runner=task_runner(c.task_runner, c.workers, c.dask_address))
            test, test_evals = certification(p, start.path, champion.path, budget)
        except BudgetExceeded as e:
            stopped = f"certification: {e}"
    if stopped:
        console.print(f"stopped: {stopped}", highlight=False, markup=False)
    scored = load_benchmark(p.benchmark.out)
    result = {
        "campaign": c.name, "rounds": len(lineage.rounds()),
        "accepted": len(lineage.versions()) - 1, "start_digest": start.digest, "champion": champion.name,
        "champion_digest": champion.digest, "benchmark_digest": scored.digest,
        "test": test, "stopped": stopped,
        "localization": localization_from_rounds(out, scored.write_tools, scored.meta.get("targets")),
        "episodes": _episodes(out, test),
        # caps, and what the evidence behind this result costs: deterministic, unlike what this process paid
        # (finished work comes from the cache for free); that goes to .state/budget.json and MLflow
        "budget": {"caps": {k: v for k, v in p.budget.caps().items() if v is not None}, "evidence_cost": _cost(out, test)},
        "lineage": [{"version": v.name, "digest": v.digest} for v in lineage.versions()],
        "history": [r.dump() for r in lineage.rounds()], "params": p.recorded().model_dump(),
    }
    settings = run_settings(p.benchmark.world)
    if settings:  # which user simulator ran (a world that has such settings)
        result["world_settings"] = settings
    if scored.protocol != "custom":  # episodes run as a reference orchestrator runs them (a leaderboard's)
        result["protocol"] = scored.protocol
    result["dev_looks"] = dev_looks(lineage.rounds(), p.gate.campaign_alpha)  # held-out reuse, accounted
    if test and test.get("tokens_per_episode"):  # cost as a second objective: the champion beside the built-ins
        result["tokens"] = {"split": "test", "per_episode": test.pop("tokens_per_episode"),
                            "cheaper": [r.round for r in lineage.rounds() if r.promoted_as == PromotedAs.CHEAPER]}
    write_json(out / "summary.json", result)
    ledger_report = ledger.report(wallet)
    ledger_report["reply_store"] = saved(budget.get("call_cache"))  # answered from the store: not paid, still used
    this_run = {k: v - spent_before.get(k, 0.0) for k, v in ledger_report["spent"].items()}
    ledger_report["spent_by_this_run"] = this_run
    write_json(state_dir(out) / "budget.json", ledger_report)
    tracker.finish(result, out / "summary.json", test_evals if test else [], spent=ledger_report["spent"])
    text, chains = champion_chain(p.evidence, c.name, champion.name)  # why the champion is what it is
    tracker.client.log_text(tracker.run_id, text, "evidence/champion_chain.txt")
    # (a list: MLflow writes any JSON-serializable object, though it annotates a dict)
    tracker.client.log_dict(tracker.run_id, chains, "evidence/champion_chain.json")  # type: ignore[arg-type]
    write_json(state_dir(out) / "state.json", {"round": result["rounds"], "stage": "done", "stopped": stopped})
    return {**result, "budget_spent": this_run,
            "mlflow": {"experiment_id": tracker.experiment_id, "experiment": tracker.experiment_name,
                       "registered_model": tracker.model_name, "run_id": tracker.run_id, "tracking_uri": tracker.uri,
                       "links": tracker.links()}}


def _link_flow_run(tracker: CampaignTracker) -> None:
    """The Prefect flow run and the MLflow campaign run name each other: the flow run is tagged `mlflow:<run id>`
    (searchable in Prefect's UI), the MLflow run gets the flow run's id and, when a persistent server with a UI is
    configured, its address (a temporary server's is gone with the process)."""
    from prefect.client.orchestration import get_client
    from prefect.runtime import flow_run
    from prefect.settings import get_current_settings

    fid = flow_run.get_id()
    if not fid:  # called outside a flow run
        return
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(UUID(fid))
        client.update_flow_run(UUID(fid), tags=sorted(set(run.tags) | {f"mlflow:{tracker.run_id}"}))
    tags = {"ratchet.prefect_flow_run": str(fid)}
    settings = get_current_settings()
    if settings.api.url and settings.ui_url:
        tags["ratchet.prefect_flow_run_url"] = f"{settings.ui_url.rstrip('/')}/runs/flow-run/{fid}"
    for k, v in tags.items():
        tracker.client.set_tag(tracker.run_id, k, v)


@flow(name="certification", validate_parameters=False)
def certify(p: Params, start: Path, champion: Path, budget: dict) -> tuple[dict, list[dict]]:
    """Champion vs the starting package on the test split, touched once per campaign, with its paired CI."""
    ev = _Eval(p, budget)
    base = ev(start, "test start", split="test")
    cand = ev(champion, "test champion", split="test")
    paired_contract(base.scores, cand.scores, "test certification")
    verdict, _ = gate(base.scores, cand.scores, replace(p.gate.config(), cheaper=False))  # the score's 95% CI, one claim
    figures = verdict.as_dict()  # as files spell it (a refusal's dropped_errors: -1)
    test = {"base_mean": verdict.base_mean, "champion_mean": verdict.cand_mean, "net": verdict.net,
            "ci_lo": verdict.ci_lo, "ci_hi": verdict.ci_hi, "n_items": verdict.n_items,
            "n_improved": verdict.n_improved, "n_regressed": verdict.n_regressed,
            "dropped_errors": figures["dropped_errors"]}
    if verdict.n_items >= 2:  # beside the certification: the smallest effect this test split could have shown
        var = power_components(base.scores, cand.scores)
        trials = int(base.scores["seed"].nunique())
        # identical arms (no promotion) show no paired variance: an MDE of 0 would claim any effect is detectable
        size = round(mde(verdict.n_items, trials, var, p.gate.alpha), 6) if var.sigma(trials) > 0 else None
        test.update(mde=size, mde_trials=trials, mde_sd_item=round(var.sd_item, 6), mde_sd_trial=round(var.sd_trial, 6))
    evals = [{"split": "test", "arm": "start", "package_digest": digest(start), "summary": summary(base.scores)},
             {"split": "test", "arm": "champion", "package_digest": digest(champion), "summary": summary(cand.scores)}]
    # cost: the champion's prompt tokens per episode beside the world's built-in packages, on the same test cells
    # (their evaluations are for this figure only: the records' test split stays the start and the champion)
    tables = {digest(start): base, digest(champion): cand}
    per_episode = {"champion": _per_episode(cand), "start": _per_episode(base)}
    for name, where in builtin_packages(p.benchmark.world).items():
        d = digest(where)
        if d not in tables:
            tables[d] = ev(where, f"test {name}", split="test")
        per_episode[name] = _per_episode(tables[d])
    test["tokens_per_episode"] = per_episode
    write_json(Path(p.campaign.out) / "test_evals.json", evals)
    return test, evals


TOKEN_BASELINES = ("seed", "all-skills", "reference")  # the built-in packages the champion's cost is set beside


def builtin_packages(world_name: str) -> dict[str, Path]:
    """The world's built-in packages among TOKEN_BASELINES that exist (a world may ship fewer)."""
    from components.params import resolve_start

    out = {}
    for name in TOKEN_BASELINES:
        # absolute: the evaluation may run in a worker whose working directory is another (a Dask worker's)
        where = Path(resolve_start(name, world_name)).resolve()
        if (where / "manifest.yaml").is_file():
            out[name] = where
    return out


def _per_episode(t: EvalTables) -> float | None:
    s = t.scores
    if "tokens_in" not in s.columns or s.empty:
        return None
    ok = s[s["error"].fillna("").astype(str) == ""] if "error" in s.columns else s
    return round(float(ok["tokens_in"].mean()), 2) if len(ok) else None


def _evals(out: Path, test: dict | None) -> list[dict]:
    import json

    files = sorted(out.glob("rounds/r*/evals.json")) + ([out / "test_evals.json"] if test else [])
    return [e for f in files if f.exists() for e in json.loads(f.read_text())]


def _episodes(out: Path, test: dict | None) -> dict:
    """Episodes run across every evaluation of the campaign, and how many errored (a model fault is never a success)."""
    evs = _evals(out, test)
    evs = [e for e in evs if not e.get("reused")]  # the same episodes as another evaluation, counted there
    kinds: dict[str, int] = {}
    for e in evs:
        for k, n in e["summary"].items():
            if k.startswith("errors_"):
                kinds[k.removeprefix("errors_")] = kinds.get(k.removeprefix("errors_"), 0) + n
    counts = {"total": sum(e["summary"]["episodes"] for e in evs), "errors": sum(e["summary"]["errors"] for e in evs)}
    return {**counts, "by_kind": dict(sorted(kinds.items()))} if kinds else counts  # absent without errors: as before


def _cost(out: Path, test: dict | None) -> dict:
    evs = [e for e in _evals(out, test) if not e.get("reused")]
    return {k: sum(e["summary"].get(k, 0) for e in evs) for k in ("tokens_in", "tokens_out", "model_calls", "tool_calls")}


def _say(rec: RoundRecord) -> None:
    from prefect.exceptions import MissingContextError
    from prefect.logging import get_run_logger

    from components.evolution.report import ci_level

    g = rec.gate
    level = ci_level(rec) if g else None
    fig = (f" net {g.net:+.3f} {'' if level is None else f'{100 * level:.4g}% '}CI [{g.ci_lo:+.3f}, "
           f"{g.ci_hi:+.3f}]") if g else ""
    kind = "retry: " if rec.retry else ""
    as_ = " (cheaper)" if rec.promoted_as == PromotedAs.CHEAPER else ""
    line = f"round {rec.round}: {rec.verdict:<7} {kind}{rec.summary or rec.reason}{as_}{fig}"
    console.print(line, highlight=False, markup=False)
    try:  # the campaign flow run's log in Prefect's API (and dashboard) has the same line
        get_run_logger().info(line)
    except MissingContextError:
        pass


def run_campaign(p: Params) -> dict:
    """Run the campaign flow in this process (its rounds and certification run on the configured task runner)."""
    # here, not at import: tying imports the server's code (~2.5 CPU-s) when no server is configured, which only a
    # process that runs a flow needs (a test module or a CLI command that only imports this module does not)
    from flows import finished

    from prefect.settings import get_current_settings

    from flows.signals import server_watched

    tie_temporary_server_to_this_process()
    finished.forget(p.campaign.out)
    try:
        # a persistent server (PREFECT_API_URL, `ratchet server`) that dies stops the campaign within seconds, one
        # line, resumable; a temporary server lives and dies with this process
        with server_watched(get_current_settings().api.url):
            result = campaign(p.model_dump(), name=p.campaign.name)
        if result["stopped"] is None:  # an unchanged rerun is recognized from here on (ratchet campaign run)
            finished.record(p.resolved(), {"budget_spent": result["budget_spent"], "mlflow": result["mlflow"]})
        return result
    except RuntimeError as e:
        if "ephemeral Prefect API server" not in str(e):
            raise
        from prefect.settings import PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS

        waited = PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value()
        raise Unavailable(
            f"Prefect's temporary server did not answer within {waited} s (a busy machine): run the same command "
            "again with PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS=600, or start a server once with `ratchet "
            "server` and export PREFECT_API_URL=http://127.0.0.1:4200/api; the committed rounds are kept") from None
