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
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from components.codes import Verdict

# traces logged per round by default (`campaign.traces_per_round`): params' default too, so it lives in defaults
from components.defaults import MAX_TRACES_PER_ROUND
from components.evolution.lineage import Lineage
from components.evolution.record import RoundRecord, StartRecord
from components.io import confined, recorded_path

# the parts of the record that live in their own modules, re-exported: callers import them from here
from components.tracking.mlflow_names import (
    UI_MODE,  # noqa: F401
    _flatten,
    campaign_identity,
    dvc_lock_hash,  # noqa: F401
    experiment_name,
    git_commit,
    identity_hash,
    manifest_knobs,
    params_hash,
    registered_name,
    tracking_names,
    ui_address,
    ui_route,
)
from components.tracking.mlflow_rounds import (
    ci_text,
    describe_round,
    round_ci_level,  # noqa: F401
    round_metrics,  # noqa: F401
    round_params,
    round_title,
)
from components.tracking.mlflow_store import new_store_from_template, one_trace_writer  # noqa: F401
from components.tracking.mlflow_traces import MAX_TRACES_PER_PACKET, TraceWriter, episode_timings  # noqa: F401

# a promoted version's metrics: the gate figures of the round that promoted it
GATE_METRICS = ("net", "ci_lo", "ci_hi", "dev_base_mean", "dev_cand_mean", "n_improved", "n_regressed")


def round_tags(rec: RoundRecord) -> dict[str, str]:
    """A round run's tags (besides its parent run and where the round and campaign are)."""
    parent, child = rec.parent, rec.child
    tags = {
        "ratchet.kind": "round",
        "ratchet.round": str(rec.round),
        "ratchet.verdict": str(rec.verdict),
        "ratchet.owner": str(rec.owner or ""),
        "ratchet.plan_key": str(rec.plan_key or ""),
        "ratchet.parent_digest": parent.digest if parent else "",
        "ratchet.parent_version": parent.version if parent else "",
        "ratchet.candidate_digest": str(rec.candidate_digest or ""),
        "ratchet.version": child.version if child else "",
        "ratchet.benchmark_digest": str(rec.benchmark_digest or ""),
        "ratchet.seed_map_hash": str(rec.seed_map_hash or ""),
        "ratchet.git_commit": git_commit(),
        "ratchet.dvc_lock": dvc_lock_hash(),
        "ratchet.reason": rec.reason[:4000],
        # what kind of look, and what an accept claims (absent: an ordinary round, a "better" promotion)
        "ratchet.look_kind": "retry" if rec.retry else "ablation" if rec.ablation else "",
        "ratchet.promoted_as": str(rec.promoted_as or ""),
        "mlflow.note.content": describe_round(rec),
    }
    return {k: v for k, v in tags.items() if v != ""}  # what a round does not have is absent, not an empty tag


class CampaignTracker:
    def __init__(
        self,
        name: str,
        out: str | Path,
        params: dict[str, Any],
        tracking_uri: str | None = None,
        artifact_root: str | Path | None = None,
    ):
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
        one_trace_writer(mlflow.get_tracking_uri())  # MLflow's own exporter writes to the process's URI
        start = next((r for r in self._lineage_records() if isinstance(r, StartRecord)), None)  # (verdict start)
        if start is None:
            raise ValueError(f"{self.out}: no lineage start record: nothing to log")
        self.identity = campaign_identity(
            params, start.child.digest, str(start.benchmark_digest or ""), (start.identity or {}).get("world.settings")
        )
        self.ident = identity_hash(self.identity)
        self.experiment_name = experiment_name(name, self.ident)
        self.model_name = registered_name(name, self.ident, params["campaign"]["out"])
        exp = self.client.get_experiment_by_name(self.experiment_name)
        if exp is None:
            root = Path(artifact_root or Path(os.environ.get("RATCHET_HOME", ".ratchet")) / "mlartifacts").resolve()
            self.experiment_id = self.client.create_experiment(
                self.experiment_name,
                artifact_location=(root / name / self.ident).as_uri(),
                tags={
                    "ratchet.campaign": name,
                    "ratchet.identity": self.ident,
                    # MLflow's UI files an experiment of this kind's runs as training runs ("Model training"),
                    # not as the GenAI evaluation runs it assumes when the kind is unset
                    "mlflow.experimentKind": "custom_model_development",
                    "mlflow.note.content": self._identity_note(),
                },
            )
        else:
            self.experiment_id = exp.experiment_id
        self.traces = TraceWriter(self.client, self.experiment_id, self.traces_per_round)  # cited episodes' traces
        commit, phash = git_commit(), params_hash(params)
        # the same campaign (identity, output, code) is one run however often it is rerun or resumed; found in MLflow
        # by this key, never through a file a checkout can leave behind from another campaign
        self.key = hashlib.sha256(f"{self.ident}|{self.out.resolve()}|{commit}".encode()).hexdigest()[:16]
        found = self._find_campaign_run()
        if found is None:
            run = self.client.create_run(
                self.experiment_id,
                run_name=f"campaign {name} @{commit[:7]} p{phash}",
                tags={
                    "ratchet.kind": "campaign",
                    "ratchet.campaign_key": self.key,
                    "ratchet.params_hash": phash,
                    "ratchet.identity": self.ident,
                    "ratchet.campaign": name,
                    "ratchet.registered_model": self.model_name,
                    "ratchet.out": self.where,
                    "ratchet.git_commit": commit,
                    "ratchet.dvc_lock": dvc_lock_hash(),
                    # a queued `dvc exp run` (its stage runs in DVC's temporary copy): the experiment's name in `dvc exp show`
                    **(
                        {"ratchet.dvc_experiment": os.environ["DVC_EXP_NAME"]} if os.environ.get("DVC_EXP_NAME") else {}
                    ),
                    "mlflow.note.content": f"Campaign `{name}` at commit `{commit[:12]}`, identity `{self.ident}`, params "
                    f"hash `{phash}`, output `{self.where}`. Its rounds are the nested runs; its "
                    f"package versions are the registered model `{self.model_name}` (alias "
                    "`champion`).",
                },
            )
            found = run.info.run_id
            self._params(found, params)
        self.run_id: str = found

    def _identity_note(self) -> str:
        rows = "\n".join(f"| `{k}` | `{json.dumps(v, default=str)}` |" for k, v in sorted(self.identity.items()))
        return (
            f"Campaign `{self.name}`, identity `{self.ident}`: the runs of every campaign with exactly these "
            "settings and start/benchmark bytes. Another value of any of them (a `dvc exp run -S ...`, a `--set`) "
            "is another campaign, recorded in its own experiment and registered model. `campaign.rounds` is "
            "part of it because each round's gate spends `gate.campaign_alpha / campaign.rounds`.\n\n"
            "| setting | value |\n|---|---|\n" + rows
        )

    def _find_campaign_run(self) -> str | None:
        runs = self.client.search_runs(
            [self.experiment_id], f"tags.`ratchet.campaign_key` = '{self.key}'", max_results=1
        )
        return runs[0].info.run_id if runs else None

    def _round_runs(self) -> dict[int, Any]:
        runs = self.client.search_runs(
            [self.experiment_id],
            f"tags.mlflow.parentRunId = '{self.run_id}' and tags.`ratchet.kind` = 'round'",
            max_results=1000,
        )
        return {int(r.data.tags["ratchet.round"]): r for r in runs}

    def _params(self, run_id: str, params: dict) -> None:
        from mlflow.entities import Param

        items = [Param(k[:250], v[:6000]) for k, v in sorted(_flatten(params).items())]
        for i in range(0, len(items), 100):
            self.client.log_batch(run_id, params=items[i : i + 100])

    def _metrics(self, run_id: str, values: dict[str, Any], step: int = 0, model_id: str | None = None) -> None:
        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        ms = [
            Metric(k, float(v), ts, step, model_id=model_id) if model_id else Metric(k, float(v), ts, step)
            for k, v in sorted(values.items())
            if isinstance(v, (int, float)) and v is not None
        ]
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
            stale = self.client.search_traces(
                locations=[self.experiment_id], run_id=found.info.run_id, include_spans=False, max_results=1000
            )
            if stale:
                self.client.delete_traces(self.experiment_id, trace_ids=[t.info.trace_id for t in stale])
            self.client.delete_run(found.info.run_id)
        tags = {
            "mlflow.parentRunId": self.run_id,
            **round_tags(rec),
            "ratchet.round_dir": recorded_path(str(rd)),
            "ratchet.campaign_out": self.where,
        }
        run = self.client.create_run(self.experiment_id, run_name=round_title(rec), tags=tags)
        rid = run.info.run_id
        self._params(rid, round_params(rec, self.params))
        self._metrics(rid, round_metrics(rec))
        for name in (
            "plan.json",
            "diagnosis.json",
            "validation.json",
            "repair.json",
            "repair_items.csv",
            "gate.json",
            "gate_items.csv",
            "dev_base.csv",
            "dev_cand.csv",
            "findings.csv",
            "round.json",
        ):
            if (rd / name).exists():
                self.client.log_artifact(rid, str(rd / name))
        if (rd / "train" / "traces.parquet").exists():
            self.client.log_artifact(rid, str(rd / "train" / "traces.parquet"), "traces")
        evals = json.loads((rd / "evals.json").read_text()) if (rd / "evals.json").exists() else []
        self._evals(rid, evals, f"r{n} ")
        self._metrics(rid, {k: sum(ev["summary"].get(k, 0) for ev in evals) for k in ("tokens_in", "tokens_out")})
        cited = self.traces.log(rid, rd, n)
        if cited:
            self.client.set_tag(
                rid, "mlflow.note.content", describe_round(rec) + "\n\n" + self.traces.cited_links(rd, cited)
            )
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
            values.update(
                round_net=g.net,
                round_ci_lo=g.ci_lo,
                round_ci_hi=g.ci_hi,
                champion_dev_mean=champion_means(rounds).get(n),
            )
        self._metrics(self.run_id, values, step=n)

    def _lineage_records(self) -> list[StartRecord | RoundRecord]:
        return Lineage(self.out / "lineage").entries()

    def _evals(self, parent: str, evals: list[dict], prefix: str = "") -> None:
        for ev in evals:
            # a sequential gate evaluates each arm once per look: the look number tells the runs apart
            look = f" look {ev['look']}" if ev.get("look") is not None else ""
            reused = f" (= {ev['reused']})" if ev.get("reused") else ""
            run = self.client.create_run(
                self.experiment_id,
                run_name=f"{prefix}{ev['split']} {ev['arm']}{look}{reused}",
                tags={
                    "mlflow.parentRunId": parent,
                    "ratchet.kind": "evaluation",
                    "ratchet.arm": ev["arm"],
                    "ratchet.split": ev["split"],
                    "ratchet.look": str(ev.get("look", "")),
                    "ratchet.package_digest": ev["package_digest"],
                },
            )
            self._metrics(run.info.run_id, ev["summary"])
            self.client.set_terminated(run.info.run_id)

    # -- package versions as logged models / registered model versions ----------------------------------------------
    def log_versions(self) -> None:
        """Every committed version as a logged model and a version of the registered model `ratchet-<name>`, parent
        first, each tagged with its digest and its parent; the newest gets the alias `champion`."""
        from mlflow.exceptions import MlflowException

        name = self.model_name
        try:
            self.client.get_registered_model(name)
        except MlflowException:
            self.client.create_registered_model(
                name,
                tags={"ratchet.campaign": self.name},
                description=(
                    f"Memory-package versions of campaign `{self.name}`: M0 is the start, each later version a promotion. "
                    "The model stays frozen; what is versioned is the package. Alias `champion` is the current champion."
                ),
            )
        existing = {v.tags.get("ratchet.digest"): v for v in self.client.search_model_versions(f"name = '{name}'")}
        rounds = self._round_runs()
        by_version: dict[str, Any] = {}
        last = None
        for rec in self._lineage_records():
            if rec.verdict not in (Verdict.START, Verdict.ACCEPT):
                continue
            child = rec.committed
            if child.digest in existing:  # registered already (a rerun, a resume)
                by_version[child.version] = last = existing[child.digest]
                continue
            by_version[child.version] = last = self._log_version(rec, rounds.get(rec.round), by_version)
        if last is not None:
            self.client.set_registered_model_alias(name, "champion", last.version)

    def _log_version(self, rec: StartRecord | RoundRecord, round_run: Any, by_version: dict[str, Any]) -> Any:
        """One committed version as a logged model (its files, knobs and gate figures) and its registered version."""
        from mlflow.entities import LoggedModelStatus

        name, child, parent = self.model_name, rec.committed, rec.parent
        d = child.digest
        path = Lineage(self.out / "lineage").version_dir(child.version, f"round {rec.round}: child.version")
        src = round_run.info.run_id if round_run is not None else self.run_id
        parent_mv = by_version.get(parent.version if parent else "")
        tags = {
            "ratchet.version": child.version,
            "ratchet.digest": d,
            "ratchet.parent": parent.version if parent else "",
            "ratchet.parent_digest": parent.digest if parent else "",
            "ratchet.round": str(rec.round),
            "ratchet.campaign": self.name,
            "ratchet.parent_model_version": parent_mv.version if parent_mv is not None else "",
        }
        lm = self.client.create_logged_model(
            self.experiment_id,
            name=f"{self.name}-{child.version}",
            source_run_id=src,
            tags=tags,
            params=manifest_knobs(path),
            model_type="memory-package",
        )
        self.client.log_model_artifacts(lm.model_id, str(path))
        rr = rec if isinstance(rec, RoundRecord) else None
        if round_run is not None and rr is not None and rr.gate:
            self._model_metrics(lm.model_id, round_run.info.run_id)
        self.client.finalize_logged_model(lm.model_id, LoggedModelStatus.READY)
        # source: the logged model's files. A `models:/<id>` source makes MLflow's SQL registry look the model up
        # through the process's tracking URI (a TODO of theirs), which fails when the campaign's store is another
        mv = self.client.create_model_version(
            name,
            source=lm.artifact_location,
            run_id=src,
            tags={**tags, "ratchet.model_id": lm.model_id},
            description=self._version_description(rec, parent_mv, lm),
            model_id=lm.model_id,
        )
        # the logged model's page lists its registered version (the tag `mlflow.register_model` sets)
        self.client.set_logged_model_tags(
            lm.model_id, {"mlflow.modelVersions": json.dumps([{"name": name, "version": mv.version}])}
        )
        return mv

    def _version_description(self, rec: StartRecord | RoundRecord, parent_mv: Any, lm: Any) -> str:
        """A registered version's description: the round that promoted it (a link to its parent's version, to walk
        the lineage), or the start; and its logged model."""
        name, child, parent = self.model_name, rec.committed, rec.parent
        rr = rec if isinstance(rec, RoundRecord) else None
        g = rr.gate if rr is not None else None
        return (
            f"{child.version} (`{child.digest[:12]}`) of campaign `{self.name}`. "
            + (
                f"Promoted in round {rr.round} from {parent.version if parent else None} ([version "
                f"{parent_mv.version}]({ui_route(f'#/models/{name}/versions/{parent_mv.version}')}) of this model, a "
                "link to walk the lineage): "
                f"{rr.summary or ''}; dev net {g.net:+.3f}, {ci_text(rr)}."
                if rr is not None and rr.verdict == Verdict.ACCEPT and parent_mv is not None and g
                else "The campaign's starting package."
            )
            + f" Logged model: [{lm.name}]({ui_route(f'#/experiments/{self.experiment_id}/models/{lm.model_id}')})"
            " (its knobs, gate figures and files)."
        )

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
        out = {
            "campaign": f"{ui}/" + ui_route(run),
            # what a reader wants of the rounds first: the gate's net with its CI, and the champion's dev mean, by
            # round (the campaign run's stepped metrics); the compare view opens on a chart of other axes
            "net by round": f"{ui}/" + ui_route(f"{run}/model-metrics"),
        }
        if rounds:
            ids = json.dumps([r.info.run_id for r in rounds], separators=(",", ":"))
            out["rounds"] = f"{ui}/" + ui_route(f"#/compare-runs?runs={quote(ids)}&experiments={quote(exp)}")
        try:
            champ = self.client.get_model_version_by_alias(self.model_name, "champion")
            out["champion"] = f"{ui}/" + ui_route(f"#/models/{quote(self.model_name)}/versions/{champ.version}")
        except Exception:  # no version registered (a campaign stopped before certification)
            pass
        for r in rounds:
            traces = self.client.search_traces(
                locations=[self.experiment_id], run_id=r.info.run_id, include_spans=False, max_results=1
            )
            if traces:
                out["trace"] = f"{ui}/" + ui_route(
                    f"#/experiments/{self.experiment_id}/traces?selectedEvaluationId={traces[0].info.trace_id}"
                )
                break
        return out

    def _model_metrics(self, model_id: str, round_run_id: str) -> None:
        """The logged model's metrics: its round's gate figures, the very points the round run holds (same key,
        value, step and timestamp). MLflow records a model's metrics through a run's `log_batch`, and a point a run
        already has is not added again, so the round run's metrics stay as they were (no second point, no new key)."""
        from mlflow.entities import Metric

        points = [
            Metric(m.key, m.value, m.timestamp, m.step, model_id=model_id)
            for key in GATE_METRICS
            for m in self.client.get_metric_history(round_run_id, key)[-1:]
        ]
        if points:
            self.client.log_batch(round_run_id, metrics=points)

    def finish(
        self,
        summary: dict[str, Any],
        summary_path: str | Path,
        test_evals: Sequence[dict[str, Any]] = (),
        spent: dict[str, float] | None = None,
    ) -> None:
        run = self.client.get_run(self.run_id)
        if run.data.tags.get("ratchet.champion_digest") == summary["champion_digest"] and run.info.status == "FINISHED":
            return  # this campaign's result is recorded already (a rerun with the same bytes): add nothing twice
        if not self.client.search_runs(
            [self.experiment_id],
            f"tags.mlflow.parentRunId = '{self.run_id}' and tags.`ratchet.split` = 'test'",
            max_results=1,
        ):
            self._evals(self.run_id, list(test_evals))  # the test split is touched once, and shows once
        t, loc = summary["test"] or {}, summary["localization"]
        spent = spent or {}
        self._metrics(
            self.run_id,
            {
                "test_base_mean": t.get("base_mean"),
                "test_champion_mean": t.get("champion_mean"),
                "test_net": t.get("net"),
                "test_ci_lo": t.get("ci_lo"),
                "test_ci_hi": t.get("ci_hi"),
                "accepted": summary["accepted"],
                "rounds": summary["rounds"],
                "localization_accuracy": loc.get("accuracy"),
                "outcome_only_accuracy": loc.get("outcome_only_accuracy"),
                "dev_looks": (summary.get("dev_looks") or {}).get("n"),
                "dev_alpha_spent": (summary.get("dev_looks") or {}).get("alpha_spent"),
                **{f"budget_{k}": v for k, v in spent.items()},
            },
        )
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
    wheres = {
        str(((summary.get("params") or {}).get("campaign") or {}).get("out")),
        recorded_path(str(campaign_dir)),
        str(Path(campaign_dir).resolve()),
    }
    runs = [
        r
        for r in client.search_runs(
            [exp.experiment_id],
            "tags.`ratchet.kind` = 'campaign'",
            order_by=["attributes.start_time DESC"],
            max_results=1000,
        )
        if r.data.tags.get("ratchet.out") in wheres
    ]
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
    finished = [
        r
        for r in runs
        if r.info.status == "FINISHED" and r.data.tags.get("ratchet.champion_digest") == summary.get("champion_digest")
    ]
    if exp is None or not finished:
        raise InputError(
            f"{where}: -: no finished MLflow run of this campaign (experiment {names['experiment']}, "
            f"champion {str(summary.get('champion_digest'))[:12]}) in {client.tracking_uri}"
        )
    return {"summary": summary, "experiment": exp, "run": finished[0], "registered_model": names["registered_model"]}


def log_export(
    manifest: Any, export_dir: str | Path, summary: dict[str, Any], tracking_uri: str | None = None
) -> str | None:
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
                df, source=recorded_path(str(path)), name=ds_name, digest=f.sha256[:32]
            )
        inputs.append(
            DatasetInput(
                ds._to_mlflow_entity(),
                tags=[
                    InputTag("mlflow.data.context", "training"),
                    InputTag("ratchet.source", "campaign"),
                    InputTag("ratchet.champion", manifest.champion),
                    InputTag("ratchet.champion_digest", manifest.champion_digest),
                    InputTag("ratchet.split", manifest.split),
                    InputTag("ratchet.sha256", f.sha256),
                    InputTag("ratchet.records", str(f.records)),
                ],
            )
        )
    if inputs:
        client.log_inputs(run_id, datasets=inputs)
    return run_id
