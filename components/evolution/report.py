"""What a round and a campaign leave on disk (besides the lineage): artifacts a user or a reproduction can read.

    <out>/rounds/r<N>/train/             the diagnosed evaluation (scores, traces, hidden-cause sidecar)
    <out>/rounds/r<N>/diagnosis.json     evidence packets;  findings.csv  one row per failed episode
    <out>/rounds/r<N>/plan.json          validation.json   repair.json   repair_items.csv
    <out>/rounds/r<N>/gate.json          gate_items.csv    dev_base.csv  dev_cand.csv
    <out>/rounds/r<N>/round.json         the round's record (what the lineage says, with paths)
    <out>/summary.json                   the campaign's result

and, from a finished campaign, what `ratchet report` (the DVC `report` stage) writes:

    reports/metrics.json   flat campaign figures (`dvc metrics show`)
    reports/rounds.csv     per-round net and CI (`dvc plots show`)
    reports/campaign.md    the round table, the certification and the lineage, readable on any forge
    reports/rounds.png     per-round net with its 95% CI
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from components.io import atomic_write_bytes, atomic_write_json

SCORE_COLS = ["item_id", "seed", "score", "success", "error"]


def round_dir(out: str | Path, round_no: int) -> Path:
    return Path(out) / "rounds" / f"r{round_no:02d}"


def write_csv(path: str | Path, df: pd.DataFrame) -> None:
    atomic_write_bytes(path, df.to_csv(index=False, lineterminator="\n").encode())


def write_json(path: str | Path, obj: Any) -> None:
    atomic_write_json(path, obj)


def round_rows(summary: dict) -> list[dict]:
    """Rows for the per-round table the CLI prints."""
    rows = []
    for r in summary.get("history", []):
        g = r.get("gate") or {}
        rep = r.get("repair") or {}
        rows.append({
            "round": r["round"], "owner": r.get("owner") or "-", "plan": r.get("summary") or r.get("reason", "-"),
            "repair": f"{rep.get('repaired', '-')}/{rep.get('broken', '-')}" if rep else "-",
            "verdict": r["verdict"], "net": g.get("net"), "ci": (g.get("ci_lo"), g.get("ci_hi")) if g else None,
            "regressed": g.get("n_regressed"), "reason": r.get("reason", ""),
            "champion": "{version} {digest:.8}".format(**(r.get("child") or r.get("parent") or {"version": "", "digest": ""})),
        })
    return rows


def write_report(campaign_out: str | Path, out: str | Path) -> Path:
    """Tables and a plot from a finished campaign's summary.json."""
    import json

    summary = json.loads((Path(campaign_out) / "summary.json").read_text())
    out = Path(out)
    t, loc = summary["test"] or {}, summary["localization"]
    write_json(out / "metrics.json", {
        **{f"test_{k}": round(t[k], 6) for k in ("net", "ci_lo", "ci_hi", "base_mean", "champion_mean") if k in t},
        "accepted": summary["accepted"], "rounds": summary["rounds"],
        "localization_accuracy": loc.get("accuracy"), "outcome_only_accuracy": loc.get("outcome_only_accuracy")})
    rows = []
    for r in summary["history"]:
        g = r.get("gate") or {}
        rows.append({"round": r["round"], "verdict": r["verdict"], "owner": r.get("owner", ""),
                     "net": g.get("net"), "ci_lo": g.get("ci_lo"), "ci_hi": g.get("ci_hi"),
                     "dev_base_mean": g.get("base_mean"), "dev_cand_mean": g.get("cand_mean"),
                     "champion": (r.get("child") or r.get("parent") or {}).get("version", "")})
    table = pd.DataFrame(rows, columns=["round", "verdict", "owner", "net", "ci_lo", "ci_hi", "dev_base_mean",
                                        "dev_cand_mean", "champion"])
    write_csv(out / "rounds.csv", table)
    md = [f"# Campaign {summary['campaign']}", "",
          f"Champion **{summary['champion']}** (`{summary['champion_digest'][:12]}`), {summary['accepted']} promotion(s) "
          f"in {summary['rounds']} round(s).", ""]
    if summary.get("stopped"):
        md += [f"Stopped early: {summary['stopped']}.", ""]
    if t:
        md += [f"Test split (touched once): start {t['base_mean']:.3f} -> champion {t['champion_mean']:.3f}, "
               f"net {t['net']:+.3f}, 95% CI [{t['ci_lo']:+.3f}, {t['ci_hi']:+.3f}], {t['n_items']} items.", ""]
    if loc.get("accuracy") is not None:
        md += [f"Diagnosis localization {loc['accuracy']:.1%} vs outcome-only {loc['outcome_only_accuracy']:.1%} "
               f"(n={loc['n']}).", ""]
    md += ["| round | owner | plan | verdict | net | 95% CI | regressed | champion |", "|---|---|---|---|---|---|---|---|"]
    for r in round_rows(summary):
        ci = f"[{r['ci'][0]:+.3f}, {r['ci'][1]:+.3f}]" if r["net"] is not None else ""
        net = f"{r['net']:+.3f}" if r["net"] is not None else ""
        md.append(f"| {r['round']} | {r['owner']} | {r['plan']} | {r['verdict']} | {net} | {ci} | "
                  f"{'' if r['regressed'] is None else r['regressed']} | {r['champion']} |")
    md += ["", "Lineage: " + " -> ".join(f"{v['version']} `{v['digest'][:12]}`" for v in summary["lineage"]), ""]
    atomic_write_bytes(out / "campaign.md", "\n".join(md).encode())
    _plot(table, out / "rounds.png")
    return out


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
        colors = ["tab:green" if v == "accept" else "tab:red" for v in gated["verdict"]]
        ax.errorbar(gated["round"], gated["net"], yerr=err, fmt="none", ecolor="grey", capsize=3)
        ax.scatter(gated["round"], gated["net"], c=colors, zorder=3)
    ax.axhline(0, color="black", linewidth=0.8)
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_xlabel("round")
    ax.set_ylabel("dev net (candidate - champion)")
    ax.set_title("held-out gate per round (green: accepted), 95% CI")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, metadata={"Software": None})
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
