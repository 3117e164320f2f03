"""The gate's arithmetic against hand-computed cases and exact enumerations (issue 15, mutation testing).

Each test states a property of components/evolution/gate.py that a mutant of it breaks: input bounds and their
messages, pairing refusals, the exact resampling distribution of every bootstrap path, the verdict's boundaries,
and the sequential looks. Expected values come from arithmetic done here (enumeration, binomial laws, the normal
quantile), never from running the gate."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from statistics import NormalDist

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from components.errors import InputError
from components.evolution import gate as g
from components.evolution.gate import GateConfig, PairingError, TooFewItems, TooManyErrors

N01 = NormalDist()


def arms(d_by_item: dict[str, list[float]], base: float = 0.4, errors: dict | None = None):
    """Two arms over (item, seed): cand - base = d[item][seed]; optional error cells {(arm, item, seed): msg}."""
    rows = [(i, s, base, base + d) for i, ds in d_by_item.items() for s, d in enumerate(ds)]
    b = pd.DataFrame({"item_id": [r[0] for r in rows], "seed": [r[1] for r in rows], "score": [r[2] for r in rows]})
    c = b.assign(score=[r[3] for r in rows])
    if errors is not None:
        b["error"] = [errors.get(("base", r[0], r[1]), "") for r in rows]
        c["error"] = [errors.get(("cand", r[0], r[1]), "") for r in rows]
    return b, c


def per(d) -> pd.DataFrame:
    d = np.asarray(d, dtype=float)
    return pd.DataFrame({"item_id": [f"i{k:03d}" for k in range(len(d))], "base": 0.3, "cand": 0.3 + d, "d": d})


def chi2_ok(draws: np.ndarray, support: list[float], probs: list[float]) -> bool:
    """Draws follow the law {support: probs} (every draw on the support; chi-square p > 1e-4)."""
    keys = np.round(np.asarray(support, dtype=float), 9)
    got = Counter(np.round(draws, 9).tolist())
    if set(got) - set(keys.tolist()):
        return False
    obs = np.array([got.get(k, 0) for k in keys.tolist()], dtype=float)
    exp = np.asarray(probs) * len(draws)
    keep = exp >= 5  # pool the thin tail so the chi-square approximation holds
    obs = np.append(obs[keep], obs[~keep].sum())
    exp = np.append(exp[keep], exp[~keep].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    return stats.chisquare(obs, exp).pvalue > 1e-4


def exact_resample_means(d: list[float]) -> tuple[list[float], list[float]]:
    """The law of the mean of n draws with replacement from d, by enumerating all n^n ordered resamples."""
    n = len(d)
    law: Counter = Counter()
    for idx in itertools.product(range(n), repeat=n):
        law[round(sum(d[i] for i in idx) / n, 9)] += 1
    support = sorted(law)
    return support, [law[s] / n**n for s in support]


# -- input bounds: one line naming the field and the interval --------------------------------------------------------


@pytest.mark.parametrize(
    "field,value,words",
    [
        ("alpha", 0, "gate: alpha: 0 is not in (0, 1)"),
        ("alpha", 1, "gate: alpha: 1 is not in (0, 1)"),
        ("alpha", "x", "gate: alpha: 'x' is not a number"),
        ("alpha", None, "gate: alpha: None is not a number"),
        ("alpha", float("inf"), "gate: alpha: inf is not a finite number"),
        ("campaign_alpha", 0.5, "gate: campaign_alpha: 0.5 is not in (0, 0.5)"),
        ("campaign_alpha", 0.0, "gate: campaign_alpha: 0.0 is not in (0, 0.5)"),
        ("material", 1.01, "gate: material: 1.01 is not in [0, 1]"),
        ("material", -0.01, "gate: material: -0.01 is not in [0, 1]"),
        ("reg_cap", -1, "gate: reg_cap: -1 is not in [0, inf)"),
        ("max_error_share", 1.5, "gate: max_error_share: 1.5 is not in [0, 1]"),
        ("reg_share", -0.1, "gate: reg_share: -0.1 is not in [0, 1]"),
        ("n_boot", 2000.0, "gate: n_boot: 2000.0 is not an integer"),
        ("n_boot", True, "gate: n_boot: True is not an integer"),
        ("seed", 1.5, "gate: seed: 1.5 is not an integer"),
        ("reg_cap", 2.0, "gate: reg_cap: 2.0 is not an integer"),
        ("min_items", 5.0, "gate: min_items: 5.0 is not an integer"),
        ("n_boot", 999, "gate: n_boot: 999 is below 1000 (the CI would carry its own sampling noise)"),
        ("min_items", 1, "gate: min_items: 1 must be at least 2"),
    ],
)
def test_config_refusals_name_the_field_and_the_bound(field, value, words):
    with pytest.raises(InputError) as e:
        GateConfig(**{field: value})
    assert str(e.value) == words


@pytest.mark.parametrize(
    "kw",
    [
        {"alpha": 1e-9},
        {"alpha": 0.999},
        {"campaign_alpha": 0.499},
        {"material": 0},
        {"material": 1},
        {"reg_cap": 0},
        {"max_error_share": 0},
        {"max_error_share": 1},
        {"reg_share": 0},
        {"reg_share": 1},
        {"n_boot": 1000},
        {"n_boot": np.int64(1500)},
        {"seed": np.int32(3)},
        {"min_items": 2},
        {"seed": 0},
    ],
)
def test_config_accepts_the_closed_ends_and_numpy_integers(kw):
    cfg = GateConfig(**kw)
    assert getattr(cfg, next(iter(kw))) == next(iter(kw.values()))


def test_the_regression_cap_is_the_larger_of_the_count_and_the_share():
    assert GateConfig(reg_cap=3, reg_share=0.0).cap(1000) == 3  # reg_share 0: the absolute cap only
    assert GateConfig(reg_cap=0, reg_share=0.0).cap(1000) == 0
    assert GateConfig(reg_cap=3).cap(1000) == 100  # the default share, a tenth
    cfg = GateConfig(reg_cap=1, reg_share=0.1)
    assert [cfg.cap(n) for n in (5, 19, 20, 29, 30, 31)] == [1, 1, 2, 2, 3, 3]
    # 0.29 * 100 is 28.999999999999996 in floating point: the share of 100 items is still 29
    assert GateConfig(reg_cap=0, reg_share=0.29).cap(100) == 29
    assert GateConfig(reg_cap=0, reg_share=0.7).cap(10) == 7


# -- pairing refusals ------------------------------------------------------------------------------------------------


def test_missing_columns_are_named_per_arm():
    b, c = arms({f"i{k}": [0.1] for k in range(5)})
    with pytest.raises(PairingError, match=r"^base: missing column\(s\) seed, score$"):
        g.pair(b.drop(columns=["seed", "score"]), c)
    with pytest.raises(PairingError, match=r"^cand: missing column\(s\) item_id$"):
        g.pair(b, c.drop(columns=["item_id"]))


def test_bad_cells_are_named_by_item_and_seed_first_five_only():
    b, c = arms({f"i{k}": [0.1] for k in range(8)})
    bad = c.copy()
    bad["seed"] = bad["seed"].astype(object)
    bad.loc[1, "seed"] = 0.5
    with pytest.raises(PairingError) as e:
        g.pair(b, bad)
    assert str(e.value) == "cand: seed is missing or not an integer for i1#0.5"
    bad = b.assign(score=[None] * 7 + [0.2])
    with pytest.raises(PairingError) as e:
        g.pair(bad, c)
    assert str(e.value) == "base: score is missing or not a number for i0#0, i1#0, i2#0, i3#0, i4#0"
    for v in (-0.01, 1.01):
        bad = c.assign(score=[0.5] * 7 + [v])
        with pytest.raises(PairingError) as e:
            g.pair(b, bad)
        assert str(e.value) == "cand: score outside [0, 1] for i7#0"


def test_scores_on_the_ends_of_the_unit_interval_pair():
    b = pd.DataFrame({"item_id": list("abcde"), "seed": 0, "score": [0.0, 1.0, 0.0, 1.0, 0.5]})
    c = b.assign(score=[1.0, 0.0, 1.0, 1.0, 0.5])
    p, dropped = g.pair(b, c)
    assert dropped == 0 and list(p["d"]) == [1.0, -1.0, 1.0, 0.0, 0.0]


def test_duplicate_cells_are_refused_sorted():
    b, c = arms({f"i{k}": [0.1, 0.1] for k in range(5)})
    dup = pd.concat([b, b.iloc[[3, 0]]], ignore_index=True)
    with pytest.raises(PairingError) as e:
        g.pair(dup, c)
    assert str(e.value) == "base: duplicate (item_id, seed) rows: i0#0, i1#1"


def test_item_ids_and_seeds_pair_across_types():
    """An item id read as a number in one table and a string in the other, or a seed as 1.0, is the same cell."""
    b = pd.DataFrame({"item_id": [1, 2, 3, 4, 5], "seed": [0, 0, 0, 0, 0], "score": 0.2})
    c = pd.DataFrame({"item_id": ["1", "2", "3", "4", "5"], "seed": [0.0] * 5, "score": 0.6})
    p, _ = g.pair(b, c)
    assert list(p["item_id"]) == ["1", "2", "3", "4", "5"] and np.allclose(p["d"], 0.4)


def test_incomplete_pairing_counts_and_names_each_side():
    b, c = arms({f"i{k}": [0.1, 0.1] for k in range(6)})
    with pytest.raises(PairingError) as e:
        g.pair(b.iloc[2:], c.iloc[:-1])
    assert str(e.value) == ("incomplete pairing: 1 (item, seed) only in base: i5#1; 2 only in cand: i0#0, i0#1")
    with pytest.raises(PairingError) as e:
        g.pair(b, c.iloc[:-1])
    assert str(e.value) == "incomplete pairing: 1 (item, seed) only in base: i5#1"
    with pytest.raises(PairingError) as e:
        g.pair(b.iloc[:-1], c)
    assert str(e.value) == "incomplete pairing: 1 only in cand: i5#1"
    with pytest.raises(PairingError, match="^no \\(item, seed\\) pairs to compare$"):
        g.pair(b.iloc[:0], c.iloc[:0])


def test_per_item_table_is_sorted_means_over_seeds():
    b, c = arms({"z": [0.2, 0.4], "a": [0.0, -0.2], "m": [0.1, 0.1]}, base=0.5)
    p, dropped = g.pair(b, c)
    assert dropped == 0
    assert list(p.columns) == ["item_id", "base", "cand", "d"]
    assert list(p["item_id"]) == ["a", "m", "z"]
    assert np.allclose(p["d"], [-0.1, 0.1, 0.3]) and np.allclose(p["base"], 0.5)


def test_the_error_share_is_refused_only_above_the_limit_and_says_how_many():
    d = {f"i{k}": [0.1] * 4 for k in range(5)}  # 20 pairs
    errs = {("cand", f"i{k}", 0): "boom" for k in range(5)}  # 5 of 20 = exactly 0.25
    b, c = arms(d, errors=errs)
    p, dropped = g.pair(b, c, max_error_share=0.25)
    assert dropped == 5 and len(p) == 5
    with pytest.raises(TooManyErrors) as e:
        g.pair(b, c, max_error_share=0.24)
    assert str(e.value) == "5 of 20 (item, seed) pairs errored in one arm or both: too many to compare"
    # an error in the base arm drops the pair too
    b2, c2 = arms(d, errors={("base", "i0", 0): "x"})
    assert g.pair(b2, c2)[1] == 1


def test_too_few_items_says_why_and_errors_make_it_a_refusal():
    b, c = arms({f"i{k}": [0.1] for k in range(4)})
    with pytest.raises(TooFewItems) as e:
        g.pair(b, c, min_items=5)
    assert str(e.value) == "4 item(s) to compare; the gate needs at least 5"
    assert len(g.pair(b, c, min_items=4)[0]) == 4
    b, c = arms({f"i{k}": [0.1] for k in range(5)}, errors={("cand", "i0", 0): "x"})
    with pytest.raises(TooManyErrors) as e:
        g.pair(b, c, min_items=5)
    assert str(e.value) == "1 errored pair(s) leave 4 item(s); the gate needs at least 5"


# -- the bootstrap: each path draws the exact law of a resample mean -------------------------------------------------


def inverse_cdf_draws(d: list[float], n_boot: int, seed: int) -> np.ndarray:
    """What the lattice path of `boot_means` draws (its docstring: one inverse-CDF draw per resample from the exact
    law of the resample mean): one uniform each from the seed's generator, inverted through the law enumerated here."""
    support, probs = exact_resample_means(d)
    cdf = np.cumsum(probs)
    k = np.searchsorted(cdf, np.random.default_rng(seed).random(n_boot) * cdf[-1], side="right")
    return np.asarray(support)[np.minimum(k, len(support) - 1)]


@pytest.mark.parametrize(
    "d,n_boot",
    [
        ([-0.5, -0.25, 0.5], 1000),  # step 0.25, integer offsets 0, 1, 4
        (
            [0.1, 0.4, 0.7],
            19,
        ),  # offsets share a factor: on the coarsest step (0.3) the support fits 19 draws, on 0.1 not
        ([0.0, 1 / 7919], 1000),  # a prime denominator below the lattice's limit
        ([0.0, 0.1, 0.2, 0.3, 0.4, 0.5], 200),
    ],
)
def test_values_on_a_lattice_are_drawn_by_inverting_the_exact_law(d, n_boot):
    for seed in (0, 5):
        assert np.allclose(
            g.boot_means(np.array(d), n_boot, seed), inverse_cdf_draws(d, n_boot, seed), rtol=0, atol=1e-9
        )


@pytest.mark.parametrize(
    "d,n_boot",
    [
        ([0.0, 1 / 9999, 1 / 9998], 100_000),  # the common denominator is too large (its FFT would fit at this n_boot)
        ([0.0, math.pi / 10], 1000),  # irrational
        ([0.1, 0.4, 0.7], 18),  # a lattice whose support does not fit 18 draws: by index
    ],
)
def test_values_off_a_small_lattice_are_drawn_by_index_with_the_same_law(d, n_boot):
    draws = g.boot_means(np.array(d), n_boot, 3)
    assert not np.allclose(draws, inverse_cdf_draws(d, n_boot, 3), rtol=0, atol=1e-9)
    support, probs = exact_resample_means(d)
    assert set(np.round(draws, 9).tolist()) <= set(support)


@pytest.mark.parametrize(
    "d",
    [
        [0.0, 0.5, 1.0],  # lattice (FFT)
        [0.0, math.sqrt(2) / 10, math.pi / 10],  # irrational, all distinct: index draws
        [-0.2, 0.0, 0.0, 0.7],  # lattice with a repeated value
    ],
)
def test_each_path_draws_the_enumerated_law_of_the_resample_mean(d):
    support, probs = exact_resample_means(d)
    draws = g.boot_means(np.array(d), 20_000, 11)
    assert draws.shape == (20_000,)
    assert chi2_ok(draws, support, probs)


def test_the_multinomial_path_draws_a_binomial_mix():
    """Two irrational values, 16 copies each (no lattice, values repeat: multinomial counts): the resample mean is
    v0 + (v1 - v0) K / 32 with K ~ Binomial(32, 1/2)."""
    v0, v1 = math.sqrt(2) / 10, math.pi / 10
    d = np.array([v0] * 16 + [v1] * 16)
    k = np.arange(33)
    support = v0 + (v1 - v0) * k / 32
    draws = g.boot_means(d, 20_000, 2)
    assert chi2_ok(draws, support.tolist(), stats.binom.pmf(k, 32, 0.5).tolist())


def test_a_skewed_lattice_draws_the_binomial_law_with_its_weights():
    """Values 0 and 1 with shares 1/4, 3/4 over 8 items: the mean is K/8 with K ~ Binomial(8, 3/4)."""
    d = np.array([0.0] * 2 + [1.0] * 6)
    k = np.arange(9)
    draws = g.boot_means(d, 20_000, 4)
    assert chi2_ok(draws, (k / 8).tolist(), stats.binom.pmf(k, 8, 0.75).tolist())


def test_a_lattice_with_a_negative_start_and_wide_gaps():
    d = [-0.3, 0.0, 0.9]  # offsets 0, 0.3, 1.2: step 0.3, j = 0, 1, 4
    support, probs = exact_resample_means(d)
    assert chi2_ok(g.boot_means(np.array(d), 20_000, 8), support, probs)


def test_draws_past_one_chunk_are_all_filled():
    """More resamples than one chunk of draws holds (chunks of 2^18 index draws bound the memory): the index and
    multinomial paths loop over chunks, every draw is filled, and the law holds."""
    d = [0.0, math.sqrt(2) / 10, math.pi / 10]
    support, probs = exact_resample_means(d)
    draws = g.boot_means(np.array(d), 200_001, 3)  # 3 items: 87381 resamples a chunk
    assert draws.shape == (200_001,) and chi2_ok(draws, support, probs)
    v0, v1 = math.sqrt(2) / 10, math.pi / 10
    two = np.array([v0] * 8 + [v1] * 8)
    draws = g.boot_means(two, 300_001, 3)  # 2 distinct values: 131072 multinomial draws a chunk
    k = np.arange(17)
    assert draws.shape == (300_001,)
    assert chi2_ok(draws, (v0 + (v1 - v0) * k / 16).tolist(), stats.binom.pmf(k, 16, 0.5).tolist())


def test_many_items_beyond_sixteen_bit_indices():
    d = np.random.default_rng(0).normal(size=70_000)
    draws = g.boot_means(d, 40, 0)
    se = d.std() / math.sqrt(len(d))
    assert draws.shape == (40,) and np.all(np.abs(draws - d.mean()) < 6 * se)
    assert draws.std() > 0.3 * se


def test_a_constant_and_an_empty_d():
    assert np.array_equal(g.boot_means(np.full(7, 0.25), 1000, 0), np.full(1000, 0.25))
    with pytest.raises(ValueError, match="zero items"):
        g.boot_means(np.array([]), 1000, 0)


def test_ci_is_the_percentile_interval_at_the_requested_level():
    """d = 0/1 over 20 items (a lattice): the resample mean is Binomial(20, p)/20, so the CI's ends are its
    quantiles at alpha/2 and 1 - alpha/2, to within a grid step."""
    d = np.array([1.0] * 12 + [0.0] * 8)
    for alpha in (0.05, 0.2):
        lo, hi = g.bootstrap_ci(d, 40_000, alpha, 1)
        assert lo == pytest.approx(stats.binom.ppf(alpha / 2, 20, 0.6) / 20, abs=0.051)
        assert hi == pytest.approx(stats.binom.ppf(1 - alpha / 2, 20, 0.6) / 20, abs=0.051)
    lo5, hi5 = g.bootstrap_ci(d, 40_000, 0.05, 1)
    lo20, hi20 = g.bootstrap_ci(d, 40_000, 0.2, 1)
    assert lo5 < lo20 < 0.6 < hi20 < hi5


# -- the verdict ------------------------------------------------------------------------------------------------------


def test_decide_counts_means_and_reason_of_an_accept():
    d = [0.3] * 10 + [-0.1, 0.0]
    res = g.decide(per(d), GateConfig(n_boot=2000, material=0.05), dropped_errors=3)
    assert res.accept and res.n_items == 12 and res.n_improved == 10 and res.n_regressed == 1
    assert res.net == pytest.approx(np.mean(d)) and res.dropped_errors == 3
    assert res.base_mean == pytest.approx(0.3) and res.cand_mean == pytest.approx(0.3 + np.mean(d))
    assert res.ci_lo > 0 and res.ci_hi > res.ci_lo
    assert res.reason == (f"net {np.mean(d):+.4f}, CI [{res.ci_lo:+.4f}, {res.ci_hi:+.4f}], 10 improved, 1 regressed")


def test_decide_material_is_strict_on_both_sides():
    res = g.decide(per([0.05] * 6 + [-0.05] * 2), GateConfig(n_boot=1000, material=0.05))
    assert (res.n_improved, res.n_regressed) == (0, 0)


def test_decide_regressions_at_the_cap_pass_and_one_more_rejects():
    at_cap = g.decide(per([0.5] * 20 + [-0.1] * 2), GateConfig(n_boot=1000, reg_cap=2))
    assert at_cap.accept
    over = g.decide(per([0.5] * 20 + [-0.1] * 3), GateConfig(n_boot=1000, reg_cap=2))
    assert not over.accept and over.reason == "3 regressed items > reg_cap 2"


def test_decide_reasons_of_each_veto_in_order():
    win = per([0.3] * 10)
    cfg = GateConfig(n_boot=1000)
    assert g.decide(win, cfg, leakage=True, mechanism_fired=False).reason == "leakage"
    res = g.decide(win, cfg, mechanism_fired=False)
    assert not res.accept and res.reason == "the prescribed mechanism did not fire"
    tie = g.decide(per([0.0] * 10), cfg)
    assert not tie.accept and tie.reason == (
        "CI [+0.0000, +0.0000] does not exclude zero on the improving side (ties keep the parent)"
    )
    with pytest.raises(TooFewItems, match="^4 item\\(s\\) to compare; the gate needs at least 5$"):
        g.decide(per([0.3] * 4), cfg)


def test_gate_refusal_is_a_reject_with_an_empty_table():
    b, c = arms({f"i{k}": [0.3] for k in range(6)}, errors={("cand", f"i{k}", 0): "x" for k in range(3)})
    res, p = g.gate(b, c, GateConfig(n_boot=1000))
    assert not res.accept and res.refused and res.dropped_errors is None and res.n_items == 0
    assert res.as_dict()["dropped_errors"] == -1 and g.GateResult.from_dict(res.as_dict()) == res  # as files spell it
    assert res.reason == "refused: 3 of 6 (item, seed) pairs errored in one arm or both: too many to compare"
    assert p.empty and list(p.columns) == ["item_id", "base", "cand", "d"]
    res, p = g.gate(b, c, GateConfig(n_boot=1000, max_error_share=0.5, min_items=3))
    assert res.accept and not res.refused and res.dropped_errors == 3 and len(p) == 3


def test_repair_screen_needs_more_repaired_than_broken_and_a_positive_mean():
    b, c = arms({"a": [0.3], "b": [-0.1], "c": [0.0], "d": [0.0], "e": [0.0]}, base=0.4)
    res, p = g.repair_screen(b, c, 0.05)
    assert (res.repaired, res.broken, res.n_items) == (1, 1, 5) and not res.ok  # a tie in counts keeps the parent
    assert res.reason == "repaired 1, broke 1 of 5 source items (mean 0.400 -> 0.440)"
    assert res.base_mean == pytest.approx(0.4) and res.cand_mean == pytest.approx(0.44)
    b, c = arms({"a": [0.3], "b": [-0.1], "c": [0.1], "d": [0.0], "e": [0.0]}, base=0.4)
    assert g.repair_screen(b, c, 0.05)[0].ok
    b, c = arms({"a": [0.06], "b": [0.06], "c": [-0.5]}, base=0.5)  # more repaired, but the mean falls
    res, _ = g.repair_screen(b, c, 0.05)
    assert (res.repaired, res.broken) == (2, 1) and not res.ok
    b, c = arms({"a": [0.0625], "b": [-0.0625]}, base=0.5)  # exactly material (binary-exact) is neither
    res, _ = g.repair_screen(b, c, 0.0625)
    assert (res.repaired, res.broken) == (0, 0)


def test_repair_screen_refuses_half_errored_pairs():
    b, c = arms({"a": [0.3, 0.3], "b": [0.3, 0.3]}, errors={("base", "a", 0): "x", ("cand", "b", 1): "y"})
    res, p = g.repair_screen(b, c)
    assert res.ok and res.n_items == 2  # 2 of 4 dropped: exactly half is allowed
    b, c = arms(
        {"a": [0.3, 0.3], "b": [0.3, 0.3]}, errors={("base", "a", 0): "x", ("cand", "b", 1): "y", ("cand", "b", 0): "z"}
    )
    res, p = g.repair_screen(b, c)
    assert not res.ok and res.reason.startswith("refused: 3 of 4") and p.empty and res.n_items == 0


# -- alpha spending and sequential looks ----------------------------------------------------------------------------


def test_look_alpha_bounds():
    assert g.look_alpha(0.05, 5, 5) == pytest.approx(0.02)
    assert g.look_alpha(0.05, 1, 1) == pytest.approx(0.1)
    with pytest.raises(InputError, match="^gate: max_looks: 0 must be at least 1$"):
        g.look_alpha(0.05, 0, 1)
    with pytest.raises(InputError, match="^gate: dev look 6 is beyond the 5 declared looks: no alpha left to spend$"):
        g.look_alpha(0.05, 5, 6)
    with pytest.raises(InputError, match="dev look 0"):
        g.look_alpha(0.05, 5, 0)


def test_spending_functions_spend_nothing_at_zero_and_all_at_one():
    for name in ("obf", "pocock"):
        f = g.SPENDING[name]
        assert f(0.0, 0.025) == 0.0 and f(1.0, 0.025) == pytest.approx(0.025)
        assert 0 < f(0.5, 0.025) < 0.025
    # O'Brien-Fleming at t = 1/4: 2 (1 - Phi(z_{1-a/2} / sqrt(t)))
    assert g.SPENDING["obf"](0.25, 0.05) == pytest.approx(2 * (1 - N01.cdf(N01.inv_cdf(0.975) * 2)))
    assert g.SPENDING["pocock"](0.5, 0.05) == pytest.approx(0.05 * math.log(1 + (math.e - 1) / 2))


def test_efficacy_levels_spend_exactly_under_the_null():
    """Monte Carlo of a Brownian motion seen at the looks: the crossing rate at each look matches what the spending
    function allots to it."""
    fr, alpha = [0.25, 0.5, 1.0], 0.05
    levels = g.efficacy_levels(fr, alpha, "pocock")
    rng = np.random.default_rng(0)
    n = 400_000
    inc = rng.normal(size=(n, 3)) * np.sqrt(np.diff([0.0] + fr))
    z = np.cumsum(inc, axis=1) / np.sqrt(fr)
    crit = np.array([N01.inv_cdf(1 - p) for p in levels])
    crossed = z >= crit
    first = np.where(crossed.any(axis=1), crossed.argmax(axis=1), -1)
    spent = [g.SPENDING["pocock"](t, alpha) for t in fr]
    allot = np.diff([0.0] + spent)
    for k in range(3):
        rate = np.mean(first == k)
        assert rate == pytest.approx(allot[k], abs=4 * math.sqrt(allot[k] / n) + 2e-4), (k, rate, allot[k])


def test_efficacy_levels_refuse_fractions_that_do_not_reach_one():
    with pytest.raises(InputError, match=r"^gate: looks: fractions \(0.5, 0.9\) must increase to 1$"):
        g.efficacy_levels([0.5, 0.9], 0.025)
    with pytest.raises(InputError, match="must increase to 1"):
        g.efficacy_levels([], 0.025)
    with pytest.raises(InputError, match="must increase to 1"):
        g.efficacy_levels([0.5, 0.5, 1.0], 0.025)
    with pytest.raises(InputError, match=r"^gate: spending: 'x' is not one of obf, pocock$"):
        g.efficacy_levels([1.0], 0.025, "x")


def test_sequential_design_validation_messages():
    with pytest.raises(InputError, match=r"^gate: sequential.looks: True is not an integer >= 1$"):
        g.SequentialDesign(looks=True)
    with pytest.raises(InputError, match=r"^gate: sequential.looks: 2.0 is not an integer >= 1$"):
        g.SequentialDesign(looks=2.0)
    with pytest.raises(InputError, match=r"^gate: sequential.spending: 'x' is not one of obf, pocock$"):
        g.SequentialDesign(spending="x")
    with pytest.raises(InputError, match=r"^gate: sequential.by: 'x' is not one of seeds, items$"):
        g.SequentialDesign(by="x")
    assert g.SequentialDesign(looks=np.int64(2)).on
    d = g.SequentialDesign()
    assert (d.looks, d.spending, d.by) == (1, "pocock", "seeds")


def test_sequential_groups_by_items_in_hash_order_and_fractions_by_cells():
    import hashlib

    its = [f"t{i}" for i in range(7)]
    design = g.SequentialDesign(3, "pocock", "items")
    groups = design.groups(its, [0, 1])
    order = sorted(its, key=lambda i: hashlib.sha256(i.encode()).hexdigest())
    assert [x for grp in groups for x in grp[0]] == order
    assert [len(grp[0]) for grp in groups] == [3, 2, 2] and all(grp[1] == [0, 1] for grp in groups)
    assert design.fractions(its, [0, 1]) == pytest.approx([3 / 7, 5 / 7, 1.0])
    assert len(g.SequentialDesign(5, "pocock", "items").groups(its[:2], [0])) == 2
    by_seeds = g.SequentialDesign(2, "pocock", "seeds")
    assert by_seeds.groups(["a"], [4, 5, 6]) == [(["a"], [4, 5]), (["a"], [6])]
    assert by_seeds.fractions(["a", "b"], [4, 5, 6]) == pytest.approx([2 / 3, 1.0])


def test_look_verdict_interim_z_bound_and_its_figures():
    d = np.array([0.2, 0.1, 0.3, 0.0, 0.25, 0.15])
    levels = [0.01, 0.02, 0.03]
    cfg = GateConfig(n_boot=1000, reg_cap=5)
    verdict, why, fig = g.look_verdict(d, 1, levels, cfg)
    se = np.std(d, ddof=1) / math.sqrt(len(d))
    z = N01.inv_cdf(1 - 0.01)
    assert fig["lo"] == pytest.approx(d.mean() - z * se) and fig["hi"] == pytest.approx(d.mean() + z * se)
    assert fig == {**fig, "look": 1, "n_looks": 3, "n_items": 6, "level": 0.01, "regressed": 0}
    assert fig["net"] == pytest.approx(d.mean())
    assert verdict is True
    assert why == (
        f"net {d.mean():+.4f}, lower bound {fig['lo']:+.4f} at one-sided level 0.01000 at look 1 of 3, 0 regressed"
    )
    # the same mean with a wider spread does not clear the bound at this level: go on
    wide = np.array([0.9, -0.5, 0.6, -0.4, 0.7, -0.3])
    verdict, why, fig = g.look_verdict(wide, 1, levels, cfg)
    assert verdict is None and why == "" and fig["lo"] < 0 < fig["net"]


def test_look_verdict_interim_with_no_spread_and_too_few_items():
    cfg = GateConfig(n_boot=1000, min_items=5)
    v, _, fig = g.look_verdict(np.full(6, 0.2), 1, [0.01, 0.02], cfg)
    assert v is True and fig["lo"] == pytest.approx(0.2) and fig["hi"] == pytest.approx(0.2)
    v, why, fig = g.look_verdict(np.zeros(6), 1, [0.01, 0.02], cfg)
    assert v is False and fig["lo"] == 0 and fig["hi"] == 0 and "futility" in why
    assert why == "net +0.0000, lower bound -0.0000 at look 1 of 2: net so far is not positive (futility)"
    v, why, fig = g.look_verdict(np.full(4, 0.2), 1, [0.01, 0.02], cfg)  # 4 < min_items: no bound yet
    assert v is None and fig["lo"] == -math.inf and fig["hi"] == math.inf


def test_look_verdict_last_look_is_the_bootstrap_at_its_level():
    d = np.array([1.0] * 12 + [0.0] * 8)
    cfg = GateConfig(n_boot=20_000, reg_cap=20, material=0.05)
    v, why, fig = g.look_verdict(d - 0.3, 2, [0.001, 0.05], cfg)
    # d - 0.3 = Binomial(20, 0.6)/20 - 0.3: the 5% quantile of the resample mean is about 0.40 - 0.3
    assert fig["lo"] == pytest.approx(stats.binom.ppf(0.05, 20, 0.6) / 20 - 0.3, abs=0.051)
    assert fig["hi"] == pytest.approx(stats.binom.ppf(0.95, 20, 0.6) / 20 - 0.3, abs=0.051)
    assert v is True and "at look 2 of 2" in why
    v, why, _ = g.look_verdict(d - 0.6, 2, [0.001, 0.05], cfg)
    assert v is False and why.endswith("at look 2 of 2: does not clear zero (ties keep the parent)")


def test_look_verdict_vetoes_and_regression_caps():
    cfg = GateConfig(n_boot=1000, reg_cap=2, reg_share=0.0)
    win = np.array([0.4] * 20 + [-0.1] * 3)
    v, why, _ = g.look_verdict(np.full(10, 0.4), 2, [0.01, 0.02], cfg, leakage=True)
    assert (v, why) == (False, "leakage")
    v, why, _ = g.look_verdict(np.full(10, 0.4), 2, [0.01, 0.02], cfg, mechanism_fired=False)
    assert (v, why) == (False, "the prescribed mechanism did not fire")
    # an interim look never accepts without the mechanism, but it does not reject for it either
    v, _, _ = g.look_verdict(np.full(10, 0.4), 1, [0.01, 0.02], cfg, mechanism_fired=False)
    assert v is None
    # final items: 3 regressions over the cap reject at an interim look, counted against the cap of all items
    v, why, _ = g.look_verdict(win, 1, [0.01, 0.02], cfg, n_total=40)
    assert v is False and why == "3 regressed items > reg_cap 2 at look 1 of 2"
    share = GateConfig(n_boot=1000, reg_cap=2, reg_share=0.1)
    v, why, _ = g.look_verdict(win, 1, [0.01, 0.02], share, n_total=40)  # cap of 40 items is 4: not over it yet,
    assert v is None  # but 3 are over the cap of the 23 seen (2): no early accept
    v, _, _ = g.look_verdict(win, 1, [0.01, 0.02], GateConfig(n_boot=1000, reg_cap=3, reg_share=0.0), n_total=40)
    assert v is True
    v, why, _ = g.look_verdict(win, 1, [0.01, 0.02], cfg, final_items=False, n_total=40)
    assert v is None  # by seeds an interim regression is not final; over the cap now, so no accept either
    v, why, _ = g.look_verdict(win, 2, [0.01, 0.02], cfg)
    assert v is False and why == "3 regressed items > reg_cap 2 at look 2 of 2"
    v, _, _ = g.look_verdict(np.array([0.4] * 20 + [-0.1] * 2), 2, [0.01, 0.02], cfg)
    assert v is True


def test_sequential_decide_refuses_group_sizes_that_do_not_cover_the_items():
    with pytest.raises(InputError, match=r"^gate: looks: group sizes \[3, 3\] do not add up to 7 items$"):
        g.sequential_decide(per([0.1] * 7), GateConfig(n_boot=1000), [3, 3])
    with pytest.raises(InputError, match="group sizes"):
        g.sequential_decide(per([0.1] * 7), GateConfig(n_boot=1000), [8, -1])
    with pytest.raises(InputError, match="group sizes"):
        g.sequential_decide(per([0.1] * 7), GateConfig(n_boot=1000), [7, 0])


def test_sequential_decide_records_each_look():
    d = [0.09, -0.07] * 10 + [0.5] * 20  # look 1: net +0.01 with a wide spread (go on); look 2: a clear win
    res = g.sequential_decide(per(d), GateConfig(n_boot=2000, alpha=0.05, material=0.1), [20, 20], "pocock")
    assert res.n_looks == 2 and res.n_items == 40
    assert [lk["n"] for lk in res.looks] == list(range(20, 20 * res.look + 1, 20))
    assert set(res.looks[0]) == {"look", "level", "lo", "net", "regressed", "n"}
    assert res.reason.endswith(f"({res.n_seen} of 40 items)")
    assert res.accept and res.look == 2 and res.n_seen == 40
    assert res.looks[0]["net"] == pytest.approx(0.01) and res.looks[1]["net"] == pytest.approx(np.mean(d))


def test_sequential_gate_figures_and_refusal():
    items, seeds = [f"t{i:02d}" for i in range(10)], [0, 1]
    d = {i: [0.3, 0.3] for i in items}
    b, c = arms(d, base=0.4)
    cfg = GateConfig(n_boot=1000, alpha=0.05)
    design = g.SequentialDesign(2, "pocock", "seeds")
    res, p, rec = g.sequential_gate(b, c, cfg, design, items, seeds)
    assert res.accept and rec["looks_used"] == 1 and rec["stopped_early"] is True
    assert (rec["looks"], rec["spending"], rec["by"]) == (2, "pocock", "seeds") and rec["why"] == res.reason
    assert (res.n_items, res.n_improved, res.n_regressed) == (10, 10, 0)
    assert res.base_mean == pytest.approx(0.4) and res.cand_mean == pytest.approx(0.7)
    assert res.net == pytest.approx(0.3) and len(rec["per_look"]) == 1 and len(p) == 10
    # look 1 evaluated with most pairs errored: a refusal that stops the gate
    errs = {("cand", i, 0): "x" for i in items[:6]}
    b, c = arms(d, base=0.4, errors=errs)
    res, p, rec = g.sequential_gate(b, c, cfg, design, items, seeds)
    assert not res.accept and res.refused and res.reason.startswith("refused: 6 of 10")
    assert rec["looks_used"] == 1 and rec["stopped_early"] is True and rec["why"] == res.reason and p.empty
    # a mechanism that fired only by look 2 is read per look
    b, c = arms({i: [0.3, 0.3] for i in items}, base=0.4)
    res, _, rec = g.sequential_gate(b, c, cfg, design, items, seeds, fired_by_look=[False, True])
    assert res.accept and rec["looks_used"] == 2 and rec["stopped_early"] is False


def test_repair_look_branches():
    levels = [0.01, 0.02, 0.03]
    ok, why = g.repair_look(np.array([0.2, 0.3, 0.25, 0.2, 0.3]), 1, levels, 0.05)
    d = np.array([0.2, 0.3, 0.25, 0.2, 0.3])
    lo = d.mean() - N01.inv_cdf(0.99) * d.std(ddof=1) / math.sqrt(5)
    assert ok is True and why == f"clear repair at look 1 of 3: mean gain {d.mean():+.3f}, lower bound {lo:+.3f}"
    ok, why = g.repair_look(np.array([0.1, -0.1]), 2, levels, 0.05)
    assert ok is False and why == "mean gain +0.000 not positive at look 2 of 3 (futility)"
    assert g.repair_look(np.array([0.5]), 1, levels, 0.05) == (None, "")  # one item: no spread, no early pass
    assert g.repair_look(np.array([0.9, -0.5, 0.6, -0.4]), 1, levels, 0.05) == (None, "")
    # more broken than repaired with a positive mean: not a clear pass whatever the bound
    assert g.repair_look(np.array([0.04] * 30 + [-0.06] * 2), 1, [0.4, 0.5], 0.05)[0] is None
    assert g.repair_look(np.array([0.3, -0.1]), 3, levels, 0.05) == (False, "look 3 of 3 (full screen)")
    assert g.repair_look(np.array([0.3, -0.1, 0.1]), 3, levels, 0.05) == (True, "look 3 of 3 (full screen)")
    assert g.repair_look(np.array([0.3, 0.0]), 3, levels, 0.05)[0] is True


def test_sequential_repair_records_and_skips_errored_interim_looks():
    items, seeds = [f"t{i:02d}" for i in range(6)], [0, 1]
    design = g.SequentialDesign(2, "pocock", "seeds")
    b, c = arms({i: [0.3, 0.3] for i in items}, base=0.3)
    res, p, rec = g.sequential_repair(b, c, 0.05, 0.05, design, items, seeds)
    assert res.ok and rec["looks_used"] == 1 and rec["stopped_early"] is True and len(p) == 6
    assert rec["why"].startswith("clear repair at look 1 of 2")
    assert res.reason == ("repaired 6, broke 0 of 6 source items (mean 0.300 -> 0.600); " + rec["why"])
    assert (rec["looks"], rec["spending"], rec["by"]) == (2, "pocock", "seeds")
    # look 1 mostly errored: skipped, and the full screen at look 2 decides
    errs = {("cand", i, 0): "x" for i in items[:4]}
    b, c = arms({i: [0.3, 0.3] for i in items}, base=0.3, errors=errs)
    res, p, rec = g.sequential_repair(b, c, 0.05, 0.05, design, items, seeds)
    assert rec["looks_used"] == 2 and rec["stopped_early"] is False and rec["why"] == "look 2 of 2 (full screen)"
    assert res.ok and res.n_items == 6
    # a look not evaluated yet: no verdict, an empty table
    res, p, rec = g.sequential_repair(b[b["seed"] == 5], c, 0.05, 0.05, design, items, seeds)
    assert res is None and p.empty and rec["looks_used"] == 0


# -- second pass: survivors of the first run of these tests ----------------------------------------------------------


def test_ci_ends_are_the_two_quantiles_of_the_resample_mean():
    """0/1 over 200 items: the resample mean is Binomial(200, 0.6) / 200 (grid 0.005); each end within a grid step
    of its exact quantile, at two levels (an asymmetric level would move one end by more)."""
    d = np.array([1.0] * 120 + [0.0] * 80)
    for alpha in (0.2, 0.05):
        lo, hi = g.bootstrap_ci(d, 40_000, alpha, 3)
        assert lo == pytest.approx(stats.binom.ppf(alpha / 2, 200, 0.6) / 200, abs=0.0051)
        assert hi == pytest.approx(stats.binom.ppf(1 - alpha / 2, 200, 0.6) / 200, abs=0.0051)


def test_decide_draws_with_the_configured_seed_and_reads_d_as_numbers():
    d = np.random.default_rng(1).normal(0.2, 0.3, 40)
    a = g.decide(per(d), GateConfig(n_boot=1000, seed=7, reg_cap=40))
    assert a == g.decide(per(d), GateConfig(n_boot=1000, seed=7, reg_cap=40))
    assert (a.ci_lo, a.ci_hi) != (
        g.decide(per(d), GateConfig(n_boot=1000, seed=8, reg_cap=40)).ci_lo,
        g.decide(per(d), GateConfig(n_boot=1000, seed=8, reg_cap=40)).ci_hi,
    )
    assert (a.ci_lo, a.ci_hi) != (
        g.decide(per(d), GateConfig(n_boot=1000, seed=0, reg_cap=40)).ci_lo,
        g.decide(per(d), GateConfig(n_boot=1000, seed=0, reg_cap=40)).ci_hi,
    )
    # a per-item table read as text (a CSV read with dtype=str) decides the same
    as_text = per(d).astype({"d": str})
    assert g.decide(as_text, GateConfig(n_boot=1000, seed=7, reg_cap=40)).accept == a.accept
    assert g.decide(as_text, GateConfig(n_boot=1000, seed=7, reg_cap=40)).net == pytest.approx(a.net)


def test_gate_refusal_figures_are_all_zero_and_the_mechanism_veto_is_passed_on():
    b, c = arms({f"i{k}": [0.3] for k in range(6)}, errors={("cand", f"i{k}", 0): "x" for k in range(4)})
    res, _ = g.gate(b, c, GateConfig(n_boot=1000))
    assert (res.net, res.ci_lo, res.ci_hi, res.n_items, res.n_improved, res.n_regressed) == (0.0, 0.0, 0.0, 0, 0, 0)
    assert (res.base_mean, res.cand_mean) == (0.0, 0.0)
    b, c = arms({f"i{k}": [0.3] for k in range(8)})
    assert g.gate(b, c, GateConfig(n_boot=1000))[0].accept
    res, _ = g.gate(b, c, GateConfig(n_boot=1000), mechanism_fired=False)
    assert not res.accept and res.reason == "the prescribed mechanism did not fire"
    res, _ = g.gate(b, c, GateConfig(n_boot=1000), leakage=True)
    assert not res.accept and res.reason == "leakage"


def test_sequential_decide_takes_single_item_groups_and_the_named_spending():
    res = g.sequential_decide(per([0.3] * 7), GateConfig(n_boot=1000, alpha=0.05), [1, 6], "pocock")
    assert res.n_looks == 2 and res.looks[0]["n"] == 1
    # two equal looks at one-sided 0.025: Pocock's first nominal level is about 0.0155, O'Brien-Fleming's 0.0015
    poc = g.sequential_decide(
        per([0.1, -0.02] * 10), GateConfig(n_boot=1000, alpha=0.05, reg_cap=20), [10, 10], "pocock"
    )
    obf = g.sequential_decide(per([0.1, -0.02] * 10), GateConfig(n_boot=1000, alpha=0.05, reg_cap=20), [10, 10], "obf")
    assert poc.looks[0]["level"] == pytest.approx(0.0155, rel=0.03)
    assert obf.looks[0]["level"] == pytest.approx(0.0015, rel=0.1)


def test_sequential_gate_waiting_and_refusing_return_an_empty_per_item_table_and_a_clean_record():
    items, seeds = [f"t{i:02d}" for i in range(10)], [0, 1]
    b, c = arms({i: [0.3, 0.3] for i in items}, base=0.4)
    design = g.SequentialDesign(2, "pocock", "seeds")
    cfg = GateConfig(n_boot=1000)
    verdict, p, rec = g.sequential_gate(b.iloc[:0], c.iloc[:0], cfg, design, items, seeds)
    assert verdict is None and p.empty and list(p.columns) == ["item_id", "base", "cand", "d"]
    assert rec == {
        "looks": 2,
        "spending": "pocock",
        "by": "seeds",
        "looks_used": 0,
        "stopped_early": False,
        "why": "",
        "per_look": [],
    }
    b, c = arms({i: [0.3, 0.3] for i in items}, base=0.4, errors={("cand", i, 0): "x" for i in items[:6]})
    res, p, _ = g.sequential_gate(b, c, cfg, design, items, seeds)
    assert p.empty and list(p.columns) == ["item_id", "base", "cand", "d"]
    assert (res.net, res.ci_lo, res.ci_hi, res.n_items, res.n_improved, res.n_regressed) == (0.0, 0.0, 0.0, 0, 0, 0)


def test_last_look_names_the_cap_of_the_items_it_compared():
    """At the last look the cap is that of the items compared (errored items dropped), not of all declared items."""
    share = GateConfig(n_boot=1000, reg_cap=0, reg_share=0.1)
    d = np.array([0.4] * 17 + [-0.1] * 3)
    v, why, _ = g.look_verdict(d, 2, [0.01, 0.02], share, n_total=40)
    assert v is False and why == "3 regressed items > reg_cap 2 at look 2 of 2"


def test_sequential_gate_passes_on_leakage_reads_by_items_as_final_and_records_each_look():
    items, seeds = [f"t{i:02d}" for i in range(30)], [0, 1]
    cfg = GateConfig(n_boot=1000, alpha=0.05, reg_share=0.0)
    b, c = arms({i: [0.3, 0.3] for i in items}, base=0.4)
    res, _, rec = g.sequential_gate(b, c, cfg, g.SequentialDesign(2, "pocock", "seeds"), items, seeds, leakage=True)
    assert not res.accept and res.reason == "leakage"
    res, _, rec = g.sequential_gate(b, c, cfg, g.SequentialDesign(2, "pocock", "seeds"), items, seeds)
    look = rec["per_look"][0]
    assert (look["look"], look["n_looks"], look["n_items"], look["regressed"]) == (1, 2, 30, 0)
    assert look["net"] == pytest.approx(0.3) and res.ci_lo == look["lo"] and res.ci_hi == look["hi"]
    # by items the first look's regressions are final: 3 over the cap of 2 reject there
    by_items = g.SequentialDesign(3, "pocock", "items")
    first = set(by_items.groups(items, seeds)[0][0])
    bad = {i: ([-0.3, -0.3] if i in sorted(first)[:3] else [0.3, 0.3]) for i in items}
    b, c = arms(bad, base=0.4)
    res, _, rec = g.sequential_gate(b, c, cfg, by_items, items, seeds)
    assert not res.accept and rec["looks_used"] == 1 and "3 regressed items > reg_cap 2" in res.reason


def test_repair_look_boundaries():
    # exactly -material is not broken: one repair against none passes the full screen
    assert g.repair_look(np.array([0.5, -0.0625]), 2, [0.01, 0.02], 0.0625)[0] is True
    # two items already have a spread: a tight pair clears the bound at an interim look
    ok, why = g.repair_look(np.array([0.3, 0.31]), 1, [0.01, 0.02], 0.05)
    assert ok is True and why.startswith("clear repair at look 1 of 2")
    # as many broken as repaired is not a clear repair, however tight the mean gain
    assert g.repair_look(np.array([0.2, -0.06] + [0.04] * 30), 1, [0.01, 0.02], 0.05) == (None, "")


def test_sequential_repair_waiting_record_and_early_means():
    items, seeds = [f"t{i:02d}" for i in range(6)], [0, 1]
    design = g.SequentialDesign(2, "pocock", "seeds")
    b, c = arms({i: [0.3, 0.3] for i in items}, base=0.3)
    res, p, rec = g.sequential_repair(b.iloc[:0], c, 0.05, 0.05, design, items, seeds)
    assert res is None and list(p.columns) == ["item_id", "base", "cand", "d"]
    assert rec == {"looks": 2, "spending": "pocock", "by": "seeds", "looks_used": 0, "stopped_early": False, "why": ""}
    res, _, _ = g.sequential_repair(b, c, 0.05, 0.05, design, items, seeds)
    assert res.base_mean == pytest.approx(0.3) and res.cand_mean == pytest.approx(0.6) and res.n_items == 6


@pytest.mark.parametrize("d", [[0.0, 0.5, 1.0, 0.5], [0.0, math.sqrt(2) / 10, math.pi / 10]])
def test_boot_means_are_reproducible_from_their_seed(d):
    a = g.boot_means(np.array(d), 2000, 5)
    assert np.array_equal(a, g.boot_means(np.array(d), 2000, 5))
    assert not np.array_equal(a, g.boot_means(np.array(d), 2000, 6))


def test_scores_read_as_text_pair_as_numbers_and_out_of_range_lists_five():
    b, c = arms({f"i{k}": [0.25, 0.25] for k in range(5)}, base=0.5)
    p, _ = g.pair(b.astype({"score": str}), c.astype({"score": str}))
    assert np.allclose(p["d"], 0.25) and np.allclose(p["base"], 0.5)
    b, c = arms({f"i{k}": [0.1] for k in range(7)})
    with pytest.raises(PairingError) as e:
        g.pair(b, c.assign(score=1.5))
    assert str(e.value) == "cand: score outside [0, 1] for i0#0, i1#0, i2#0, i3#0, i4#0"


def test_repair_screen_refusal_is_a_plain_no_with_an_empty_table():
    b, c = arms(
        {"a": [0.3, 0.3], "b": [0.3, 0.3]}, errors={("cand", "a", 0): "x", ("cand", "a", 1): "y", ("cand", "b", 0): "z"}
    )
    res, p = g.repair_screen(b, c)
    assert res.ok is False and (res.repaired, res.broken, res.base_mean, res.cand_mean) == (0, 0, 0.0, 0.0)
    assert list(p.columns) == ["item_id", "base", "cand", "d"] and p.empty


def test_missing_error_cells_are_not_errors():
    b, c = arms({f"i{k}": [0.3] for k in range(5)}, errors={})
    b["error"], c["error"] = None, float("nan")
    p, dropped = g.pair(b, c)
    assert dropped == 0 and len(p) == 5


def test_decide_d_counts_no_dropped_pair_unless_told():
    res = g.decide_d(np.array([0.3] * 6), GateConfig(n_boot=1000))
    assert res.dropped_errors == 0 and not res.refused


def test_a_sequential_verdict_counts_the_pairs_it_dropped():
    """Look 1 (seed 0) holds one errored pair, look 2 (seed 1) none: the deciding look reports the one it dropped."""
    items, seeds = [f"t{i:02d}" for i in range(10)], [0, 1]
    b, c = arms({i: [0.3, 0.3] for i in items}, base=0.4, errors={("cand", "t03", 0): "x"})
    cfg = GateConfig(n_boot=1000, alpha=0.05)
    res, _, rec = g.sequential_gate(b, c, cfg, g.SequentialDesign(2, "pocock", "seeds"), items, seeds)
    assert res.accept and res.dropped_errors == 1 and not res.refused and rec["looks_used"] == 1


def test_an_interim_look_by_items_caps_regressions_for_every_item():
    """By items, an interim look's regressions are final, and the cap they are held to is the cap for all the items
    (reg_share x 20 = 4), not for the items seen so far (x 10 = 2): 3 regressions in look 1 go on to look 2."""
    items, seeds = [f"t{i:02d}" for i in range(20)], [0]
    design = g.SequentialDesign(2, "pocock", "items")
    first = design.groups(items, seeds)[0][0]
    d = {i: [-0.3] if i in first[:3] else [0.3] for i in items}
    b, c = arms(d, base=0.4)
    cfg = GateConfig(n_boot=1000, alpha=0.05, reg_cap=0, reg_share=0.2)
    res, _, rec = g.sequential_gate(b, c, cfg, design, items, seeds)
    assert len(first) == 10 and rec["per_look"][0]["regressed"] == 3
    assert rec["looks_used"] == 2 and res.n_regressed == 3 and res.accept
