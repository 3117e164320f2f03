"""The campaign's own data contracts (the benchmark's, the test certification's pairing) are Prefect tasks cached on
the bytes they check: the same bytes pass without validating again, and changed bytes are validated again, so an
in-place edit that breaks the contract is caught."""

from __future__ import annotations

import shutil

import pandas as pd
import pytest


def test_the_benchmark_contract_is_cached_on_the_bytes_and_an_edit_is_validated_again(
    prefect_server, bench_dir, tmp_path
):
    from prefect import flow

    from components.contracts import ContractError
    from flows.tasks import benchmark_contract

    bench = tmp_path / "bench"
    shutil.copytree(bench_dir, bench)

    @flow(name="contract-check")
    def check(root: str):
        return benchmark_contract(root, return_state=True)

    first, again = check(str(bench)), check(str(bench))
    assert first.is_completed() and again.name == "Cached"  # the same bytes: the verdict comes back, not validated

    tasks = pd.read_csv(bench / "tasks.csv", dtype=str)
    tasks.loc[0, "min_weight"] = "0"  # rubric weights must be > 0
    tasks.to_csv(bench / "tasks.csv", index=False)
    with pytest.raises(ContractError, match=r"tasks.csv|min_weight"):
        check(str(bench))


def test_the_paired_contract_is_cached_on_the_frames_and_a_broken_pairing_fails(prefect_server):
    from prefect import flow

    from components.contracts import ContractError
    from flows.tasks import paired_contract

    base = pd.DataFrame({"item_id": ["a", "b"], "seed": [0, 0], "score": [0.5, 1.0]})

    @flow(name="paired-check")
    def check(cand: pd.DataFrame):
        return paired_contract(base, cand, "test certification", return_state=True)

    cand = base.assign(score=[0.25, 0.75])
    first, again = check(cand), check(cand.copy())
    assert first.is_completed() and again.name == "Cached"
    with pytest.raises(ContractError, match="test certification"):
        check(cand.assign(item_id=["a", "c"]))  # an item only one arm has
