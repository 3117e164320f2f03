"""notebooks/campaign.ipynb runs top to bottom against the session's small campaign, reading it from MLflow only."""

from __future__ import annotations

from tests.conftest import ROOT

NOTEBOOK = ROOT / "notebooks" / "campaign.ipynb"


def test_campaign_notebook_executes_against_a_campaign(small_campaign, monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(not c.outputs and c.execution_count is None for c in code), "commit the notebook stripped"
    s = small_campaign.summary
    # the kernel inherits the session's MLFLOW_TRACKING_URI; the campaign is named by its directory (its identity)
    monkeypatch.setenv("RATCHET_CAMPAIGN_DIR", str(small_campaign.out))
    decoy = _a_later_finished_campaign_of_the_same_name(s["campaign"])
    try:
        NotebookClient(
            nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOK.parent)}}
        ).execute()
    finally:
        from mlflow import MlflowClient

        MlflowClient().delete_experiment(decoy)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) >= 5  # net and CI, champion, causes, families, the paired scatter
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert f"champion: {s['champion']} =" in text
    # no artifact-download progress bars (MLflow draws one per download, on stderr)
    assert not [o for o in outputs if o.output_type == "stream" and o.get("name") == "stderr"], text
    # the CI level of every gated round is stated, and the rounds table holds every round with its plan and reason
    from components.evolution.report import ci_level

    for r in s["history"]:
        if r.get("gate"):
            assert f"round {r['round']}: {100 * ci_level(r):.4g}%" in text
    table = next(
        o["data"]["text/html"]
        for c in nb.cells
        if c.cell_type == "code" and "rounds[[" in c.source
        for o in c.outputs
        if o.output_type == "execute_result"
    )
    assert "<th>plan</th>" in table and "<th>reason</th>" in table and "<th>ci_level</th>" in table
    assert table.count("<tr") == 1 + len(s["history"])  # the header, then every round
    assert " -> ".join(f"{v['version']} ({v['digest'][:12]})" for v in s["lineage"]) in text


def _a_later_finished_campaign_of_the_same_name(name: str) -> str:
    """What a `dvc exp run` leaves: a campaign of the same name and another identity, finished after the one in the
    workspace. The notebook picked "the latest finished run named default": it showed this one."""
    from mlflow import MlflowClient

    client = MlflowClient()
    import uuid

    eid = client.create_experiment(f"ratchet/{name}/decoy-{uuid.uuid4().hex[:8]}", tags={"ratchet.campaign": name})
    run = client.create_run(
        eid, tags={"ratchet.kind": "campaign", "ratchet.campaign": name, "ratchet.registered_model": "no-such-model"}
    )
    client.log_param(run.info.run_id, "campaign.rounds", "3")
    client.set_terminated(run.info.run_id)
    return eid


def test_screenshots_find_the_campaign_by_its_directory_not_its_name(small_campaign):
    """scripts/screenshots.py shot "the latest finished run named default": after a `dvc exp run`, the experiment."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("screenshots", ROOT / "scripts" / "screenshots.py")
    shots = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(shots)
    from mlflow import MlflowClient

    decoy = _a_later_finished_campaign_of_the_same_name(small_campaign.summary["campaign"])
    try:
        rec = shots.records(MlflowClient().tracking_uri, small_campaign.out)
    finally:
        MlflowClient().delete_experiment(decoy)
    ml = small_campaign.summary["mlflow"]
    assert rec["run"] == ml["run_id"] and rec["eid"] == ml["experiment_id"] and rec["model"] == ml["registered_model"]
