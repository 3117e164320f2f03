"""benchmarks/bench_peers.py: Ratchet's gate beside GEPA's engine and the field's acceptance rules (issue 28).

The quick run checks the script runs every arm (GEPA's real engine included) and ends on its headline; the rest checks
the parts the comparison rests on against independent computations: the injected share of proposals, the harmful
card's wrong value, the injected plans passing Ratchet's own validation, the peers' decision rules, the episode memo."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from tests.test_benchmarks import HEADLINE, load

ARMS = ("ratchet", "kse", "anypos", "gepa", "gepa-defaults")


@pytest.fixture(scope="module")
def peers():
    return load("bench_peers.py")


def test_bench_peers_quick_runs_every_arm_and_ends_on_its_ratio(peers, capsys):
    peers.main(["--quick"])
    out = capsys.readouterr().out.strip().splitlines()
    m = HEADLINE.match(out[-1])
    assert m, f"last line is not a headline ratio: {out[-1]!r}"
    assert float(m.group(1)) >= 0
    assert any(line.startswith("receipts: silent") for line in out)
    main = out[: out.index("")]  # the arms' table; then the paired differences
    rows = {line.split("|")[2].strip(): line for line in main if line.startswith("| retail |")}
    assert sorted(rows) == sorted(ARMS)
    assert "gepa-defaults" in rows  # GEPA at its own defaults (minibatch 3, merge on) ran
    diffs = [line.split("|")[2].strip() for line in out[out.index("") :] if line.startswith("| retail |")]
    assert diffs == list(ARMS[1:])
    for arm, line in rows.items():
        cells = [c.strip() for c in line.split("|")[1:-1]]
        assert int(cells[4]) > 0, f"{arm} spent no episodes"
        assert re.fullmatch(r"\d+/1", cells[7]) and re.fullmatch(r"\d+/1", cells[9])


def test_one_proposal_in_three_is_replaced_half_neutral_half_harmful(peers):
    kinds = pd.Series([peers.decision(rep, f"parent{rep % 7}", f"plan{i}") for rep in range(6) for i in range(600)])
    share = kinds.value_counts(normalize=True)
    assert abs(share["real"] - 2 / 3) < 0.03
    assert abs(share["neutral"] - 1 / 6) < 0.03 and abs(share["harmful"] - 1 / 6) < 0.03
    # the same question gets the same answer (every arm sees the same proposer)
    assert peers.decision(3, "p", "k") == peers.decision(3, "p", "k")


@pytest.mark.parametrize("world", ["retail", "airline"])
def test_a_harmful_card_states_a_rule_with_a_wrong_value(peers, world):
    from components.worlds import world as get

    harmful = 0
    for f in get(world).competence.facts:
        text = peers._harmful_text(f)
        if text is None:
            continue
        harmful += 1
        assert text != f.statement
        assert f.read(text) is not None and f.read(text) != f.value
    assert harmful >= 5


def test_injected_plans_pass_ratchets_validation(peers, bench_dir, tmp_path):
    """A neutral and a harmful card in place of a real plan: schema, lint, leakage and reachability all pass, so the
    gate (not validation) is what has to turn them down; and the harmful card misleads the agent on its write."""
    from components.evidence.packets import Citation
    from components.evolution.patch import apply_plan
    from components.evolution.plan import Plan, SetWM
    from components.evolution.validate import static_checks
    from components.memory.package import load_package
    from components.worlds import load_benchmark, world

    b = load_benchmark(bench_dir)
    start = world("retail").packages["seed"]
    real = Plan(
        owner="W",
        cluster="pk1",
        summary="W: bind receipts on order_id as well as the tool",
        evidence=[Citation(episode_id="x#0", step=1, hash="0" * 64)],
        operations=[SetWM(op="set_wm", field="bind_on", value=["order_id"])],
        mechanism="ground:",
        source_items=b.ids("train")[:2],
    )
    facts = {f.id: f for f in world("retail").competence.facts}
    for kind in ("neutral", "harmful"):
        plan = peers.fake_plan(kind, real, str(start), b, rep=0)
        assert plan is not None and plan.owner == "E" and plan.source_items == real.source_items
        cand = apply_plan(plan, start, tmp_path / kind)
        v, _ = static_checks(plan, cand, b)
        assert v.ok, v.checks
        card = [c for c in load_package(cand).cards.values() if c.id.startswith("peers-")]
        assert len(card) == 1
        read = {fid: f.read(card[0].body) for fid, f in facts.items() if f.read(card[0].body) is not None}
        if kind == "neutral":
            assert read == {}, "the neutral card addresses a rule"
        else:
            assert read and all(v != facts[fid].value for fid, v in read.items())


def _tables(d_by_item: dict[str, list[float]]):
    base = pd.DataFrame(
        [{"item_id": i, "seed": s, "score": 0.5, "error": None} for i, ds in d_by_item.items() for s in range(len(ds))]
    )
    cand = pd.DataFrame(
        [
            {"item_id": i, "seed": s, "score": 0.5 + x, "error": None}
            for i, ds in d_by_item.items()
            for s, x in enumerate(ds)
        ]
    )
    return base, cand


CFG = {"max_error_share": 0.25, "material": 0.05}


@pytest.mark.parametrize("seed", range(6))
def test_the_kse_rule_is_a_t_statistic_above_two(peers, seed):
    rng = np.random.default_rng(seed)
    d = {f"i{k}": [float(rng.normal(0.04, 0.1))] for k in range(15)}
    base, cand = _tables(d)
    res, per, _ = peers.peer_gate("kse")(base, cand, CFG, {}, list(d), [0], [True], False)
    x = np.array([v[0] for v in d.values()])
    t = stats.ttest_1samp(x, 0.0).statistic  # independent: scipy's one-sample t
    assert res.accept == (t > 2.0)
    assert res.net == pytest.approx(x.mean())
    anypos, _, _ = peers.peer_gate("anypos")(base, cand, CFG, {}, list(d), [0], [True], False)
    assert anypos.accept == (x.mean() > 0)


def test_peer_rules_wait_for_every_seed(peers):
    base, cand = _tables({f"i{k}": [0.2, 0.2] for k in range(6)})
    first = cand[cand["seed"] == 0]
    assert peers.peer_gate("anypos")(base, first, CFG, {}, [], [0, 1], [True], False)[0] is None
    assert peers.peer_gate("anypos")(base, cand, CFG, {}, [], [0, 1], [True], False)[0].accept


def test_the_memo_runs_an_episode_once_and_gives_the_same_tables(peers, bench_dir):
    from components.worlds import load_benchmark, world

    b = load_benchmark(bench_dir)
    pkg = world("retail").packages["seed"]
    memo = peers.Memo()
    items = b.ids("dev")[:3]
    first = memo.run(pkg, bench_dir, items, [0, 1], 40)
    assert memo.ran == 6
    again = memo.run(pkg, bench_dir, items[:2], [1], 40)
    assert memo.ran == 6
    s = first.scores
    pd.testing.assert_frame_equal(
        again.scores.reset_index(drop=True), s[s["item_id"].isin(items[:2]) & (s["seed"] == 1)].reset_index(drop=True)
    )


def test_an_unknown_arm_is_refused_before_any_work(peers, capsys):
    with pytest.raises(SystemExit) as e:
        peers.main(["--quick", "--arms", "ratchet,opro"])
    assert e.value.code == 2
    assert "--arms: opro: not an arm" in capsys.readouterr().err


def test_the_table_counts_campaigns_with_a_false_promotion(peers):
    rows = [
        {
            "world": "retail",
            "arm": "ratchet",
            "rep": r,
            "episodes": 100,
            "promotions": 1,
            "false_promotions": int(r == 0),
            "false_in_champion": 0,
            "test_gain": g,
            "test_regression": g < 0,
            "truth_gain": 0.01,
        }
        for r, g in enumerate([0.02, -0.01, 0.03])
    ]
    line = [x for x in peers.table(rows, "size") if x.startswith("| retail | ratchet |")][0]
    cells = [c.strip() for c in line.split("|")[1:-1]]
    m, lo, hi = (
        np.mean([0.02, -0.01, 0.03]),
        *stats.t.interval(0.95, 2, loc=np.mean([0.02, -0.01, 0.03]), scale=stats.sem([0.02, -0.01, 0.03])),
    )
    assert cells[2] == f"{m:+.4f} [{lo:+.4f}, {hi:+.4f}]"
    assert cells[6] == "0.33" and cells[7] == "1/3" and cells[9] == "1/3"


def test_the_table_pairs_ratchet_with_each_peer_by_repetition(peers):
    mine, theirs = [0.02, -0.01, 0.03, 0.04], [0.01, 0.00, 0.03, 0.01]
    rows = [
        {
            "world": "airline",
            "arm": arm,
            "rep": r,
            "episodes": 100,
            "promotions": 1,
            "false_promotions": 0,
            "false_in_champion": 0,
            "test_gain": g,
            "test_regression": g < 0,
            "truth_gain": 0.01,
        }
        for arm, gains in (("ratchet", mine), ("gepa-defaults", theirs))
        for r, g in enumerate(gains)
    ]
    rows.append({**rows[-1], "arm": "kse", "rep": 9})  # a repetition ratchet did not run is not paired
    out = peers.table(rows, "size")
    line = [x for x in out[out.index("") :] if x.startswith("| airline | gepa-defaults |")][0]
    cells = [c.strip() for c in line.split("|")[1:-1]]
    d = np.subtract(mine, theirs)
    lo, hi = stats.t.interval(0.95, len(d) - 1, loc=d.mean(), scale=stats.sem(d))
    assert cells[2] == f"{d.mean():+.4f} [{lo:+.4f}, {hi:+.4f}]"
    assert cells[3] == "4" and cells[4] == "2 / 1 / 1"
    assert not [x for x in out[out.index("") :] if x.startswith("| airline | kse |")]


def test_an_accepted_proposal_is_judged_again_on_a_larger_draw_of_its_own(peers, monkeypatch):
    """A small true effect the first truth draw cannot tell from zero is judged on the second, larger draw when an
    arm accepted it (`truth_first` keeps the first verdict); a rejected one keeps the first draw's verdict."""
    import numpy as np

    import components.runtime.evaluate as ev

    class Bench:
        def ids(self, split):
            return [f"{split}-{k}" for k in range(3)]

    draws = {}

    def draw(world, per_family, seed=peers.TRUTH_SEED):
        return draws.setdefault((seed, per_family), (f"draw-{seed}", None))

    def paired(memo, home, bench, parent, cand, items, seeds, turns):
        small = bench == f"draw-{peers.TRUTH_SEED}"
        assert len(seeds) == (2 if small else 3)
        return np.array([0.02, -0.01, 0.0, 0.01] * 3) if small else np.array([0.01, 0.012, 0.011] * 4)

    monkeypatch.setattr(peers, "truth_draw", draw)
    monkeypatch.setattr(peers, "paired", paired)
    monkeypatch.setattr(ev, "benchmark_at", lambda path: Bench())
    props = [
        {"parent": "p", "cand": "a", "verdict": "accept"},
        {"parent": "p", "cand": "r", "verdict": "reject"},
    ]
    job = {"world": "retail", "truth_per_family": 12, "resolve_per_family": 24, "resolve_seeds": 3}
    peers.judge({"ratchet": {"proposals": props}}, job, None, 40)
    assert (props[0]["truth"], props[0]["truth_first"]) == ("helps", "neutral")
    assert props[0]["truth_delta"] == pytest.approx(0.011) and props[0]["truth_first_delta"] == pytest.approx(0.005)
    assert props[1]["truth"] == "neutral" and "truth_first" not in props[1]
    assert (peers.TRUTH_SEED + 1, 24) in draws  # the second draw is a benchmark of its own
    off = [{"parent": "p", "cand": "a", "verdict": "accept"}]
    peers.judge({"ratchet": {"proposals": off}}, job | {"resolve_per_family": 0}, None, 40)
    assert off[0]["truth"] == "neutral" and "truth_first" not in off[0]
