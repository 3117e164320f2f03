"""What the views say (issue 41): the end-of-campaign table says why a round stopped before the gate, a rejected
round's MLflow run carries no empty tags and no "mechanism ?", params are logged as params.yaml spells them, tags
hold recorded paths, and the printed links point at the MLflow UI that runs, not at a fixed port."""

from __future__ import annotations

import json
import os
import socket

import pytest

from tests.conftest import EXPLAINED  # noqa: F401 (the same conventions as the other CLI tests)

REPAIR_REJECT = {
    "round": 1,
    "verdict": "reject",
    "owner": "W",
    "plan_key": "p1",
    "summary": "W: track more entries",
    "reason": "repair screen: repaired 0, broke 1 of 3 source items (mean 0.500 -> 0.400)",
    "repair": {
        "ok": False,
        "repaired": 0,
        "broken": 1,
        "base_mean": 0.5,
        "cand_mean": 0.4,
        "n_items": 3,
        "reason": "repaired 0, broke 1 of 3 source items",
    },
    "candidate_digest": "c" * 64,
    "benchmark_digest": "b" * 64,
    "round_dir": "rounds/r01",
    "champion_before": "M0",
    "parent": {"version": "M0", "digest": "a" * 64},
    "child": None,
}
NO_PLAN = {
    "round": 2,
    "verdict": "no_plan",
    "reason": "no patchable cluster left that was not already tried",
    "round_dir": "rounds/r02",
    "champion_before": "M0",
    "parent": {"version": "M0", "digest": "a" * 64},
    "child": None,
}


def _summary(history: list[dict], **extra) -> dict:
    return {
        "campaign": "c",
        "history": history,
        "test": None,
        "localization": {},
        "champion": "M0",
        "champion_digest": "a" * 64,
        "accepted": 0,
        "rounds": len(history),
        **extra,
    }


def test_the_campaign_table_says_why_a_round_never_reached_the_gate(capsys, tmp_path, monkeypatch):
    """The table showed "0/1" in an unlabelled column and nothing else for a round rejected at the repair screen
    (the reason was only in MLflow)."""
    from rich.console import Console

    import flows.cli.campaigns
    from flows.cli import _print_summary

    monkeypatch.setattr(
        flows.cli.campaigns, "out", Console(soft_wrap=True, width=400)
    )  # a wide terminal: no folded cells

    _print_summary(_summary([REPAIR_REJECT, NO_PLAN]), tmp_path / "summary.json")
    out = capsys.readouterr().out
    assert "repair fixed/broke" in out and "or why not gated" in out
    flat = " ".join(out.split())
    assert "repair screen: repaired 0, broke 1 of 3 source items" in flat, out
    assert "0/1" in flat


def test_campaign_md_says_why_a_round_never_reached_the_gate():
    from components.evolution.report import round_rows

    rows = round_rows(_summary([REPAIR_REJECT, NO_PLAN]))
    assert rows[0]["not_gated"].startswith("repair screen: repaired 0, broke 1") and rows[0]["repair"] == "0/1"
    assert rows[1]["not_gated"] == "-"  # no plan: the plan column holds the reason already


def test_a_round_rejected_before_the_gate_has_no_mechanism_question_mark_and_no_empty_tags():
    from components.evolution.record import RoundRecord
    from components.tracking.mlflow_log import describe_round, round_tags

    rec = RoundRecord.of(REPAIR_REJECT)
    text = describe_round(rec)
    assert "mechanism ?" not in text and "owner W" in text and "?" not in text.split("Plan", 1)[1].split(":")[0]
    tags = round_tags(rec)
    assert "" not in tags.values() and "ratchet.version" not in tags  # was an empty version tag
    assert tags["ratchet.candidate_digest"] == "c" * 64 and tags["ratchet.verdict"] == "reject"


def test_params_are_logged_as_params_yaml_spells_them():
    """`benchmark.receipts` was logged as `ReceiptMode.silent`."""
    from components.params import load_params
    from components.tracking.mlflow_log import _flatten

    flat = _flatten(load_params(None, {"benchmark.receipts": "silent"}).recorded().model_dump())
    assert flat["benchmark.receipts"] == "silent"
    assert not [k for k, v in flat.items() if "ReceiptMode" in v or "<" in v]


@pytest.fixture
def running_ui(tmp_path, monkeypatch):
    from components.env import UI_NOTE

    monkeypatch.setenv("RATCHET_HOME", str(tmp_path))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
        (tmp_path / UI_NOTE).write_text(json.dumps({"url": url, "pid": os.getpid()}))
        yield url


def test_printed_links_point_at_the_running_ui_not_port_5000(capsys, tmp_path, running_ui):
    from flows.cli import _print_summary

    route = "#/experiments/1/runs/abc?workflowType=machine_learning"
    summary = _summary(
        [],
        mlflow={
            "experiment": "ratchet/c/x",
            "registered_model": "m",
            "tracking_uri": None,
            "links": {"campaign": f"http://127.0.0.1:5000/{route}"},
        },
    )
    _print_summary(summary, tmp_path / "summary.json")
    out = capsys.readouterr().out
    assert f"campaign: {running_ui}/{route}" in out and ":5000" not in out and "`ratchet ui`, running" in out


def test_without_a_running_ui_the_links_say_which_port_they_assume(capsys, tmp_path, monkeypatch):
    from components.tracking.mlflow_log import ui_address

    monkeypatch.setenv("RATCHET_HOME", str(tmp_path))
    base, how = ui_address(None)
    assert base == "http://127.0.0.1:5000" and "--port N" in how
    assert ui_address("http://mlflow:5555/")[0] == "http://mlflow:5555"


def _gated(round_no: int, verdict: str, base: float, cand: float) -> dict:
    return {
        "round": round_no,
        "verdict": verdict,
        "reason": "gate",
        "round_dir": f"rounds/r{round_no:02d}",
        "gate": {
            "accept": verdict == "accept",
            "net": cand - base,
            "ci_lo": 0.0,
            "ci_hi": 0.1,
            "n_items": 30,
            "n_improved": 1,
            "n_regressed": 0,
            "reason": "r",
            "base_mean": base,
            "cand_mean": cand,
        },
    }


def test_the_champions_dev_mean_changes_only_with_the_champion():
    """`champion_dev_mean` dropped from 0.695 to 0.676 with no change of champion (M6): round 9 re-measured M6 on
    another look's cells (more seeds than its promoting look used). It is the mean the champion was promoted on."""
    from components.evolution.record import RoundRecord
    from components.evolution.report import champion_means

    rounds = [
        RoundRecord.of(r)
        for r in (
            _gated(1, "reject", 0.30, 0.30),
            _gated(2, "accept", 0.31, 0.38),
            _gated(3, "reject", 0.37, 0.36),
            {**NO_PLAN, "round": 4},
            _gated(5, "accept", 0.36, 0.69),
            _gated(6, "reject", 0.676, 0.68),
        )
    ]
    assert champion_means(rounds) == {1: 0.30, 2: 0.38, 3: 0.38, 4: None, 5: 0.69, 6: 0.69}
