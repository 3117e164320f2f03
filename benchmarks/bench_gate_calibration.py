"""How often the held-out gate promotes a change that does nothing or harms, how often it catches a real one, and
what a 10-round campaign of null patches does to the campaign-level false-promotion rate.

    python benchmarks/bench_gate_calibration.py [--quick] [--pool 20] [--workers 2]

Cheap but honest: each package is evaluated ONCE on every dev item over a pool of seeds (the simulated agent is
deterministic given package, task and seed), and each gate is then formed from random seed subsets of that pool:
  A/A        two independent evaluations of the base package: disjoint seed subsets per item, 3 seeds each
  patches    base vs a neutral or harmful patch produced by the simulator, paired on the same 3 seeds per item:
               nothing     a card about nothing, delivered next to the useful cards (it only dilutes attention)
               misleading  the refund card rewritten to state the wrong refund method
               bounce      a pre-write checker whose confirmation word no user ever says: it bounces good writes
  power      base vs a candidate with a true effect of +5 / +10 points, paired seeds: on a random share of items a
             failed episode becomes a success with probability 0.9 (as a followed card would), the share set so the
             expected dev gain is exactly the effect. "clean": fixes only (nothing else changes, so no item can
             regress); "perturbed": fixes on top of the "nothing" patch (real behavioural changes and their small
             cost, so some items regress). Also at larger virtual dev sets (items drawn with replacement from the
             60, perturbed) to say what size would meet the goal.
  campaign   10 rounds against one fixed champion evaluation (the campaign's dev seeds), each round's candidate an
             independent re-evaluation of the same package (the most dangerous null: fresh noise at every look).
Every gate is the real `decide` (CI, regression cap, material threshold) at the alpha it would use: 0.05 for one
look, and alpha_k = 2 * campaign_alpha / rounds (0.01) per look under the campaign's linear alpha spending.
Sequential: the same gates at alpha_k stopped early as the round flow does (`--looks`, `--spending`, by seeds: look g
sees every item with the first g of its seeds; `look_verdict` at each), with the share of episodes it evaluated.
Gates drawn from one pool share seeds, so the Wilson CIs (which assume independent gates) are somewhat too narrow.
Last line: the campaign-level false-promotion rate under alpha spending.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from components.env import quiet_offline  # noqa: E402

quiet_offline()

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from components.evolution.gate import (  # noqa: E402
    GateConfig,
    boot_means,
    decide,
    efficacy_levels,
    look_alpha,  # noqa: E402
    look_verdict,
)

NOTHING = """---
id: customer-tone
type: knowledge
trigger:
  event: intent_recorded
  tool: return_delivered_order_items
source: style-guide
---
Greet the customer by name, keep answers short and friendly, and thank them for their patience.
"""

MISLEADING = """---
id: refund-original-payment
type: procedure
trigger:
  event: intent_recorded
  tool: return_delivered_order_items
source: policy.md#returns
---
`return_delivered_order_items` refunds go to a gift card balance: pass the account's gift card as the refund
payment method, whatever the order was paid with.
"""

BASE_MANIFEST = """name: calibration-base
description: A mid-campaign package - board, two routed cards, no checker yet.
wm:
  board: true
  max_entries: 8
  bind_on: [order_id]
delivery:
  - use: event_cards
    at: intent_recorded
checkers: []
"""

BOUNCE = """checkers:
  - use: confirm_before_write
    at: pre_write
    cfg:
      # the agent's confirmation names only the identifying args: demanding these too bounces every good write
      match_args: [reason, item_ids, payment_method_id, address1]
"""


def build_packages(root: Path) -> dict[str, Path]:
    """The base (a mid-campaign package built from the shipped reference cards) and its three null/harmful patches."""
    ref = ROOT / "data/packages/reference/em/procedure"
    base = root / "base"
    (base / "em/procedure").mkdir(parents=True)
    (base / "manifest.yaml").write_text(BASE_MANIFEST)
    for card in ("refund-original-payment.md", "cancel-reason.md"):
        shutil.copy(ref / card, base / "em/procedure" / card)
    nothing = root / "nothing"
    shutil.copytree(base, nothing)
    (nothing / "em/knowledge").mkdir()
    (nothing / "em/knowledge/customer-tone.md").write_text(NOTHING)
    misleading = root / "misleading"
    shutil.copytree(base, misleading)
    (misleading / "em/procedure/refund-original-payment.md").write_text(MISLEADING)
    bounce = root / "bounce"
    shutil.copytree(base, bounce)
    (bounce / "manifest.yaml").write_text(BASE_MANIFEST.replace("checkers: []\n", BOUNCE))
    return {"base": base, "nothing": nothing, "misleading": misleading, "bounce": bounce}


def _shard(args: tuple) -> pd.DataFrame:
    quiet_offline()
    from components.runtime.evaluate import run_shard

    package, bench, items, seeds = args
    return run_shard(package, bench, items, seeds).scores


def pool_scores(package: Path, bench: str, items: list[str], pool: int, workers: int, cache: Path) -> np.ndarray:
    """scores[item, seed] of one package over the seed pool, evaluated once (and cached by package and bench bytes)."""
    from components.memory.package import digest

    key = hashlib.sha256(f"{digest(package)}:{digest(bench)}:{items}:{pool}".encode()).hexdigest()[:16]
    f = cache / f"{package.name}-{key}.npy"
    if f.exists():
        return np.load(f)
    shards = [(str(package), bench, items[i : i + 5], list(range(pool))) for i in range(0, len(items), 5)]
    with ProcessPoolExecutor(workers) as ex:
        df = pd.concat(list(ex.map(_shard, shards)), ignore_index=True)
    if (df["error"].fillna("") != "").any():
        raise SystemExit(f"{package.name}: errored episodes in the pool")
    m = df.pivot(index="item_id", columns="seed", values="score").loc[items, list(range(pool))].to_numpy(float)
    cache.mkdir(parents=True, exist_ok=True)
    np.save(f, m)
    return m


def draw_seeds(rng: np.random.Generator, n_items: int, pool: int, k: int) -> np.ndarray:
    """Per item, k distinct seeds of the pool: an (n_items, k) index array."""
    return np.argsort(rng.random((n_items, pool)), axis=1)[:, :k]


def arm_cells(scores: np.ndarray, seeds: np.ndarray) -> np.ndarray:
    """scores[item, seed] of the drawn seeds: an (n_items, k) array, seeds in look order."""
    return np.take_along_axis(scores, seeds, axis=1)


def sequential(base: np.ndarray, cand: np.ndarray, cfg: GateConfig, looks: int, spending: str) -> tuple[bool, float]:
    """The round flow's sequential gate by seeds on (n_items, k) cells: (accepted, share of the cells evaluated)."""
    verdict, used, _ = sequential_looks(base, cand, cfg, looks, spending)
    return verdict, used


def sequential_looks(
    base: np.ndarray, cand: np.ndarray, cfg: GateConfig, looks: int, spending: str
) -> tuple[bool, float, int | None]:
    """`sequential`, and the look a futility stop ended it at (None: it did not stop for futility)."""
    k = base.shape[1]
    ends = np.cumsum([len(g) for g in np.array_split(np.arange(k), min(looks, k))])
    levels = efficacy_levels([e / k for e in ends], cfg.alpha / 2, spending)
    for g, e in enumerate(ends, start=1):
        verdict, _, fig = look_verdict((cand[:, :e] - base[:, :e]).mean(axis=1), g, levels, cfg, final_items=False)
        if verdict is not None:
            return verdict, e / k, g if fig.get("futility") else None
    raise AssertionError("unreachable")


def refund_for(share: float, looks: int, seeds: int, spending: str):
    """The futility refund's design (components/evolution/alpha.py) for a look by seeds, its share rounded down to a
    grid of ratio 2^(1/8) (never above what the wealth rule gives; a few designs to compute)."""
    from components.evolution.alpha import refund_design

    q = 2.0 ** (np.floor(8 * np.log2(share)) / 8)
    ends = np.cumsum([len(g) for g in np.array_split(np.arange(seeds), min(looks, seeds))])
    return refund_design(tuple(float(e / seeds) for e in ends), spending, float(q))


def verdicts(
    base: np.ndarray, cand: np.ndarray, cfgs: list[GateConfig], check: bool = False
) -> list[tuple[bool, bool]]:
    """(accepted by the whole gate, CI excludes zero upward) under each config, for per-item arm means.

    `decide`'s arithmetic with one bootstrap shared by the configs (they differ only in alpha); `check` runs the real
    `decide` too and insists on the same verdict."""
    d = cand - base
    means = boot_means(d, cfgs[0].n_boot, cfgs[0].seed)
    out = []
    for cfg in cfgs:
        lo = float(np.quantile(means, cfg.alpha / 2))
        accept = lo > 0 and int((d < -cfg.material).sum()) <= cfg.cap(len(d))
        if check:
            per = pd.DataFrame({"item_id": [f"i{k}" for k in range(len(base))], "base": base, "cand": cand, "d": d})
            r = decide(per, cfg)
            assert (r.accept, r.ci_lo) == (accept, lo), (r, accept, lo)
        out.append((accept, lo > 0))
    return out


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float, float]:
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return p, max(0.0, mid - half), min(1.0, mid + half)


def fmt(k: int, n: int) -> str:
    p, lo, hi = wilson(k, n)
    return f"{100 * p:5.1f}% [{100 * lo:4.1f}, {100 * hi:4.1f}] ({k}/{n})"


def effect_arm(rng: np.random.Generator, scores: np.ndarray, effect: float) -> np.ndarray:
    """The same episodes with a true effect: on a random share of items each failure becomes a success w.p. 0.9."""
    fail = (1 - scores).mean()
    share = min(1.0, effect / (0.9 * fail))  # capped: a base this strong cannot gain the whole effect
    hit = rng.random(scores.shape[0]) < share
    fixed = rng.random(scores.shape) < 0.9
    return np.where(hit[:, None] & fixed, 1.0, scores)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--pool", type=int, default=None, help="seeds per item evaluated once (default 20, quick 8)")
    ap.add_argument("--seeds", type=int, default=3, help="seeds per item in one gate (the campaign's)")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument(
        "--reg-share",
        type=float,
        default=0.0,
        help="gate.reg_share: a cap proportional to the items (0 here: the absolute cap the tables were first "
        "measured with; the gate's default is 0.1, measured with --reg-share 0.1)",
    )
    ap.add_argument("--looks", type=int, default=3, help="sequential looks (by seeds), as gate.sequential.looks")
    ap.add_argument("--spending", default="pocock", help="sequential spending function (pocock | obf)")
    ap.add_argument("--bench", default=str(ROOT / "data/benchmarks/retail"))
    ap.add_argument("--cache", default=str(ROOT / ".ratchet" / "bench_gate_calibration"), help="pool score cache")
    a = ap.parse_args()
    pool = a.pool or (6 if a.quick else 20)
    n_aa, n_patch, n_power, n_camp = (40, 20, 20, 20) if a.quick else (1000, 300, 300, 500)
    n_boot = 1000 if a.quick else 10_000
    t0 = time.perf_counter()
    from components.worlds import load_benchmark, world

    if not (Path(a.bench) / "meta.json").exists():
        world("retail").materialize(a.bench, 0)
    b = load_benchmark(a.bench)
    items = b.ids("dev")
    if a.quick:
        items = items[:10]
    one = GateConfig(n_boot=n_boot, reg_share=a.reg_share)  # a single look
    per_look = GateConfig(
        n_boot=n_boot,
        alpha=look_alpha(one.campaign_alpha, a.rounds, 1),  # alpha spending
        reg_share=a.reg_share,
    )
    rng = np.random.default_rng(2024)
    with tempfile.TemporaryDirectory() as tmp:
        pkgs = build_packages(Path(tmp))
        cache = Path(a.cache)
        S = {name: pool_scores(p, a.bench, items, pool, a.workers, cache) for name, p in pkgs.items()}
    n_ep = len(S) * len(items) * pool
    base = S["base"]
    print(
        f"dev items {len(items)}, seeds per gate {a.seeds}, pool {pool} seeds/item, {n_ep} episodes evaluated once "
        f"({time.perf_counter() - t0:.0f} s); base package dev mean {base.mean():.3f}; n_boot {n_boot}"
    )
    print(
        f"per look: alpha {one.alpha} (one look) and {per_look.alpha:.3f} (linear spending of campaign_alpha "
        f"{one.campaign_alpha} over {a.rounds} looks); reg_cap {one.reg_cap}, reg_share {one.reg_share}, material {one.material}"
    )
    rows = []

    no_cap = GateConfig(n_boot=n_boot, alpha=per_look.alpha, reg_cap=10**6)  # the CI rule alone

    def run(label: str, true_effect: float, n: int, arms) -> None:
        acc = {"one": [0, 0], "look": [0, 0]}
        seq, used, agree, seq_ci = 0, 0.0, 0, 0
        for g in range(n):
            bc, cc = arms()
            for key, (full, ci) in zip(("one", "look"), verdicts(bc.mean(1), cc.mean(1), [one, per_look], check=g < 5)):
                acc[key][0] += full
                acc[key][1] += ci
            s_acc, s_used = sequential(bc, cc, per_look, a.looks, a.spending)
            seq, used, agree = seq + s_acc, used + s_used, agree + (s_acc == full)  # full: the @alpha_k verdict
            seq_ci += sequential(bc, cc, no_cap, a.looks, a.spending)[0]
        rows.append((label, true_effect, n, acc))
        print(
            f"{label:<22} true {100 * true_effect:+6.2f} pts  gates {n:5d}  promoted @0.05 {fmt(acc['one'][0], n)}  "
            f"@{per_look.alpha:.2f} {fmt(acc['look'][0], n)}  (CI alone: @0.05 {100 * acc['one'][1] / n:.1f}%, "
            f"@{per_look.alpha:.2f} {100 * acc['look'][1] / n:.1f}%)  sequential @{per_look.alpha:.2f} "
            f"{fmt(seq, n)}, same verdict {100 * agree / n:.1f}%, episodes {100 * used / n:.0f}% "
            f"(CI alone {100 * seq_ci / n:.1f}%)",
            flush=True,
        )

    def aa():
        s = draw_seeds(rng, len(items), pool, 2 * a.seeds)
        return arm_cells(base, s[:, : a.seeds]), arm_cells(base, s[:, a.seeds :])

    run("A/A", 0.0, n_aa, aa)
    for name in ("nothing", "misleading", "bounce"):

        def patch(name=name):
            s = draw_seeds(rng, len(items), pool, a.seeds)
            return arm_cells(base, s), arm_cells(S[name], s)

        run(f"patch: {name}", float(S[name].mean() - base.mean()), n_patch, patch)
    # a real improvement also changes behaviour elsewhere: build it on the "nothing" patch (an added card that
    # perturbs episodes and costs a little) and add fixes until the total true effect is +5 / +10 points
    noisy, cost = S["nothing"], float(base.mean() - S["nothing"].mean())
    for effect in (0.05, 0.10):

        def clean(effect=effect):
            s = draw_seeds(rng, len(items), pool, a.seeds)
            return arm_cells(base, s), arm_cells(effect_arm(rng, base, effect), s)

        def perturbed(effect=effect):
            s = draw_seeds(rng, len(items), pool, a.seeds)
            return arm_cells(base, s), arm_cells(effect_arm(rng, noisy, effect + cost), s)

        run(f"power: +{round(100 * effect)} clean", effect, n_power, clean)
        run(f"power: +{round(100 * effect)} perturbed", effect, n_power, perturbed)
    # what dev size would give 80% power at +10 under alpha spending: virtual dev sets of items drawn from the 60
    for mult in (2,) if a.quick else (2, 3, 4):

        def bigger(mult=mult):
            pick = rng.integers(0, len(items), len(items) * mult)
            s = draw_seeds(rng, len(pick), pool, a.seeds)
            return arm_cells(base[pick], s), arm_cells(effect_arm(rng, noisy[pick], 0.10 + cost), s)

        run(f"power: +10, {mult * len(items)} items", 0.10, n_power // 2, bigger)
    # a 10-round campaign of null patches: one champion evaluation, a fresh null candidate at every look
    camp = {"one": 0, "look": 0, "ci_one": 0, "ci_look": 0, "seq": 0, "ci_seq": 0, "refund": 0, "ci_refund": 0}
    for _ in range(n_camp):
        perm = draw_seeds(rng, len(items), pool, pool)
        bc = arm_cells(base, perm[:, : a.seeds])  # the champion's dev evaluation, fixed for the whole campaign
        bm = bc.mean(axis=1)
        rest = perm[:, a.seeds :]
        hit = dict.fromkeys(camp, False)
        # the futility refund under the wealth rule (alpha.py): each round reserves the wealth left over the rounds
        # left, tests at the refund's level, and is charged less after a futility stop; one account per gate kind
        wealth = {"refund": one.campaign_alpha, "ci_refund": one.campaign_alpha}
        for r in range(a.rounds):
            cand_seeds = np.take_along_axis(rest, np.argsort(rng.random(rest.shape), axis=1)[:, : a.seeds], axis=1)
            cc = arm_cells(base, cand_seeds)
            for key, (full, ci) in zip(("one", "look"), verdicts(bm, cc.mean(axis=1), [one, per_look])):
                hit[key] = hit[key] or full
                hit["ci_" + key] = hit["ci_" + key] or ci
            hit["seq"] = hit["seq"] or sequential(bc, cc, per_look, a.looks, a.spending)[0]
            hit["ci_seq"] = hit["ci_seq"] or sequential(bc, cc, no_cap, a.looks, a.spending)[0]
            for key, cfg in (("refund", per_look), ("ci_refund", no_cap)):
                if hit[key] or wealth[key] <= 0:
                    continue
                rf = refund_for(wealth[key] / (a.rounds - r), a.looks, a.seeds, a.spending)
                promoted, _, futile = sequential_looks(bc, cc, replace(cfg, alpha=2 * rf.level), a.looks, a.spending)
                hit[key] = promoted
                wealth[key] -= rf.charge(futile)
            if all(hit.values()):
                break
        for key in camp:
            camp[key] += hit[key]
    print(
        f"{a.rounds}-round null campaigns {n_camp}: any false promotion without spending (0.05 per look) "
        f"{fmt(camp['one'], n_camp)}; with linear alpha spending ({per_look.alpha:.3f} per look) {fmt(camp['look'], n_camp)}"
    )
    print(
        f"  the CI rule alone (no regression cap): without spending {fmt(camp['ci_one'], n_camp)}; "
        f"with spending {fmt(camp['ci_look'], n_camp)}"
    )
    print(
        f"  sequential ({a.looks} looks by seeds, {a.spending} spending of each look's alpha): {fmt(camp['seq'], n_camp)}; "
        f"its CI rule alone {fmt(camp['ci_seq'], n_camp)}"
    )
    print(
        f"  sequential with the futility refund (wealth rule, alpha given back after a futility stop): "
        f"{fmt(camp['refund'], n_camp)}; its CI rule alone {fmt(camp['ci_refund'], n_camp)}"
    )
    print(f"total {time.perf_counter() - t0:.0f} s")
    print(
        f"campaign-level false promotion with alpha spending: {100 * camp['look'] / n_camp:.1f}% "
        f"(CI rule alone {100 * camp['ci_look'] / n_camp:.1f}%; sequential {100 * camp['seq'] / n_camp:.1f}%)"
    )


if __name__ == "__main__":
    main()
