"""The round as a Prefect flow (`evolution_round`), and the round kept whole for a rerun on the same inputs.

A rerun of a round on the same inputs (a resumed or repeated campaign, a new campaign on the same bytes) would find
every stage in the task cache, but each lookup still costs a task run, and the round a flow run. One lookup of the
whole round skips them all: its files, progress records and lineage write are kept (compressed, in Prefect's result
storage) under a key of every input the round reads (`round_key`), and replayed in order (`play_round`). What the plan
read from the campaign memory is asked again and compared, since the evidence graph changes under the same key.
"""

from __future__ import annotations

import pickle
import zlib
from dataclasses import dataclass
from pathlib import Path

from prefect import flow

from components.codes import Verdict
from components.evidence.budget import BudgetSpec
from components.evidence.graph_record import memory_for_round, model_id
from components.evolution.lineage import Lineage
from components.evolution.record import RoundRecord
from components.evolution.report import round_dir, write_json
from components.io import atomic_write_bytes
from components.params import Params
from components.version import code_version
from components.worlds import load_benchmark
from flows.round import PREFECT_STEPS, Committed, Trail, dev_look, run_round, stage_done
from flows.tasks import PERSIST, stage_key, tree_digest


@flow(name="evolution_round", flow_run_name="round {round_no}", validate_parameters=False)
def evolution_round(round_no: int, params: dict, budget: BudgetSpec) -> RoundRecord:
    p = Params.model_validate(params)
    key, trail = round_key(round_no, p, Lineage(Path(p.campaign.out) / "lineage")), Trail()
    rec = run_round(round_no, p, budget, PREFECT_STEPS, trail)
    keep_round(key, round_dir(p.campaign.out, round_no), trail)  # for a rerun on the same inputs: see play_round
    return rec


def round_key(round_no: int, p: Params, lineage: Lineage) -> str:
    """Every input of a round: the code (components/ and flows/), the champion's bytes, the benchmark's bytes, the
    params that shape a round, and what the round reads from the lineage (rejected plans, earlier dev looks)."""
    round_params = p.round_inputs()  # without where it runs and what it is called (`components.params.PLACE`)
    # what a round without a plan reads (the retry pool, the parts tried): each round's verdict, plan, net, retry
    idle = [
        (x.round, str(x.verdict), x.plan_key, x.gate.net if x.gate else None, bool(x.retry), bool(x.ablation))
        for x in lineage.rounds()
        if x.round < round_no
    ]
    return stage_key(
        "round",
        flows=code_version(Path(__file__).resolve().parent),
        round=round_no,
        champion=lineage.champion().digest,
        bench=tree_digest(p.benchmark.out),
        params=round_params,
        rejected=sorted(lineage.rejected_keys()),
        dev_look=dev_look(lineage, round_no, p).dump(),
        idle=idle,
    )


def _round_store():
    from prefect.results import ResultStore

    return ResultStore(serializer=PERSIST["result_serializer"], cache_result_in_memory=False)


@dataclass(frozen=True)
class KeptRound:
    """A completed round as kept for a replay: its round directory's files (by relative path) and its trail."""

    files: dict[str, bytes]
    trail: Trail


def keep_round(key: str, rd: Path, trail: Trail) -> None:
    files = {
        f.relative_to(rd).as_posix(): f.read_bytes()
        for f in sorted(rd.rglob("*"))
        if f.is_file() and f.name != "round.json"
    }  # round.json names the committed version: written again
    _round_store().write(KeptRound(files, trail), key=key)


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
    if not isinstance(kept, KeptRound) or not _same_memory(kept.trail, p, lineage):
        return None
    rd, trail = round_dir(p.campaign.out, round_no), kept.trail
    for name, data in kept.files.items():
        atomic_write_bytes(rd / name, data)
    for stage, extra in trail.stages[:-1]:
        stage_done(p, round_no, stage, **extra)
    action = trail.action
    if isinstance(action, Committed):
        version = lineage.commit(rd / "candidate", action.digest, round_no, action.record).name
        rec = RoundRecord(**action.record, verdict=Verdict.ACCEPT, version=version)
    else:
        assert action is not None, "a kept round always made its lineage write"
        rec = RoundRecord(**action.record)
        lineage.reject(round_no, action.record, action.plan)
    write_json(rd / "round.json", rec.dump())
    stage, extra = trail.stages[-1]
    stage_done(p, round_no, stage, **{**extra, **({"version": rec.version} if "version" in extra else {})})
    return rec


def _same_memory(trail: Trail, p: Params, lineage: Lineage) -> bool:
    """Would the plan read the same from the campaign memory now as when the round ran? (Always, with none.)"""
    c = p.campaign
    if trail.memory_inputs is None:
        return not p.evidence.memory
    packets, traces = trail.memory_inputs
    champ, b = lineage.champion(), load_benchmark(p.benchmark.out)
    now = memory_for_round(
        p.evidence, c.name, packets, traces, str(champ.path), b.digest, model_id(c.model, c.model_cfg), c.out
    )
    return now.record() == trail.memory


def play_round(round_no: int, p: Params, budget: BudgetSpec, round_flow=None) -> RoundRecord:
    """A round as the campaign runs it: replayed whole from the cache when every input is the same, else the round
    flow (whose stages still come from the task cache one by one where their own inputs are the same)."""
    lineage = Lineage(Path(p.campaign.out) / "lineage")
    key = round_key(round_no, p, lineage)
    rec = replay_round(key, round_no, p, lineage)
    if rec is not None:
        return rec
    return (round_flow or evolution_round)(round_no, p.model_dump(), budget)
