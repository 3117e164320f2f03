"""Counterfactual ground truth: what would have fixed a failed episode, found by replaying it with the simulated
agent's faults switched off, one owner at a time, then in sets of two and three.

For each failed (package, item, seed), in-process with the simulator whatever backend produced the episode:

    replay as is, probing -> which owners' faults fired, and at which call (a fault that never fired changes nothing:
                             its replay would be the same episode, so it is not run)
    each fired owner alone off, in firing order -> the first whose switch alone turns the failure into a success is
                        the cause (the earliest fault; ties at one call: `OWNERS` order); later ones are not run
                        (their columns stay empty)
        none         -> the minimal fixing sets of two or three switches (`Replayer.minimal_fixes`: a set fixes it
                        and no smaller set inside it does; a set is replayed only when each of its switches fires
                        with the others off, else it is the episode without that switch): any -> `compound`, with
                        those sets (`fixing_sets`, e.g. "E+W;rho+W+C"); none -> all four off: still failing ->
                        `external`, else `compound` with no set (it takes all four fixes: no owner named is right)

In a world without fault switches (`WorldSpec.counterfactual` False: a real benchmark, played by a real model)
nothing is replayed: every failed episode is `unlabelled`, and diagnosis scoring reports itself unscored.

The result is the hidden sidecar `_hidden/causes.csv`; only diagnosis scoring (`components.evolution.localization`)
reads it. An episode that ended in a model error is `external` (no memory fixes a broken endpoint); one whose replay
succeeds although the recorded episode failed (another model produced it) is `not_reproduced` and is not scored.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import combinations

import pandas as pd

from components.memory.package import MemoryPackage
from components.models.simulated import OWNERS, RATES, Rates, SimulatedAgent
from components.defaults import MAX_TURNS
from components.runtime.episode import run_episode
from components.worlds import Benchmark, world

COLUMNS = [
    "item_id",
    "seed",
    "cause",
    "fired",
    "E_off",
    "rho_off",
    "W_off",
    "C_off",
    "all_off",
    "fixing_sets",
    "replays",
]
EXTERNAL, COMPOUND, NOT_REPRODUCED = "external", "compound", "not_reproduced"
MAX_FIX = 3  # the largest set of switches searched for a fix (of four: a fix needing all four names no owner)
UNLABELLED = "unlabelled"  # a world without fault switches (`WorldSpec.counterfactual` False): no cause to find


@dataclass
class Replayer:
    package: MemoryPackage
    bench: Benchmark
    max_turns: int = MAX_TURNS
    rates: Rates = RATES
    learned: frozenset[str] = frozenset()  # the facts the replayed model was trained on (`sim`'s `learned`)
    replays: int = 0
    _cards: tuple[str, ...] = field(default=(), init=False)
    _runs: dict[frozenset[str], tuple[bool, dict]] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self._cards = tuple(c.render() for c in self.package.cards.values())

    def run(self, item_id: str, seed: int, off: frozenset[str] = frozenset(), probe: bool = False):
        spec = world(self.bench.world)
        agent = SimulatedAgent(
            self.rates,
            off,
            self._cards,
            probe=probe,
            metered=False,
            competence=spec.competence,
            learned=self.learned,
            truth=spec.truth(self.bench) if spec.truth else None,
        )
        self.replays += 1
        # the trace is discarded: no step is content-hashed
        return run_episode(
            self.package, self.bench, item_id, seed, agent, self.max_turns, sealed=False
        ).success, agent.onsets

    def outcome(self, item_id: str, seed: int, off: frozenset[str]) -> tuple[bool, dict]:
        """(success, onsets) with the switches `off` off, probing the rest. Replayed only when every switch in `off`
        fires once the others are off: a switch whose fault never fires there changes no call, so the episode is the
        one without it (the simulated agent is a pure function of its messages and seed). Memoized per episode
        (`cause` clears it)."""
        if off in self._runs:
            return self._runs[off]
        for o in sorted(off, key=OWNERS.index):
            without = self.outcome(item_id, seed, off - {o})
            if o not in without[1]:
                self._runs[off] = without
                return without
        self._runs[off] = self.run(item_id, seed, off, probe=True)
        return self._runs[off]

    def minimal_fixes(self, item_id: str, seed: int) -> list[frozenset[str]]:
        """Every set of two or three switches that turns the failure into a success while no smaller set inside it
        does (called once no single switch fixes the episode)."""
        fixes: list[frozenset[str]] = []
        for size in (2, MAX_FIX):
            for combo in combinations(OWNERS, size):
                s = frozenset(combo)
                if not any(f <= s for f in fixes) and self.outcome(item_id, seed, s)[0]:
                    fixes.append(s)
        return fixes

    def cause(self, item_id: str, seed: int, error: str = "") -> dict:
        row: dict = {"item_id": item_id, "seed": seed, "fired": "", "fixing_sets": "", "all_off": ""}
        row.update({f"{o}_off": "" for o in OWNERS})
        start = self.replays
        self._runs = {}
        if error:
            row.update(cause=EXTERNAL, replays=0)
            return row
        base_ok, onsets = self.outcome(item_id, seed, frozenset())
        row["fired"] = " ".join(f"{o}@{onsets[o]}" for o in sorted(onsets, key=lambda o: (onsets[o], OWNERS.index(o))))
        if base_ok:
            row.update(cause=NOT_REPRODUCED, replays=self.replays - start)
            return row
        row.update({f"{o}_off": 0 for o in OWNERS if o not in onsets})  # a fault that never fired: the same episode
        # fired faults in the order they fired: the first whose switch alone fixes it is the cause; later ones are
        # not replayed
        for o in sorted(onsets, key=lambda o: (onsets[o], OWNERS.index(o))):
            row[f"{o}_off"] = int(self.outcome(item_id, seed, frozenset({o}))[0])
            if row[f"{o}_off"]:
                row["cause"] = o
                break
        else:
            fixes = self.minimal_fixes(item_id, seed)
            row["fixing_sets"] = ";".join("+".join(o for o in OWNERS if o in f) for f in fixes)
            every = bool(fixes) or self.outcome(item_id, seed, frozenset(OWNERS))[0]
            row["all_off"] = "" if fixes else int(every)
            row["cause"] = COMPOUND if every else EXTERNAL
        row["replays"] = self.replays - start
        return row


def causes_table(
    package: MemoryPackage,
    bench: Benchmark,
    scores: pd.DataFrame,
    max_turns: int = MAX_TURNS,
    rates: Rates = RATES,
    learned: frozenset[str] = frozenset(),
) -> pd.DataFrame:
    """The hidden cause of every failed episode in `scores` (columns item_id, seed, success, error)."""
    rep = Replayer(package, bench, max_turns, rates, frozenset(learned))
    failed = scores[~scores["success"].astype(bool)]
    if not world(bench.world).counterfactual:  # nothing to replay: every failure stays unlabelled, none is scored
        rows = [
            {
                **dict.fromkeys(COLUMNS, ""),
                "item_id": str(r.item_id),
                "seed": int(r.seed),
                "cause": UNLABELLED,
                "replays": 0,
            }
            for r in failed.itertuples(index=False)
        ]
        return pd.DataFrame(rows, columns=COLUMNS)
    rows = [
        rep.cause(str(r.item_id), int(r.seed), "" if pd.isna(r.error) else str(r.error))
        for r in failed.itertuples(index=False)
    ]
    return pd.DataFrame(rows, columns=COLUMNS)
