"""`ratchet evidence`: the campaign memory (why a change is there, what is contested, revoke)."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

# The usage errors typer raises are its vendored click's (typer 0.26+), not the `click` package's. Typer 0.29 gives
# public names to BadParameter, Abort and Exit only: UsageError, MissingParameter and NoArgsIsHelpError have none
# (asked for in fastapi/typer#1867, closed), so they are read from the vendored module, here alone.
from components.errors import InputError

# the gate command's defaults are GateConfig's (this import is light: numpy and pandas load on first use)
from flows.cli.app import evidence_app, out

# -- campaign memory -------------------------------------------------------------------------------------------

DB_HELP = (
    "the evidence graph: a path or a SQLAlchemy URL (default: evidence.db in params.yaml, else .ratchet/evidence.db)"
)


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
            raise InputError(
                f"{where}: --db: not an evidence graph (a file or database a campaign did not write); left as it is"
            )
        # a graph this process may not write (read-only file, directory or mount) is still read
        if not (os.access(local, os.W_OK) and os.access(Path(local).resolve().parent, os.W_OK)):
            if write:
                raise InputError(
                    f"{where}: --db: the evidence graph is read-only here (its file or directory "
                    "cannot be written); nothing revoked"
                )
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
                return (
                    con.execute(
                        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'evidence_node'"
                    ).fetchone()
                    is not None
                )
        except sqlite3.Error as e:
            if damage(e):
                raise damaged_graph(path, str(e)) from None
            continue
    return False


@evidence_app.command("why")
def evidence_why(
    ref: Annotated[
        str, typer.Argument(help="a version (M3), a package digest, a card path (em/procedure/x.md) or a node id")
    ],
    campaign: Annotated[
        Optional[str],
        typer.Option(
            help="the campaign that made the version: its output directory "
            "(the campaign itself: its lineage and the figures it "
            "recorded), or a name (any campaign of that name); default: "
            "campaign.out of params.yaml when the graph holds it, else "
            "any"
        ),
    ] = None,
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
            raise InputError(
                f"{ref}: no promotion in the evidence graph made this version or card"
                + (f" (campaign {campaign})" if campaign else "")
            )
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
    kind: Annotated[
        Optional[str], typer.Option(help="only this kind (source, run, claim, artifact, decision, question)")
    ] = None,
    benchmark: Annotated[
        Optional[str],
        typer.Option(
            help="--open: the current benchmark digest (default: that of benchmark.out in params.yaml, when it exists)"
        ),
    ] = None,
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
            out.print(
                f"{n.id} was already revoked ({before['reason'][:80]}); this reason is kept with it "
                f"({len(reasons)} reasons); nothing newly flagged",
                highlight=False,
                markup=False,
            )
            return
    out.print(
        f"revoked {n.id} ({n.kind}: {n.content[:80]}); {len(flagged)} derived node(s) flagged",
        highlight=False,
        markup=False,
    )
    for f in sorted(flagged):
        out.print(f"  flagged {f}", highlight=False, markup=False)
