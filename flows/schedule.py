"""Scheduled campaigns: a Prefect deployment of the `campaign` flow per schedule, served by `ratchet worker`.

Why `serve` and not a work pool: a served deployment needs no pool, no worker type and no image; the long-running
`ratchet worker` process already has this repository and its environment, runs each scheduled campaign in a
subprocess, and is the same for one laptop or one VM. A work pool is the step up when campaigns must start on other
infrastructure (Kubernetes, Docker, a cloud batch service): deploy the same flow with `flow.deploy(work_pool_name=...)`.

Schedules fire only against a persistent Prefect server, whose scheduler service creates the runs: start one with
`ratchet server` (or point PREFECT_API_URL at a shared one). `ratchet campaign schedule` registers the deployment and
records it under $RATCHET_HOME/schedules/, which `ratchet worker` serves.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from components.env import project_home
from components.io import atomic_write_json
from components.params import Params

if TYPE_CHECKING:
    from uuid import UUID

FLOW = "campaign"


def schedules_dir() -> Path:
    return project_home() / "schedules"


def _deployment(name: str, cron: str | None, params: dict):
    from flows.campaign import campaign

    return campaign.to_deployment(
        name=name,
        cron=cron,
        parameters={"params": params, "name": params["campaign"]["name"]},
        description=f"Ratchet campaign {params['campaign']['name']} ({cron or 'on demand'})",
        tags=["ratchet"],
    )


def register(name: str, cron: str | None, p: Params) -> str:
    """Record the schedule and register (or update) its deployment on the Prefect server; returns the deployment id."""
    from flows.prefect_setup import tie_temporary_server_to_this_process

    tie_temporary_server_to_this_process()  # no server configured: registering starts a temporary one
    # every path resolved here, where the user named them: a scheduled run must not depend on the worker's directory
    params = p.resolved().model_dump()
    atomic_write_json(
        schedules_dir() / f"{name}.json", {"name": name, "cron": cron, "params": params, "cwd": os.getcwd()}
    )
    return str(_deployment(name, cron, params).apply())


def registered() -> list[dict]:
    from components.errors import InputError

    d = schedules_dir()
    out = []
    for f in sorted(d.glob("*.json")) if d.is_dir() else []:
        try:
            entry = json.loads(f.read_text(encoding="utf-8"))
            Params.model_validate(entry["params"])
            out.append(entry)
        except (ValueError, KeyError, TypeError) as e:  # one line, naming the file: not a traceback in the worker
            raise InputError(
                f"{f}: -: not a schedule Ratchet can serve ({type(e).__name__}: {str(e).splitlines()[0]})"
            ) from None
    return out


def serve_all(limit: int = 1) -> None:
    """Serve every registered campaign deployment until interrupted (runs one campaign at a time by default)."""
    from prefect import serve

    from flows.prefect_setup import tie_temporary_server_to_this_process

    tie_temporary_server_to_this_process()
    entries = registered()
    if not entries:
        from components.errors import InputError

        raise InputError(f"{schedules_dir()}: -: no scheduled campaign (use `ratchet campaign schedule` first)")
    serve(*[_deployment(e["name"], e["cron"], e["params"]) for e in entries], limit=limit, print_starting_message=True)


def list_runs(limit: int = 50) -> list[dict]:
    """Scheduled, running and past campaign runs, most recent first."""
    import asyncio

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName
    from prefect.client.schemas.sorting import FlowRunSort

    from flows.prefect_setup import tie_temporary_server_to_this_process

    tie_temporary_server_to_this_process()

    async def fetch() -> list[dict]:
        async with get_client() as client:
            runs = await client.read_flow_runs(
                flow_filter=FlowFilter(name=FlowFilterName(any_=[FLOW])),
                sort=FlowRunSort.EXPECTED_START_TIME_DESC,
                limit=limit,
            )
            names: dict[UUID | None, str] = {}
            for r in runs:
                if r.deployment_id and r.deployment_id not in names:
                    names[r.deployment_id] = (await client.read_deployment(r.deployment_id)).name
            return [
                {
                    "id": str(r.id),
                    "name": r.name,
                    "deployment": names.get(r.deployment_id, "-"),
                    "state": r.state.name if r.state else "-",
                    "expected_start": r.expected_start_time.isoformat(timespec="seconds")
                    if r.expected_start_time
                    else "-",
                    "start": r.start_time.isoformat(timespec="seconds") if r.start_time else "-",
                    "end": r.end_time.isoformat(timespec="seconds") if r.end_time else "-",
                }
                for r in runs
            ]

    return asyncio.run(fetch())
