"""The outer round: the removal gate's two objectives, the trained model's identity, and one offline outer round
(export -> train -> register -> prune -> inner campaign) on the shared small campaign."""

from __future__ import annotations

import json
import shutil

import pandas as pd

from components.evolution.gate import GateConfig, removal_decide
from tests.conftest import run_cli

CFG = GateConfig(n_boot=2000)


def _arm(scores: list[float], tokens: list[int]) -> pd.DataFrame:
    return pd.DataFrame(
        {"item_id": [f"i{k}" for k in range(len(scores))], "seed": 0, "score": scores, "tokens_in": tokens, "error": ""}
    )


def test_a_removal_that_keeps_the_score_and_saves_tokens_is_kept():
    base = _arm([1.0, 0.5] * 10, [1000] * 20)
    v = removal_decide(base, _arm([1.0, 0.5] * 10, [900, 880] * 10), CFG)
    assert v.accept and v.tokens_ci_hi < 0 and v.ci_lo == 0 == v.ci_hi


def test_a_removal_that_costs_score_beyond_material_is_refused():
    base = _arm([1.0] * 20, [1000] * 20)
    v = removal_decide(base, _arm([1.0] * 14 + [0.0] * 6, [900] * 20), CFG)
    assert not v.accept and "below -material" in v.reason


def test_a_removal_that_saves_no_tokens_keeps_the_parent():
    base = _arm([1.0, 0.5] * 10, [1000] * 20)
    v = removal_decide(base, _arm([1.0, 0.5] * 10, [1000, 1001] * 10), CFG)
    assert not v.accept and "ties keep the parent" in v.reason


def test_a_bad_model_file_is_one_line_naming_file_and_field(capsys, tmp_path):
    bad = tmp_path / "model.json"
    bad.write_text(json.dumps({"name": "m", "model": "sim", "model_cfg": {"learned": "E1"}, "trained_on": "x"}))
    code, _, err = run_cli(
        capsys, "outer", "learn-sim", "--export", str(tmp_path), "--base", str(bad), "--out", str(tmp_path / "o.json")
    )
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert err.startswith(f"error: {bad}: model_cfg") and "learned" in err


def test_one_offline_outer_round(small_campaign, tmp_path):
    """The recursion runs offline: the trained model is registered under its own name, the inner campaign runs from
    the champion with it, and the pruned package holds only cards the dev gate let go."""
    from components.io import read_json_object
    from components.outer.model import read_model
    from flows.outer import run_outer

    camp = tmp_path / "camp"
    shutil.copytree(small_campaign.out, camp)
    p = small_campaign.params.model_copy(
        update={"campaign": small_campaign.params.campaign.model_copy(update={"rounds": 1})}
    )
    out = tmp_path / "outer"
    r = run_outer(p, camp, out, None)
    spec = read_model(out / "model.json")
    assert r["model"] == spec.name and (out / "models" / f"{spec.name}.json").is_file() and spec.model_cfg["learned"]
    inner = read_json_object(out / "inner" / "summary.json")
    assert inner["params"]["campaign"]["model_cfg"]["model"] == spec.name
    assert inner["params"]["campaign"]["model_cfg"]["learned"] == spec.model_cfg["learned"]
    prune = read_json_object(out / "prune" / "prune.json")
    assert r["removed"] == prune["removed"] == [d["card"] for d in prune["decisions"] if d["accept"]]
    for d in prune["decisions"]:
        assert d["accept"] == (
            d["ci_lo"] > -p.gate.material and d["tokens_ci_hi"] < 0 and d["n_regressed"] <= max(p.gate.reg_cap, 0)
        )


def test_a_failing_training_command_is_one_line_exit_1_without_prefects_traceback(
    capfd, small_campaign, tmp_path, monkeypatch
):
    """Prefect printed the training command's failure as tracebacks before Ratchet's last line; now it is one line
    naming the command, exit 1, and the outer directory is Ratchet's own (a rerun may replace it)."""
    import sys

    from components.io import MARK

    camp = tmp_path / "camp"
    shutil.copytree(small_campaign.out, camp)
    monkeypatch.chdir(tmp_path)
    params = tmp_path / "params.yaml"
    import yaml

    params.write_text(yaml.safe_dump(small_campaign.params.model_dump(mode="json")))
    trainer = f"{sys.executable} -c \"import sys; print('trainer: CUDA out of memory', file=sys.stderr); sys.exit(4)\""
    code, out, err = run_cli(
        capfd, "outer", "run", "--params", str(params), "--campaign", str(camp), "--out", "o", "--train", trainer
    )
    lines = [x for x in err.splitlines() if x.strip()]
    assert code == 1 and len(lines) == 1 and "Traceback" not in err + out, err
    assert lines[0].startswith("error: --train: ") and "exited 4: trainer: CUDA out of memory" in lines[0]
    assert (tmp_path / "o" / MARK).read_text().strip() == "outer" and (tmp_path / "o" / "export").is_dir()
