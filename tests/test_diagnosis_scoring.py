"""Scoring the diagnoser against the hidden causes. This is the one test module that reads the hidden causes
(through components.evolution.localization, their only reader)."""

from __future__ import annotations

from collections import Counter

import pytest

from components.evolution.diagnose import diagnose
from components.evolution.localization import localization
from components.memory import load_package
from components.runtime.evaluate import run_shard
from tests.conftest import PACKAGES


def eid(df):
    return df.assign(episode_id=df["item_id"] + "#" + df["seed"].astype(str))


def scored(bench, pkg_dir):
    pkg = load_package(pkg_dir)
    t = run_shard(pkg, bench, bench.ids("train"), [0, 1, 2])
    d = diagnose(t.traces, t.scores, pkg, bench.write_tools, "test")
    return t, localization(d.findings_frame(), eid(t.causes), eid(t.scores))


def test_seed_failures_cover_e_w_and_c(bench):
    t = run_shard(PACKAGES / "seed", bench, bench.ids("train"), [0, 1, 2])
    share = {k: v / len(t.causes) for k, v in Counter(t.causes["cause"]).items()}
    for owner in ("E", "W", "C"):
        assert share.get(owner, 0) >= 0.10, share


def test_misrouted_reference_shows_rho_failures(bench, package_copy):
    broken = package_copy("reference")
    card = broken / "em/procedure/cancel-reason.md"
    card.write_text(card.read_text().replace("tool: cancel_pending_order", "tool: get_order_details"))
    card = broken / "em/procedure/refund-original-payment.md"
    card.write_text(card.read_text().replace("tool: return_delivered_order_items", "tool: get_user_details"))
    t = run_shard(broken, bench, bench.ids("train"), [0, 1, 2])
    causes = Counter(t.causes["cause"])
    assert causes["rho"] >= 0.3 * sum(causes.values()), causes


@pytest.mark.parametrize("name", ["seed", "all-skills", "none"])
def test_localization_beats_outcome_only(bench, name):
    _, loc = scored(bench, PACKAGES / name)
    assert loc["n"] >= 50
    assert loc["accuracy"] >= 0.90, loc
    assert loc["accuracy"] > loc["outcome_only_accuracy"], loc
    assert len(loc["per_owner"]) >= 3  # several owners, not one dominant class
