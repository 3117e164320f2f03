"""Ratchet's Python API, re-exported as the `ratchet` package: one function per job, each taking a frozen, typed
request and returning a typed result. The `ratchet` command line maps its options to these requests and prints
the results; a notebook or a script calls them directly:

    import ratchet
    r = ratchet.evaluate(ratchet.EvalRequest(package="data/packages/seed", split="dev", seeds=1, out="runs/eval"))
    print(r.summary.mean_score)

Bad input raises `InputError`, one line naming the file (or option) and the field, before anything is written.
Progress that a long job reports as it goes (which episodes were resumed, which campaign is resumed) goes to the
`say` callable a function takes (None: kept quiet). Imports stay inside the functions: `import ratchet` costs
pydantic and the params models, not pandas, Prefect or MLflow, and each job loads only the stack it runs on.

Here, in `flows/`, beside the flows a campaign runs on, so that the command line (`flows.cli`) and the `ratchet`
package both import downward: ratchet -> flows.api -> flows.campaign, components; nothing imports back up.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from components.defaults import MAX_TURNS
from components.errors import InputError
from components.evolution.gate import GateConfig  # light: numpy and pandas load on first use
from components.params import BenchmarkParams, Params

if TYPE_CHECKING:  # only for annotations: each is imported where it is used
    import pandas as pd

    from components.evolution.gate import GateResult
    from components.outer.export import ExportManifest
    from components.worlds import Benchmark

Say = Callable[[str], None]
# the progress of an evaluation: given a description and the number of episodes, a context that yields the
# callable to call once per finished episode (the command line draws a bar with it)
Progress = Callable[[str, int], AbstractContextManager[Callable[[], None]]]

DEFAULT_BENCH = Path("data/benchmarks/retail")
MAX_SEEDS = 1000  # seeds per item in one eval (a campaign allows 20); more is a typo, and the seed list is built whole


class Request(BaseModel):
    """A request: frozen (it cannot change once made, so it can be kept beside what it produced), and no field it
    does not declare (a misspelled option is refused, not ignored)."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class Result(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def _quiet(_line: str) -> None:
    return None


@contextmanager
def _no_progress(_description: str, _total: int) -> Iterator[Callable[[], None]]:
    yield lambda: None


# -- benchmarks -----------------------------------------------------------------------------------------------------


def materialize(benchmark: BenchmarkParams) -> Path:
    """Write a world's tasks, policy, tools, database and fixed train/dev/test splits as files at `benchmark.out`
    (refused unless it is new, empty or a benchmark, which is replaced); the directory written. `BenchmarkParams` is
    the `benchmark` section of params (`campaign_params(...).benchmark`)."""
    benchmark.materialize()
    return Path(benchmark.out)


# -- evaluate -------------------------------------------------------------------------------------------------------


class ModelSettings(Request):
    """A served model's settings (the `openai` and `local` backends); None: the backend's default. Any other
    model takes none of them."""

    base_url: str | None = Field(None, description="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1")
    model_name: str | None = Field(None, description="model name sent to the endpoint")
    max_tokens: int | None = None
    timeout: float | None = None
    max_retries: int | None = None
    temperature: float | None = None
    tool_choice: str | None = None
    json_actions: bool | None = None
    headers: dict[str, str] | None = None
    reasoning: bool | None = None
    reasoning_effort: str | None = None
    max_tokens_field: str | None = None
    extra_body: dict[str, Any] | None = None

    def backend_cfg(self, model: str, benchmark: Path) -> dict[str, Any]:
        """The backend's options: only the settings given (the backend has defaults). A model whose options take a
        `benchmark` (tau2's `gold` replay) plays the benchmark it is evaluated on."""
        given = self.model_dump(exclude_none=True, exclude={"base_url", "model_name"})
        base_url, model_name = self.base_url, self.model_name
        if model == "openai":
            if not base_url:
                raise InputError("--base-url: required with --model openai")
            return {"base_url": base_url, **({"model": model_name} if model_name else {}), **given}
        if model == "local":
            return {
                **({"base_url": base_url} if base_url else {}),
                **({"model": model_name} if model_name else {}),
                **given,
            }
        if given or base_url or model_name:
            raise InputError(
                f"--model {model}: model settings (--base-url, --max-tokens, ...) apply to openai and local only"
            )
        from components.models import MODELS

        spec = MODELS.get(model)
        return {"benchmark": str(benchmark)} if spec is not None and "benchmark" in spec.options.model_fields else {}


class EvalRequest(Request):
    """One evaluation: every (item, seed) episode of a split (or of `items`) with a package on a benchmark."""

    package: Path = Field(description="memory package directory")
    benchmark: Path = Field(DEFAULT_BENCH, description="benchmark directory")
    split: str = Field("dev", description="train | dev | test: the benchmark's split to evaluate")
    seeds: int = Field(3, description="seeds per item (0..N-1)")
    out: Path = Field(
        Path("runs/eval"),
        description="where to write scores.csv and traces.parquet (new, empty, or "
        "an earlier eval's output, which is replaced)",
    )
    model: str = Field("sim", description="a registered model backend: sim | openai | local | a plug-in's")
    settings: ModelSettings = Field(default_factory=ModelSettings, description="the served model's settings")
    items: tuple[str, ...] | None = Field(None, description="item ids (default: the whole split)")
    max_turns: int | None = Field(
        None,
        description=f"turns per episode (default {MAX_TURNS}; a benchmark of the "
        "standard protocol ends episodes by its own limits instead)",
    )


class EvalSummary(Result):
    """The headline figures of an evaluation (`components.runtime.evaluate.summary`)."""

    model_config = ConfigDict(frozen=True, extra="allow")  # and `errors_<kind>` for each error kind that occurred
    episodes: int
    mean_score: float
    success_rate: float
    errors: int
    tokens_in: int
    tokens_out: int
    model_calls: int
    tool_calls: int
    user_tokens_in: int = 0
    user_tokens_out: int = 0
    user_model_calls: int = 0


class EvalResult(Result):
    out: Path = Field(description="the output directory: scores.csv, traces.parquet, meta.json")
    package_name: str
    split: str = Field(description="the split the items came from (several joined by +)")
    summary: EvalSummary
    error_kinds: dict[str, int] = Field(description="errored episodes by kind")
    pass_hat_k: dict[int, float] = Field(description="pass^k for k = 1..seeds (empty with one seed)")
    resumed: int = Field(0, description="finished episodes resumed from an earlier run's journal")
    first_error: str | None = Field(None, description="the first errored episode's error, when every one errored")

    @property
    def all_errored(self) -> bool:
        """Nothing behind the numbers: every episode errored (the command line exits 1)."""
        return bool(self.summary.episodes) and self.summary.errors == self.summary.episodes

    def scores(self) -> pd.DataFrame:
        """scores.csv: one row per (item, seed) episode."""
        import pandas as pd

        return pd.read_csv(self.out / "scores.csv", dtype={"item_id": str})


def evaluate(request: EvalRequest, *, say: Say | None = None, progress: Progress | None = None) -> EvalResult:
    """Run every (item, seed) episode; write scores.csv, traces.parquet and the hidden-cause sidecar (each failed
    episode replayed in-process with the simulated agent's faults switched off, one owner at a time). A served
    model's finished episodes are journaled under `out/partial/` as they end, and the same evaluation run again
    resumes them."""
    from components.models.counterfactual import causes_table
    from components.runtime.evaluate import error_kinds, pass_hat_k, run_shard, summary, write_eval

    r, say = request, say or _quiet
    x = _EvalInputs.check(r)
    journal = _journal(x)
    seed_list = list(range(r.seeds))
    with (progress or _no_progress)(f"{x.pkg.name} on {r.split}", len(x.ids) * len(seed_list)) as advance:
        t = run_shard(
            x.pkg,
            x.bench,
            x.ids,
            seed_list,
            r.model,
            x.cfg,
            x.max_turns or MAX_TURNS,
            on_episode=lambda _r: advance(),
            journal=journal,
        )
    resumed = journal.resumed if journal is not None else 0
    if resumed:
        say(f"resumed {resumed} finished episode(s) from {journal.root}")
    t.causes = causes_table(x.pkg, x.bench, t.scores, x.max_turns or MAX_TURNS)
    taken = x.splits()
    write_eval(r.out, t, {**x.meta(taken), **summary(t.scores)}, mark="eval")
    s = EvalSummary.model_validate(summary(t.scores))
    first = None
    if s.episodes and s.errors == s.episodes:
        errors = t.scores["error"].fillna("").astype(str)
        first = str(errors[errors != ""].iloc[0])
    return EvalResult(
        out=r.out,
        package_name=x.pkg.name,
        split="+".join(taken) if len(taken) != 1 else taken[0],
        summary=s,
        error_kinds=error_kinds(t.scores),
        pass_hat_k=pass_hat_k(t.scores) if r.seeds > 1 else {},
        resumed=resumed,
        first_error=first,
    )


@dataclass(frozen=True)
class _EvalInputs:
    """An evaluation's request with what it reads, each checked before any output is written."""

    r: EvalRequest
    pkg: Any  # components.memory.MemoryPackage (imported where used: the API module stays light)
    bench: Benchmark
    max_turns: int | None
    settings: dict[str, Any]
    ids: list[str]
    cfg: dict[str, Any]

    @classmethod
    def check(cls, r: EvalRequest) -> _EvalInputs:
        from components.evolution.validate import foreign_tools
        from components.io import claim_output
        from components.memory import load_package
        from components.worlds import load_benchmark, run_settings, world

        if r.seeds < 1:
            raise InputError(f"--seeds: {r.seeds}: must be at least 1")
        if r.seeds > MAX_SEEDS:
            raise InputError(f"--seeds: {r.seeds}: must be at most {MAX_SEEDS}")
        claim_output(r.out, "eval", inputs={"package": r.package, "benchmark": r.benchmark})
        try:
            pkg = load_package(r.package)
        except RecursionError:
            raise InputError(f"{r.package}: -: nested too deeply to read (thousands of directory levels)") from None
        bench = load_benchmark(r.benchmark)
        foreign = foreign_tools(pkg, bench)
        if foreign:
            raise InputError(foreign[0] + (f" (and {len(foreign) - 1} more card(s))" if len(foreign) > 1 else ""))
        max_turns = _max_turns(r, bench)
        settings = run_settings(bench.world)  # a user simulator's model (RATCHET_TAU2_USER): refused here if malformed
        ids = _eval_ids(r, bench)
        check_items = world(bench.world).check
        if check_items is not None:  # the world's own reading of its files (tau2's database and tasks)
            check_items(bench, ids)
        return cls(r, pkg, bench, max_turns, settings, ids, r.settings.backend_cfg(r.model, r.benchmark))

    def splits(self) -> list[str]:
        """The splits the items really came from (items may name any)."""
        where = {i: s for s in ("train", "dev", "test") for i in self.bench.ids(s)}
        return [s for s in ("train", "dev", "test") if any(where.get(i) == s for i in self.ids)]

    def meta(self, taken: list[str]) -> dict[str, Any]:
        """meta.json's fields of what ran (the score summary is added beside them): one split name, or a list when the
        items span several."""
        from components.runtime.evaluate import seed_map_hash

        r, seed_list = self.r, list(range(self.r.seeds))
        return {
            "package": str(r.package),
            "package_digest": self.pkg.digest,
            "benchmark": str(r.benchmark),
            "benchmark_digest": self.bench.digest,
            "split": taken[0] if len(taken) == 1 else taken,
            "seeds": seed_list,
            "items": len(self.ids),
            "seed_map_hash": seed_map_hash(self.ids, seed_list),
            "model": r.model,
            "max_turns": self.max_turns,
            "model_cfg": {k: v for k, v in self.cfg.items() if k != "headers"},
            **_run_record(self.bench, self.settings),
        }


def _max_turns(r: EvalRequest, bench: Benchmark) -> int | None:
    """The turn cap: none under the standard protocol (its benchmark's own limits end episodes), else the request's or
    the default."""
    if bench.protocol == "standard" and r.max_turns is not None:  # it would be recorded, and never applied
        raise InputError(
            f"--max-turns: {r.benchmark / 'meta.json'} runs episodes under the standard protocol, which "
            "ends them by the benchmark's own limits (materialize it with --protocol custom to cap turns)"
        )
    if bench.protocol != "standard" and r.max_turns is None:
        return MAX_TURNS
    return r.max_turns


def _journal(x: _EvalInputs):
    """A served model's episode costs seconds to minutes: each is kept as it ends, under out/partial/ (the sim's not:
    None)."""
    from components.io import mark_output, output_kind
    from components.runtime.journal import PARTIAL, TRANSPORT, Journal, journal_key

    r = x.r
    if r.model == "sim":
        return None
    from components.models import make_model

    make_model(r.model, x.cfg)  # bad settings are refused before `out` is created for the journal
    r.out.mkdir(parents=True, exist_ok=True)
    if output_kind(r.out) is None:  # so that a rerun may claim it (and resume)
        mark_output(r.out, "eval")
    key = journal_key(
        package=x.pkg.digest,
        benchmark=x.bench.digest,
        model=r.model,
        max_turns=x.max_turns,
        model_cfg={k: v for k, v in x.cfg.items() if k not in TRANSPORT},
        **({"settings": x.settings} if x.settings else {}),
    )
    return Journal(r.out / PARTIAL, key)


def _eval_ids(r: EvalRequest, bench: Benchmark) -> list[str]:
    """The items to run: `items` as given, else the split's; each once, each the benchmark's."""
    ids = [i.strip() for i in r.items if i.strip()] if r.items is not None else bench.ids(r.split)
    if not ids:
        raise InputError(
            "--items: no item ids given"
            if r.items is not None
            else f"{r.benchmark / 'splits.json'}: {r.split}: the split is empty"
        )
    twice = sorted(i for i, n in Counter(ids).items() if n > 1)
    if twice:  # each would be run and scored twice: a table the gate refuses (duplicate pairs)
        raise InputError(f"--items: given more than once: {', '.join(twice[:5])}")
    unknown = [i for i in ids if i not in bench.tasks]
    if unknown:
        raise InputError(f"--items: unknown item ids: {', '.join(unknown[:5])}")
    return ids


def _run_record(bench: Benchmark, settings: dict[str, Any]) -> dict[str, Any]:
    """What an eval's meta.json says of how its episodes ran: the protocol (standard: as the benchmark's reference
    orchestrator runs them, comparable to its leaderboard; custom: Ratchet's harness) and the world's settings outside
    the benchmark (which user simulator), when it has any."""
    out: dict[str, Any] = {"protocol": bench.protocol}
    if settings:
        out["settings"] = settings
    return out


# -- diagnose -------------------------------------------------------------------------------------------------------


class DiagnoseRequest(Request):
    """Diagnose a finished evaluation and score the owners it names against the hidden counterfactual causes."""

    eval_dir: Path = Field(description="a finished evaluation's output directory (`evaluate`'s `out`)")
    package: Path = Field(description="the memory package that was evaluated")
    benchmark: Path = Field(DEFAULT_BENCH, description="benchmark directory")


class Compound(Result):
    n: int = 0
    coverage: float | None = None
    accuracy: float | None = None
    constant: float | None = None
    no_fix: int = 0


class OwnerScore(Result):
    n: int
    coverage: float
    accuracy: float


class Localization(Result):
    """How often the diagnoser's owner matches the hidden cause, beside the baselines
    (`components.evolution.localization`: each figure is described there). None: not measurable here."""

    model_config = ConfigDict(frozen=True, extra="allow")  # a figure the scoring adds later is kept, not refused
    accuracy: float | None
    single_accuracy: float | None = None
    n: int
    n_single: int = 0
    coverage: float | None
    constant_accuracy: float | None
    outcome_only_accuracy: float | None
    trace_rule_accuracy: float | None
    three_line_accuracy: float | None
    trace_rule_no_refusal_accuracy: float | None = None
    margin: float | None
    ceiling: float | None
    compound: Compound
    checks: dict[str, bool]
    passes: bool
    per_owner: dict[str, OwnerScore]
    confusion: dict[str, dict[str, int]] = Field(description="truth -> predicted -> episodes")
    scored: bool
    unlabelled: int
    unscored: str | None
    diagnosed: int
    unattributed: dict[str, int]


# what `ratchet diagnose --json` prints, in this order of keys (sorted when printed)
DIAGNOSE_KEYS = (
    "accuracy",
    "n",
    "coverage",
    "constant_accuracy",
    "outcome_only_accuracy",
    "trace_rule_accuracy",
    "three_line_accuracy",
    "margin",
    "ceiling",
    "checks",
    "passes",
    "confusion",
    "compound",
    "per_owner",
    "scored",
    "unlabelled",
    "unscored",
    "diagnosed",
    "unattributed",
)


def diagnose(request: DiagnoseRequest) -> Localization:
    """Diagnose a finished evaluation from its traces and score it: accuracy, coverage, the baselines (fitted on
    train) and the confusion matrix (truth -> predicted)."""
    from components.evolution.localization import diagnose_eval

    loc = diagnose_eval(request.eval_dir, request.package, request.benchmark)
    return Localization.model_validate(loc)


# -- the gate -------------------------------------------------------------------------------------------------------


class GateRequest(Request):
    """The held-out gate on two paired score tables (CSV with item_id, seed, score)."""

    base: Path = Field(description="the parent's score table")
    cand: Path = Field(description="the candidate's score table")
    reg_cap: int = Field(GateConfig.reg_cap, description="regressed items allowed")
    reg_share: float = Field(
        GateConfig.reg_share, description="... or this share of the items compared, when more (0: reg_cap only)"
    )
    material: float = Field(GateConfig.material, description="|d_i| above this counts as improved/regressed")
    alpha: float = Field(GateConfig.alpha, description="two-sided CI level 1 - alpha")
    n_boot: int = Field(GateConfig.n_boot, description="bootstrap resamples")
    seed: int = Field(GateConfig.seed, description="seed of the bootstrap resamples")
    min_items: int = Field(GateConfig.min_items, description="refuse tables with fewer items")


def gate(request: GateRequest) -> GateResult:
    """Accept iff the bootstrap CI of the mean paired difference over items excludes zero upward and regressions
    stay under the cap. A table with too many errored pairs to compare is refused (InputError), as is any other
    bad table. The command line's `ratchet gate` runs the same decision (`gate_files.gate_command`) on a path that
    imports no pydantic model of this module, so that it stays light."""
    from components.evolution.gate_files import gate_files

    r = request
    verdict = gate_files(
        r.base,
        r.cand,
        GateConfig(
            reg_cap=r.reg_cap,
            reg_share=r.reg_share,
            material=r.material,
            alpha=r.alpha,
            n_boot=r.n_boot,
            seed=r.seed,
            min_items=r.min_items,
        ),
    )
    if verdict.refused:  # too many errored pairs: nothing was compared
        raise InputError(f"{r.base} vs {r.cand}: {verdict.reason}")
    return verdict


# -- campaigns ------------------------------------------------------------------------------------------------------


class CampaignRequest(Request):
    """A campaign: run (or resume) every round the params ask for at `params.campaign.out`."""

    params: Params = Field(description="every knob (`load_params`, or `campaign_params` for a file with overrides)")
    force: bool = Field(
        False,
        description="delete Ratchet's own output at campaign.out if it is another campaign "
        "(or another kind of output) and start over",
    )
    resume: bool = Field(
        False,
        description="the params were read back from an interrupted campaign's output "
        "(`CampaignRequest.resuming`); said so, and how to continue, on a stop",
    )

    @classmethod
    def resuming(cls, out: str | Path) -> CampaignRequest:
        """Finish the interrupted campaign at `out` with the params it was started with, wherever it now is."""
        from pydantic import ValidationError

        out = Path(out)
        saved = out / ".state" / "params.json"
        if not saved.is_file():
            raise InputError(f"{saved}: -: no campaign was started here")
        try:
            p = Params.model_validate_json(saved.read_bytes())
        except ValidationError as e:
            first = e.errors()[0]
            raise InputError(f"{saved}: {'.'.join(str(x) for x in first['loc']) or '-'}: {first['msg']}") from None
        return cls(
            params=p.model_copy(update={"campaign": p.campaign.model_copy(update={"out": str(out)})}), resume=True
        )


class CampaignResult(Result):
    path: Path = Field(description="the campaign's summary.json")
    summary: dict[str, Any] = Field(description="summary.json as written (rounds, champion, test, localization)")
    unchanged: bool = Field(
        False,
        description="the campaign had finished and nothing it depends on had changed "
        "since: nothing ran, the summary is the one on disk",
    )

    @property
    def champion(self) -> str:
        return str(self.summary["champion"])

    @property
    def accepted(self) -> int:
        return int(self.summary["accepted"])


def campaign_params(
    params: str | Path | None = None,
    *,
    rounds: int | None = None,
    out: str | Path | None = None,
    overrides: dict[str, Any] | None = None,
) -> Params:
    """The params of a campaign: `params` (None: ./params.yaml if present, else the built-in defaults), then
    `rounds`, `out` and any dotted overrides ({"campaign.seeds": 1}); one line naming the file and field if bad."""
    from components.params import load_params

    given: dict[str, Any] = dict(overrides or {})
    if rounds is not None:
        given["campaign.rounds"] = rounds
    if out is not None:
        given["campaign.out"] = str(out)
    if params is None:  # only the implicit default may be absent; a named file must exist
        params = Path("params.yaml") if Path("params.yaml").exists() else None
    return load_params(params, given)


def finished_summary(p: Params) -> CampaignResult | None:
    """The summary of a finished campaign nothing has changed since (flows/finished.py), read before any server
    starts or heavy import happens; None: it must run."""
    from flows.finished import unchanged

    kept = unchanged(p.resolved())
    if kept is None:
        return None
    path = Path(p.campaign.out) / "summary.json"
    summary = {
        **json.loads(path.read_text(encoding="utf-8")),
        **kept,
        "budget_spent": dict.fromkeys(kept.get("budget_spent") or {}, 0.0),
    }
    return CampaignResult(path=path, summary=summary, unchanged=True)


def campaign(request: CampaignRequest, *, say: Say | None = None) -> CampaignResult:
    """Run (or resume) an evolution campaign in this process: evaluate -> diagnose -> patch -> validate -> repair
    screen -> held-out paired gate -> commit, for `campaign.rounds` rounds, then the champion's certification on
    test. Running it again resumes an interrupted campaign; a finished one that nothing has changed since is not
    run again (its summary comes back with `unchanged`)."""
    say = say or _quiet
    p = request.params
    if not request.force and not request.resume:
        done = finished_summary(p)
        if done is not None:
            say(f"{p.campaign.out}: finished, and nothing it depends on has changed since: nothing to run")
            return done
    from components.evolution.lineage import LineageLock
    from components.heap import long_lived

    with long_lived("flows.campaign"):  # Prefect, pandas and the stack a campaign runs on live as long as the process
        from flows.campaign import prepare, run_campaign
    from flows.signals import flows_obey

    out = Path(p.campaign.out)
    flows_obey(
        f"the committed work is kept: `ratchet campaign resume --out {out}` continues"
        if request.resume
        else "the committed work is kept: the same command continues the campaign"
    )
    prepare(p, force=request.force)
    if request.resume:
        _say_resuming(p, say)
    # the lineage lock, taken as soon as the checks pass: a second campaign on the same output is refused at once,
    # not after this one's Prefect server has started (the flow takes it again, re-entrantly)
    with LineageLock(out / "lineage"):
        summary = run_campaign(p)
    return CampaignResult(path=out / "summary.json", summary=summary)


def _say_resuming(p: Params, say: Say) -> None:
    state = Path(p.campaign.out) / ".state" / "state.json"
    try:  # only what the message says: the lineage, not this file, decides what is done
        s = json.loads(state.read_bytes()) if state.exists() else None
    except (OSError, ValueError):
        s = None
    if isinstance(s, dict):
        say(f"resuming {p.campaign.name}: last state round {s.get('round')} after {s.get('stage')}")
    elif state.exists():
        say(f"resuming {p.campaign.name}: {state} is unreadable (ignored; the lineage says what is done)")


# -- reproduce ------------------------------------------------------------------------------------------------------


class ReproduceRequest(Request):
    """Re-run a promotion's held-out gate on the recorded bytes and seeds."""

    version: str | None = Field(None, description="a promoted version, e.g. M3")
    run_id: str | None = Field(None, description="or the MLflow run id of the round that promoted it")
    campaign: Path = Field(Path("runs/campaign"), description="the campaign's output directory")


class Verdict(Result):
    """A gate's verdict, as recomputed."""

    model_config = ConfigDict(frozen=True, extra="ignore")
    accept: bool
    net: float
    ci_lo: float
    ci_hi: float


class ReproduceResult(Result):
    version: str
    round: int
    identical: bool = Field(description="the per-episode and per-item tables are byte-identical to the recorded")
    verdict_matches: bool
    differences: list[str]
    n_items: int
    n_episodes: int
    recomputed: Verdict
    level: float | None = Field(description="the CI level the round's gate decided at (its look's alpha)")

    @property
    def ok(self) -> bool:
        return self.identical and self.verdict_matches


def reproduce(request: ReproduceRequest, *, say: Say | None = None) -> ReproduceResult:
    """Exit 0 on the command line only when `ok`: the tables are byte-identical and the verdict matches. A digest
    mismatch is refused (InputError) before anything runs."""
    from components.evolution.report import ci_level
    from components.tracking.reproduce import find_round
    from components.tracking.reproduce import reproduce as rerun

    if not request.version and not request.run_id:
        raise InputError("--version or --run-id: one is required")
    where, rec = find_round(request.campaign, request.version, request.run_id)
    (say or _quiet)(f"reproducing {rec.committed.version} (round {rec.round}): {rec.summary or ''}")
    r = rerun(where, rec)
    return ReproduceResult(
        version=r.version,
        round=r.round,
        identical=r.identical,
        verdict_matches=r.verdict_matches,
        differences=list(r.differences),
        n_items=r.n_items,
        n_episodes=r.n_episodes,
        recomputed=Verdict.model_validate(r.recomputed),
        level=ci_level(rec),
    )


# -- export ---------------------------------------------------------------------------------------------------------


class ExportRequest(Request):
    """Training data from a finished campaign's train episodes."""

    campaign: Path = Field(Path("runs/campaign"), description="a finished campaign's output directory")
    benchmark: Path | None = Field(
        None, description="the benchmark the campaign ran (default: the one its summary.json records)"
    )
    out: Path = Field(Path("runs/export"), description="where to write the export (new, empty, or an earlier export)")
    split: str = Field("train", description="train only: dev and test are held out and refused")
    mlflow: bool = Field(True, description="log each file as a dataset input of the campaign's MLflow run")
    tracking_uri: str | None = Field(
        None, description="MLflow store (default: the campaign's, else $MLFLOW_TRACKING_URI)"
    )


class ExportResult(Result):
    out: Path
    manifest: ExportManifest = Field(description="what each file holds: sha256, bytes, records")
    logged: bool = Field(description="MLflow logging was asked for")
    run_id: str | None = Field(
        description="the campaign's MLflow run the files were logged to (None: not found, or not asked)"
    )


def export(request: ExportRequest) -> ExportResult:
    """sft.jsonl (chat fine-tuning records of the champion's successes), preferences.jsonl (the champion's success
    against the start package's failure, same item and seed), rollouts.jsonl (every episode with its reward per
    rubric criterion) and manifest.json."""
    from components.io import claim_output, read_json_object
    from components.outer.export import check_split, export_campaign

    r = request
    check_split(r.split)
    if not (r.campaign / "summary.json").is_file():
        raise InputError(f"{r.campaign / 'summary.json'}: -: no such file (run the campaign first)")
    bench = r.benchmark
    if bench is None:  # the campaign's own record says which benchmark it ran (its digest is checked on reading)
        ran = ((read_json_object(r.campaign / "summary.json").get("params") or {}).get("benchmark") or {}).get("out")
        if not isinstance(ran, str) or not ran:
            raise InputError(f"{r.campaign / 'summary.json'}: params.benchmark.out: not recorded; give --benchmark")
        bench = Path(ran)
    claim_output(r.out, "export", inputs={"campaign": r.campaign, "benchmark": bench})
    m = export_campaign(r.campaign, bench, r.out, r.split)
    run_id = None
    if r.mlflow:
        from components.tracking.mlflow_log import log_export

        summary = read_json_object(r.campaign / "summary.json")
        uri = r.tracking_uri or ((summary.get("params") or {}).get("campaign") or {}).get("tracking_uri")
        run_id = log_export(m, r.out, summary, uri)
    if not ExportResult.__pydantic_complete__:  # its manifest's class is imported here, not with the module (pandas)
        ExportResult.model_rebuild(_types_namespace={"ExportManifest": type(m)})
    return ExportResult(out=r.out, manifest=m, logged=r.mlflow, run_id=run_id)


__all__ = [
    "BenchmarkParams",
    "CampaignRequest",
    "CampaignResult",
    "DiagnoseRequest",
    "EvalRequest",
    "EvalResult",
    "EvalSummary",
    "ExportRequest",
    "ExportResult",
    "GateRequest",
    "InputError",
    "Localization",
    "ModelSettings",
    "ReproduceRequest",
    "ReproduceResult",
    "Verdict",
    "campaign",
    "campaign_params",
    "diagnose",
    "evaluate",
    "export",
    "finished_summary",
    "gate",
    "materialize",
    "reproduce",
]
