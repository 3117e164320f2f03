"""Prefect flows and the CLI: thin orchestration over components/."""
