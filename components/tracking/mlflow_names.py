"""What names a campaign's MLflow records: its identity (the settings and bytes that decide its results), the
experiment and registered model that identity names, the code and data it ran on, and the UI addresses a view opens
(components/tracking/mlflow_log.py has the overview)."""

from __future__ import annotations

import hashlib
import json
import subprocess
from enum import Enum
from pathlib import Path
from typing import Any

# MLflow 3.17's UI takes its mode ("GenAI apps & agents" or "Machine learning") from the address's `workflowType`,
# else from the browser's last choice (GenAI when there is none), and not from the experiment's `mlflow.experimentKind`
# tag (set as well: the experiment list and other clients read it). So every address Ratchet writes names the mode,
# and a round opens as a training run, its params and metrics first, without a switch to find.
UI_MODE = "workflowType=machine_learning"


def ui_route(route: str) -> str:
    """A UI route (`#/...`) opened in the "Machine learning" mode."""
    return f"{route}{'&' if '?' in route else '?'}{UI_MODE}"


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
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        return (sha + ("-dirty" if dirty else "")) if sha else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def dvc_lock_hash(cwd: str | Path = ".") -> str:
    lock = Path(cwd) / "dvc.lock"
    return hashlib.sha256(lock.read_bytes()).hexdigest()[:16] if lock.exists() else "none"


def params_hash(params: dict) -> str:
    return hashlib.sha256(json.dumps(params, sort_keys=True, default=str).encode()).hexdigest()[:8]


def campaign_identity(
    params: dict, start_digest: str, benchmark_digest: str, settings: dict | None = None
) -> dict[str, Any]:
    """What decides a campaign's results, so what names its MLflow records: the evolution params a rerun must keep
    (`Params.identity`), the declared rounds (each round's gate spends campaign_alpha / rounds: a 2-round campaign is
    not the first two rounds of a 10-round one), whether it reads the campaign memory, the bytes it starts from, and
    the world's settings outside the benchmark (`settings`: a user simulator's model; absent when there are none)."""
    from components.params import Params

    p = Params.model_validate(params)
    return {
        **p.identity(),
        "campaign.rounds": p.campaign.rounds,
        "evidence.memory": p.evidence.memory,
        "start_digest": start_digest,
        "benchmark_digest": benchmark_digest,
        **({"world.settings": settings} if settings else {}),
    }


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
    ih = identity_hash(
        campaign_identity(
            summary["params"], summary["start_digest"], summary["benchmark_digest"], summary.get("world_settings")
        )
    )
    return {
        "experiment": experiment_name(summary["campaign"], ih),
        "registered_model": registered_name(summary["campaign"], ih, summary["params"]["campaign"]["out"]),
        "identity": ih,
    }


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
