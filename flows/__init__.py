"""Prefect flows and the CLI: thin orchestration over components/."""

from components.env import quiet_offline

quiet_offline()  # before prefect or mlflow is imported, also in flow-run subprocesses started by `ratchet worker`
