"""Data contracts (great-expectations): broken tables are stopped with a readable list, and nothing is written."""

from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest

from components.contracts import ContractError, check_benchmark, check_paired_scores
from components.worlds import world


def scores(rows):
    return pd.DataFrame(rows, columns=["item_id", "seed", "score"])


GOOD = scores([("a", 0, 0.5), ("a", 1, 0.25), ("b", 0, 1.0), ("b", 1, 0.0)])


def test_good_pair_passes():
    check_paired_scores(GOOD, GOOD.assign(score=GOOD["score"] * 0.5))


@pytest.mark.parametrize(
    "cand,words",
    [
        (GOOD.iloc[:3], ["incomplete pairing", "b#1", "base only"]),
        (GOOD.assign(score=[0.5, float("nan"), 1.0, 0.0]), ["score missing or not a number", "a#1"]),
        (GOOD.assign(score=[0.5, 0.2, 1.7, 0.0]), ["score outside [0, 1]", "b#0"]),
        (pd.concat([GOOD, GOOD.iloc[[0]]]), ["item_id,seed duplicated", "a#0"]),
    ],
)
def test_broken_pair_is_stopped_with_a_readable_line(cand, words):
    with pytest.raises(ContractError) as e:
        check_paired_scores(GOOD, cand, "gate r03")
    text = str(e.value)
    assert text.startswith("gate r03: ")
    for w in words:
        assert w in text, text
    assert all(line.startswith("gate r03: ") for line in text.splitlines())


def test_benchmark_contract_passes_on_a_materialized_benchmark(bench_dir):
    check_benchmark(bench_dir)


IN_SET = "[expect_column_values_to_be_in_set]"


# each breaker damages the first task (t, in split s) or moves the first train task (x) into dev as well; the contract
# must report exactly the damage: every failed expectation, naming exactly the rows at fault, and nothing else
@pytest.mark.parametrize(
    "breaker,expected",
    [
        (
            lambda df, sp: (pd.concat([df, df.iloc[[0]]]), sp),
            [
                "task_id not unique for {t}, {t} [expect_column_values_to_be_unique]",
                "task_id,split duplicated for {t}#{s}, {t}#{s} [expect_compound_columns_to_be_unique]",
            ],
        ),
        (
            lambda df, sp: (df.assign(min_weight=[0.0] + list(df["min_weight"][1:])), sp),
            ["min_weight outside [0, inf] for {t} [expect_column_values_to_be_between]"],
        ),
        (
            lambda df, sp: (df.assign(split=["holdout"] + list(df["split"][1:])), sp),
            [
                "split not one of ['train', 'dev', 'test'] for {t} " + IN_SET,
                "_merge not one of ['both'] for {t}#{s}, {t}#holdout " + IN_SET,
            ],
        ),
        (
            lambda df, sp: (df, {**sp, "dev": sp["dev"] + sp["train"][:1]}),
            ["_merge not one of ['both'] for {x}#dev " + IN_SET],
        ),
    ],
    ids=["duplicate-task", "zero-weight", "unknown-split", "task-in-two-splits"],
)
def test_broken_benchmark_is_stopped(tmp_path, bench_dir, breaker, expected):
    broken = tmp_path / "bench"
    shutil.copytree(bench_dir, broken)
    df = pd.read_csv(broken / "tasks.csv", dtype={"task_id": str})
    sp = json.loads((broken / "splits.json").read_text())
    names = {"t": df["task_id"][0], "s": df["split"][0], "x": sp["train"][0]}
    df, sp = breaker(df, sp)
    df.to_csv(broken / "tasks.csv", index=False)
    (broken / "splits.json").write_text(json.dumps(sp))
    with pytest.raises(ContractError) as e:
        check_benchmark(broken)
    want = [line.format(**names) for line in expected]
    assert e.value.failures == want
    assert str(e.value).splitlines() == [f"{broken}: {line}" for line in want]


def test_materialize_writes_nothing_when_the_contract_fails(tmp_path, monkeypatch):
    import components.contracts as contracts  # the check every world's materialize runs (`write_benchmark`)

    def failing(root):
        raise ContractError(str(root), ["task_id not unique for x [expect_column_values_to_be_unique]"])

    monkeypatch.setattr(contracts, "check_benchmark", failing)
    with pytest.raises(ContractError):
        world("retail").materialize(tmp_path / "bench", 0)
    assert list(tmp_path.iterdir()) == []  # no benchmark, no temp directory left behind


def test_cli_gate_stops_a_broken_table(tmp_path, capsys):
    from tests.conftest import run_cli  # the real entry point in this process: a subprocess proves nothing more

    GOOD.to_csv(tmp_path / "b.csv", index=False)
    GOOD.assign(score=[0.5, 0.2, 3.0, 0.0]).to_csv(tmp_path / "c.csv", index=False)
    code, _, err = run_cli(capsys, "gate", "--base", str(tmp_path / "b.csv"), "--cand", str(tmp_path / "c.csv"))
    assert code == 2 and "outside [0, 1]" in err and "Traceback" not in err
