"""What a round and a campaign leave on disk (besides the lineage): artifacts a user or a reproduction can read.

    <out>/rounds/r<N>/train/             the diagnosed evaluation (scores, traces, hidden-cause sidecar)
    <out>/rounds/r<N>/diagnosis.json     evidence packets;  findings.csv  one row per failed episode
    <out>/rounds/r<N>/plan.json          validation.json   repair.json   repair_items.csv
    <out>/rounds/r<N>/gate.json          gate_items.csv    dev_base.csv  dev_cand.csv
    <out>/rounds/r<N>/round.json         the round's record (what the lineage says, with paths)
    <out>/summary.json                   the campaign's result

and, from a finished campaign, what `ratchet report` (the DVC `report` stage) writes:

    reports/metrics.json   flat campaign figures (`dvc metrics show`)
    reports/rounds.csv     per-round net, CI, champion dev mean and diagnosed causes (a table)
    reports/campaign.md    the round table, the certification and the lineage, readable on any forge
    reports/rounds.png     per-round net with its dev CI (at the look's level alpha_k, not 95%)
    reports/champion.png   the champion's dev score per round, and its test certification
    reports/causes.png     diagnosed failure causes (owner) per round
    reports/families.png   per-family dev score, start vs champion

Plots are PNG images (matplotlib, Agg): they render with no network, in `dvc plots show` and on any forge.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, ValidationError

from components.evolution.gate import PromotedAs
from components.evolution.record import RoundRecord
from components.codes import CAUSE_OWNERS, Verdict
from components.errors import InputError
from components.evolution.localization import localization_notes
from components.io import atomic_write_bytes, atomic_write_json, read_json_object
from components.lazy import LazyModule

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
else:
    pd = LazyModule("pandas")  # the CLI prints round_rows without it (an unchanged rerun: flows/finished.py)

SCORE_COLS = ["item_id", "seed", "score", "success", "error"]


def round_dir(out: str | Path, round_no: int) -> Path:
    return Path(out) / "rounds" / f"r{round_no:02d}"


def write_csv(path: str | Path, df: pd.DataFrame) -> None:
    atomic_write_bytes(path, df.to_csv(index=False, lineterminator="\n").encode())


def write_json(path: str | Path, obj: Any) -> None:
    atomic_write_json(path, obj)


def ci_level(r: dict[str, Any] | RoundRecord) -> float | None:
    """The two-sided confidence of a round's dev CI: each look at dev spends alpha_k of the campaign's budget (not
    0.05), and a sequential gate decides at its deciding look's one-sided level p (a 1 - 2p interval)."""
    r = RoundRecord.of(r)
    seq = r.sequential.gate if r.sequential is not None else None
    if seq is not None and seq.looks > 1 and seq.per_look:
        return 1 - 2 * seq.per_look[-1].level
    alpha = (r.dev_look.alpha if r.dev_look else None) or (
        r.evaluation.gate.alpha if r.evaluation is not None else None
    )
    return None if alpha is None else 1 - alpha


def _pct(level: float | None) -> str:
    return "" if level is None else f"{100 * level:.4g}%"


def history(summary: dict[str, Any]) -> list[RoundRecord]:
    """summary.json's rounds, typed."""
    return [RoundRecord.of(r) for r in summary.get("history", [])]


_GATE_COLUMNS_NONE = dict.fromkeys(("net", "ci_lo", "ci_hi", "dev_base_mean", "dev_cand_mean"))  # a round not gated


def round_rows(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows for the per-round table the CLI prints (and campaign.md). `not_gated`: why a round that never reached
    the dev gate stopped where it did (the repair screen's figures, the validation problem, the meta-agent's
    failure, no plan left), which the lineage records and the table would otherwise leave blank."""
    rows = []
    for r in history(summary):
        g, rep, champ = r.gate, r.repair, r.champion_after
        rows.append(
            {
                "round": r.round,
                "owner": str(r.owner or "-"),
                "plan": _plan_text(r),
                "repair": f"{rep.repaired}/{rep.broken}" if rep else "-",
                "verdict": str(r.verdict),
                "net": g.net if g else None,
                "ci": (g.ci_lo, g.ci_hi) if g else None,
                "level": _pct(ci_level(r)) if g else "",
                "regressed": g.n_regressed if g else None,
                "reason": r.reason,
                "not_gated": "" if g else (r.reason if r.summary else "-"),  # without a plan, the plan column says why
                "champion": f"{champ.version} {champ.digest:.8}" if champ else " ",
            }
        )
    return rows


def _plan_text(r: RoundRecord) -> str:
    """The plan column: the plan's summary, said to be a retry from the pool or a promotion as cheaper."""
    text = r.summary or r.reason
    if r.retry is not None:
        text = f"retry of round {r.retry.of_round} (seeds {r.retry.seeds[0]}-{r.retry.seeds[-1]}): {text}"
    if r.promoted_as == PromotedAs.CHEAPER:
        text += " (promoted as cheaper)"
    return text


class TokensSummary(BaseModel):
    """summary.json's `tokens`: prompt tokens per episode on the test split of the champion, the start and the
    world's built-in packages (seed, all-skills, reference), and the rounds that promoted as cheaper."""

    model_config = ConfigDict(extra="forbid")
    split: str
    per_episode: dict[str, float | None]
    cheaper: list[int]


def tokens_line(tokens: TokensSummary) -> str:
    pe = tokens.per_episode
    fmt: Callable[[float | None], str] = lambda v: "-" if v is None else f"{v:,.0f}"  # noqa: E731
    others = ", ".join(f"{k} {fmt(pe[k])}" for k in ("seed", "all-skills", "reference") if k in pe)
    cheaper = ", ".join(str(x) for x in tokens.cheaper) or "none"
    return (
        f"Prompt tokens per episode on {tokens.split}: champion {fmt(pe.get('champion'))} (built-in packages: "
        f"{others}); promoted as cheaper: {cheaper}."
    )


class _Named(BaseModel):
    model_config = ConfigDict(extra="allow")
    version: str
    digest: str


class _Summary(BaseModel):
    """What the report reads of summary.json (the campaign writes more)."""

    model_config = ConfigDict(extra="allow")
    campaign: str
    champion: str
    champion_digest: str
    accepted: int
    rounds: int
    test: dict[str, Any] | None
    localization: dict[str, Any]
    history: list[RoundRecord]
    lineage: list[_Named]
    tokens: TokensSummary | None = None  # absent in summaries from before the cost objective


def read_summary(campaign_out: str | Path) -> dict[str, Any]:
    """A campaign's summary.json, checked for what a report reads: a damaged or foreign file is one line naming the
    field, before anything is written."""
    path = Path(campaign_out) / "summary.json"
    summary = read_json_object(path)
    try:
        _Summary.model_validate(summary)
    except ValidationError as e:
        first = e.errors()[0]
        raise InputError(f"{path}: {'.'.join(str(x) for x in first['loc']) or '-'}: {first['msg']}") from None
    return summary


def write_report(campaign_out: str | Path, out: str | Path) -> Path:
    """Tables and a plot from a finished campaign's summary.json."""
    summary = read_summary(campaign_out)
    _check_round_dirs(campaign_out, summary)
    out = Path(out)
    t, loc = summary["test"] or {}, summary["localization"]
    tokens = TokensSummary.model_validate(summary["tokens"]) if summary.get("tokens") else None
    metrics = _metrics(summary, t, loc, tokens)
    causes = _causes(Path(campaign_out), summary)
    table = _rounds_table(summary, causes)
    families = _families(Path(campaign_out), summary)  # every input read before the first write: none half-written
    md = _campaign_md(summary, t, loc, tokens)
    write_json(out / "metrics.json", metrics)
    write_csv(out / "rounds.csv", table)
    atomic_write_bytes(out / "campaign.md", "\n".join(md).encode())
    _plot_data(summary, table, causes, families, out / "plots")
    _plot(table, out / "rounds.png")
    _plot_champion(table, t, out / "champion.png")
    _plot_causes(causes, out / "causes.png")
    _plot_families(families, out / "families.png")
    return out


def _check_round_dirs(campaign_out: str | Path, summary: dict[str, Any]) -> None:
    """A round's columns come from its directory: a blank row would pass for "no data", so a missing one refuses."""
    for r in history(summary):
        rd = round_dir(campaign_out, r.round)
        if not rd.is_dir():
            raise InputError(
                f"{rd}: -: round {r.round} is in summary.json but its directory is missing; refusing "
                f"a report with blank rows (restore it, or rerun the campaign)"
            )


def _metrics(
    summary: dict[str, Any], t: dict[str, Any], loc: dict[str, Any], tokens: TokensSummary | None
) -> dict[str, Any]:
    """metrics.json: the test split's figures, promotions, localization accuracies and test tokens per episode."""
    metrics = {
        **{f"test_{k}": round(t[k], 6) for k in ("net", "ci_lo", "ci_hi", "base_mean", "champion_mean") if k in t},
        "accepted": summary["accepted"],
        "rounds": summary["rounds"],
        "localization_accuracy": loc.get("accuracy"),
        "outcome_only_accuracy": loc.get("outcome_only_accuracy"),
        "trace_rule_accuracy": loc.get("trace_rule_accuracy"),
    }
    if tokens is not None:
        metrics.update({f"test_tokens_{k.replace('-', '_')}": v for k, v in tokens.per_episode.items()})
    return metrics


def _rounds_table(summary: dict[str, Any], causes: pd.DataFrame) -> pd.DataFrame:
    """rounds.csv: one row per round (its gate's figures, blank when not gated), the champion's dev mean and the
    causes diagnosed."""
    rows = []
    for r in history(summary):
        g, champ = r.gate, r.champion_after
        rows.append(
            {
                "round": r.round,
                "verdict": str(r.verdict),
                "owner": str(r.owner or ""),
                **_GATE_COLUMNS_NONE,
                **(
                    {
                        "net": g.net,
                        "ci_lo": g.ci_lo,
                        "ci_hi": g.ci_hi,
                        "dev_base_mean": g.base_mean,
                        "dev_cand_mean": g.cand_mean,
                    }
                    if g
                    else {}
                ),
                "champion": champ.version if champ else "",
            }
        )
    table = pd.DataFrame(
        rows,
        columns=["round", "verdict", "owner", "net", "ci_lo", "ci_hi", "dev_base_mean", "dev_cand_mean", "champion"],
    )
    means = champion_means(history(summary))
    table["champion_dev_mean"] = [means[r.round] for r in history(summary)] if len(table) else []
    return table.join(causes, on="round") if len(causes.columns) else table


def _campaign_md(
    summary: dict[str, Any], t: dict[str, Any], loc: dict[str, Any], tokens: TokensSummary | None
) -> list[str]:
    """campaign.md's lines: the champion, the test split, tokens, localization, a row per round and the lineage."""
    md = [
        f"# Campaign {summary['campaign']}",
        "",
        f"Champion **{summary['champion']}** (`{summary['champion_digest'][:12]}`), {summary['accepted']} promotion(s) "
        f"in {summary['rounds']} round(s).",
        "",
    ]
    if summary.get("stopped"):
        md += [f"Stopped early: {summary['stopped']}.", ""]
    if t:
        md += [
            f"Test split (touched once): start {t['base_mean']:.3f} -> champion {t['champion_mean']:.3f}, "
            f"net {t['net']:+.3f}, 95% CI [{t['ci_lo']:+.3f}, {t['ci_hi']:+.3f}], {t['n_items']} items.",
            "",
        ]
    if tokens is not None:
        md += [tokens_line(tokens), ""]
    if loc.get("accuracy") is not None:
        rule = loc.get("trace_rule_accuracy")
        md += [
            f"Diagnosis localization {loc['accuracy']:.1%} of every scored failure (n={loc['n']}, compound "
            f"included) vs trace rule {'-' if rule is None else f'{rule:.1%}'}, outcome-only "
            f"{loc['outcome_only_accuracy']:.1%}.",
            "",
        ]
    notes = localization_notes(loc)
    md += [line[0].upper() + line[1:] + "." for line in notes] + ([""] if notes else [])
    md += [
        "| round | owner | plan | repair fixed/broke | verdict | net | dev CI (level: the look's alpha_k) | "
        "regressed | champion |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in round_rows(summary):
        ci = f"[{row['ci'][0]:+.3f}, {row['ci'][1]:+.3f}] {row['level']}" if row["net"] is not None else ""
        net = f"{row['net']:+.3f}" if row["net"] is not None else f"not gated: {row['not_gated']}"
        md.append(
            f"| {row['round']} | {row['owner']} | {row['plan']} | {row['repair']} | {row['verdict']} | {net} | "
            f"{ci} | {'' if row['regressed'] is None else row['regressed']} | {row['champion']} |"
        )
    md += ["", "Lineage: " + " -> ".join(f"{v['version']} `{v['digest'][:12]}`" for v in summary["lineage"]), ""]
    return md


def _plot_data(
    summary: dict[str, Any], table: pd.DataFrame, causes: pd.DataFrame, families: pd.DataFrame, out: Path
) -> None:
    """The figures as data for `dvc plots` (dvc.yaml), one tidy CSV each with fixed columns, so `dvc plots diff`
    overlays two experiments' curves: the gate per gated round (net, CI, the CI's level, verdict), the champion's
    dev mean per gated round, diagnosed causes per round (every owner a column, 0 when absent), per-family dev means."""
    levels = {r.round: ci_level(r) for r in history(summary) if r.gate is not None}
    gated = table.dropna(subset=["net"])
    gate = pd.DataFrame(
        {
            "round": gated["round"],
            "net": gated["net"],
            "ci_lo": gated["ci_lo"],
            "ci_hi": gated["ci_hi"],
            "ci_level": [levels.get(r) for r in gated["round"]],
            "accepted": (gated["verdict"] == Verdict.ACCEPT).astype(int),
            "verdict": gated["verdict"],
        }
    )
    champ = pd.DataFrame({"round": gated["round"], "champion_dev_mean": gated["champion_dev_mean"]})
    rounds = [r.round for r in history(summary)]
    cause = pd.DataFrame(
        {
            "round": rounds,
            **{
                o.value: [
                    int(causes.at[r, f"causes_{o}"]) if r in causes.index and f"causes_{o}" in causes.columns else 0
                    for r in rounds
                ]
                for o in CAUSE_OWNERS
            },
        }
    )
    fam = (
        families.rename_axis("family").reset_index()
        if len(families)
        else pd.DataFrame(columns=["family", "start", "champion"])
    )
    for name, df in (("gate.csv", gate), ("champion.csv", champ), ("causes.csv", cause), ("families.csv", fam)):
        write_csv(out / name, df.reset_index(drop=True))


def _read_csv(path: Path, **kw: Any) -> pd.DataFrame:
    """A campaign file the report reads: damaged (a column missing, not a table), one line naming it."""
    try:
        return pd.read_csv(path, **kw)
    except (ValueError, UnicodeDecodeError) as e:  # pandas' parser and usecols errors are ValueErrors
        raise InputError(f"{path}: -: not a readable table ({str(e).strip().splitlines()[0]})") from None


def champion_means(rounds: list[RoundRecord]) -> dict[int, float | None]:
    """The champion's dev mean after each gated round (None for a round not gated): the mean it was promoted on
    (its promoting look's cand_mean), unchanged until the next promotion; before any, the start's mean at the first
    gated look. A rejection re-measures the champion on its own look's cells (another number of seeds when the
    gate stopped early): reporting that mean dropped the champion's score with no change of champion."""
    out: dict[int, float | None] = {}
    held: float | None = None
    for r in sorted(rounds, key=lambda x: x.round):
        g = r.gate
        if g is None:
            out[r.round] = None
            continue
        if r.accepted:
            held = g.cand_mean
        elif held is None:
            held = g.base_mean
        out[r.round] = held
    return out


def _causes(campaign_out: Path, summary: dict[str, Any]) -> pd.DataFrame:
    """Diagnosed failures per round by owner (E, W, rho, C, none), from each round's findings.csv."""
    counts = {}
    for r in history(summary):
        f = campaign_out / "rounds" / f"r{r.round:02d}" / "findings.csv"
        if f.exists():
            counts[r.round] = _read_csv(f, usecols=["owner"], keep_default_na=False)["owner"].value_counts()
    if not counts:
        return pd.DataFrame()
    df = pd.DataFrame(counts).T.fillna(0).astype(int).sort_index()
    order = [o.value for o in CAUSE_OWNERS if o in df.columns] + sorted(set(df.columns) - set(CAUSE_OWNERS))
    return df[order].add_prefix("causes_")


def _families(campaign_out: Path, summary: dict[str, Any]) -> pd.DataFrame:
    """Mean dev score per task family: the starting package (first gated round's parent) vs the champion (the last
    gated round's winner). Families come from the benchmark's tasks.csv."""
    gated = [r for r in history(summary) if r.gate is not None and r.evaluation is not None]
    if not gated:
        return pd.DataFrame()
    first, last = gated[0], gated[-1]
    assert first.evaluation is not None  # (gated: filtered above)
    tasks = Path(first.evaluation.benchmark) / "tasks.csv"  # relative paths: from the project root, as recorded
    start_f = campaign_out / "rounds" / f"r{first.round:02d}" / "dev_base.csv"
    champ_f = campaign_out / "rounds" / f"r{last.round:02d}" / ("dev_cand.csv" if last.accepted else "dev_base.csv")
    if not (tasks.exists() and start_f.exists() and champ_f.exists()):
        return pd.DataFrame()
    fam = _read_csv(tasks, usecols=["task_id", "family"], dtype={"task_id": str}).rename(columns={"task_id": "item_id"})

    def by_family(f: Path) -> pd.Series:
        scores = _read_csv(f, usecols=["item_id", "score"], dtype={"item_id": str})
        return scores.merge(fam, on="item_id").groupby("family")["score"].mean()

    return pd.DataFrame({"start": by_family(start_f), "champion": by_family(champ_f)})


def _figure(width: float = 7, height: float = 3.2) -> tuple[ModuleType, Figure, Axes]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt, *plt.subplots(figsize=(width, height))


def _save(plt: ModuleType, fig: Figure, path: Path) -> None:
    import io

    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, metadata={"Software": None})
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())


def _empty(ax: Axes, what: str) -> None:
    ax.text(0.5, 0.5, f"no {what} in this campaign", ha="center", va="center", transform=ax.transAxes)
    ax.set_axis_off()


def _plot_champion(table: pd.DataFrame, test: dict[str, Any], path: Path) -> None:
    import matplotlib.ticker

    plt, fig, ax = _figure()
    rows = table.dropna(subset=["champion_dev_mean"]) if "champion_dev_mean" in table else table.iloc[0:0]
    if len(rows):
        ax.step(rows["round"], rows["champion_dev_mean"], where="post", color="tab:blue", label="champion (dev)")
        ax.scatter(
            rows["round"],
            rows["champion_dev_mean"],
            c=["tab:green" if v == Verdict.ACCEPT else "tab:grey" for v in rows["verdict"]],
            zorder=3,
        )
        if test:
            ax.axhline(test["base_mean"], color="tab:red", linestyle=":", label=f"start (test) {test['base_mean']:.3f}")
            ax.axhline(
                test["champion_mean"],
                color="tab:green",
                linestyle="--",
                label=f"champion (test) {test['champion_mean']:.3f}",
            )
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        ax.set_xlabel("round")
        ax.set_ylabel("mean score")
        ax.legend(loc="lower right", fontsize=8)
    else:
        _empty(ax, "gated round")
    ax.set_title("champion score per round (green: promoted)")
    _save(plt, fig, path)


def _plot_causes(causes: pd.DataFrame, path: Path) -> None:
    plt, fig, ax = _figure()
    if len(causes):
        bottom = None
        for col in causes.columns:
            ax.bar(causes.index, causes[col], bottom=bottom, label=col.removeprefix("causes_"))
            bottom = causes[col] if bottom is None else bottom + causes[col]
        ax.set_xticks(list(causes.index))
        ax.set_xlabel("round")
        ax.set_ylabel("failed train episodes")
        ax.legend(title="owner", fontsize=8)
    else:
        _empty(ax, "diagnosis")
    ax.set_title("diagnosed failure causes per round")
    _save(plt, fig, path)


def _plot_families(fam: pd.DataFrame, path: Path) -> None:
    import numpy as np

    plt, fig, ax = _figure()
    if len(fam):
        x = np.arange(len(fam))
        ax.bar(x - 0.2, fam["start"], width=0.4, label="start", color="tab:grey")
        ax.bar(x + 0.2, fam["champion"], width=0.4, label="champion", color="tab:green")
        ax.set_xticks(x, fam.index)
        ax.set_ylim(0, 1)
        ax.set_ylabel("mean dev score")
        ax.legend(fontsize=8)
    else:
        _empty(ax, "gated round")
    ax.set_title("per-family dev score: start vs champion")
    _save(plt, fig, path)


def _plot(table: pd.DataFrame, path: Path) -> None:
    import io

    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.2))
    gated = table.dropna(subset=["net"])
    if len(gated):
        err = [gated["net"] - gated["ci_lo"], gated["ci_hi"] - gated["net"]]
        colors = ["tab:green" if v == Verdict.ACCEPT else "tab:red" for v in gated["verdict"]]
        ax.errorbar(gated["round"], gated["net"], yerr=err, fmt="none", ecolor="grey", capsize=3)
        ax.scatter(gated["round"], gated["net"], c=colors, zorder=3)
    ax.axhline(0, color="black", linewidth=0.8)
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_xlabel("round")
    ax.set_ylabel("dev net (candidate - champion)")
    ax.set_title("held-out gate per round (green: accepted), CI at each look's alpha_k")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, metadata={"Software": None})
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
