"""MLflow records of a campaign (nested runs, tags, lineage) and `ratchet reproduce` of a promotion, all read from
the session's shared small campaign (tests/conftest.py)."""

from __future__ import annotations

import json

import pytest
from mlflow import MlflowClient

from components.memory.package import digest
from tests.conftest import run_cli as cli

ROUND_TAGS = (
    "ratchet.parent_digest",
    "ratchet.candidate_digest",
    "ratchet.benchmark_digest",
    "ratchet.git_commit",
    "ratchet.dvc_lock",
    "ratchet.seed_map_hash",
    "ratchet.verdict",
)
# the dev seed map is the gate's: a round rejected before the gate (invalid plan, repair screen) did not look at dev
GATE_TAGS = ("ratchet.seed_map_hash",)
# every round that patched a candidate records its digest and the benchmark's, whether or not it reached the gate
CANDIDATE_TAGS = ("ratchet.candidate_digest", "ratchet.benchmark_digest")


@pytest.fixture
def campaign(small_campaign):
    return small_campaign.out, small_campaign.summary


def test_mlflow_has_nested_runs_tags_and_lineage(campaign):
    out, s = campaign
    client = MlflowClient()
    exp = client.get_experiment_by_name(s["mlflow"]["experiment"])
    assert exp is not None and exp.experiment_id == s["mlflow"]["experiment_id"]
    runs = client.search_runs([exp.experiment_id], max_results=500)
    by_parent: dict[str, list] = {}
    for r in runs:
        by_parent.setdefault(r.data.tags.get("mlflow.parentRunId"), []).append(r)
    top = client.get_run(s["mlflow"]["run_id"])
    assert top.data.tags["ratchet.kind"] == "campaign"
    rounds = [r for r in by_parent[top.info.run_id] if r.data.tags["ratchet.kind"] == "round"]
    assert sorted(int(r.data.tags["ratchet.round"]) for r in rounds) == list(range(1, s["rounds"] + 1))
    for r in rounds:
        rd = out / "rounds" / f"r{int(r.data.tags['ratchet.round']):02d}"
        gated, patched = (rd / "gate.json").exists(), (rd / "candidate").is_dir()
        assert patched or not gated
        need = set(ROUND_TAGS) - set(GATE_TAGS) - set(CANDIDATE_TAGS)
        need |= set(CANDIDATE_TAGS) if patched else set()
        need |= set(GATE_TAGS) if gated else set()
        for tag in sorted(need):
            assert r.data.tags.get(tag), (tag, r.info.run_name)
        if patched:  # the digests of the bytes this round patched and evaluated, not just any value
            assert r.data.tags["ratchet.candidate_digest"] == digest(rd / "candidate"), r.info.run_name
            assert r.data.tags["ratchet.benchmark_digest"] == s["benchmark_digest"], r.info.run_name
        evals = by_parent.get(r.info.run_id, [])
        assert {(e.data.tags["ratchet.split"], e.data.tags["ratchet.arm"]) for e in evals} >= {("train", "base")}
        if r.data.tags["ratchet.verdict"] == "accept":
            assert {"net", "ci_lo", "ci_hi", "n_improved", "n_regressed", "dev_base_mean", "dev_cand_mean"} <= set(
                r.data.metrics
            )
            assert {("dev", "base"), ("dev", "cand")} <= {
                (e.data.tags["ratchet.split"], e.data.tags["ratchet.arm"]) for e in evals
            }
            artifacts = {a.path for a in client.list_artifacts(r.info.run_id)}
            assert {"plan.json", "diagnosis.json", "gate_items.csv", "validation.json"} <= artifacts
    # the champion's lineage M0 -> M1 -> ... is on the campaign run
    lineage = top.data.tags["ratchet.lineage"]
    assert lineage.startswith("M0 (") and all(v["digest"][:12] in lineage for v in s["lineage"])
    assert top.data.metrics["test_net"] == pytest.approx(s["test"]["net"])
    assert {
        e.data.tags["ratchet.arm"] for e in by_parent[top.info.run_id] if e.data.tags["ratchet.kind"] == "evaluation"
    } == {"start", "champion"}


class Result:
    def __init__(self, code: int, out: str, err: str):
        self.returncode, self.stdout, self.stderr = code, out, err


@pytest.fixture
def reproduce(capsys):
    """`ratchet reproduce ...` in this process (the entry point's error handling included)."""
    return lambda *args: Result(*cli(capsys, "reproduce", *args))


def test_reproduce_a_promotion_is_identical(small_campaign, campaign, reproduce):
    from components.worlds import load_benchmark

    out, s = campaign
    bench = load_benchmark(small_campaign.params.benchmark.out)
    promoted = [v["version"] for v in s["lineage"][1:]]
    assert promoted
    r = reproduce("--version", promoted[-1], "--campaign", str(out), "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    result = json.loads(r.stdout)
    assert result["identical"] and result["verdict_matches"] and result["differences"] == []
    assert result["n_items"] == len(bench.ids("dev"))


def test_reproduce_by_mlflow_round_run_id(campaign, reproduce):
    out, s = campaign
    first = next(
        json.loads(line)
        for line in (out / "lineage" / "lineage.jsonl").read_text().splitlines()
        if json.loads(line).get("verdict") == "accept"
    )  # the round that promoted M1
    run_id = _round_runs(MlflowClient(), s["mlflow"]["run_id"], s["mlflow"]["experiment_id"])[
        first["round"]
    ].info.run_id
    r = reproduce("--run-id", run_id, "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout)["version"] == "M1"


def test_tampered_version_is_refused_naming_the_digest(campaign, reproduce, tmp_path):
    import shutil

    out, s = campaign
    copy = tmp_path / "camp"
    shutil.copytree(out, copy)
    card_dir = copy / "lineage" / "versions" / "M1"
    manifest = card_dir / "manifest.yaml"
    manifest.write_text(manifest.read_text() + "\n")
    r = reproduce("--version", "M1", "--campaign", str(copy))
    assert r.returncode == 2
    assert "digest mismatch" in r.stderr and str(card_dir) in r.stderr and "Traceback" not in r.stderr


def test_reproduce_an_unknown_version_is_a_clear_error(campaign, reproduce):
    out, _ = campaign
    r = reproduce("--version", "M99", "--campaign", str(out))
    assert r.returncode == 2 and "M99" in r.stderr and "promoted" in r.stderr


def _round_runs(client, campaign_run_id: str, experiment_id: str) -> dict[int, object]:
    runs = client.search_runs(
        [experiment_id], f"tags.mlflow.parentRunId = '{campaign_run_id}' and tags.`ratchet.kind` = 'round'"
    )
    return {int(r.data.tags["ratchet.round"]): r for r in runs}


def test_round_runs_carry_params_and_a_description(small_campaign):
    from components.evolution.report import ci_level

    s, p = small_campaign.summary, small_campaign.params
    client = MlflowClient()
    top = client.get_run(s["mlflow"]["run_id"])
    # campaign runs can be told apart: name, short commit, params hash
    assert top.info.run_name.startswith(f"campaign {s['campaign']} @")
    assert top.data.tags["ratchet.params_hash"] in top.info.run_name
    assert top.data.tags["ratchet.git_commit"][:7] in top.info.run_name
    rounds = _round_runs(client, top.info.run_id, s["mlflow"]["experiment_id"])
    for rec in s["history"]:
        r = rounds[rec["round"]]
        assert r.data.params["gate.alpha"] == str(p.gate.alpha) and r.data.params["gate.n_boot"] == str(p.gate.n_boot)
        assert r.data.params["gate.material"] == str(p.gate.material) and r.data.params["gate.reg_cap"] == str(
            p.gate.reg_cap
        )
        assert r.data.params["seeds"] == str(p.campaign.seeds) and r.data.params["meta_agent"] == p.campaign.meta_agent
        assert r.data.params["model"] == p.campaign.model
        note = r.data.tags["mlflow.note.content"]
        assert note.startswith(f"Round {rec['round']} on champion ") and "Verdict:" in note
        if rec["verdict"] == "accept":
            assert f"committed as {rec['child']['version']}" in note and rec["summary"] in note
        # a list of rounds reads verdict and net first; why a round was rejected is a field, not only prose
        g = rec.get("gate") or {}
        assert r.info.run_name.startswith(f"r{rec['round']} {rec['verdict']}" + (f" net {g['net']:+.3f}" if g else ""))
        assert r.data.params["reason"] == (rec.get("reason") or "-")[:6000] == r.data.tags["ratchet.reason"]
        # one statement of the interval: the level the gate used, as a metric, in the description, as the CLI says it
        if g:
            level = ci_level(rec)
            assert level is not None and 0 < level < 1 and r.data.metrics["ci_level"] == pytest.approx(level)
            assert f"net {g['net']:+.3f}, {100 * level:.4g}% CI [{g['ci_lo']:+.3f}, {g['ci_hi']:+.3f}]" in note
            assert "95% CI" not in note
        assert r.data.params["gate.look_alpha"] == str(rec["dev_look"]["alpha"]) if rec.get("dev_look") else True
        if rec.get("dev_look"):
            assert r.data.metrics["look_alpha"] == pytest.approx(rec["dev_look"]["alpha"])
        assert "gate_alpha" not in r.data.metrics  # was the look's alpha under the name of the param gate.alpha
        # the evaluations under a round can be told apart by name: split, arm and look
        evals = client.search_runs([s["mlflow"]["experiment_id"]], f"tags.mlflow.parentRunId = '{r.info.run_id}'")
        names = [e.info.run_name for e in evals]
        assert len(set(names)) == len(names) and all(n.startswith(f"r{rec['round']} ") for n in names), names


def test_the_experiment_names_its_identity_and_the_flow_run_links_both_ways(small_campaign, prefect_server):
    from uuid import UUID

    from prefect.client.orchestration import get_client

    from components.tracking.mlflow_log import campaign_identity, identity_hash, tracking_names

    s, ml = small_campaign.summary, small_campaign.summary["mlflow"]
    client = MlflowClient()
    exp = client.get_experiment(ml["experiment_id"])
    names = tracking_names(json.loads((small_campaign.out / "summary.json").read_text()))
    assert exp.name == names["experiment"] == ml["experiment"] and ml["registered_model"] == names["registered_model"]
    assert names["identity"] == identity_hash(campaign_identity(s["params"], s["start_digest"], s["benchmark_digest"]))
    # filed by the UI as model training, not as GenAI evaluation runs
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"
    assert (
        f"`{names['identity']}`" in exp.tags["mlflow.note.content"]
        and "campaign.rounds" in exp.tags["mlflow.note.content"]
    )
    # another number of rounds is another campaign: every look spends campaign_alpha / rounds
    other = {**s["params"], "campaign": {**s["params"]["campaign"], "rounds": s["params"]["campaign"]["rounds"] + 1}}
    assert identity_hash(campaign_identity(other, s["start_digest"], s["benchmark_digest"])) != names["identity"]
    top = client.get_run(ml["run_id"])
    fid = top.data.tags["ratchet.prefect_flow_run"]
    with get_client(sync_client=True) as prefect:
        assert f"mlflow:{ml['run_id']}" in prefect.read_flow_run(UUID(fid)).tags
    # the links the CLI prints: the rounds compared, the champion's version, a cited trace
    links = ml["links"]
    assert all(
        rid in links["rounds"]
        for rid in (
            r.info.run_id
            for r in client.search_runs(
                [ml["experiment_id"]], f"tags.mlflow.parentRunId = '{ml['run_id']}' and tags.`ratchet.kind` = 'round'"
            )
        )
    )
    champion = client.get_model_version_by_alias(ml["registered_model"], "champion")
    # each opens in the UI's "Machine learning" mode (MLflow 3.17 reads the mode from the address, not the experiment)
    assert all(link.endswith("workflowType=machine_learning") for link in links.values()), links
    assert links["champion"].endswith(
        f"/#/models/{ml['registered_model']}/versions/{champion.version}?workflowType=machine_learning"
    )
    # the gate's net and CI by round first (the campaign run's stepped metrics), not the compare view's chart
    assert list(links)[:2] == ["campaign", "net by round"]
    assert links["net by round"].endswith(
        f"/#/experiments/{ml['experiment_id']}/runs/{ml['run_id']}/model-metrics?workflowType=machine_learning"
    )
    assert {m.key for m in client.get_metric_history(ml["run_id"], "round_net")} == {"round_net"}
    trace_id = links["trace"].rsplit("selectedEvaluationId=", 1)[1].split("&", 1)[0]
    assert client.get_trace(trace_id).info.experiment_id == ml["experiment_id"]


def test_campaign_metrics_are_stepped_by_round_and_only_gated_rounds_have_a_net(small_campaign):
    s = small_campaign.summary
    client = MlflowClient()
    rid = s["mlflow"]["run_id"]
    gated = [r["round"] for r in s["history"] if r.get("gate")]
    assert [m.step for m in client.get_metric_history(rid, "round_net")] == gated
    champ = {m.step: m.value for m in client.get_metric_history(rid, "champion_dev_mean")}
    held = None  # the mean the champion was promoted on, until the next promotion (the start's: its first look)
    for r in s["history"]:
        if r.get("gate"):
            held = (
                r["gate"]["cand_mean"]
                if r["verdict"] == "accept"
                else (held if held is not None else r["gate"]["base_mean"])
            )
            assert champ[r["round"]] == pytest.approx(held)
    promotions = {m.step: m.value for m in client.get_metric_history(rid, "promotions")}
    assert promotions[max(promotions)] == s["accepted"]


def test_every_version_is_a_registered_model_version_with_lineage(small_campaign):
    s = small_campaign.summary
    client = MlflowClient()
    name = s["mlflow"]["registered_model"]
    versions = {v.tags["ratchet.version"]: v for v in client.search_model_versions(f"name = '{name}'")}
    rounds = _round_runs(client, s["mlflow"]["run_id"], s["mlflow"]["experiment_id"])
    assert sorted(versions) == sorted(v["version"] for v in s["lineage"])  # once each
    champion = client.get_model_version_by_alias(name, "champion")
    assert champion.tags["ratchet.version"] == s["champion"] and champion.tags["ratchet.digest"] == s["champion_digest"]
    # walk the lineage back from the champion through the parent tags, version to version
    walk, v = [], champion
    while v is not None:
        walk.append((v.tags["ratchet.version"], v.tags["ratchet.digest"]))
        parent = v.tags.get("ratchet.parent_model_version")
        v = client.get_model_version(name, parent) if parent else None
    assert walk[::-1] == [(x["version"], x["digest"]) for x in s["lineage"]]
    for rec in (r for r in s["history"] if r["verdict"] == "accept"):
        mv = versions[rec["child"]["version"]]
        model = client.get_logged_model(mv.tags["ratchet.model_id"])
        assert mv.source == model.artifact_location and model.name == f"{s['campaign']}-{rec['child']['version']}"
        # ... and the logged model's page lists the version it is registered as
        assert [(d["name"], str(d["version"])) for d in json.loads(model.tags["mlflow.modelVersions"])] == [
            (name, str(mv.version))
        ]
        # the UI walks the lineage: the version's description links its parent version's page, and its logged model
        assert (
            f"](#/experiments/{s['mlflow']['experiment_id']}/models/{model.model_id}?workflowType=machine_learning)"
        ) in mv.description
        parent = versions[rec["parent"]["version"]]
        assert f"](#/models/{name}/versions/{parent.version}?workflowType=machine_learning)" in mv.description
        assert mv.tags["ratchet.parent_model_version"] == str(parent.version)
        assert model.tags["ratchet.parent_digest"] == rec["parent"]["digest"]
        assert "wm.max_entries" in model.params and "cards" in model.params
        metrics = {m.key: m.value for m in model.metrics}
        assert metrics["net"] == pytest.approx(rec["gate"]["net"]) and metrics["ci_lo"] == pytest.approx(
            rec["gate"]["ci_lo"]
        )
        assert metrics["dev_cand_mean"] == pytest.approx(rec["gate"]["cand_mean"])
        # ... the very points of its round run, which holds each gate figure once (no second point, no extra key)
        rr = rounds[rec["round"]]
        assert mv.run_id == rr.info.run_id and set(metrics) <= set(rr.data.metrics)
        assert [len(client.get_metric_history(rr.info.run_id, k)) for k in metrics] == [1] * len(metrics)


def test_cited_failed_episodes_are_traces_linked_to_their_round(small_campaign):
    import pandas as pd
    from mlflow.environment_variables import MLFLOW_ASYNC_TRACE_LOGGING_MAX_WORKERS

    s = small_campaign.summary
    client = MlflowClient()
    # a SQLite store takes traces from one export thread (concurrent exporters lost traces to "database is locked")
    assert client.tracking_uri.startswith("sqlite") and MLFLOW_ASYNC_TRACE_LOGGING_MAX_WORKERS.get() == 1
    steps = pd.read_parquet(small_campaign.out / "rounds/r01/train/traces.parquet")
    # when each turn and phase ran: beside the traces table (which stays byte-identical), not in it
    timings = pd.read_parquet(small_campaign.out / "rounds/r01/train/.timings.parquet")
    assert set(timings.groupby(["item_id", "seed", "step"]).groups) == set(
        steps.groupby(["item_id", "seed", "step"]).groups
    )
    assert not set(timings.columns) & set(steps.columns) - {"item_id", "seed", "step"}
    exp_id = s["mlflow"]["experiment_id"]
    rounds = _round_runs(client, s["mlflow"]["run_id"], exp_id)
    r1 = rounds[1]
    traces = client.search_traces(locations=[exp_id], run_id=r1.info.run_id)
    assert traces, "no trace for round 1's cited episodes"
    packets = {p["id"]: p for p in json.loads((small_campaign.out / "rounds/r01/diagnosis.json").read_text())}
    for t in traces:
        pk = packets[t.info.tags["ratchet.packet"]]
        episode = t.info.tags["ratchet.episode"]
        assert any(c["episode_id"] == episode for claim in pk["claims"] for c in claim["evidence"])
        names = [sp.name for sp in t.data.spans]
        assert names[0] == f"episode {episode}"
        # every span reached the store: the root, and per turn its span and one per kernel phase as it ran
        ran = timings[timings["item_id"] + "#" + timings["seed"].astype(str) == episode]
        n_turns = int((steps["episode_id"] == episode).sum())
        assert ran["step"].nunique() == n_turns and len(names) == 1 + len(ran), episode
        for phase in ("memory delivered", "model call", "checker verdicts", "tool call"):
            assert phase in names
        # ... each with the real start and end the kernel recorded (not 1 ms ticks), nested in its turn
        assert t.data.spans[0].attributes["ratchet.timing"] == f"{n_turns} of {n_turns} turns timed as they ran"
        assert sorted((sp.start_time_ns, sp.end_time_ns) for sp in t.data.spans[1:]) == sorted(
            zip(ran["start_ns"].astype(int), ran["end_ns"].astype(int))
        )
        by_id = {sp.span_id: sp for sp in t.data.spans}
        for sp in t.data.spans[1:]:
            up = by_id[sp.parent_id]
            assert up.start_time_ns <= sp.start_time_ns <= sp.end_time_ns <= up.end_time_ns, sp.name
        assert len({sp.end_time_ns - sp.start_time_ns for sp in t.data.spans}) > 2
        assert any(n.endswith("(cited)") for n in names)
        # the round's description links each claim to the traces of the episodes it cites: the line holding this
        # trace's link names its packet and a claim of that packet citing this episode
        links = [
            ln
            for ln in r1.data.tags["mlflow.note.content"].splitlines()
            if f"selectedEvaluationId={t.info.trace_id}&workflowType=machine_learning)" in ln
        ]
        assert links, t.info.trace_id
        claims = [c["statement"][:100] for c in pk["claims"] if any(e["episode_id"] == episode for e in c["evidence"])]
        for ln in links:
            assert f"packet `{pk['id']}`" in ln and any(st in ln for st in claims), ln
            assert f"[{episode}, turn " in ln


def test_logging_the_same_campaign_again_adds_nothing(small_campaign, monkeypatch):
    """A rerun, a resume or a forced `dvc repro` (which deletes the output) finds its runs again, in the store."""
    import components.tracking.mlflow_log as mlflow_log
    from components.tracking.mlflow_log import CampaignTracker

    s, p, out = small_campaign.summary, small_campaign.params, small_campaign.out
    client = MlflowClient()
    # the same code as the campaign ran with (this session's checkout may have changed since)
    commit = client.get_run(s["mlflow"]["run_id"]).data.tags["ratchet.git_commit"]
    monkeypatch.setattr(mlflow_log, "git_commit", lambda *a, **k: commit)
    exp_id = s["mlflow"]["experiment_id"]
    before = {r.info.run_id for r in client.search_runs([exp_id], max_results=5000)}
    versions = len(client.search_model_versions(f"name = '{s['mlflow']['registered_model']}'"))
    t = CampaignTracker(p.campaign.name, out, p.model_dump(), p.campaign.tracking_uri)
    assert t.run_id == s["mlflow"]["run_id"]
    for rec in s["history"]:
        t.log_round(rec)
    t.finish(
        json.loads((out / "summary.json").read_text()),
        out / "summary.json",
        [{"split": "test", "arm": "x", "package_digest": "-", "summary": {}}],
    )
    assert {r.info.run_id for r in client.search_runs([exp_id], max_results=5000)} == before
    assert len(client.search_model_versions(f"name = '{s['mlflow']['registered_model']}'")) == versions
    tests = client.search_runs(
        [exp_id], f"tags.mlflow.parentRunId = '{s['mlflow']['run_id']}' and tags.`ratchet.split` = 'test'"
    )
    assert sorted(r.data.tags["ratchet.arm"] for r in tests) == ["champion", "start"]  # the test split, shown once


def test_report_writes_tables_and_offline_images(small_campaign, capsys, tmp_path):
    import pandas as pd

    s = small_campaign.summary
    code, out, err = cli(capsys, "report", "--campaign", str(small_campaign.out), "--out", str(tmp_path / "r"))
    assert code == 0, err
    for name in ("rounds", "champion", "causes", "families"):
        png = (tmp_path / "r" / f"{name}.png").read_bytes()
        assert png.startswith(b"\x89PNG") and len(png) > 5000  # a drawn figure, not the empty-data placeholder
    rounds = pd.read_csv(tmp_path / "r" / "rounds.csv")
    assert list(rounds["round"]) == [r["round"] for r in s["history"]]
    first = json.loads((small_campaign.out / "rounds/r01/diagnosis.json").read_text())
    findings = pd.read_csv(small_campaign.out / "rounds/r01/findings.csv", keep_default_na=False)
    causes = [c for c in rounds.columns if c.startswith("causes_")]
    assert causes and int(rounds.loc[0, causes].sum()) == len(findings) and first
    accepted = [r for r in s["history"] if r["verdict"] == "accept"]
    last = rounds.set_index("round").loc[accepted[-1]["round"], "champion_dev_mean"]
    assert last == pytest.approx(accepted[-1]["gate"]["cand_mean"])
    # the figures as data for `dvc plots` (dvc.yaml), fixed columns so two experiments overlay: the gate per gated
    # round with the level of its CI, causes per round with every owner a column
    from components.evolution.report import ci_level

    gated = [r for r in s["history"] if r.get("gate")]
    gate = pd.read_csv(tmp_path / "r" / "plots" / "gate.csv")
    assert list(gate["round"]) == [r["round"] for r in gated]
    assert list(gate["ci_level"]) == pytest.approx([ci_level(r) for r in gated])
    assert list(gate["accepted"]) == [int(r["verdict"] == "accept") for r in gated]
    plotted = pd.read_csv(tmp_path / "r" / "plots" / "causes.csv")
    assert list(plotted.columns) == ["round", "E", "W", "rho", "C", "none"]
    assert int(plotted.loc[0, ["E", "W", "rho", "C", "none"]].sum()) == len(findings)
    families = pd.read_csv(tmp_path / "r" / "plots" / "families.csv")
    assert list(families.columns) == ["family", "start", "champion"] and len(families) > 1
    # the report is Ratchet's own output: written again over itself, it is replaced, not refused
    files = lambda: {  # noqa: E731
        p.relative_to(tmp_path).as_posix(): p.read_bytes()  # noqa: E731
        for p in sorted((tmp_path / "r").rglob("*"))
        if p.is_file()
    }
    first_bytes = files()
    code, out, err = cli(capsys, "report", "--campaign", str(small_campaign.out), "--out", str(tmp_path / "r"))
    assert code == 0, err
    assert files() == first_bytes


def test_the_typed_round_record_writes_what_the_campaign_wrote(campaign):
    """Every round of the campaign, read typed from the lineage, round.json and summary.json, writes back the same
    bytes (the stages' results held as GateResult, RepairResult, looks and the evaluation)."""
    from components.evolution.gate import GateResult, RepairResult
    from components.evolution.record import RoundRecord
    from components.io import dumps

    out, s = campaign
    lines = [json.loads(x) for x in (out / "lineage" / "lineage.jsonl").read_text().splitlines() if x.strip()]
    rounds = [x for x in lines if x["round"] > 0]
    from components.evolution.lineage import Lineage
    from components.evolution.record import StartRecord

    start, *typed = Lineage(out / "lineage").entries()  # the start record typed as well
    assert isinstance(start, StartRecord) and start.child.version == "M0" and start.identity
    assert json.dumps(start.dump(), sort_keys=True) == json.dumps(lines[0], sort_keys=True)
    assert [r.dump() for r in typed] == [RoundRecord.of(x).dump() for x in rounds]
    assert len(rounds) == s["rounds"] and any("gate" in x for x in rounds) and any("repair" in x for x in rounds)
    for x in rounds:
        rec = RoundRecord.of(x)
        assert json.dumps(rec.dump(), sort_keys=True) == json.dumps(x, sort_keys=True)  # the lineage's line
        assert rec.gate is None or isinstance(rec.gate, GateResult)
        assert rec.repair is None or isinstance(rec.repair, RepairResult)
        text = (out / rec.round_dir / "round.json").read_text()
        assert dumps(RoundRecord.of(json.loads(text)).dump()) == text  # round.json, byte for byte
    assert [json.dumps(RoundRecord.of(h).dump(), sort_keys=True) for h in s["history"]] == [
        json.dumps(h, sort_keys=True) for h in s["history"]
    ]


def test_params_and_tags_are_as_records_spell_them(small_campaign):
    """`benchmark.receipts` was logged as `ReceiptMode.explained`; tags held this machine's absolute paths where the
    params hold the recorded ones; a rejected round carried empty tags (`ratchet.version`)."""
    s, ml = small_campaign.summary, small_campaign.summary["mlflow"]
    client = MlflowClient()
    top = client.get_run(ml["run_id"])
    assert top.data.params["benchmark.receipts"] == "explained"
    assert top.data.tags["ratchet.out"] == s["params"]["campaign"]["out"]  # the recorded form, as the params
    rounds = client.search_runs(
        [ml["experiment_id"]], f"tags.mlflow.parentRunId = '{ml['run_id']}' and tags.`ratchet.kind` = 'round'"
    )
    for r in rounds:
        assert "" not in r.data.tags.values(), r.info.run_name
        assert r.data.tags["ratchet.campaign_out"] == s["params"]["campaign"]["out"]
        assert "mechanism ?" not in r.data.tags["mlflow.note.content"]
