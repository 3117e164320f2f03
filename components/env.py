"""The quiet, offline environment: the one place that sets it.

Every entry point (CLI, tests, benchmarks, the DVC stages) calls `quiet_offline()` before Prefect, MLflow, DVC or
great-expectations are imported, so nothing phones home and every store lives where the project says.
Values already set by the user win (setdefault), except the telemetry switches, which are always off.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

ALWAYS = {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_CLOUD_ENABLE_ORCHESTRATION_TELEMETRY": "false",
    "DO_NOT_TRACK": "1",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DVC_NO_ANALYTICS": "1",
    "GX_ANALYTICS_ENABLED": "false",
    "HF_HUB_OFFLINE": "1",
}

DEFAULTS = {
    "PREFECT_LOGGING_LEVEL": "WARNING",
    # flow and task runs log at INFO to the API (their pages in the dashboard show what ran), while the console
    # keeps only warnings: the CLI prints its own one line per round
    "PREFECT_LOGGING_TO_API_ENABLED": "true",
    "PREFECT_LOGGING_LOGGERS_PREFECT_FLOW_RUNS_LEVEL": "INFO",
    "PREFECT_LOGGING_LOGGERS_PREFECT_TASK_RUNS_LEVEL": "INFO",
    "PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL": "WARNING",
    "PREFECT_UI_ENABLED": "false",
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
    "PREFECT_RESULTS_PERSIST_BY_DEFAULT": "true",
    "PREFECT_TASKS_REFRESH_CACHE": "false",
    "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
    "GIT_PYTHON_REFRESH": "quiet",
    "TQDM_DISABLE": "1",
    "MLFLOW_LOGGING_LEVEL": "WARNING",
}


def project_root(root: Path | None = None) -> Path:
    """The project whose record stores a process uses: `root`, else the repository DVC runs a stage for ($DVC_ROOT),
    else the working directory. DVC sets $DVC_ROOT for every stage command; for a queued experiment (`dvc exp run
    --queue`, then `dvc queue start`) the stage runs in a temporary copy under .dvc/tmp/exps/ and $DVC_ROOT still
    names the real repository, so a queued variant's records (MLflow runs, registered model, evidence, flow runs)
    land in the repository's stores, under the variant's own identity, and are not deleted with DVC's copy."""
    if root is not None:
        return Path(root)
    dvc_root = os.environ.get("DVC_ROOT")
    return Path(dvc_root) if dvc_root else Path.cwd()


def project_home(root: Path | None = None) -> Path:
    """Where local stores live: $RATCHET_HOME, else <project>/.ratchet (`project_root`)."""
    if os.environ.get("RATCHET_HOME"):
        return Path(os.environ["RATCHET_HOME"]).absolute()  # every store a task is given is an absolute path
    return project_root(root).absolute() / ".ratchet"


def default_db(db: str | None) -> str:
    """The evidence graph: `evidence.db`, else $RATCHET_EVIDENCE_DB, else next to the MLflow store:
    $RATCHET_HOME/evidence.db (`.ratchet/evidence.db`)."""
    return db or os.environ.get("RATCHET_EVIDENCE_DB") or str(project_home() / "evidence.db")


SERVER_NOTE = "prefect-server.json"  # under $RATCHET_HOME: the server `ratchet server` runs ({url, pid})
UI_NOTE = "mlflow-ui.json"  # under $RATCHET_HOME: the MLflow UI `ratchet ui` runs ({url, pid})
UI_DEFAULT = "http://127.0.0.1:5000"  # where `ratchet ui` serves without --port


def running_server(home: Path, note_name: str = SERVER_NOTE) -> str | None:
    """The API URL of the Prefect server `ratchet server` runs for this home (with `UI_NOTE`: the address of the
    MLflow UI `ratchet ui` runs), while its process lives and its port answers (else None: a stale note, whose
    server is gone, is no server)."""
    import json

    try:
        note = json.loads((home / note_name).read_text(encoding="utf-8"))
        os.kill(int(note["pid"]), 0)
        url = str(note["url"])
    except (OSError, ValueError, KeyError, TypeError):  # none, unreadable, or its process is gone
        return None
    return url if answers(url) else None


def answers(url: str, timeout: float = 1.0) -> bool:
    """Whether something accepts a TCP connection at the URL's host and port (a loopback refusal is immediate)."""
    import socket
    from urllib.parse import urlsplit

    try:
        u = urlsplit(url)
        with socket.create_connection((u.hostname or "127.0.0.1", u.port or 80), timeout=timeout):
            return True
    except (OSError, ValueError):
        return False


def quiet_offline(home: Path | None = None) -> Path:
    """Set the offline/quiet environment; put Prefect's home, results and the MLflow store under `home`."""
    home = Path(home).absolute() if home else project_home()
    home.mkdir(parents=True, exist_ok=True)
    os.environ.update(ALWAYS)
    for key, value in DEFAULTS.items():
        os.environ.setdefault(key, value)
    os.environ.setdefault("RATCHET_HOME", str(home))
    os.environ.setdefault("PREFECT_HOME", str(home / "prefect"))
    os.environ.setdefault("PREFECT_LOCAL_STORAGE_PATH", str(home / "prefect" / "storage"))
    os.environ.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{home / 'mlflow.db'}")
    os.environ.setdefault("DVC_SITE_CACHE_DIR", str(home / "dvc-site-cache"))
    if not os.environ.get("PREFECT_API_URL") and (url := running_server(home)):
        os.environ["PREFECT_API_URL"] = url  # `ratchet server` runs: every command uses it, none starts its own
    if os.environ.get("PREFECT_API_URL"):
        # a server shared by campaigns answers 503 when its SQLite database is busy (a write that lost the race):
        # the client retries after 2, 4, ... s. Prefect's 5 retries (~1 min) ran out with 4 campaigns at load 38 on
        # 2 cores; 8 wait up to ~8.5 min. Not for a temporary server: a process that outlives it would wait as long
        os.environ.setdefault("PREFECT_CLIENT_MAX_RETRIES", "8")
    for name in ("great_expectations", "mlflow", "alembic", "distributed"):
        logging.getLogger(name).setLevel(logging.WARNING)
    return home
