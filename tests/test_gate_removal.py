"""A card removal's verdict (components/evolution/gate.py::removal_decide), in-process and fast: every figure of the
result on small tables worked out by hand, each branch of the reason, each boundary of the accept rule (material,
the token CI's upper end, the regression cap), and which episodes the token means read (errored ones are not)."""

from __future__ import annotations

import pandas as pd
import pytest

from components.evolution.gate import GateConfig, PairingError, bootstrap_ci, removal_decide

# quarters are exact in binary: d = -0.25 sits exactly on -material
CFG = GateConfig(n_boot=1000, material=0.25, reg_cap=0, reg_share=0.0, min_items=5)


def arm(
    scores: list[float], tokens: list[float], *, seeds: int = 1, errors: dict | None = None, ids=None
) -> pd.DataFrame:
    """One row per (item, seed); `scores`/`tokens` per item (every seed the same) unless given per row."""
    ids = ids if ids is not None else [f"i{k:02d}" for k in range(len(scores))]
    rows = [
        {"item_id": i, "seed": s, "score": sc, "tokens_in": tk, "error": (errors or {}).get((i, s))}
        for i, sc, tk in zip(ids, scores, tokens)
        for s in range(seeds)
    ]
    return pd.DataFrame(rows)


def test_an_accepted_removal_carries_every_figure():
    d = [0.0] * 11 + [-0.25]  # one item loses exactly `material`: not a regression (strictly below is)
    t = [-100.0] * 11 + [-50.0]
    base = arm([1.0] * 12, [1000.0] * 12).drop(columns="error")  # no error column at all
    cand = arm([1.0 + x for x in d], [1000.0 + x for x in t]).drop(columns="error")
    v = removal_decide(base, cand, CFG)
    lo, hi = bootstrap_ci(pd.Series(d).to_numpy(), 1000, 0.05, 0)
    tlo, thi = bootstrap_ci(pd.Series(t).to_numpy(), 1000, 0.05, 0)
    assert v.accept
    assert (v.ci_lo, v.ci_hi, v.tokens_ci_lo, v.tokens_ci_hi) == (lo, hi, tlo, thi)
    assert lo > -0.25 and thi < 0
    assert v.net == pytest.approx(-0.25 / 12) and v.tokens_net == pytest.approx(-1150 / 12)
    assert v.base_tokens == 1000.0 and v.cand_tokens == pytest.approx(1000 - 1150 / 12)
    assert (v.n_items, v.n_regressed) == (12, 0)
    assert v.base_mean == 1.0 and v.cand_mean == pytest.approx(11.75 / 12)
    assert v.reason == (
        f"score net {-0.25 / 12:+.4f} CI [{lo:+.4f}, {hi:+.4f}] within -0.25; prompt tokens "
        f"{-1150 / 12:+.1f} per episode CI [{tlo:+.1f}, {thi:+.1f}]"
    )
    assert v.as_dict()["accept"] is True and v.as_dict()["n_items"] == 12
    # the default config is GateConfig()'s
    assert removal_decide(base, cand) == removal_decide(base, cand, GateConfig())


def test_a_score_ci_reaching_minus_material_keeps_the_parent():
    base = arm([1.0] * 6, [1000.0] * 6)
    cand = arm([0.75] * 6, [500.0] * 6)  # every item exactly -material: the CI is [-0.25, -0.25], not above it
    v = removal_decide(base, cand, CFG)
    assert not v.accept and (v.ci_lo, v.ci_hi) == (-0.25, -0.25) and v.n_regressed == 0
    assert v.reason == "score CI [-0.2500, -0.2500] reaches below -material 0.25 (the parent is kept)"
    assert (v.tokens_ci_lo, v.tokens_ci_hi, v.tokens_net) == (-500.0, -500.0, -500.0)


def test_no_token_drop_keeps_the_parent_even_when_the_score_holds():
    base = arm([0.5] * 6, [1000.0] * 6)
    v = removal_decide(base, arm([0.5] * 6, [1000.0] * 6), CFG)  # a tie on tokens: the CI's upper end is 0
    assert not v.accept and (v.tokens_ci_lo, v.tokens_ci_hi) == (0.0, 0.0)
    assert v.reason == "prompt tokens CI [+0.0, +0.0] per episode does not show a drop (ties keep the parent)"
    v = removal_decide(base, arm([0.5] * 6, [1000.0] * 5 + [1600.0]), CFG)  # dearer on one item
    assert not v.accept and v.tokens_ci_hi > 0 and v.tokens_net == 100.0
    assert v.reason.startswith("prompt tokens CI [") and v.reason.endswith(
        "does not show a drop (ties keep the parent)"
    )


def test_regressions_over_the_cap_keep_the_parent():
    d = [0.0] * 11 + [-0.5]  # one item below -material: one regression, the score CI still above -material
    base = arm([1.0] * 12, [1000.0] * 12)
    cand = arm([1.0 + x for x in d], [900.0] * 12)
    v = removal_decide(base, cand, CFG)
    assert v.ci_lo > -0.25 and v.tokens_ci_hi < 0 and v.n_regressed == 1
    assert not v.accept and v.reason == "1 regressed items > reg_cap 0"
    one = GateConfig(n_boot=1000, material=0.25, reg_cap=1, min_items=5)
    assert removal_decide(base, cand, one).accept  # the cap is inclusive
    share = GateConfig(n_boot=1000, material=0.25, reg_cap=0, reg_share=1 / 12, min_items=5)
    assert removal_decide(base, cand, share).accept  # the cap grows with the items compared


def test_errored_episodes_are_left_out_of_the_scores_and_the_token_means():
    ids = [f"i{k}" for k in range(6)]
    base = arm([0.5] * 6, [1000.0] * 6, seeds=2, errors={("i0", 1): "boom"}, ids=ids)
    base.loc[(base["item_id"] == "i0") & (base["seed"] == 1), ["score", "tokens_in"]] = [0.0, 99_000.0]
    cand = arm([0.5] * 6, [800.0] * 6, seeds=2, ids=ids)
    cfg = GateConfig(n_boot=1000, material=0.25, reg_cap=0, min_items=5, max_error_share=0.5)
    v = removal_decide(base, cand, cfg)
    # the errored episode's 99,000 tokens are not read (an error cell left empty, None, is not an error)
    assert v.base_tokens == 1000.0 and v.cand_tokens == 800.0 and v.tokens_net == -200.0
    assert (v.tokens_ci_lo, v.tokens_ci_hi) == (-200.0, -200.0)
    assert (v.net, v.n_items, v.base_mean, v.cand_mean) == (0.0, 6, 0.5, 0.5) and v.accept
    assert base["error"].isna().sum() == 11  # what the test relies on: empty cells read as NaN


def test_item_ids_are_matched_as_text_whatever_their_type():
    base = arm([0.5] * 6, [1000.0] * 6, ids=list(range(6)))
    cand = arm([0.5] * 6, [1000.0 - 10 * k for k in range(6)], ids=list(range(6)))
    v = removal_decide(base, cand, CFG)
    assert v.tokens_net == -25.0 and v.base_tokens == 1000.0 and v.cand_tokens == 975.0 and v.n_items == 6


@pytest.mark.parametrize("side", ["base", "cand"])
def test_a_table_without_token_counts_is_refused_naming_its_side(side):
    tables = {"base": arm([0.5] * 6, [1000.0] * 6), "cand": arm([0.5] * 6, [900.0] * 6)}
    tables[side] = tables[side].drop(columns="tokens_in")
    with pytest.raises(PairingError, match=f"^{side}: missing column tokens_in$"):
        removal_decide(tables["base"], tables["cand"], CFG)


def test_a_removal_pairs_like_the_gate():
    with pytest.raises(PairingError, match="needs at least 5"):
        removal_decide(arm([0.5] * 4, [1000.0] * 4), arm([0.5] * 4, [900.0] * 4), CFG)


def test_both_intervals_are_drawn_with_the_configs_seed():
    offs = [0.013 * k - 0.04 for k in range(12)]  # distinct values: the CIs depend on the draws
    toks = [-37.0 * k - 11.0 * (k % 3) for k in range(12)]
    base = arm([0.5] * 12, [1000.0] * 12)
    cand = arm([0.5 + o for o in offs], [1000.0 + t for t in toks])
    d = pd.Series([(0.5 + o) - 0.5 for o in offs]).to_numpy()
    t = pd.Series([(1000.0 + x) - 1000.0 for x in toks]).to_numpy()
    cfg = GateConfig(n_boot=1000, material=0.25, reg_cap=0, min_items=5, seed=7)
    v = removal_decide(base, cand, cfg)
    assert (v.ci_lo, v.ci_hi) == bootstrap_ci(d, 1000, 0.05, 7) != bootstrap_ci(d, 1000, 0.05, 0)
    assert (v.tokens_ci_lo, v.tokens_ci_hi) == bootstrap_ci(t, 1000, 0.05, 7) != bootstrap_ci(t, 1000, 0.05, 0)


def test_an_item_dropped_whole_by_errors_is_not_compared_on_tokens():
    """Every episode of i5 errored in base: the pairing drops the item, and its candidate tokens are not compared."""
    ids = [f"i{k}" for k in range(6)]
    base = arm([0.5] * 6, [1000.0] * 6, errors={("i5", 0): "boom"}, ids=ids)
    cand = arm([0.5] * 6, [900.0] * 5 + [5000.0], ids=ids)
    cfg = GateConfig(n_boot=1000, material=0.25, reg_cap=0, min_items=5, max_error_share=0.5)
    v = removal_decide(base, cand, cfg)
    assert v.n_items == 5 and v.tokens_net == -100.0 and (v.tokens_ci_lo, v.tokens_ci_hi) == (-100.0, -100.0)
    assert v.accept
