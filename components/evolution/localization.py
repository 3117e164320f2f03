"""Diagnosis scoring: how often the diagnoser's owner matches the hidden counterfactual cause.

This is the only code that reads the hidden-cause sidecar (`_hidden/causes.csv`, written by
`components.models.counterfactual`). Every labelled failed episode is scored, compound ones included; an episode the
diagnoser calls `unknown` counts as a miss. An owner is right on a single-cause episode when it is the cause, and on a
compound one only when its switch is part of a minimal set of switches (two or three; `components.models.counterfactual`)
that fixes the episode (one that takes all four fixes has no such set: no single owner is right there). Every baseline,
the constant guess too, is scored by the same rule. Figures:

    n, coverage         labelled failed episodes; the share the diagnoser did not call `unknown`
    accuracy            share of all n where its owner is right
    single_accuracy     the same over single-cause episodes only (for reference)
    compound            n, coverage, accuracy, no_fix (episodes no set of up to three fixes), and `constant`: what the best single
                        owner named on every compound episode would get (fitted on those very episodes: an upper bound)
    baselines           each fitted on other labels (train, or the other half of the items) and scored on these:
        constant_accuracy       one owner for every episode
        outcome_only_accuracy   the best owner per outcome (the episode's score)
        trace_rule_accuracy     the best owner per pattern of trace signals (`components.evolution.trace_rule`):
                                blocking, rule refusal, unconfirmed write, finish with work pending, checker bounce,
                                unfinished; the three-line rule where the fit saw no such pattern
        three_line_accuracy     the three-line rule itself, unfitted
        trace_rule_no_refusal_accuracy  the trace rule fitted and scored with the rule-refusal signal blanked: what
                                it gets from a world whose refusals say nothing (or that refuses nothing)
    ceiling             the share of n that has a right answer at all (compound episodes no set of up to three fixes have none)
    margin              accuracy - trace_rule_accuracy
    checks, passes      coverage >= MIN_COVERAGE, accuracy >= MIN_ACCURACY, margin >= MIN_MARGIN
    per_owner, confusion  truth -> predicted counts
    scored, unlabelled, unscored, diagnosed, unattributed   `attribution`: where no counterfactual exists (a world
                        without fault switches) nothing is scored, and accuracy is None (unscored), never 0 or 100%
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
from pydantic import BaseModel, ConfigDict

from components.codes import Owner
from components.defaults import MAX_TURNS
from components.evolution.trace_rule import Signals, from_pattern, signals_frame, three_line
from components.models.counterfactual import UNLABELLED as UNLABELLED_CAUSE
from components.runtime.confirm import Targets
from components.runtime.evaluate import HIDDEN, EvalTables

if TYPE_CHECKING:  # the package and world modules are imported where they are used
    from components.memory.package import MemoryPackage
    from components.worlds import Benchmark

OWNER_OF = {
    Owner.NONE.value: Owner.EXTERNAL.value
}  # the diagnoser says "none" (owner ∅) where the hidden label says "external"
LABEL_OWNERS = (Owner.E, Owner.W, Owner.RHO, Owner.C, Owner.EXTERNAL)  # the hidden labels' single causes, in tie order
SINGLE = tuple(o.value for o in LABEL_OWNERS)
COMPOUND = "compound"
UNKNOWN = Owner.UNKNOWN.value
# the bars a row must clear (issue 24): judged on enough of the failures, right often, and well above a glance
MIN_COVERAGE, MIN_ACCURACY, MIN_MARGIN = 0.5, 0.85, 0.10


class Key(StrEnum):
    """What a fitted guess looks at."""

    CONSTANT = "constant"
    OUTCOME = "outcome"
    PATTERN = "pattern"


class Guess(BaseModel):
    """A fitted guess: the owner right most often per key value on the fitting episodes, and a fallback."""

    model_config = ConfigDict(frozen=True)
    key: Key
    by_key: dict[str, Owner] = {}
    default: Owner = Owner.E

    def predict(self, frame: pd.DataFrame) -> pd.Series:
        if self.key is Key.CONSTANT:
            return pd.Series(self.default.value, index=frame.index, dtype=object)
        fallback: Callable[[str], str] = (
            (lambda k: three_line(from_pattern(k)).value) if self.key is Key.PATTERN else (lambda k: self.default.value)
        )
        return frame[self.key.value].map(lambda k: self.by_key[k].value if k in self.by_key else fallback(k))


class Baselines(BaseModel):
    """The simple guesses the diagnoser is compared with, fitted on one set of labelled episodes."""

    model_config = ConfigDict(frozen=True)
    constant: Guess
    outcome: Guess
    trace_rule: Guess
    trace_rule_no_refusal: Guess


def read_hidden_causes(eval_dir: str | Path) -> pd.DataFrame:
    return pd.read_csv(
        Path(eval_dir) / HIDDEN / "causes.csv", dtype={"item_id": str, "cause": str, "fired": str, "fixing_sets": str}
    )


def _eid(df: pd.DataFrame, suffix: str = "") -> pd.DataFrame:
    return df.assign(episode_id=df["item_id"].astype(str) + "#" + df["seed"].astype(str) + suffix)


def _needed(row: dict[str, Any]) -> frozenset[str]:
    """The owners whose naming is right: the cause; for a compound episode, every member of a minimal set that fixes
    it."""
    if row["cause"] != COMPOUND:
        return frozenset({row["cause"]})
    sets = row.get("fixing_sets")
    return (
        frozenset(o for p in sets.split(";") for o in p.split("+")) if isinstance(sets, str) and sets else frozenset()
    )


def labelled(causes: pd.DataFrame, scores: pd.DataFrame, signals: pd.DataFrame | None = None) -> pd.DataFrame:
    """The scored failed episodes: cause, the owners that count as right (`needed`), outcome and signal pattern."""
    m = causes[causes["cause"].isin(SINGLE + (COMPOUND,))].merge(scores[["episode_id", "score"]], on="episode_id")
    m = m.assign(outcome=m["score"].map(lambda x: f"{x:.3f}"), needed=[_needed(r) for r in m.to_dict("records")])
    if signals is not None:
        m = m.merge(signals[["episode_id", "pattern"]], on="episode_id", how="left")
    return m


def _best(frame: pd.DataFrame, prefer: Owner | None = None) -> Owner:
    """The owner right on most of `frame`'s episodes (ties: `prefer` if among them, else `LABEL_OWNERS` order)."""
    hits = {o: sum(o.value in n for n in frame["needed"]) for o in LABEL_OWNERS}
    tied = [o for o in LABEL_OWNERS if hits[o] == max(hits.values())]
    return prefer if prefer in tied else tied[0]


def fit(frame: pd.DataFrame, key: Key) -> Guess:
    """The best guess of its kind on labelled episodes (`labelled`)."""
    if frame.empty:
        return Guess(key=key)
    default = _best(frame)
    if key is Key.CONSTANT:
        return Guess(key=key, default=default)
    by = {
        str(k): _best(g, three_line(from_pattern(str(k))) if key is Key.PATTERN else default)
        for k, g in frame.groupby(key.value)
    }
    return Guess(key=key, by_key=by, default=default)


def _no_refusal(m: pd.DataFrame) -> pd.DataFrame:
    """The same episodes with the rule-refusal signal blanked, as a world whose refusals say nothing would show them."""
    at = list(Signals.model_fields).index("refusal")
    return m.assign(pattern=m["pattern"].map(lambda p: p[:at] + "0" + p[at + 1 :]))


def fit_baselines(causes: pd.DataFrame, scores: pd.DataFrame, signals: pd.DataFrame) -> Baselines:
    m = labelled(causes, scores, signals)
    return Baselines(
        constant=fit(m, Key.CONSTANT),
        outcome=fit(m, Key.OUTCOME),
        trace_rule=fit(m, Key.PATTERN),
        trace_rule_no_refusal=fit(_no_refusal(m), Key.PATTERN),
    )


def _cross_fit(m: pd.DataFrame, key: Key) -> pd.Series:
    """Two folds by item: each half's labels fit the guess for the other half."""
    fold = m["item_id"].astype(str).map(lambda i: zlib.crc32(i.encode()) % 2)
    out = pd.Series(index=m.index, dtype=object)
    for k in (0, 1):
        if (fold == k).any():
            out[fold == k] = fit(m[fold != k], key).predict(m[fold == k])
    return out


def _rate(pred: pd.Series, needed: pd.Series) -> float | None:
    return float(sum(p in n for p, n in zip(pred, needed)) / len(pred)) if len(pred) else None


EMPTY: dict[str, Any] = {
    "accuracy": None,
    "single_accuracy": None,
    "n": 0,
    "n_single": 0,
    "coverage": None,
    "constant_accuracy": None,
    "outcome_only_accuracy": None,
    "trace_rule_accuracy": None,
    "three_line_accuracy": None,
    "trace_rule_no_refusal_accuracy": None,
    "margin": None,
    "ceiling": None,
    "compound": {"n": 0, "coverage": None, "accuracy": None, "constant": None, "no_fix": 0},
    "checks": {"coverage": False, "accuracy": False, "margin": False},
    "passes": False,
    "per_owner": {},
    "confusion": {},
}


def localization(
    findings: pd.DataFrame,
    causes: pd.DataFrame,
    scores: pd.DataFrame,
    signals: pd.DataFrame | None = None,
    baselines: Baselines | None = None,
) -> dict[str, Any]:
    """findings: episode_id, owner (the diagnoser's); causes, scores: episode_id with the hidden labels / score;
    signals: episode_id, pattern (`trace_rule.signals_frame`; without them no trace-rule figure). `baselines`: fitted
    elsewhere (train); without them each is cross-fitted over two halves of the items."""
    m = labelled(causes, scores, signals).merge(findings[["episode_id", "owner"]], on="episode_id")
    scope = attribution(findings, causes)
    if m.empty:
        return {**EMPTY, "compound": dict(EMPTY["compound"]), "checks": dict(EMPTY["checks"]), **scope}
    m["pred"] = m["owner"].map(lambda o: OWNER_OF.get(o, o))
    m["covered"] = m["pred"] != UNKNOWN
    m["hit"] = [p in n for p, n in zip(m["pred"], m["needed"])]
    has_signals = "pattern" in m and not m["pattern"].isna().any()
    guess = _baseline_rates(m, has_signals, baselines)
    three = _rate(m["pattern"].map(lambda p: three_line(from_pattern(p)).value), m["needed"]) if has_signals else None
    single, comp = m[m["cause"] != COMPOUND], m[m["cause"] == COMPOUND]
    accuracy = float(m["hit"].mean())
    coverage = float(m["covered"].mean())
    margin = None if guess["trace_rule"] is None else accuracy - guess["trace_rule"]
    checks = {
        "coverage": coverage >= MIN_COVERAGE,
        "accuracy": accuracy >= MIN_ACCURACY,
        "margin": margin is not None and margin >= MIN_MARGIN - 1e-9,
    }
    per_owner = {
        str(c): {"n": int(len(g)), "coverage": float(g["covered"].mean()), "accuracy": float(g["hit"].mean())}
        for c, g in m.groupby("cause")
    }
    confusion = {
        str(t): {str(p): int(n) for p, n in g["pred"].value_counts().sort_index().items()}
        for t, g in m.groupby("cause")
    }
    return {
        "accuracy": accuracy,
        "single_accuracy": float(single["hit"].mean()) if len(single) else None,
        "n": int(len(m)),
        "n_single": int(len(single)),
        "coverage": coverage,
        "constant_accuracy": guess["constant"],
        "outcome_only_accuracy": guess["outcome"],
        "trace_rule_accuracy": guess["trace_rule"],
        "three_line_accuracy": three,
        "trace_rule_no_refusal_accuracy": guess["trace_rule_no_refusal"],
        "margin": margin,
        "ceiling": float(sum(bool(n) for n in m["needed"]) / len(m)),
        "compound": _compound(comp),
        "checks": checks,
        "passes": all(checks.values()),
        "per_owner": per_owner,
        "confusion": confusion,
        **scope,
    }


def _baseline_rates(m: pd.DataFrame, has_signals: bool, baselines: Baselines | None) -> dict[str, float | None]:
    """Each baseline's accuracy on the labelled failures `m` (fitted elsewhere, or cross-fitted over two halves of
    the items); the trace rule's None without signals."""
    guess: dict[str, float | None] = {}
    for name, key in (
        ("constant", Key.CONSTANT),
        ("outcome", Key.OUTCOME),
        ("trace_rule", Key.PATTERN),
        ("trace_rule_no_refusal", Key.PATTERN),
    ):
        if key is Key.PATTERN and not has_signals:
            guess[name] = None
            continue
        seen = _no_refusal(m) if name == "trace_rule_no_refusal" else m
        pred = getattr(baselines, name).predict(seen) if baselines is not None else _cross_fit(seen, key)
        guess[name] = _rate(pred, m["needed"])
    return guess


def _compound(comp: pd.DataFrame) -> dict[str, Any]:
    """The compound failures' figures: how many, the diagnoser's coverage and accuracy on them, the constant
    baseline's, and how many no single fix repairs."""
    return {
        "n": int(len(comp)),
        "coverage": float(comp["covered"].mean()) if len(comp) else None,
        "accuracy": float(comp["hit"].mean()) if len(comp) else None,
        "constant": _rate(pd.Series(_best(comp).value, index=comp.index), comp["needed"]) if len(comp) else None,
        "no_fix": int(sum(not n for n in comp["needed"])),
    }


def attribution(findings: pd.DataFrame, causes: pd.DataFrame) -> dict[str, Any]:
    """What the scoring could not score and the diagnoser could not attribute:
    scored        whether any failure has a counterfactual label to score the diagnoser against
    unlabelled    failed episodes with no label: a world without fault switches (`WorldSpec.counterfactual`)
    unscored      why nothing was scored (None when something was)
    diagnosed     failed episodes the diagnoser judged; unattributed: those it named no owner for, by the
                  kind of evidence it had (a missing, extra or wrong-argument write, a refusal, ...)"""
    n_labelled = int(causes["cause"].isin(SINGLE + (COMPOUND,)).sum()) if "cause" in causes else 0
    unlabelled = int((causes["cause"] == UNLABELLED_CAUSE).sum()) if "cause" in causes else 0
    reason = None
    if not n_labelled:
        reason = (
            (
                f"no counterfactual cause: the world has no fault switches to replay ({unlabelled} failed "
                "episode(s) unlabelled)"
            )
            if unlabelled
            else "no labelled failed episode"
        )
    owner = findings["owner"].astype(str) if "owner" in findings else pd.Series([], dtype=str)
    kinds = findings.loc[owner == UNKNOWN, "kind"].astype(str) if "kind" in findings else pd.Series([], dtype=str)
    return {
        "scored": bool(n_labelled),
        "unlabelled": unlabelled,
        "unscored": reason,
        "diagnosed": int(len(findings)),
        "unattributed": {str(k): int(n) for k, n in sorted(kinds.value_counts().items())},
    }


def localization_from_rounds(
    out: str | Path, write_tools: frozenset[str], targets: Targets | None = None
) -> dict[str, Any]:
    """Pool every round's diagnosed train evaluation, each distinct champion once, and score it (baselines
    cross-fitted by item: the pool is train itself)."""
    findings, causes, scores, signals, seen = [], [], [], [], set()
    for rd in sorted((Path(out) / "rounds").glob("r*")):
        train = rd / "train"
        if not (rd / "findings.csv").exists() or not (train / "scores.csv").exists():
            continue
        f = pd.read_csv(rd / "findings.csv", dtype={"item_id": str, "episode_id": str, "champion": str})
        champion = f["champion"].iloc[0] if len(f) else rd.name
        if champion in seen:
            continue
        seen.add(champion)
        sc = pd.read_csv(train / "scores.csv", dtype={"item_id": str})
        tr = pd.read_parquet(train / "traces.parquet") if (train / "traces.parquet").exists() else pd.DataFrame()
        sig = signals_frame(tr, sc, write_tools, targets)
        findings.append(f.assign(episode_id=f["episode_id"] + "@" + champion))
        causes.append(_eid(read_hidden_causes(train), "@" + champion))
        scores.append(_eid(sc, "@" + champion))
        signals.append(sig.assign(episode_id=sig["episode_id"] + "@" + champion))
    if not findings:
        return localization(
            pd.DataFrame(columns=["episode_id", "owner"]),
            pd.DataFrame(columns=["episode_id", "cause", "item_id"]),
            pd.DataFrame(columns=["episode_id", "score"]),
        )
    return localization(pd.concat(findings), pd.concat(causes), pd.concat(scores), pd.concat(signals))


def baselines_on_train(
    package: MemoryPackage, bench: Benchmark, seeds: list[int], max_turns: int, run: EvalTables | None = None
) -> Baselines:
    """Fit the baselines on the train split (evaluated and replayed in-process with the simulator; `run`: that
    evaluation when already made, `run_shard`'s tables)."""
    from components.models.counterfactual import causes_table
    from components.runtime.evaluate import run_shard

    t = run if run is not None else run_shard(package, bench, bench.ids("train"), seeds, max_turns=max_turns)
    return fit_baselines(
        _eid(causes_table(package, bench, t.scores, max_turns)),
        _eid(t.scores),
        signals_frame(t.traces, t.scores, bench.write_tools, bench.targets),
    )


def diagnose_eval(eval_dir: str | Path, package_dir: str | Path, bench_dir: str | Path) -> dict[str, Any]:
    """Diagnose a finished evaluation (traces and package only), then score it against its hidden causes.
    The baselines are fitted on train; when the evaluation is itself on train, cross-fitted by item."""
    from components.errors import InputError
    from components.evolution.diagnose import diagnose
    from components.io import read_json_object
    from components.memory import load_package
    from components.worlds import load_benchmark

    ev = Path(eval_dir)
    for name in ("scores.csv", "traces.parquet", f"{HIDDEN}/causes.csv", "meta.json"):
        if not (ev / name).is_file():
            raise InputError(f"{ev / name}: -: missing (run `ratchet eval --out {ev}` first)")
    pkg, bench = load_package(package_dir), load_benchmark(bench_dir)
    meta = read_json_object(ev / "meta.json")
    for key, what, given in (("package_digest", "package", pkg), ("benchmark_digest", "benchmark", bench)):
        if meta.get(key) not in (None, given.digest):  # diagnosing against other bytes scores nonsense
            raise InputError(
                f"{ev / 'meta.json'}: {key}: the eval ran on another {what} ({meta.get(what)}, "
                f"{str(meta[key])[:12]}) than {given.root} ({given.digest[:12]})"
            )
    try:
        scores = pd.read_csv(ev / "scores.csv", dtype={"item_id": str})
        traces = pd.read_parquet(ev / "traces.parquet")
    except (ValueError, OSError) as e:  # pyarrow's ArrowInvalid and pandas' parser errors are ValueErrors
        raise InputError(f"{ev}: -: an unreadable eval file ({str(e).strip().splitlines()[0]})") from None
    lacking = [c for c in ("item_id", "seed", "score", "success") if c not in scores.columns]
    if lacking:
        raise InputError(f"{ev / 'scores.csv'}: {lacking[0]}: missing column")
    from components.evolution.infer import policy_today
    from components.worlds.base import train_gold

    # outcome evidence as a campaign's diagnosis has it: train items' gold only (a dev or test eval gets none of
    # its own; it gets what train's traces showed against train's gold, `TrainEvidence`)
    gold, targets = train_gold(bench), bench.targets
    split = meta.get("split")
    baselines = train_ev = None
    if split != "train":
        from components.evolution.diagnose import evidence_from_train
        from components.runtime.evaluate import run_shard

        seeds, max_turns = list(meta.get("seeds", [0, 1, 2])), int(meta.get("max_turns") or MAX_TURNS)
        t = run_shard(pkg, bench, bench.ids("train"), seeds, max_turns=max_turns)
        baselines = baselines_on_train(pkg, bench, seeds, max_turns, run=t)
        train_ev = (
            evidence_from_train(
                t.traces,
                t.scores,
                pkg,
                bench.write_tools,
                gold,
                targets,
                policy_today(bench.policy),
                bench.confirmation,
            )
            if gold
            else None
        )
    d = diagnose(
        traces,
        scores,
        pkg,
        bench.write_tools,
        f"eval:{ev.name}",
        targets=targets,
        gold=gold,
        train=train_ev,
        today=policy_today(bench.policy),
        confirmation=bench.confirmation,
    )
    sig = signals_frame(traces, scores, bench.write_tools, bench.targets)
    return localization(d.findings_frame(), _eid(read_hidden_causes(ev)), _eid(scores), sig, baselines)


def localization_notes(loc: dict[str, Any]) -> list[str]:
    """The lines a report prints for `attribution`'s figures: an unscored localization, and what the diagnosis could
    not attribute (nothing when every failure was scored and attributed)."""
    lines = []
    if loc.get("scored") is False:
        lines.append(f"diagnosis localization: unscored ({loc['unscored']})")
    missed = loc.get("unattributed") or {}
    if missed:
        lines.append(
            f"diagnosis could not attribute {sum(missed.values())} of {loc['diagnosed']} diagnosed failed "
            "episode(s) to an owner; its evidence there: " + ", ".join(f"{k} {n}" for k, n in missed.items())
        )
    return lines
