"""Scoring the diagnoser against the hidden counterfactual causes. This is the one test module that reads them
(through components.evolution.localization, their only reader), besides the perturbation benchmark."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from typer.testing import CliRunner

from components.evolution.diagnose import diagnose
from components.evolution.localization import _eid, fit_baselines, localization
from components.evolution.trace_rule import signals_frame
from components.memory import load_package
from components.memory.strategies import DELIVERERS
from components.models.counterfactual import causes_table
from components.runtime.evaluate import run_shard
from tests.conftest import PACKAGES, ROOT

SEEDS = [0, 1]


CHECKED = """name: checked
wm:
  board: true
  max_entries: 2
  bind_on: []
delivery: []
checkers:
  - use: completion_requires_receipts
    at: agent_declares_done
  - use: confirm_before_write
    at: pre_write
"""


@pytest.fixture(scope="module")
def labelled(bench, tmp_path_factory):
    """(tables, hidden causes, trace signals) of a package on the first 30 items of a split; each computed once per
    module (the seed's train set is read by two tests; its counterfactual replays are the costly part). "checked":
    the seed with both checkers installed."""
    done = {}
    root = tmp_path_factory.mktemp("pkgs")
    (root / "checked").mkdir()
    (root / "checked" / "manifest.yaml").write_text(CHECKED)

    def get(name, split, n=30, max_turns=40):
        if (name, split, max_turns) not in done:
            pkg = load_package(root / name if name == "checked" else PACKAGES / name)
            t = run_shard(pkg, bench, bench.ids(split)[:n], SEEDS, max_turns=max_turns)
            done[name, split, max_turns] = (
                t,
                causes_table(pkg, bench, t.scores, max_turns),
                signals_frame(t.traces, t.scores, bench.write_tools, bench.meta.get("targets")),
            )
        return done[name, split, max_turns]

    get.package = lambda name: load_package(root / name if name == "checked" else PACKAGES / name)
    return get


def test_seed_failures_cover_e_c_and_compound(labelled):
    _, causes, _ = labelled("seed", "train")
    share = {k: v / len(causes) for k, v in Counter(causes["cause"]).items()}
    for cause in ("E", "C", "compound", "external"):
        assert share.get(cause, 0) >= 0.05, share
    fixed_alone = causes[causes["cause"].isin(["E", "C", "W", "rho"])]
    # the cause's own switch alone turned the failure into a success
    assert all(row[f"{row['cause']}_off"] == 1 for row in fixed_alone.to_dict("records"))


def scored(bench, labelled, name, max_turns=40) -> dict:
    """The diagnoser on dev, baselines fitted on train (issue 24's scoring: every scored failure counts)."""
    train, train_causes, train_signals = labelled(name, "train", max_turns=max_turns)
    dev, dev_causes, dev_signals = labelled(name, "dev", max_turns=max_turns)
    d = diagnose(
        dev.traces, dev.scores, labelled.package(name), bench.write_tools, "test", targets=bench.meta.get("targets")
    )
    return localization(
        d.findings_frame(),
        _eid(dev_causes),
        _eid(dev.scores),
        dev_signals,
        fit_baselines(_eid(train_causes), _eid(train.scores), train_signals),
    )


CASES = [("seed", 40), ("all-skills", 40), ("all-skills", 8), ("none", 40), ("checked", 40)]


@pytest.mark.parametrize("name,max_turns", CASES)
def test_localization_over_every_failure_beats_the_simple_guesses(bench, labelled, name, max_turns):
    """Scored over every failed episode (compound included), fitted baselines on train, scored on dev."""
    loc = scored(bench, labelled, name, max_turns)
    assert loc["n"] >= 25
    assert loc["accuracy"] >= 0.85, loc
    assert loc["coverage"] >= 0.8 and loc["checks"]["coverage"], loc
    assert loc["accuracy"] >= loc["trace_rule_accuracy"], loc  # never worse than the glance
    assert loc["accuracy"] >= max(loc["outcome_only_accuracy"], loc["constant_accuracy"]) + 0.05, loc
    assert sum(sum(row.values()) for row in loc["confusion"].values()) == loc["n"]


# Known gap (issue 24): with receipts that name the broken rule, the trace rule fitted on train reads the owner about
# as well as the diagnoser (a refusal is E, a bounce C, ...), so the diagnoser does not beat it by 10 points. Strict:
# it turns red when the diagnoser's outcome evidence (silent receipts) makes the margin.
@pytest.mark.xfail(strict=True, reason="the fitted trace rule is within 10 points where refusals name the rule")
@pytest.mark.parametrize("name", ["seed"])
def test_localization_beats_the_trace_rule_by_ten_points(bench, labelled, name):
    loc = scored(bench, labelled, name)
    assert loc["margin"] >= 0.10, loc


def test_a_checker_bounce_is_read_as_c(bench, labelled):
    """With a confirmation checker installed the skipped confirmation never reaches the world: the checker blocks the
    draft and the agent gives up. The bounce is the C fault's trace; dropped work after it is not W."""
    said = {}
    for name in ("checked", "reference"):  # every dev item: with the checker in place true C failures are rare
        t, causes, _ = labelled(name, "dev", n=72)
        d = diagnose(
            t.traces, t.scores, labelled.package(name), bench.write_tools, "test", targets=bench.meta.get("targets")
        )
        truth = _eid(causes).set_index("episode_id")["cause"]
        said |= {f.episode_id: (f.owner, f.kind) for f in d.findings if truth.get(f.episode_id) == "C"}
    assert len(said) >= 3, said
    assert all(owner == "C" for owner, _ in said.values()), said
    assert any(kind == "bounced_write" for _, kind in said.values()), said


def test_ratchet_diagnose_prints_one_json_object(tmp_path, bench_dir):
    from flows.cli import app

    runner = CliRunner()
    items = ",".join(json.loads((bench_dir / "splits.json").read_text())["dev"][:12])
    r = runner.invoke(
        app,
        [
            "eval",
            "--package",
            str(PACKAGES / "seed"),
            "--benchmark",
            str(bench_dir),
            "--items",
            items,
            "--seeds",
            "1",
            "--max-turns",
            "12",
            "--out",
            str(tmp_path / "ev"),
        ],
    )
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "ev" / "meta.json").read_text())["max_turns"] == 12
    r = runner.invoke(
        app,
        [
            "diagnose",
            "--eval",
            str(tmp_path / "ev"),
            "--package",
            str(PACKAGES / "seed"),
            "--benchmark",
            str(bench_dir),
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert {
        "accuracy",
        "n",
        "coverage",
        "outcome_only_accuracy",
        "trace_rule_accuracy",
        "constant_accuracy",
        "passes",
        "confusion",
    } <= set(out)
    assert out["n"] == sum(sum(v.values()) for v in out["confusion"].values())


def test_bench_diagnosis_quick_prints_the_table(bench_dir, capsys):
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_diagnosis", ROOT / "benchmarks" / "bench_diagnosis.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rows = mod.main(["--quick", "--bench", str(bench_dir), "--items", "4"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(rows) == 23 and len(lines) == 28 and lines[0] == "receipts: explained"
    assert rows[-1]["row"] == "rotated triggers" and lines[-3].startswith("rows clearing accuracy >= 85%")
    # the bar over the outcome-only baseline, recomputed from the row's own figures
    for r in rows:
        if r["n"]:
            assert r["outcome_margin"] == r["accuracy"] - r["outcome_only_accuracy"]
            assert r["clears_outcome"] is (r["accuracy"] >= 0.85 and r["outcome_margin"] >= 0.05 - 1e-9)
        else:
            assert not r["clears_outcome"]
    assert {r["world"] for r in rows} == {"retail"} and {r["receipts"] for r in rows} == {"explained"}
    assert lines[-2].startswith("rows passing:") and lines[-1].startswith("worst-row localization accuracy:")
    assert sum(r["n"] > 0 for r in rows) >= 10
    # every row states its coverage and its verdict; a row with nothing to score cannot pass
    assert all(r["coverage"] is not None for r in rows if r["n"])
    assert not any(r["passes"] for r in rows if not r["n"])


def test_bench_diagnosis_runs_a_silent_world(tmp_path):
    """`--receipts silent`: the rows run on the world's benchmark with silent receipts, where no write is ever refused
    on a rule, so blanking the trace rule's refusal signal changes nothing."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_diagnosis", ROOT / "benchmarks" / "bench_diagnosis.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rows = mod.main(
        ["--quick", "--world", "retail", "--receipts", "silent", "--items", "6", "--only", "seed,wrong card"]
    )
    assert [r["row"] for r in rows] == ["wrong card", "seed"] and {r["receipts"] for r in rows} == {"silent"}
    assert all(r["n"] > 0 for r in rows)
    assert all(r["trace_rule_no_refusal_accuracy"] == r["trace_rule_accuracy"] for r in rows)


def _bench_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_diagnosis", ROOT / "benchmarks" / "bench_diagnosis.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_late_router_delivers_a_card_only_after_its_write(bench, tmp_path):
    """`cards_after_write` (the "card after its write" rows): no write ever has a card about its own tool in memory
    before that tool's first successful write in the episode, and some later turn has one: the card exists and is
    delivered, at the wrong time."""
    from components.memory import load_package
    from components.models.simulated import SimulatedAgent
    from components.runtime.episode import run_episode

    mod = _bench_module()
    with mod.perturbations():
        pkg = load_package(mod.card_package(tmp_path, "late", mod.RETAIL.paraphrased, use="cards_after_write"))
        runs = [run_episode(pkg, bench, item, 0, SimulatedAgent()).steps for item in bench.ids("train")[:24]]
    assert "cards_after_write" not in DELIVERERS  # registered for the table only
    tool_of = {c.id: c.meta.trigger.tool for c in pkg.cards.values()}
    early = late = 0
    for steps in runs:
        written: set[str] = set()
        for s in steps:
            about = {tool_of[c] for c in s.delivered}
            tool = s.action.get("tool")
            if tool in bench.write_tools and tool not in written:
                early += tool in about  # a card about this write before its first success: must never happen
            late += bool(about & written)
            if tool in bench.write_tools and s.blocked is None and s.observation.get("ok"):
                written.add(tool)
    assert early == 0 and late > 0


def test_the_false_alarm_checker_bounces_correct_work_at_its_rate():
    """`false_alarm` (the "false-alarm checker" rows) bounces a write by a hash of its tool and arguments, whatever
    they are: the same call always gets the same verdict, reads are never bounced, and about `rate` of writes are."""
    from components.memory.ledger import Ledger, WMOptions
    from components.memory.strategies import CHECKERS, CheckContext
    from components.runtime.types import Draft, ToolCall

    with _bench_module().perturbations():
        check = CHECKERS.make("false_alarm", {"rate": 0.3})
    assert "false_alarm" not in CHECKERS

    def verdict(name: str, n: int) -> bool:
        draft = Draft(tool_call=ToolCall(id="c1", name=name, args={"order_id": f"#W{n:07d}"}))
        return check(CheckContext("pre_write", draft, Ledger(WMOptions()), [], frozenset({"write_it"}))).ok

    bounced = [not verdict("write_it", n) for n in range(400)]
    assert 0.2 < sum(bounced) / len(bounced) < 0.4
    assert bounced == [not verdict("write_it", n) for n in range(400)]
    assert all(verdict("read_it", n) for n in range(400))
