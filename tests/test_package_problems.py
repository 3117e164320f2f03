"""Load errors name the exact field, list element included, and every bad binding is reported, not just the first
(found by mutation testing of components/memory/package.py)."""

from __future__ import annotations

import shutil

from components.memory.package import lint
from tests.conftest import PACKAGES

DELIVERY = "  - use: event_cards\n    at: intent_recorded\n"


def broken(tmp_path, *edits: tuple[str, str]):
    pkg = tmp_path / "p"
    shutil.copytree(PACKAGES / "reference", pkg)
    manifest = pkg / "manifest.yaml"
    text = manifest.read_text()
    for old, new in edits:
        assert old in text
        text = text.replace(old, new, 1)
    manifest.write_text(text)
    return [(p.file, p.field, p.message) for p in lint(pkg)], str(manifest)


def test_a_missing_field_in_a_list_element_is_named_with_its_index(tmp_path):
    problems, manifest = broken(
        tmp_path,
        (
            "  - use: completion_requires_receipts\n    at: agent_declares_done\n",
            "  - use: completion_requires_receipts\n",
        ),
    )
    assert problems == [(manifest, "checkers[0].at", "Field required")]


def test_every_bad_binding_is_reported_with_the_names_it_could_have_been(tmp_path):
    problems, manifest = broken(
        tmp_path,
        (DELIVERY, "  - use: nope\n    at: intent_recorded\n  - use: nada\n    at: turn_start\n" + DELIVERY),
        ("match_args: [order_id]", "match_args: [[1]]"),
    )
    assert problems == [
        (manifest, "delivery[0].use", "unknown deliverer 'nope' (one of all_cards, event_cards, state_reminder)"),
        (manifest, "delivery[1].use", "unknown deliverer 'nada' (one of all_cards, event_cards, state_reminder)"),
        (manifest, "checkers[1].cfg.match_args[0]", "Input should be a valid string"),
    ]


def test_bad_events_are_all_reported_with_what_was_allowed(tmp_path):
    problems, manifest = broken(
        tmp_path,
        (
            DELIVERY,
            "  - use: event_cards\n    at: nowhen\n  - use: event_cards\n"
            "    at: draft_ready\n  - use: event_cards\n    at: later\n" + DELIVERY,
        ),
    )
    events = "turn_start, intent_recorded, draft_ready, pre_write, agent_declares_done"
    allowed = "intent_recorded, pre_write, turn_start"
    assert problems == [
        (manifest, "delivery[0].at", f"unknown event 'nowhen' (one of {events})"),
        (manifest, "delivery[1].at", f"'event_cards' cannot run at 'draft_ready' (only {allowed})"),
        (manifest, "delivery[2].at", f"unknown event 'later' (one of {events})"),
    ]
