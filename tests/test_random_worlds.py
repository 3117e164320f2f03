"""Inference on random worlds (`benchmarks/bench_inference.py`): a rule drawn at random from the grammar, of every
form (thresholds in either direction at values that are not round, factors that are ratios of small integers, any
number of them, tables by one or two categories, caps, sums, allowed sets), its train rows computed as a world computes
them; the inferred rule must give the true value on >= 99% of fresh rows. Hypothesis draws the worlds (derandomized:
the same draws on every run)."""

from __future__ import annotations

import sys

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import bench_inference as B  # noqa: E402

sys.path.pop(0)

TRAIN, FRESH = 200, 400


@pytest.mark.parametrize("form", B.FORMS)
@settings(
    max_examples=1,
    deadline=None,
    derandomize=True,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[HealthCheck.too_slow],
)
@given(seed=st.integers(min_value=0, max_value=10**6))
def test_a_random_rule_of_every_form_is_recovered(form, seed):
    got = B.recover(form, seed, TRAIN, FRESH)
    assert got["agreement"] >= 0.99, got


def test_two_fields_never_read_each_other():
    """`fee` = 35 per bag beyond the free bags: the fee's rule reads the write's own `free_bags`; the free bags
    (here from the tier alone) may not be read back off the fee (a card of both would compute each from the other)."""
    from components.evolution.infer import Row, infer_rows

    rows = []
    for n in range(40):
        free = (0, 1, 2)[n % 3]
        bags = free + (n // 3) % 3
        gold = {"reservation_id": f"r{n}", "bags": bags, "free_bags": free, "fee": 35 * (bags - free)}
        rows.append(
            Row(
                f"item-{n:03d}",
                f"item-{n:03d}#0",
                {"u.tier": ("a", "b", "c")[n % 3], "u.x": n % 7},
                gold,
                {"reservation_id": f"r{n}", "bags": bags, "free_bags": 9, "fee": 1},
            )
        )
    infs = {i.field: i.rule for i in infer_rows("add_checked_bags", rows, {"add_checked_bags": ["reservation_id"]})}
    reads = {f: {p for p in r.features() if p.startswith("@")} for f, r in infs.items() if r is not None}
    assert infs["fee"] is not None and "@free_bags" in reads["fee"]
    assert "@fee" not in reads.get("free_bags", set())
