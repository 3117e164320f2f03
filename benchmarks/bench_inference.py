"""Inference on random worlds: does a rule drawn at random from the grammar come back from its train rows?

    python benchmarks/bench_inference.py [--quick] [--worlds N] [--train N] [--fresh N]

For each form of the grammar (`components.worlds.outcome_rules`), N random rules are drawn: values that are not
round (thresholds anywhere in 5..95, in either direction; factors that are ratios of small integers; odd caps,
fees and tables), conditions on random features. Train rows are drawn at random and their gold computed by the
rule exactly as a world computes it (`outcome_rules.evaluate`: exact rationals, rounded to the cent or the unit,
halves up); inference (`components.evolution.infer.infer_field`, two folds) sees those rows only. The inferred rule
is then judged on fresh rows from the same distribution: a world counts as recovered when the inferred rule gives the
true value on at least 99% of them. The last line is the share of worlds recovered over every form.

With `--variants N`, the same question on the built-in worlds themselves: for N random variants of each world
(`random_rules`), train rows come from the `seed` package's episodes on a benchmark of the variant (world seed 0,
gold through the world's own formulas), and the inferred rule of each field is judged on the rows of a second
benchmark of the same variant (world seed 1: other customers, orders and amounts); a field counts as recovered when
its rule gives the gold on >= 99% of those rows.

`tests/test_random_worlds.py` runs the same draws through hypothesis (`draw_world`); `tests/test_benchmarks.py` runs
this script at --quick.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from fractions import Fraction
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from components.evolution.infer import Row, infer_field  # noqa: E402
from components.worlds.numbers import CENT, UNIT, q  # noqa: E402
from components.worlds.outcome_rules import (  # noqa: E402
    Cond,
    FieldRule,
    Records,
    Term,
    evaluate,
    indicator,
    picked,  # noqa: E402
    render,
)

FIELD = "x"
TIERS = ("regular", "silver", "gold")
KINDS = ("card", "gift_card", "paypal", "certificate")
FARES = ("basic", "economy", "flex", "business")
MONEY = ("o.total", "o.price")
COUNTS = ("o.age", "o.days", "o.late")
COLORS = ("red", "blue", "green", "black")


def features(rng: random.Random) -> dict:
    """One row's features: amounts in cents, whole numbers (ages, days, counts), categories, an id, and the
    write's own arguments (`@n`, `@m`), and a read's list of records (`o.items`: an id, a colour, a flag and a size
    each) with its count, as a read of a real world shows them."""
    row = {
        "o.total": q(rng.randint(500, 50000)) / 100,
        "o.price": q(rng.randint(500, 30000)) / 100,
        "o.age": rng.randint(0, 100),
        "o.days": rng.randint(0, 60),
        "o.late": rng.randint(1, 12),
        "u.tier": rng.choice(TIERS),
        "u.kind": rng.choice(KINDS),
        "r.fare": rng.choice(FARES),
        "r.id": f"id_{rng.randint(10**5, 10**6)}",
        "@n": rng.randint(0, 6),
        "@m": rng.randint(0, 4),
    }
    irng = random.Random(str(sorted(row.items())))  # its own draws: the other features as they always were
    items = Records(
        {
            "id": f"v{irng.randint(10**5, 10**6)}",
            "color": irng.choice(COLORS),
            "ok": irng.random() < 0.6,
            "size": irng.randint(1, 5),
        }
        for _ in range(irng.randint(1, 5))
    )
    return {**row, "o.items": items, "len(o.items)": len(items)}


def _ratio(rng: random.Random, lo: float, hi: float) -> Fraction:
    """A factor that is a ratio of small integers, in [lo, hi], not 1."""
    while True:
        k = Fraction(rng.randint(1, 40), rng.randint(1, 12))
        if lo <= k <= hi and k != 1:
            return k


def _threshold(rng: random.Random, path: str) -> Cond:
    hi = {"o.age": 95, "o.days": 55, "o.late": 11}[path]
    return Cond(path, rng.choice([">", ">=", "<", "<="]), rng.randint(5, hi))


def _category(rng: random.Random) -> Cond:
    path, values = rng.choice([("u.tier", TIERS), ("u.kind", KINDS), ("r.fare", FARES)])
    return Cond(path, "is", rng.choice(values))


def _factor_conds(rng: random.Random, n: int) -> list[Cond]:
    """n conditions on distinct features: thresholds and categories."""
    pool = [lambda p=p: _threshold(rng, p) for p in COUNTS] + [lambda: _category(rng)] * 2
    out: list[Cond] = []
    while len(out) < n:
        c = rng.choice(pool)()
        if c.path not in {o.path for o in out}:
            out.append(c)
    return out


FORMS = (
    "const",
    "equal",
    "share",
    "threshold",
    "threshold_const",
    "category",
    "product2",
    "product3",
    "const_product",
    "table",
    "table_factor",
    "table2",
    "cap",
    "sum",
    "one_of",
    "each",
    "each_sum",
    "pick",
)


def draw_world(form: str, seed: int) -> FieldRule:
    """A rule of `form` with values drawn at random (seeded)."""
    rng = random.Random(f"{form}:{seed}")
    money = rng.choice(MONEY)
    if form == "const":
        return FieldRule(FIELD, Term("const", q(rng.randint(100, 9999)) / 100))
    if form == "equal":
        return FieldRule(FIELD, Term("equal", None, money))
    if form == "share":
        return FieldRule(FIELD, Term("share", _ratio(rng, Fraction(1, 10), Fraction(3)), money))
    if form == "threshold":  # a percent fee past (or within) an age
        return FieldRule(
            FIELD,
            Term("equal", None, money),
            factors=((_threshold(rng, "o.age"), 1 - Fraction(rng.randint(2, 40), 100)),),
        )
    if form == "threshold_const":  # a flat fee past (or within) an age
        return FieldRule(
            FIELD, Term("const", q(rng.randint(2, 30))), _threshold(rng, "o.age"), Term("const", q(0)), quantum=UNIT
        )
    if form == "category":
        c = _category(rng)
        return FieldRule(
            FIELD, Term("const", rng.choice(["travel_credit", "voucher", "none"])), c, Term("equal", None, "r.id")
        )
    if form in ("product2", "product3"):
        conds = _factor_conds(rng, 2 if form == "product2" else 3)
        return FieldRule(
            FIELD,
            Term("equal", None, money),
            factors=tuple((c, _ratio(rng, Fraction(1, 2), Fraction(5, 2))) for c in conds),
        )
    if form == "const_product":  # compensation: a base amount, times a factor past a delay, times one by tier
        t, c = _threshold(rng, "o.age"), Cond("u.tier", "is", rng.choice(TIERS))
        return FieldRule(
            FIELD,
            Term("const", q(rng.randint(40, 300))),
            factors=((t, _ratio(rng, Fraction(3, 2), Fraction(4))), (c, _ratio(rng, Fraction(3, 2), Fraction(3)))),
            quantum=UNIT,
        )
    if form in ("table", "table_factor"):
        path, values = rng.choice([("u.tier", TIERS), ("r.fare", FARES), ("u.kind", KINDS)])
        entries = tuple(((v,), q(rng.randint(0, 200))) for v in values)
        if len({n for _k, n in entries}) < 2:
            entries = ((entries[0][0], entries[0][1] + 7),) + entries[1:]
        factors = (
            ((_threshold(rng, "o.days"), _ratio(rng, Fraction(1, 2), Fraction(3))),) if form == "table_factor" else ()
        )
        return FieldRule(FIELD, Term("table", tuple(sorted(entries)), path), factors=factors, quantum=UNIT)
    if form == "table2":
        vals = {(f, t): q(rng.randint(0, 150)) for f in FARES for t in TIERS}
        return FieldRule(
            FIELD,
            Term("table", tuple(sorted(((f, t), n) for (f, t), n in vals.items())), ("r.fare", "u.tier")),
            quantum=UNIT,
        )
    if form == "cap":
        rate = rng.randint(2, 15)
        return FieldRule(
            FIELD,
            Term("share", q(rate), "o.late"),
            cap=q(rate * rng.randint(3, 9) + rng.randint(1, rate - 1)),
            quantum=UNIT,
        )
    if form == "sum":
        a, b = rng.randint(5, 80), rng.randint(5, 80)
        return FieldRule(
            FIELD, Term("sum", (q(rng.choice([0, rng.randint(1, 50)])), ((q(a), "@n"), (q(-b), "@m")))), quantum=UNIT
        )
    if form == "each":  # an allowance by category for each record (free bags by tier, per passenger)
        path, values = rng.choice([("u.tier", TIERS), ("r.fare", FARES), ("u.kind", KINDS)])
        entries = tuple(((v,), q(rng.randint(0, 5))) for v in values)
        if len({n for _k, n in entries}) < 2:
            entries = ((entries[0][0], entries[0][1] + 1),) + entries[1:]
        return FieldRule(FIELD, Term("table", tuple(sorted(entries)), path), quantum=UNIT, each="len(o.items)")
    if form == "each_sum":  # an allowance by category plus a bonus on another, for each record (tier + business fare)
        (a, av), (b, bv) = rng.sample([("u.tier", TIERS), ("r.fare", FARES), ("u.kind", KINDS)], 2)
        parts = (
            (q(rng.randint(1, 4)), indicator(a, rng.choice(av))),
            (q(rng.randint(1, 3)), indicator(b, rng.choice(bv))),
        )
        return FieldRule(
            FIELD,
            Term("sum", (q(rng.randint(0, 2)), tuple(sorted(parts, key=lambda kp: kp[1])))),
            quantum=UNIT,
            each="len(o.items)",
        )
    if form == "pick":  # the ids of records with one attribute's value (an available variant)
        attr, value = rng.choice([("ok", rng.choice([True, False])), ("color", rng.choice(COLORS))])
        return FieldRule(FIELD, Term("pick", ("id", ((attr, value),)), "o.items"))
    if form == "one_of":
        words = [
            "no longer needed",
            "ordered by mistake",
            "found a better price",
            "changed my mind",
            "too slow",
            "damaged",
            "wrong size",
        ]
        return FieldRule(FIELD, Term("one_of", tuple(sorted(rng.sample(words, rng.randint(2, 6))))))
    raise ValueError(form)


def rows_of(rule: FieldRule, seed: int, n: int) -> list[Row]:
    """n rows (one item each) with their gold computed by the rule, as the world computes it."""
    rng = random.Random(f"rows:{seed}")
    out = []
    for i in range(n):
        f = features(rng)
        agent: object = "wrong"
        if rule.then.kind == "pick":  # the gold picks an allowed record; the agent any record
            allowed = [e for e in f["o.items"] if picked(rule.then, f, [e["id"]])]
            if not allowed:  # the task is written so that one is allowed
                key, ((attr, value),) = rule.then.value
                e = dict(f["o.items"][0], **{attr: value})
                f["o.items"] = Records((e, *f["o.items"][1:]))
                allowed = [e]
            y = [rng.choice(allowed)["id"]]
            agent = [rng.choice(f["o.items"])["id"]]
        elif rule.then.kind == "one_of":
            y = rng.choice(rule.then.value)
        else:
            ok, y = evaluate(rule, f)
            assert ok, (render("t", rule), f)
            y = (
                float(y)
                if rule.quantum == CENT and not isinstance(y, str)
                else (int(y) if not isinstance(y, str) else y)
            )
        gold = {FIELD: y, **{k[1:]: v for k, v in f.items() if k.startswith("@")}}
        feats = {k: (float(v) if isinstance(v, Fraction) else v) for k, v in f.items() if not k.startswith("@")}
        out.append(Row(f"item-{seed}-{i:04d}", f"item-{seed}-{i:04d}#0", feats, gold, {FIELD: agent}))
    return out


def agreement(truth: FieldRule, inferred: FieldRule | None, fresh: list[Row]) -> float:
    """The share of fresh rows on which the inferred rule gives the true value (a pick: allows the same records)."""
    from components.evolution.infer import holds

    if inferred is None:
        return 0.0
    if truth.then.kind == "pick":

        def allowed(rule: FieldRule, r: Row) -> set[str]:
            return {e["id"] for e in r.feats["o.items"] if _allows(rule, r, e["id"])}

        return sum(allowed(truth, r) == allowed(inferred, r) for r in fresh) / len(fresh)
    return sum(holds(inferred, r) is True for r in fresh) / len(fresh)


def _allows(rule: FieldRule, r: Row, ident: str) -> bool:
    return rule.then.kind == "pick" and picked(rule.then, r.feats, [ident]) is True


def recover(form: str, seed: int, n_train: int, n_fresh: int) -> dict:
    truth = draw_world(form, seed)
    inf = infer_field(rows_of(truth, seed, n_train), FIELD)
    share = agreement(truth, inf.rule, rows_of(truth, 10**6 + seed, n_fresh))
    return {
        "form": form,
        "seed": seed,
        "agreement": share,
        "recovered": share >= 0.99,
        "truth": render("t", truth),
        "inferred": render("t", inf.rule) if inf.rule else inf.why,
    }


def world_rows(world: str, changes: dict, seed: int, root: Path, per_family: int) -> dict[str, list[Row]]:
    """Per write tool, the rows of the `seed` package's train episodes (3 seeds) on a benchmark of the variant."""
    from components.evolution.infer import policy_today, rows_for
    from components.memory import load_package
    from components.models.simulated import SimulatedAgent
    from components.params import BenchmarkParams
    from components.runtime.episode import run_episode
    from components.worlds import load_benchmark
    from components.worlds.base import train_gold

    out = root / f"{world}-{seed}"
    BenchmarkParams(world=world, seed=seed, out=str(out), per_family=per_family, rules=changes).materialize()
    bench = load_benchmark(out)
    pkg = load_package(ROOT / "data" / "packages" / ("seed" if world == "retail" else f"{world}/seed"))
    agent = SimulatedAgent()
    episodes = {}
    for item in bench.splits["train"]:
        for s in range(3):
            episodes[f"{item}#{s}"] = run_episode(pkg, bench, item, s, agent).steps
    gold, today = train_gold(bench), policy_today(bench.policy)
    return {tool: rows_for(tool, episodes, gold, bench.write_tools, bench.targets, today) for tool in bench.write_tools}


def world_recovery(world: str, variant: int, root: Path, per_family: int) -> list[dict]:
    """Each inferred field of a variant, judged on the rows of another benchmark of that variant."""
    import importlib

    from components.evolution.infer import holds, infer_rows

    rules = importlib.import_module(f"components.worlds.{world}.rules")
    changes = rules.random_rules(variant)
    fit = world_rows(world, changes, 0, root / f"v{variant}", per_family)
    fresh = world_rows(world, changes, 1, root / f"v{variant}", per_family)
    out = []
    for tool, rows in sorted(fit.items()):
        for inf in infer_rows(tool, rows):
            rows_f = [r for r in fresh[tool] if inf.field in r.gold]
            verdicts = [holds(inf.rule, r) for r in rows_f] if inf.rule else []
            judged = [v for v in verdicts if v is not None]  # rows where the reads the rule needs were made
            share = sum(judged) / len(judged) if judged else 0.0
            out.append(
                {
                    "world": world,
                    "variant": variant,
                    "tool": tool,
                    "field": inf.field,
                    "agreement": share,
                    "recovered": share >= 0.99,
                    "rule": render(tool, inf.rule) if inf.rule else inf.why,
                    "n": len(judged),
                    "coverage": len(judged) / len(rows_f) if rows_f else 0.0,
                }
            )
    return out


def main_worlds(n: int, per_family: int, show: bool) -> None:
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="ratchet-infer-"))
    rows = [
        r
        for world in ("retail", "airline")
        for v in range(1, n + 1)
        for r in world_recovery(world, v, root, per_family)
    ]
    print(
        f"inference on random variants of the built-in worlds: {n} per world, {per_family} tasks per family; "
        "judged on a second benchmark of each variant, on the rows where the reads the rule needs were made"
    )
    print(f"{'world':8} {'write.field':48} {'recovered':>10} {'median agreement':>17} {'judged rows':>11}")
    for key in sorted({(r["world"], r["tool"], r["field"]) for r in rows}):
        rs = [r for r in rows if (r["world"], r["tool"], r["field"]) == key]
        print(
            f"{key[0]:8} {key[1] + '.' + key[2]:48} {sum(r['recovered'] for r in rs):>4} / {len(rs):<3} "
            f"{statistics.median(r['agreement'] for r in rs):>17.3f} {statistics.median(r['coverage'] for r in rs):>10.0%}"
        )
    if show:
        for r in rows:
            if not r["recovered"]:
                print(
                    f"  {r['world']} v{r['variant']} {r['tool']}.{r['field']} ({r['agreement']:.3f} of {r['n']} judged rows): "
                    f"{r['rule']}"
                )
    ok = sum(r["recovered"] for r in rows)
    print(f"recovered {ok} / {len(rows)} inferred fields of the variants ({ok / len(rows):.1%}) at >= 99% agreement")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="3 worlds per form (the test's size)")
    ap.add_argument("--worlds", type=int, help="random worlds per form (default 40; quick 3)")
    ap.add_argument("--train", type=int, default=80, help="train rows (items) per world (default 80)")
    ap.add_argument("--fresh", type=int, default=1000, help="fresh rows each inferred rule is judged on")
    ap.add_argument("--show", action="store_true", help="print every world that was not recovered")
    ap.add_argument(
        "--variants",
        type=int,
        help="judge inference on this many random variants of each built-in "
        "world instead (rows from episodes; see above)",
    )
    ap.add_argument("--per-family", type=int, default=36, help="tasks per family of the variants' benchmarks")
    args = ap.parse_args(argv)
    if args.variants:
        return main_worlds(args.variants, args.per_family, args.show)
    n = args.worlds or (3 if args.quick else 40)
    t0 = time.process_time()
    results = [recover(form, seed, args.train, args.fresh) for form in FORMS for seed in range(n)]
    print(f"inference on random worlds: {n} per form, {args.train} train rows each, {args.fresh} fresh rows judged")
    print(f"{'form':16} {'recovered':>10} {'median agreement':>17} {'worst':>7}")
    for form in FORMS:
        rs = [r for r in results if r["form"] == form]
        print(
            f"{form:16} {sum(r['recovered'] for r in rs):>4} / {len(rs):<3} "
            f"{statistics.median(r['agreement'] for r in rs):>17.3f} {min(r['agreement'] for r in rs):>7.3f}"
        )
    if args.show:
        for r in results:
            if not r["recovered"]:
                print(
                    f"  {r['form']} seed {r['seed']} ({r['agreement']:.3f}):\n    truth    {r['truth']}\n"
                    f"    inferred {r['inferred']}"
                )
    ok = sum(r["recovered"] for r in results)
    print(f"CPU {time.process_time() - t0:.1f} s")
    print(f"recovered {ok} / {len(results)} random worlds ({ok / len(results):.1%}) at >= 99% agreement")


if __name__ == "__main__":
    main()
