"""The outer round (the source's outer recursion: the model learns under the improved harness, then the harness adapts
to the model that learned). It reads like the loop:

    export (train episodes of the finished campaign) -> train (the user's command) -> register the trained model
           -> prune (cards the trained model no longer needs, gated on dev: `components.outer.prune`)
           -> inner campaign from the (pruned) champion, with the trained model

The logic is in `components.outer`; `train` runs any command (`{export}` and `{out}` replaced by the export directory
and the model.json it must write; `ratchet outer learn-sim` offline, a TRL script on a GPU) and reads the
`ModelSpec` it wrote. The inner campaign is the ordinary `campaign` flow, as a subflow, with `campaign.start` the
champion's committed version and `campaign.model`/`model_cfg` the trained model's.

    <out>/export/        the export (manifest.json pins every file)
    <out>/model.json     what the training command wrote
    <out>/models/<name>.json   the registered identity (refused if another spec already holds the name)
    <out>/prune/         candidates without one card each, and prune.json (every decision with both intervals)
    <out>/inner/         the inner campaign (an ordinary campaign directory: report, reproduce, export work on it)
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from prefect import flow, task

from components.errors import ExternalFailure, InputError
from components.io import atomic_write_json, claim_output, confined, mark_output, read_json_object
from components.outer.export import ExportManifest, export_campaign
from components.outer.model import ModelSpec, read_model
from components.params import Params

DEFAULT_TRAIN = f"{shlex.quote(sys.executable)} -m flows.cli outer learn-sim --export {{export}} --out {{out}}"


@task(name="export")
def export_stage(campaign: str, bench: str, out: str, tracking_uri: str | None) -> ExportManifest:
    from components.tracking.mlflow_log import log_export

    m = export_campaign(campaign, bench, out)
    log_export(m, out, read_json_object(Path(campaign) / "summary.json"), tracking_uri)
    return m


def train_argv(command: str) -> list[str]:
    """The training command as argv, or one line saying why it is none (checked before anything runs)."""
    try:
        argv = shlex.split(command)
    except ValueError as e:
        raise InputError(f"--train: {command[:120]!r}: not a command line ({e})") from None
    if not argv:
        raise InputError(
            "--train: empty command (leave --train out for the offline learner, `ratchet outer learn-sim`)"
        )
    return argv


@task(name="train")
def train_stage(command: str, export_dir: str, model_out: str) -> ModelSpec:
    """Run the user's training command; it reads the export and writes model.json (a `ModelSpec`)."""
    argv = [a.replace("{export}", export_dir).replace("{out}", model_out) for a in train_argv(command)]
    Path(model_out).unlink(missing_ok=True)  # what is read afterwards is what this run wrote
    try:
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
    except OSError as e:  # not found, not executable
        raise ExternalFailure(f"--train: {argv[0]}: the training command could not start ({e.strerror or e})") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise ExternalFailure(f"--train: {argv[0]}: the training command exited {done.returncode}: {last[:300]}")
    if not Path(model_out).is_file():
        raise InputError(f"{model_out}: -: the training command wrote no model.json ({command})")
    spec = read_model(model_out)
    confined(Path(model_out).parent / "models", f"{spec.name}.json", f"{model_out}: name")  # registered there
    return spec


@task(name="register")
def register_stage(spec: ModelSpec, out: str, campaign: str, tracking_uri: str | None) -> str:
    """The trained model's identity, kept under <out>/models/ and tagged on the campaign's MLflow run."""
    from mlflow import MlflowClient

    from components.tracking.mlflow_log import campaign_run

    path = confined(Path(out) / "models", f"{spec.name}.json", f"{Path(out) / 'model.json'}: name")
    if path.is_file() and read_model(path) != spec:
        raise InputError(f"{path}: name: {spec.name} is registered already with another spec")
    atomic_write_json(path, spec.model_dump())
    client = MlflowClient(tracking_uri=tracking_uri)
    run_id = campaign_run(client, read_json_object(Path(campaign) / "summary.json"), campaign)
    if run_id is not None:
        client.set_tag(run_id, "ratchet.trained_model", spec.name)
        client.log_dict(run_id, spec.model_dump(), f"outer/{spec.name}.json")
    return spec.name


@task(name="prune")
def prune_stage(p: Params, package: str, spec: ModelSpec, work: str) -> dict:
    """Remove the cards the trained model no longer needs (`components.outer.prune`), gated on dev."""
    from components.outer.prune import prune
    from components.runtime.evaluate import benchmark_at, run_shard

    bench = benchmark_at(p.benchmark.out)
    items, seeds = bench.ids("dev"), list(range(p.campaign.seeds))

    def evaluate(pkg: Path, _label: str):
        return run_shard(pkg, bench, items, seeds, spec.model, spec.campaign_cfg(), p.campaign.max_turns).scores

    r = prune(Path(package), Path(work), evaluate, p.gate.config())
    atomic_write_json(
        Path(work) / "prune.json", {"package": str(r.package), "removed": r.removed, "decisions": r.decisions}
    )
    return {"package": str(r.package), "removed": r.removed, "decisions": r.decisions}


def inner_params(p: Params, champion: Path, spec: ModelSpec, out: Path) -> Params:
    """The next inner campaign: the same evolution settings, from the champion, with the trained model."""
    c = p.campaign.model_copy(
        update={
            "name": f"{p.campaign.name}-{spec.name}",
            "start": str(champion.resolve()),
            "out": str(out / "inner"),
            "model": spec.model,
            "model_cfg": spec.campaign_cfg(),
        }
    )
    return Params.model_validate({**p.model_dump(), "campaign": c.model_dump()})


@flow(name="outer-round", validate_parameters=False)
def outer_round(params: dict, campaign: str, out: str, train_command: str, adapt: bool = True) -> dict:
    from components.evolution.lineage import Lineage
    from flows.campaign import campaign as campaign_flow
    from flows.campaign import prepare

    p = Params.model_validate(params)
    outd = Path(out)
    mark_output(outd, "outer")  # Ratchet's own from here: a rerun may replace it, nothing else is written over
    manifest = export_stage(campaign, p.benchmark.out, str(outd / "export"), p.campaign.tracking_uri)
    spec = train_stage(train_command, str(outd / "export"), str(outd / "model.json"))
    register_stage(spec, out, campaign, p.campaign.tracking_uri)
    champion = Lineage(Path(campaign) / "lineage").champion()
    pruned: dict[str, Any] = (
        prune_stage(p, str(champion.path), spec, str(outd / "prune"))
        if adapt
        else {"package": str(champion.path), "removed": [], "decisions": []}
    )
    inner = inner_params(p, Path(pruned["package"]), spec, outd)
    prepare(inner)
    summary = campaign_flow(inner.model_dump(), name=inner.campaign.name)
    return {
        "export": {k: v.model_dump() for k, v in manifest.files.items()},
        "model": spec.name,
        "learned": spec.model_cfg.get("learned", []),
        "champion_before": champion.name,
        "removed": pruned["removed"],
        "inner": {k: summary.get(k) for k in ("campaign", "rounds", "accepted", "champion", "test")},
    }


def run_outer(p: Params, campaign: Path, out: Path, train: str | None, adapt: bool = True) -> dict:
    from flows.prefect_setup import tie_temporary_server_to_this_process

    if not (campaign / "summary.json").is_file():
        raise InputError(f"{campaign / 'summary.json'}: -: no such file (run the campaign first)")
    if train is not None:
        train_argv(train)  # `--train ""` is no command, not the offline learner
    # new, empty or an earlier outer round's: a user's directory (or a file) is refused before anything runs
    claim_output(out, "outer", inputs={"campaign": campaign, "benchmark": p.benchmark.out})
    summary = read_json_object(campaign / "summary.json")
    ran = Params.model_validate(summary.get("params") or {})
    if ran.benchmark.out != p.benchmark.out or ran.campaign.model != p.campaign.model:
        raise InputError(
            f"{campaign / 'summary.json'}: params: the campaign ran benchmark {ran.benchmark.out} with "
            f"model {ran.campaign.model}; --params names {p.benchmark.out} / {p.campaign.model}"
        )
    from prefect.settings import get_current_settings

    from flows.signals import server_watched

    tie_temporary_server_to_this_process()
    with server_watched(get_current_settings().api.url):  # a persistent server that dies: one line, resumable
        return outer_round(
            ran.model_copy(
                update={"campaign": ran.campaign.model_copy(update={"rounds": p.campaign.rounds})}
            ).model_dump(),
            str(campaign),
            str(out),
            DEFAULT_TRAIN if train is None else train,
            adapt,
        )
