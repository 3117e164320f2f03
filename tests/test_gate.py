"""The held-out gate (components/evolution/gate.py) and `ratchet gate`: pairing is refused before any statistic,
the bootstrap is over items, and only a CI that excludes zero upward (with regressions under the cap) accepts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from components.evolution import gate as gate_mod
from components.evolution.gate import (
    GateConfig,
    GateResult,
    PairingError,
    SequentialDesign,
    bootstrap_ci,
    decide,
    gate,
    pair,
    repair_screen,
    sequential_gate,
)

ROOT = Path(__file__).resolve().parents[1]
FAST = GateConfig(n_boot=2000)
ABSOLUTE = GateConfig(n_boot=2000, reg_share=0.0)  # the regression cap as the absolute count reg_cap alone
CLI_KEYS = {"accept", "net", "ci_lo", "ci_hi", "n_items", "n_improved", "n_regressed", "reason"}


# -- helpers -----------------------------------------------------------------------------------------------------


def table(scores: dict[str, list[float]], errors: dict[tuple[str, int], str] | None = None) -> pd.DataFrame:
    """One row per (item, seed): scores[item][seed]; optional error messages by (item, seed)."""
    rows = []
    for item, per_seed in scores.items():
        for seed, score in enumerate(per_seed):
            row = {"item_id": item, "seed": seed, "score": score}
            if errors is not None:
                row["error"] = errors.get((item, seed), "")
            rows.append(row)
    return pd.DataFrame(rows)


def shifted(scores: dict[str, list[float]], delta: dict[str, float]) -> dict[str, list[float]]:
    """Every seed of item i moved by delta[i] (default 0), clipped to [0, 1]."""
    return {i: [float(np.clip(s + delta.get(i, 0.0), 0.0, 1.0)) for s in v] for i, v in scores.items()}


def items(n: int, per_seed: list[float]) -> dict[str, list[float]]:
    return {f"item-{k:03d}": list(per_seed) for k in range(n)}


# -- identical arms, wins, losses, ties --------------------------------------------------------------------------


@pytest.mark.parametrize("data_seed", [0, 1, 2, 3])
@pytest.mark.parametrize("boot_seed,n_boot", [(0, 1000), (7, 2000), (123, 5000)])
def test_identical_arms_never_accept(data_seed, boot_seed, n_boot):
    rng = np.random.default_rng(data_seed)
    n_items, n_seeds = int(rng.integers(5, 40)), int(rng.integers(1, 5))
    base = pd.DataFrame(
        [{"item_id": f"t{i}", "seed": s, "score": float(rng.random())} for i in range(n_items) for s in range(n_seeds)]
    )
    cand = base.sample(frac=1.0, random_state=data_seed).reset_index(drop=True)  # row order must not matter
    res, per = gate(base, cand, GateConfig(n_boot=n_boot, seed=boot_seed))
    assert res.accept is False
    assert res.net == 0.0 and res.ci_lo == 0.0 and res.ci_hi == 0.0
    assert (res.n_items, res.n_improved, res.n_regressed) == (n_items, 0, 0)
    assert "ties keep the parent" in res.reason
    assert (per["d"] == 0).all()


def test_clear_win_accepts_with_counts():
    base = {
        **items(20, [0.4, 0.5, 0.6]),  # -> +0.2
        **{f"high-{k}": [0.9, 0.9, 0.9] for k in range(4)},  # clipped at 1.0 -> +0.1
        **{f"flat-{k}": [0.3, 0.3, 0.3] for k in range(6)},
    }  # unchanged
    delta = {i: 0.2 for i in base if not i.startswith("flat")}
    cand = shifted(base, delta)
    assert cand["high-0"] == [1.0, 1.0, 1.0]
    res, per = gate(table(base), table(cand), FAST)
    assert res.accept is True
    assert res.n_items == 30
    assert res.n_improved == 24 and res.n_regressed == 0
    assert res.net == pytest.approx((20 * 0.2 + 4 * 0.1) / 30)
    assert 0 < res.ci_lo <= res.net <= res.ci_hi
    assert res.cand_mean - res.base_mean == pytest.approx(res.net)
    assert "24 improved, 0 regressed" in res.reason
    assert per.set_index("item_id").loc["high-2", "d"] == pytest.approx(0.1)


def test_win_with_regressions_over_cap_rejects_and_says_so():
    base = items(30, [0.5, 0.5])
    delta = {i: (0.3 if k >= 3 else -0.1) for k, i in enumerate(base)}
    b, c = table(base), table(shifted(base, delta))
    res, _ = gate(b, c, ABSOLUTE)
    assert res.ci_lo > 0  # the win itself is clear ...
    assert res.n_regressed == 3 and res.n_improved == 27
    assert res.accept is False  # ... but three regressions exceed the absolute cap of 2
    assert "3 regressed items > reg_cap 2" in res.reason
    loose, _ = gate(b, c, GateConfig(n_boot=2000, reg_cap=3, reg_share=0.0))
    assert loose.accept is True and loose.n_regressed == 3
    shared, _ = gate(b, c, FAST)  # the default cap: a tenth of the 30 items compared
    assert shared.accept is True and shared.n_regressed == 3
    four = {i: (0.3 if k >= 4 else -0.1) for k, i in enumerate(base)}
    over, _ = gate(b, table(shifted(base, four)), FAST)
    assert over.accept is False and "4 regressed items > reg_cap 3" in over.reason


@pytest.mark.parametrize(
    "cand_score,material,regressed,accept",
    [
        (0.46, 0.05, 0, True),  # a drop of 0.04 is not material at 0.05
        (0.44, 0.05, 3, False),  # a drop of 0.06 is
        (0.44, 0.07, 0, True),  # ... unless the threshold is raised above it
    ],
)
def test_material_threshold_decides_what_counts(cand_score, material, regressed, accept):
    base = items(30, [0.5, 0.5])
    cand = {i: ([0.8, 0.8] if k >= 3 else [cand_score, cand_score]) for k, i in enumerate(base)}
    res, _ = gate(table(base), table(cand), GateConfig(n_boot=2000, material=material, reg_share=0.0))
    assert res.n_regressed == regressed
    assert res.n_improved == 27
    assert res.accept is accept


def test_improvement_below_material_is_not_counted():
    base = items(10, [0.5])
    res, _ = gate(table(base), table(shifted(base, {i: 0.04 for i in base})), FAST)
    assert res.n_improved == 0 and res.n_regressed == 0
    assert res.net == pytest.approx(0.04)


def test_net_exactly_zero_keeps_the_parent():
    base = items(20, [0.5, 0.5])
    delta = {i: (0.25 if k % 2 else -0.25) for k, i in enumerate(base)}
    res, _ = gate(table(base), table(shifted(base, delta)), FAST)
    assert res.net == 0.0
    assert res.ci_lo < 0 < res.ci_hi
    assert res.accept is False
    assert "does not exclude zero" in res.reason


def test_loss_rejects():
    base = items(25, [0.7, 0.8, 0.9])
    res, _ = gate(table(base), table(shifted(base, {i: -0.2 for i in base})), FAST)
    assert res.accept is False
    assert res.net == pytest.approx(-0.2)
    assert res.ci_hi < 0
    assert res.n_regressed == 25 and res.n_improved == 0


def test_leakage_or_unfired_mechanism_vetoes_a_clear_win():
    base = items(20, [0.3])
    b, c = table(base), table(shifted(base, {i: 0.3 for i in base}))
    assert gate(b, c, FAST)[0].accept is True
    leak, _ = gate(b, c, FAST, leakage=True)
    assert leak.accept is False and leak.reason == "leakage"
    silent, _ = gate(b, c, FAST, mechanism_fired=False)
    assert silent.accept is False and "did not fire" in silent.reason


# -- pairing: refused before any statistic -----------------------------------------------------------------------


def _base() -> pd.DataFrame:
    return table({"a": [0.1, 0.2, 0.3], "b": [0.4, 0.5, 0.6], "c": [0.7, 0.8, 0.9]})


def _broken(kind: str) -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
    b, c = _base(), _base()
    if kind == "item only in cand":
        c = pd.concat([c, pd.DataFrame([{"item_id": "zz", "seed": 0, "score": 0.5}])], ignore_index=True)
        return b, c, ["incomplete pairing", "only in cand", "zz#0"]
    if kind == "item only in base":
        c = c[c["item_id"] != "b"]
        return b, c, ["incomplete pairing", "only in base", "b#0", "b#1", "b#2"]
    if kind == "seed only in base":
        c = c[~((c["item_id"] == "a") & (c["seed"] == 2))]
        return b, c, ["incomplete pairing", "only in base", "a#2"]
    if kind == "seed only in cand":
        c = pd.concat([c, pd.DataFrame([{"item_id": "c", "seed": 3, "score": 0.5}])], ignore_index=True)
        return b, c, ["only in cand", "c#3"]
    if kind == "duplicate row":
        c = pd.concat([c, c.iloc[[4]]], ignore_index=True)
        return b, c, ["cand", "duplicate", "b#1"]
    if kind == "nan score":
        b.loc[1, "score"] = np.nan
        return b, c, ["base", "not a number", "a#1"]
    if kind == "non-numeric score":
        c["score"] = c["score"].astype(object)
        c.loc[0, "score"] = "high"
        return b, c, ["cand", "not a number", "a#0"]
    if kind == "score above 1":
        c.loc[3, "score"] = 1.5
        return b, c, ["cand", "outside [0, 1]", "b#0"]
    if kind == "score below 0":
        b.loc[8, "score"] = -0.1
        return b, c, ["base", "outside [0, 1]", "c#2"]
    if kind == "missing column":
        c = c.drop(columns=["seed"])
        return b, c, ["cand", "missing column", "seed"]
    if kind == "empty":
        return b.iloc[0:0], c.iloc[0:0], ["no (item, seed) pairs"]
    raise AssertionError(kind)


PAIRING_CASES = [
    "item only in cand",
    "item only in base",
    "seed only in base",
    "seed only in cand",
    "duplicate row",
    "nan score",
    "non-numeric score",
    "score above 1",
    "score below 0",
    "missing column",
    "empty",
]


@pytest.mark.parametrize("kind", PAIRING_CASES)
def test_incomplete_pairing_is_refused_before_any_statistic(kind, monkeypatch):
    calls = []
    monkeypatch.setattr(gate_mod, "bootstrap_ci", lambda *a, **k: calls.append(a) or (1.0, 1.0))
    monkeypatch.setattr(gate_mod, "decide", lambda *a, **k: calls.append(a) or pytest.fail("decide was reached"))
    b, c, words = _broken(kind)
    with pytest.raises(PairingError) as exc:
        gate_mod.gate(b, c, FAST)
    assert calls == []
    msg = str(exc.value)
    for w in words:
        assert w in msg, (w, msg)


def test_pairing_error_is_an_input_error():
    from components.errors import InputError

    assert issubclass(PairingError, InputError)


def test_missing_seed_value_is_a_pairing_error():
    b = _base()
    b["seed"] = b["seed"].astype(float)
    b.loc[2, "seed"] = np.nan
    with pytest.raises(PairingError, match="seed"):
        pair(b, _base())


def test_non_integer_seeds_are_not_silently_truncated():
    b = pd.DataFrame({"item_id": ["a", "a", "b"], "seed": [0, 0.5, 0], "score": [0.1, 0.9, 0.5]})
    c = pd.DataFrame({"item_id": ["a", "a", "b"], "seed": [0, 0.7, 0], "score": [0.1, 0.9, 0.5]})
    with pytest.raises(PairingError):
        pair(b, c)


# -- errored episodes --------------------------------------------------------------------------------------------


def test_errored_pairs_are_dropped_from_both_arms():
    base = items(10, [0.6, 0.6])
    cand = shifted(base, {i: 0.3 for i in base})
    # the cand errored on item-000#0 (score 0) and the base on item-001#1 (score 0)
    cand["item-000"][0] = 0.0
    base["item-001"][1] = 0.0
    b = table(base, {("item-001", 1): "model timeout"})
    c = table(cand, {("item-000", 0): "HTTP 500"})
    res, per = gate(b, c, GateConfig(n_boot=2000, max_error_share=0.25))
    assert res.dropped_errors == 2
    per = per.set_index("item_id")
    # each of the two items is compared on its remaining seed only, in both arms
    assert per.loc["item-000", "base"] == pytest.approx(0.6) and per.loc["item-000", "cand"] == pytest.approx(0.9)
    assert per.loc["item-001", "base"] == pytest.approx(0.6) and per.loc["item-001", "cand"] == pytest.approx(0.9)
    assert res.n_regressed == 0 and res.n_improved == 10
    assert res.accept is True
    # symmetric: swapping the arms drops the same pairs and negates every d
    swapped, per2 = gate(c, b, GateConfig(n_boot=2000, max_error_share=0.25))
    assert swapped.dropped_errors == 2
    assert np.allclose(per2.set_index("item_id").loc[per.index, "d"], -per["d"])


def test_errored_item_on_every_seed_leaves_the_comparison():
    base = items(10, [0.5])
    c = table(shifted(base, {i: 0.2 for i in base}), {("item-004", 0): "crash"})
    res, per = gate(table(base), c, GateConfig(n_boot=1000))
    assert res.dropped_errors == 1
    assert res.n_items == 9 and "item-004" not in set(per["item_id"])


def test_nan_error_cells_are_not_errors():
    b = _base()
    b["error"] = np.nan  # what read_csv gives for an empty error column
    c = _base()
    c["error"] = ""
    per, dropped = pair(b, c)
    assert dropped == 0 and len(per) == 3


@pytest.mark.parametrize("n_errored,ok", [(2, True), (3, False)])
def test_too_many_errored_pairs_refuse(n_errored, ok):
    base = items(10, [0.5])
    errs = {(f"item-{k:03d}", 0): "boom" for k in range(n_errored)}
    b, c = table(base), table(shifted(base, {i: 0.2 for i in base}), errs)
    cfg = GateConfig(n_boot=1000, max_error_share=0.25)
    if ok:
        assert gate(b, c, cfg)[0].dropped_errors == n_errored
    else:
        with pytest.raises(PairingError, match="3 of 10"):  # pairing itself refuses ...
            pair(b, c, cfg.max_error_share)
        verdict, per = gate(b, c, cfg)  # ... and the gate turns that into a rejection that keeps the parent
        assert not verdict.accept and "3 of 10" in verdict.reason and per.empty
        assert verdict.refused and verdict.dropped_errors is None and verdict.as_dict()["dropped_errors"] == -1


def test_every_pair_errored_is_refused():
    base = items(2, [0.5])
    with pytest.raises(PairingError, match="errored"):
        pair(table(base, {(i, 0): "x" for i in base}), table(base), max_error_share=1.0)


# -- per-item, not per-trial -------------------------------------------------------------------------------------


def test_per_item_means_over_seeds_are_compared():
    base = {"a": [0, 1, 0, 1, 0], "b": [1, 1, 1, 1, 1], "c": [0, 0, 0, 0, 0], "d": [0.5, 0.5, 0.5, 0.5, 0.5]}
    cand = {"a": [1, 1, 1, 1, 0], "b": [1, 1, 1, 1, 0], "c": [1, 1, 0, 0, 0], "d": [1, 1, 1, 1, 1]}
    b, c = table(base), table(cand)
    cfg = GateConfig(n_boot=3000, seed=5, reg_cap=10, min_items=4)
    res, per = gate(b, c, cfg)
    expected_d = np.array([0.8 - 0.4, 0.8 - 1.0, 0.4 - 0.0, 1.0 - 0.5])
    assert list(per["item_id"]) == ["a", "b", "c", "d"]
    assert np.allclose(per["d"], expected_d)
    assert res.n_items == 4  # not 20 trials
    assert res.n_improved == 3 and res.n_regressed == 1
    assert (res.ci_lo, res.ci_hi) == bootstrap_ci(expected_d, cfg.n_boot, cfg.alpha, cfg.seed)
    trial_d = (c["score"] - b["score"]).to_numpy(dtype=float)
    assert (res.ci_lo, res.ci_hi) != bootstrap_ci(trial_d, cfg.n_boot, cfg.alpha, cfg.seed)


# -- bootstrap ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind,n", [("lattice", 8), ("lattice", 60), ("few", 400), ("continuous", 50)])
def test_bootstrap_ci_matches_scipy_within_monte_carlo_error(kind, n):
    """Same percentile CI as scipy.stats.bootstrap resampling items, up to the Monte-Carlo error of either side.

    The tolerance is measured, not guessed: the spread of scipy's own endpoints over 20 resampling seeds."""
    from scipy import stats

    rng = np.random.default_rng(n)
    if kind == "lattice":  # rubric fractions averaged over 3 seeds: the exact lattice path
        d = (rng.integers(0, 7, (n, 3)).mean(axis=1) - rng.integers(0, 7, (n, 3)).mean(axis=1)) / 6
    elif kind == "few":  # a handful of irrational values: the multinomial path
        d = rng.choice(np.array([np.pi, np.e, np.sqrt(2), -1.0]) / 10, size=n)
    else:  # all distinct: the index path
        d = rng.normal(0.05, 0.2, size=n)
    n_boot = 4000
    ref = np.array(
        [
            [
                *stats.bootstrap(
                    (d,), np.mean, n_resamples=n_boot, method="percentile", random_state=s
                ).confidence_interval
            ]
            for s in range(20)
        ]
    )
    ours = np.array([bootstrap_ci(d, n_boot, 0.05, seed) for seed in range(20)])
    sd = ref.std(axis=0, ddof=1)
    assert (sd > 0).all()
    # means of 20 runs each: their difference has sd ~ sqrt(2/20) * sd; allow 4 of those, plus lattice granularity
    tol = 4 * np.sqrt(2 / 20) * sd + 1e-12
    assert np.all(np.abs(ours.mean(axis=0) - ref.mean(axis=0)) <= tol), (ours.mean(axis=0), ref.mean(axis=0), tol)
    # and the spread across seeds is of the same size (a broken sampler is often too narrow or too wide)
    assert np.all(ours.std(axis=0, ddof=1) < 3 * sd + 1e-12)


def test_every_bootstrap_path_draws_the_item_resampling_distribution():
    """The three exact paths (lattice FFT, multinomial counts, index draws) agree on the resample means' moments:
    mean(d) and var(d) / n (population variance)."""
    rng = np.random.default_rng(3)
    cases = {
        "lattice": rng.integers(-6, 7, 300) / 6,
        "few": rng.choice([np.pi, -np.e, 0.5], 300) / 10,
        "continuous": rng.normal(0.0, 0.3, 300),
    }
    for name, d in cases.items():
        m = gate_mod.boot_means(d, 20_000, 1)
        assert m.shape == (20_000,)
        se = d.std() / np.sqrt(len(d))
        assert abs(m.mean() - d.mean()) < 4 * se / np.sqrt(20_000) * 3, name
        assert m.std() == pytest.approx(se, rel=0.05), name


def test_lattice_is_found_only_where_it_exists():
    assert gate_mod._lattice(np.array([-1 / 3, 0.0, 1 / 6, 0.5])) is not None
    h, j = gate_mod._lattice(np.array([-1 / 3, 0.0, 1 / 6, 0.5]))
    assert h == pytest.approx(1 / 6) and list(j) == [0, 2, 3, 5]
    assert gate_mod._lattice(np.sort(np.random.default_rng(0).normal(size=50))) is None


def test_bootstrap_memory_does_not_grow_with_n_boot_times_n_items():
    import tracemalloc

    d = np.random.default_rng(0).normal(size=20_000)  # all distinct: the index path, the largest footprint
    tracemalloc.start()
    gate_mod.boot_means(d, 2_000, 0)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 8 * 2**20  # an (n_boot, n) index array would be 2000 * 20000 * 8 bytes = 320 MB


def test_bootstrap_ci_is_deterministic_per_seed():
    d = np.random.default_rng(0).normal(0.0, 0.3, size=30)
    assert bootstrap_ci(d, 2000, 0.05, 4) == bootstrap_ci(d, 2000, 0.05, 4)
    assert bootstrap_ci(d, 2000, 0.05, 4) != bootstrap_ci(d, 2000, 0.05, 5)


def test_gate_is_deterministic_for_a_seed():
    base = items(15, [0.5, 0.4])
    delta = {i: 0.1 * ((k % 5) - 1) for k, i in enumerate(base)}
    b, c = table(base), table(shifted(base, delta))
    r1, _ = gate(b, c, GateConfig(n_boot=1000, seed=8))
    r2, _ = gate(b, c, GateConfig(n_boot=1000, seed=8))
    r3, _ = gate(b, c, GateConfig(n_boot=1000, seed=9))
    assert r1 == r2
    assert (r1.ci_lo, r1.ci_hi) != (r3.ci_lo, r3.ci_hi)


# -- repair screen -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "deltas,ok,repaired,broken",
    [
        ([0.3, 0.3, 0.3, -0.2, 0.0], True, 3, 1),  # more repaired than broken, mean up
        ([0.3, 0.3, -0.2, -0.2, 0.0], False, 2, 2),  # as many broken as repaired
        ([0.1] + [-0.04] * 10, False, 1, 0),  # repaired > broken, but the mean goes down
        ([0.04] * 6, False, 0, 0),  # mean up, nothing materially repaired
        ([-0.3, -0.3, 0.0], False, 0, 2),  # only breaks
    ],
)
def test_repair_screen(deltas, ok, repaired, broken):
    base = {f"s{k}": [0.5, 0.5] for k in range(len(deltas))}
    cand = shifted(base, {f"s{k}": dv for k, dv in enumerate(deltas)})
    res, per = repair_screen(table(base), table(cand))
    assert res.ok is ok
    assert (res.repaired, res.broken, res.n_items) == (repaired, broken, len(deltas))
    assert res.cand_mean - res.base_mean == pytest.approx(float(np.mean(deltas)))
    assert f"repaired {repaired}, broke {broken} of {len(deltas)}" in res.reason


def test_repair_screen_refuses_incomplete_pairing():
    b = _base()
    with pytest.raises(PairingError):
        repair_screen(b, b[b["item_id"] != "c"])


def test_decide_on_a_given_table():
    per = pd.DataFrame({"item_id": ["x", "y", "z"], "base": [0.2, 0.2, 0.2], "cand": [0.6, 0.7, 0.5]})
    per["d"] = per["cand"] - per["base"]
    res = decide(per, GateConfig(n_boot=1000, min_items=3), dropped_errors=4)
    assert res.accept is True and res.dropped_errors == 4
    assert res.base_mean == pytest.approx(0.2) and res.cand_mean == pytest.approx(0.6)
    assert set(res.as_dict()) >= CLI_KEYS | {"base_mean", "cand_mean", "dropped_errors"}


# -- the command line --------------------------------------------------------------------------------------------


def write_csv(path: Path, df: pd.DataFrame) -> Path:
    df.to_csv(path, index=False)
    return path


def run_gate(*args: str, capsys=None) -> subprocess.CompletedProcess:
    """`ratchet gate ...`: in this process through the real entry point when given capsys (an interpreter start and
    the imports per call prove nothing more), else as a subprocess (kept where the process's exit code, streams and
    imports are the point)."""
    if capsys is None:
        return subprocess.run(
            [sys.executable, "-m", "flows.entry", "gate", *args], cwd=ROOT, capture_output=True, text=True, timeout=120
        )
    from tests.conftest import run_cli

    code, out, err = run_cli(capsys, "gate", *args)
    return subprocess.CompletedProcess(["ratchet", "gate", *args], code, out, err)


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    d = tmp_path_factory.mktemp("gate-cli")
    base = items(20, [0.4, 0.5])
    win = shifted(base, {i: 0.3 for i in base})
    bad_nan = _base()
    bad_nan.loc[3, "score"] = np.nan
    bad_range = _base()
    bad_range.loc[0, "score"] = 7
    return {
        "base": write_csv(d / "base.csv", table(base)),
        "win": write_csv(d / "win.csv", table(win)),
        "small": write_csv(d / "small.csv", _base()),
        "missing_pair": write_csv(d / "missing_pair.csv", _base().iloc[:-1]),
        "nan": write_csv(d / "nan.csv", bad_nan),
        "range": write_csv(d / "range.csv", bad_range),
        "dir": d,
    }


def test_cli_json_accept(tables, capsys):
    p = run_gate(
        "--base", str(tables["base"]), "--cand", str(tables["win"]), "--n-boot", "2000", "--json", capsys=capsys
    )
    assert p.returncode == 0, p.stderr
    lines = p.stdout.strip().splitlines()
    assert len(lines) == 1
    obj = json.loads(lines[0])
    assert set(obj) == CLI_KEYS
    assert obj["accept"] is True and obj["n_items"] == 20 and obj["n_improved"] == 20 and obj["n_regressed"] == 0
    expected, _ = gate(
        pd.read_csv(tables["base"], dtype={"item_id": str}),
        pd.read_csv(tables["win"], dtype={"item_id": str}),
        GateConfig(n_boot=2000),
    )
    assert obj["net"] == pytest.approx(expected.net) and obj["ci_lo"] == pytest.approx(expected.ci_lo)
    assert obj["ci_hi"] == pytest.approx(expected.ci_hi) and obj["reason"] == expected.reason


def test_cli_json_reject_exits_1(tables):
    # the candidate as base: a clear loss
    p = run_gate("--base", str(tables["win"]), "--cand", str(tables["base"]), "--n-boot", "1000", "--json")
    assert p.returncode == 1, p.stderr
    lines = p.stdout.strip().splitlines()
    assert len(lines) == 1
    obj = json.loads(lines[0])
    assert set(obj) == CLI_KEYS
    assert obj["accept"] is False and obj["net"] == pytest.approx(-0.3) and obj["n_regressed"] == 20


def test_cli_text_and_options(tables, capsys):
    same = run_gate("--base", str(tables["base"]), "--cand", str(tables["base"]), "--n-boot", "1000", capsys=capsys)
    assert same.returncode == 1 and same.stdout.startswith("REJECT:")
    # the options reach the gate: a negative reg_cap is refused as bad input, naming the option
    capped = run_gate(
        "--base",
        str(tables["base"]),
        "--cand",
        str(tables["win"]),
        "--n-boot",
        "1000",
        "--reg-cap",
        "-1",
        capsys=capsys,
    )
    assert capped.returncode == 2 and "reg_cap" in capped.stderr and "Traceback" not in capped.stderr


@pytest.mark.parametrize(
    "cand_key,words",
    [
        ("missing_pair", ["incomplete pairing", "c#2"]),
        ("nan", ["not a number", "b#0"]),
        ("range", ["outside [0, 1]", "a#0"]),
    ],
)
def test_cli_broken_table_exits_2_with_one_line(tables, capsys, cand_key, words):
    cand = tables[cand_key]
    p = run_gate("--base", str(tables["small"]), "--cand", str(cand), "--json", capsys=capsys)
    assert p.returncode == 2
    assert "Traceback" not in p.stderr + p.stdout
    assert p.stdout.strip() == ""
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, p.stderr
    assert str(tables["small"]) in lines[0] and str(cand) in lines[0]
    for w in words:
        assert w in lines[0]


def test_cli_missing_file_exits_2_naming_it(tables):
    missing = tables["dir"] / "no-such-scores.csv"
    p = run_gate("--base", str(tables["base"]), "--cand", str(missing), "--json")
    assert p.returncode == 2
    assert "Traceback" not in p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and str(missing) in lines[0] and "--cand" in lines[0]


def test_cli_empty_seed_cell_exits_2(tables, capsys):
    bad = tables["dir"] / "empty_seed.csv"
    bad.write_text("item_id,seed,score\na,0,0.1\na,,0.2\n")
    ok = tables["dir"] / "two.csv"
    ok.write_text("item_id,seed,score\na,0,0.1\na,1,0.2\n")
    p = run_gate("--base", str(bad), "--cand", str(ok), capsys=capsys)
    assert "Traceback" not in p.stderr
    assert p.returncode == 2


def test_cli_zero_bootstrap_draws_is_bad_input(tables, capsys):
    p = run_gate("--base", str(tables["base"]), "--cand", str(tables["win"]), "--n-boot", "0", capsys=capsys)
    assert "Traceback" not in p.stderr
    assert p.returncode == 2


def test_empty_error_column_from_csv_pairs_without_warning(tmp_path):
    import warnings

    path = tmp_path / "scores.csv"
    path.write_text("item_id,seed,score,error\na,0,0.5,\nb,0,0.25,\n")
    df = pd.read_csv(path, dtype={"item_id": str})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        per, dropped = pair(df, df)
    assert dropped == 0 and len(per) == 2


# -- refusals and exit codes -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "field,value,words",
    [
        ("material", float("nan"), "material"),
        ("material", float("inf"), "material"),
        ("alpha", float("nan"), "alpha"),
        ("alpha", float("inf"), "alpha"),
        ("alpha", 1.0, "alpha"),
        ("reg_cap", float("nan"), "reg_cap"),
        ("reg_cap", float("inf"), "reg_cap"),
        ("n_boot", 1, "below 1000"),
        ("n_boot", 999, "below 1000"),
        ("campaign_alpha", float("nan"), "campaign_alpha"),
        ("min_items", 1, "min_items"),
    ],
)
def test_config_refuses_non_finite_or_out_of_range(field, value, words):
    from components.errors import InputError

    with pytest.raises(InputError, match=words):
        GateConfig(**{field: value})


@pytest.mark.parametrize("n", [1, 2, 4])
def test_fewer_than_min_items_is_refused(n):
    base = items(n, [0.2, 0.3])
    with pytest.raises(gate_mod.TooFewItems, match=f"{n} item"):
        gate(table(base), table(shifted(base, {i: 0.5 for i in base})), FAST)
    per = pd.DataFrame({"item_id": list(base), "base": 0.2, "cand": 0.7, "d": 0.5})
    with pytest.raises(gate_mod.TooFewItems):
        decide(per, FAST)


def test_five_items_are_enough_and_errors_below_the_minimum_refuse_softly():
    base = items(5, [0.2, 0.3])
    b, c = table(base), table(shifted(base, {i: 0.5 for i in base}))
    assert gate(b, c, FAST)[0].accept is True
    c_err = table(shifted(base, {i: 0.5 for i in base}), {("item-000", 0): "x", ("item-000", 1): "y"})
    verdict, _ = gate(b, c_err, GateConfig(n_boot=1000, max_error_share=0.5))  # errors leave 4 items
    assert verdict.accept is False and "errored" in verdict.reason


@pytest.mark.parametrize(
    "key,value",
    [
        ("gate.material", float("nan")),
        ("gate.alpha", float("inf")),
        ("gate.n_boot", 999),
        ("gate.reg_cap", -1),
        ("gate.min_items", 1),
        ("gate.campaign_alpha", float("nan")),
        ("gate.max_error_share", float("nan")),
    ],
)
def test_params_gate_block_refuses_the_same(key, value):
    from components.errors import InputError
    from components.params import load_params

    with pytest.raises(InputError, match=key.replace(".", r"\.")):
        load_params(None, {key: value})


def test_params_yaml_nan_is_refused(tmp_path):
    from components.errors import InputError
    from components.params import load_params

    f = tmp_path / "params.yaml"
    f.write_text("gate:\n  material: .nan\n")
    with pytest.raises(InputError, match="gate.material"):
        load_params(f)
    assert load_params(ROOT / "params.yaml").gate.config().n_boot >= gate_mod.MIN_BOOT


def test_look_alpha_spends_the_campaign_budget_linearly():
    from components.errors import InputError

    per = [gate_mod.look_alpha(0.05, 10, k) for k in range(1, 11)]
    assert per == [pytest.approx(0.01)] * 10
    assert sum(a / 2 for a in per) == pytest.approx(0.05)  # one-sided: a CI whose lower end must clear zero
    with pytest.raises(InputError, match="beyond"):
        gate_mod.look_alpha(0.05, 10, 11)


@pytest.fixture(scope="module")
def refusals(tables):
    d = tables["dir"]
    one = items(1, [0.2, 0.3])
    four = items(4, [0.2, 0.3])
    return {
        "one_b": write_csv(d / "one_b.csv", table(one)),
        "one_c": write_csv(d / "one_c.csv", table(shifted(one, {i: 0.5 for i in one}))),
        "four_b": write_csv(d / "four_b.csv", table(four)),
        "four_c": write_csv(d / "four_c.csv", table(shifted(four, {i: 0.5 for i in four}))),
    }


@pytest.mark.parametrize(
    "args,words",
    [
        (("one_b", "one_c"), ["1 item", "at least 5"]),
        (("four_b", "four_c"), ["4 item", "at least 5"]),
        (("base", "win", "--material", "nan"), ["material"]),
        (("base", "win", "--alpha", "inf"), ["alpha"]),
        (("base", "win", "--n-boot", "1"), ["n_boot", "1000"]),
        (("base", "win", "--n-boot", "999"), ["n_boot", "1000"]),
    ],
)
def test_cli_refusals_exit_2_with_one_line(tables, capsys, refusals, args, words):
    files = {**tables, **refusals}
    b, c, *rest = args
    p = run_gate("--base", str(files[b]), "--cand", str(files[c]), *rest, capsys=capsys)
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert p.stdout.strip() == "" and "Traceback" not in p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and all(w in lines[0] for w in words), p.stderr


def test_cli_internal_error_exits_3_not_1(tables, monkeypatch):
    from typer.testing import CliRunner

    from flows.cli import app

    def boom(*a, **k):
        raise RuntimeError("simulated crash")

    monkeypatch.setattr(gate_mod, "decide_d", boom)  # the verdict both paths (light and pandas) reach
    r = CliRunner().invoke(app, ["gate", "--base", str(tables["base"]), "--cand", str(tables["win"])])
    assert r.exit_code == 3
    assert "internal error" in r.output and "simulated crash" in r.output


@pytest.mark.parametrize(
    "entry,absent",
    [
        # the console script (flows/entry.py): numpy and the csv module only
        ("flows.entry", ("great_expectations", "prefect", "mlflow", "dvc", "scipy", "pandas", "typer", "rich")),
        # the typer app (a gate invocation the light parser leaves to it): nothing heavy either
        ("flows.cli", ("great_expectations", "prefect", "mlflow", "dvc", "scipy", "pandas")),
    ],
)
def test_cli_gate_path_imports_nothing_heavy(tables, entry, absent):
    code = (
        f"import sys; from {entry} import main; sys.argv = ['ratchet', 'gate', '--base', sys.argv[1], '--cand', "
        "sys.argv[2], '--json']\ntry:\n    main()\nexcept SystemExit as e:\n    code = e.code\n"
        f"heavy = sorted(m for m in {absent!r} if m in sys.modules)\n"
        "print('HEAVY', heavy, code)"
    )
    p = subprocess.run(
        [sys.executable, "-c", code, str(tables["base"]), str(tables["win"])],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.stdout.strip().splitlines()[-1] == "HEAVY [] 0", p.stdout + p.stderr


# -- held-out reuse: every dev look is counted and spends its share --------------------------------------------


def test_dev_looks_are_numbered_from_the_lineage_and_spend_linearly(tmp_path):
    from components.evolution.lineage import Lineage
    from components.params import load_params
    from flows.round import dev_look, dev_looks

    root = tmp_path / "lineage"
    root.mkdir()
    recs = [
        {"round": 0, "verdict": "start"},
        {
            "round": 1,
            "verdict": "reject",
            "plan_key": "p1",
            "dev_look": {"look": 1, "alpha": 0.01, "spent": 0.005, "campaign_alpha": 0.05},
        },
        {"round": 2, "verdict": "reject", "plan_key": "p2"},  # stopped at the repair screen: no dev look
        {
            "round": 3,
            "verdict": "accept",
            "plan_key": "p3",
            "dev_look": {"look": 2, "alpha": 0.01, "spent": 0.01, "campaign_alpha": 0.05},
        },
    ]
    (root / "lineage.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    p = load_params(None, {"campaign.rounds": 10, "gate.campaign_alpha": 0.05, "gate.campaign_spending": "linear"})
    look = dev_look(Lineage(root), 4, p)
    assert look.look == 3 and look.alpha == pytest.approx(0.01) and look.spent == pytest.approx(0.015)
    assert look.campaign_alpha == 0.05
    assert dev_look(Lineage(root), 2, p).look == 2  # a resumed round 2 numbers its look as it did the first time
    acc = dev_looks([r for r in recs if r["round"] > 0], 0.05)
    assert acc["n"] == 2 and acc["alpha_spent"] == pytest.approx(0.01)
    assert [(x["round"], x["plan"], x["verdict"]) for x in acc["looks"]] == [(1, "p1", "reject"), (3, "p3", "accept")]
    p3 = load_params(None, {"campaign.rounds": 3, "gate.campaign_spending": "linear"})
    assert dev_look(Lineage(root), 4, p3).alpha == pytest.approx(2 * 0.05 / 3)
    # the wealth rule on the same lineage: round 1's look kept the parent (spent 0.005), round 3's promoted (given
    # back), round 2 never looked; round 4 takes the wealth left over the 7 rounds left
    w = dev_look(Lineage(root), 4, load_params(None, {"campaign.rounds": 10}))
    assert w.rule == "wealth" and w.wealth == pytest.approx(0.045) and w.alpha == pytest.approx(2 * 0.045 / 7)
    assert w.spent == pytest.approx(0.005 + 0.045 / 7)


# -- benchmarks (quick sizes) ----------------------------------------------------------------------------------


def test_bench_gate_quick():
    import re

    p = subprocess.run(
        [sys.executable, "benchmarks/bench_gate.py", "--quick"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert p.returncode == 0, p.stderr
    last = p.stdout.strip().splitlines()[-1]
    m = re.search(r"plain Python at 1000 items \(rubric d\): (\d+)x", last)
    assert m and int(m.group(1)) >= 50, p.stdout
    assert "ratchet gate on a 60-item table" in p.stdout and "peak RSS" in p.stdout


def test_bench_gate_calibration_quick(bench_dir, tmp_path):
    import re

    p = subprocess.run(
        [
            sys.executable,
            "benchmarks/bench_gate_calibration.py",
            "--quick",
            "--bench",
            str(bench_dir),
            "--cache",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr
    out = p.stdout
    rate = lambda label, at: int(re.search(rf"{re.escape(label)}.*?@{at}\s+\S+% \[[^]]*\] \((\d+)/", out).group(1))  # noqa: E731
    assert rate("patch: bounce", "0.01") == 0  # bouncing every good write never passes for an improvement
    bounce = re.search(
        r"patch: bounce.*sequential @0\.01\s+\S+% \[[^]]*\] \((\d+)/\d+\), same verdict ([\d.]+)%, "
        r"episodes (\d+)%",
        out,
    )
    # the sequential gate never promotes it either, agrees with the full gate, and stops before the last look
    assert bounce and int(bounce.group(1)) == 0 and float(bounce.group(2)) == 100.0 and int(bounce.group(3)) < 100
    camp = re.search(r"without spending .*?\((\d+)/(\d+)\); with linear alpha spending .*?\((\d+)/(\d+)\)", out)
    assert camp, out
    # the spent alpha is smaller than one look's, on the same draws: it can only promote less often
    assert int(camp.group(3)) <= int(camp.group(1))
    assert re.fullmatch(
        r"campaign-level false promotion with alpha spending: [\d.]+% "
        r"\(CI rule alone [\d.]+%; sequential [\d.]+%\)",
        out.strip().splitlines()[-1],
    )


# -- sequential looks ------------------------------------------------------------------------------------------


def test_efficacy_levels_match_the_published_lan_demets_boundaries():
    obf = gate_mod.efficacy_levels([1 / 3, 2 / 3, 1], 0.025, "obf")  # z = 3.71, 2.51, 1.99
    assert obf == pytest.approx([0.000104, 0.00604, 0.0231], rel=0.05)
    poc = gate_mod.efficacy_levels([0.5, 1.0], 0.025, "pocock")  # z = 2.157, 2.201
    assert poc == pytest.approx([0.0155, 0.0139], rel=0.03)
    assert gate_mod.efficacy_levels([1.0], 0.025) == pytest.approx([0.025], rel=1e-3)
    from components.errors import InputError

    with pytest.raises(InputError, match="spending"):
        gate_mod.efficacy_levels([1.0], 0.025, "linear")
    with pytest.raises(InputError, match="increase"):
        gate_mod.efficacy_levels([0.5, 0.4, 1.0], 0.025)


def _per(d):
    d = np.asarray(d, dtype=float)
    return pd.DataFrame({"item_id": [f"i{k:03d}" for k in range(len(d))], "base": 0.5, "cand": 0.5 + d, "d": d})


def test_sequential_stops_early_for_a_clear_win_and_for_clear_losses():
    cfg = GateConfig(n_boot=1000, alpha=0.01, reg_share=0.0)
    win = gate_mod.sequential_decide(_per(np.full(60, 0.3)), cfg, [20, 20, 20], "obf")
    assert win.accept and win.look == 1 and win.n_seen == 20
    regress = gate_mod.sequential_decide(_per([-0.3] * 3 + [0.3] * 57), cfg, [20, 20, 20])
    assert not regress.accept and regress.look == 1 and "reg_cap" in regress.reason
    null = gate_mod.sequential_decide(_per([0.04, -0.04] * 30), GateConfig(n_boot=1000, reg_cap=60), [20, 20, 20])
    assert not null.accept and null.look == 1 and "futility" in null.reason and null.n_seen == 20
    small = gate_mod.sequential_decide(_per([0.1, -0.04] * 30), GateConfig(n_boot=1000, reg_cap=60), [20, 20, 20])
    assert small.look > 1  # a modest positive effect is not a clear call after 20 items: keep evaluating


def test_sequential_keeps_the_false_promotion_rate():
    """Under no effect the sequential gate promotes no more often than its one-sided alpha (plus Monte-Carlo error)."""
    rng = np.random.default_rng(7)
    cfg = GateConfig(n_boot=1000, alpha=0.2, reg_cap=60)  # a large alpha so the rate is measurable in 400 runs
    hits = sum(
        gate_mod.sequential_decide(_per(rng.normal(0, 0.2, 60)), cfg, [20, 20, 20], "pocock").accept for _ in range(400)
    )
    assert hits / 400 <= 0.1 + 3 * np.sqrt(0.1 * 0.9 / 400)


def test_bench_gate_sequential_replays_a_campaign(tmp_path):
    """The replay on a small recorded campaign: a clear win stops at the first look, a clear loss too, and the
    saved model calls are exactly the unseen items' calls in both arms."""
    import re

    rng = np.random.default_rng(0)
    history = []
    for r, delta in ((1, 0.4), (2, -0.4)):
        rd = tmp_path / "rounds" / f"r{r:02d}"
        rd.mkdir(parents=True)
        base = pd.DataFrame(
            [{"item_id": f"t{i:03d}", "seed": s, "score": 0.5, "model_calls": 10} for i in range(30) for s in range(2)]
        )
        cand = base.assign(score=np.clip(0.5 + delta + rng.normal(0, 0.01, len(base)), 0, 1))
        base.to_csv(rd / "dev_base.csv", index=False)
        cand.to_csv(rd / "dev_cand.csv", index=False)
        history.append(
            {
                "round": r,
                "round_dir": str(rd),
                "verdict": "accept" if delta > 0 else "reject",
                "dev_look": {"look": r, "alpha": 0.01, "spent": r * 0.005, "campaign_alpha": 0.05},
                "evaluation": {
                    "benchmark": "bench",
                    "split": "dev",
                    "seeds": [0, 1],
                    "model": "sim",
                    "model_cfg": {},
                    "max_turns": 40,
                    "gate": {**GateConfig().__dict__, "n_boot": 1000, "alpha": 0.01},
                },
            }
        )
    (tmp_path / "summary.json").write_text(
        json.dumps(
            {
                "params": {"campaign": {"shard_size": 10}},
                "budget": {"evidence_cost": {"model_calls": 4000}},
                "history": history,
            }
        )
    )
    p = subprocess.run(
        [sys.executable, "benchmarks/bench_gate_sequential.py", "--campaign", str(tmp_path), "--spending", "pocock"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    assert "verdicts identical to full evaluation" in p.stdout, p.stdout
    # each round stops after the first 10-item look: 20 of 30 items unseen, 2 seeds x 10 calls x 2 arms each
    assert re.search(r"saved 1600 \(", p.stdout), p.stdout
    assert p.stdout.strip().splitlines()[-1] == "model calls saved per campaign: 40.0% of 4000"


# -- sequential early stopping in the round (design, looks over evaluated cells, repair screen) -----------------------


def _cells_table(d_by_item_seed: np.ndarray, base: float = 0.4) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Score tables of two arms over (item, seed) cells: cand - base = d[item, seed]."""
    n, k = d_by_item_seed.shape
    rows = [(f"t{i:03d}", s) for i in range(n) for s in range(k)]
    b = pd.DataFrame({"item_id": [r[0] for r in rows], "seed": [r[1] for r in rows], "score": base})
    c = b.assign(score=np.clip(base + d_by_item_seed.reshape(-1), 0, 1))
    return b, c


def test_sequential_design_groups_and_refusals():
    from components.errors import InputError

    items, seeds = [f"t{i:03d}" for i in range(10)], [0, 1, 2]
    by_seeds = gate_mod.SequentialDesign(3, "pocock", "seeds").groups(items, seeds)
    assert [g[1] for g in by_seeds] == [[0], [1], [2]] and all(g[0] == items for g in by_seeds)
    by_items = gate_mod.SequentialDesign(3, "obf", "items").groups(items, seeds)
    flat = [i for g in by_items for i in g[0]]
    assert sorted(flat) == items and flat != items and all(g[1] == seeds for g in by_items)  # a hash order, not dev's
    assert gate_mod.SequentialDesign(5, "pocock", "seeds").groups(items, [0, 1]) == [(items, [0]), (items, [1])]
    assert gate_mod.SequentialDesign(3).fractions(items, seeds) == pytest.approx([1 / 3, 2 / 3, 1])
    assert not gate_mod.SequentialDesign(1).on and gate_mod.SequentialDesign(2).on
    for bad in ({"looks": 0}, {"spending": "linear"}, {"by": "families"}):
        with pytest.raises(InputError, match=list(bad)[0]):
            gate_mod.SequentialDesign(**bad)


def test_sequential_gate_waits_for_unevaluated_looks_and_stops_at_a_clear_win():
    cfg = GateConfig(n_boot=1000, alpha=0.01)
    items, seeds = [f"t{i:03d}" for i in range(30)], [0, 1, 2]
    design = gate_mod.SequentialDesign(3, "pocock", "seeds")
    b, c = _cells_table(np.full((30, 3), 0.4))
    first = lambda t: t[t["seed"] == 0]  # noqa: E731  only look 1 evaluated
    verdict, per, rec = gate_mod.sequential_gate(first(b), first(c), cfg, design, items, seeds)
    assert verdict.accept and rec["looks_used"] == 1 and rec["stopped_early"] and len(per) == 30
    # a candidate that has not fired its mechanism yet cannot be accepted early; with nothing evaluated past look 1,
    # the gate asks for the next look (None) rather than deciding
    verdict, _, rec = gate_mod.sequential_gate(first(b), first(c), cfg, design, items, seeds, fired_by_look=[False])
    assert verdict is None and rec["looks_used"] == 0
    # ... and it rejects at the last look if the mechanism never fired
    verdict, _, rec = gate_mod.sequential_gate(b, c, cfg, design, items, seeds, fired_by_look=[False] * 3)
    assert not verdict.accept and rec["looks_used"] == 3 and "mechanism" in verdict.reason


def test_sequential_gate_by_seeds_does_not_reject_on_interim_regressions():
    """By seeds an item's d is not final before the last look: seed 0 shows 4 regressions (cap 2) that the other
    seeds undo, so the gate must look on, and then agrees with the full gate."""
    rng = np.random.default_rng(3)
    d = np.zeros((60, 3))
    d[:20] = 0.3  # a real improvement on 20 items
    d[20:24, 0], d[20:24, 1:] = -0.3, 0.15  # item means 0: regressed at seed 0 only
    d[24:, :] = rng.choice([0.0, 0.0, 0.0, 0.02], size=(36, 3))
    b, c = _cells_table(d)
    items, seeds = sorted(b["item_id"].unique()), [0, 1, 2]
    cfg = GateConfig(n_boot=2000, alpha=0.01, reg_share=0.0)
    verdict, _, rec = gate_mod.sequential_gate(b, c, cfg, gate_mod.SequentialDesign(3, "pocock", "seeds"), items, seeds)
    assert rec["per_look"][0]["regressed"] == 4 and rec["looks_used"] >= 2
    full, _ = gate_mod.gate(b, c, cfg)
    assert verdict.accept == full.accept is True
    # by items a regression seen is final: the same cap rejects at the first look that holds it
    by_items = gate_mod.SequentialDesign(3, "pocock", "items")
    bad = d.copy()
    bad[20:24, :] = -0.3
    b2, c2 = _cells_table(bad)
    verdict, _, rec = gate_mod.sequential_gate(b2, c2, cfg, by_items, items, seeds)
    assert not verdict.accept and "reg_cap" in verdict.reason and not gate_mod.gate(b2, c2, cfg)[0].accept


def test_sequential_repair_stops_for_a_clear_repair_and_for_futility_and_else_is_the_full_screen():
    items, seeds = [f"t{i:03d}" for i in range(12)], [0, 1, 2]
    design = gate_mod.SequentialDesign(3, "pocock", "seeds")
    good = np.full((12, 3), 0.5)
    good[0] = 0.0
    b, c = _cells_table(good, base=0.3)
    first = lambda t: t[t["seed"] == 0]  # noqa: E731
    res, per, rec = gate_mod.sequential_repair(b, first(c), 0.05, 0.05, design, items, seeds)
    assert res.ok and rec["stopped_early"] and rec["looks_used"] == 1 and res.repaired == 11 and len(per) == 12
    b, c = _cells_table(np.full((12, 3), -0.2), base=0.5)
    res, _, rec = gate_mod.sequential_repair(b, first(c), 0.05, 0.05, design, items, seeds)
    assert not res.ok and "futility" in rec["why"]
    # unclear after each interim look: the last look is exactly the full screen
    mixed = np.tile([0.3, -0.2, 0.0, 0.1], (3, 3)).T.reshape(12, 3)
    b, c = _cells_table(mixed, base=0.4)
    res, _, rec = gate_mod.sequential_repair(b, c, 0.05, 0.05, design, items, seeds)
    full, _ = gate_mod.repair_screen(b, c, 0.05)
    assert rec["looks_used"] == 3 and (res.ok, res.repaired, res.broken) == (full.ok, full.repaired, full.broken)


def test_gate_params_sequential_block_is_validated():
    from components.errors import InputError
    from components.params import load_params

    p = load_params(ROOT / "params.yaml")
    assert p.gate.sequential.design() == gate_mod.SequentialDesign(
        p.gate.sequential.looks, p.gate.sequential.spending, p.gate.sequential.by
    )
    assert "sequential" not in p.gate.config().__dict__  # the arithmetic's config stays the gate's own
    assert "gate.sequential" in p.identity()  # a rerun may not change how dev is looked at
    for field, value in (("looks", 0), ("spending", "linear"), ("by", "tasks"), ("surprise", 1)):
        with pytest.raises(InputError, match=rf"gate\.sequential\.{field}"):
            load_params(None, {f"gate.sequential.{field}": value})


def test_ci_level_labels_each_dev_ci_with_the_alpha_it_spent():
    from components.evolution.report import ci_level, round_rows

    gate = {
        "accept": True,
        "net": 0.1,
        "ci_lo": 0.01,
        "ci_hi": 0.2,
        "n_items": 30,
        "n_improved": 5,
        "n_regressed": 0,
        "reason": "ok",
    }
    plain = {
        "round": 1,
        "verdict": "accept",
        "gate": gate,
        "dev_look": {"look": 1, "alpha": 0.01, "spent": 0.005, "campaign_alpha": 0.05},
    }
    looked = {"look": 1, "n_looks": 3, "n_items": 30, "lo": 0.01, "hi": 0.2, "net": 0.1, "regressed": 0}
    seq = {
        **plain,
        "round": 2,
        "sequential": {
            "gate": {
                "looks": 3,
                "looks_used": 2,
                "stopped_early": True,
                "why": "early",
                "per_look": [{**looked, "level": 0.002}, {**looked, "look": 2, "level": 0.0019}],
            }
        },
    }
    assert ci_level(plain) == pytest.approx(0.99) and ci_level(seq) == pytest.approx(1 - 0.0038)
    rows = round_rows({"history": [plain, seq, {"round": 3, "verdict": "no_plan"}]})
    assert [r["level"] for r in rows] == ["99%", "99.62%", ""]


def test_the_round_flow_stops_dev_and_repair_looks_early_and_records_them(small_campaign):
    """The shared small campaign runs with params.yaml's sequential gate (2 seeds: 2 looks by seeds). Each gated round
    records its looks; the dev tables hold exactly the cells of the looks used; the repair screen's base side is the
    champion's train episodes (reused, not re-run, and not counted twice in the evidence cost)."""
    p, out = small_campaign.params, small_campaign.out
    assert p.gate.sequential.looks > 1
    gated = [r for r in small_campaign.summary["history"] if r.get("gate")]
    assert gated
    for r in gated:
        seq = r["sequential"]["gate"]
        assert 1 <= seq["looks_used"] <= seq["looks"] == min(p.gate.sequential.looks, p.campaign.seeds)
        assert seq["stopped_early"] == (seq["looks_used"] < seq["looks"]) and seq["why"]
        assert r["evaluation"]["sequential"]["looks_used"] == seq["looks_used"]
        rd = out / "rounds" / f"r{r['round']:02d}"
        dev = pd.read_csv(rd / "dev_cand.csv", dtype={"item_id": str})
        assert sorted(dev["seed"].unique()) == list(range(seq["looks_used"]))  # by seeds: look g adds seed g-1
        assert len(pd.read_csv(rd / "dev_base.csv")) == len(dev) == len(set(dev["item_id"])) * seq["looks_used"]
        evals = json.loads((rd / "evals.json").read_text())
        assert [e.get("reused") for e in evals if e["split"] == "repair" and e["arm"] == "base"] == ["train"]
        assert {e["look"] for e in evals if e["split"] == "dev"} == set(range(1, seq["looks_used"] + 1))
    from flows.campaign import _cost, _evals

    evs = _evals(out, small_campaign.summary["test"])
    all_calls = sum(e["summary"]["model_calls"] for e in evs)
    reused = sum(e["summary"]["model_calls"] for e in evs if e.get("reused"))
    assert reused > 0 and _cost(out, small_campaign.summary["test"])["model_calls"] == all_calls - reused


def test_bench_gate_sequential_compares_two_campaigns(tmp_path):
    """The on/off comparison reads each campaign's ledger (what it paid) and verdicts; a differing verdict is said."""
    for name, paid, verdicts in (("on", 600, ["accept", "reject"]), ("off", 1000, ["accept", "accept"])):
        camp = tmp_path / name
        (camp / ".state").mkdir(parents=True)
        (camp / ".state/budget.json").write_text(json.dumps({"spent": {"model_calls": paid}}))
        history = [
            {
                "round": i + 1,
                "verdict": v,
                "plan_key": f"p{i}",
                "sequential": {"gate": {"looks": 3, "looks_used": 1, "stopped_early": True, "why": "early"}},
            }
            for i, v in enumerate(verdicts)
        ]
        (camp / "summary.json").write_text(
            json.dumps({"history": history, "test": {"net": 0.1}, "champion_digest": name})
        )
    p = subprocess.run(
        [
            sys.executable,
            "benchmarks/bench_gate_sequential.py",
            "--on",
            str(tmp_path / "on"),
            "--off",
            str(tmp_path / "off"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    assert "verdicts and plans DIFFER; champion DIFFERS" in p.stdout, p.stdout
    assert (
        p.stdout.strip().splitlines()[-1] == "model calls paid per campaign: sequential on 600, off 1,000: 40.0% fewer"
    )


def test_a_proportional_regression_cap_grows_with_the_items_compared():
    from components.errors import InputError

    cfg = GateConfig(n_boot=1000, reg_share=0.1)
    assert (cfg.cap(10), cfg.cap(60), cfg.cap(240)) == (2, 6, 24)  # never below reg_cap
    d = np.array([0.3] * 40 + [-0.1] * 5 + [0.0] * 15)  # a real gain that perturbs 5 of 60 items
    assert gate_mod.decide(_per(d), cfg).accept
    assert not gate_mod.decide(_per(d), GateConfig(n_boot=1000, reg_share=0.0)).accept
    assert GateConfig().reg_share == 0.1  # on by default
    with pytest.raises(InputError, match="reg_share"):
        GateConfig(reg_share=float("nan"))


# -- cost as a second objective -------------------------------------------------------------------------------


def _with_tokens(df: pd.DataFrame, per_item: dict[str, float]) -> pd.DataFrame:
    out = df.copy()
    out["tokens_in"] = [per_item[i] + 3 * s for i, s in zip(out["item_id"], out["seed"])]
    return out


def test_the_cheaper_claim_promotes_a_change_within_the_margin_that_cuts_tokens_and_says_so():
    from components.evolution.gate import PromotedAs

    rng = np.random.default_rng(5)
    base = {f"i{k:02d}": [float(x) for x in rng.choice([0.0, 0.5, 1.0], 3)] for k in range(30)}
    b = _with_tokens(table(base), {i: 1000.0 for i in base})
    same = _with_tokens(table(base), {i: 900.0 - k for k, i in enumerate(base)})  # same scores, ~10% fewer tokens
    off, _ = gate(b, same, GateConfig(n_boot=2000))
    on, _ = gate(b, same, GateConfig(n_boot=2000, cheaper=True))
    assert not off.accept and off.promoted_as is None
    assert on.accept and on.promoted_as is PromotedAs.CHEAPER and on.tokens_net < -90 and on.tokens_ci_hi < 0
    assert on.as_dict()["promoted_as"] == "cheaper" and GateResult.from_dict(on.as_dict()) == on
    dearer = _with_tokens(table(base), {i: 1100.0 for i in base})
    assert not gate(b, dearer, GateConfig(n_boot=2000, cheaper=True))[0].accept  # same score, more tokens
    worse = _with_tokens(table(shifted(base, {i: -0.2 for i in base})), {i: 500.0 for i in base})
    assert not gate(b, worse, GateConfig(n_boot=2000, cheaper=True))[0].accept  # cheaper but out of the margin


def test_with_the_cost_objective_each_claim_gets_half_the_look_s_alpha():
    """A change in the margin whose tokens do not drop could be promoted falsely by either claim: each is tested at
    half the alpha so the look's false promotions stay within its share. A gain the full alpha accepts and half of
    it does not is rejected with the cost objective on."""
    assert GateConfig(alpha=0.01, cheaper=True).route_alpha == 0.005 and GateConfig(alpha=0.01).route_alpha == 0.01
    rng = np.random.default_rng(0)
    for _ in range(200):
        base = {f"i{k:02d}": [float(x) for x in rng.choice([0.0, 0.5, 1.0], 2)] for k in range(25)}
        cand = shifted(base, {i: float(rng.choice([0.0, 0.5, -0.5], p=[0.5, 0.3, 0.2])) for i in base})
        b, c = (
            _with_tokens(table(base), {i: 1000.0 for i in base}),
            _with_tokens(table(cand), {i: 1000.0 for i in base}),
        )
        full = gate(b, c, GateConfig(n_boot=2000, alpha=0.1))[0]
        half = gate(b, c, GateConfig(n_boot=2000, alpha=0.05))[0]
        split = gate(b, c, GateConfig(n_boot=2000, alpha=0.1, cheaper=True))[0]
        assert split.accept == half.accept and split.ci_lo == half.ci_lo
        if full.accept and not half.accept:
            break
    else:
        pytest.fail("no draw separated the full alpha from half of it")


def test_a_sequential_gate_records_the_look_a_futility_stop_ended_at():
    base = items(20, [0.5, 0.5, 0.5])
    worse = shifted(base, {i: -0.1 for i in list(base)[:10]})
    design = SequentialDesign(3, "pocock", "seeds")
    res, _, rec = sequential_gate(
        table(base), table(worse), GateConfig(n_boot=1000, alpha=0.01), design, list(base), [0, 1, 2]
    )
    assert not res.accept and rec["looks_used"] == 1 and rec["futile_at"] == 1
    assert rec["per_look"][0]["futility"] is True


def test_the_alpha_account_s_params_are_validated_at_load():
    from components.errors import InputError
    from components.evolution.alpha import Spending
    from components.params import load_params

    p = load_params(ROOT / "params.yaml")
    assert p.gate.campaign_spending is Spending.WEALTH and not p.gate.futility_refund and not p.gate.cheaper
    assert p.gate.retries == 1 and p.campaign.ablate
    with pytest.raises(InputError, match="gate: futility_refund: needs campaign_spending: wealth"):
        load_params(None, {"gate.futility_refund": True, "gate.campaign_spending": "linear"})
    with pytest.raises(InputError, match="gate.campaign_spending"):
        load_params(None, {"gate.campaign_spending": "greedy"})
    with pytest.raises(InputError, match="gate.retries"):
        load_params(None, {"gate.retries": -1})
    assert "cheaper" not in p.gate.config().__dict__ or p.gate.config().cheaper is False
