"""MLflow records for a campaign (SQLite store by default; the tracking URI is configurable).

    experiment  ratchet/<name>/<identity>           one per campaign identity (see `campaign_identity`)
      run       campaign <name> @<commit> p<params hash>   params, test figures, metrics stepped by round, lineage
        run     r<N> <verdict> net <net>: <plan>           params (gate, seeds, model, meta-agent), a description,
                                                            tags (digests, git commit, dvc.lock hash, seed map hash,
                                                            reason), gate/repair metrics with their `ci_level`,
                                                            plan/diagnosis/per-item artifacts
          run   r<N> <split> <arm> [look <k>]              mean score, success rate, tokens, errors
      traces    episode <item>#<seed>                       each failed episode a packet cites: one span per turn,
                                                            one child per kernel phase; linked to its round run
      models    <name>-M<k>                                 each committed version as a logged model (params = the
                                                            manifest's knobs, metrics = its gate figures), registered
                                                            as a version of `ratchet-<name>-<identity>-<out>`; alias `champion`

A campaign's identity is what decides its results: its name, the evolution params a rerun must keep, the number of
declared rounds (every round's gate spends campaign_alpha / rounds), the start package's and the benchmark's bytes.
Its experiment and registered model are named by it, so a variant (`dvc exp run -S campaign.rounds=2`, a `--set`, a
queued experiment) records into its own and never moves another campaign's `@champion`.

Everything is logged from what a round left on disk (its round directory and lineage record), so a round can be
logged again after a crash. Logging is idempotent and keyed in MLflow itself: the campaign run is found by a tag over
(identity, output dir, git commit), a round run by its number under it, a model version by its digest, so a rerun, a
resume or a forced `dvc repro` adds no run, trace or version twice, and no file outside the store (a DVC checkout
restores the outputs, not MLflow) can attach one campaign's rounds to another's run. Runs are addressed by id through
MlflowClient (no fluent, thread-local active run). Traces are built in memory and written through a client bound to
the campaign's tracking URI, so they land in the campaign's store with its runs, whatever the process's URI is.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import threading
import time
from enum import Enum
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from components.codes import Verdict
# traces logged per round by default (`campaign.traces_per_round`): params' default too, so it lives in defaults
from components.defaults import MAX_TRACES_PER_ROUND
from components.evolution.lineage import Lineage
from components.evolution.record import RoundRecord, StartRecord
from components.io import confined, recorded_path

if TYPE_CHECKING:
    from mlflow.tracing.client import TracingClient

MAX_TRACES_PER_PACKET = 2
# a promoted version's metrics: the gate figures of the round that promoted it
GATE_METRICS = ("net", "ci_lo", "ci_hi", "dev_base_mean", "dev_cand_mean", "n_improved", "n_regressed")
# MLflow 3.17's UI takes its mode ("GenAI apps & agents" or "Machine learning") from the address's `workflowType`,
# else from the browser's last choice (GenAI when there is none), and not from the experiment's `mlflow.experimentKind`
# tag (set as well: the experiment list and other clients read it). So every address Ratchet writes names the mode,
# and a round opens as a training run, its params and metrics first, without a switch to find.
UI_MODE = "workflowType=machine_learning"


def ui_route(route: str) -> str:
    """A UI route (`#/...`) opened in the "Machine learning" mode."""
    return f"{route}{'&' if '?' in route else '?'}{UI_MODE}"


# Traces are written by the tracker itself, one tracker at a time in this process (see CampaignTracker._write_traces).
_TRACE_WRITES = threading.Lock()
_TRACER: Any = None
_ENV_METADATA: dict[str, str] | None = None


def _env_metadata() -> dict[str, str]:
    """What MLflow's span processor records about the writing process (user, source, git), resolved once."""
    global _ENV_METADATA
    if _ENV_METADATA is None:
        from mlflow.tracing.utils.environment import resolve_env_metadata

        _ENV_METADATA = dict(resolve_env_metadata())
    return _ENV_METADATA


def _start_span(name: str, kind: str, parent: Any, start_ns: int, spans: list, inputs: Any = None,
                attributes: dict | None = None):
    """A live mlflow span from a private OpenTelemetry tracer. The tracer has no span processor, so ending a span
    exports nothing: MLflow's own tracer would send it to the process's tracking URI, not the campaign's."""
    global _TRACER
    from mlflow.entities import LiveSpan
    from mlflow.tracing.utils import generate_trace_id_v3
    from opentelemetry import trace as otel
    from opentelemetry.context import Context

    if _TRACER is None:
        import mlflow
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider

        # the resource MLflow's own provider uses (the default one would add service.* tags to every trace)
        resource = Resource({"telemetry.sdk.language": "python", "telemetry.sdk.name": "mlflow",
                             "telemetry.sdk.version": mlflow.__version__})
        _TRACER = TracerProvider(resource=resource, shutdown_on_exit=False).get_tracer("ratchet.tracking")
    # an empty context for a root: never the child of whatever span is active in this thread
    ctx = otel.set_span_in_context(parent._span) if parent is not None else Context()
    o = _TRACER.start_span(name, context=ctx, start_time=start_ns)
    span = LiveSpan(o, parent.trace_id if parent is not None else generate_trace_id_v3(o), kind)
    if inputs is not None:
        span.set_inputs(inputs)
    span.set_attributes(attributes or {})
    spans.append(span)
    return span


def episode_timings(eval_dir: Path) -> dict[str, dict[int, list[tuple[str, int, int]]]]:
    """An evaluation's recorded timings (`components.runtime.evaluate.TIMINGS`, beside its DVC-tracked tables) as
    episode -> step -> [(turn, start, end), (phase, start, end), ...] in the order they ran; {} when none were kept."""
    import pandas as pd

    from components.runtime.evaluate import TIMINGS

    path = eval_dir / TIMINGS
    if not path.exists():
        return {}
    out: dict[str, dict[int, list[tuple[str, int, int]]]] = {}
    for r in pd.read_parquet(path).sort_values(["item_id", "seed", "step", "i"]).itertuples(index=False):
        out.setdefault(f"{r.item_id}#{r.seed}", {}).setdefault(int(r.step), []).append(
            (str(r.phase), int(r.start_ns), int(r.end_ns)))
    return out


def _flatten(d: dict, prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(_flatten(v, key + "."))
        elif isinstance(v, Enum):  # `silent`, as params.yaml spells it, not `ReceiptMode.silent`
            out[key] = str(v.value)
        else:
            out[key] = json.dumps(v) if isinstance(v, (dict, list)) else str(v)
    return out


def git_commit(cwd: str | Path = ".") -> str:
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd, capture_output=True,
                               text=True, timeout=10).stdout.strip()
        return (sha + ("-dirty" if dirty else "")) if sha else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def dvc_lock_hash(cwd: str | Path = ".") -> str:
    lock = Path(cwd) / "dvc.lock"
    return hashlib.sha256(lock.read_bytes()).hexdigest()[:16] if lock.exists() else "none"


def params_hash(params: dict) -> str:
    return hashlib.sha256(json.dumps(params, sort_keys=True, default=str).encode()).hexdigest()[:8]


def campaign_identity(params: dict, start_digest: str, benchmark_digest: str,
                      settings: dict | None = None) -> dict[str, Any]:
    """What decides a campaign's results, so what names its MLflow records: the evolution params a rerun must keep
    (`Params.identity`), the declared rounds (each round's gate spends campaign_alpha / rounds: a 2-round campaign is
    not the first two rounds of a 10-round one), whether it reads the campaign memory, the bytes it starts from, and
    the world's settings outside the benchmark (`settings`: a user simulator's model; absent when there are none)."""
    from components.params import Params

    p = Params.model_validate(params)
    return {**p.identity(), "campaign.rounds": p.campaign.rounds, "evidence.memory": p.evidence.memory,
            "start_digest": start_digest, "benchmark_digest": benchmark_digest,
            **({"world.settings": settings} if settings else {})}


def identity_hash(identity: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:8]


def experiment_name(campaign: str, ident: str) -> str:
    return f"ratchet/{campaign}/{ident}"


def registered_name(campaign: str, ident: str, out: str) -> str:
    """`ratchet-<name>-<identity>-<out>`: <out> is a short hash of the campaign's output directory as records show
    it (relative inside the project, `Params.recorded`). Two campaigns of one identity in different directories are
    two campaigns, each with its own versions and `@champion` (they shared one model before); the same campaign
    rerun, resumed or queued by DVC (whose copy records the same relative path) keeps its model."""
    return f"ratchet-{campaign}-{ident}-{hashlib.sha256(str(out).encode()).hexdigest()[:6]}"


def tracking_names(summary: dict[str, Any]) -> dict[str, str]:
    """The MLflow experiment and registered model of the campaign a summary.json describes (a notebook's way in)."""
    ih = identity_hash(campaign_identity(summary["params"], summary["start_digest"], summary["benchmark_digest"],
                                         summary.get("world_settings")))
    return {"experiment": experiment_name(summary["campaign"], ih),
            "registered_model": registered_name(summary["campaign"], ih, summary["params"]["campaign"]["out"]),
            "identity": ih}


def manifest_knobs(package: str | Path) -> dict[str, str]:
    """A package's knobs as flat params: the manifest's wm, delivery and checkers, and its card count."""
    import yaml

    p = Path(package)
    m = yaml.safe_load((p / "manifest.yaml").read_text(encoding="utf-8")) or {}
    knobs = _flatten({k: v for k, v in m.items() if k not in ("description",)})
    knobs["cards"] = str(len(list((p / "em").rglob("*.md"))) if (p / "em").is_dir() else 0)
    return knobs


def ui_address(tracking_uri: str | None) -> tuple[str, str]:
    """Where the MLflow UI is, and how it got there: the tracking server's own address (an http store), else the
    `ratchet ui` that runs for this home (its note: whatever --port it was given), else the address `ratchet ui`
    serves without --port, said as such."""
    from components.env import UI_DEFAULT, UI_NOTE, project_home, running_server

    if str(tracking_uri or "").startswith("http"):
        return str(tracking_uri).rstrip("/"), "the tracking server"
    running = running_server(project_home(), UI_NOTE)
    if running is not None:
        return running.rstrip("/"), "`ratchet ui`, running"
    return UI_DEFAULT, "`ratchet ui` serves these; started with --port N, the same addresses on port N"


def round_ci_level(rec: RoundRecord | dict[str, Any]) -> float | None:
    """The two-sided level of a round's dev CI as the gate used it (the report's and the CLI's, one definition)."""
    from components.evolution.report import ci_level

    return ci_level(rec)


def ci_text(rec: RoundRecord | dict[str, Any]) -> str:
    """A round's dev interval as every view states it: `99.5% CI [+0.012, +0.121]`."""
    rec = RoundRecord.of(rec)
    g, level = rec.gated, round_ci_level(rec)
    return (f"{100 * level:.4g}% CI" if level is not None else "CI") + f" [{g.ci_lo:+.3f}, {g.ci_hi:+.3f}]"


def round_title(rec: RoundRecord | dict[str, Any]) -> str:
    """A round run's name, verdict and net first (what a reader scans a list of rounds for), then the plan or why
    there was none."""
    rec = RoundRecord.of(rec)
    net = f" net {rec.gate.net:+.3f}" if rec.gate else ""
    return f"r{int(rec.round)} {rec.verdict}{net}: {rec.summary or rec.reason}"[:240]


def describe_round(rec: RoundRecord | dict[str, Any]) -> str:
    """One paragraph a person reads on the round's run page: plan, owner, verdict and why."""
    rec = RoundRecord.of(rec)
    parent = (rec.parent.version if rec.parent else "") or (rec.champion_before or "?")
    g, rep = rec.gate, rec.repair
    words = [f"Round {rec.round} on champion {parent}."]
    if rec.summary:  # the mechanism is recorded once the plan reaches the gate
        words.append(f"Plan (owner {rec.owner or '-'}" + (f", mechanism {rec.mechanism}" if rec.mechanism else "")
                     + f"): {rec.summary}.")
    if rep:
        words.append(f"Repair screen on the diagnosed tasks: {rep.repaired} repaired, {rep.broken} broken.")
    if g:
        words.append(f"Held-out gate on dev: net {g.net:+.3f}, {ci_text(rec)}, "
                     f"{g.n_improved} improved / {g.n_regressed} regressed of {g.n_items} items.")
    child = rec.child.version if rec.child else None
    verdict = {Verdict.ACCEPT: f"accepted: committed as {child}", Verdict.REJECT: "rejected: the champion stays",
               Verdict.NO_PLAN: "no plan: nothing left to patch"}.get(rec.verdict, rec.verdict)
    words.append(f"Verdict: {verdict} ({rec.reason}).")
    return " ".join(words)


def round_tags(rec: RoundRecord) -> dict[str, str]:
    """A round run's tags (besides its parent run and where the round and campaign are)."""
    parent, child = rec.parent, rec.child
    tags = {"ratchet.kind": "round", "ratchet.round": str(rec.round), "ratchet.verdict": str(rec.verdict),
            "ratchet.owner": str(rec.owner or ""), "ratchet.plan_key": str(rec.plan_key or ""),
            "ratchet.parent_digest": parent.digest if parent else "",
            "ratchet.parent_version": parent.version if parent else "",
            "ratchet.candidate_digest": str(rec.candidate_digest or ""),
            "ratchet.version": child.version if child else "",
            "ratchet.benchmark_digest": str(rec.benchmark_digest or ""),
            "ratchet.seed_map_hash": str(rec.seed_map_hash or ""), "ratchet.git_commit": git_commit(),
            "ratchet.dvc_lock": dvc_lock_hash(), "ratchet.reason": rec.reason[:4000],
            # what kind of look, and what an accept claims (absent: an ordinary round, a "better" promotion)
            "ratchet.look_kind": "retry" if rec.retry else "ablation" if rec.ablation else "",
            "ratchet.promoted_as": str(rec.promoted_as or ""),
            "mlflow.note.content": describe_round(rec)}
    return {k: v for k, v in tags.items() if v != ""}  # what a round does not have is absent, not an empty tag


def round_params(rec: RoundRecord, params: dict[str, Any]) -> dict[str, Any]:
    """A round run's params: the gate's settings at this look, the campaign's model and meta-agent, the plan."""
    c, gp = params.get("campaign", {}), params.get("gate", {})
    return {"gate": {**{k: gp.get(k) for k in ("alpha", "campaign_alpha", "n_boot", "material", "reg_cap", "seed",
                                               "sequential")},
                     "look_alpha": rec.dev_look.alpha if rec.dev_look else None},
            "reason": (rec.reason or "-")[:6000], "verdict": str(rec.verdict),
            "seeds": c.get("seeds"), "model": c.get("model"), "meta_agent": c.get("meta_agent"),
            "max_turns": c.get("max_turns"), "plan": rec.summary or "-", "owner": str(rec.owner or "-"),
            "looks": {k: {"looks_used": seq.looks_used, "stopped_early": seq.stopped_early, "why": seq.why}
                      for k, seq in _stage_looks(rec).items() if seq}}


def _stage_looks(rec: RoundRecord) -> dict:
    return rec.sequential.stages() if rec.sequential is not None else {}


def round_metrics(rec: RoundRecord) -> dict[str, Any]:
    """A round run's metrics: the gate's and the repair screen's figures, the looks they took, the CI's level."""
    g, rep, seqs = rec.gate, rec.repair, _stage_looks(rec)
    return {"dev_base_mean": g and g.base_mean, "dev_cand_mean": g and g.cand_mean, "net": g and g.net,
            "ci_lo": g and g.ci_lo, "ci_hi": g and g.ci_hi, "n_improved": g and g.n_improved,
            "n_regressed": g and g.n_regressed, "repair_repaired": rep and rep.repaired,
            "repair_broken": rep and rep.broken,
            "repair_delta": (rep.cand_mean - rep.base_mean) if rep else None,
            "accepted": 1.0 if rec.accepted else 0.0,
            "dev_look": rec.dev_look.look if rec.dev_look else None,
            # sequential early stopping: looks evaluated, and whether the verdict came early
            **{f"{k}_looks_used": seq and seq.looks_used for k, seq in seqs.items()},
            **{f"{k}_stopped_early": float(seq.stopped_early) for k, seq in seqs.items() if seq},
            # the alpha this look at dev may spend (the param gate.alpha is one comparison's, the test
            # certification's), and the level of the CI the gate decided on
            "look_alpha": rec.dev_look.alpha if rec.dev_look else None,
            "ci_level": round_ci_level(rec) if g else None,
            # with the futility refund: what the look reserved and what it cost (one-sided)
            "look_reserved": rec.dev_look.reserved if rec.dev_look else None,
            "look_charge": rec.dev_look.charge if rec.dev_look else None,
            # prompt tokens per episode of both arms on the dev cells the gate saw
            "dev_base_tokens": rec.tokens.dev.base if rec.tokens and rec.tokens.dev else None,
            "dev_cand_tokens": rec.tokens.dev.cand if rec.tokens and rec.tokens.dev else None}


def new_store_from_template(uri: str | None) -> None:
    """Start a new local SQLite store as a copy of an empty, migrated one instead of migrating it afresh.

    Creating a store runs all of MLflow's schema migrations on the empty file: ~2.6 s of CPU each time, paid by every
    campaign with a new store (each test's own store, each fresh `RATCHET_HOME`). The template is made once per MLflow
    version (in `$XDG_CACHE_HOME/ratchet`, else `~/.cache/ratchet`) the way MLflow makes any store, and then emptied of
    its one row that names a place and a time: the Default experiment (artifact location under the current directory,
    creation time). MLflow adds that row itself when it first opens the copy, as it would on a new file, so the copy
    ends up with the same rows a migrated store has. Anything but a `sqlite:///<path>` URI, or an existing file, is
    left alone; the copy is linked into place, so a store another process created meanwhile is never replaced."""
    import sqlite3

    if not uri or not uri.startswith("sqlite:///") or "?" in uri:
        return
    path = Path(uri[len("sqlite:///"):])
    if path.exists() or str(path) in ("", ":memory:"):
        return
    try:
        _copy_template(path)
    except (OSError, sqlite3.Error):  # no cache to write (a read-only home): MLflow makes the store as before
        pass


def _copy_template(path: Path) -> None:
    import shutil
    import sqlite3

    import mlflow

    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ratchet"
    template = cache / f"mlflow-{mlflow.__version__}-empty-store.db"
    if not template.exists():
        from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

        cache.mkdir(parents=True, exist_ok=True)
        tmp = cache / f".{template.name}.{os.getpid()}-{threading.get_ident()}"
        tmp.unlink(missing_ok=True)
        SqlAlchemyStore(f"sqlite:///{tmp}", str(cache / "artifacts")).engine.dispose()
        with sqlite3.connect(tmp) as con:
            con.execute("DELETE FROM experiments")
        con.close()
        os.replace(tmp, template)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{threading.get_ident()}")
    shutil.copyfile(template, tmp)
    try:
        os.link(tmp, path)
    except FileExistsError:
        pass
    finally:
        tmp.unlink()


def one_trace_writer(uri: str | None) -> None:
    """On a SQLite store, have MLflow's process-wide trace exporter write from one thread. SQLite takes one writer
    at a time, and a transaction that reads and then writes while another connection writes fails at once with
    "database is locked" (no busy wait; MLflow retries only Postgres deadlocks); the async exporter runs `log_spans`
    and `start_trace` of the same traces on up to 10 threads at once. The tracker's own traces no longer go through
    that exporter (`CampaignTracker._write_traces` writes them itself, in sequence); this keeps any other tracing in
    the process (a `@mlflow.trace` of the caller's) from meeting the error on the same store."""
    from mlflow.environment_variables import MLFLOW_ASYNC_TRACE_LOGGING_MAX_WORKERS

    if str(uri or "").startswith("sqlite") and MLFLOW_ASYNC_TRACE_LOGGING_MAX_WORKERS.get() != 1:
        import mlflow

        MLFLOW_ASYNC_TRACE_LOGGING_MAX_WORKERS.set(1)
        mlflow.tracing.reset()  # the exporter reads the setting when it is built: build it again


class CampaignTracker:
    def __init__(self, name: str, out: str | Path, params: dict[str, Any], tracking_uri: str | None = None,
                 artifact_root: str | Path | None = None):
        from components.heap import long_lived

        self.name, self.out, self.params = name, Path(out), params
        # the output as records show it (`Params.recorded`: relative inside the project), not this machine's path
        self.where = recorded_path(str(self.out))
        self.traces_per_round = int((params.get("campaign") or {}).get("traces_per_round", MAX_TRACES_PER_ROUND))
        self.uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
        # MLflow's modules, and its store's (imported when the first client is made), live as long as the process
        with long_lived("mlflow"):  # components/heap.py
            import mlflow
            from mlflow import MlflowClient

            new_store_from_template(self.uri)
            self.client = MlflowClient(tracking_uri=self.uri)
        self._tracing: TracingClient | None = None  # the traces are written through it, made on first use
        one_trace_writer(mlflow.get_tracking_uri())  # MLflow's own exporter writes to the process's URI
        start = next((r for r in self._lineage_records() if isinstance(r, StartRecord)), None)  # (verdict start)
        if start is None:
            raise ValueError(f"{self.out}: no lineage start record: nothing to log")
        self.identity = campaign_identity(params, start.child.digest, str(start.benchmark_digest or ""),
                                          (start.identity or {}).get("world.settings"))
        self.ident = identity_hash(self.identity)
        self.experiment_name = experiment_name(name, self.ident)
        self.model_name = registered_name(name, self.ident, params["campaign"]["out"])
        exp = self.client.get_experiment_by_name(self.experiment_name)
        if exp is None:
            root = Path(artifact_root or Path(os.environ.get("RATCHET_HOME", ".ratchet")) / "mlartifacts").resolve()
            self.experiment_id = self.client.create_experiment(
                self.experiment_name, artifact_location=(root / name / self.ident).as_uri(),
                tags={"ratchet.campaign": name, "ratchet.identity": self.ident,
                      # MLflow's UI files an experiment of this kind's runs as training runs ("Model training"),
                      # not as the GenAI evaluation runs it assumes when the kind is unset
                      "mlflow.experimentKind": "custom_model_development",
                      "mlflow.note.content": self._identity_note()})
        else:
            self.experiment_id = exp.experiment_id
        commit, phash = git_commit(), params_hash(params)
        # the same campaign (identity, output, code) is one run however often it is rerun or resumed; found in MLflow
        # by this key, never through a file a checkout can leave behind from another campaign
        self.key = hashlib.sha256(f"{self.ident}|{self.out.resolve()}|{commit}".encode()).hexdigest()[:16]
        found = self._find_campaign_run()
        if found is None:
            run = self.client.create_run(self.experiment_id, run_name=f"campaign {name} @{commit[:7]} p{phash}", tags={
                "ratchet.kind": "campaign", "ratchet.campaign_key": self.key, "ratchet.params_hash": phash,
                "ratchet.identity": self.ident, "ratchet.campaign": name, "ratchet.registered_model": self.model_name,
                "ratchet.out": self.where, "ratchet.git_commit": commit, "ratchet.dvc_lock": dvc_lock_hash(),
                # a queued `dvc exp run` (its stage runs in DVC's temporary copy): the experiment's name in `dvc exp show`
                **({"ratchet.dvc_experiment": os.environ["DVC_EXP_NAME"]} if os.environ.get("DVC_EXP_NAME") else {}),
                "mlflow.note.content": f"Campaign `{name}` at commit `{commit[:12]}`, identity `{self.ident}`, params "
                                       f"hash `{phash}`, output `{self.where}`. Its rounds are the nested runs; its "
                                       f"package versions are the registered model `{self.model_name}` (alias "
                                       "`champion`)."})
            found = run.info.run_id
            self._params(found, params)
        self.run_id: str = found
    def _identity_note(self) -> str:
        rows = "\n".join(f"| `{k}` | `{json.dumps(v, default=str)}` |" for k, v in sorted(self.identity.items()))
        return (f"Campaign `{self.name}`, identity `{self.ident}`: the runs of every campaign with exactly these "
                "settings and start/benchmark bytes. Another value of any of them (a `dvc exp run -S ...`, a `--set`) "
                "is another campaign, recorded in its own experiment and registered model. `campaign.rounds` is "
                "part of it because each round's gate spends `gate.campaign_alpha / campaign.rounds`.\n\n"
                "| setting | value |\n|---|---|\n" + rows)

    def _find_campaign_run(self) -> str | None:
        runs = self.client.search_runs([self.experiment_id], f"tags.`ratchet.campaign_key` = '{self.key}'",
                                       max_results=1)
        return runs[0].info.run_id if runs else None

    def _round_runs(self) -> dict[int, Any]:
        runs = self.client.search_runs([self.experiment_id], f"tags.mlflow.parentRunId = '{self.run_id}' and "
                                       "tags.`ratchet.kind` = 'round'", max_results=1000)
        return {int(r.data.tags["ratchet.round"]): r for r in runs}

    def _params(self, run_id: str, params: dict) -> None:
        from mlflow.entities import Param

        items = [Param(k[:250], v[:6000]) for k, v in sorted(_flatten(params).items())]
        for i in range(0, len(items), 100):
            self.client.log_batch(run_id, params=items[i:i + 100])

    def _metrics(self, run_id: str, values: dict[str, Any], step: int = 0, model_id: str | None = None) -> None:
        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        ms = [Metric(k, float(v), ts, step, model_id=model_id) if model_id else Metric(k, float(v), ts, step)
              for k, v in sorted(values.items()) if isinstance(v, (int, float)) and v is not None]
        if ms:
            self.client.log_batch(run_id, metrics=ms)

    def log_round(self, rec: RoundRecord | dict[str, Any]) -> str:
        """One nested run for a finished round, with nested runs for its evaluations; returns its run id."""
        rec = RoundRecord.of(rec)
        # where the round is now: the record's directory name under this campaign's rounds/ (an older record's
        # absolute path names the same round), never a place outside it on the record's say-so
        rd = confined(self.out / "rounds", Path(rec.round_dir).name, f"{self.out / 'lineage'}: round_dir")
        n = int(rec.round)
        found = self._round_runs().get(n)
        if found is not None and found.info.status == "FINISHED":  # logged already (a rerun, a resume): not twice
            return found.info.run_id
        if found is not None:  # half-logged by a killed process: log it again from the files, its traces too
            stale = self.client.search_traces(locations=[self.experiment_id], run_id=found.info.run_id,
                                              include_spans=False, max_results=1000)
            if stale:
                self.client.delete_traces(self.experiment_id, trace_ids=[t.info.trace_id for t in stale])
            self.client.delete_run(found.info.run_id)
        tags = {"mlflow.parentRunId": self.run_id, **round_tags(rec), "ratchet.round_dir": recorded_path(str(rd)),
                "ratchet.campaign_out": self.where}
        run = self.client.create_run(self.experiment_id, run_name=round_title(rec), tags=tags)
        rid = run.info.run_id
        self._params(rid, round_params(rec, self.params))
        self._metrics(rid, round_metrics(rec))
        for name in ("plan.json", "diagnosis.json", "validation.json", "repair.json", "repair_items.csv", "gate.json",
                     "gate_items.csv", "dev_base.csv", "dev_cand.csv", "findings.csv", "round.json"):
            if (rd / name).exists():
                self.client.log_artifact(rid, str(rd / name))
        if (rd / "train" / "traces.parquet").exists():
            self.client.log_artifact(rid, str(rd / "train" / "traces.parquet"), "traces")
        evals = json.loads((rd / "evals.json").read_text()) if (rd / "evals.json").exists() else []
        self._evals(rid, evals, f"r{n} ")
        self._metrics(rid, {k: sum(ev["summary"].get(k, 0) for ev in evals) for k in ("tokens_in", "tokens_out")})
        cited = self._log_traces(rid, rd, n)
        if cited:
            self.client.set_tag(rid, "mlflow.note.content", describe_round(rec) + "\n\n" + self._cited_links(rd, cited))
        self._campaign_step(rec)
        self.client.set_terminated(rid)
        return rid

    def _campaign_step(self, rec: RoundRecord) -> None:
        """Campaign metrics stepped by round. Only gated rounds have a net, so the latest value is never a round
        that had nothing to gate; the champion's dev mean (`report.champion_means`: the mean it was promoted on,
        unchanged until the next promotion) and the promotions so far are defined at every round."""
        from components.evolution.report import champion_means

        g, n = rec.gate, int(rec.round)
        rounds = [r for r in self._lineage_records() if isinstance(r, RoundRecord) and r.round <= n]
        values: dict[str, Any] = {"promotions": sum(1 for r in rounds if r.verdict == Verdict.ACCEPT)}
        if g:
            values.update(round_net=g.net, round_ci_lo=g.ci_lo, round_ci_hi=g.ci_hi,
                          champion_dev_mean=champion_means(rounds).get(n))
        self._metrics(self.run_id, values, step=n)

    def _lineage_records(self) -> list[StartRecord | RoundRecord]:
        return Lineage(self.out / "lineage").entries()

    def _evals(self, parent: str, evals: list[dict], prefix: str = "") -> None:
        for ev in evals:
            # a sequential gate evaluates each arm once per look: the look number tells the runs apart
            look = f" look {ev['look']}" if ev.get("look") is not None else ""
            reused = f" (= {ev['reused']})" if ev.get("reused") else ""
            run = self.client.create_run(self.experiment_id, run_name=f"{prefix}{ev['split']} {ev['arm']}{look}{reused}",
                                         tags={"mlflow.parentRunId": parent, "ratchet.kind": "evaluation",
                                               "ratchet.arm": ev["arm"], "ratchet.split": ev["split"],
                                               "ratchet.look": str(ev.get("look", "")),
                                               "ratchet.package_digest": ev["package_digest"]})
            self._metrics(run.info.run_id, ev["summary"])
            self.client.set_terminated(run.info.run_id)

    # -- traces of the failed episodes an evidence packet cites ----------------------------------------------------
    def _log_traces(self, run_id: str, rd: Path, round_no: int) -> list[tuple[str, str, str]]:
        """Each cited failed episode as an MLflow trace linked to the round run: one span per turn, one child span
        per kernel phase (memory delivered, model call, checker verdicts, tool call with its receipt)."""
        import pandas as pd

        diag, tp = rd / "diagnosis.json", rd / "train" / "traces.parquet"
        if not diag.exists() or not tp.exists():
            return []
        packets = json.loads(diag.read_text())
        traces = pd.read_parquet(tp)
        timings = episode_timings(rd / "train")
        built: dict[str, Any] = {}  # episode -> its trace, built in memory
        cited: list[tuple[str, str, str]] = []
        for pk in packets:
            eps: list[str] = []
            for claim in pk.get("claims", []):
                for c in claim.get("evidence", []):
                    if c["episode_id"] not in eps:
                        eps.append(c["episode_id"])
            for ep in eps[:MAX_TRACES_PER_PACKET]:
                if ep not in built and len(built) < self.traces_per_round:
                    steps = traces[traces["episode_id"] == ep].sort_values("step")
                    cites = {int(c["step"]) for claim in pk["claims"] for c in claim["evidence"] if c["episode_id"] == ep}
                    built[ep] = self._episode_trace(run_id, round_no, pk, ep, steps, cites, timings.get(ep, {}))
                if ep in built:
                    cited.append((pk["id"], ep, built[ep].info.trace_id))
        if built:
            self._write_traces(list(built.values()))
        return cited

    def _cited_links(self, rd: Path, cited: list[tuple[str, str, str]]) -> str:
        """Markdown for the round's description: each packet's claims, each followed by links to the traces of the
        episodes it cites (the cited turn named), so a reader clicks from a claim to the trace it rests on."""
        packets = {pk["id"]: pk for pk in json.loads((rd / "diagnosis.json").read_text())}
        trace_of: dict[str, dict[str, str]] = {}
        for pk, ep, tid in cited:
            trace_of.setdefault(pk, {})[ep] = tid
        lines = ["Cited failed episodes (each packet's claim, then the traces of the episodes it cites):"]
        for pk, eps in trace_of.items():
            for claim in packets[pk].get("claims", []):
                links = [f"[{c['episode_id']}, turn {c['step']}]("
                         + ui_route(f"#/experiments/{self.experiment_id}/traces?selectedEvaluationId="
                                    f"{eps[c['episode_id']]}") + ")"
                         for c in claim.get("evidence", []) if c["episode_id"] in eps]
                if links:
                    st = claim["statement"]
                    st = st if len(st) <= 160 else st[:157] + "..."
                    lines.append(f"- packet `{pk}` ({packets[pk].get('owner', '?')}): \"{st}\" → " + ", ".join(links))
        return "\n".join(lines)

    def _write_traces(self, traces: list) -> None:
        """Write finished traces to the campaign's own store, whatever the process's tracking URI: through a
        TracingClient bound to this tracker's URI (the calls MLflow's exporter makes), not through MLflow's
        process-wide exporter, which sends every trace to the process's URI. Synchronous and on this thread, so on a
        SQLite store nothing writes concurrently, and the traces are complete in the store before the round's run is
        finished: each trace's info first, then all of the round's spans in one `log_spans` transaction. In that
        order each `start_trace` is a plain insert; after `log_spans` (the exporter's order) it would meet the row
        `log_spans` created and take MLflow's slower merge path. The stored traces, tags, metadata and spans are the
        same either way (MLflow's internal payload counter aside); writing them takes about a third less CPU."""
        from mlflow.exceptions import RestException
        from mlflow.tracing.client import TracingClient
        from mlflow.tracing.utils import add_size_stats_to_trace_metadata

        if self._tracing is None:
            self._tracing = TracingClient(self.client.tracking_uri)
        client = self._tracing
        with _TRACE_WRITES:
            infos = []
            for t in traces:
                add_size_stats_to_trace_metadata(t)
                infos.append(client.start_trace(t.info))
            try:
                client.log_spans(self.experiment_id, [s for t in traces for s in t.data.spans])
            except NotImplementedError:  # a store without span storage: the spans go to artifacts
                pass
            except RestException as e:  # the same, behind a tracking server (what MLflow's exporter tolerates)
                if "REST OTLP span logging is not supported" not in e.message:
                    raise
            else:
                return
            # Private, with no public equivalent in MLflow 3.17: `mlflow.log_trace` builds a new trace, `mlflow.add_trace`
            # attaches one to the active span, `MlflowClient._log_trace` is private too. This is the call MLflow's own
            # exporter makes (mlflow/tracing/export/mlflow_v3.py) for a store without span storage, the only case here.
            for info, t in zip(infos, traces):
                client._upload_trace_data(info, t.data)

    def _episode_trace(self, run_id: str, round_no: int, packet: dict, ep: str, steps, cited_steps: set[int],
                       timing: dict[int, list[tuple[str, int, int]]] | None = None):
        """One episode as a finished mlflow Trace, built in memory (nothing is exported): its spans come from a
        private OpenTelemetry tracer with no processor, its info is what MLflow's span processor would record (the
        source run links it to the round run). `timing` (`episode_timings`): when each turn and phase ran, so spans
        have their real start and duration, one span per phase as the kernel ran it (the model is called to propose
        and to draft, memory delivered before each); a turn without it (cut short by a model error, or an
        evaluation recorded before timings were kept) gets its four phases at 1 ms each, the root span saying so."""
        from mlflow.entities import SpanType, Trace, TraceData, TraceInfo, TraceLocation, TraceState
        from mlflow.tracing.constant import (MAX_CHARS_IN_TRACE_INFO_METADATA, TRACE_SCHEMA_VERSION,
                                             TRACE_SCHEMA_VERSION_KEY, SpanAttributeKey, TraceMetadataKey,
                                             TraceTagKey)

        from components.runtime.kernel import CHECKS, MEMORY, MODEL, TOOL

        timing = timing or {}
        recorded = sum(int(s in timing) for s in steps["step"].astype(int)) if len(steps) else 0
        first = steps.iloc[0] if len(steps) else None
        starts = [t[0][1] for t in timing.values() if t]
        clock = min(starts) if starts else time.time_ns()  # where the next synthetic 1 ms phase starts

        def tick() -> int:
            nonlocal clock
            clock += 1_000_000
            return clock - 1_000_000

        spans: list = []
        root = _start_span(f"episode {ep}", SpanType.AGENT, None, clock, spans, inputs={
            "episode": ep, "item_id": str(first["item_id"]) if first is not None else "",
            "incoming": json.loads(first["incoming"]) if first is not None else {}},
            attributes={SpanAttributeKey.EXPERIMENT_ID: self.experiment_id, "ratchet.packet": packet["id"],
                        "ratchet.owner": packet["owner"], "ratchet.kind": packet["kind"],
                        "ratchet.timing": f"{recorded} of {len(steps)} turns timed as they ran"
                                          + ("" if recorded == len(steps) else "; the others at 1 ms per phase")})
        for s in steps.to_dict("records"):
            j = {k: (json.loads(s[k]) if isinstance(s.get(k), str) and k != "episode_id" and k != "hash"
                     and s[k][:1] in "[{" else s.get(k)) for k in s}
            ran = timing.get(int(s["step"]))  # [(turn, start, end), (phase, start, end), ...] as the kernel ran them
            turn = _start_span(f"turn {s['step']}" + (" (cited)" if int(s["step"]) in cited_steps else ""),
                               SpanType.CHAIN, root, ran[0][1] if ran else tick(), spans,
                               inputs={"incoming": j.get("incoming"), "state_before": j.get("state_before")},
                               attributes={"step": int(s["step"]), "hash": s.get("hash", ""),
                                           "cited": int(s["step"]) in cited_steps})
            phases = {
                MEMORY: (SpanType.MEMORY, {"deliveries": j.get("deliveries")}, {"cards": j.get("delivered")}),
                MODEL: (SpanType.LLM, {"state_before": j.get("state_before")},
                               {"proposal": j.get("proposal"), "first_draft": j.get("first_draft"),
                                "draft": j.get("action")}),
                CHECKS: (SpanType.GUARDRAIL, {"draft": j.get("first_draft") or j.get("action")},
                                     {"checks": j.get("checks"), "blocked": j.get("blocked")}),
                TOOL: (SpanType.TOOL, {"action": j.get("action")},
                              {"receipt": j.get("observation"), "state_after": j.get("state_after")}),
            }
            for name, start, end in (ran[1:] if ran else [(n, None, None) for n in phases]):
                kind, inputs, outputs = phases[name]
                _start_span(name, kind, turn, start if start is not None else tick(), spans, inputs=inputs).end(
                    outputs=outputs, end_time_ns=end if end is not None else tick())  # (None: not timed, `ran` empty)
            turn.end(outputs={"fingerprint": j.get("fingerprint")}, end_time_ns=ran[0][2] if ran else tick())
            clock = max(clock, ran[0][2] if ran else clock)
        root.end(outputs={"claims": [c["statement"] for c in packet.get("claims", [])]}, status="ERROR",
                 end_time_ns=clock)

        def preview(key: str) -> str:  # the request/response columns of the Traces tab, cut as MLflow cuts them
            v = root._span.attributes.get(key) or ""
            return v if len(v) <= MAX_CHARS_IN_TRACE_INFO_METADATA else v[:MAX_CHARS_IN_TRACE_INFO_METADATA - 3] + "..."

        start_ns, end_ns = root.start_time_ns, root.end_time_ns
        info = TraceInfo(
            trace_id=root.trace_id, trace_location=TraceLocation.from_experiment_id(self.experiment_id),
            request_time=start_ns // 1_000_000, execution_duration=(end_ns - start_ns) // 1_000_000,
            state=TraceState.ERROR,
            trace_metadata={**_env_metadata(), TRACE_SCHEMA_VERSION_KEY: str(TRACE_SCHEMA_VERSION),
                            TraceMetadataKey.SOURCE_RUN: run_id,
                            TraceMetadataKey.INPUTS: preview(SpanAttributeKey.INPUTS),
                            TraceMetadataKey.OUTPUTS: preview(SpanAttributeKey.OUTPUTS)},
            tags={TraceTagKey.TRACE_NAME: f"episode {ep}", "ratchet.round": str(round_no),
                  "ratchet.packet": packet["id"], "ratchet.episode": ep, "ratchet.owner": packet["owner"]})
        return Trace(info=info, data=TraceData(spans=[s.to_immutable_span() for s in spans]))

    # -- package versions as logged models / registered model versions ----------------------------------------------
    def log_versions(self) -> None:
        """Every committed version as a logged model and a version of the registered model `ratchet-<name>`, parent
        first, each tagged with its digest and its parent; the newest gets the alias `champion`."""
        from mlflow.entities import LoggedModelStatus
        from mlflow.exceptions import MlflowException

        name = self.model_name
        try:
            self.client.get_registered_model(name)
        except MlflowException:
            self.client.create_registered_model(name, tags={"ratchet.campaign": self.name}, description=(
                f"Memory-package versions of campaign `{self.name}`: M0 is the start, each later version a promotion. "
                "The model stays frozen; what is versioned is the package. Alias `champion` is the current champion."))
        existing = {v.tags.get("ratchet.digest"): v for v in self.client.search_model_versions(f"name = '{name}'")}
        rounds = self._round_runs()
        by_version: dict[str, Any] = {}
        last = None
        for rec in self._lineage_records():
            if rec.verdict not in (Verdict.START, Verdict.ACCEPT):
                continue
            child, parent = rec.committed, rec.parent
            d = child.digest
            if d in existing:
                by_version[child.version] = last = existing[d]
                continue
            path = Lineage(self.out / "lineage").version_dir(child.version, f"round {rec.round}: child.version")
            round_run = rounds.get(rec.round)
            src = round_run.info.run_id if round_run is not None else self.run_id
            parent_mv = by_version.get(parent.version if parent else "")
            tags = {"ratchet.version": child.version, "ratchet.digest": d,
                    "ratchet.parent": parent.version if parent else "",
                    "ratchet.parent_digest": parent.digest if parent else "", "ratchet.round": str(rec.round),
                    "ratchet.campaign": self.name,
                    "ratchet.parent_model_version": parent_mv.version if parent_mv is not None else ""}
            lm = self.client.create_logged_model(self.experiment_id, name=f"{self.name}-{child.version}",
                                                 source_run_id=src, tags=tags, params=manifest_knobs(path),
                                                 model_type="memory-package")
            self.client.log_model_artifacts(lm.model_id, str(path))
            rr = rec if isinstance(rec, RoundRecord) else None
            g = rr.gate if rr is not None else None
            if round_run is not None and g:
                self._model_metrics(lm.model_id, round_run.info.run_id)
            self.client.finalize_logged_model(lm.model_id, LoggedModelStatus.READY)
            desc = (f"{child.version} (`{d[:12]}`) of campaign `{self.name}`. " + (
                f"Promoted in round {rr.round} from {parent.version if parent else None} ([version "
                f"{parent_mv.version}]({ui_route(f'#/models/{name}/versions/{parent_mv.version}')}) of this model, a "
                "link to walk the lineage): "
                f"{rr.summary or ''}; dev net {g.net:+.3f}, {ci_text(rr)}."
                if rr is not None and rr.verdict == Verdict.ACCEPT and parent_mv is not None and g
                else "The campaign's starting package.")
                + f" Logged model: [{lm.name}]({ui_route(f'#/experiments/{self.experiment_id}/models/{lm.model_id}')})"
                " (its knobs, gate figures and files).")
            # source: the logged model's files. A `models:/<id>` source makes MLflow's SQL registry look the model up
            # through the process's tracking URI (a TODO of theirs), which fails when the campaign's store is another
            mv = self.client.create_model_version(name, source=lm.artifact_location, run_id=src,
                                                  tags={**tags, "ratchet.model_id": lm.model_id},
                                                  description=desc, model_id=lm.model_id)
            # the logged model's page lists its registered version (the tag `mlflow.register_model` sets)
            self.client.set_logged_model_tags(lm.model_id, {"mlflow.modelVersions": json.dumps(
                [{"name": name, "version": mv.version}])})
            by_version[child.version] = last = mv
        if last is not None:
            self.client.set_registered_model_alias(name, "champion", last.version)

    def links(self, ui: str | None = None) -> dict[str, str]:
        """Direct addresses in the MLflow UI (`ui_address`: the tracking server's own, else the `ratchet ui` that
        runs, else its default address): the rounds side by side, the champion's registered version, and one cited
        trace (the first round's that has one)."""
        from urllib.parse import quote

        if ui is None:
            ui = ui_address(self.uri)[0]

        rounds = [r for _, r in sorted(self._round_runs().items())]
        exp = json.dumps([self.experiment_id])
        run = f"#/experiments/{self.experiment_id}/runs/{self.run_id}"
        out = {"campaign": f"{ui}/" + ui_route(run),
               # what a reader wants of the rounds first: the gate's net with its CI, and the champion's dev mean, by
               # round (the campaign run's stepped metrics); the compare view opens on a chart of other axes
               "net by round": f"{ui}/" + ui_route(f"{run}/model-metrics")}
        if rounds:
            ids = json.dumps([r.info.run_id for r in rounds], separators=(",", ":"))
            out["rounds"] = f"{ui}/" + ui_route(f"#/compare-runs?runs={quote(ids)}&experiments={quote(exp)}")
        try:
            champ = self.client.get_model_version_by_alias(self.model_name, "champion")
            out["champion"] = f"{ui}/" + ui_route(f"#/models/{quote(self.model_name)}/versions/{champ.version}")
        except Exception:  # no version registered (a campaign stopped before certification)
            pass
        for r in rounds:
            traces = self.client.search_traces(locations=[self.experiment_id], run_id=r.info.run_id,
                                               include_spans=False, max_results=1)
            if traces:
                out["trace"] = f"{ui}/" + ui_route(f"#/experiments/{self.experiment_id}/traces?"
                                                    f"selectedEvaluationId={traces[0].info.trace_id}")
                break
        return out

    def _model_metrics(self, model_id: str, round_run_id: str) -> None:
        """The logged model's metrics: its round's gate figures, the very points the round run holds (same key,
        value, step and timestamp). MLflow records a model's metrics through a run's `log_batch`, and a point a run
        already has is not added again, so the round run's metrics stay as they were (no second point, no new key)."""
        from mlflow.entities import Metric

        points = [Metric(m.key, m.value, m.timestamp, m.step, model_id=model_id)
                  for key in GATE_METRICS for m in self.client.get_metric_history(round_run_id, key)[-1:]]
        if points:
            self.client.log_batch(round_run_id, metrics=points)

    def finish(self, summary: dict[str, Any], summary_path: str | Path, test_evals: Sequence[dict[str, Any]] = (),
               spent: dict[str, float] | None = None) -> None:
        run = self.client.get_run(self.run_id)
        if run.data.tags.get("ratchet.champion_digest") == summary["champion_digest"] and run.info.status == "FINISHED":
            return  # this campaign's result is recorded already (a rerun with the same bytes): add nothing twice
        if not self.client.search_runs([self.experiment_id], f"tags.mlflow.parentRunId = '{self.run_id}' and "
                                       "tags.`ratchet.split` = 'test'", max_results=1):
            self._evals(self.run_id, list(test_evals))  # the test split is touched once, and shows once
        t, loc = summary["test"] or {}, summary["localization"]
        spent = spent or {}
        self._metrics(self.run_id, {
            "test_base_mean": t.get("base_mean"), "test_champion_mean": t.get("champion_mean"), "test_net": t.get("net"),
            "test_ci_lo": t.get("ci_lo"), "test_ci_hi": t.get("ci_hi"), "accepted": summary["accepted"],
            "rounds": summary["rounds"], "localization_accuracy": loc.get("accuracy"),
            "outcome_only_accuracy": loc.get("outcome_only_accuracy"),
            "dev_looks": (summary.get("dev_looks") or {}).get("n"),
            "dev_alpha_spent": (summary.get("dev_looks") or {}).get("alpha_spent"),
            **{f"budget_{k}": v for k, v in spent.items()}})
        if summary.get("stopped"):
            self.client.set_tag(self.run_id, "ratchet.stopped", summary["stopped"][:4000])
        lineage = " -> ".join(f"{v['version']} ({v['digest'][:12]})" for v in summary["lineage"])
        self.client.set_tag(self.run_id, "ratchet.lineage", lineage[:4000])
        self.client.set_tag(self.run_id, "ratchet.champion", summary["champion"])
        self.client.log_artifact(self.run_id, str(summary_path))
        lineage_file = self.out / "lineage" / "lineage.jsonl"
        if lineage_file.exists():
            self.client.log_artifact(self.run_id, str(lineage_file))
        self.log_versions()
        self.client.set_tag(self.run_id, "ratchet.champion_digest", summary["champion_digest"])  # last: the done mark
        self.client.set_terminated(self.run_id)


def _campaign_runs(client: Any, summary: dict[str, Any], campaign_dir: str | Path) -> tuple[Any, list]:
    """The experiment of the campaign a summary.json describes (its identity) and that experiment's campaign runs
    written to `campaign_dir`, newest first."""
    exp = client.get_experiment_by_name(tracking_names(summary)["experiment"])
    if exp is None:
        return None, []
    # the tag as the campaign recorded it (its summary's out, whatever this process's directory), as this process
    # names it, or absolute (runs logged before tags held recorded paths)
    wheres = {str(((summary.get("params") or {}).get("campaign") or {}).get("out")), recorded_path(str(campaign_dir)),
              str(Path(campaign_dir).resolve())}
    runs = [r for r in client.search_runs([exp.experiment_id], "tags.`ratchet.kind` = 'campaign'",
                                          order_by=["attributes.start_time DESC"], max_results=1000)
            if r.data.tags.get("ratchet.out") in wheres]
    return exp, runs


def campaign_run(client: Any, summary: dict[str, Any], campaign_dir: str | Path) -> str | None:
    """The MLflow run of the campaign written to `campaign_dir` (the latest, when code changes made several)."""
    _, runs = _campaign_runs(client, summary, campaign_dir)
    return runs[0].info.run_id if runs else None


def campaign_records(client: Any, campaign_dir: str | Path) -> dict[str, Any]:
    """What a view shows of the campaign in `campaign_dir`, found by that campaign's identity: its summary.json
    (name, the params a rerun keeps, start and benchmark bytes) names its experiment and registered model, and its
    run is the finished one of that output whose champion is the summary's. Never "the latest finished run named
    default": after a `dvc exp run`, that is the experiment, not the campaign in the workspace. InputError (one
    line) when the campaign is not in this store."""
    from components.errors import InputError
    from components.io import read_json_object

    where = Path(campaign_dir) / "summary.json"
    summary = read_json_object(where)
    try:
        names = tracking_names(summary)
    except (KeyError, TypeError, ValueError) as e:
        raise InputError(f"{where}: -: not a campaign's summary ({type(e).__name__}: {e})") from None
    exp, runs = _campaign_runs(client, summary, campaign_dir)
    finished = [r for r in runs if r.info.status == "FINISHED"
                and r.data.tags.get("ratchet.champion_digest") == summary.get("champion_digest")]
    if exp is None or not finished:
        raise InputError(f"{where}: -: no finished MLflow run of this campaign (experiment {names['experiment']}, "
                         f"champion {str(summary.get('champion_digest'))[:12]}) in {client.tracking_uri}")
    return {"summary": summary, "experiment": exp, "run": finished[0], "registered_model": names["registered_model"]}


def log_export(manifest: Any, export_dir: str | Path, summary: dict[str, Any], tracking_uri: str | None = None) -> str | None:
    """Each exported file as a dataset input of the campaign's run (context `training`; source: the campaign and its
    champion version; digest: the file's sha256). Returns the run id, or None when the campaign was never logged."""
    import warnings

    import mlflow.data
    import pandas as pd
    from mlflow import MlflowClient
    from mlflow.entities import DatasetInput, InputTag

    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    new_store_from_template(uri)
    client = MlflowClient(tracking_uri=uri)
    run_id = campaign_run(client, summary, manifest.campaign_dir)
    if run_id is None:
        return None
    inputs_now = client.get_run(run_id).inputs
    logged = {(d.dataset.name, d.dataset.digest) for d in (inputs_now.dataset_inputs if inputs_now is not None else [])}
    inputs = []
    for name, f in sorted(manifest.files.items()):
        path = Path(export_dir) / f.path
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
        df = pd.DataFrame([{k: json.dumps(v, sort_keys=True) for k, v in r.items()} for r in rows])
        ds_name = f"{manifest.campaign}/{manifest.champion}/{name.removesuffix('.jsonl')}"
        if (ds_name, f.sha256[:32]) in logged:
            continue  # the same bytes are logged already (a rerun of the stage)
        with warnings.catch_warnings():  # MLflow registers its local-file source twice and says so on every call
            warnings.simplefilter("ignore", UserWarning)
            # (defined when mlflow.data is imported, from MLflow's dataset registry: no attribute a checker can see)
            ds = mlflow.data.from_pandas(  # type: ignore[attr-defined]
                df, source=recorded_path(str(path)), name=ds_name, digest=f.sha256[:32])
        inputs.append(DatasetInput(ds._to_mlflow_entity(), tags=[
            InputTag("mlflow.data.context", "training"), InputTag("ratchet.source", "campaign"),
            InputTag("ratchet.champion", manifest.champion), InputTag("ratchet.champion_digest", manifest.champion_digest),
            InputTag("ratchet.split", manifest.split), InputTag("ratchet.sha256", f.sha256),
            InputTag("ratchet.records", str(f.records))]))
    if inputs:
        client.log_inputs(run_id, datasets=inputs)
    return run_id
