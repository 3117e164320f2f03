"""The diagnosis of a policy-blind agent on τ²-bench, per domain: a scripted agent over the OpenAI protocol (behind a
strict-template server) that breaks one written rule of the domain (tests/tau2_fakes.py: retail refunds a return
elsewhere than the original payment method; airline pays a flight change or a bag update with a travel
certificate), evaluated on the train items whose gold holds such a write, diagnosed against tau2's train gold; then
the card the `rules` meta-agent drafts from it.

    python benchmarks/bench_tau2_diagnosis.py [--worlds tau2-retail,tau2-airline] [--no-strict-system]

Rows: world, episodes, failed, findings by owner/kind/tool (how many of them at a write tau2's tool refused), and
the drafted card's text."""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from components.env import quiet_offline  # noqa: E402

quiet_offline()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tau2-airline only (the test's size)")
    ap.add_argument("--worlds", default="tau2-retail,tau2-airline")
    ap.add_argument(
        "--no-strict-system",
        dest="strict_system",
        action="store_false",
        help="a server that takes any system message (an older checkout's requests need it)",
    )
    args = ap.parse_args(argv)
    if args.quick:
        args.worlds = "tau2-airline"

    from components.evolution.diagnose import diagnose
    from components.evolution.infer import policy_today
    from components.evolution.meta import PlanContext, RulesAgent
    from components.memory.package import load_package
    from components.runtime.evaluate import run_shard
    from components.worlds import load_benchmark, world
    from components.worlds.base import train_gold
    from components.worlds.taubench import DOMAINS
    from tests.tau2_fakes import BROKEN, PolicyBlind, served

    print(
        "| world | train episodes (with the rule's write) | failed | findings (owner, kind, tool: n, of them at a "
        "write tau2 refused) |"
    )
    print("|---|---|---|---|")
    cards = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.worlds.split(","):
            bench = load_benchmark(world(name).materialize(Path(tmp) / name, 0))
            gold = train_gold(bench)
            broken = BROKEN[DOMAINS[name]]
            items = [i for i in bench.ids("train") if any(a.tool in broken for a in gold[i].actions)]
            pkg = load_package(ROOT / "data" / "packages" / "none")
            with served(PolicyBlind(bench.root), strict_system=args.strict_system) as url:
                t = run_shard(
                    pkg, bench, items, [0], "openai", {"base_url": url, "model": "policy-blind", "max_retries": 0}
                )
            # (an older checkout, measured for the figures before, has no `confirmation`)
            extra = {"confirmation": bench.confirmation} if hasattr(bench, "confirmation") else {}
            d = diagnose(
                t.traces,
                t.scores,
                pkg,
                bench.write_tools,
                "policy-blind",
                targets=bench.targets,
                gold=gold,
                today=policy_today(bench.policy),
                **extra,
            )
            kinds = Counter(
                (
                    str(f.owner.value if hasattr(f.owner, "value") else f.owner),
                    str(f.kind.value if hasattr(f.kind, "value") else f.kind),
                    f.tool,
                )
                for f in d.findings
            )
            refused = Counter(
                (
                    str(f.owner.value if hasattr(f.owner, "value") else f.owner),
                    str(f.kind.value if hasattr(f.kind, "value") else f.kind),
                    f.tool,
                )
                for f in d.findings
                if f.extra.get("refused")
            )
            failed = int((~t.scores["success"].astype(bool)).sum())
            cells = "; ".join(
                f"{o} {k} `{tool}`: {n} ({refused[(o, k, tool)]} refused)" for (o, k, tool), n in sorted(kinds.items())
            )
            print(f"| {name} | {len(t.scores)} | {failed} | {cells} |", flush=True)
            plan = RulesAgent()(
                PlanContext(
                    packets=d.packets, package=pkg, bench=bench, traces=t.traces, scores=t.scores, findings=d.findings
                )
            )
            body = next((op.body for op in (plan.operations if plan else []) if op.op == "add_card"), None)
            cards.append((name, plan.summary if plan else "no plan", body))
    for name, summary, body in cards:
        print(f"\n{name}: {summary}\n{body or ''}")


if __name__ == "__main__":
    main()
