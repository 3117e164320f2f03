"""The figures of one inner -> outer -> inner run, as a markdown table (issue 31's closing note).

    .venv/bin/python scripts/outer_figures.py --campaign runs/campaign --outer runs/outer

Test score and prompt tokens per episode of: the start package and the inner champion (the first campaign's
certification, base model); the same champion under the trained model (one more test evaluation, here: nothing is
selected on it); the pruned champion and the second inner campaign's champion (its certification, trained model).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def _test(campaign: Path) -> dict[str, dict]:
    evals = json.loads((campaign / "test_evals.json").read_text())
    return {e["arm"]: e["summary"] for e in evals}


def _row(label: str, s: dict) -> str:
    return (
        f"| {label} | {s['mean_score']:.3f} | {s['success_rate']:.3f} | "
        f"{s['tokens_in'] / max(1, s['episodes']):,.0f} | {s['episodes']} |"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--campaign", type=Path, default=Path("runs/campaign"))
    ap.add_argument("--outer", type=Path, default=Path("runs/outer"))
    a = ap.parse_args()

    from components.evolution.lineage import Lineage
    from components.outer.model import read_model
    from components.params import Params
    from components.runtime.evaluate import benchmark_at, run_shard, summary

    first = json.loads((a.campaign / "summary.json").read_text())
    p = Params.model_validate(first["params"])
    spec = read_model(a.outer / "model.json")
    champion = Lineage(a.campaign / "lineage").champion()
    bench = benchmark_at(p.benchmark.out)
    same = summary(
        run_shard(
            champion.path,
            bench,
            bench.ids("test"),
            list(range(p.campaign.seeds)),
            spec.model,
            spec.campaign_cfg(),
            p.campaign.max_turns,
        ).scores
    )
    t1, t2 = _test(a.campaign), _test(a.outer / "inner")
    prune = (
        json.loads((a.outer / "prune" / "prune.json").read_text())
        if (a.outer / "prune" / "prune.json").exists()
        else {"removed": []}
    )
    second = json.loads((a.outer / "inner" / "summary.json").read_text())
    print("| step | test score | test success | prompt tokens / episode | episodes |")
    print("|---|---|---|---|---|")
    print(_row(f"start ({first['lineage'][0]['version']}, base model)", t1["start"]))
    print(_row(f"inner champion ({champion.name}, base model)", t1["champion"]))
    print(_row(f"after the outer round: {champion.name}, model {spec.name}", same))
    print(
        _row(
            f"pruned {champion.name} (removed: {', '.join(prune['removed']) or 'none'}), model {spec.name}", t2["start"]
        )
    )
    print(_row(f"second inner champion ({second['champion']}), model {spec.name}", t2["champion"]))
    print()
    print(f"learned facts: {', '.join(spec.model_cfg.get('learned', []))}")
    for d in prune.get("decisions", []):
        print(f"- remove `{d['card']}`: {'accepted' if d['accept'] else 'kept'}: {d['reason']}")


if __name__ == "__main__":
    main()
