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
        return Path(os.environ["RATCHET_HOME"])
    return project_root(root) / ".ratchet"


def quiet_offline(home: Path | None = None) -> Path:
    """Set the offline/quiet environment; put Prefect's home, results and the MLflow store under `home`."""
    home = Path(home) if home else project_home()
    home.mkdir(parents=True, exist_ok=True)
    os.environ.update(ALWAYS)
    for key, value in DEFAULTS.items():
        os.environ.setdefault(key, value)
    os.environ.setdefault("RATCHET_HOME", str(home))
    os.environ.setdefault("PREFECT_HOME", str(home / "prefect"))
    os.environ.setdefault("PREFECT_LOCAL_STORAGE_PATH", str(home / "prefect" / "storage"))
    os.environ.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{home / 'mlflow.db'}")
    os.environ.setdefault("DVC_SITE_CACHE_DIR", str(home / "dvc-site-cache"))
    for name in ("great_expectations", "mlflow", "alembic", "distributed"):
        logging.getLogger(name).setLevel(logging.WARNING)
    return home
