"""`ratchet power`: the gate's minimum detectable effect, checked against the gate's own bootstrap by simulation."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from components.errors import InputError
from components.evolution.power import Variance, components, mde, simulated_power
from tests.conftest import run_cli


@pytest.mark.parametrize(
    "n_items,trials,var",
    [
        (40, 1, Variance(0.0, 0.707, "binary rewards at p=0.5")),
        (20, 4, Variance(0.0, 0.707, "binary rewards at p=0.5")),
        (40, 4, Variance(0.15, 0.5, "mixed")),
    ],
    ids=["retail-40x1", "airline-20x4", "mixed-40x4"],
)
def test_the_gate_accepts_an_effect_of_the_mde_with_the_stated_power(n_items, trials, var):
    delta = mde(n_items, trials, var)
    got = simulated_power(delta, n_items, trials, var, reps=400, n_boot=1000)
    assert 0.72 <= got <= 0.88, got  # 80% by the formula; 400 reps: SE 2 points
    assert simulated_power(delta / 2, n_items, trials, var, reps=200, n_boot=1000) < 0.5  # half of it: mostly missed


def test_trials_shrink_only_the_within_item_part():
    within, between = Variance(0.0, 0.6, "x"), Variance(0.6, 0.0, "x")
    assert mde(40, 4, within) == pytest.approx(mde(40, 1, within) / 2)
    assert mde(40, 4, between) == pytest.approx(mde(40, 1, between))
    assert mde(20, 1, within) > mde(40, 1, within)


def _tables(n_items: int, trials: int, sd_item: float, sd_trial: float, seed: int = 0):
    rng = np.random.default_rng(seed)
    effect = sd_item * rng.standard_normal(n_items)
    rows_b, rows_c = [], []
    for i in range(n_items):
        for s in range(trials):
            rows_b.append({"item_id": f"i{i}", "seed": s, "score": 0.5})
            rows_c.append({"item_id": f"i{i}", "seed": s, "score": 0.5 + effect[i] + sd_trial * rng.standard_normal()})
    b, c = pd.DataFrame(rows_b), pd.DataFrame(rows_c)
    c["score"] = c["score"].clip(0, 1)
    return b, c


def test_components_separate_between_and_within_item_variance():
    b, c = _tables(2000, 3, 0.08, 0.1)
    v = components(b, c)
    assert v.sd_item == pytest.approx(0.08, abs=0.01) and v.sd_trial == pytest.approx(0.1, abs=0.01)
    one = components(b[b["seed"] == 0], c[c["seed"] == 0])  # one trial: nothing to separate, all between (cautious)
    assert one.sd_trial == 0 and one.sd_item == pytest.approx(np.hypot(0.08, 0.1), abs=0.01)
    with pytest.raises(InputError, match="not the same"):
        components(b, c.iloc[1:])


def test_power_cli_on_sds_and_on_tables(capsys, tmp_path):
    code, out, _ = run_cli(
        capsys, "power", "--items", "40", "--sd-trial", "0.707", "--trials", "1", "--trials", "4", "--json"
    )
    rows = json.loads(out)
    assert (
        code == 0
        and [r["trials"] for r in rows] == [1, 4]
        and rows[1]["mde"] == pytest.approx(rows[0]["mde"] / 2, abs=1e-5)
    )
    assert rows[0]["mde"] == pytest.approx(mde(40, 1, Variance(0, 0.707, "")), abs=1e-6)
    b, c = _tables(30, 2, 0.05, 0.1)
    b.to_csv(tmp_path / "b.csv", index=False)
    c.to_csv(tmp_path / "c.csv", index=False)
    code, out, _ = run_cli(capsys, "power", "--base", str(tmp_path / "b.csv"), "--cand", str(tmp_path / "c.csv"))
    assert code == 0 and "30 items x 1 trial(s)" in out and "tables, 2 trials per item" in out


@pytest.mark.parametrize(
    "args,msg",
    [
        (["--sd-trial", "0.5"], "--items: required"),
        (["--items", "40"], "--sd-item/--sd-trial: give at least one"),
        (["--items", "1", "--sd-trial", "0.5"], "items: 1 must be at least 2"),
        (["--items", "40", "--sd-trial", "-1"], "--sd-trial: -1.0: must be"),
        (["--items", "40", "--sd-trial", "0.5", "--trials", "0"], "trials: 0 must be at least 1"),
        (["--items", "40", "--sd-trial", "0.5", "--power", "1"], "power: 1.0 is not in"),
        (["--base", "x.csv"], "give both tables"),
    ],
)
def test_power_cli_refuses_bad_input_in_one_line(capsys, args, msg):
    code, out, err = run_cli(capsys, "power", *args)
    assert code == 2 and msg in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


@pytest.mark.parametrize(
    "mde_value,expected",
    [
        (0.1204, "minimum detectable effect on test: +0.120 (40 items x 1 trial(s)"),
        (None, "minimum detectable effect on test: not sized"),
    ],
    ids=["sized", "identical-arms"],
)
def test_the_campaign_prints_the_mde_beside_the_certification(capsys, tmp_path, mde_value, expected):
    from flows.cli import _print_summary

    test = {
        "base_mean": 0.5,
        "champion_mean": 0.6,
        "net": 0.1,
        "ci_lo": 0.02,
        "ci_hi": 0.18,
        "n_items": 40,
        "mde": mde_value,
        "mde_trials": 1,
        "mde_sd_item": 0.165,
        "mde_sd_trial": 0.219,
    }
    summary = {
        "campaign": "c",
        "history": [],
        "test": test,
        "localization": {},
        "champion": "M1",
        "champion_digest": "ab" * 32,
        "accepted": 1,
        "rounds": 1,
        "episodes": {"total": 10, "errors": 3, "by_kind": {"empty": 2, "length": 1}},
    }
    _print_summary(summary, tmp_path / "summary.json")
    out = capsys.readouterr().out.replace("\n", " ")
    assert expected in out and "errored episodes: 3 of 10 (empty 2, length 1)" in out
