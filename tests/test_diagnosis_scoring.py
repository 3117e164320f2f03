"""Scoring the diagnoser against the hidden counterfactual causes. This is the one test module that reads them
(through components.evolution.localization, their only reader), besides the perturbation benchmark."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from typer.testing import CliRunner

from components.evolution.diagnose import diagnose
from components.evolution.localization import _eid, fit_outcome_only, localization
from components.memory import load_package
from components.models.counterfactual import causes_table
from components.runtime.evaluate import run_shard
from tests.conftest import PACKAGES, ROOT

SEEDS = [0, 1]


@pytest.fixture(scope="module")
def labelled(bench):
    """(tables, hidden causes) of a shipped package on the first 30 items of a split; each computed once per module
    (the seed's train set is read by two tests; its counterfactual replays are the costly part)."""
    done = {}

    def get(name, split, n=30):
        if (name, split) not in done:
            pkg = load_package(PACKAGES / name)
            t = run_shard(pkg, bench, bench.ids(split)[:n], SEEDS)
            done[name, split] = t, causes_table(pkg, bench, t.scores)
        return done[name, split]

    return get


def test_seed_failures_cover_e_c_and_compound(labelled):
    _, causes = labelled("seed", "train")
    share = {k: v / len(causes) for k, v in Counter(causes["cause"]).items()}
    for cause in ("E", "C", "compound", "external"):
        assert share.get(cause, 0) >= 0.05, share
    fixed_alone = causes[causes["cause"].isin(["E", "C", "W", "rho"])]
    # the cause's own switch alone turned the failure into a success
    assert all(row[f"{row['cause']}_off"] == 1 for row in fixed_alone.to_dict("records"))


# all-skills on the 13-rule retail world: every card is in memory at every write, so there is no contrast to show a
# card helps, and with 2-3 rules per write its diluted turns clear a rule barely above the floor: drowned cards (rho)
# are read as ineffective (E). Judging per rule lifted it from 0.41 to 0.74; strict, so a fix is noticed.
ALL_SKILLS_GAP = pytest.mark.xfail(strict=True, reason="known gap: dilution without contrast reads as E (0.74 < 0.85)")


@pytest.mark.parametrize("name", ["seed", pytest.param("all-skills", marks=ALL_SKILLS_GAP), "none"])
def test_localization_beats_outcome_only_fitted_on_train(bench, labelled, name):
    pkg = load_package(PACKAGES / name)
    train, train_causes = labelled(name, "train")
    dev, dev_causes = labelled(name, "dev")
    d = diagnose(dev.traces, dev.scores, pkg, bench.write_tools, "test")
    loc = localization(d.findings_frame(), _eid(dev_causes), _eid(dev.scores),
                       fit_outcome_only(_eid(train_causes), _eid(train.scores)))
    assert loc["n"] >= 25
    assert loc["accuracy"] >= 0.85, loc
    assert loc["accuracy"] > loc["outcome_only_accuracy"], loc
    assert loc["coverage"] >= 0.8, loc
    assert sum(sum(row.values()) for row in loc["confusion"].values()) == loc["n"]


def test_ratchet_diagnose_prints_one_json_object(tmp_path, bench_dir):
    from flows.cli import app

    runner = CliRunner()
    items = ",".join(json.loads((bench_dir / "splits.json").read_text())["dev"][:12])
    r = runner.invoke(app, ["eval", "--package", str(PACKAGES / "seed"), "--benchmark", str(bench_dir), "--items", items,
                            "--seeds", "1", "--max-turns", "12", "--out", str(tmp_path / "ev")])
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "ev" / "meta.json").read_text())["max_turns"] == 12
    r = runner.invoke(app, ["diagnose", "--eval", str(tmp_path / "ev"), "--package", str(PACKAGES / "seed"),
                            "--benchmark", str(bench_dir), "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert {"accuracy", "n", "coverage", "outcome_only_accuracy", "confusion"} <= set(out)
    assert out["n"] == sum(sum(v.values()) for v in out["confusion"].values())


def test_bench_diagnosis_quick_prints_the_table(bench_dir, capsys):
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_diagnosis", ROOT / "benchmarks" / "bench_diagnosis.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rows = mod.main(["--quick", "--bench", str(bench_dir), "--items", "4"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(rows) == 13 and len(lines) == 15
    assert lines[-1].startswith("worst-row localization accuracy:")
    assert all(r["n"] > 0 for r in rows if r["row"] != "paraphrased cards")
