"""Ratchet's acceptance rule beside its peers' on one proposer, one world, one agent and one budget (issue 28).

Arms, each from the same start package (`campaign.start`), benchmark draw, simulated agent and seeds:

  ratchet  flows.round.run_round, the round's own composition (evaluate, diagnose, plan, patch, validate,
           sequential repair screen, the paired gate with alpha spending over the declared rounds and sequential
           looks, commit | reject), its stages called directly (`plain_steps`, no Prefect server, no MLflow);
  kse      the same loop and stages, the dev decision replaced by the k*SE paired rule (cap-evolve's): accept when the
           mean paired per-item improvement on dev exceeds k = 2 standard errors (Student-t statistic, df = n-1),
           decided on the whole dev evaluation (every seed), no alpha spending;
  anypos   the same loop, accept any positive mean dev delta;
  gepa     the real `gepa.optimize` (gepa 0.1.4): the package's files as the candidate's one component, train
           (item, seed) episodes as trainset, dev episodes as valset, the `rules` meta-agent (the same injected
           proposer) as `propose_new_texts`; GEPA's own minibatch acceptance (strict improvement of the summed
           minibatch scores), Pareto candidate selection, and `max_metric_calls` = the episodes the ratchet arm spent
           in the same repetition; its best valset candidate is the champion. Its reflection minibatch is the whole
           train split (every train episode), merge off.
  gepa-defaults  the same `gepa.optimize` call at GEPA's own defaults for the rest: its default reflection minibatch
           (`reflection_minibatch_size=None`, which gepa 0.1.4 turns into 3 episodes) and `use_merge=True` (at most
           `max_merge_invocations` = 5 merges, its default). GEPA's merge combines the components of two descendants of
           a common ancestor; the candidate here is one component (the package), so a merge needs one descendant's
           package equal to the ancestor's, which strict minibatch acceptance never admits: merge is on and counted
           (a merged candidate in the pool is a promotion), but expected not to fire.
  kse-bare, anypos-bare (`--arms`; not in the default run) the two rules alone, as their systems run them: the same
           loop with Ratchet's repair screen passing every candidate at once.

One proposer for every arm: the `rules` meta-agent, wrapped so that a seeded share of its proposals (one in three,
decided by a hash of the repetition, the parent package and the real plan) is replaced by a neutral card (about
nothing the policy governs) or a harmful one (a rule of the world stated with a wrong value, which the simulated agent
follows like any card). A replaced plan that is turned down leaves the real plan to be proposed next time from the same
parent. The truth of every proposal (helps / neutral / harms) is settled afterwards against its parent on a separate,
larger benchmark draw (`--truth-per-family` tasks per family, two seeds) that no arm sees: helps when the paired 95% CI
of the per-item difference is above zero, harms when below, neutral otherwise. An accepted proposal is judged again
on a second draw of its own (`--resolve-per-family`, default twice `--per-family`, `--resolve-seeds` seeds), so that
a false promotion is judged at least as precisely as the gate's dev looks that made it. A false promotion is an
accepted proposal that does not help by that truth (for GEPA: a candidate admitted to its pool).

Every arm is run at the component level (no Prefect server or MLflow: the acceptance rules are what is compared), with
every episode memoized by (package digest, benchmark, item, seed) across the arms of a repetition, so an episode two
arms both ask for runs once (each arm is still charged it). The test gain is the champion's mean paired gain over the
start package on the repetition's own test split (never seen by any arm), every campaign seed. Receipts: silent (the
default benchmark mode), stated in the table.

    python benchmarks/bench_peers.py [--quick] [--reps N] [--first-rep K] [--worlds retail,airline] [--jobs 2]
                                      [--out FILE]
    python benchmarks/bench_peers.py --table FILE      # the table of the rows --out wrote (a run still going)

`--quick` (the test's size): retail, one repetition, 6 tasks per family, 2 rounds; its last line is a ratio
(Ratchet's test gain over the best peer's, or 1.00 when all are equal), like the other benchmarks' quick runs.
"""

from __future__ import annotations

import argparse
import atexit
import hashlib
import json
import math
import re
import shutil
import sys
import tempfile
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ARMS = ("ratchet", "kse", "anypos", "gepa", "gepa-defaults")
# the peers' rules alone, as their systems run them: the same loop without Ratchet's repair screen (`--arms`)
BARE = ("kse-bare", "anypos-bare")
K_SE = 2.0
SHARE = 1 / 3  # proposals replaced: half of them neutral, half harmful
INJECTED = ("neutral", "harmful")
TRUTH_SEED = 100_000  # the truth draw's benchmark seed (the repetitions' draws are seeds 0, 1, ...)


# -- the episode memo ---------------------------------------------------------------------------------------------------


class Memo:
    """Finished episodes by (package digest, benchmark digest, item, seed), shared by a repetition's arms. `view` is the
    `journal` of components.runtime.evaluate.run_shard: an episode it holds is not run again."""

    def __init__(self):
        self.done: dict[tuple, object] = {}
        self.ran = 0

    def view(self, pkg_digest: str, bench_digest: str):
        memo = self

        class View:
            resumed = False

            def get(self, item, seed):
                return memo.done.get((pkg_digest, bench_digest, item, seed))

            def put(self, r):
                memo.ran += 1
                memo.done[(pkg_digest, bench_digest, r.item_id, r.seed)] = r

        return View()

    def run(self, package, bench, items: list[str], seeds: list[int], max_turns: int):
        """EvalTables of `package` on items x seeds (memoized)."""
        from components.memory.package import digest
        from components.runtime.evaluate import benchmark_at, run_shard

        b = benchmark_at(bench)
        return run_shard(
            str(package),
            b,
            list(items),
            list(seeds),
            "sim",
            {},
            max_turns,
            journal=self.view(digest(package), b.digest),
        )


# -- the proposer: the rules meta-agent with injected neutral and harmful cards -----------------------------------------


def _u(*parts) -> float:
    h = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()
    return int(h[:12], 16) / 16**12


def decision(rep: int, parent: str, plan_key: str) -> str:
    """real | neutral | harmful, seeded by the repetition, the parent package and the real plan (so every arm that
    asks the proposer the same question gets the same answer)."""
    u = _u("peers", rep, parent, plan_key)
    return "real" if u >= SHARE else ("neutral" if u < SHARE / 2 else "harmful")


NEUTRAL_BODY = (
    "Greet the customer once, keep each reply short and polite, and thank them at the end of the conversation."
)


def _plan_tool(plan, bench) -> str | None:
    for t in sorted(bench.write_tools):
        if re.search(rf"(^|[\s`/]){re.escape(t)}($|[\s`(,])", plan.summary):
            return t
    return None


def _harmful_text(fact) -> str | None:
    """The fact's own statement with one number changed so that it instructs a wrong value, or None. The last number
    first: in a rule's statement it is usually the amount (a threshold changed only misleads between the two)."""
    text = fact.statement
    truth = fact.read(text)
    for m in reversed(list(re.finditer(r"\d+(?:\.\d+)?", text))):
        x = float(m.group())
        for alt in (x * 2 if x else 5, x / 2 if x else 1, x + 7):
            s = f"{alt:g}"
            new = text[: m.start()] + s + text[m.end() :]
            got = fact.read(new)
            if got is not None and got != truth:
                return new
    return None


def fake_plan(kind: str, real, package: str, bench, rep: int):
    """A neutral or harmful card plan in the real plan's place (its evidence and source items), or None."""
    from components.evolution.plan import AddBinding, AddCard, Plan
    from components.memory.package import load_package
    from components.worlds import world

    facts = [f for f in world(bench.meta["world"]).competence.facts if f.tool in set(bench.write_tools)]
    tool = _plan_tool(real, bench)
    pool = [f for f in facts if f.tool == tool] or facts
    if not pool:
        return None
    h = hashlib.sha256(f"{rep}:{real.key()}:{kind}".encode()).hexdigest()[:8]
    if kind == "harmful":
        order = sorted(pool, key=lambda f: _u("fact", rep, real.key(), f.id))
        got = next(((f, t) for f in order if (t := _harmful_text(f)) is not None), None)
        if got is None:
            return None
        fact, body = got
        tool, card_id, ctype = fact.tool, f"peers-tip-{h}", "procedure"
    else:
        tool = tool or sorted(pool, key=lambda f: _u("tool", rep, real.key(), f.id))[0].tool
        card_id, ctype, body = f"peers-note-{h}", "knowledge", NEUTRAL_BODY
    pkg = load_package(package)
    routed = any(b.spec.use == "event_cards" and b.spec.at == "intent_recorded" for b in pkg.delivery)
    ops = [
        AddCard(
            op="add_card",
            path=f"em/{ctype}/{card_id}.md",
            meta={
                "id": card_id,
                "type": ctype,
                "trigger": {"event": "intent_recorded", "tool": tool},
                "source": f"bench_peers: a {kind} card injected in place of plan {real.key()}",
            },
            body=body,
        )
    ]
    if not routed:
        ops.append(
            AddBinding(
                op="add_binding",
                section="delivery",
                use="event_cards",
                at="intent_recorded",
                cfg={"max_per_episode": 6},
            )
        )
    return Plan(
        owner="E",
        cluster=real.cluster,
        summary=f"E: card {card_id} on {tool} ({kind}, injected)",
        rationale=real.rationale,
        evidence=real.evidence,
        operations=ops,
        mechanism=f"deliver:{card_id}@",
        source_items=real.source_items,
    )


class Proposals:
    """Every proposal an arm's proposer made: parent, candidate, kind, and the verdict. (A plain class: the tests load
    this script as a module sys.modules does not hold, which a dataclass's annotations would need.)"""

    def __init__(self):
        self.rows: list[dict] = []
        self.kinds: dict[str, str] = {}  # plan key -> kind


def injected_plan(rep: int, props: Proposals, plan_fn):
    """Wrap flows.tasks.plan_stage's function: one in three plans replaced by a neutral or harmful card."""
    from components.evolution.meta import PlanOutcome
    from components.memory.package import digest

    def plan(diagnosis, train, package, bench, corpus, rejected, meta_agent, meta_cfg, budget=None, memory=None, **kw):
        out = plan_fn(
            diagnosis, train, package, bench, corpus, rejected, meta_agent, meta_cfg, budget, memory=memory, **kw
        )
        if out.plan is None or out.failure:
            return out
        kind = decision(rep, digest(package), out.plan.key())
        if kind != "real":
            from components.runtime.evaluate import benchmark_at

            fake = fake_plan(kind, out.plan, package, benchmark_at(bench), rep)
            if fake is not None and fake.key() not in set(rejected):
                props.kinds[fake.key()] = kind
                return PlanOutcome(plan=fake)
        props.kinds[out.plan.key()] = "real"
        return out

    return plan


# -- the arms in Ratchet's loop -------------------------------------------------------------------------------------------


def no_screen(base, cand, material, alpha, design, items, seeds):
    """A repair_look step that passes every candidate at its first look (the peers have no repair screen)."""
    import pandas as pd

    from components.evolution.gate import RepairResult

    return (
        RepairResult(True, 0, 0, 0.0, 0.0, 0, "no repair screen (a peer's rule alone)"),
        pd.DataFrame(columns=["item_id", "base", "cand", "d"]),
        {"looks": 1, "looks_used": 1, "stopped_early": False, "why": "no screen"},
    )


def peer_gate(rule: str):
    """A gate_look step deciding on the whole dev evaluation (every look's cells) with a peer's rule."""

    from components.evolution.gate import GateResult, pair

    def gate_look(base, cand, cfg, design, items, seeds, fired_by_look, leakage):
        if cand["seed"].nunique() < len(seeds):  # decide on the full evaluation, like the peer does
            return None, None, {}
        per, dropped = pair(base, cand, cfg["max_error_share"], 2)
        d = per["d"].to_numpy(dtype=float)
        n, net = len(d), float(d.mean())
        se = float(d.std(ddof=1) / math.sqrt(n)) if n > 1 else 0.0
        if rule.startswith("kse"):
            accept = net > K_SE * se if se > 0 else net > 0
            why = f"net {net:+.4f} vs {K_SE:g} x SE {se:.4f} (t = {net / se if se else float('inf'):+.2f}, df {n - 1})"
        else:
            accept, why = net > 0, f"net {net:+.4f} (any positive delta)"
        mat = cfg["material"]
        res = GateResult(
            bool(accept),
            net,
            net - K_SE * se,
            net + K_SE * se,
            n,
            int((d > mat).sum()),
            int((d < -mat).sum()),
            why,
            float(per["base"].mean()),
            float(per["cand"].mean()),
            dropped,
        )
        return res, per, {"looks": len(seeds), "looks_used": len(seeds), "stopped_early": False, "why": rule}

    return gate_look


def loop_arm(arm: str, rep: int, bench: Path, home: Path, memo: Memo, over: dict) -> dict:
    """One campaign of Ratchet's loop (`flows.round.run_round` round by round), with this arm's dev decision."""
    import dataclasses

    from components.evolution.lineage import Lineage
    from components.memory.package import digest
    from components.params import load_params
    from components.codes import Verdict
    from flows.round import plain_steps, run_round
    from flows.tasks import plan_stage, validate_stage

    out = home / f"{arm}"
    p = load_params(
        ROOT / "params.yaml",
        {
            **over,
            "benchmark.out": str(bench),
            "campaign.out": str(out),
            "campaign.name": f"peers-{arm}",
            "evidence.memory": False,
            "evidence.db": str(home / f"evidence-{arm}.db"),
        },
    )
    lineage = Lineage(out / "lineage")
    start = lineage.start(ROOT / p.campaign.start)
    spent = {"episodes": 0}
    props = Proposals()
    current: dict = {}

    def evaluate(package, bench_, seeds, split=None, items=None, **_):
        from components.runtime.evaluate import benchmark_at

        ids = list(items) if items is not None else benchmark_at(bench_).ids(split)
        spent["episodes"] += len(ids) * len(seeds)
        return memo.run(package, bench_, ids, seeds, p.campaign.max_turns)

    def validate(plan, candidate, bench_, probe_items, model, model_cfg, max_turns, budget=None):
        v = validate_stage.fn(plan, candidate, bench_, probe_items, model, model_cfg, max_turns, None)
        if "activation" in v.checks:
            spent["episodes"] += len(probe_items)
        return v

    def patch(plan, base, cand_out):
        from flows.tasks import patch_stage

        got = patch_stage.fn(plan, base, cand_out)
        keep = home / "packages" / digest(got)
        if not keep.exists():
            shutil.copytree(got, keep)
        current.update(
            parent=digest(base),
            cand=digest(got),
            kind=props.kinds.get(plan.key(), "real"),
            plan=plan.key(),
            summary=plan.summary,
        )
        return got

    def causes(*_a, **_k):  # counterfactual replay scores the diagnoser; no decision reads it
        import pandas as pd

        return pd.DataFrame(columns=["item_id", "seed", "cause"])

    steps = dataclasses.replace(
        plain_steps(1),
        evaluate=evaluate,
        causes=causes,
        validate=validate,
        patch=patch,
        plan=injected_plan(rep, props, plan_stage.fn),
        **({"gate_look": peer_gate(arm)} if arm != "ratchet" else {}),
        **({"repair_look": no_screen} if arm.endswith("-bare") else {}),
    )
    keep = home / "packages" / start.digest
    if not keep.exists():
        shutil.copytree(start.path, keep)
    for r in range(1, p.campaign.rounds + 1):
        current.clear()
        rec = run_round(r, p, None, steps)
        if current:
            props.rows.append({**current, "round": r, "verdict": str(rec.verdict), "reason": rec.reason or ""})
        if rec.verdict in (Verdict.NO_PLAN, Verdict.REJECTED_PLAN):
            break
    champ = lineage.champion()
    chain = [x["cand"] for x in props.rows if x["verdict"] == "accept"]
    return {
        "arm": arm,
        "episodes": spent["episodes"],
        "champion": champ.digest,
        "start": start.digest,
        "proposals": props.rows,
        "chain": chain,
    }


# -- GEPA ---------------------------------------------------------------------------------------------------------------


def package_text(path: Path) -> str:
    return json.dumps(
        {f.relative_to(path).as_posix(): f.read_text() for f in sorted(Path(path).rglob("*")) if f.is_file()},
        sort_keys=True,
        indent=0,
    )


def text_package(text: str, home: Path) -> Path:
    from components.memory.package import digest

    tmp = home / "gepa-tmp" / hashlib.sha256(text.encode()).hexdigest()[:16]
    if not tmp.exists():
        for rel, body in json.loads(text).items():
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp / rel).write_text(body)
    keep = home / "packages" / digest(tmp)
    if not keep.exists():
        shutil.copytree(tmp, keep)
    return keep


def gepa_arm(rep: int, bench: Path, home: Path, memo: Memo, over: dict, budget: int, defaults: bool = False) -> dict:
    """GEPA's engine; `defaults`: its own reflection minibatch and merge on (the `gepa-defaults` arm), else the whole
    train split as the minibatch and no merge (the `gepa` arm)."""
    import gepa
    from gepa.core.adapter import EvaluationBatch

    from components.evolution.diagnose import Diagnosis  # noqa: F401 (the type diagnose_stage returns)
    from components.evolution.patch import apply_plan
    from components.evolution.validate import static_checks
    from components.memory.package import digest
    from components.params import load_params
    from components.runtime.evaluate import benchmark_at, seed_map_hash, tables
    from flows.tasks import diagnose_stage, plan_stage

    p = load_params(ROOT / "params.yaml", {**over, "benchmark.out": str(bench)})
    b = benchmark_at(bench)
    seeds = list(range(p.campaign.seeds))
    start = ROOT / p.campaign.start
    spent = {"episodes": 0}
    props = Proposals()
    tried: dict[str, set[str]] = defaultdict(set)
    plan_fn = injected_plan(rep, props, plan_stage.fn)

    class Adapter:
        def evaluate(self, batch, candidate, capture_traces=False):
            path = text_package(candidate["package"], home)
            by_seed = defaultdict(list)
            for item, s in batch:
                by_seed[s].append(item)
            score = {}
            for s, items in by_seed.items():
                t = memo.run(path, bench, items, [s], p.campaign.max_turns)
                score.update({(r.item_id, int(r.seed)): float(r.score) for r in t.scores.itertuples()})
            spent["episodes"] += len(batch)
            scores = [score[(i, s)] for i, s in batch]
            return EvaluationBatch(
                outputs=scores,
                scores=scores,
                trajectories=[{"item": i, "seed": s, "score": x} for (i, s), x in zip(batch, scores)]
                if capture_traces
                else None,
            )

        def make_reflective_dataset(self, candidate, eval_batch, components_to_update):
            return {c: list(eval_batch.trajectories) for c in components_to_update}

        def propose_new_texts(self, candidate, reflective_dataset, components_to_update):
            """Ratchet's proposer on the parent's minibatch episodes (read from the memo: GEPA just ran them)."""
            path = text_package(candidate["package"], home)
            dg = digest(path)
            cells = [(r["item"], r["seed"]) for r in reflective_dataset["package"]]
            view = memo.view(dg, b.digest)
            train = tables([view.get(i, s) for i, s in cells])
            items = sorted({i for i, _ in cells})
            corpus = f"{dg}:{b.digest}:{seed_map_hash(items, sorted({s for _, s in cells}))}"
            diagnosis = diagnose_stage.fn(train, str(path), str(bench), corpus)
            for _ in range(12):
                out = plan_fn(
                    diagnosis, train, str(path), str(bench), corpus, sorted(tried[dg]), "rules", {}, None, memory=None
                )
                plan = out.plan
                if plan is None:
                    return dict(candidate)  # nothing left to propose: GEPA evaluates the parent again
                tried[dg].add(plan.key())
                work = home / "gepa-work" / plan.key()
                shutil.rmtree(work, ignore_errors=True)
                cand = apply_plan(plan, path, work)
                v, _ = static_checks(plan, cand, b)
                if v.ok:
                    props.rows.append(
                        {
                            "parent": dg,
                            "cand": digest(cand),
                            "kind": props.kinds.get(plan.key(), "real"),
                            "plan": plan.key(),
                            "summary": plan.summary,
                        }
                    )
                    return {"package": package_text(cand)}
            return dict(candidate)

    class Quiet:
        def log(self, message: str):
            pass

    trainset = [(i, s) for i in b.ids("train") for s in seeds]
    valset = [(i, s) for i in b.ids("dev") for s in seeds]
    result = gepa.optimize(
        seed_candidate={"package": package_text(start)},
        trainset=trainset,
        valset=valset,
        adapter=Adapter(),
        max_metric_calls=budget,
        reflection_minibatch_size=None if defaults else len(trainset),
        use_merge=defaults,
        candidate_selection_strategy="pareto",
        frontier_type="instance",
        seed=rep,
        logger=Quiet(),
        display_progress_bar=False,
        raise_on_exception=True,
    )
    pool = [digest(text_package(c["package"], home)) for c in result.candidates]
    proposed = {row["cand"] for row in props.rows}
    for i in range(1, len(pool)):  # a merged candidate never went through the proposer: a proposal of its own
        if pool[i] not in proposed:
            props.rows.append(
                {
                    "parent": pool[(result.parents[i] or [0])[0] or 0],
                    "cand": pool[i],
                    "kind": "merge",
                    "plan": f"merge:{result.parents[i]}",
                    "summary": "GEPA merge",
                }
            )
    for row in props.rows:
        row["verdict"] = "accept" if row["cand"] in pool[1:] else "reject"
    chain, i = [], result.best_idx
    while i is not None and i != 0:
        chain.append(pool[i])
        i = (result.parents[i] or [None])[0]
    return {
        "arm": "gepa-defaults" if defaults else "gepa",
        "episodes": spent["episodes"],
        "champion": pool[result.best_idx],
        "start": pool[0],
        "proposals": props.rows,
        "chain": chain[::-1],
        "pool": len(pool),
        "metric_calls": result.total_metric_calls,
    }


# -- truth, test gain, one repetition -------------------------------------------------------------------------------------


def paired(memo: Memo, home: Path, bench: Path, a: str, b_: str, items: list[str], seeds: list[int], max_turns: int):
    """Per-item mean difference b_ - a (package digests under home/packages) on items x seeds."""
    import numpy as np

    ta = memo.run(home / "packages" / a, bench, items, seeds, max_turns).scores
    tb = memo.run(home / "packages" / b_, bench, items, seeds, max_turns).scores
    ma = ta.groupby("item_id")["score"].mean()
    mb = tb.groupby("item_id")["score"].mean()
    return (mb - ma).to_numpy(dtype=float) if a != b_ else np.zeros(len(items))


def t_ci(d, z: float = 1.96) -> tuple[float, float, float]:
    import numpy as np

    d = np.asarray(d, dtype=float)
    m = float(d.mean()) if len(d) else 0.0
    if len(d) < 2:
        return m, m, m
    from scipy import stats

    h = float(stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d)))
    return m, m - h, m + h


_TRUTH: dict = {}  # (world, seed, per_family) -> a truth draw and its episodes; "home": the process's home


def truth_draw(world: str, per_family: int, seed: int = TRUTH_SEED) -> tuple[Path, Memo]:
    """A truth draw of a world (one benchmark seed for every repetition, never seen by an arm) and its episode memo,
    kept for the process: a package two repetitions both proposed (same bytes, same digest) is scored once."""
    from components.params import BenchmarkParams

    if (world, seed, per_family) not in _TRUTH:
        out = Path(tempfile.mkdtemp(prefix=f"peers-truth-{world}-")) / "truth"
        atexit.register(shutil.rmtree, out.parent, ignore_errors=True)
        BenchmarkParams(world=world, seed=seed, out=str(out), per_family=per_family).materialize()
        _TRUTH[(world, seed, per_family)] = (out, Memo())
    return _TRUTH[(world, seed, per_family)]


def verdict_of(d) -> tuple[str, float]:
    """helps / harms / neutral by the paired 95% t interval of the per-item differences, and their mean."""
    m, lo, hi = t_ci(d)
    return ("helps" if lo > 0 else "harms" if hi < 0 else "neutral"), m


def judge(arms: dict, job: dict, home: Path, turns: int) -> None:
    """Every proposal's truth (`truth`, `truth_delta`) on the truth draw; with `resolve_per_family`, an accepted
    proposal's on a second, larger draw of its own (`truth_first` keeps the first draw's verdict). The first draw is
    smaller than a full-size campaign's dev looks, so a change the gate could rightly resolve (a small true effect) is
    *neutral* there: a false promotion must be judged at least as precisely as the gate that made it."""
    from components.runtime.evaluate import benchmark_at

    truth, tmemo = truth_draw(job["world"], job["truth_per_family"])
    tb = benchmark_at(truth)
    items, seeds = sorted(tb.ids("train") + tb.ids("dev") + tb.ids("test")), [0, 1]
    first: dict[tuple[str, str], tuple[str, float]] = {}
    for a in arms.values():
        for pr in a["proposals"]:
            key = (pr["parent"], pr["cand"])
            if key not in first:
                first[key] = verdict_of(paired(tmemo, home, truth, *key, items, seeds, turns))
            pr["truth"], pr["truth_delta"] = first[key]
    if not job.get("resolve_per_family"):
        return
    big, bmemo = truth_draw(job["world"], job["resolve_per_family"], seed=TRUTH_SEED + 1)
    bb = benchmark_at(big)
    bitems, bseeds = sorted(bb.ids("train") + bb.ids("dev") + bb.ids("test")), list(range(job["resolve_seeds"]))
    resolved: dict[tuple[str, str], tuple[str, float]] = {}
    for a in arms.values():
        for pr in a["proposals"]:
            if pr["verdict"] != "accept":
                continue
            key = (pr["parent"], pr["cand"])
            if key not in resolved:
                resolved[key] = verdict_of(paired(bmemo, home, big, *key, bitems, bseeds, turns))
            pr["truth_first"], pr["truth_first_delta"] = pr["truth"], pr["truth_delta"]
            pr["truth"], pr["truth_delta"] = resolved[key]


def repetition(job: dict) -> dict:
    """Every arm on one (world, repetition): returns the arm rows with truth attached."""
    from components.env import quiet_offline

    if "home" not in _TRUTH:  # the quiet, offline environment, one home for the process's repetitions
        _TRUTH["home"] = Path(tempfile.mkdtemp(prefix="peers-home-"))
        atexit.register(shutil.rmtree, _TRUTH["home"], ignore_errors=True)
        quiet_offline(_TRUTH["home"])
    home = Path(tempfile.mkdtemp(prefix=f"peers-{job['world']}-{job['rep']}-"))
    from components.params import BenchmarkParams
    from components.runtime.evaluate import benchmark_at

    t0 = time.perf_counter()
    world, rep = job["world"], job["rep"]
    bench = home / "bench"
    BenchmarkParams(world=world, seed=rep, out=str(bench), per_family=job["per_family"]).materialize()
    truth, tmemo = truth_draw(world, job["truth_per_family"])
    over = {
        "benchmark.world": world,
        "benchmark.per_family": job["per_family"],
        "campaign.rounds": job["rounds"],
        "campaign.seeds": job["seeds"],
        "gate.n_boot": job["n_boot"],
        "campaign.traces_per_round": 0,
    }
    memo = Memo()
    arms = {}
    for arm in ("ratchet", "kse", "anypos", *BARE):
        if arm in job["arms"]:
            arms[arm] = loop_arm(arm, rep, bench, home, memo, over)
    budget: dict[str, int] = {}
    for arm in ("gepa", "gepa-defaults"):
        if arm in job["arms"]:
            if "ratchet" not in budget:  # the ratchet arm's episodes in this repetition
                budget["ratchet"] = (
                    arms["ratchet"] if "ratchet" in arms else loop_arm("ratchet", rep, bench, home, memo, over)
                )["episodes"]
            arms[arm] = gepa_arm(
                rep, bench, home, memo, over, budget=budget["ratchet"], defaults=arm == "gepa-defaults"
            )
    b, tb = benchmark_at(bench), benchmark_at(truth)
    seeds, turns = list(range(job["seeds"])), 40
    truth_items, truth_seeds = sorted(tb.ids("train") + tb.ids("dev") + tb.ids("test")), [0, 1]
    judge(arms, job, home, turns)
    rows = []
    for arm, a in arms.items():
        false = [pr for pr in a["proposals"] if pr["verdict"] == "accept" and pr["truth"] != "helps"]
        truth_of = {pr["cand"]: pr["truth"] for pr in a["proposals"]}
        test = t_ci(paired(memo, home, bench, a["start"], a["champion"], sorted(b.ids("test")), seeds, turns))
        whole = float(paired(tmemo, home, truth, a["start"], a["champion"], truth_items, truth_seeds, turns).mean())
        rows.append(
            {
                "world": world,
                "rep": rep,
                "arm": arm,
                "episodes": a["episodes"],
                "proposals": len(a["proposals"]),
                "injected_proposed": sum(pr["kind"] in INJECTED for pr in a["proposals"]),
                "promotions": sum(pr["verdict"] == "accept" for pr in a["proposals"]),
                "false_promotions": len(false),
                "false_injected": sum(pr["kind"] in INJECTED for pr in false),
                "merges": sum(pr["kind"] == "merge" for pr in a["proposals"]),
                "false_in_champion": sum(truth_of.get(c) != "helps" for c in a["chain"]),
                "test_gain": test[0],
                "test_regression": test[0] < 0,
                "truth_gain": whole,
                "proposals_detail": a["proposals"],
            }
        )
    shutil.rmtree(home, ignore_errors=True)
    for r in rows:
        r["seconds"] = time.perf_counter() - t0
    return {"rows": rows, "episodes_run": memo.ran}


# -- the table -------------------------------------------------------------------------------------------------------------


def table(rows: list[dict], size: str) -> list[str]:
    import numpy as np

    out = [
        f"receipts: silent; {size}",
        "| world | arm | test gain [95% CI] | truth-draw gain | episodes | promotions | false promotions "
        "| campaigns with a false promotion | false in champion | test regressions | injected cards: proposed / falsely promoted |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for world in sorted({r["world"] for r in rows}):
        for arm in ARMS + BARE:
            rs = [r for r in rows if r["world"] == world and r["arm"] == arm]
            if not rs:
                continue
            m, lo, hi = t_ci([r["test_gain"] for r in rs])
            n = len(rs)
            out.append(
                f"| {world} | {arm} | {m:+.4f} [{lo:+.4f}, {hi:+.4f}] "
                f"| {np.mean([r['truth_gain'] for r in rs]):+.4f} "
                f"| {np.mean([r['episodes'] for r in rs]):.0f} "
                f"| {np.mean([r['promotions'] for r in rs]):.2f} "
                f"| {np.mean([r['false_promotions'] for r in rs]):.2f} "
                f"| {sum(r['false_promotions'] > 0 for r in rs)}/{n} "
                f"| {np.mean([r['false_in_champion'] for r in rs]):.2f} "
                f"| {sum(r['test_regression'] for r in rs)}/{n} "
                f"| {sum(r.get('injected_proposed', 0) for r in rs)} / {sum(r.get('false_injected', 0) for r in rs)} |"
            )
    out += [
        "",
        "Ratchet's test gain minus each peer's, paired by repetition (95% t interval over the repetitions both ran):",
        "| world | peer | ratchet - peer [95% CI] | repetitions | ratchet ahead / level / behind |",
        "|---|---|---|---|---|",
    ]
    for world in sorted({r["world"] for r in rows}):
        mine = {r["rep"]: r["test_gain"] for r in rows if r["world"] == world and r["arm"] == "ratchet"}
        for arm in ARMS[1:] + BARE:
            theirs = {r["rep"]: r["test_gain"] for r in rows if r["world"] == world and r["arm"] == arm}
            both = sorted(set(mine) & set(theirs))
            if not both:
                continue
            d = [mine[k] - theirs[k] for k in both]
            m, lo, hi = t_ci(d)
            out.append(
                f"| {world} | {arm} | {m:+.4f} [{lo:+.4f}, {hi:+.4f}] | {len(both)} "
                f"| {sum(x > 1e-12 for x in d)} / {sum(abs(x) <= 1e-12 for x in d)} / {sum(x < -1e-12 for x in d)} |"
            )
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="retail, one repetition, 6 tasks per family, 2 rounds")
    ap.add_argument("--reps", type=int, default=20, help="seeded repetitions per arm and world (benchmark seeds)")
    ap.add_argument("--first-rep", type=int, default=0, help="the first repetition's benchmark seed (to extend a run)")
    ap.add_argument("--worlds", default="retail,airline")
    ap.add_argument("--per-family", type=int, default=8, help="tasks per family of each repetition's benchmark")
    ap.add_argument("--truth-per-family", type=int, default=12, help="tasks per family of the truth draw")
    ap.add_argument(
        "--resolve-per-family",
        type=int,
        default=None,
        help="tasks per family of the second truth draw every accepted proposal is judged on (default: 2 x "
        "--per-family, at least --truth-per-family; 0: none, the first draw judges)",
    )
    ap.add_argument("--resolve-seeds", type=int, default=3, help="seeds of the second truth draw")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--n-boot", type=int, default=1000)
    ap.add_argument("--jobs", type=int, default=1, help="repetitions run at once (processes)")
    ap.add_argument("--out", default=None, help="write every row (JSON lines) here as repetitions finish")
    ap.add_argument("--arms", default=",".join(ARMS), help=f"a subset of {', '.join(ARMS + BARE)}")
    ap.add_argument("--table", default=None, help="print the table of the rows in this file (from --out), run nothing")
    a = ap.parse_args(argv)
    if a.table:
        rows = [json.loads(line) for line in open(a.table)]
        reps = sorted({r["rep"] for r in rows})
        print("\n".join(table(rows, f"{len(reps)} repetition(s) read from {a.table}")))
        return
    if a.quick:
        a.reps, a.worlds, a.per_family, a.truth_per_family, a.rounds, a.n_boot = 1, "retail", 6, 6, 2, 1000
        a.resolve_per_family, a.resolve_seeds = 6, 2
    if a.resolve_per_family is None:
        a.resolve_per_family = max(2 * a.per_family, a.truth_per_family)
    arms = a.arms.split(",")
    if set(arms) - set(ARMS + BARE):
        ap.error(f"--arms: {', '.join(sorted(set(arms) - set(ARMS + BARE)))}: not an arm")
    jobs = [
        {
            "world": w,
            "rep": r,
            "per_family": a.per_family,
            "truth_per_family": a.truth_per_family,
            "resolve_per_family": a.resolve_per_family,
            "resolve_seeds": a.resolve_seeds,
            "rounds": a.rounds,
            "seeds": a.seeds,
            "n_boot": a.n_boot,
            "arms": arms,
        }
        for r in range(a.first_rep, a.first_rep + a.reps)
        for w in a.worlds.split(",")
    ]
    size = (
        f"{a.reps} repetition(s) per arm and world (benchmark seeds {a.first_rep}..{a.first_rep + a.reps - 1}), "
        f"{a.per_family} tasks per "
        f"family, {a.seeds} seeds, {a.rounds} rounds declared; truth draw {a.truth_per_family} tasks per family x 2 "
        f"seeds"
        + (
            f", accepted proposals judged on a second draw of {a.resolve_per_family} x {a.resolve_seeds}"
            if a.resolve_per_family
            else ""
        )
    )
    rows: list[dict] = []
    t0 = time.perf_counter()
    sink = open(a.out, "a") if a.out else None

    def got(res: dict) -> None:
        rows.extend(res["rows"])
        r0 = res["rows"][0]
        print(
            f"  {r0['world']} rep {r0['rep']}: {r0['seconds']:.0f} s, {res['episodes_run']} episodes run; "
            + ", ".join(
                f"{r['arm']} {r['test_gain']:+.3f} ({r['promotions']} promoted, {r['false_promotions']} false)"
                for r in res["rows"]
            ),
            flush=True,
        )
        if sink:
            for r in res["rows"]:
                sink.write(json.dumps(r, default=str) + "\n")
            sink.flush()

    if a.jobs > 1:
        with ProcessPoolExecutor(a.jobs) as pool:
            for res in pool.map(repetition, jobs):
                got(res)
    else:
        for j in jobs:
            got(repetition(j))
    for line in table(rows, size):
        print(line)
    print(f"  {time.perf_counter() - t0:.0f} s wall")
    peers = [x for x in arms if x != "ratchet"]
    if "ratchet" not in arms or not peers:
        return
    best = {
        w: max(float(sum(r["test_gain"] for r in rows if r["world"] == w and r["arm"] == arm)) for arm in peers)
        for w in {r["world"] for r in rows}
    }
    mine = {w: float(sum(r["test_gain"] for r in rows if r["world"] == w and r["arm"] == "ratchet")) for w in best}
    ratio = min((mine[w] / best[w]) if best[w] > 0 else (1.0 if mine[w] >= best[w] else 0.0) for w in best)
    what = " at the quick size (one repetition, which shows the script runs, not the comparison)" if a.quick else ""
    print(f"ratio ratchet test gain / best peer's{what}: {ratio:.2f}")


if __name__ == "__main__":
    main()
