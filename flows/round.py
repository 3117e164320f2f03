"""A round reads like the loop:

    evaluate -> diagnose -> plan -> patch -> validate -> repair screen -> held-out gate -> commit | reject

`run_round` is that composition; it takes its stage calls as `Steps`: the Prefect tasks for the flow
(`flows.replay.evolution_round`), the same functions called directly for the plain-calls baseline that
benchmarks/bench_round.py measures the flow against. After each stage the round's progress is written atomically to
`<out>/.state/state.json` (`stage_done`), so an interrupted campaign resumes where it stopped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

from components.codes import Verdict
from components.evidence.budget import BudgetSpec
from components.evidence.graph_record import memory_for_round, model_id
from components.evolution.alpha import Spending, account, refund_design
from components.evolution.diagnose import Diagnosis
from components.evolution.gate import GateResult, RepairResult, SequentialDesign
from components.evolution.idle import Idle, IdleKind, ablations, next_retry
from components.evolution.lineage import Lineage, Version
from components.evolution.meta import PlanOutcome
from components.evolution.plan import Plan
from components.evolution.record import ArmTokens, DevLook, RoundRecord, StageTokens
from components.evolution.report import round_dir, write_csv, write_json
from components.evolution.validate import Validation, fired
from components.failpoints import failpoint
from components.memory.package import digest
from components.params import Params, recorded_path
from components.runtime.evaluate import EvalTables, benchmark_at, eval_items, seed_map_hash, summary, write_eval
from components.worlds import Benchmark, run_settings
from flows.evaluate import auto_shard, submit_eval
from flows.tasks import (
    causes_stage,
    commit_stage,
    diagnose_stage,
    gate_look_stage,
    patch_stage,
    plain_eval,
    plan_stage,
    reject_stage,
    repair_look_stage,
    validate_stage,
)

STATE = ".state"  # under the campaign's output dir; excluded from DVC (ids, timestamps, the budget ledger)


def state_dir(out: str | Path) -> Path:
    return Path(out) / STATE


def stage_done(p: Params, round_no: int, stage: str, **extra) -> None:
    """Record progress atomically, then honour a failpoint at this boundary (crash tests)."""
    write_json(state_dir(p.campaign.out) / "state.json", {"round": round_no, "stage": stage, **extra})
    failpoint(f"round{round_no}:{stage}")


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


PREFECT_STEPS = Steps(
    submit_eval,
    causes_stage,
    diagnose_stage,
    plan_stage,
    patch_stage,
    validate_stage,
    repair_look_stage,
    gate_look_stage,
    commit_stage,
    reject_stage,
)


def plain_steps(workers: int) -> Steps:
    """The same stage functions without Prefect: shards on a plain thread pool of the flow's size."""
    return Steps(
        partial(plain_eval, workers=workers),
        *(
            t.fn
            for t in (
                causes_stage,
                diagnose_stage,
                plan_stage,
                patch_stage,
                validate_stage,
                repair_look_stage,
                gate_look_stage,
                commit_stage,
                reject_stage,
            )
        ),
    )


class Eval:
    """Evaluate packages with the campaign's seeds, model, shards and budget (on the running flow's task runner when
    the steps are Prefect's)."""

    def __init__(self, p: Params, budget: BudgetSpec, steps: Steps = PREFECT_STEPS):
        self.p, self.budget, self.seeds, self.steps = p, budget, list(range(p.campaign.seeds)), steps

    def __call__(
        self,
        package: str | Path,
        label: str,
        split: str | None = None,
        items: list[str] | None = None,
        seeds: list[int] | None = None,
    ) -> EvalTables:
        c, seeds = self.p.campaign, self.seeds if seeds is None else seeds
        n_items = (
            None
            if c.shard_size is not None
            # only `shard_size: null` sizes shards to the look
            else (len(eval_items(self.p.benchmark.out, split, items)))
        )
        return self.steps.evaluate(
            str(package),
            self.p.benchmark.out,
            seeds,
            split=split,
            items=items,
            shard_size=self.shard_items(seeds, n_items),
            model=c.model,
            model_cfg=c.model_cfg,
            max_turns=c.max_turns,
            label=label,
            budget=self.budget,
        )

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
    return EvalTables(
        rows.reset_index(drop=True),
        keep(train.traces).reset_index(drop=True),
        keep(train.causes).reset_index(drop=True) if len(train.causes) else train.causes,
    )


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
        {
            "round": r.round,
            "look": x.look,
            "plan": r.plan_key or "",
            "verdict": r.verdict,
            "alpha": x.alpha,
            **({"kind": "retry" if r.retry else "ablation"} if r.retry or r.ablation else {}),
            **({"promoted_as": r.promoted_as} if r.promoted_as else {}),
        }
        for r, x in rounds
    ]
    rule = next((x.rule for _, x in rounds if x.rule), None)
    if rule is None and not any(x.reserved is not None for _, x in rounds):
        return {
            "looks": looks,
            "n": len(looks),
            "alpha_spent": sum(x.alpha / 2 for _, x in rounds),
            "campaign_alpha": campaign_alpha,
        }
    w = account([r for r, _ in rounds], campaign_alpha, max([1] + [r.round for r, _ in rounds]), rule or "linear")
    return {
        "looks": looks,
        "n": len(looks),
        "alpha_spent": w.spent,
        "alpha_returned": w.returned,
        "rule": rule or "linear",
        "campaign_alpha": campaign_alpha,
    }


@dataclass(frozen=True)
class Committed:
    """A round's lineage write on accept: the candidate's digest and the record committed with it (the lineage sets
    its verdict and version)."""

    digest: str
    record: dict[str, Any]


@dataclass(frozen=True)
class Rejected:
    """A round's lineage write without a new champion: its record and the plan turned down (None: no plan)."""

    record: dict[str, Any]
    plan: dict[str, Any] | None


@dataclass
class Trail:
    """What a round did besides writing its round directory: the progress it recorded, its lineage write, and what its
    plan read from the campaign memory. Kept with the round's files so that a rerun on the same inputs replays it."""

    stages: list[tuple[str, dict]] = field(default_factory=list)
    action: Committed | Rejected | None = None
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
        self.evals.append(
            {"split": split, "arm": arm, "package_digest": digest(package), "summary": summary(t.scores), **extra}
        )
        self.json("evals.json", self.evals)
        return t

    def done(self, stage: str, **extra) -> None:
        self.trail.stages.append((stage, extra))
        stage_done(self.p, self.round_no, stage, **extra)


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
    ev: Eval
    files: RoundFiles

    @classmethod
    def open(cls, round_no: int, p: Params, budget: BudgetSpec, steps: Steps, trail: Trail) -> Round:
        lineage = Lineage(Path(p.campaign.out) / "lineage")
        rd = round_dir(p.campaign.out, round_no)
        return cls(
            round_no,
            p,
            steps,
            lineage,
            lineage.champion(),
            benchmark_at(p.benchmark.out),
            Eval(p, budget, steps),
            RoundFiles(p, round_no, rd, trail),
        )

    @property
    def base(self) -> str:
        return str(self.champ.path)

    @property
    def c(self):
        return self.p.campaign

    def record(self, **fields) -> RoundRecord:
        return RoundRecord(
            round=self.no,
            round_dir=self.files.rd.relative_to(self.c.out).as_posix(),  # the campaign moves
            champion_before=self.champ.name,
            **fields,
        )


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
    causes = r.steps.causes(
        train.scores, r.base, r.p.benchmark.out, c.max_turns, **({"learned": learned} if learned else {})
    )
    write_eval(
        r.files.rd / "train",
        EvalTables(train.scores, train.traces, causes, timings=train.timings),
        {
            "package_digest": r.champ.digest,
            "benchmark_digest": r.bench.digest,
            "split": "train",
            "seeds": ev.seeds,
            "corpus": corpus,
        },
    )
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
    memory = memory_for_round(
        p.evidence,
        c.name,
        diagnosis.packets,
        train.tables.traces,
        r.base,
        r.bench.digest,
        model_id(c.model, c.model_cfg),
        c.out,
    )
    r.files.json("memory.json", memory.record())
    trail.memory = memory.record()
    if p.evidence.memory:
        trail.memory_inputs = (diagnosis.packets, train.tables.traces)
    outcome = r.steps.plan(
        diagnosis,
        train.tables,
        r.base,
        p.benchmark.out,
        train.corpus,
        sorted(r.lineage.rejected_keys() | set(memory.rejected_here)),
        c.meta_agent,
        c.meta_agent_cfg,
        r.ev.budget,
        memory={
            "revocations": memory.revocations,
            "later": sorted(set(memory.rejected_elsewhere) | r.lineage.rejected_sites()),
            "projection": memory.projection,
        },
        max_source_items=c.repair_max_items,
    )
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
    validation = r.steps.validate(
        plan,
        cand.path,
        r.p.benchmark.out,
        plan.source_items[: c.probe_items],
        c.model,
        c.model_cfg,
        c.max_turns,
        r.ev.budget,
    )
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
        got = self.r.steps.repair_look(
            self.base.scores, t["cand"].scores, g.material, g.alpha, asdict(self.design), self.items, self.r.ev.seeds
        )
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
        got = self.r.steps.gate_look(
            t["base"].scores,
            t["cand"].scores,
            self.cfg,
            asdict(self.design),
            self.dev_ids,
            self.seeds or self.r.ev.seeds,
            self.fired_by_look,
            self.leak,
        )
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
    seen, (result, items, sequential) = by_looks(
        design.groups(plan.source_items, ev.seeds), {"cand": arm}, _RepairJudge(r, rb, design, plan.source_items)
    )
    r.files.json("repair.json", {**result.as_dict(), "sequential": sequential})
    r.files.csv("repair_items.csv", items)
    r.files.done("repair")
    return Repair(result, sequential, tokens_per_episode(rb, seen["cand"]))


def dev_gate(
    r: Round, plan: Plan, cand: Candidate, validation: Validation, seeds: list[int] | None = None, cheaper: bool = False
) -> Gate:
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
    arms = {
        "base": _Arm(r, "dev", "base", r.base, f"r{r.no} dev {r.champ.name}", looks_named=design.on),
        "cand": _Arm(r, "dev", "cand", cand.path, f"r{r.no} dev candidate", looks_named=design.on),
    }
    judge = _GateJudge(r, plan.mechanism, cfg, design, dev_ids, validation.checks.get("leakage") != "ok", seeds=seeds)
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
    got = {
        k: v
        for k, v in (("repair", repair.tokens if repair else None), ("dev", gate.tokens if gate else None))
        if v is not None
    }
    return {"tokens": StageTokens(**got)} if got else {}


def gate_figures(
    r: Round, plan: Plan, cand: Candidate, validation: Validation, repair: Repair | None, gate: Gate
) -> dict:
    """What a gated round records, accepted or not (an ablation has no repair screen)."""
    c, design = r.c, r.p.gate.sequential.design()
    looks = {"repair": repair.sequential, "gate": gate.sequential} if repair else {"gate": gate.sequential}
    return {
        **({"repair": repair.result} if repair else {}),
        "gate": gate.result,
        "dev_look": gate.look,
        "validation": validation.checks,
        "sequential": looks,
        **cand.digests,
        "mechanism": plan.mechanism,
        "seed_map_hash": seed_map_hash(r.bench.ids("dev"), gate.seeds),
        # what `ratchet reproduce` needs to re-run this gate on the same bytes (and the same looks)
        "evaluation": {
            "benchmark": recorded_path(r.p.benchmark.out),
            "split": "dev",
            "seeds": gate.seeds,
            "model": c.model,
            "model_cfg": c.model_cfg,
            "max_turns": c.max_turns,
            "gate": gate.cfg,
            "sequential": {**asdict(design), "looks_used": gate.sequential["looks_used"]},
        },
        **_tokens(repair, gate),
        **({"promoted_as": gate.result.promoted_as} if gate.result.accept and gate.result.promoted_as else {}),
    }


def _plan_fields(plan: Plan | None) -> dict:
    return {} if plan is None else {"plan_key": plan.key(), "owner": plan.owner, "summary": plan.summary}


def reject(
    r: Round, reason: str, plan: Plan | None = None, verdict: Verdict = Verdict.REJECT, **figures
) -> RoundRecord:
    """The round ends without a new champion: its lineage record (and the rejected plan), round.json, progress."""
    rec = r.record(**figures, reason=reason, verdict=verdict, **_plan_fields(plan))
    trail = r.files.trail
    trail.action = Rejected(rec.dump(), plan.model_dump() if plan is not None else None)
    r.steps.reject(str(r.lineage.root), r.no, trail.action.record, trail.action.plan)
    r.files.json("round.json", trail.action.record)
    r.files.done("commit", verdict=verdict)
    return rec


def commit(r: Round, plan: Plan, cand: Candidate, figures: dict, reason: str) -> RoundRecord:
    """8. commit an immutable version (digest recomputed and compared to the one evaluated)."""
    fields = {**figures, **_plan_fields(plan), "reason": reason}
    committing = r.record(**fields, verdict=Verdict.ACCEPT).dump()
    del committing["verdict"]  # the lineage's commit sets it
    r.files.trail.action = Committed(cand.digests["candidate_digest"], dict(committing))
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


def run_round(round_no: int, p: Params, budget: BudgetSpec, steps: Steps, trail: Trail | None = None) -> RoundRecord:
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
        return reject(
            r, "invalid: " + "; ".join(validation.problems), plan, validation=validation.checks, **cand.digests, **about
        )
    repair = None
    ablation = idle is not None and idle.kind == IdleKind.ABLATION
    if not ablation:  # an ablation claims no repair: the gate alone judges it
        repair = repair_screen(r, plan, cand, train)
        if not repair.result.ok:
            looked = {"repair": repair.result, "sequential": {"repair": repair.sequential}, **_tokens(repair, None)}
            return reject(r, f"repair screen: {repair.result.reason}", plan, **looked, **cand.digests, **about)
    gate = dev_gate(r, plan, cand, validation, seeds=idle.seeds if idle else None, cheaper=ablation)
    figures = {**gate_figures(r, plan, cand, validation, repair, gate), **about}
    if not gate.result.accept:
        return reject(r, f"gate: {gate.result.reason}", plan, **figures)
    return commit(r, plan, cand, figures, gate.result.reason)
