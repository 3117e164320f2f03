"""The built-in worlds' rules as data (`components/worlds/<world>/rules.yaml`): every value a record allows is written
as a statement that reads back to that value (and to no other rule's), the shipped packages are rendered from the
world's own rules, a variant's tasks, tools, gold and rubric agree (an agent that knows every rule solves every
possible task), and a bad rules file is one line naming the file and the field."""

from __future__ import annotations

import json
from fractions import Fraction

import pytest

from components.errors import InputError
from components.memory import load_package
from components.models.simulated import OWNERS, SimulatedAgent
from components.params import BenchmarkParams
from components.runtime.episode import run_episode
from components.worlds import load_benchmark, world
from components.worlds.airline import facts as A
from components.worlds.airline import rules as AR
from components.worlds.grammar import facts_read
from components.worlds.retail import facts as R
from components.worlds.retail import rules as RR
from tests.conftest import PACKAGES

WORLDS = {"retail": (RR, R), "airline": (AR, A)}
OPS = (">", ">=", "<", "<=")


def _edge_variants(world_name: str) -> list[dict]:
    """Every form a rule can take: each threshold direction, no threshold, no fee; each choice."""
    if world_name == "retail":
        out = []
        for name, lo in (("cancel_fee", 10), ("restocking_fee", 12), ("exchange_fee", 6), ("reroute_fee", 20)):
            out += [{name: {"amount": 7, "when": {"op": op, "value": lo + 7}}} for op in OPS]
            out += [{name: {"amount": "25/2"}}, {name: {"amount": 0}}]
        out += [{"cancel_reason": {"allowed": list(RR.REASONS)[:k]}} for k in (1, 3, 5)]
        out += [
            {
                "refund_original": "account",
                "exchange_available": "ignore_available",
                "address_validated": "raw",
                "user_address_validated": "raw",
                "credit_gift_card": "original",
                "credit_cap": None,
                "gift_card_bonus": 0,
            },
            {"gift_card_bonus": "100/3", "credit_rate": "7/2", "credit_cap": "61/2"},
        ]
        return out
    out = [{"change_window": {"when": {"op": op, "value": 9}, "factor": k}} for op in OPS for k in (3, "3/2")]
    out += [
        {"change_window": {"factor": 1}},
        {"change_fee": {"economy": 0, "flex": 0, "business": 0}},
        {"change_fee": {"economy": 90, "flex": 40, "business": 20}},
        {"bag_fee": 0, "bag_business": 0},
        {"bag_business": 2},
        {"comp_gold": 1},
        {"comp_gold": "5/2"},
        {"comp_rate": [[3, 120], [5, 200], [8, 310]]},
        {
            "refund_original": "account",
            "basic_credit": "same",
            "comp_form": "cash",
            "upgrade_payment": "any",
            "name_upper": "as_given",
        },
    ]
    return out


def _variants(world_name: str) -> list[dict]:
    mod = WORLDS[world_name][0]
    return [{}] + _edge_variants(world_name) + [mod.random_rules(seed) for seed in range(40)]


@pytest.mark.parametrize("world_name", sorted(WORLDS))
def test_every_statement_reads_back_to_its_value_and_no_other(world_name):
    mod, facts = WORLDS[world_name]
    for changes in _variants(world_name):
        fs = facts.facts_of(mod.rules_of(changes))
        for f in fs.values():
            assert f"`{f.tool}`" in f.statement, (changes, f.id)
            assert facts_read(fs.values(), f.statement) == {f.id: f.value}, (changes, f.id, f.statement)


@pytest.mark.parametrize("world_name", sorted(WORLDS))
def test_the_policy_states_the_stated_rules_only(world_name):
    from components.worlds.airline.tasks import policy_text as airline_policy
    from components.worlds.retail.tasks import policy_text as retail_policy

    mod, facts = WORLDS[world_name]
    policy_text = retail_policy if world_name == "retail" else airline_policy
    for changes in _variants(world_name)[:12]:
        fs = facts.facts_of(mod.rules_of(changes))
        got = facts_read(fs.values(), policy_text(fs))
        assert got == {f.id: f.value for f in fs.values() if f.stated}, changes


def test_the_shipped_packages_are_rendered_from_the_worlds_own_rules():
    """The `reference` and `all-skills` cards in data/packages are what scripts/render_packages.py writes."""
    import sys

    from tests.conftest import ROOT

    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import render_packages
    finally:
        sys.path.pop(0)
    for path, text in render_packages.shipped().items():
        assert path.read_text(encoding="utf-8") == text, f"{path}: run scripts/render_packages.py"


def test_the_world_reads_its_own_rules_file():
    assert RR.rules_of() == RR.OWN and AR.rules_of() == AR.OWN
    assert R.BY_ID["cancel_fee"].value.when.op == ">" and A.BY_ID["comp_gold"].value == 2
    assert RR.rules_of({"credit_cap": None}).credit_cap is None
    assert AR.rules_of({"comp_gold": "5/2"}).comp_gold == Fraction(5, 2)


@pytest.mark.parametrize(
    "changes,match",
    [
        ({"cancel_fee": {"amount": 5, "when": {"op": "~", "value": 3}}}, r"cancel_fee\.when\.op: "),
        ({"cancel_fee": {"amount": 120}}, "a percent from 0 to under 100"),
        ({"credit_rate": "ten"}, r"credit_rate: .*not a number"),
        ({"cancel_reason": {"allowed": []}}, "at least one reason"),
        ({"nope": 1}, "nope: no such rule"),
    ],
)
def test_a_bad_retail_rule_is_one_line_naming_the_field(changes, match):
    with pytest.raises(InputError, match=f"^benchmark.rules: .*{match}"):
        RR.rules_of(changes)


@pytest.mark.parametrize(
    "changes,match",
    [
        ({"comp_rate": [[6, 100], [3, 250]]}, "increasing hours"),
        ({"bag_allowance": {"regular": 0}}, "one count per tier"),
        ({"change_window": {"when": {"op": "<=", "value": 7}, "factor": 0}}, "factor > 0"),
    ],
)
def test_a_bad_airline_rule_is_one_line_naming_the_field(changes, match):
    with pytest.raises(InputError, match=f"^benchmark.rules: .*{match}"):
        AR.rules_of(changes)


@pytest.mark.parametrize("world_name,seed", [("retail", 1), ("retail", 2), ("airline", 1), ("airline", 2)])
def test_an_agent_that_knows_every_rule_solves_every_possible_task_of_a_variant(tmp_path, world_name, seed):
    """The variant's task generator, gold, tools and rubric agree with its rules: with every fault switched off
    (it knows every rule's true value, confirms, tracks its work) the simulated agent scores 1.0 on each possible
    task; its own `reference` cards state the variant's values."""
    mod, facts = WORLDS[world_name]
    changes = mod.random_rules(seed)
    root = BenchmarkParams(
        world=world_name, seed=seed, out=str(tmp_path / "b"), per_family=4, rules=changes, receipts="explained"
    ).materialize()
    bench = load_benchmark(root)
    fs = facts.facts_of(mod.rules_of(changes))
    assert bench.meta["rules"] == mod.rules_of(changes).model_dump(mode="json")
    ref = load_package(root / "packages" / "reference")
    read = {fid: v for card in ref.cards.values() for fid, v in facts_read(fs.values(), card.body).items()}
    assert read == {fid: f.value for fid, f in fs.items()}
    seed_pkg = load_package(PACKAGES / ("seed" if world_name == "retail" else "airline/seed"))
    agent = SimulatedAgent(off=frozenset(OWNERS), truth=world(world_name).truth(bench))
    for tid, task in sorted(bench.tasks.items()):
        if task.possible:
            r = run_episode(seed_pkg, bench, tid, 0, agent)
            assert r.score == 1.0, (tid, r.criteria)


def test_bench_rules_writes_a_file_materialize_takes(tmp_path):
    from typer.testing import CliRunner

    from flows.cli import app

    runner = CliRunner()
    f = tmp_path / "air.yaml"
    got = runner.invoke(app, ["bench", "rules", "--world", "airline", "--random", "7", "--out", str(f)])
    assert got.exit_code == 0, got.output
    got = runner.invoke(
        app,
        [
            "bench",
            "materialize",
            "--world",
            "airline",
            "--rules",
            str(f),
            "--per-family",
            "3",
            "--out",
            str(tmp_path / "b"),
        ],
    )
    assert got.exit_code == 0, got.output
    meta = json.loads((tmp_path / "b" / "meta.json").read_text())
    assert meta["rules"] == AR.rules_of(AR.random_rules(7)).model_dump(mode="json")
    f.write_text("comp_gold: lots\n")
    got = runner.invoke(
        app,
        [
            "bench",
            "materialize",
            "--world",
            "airline",
            "--rules",
            str(f),
            "--per-family",
            "3",
            "--out",
            str(tmp_path / "c"),
        ],
    )
    assert got.exit_code == 2 and f"{f}: comp_gold: " in got.output and "Traceback" not in got.output
    assert not (tmp_path / "c").exists()
