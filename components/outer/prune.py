"""Adapting the package to a model that learned: remove the cards it no longer needs.

For each card of the package, in id order, the candidate is the current package without that card. It is run on dev
beside the current package (same items, paired seeds, the trained model) and kept by `gate.removal_decide`: the
score is not worse beyond the gate's material margin AND the prompt tokens per episode drop (a second objective,
with its own interval). An accepted removal becomes the current package for the next card. Each comparison is one
dev look, so each gets `campaign_alpha / n_cards` (the same linear spending as a campaign's rounds).

The evaluation function is passed in (the flow passes its Prefect-task evaluation; a test passes `run_shard`), so
this module stays free of Prefect.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import pandas as pd

from components.evolution.gate import GateConfig, RemovalResult, look_alpha, removal_decide
from components.io import atomic_dir
from components.memory.package import load_package

Evaluate = Callable[[Path, str], pd.DataFrame]  # (package dir, label) -> a dev score table with tokens_in


@dataclass
class PruneResult:
    package: Path  # the final package (the input itself when nothing was removed)
    removed: list[str] = field(default_factory=list)
    decisions: list[dict] = field(default_factory=list)  # per card: card, accept, reason and both intervals


def without_card(package: Path, card_id: str, out: Path) -> Path:
    """A copy of `package` without the card (loaded again: a binding that names the card refuses the copy)."""
    pkg = load_package(package)
    rel = pkg.cards[card_id].path
    with atomic_dir(out) as tmp:
        shutil.copytree(package, tmp, dirs_exist_ok=True)
        (tmp / rel).unlink()
    load_package(out)
    return out


def prune(package: Path, work: Path, evaluate: Evaluate, cfg: GateConfig) -> PruneResult:
    current = Path(package)
    cards = sorted(load_package(current).cards)
    result = PruneResult(current)
    if not cards:
        return result
    base = evaluate(current, "prune base")
    for k, card in enumerate(cards, 1):
        look = replace(cfg, alpha=look_alpha(cfg.campaign_alpha, len(cards), k))
        cand_dir = without_card(current, card, work / f"without-{card}")
        cand = evaluate(cand_dir, f"prune without {card}")
        v: RemovalResult = removal_decide(base, cand, look)
        result.decisions.append({"card": card, **v.as_dict(), "alpha": look.alpha})
        if v.accept:
            current, base = cand_dir, cand
            result.removed.append(card)
    result.package = current
    return result
