"""Reproduce a promotion: re-run the round's held-out gate on the recorded bytes and seeds, compare everything.

1. find the round that promoted version M<k> (from the lineage, or from an MLflow round run's tags)
2. refuse up front unless the parent version, the promoted version and the benchmark on disk have exactly the
   digests the round recorded (check out the git + DVC commit first: `git checkout <rev> && dvc checkout`)
3. evaluate parent and candidate on the recorded split with the recorded seeds, model and turn limit (a
   sequential gate: the cells of the looks it used) and re-run the gate's looks
4. compare the per-episode and per-item tables byte for byte with what the round wrote, and the verdict
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from pydantic import ValidationError

from components.codes import Verdict
from components.errors import InputError
from components.evolution.gate import SequentialDesign, gate, sequential_gate
from components.evolution.lineage import Lineage
from components.io import confined
from components.evolution.record import Evaluation, RoundRecord, VersionRef
from components.evolution.validate import fired
from components.memory.package import digest
from components.runtime.evaluate import run_shard, seed_map_hash
from components.worlds import load_benchmark
from components.worlds.base import Benchmark


class ReproduceError(InputError):
    pass


@dataclass
class Reproduction:
    version: str
    round: int
    identical: bool
    verdict_matches: bool
    differences: list[str] = field(default_factory=list)
    n_items: int = 0
    n_episodes: int = 0
    recorded: dict = field(default_factory=dict)
    recomputed: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.identical and self.verdict_matches


def find_round(
    campaign: str | Path, version: str | None = None, run_id: str | None = None, tracking_uri: str | None = None
) -> tuple[Path, RoundRecord]:
    """(campaign dir, lineage record) for a promoted version, or for an MLflow round run id."""
    if run_id:
        from mlflow import MlflowClient
        from mlflow.exceptions import MlflowException

        try:
            tags = MlflowClient(tracking_uri=tracking_uri).get_run(run_id).data.tags
        except MlflowException as e:
            raise ReproduceError(f"--run-id: {run_id}: not found in the MLflow store ({e.message[:120]})") from None
        if tags.get("ratchet.kind") != "round" or not tags.get("ratchet.version"):
            raise ReproduceError(f"--run-id: {run_id}: not a round run that promoted a version")
        campaign, version = Path(tags["ratchet.campaign_out"]), tags["ratchet.version"]
    campaign = Path(campaign)
    lineage = Lineage(campaign / "lineage")
    if not lineage.log.exists():
        raise ReproduceError(f"{lineage.log}: -: no lineage here (check out the commit and `dvc checkout` first)")
    rec = next(
        (
            r
            for r in lineage.records()
            if r.get("verdict") == Verdict.ACCEPT and (r.get("child") or {}).get("version") == version
        ),
        None,
    )
    if rec is None:
        _altered(campaign, lineage, version)
        promoted = [r["child"]["version"] for r in lineage.records() if r.get("verdict") == Verdict.ACCEPT]
        raise ReproduceError(
            f"{lineage.log}: version: {version!r} was not promoted here (promoted: {', '.join(promoted) or 'none'})"
        )
    try:
        typed = RoundRecord.of(rec)
    except ValidationError as e:
        where = ".".join(str(x) for x in e.errors()[0]["loc"]) or "-"
        raise ReproduceError(
            f"{lineage.log}: round {rec.get('round')}: {where}: the record is damaged ({e.errors()[0]['msg']})"
        ) from None
    _places(campaign, typed)  # before anything is said or read on the record's say-so
    return campaign, typed


def _versions(lineage: Lineage, rec: RoundRecord) -> tuple[VersionRef, VersionRef]:
    """The (parent, promoted) versions a promotion's record names."""
    if rec.parent is None or rec.child is None:
        raise ReproduceError(
            f"{lineage.log}: round {rec.round}: {'parent' if rec.parent is None else 'child'}: not "
            "recorded; the record is damaged"
        )
    return rec.parent, rec.child


def _places(campaign: Path, rec: RoundRecord) -> tuple[Path, Path, Path]:
    """The parent's and the promoted version's directories and the round's, as the record names them, each confined
    to where it belongs in the campaign: a tampered name is refused before anything is read (or hashed)."""
    lineage = Lineage(campaign / "lineage")
    parent, child = _versions(lineage, rec)
    return (
        lineage.version_dir(parent.version, f"round {rec.round}: parent.version"),
        lineage.version_dir(child.version, f"round {rec.round}: child.version"),
        confined(campaign / "rounds", Path(rec.round_dir).name, f"{lineage.log}: round {rec.round}: round_dir"),
    )


def _altered(campaign: Path, lineage: Lineage, version: str | None) -> None:
    """Refuse, saying so, when the lineage no longer says what the campaign wrote about `version`: only an accept
    commits a version, so a record naming it as its child with another verdict, or a round's round.json recording
    its promotion where the lineage has none, was edited after the fact."""
    for r in lineage.records():
        if (r.get("child") or {}).get("version") == version and r.get("round") and r.get("verdict") != Verdict.ACCEPT:
            raise ReproduceError(
                f"{lineage.log}: round {r['round']}: the record was altered: it names {version} as "
                f"its promoted version but its verdict is {r.get('verdict')!r} (only an accept "
                "commits a version)"
            )
    for f in sorted((campaign / "rounds").glob("r*/round.json")):
        try:
            rd = json.loads(f.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if (
            isinstance(rd, dict)
            and rd.get("verdict") == Verdict.ACCEPT
            and (rd.get("child") or {}).get("version") == version
        ):
            raise ReproduceError(
                f"{lineage.log}: round {rd.get('round')}: the record was altered: {f.relative_to(campaign)} "
                f"records {version}'s promotion, the lineage does not"
            )


def reproduce(campaign: str | Path, rec: RoundRecord | dict) -> Reproduction:
    campaign, rec = Path(campaign), RoundRecord.of(rec)
    lineage = Lineage(campaign / "lineage")
    parent_dir, child_dir, rd = _places(campaign, rec)
    parent, child = _versions(lineage, rec)
    ev = rec.evaluation
    if ev is None:
        raise ReproduceError(
            f"{lineage.log}: round {rec.round}: evaluation: not recorded (campaign from an older Ratchet)"
        )
    old, mechanism = rec.gate, rec.mechanism
    if old is None or mechanism is None:
        raise ReproduceError(
            f"{lineage.log}: round {rec.round}: {'gate' if old is None else 'mechanism'}: not "
            "recorded; the record is damaged"
        )
    bench_dir = Path(ev.benchmark)
    if bench_dir.is_dir():  # a benchmark, or refused before its bytes are hashed (a record may name any directory)
        load_benchmark(bench_dir)
    # 2. the bytes on disk must be the recorded bytes, or nothing is re-run
    _same_bytes(
        (
            ("parent version", parent_dir, parent.digest),
            ("promoted version", child_dir, child.digest),
            ("benchmark", bench_dir, rec.benchmark_digest or ""),
        )
    )
    bench = load_benchmark(bench_dir)
    ids, seeds = bench.ids(ev.split), list(ev.seeds)
    if seed_map_hash(ids, seeds) != rec.seed_map_hash:
        raise ReproduceError(f"{bench_dir}: seed map hash differs from the record (split or seeds changed)")
    # 3. re-run the gate's evaluations (a sequential gate: the cells of the looks it used, then the same looks)
    base, cand, verdict, per_item = _rerun_gate(rec, ev, bench, parent_dir, child_dir, mechanism)
    # 4. compare with what the round recorded
    diffs = _table_diffs(
        rd, (("dev_base.csv", base.scores), ("dev_cand.csv", cand.scores), ("gate_items.csv", per_item))
    )
    same_verdict = (
        old.accept == verdict.accept
        and old.n_improved == verdict.n_improved
        and old.n_regressed == verdict.n_regressed
        and abs(old.net - verdict.net) < 1e-12
        and abs(old.ci_lo - verdict.ci_lo) < 1e-12
        and abs(old.ci_hi - verdict.ci_hi) < 1e-12
    )
    if not same_verdict:
        diffs.append(
            f"verdict: recorded accept={old.accept} net={old.net:+.6f} CI [{old.ci_lo:+.6f}, "
            f"{old.ci_hi:+.6f}], recomputed accept={verdict.accept} net={verdict.net:+.6f} "
            f"CI [{verdict.ci_lo:+.6f}, {verdict.ci_hi:+.6f}]"
        )
    return Reproduction(
        child.version,
        rec.round,
        identical=not any(not d.startswith("verdict") for d in diffs),
        verdict_matches=same_verdict,
        differences=diffs,
        n_items=len(per_item),
        n_episodes=len(base.scores) + len(cand.scores),
        recorded=old.as_dict(),
        recomputed=verdict.as_dict(),
    )


def _same_bytes(places: tuple[tuple[str, Path, str], ...]) -> None:
    """Refuse unless each (what, directory, recorded digest) is on disk with the recorded bytes."""
    for what, path, want in places:
        if not path.is_dir():
            raise ReproduceError(f"{path}: -: {what} is missing (run `dvc checkout` at the recording commit)")
        have = digest(path)
        if have != want:
            raise ReproduceError(
                f"{path}: digest mismatch: the {what} on disk is {have[:16]}, the record says {want[:16]}"
            )


def _rerun_gate(rec: RoundRecord, ev: Evaluation, bench: Benchmark, parent_dir: Path, child_dir: Path, mechanism: str):
    """Both arms re-run on the cells the gate saw, and the gate's verdict and per-item table recomputed from them."""
    ids, seeds = bench.ids(ev.split), list(ev.seeds)
    seq = ev.sequential
    design = SequentialDesign(seq.looks, seq.spending, seq.by) if seq is not None else SequentialDesign()
    groups = design.groups(ids, seeds)[: seq.looks_used] if seq is not None and design.on else [(ids, seeds)]
    run_items = [i for i in ids if i in {x for its, _ in groups for x in its}]
    run_seeds = sorted({s for _, sds in groups for s in sds})
    base = run_shard(parent_dir, bench, run_items, run_seeds, ev.model, ev.model_cfg, ev.max_turns)
    cand = run_shard(child_dir, bench, run_items, run_seeds, ev.model, ev.model_cfg, ev.max_turns)
    if design.on:
        upto = [
            (set().union(*(its for its, _ in groups[:g])), set().union(*(sds for _, sds in groups[:g])))
            for g in range(1, len(groups) + 1)
        ]
        tr = cand.traces
        fired_by_look = [fired(tr[tr["item_id"].isin(its) & tr["seed"].isin(sds)], mechanism) for its, sds in upto]
        verdict, per_item, _ = sequential_gate(
            base.scores, cand.scores, ev.gate, design, ids, seeds, fired_by_look=fired_by_look
        )
        if verdict is None:
            raise ReproduceError(f"round {rec.round}: the recorded looks do not reach a verdict")
    else:
        verdict, per_item = gate(base.scores, cand.scores, ev.gate, mechanism_fired=fired(cand.traces, mechanism))
    return base, cand, verdict, per_item


def _table_diffs(rd: Path, tables: tuple[tuple[str, pd.DataFrame], ...]) -> list[str]:
    """How each recomputed table differs from the one the round wrote (nothing: the same bytes)."""
    diffs: list[str] = []
    for name, df in tables:
        recorded = (rd / name).read_bytes() if (rd / name).exists() else None
        now = df.to_csv(index=False, lineterminator="\n").encode()
        if recorded is None:
            diffs.append(f"{rd / name}: missing")
        elif recorded != now:
            diffs.append(f"{name}: " + _table_diff(recorded, now, df))
    return diffs


def _table_diff(recorded: bytes, now: bytes, df: pd.DataFrame) -> str:
    """Which rows differ, read as the text both tables are (a CSV written by the same writer): an edited row is one
    row, never every row an empty cell reads differently in (pandas took "" for NaN on one side only)."""
    old, new = recorded.decode("utf-8", errors="replace").splitlines(), now.decode("utf-8").splitlines()
    if not old or old[0] != new[0] or len(old) != len(new):
        return f"shape differs ({max(len(old) - 1, 0)} rows recorded, {len(new) - 1} recomputed)"
    keys = [c for c in ("item_id", "seed") if c in df.columns]
    bad = [i for i in range(1, len(new)) if old[i] != new[i]]
    where = ", ".join("#".join(str(df.iloc[i - 1][k]) for k in keys) for i in bad[:5])
    return f"{len(bad)} row(s) differ: {where}" if bad else "formatting differs (values equal)"
