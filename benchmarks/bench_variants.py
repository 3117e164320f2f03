"""The default campaign on random variants of the built-in worlds: does the learning hold on rule values and forms
nobody developed it on?

    python benchmarks/bench_variants.py [--quick] [--worlds retail,airline] [--seeds 1,2,3,4,5] [--out DIR]

For each world and seed, `ratchet bench rules --random SEED` draws a variant (every numeric rule a new value,
thresholds in either direction, factors that are ratios of small integers, other allowed sets), `ratchet bench
materialize --rules` builds its benchmark (with its own `reference` package), and the default campaign
(`ratchet campaign run`, params.yaml unchanged but the benchmark) runs on it in a fresh process with its own
$RATCHET_HOME. The variant's own `reference` and the start package `seed` are then evaluated on the untouched test
split (3 seeds, as the campaign certifies its champion). Reported per variant: test seed -> champion, the net gain and
its 95% CI (the campaign's own certification), the reference's test mean, and the share of the seed-to-reference gap
the champion closes. `--quick` (the test's size): one retail variant, 4 tasks per family, one round.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from components.env import answers  # noqa: E402


def ratchet() -> list[str]:
    script = Path(sys.executable).parent / "ratchet"
    return [str(script)] if script.exists() else [sys.executable, "-m", "flows.entry"]


def run(cmd: list[str], env: dict, log: Path) -> None:
    with log.open("a") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        got = subprocess.run(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT)
    if got.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:4])} ... failed (exit {got.returncode}); its output is in {log}")


def test_mean(scores: Path) -> float:
    import pandas as pd

    df = pd.read_csv(scores)
    return float(df.groupby("item_id")["score"].mean().mean())


def variant(world: str, seed: int, root: Path, extra: list[str], per_family: int | None) -> dict:
    home = root / f"{world}-{seed}"
    home.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "RATCHET_HOME": str(home / "home")}
    if env.get("PREFECT_API_URL") and not answers(env["PREFECT_API_URL"]):
        # a server this process was once pointed at and that has stopped since: no server, so each command starts
        # its own rather than failing to reach it
        env.pop("PREFECT_API_URL")
    log = home / "log.txt"
    rules, bench = home / "rules.yaml", home / "bench"
    run(ratchet() + ["bench", "rules", "--world", world, "--random", str(seed), "--out", str(rules)], env, log)
    out = home / "campaign"  # the campaign materializes the variant's benchmark from its benchmark.* params
    run(
        ratchet()
        + [
            "campaign",
            "run",
            "--out",
            str(out),
            "--set",
            f"benchmark.world={world}",
            "--set",
            f"benchmark.out={bench}",
            "--set",
            f"benchmark.rules={rules}",
            "--set",
            f"evidence.db={home / 'evidence.db'}",
        ]
        + size_params(per_family)
        + extra,
        env,
        log,
    )
    summary = json.loads((out / "summary.json").read_text())
    t = summary["test"]
    ref = home / "eval-reference"
    run(
        ratchet()
        + [
            "eval",
            "--package",
            str(bench / "packages" / "reference"),
            "--benchmark",
            str(bench),
            "--split",
            "test",
            "--seeds",
            str(summary["params"]["campaign"]["seeds"]),
            "--out",
            str(ref),
        ],
        env,
        log,
    )
    reference = test_mean(ref / "scores.csv")
    gap = reference - t["base_mean"]
    return {
        "world": world,
        "seed": seed,
        "seed_mean": t["base_mean"],
        "champion": t["champion_mean"],
        "net": t["net"],
        "ci_lo": t["ci_lo"],
        "ci_hi": t["ci_hi"],
        "reference": reference,
        "closed": (t["champion_mean"] - t["base_mean"]) / gap if gap > 0 else float("nan"),
        "promotions": summary["accepted"],
        "rounds": summary["rounds"] if isinstance(summary["rounds"], int) else len(summary["rounds"]),
        "rules": str(rules),
    }


def size_params(per_family: int | None) -> list[str]:
    return ["--set", f"benchmark.per_family={per_family}"] if per_family else []


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="one retail variant, 4 tasks per family, one round")
    ap.add_argument("--worlds", default="retail,airline")
    ap.add_argument("--seeds", default="1,2,3,4,5", help="the variants' seeds (`ratchet bench rules --random`)")
    ap.add_argument("--out", help="where each variant's files go (default: a temporary directory)")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args(argv)
    worlds, seeds = args.worlds.split(","), [int(s) for s in args.seeds.split(",")]
    extra, per_family = [], None
    if args.quick:
        worlds, seeds, per_family = ["retail"], seeds[:1], 4
        extra = ["--rounds", "1", "--set", "campaign.seeds=1", "--set", "gate.n_boot=1000"]
    root = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="ratchet-variants-"))
    rows = [variant(w, s, root, extra, per_family) for w in worlds for s in seeds]
    print(
        f"{'world':8} {'seed':>4} {'test: seed -> champion':>23} {'net [95% CI]':>26} {'reference':>9} "
        f"{'gap closed':>10} {'promotions':>10}"
    )
    for r in rows:
        print(
            f"{r['world']:8} {r['seed']:>4} {r['seed_mean']:>10.3f} -> {r['champion']:.3f}   {r['net']:+.3f} "
            f"[{r['ci_lo']:+.3f}, {r['ci_hi']:+.3f}] {r['reference']:>9.3f} {r['closed']:>10.0%} "
            f"{r['promotions']:>10}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    ok = sum(r["net"] >= 0.25 and r["ci_lo"] > 0 and r["closed"] >= 0.75 for r in rows)
    print(f"{ok} / {len(rows)} variants net >= +0.25 (CI above 0) and close >= 75% of the seed-to-reference gap")
    return rows


if __name__ == "__main__":
    main()
