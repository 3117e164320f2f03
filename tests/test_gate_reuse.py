"""Evaluations reuse what was already paid for (components/models/callcache.py): the same request to a deterministic
model is answered from the campaign's reply store, so re-evaluating a champion costs no model call and a patched
candidate pays only where its patch changes what the model reads, with byte-identical score tables and traces."""

from __future__ import annotations

import io
import shutil

import pytest

from components.evidence.budget import Estimate
from components.models.callcache import deterministic, saved
from components.runtime.evaluate import run_shard
from tests.conftest import PACKAGES

SEEDS = [0, 1]
CARD = "em/procedure/cancel-reason.md"


def _bytes(t) -> tuple[str, bytes]:
    buf = io.BytesIO()
    t.traces.to_parquet(buf, index=False)
    return t.scores.to_csv(index=False, lineterminator="\n"), buf.getvalue()


@pytest.fixture
def candidate(tmp_path):
    """The seed package plus one routed card: a one-card patch, as a round proposes."""
    out = tmp_path / "cand"
    shutil.copytree(PACKAGES / "seed", out)
    (out / CARD).parent.mkdir(parents=True)
    shutil.copy(PACKAGES / "all-skills" / CARD, out / CARD)
    manifest = (
        (out / "manifest.yaml")
        .read_text()
        .replace("delivery: []", "delivery:\n  - use: event_cards\n    at: intent_recorded")
    )
    (out / "manifest.yaml").write_text(manifest)
    return out


def test_a_champion_evaluated_again_pays_nothing_and_a_patch_pays_only_where_it_acts(bench, candidate, tmp_path):
    store = tmp_path / "calls.sqlite"
    items = bench.ids("train")[:12]
    plain = run_shard(PACKAGES / "seed", bench, items, SEEDS)
    first = run_shard(PACKAGES / "seed", bench, items, SEEDS, call_cache=store)
    calls = int(plain.scores["model_calls"].sum())
    assert plain.paid is None and 0 < first.paid["model_calls"] <= calls
    again = run_shard(PACKAGES / "seed", bench, items, SEEDS, call_cache=store)  # a rejected round's next train eval
    assert again.paid["model_calls"] == 0 and again.paid["tokens_in"] == 0 and again.paid["hits"] == calls
    assert _bytes(again) == _bytes(plain) == _bytes(first)

    cand_plain = run_shard(candidate, bench, items, SEEDS)
    cand = run_shard(candidate, bench, items, SEEDS, call_cache=store)
    assert _bytes(cand) == _bytes(cand_plain)  # the store never changes an answer
    assert not cand_plain.scores.equals(plain.scores) or not cand_plain.traces.equals(plain.traces)  # the patch acts
    cand_calls = int(cand.scores["model_calls"].sum())
    assert 0 < cand.paid["model_calls"] < cand_calls  # paid only from the turn the card first changes the request
    assert cand.paid["hits"] + cand.paid["model_calls"] == cand_calls
    # the store's books: every call answered from it is counted as saved, so paid + saved = what the tables used
    used = calls + calls + cand_calls
    paid = first.paid["model_calls"] + again.paid["model_calls"] + cand.paid["model_calls"]
    assert saved(store)["model_calls"] == used - paid > 0


def test_the_ledger_is_charged_what_was_paid_and_only_deterministic_models_are_stored(bench, tmp_path):
    from flows.tasks import paid_usage

    items = bench.ids("dev")[:4]
    store = tmp_path / "calls.sqlite"
    run_shard(PACKAGES / "seed", bench, items, [0], call_cache=store)
    t = run_shard(PACKAGES / "seed", bench, items, [0], call_cache=store)
    est = Estimate(
        max_turns=40, tokens_in_per_call=4000, tokens_out_per_call=512, price_in_per_1k=1.0, price_out_per_1k=1.0
    )
    got = paid_usage(t, est)
    assert got["model_calls"] == 0 and got["tokens_in"] == 0 and got["money"] == 0
    assert got["tool_calls"] == float(t.scores["tool_calls"].sum()) > 0  # tools run in the world every time
    t.paid = None
    assert paid_usage(t, est)["model_calls"] == float(t.scores["model_calls"].sum()) > 0
    assert deterministic("sim", {}) and deterministic("openai", {"base_url": "x"})
    assert not deterministic("openai", {"base_url": "x", "temperature": 0.7})
