"""The campaign as Prefect flows: a real (temporary) Prefect server, real task caching, real files.

Every test reads the session's shared small campaign (tests/conftest.py `small_campaign`) or runs its own variant of
it, so no test depends on another having run first."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import flows.tasks
from components.evolution.lineage import Lineage
from components.evolution.plan import parse_plan
from components.memory import digest
from flows.campaign import run_campaign
from tests.conftest import EXPLAINED, run_cli as cli, small_params


def variant(campaign, out: Path, **over):
    """Params of a variant of the shared small campaign at `out`: on its benchmark (the same path and size) with as
    many rounds and the same shards, so that what the variant does not change comes from the task cache it filled;
    `over` changed. No variant's test reads a trace: none is logged."""
    b, c = campaign.params.benchmark, campaign.params.campaign
    return small_params(
        Path(b.out),
        out,
        **{
            "benchmark.per_family": b.per_family,
            "benchmark.train_share": b.train_share,
            "benchmark.dev_share": b.dev_share,
            "campaign.rounds": c.rounds,
            "campaign.shard_size": c.shard_size,
            "campaign.traces_per_round": 0,
            **over,
        },
    )


@pytest.fixture
def camp(tmp_path, small_campaign):
    """A variant of the shared small campaign in this test's temp dir, under its own name (its own MLflow records)."""
    return lambda name, **over: variant(small_campaign, tmp_path / name, **{"campaign.name": f"small-{name}", **over})


@pytest.fixture
def episodes(monkeypatch):
    """Count the episodes the flow actually runs (the real run_shard still runs)."""
    calls = []
    real = flows.tasks.run_shard

    def counting(package, bench, items, seeds, *a, **kw):
        calls.append(len(items) * len(seeds))
        return real(package, bench, items, seeds, *a, **kw)

    monkeypatch.setattr(flows.tasks, "run_shard", counting)
    return calls


def test_campaign_promotes_and_records(small_campaign):
    p, s = small_campaign.params, small_campaign.summary
    assert s["episodes"]["total"] > 0 and s["episodes"]["errors"] == 0
    assert s["rounds"] == p.campaign.rounds and 1 <= s["accepted"] <= s["rounds"]
    lineage = Lineage(p.campaign.out + "/lineage")
    versions = lineage.versions()
    assert [v.name for v in versions] == [f"M{i}" for i in range(s["accepted"] + 1)]
    for v in versions:  # every version on disk is the bytes that were evaluated
        assert digest(v.path) == v.digest
    assert s["champion_digest"] == versions[-1].digest
    for rec in s["history"]:
        assert rec["verdict"] in ("accept", "reject", "no_plan")
        if rec["verdict"] == "accept":
            g = rec["gate"]
            assert g["ci_lo"] > 0 and g["n_regressed"] <= p.gate.reg_cap
            assert rec["child"]["digest"] == rec["candidate_digest"]
    t = s["test"]
    assert t["champion_mean"] > t["base_mean"] and t["ci_lo"] > 0
    assert set(s["localization"]) >= {
        "accuracy",
        "outcome_only_accuracy",
        "trace_rule_accuracy",
        "n",
        "coverage",
        "passes",
    }
    assert s["localization"]["trace_rule_accuracy"] is not None  # the round dirs keep the traces it reads
    on_disk = json.loads((small_campaign.out / "summary.json").read_text())
    assert on_disk["champion_digest"] == s["champion_digest"]
    plan = parse_plan((small_campaign.out / "rounds/r01/plan.json").read_text())
    assert plan.owner in ("E", "W", "rho", "C") and plan.evidence


def test_rerun_with_the_same_bytes_runs_no_episode(small_campaign, camp, episodes):
    first = small_campaign.summary
    s = run_campaign(camp("again"))
    assert episodes == []  # every evaluation, probe included, came from the task cache
    assert s["test"] == first["test"]
    assert [v["digest"] for v in s["lineage"]] == [v["digest"] for v in first["lineage"]]


def test_shards_sized_to_the_look_change_no_result(small_campaign, camp, episodes):
    """`campaign.shard_size: null` (issue 29): each look cut by `auto_shard` into tasks of another size than the
    small campaign's one task per look; every table, verdict and version is the same."""
    first = small_campaign.summary
    s = run_campaign(camp("auto-shards", **{"campaign.shard_size": None}))
    assert episodes and max(episodes) < max(first["episodes"]["total"], 1)  # the shards did run, and smaller
    assert s["test"] == first["test"]
    assert [v["digest"] for v in s["lineage"]] == [v["digest"] for v in first["lineage"]]
    keep = ("round", "verdict", "plan_key", "gate")
    assert [{k: r.get(k) for k in keep} for r in s["history"]] == [
        {k: r.get(k) for k in keep} for r in first["history"]
    ]


def test_a_changed_input_recomputes_only_what_depends_on_it(small_campaign, camp, episodes):
    first = small_campaign.summary
    s = run_campaign(camp("probe", **{"campaign.probe_items": 2}))
    # only the activation probes (validate stage) ran again: at most 2 items x 1 seed per round with a plan
    planned = sum(1 for r in s["history"] if r["verdict"] != "no_plan")
    assert 0 < len(episodes) <= planned and all(n <= 2 for n in episodes)
    assert s["test"] == first["test"]


def test_a_rejected_plan_is_not_tried_again(prefect_server, tmp_path):
    from components.worlds import world

    # its own campaign, cold wherever it runs (it reads no other campaign's cache): on a sixth of the session's
    # benchmark (6 tasks per family: 10 dev items, above the gate's minimum) with one seed, this strict gate rejects
    # the plan of both rounds (deterministic). Nothing here reads a trace: none is logged.
    bench = world("retail").materialize(tmp_path / "bench", 0, 6)
    p = small_params(
        bench,
        tmp_path / "strict",
        **{
            "campaign.name": "small-strict",
            "gate.reg_cap": 0,
            "benchmark.per_family": 6,
            "gate.material": 0.0,
            "campaign.rounds": 2,
            "campaign.seeds": 1,
            "campaign.traces_per_round": 0,
        },
    )
    s = run_campaign(p)
    keys = [r.get("plan_key") for r in s["history"] if r.get("plan_key")]
    assert len(keys) == len(set(keys))
    rejected = [r for r in s["history"] if r["verdict"] == "reject"]
    assert len(rejected) >= 2, s["history"]  # a rejection followed by another plan: what "not tried again" is about
    for r in rejected:
        assert (Path(p.campaign.out) / "lineage/rejected" / f"{r['plan_key']}.json").exists()


def test_llm_meta_agent_goes_through_the_model_and_the_same_schema(small_campaign, camp):
    p = camp("llm", **{"campaign.meta_agent": "llm", "campaign.rounds": 1})
    s = run_campaign(p)
    plan = parse_plan((Path(p.campaign.out) / "rounds/r01/plan.json").read_text())
    rules = parse_plan((small_campaign.out / "rounds/r01/plan.json").read_text())
    assert plan.key() == rules.key()  # the simulated model returns the rules' draft; a real model may not
    assert s["history"][0]["plan_key"] == plan.key()


def test_cli_campaign_prints_rounds_and_certification(prefect_server, capsys, tmp_path):
    from components.worlds import world

    # a third of the session's benchmark (12 tasks per family): what is printed does not depend on the size
    bench = world("retail").materialize(tmp_path / "bench", 0, 12)
    # in-process: the entry point, option parsing and printing are the same code a subprocess would run
    code, out, err = cli(
        capsys,
        "campaign",
        "run",
        "--rounds",
        "1",
        "--out",
        str(tmp_path / "c"),
        "--set",
        f"benchmark.out={bench}",
        "--set",
        "benchmark.per_family=12",
        "--set",
        "campaign.seeds=1",
        "--set",
        "gate.n_boot=1000",
        "--set",
        "campaign.name=cli",
        "--set",
        "campaign.traces_per_round=0",
        *EXPLAINED,
    )
    assert code == 0, err[-3000:]
    assert "round 1:" in err
    assert "test (touched once)" in out and "summary:" in out
    assert (tmp_path / "c" / "summary.json").exists()


@pytest.mark.parametrize(
    "text, field",
    [
        ("campaign:\n  rounds: lots\n", "campaign.rounds"),
        ("campaign:\n  traces_per_round: -1\n", "campaign.traces_per_round"),
    ],
)
def test_bad_params_are_one_clear_line(capsys, tmp_path, text, field):
    bad = tmp_path / "params.yaml"
    bad.write_text(text)
    code, out, err = cli(capsys, "campaign", "run", "--params", str(bad))
    assert code == 2
    assert field in err and str(bad) in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_the_trace_count_defaults_to_the_old_constant():
    from components.params import load_params
    from components.tracking.mlflow_log import MAX_TRACES_PER_ROUND
    from tests.conftest import ROOT

    # params.yaml and the model agree with the constant it replaced: the default campaign logs what it logged
    assert load_params(ROOT / "params.yaml").campaign.traces_per_round == MAX_TRACES_PER_ROUND == 12
    assert load_params(None).campaign.traces_per_round == MAX_TRACES_PER_ROUND


def test_rounds_without_a_plan_retry_from_the_pool_and_ablate(small_campaign, camp, monkeypatch):
    """The small campaign (round 1 rejected by the gate with a positive net, round 2 promoting a card of two
    inferred rules), then rounds whose meta-agent has no plan left: the first gates round 1's plan again on fresh
    dev seeds (a look with its own share), the next ones drop one rule of round 2's card each (gated with the cost
    objective); each says so in its record, and the account of the campaign's alpha never passes campaign_alpha.
    The summary sets the champion's prompt tokens per episode beside the built-in packages."""
    import flows.round as fc
    from components.evolution.alpha import account
    from components.evolution.meta import PlanOutcome
    from components.evolution.record import AblationInfo, RetryInfo

    real = fc.plan_round
    monkeypatch.setattr(fc, "plan_round", lambda r, *a: real(r, *a) if r.no <= 2 else PlanOutcome())
    p = camp("idle", **{"campaign.rounds": 5})
    s = run_campaign(p)
    recs = Lineage(p.campaign.out + "/lineage").rounds()
    idle = [r for r in recs if r.retry or r.ablation]
    assert [bool(r.retry) for r in idle] == [True, False, False], [(r.round, r.verdict, r.reason[:60]) for r in recs]
    for r in idle:
        assert r.dev_look is not None or r.gate is None  # refused before the gate: no look, nothing spent
        if r.retry:
            assert isinstance(r.retry, RetryInfo) and min(r.retry.seeds) >= p.campaign.seeds
            if r.evaluation is not None:
                assert r.evaluation.seeds == r.retry.seeds
            assert r.plan_key == r.retry.plan_key
        if r.ablation:
            assert isinstance(r.ablation, AblationInfo) and r.ablation.parts >= 2 and r.repair is None
            if r.gate is not None:
                assert r.evaluation is not None and r.evaluation.gate.cheaper
    w = account(recs, p.gate.campaign_alpha, p.campaign.rounds, p.gate.campaign_spending)
    assert w.spent <= p.gate.campaign_alpha + 1e-12
    assert s["dev_looks"]["alpha_spent"] == pytest.approx(w.spent)
    pe = s["tokens"]["per_episode"]
    assert {"champion", "start", "seed", "all-skills", "reference"} <= set(pe) and pe["champion"] > 0
    assert all(r.tokens is not None and r.tokens.dev is not None for r in recs if r.gate is not None)


def test_a_campaign_with_futility_refunds_keeps_its_alpha_account(small_campaign, camp):
    """gate.futility_refund on (off by default): every dev look reserves its share, tests at a lower level, and is
    charged the whole share, or less only after a futility stop; the campaign's account of alpha, rebuilt from the
    lineage, stays within campaign_alpha and agrees with the summary."""
    from components.evolution.alpha import account

    p = camp("refund", **{"gate.futility_refund": True, "campaign.rounds": 3})
    s = run_campaign(p)
    recs = Lineage(p.campaign.out + "/lineage").rounds()
    looks = [r for r in recs if r.dev_look is not None and r.gate is not None]
    assert looks, [(r.round, r.verdict, r.reason[:60]) for r in recs]
    for r in looks:
        x, seq = r.dev_look, r.sequential.gate if r.sequential else None
        assert x.reserved is not None and x.charge is not None, r.round
        assert x.alpha / 2 < x.reserved  # the test runs below the share it reserved
        if seq is not None and seq.futile_at is not None and seq.futile_at < seq.looks:
            assert 0 < x.charge < x.reserved
        else:
            assert x.charge == pytest.approx(x.reserved)
    w = account(recs, p.gate.campaign_alpha, p.campaign.rounds, p.gate.campaign_spending)
    assert w.spent <= p.gate.campaign_alpha + 1e-12
    assert s["dev_looks"]["alpha_spent"] == pytest.approx(w.spent)


def test_a_campaign_with_the_cost_objective_tests_both_claims_and_says_which_promoted(small_campaign, camp):
    """gate.cheaper on (off by default): every gated round tests "better" and "cheaper", each at half its look's
    alpha; an accepted round says which claim promoted it, and the summary lists the rounds promoted as cheaper."""
    p = camp("cheaper", **{"gate.cheaper": True})
    s = run_campaign(p)
    recs = Lineage(p.campaign.out + "/lineage").rounds()
    gated = [r for r in recs if r.gate is not None]
    assert gated, [(r.round, r.verdict, r.reason[:60]) for r in recs]
    assert all(r.evaluation is not None and r.evaluation.gate.cheaper for r in gated)
    assert all(r.promoted_as is not None for r in recs if r.accepted)
    assert s["tokens"]["cheaper"] == [r.round for r in recs if r.promoted_as == "cheaper"]
