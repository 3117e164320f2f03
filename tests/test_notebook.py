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
    monkeypatch.setenv("RATCHET_CAMPAIGN", s["campaign"])  # the kernel inherits the session's MLFLOW_TRACKING_URI
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
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
    table = next(o["data"]["text/html"] for c in nb.cells if c.cell_type == "code" and "rounds[[" in c.source
                 for o in c.outputs if o.output_type == "execute_result")
    assert "<th>plan</th>" in table and "<th>reason</th>" in table and "<th>ci_level</th>" in table
    assert table.count("<tr") == 1 + len(s["history"])  # the header, then every round
    assert " -> ".join(f"{v['version']} ({v['digest'][:12]})" for v in s["lineage"]) in text
