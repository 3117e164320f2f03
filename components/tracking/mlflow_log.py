"""MLflow records for a campaign (SQLite store by default; the tracking URI is configurable).

    experiment  ratchet/<campaign name>
      run       campaign <name>                    params, final test figures, lineage tag + lineage.json, summary
        run     round <N>: <verdict> <plan>        tags (digests, git commit, dvc.lock hash, seed map hash, verdict),
                                                   gate/repair metrics, plan/diagnosis/validation/per-item artifacts
          run   eval <split> <arm>                 mean score, success rate, tokens, errors

Everything is logged from what a round left on disk (its round directory and lineage record), so a round can be
logged again after a crash. Runs are addressed by id through MlflowClient (no fluent, thread-local active run).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path
from typing import Any

from components.io import atomic_write_json

# MLflow run ids are random: they live under <out>/.state/ (excluded by .dvcignore), so the campaign's DVC-tracked
# output stays byte-identical for identical inputs while a resumed campaign still finds its runs.
IDS = ".state"
RUN_FILE = "campaign.json"


def _flatten(d: dict, prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(_flatten(v, key + "."))
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


class CampaignTracker:
    def __init__(self, name: str, out: str | Path, params: dict[str, Any], tracking_uri: str | None = None,
                 artifact_root: str | Path | None = None):
        from mlflow import MlflowClient

        self.out = Path(out)
        self.uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
        self.client = MlflowClient(tracking_uri=self.uri)
        exp_name = f"ratchet/{name}"
        exp = self.client.get_experiment_by_name(exp_name)
        if exp is None:
            root = Path(artifact_root or Path(os.environ.get("RATCHET_HOME", ".ratchet")) / "mlartifacts").resolve()
            self.experiment_id = self.client.create_experiment(exp_name, artifact_location=(root / name).as_uri())
        else:
            self.experiment_id = exp.experiment_id
        saved = self.out / IDS / RUN_FILE
        self.run_id = json.loads(saved.read_text())["run_id"] if saved.exists() else None
        if self.run_id is None:
            run = self.client.create_run(self.experiment_id, run_name=f"campaign {name}", tags={
                "ratchet.kind": "campaign", "ratchet.out": str(self.out.resolve()), "ratchet.git_commit": git_commit(),
                "ratchet.dvc_lock": dvc_lock_hash()})
            self.run_id = run.info.run_id
            atomic_write_json(saved, {"run_id": self.run_id, "experiment_id": self.experiment_id, "tracking_uri": self.uri})
            self._params(self.run_id, params)

    def _params(self, run_id: str, params: dict) -> None:
        from mlflow.entities import Param

        items = [Param(k[:250], v[:6000]) for k, v in sorted(_flatten(params).items())]
        for i in range(0, len(items), 100):
            self.client.log_batch(run_id, params=items[i:i + 100])

    def _metrics(self, run_id: str, values: dict[str, Any], step: int = 0) -> None:
        import time

        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        ms = [Metric(k, float(v), ts, step) for k, v in sorted(values.items()) if isinstance(v, (int, float)) and v is not None]
        if ms:
            self.client.log_batch(run_id, metrics=ms)

    def log_round(self, rec: dict[str, Any]) -> str:
        """One nested run for a finished round, with nested runs for its evaluations; returns its run id."""
        rd = self.out / rec["round_dir"]  # relative to the campaign (an absolute one from older records stays)
        logged = self.out / IDS / f"round-{int(rec['round']):02d}.json"
        if logged.exists():  # already logged before an interruption: do not log twice
            return json.loads(logged.read_text())["run_id"]
        g, rep = rec.get("gate") or {}, rec.get("repair") or {}
        parent = rec.get("parent") or {}
        child = rec.get("child") or {}
        title = f"round {rec['round']}: {rec['verdict']} {rec.get('summary') or rec.get('reason', '')}"[:240]
        tags = {
            "mlflow.parentRunId": self.run_id, "ratchet.kind": "round", "ratchet.round": str(rec["round"]),
            "ratchet.verdict": rec["verdict"], "ratchet.owner": str(rec.get("owner", "")),
            "ratchet.plan_key": str(rec.get("plan_key", "")), "ratchet.parent_digest": str(parent.get("digest", "")),
            "ratchet.parent_version": str(parent.get("version", "")),
            "ratchet.candidate_digest": str(rec.get("candidate_digest", "")),
            "ratchet.version": str(child.get("version", "")) if child else "",
            "ratchet.benchmark_digest": str(rec.get("benchmark_digest", "")),
            "ratchet.seed_map_hash": str(rec.get("seed_map_hash", "")), "ratchet.git_commit": git_commit(),
            "ratchet.dvc_lock": dvc_lock_hash(), "ratchet.round_dir": str(rd.resolve()),
            "ratchet.campaign_out": str(self.out.resolve()), "ratchet.reason": str(rec.get("reason", ""))[:4000],
        }
        run = self.client.create_run(self.experiment_id, run_name=title, tags=tags)
        rid = run.info.run_id
        self._metrics(rid, {"dev_base_mean": g.get("base_mean"), "dev_cand_mean": g.get("cand_mean"), "net": g.get("net"),
                            "ci_lo": g.get("ci_lo"), "ci_hi": g.get("ci_hi"), "n_improved": g.get("n_improved"),
                            "n_regressed": g.get("n_regressed"), "repair_repaired": rep.get("repaired"),
                            "repair_broken": rep.get("broken"),
                            "repair_delta": (rep["cand_mean"] - rep["base_mean"]) if rep else None,
                            "accepted": 1.0 if rec["verdict"] == "accept" else 0.0,
                            "dev_look": (rec.get("dev_look") or {}).get("look"),
                            "gate_alpha": (rec.get("dev_look") or {}).get("alpha")})
        for name in ("plan.json", "diagnosis.json", "validation.json", "repair.json", "repair_items.csv", "gate.json",
                     "gate_items.csv", "dev_base.csv", "dev_cand.csv", "findings.csv", "round.json"):
            if (rd / name).exists():
                self.client.log_artifact(rid, str(rd / name))
        if (rd / "train" / "traces.parquet").exists():
            self.client.log_artifact(rid, str(rd / "train" / "traces.parquet"), "traces")
        evals = json.loads((rd / "evals.json").read_text()) if (rd / "evals.json").exists() else []
        self._evals(rid, evals)
        self._metrics(rid, {k: sum(ev["summary"].get(k, 0) for ev in evals) for k in ("tokens_in", "tokens_out")})
        self._metrics(self.run_id, {"round_net": g.get("net", 0.0), "round_accepted": 1.0 if rec["verdict"] == "accept" else 0.0},
                      step=int(rec["round"]))
        self.client.set_terminated(rid)
        atomic_write_json(logged, {"run_id": rid})
        return rid

    def _evals(self, parent: str, evals: list[dict]) -> None:
        for ev in evals:
            run = self.client.create_run(self.experiment_id, run_name=f"eval {ev['split']} {ev['arm']}", tags={
                "mlflow.parentRunId": parent, "ratchet.kind": "evaluation", "ratchet.arm": ev["arm"],
                "ratchet.split": ev["split"], "ratchet.package_digest": ev["package_digest"]})
            self._metrics(run.info.run_id, ev["summary"])
            self.client.set_terminated(run.info.run_id)

    def finish(self, summary: dict[str, Any], summary_path: str | Path, test_evals: list[dict] = (),
               spent: dict[str, float] | None = None) -> None:
        self._evals(self.run_id, list(test_evals))
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
        self.client.set_tag(self.run_id, "ratchet.lineage", lineage)
        self.client.set_tag(self.run_id, "ratchet.champion", summary["champion"])
        self.client.set_tag(self.run_id, "ratchet.champion_digest", summary["champion_digest"])
        self.client.log_artifact(self.run_id, str(summary_path))
        lineage_file = self.out / "lineage" / "lineage.jsonl"
        if lineage_file.exists():
            self.client.log_artifact(self.run_id, str(lineage_file))
        self.client.set_terminated(self.run_id)
