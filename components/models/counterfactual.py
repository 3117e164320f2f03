"""Counterfactual ground truth: what would have fixed a failed episode, found by replaying it with the simulated
agent's faults switched off, one owner at a time.

For each failed (package, item, seed), in-process with the simulator whatever backend produced the episode:

    replay as is, probing -> which owners' faults fired, and at which call (a fault that never fired changes nothing:
                             its replay would be the same episode, so it is not run)
    each fired owner alone off, in firing order -> the first whose switch alone turns the failure into a success is
                        the cause (the earliest fault; ties at one call: `OWNERS` order); later ones are not run
                        (their columns stay empty)
        none         -> pairs (only those whose second fault fires once the first is off): any fixes ->
                        `compound`, with the pairs that fix it; none -> all four off: still failing -> `external`,
                        else `compound` (it takes three or four fixes)

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
from components.runtime.episode import MAX_TURNS, run_episode
from components.worlds import Benchmark, world

COLUMNS = ["item_id", "seed", "cause", "fired", "E_off", "rho_off", "W_off", "C_off", "all_off", "fixing_pairs",
           "replays"]
EXTERNAL, COMPOUND, NOT_REPRODUCED = "external", "compound", "not_reproduced"
UNLABELLED = "unlabelled"  # a world without fault switches (`WorldSpec.counterfactual` False): no cause to find


@dataclass
class Replayer:
    package: MemoryPackage
    bench: Benchmark
    max_turns: int = MAX_TURNS
    rates: Rates = RATES
    replays: int = 0
    _cards: tuple[str, ...] = field(default=(), init=False)

    def __post_init__(self) -> None:
        self._cards = tuple(c.render() for c in self.package.cards.values())

    def run(self, item_id: str, seed: int, off: frozenset[str] = frozenset(), probe: bool = False):
        agent = SimulatedAgent(self.rates, off, self._cards, probe=probe, metered=False,
                               competence=world(self.bench.world).competence)
        self.replays += 1
        # the trace is discarded: no step is content-hashed
        return run_episode(self.package, self.bench, item_id, seed, agent, self.max_turns,
                           sealed=False).success, agent.onsets

    def cause(self, item_id: str, seed: int, error: str = "") -> dict:
        row: dict = {"item_id": item_id, "seed": seed, "fired": "", "fixing_pairs": "", "all_off": ""}
        row.update({f"{o}_off": "" for o in OWNERS})
        start = self.replays
        if error:
            row.update(cause=EXTERNAL, replays=0)
            return row
        base_ok, onsets = self.run(item_id, seed, probe=True)
        row["fired"] = " ".join(f"{o}@{onsets[o]}" for o in sorted(onsets, key=lambda o: (onsets[o], OWNERS.index(o))))
        if base_ok:
            row.update(cause=NOT_REPRODUCED, replays=self.replays - start)
            return row
        alone: dict[str, tuple[bool, dict]] = {o: (False, {}) for o in OWNERS if o not in onsets}
        row.update({f"{o}_off": 0 for o in alone})  # a fault that never fired replays the same failing episode
        # fired faults in the order they fired: the first whose switch alone fixes it is the cause; later ones are
        # not replayed
        for o in sorted(onsets, key=lambda o: (onsets[o], OWNERS.index(o))):
            if o not in alone:
                alone[o] = self.run(item_id, seed, frozenset({o}), probe=True)
            row[f"{o}_off"] = int(alone[o][0])
            if alone[o][0]:
                row["cause"] = o
                break
        else:
            # a pair can fix only if its second fault fires once the first is off
            pairs = [(a, b) for a, b in combinations(OWNERS, 2)
                     if ((a in onsets and b in alone[a][1]) or (b in onsets and a in alone[b][1]))
                     and self.run(item_id, seed, frozenset((a, b)))[0]]
            row["fixing_pairs"] = ";".join("+".join(p) for p in pairs)
            every = bool(pairs) or self.run(item_id, seed, frozenset(OWNERS))[0]
            row["all_off"] = "" if pairs else int(every)
            row["cause"] = COMPOUND if every else EXTERNAL
        row["replays"] = self.replays - start
        return row


def causes_table(package: MemoryPackage, bench: Benchmark, scores: pd.DataFrame, max_turns: int = MAX_TURNS,
                 rates: Rates = RATES) -> pd.DataFrame:
    """The hidden cause of every failed episode in `scores` (columns item_id, seed, success, error)."""
    rep = Replayer(package, bench, max_turns, rates)
    failed = scores[~scores["success"].astype(bool)]
    if not world(bench.world).counterfactual:  # nothing to replay: every failure stays unlabelled, none is scored
        rows = [{**dict.fromkeys(COLUMNS, ""), "item_id": str(r.item_id), "seed": int(r.seed), "cause": UNLABELLED,
                 "replays": 0} for r in failed.itertuples(index=False)]
        return pd.DataFrame(rows, columns=COLUMNS)
    rows = [rep.cause(str(r.item_id), int(r.seed), "" if pd.isna(r.error) else str(r.error))
            for r in failed.itertuples(index=False)]
    return pd.DataFrame(rows, columns=COLUMNS)
