"""Sequential early stopping of the held-out gate, replayed on a finished campaign's recorded dev evaluations.

    python benchmarks/bench_gate_sequential.py --campaign runs/campaign [--looks 3] [--spending obf|pocock] [--order hash|dev]

Every round that looked at dev recorded both arms' scores per (item, seed), model calls included. Shards run in dev
order (`campaign.shard_size` items each, the items ordered by a hash of their id so that a group is not one task
family: dev ids run family by family); the replay puts a look after every group of shards, applies
`sequential_decide` (group-sequential efficacy boundary from the named spending function, early reject on the
regression cap or a non-positive net) at the round's own alpha, and counts the model calls of the shards a
sequential round would never have run, in both arms. It reports each round's verdict next to the full evaluation's
and the saving against the campaign's whole evidence cost. The replay is exact for what it covers (same episodes, same
bootstrap); the flow itself still evaluates dev in full (see README). Last line: the share of model calls saved.
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

from components.evolution.gate import GateConfig, decide, pair, sequential_decide  # noqa: E402


def replay(campaign: Path, looks: int, spending: str, shuffle: bool = True) -> dict:
    summary = json.loads((campaign / "summary.json").read_text())
    shard = int(summary["params"]["campaign"]["shard_size"])
    total_calls = int(summary["budget"]["evidence_cost"]["model_calls"])
    rows = []
    for rec in summary["history"]:
        if not rec.get("dev_look") and "evaluation" not in rec:
            continue
        rd = Path(rec["round_dir"])
        if not rd.is_absolute() and not rd.exists():
            rd = campaign / "rounds" / rd.name
        b = pd.read_csv(rd / "dev_base.csv", dtype={"item_id": str})
        c = pd.read_csv(rd / "dev_cand.csv", dtype={"item_id": str})
        cfg = GateConfig(**rec["evaluation"]["gate"])
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
        seen = set(order[:seq.n_seen])
        calls = int(b["model_calls"].sum() + c["model_calls"].sum())
        used = int(b.loc[b["item_id"].isin(seen), "model_calls"].sum() + c.loc[c["item_id"].isin(seen), "model_calls"].sum())
        rows.append({"round": rec["round"], "recorded": rec["verdict"], "full": "accept" if full.accept else "reject",
                     "sequential": "accept" if seq.accept else "reject", "look": f"{seq.look}/{seq.n_looks}",
                     "items": f"{seq.n_seen}/{seq.n_items}", "dev_calls": calls, "saved": calls - used,
                     "net": full.net, "ci_lo": full.ci_lo})
    saved = sum(r["saved"] for r in rows)
    return {"rows": rows, "total_calls": total_calls, "saved": saved, "dev_calls": sum(r["dev_calls"] for r in rows),
            "same": all(r["full"] == r["sequential"] for r in rows)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--campaign", default=str(ROOT / "runs/campaign"))
    ap.add_argument("--looks", type=int, default=3)
    ap.add_argument("--spending", default="obf")
    ap.add_argument("--order", choices=["hash", "dev"], default="hash",
                    help="shard order: by a hash of the item id (default), or the dev ids' own order")
    a = ap.parse_args()
    r = replay(Path(a.campaign), a.looks, a.spending, a.order == "hash")
    print(f"{'round':>5} {'full':>7} {'seq':>7} {'look':>5} {'items':>6} {'net':>7} {'ci_lo':>7} {'dev calls':>10} {'saved':>7}")
    for x in r["rows"]:
        print(f"{x['round']:>5} {x['full']:>7} {x['sequential']:>7} {x['look']:>5} {x['items']:>6} {x['net']:+7.3f} "
              f"{x['ci_lo']:+7.3f} {x['dev_calls']:>10} {x['saved']:>7}")
    print(f"spending {a.spending}, {a.looks} looks: verdicts {'identical' if r['same'] else 'DIFFER'} to full evaluation; "
          f"dev model calls {r['dev_calls']}, saved {r['saved']} ({100 * r['saved'] / max(1, r['dev_calls']):.1f}% of dev)")
    print(f"model calls saved per campaign: {100 * r['saved'] / max(1, r['total_calls']):.1f}% of {r['total_calls']}")


if __name__ == "__main__":
    main()
