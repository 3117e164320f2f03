"""The `campaign` flow: rounds on the committed champion (`flows.replay.play_round`: the `evolution_round` flow,
or its replay), then the certification of the champion against the starting package on the test split (touched
once, `flows.certify`), the diagnoser scored against the hidden causes, and the summary, budget report and MLflow
records.

Operating it safely: the campaign holds an exclusive lock on its lineage; every evaluation shard reserves budget
before it runs and reconciles after; after each stage the campaign's state is written atomically to
`<out>/.state/state.json`. A round that already has a lineage record is not run again, and the stages of an
interrupted round come back from Prefect's task cache, so rerunning the same command (or `ratchet campaign resume`)
finishes a killed campaign with the lineage a clean run would have produced.

A campaign owns its output directory (marked `campaign`): `prepare` refuses, before any work, an output that is a file,
an input, or a directory Ratchet did not write, and a rerun whose start package, benchmark or evolution params
differ from what the lineage recorded (`Params.identity`; what may change is `RERUN_MAY_CHANGE`). Paths recorded in
the campaign are relative to it, so a moved or copied campaign resumes and reproduces where it now is.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import UUID

from prefect import flow
from rich.console import Console

from components.errors import InputError, Unavailable
from components.evidence.budget import BudgetExceeded, BudgetLedger, BudgetSpec, Estimate
from components.evidence.graph_record import champion_chain, model_id, open_graph, record_campaign_round
from components.evolution.gate import PromotedAs
from components.evolution.lineage import CampaignMismatch, Lineage, LineageLock
from components.evolution.localization import localization_from_rounds
from components.evolution.record import RoundRecord
from components.evolution.report import write_json
from components.evolution.validate import foreign_tools
from components.io import claim_output, mark_output, output_kind, remove_output
from components.memory.package import digest, load_package
from components.models.callcache import deterministic, saved
from components.params import Params, recorded_path
from components.tracking.mlflow_log import CampaignTracker
from components.worlds import load_benchmark, party_model, run_settings, world
from flows.certify import certify
from flows.evaluate import task_runner
from flows.prefect_setup import quiet_expected_failures, tie_temporary_server_to_this_process
from flows.replay import evolution_round, play_round
from flows.round import dev_looks, identity, state_dir
from flows.tasks import benchmark_contract

quiet_expected_failures()
console = Console(stderr=True, soft_wrap=True)  # one line per round, however narrow the terminal


def budget_spec(p: Params) -> BudgetSpec:
    b, c = p.budget, p.campaign
    # a deterministic model's replies are stored per campaign: a request asked again (the same champion's episodes,
    # a candidate's up to its patch's first effect) is not paid twice, and the tables stay byte-identical
    return BudgetSpec(
        db=str(state_dir(c.out) / "budget.sqlite"),
        wallet=c.name,
        call_cache=str(state_dir(c.out) / "calls.sqlite") if deterministic(c.model, c.model_cfg) else None,
        # a served model's finished episodes, one file each while a shard runs: a killed shard resumes them
        episodes=str(state_dir(c.out) / "episodes") if c.model != "sim" else None,
        estimate=Estimate(
            max_turns=c.max_turns,
            tokens_in_per_call=b.est_tokens_in_per_call,
            tokens_out_per_call=b.est_tokens_out_per_call,
            price_in_per_1k=b.price_in_per_1k,
            price_out_per_1k=b.price_out_per_1k,
            # a user simulated by a model answers every turn, from the same budget
            party_calls_per_turn=1 if party_model(run_settings(p.benchmark.world)) else 0,
        ),
    )


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

            cluster = stack.enter_context(
                LocalCluster(n_workers=c.workers, threads_per_worker=1, processes=True, dashboard_address=None)
            )
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
            raise InputError(
                "campaign.dask_address: the Dask workers outlive this campaign, so the Prefect server "
                "they report to must too: start `ratchet server` (or export PREFECT_API_URL) first"
            )
    bench = _existing_benchmark(p)
    out = claim_output(
        c.out,
        "campaign",
        option="campaign.out",
        force=force,
        inputs={"start package": c.start, "benchmark": p.benchmark.out},
    )
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
        raise InputError(
            f"{meta}: world: {bench.world!r}, but benchmark.world is {p.benchmark.world!r} (a benchmark "
            "of another world at benchmark.out)"
        )
    if bench.receipts != p.benchmark.receipts:  # the same tasks, another world's receipts: refused, never mixed up
        raise InputError(
            f"{meta}: receipts: {bench.receipts.value!r}, but benchmark.receipts is "
            f"{p.benchmark.receipts.value!r} (materialize it with --receipts, or set benchmark.out)"
        )
    if bench.protocol != p.benchmark.protocol_for():  # likewise: episodes run another way than asked
        raise InputError(
            f"{meta}: protocol: {bench.protocol!r}, but benchmark.protocol is "
            f"{p.benchmark.protocol_for()!r} (materialize it with --protocol, or set benchmark.out)"
        )
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
    lineage.check_rerun(
        digest(c.start) if Path(c.start).is_dir() else None,
        digest(bench) if (bench / "meta.json").is_file() else None,
        identity(p),
        where=str(c.out),
        legacy_identity=legacy,
    )


def _campaign(p: Params, lineage: Lineage) -> dict:
    c, out = p.campaign, Path(p.campaign.out)
    open_graph(p.evidence, c.name, check=True).close()  # one that cannot be opened (or is damaged): refused now
    write_json(state_dir(out) / "params.json", p.recorded().model_dump())  # what `ratchet campaign resume` reruns
    budget = budget_spec(p)
    wallet = _Wallet.open(p, budget)
    start = lineage.start(c.start, load_benchmark(p.benchmark.out).digest, identity(p), source=recorded_path(c.start))
    tracker = CampaignTracker(c.name, out, p.recorded().model_dump(), c.tracking_uri)
    _link_flow_run(tracker)
    stopped = _play_rounds(p, lineage, budget, tracker)
    champion = lineage.champion()
    test = test_evals = None
    if stopped is None:
        try:
            certification = certify.with_options(task_runner=task_runner(c.task_runner, c.workers, c.dask_address))
            test, test_evals = certification(p, start.path, champion.path, budget)
        except BudgetExceeded as e:
            stopped = f"certification: {e}"
    if stopped:
        console.print(f"stopped: {stopped}", highlight=False, markup=False)
    result = _summary(p, lineage, start.digest, test, stopped)
    write_json(out / "summary.json", result)
    spent, this_run = wallet.report(budget, out)
    tracker.finish(result, out / "summary.json", test_evals or [], spent=spent)
    text, chains = champion_chain(p.evidence, c.name, champion.name)  # why the champion is what it is
    tracker.client.log_text(tracker.run_id, text, "evidence/champion_chain.txt")
    # (a list: MLflow writes any JSON-serializable object, though it annotates a dict)
    tracker.client.log_dict(tracker.run_id, chains, "evidence/champion_chain.json")  # type: ignore[arg-type]
    write_json(state_dir(out) / "state.json", {"round": result["rounds"], "stage": "done", "stopped": stopped})
    return {
        **result,
        "budget_spent": this_run,
        "mlflow": {
            "experiment_id": tracker.experiment_id,
            "experiment": tracker.experiment_name,
            "registered_model": tracker.model_name,
            "run_id": tracker.run_id,
            "tracking_uri": tracker.uri,
            "links": tracker.links(),
        },
    }


@dataclass
class _Wallet:
    """The campaign's budget ledger and wallet. The ledger is the campaign output's, kept across processes (a resume
    adds to it): what this process spends is the difference from what was spent when it opened."""

    ledger: BudgetLedger
    wallet: Any
    spent_before: dict[str, float]

    @classmethod
    def open(cls, p: Params, budget: BudgetSpec) -> _Wallet:
        ledger = BudgetLedger(budget.db)
        wallet = ledger.open_wallet(
            p.campaign.name,
            p.budget.caps(),
            wall_seconds=p.budget.wall_seconds,
            max_concurrency=p.budget.max_concurrency,
            max_depth=p.budget.max_depth,
        )
        if released := ledger.recover(wallet):
            console.print(
                f"settled {released} budget hold(s) left by a killed process at their full reservation", highlight=False
            )
        return cls(ledger, wallet, ledger.report(wallet)["spent"])

    def report(self, budget: BudgetSpec, out: Path) -> tuple[dict, dict]:
        """Writes the budget report (.state/budget.json); returns (spent in all, spent by this process)."""
        report = self.ledger.report(self.wallet)
        report["reply_store"] = saved(budget.call_cache)  # answered from the store: not paid, still used
        this_run = {k: v - self.spent_before.get(k, 0.0) for k, v in report["spent"].items()}
        report["spent_by_this_run"] = this_run
        write_json(state_dir(out) / "budget.json", report)
        return report["spent"], this_run


def _play_rounds(p: Params, lineage: Lineage, budget: BudgetSpec, tracker: CampaignTracker) -> str | None:
    """The declared rounds not yet in the lineage, each recorded (MLflow, campaign memory) and said in one line, until
    one stops the campaign; the budget stop that ended them, if one did."""
    c, out = p.campaign, Path(p.campaign.out)
    round_flow = evolution_round.with_options(task_runner=task_runner(c.task_runner, c.workers, c.dask_address))
    for r in range(1, c.rounds + 1):
        if lineage.round_record(r) is None:
            try:
                play_round(r, p, budget, round_flow)
            except BudgetExceeded as e:  # stop cleanly between stages; the committed lineage is untouched
                return f"round {r}: {e}"
        kept = lineage.round_record(r)
        assert kept is not None, f"round {r}: played, yet not in the lineage"
        rec = RoundRecord.of(kept)  # as the lineage has it (with its parent and child)
        tracker.log_round(rec)
        record_campaign_round(p.evidence, c.name, out, rec, model_id(c.model, c.model_cfg))  # campaign memory
        _say(rec)
        if rec.stops_campaign:  # the same inputs would plan the same way again
            break
    return None


def _summary(p: Params, lineage: Lineage, start_digest: str, test: dict | None, stopped: str | None) -> dict:
    """summary.json: the campaign's result, lineage, history and the params it ran with."""
    out = Path(p.campaign.out)
    scored, champion = load_benchmark(p.benchmark.out), lineage.champion()
    result = {
        "campaign": p.campaign.name,
        "rounds": len(lineage.rounds()),
        "accepted": len(lineage.versions()) - 1,
        "start_digest": start_digest,
        "champion": champion.name,
        "champion_digest": champion.digest,
        "benchmark_digest": scored.digest,
        "test": test,
        "stopped": stopped,
        "localization": localization_from_rounds(out, scored.write_tools, scored.targets),
        "episodes": _episodes(out, test),
        # caps, and what the evidence behind this result costs: deterministic, unlike what this process paid
        # (finished work comes from the cache for free); that goes to .state/budget.json and MLflow
        "budget": {
            "caps": {k: v for k, v in p.budget.caps().items() if v is not None},
            "evidence_cost": _cost(out, test),
        },
        "lineage": [{"version": v.name, "digest": v.digest} for v in lineage.versions()],
        "history": [r.dump() for r in lineage.rounds()],
        "params": p.recorded().model_dump(),
    }
    settings = run_settings(p.benchmark.world)
    if settings:  # which user simulator ran (a world that has such settings)
        result["world_settings"] = settings
    if scored.protocol != "custom":  # episodes run as a reference orchestrator runs them (a leaderboard's)
        result["protocol"] = scored.protocol
    result["dev_looks"] = dev_looks(lineage.rounds(), p.gate.campaign_alpha)  # held-out reuse, accounted
    if test and test.get("tokens_per_episode"):  # cost as a second objective: the champion beside the built-ins
        result["tokens"] = {
            "split": "test",
            "per_episode": test.pop("tokens_per_episode"),
            "cheaper": [r.round for r in lineage.rounds() if r.promoted_as == PromotedAs.CHEAPER],
        }
    return result


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
    return {
        k: sum(e["summary"].get(k, 0) for e in evs) for k in ("tokens_in", "tokens_out", "model_calls", "tool_calls")
    }


def _say(rec: RoundRecord) -> None:
    from prefect.exceptions import MissingContextError
    from prefect.logging import get_run_logger

    from components.evolution.report import ci_level

    g = rec.gate
    level = ci_level(rec) if g else None
    fig = (
        (f" net {g.net:+.3f} {'' if level is None else f'{100 * level:.4g}% '}CI [{g.ci_lo:+.3f}, {g.ci_hi:+.3f}]")
        if g
        else ""
    )
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
    from prefect.settings import get_current_settings

    from flows import finished
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
            "server` and export PREFECT_API_URL=http://127.0.0.1:4200/api; the committed rounds are kept"
        ) from None
