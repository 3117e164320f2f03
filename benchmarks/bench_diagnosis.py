"""The diagnoser under perturbation, scored against counterfactual ground truth, in both worlds.

    python benchmarks/bench_diagnosis.py [--quick] [--world retail|airline|both] [--receipts explained|coded|silent]
                                         [--bench DIR] [--only ROWS] [--json FILE]

Each row changes one thing (the turn budget, the cards, the package, its checkers, the simulator's fault rates),
evaluates the package on train and dev, replays every failed episode with one owner's faults off at a time (the
hidden causes), diagnoses dev from its traces alone, and scores the diagnosis over every scored failed episode
(`components.evolution.localization`: compound ones count as right only when the named owner's switch is part of a
minimal set of two or three switches that fixes them; `unknown` is a miss; the baselines are scored by the same rule). The baselines are fitted on the row's train split and scored on its dev:
one constant owner, the best owner per outcome, and the trace rule (the best owner per pattern of glance-level trace
signals, `components.evolution.trace_rule`). Columns: n failed (labelled), coverage, accuracy, compound n and the
share right there (and what the best constant owner would get on them), how many of them no set of up to three
switches fixes (they take all four: no owner named alone counts as right there), the ceiling (the share of n that has
a right answer at all), the three baselines, the margin over the
trace rule, the trace rule again with its rule-refusal signal blanked (what it would read in a world whose refusals
say nothing), and whether the row passes (coverage >= 50%, accuracy >= 85%, margin >= 10 points). The last lines
count the rows that pass and name the worst. The last five rows are failure modes where that glance misleads,
built from strategies a real package could carry (registered here, not in the library): a router that delivers a
tool's card only once a write of that tool has been settled (`cards_after_write`: the card arrives after the write it
was for; the cause is rho, a glance reads E or nothing), work dropped with no trace under three times faster
forgetting (the board hidden, or a ledger of one entry: W, a glance reads nothing), both at once, and a checker that
bounces about 30% of writes whatever they are (`false_alarm`: no owner's switch fixes its episodes). `--receipts` runs every row on the world's benchmark in that receipt
mode (`benchmark.receipts`: `silent` lets policy-breaking writes through, so no rule refusal is ever seen), built
under a temporary directory with its train gold (`gold_train.jsonl`), which the diagnosis of dev may use through
train's outcome evidence (`components.evolution.outcomes.TrainEvidence`); dev gold is read by scoring alone."""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import replace
from typing import NamedTuple
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from components.env import quiet_offline  # noqa: E402

quiet_offline()

from components.evolution.diagnose import diagnose, evidence_from_train  # noqa: E402
from components.evolution.infer import policy_today  # noqa: E402
from components.evolution.localization import _eid, fit_baselines, localization  # noqa: E402
from components.evolution.trace_rule import signals_frame  # noqa: E402
from components.memory import load_package  # noqa: E402
from components.memory.events import DELIVERY_EVENTS, PRE_WRITE  # noqa: E402
from components.memory.strategies import (  # noqa: E402
    CHECKERS as CHECKER_REGISTRY,
    DELIVERERS,
    CheckContext,
    Delivery,
    DeliveryContext,
    Verdict,
)  # noqa: E402
from components.models.counterfactual import causes_table  # noqa: E402
from components.models.simulated import RATES, Rates, SimulatedAgent  # noqa: E402
from components.params import BenchmarkParams  # noqa: E402
from components.runtime.episode import MAX_TURNS, run_episode  # noqa: E402
from components.runtime.evaluate import tables  # noqa: E402
from components.worlds import load_benchmark  # noqa: E402
from components.worlds.base import ReceiptMode, train_gold  # noqa: E402

WRONG_CANCEL = "When you call `cancel_pending_order`, the `reason` must be exactly 'customer request'."
UNRELATED = (
    "`modify_pending_order_address` needs a normalized address: call `validate_address` with the customer's "
    "address first, then pass the normalized fields it returns exactly as given."
)
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


PACKAGES = ROOT / "data" / "packages"
ROUTED = """name: {name}
wm:
  board: {board}
  max_entries: 2
  bind_on: []
delivery:
  - use: {use}
    at: {at}
checkers: {checkers}
"""
CHECKED = """name: {name}
wm:
  board: true
  max_entries: 2
  bind_on: []
delivery: []
checkers:
  - use: completion_requires_receipts
    at: agent_declares_done
  - use: confirm_before_write
    at: pre_write
"""
CHECKERS = "\n  - use: confirm_before_write\n    at: pre_write"
CARD = (
    "---\nid: {id}\ntype: procedure\ntrigger:\n  event: intent_recorded\n  tool: {tool}\nsource: bench\n---\n{body}\n"
)


class Cards(NamedTuple):
    """A world's perturbed cards: a wrong one, an unrelated one, and its rules negated and paraphrased (inside the
    world's grammar, so the simulated agent reads them)."""

    wrong: dict[str, str]
    unrelated: dict[str, str]
    negated: dict[str, str]
    paraphrased: dict[str, str]


RETAIL = Cards(
    wrong={
        "cancel_pending_order": "When you call `cancel_pending_order`, the `reason` must be exactly 'customer request'."
    },
    unrelated={
        "modify_pending_order_address": "`modify_pending_order_address` needs a normalized address: call "
        "`validate_address` with the customer's address first, then pass the normalized fields it returns "
        "exactly as given."
    },
    negated={
        "cancel_pending_order": "When you call `cancel_pending_order`, the `reason` must not be 'no longer needed' or "
        "'ordered by mistake': pass the customer's own words.",
        "return_delivered_order_items": "`return_delivered_order_items` must never refund to the original payment "
        "method of the order; use the account's first method.",
        "exchange_delivered_order_items": "For `exchange_delivered_order_items` there is no need to check "
        "`available`: use the customer's first choice.",
        "modify_pending_order_address": "`modify_pending_order_address` takes the customer's address as given; do "
        "not call `validate_address`.",
    },
    paraphrased={
        "cancel_pending_order": "With `cancel_pending_order`, the reason has to be one of 'no longer needed' and "
        "'ordered by mistake', whatever words the customer used.",
        "return_delivered_order_items": "A refund made with `return_delivered_order_items` goes back to the method "
        "the order was paid with.",
        "exchange_delivered_order_items": "Ahead of `exchange_delivered_order_items`, see whether the wanted variant "
        "is in stock; otherwise take the customer's alternative.",
        "modify_pending_order_address": "For `modify_pending_order_address`, normalize the customer's address with "
        "`validate_address` beforehand and send back its fields.",
    },
)
AIRLINE = Cards(
    wrong={"issue_compensation": "When you call `issue_compensation`, always pay it as cash: pass `form` 'cash'."},
    unrelated={
        "upgrade_cabin": "`upgrade_cabin` is paid only with a credit card on the account: pick the member's "
        "`credit_card` payment method from `get_user_details`."
    },
    negated={
        "cancel_reservation": "`cancel_reservation` must never refund to the original payment method of the "
        "reservation; use the account's first method.",
        "issue_compensation": "`issue_compensation` is never paid as a certificate: pass `form` 'cash'.",
        "upgrade_cabin": "`upgrade_cabin` need not be paid with a credit card: use the method the reservation was "
        "paid with.",
        "update_passenger_name": "`update_passenger_name` does not take names in upper case: pass them as given.",
    },
    paraphrased={
        "cancel_reservation": "A refund made with `cancel_reservation` goes back to the method the reservation was "
        "paid with.",
        "issue_compensation": "For `issue_compensation`, set `form` to 'certificate': compensation comes as a "
        "certificate.",
        "upgrade_cabin": "Charge `upgrade_cabin` to the member's credit card, whatever paid for the reservation.",
        "update_passenger_name": "For `update_passenger_name`, write the names in capital letters.",
    },
)
WORLDS = {"retail": (RETAIL, PACKAGES), "airline": (AIRLINE, PACKAGES / "airline")}


# -- perturbations where a glance at the trace misleads (issue 24): strategies a real package could carry --------------


def cards_after_write():
    """A router keyed on receipts: a card about a write is delivered once the ledger holds a settled write of its
    tool, so it arrives AFTER the write it was for (it helps a second write of that tool, never the first). A glance
    sees a card about the tool in the episode (or nothing at all, in a silent world); the cause is routing (rho)."""

    def deliver(ctx: DeliveryContext) -> Delivery:
        written = {e.tool for e in ctx.ledger.entries if e.status == "done"}
        return Delivery(
            card_ids=tuple(
                c.id for c in ctx.cards.values() if c.meta.trigger is not None and c.meta.trigger.tool in written
            )
        )

    return deliver


def false_alarm(*, rate: float = 0.3):
    """A checker that bounces correct work: a write whose tool and arguments hash under `rate` is sent back as
    suspicious, whatever it is (a fraud heuristic with false positives). No switch of the agent fixes it: a glance
    sees a bounced write (discipline, C); its cause is the package's checker, which no owner's fault explains."""
    from components.models.simulated import coin

    def check(ctx: CheckContext) -> Verdict:
        call = ctx.draft.tool_call
        if call is None or call.name not in ctx.write_tools:
            return Verdict(True)
        if coin(0, "false-alarm", call.name, json.dumps(call.args, sort_keys=True)) >= rate:
            return Verdict(True)
        return Verdict(False, f"`{call.name}` looks unusual: review it before writing")

    return check


@contextmanager
def perturbations():
    """The two strategies above, registered while the table runs (never in the process's registry for good)."""
    with (
        DELIVERERS.scoped("cards_after_write", cards_after_write, events=DELIVERY_EVENTS, delivers_cards=True),
        CHECKER_REGISTRY.scoped("false_alarm", false_alarm, events={PRE_WRITE}),
    ):
        yield


TRIGGER_TOOL = re.compile(r"^(trigger:\n(?:  .*\n)*?  tool: )(\S+)$", re.M)


def rotated_triggers(root: Path, name: str, source: Path) -> Path:
    """`source` (the world's `reference`) with every card's trigger moved to another write's intent: the tools its
    cards are keyed on, in order, each card taking the next one's (a cycle, so every card moves and every write
    still has one card keyed on it). Text, event, manifest and checkers stay as they are. A card thus exists, and is
    delivered, but at the intent of another write: in an episode without that write it never arrives; with it, it
    arrives on the turn the agent does that other write, and the write it states rules for gets a card about
    another write (irrelevant there: it dilutes). Its failures' cause is routing (rho: with every card about the
    action in front of the agent, undiluted, they are fixed), while a glance sees a card about another tool at the
    write, or nothing, as a missing card would look. Chosen over moving the event alone: keyed on its own tool, a
    card at `turn_start` still fires while its write is pending and stays in that turn's memory, and one at
    `pre_write` is delivered at its own drafted write and bounces the draft so the agent reads it: both still
    reach their write, so neither is a routing fault."""
    pkg = root / name
    shutil.copytree(source, pkg)
    files = sorted((pkg / "em").rglob("*.md"))
    keyed = [(f, m) for f in files if (m := TRIGGER_TOOL.search(f.read_text())) is not None]
    tools = [m.group(2) for _f, m in keyed]
    for i, (f, m) in enumerate(keyed):
        moved = next((t for t in tools[i + 1 :] + tools[:i] if t != m.group(2)), m.group(2))
        text = f.read_text()
        f.write_text(text[: m.start(2)] + moved + text[m.end(2) :])
    return pkg


def card_package(
    root: Path, name: str, cards: dict[str, str], use="event_cards", at="intent_recorded", board="true", checkers="[]"
) -> Path:
    pkg = root / name
    (pkg / "em" / "procedure").mkdir(parents=True)
    (pkg / "manifest.yaml").write_text(ROUTED.format(name=name, use=use, at=at, board=board, checkers=checkers))
    for i, (tool, body) in enumerate(cards.items()):
        (pkg / "em" / "procedure" / f"c{i}.md").write_text(CARD.format(id=f"c{i}", tool=tool, body=body))
    return pkg


def wm_package(root: Path, name: str, board: str = "true", max_entries: int = 2, checkers: str = "[]") -> Path:
    """The seed with its working memory changed (the board hidden, fewer ledger entries) or a checker added."""
    pkg = root / name
    pkg.mkdir(parents=True)
    (pkg / "manifest.yaml").write_text(
        f"name: {name}\nwm:\n  board: {board}\n  max_entries: {max_entries}\n"
        f"  bind_on: []\ndelivery: []\ncheckers: {checkers}\n"
    )
    return pkg


def checked_package(root: Path, name: str) -> Path:
    """The seed with the two checkers installed: a bounced write is the C fault's only trace."""
    pkg = root / name
    pkg.mkdir(parents=True)
    (pkg / "manifest.yaml").write_text(CHECKED.format(name=name))
    return pkg


def scaled(k: float) -> Rates:
    """Every fault rate times k (the E fault is 1 - p_base, the chance of missing a rule stated only in the policy)."""
    return replace(
        RATES,
        p_base=max(0.0, 1 - (1 - RATES.p_base) * k),
        attention=RATES.attention * k,
        p_skip_confirm=min(1.0, RATES.p_skip_confirm * k),
        p_early_done=min(1.0, RATES.p_early_done * k),
        drift=RATES.drift * k,
        drift_max=min(1.0, RATES.drift_max * k),
    )


def drifting(k: float) -> Rates:
    """Forgetting k times faster (the drift hazard and its ceiling), every other rate as is: work dropped silently."""
    return replace(RATES, drift=RATES.drift * k, drift_max=min(1.0, RATES.drift_max * k))


def evaluate(pkg, bench, items, seeds, max_turns, rates):
    agent = SimulatedAgent(rates)
    t = tables([run_episode(pkg, bench, i, s, agent, max_turns) for i in items for s in seeds])
    return t, causes_table(pkg, bench, t.scores, max_turns, rates)


def spread(ids: list[str], n: int) -> list[str]:
    """n items taken evenly across a split (its ids are grouped by family: the first n would miss whole families)."""
    return ids if n >= len(ids) else [ids[i * len(ids) // n] for i in range(n)]


def row(name, pkg_dir, bench, n_items, seeds, max_turns=MAX_TURNS, rates=RATES) -> dict:
    pkg = load_package(pkg_dir)
    targets = bench.meta.get("targets")
    train, train_causes = evaluate(pkg, bench, spread(bench.ids("train"), n_items), seeds, max_turns, rates)
    dev, dev_causes = evaluate(pkg, bench, spread(bench.ids("dev"), n_items), seeds, max_turns, rates)
    # dev is diagnosed from its traces, and from what train's traces showed against train's gold (dev gold is the
    # rubric's alone)
    train_ev = evidence_from_train(
        train.traces, train.scores, pkg, bench.write_tools, train_gold(bench), targets, policy_today(bench.policy)
    )
    d = diagnose(dev.traces, dev.scores, pkg, bench.write_tools, name, targets=targets, train=train_ev)
    fitted = fit_baselines(
        _eid(train_causes), _eid(train.scores), signals_frame(train.traces, train.scores, bench.write_tools, targets)
    )
    loc = localization(
        d.findings_frame(),
        _eid(dev_causes),
        _eid(dev.scores),
        signals_frame(dev.traces, dev.scores, bench.write_tools, targets),
        fitted,
    )
    return {"world": bench.world, "receipts": bench.receipts.value, "row": name, **loc, **over_outcome(loc)}


OUTCOME_BAR, OUTCOME_MARGIN = 0.85, 0.05  # issue 40's bar: accuracy >= 85% and >= the outcome-only baseline + 5


def over_outcome(loc: dict) -> dict:
    """The margin over the outcome-only baseline, and whether the row clears issue 40's bar (accuracy >= 85% and
    >= outcome-only + 5 points); `passes` stays the trace-rule bar of `components.evolution.localization`."""
    acc, base = loc.get("accuracy"), loc.get("outcome_only_accuracy")
    margin = None if acc is None or base is None else acc - base
    return {
        "outcome_margin": margin,
        "clears_outcome": margin is not None and acc >= OUTCOME_BAR and margin >= OUTCOME_MARGIN - 1e-9,
    }


def rows_of(world_name: str, tmp: Path) -> list[tuple[str, Path, dict]]:
    cards, shipped = WORLDS[world_name]
    tmp = tmp / world_name
    wrong = cards.wrong
    return [
        ("max_turns 5", shipped / "seed", {"max_turns": 5}),
        ("max_turns 8", shipped / "seed", {"max_turns": 8}),
        ("max_turns 40", shipped / "seed", {"max_turns": 40}),
        ("wrong card", card_package(tmp, "wrong", wrong), {}),
        (
            "wrong card + unrelated",
            card_package(tmp, "wrong-unrelated", wrong | cards.unrelated, use="all_cards", at="turn_start"),
            {},
        ),
        ("negated cards", card_package(tmp, "negated", cards.negated), {}),
        ("paraphrased cards", card_package(tmp, "paraphrased", cards.paraphrased), {}),
        ("all-skills", shipped / "all-skills", {}),
        ("all-skills 8 turns", shipped / "all-skills", {"max_turns": 8}),
        ("none", shipped / "none", {}),
        ("seed", shipped / "seed", {}),
        ("fault rates x0.5", shipped / "seed", {"rates": scaled(0.5)}),
        ("fault rates x2", shipped / "seed", {"rates": scaled(2.0)}),
        ("two faults", card_package(tmp, "two-faults", wrong, board="false"), {}),
        ("checkers", checked_package(tmp, "checkers"), {}),
        ("checkers + wrong card", card_package(tmp, "checkers-wrong", wrong, checkers=CHECKERS), {}),
        ("reference", shipped / "reference", {}),
        # where a glance misleads: a card arriving after its write (rho, read as E or as nothing); work dropped with
        # no trace (W, read as E or nothing): the board hidden, or a ledger of one entry, under faster forgetting;
        # both at once; a checker that bounces correct work (its cause no owner's switch fixes)
        ("card after its write", card_package(tmp, "late", cards.paraphrased, use="cards_after_write"), {}),
        ("no board drift x3", wm_package(tmp, "no-board", board="false"), {"rates": drifting(3.0)}),
        ("one ledger entry drift x3", wm_package(tmp, "one-entry", max_entries=1), {"rates": drifting(3.0)}),
        (
            "late card no board",
            card_package(tmp, "late-no-board", cards.paraphrased, use="cards_after_write", board="false"),
            {"rates": drifting(3.0)},
        ),
        (
            "false-alarm checker",
            wm_package(tmp, "false-alarm", checkers="\n  - use: false_alarm\n    at: pre_write"),
            {},
        ),
        # a card that exists but is delivered at another write's intent (rho, read as a missing card: E)
        ("rotated triggers", rotated_triggers(tmp, "rotated", shipped / "reference"), {}),
    ]


def _bench_of(
    world_name: str, given: str | None, receipts: ReceiptMode = ReceiptMode.explained, tmp: Path | None = None
):
    """The benchmark at `given`, or the world's default one (seed 0, the world's defaults, as `ratchet bench
    materialize` writes it) in `receipts` mode, materialized under `tmp` (so its train gold is there)."""
    if given:
        bench = load_benchmark(given)
        if bench.receipts is not receipts:
            raise SystemExit(f"--bench {given}: its receipts are {bench.receipts.value}, not {receipts.value}")
        return bench
    out = BenchmarkParams(
        world=world_name,
        receipts=receipts,
        out=str((tmp or Path(tempfile.mkdtemp())) / f"bench-{world_name}-{receipts.value}"),
    )
    return load_benchmark(out.materialize())


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="12 items per split, one seed")
    ap.add_argument("--world", choices=["retail", "airline", "both"], default="both")
    ap.add_argument(
        "--receipts",
        choices=[m.value for m in ReceiptMode],
        default=ReceiptMode.explained.value,
        help="what a broken rule's receipt tells the agent (benchmark.receipts; default explained)",
    )
    ap.add_argument("--bench", help="the benchmark directory (one world only; default data/benchmarks/<world>)")
    ap.add_argument("--items", type=int, help="items per split (default 60, quick 12)")
    ap.add_argument("--seeds", type=int, help="seeds per item (default 3, quick 1)")
    ap.add_argument("--only", help="comma-separated row names to run")
    ap.add_argument("--json", help="also write the rows to this file")
    a = ap.parse_args(argv)
    worlds = ["retail", "airline"] if a.world == "both" else [a.world]
    if a.bench and len(worlds) > 1:
        worlds = [load_benchmark(a.bench).world] if (Path(a.bench) / "meta.json").exists() else ["retail"]
    n_items, seeds = (12, [0]) if a.quick else (60, [0, 1, 2])
    n_items, seeds = a.items or n_items, list(range(a.seeds)) if a.seeds else seeds
    only = set(a.only.split(",")) if a.only else None
    pct = lambda x: "     -" if x is None else f"{x:6.1%}"  # noqa: E731
    print(f"receipts: {a.receipts}")
    print(
        f"{'world':<8} {'row':<24} {'n':>4} {'cover':>6} {'acc':>6} {'comp':>4} {'nofix':>5} {'right':>6} {'const':>6} "
        f"{'ceil':>6} "
        f"{'constant':>8} {'outcome':>7} {'trace':>6} {'margin':>6} {'no-refusal':>10} {'vs-out':>6} bar pass",
        flush=True,
    )
    tmp = Path(tempfile.mkdtemp(prefix="bench-diagnosis-"))
    out: list[dict] = []
    try:
        with perturbations():
            for w in worlds:
                bench = _bench_of(w, a.bench, ReceiptMode(a.receipts), tmp)
                for name, pkg, kw in rows_of(w, tmp):
                    if only is not None and name not in only:
                        continue
                    r = row(name, pkg, bench, n_items, seeds, **kw)
                    out.append(r)
                    c = r["compound"]
                    margin = "     -" if r["margin"] is None else f"{r['margin'] * 100:+6.1f}"
                    out_margin = "     -" if r["outcome_margin"] is None else f"{r['outcome_margin'] * 100:+6.1f}"
                    print(
                        f"{r['world']:<8} {r['row']:<24} {r['n']:>4} {pct(r['coverage'])} {pct(r['accuracy'])} "
                        f"{c['n']:>4} {c['no_fix']:>5} "
                        f"{pct(c['accuracy'])} {pct(c['constant'])} {pct(r['ceiling'])} {pct(r['constant_accuracy']):>8} "
                        f"{pct(r['outcome_only_accuracy']):>7} {pct(r['trace_rule_accuracy'])} {margin} "
                        f"{pct(r['trace_rule_no_refusal_accuracy']):>10} {out_margin} "
                        f"{'ok ' if r['clears_outcome'] else 'NO '} "
                        f"{'yes' if r['passes'] else 'NO ' + ','.join(k for k, ok in r['checks'].items() if not ok)}",
                        flush=True,
                    )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1, sort_keys=True))
    scored = [r for r in out if r["accuracy"] is not None]
    worst = min(scored, key=lambda r: r["accuracy"], default=None)
    print(
        f"rows clearing accuracy >= 85% and >= outcome-only + 5: {sum(r['clears_outcome'] for r in out)} of {len(out)}"
    )
    print(f"rows passing: {sum(r['passes'] for r in out)} of {len(out)}")
    print(
        "worst-row localization accuracy: "
        + (f"{worst['accuracy']:.1%} ({worst['world']}, {worst['row']})" if worst else "-")
    )
    return out


if __name__ == "__main__":
    main()
