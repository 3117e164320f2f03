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
app.add_typer(package_app, name="package")
app.add_typer(bench_app, name="bench")

out = Console()
err = Console(stderr=True)

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
) -> None:
    """Write a world's tasks, policy, tools, database and fixed train/dev/test splits as files."""
    from components.memory import digest
    from components.worlds import world

    world(world_name).materialize(out_dir, seed)
    out.print(f"wrote {out_dir} (world {world_name}, seed {seed}, digest {digest(out_dir)[:12]})")


# -- evaluation -------------------------------------------------------------------------------------------------

def _model_cfg(model: str, base_url: Optional[str], model_name: Optional[str]) -> dict:
    if model == "openai":
        if not base_url:
            raise InputError("--base-url: required with --model openai")
        return {"base_url": base_url, **({"model": model_name} if model_name else {})}
    return {}


@app.command("eval")
def eval_cmd(
    package: Annotated[Path, typer.Option(help="memory package directory")],
    benchmark: Annotated[Path, typer.Option(help="benchmark directory")] = DEFAULT_BENCH,
    split: Annotated[str, typer.Option()] = "dev",
    seeds: Annotated[int, typer.Option(help="seeds per item (0..N-1)")] = 3,
    out_dir: Annotated[Path, typer.Option("--out")] = Path("runs/eval"),
    model: Annotated[str, typer.Option(help="sim | openai")] = "sim",
    base_url: Annotated[Optional[str], typer.Option(help="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1")] = None,
    model_name: Annotated[Optional[str], typer.Option(help="model name sent to the endpoint")] = None,
    items: Annotated[Optional[str], typer.Option(help="comma-separated item ids (default: the whole split)")] = None,
) -> None:
    """Run every (item, seed) episode; write scores.csv, traces.parquet and the hidden-cause sidecar."""
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
    cfg = _model_cfg(model, base_url, model_name)
    seed_list = list(range(seeds))
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                  console=err, transient=True) as progress:
        bar = progress.add_task(f"{pkg.name} on {split}", total=len(ids) * len(seed_list))
        t = run_shard(pkg, bench, ids, seed_list, model, cfg, on_episode=lambda _r: progress.advance(bar))
    meta = {"package": str(package), "package_digest": pkg.digest, "benchmark": str(benchmark),
            "benchmark_digest": bench.digest, "split": split, "seeds": seed_list, "items": len(ids),
            "seed_map_hash": seed_map_hash(ids, seed_list), "model": model, **summary(t.scores)}
    write_eval(out_dir, t, meta)
    s = summary(t.scores)
    out.print(f"{pkg.name} on {split}: mean score {s['mean_score']:.3f}, success {s['success_rate']:.1%}, "
              f"{s['episodes']} episodes, {s['errors']} errors, tokens {s['tokens_in']}/{s['tokens_out']}")
    out.print(f"wrote {out_dir}/scores.csv, traces.parquet")


@app.command("serve-sim")
def serve_sim(
    port: Annotated[int, typer.Option()] = 8000,
    fault_rate: Annotated[float, typer.Option(help="share of requests that fault (tests)")] = 0.0,
    fault_seed: Annotated[int, typer.Option()] = 0,
) -> None:
    """Serve the simulated agent over /v1/chat/completions on 127.0.0.1."""
    from components.models.server import serve

    err.print(f"serving the simulated agent on http://127.0.0.1:{port}/v1 (fault rate {fault_rate})")
    serve(port, fault_rate=fault_rate, fault_seed=fault_seed)


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
