"""The certification: the champion against the starting package on the test split, touched once per campaign, with
its paired CI, the smallest effect the split could show, and the champion's prompt tokens per episode beside the
world's built-in packages."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from prefect import flow

from components.evidence.budget import BudgetSpec
from components.evolution.gate import gate
from components.evolution.power import components as power_components
from components.evolution.power import mde
from components.evolution.report import write_json
from components.memory.package import digest
from components.params import Params
from components.runtime.evaluate import EvalTables, summary
from flows.round import Eval
from flows.tasks import paired_contract


@flow(name="certification", validate_parameters=False)
def certify(p: Params, start: Path, champion: Path, budget: BudgetSpec) -> tuple[dict, list[dict]]:
    """Champion vs the starting package on the test split, touched once per campaign, with its paired CI."""
    ev = Eval(p, budget)
    base = ev(start, "test start", split="test")
    cand = ev(champion, "test champion", split="test")
    paired_contract(base.scores, cand.scores, "test certification")
    verdict, _ = gate(
        base.scores, cand.scores, replace(p.gate.config(), cheaper=False)
    )  # the score's 95% CI, one claim
    figures = verdict.as_dict()  # as files spell it (a refusal's dropped_errors: -1)
    test = {
        "base_mean": verdict.base_mean,
        "champion_mean": verdict.cand_mean,
        "net": verdict.net,
        "ci_lo": verdict.ci_lo,
        "ci_hi": verdict.ci_hi,
        "n_items": verdict.n_items,
        "n_improved": verdict.n_improved,
        "n_regressed": verdict.n_regressed,
        "dropped_errors": figures["dropped_errors"],
    }
    if verdict.n_items >= 2:  # beside the certification: the smallest effect this test split could have shown
        var = power_components(base.scores, cand.scores)
        trials = int(base.scores["seed"].nunique())
        # identical arms (no promotion) show no paired variance: an MDE of 0 would claim any effect is detectable
        size = round(mde(verdict.n_items, trials, var, p.gate.alpha), 6) if var.sigma(trials) > 0 else None
        test.update(mde=size, mde_trials=trials, mde_sd_item=round(var.sd_item, 6), mde_sd_trial=round(var.sd_trial, 6))
    evals = [
        {"split": "test", "arm": "start", "package_digest": digest(start), "summary": summary(base.scores)},
        {"split": "test", "arm": "champion", "package_digest": digest(champion), "summary": summary(cand.scores)},
    ]
    # cost: the champion's prompt tokens per episode beside the world's built-in packages, on the same test cells
    # (their evaluations are for this figure only: the records' test split stays the start and the champion)
    tables = {digest(start): base, digest(champion): cand}
    per_episode = {"champion": _per_episode(cand), "start": _per_episode(base)}
    for name, where in builtin_packages(p.benchmark.world).items():
        d = digest(where)
        if d not in tables:
            tables[d] = ev(where, f"test {name}", split="test")
        per_episode[name] = _per_episode(tables[d])
    test["tokens_per_episode"] = per_episode
    write_json(Path(p.campaign.out) / "test_evals.json", evals)
    return test, evals


TOKEN_BASELINES = ("seed", "all-skills", "reference")  # the built-in packages the champion's cost is set beside


def builtin_packages(world_name: str) -> dict[str, Path]:
    """The world's built-in packages among TOKEN_BASELINES that exist (a world may ship fewer)."""
    from components.params import resolve_start

    out = {}
    for name in TOKEN_BASELINES:
        # absolute: the evaluation may run in a worker whose working directory is another (a Dask worker's)
        where = Path(resolve_start(name, world_name)).resolve()
        if (where / "manifest.yaml").is_file():
            out[name] = where
    return out


def _per_episode(t: EvalTables) -> float | None:
    s = t.scores
    if "tokens_in" not in s.columns or s.empty:
        return None
    ok = s[s["error"].fillna("").astype(str) == ""] if "error" in s.columns else s
    return round(float(ok["tokens_in"].mean()), 2) if len(ok) else None
