"""Diagnosis scoring: how often the diagnoser's owner matches the hidden ground-truth cause.

This is the only code that reads the simulated agent's hidden-cause sidecar (`_hidden/causes.csv`).
Beside the diagnoser's accuracy it reports an outcome-only baseline: the best single owner guess per task outcome
(the episode's score), fitted on the same labels, i.e. the most that attribution from outcomes alone could reach.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from components.runtime.evaluate import HIDDEN

OWNER_OF = {"none": "external"}  # the diagnoser says "none" (owner ∅) where the hidden label says "external"


def read_hidden_causes(eval_dir: str | Path) -> pd.DataFrame:
    return pd.read_csv(Path(eval_dir) / HIDDEN / "causes.csv", dtype={"item_id": str, "cause": str})


def _eid(df: pd.DataFrame, suffix: str = "") -> pd.DataFrame:
    return df.assign(episode_id=df["item_id"].astype(str) + "#" + df["seed"].astype(str) + suffix)


def localization(findings: pd.DataFrame, causes: pd.DataFrame, scores: pd.DataFrame) -> dict:
    """findings: episode_id, owner (the diagnoser's); causes, scores: episode_id with cause (hidden) / score."""
    m = causes[["episode_id", "cause"]].merge(findings[["episode_id", "owner"]], on="episode_id")
    m = m.merge(scores[["episode_id", "score"]], on="episode_id")
    if m.empty:
        return {"accuracy": None, "outcome_only_accuracy": None, "n": 0, "per_owner": {}}
    m["hit"] = m["owner"].map(lambda o: OWNER_OF.get(o, o)) == m["cause"]
    m["outcome"] = m["score"].round(3)
    best = m.groupby("outcome")["cause"].agg(lambda x: x.value_counts().sort_index().idxmax())
    m["baseline_hit"] = m["outcome"].map(best) == m["cause"]
    per_owner = {str(cause): {"n": int(len(g)), "accuracy": float(g["hit"].mean()),
                              "outcome_only_accuracy": float(g["baseline_hit"].mean())}
                 for cause, g in m.groupby("cause")}
    return {"accuracy": float(m["hit"].mean()), "outcome_only_accuracy": float(m["baseline_hit"].mean()),
            "n": int(len(m)), "per_owner": per_owner}


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
        return {"accuracy": None, "outcome_only_accuracy": None, "n": 0, "per_owner": {}}
    return localization(pd.concat(findings), pd.concat(causes), pd.concat(scores))
