"""Diagnosis scoring: how often the diagnoser's owner matches the hidden counterfactual cause.

This is the only code that reads the hidden-cause sidecar (`_hidden/causes.csv`, written by
`components.models.counterfactual`). Figures, over failed episodes with a label:

    n               labelled failed episodes (compound ones included)
    coverage        share the diagnoser did not call `unknown`
    accuracy        single-cause episodes (E, W, rho, C, external) it covered: share where its owner is the cause
    compound        episodes no single fix repairs: n, and the share where it named an owner whose fix is needed
                    (a member of a pair that fixes it; with no fixing pair, any owner whose fault fired)
    outcome_only_accuracy   the best owner guess per outcome (the episode's score), fitted on other labels (train,
                    or the other half of the items) and scored on these, single-cause episodes
    confusion       truth -> predicted counts
"""

from __future__ import annotations

import zlib
from pathlib import Path

import pandas as pd

from components.runtime.evaluate import HIDDEN

OWNER_OF = {"none": "external"}  # the diagnoser says "none" (owner ∅) where the hidden label says "external"
SINGLE = ("E", "W", "rho", "C", "external")
UNKNOWN = "unknown"


def read_hidden_causes(eval_dir: str | Path) -> pd.DataFrame:
    return pd.read_csv(Path(eval_dir) / HIDDEN / "causes.csv", dtype={"item_id": str, "cause": str,
                                                                      "fired": str, "fixing_pairs": str})


def _eid(df: pd.DataFrame, suffix: str = "") -> pd.DataFrame:
    return df.assign(episode_id=df["item_id"].astype(str) + "#" + df["seed"].astype(str) + suffix)


def _labelled(causes: pd.DataFrame, scores: pd.DataFrame) -> pd.DataFrame:
    m = causes[causes["cause"].isin(SINGLE + ("compound",))]
    return m.merge(scores[["episode_id", "score"]], on="episode_id").assign(outcome=lambda d: d["score"].round(3))


def fit_outcome_only(causes: pd.DataFrame, scores: pd.DataFrame) -> dict:
    """The most frequent single cause per outcome (rounded score), and overall as a fallback."""
    return _fit(_labelled(causes, scores))


def _fit(m: pd.DataFrame) -> dict:
    m = m[m["cause"].isin(SINGLE)]
    if m.empty:
        return {"by_outcome": {}, "default": "E"}
    pick = lambda x: x.value_counts().sort_index().idxmax()  # noqa: E731 - ties: alphabetical, deterministic
    return {"by_outcome": m.groupby("outcome")["cause"].agg(pick).to_dict(), "default": pick(m["cause"])}


def _needed(row) -> set[str]:
    pairs = row.get("fixing_pairs")
    if isinstance(pairs, str) and pairs:
        return {o for p in pairs.split(";") for o in p.split("+")}
    fired = row.get("fired")
    return {f.split("@")[0] for f in fired.split()} if isinstance(fired, str) else set()


def localization(findings: pd.DataFrame, causes: pd.DataFrame, scores: pd.DataFrame,
                 baseline: dict | None = None) -> dict:
    """findings: episode_id, owner (the diagnoser's); causes, scores: episode_id with the hidden labels / score.
    `baseline`: an outcome-only model fitted elsewhere; without one it is cross-fitted over two halves of the items."""
    m = _labelled(causes, scores).merge(findings[["episode_id", "owner"]], on="episode_id")
    empty = {"accuracy": None, "outcome_only_accuracy": None, "n": 0, "coverage": None,
             "compound": {"n": 0, "accuracy": None}, "per_owner": {}, "confusion": {}}
    if m.empty:
        return empty
    m["pred"] = m["owner"].map(lambda o: OWNER_OF.get(o, o))
    m["covered"] = m["pred"] != UNKNOWN
    single, comp = m[m["cause"].isin(SINGLE)], m[m["cause"] == "compound"]
    hit = single["pred"] == single["cause"]
    cov = single[single["covered"]]
    comp_cov = comp[comp["covered"]]
    comp_hit = [p in _needed(r) for p, r in zip(comp_cov["pred"], comp_cov.to_dict("records"))]
    if baseline is None:  # two folds by item: each half's labels predict the other half's
        fold = m["item_id"].astype(str).map(lambda i: zlib.crc32(i.encode()) % 2)
        guesses = pd.Series(index=m.index, dtype=object)
        for k in (0, 1):
            fit = _fit(m[fold != k])
            guesses[fold == k] = m.loc[fold == k, "outcome"].map(lambda o: fit["by_outcome"].get(o, fit["default"]))
    else:
        guesses = m["outcome"].map(lambda o: baseline["by_outcome"].get(o, baseline["default"]))
    base_hit = (guesses[single.index] == single["cause"])
    per_owner = {str(c): {"n": int(len(g)), "coverage": float(g["covered"].mean()),
                          "accuracy": float((g.loc[g["covered"], "pred"] == c).mean()) if g["covered"].any() else None}
                 for c, g in single.groupby("cause")}
    confusion = {str(t): {str(p): int(n) for p, n in g["pred"].value_counts().sort_index().items()}
                 for t, g in m.groupby("cause")}
    return {"accuracy": float((cov["pred"] == cov["cause"]).mean()) if len(cov) else None,
            "outcome_only_accuracy": float(base_hit.mean()) if len(single) else None,
            "n": int(len(m)), "n_single": int(len(single)),
            "coverage": float(m["covered"].mean()),
            "accuracy_all": float(hit.mean()) if len(single) else None,  # unknown counted as a miss
            "compound": {"n": int(len(comp)), "coverage": float(comp["covered"].mean()) if len(comp) else None,
                         "accuracy": float(sum(comp_hit) / len(comp_hit)) if comp_hit else None},
            "per_owner": per_owner, "confusion": confusion}


def localization_from_rounds(out: str | Path) -> dict:
    """Pool every round's diagnosed train evaluation, each distinct champion once, and score it."""
    findings, causes, scores, seen = [], [], [], set()
    for rd in sorted((Path(out) / "rounds").glob("r*")):
        train = rd / "train"
        if not (rd / "findings.csv").exists() or not (train / "scores.csv").exists():
            continue
        f = pd.read_csv(rd / "findings.csv", dtype={"item_id": str, "episode_id": str, "champion": str})
        champion = f["champion"].iloc[0] if len(f) else rd.name
        if champion in seen:
            continue
        seen.add(champion)
        findings.append(f.assign(episode_id=f["episode_id"] + "@" + champion))
        causes.append(_eid(read_hidden_causes(train), "@" + champion))
        scores.append(_eid(pd.read_csv(train / "scores.csv", dtype={"item_id": str}), "@" + champion))
    if not findings:
        return localization(pd.DataFrame(columns=["episode_id", "owner"]),
                            pd.DataFrame(columns=["episode_id", "cause", "item_id"]),
                            pd.DataFrame(columns=["episode_id", "score"]))
    return localization(pd.concat(findings), pd.concat(causes), pd.concat(scores))


def outcome_only_on_train(package, bench, seeds: list[int], max_turns: int) -> dict:
    """Fit the outcome-only baseline on the train split (evaluated and replayed in-process with the simulator)."""
    from components.models.counterfactual import causes_table
    from components.runtime.evaluate import run_shard

    t = run_shard(package, bench, bench.ids("train"), seeds, max_turns=max_turns)
    return fit_outcome_only(_eid(causes_table(package, bench, t.scores, max_turns)), _eid(t.scores))


def diagnose_eval(eval_dir: str | Path, package_dir: str | Path, bench_dir: str | Path) -> dict:
    """Diagnose a finished evaluation (traces and package only), then score it against its hidden causes.
    The outcome-only baseline is fitted on train; when the evaluation is itself on train, cross-fitted by item."""
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
            raise InputError(f"{ev / 'meta.json'}: {key}: the eval ran on another {what} ({meta.get(what)}, "
                             f"{str(meta[key])[:12]}) than {given.root} ({given.digest[:12]})")
    try:
        scores = pd.read_csv(ev / "scores.csv", dtype={"item_id": str})
        traces = pd.read_parquet(ev / "traces.parquet")
    except (ValueError, OSError) as e:  # pyarrow's ArrowInvalid and pandas' parser errors are ValueErrors
        raise InputError(f"{ev}: -: an unreadable eval file ({str(e).strip().splitlines()[0]})") from None
    lacking = [c for c in ("item_id", "seed", "score", "success") if c not in scores.columns]
    if lacking:
        raise InputError(f"{ev / 'scores.csv'}: {lacking[0]}: missing column")
    d = diagnose(traces, scores, pkg, bench.write_tools, f"eval:{ev.name}", targets=bench.meta.get("targets"))
    split = meta.get("split")
    baseline = None if split == "train" else outcome_only_on_train(pkg, bench, list(meta.get("seeds", [0, 1, 2])),
                                                                  int(meta.get("max_turns", 40)))
    return localization(d.findings_frame(), _eid(read_hidden_causes(ev)), _eid(scores), baseline)
