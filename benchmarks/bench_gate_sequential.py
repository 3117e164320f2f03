"""Sequential early stopping of the held-out gate: two finished campaigns compared, or one replayed.

    python benchmarks/bench_gate_sequential.py --on DIR --off DIR
    python benchmarks/bench_gate_sequential.py --campaign runs/campaign [--looks 3] [--spending obf|pocock] [--order hash|dev]

Compare (`--on`, `--off`): the same campaign run with `gate.sequential` on and off (each in a fresh RATCHET_HOME, so
nothing comes from an earlier run's task cache): each round's verdict, plan and looks used side by side, and the
model calls each campaign paid (its budget ledger, `.state/budget.json`: cached evaluations, such as the champion's
dev cells from the round that accepted it, cost nothing) and where they went (its evaluations, by split and arm).
Last line: the share of model calls the sequential campaign saved.

Replay (`--campaign`):
Every round that looked at dev recorded both arms' scores per (item, seed), model calls included. Shards run in dev
order (`campaign.shard_size` items each, the items ordered by a hash of their id so that a group is not one task
family: dev ids run family by family); the replay puts a look after every group of shards, applies
`sequential_decide` (group-sequential efficacy boundary from the named spending function, early reject on the
regression cap or a non-positive net) at the round's own alpha, and counts the model calls of the shards a
sequential round would never have run, in both arms. It reports each round's verdict next to the full evaluation's
and the saving against the campaign's whole evidence cost. The replay is exact for what it covers (same episodes, same
bootstrap) but ignores what a partly evaluated champion costs the next round. Last line: the share of model calls
saved.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pandas as pd  # noqa: E402

from components.evolution.gate import decide, pair, sequential_decide  # noqa: E402
from components.evolution.report import history  # noqa: E402


def replay(campaign: Path, looks: int, spending: str, shuffle: bool = True) -> dict:
    summary = json.loads((campaign / "summary.json").read_text())
    shard = int(summary["params"]["campaign"]["shard_size"])
    total_calls = int(summary["budget"]["evidence_cost"]["model_calls"])
    rows = []
    for rec in history(summary):
        if rec.evaluation is None:  # not gated
            continue
        rd = Path(rec.round_dir)
        if not rd.is_absolute() and not rd.exists():
            rd = campaign / "rounds" / rd.name
        b = pd.read_csv(rd / "dev_base.csv", dtype={"item_id": str})
        c = pd.read_csv(rd / "dev_cand.csv", dtype={"item_id": str})
        cfg = rec.evaluation.gate
        per, _ = pair(b, c, cfg.max_error_share, cfg.min_items)
        full = decide(per, cfg)  # the gate as the round ran it (items in pair()'s order)
        order = list(dict.fromkeys(b["item_id"]))  # the dev ids as the shards ran them (grouped by kind)
        if shuffle:  # a pre-declared order that does not follow the item's kind: by a hash of its id
            order = sorted(order, key=lambda i: hashlib.sha256(i.encode()).hexdigest())
        per = per.set_index("item_id").loc[[i for i in order if i in set(per["item_id"])]].reset_index()
        n_shards = -(-len(order) // shard)
        per_look = -(-n_shards // looks)
        bounds = [min(len(order), shard * per_look * k) for k in range(1, looks + 1)]
        bounds = sorted(set(bounds))
        sizes = [bounds[0]] + [y - x for x, y in zip(bounds, bounds[1:])]
        seq = sequential_decide(per, cfg, sizes, spending)
        seen = set(order[: seq.n_seen])
        calls = int(b["model_calls"].sum() + c["model_calls"].sum())
        used = int(
            b.loc[b["item_id"].isin(seen), "model_calls"].sum() + c.loc[c["item_id"].isin(seen), "model_calls"].sum()
        )
        rows.append(
            {
                "round": rec.round,
                "recorded": str(rec.verdict),
                "full": "accept" if full.accept else "reject",
                "sequential": "accept" if seq.accept else "reject",
                "look": f"{seq.look}/{seq.n_looks}",
                "items": f"{seq.n_seen}/{seq.n_items}",
                "dev_calls": calls,
                "saved": calls - used,
                "net": full.net,
                "ci_lo": full.ci_lo,
            }
        )
    saved = sum(r["saved"] for r in rows)
    return {
        "rows": rows,
        "total_calls": total_calls,
        "saved": saved,
        "dev_calls": sum(r["dev_calls"] for r in rows),
        "same": all(r["full"] == r["sequential"] for r in rows),
    }


def _where(camp: Path) -> dict:
    """Model calls of the campaign's evaluations by split and arm (reused ones excluded: counted where they ran)."""
    out: dict = {}
    files = sorted(camp.glob("rounds/r*/evals.json")) + [camp / "test_evals.json"]
    for f in files:
        for e in json.loads(f.read_text()) if f.exists() else []:
            if not e.get("reused"):
                key = f"{e['split']} {e['arm']}"
                out[key] = out.get(key, 0) + int(e["summary"]["model_calls"])
    return out


def compare(on: Path, off: Path) -> dict:
    s_on, s_off = (json.loads((c / "summary.json").read_text()) for c in (on, off))
    paid = {
        k: int(json.loads((c / ".state/budget.json").read_text())["spent"]["model_calls"])
        for k, c in (("on", on), ("off", off))
    }
    by_round = {}
    for k, s in (("on", s_on), ("off", s_off)):
        for r in history(s):
            seq = r.sequential.gate if r.sequential is not None else None
            by_round.setdefault(r.round, {})[k] = {
                "verdict": str(r.verdict),
                "plan": r.plan_key or "-",
                "looks": f"{seq.looks_used}/{seq.looks}" if seq else "-/-",
            }
    same = all(
        v.get("on", {}).get("verdict") == v.get("off", {}).get("verdict")
        and v.get("on", {}).get("plan") == v.get("off", {}).get("plan")
        for v in by_round.values()
    )
    return {
        "paid": paid,
        "rounds": by_round,
        "same": same,
        "test": (s_on["test"], s_off["test"]),
        "champion": (s_on["champion_digest"], s_off["champion_digest"]),
        "where": (_where(on), _where(off)),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--on", help="a finished campaign run with gate.sequential on")
    ap.add_argument("--off", help="the same campaign with gate.sequential.looks: 1")
    ap.add_argument("--campaign", default=str(ROOT / "runs/campaign"))
    ap.add_argument(
        "--names",
        default="sequential on,off",
        help="what --on and --off differ by, for the last line (e.g. 'reply store on,off')",
    )
    ap.add_argument("--looks", type=int, default=3)
    ap.add_argument("--spending", default="obf")
    ap.add_argument(
        "--order",
        choices=["hash", "dev"],
        default="hash",
        help="shard order: by a hash of the item id (default), or the dev ids' own order",
    )
    a = ap.parse_args()
    if a.on or a.off:
        if not (a.on and a.off):
            raise SystemExit("--on and --off go together")
        c = compare(Path(a.on), Path(a.off))
        print(f"{'round':>5} {'verdict on':>11} {'verdict off':>11} {'looks on':>8}  plan")
        for r, v in sorted(c["rounds"].items()):
            on, off = v.get("on", {}), v.get("off", {})
            print(
                f"{r:>5} {on.get('verdict', '-'):>11} {off.get('verdict', '-'):>11} {on.get('looks', '-'):>8}  "
                f"{on.get('plan', '-')}{'' if on.get('plan') == off.get('plan') else ' | off: ' + str(off.get('plan'))}"
            )
        for k, w in zip(("on", "off"), c["where"]):
            print(
                f"{k:>3}: model calls behind each evaluation (cached ones too): "
                + ", ".join(f"{x} {n:,}" for x, n in sorted(w.items()))
            )
        t_on, t_off = c["test"]
        print(
            f"verdicts and plans {'identical' if c['same'] else 'DIFFER'}; champion "
            f"{'identical' if c['champion'][0] == c['champion'][1] else 'DIFFERS'}; test net on "
            f"{(t_on or {}).get('net', float('nan')):+.3f}, off {(t_off or {}).get('net', float('nan')):+.3f}"
        )
        on_, off_ = c["paid"]["on"], c["paid"]["off"]
        name_on, name_off = (a.names.split(",") + ["off"])[:2]
        print(
            f"model calls paid per campaign: {name_on} {on_:,}, {name_off} {off_:,}: "
            f"{100 * (off_ - on_) / max(1, off_):.1f}% fewer"
        )
        return
    r = replay(Path(a.campaign), a.looks, a.spending, a.order == "hash")
    print(
        f"{'round':>5} {'full':>7} {'seq':>7} {'look':>5} {'items':>6} {'net':>7} {'ci_lo':>7} {'dev calls':>10} {'saved':>7}"
    )
    for x in r["rows"]:
        print(
            f"{x['round']:>5} {x['full']:>7} {x['sequential']:>7} {x['look']:>5} {x['items']:>6} {x['net']:+7.3f} "
            f"{x['ci_lo']:+7.3f} {x['dev_calls']:>10} {x['saved']:>7}"
        )
    print(
        f"spending {a.spending}, {a.looks} looks: verdicts {'identical' if r['same'] else 'DIFFER'} to full evaluation; "
        f"dev model calls {r['dev_calls']}, saved {r['saved']} ({100 * r['saved'] / max(1, r['dev_calls']):.1f}% of dev)"
    )
    print(f"model calls saved per campaign: {100 * r['saved'] / max(1, r['total_calls']):.1f}% of {r['total_calls']}")


if __name__ == "__main__":
    main()
