"""A variant of a campaign records into its own MLflow experiment and registered model, and no sequence of runs and
checkouts attaches one campaign's rounds to another's run.

The experiment-and-undo sequence of docs/records.md (`dvc exp run -S campaign.rounds=2`, then `git checkout . && dvc
checkout`, then `./run.sh`), replayed through the CLI with `--set` on a copy of the shared small campaign. DVC's part
in it is done to the files as DVC does it: the experiment's stage run deletes the whole output first; the checkout
replaces the tracked files and leaves `<out>/.state/` (which .dvcignore excludes) as the experiment left it. A real
`dvc exp run` would add a campaign's worth of DVC and Prefect overhead and prove nothing more about the records
(tests/test_dvc_pipeline.py runs one)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import yaml
from mlflow import MlflowClient

from tests.conftest import run_cli as cli


def _tracked(out: Path) -> set[str]:
    return {p.name for p in out.iterdir() if p.name != ".state"}


def _checkout(out: Path, source: Path) -> None:
    """What `dvc checkout` does to a directory output: its tracked files replaced by `source`'s; what .dvcignore
    excludes (`.state/`, written by whichever campaign ran there last) left as it is."""
    for name in _tracked(out):
        (shutil.rmtree if (out / name).is_dir() else Path.unlink)(out / name)
    for p in source.iterdir():
        (shutil.copytree if p.is_dir() else shutil.copy2)(p, out / p.name)


def _records(client: MlflowClient, experiment: str, model: str) -> dict:
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id], max_results=5000)
    return {
        "runs": sorted(
            (r.info.run_id, r.info.run_name, r.info.status, r.data.tags.get("mlflow.parentRunId", "")) for r in runs
        ),
        "versions": sorted(
            (v.version, v.tags["ratchet.digest"]) for v in client.search_model_versions(f"name = '{model}'")
        ),
        "champion": client.get_model_version_by_alias(model, "champion").version,
    }


def test_an_experiment_and_its_undo_leave_the_default_campaigns_records_alone(small_campaign, tmp_path, capsys):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = tmp_path / "runs" / "campaign"
    params = small_campaign.params.model_dump(mode="json")
    params["campaign"].update(out=str(out), tracking_uri=store, traces_per_round=0)
    params["evidence"]["db"] = str(tmp_path / "evidence.db")
    pfile = tmp_path / "params.yaml"
    pfile.write_text(yaml.safe_dump(params))
    out.parent.mkdir()
    shutil.copytree(small_campaign.out, out, ignore=shutil.ignore_patterns(".state"))  # the default, checked out
    kept = tmp_path / "default-tracked"
    shutil.copytree(small_campaign.out, kept, ignore=shutil.ignore_patterns(".state"))
    client = MlflowClient(store)

    # ./run.sh: the default campaign (every round already in its lineage) records itself
    code, stdout, err = cli(capsys, "campaign", "run", "--params", str(pfile))
    assert code == 0, err
    default = json.loads((out / "summary.json").read_text())
    from components.tracking.mlflow_log import tracking_names

    names = tracking_names(default)
    before = _records(client, names["experiment"], names["registered_model"])
    assert [v for _, v in before["versions"]] == [v["digest"] for v in default["lineage"]]
    assert f"registered model {names['registered_model']}" in stdout and "/#/compare-runs?runs=" in stdout

    # dvc exp run -S campaign.rounds=1: DVC deletes the stage's output (the whole directory) and runs the stage
    shutil.rmtree(out)
    code, stdout, err = cli(capsys, "campaign", "run", "--params", str(pfile), "--set", "campaign.rounds=1")
    assert code == 0, err
    variant = json.loads((out / "summary.json").read_text())
    vnames = tracking_names(variant)
    assert vnames["experiment"] != names["experiment"] and vnames["registered_model"] != names["registered_model"]
    experiment = _records(client, vnames["experiment"], vnames["registered_model"])

    # git checkout . && dvc checkout: the default's tracked files back, the experiment's .state/ still there; ./run.sh
    assert (out / ".state").is_dir()  # the experiment's, as DVC leaves it
    _checkout(out, kept)
    code, stdout, err = cli(capsys, "campaign", "run", "--params", str(pfile))
    assert code == 0, err
    # nothing of the experiment is this process's: every round was recorded, every evaluation came from the cache
    spent = next(line for line in stdout.splitlines() if line.startswith("budget spent by this process"))
    assert all(float(x.split()[-1].replace(",", "")) == 0 for x in spent.split(": ", 1)[1].split(", ")), spent

    # the default campaign's records are as they were (runs, versions, alias) ...
    assert _records(client, names["experiment"], names["registered_model"]) == before
    # ... and the experiment's are complete and its own: one campaign run, with its one round, in its own experiment
    assert _records(client, vnames["experiment"], vnames["registered_model"]) == experiment
    exp_id = client.get_experiment_by_name(vnames["experiment"]).experiment_id
    tops = client.search_runs([exp_id], "tags.`ratchet.kind` = 'campaign'")
    assert len(tops) == 1 and tops[0].data.params["campaign.rounds"] == "1"
    rounds = client.search_runs(
        [exp_id], f"tags.mlflow.parentRunId = '{tops[0].info.run_id}' and tags.`ratchet.kind` = 'round'"
    )
    assert sorted(r.data.tags["ratchet.round"] for r in rounds) == ["1"]
    assert [v for _, v in experiment["versions"]] == [v["digest"] for v in variant["lineage"]]
    # and the default's campaign runs hold only the default's rounds
    dexp = client.get_experiment_by_name(names["experiment"]).experiment_id
    for top in client.search_runs([dexp], "tags.`ratchet.kind` = 'campaign'"):
        assert top.data.params["campaign.rounds"] == str(default["params"]["campaign"]["rounds"])
        got = client.search_runs(
            [dexp], f"tags.mlflow.parentRunId = '{top.info.run_id}' and tags.`ratchet.kind` = 'round'"
        )
        assert sorted(int(r.data.tags["ratchet.round"]) for r in got) == [r["round"] for r in default["history"]]
