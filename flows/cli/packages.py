"""`ratchet package` and `ratchet bench`: memory packages and benchmarks."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

# The usage errors typer raises are its vendored click's (typer 0.26+), not the `click` package's. Typer 0.29 gives
# public names to BadParameter, Abort and Exit only: UsageError, MissingParameter and NoArgsIsHelpError have none
# (asked for in fastapi/typer#1867, closed), so they are read from the vendored module, here alone.
from components.defaults import SPLIT_SHARES
from components.errors import InputError

# the gate command's defaults are GateConfig's (this import is light: numpy and pandas load on first use)
from flows.cli.app import bench_app, err, nested_too_deep, out, package_app

# -- packages ---------------------------------------------------------------------------------------------------


@package_app.command("lint")
def package_lint(path: Annotated[Path, typer.Argument(help="the package directory")]) -> None:
    """Validate a package: exit 0 when it loads, else one line per problem (file: field: message)."""
    from components.memory import lint

    try:
        problems = lint(path)
    except RecursionError:
        raise nested_too_deep(path) from None
    for p in problems:
        err.print(str(p), markup=False, highlight=False)
    if problems:
        raise typer.Exit(1)
    out.print(f"ok: {path}")


@package_app.command("digest")
def package_digest(path: Annotated[Path, typer.Argument(help="the package directory")]) -> None:
    """SHA-256 over the sorted (relative path, bytes) of the package's files."""
    from components.memory import digest

    if not path.is_dir():
        raise InputError(f"{path}: -: not a package directory")
    if not (path / "manifest.yaml").is_file():  # an empty or foreign directory has bytes, but no package to pin
        raise InputError(f"{path / 'manifest.yaml'}: -: missing (not a package directory)")
    try:
        links = sorted(p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_symlink())
        if links:  # a package may not hold one (see load_package): its bytes would depend on where the link points
            raise InputError(f"{path / links[0]}: -: symlinks are not allowed in a package")
        from components.memory.package import _special

        odd = sorted(p.relative_to(path).as_posix() for p in path.rglob("*") if _special(p))
        if odd:  # a FIFO, socket or device: no bytes to pin (and a FIFO's read would block)
            raise InputError(
                f"{path / odd[0]}: -: {_special(path / odd[0])}, not a regular file: a package holds files only"
            )
        out.print(digest(path), highlight=False)
    except RecursionError:
        raise nested_too_deep(path) from None


# -- benchmarks -------------------------------------------------------------------------------------------------


@bench_app.command("materialize")
def bench_materialize(
    out_dir: Annotated[
        Optional[Path], typer.Option("--out", help="where to write the benchmark (default: data/benchmarks/<world>)")
    ] = None,
    world_name: Annotated[
        str, typer.Option("--world", help="the world: retail, airline, or a plug-in's name")
    ] = "retail",
    seed: Annotated[int, typer.Option(help="fixes the data, the tasks and the splits")] = 0,
    per_family: Annotated[Optional[int], typer.Option(help="tasks per family (default: the world's)")] = None,
    train_share: Annotated[
        float, typer.Option(help="share of each family in train (diagnosis, repair screens)")
    ] = SPLIT_SHARES[0],
    dev_share: Annotated[float, typer.Option(help="share in dev (the gate); the rest is test")] = SPLIT_SHARES[1],
    receipts: Annotated[
        Optional[str],
        typer.Option(
            help="what a rule refusal tells the agent: explained | coded | "
            "silent (default: benchmark.receipts' default)"
        ),
    ] = None,
    rules: Annotated[
        Optional[Path],
        typer.Option(
            help="a YAML file of the world's rules to change (a variant of the world; `ratchet bench rules` writes one)"
        ),
    ] = None,
    params_file: Annotated[
        Optional[Path],
        typer.Option(
            "--params",
            help="take every benchmark setting from this "
            "params file's `benchmark` section (what dvc.yaml's stage "
            "runs); options given as well are refused",
        ),
    ] = None,
    protocol: Annotated[
        Optional[str],
        typer.Option(
            help="how episodes run: standard (the benchmark's reference "
            "orchestrator: tau2-bench's, comparable to its leaderboard) | "
            "custom (Ratchet's harness); default: the world's"
        ),
    ] = None,
) -> None:
    """Write a world's tasks, policy, tools, database and fixed train/dev/test splits as files. --out must be new,
    empty or a benchmark (which is replaced); anything else is refused. A variant (--rules) also gets its own
    `reference` and `all-skills` packages under <out>/packages/."""
    from pydantic import ValidationError

    from components.memory import digest
    from components.params import BenchmarkParams

    if params_file is not None:
        from components.params import load_params

        given = [
            name
            for name, v, default in (
                ("--world", world_name, "retail"),
                ("--seed", seed, 0),
                ("--per-family", per_family, None),
                ("--receipts", receipts, None),
                ("--rules", rules, None),
                ("--protocol", protocol, None),
                ("--train-share", train_share, SPLIT_SHARES[0]),
                ("--dev-share", dev_share, SPLIT_SHARES[1]),
            )
            if v != default
        ]
        if given:
            raise InputError(
                f"{given[0]}: --params takes every benchmark setting from {params_file}; give one or the other"
            )
        bench = load_params(params_file).benchmark
        if out_dir is not None:
            bench = bench.model_copy(update={"out": str(out_dir)})
        world_name, seed = bench.world, bench.seed
    else:
        try:
            bench = BenchmarkParams(
                world=world_name,
                seed=seed,
                out=str(out_dir) if out_dir else None,
                per_family=per_family,
                train_share=train_share,
                dev_share=dev_share,
                **({"receipts": receipts} if receipts is not None else {}),
                **({"rules": str(rules)} if rules is not None else {}),
                **({"protocol": protocol} if protocol is not None else {}),
            )
        except ValidationError as e:
            raise InputError(_option_error(e)) from None
    from flows.api import materialize

    out_dir = materialize(bench)
    out.print(
        f"wrote {out_dir} (world {world_name}, seed {seed}, receipts {bench.receipts.value}, "
        f"protocol {bench.protocol_for()}, digest {digest(out_dir)[:12]})"
    )


@bench_app.command("rules")
def bench_rules(
    world_name: Annotated[
        str, typer.Option("--world", help="the world whose rules to write (its rules must be data: retail, airline)")
    ] = "retail",
    random_seed: Annotated[
        Optional[int],
        typer.Option("--random", help="draw a random variant of the world's rules with this seed (values and forms)"),
    ] = None,
    out_file: Annotated[
        Optional[Path], typer.Option("--out", help="write the rules file here (default: print it)")
    ] = None,
) -> None:
    """Print (or write) a world's rules as a YAML file that `ratchet bench materialize --rules` takes: the world's own,
    or a random variant of them (--random SEED)."""
    import yaml

    from components.io import atomic_write_text
    from components.worlds import world

    spec = world(world_name)
    rules_mod = getattr(spec, "rules", None)
    if rules_mod is None:
        raise InputError(f"--world: {world_name}: its rules are not data (no rules file to write)")
    data = rules_mod.rules_of(rules_mod.random_rules(random_seed) if random_seed is not None else None)
    text = yaml.safe_dump({"world": world_name, **data.model_dump(mode="json")}, sort_keys=False)
    if out_file is None:
        out.print(text, end="", markup=False, highlight=False)
    else:
        atomic_write_text(out_file, text)
        out.print(f"wrote {out_file}")


def _option_error(e) -> str:
    """A pydantic error on options as `--the-option: message`."""
    first = e.errors()[0]
    loc = [str(x) for x in first["loc"]]
    name = f"--{loc[-1].replace('_', '-')}" if loc else "options"
    return f"{name}: {first['msg'].removeprefix('Value error, ')}"
