"""The campaign's stages as Prefect tasks. Each calls one component function.

Cache keys are the code version of components/ plus the digests of the stage's inputs (package bytes, benchmark
bytes, seed map, options), never object identities, so a rerun with the same bytes recomputes nothing and a changed
input recomputes only what depends on it. A stage's key is derived from its own signature (`inputs_key`): each
parameter is keyed as its annotation declares (`As`: a directory by its digest, a table by its rows' hash, or not
at all), the rest by value; `KEY_VERSION` names what keys are made of. A budget hold is keyed by the same key. Results persist (compressed pickle: flows/resultzip.py) under
PREFECT_LOCAL_STORAGE_PATH.
`patch` and `commit` write files and are cheap: they run every time and are idempotent instead of cached.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import shutil
import time
from collections.abc import Callable
from enum import Enum
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, TypedDict, get_type_hints

import numpy as np
import pandas as pd
from prefect import task
from prefect.cache_policies import NO_CACHE
from pydantic import BaseModel

from components.contracts import check_benchmark, check_paired_scores
from components.defaults import MAX_SOURCE_ITEMS, MAX_TURNS
from components.evidence.budget import BudgetExceeded, BudgetLedger, BudgetSpec, Estimate, usage
from components.evidence.packets import verify_citations
from components.evolution.diagnose import Diagnosis, diagnose
from components.evolution.gate import (
    GateConfig,
    GateResult,
    RepairResult,
    SequentialDesign,
    gate,
    repair_screen,
    sequential_gate,
    sequential_repair,
)
from components.evolution.lineage import Lineage
from components.evolution.meta import PlanContext, PlanOutcome, make_meta_agent
from components.evolution.patch import apply_plan
from components.evolution.plan import Plan, parse_plan
from components.evolution.validate import Validation, fired, static_checks
from components.io import tree_stats
from components.memory.package import digest
from components.runtime.evaluate import RACY_NS, EvalTables, benchmark_at, eval_items, package_at, run_shard
from components.runtime.journal import Journal
from components.runtime.progress import progress_bar
from components.version import code_version
from components.worlds import run_settings
from flows.prefect_setup import atomic_local_results
from flows.resultzip import ZlibPickle

atomic_local_results()  # here: every process that runs these tasks (a Dask worker too) writes results whole


# zlib (as small as lzma for these tables at a tenth of the time) at level 1 on the pickle's bytes, under a type name
# that Prefect's server and clients can read back (flows/resultzip.py)
class Persisted(TypedDict):
    persist_result: bool
    result_serializer: ZlibPickle


PERSIST: Persisted = {"persist_result": True, "result_serializer": ZlibPickle()}


def stage_key(stage: str, **inputs: Any) -> str:
    blob = json.dumps(inputs, sort_keys=True, default=str)
    return f"{stage}-{code_version()}-{hashlib.sha256(blob.encode()).hexdigest()[:32]}"


class As(Enum):
    """How a stage's parameter enters its cache key, declared on the parameter itself (`Annotated[str, As.TREE]`).
    Undeclared: its value (a pydantic record as its dump)."""

    TREE = "tree"  # a package or benchmark directory: its digest (its bytes, wherever it lies)
    FRAME = "frame"  # a table: the hash of its rows
    OFF = "off"  # not an input of what the stage computes (a label, the budget it is charged to), or one that a
    # keyed parameter stands for (a train corpus's name stands for its tables)


Tree = Annotated[str, As.TREE]
Frame = Annotated[pd.DataFrame, As.FRAME]
KEY_VERSION = 2  # what stage keys are made of (the code version covers the code): bumped when that changes


@lru_cache(maxsize=None)
def _signature(fn: Callable[..., Any]) -> tuple[tuple[str, As | None, Any], ...]:
    hints = get_type_hints(fn, include_extras=True)
    how = lambda h: next((m for m in getattr(h, "__metadata__", ()) if isinstance(m, As)), None)  # noqa: E731
    return tuple((name, how(hints.get(name)), prm.default) for name, prm in inspect.signature(fn).parameters.items())


def inputs_key(fn: Callable[..., Any], params: dict[str, Any], **extra: Any) -> str:
    """The cache key of a call of stage function `fn` with `params`: every parameter its signature declares, each as
    `As` says, and `extra` inputs read elsewhere; the same key for the budget hold of its work."""
    keyed: dict[str, Any] = {}
    for name, how, default in _signature(fn):
        if how is As.OFF:
            continue
        v = params.get(name, default)
        keyed[name] = (
            tree_digest(v)
            if how is As.TREE
            else frame_hash(v)
            if how is As.FRAME
            else v.model_dump()
            if isinstance(v, BaseModel)
            else v
        )
    return stage_key(fn.__name__, key_version=KEY_VERSION, **keyed, **extra)


def by_signature(ctx: Any, params: dict[str, Any]) -> str:
    """Prefect's `cache_key_fn` for a stage keyed by its own signature (`inputs_key`)."""
    return inputs_key(ctx.task.fn, params)


@lru_cache(maxsize=64)
def _tree_digest(path: str, _stats: tuple) -> str:
    return digest(path)


def tree_digest(path: str | Path) -> str:
    """Digest of a package or benchmark directory, memoized on the stat of every file in it (a stat walk costs far
    less than hashing megabytes of db.json), so a long-lived worker never reuses the key of a tree edited in place.
    As in git's "racy" check, a tree touched within the last two seconds is hashed, not memoized: timestamps are
    coarse-grained, and a second edit inside the same tick would leave every stat unchanged."""
    p = Path(path).resolve()
    if not p.is_dir():
        return digest(p)
    stats, newest = tree_stats(p)
    if time.time_ns() - newest < RACY_NS:
        return digest(p)
    return _tree_digest(str(p), stats)


def frame_hash(df: pd.DataFrame) -> str:
    return hashlib.sha256(pd.util.hash_pandas_object(df, index=False).values.tobytes()).hexdigest()


# -- evaluate ----------------------------------------------------------------------------------------------------------


def _shard_key(ctx: Any, p: dict) -> str:
    # the world's settings outside the benchmark, as this process runs episodes (a user simulator's model): a shard run
    # with another user is another shard
    return inputs_key(eval_shard.fn, p, settings=run_settings(benchmark_at(p["bench"]).world))


def _charged(budget: BudgetSpec | None, key: str, n_episodes: int, work):
    """Run `work(on_episode)` under a budget hold: reserve a conservative estimate first, reconcile the actual usage
    after. The shard spends only what its hold transferred: past it, it stops. The hold is keyed by the stage's
    cache key, so work already paid for is never charged again."""
    if budget is None:
        return work(None)
    ledger, est = BudgetLedger(budget.db), budget.estimate
    hold = ledger.reserve(budget.wallet, est.episodes(n_episodes), key=key, wait=3600)
    spent = dict.fromkeys(hold.amounts, 0.0)

    def allowance(r) -> None:
        # the episode's row as one-element columns: what `usage` sums, without building a DataFrame per episode
        for k, v in usage({k: np.asarray([x]) for k, x in r.row().items()}, est).items():
            spent[k] = spent.get(k, 0.0) + v
        over = [k for k in hold.amounts if spent[k] > hold.amounts[k]]
        if over and not hold.already_settled:
            raise BudgetExceeded(f"budget: shard went past its allowance ({', '.join(over)}); raise est_*_per_call")

    try:
        result = work(allowance)
    except BaseException:
        ledger.settle(hold, spent, completed=False)  # what the failed shard consumed was spent all the same
        raise
    ledger.settle(hold, paid_usage(result, est))
    return result


def call_cache(budget: BudgetSpec | None) -> str | None:
    """The campaign's reply store (None: every call is paid; see components.models.callcache)."""
    return budget.call_cache if budget else None


def paid_usage(t: EvalTables, est: Estimate) -> dict[str, float]:
    """What a shard paid: its score tables' usage, less the model calls its reply store answered."""
    got = usage(t.scores, est)
    if t.paid is not None:  # the agent's calls as paid; the other party's (a simulated user's model) as recorded
        party = {
            k: float(t.scores[c].sum()) if c in t.scores else 0.0
            for k, c in (
                ("tokens_in", "user_tokens_in"),
                ("tokens_out", "user_tokens_out"),
                ("model_calls", "user_model_calls"),
            )
        }
        t_in, t_out = t.paid["tokens_in"] + party["tokens_in"], t.paid["tokens_out"] + party["tokens_out"]
        got.update(
            tokens_in=float(t_in),
            tokens_out=float(t_out),
            model_calls=float(t.paid["model_calls"]) + party["model_calls"],
            money=est.cost(t_in, t_out),
        )
    return got


@task(name="eval_shard", cache_key_fn=_shard_key, task_run_name="eval {label}", **PERSIST)
def eval_shard(
    package: Tree,
    bench: Tree,
    items: list[str],
    seeds: list[int],
    model: str,
    model_cfg: dict,
    max_turns: int,
    label: Annotated[str, As.OFF] = "",
    budget: Annotated[BudgetSpec | None, As.OFF] = None,
) -> EvalTables:
    key = _shard_key(
        None,
        {
            "package": package,
            "bench": bench,
            "items": items,
            "seeds": seeds,
            "model": model,
            "model_cfg": model_cfg,
            "max_turns": max_turns,
        },
    )
    where = budget.episodes if budget else None  # a served model's finished episodes, kept while the shard runs
    journal = Journal(Path(where) / key, key) if where else None
    progress = progress_bar(label, len(items) * len(seeds))

    def run(check):
        def each(r):
            progress(r)
            if check is not None:
                check(r)

        return run_shard(
            package,
            bench,
            items,
            seeds,
            model,
            model_cfg,
            max_turns,
            each,
            call_cache=call_cache(budget),
            journal=journal,
        )

    out = _charged(budget, key, len(items) * len(seeds), run)
    if journal is not None:  # the shard's result is cached by Prefect now: its episode files are not needed again
        shutil.rmtree(journal.root, ignore_errors=True)
    return out


# -- hidden causes (counterfactual replay; read only by diagnosis scoring) -----------------------------------------------


@task(name="causes", cache_key_fn=by_signature, **PERSIST)
def causes_stage(
    scores: Frame, package: Tree, bench: Tree, max_turns: int, learned: tuple[str, ...] = ()
) -> pd.DataFrame:
    """Replay each failed episode with one owner's faults off at a time (cached: a champion's train set once).
    `learned`: the facts the campaign's simulated model was trained on (its replays know them too)."""
    from components.models.counterfactual import causes_table

    return causes_table(package_at(package), benchmark_at(bench), scores, max_turns, learned=frozenset(learned))


# -- diagnose ----------------------------------------------------------------------------------------------------------


@task(name="diagnose", cache_key_fn=by_signature, **PERSIST)
def diagnose_stage(train: Annotated[EvalTables, As.OFF], package: Tree, bench: Tree, corpus: str) -> Diagnosis:
    """Diagnose from traces and scores only (never the hidden causes), then check every packet's citations."""
    from components.evolution.infer import policy_today
    from components.worlds.base import train_gold

    b = benchmark_at(bench)
    # train items' gold only: the loader refuses any other split's
    d = diagnose(
        train.traces,
        train.scores,
        package_at(package),
        b.write_tools,
        corpus,
        targets=b.targets,
        gold=train_gold(b),
        today=policy_today(b.policy),
        confirmation=b.confirmation,
    )
    checked = []
    for p in d.packets:
        problems = verify_citations(p, train.traces)
        if problems:
            raise ValueError("diagnosis cites steps that do not resolve: " + "; ".join(problems[:3]))
        checked.append(p)
    return Diagnosis(d.findings, checked)


# -- plan --------------------------------------------------------------------------------------------------------------


@task(name="plan", cache_key_fn=by_signature, **PERSIST)
def plan_stage(
    diagnosis: Annotated[Diagnosis, As.OFF],
    train: Annotated[EvalTables, As.OFF],
    package: Tree,
    bench: Tree,
    corpus: str,
    rejected: list[str],
    meta_agent: str,
    meta_cfg: dict,
    budget: Annotated[BudgetSpec | None, As.OFF] = None,
    memory: dict | None = None,
    max_source_items: int = MAX_SOURCE_ITEMS,
) -> PlanOutcome:
    """The meta-agent's plan. Its diagnosis and train tables are not keyed: the corpus's name stands for them."""
    mem = memory or {}
    ctx = PlanContext(
        diagnosis.packets,
        package_at(package),
        benchmark_at(bench),
        train.traces,
        train.scores,
        set(rejected),
        diagnosis.findings,
        revocations=[parse_plan(x) for x in mem.get("revocations", [])],
        later=set(mem.get("later", [])),
        memory=mem.get("projection") or {},
        max_source_items=max_source_items,
    )
    agent = make_meta_agent(meta_agent, meta_cfg)
    if budget is None or not agent.spends:
        return agent.plan(ctx)
    key = inputs_key(
        plan_stage.fn,
        {
            "package": package,
            "bench": bench,
            "corpus": corpus,
            "rejected": rejected,
            "meta_agent": meta_agent,
            "meta_cfg": meta_cfg,
            "memory": memory,
            "max_source_items": max_source_items,
        },
    )
    ledger, est = BudgetLedger(budget.db), budget.estimate
    hold = ledger.reserve(
        budget.wallet,
        {k: v / (est.max_turns * est.calls_per_turn) for k, v in est.episodes(1).items()},
        key=key,
        wait=3600,
    )
    try:
        result = agent.plan(ctx)
    except BaseException:
        ledger.release(hold)
        raise
    used = result.usage  # every attempt, failed ones included
    t_in, t_out = sum(u.tokens_in for u in used), sum(u.tokens_out for u in used)
    ledger.settle(
        hold,
        {
            "tokens_in": t_in,
            "tokens_out": t_out,
            "model_calls": sum(max(1, u.calls) for u in used),
            "money": est.cost(t_in, t_out),
        },
    )
    return result


# -- patch / validate --------------------------------------------------------------------------------------------------


@task(name="patch", cache_policy=NO_CACHE)
def patch_stage(plan: Plan, base: str, out: str) -> str:
    return str(apply_plan(plan, base, out))


@task(name="validate", cache_key_fn=by_signature, **PERSIST)
def validate_stage(
    plan: Plan,
    candidate: Tree,
    bench: Tree,
    probe_items: list[str],
    model: str,
    model_cfg: dict,
    max_turns: int,
    budget: Annotated[BudgetSpec | None, As.OFF] = None,
) -> Validation:
    """Schema, lint, leakage, reachability; then an activation probe: the mechanism must fire on the source tasks."""
    b = benchmark_at(bench)
    v, pkg = static_checks(plan, candidate, b)
    if v.ok and pkg is not None:  # (ok: it loaded)
        key = inputs_key(
            validate_stage.fn,
            {
                "plan": plan,
                "candidate": candidate,
                "bench": bench,
                "probe_items": probe_items,
                "model": model,
                "model_cfg": model_cfg,
                "max_turns": max_turns,
            },
        )
        probe = _charged(
            budget,
            key,
            len(probe_items),
            lambda check: run_shard(
                pkg, b, probe_items, [0], model, model_cfg, max_turns, check, call_cache=call_cache(budget)
            ),
        )
        v.checks["activation"] = (
            "ok"
            if fired(probe.traces, plan.mechanism)
            else f"mechanism {plan.mechanism!r} did not fire on {len(probe_items)} source task(s)"
        )
        v.ok = v.checks["activation"] == "ok"
    return v


# -- repair screen and gate (arithmetic over score tables) -------------------------------------------------------------


@task(name="repair_look", cache_key_fn=by_signature, **PERSIST)
def repair_look_stage(
    base: Frame, cand: Frame, material: float, alpha: float, design: dict, items: list[str], seeds: list[int]
) -> tuple[RepairResult | None, pd.DataFrame, dict]:
    """The repair screen over the looks evaluated so far (None: not decided yet); one look is the full screen."""
    d = SequentialDesign(**design)
    seen = pd.MultiIndex.from_frame(cand[["item_id", "seed"]])  # the base side holds every look: keep those seen
    base = base[pd.MultiIndex.from_frame(base[["item_id", "seed"]]).isin(seen)].reset_index(drop=True)
    check_paired_scores(base, cand, "repair screen")
    if not d.on:
        result, per = repair_screen(base, cand, material)
        return result, per, {"looks": 1, "looks_used": 1, "stopped_early": False, "why": "full screen"}
    return sequential_repair(base, cand, material, alpha, d, items, seeds)


@task(name="gate_look", cache_key_fn=by_signature, **PERSIST)
def gate_look_stage(
    base: Frame,
    cand: Frame,
    cfg: dict,
    design: dict,
    items: list[str],
    seeds: list[int],
    fired_by_look: list[bool],
    leakage: bool,
) -> tuple[GateResult | None, pd.DataFrame, dict]:
    """The held-out gate over the looks evaluated so far (None: not decided yet); one look is the ordinary gate."""
    d = SequentialDesign(**design)
    check_paired_scores(base, cand, "held-out gate")
    if not d.on:
        verdict, per = gate(base, cand, GateConfig(**cfg), mechanism_fired=fired_by_look[-1], leakage=leakage)
        return verdict, per, {"looks": 1, "looks_used": 1, "stopped_early": False, "why": "full evaluation"}
    return sequential_gate(base, cand, GateConfig(**cfg), d, items, seeds, fired_by_look=fired_by_look, leakage=leakage)


# -- commit ------------------------------------------------------------------------------------------------------------


@task(name="commit", cache_policy=NO_CACHE)
def commit_stage(lineage: str, candidate: str, evaluated_digest: str, round_no: int, record: dict) -> str:
    return Lineage(lineage).commit(candidate, evaluated_digest, round_no, record).name


@task(name="reject", cache_policy=NO_CACHE)
def reject_stage(lineage: str, round_no: int, record: dict, plan: dict | None) -> None:
    Lineage(lineage).reject(round_no, record, plan)


# -- data contracts whose inputs are not inside a cached stage ------------------------------------------------------------
# A contract's verdict on the same bytes is the same verdict: cached on them like a stage, so a resume or a rerun of
# the same campaign neither imports great-expectations (~3.5 CPU-s) nor validates again. A failure is never cached.


@task(name="benchmark_contract", cache_key_fn=by_signature, **PERSIST)
def benchmark_contract(bench: Tree) -> bool:
    check_benchmark(bench)
    return True


@task(name="paired_contract", cache_key_fn=by_signature, **PERSIST)
def paired_contract(base: Frame, cand: Frame, where: str) -> bool:
    check_paired_scores(base, cand, where)
    return True


# -- the same evaluation without Prefect -------------------------------------------------------------------------------


def plain_eval(
    package: str,
    bench: str,
    seeds: list[int],
    split: str | None = None,
    items: list[str] | None = None,
    shard_size: int = 10,
    model: str = "sim",
    model_cfg: dict | None = None,
    max_turns: int = MAX_TURNS,
    label: str = "",
    budget: BudgetSpec | None = None,
    workers: int = 2,
) -> EvalTables:
    """flows.evaluate.submit_eval's shards as direct calls of eval_shard's function on a plain thread pool of the flow's
    size (its budget holds included): the baseline benchmarks/bench_round.py measures Prefect against."""
    from concurrent.futures import ThreadPoolExecutor

    from components.runtime.evaluate import shards

    ids = eval_items(bench, split, items)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [
            pool.submit(
                eval_shard.fn,
                package,
                bench,
                shard,
                seeds,
                model,
                model_cfg or {},
                max_turns,
                label=label,
                budget=budget,
            )
            for shard in shards(ids, shard_size)
        ]
        return EvalTables.concat([f.result() for f in futures])
