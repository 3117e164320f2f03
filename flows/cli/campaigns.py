"""`ratchet campaign`, `report`, `export`, `reproduce`, `outer`, and the services `ui`, `server` and `worker`."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

# The usage errors typer raises are its vendored click's (typer 0.26+), not the `click` package's. Typer 0.29 gives
# public names to BadParameter, Abort and Exit only: UsageError, MissingParameter and NoArgsIsHelpError have none
# (asked for in fastapi/typer#1867, closed), so they are read from the vendored module, here alone.
from components.errors import InputError

# the gate command's defaults are GateConfig's (this import is light: numpy and pandas load on first use)
from flows.cli.app import app, campaign_app, check_port, out, outer_app, say

# -- campaigns ---------------------------------------------------------------------------------------------------

PARAMS_HELP = "parameter file (default: ./params.yaml if present, else the built-in defaults)"


def _params(params: Optional[Path], rounds: Optional[int], out_dir: Optional[Path], extra: Optional[list[str]] = None):
    from components.params import parse_set
    from flows.api import campaign_params

    return campaign_params(params, rounds=rounds, out=out_dir, overrides=parse_set(extra or []))


def _print_summary(summary: dict, path: Path) -> None:
    from components.evolution.localization import localization_notes

    out.print(_rounds_table(summary))
    lines = [
        f"champion {summary['champion']} ({summary['champion_digest'][:12]}), {summary['accepted']} "
        f"promotion(s) in {summary['rounds']} round(s)"
    ]
    if summary.get("stopped"):
        lines.append(f"stopped early: {summary['stopped']}")
    lines += _test_lines(summary["test"]) + _cost_lines(summary) + _localization_lines(summary["localization"])
    lines += localization_notes(summary["localization"])
    lines.append(f"summary: {path}")
    for line in lines:
        out.print(line, highlight=False)
    _print_mlflow(summary.get("mlflow") or {})


def _rounds_table(summary: dict) -> Table:
    from components.evolution.report import round_rows

    table = Table(title=f"campaign {summary['campaign']}", show_lines=False)
    for col in (
        "round",
        "owner",
        "plan",
        "repair fixed/broke",
        "verdict",
        "dev net [CI], or why not gated",
        "regr",
        "champion",
    ):
        table.add_column(col, overflow="fold")
    for r in round_rows(summary):
        ci = (
            f"{r['net']:+.3f} [{r['ci'][0]:+.3f}, {r['ci'][1]:+.3f}] {r['level']}"
            if r["net"] is not None
            else r["not_gated"]
        )
        table.add_row(
            str(r["round"]),
            r["owner"],
            r["plan"],
            r["repair"],
            r["verdict"],
            ci,
            "-" if r["regressed"] is None else str(r["regressed"]),
            r["champion"],
        )
    return table


def _test_lines(t: dict | None) -> list[str]:
    """The certification on test and the smallest effect it could have shown."""
    if not t:
        return []
    lines = [
        f"test (touched once): start {t['base_mean']:.3f} -> champion {t['champion_mean']:.3f}, "
        f"net {t['net']:+.3f}, 95% CI [{t['ci_lo']:+.3f}, {t['ci_hi']:+.3f}] over {t['n_items']} items"
    ]
    if "mde" in t and t["mde"] is None:
        lines.append(
            "minimum detectable effect on test: not sized (the arms' paired scores do not vary: the "
            "champion is the start package); `ratchet power --sd-trial ...` sizes it"
        )
    elif t.get("mde") is not None:
        lines.append(
            f"minimum detectable effect on test: {t['mde']:+.3f} ({t['n_items']} items x {t['mde_trials']} "
            f"trial(s), SDs item {t['mde_sd_item']:.3f}, trial {t['mde_sd_trial']:.3f}; 80% power; "
            "`ratchet power` for other sizes)"
        )
    return lines


def _cost_lines(summary: dict) -> list[str]:
    """Tokens per episode beside the built-in packages (the cost objective), the budget this process spent, and the
    episodes that errored."""
    lines = []
    if summary.get("tokens"):
        from components.evolution.report import TokensSummary, tokens_line

        lines.append(tokens_line(TokensSummary.model_validate(summary["tokens"])))
    spent = summary.get("budget_spent") or {}
    if spent:
        lines.append(
            "budget spent by this process: "
            + ", ".join(f"{k} {v:,.0f}" if k != "money" else f"money {v:.2f}" for k, v in sorted(spent.items()))
        )
    errors = (summary.get("episodes") or {}).get("errors")
    if errors:
        kinds = ", ".join(f"{k} {n}" for k, n in (summary["episodes"].get("by_kind") or {}).items())
        lines.append(
            f"errored episodes: {errors} of {summary['episodes']['total']}{f' ({kinds})' if kinds else ''} "
            "(model faults; never a success)"
        )
    return lines


def _localization_lines(loc: dict) -> list[str]:
    if loc.get("accuracy") is None:
        return []
    comp = loc.get("compound") or {}
    rule = loc.get("trace_rule_accuracy")
    return [
        f"diagnosis localization {loc['accuracy']:.1%} vs trace rule "
        f"{'-' if rule is None else f'{rule:.1%}'}, outcome-only {loc['outcome_only_accuracy']:.1%} "
        f"(n={loc['n']} incl. compound {comp.get('n', 0)}, coverage {loc.get('coverage') or 0:.1%}, "
        "counterfactual causes)"
    ]


def _print_mlflow(ml: dict) -> None:
    """Where to look next, in the MLflow UI (the tracking server's, else `ratchet ui`'s)."""
    if not ml.get("links"):
        return
    from components.tracking.mlflow_log import ui_address

    base, how = ui_address(ml.get("tracking_uri"))
    out.print(
        f"MLflow ({how}): experiment {ml['experiment']}, registered model {ml['registered_model']}", highlight=False
    )
    for what, url in ml["links"].items():  # the route as recorded, on the UI's address of this moment
        route = url.split("/#/", 1)[1] if "/#/" in url else None
        out.print(
            f"  {what}: {base}/#/{route}" if route is not None else f"  {what}: {url}", highlight=False, soft_wrap=True
        )


@campaign_app.command("run")
def campaign_run(
    params: Annotated[Optional[Path], typer.Option(help=PARAMS_HELP)] = None,
    rounds: Annotated[Optional[int], typer.Option(help="override campaign.rounds")] = None,
    out_dir: Annotated[Optional[Path], typer.Option("--out", help="override campaign.out")] = None,
    set_: Annotated[
        Optional[list[str]], typer.Option("--set", metavar="<key.path=value>", help="override any param (repeatable)")
    ] = None,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="delete Ratchet's own output at --out if it is another "
            "campaign (or another kind of output) and start over",
        ),
    ] = False,
) -> None:
    """Run an evolution campaign (the default: 10 rounds from data/packages/seed on the retail world, offline).
    Rerunning the same command resumes an interrupted campaign; a rerun may change only campaign.rounds, budget.*
    and where things run (docs/operations.md, "Reruns"), else it is refused naming the field."""
    from flows.api import CampaignRequest, campaign

    r = campaign(CampaignRequest(params=_params(params, rounds, out_dir, set_), force=force), say=say)
    _print_summary(r.summary, r.path)


@app.command("report")
def report(
    campaign: Annotated[Path, typer.Option(help="a campaign's output directory")] = Path("runs/campaign"),
    out_dir: Annotated[
        Path, typer.Option("--out", help="where to write the report (new, empty, or an earlier report)")
    ] = Path("reports"),
) -> None:
    """Tables and plots from a finished campaign (the DVC `report` stage): metrics.json, rounds.csv, campaign.md and
    PNG images (rounds, champion per round, causes per round, per-family scores) that render offline."""
    from components.evolution.report import write_report
    from components.io import claim_output

    if not (campaign / "summary.json").is_file():
        raise InputError(f"{campaign / 'summary.json'}: -: no such file (run the campaign first)")
    claim_output(out_dir, "report", inputs={"campaign": campaign})
    write_report(campaign, out_dir)
    out.print(
        f"wrote {out_dir}/metrics.json, rounds.csv, campaign.md, rounds.png, champion.png, causes.png, families.png",
        highlight=False,
    )


@app.command("export")
def export_cmd(
    campaign: Annotated[Path, typer.Option(help="a finished campaign's output directory")] = Path("runs/campaign"),
    bench: Annotated[
        Optional[Path],
        typer.Option("--benchmark", help="the benchmark the campaign ran (default: the one its summary.json records)"),
    ] = None,
    out_dir: Annotated[
        Path, typer.Option("--out", help="where to write the export (new, empty, or an earlier export)")
    ] = Path("runs/export"),
    split: Annotated[str, typer.Option(help="train only: dev and test are held out and refused")] = "train",
    mlflow: Annotated[
        bool, typer.Option("--mlflow/--no-mlflow", help="log each file as a dataset input of the campaign's MLflow run")
    ] = True,
    tracking_uri: Annotated[
        Optional[str], typer.Option(help="MLflow store (default: the campaign's, else $MLFLOW_TRACKING_URI)")
    ] = None,
) -> None:
    """Training data from a finished campaign's train episodes (the DVC `export` stage): sft.jsonl (OpenAI chat
    fine-tuning records of the champion's successes), preferences.jsonl (prompt/chosen/rejected: the champion's
    success against the start package's failure, same item and seed), rollouts.jsonl (every episode with its reward
    per rubric criterion) and manifest.json (sha256, bytes and records of each)."""
    from flows.api import ExportRequest, export

    r = export(
        ExportRequest(
            campaign=campaign, benchmark=bench, out=out_dir, split=split, mlflow=mlflow, tracking_uri=tracking_uri
        )
    )
    for name, f in sorted(r.manifest.files.items()):
        out.print(f"{out_dir / name}: {f.records} records, {f.bytes} bytes, sha256 {f.sha256[:12]}", highlight=False)
    if r.logged:
        out.print(
            f"logged as dataset inputs of the campaign's MLflow run {r.run_id}"
            if r.run_id
            else "no MLflow run of this campaign was found: nothing logged",
            highlight=False,
        )


@outer_app.command("learn-sim")
def outer_learn_sim(
    export: Annotated[Path, typer.Option(help="an export directory (`ratchet export`)")] = Path("runs/export"),
    out_path: Annotated[Path, typer.Option("--out", help="the model.json to write")] = Path("runs/outer/model.json"),
    base: Annotated[Optional[Path], typer.Option(help="the model.json of the model being trained further")] = None,
    min_demos: Annotated[int, typer.Option(help="exported successes that must demonstrate a fact")] = 2,
) -> None:
    """The offline trainer: "fine-tune" the simulated agent on an export's SFT records (it learns the facts those
    successes demonstrate) and write the trained model's identity (model.json)."""
    from components.outer.learn import learn_sim
    from components.outer.model import read_model, write_model

    if out_path.is_dir() or out_path.is_symlink():
        raise InputError(
            f"{out_path}: --out: is a {'directory' if out_path.is_dir() else 'symbolic link'}, not a "
            "model.json to write"
        )
    if out_path.exists():  # replaced only when it is a model identity Ratchet wrote, never a user's file
        try:
            read_model(out_path)
        except InputError:
            raise InputError(
                f"{out_path}: --out: exists and is not a model.json (a ModelSpec); refusing to replace "
                "it: choose another --out"
            ) from None
    spec = learn_sim(export, read_model(base) if base else None, min_demos)
    write_model(out_path, spec)
    out.print(
        f"{out_path}: {spec.name} knows {len(spec.model_cfg['learned'])} facts "
        f"({len(spec.notes['newly_learned'])} new)",
        highlight=False,
    )


@outer_app.command("run")
def outer_run(
    params: Annotated[Optional[Path], typer.Option(help=PARAMS_HELP)] = None,
    campaign: Annotated[Path, typer.Option(help="the finished inner campaign")] = Path("runs/campaign"),
    out_dir: Annotated[Path, typer.Option("--out", help="the outer round's directory")] = Path("runs/outer"),
    train: Annotated[
        Optional[str],
        typer.Option(
            help="the training command, run with {export} and {out} "
            "replaced by the export directory and the model.json to "
            "write (default: the offline learner, `ratchet outer "
            "learn-sim`)"
        ),
    ] = None,
    rounds: Annotated[Optional[int], typer.Option(help="rounds of the inner campaign after training")] = None,
    set_: Annotated[
        Optional[list[str]],
        typer.Option("--set", metavar="<key.path=value>", help="override any param of the inner campaign (repeatable)"),
    ] = None,
    adapt: Annotated[
        bool,
        typer.Option(
            "--prune/--no-prune",
            help="remove cards the trained model no longer needs (gated on dev) before the inner campaign",
        ),
    ] = True,
) -> None:
    """One outer round as a Prefect flow: export -> train -> register the model -> an inner campaign from the
    current champion with the trained model (its params: --params with the start, model and output set here)."""
    from flows.outer import run_outer

    p = _params(params, rounds, None, set_)
    result = run_outer(p, campaign, out_dir, train, adapt)
    out.print(json.dumps(result, indent=1, sort_keys=True), highlight=False, markup=False)


@app.command("reproduce")
def reproduce_cmd(
    version: Annotated[Optional[str], typer.Option(help="a promoted version, e.g. M3")] = None,
    run_id: Annotated[Optional[str], typer.Option(help="or the MLflow run id of the round that promoted it")] = None,
    campaign: Annotated[Path, typer.Option(help="the campaign's output directory")] = Path("runs/campaign"),
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> None:
    """Re-run a promotion's held-out gate on the recorded bytes and seeds. Exit 0 only when the per-episode and
    per-item tables are byte-identical and the verdict matches; a digest mismatch is refused before anything runs.
    At another commit: `git checkout <rev> && dvc checkout` first."""
    from flows.api import ReproduceRequest, reproduce

    r = reproduce(ReproduceRequest(version=version, run_id=run_id, campaign=campaign), say=say)
    if as_json:
        out.print(
            json.dumps(
                {
                    "version": r.version,
                    "round": r.round,
                    "identical": r.identical,
                    "verdict_matches": r.verdict_matches,
                    "differences": r.differences,
                    "n_items": r.n_items,
                    "n_episodes": r.n_episodes,
                },
                sort_keys=True,
            ),
            highlight=False,
        )
    else:
        g, level = r.recomputed, r.level
        out.print(
            f"per-item scores: {'identical' if r.identical else 'DIFFERENT'} ({r.n_items} items, "
            f"{r.n_episodes} episodes re-run)",
            highlight=False,
        )
        out.print(
            f"verdict: {'matches' if r.verdict_matches else 'DIFFERS'}: accept={g.accept} net {g.net:+.4f} "
            + ("" if level is None else f"{100 * level:.4g}% ")
            + f"CI [{g.ci_lo:+.4f}, {g.ci_hi:+.4f}]",
            highlight=False,
        )
        for d in r.differences:
            out.print(f"  differs: {d}", highlight=False)
    raise typer.Exit(0 if r.ok else 1)


@app.command("ui")
def ui(
    port: Annotated[int, typer.Option(help="port on 127.0.0.1")] = 5000,
    tracking_uri: Annotated[
        Optional[str], typer.Option(help="default: $MLFLOW_TRACKING_URI (the project's store)")
    ] = None,
) -> None:
    """Start the MLflow UI on 127.0.0.1 against the project's store (one worker, no job execution)."""
    import os

    check_port(port)
    _port_free(port)
    uri = tracking_uri or os.environ["MLFLOW_TRACKING_URI"]
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    cmd = [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--backend-store-uri",
        uri,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
    ]
    out.print(f"MLflow UI: http://127.0.0.1:{port}  (store {uri}; Ctrl-C to stop)", highlight=False)
    from components.env import UI_NOTE, project_home

    # the links a campaign prints point at this UI while it runs (whatever --port), not at a fixed port
    with _note(project_home() / UI_NOTE, f"http://127.0.0.1:{port}"):
        from flows.signals import run_server

        code = run_server(cmd, env)  # the server stops with this command, even on kill -9
    raise typer.Exit(code)


@contextlib.contextmanager
def _note(note: Path, url: str):
    """A server's note ({url, pid}) while it runs: removed at its end, and on Ctrl-C or SIGTERM (`os._exit`)."""
    from components.io import atomic_write_json
    from flows.signals import at_stop

    def forget() -> None:
        with contextlib.suppress(OSError, ValueError):
            if json.loads(note.read_text(encoding="utf-8")).get("pid") == os.getpid():
                note.unlink()

    atomic_write_json(note, {"url": url, "pid": os.getpid()})
    at_stop(forget)
    try:
        yield
    finally:
        forget()


@campaign_app.command("resume")
def campaign_resume(
    out_dir: Annotated[Path, typer.Option("--out", help="the interrupted campaign's output directory")] = Path(
        "runs/campaign"
    ),
) -> None:
    """Finish an interrupted campaign with the parameters it was started with (the same as rerunning its command),
    in --out wherever it now is (a moved or copied campaign resumes in place)."""
    from flows.api import CampaignRequest, campaign

    r = campaign(CampaignRequest.resuming(out_dir), say=say)
    _print_summary(r.summary, out_dir / "summary.json")


@campaign_app.command("schedule")
def campaign_schedule(
    cron: Annotated[str, typer.Option(help='cron expression, e.g. "0 3 * * *"')],
    name: Annotated[str, typer.Option(help="deployment name")] = "nightly",
    params: Annotated[Optional[Path], typer.Option(help=PARAMS_HELP)] = None,
    set_: Annotated[
        Optional[list[str]], typer.Option("--set", metavar="<key.path=value>", help="override any param (repeatable)")
    ] = None,
) -> None:
    """Register a Prefect deployment of the campaign flow on this cron schedule (served by `ratchet worker`)."""
    from prefect.client.schemas.schedules import CronSchedule
    from pydantic import ValidationError

    try:
        CronSchedule(cron=cron)
    except ValidationError:
        raise InputError(f"--cron: {cron!r} is not a valid cron expression") from None
    banned = "/%&><"  # what Prefect refuses in a deployment name (its InvalidNameError came as a traceback)
    if not name.strip() or any(c in name for c in banned):
        raise InputError(f"--name: {name!r}: a deployment name must be non-empty, without any of {' '.join(banned)}")
    p = _params(params, None, None, set_)
    from flows.schedule import register

    dep_id = register(name, cron, p)
    out.print(
        f"scheduled campaign/{name} ({cron}), deployment {dep_id}; serve it with `ratchet worker`", highlight=False
    )


@campaign_app.command("runs")
def campaign_runs(limit: Annotated[int, typer.Option(min=1, help="runs listed at most")] = 30) -> None:
    """Scheduled and past campaign runs with their state."""
    from flows.schedule import list_runs

    rows = list_runs(limit)
    table = Table(title="campaign runs")
    for col in ("name", "deployment", "state", "expected start", "start", "end"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["name"], r["deployment"], r["state"], r["expected_start"], r["start"], r["end"])
    out.print(table)


@app.command("worker")
def worker(limit: Annotated[int, typer.Option(min=1, help="campaigns run at once")] = 1) -> None:
    """Serve the scheduled campaign deployments: run them when their schedule (or a manual trigger) says so."""
    from flows.schedule import serve_all

    serve_all(limit)


@app.command("server")
def server(port: Annotated[int, typer.Option(help="port on 127.0.0.1 (API and dashboard)")] = 4200) -> None:
    """Start a persistent Prefect server on 127.0.0.1 (schedules fire only with one); its data lives in PREFECT_HOME."""
    import os

    check_port(port)
    from flows.signals import run_server

    # the dashboard is what a persistent server is for (components/env.py leaves the UI off for the temporary
    # servers flows start, which nobody browses)
    # and the dashboard's pages call this server's API, on this port: Prefect would point them at the API URL of its
    # settings (port 4200 by default), whatever --port says
    env = {
        **os.environ,
        "PREFECT_UI_ENABLED": "true",
        "PREFECT_UI_API_URL": os.environ.get("PREFECT_UI_API_URL") or f"http://127.0.0.1:{port}/api",
    }
    env.pop("PREFECT_API_URL", None)  # this server's own (a note of another one's may have set it)
    from components.env import SERVER_NOTE, project_home, running_server

    # while it runs, every `ratchet` command of this home (campaigns, workers, benchmarks, DVC stages) uses it and
    # starts no temporary server of its own (components/env.py); a note whose process is gone or whose port does
    # not answer is no server's
    note = project_home() / SERVER_NOTE
    if (live := running_server(project_home())) is not None:  # never take over (or, failing, delete) its note
        raise InputError(
            f"{note}: url: a Prefect server already runs for this home at {live}: use it (export "
            f"PREFECT_API_URL={live}), or stop it first"
        )
    _port_free(port)
    out.print(
        f"Prefect server and dashboard on http://127.0.0.1:{port}; in other shells: "
        f"export PREFECT_API_URL=http://127.0.0.1:{port}/api",
        highlight=False,
    )

    with _note(note, f"http://127.0.0.1:{port}/api"):  # the note goes with this server, also on Ctrl-C or SIGTERM
        code = run_server(
            [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)], env
        )  # stops with this command, even on kill -9
    raise typer.Exit(code)


def _port_free(port: int) -> None:
    """Refuse a port something on 127.0.0.1 already listens on, before a server (and its note) is started there."""
    import socket

    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds: closed connections don't count
        try:
            s.bind(("127.0.0.1", port))
        except OSError as e:
            raise InputError(f"--port: {port}: in use on 127.0.0.1 ({e.strerror}); choose another --port") from None
