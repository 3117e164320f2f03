"""`ratchet export` and the offline learner: the exported files against the fine-tuning schema, their pins, the
held-out refusal, the MLflow dataset inputs, and a "fine-tune" that changes what the simulated agent does."""

from __future__ import annotations

import copy
import hashlib
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from components.outer.chat_schema import message_problems, problems
from components.outer.export import FILES, MANIFEST, read_jsonl, read_manifest
from tests.conftest import run_cli


@pytest.fixture(scope="module")
def exported(small_campaign, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("export") / "export"
    from components.outer.export import export_campaign

    export_campaign(small_campaign.out, small_campaign.params.benchmark.out, out)
    return out


def test_files_are_pinned_and_counted(exported):
    m = read_manifest(exported)
    assert sorted(m.files) == sorted(FILES)
    for name, f in m.files.items():
        data = (exported / name).read_bytes()
        assert f.sha256 == hashlib.sha256(data).hexdigest() and f.bytes == len(data)
        assert f.records == len(data.splitlines())
    assert m.split == "train" and m.champion != m.start  # the small campaign promoted once
    assert m.files["sft.jsonl"].records > 0 and m.files["preferences.jsonl"].records > 0
    # rollouts: every train episode of both arms
    assert m.files["rollouts.jsonl"].records == 2 * len(small_bench_train(m)) * m.seeds


def small_bench_train(m) -> list[str]:
    from components.worlds import load_benchmark

    return load_benchmark(Path(m.campaign_dir).parent / "bench").ids("train")


def test_a_changed_byte_is_refused(exported, tmp_path):
    from components.errors import InputError

    copy_ = tmp_path / "e"
    shutil.copytree(exported, copy_)
    p = copy_ / "sft.jsonl"
    p.write_bytes(p.read_bytes().replace(b'"role": "user"', b'"role": "User"', 1))
    with pytest.raises(InputError, match=r"sft\.jsonl: sha256: "):
        read_manifest(copy_)


def test_sft_records_are_fine_tuning_chat_records(exported):
    recs = read_jsonl(exported / "sft.jsonl")
    for r in recs:
        assert set(r) == {"messages", "tools"}
        assert problems(r) == [], problems(r)
        roles = [m["role"] for m in r["messages"]]
        assert roles[0] == "system" and "user" in roles and "tool" in roles
    # tool calls and their answers are there, with matching ids
    calls = [c for r in recs for m in r["messages"] if m["role"] == "assistant" for c in m.get("tool_calls") or []]
    assert calls and all(isinstance(json.loads(c["function"]["arguments"]), dict) for c in calls)


def _first_call(rec: dict) -> tuple[int, dict]:
    return next((i, m) for i, m in enumerate(rec["messages"]) if m["role"] == "assistant" and m.get("tool_calls"))


@pytest.mark.parametrize(
    "mutate, field",
    [
        (lambda r: r["messages"].__setitem__(0, {"role": "robot", "content": "x"}), "messages.0"),
        (lambda r: _first_call(r)[1]["tool_calls"][0].__setitem__("id", "call_zzz"), "tool_call_id"),
        (lambda r: _first_call(r)[1]["tool_calls"][0]["function"].__setitem__("arguments", {"a": 1}), "arguments"),
        (lambda r: _first_call(r)[1]["tool_calls"][0]["function"].__setitem__("arguments", "[1]"), "arguments"),
        (
            lambda r: _first_call(r)[1]["tool_calls"][0]["function"].__setitem__("name", "no_such_tool"),
            "not one of tools",
        ),
        (lambda r: r["messages"].pop(_first_call(r)[0] + 1), "has no tool message"),
        (lambda r: r.__setitem__("item_id", "x"), "item_id"),
    ],
)
def test_the_schema_refuses_broken_records(exported, mutate, field):
    rec = copy.deepcopy(read_jsonl(exported / "sft.jsonl")[0])
    assert problems(rec) == []
    mutate(rec)
    assert any(field in p for p in problems(rec)), problems(rec)


def test_preferences_are_trl_pairs_of_one_item_and_seed(exported):
    pairs = read_jsonl(exported / "preferences.jsonl")
    rollouts = {(r["item_id"], r["seed"], r["arm"]): r for r in read_jsonl(exported / "rollouts.jsonl")}
    for p in pairs:
        for field in ("prompt", "chosen", "rejected"):
            assert message_problems(p[field], field) == []
        assert p["chosen"] != p["rejected"] and p["chosen"][0]["role"] == "assistant"
        win, lose = rollouts[(p["item_id"], p["seed"], "champion")], rollouts[(p["item_id"], p["seed"], "start")]
        assert win["success"] and not lose["success"]
        # prompt + completion is each arm's conversation (the memory message left out)
        assert p["prompt"] + p["chosen"] == conversation(win) and p["prompt"] + p["rejected"] == conversation(lose)


def conversation(rollout: dict) -> list[dict]:
    """The policy and the conversation, without the memory message."""
    from components.runtime.prompts import MEMORY_HEADER

    msgs = rollout["messages"]
    return [msgs[0], *msgs[2 if msgs[1]["content"].startswith(MEMORY_HEADER) else 1 :]]


def test_rollout_rewards_are_the_rubric_over_its_criteria(exported):
    for r in read_jsonl(exported / "rollouts.jsonl"):
        w, s = r["weights"], r["criteria"]
        assert set(w) == set(s)
        assert r["reward"] == pytest.approx(sum(w[k] * s[k] for k in w) / sum(w.values()), abs=1e-6)  # rounded to 6


def test_each_file_loads_as_a_table(exported):
    """With `datasets` when it is installed (the trainer's loader), else with pandas/pyarrow (the same JSON lines)."""
    m = read_manifest(exported)
    try:
        import datasets
    except ImportError:
        datasets = None
    for name, f in m.files.items():
        if datasets is not None:
            ds = datasets.load_dataset("json", data_files=str(exported / name), split="train")
            assert ds.num_rows == f.records
        else:
            df = pd.read_json(exported / name, lines=True)
            assert len(df) == f.records
    if datasets is None:
        df = pd.read_json(exported / "preferences.jsonl", lines=True)
        assert {"prompt", "chosen", "rejected"} <= set(df.columns)


@pytest.mark.parametrize("split", ["dev", "test"])
def test_held_out_splits_are_refused(capsys, small_campaign, tmp_path, split):
    code, _, err = run_cli(
        capsys,
        "export",
        "--campaign",
        str(small_campaign.out),
        "--benchmark",
        str(small_campaign.params.benchmark.out),
        "--out",
        str(tmp_path / "x"),
        "--split",
        split,
        "--no-mlflow",
    )
    assert code == 2 and err.startswith(f"error: --split: {split}: export reads train items only")
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "x").exists()


def test_the_export_is_deterministic_and_logged_as_dataset_inputs(capsys, small_campaign, exported, tmp_path):
    from mlflow import MlflowClient

    from components.io import read_json_object
    from components.tracking.mlflow_log import campaign_run

    out = tmp_path / "again"
    code, stdout, err = run_cli(
        capsys,
        "export",
        "--campaign",
        str(small_campaign.out),
        "--benchmark",
        str(small_campaign.params.benchmark.out),
        "--out",
        str(out),
    )
    assert code == 0, err
    for name in (*FILES, MANIFEST):
        assert (out / name).read_bytes() == (exported / name).read_bytes()
    summary = read_json_object(small_campaign.out / "summary.json")
    client = MlflowClient()
    run = client.get_run(campaign_run(client, summary, small_campaign.out))
    m = read_manifest(out)
    got = {d.dataset.name: ({t.key: t.value for t in d.tags}, d.dataset.digest) for d in run.inputs.dataset_inputs}
    for name, f in m.files.items():
        tags, digest = got[f"{m.campaign}/{m.champion}/{name.removesuffix('.jsonl')}"]
        assert tags["mlflow.data.context"] == "training" and tags["ratchet.source"] == "campaign"
        assert tags["ratchet.champion"] == m.champion and tags["ratchet.sha256"] == f.sha256
        assert digest == f.sha256[:32]


def test_a_fine_tune_on_the_export_teaches_the_simulated_agent(exported, small_campaign):
    """The learner learns the facts the exported successes demonstrate; the trained agent then applies them with no
    card: the start package (no cards) scores higher on train under it."""
    from components.outer.learn import learn_sim
    from components.runtime.evaluate import run_shard

    spec = learn_sim(exported)
    learned = spec.model_cfg["learned"]
    assert learned and spec.name.startswith("ratchet-sim-ft-") and learn_sim(exported) == spec  # deterministic
    m = read_manifest(exported)
    bench = small_campaign.params.benchmark.out
    items = small_bench_train(m)[:12]
    start = Path(small_campaign.out) / "lineage" / "versions" / m.start
    before = run_shard(start, bench, items, [0], "sim", {})
    after = run_shard(start, bench, items, [0], "sim", spec.campaign_cfg())
    assert after.scores["score"].mean() > before.scores["score"].mean()


# -- the third red team (issue 41): what export reads is what it pins, and nothing outside its place -------------------


def _copy_campaign(small_campaign, tmp_path) -> Path:
    camp = tmp_path / "camp"
    shutil.copytree(small_campaign.out, camp)
    return camp


def test_export_refuses_a_promoted_version_whose_bytes_were_edited(capsys, small_campaign, tmp_path):
    """export pinned the lineage's digest of the champion while reading edited bytes (reproduce refused the same)."""
    from components.evolution.lineage import Lineage

    camp = _copy_campaign(small_campaign, tmp_path)
    champ = Lineage(camp / "lineage").champion()
    card = sorted((champ.path / "em").rglob("*.md"))[0]
    card.write_text(card.read_text() + "\nOne more line.\n")
    code, _, err = run_cli(
        capsys,
        "export",
        "--campaign",
        str(camp),
        "--benchmark",
        str(small_campaign.params.benchmark.out),
        "--out",
        str(tmp_path / "x"),
        "--no-mlflow",
    )
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"error: {champ.path}: digest: {champ.name}'s bytes on disk are ") and "pins" in err
    assert not (tmp_path / "x").exists()


def test_export_on_a_truncated_traces_file_is_one_line_naming_it(capsys, small_campaign, tmp_path):
    camp = _copy_campaign(small_campaign, tmp_path)
    for f in camp.glob("rounds/r*/train/traces.parquet"):
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    code, _, err = run_cli(
        capsys,
        "export",
        "--campaign",
        str(camp),
        "--benchmark",
        str(small_campaign.params.benchmark.out),
        "--out",
        str(tmp_path / "x"),
        "--no-mlflow",
    )
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "traces.parquet: -: damaged, cannot be read" in err and not (tmp_path / "x").exists()


def test_export_takes_the_benchmark_the_campaign_recorded(capsys, small_campaign, exported, tmp_path, monkeypatch):
    """`--benchmark` was required (default data/benchmarks/retail) although summary.json records it."""
    monkeypatch.chdir(tmp_path)  # the record's path is absolute here (the campaign ran outside this directory)
    code, _, err = run_cli(capsys, "export", "--campaign", str(small_campaign.out), "--out", "x", "--no-mlflow")
    assert code == 0, err
    for name in (*FILES, MANIFEST):
        assert (tmp_path / "x" / name).read_bytes() == (exported / name).read_bytes()


@pytest.mark.parametrize("where", ["../outside.jsonl", "/etc/hostname"])
def test_learn_sim_refuses_a_manifest_entry_outside_the_export(capsys, exported, tmp_path, where):
    e = tmp_path / "e"
    shutil.copytree(exported, e)
    outside = tmp_path / "outside.jsonl"
    shutil.copy(e / "sft.jsonl", outside)
    m = json.loads((e / MANIFEST).read_text())
    m["files"]["sft.jsonl"]["path"] = where
    (e / MANIFEST).write_text(json.dumps(m))
    code, _, err = run_cli(capsys, "outer", "learn-sim", "--export", str(e), "--out", str(tmp_path / "m.json"))
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"error: {e / MANIFEST}: files.sft.jsonl.path: {where!r}: must name a place inside")
    assert not (tmp_path / "m.json").exists()
