"""The diagnoser under perturbation, scored against counterfactual ground truth.

    python benchmarks/bench_diagnosis.py [--quick] [--bench DIR]

Each row changes one thing (the turn budget, the cards, the package, the simulator's fault rates), evaluates the
package on dev, replays every failed episode with one owner's faults off at a time (the hidden causes), diagnoses it
from its traces alone, and scores the diagnosis. Columns: n failed (labelled), accuracy on single-cause episodes the
diagnoser covered, its coverage (share not `unknown`), compound episodes and the share credited (it named an owner
whose fix is needed), and the outcome-only baseline fitted on train and scored on dev. The last line is the headline:
the worst row's accuracy."""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from components.env import quiet_offline  # noqa: E402

quiet_offline()

from components.evolution.diagnose import diagnose  # noqa: E402
from components.evolution.localization import _eid, fit_outcome_only, localization  # noqa: E402
from components.memory import load_package  # noqa: E402
from components.models.counterfactual import causes_table  # noqa: E402
from components.models.simulated import RATES, Rates, SimulatedAgent  # noqa: E402
from components.runtime.episode import run_episode  # noqa: E402
from components.runtime.evaluate import tables  # noqa: E402
from components.worlds import load_benchmark, world  # noqa: E402

PACKAGES = ROOT / "data" / "packages"
ROUTED = """name: {name}
wm:
  board: {board}
  max_entries: 2
  bind_on: []
delivery:
  - use: {use}
    at: {at}
checkers: []
"""
CARD = "---\nid: {id}\ntype: procedure\ntrigger:\n  event: intent_recorded\n  tool: {tool}\nsource: bench\n---\n{body}\n"
WRONG_CANCEL = "When you call `cancel_pending_order`, the `reason` must be exactly 'customer request'."
UNRELATED = ("`modify_pending_order_address` needs a normalized address: call `validate_address` with the customer's "
             "address first, then pass the normalized fields it returns exactly as given.")
NEGATED = {
    "cancel_pending_order": "When you call `cancel_pending_order`, the `reason` must not be 'no longer needed' or "
                            "'ordered by mistake': pass the customer's own words.",
    "return_delivered_order_items": "`return_delivered_order_items` must never refund to the original payment method "
                                    "of the order; use the account's first method.",
    "exchange_delivered_order_items": "For `exchange_delivered_order_items` there is no need to check `available`: "
                                      "use the customer's first choice.",
    "modify_pending_order_address": "`modify_pending_order_address` takes the customer's address as given; do not "
                                    "call `validate_address`.",
}
PARAPHRASED = {
    "cancel_pending_order": "With `cancel_pending_order`, the reason has to be one of 'no longer needed' and "
                            "'ordered by mistake', whatever words the customer used.",
    "return_delivered_order_items": "A refund made with `return_delivered_order_items` goes back to the method the "
                                    "order was paid with.",
    "exchange_delivered_order_items": "Ahead of `exchange_delivered_order_items`, see whether the wanted variant is in "
                                      "stock; otherwise take the customer's alternative.",
    "modify_pending_order_address": "For `modify_pending_order_address`, normalize the customer's address with "
                                    "`validate_address` beforehand and send back its fields.",
}


def card_package(root: Path, name: str, cards: dict[str, str], use="event_cards", at="intent_recorded",
                 board="true") -> Path:
    pkg = root / name
    (pkg / "em" / "procedure").mkdir(parents=True)
    (pkg / "manifest.yaml").write_text(ROUTED.format(name=name, use=use, at=at, board=board))
    for i, (tool, body) in enumerate(cards.items()):
        (pkg / "em" / "procedure" / f"c{i}.md").write_text(CARD.format(id=f"c{i}", tool=tool, body=body))
    return pkg


def scaled(k: float) -> Rates:
    """Every fault rate times k (the E fault is 1 - p_base, the chance of missing a rule stated only in the policy)."""
    return replace(RATES, p_base=max(0.0, 1 - (1 - RATES.p_base) * k), attention=RATES.attention * k,
                   p_skip_confirm=min(1.0, RATES.p_skip_confirm * k), p_early_done=min(1.0, RATES.p_early_done * k),
                   drift=RATES.drift * k, drift_max=min(1.0, RATES.drift_max * k))


def evaluate(pkg, bench, items, seeds, max_turns, rates):
    agent = SimulatedAgent(rates)
    t = tables([run_episode(pkg, bench, i, s, agent, max_turns) for i in items for s in seeds])
    return t, causes_table(pkg, bench, t.scores, max_turns, rates)


def row(name, pkg_dir, bench, n_items, seeds, max_turns=40, rates=RATES) -> dict:
    pkg = load_package(pkg_dir)
    train, train_causes = evaluate(pkg, bench, bench.ids("train")[:n_items], seeds, max_turns, rates)
    dev, dev_causes = evaluate(pkg, bench, bench.ids("dev")[:n_items], seeds, max_turns, rates)
    d = diagnose(dev.traces, dev.scores, pkg, bench.write_tools, name, targets=bench.meta.get("targets"))
    loc = localization(d.findings_frame(), _eid(dev_causes), _eid(dev.scores),
                       fit_outcome_only(_eid(train_causes), _eid(train.scores)))
    return {"row": name, **loc}


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="12 items per split, one seed")
    ap.add_argument("--bench", default=str(ROOT / "data/benchmarks/retail"))
    ap.add_argument("--items", type=int, help="items per split (default 60, quick 12)")
    ap.add_argument("--seeds", type=int, help="seeds per item (default 3, quick 1)")
    ap.add_argument("--only", help="comma-separated row names to run")
    a = ap.parse_args(argv)
    if not (Path(a.bench) / "meta.json").exists():
        world("retail").materialize(a.bench, 0)
    bench = load_benchmark(a.bench)
    n_items, seeds = (12, [0]) if a.quick else (60, [0, 1, 2])
    n_items, seeds = a.items or n_items, list(range(a.seeds)) if a.seeds else seeds
    tmp = Path(tempfile.mkdtemp(prefix="bench-diagnosis-"))
    try:
        rows = [
            ("max_turns 5", PACKAGES / "seed", {"max_turns": 5}),
            ("max_turns 8", PACKAGES / "seed", {"max_turns": 8}),
            ("max_turns 40", PACKAGES / "seed", {"max_turns": 40}),
            ("wrong card", card_package(tmp, "wrong", {"cancel_pending_order": WRONG_CANCEL}), {}),
            ("wrong card + unrelated", card_package(tmp, "wrong-unrelated", {"cancel_pending_order": WRONG_CANCEL,
                                                                            "modify_pending_order_address": UNRELATED},
                                                    use="all_cards", at="turn_start"), {}),
            ("negated cards", card_package(tmp, "negated", NEGATED), {}),
            ("paraphrased cards", card_package(tmp, "paraphrased", PARAPHRASED), {}),
            ("all-skills", PACKAGES / "all-skills", {}),
            ("none", PACKAGES / "none", {}),
            ("seed", PACKAGES / "seed", {}),
            ("fault rates x0.5", PACKAGES / "seed", {"rates": scaled(0.5)}),
            ("fault rates x2", PACKAGES / "seed", {"rates": scaled(2.0)}),
            ("two faults", card_package(tmp, "two-faults", {"cancel_pending_order": WRONG_CANCEL}, board="false"), {}),
        ]
        only = set(a.only.split(",")) if a.only else None
        out = [row(name, pkg, bench, n_items, seeds, **kw) for name, pkg, kw in rows if only is None or name in only]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    pct = lambda x: "   -" if x is None else f"{x:5.1%}"  # noqa: E731
    print(f"{'row':<24} {'n failed':>8} {'accuracy':>9} {'coverage':>9} {'compound':>9} {'credited':>9} {'outcome-only':>13}")
    for r in out:
        print(f"{r['row']:<24} {r['n']:>8} {pct(r['accuracy']):>9} {pct(r['coverage']):>9} {r['compound']['n']:>9} "
              f"{pct(r['compound']['accuracy']):>9} {pct(r['outcome_only_accuracy']):>13}")
    worst = min((r["accuracy"] for r in out if r["accuracy"] is not None), default=0.0)
    print(f"worst-row localization accuracy: {worst:.1%}")
    return out


if __name__ == "__main__":
    main()
