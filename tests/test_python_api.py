"""The Python API (`import ratchet`, flows/api.py): the command line is a layer over it (same files from the same
inputs), requests are frozen and refuse unknown fields, bad input is one line, `import ratchet` stays light, the API
reference documents every function, and the Python quick start page (docs/python.md) runs as written."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from pydantic import ValidationError

from components.errors import InputError
from tests.conftest import PACKAGES, ROOT, run_cli

PAGE = ROOT / "docs" / "python.md"
API_PAGE = ROOT / "docs" / "reference" / "api.md"
JOBS = ("materialize", "evaluate", "diagnose", "gate", "campaign", "reproduce", "export")


def test_the_cli_and_the_api_write_the_same_evaluation(capsys, bench_dir, tmp_path):
    import ratchet

    ids = ratchet.EvalRequest(package=PACKAGES / "seed")  # the defaults the command line's options have too
    assert (ids.split, ids.seeds, ids.model) == ("dev", 3, "sim")
    from components.worlds import load_benchmark

    items = load_benchmark(bench_dir).ids("dev")[:3]
    code, out, _ = run_cli(
        capsys,
        "eval",
        "--package",
        str(PACKAGES / "seed"),
        "--benchmark",
        str(bench_dir),
        "--items",
        ",".join(items),
        "--seeds",
        "2",
        "--out",
        str(tmp_path / "cli"),
    )
    assert code == 0, out
    r = ratchet.evaluate(
        ratchet.EvalRequest(
            package=PACKAGES / "seed", benchmark=bench_dir, items=tuple(items), seeds=2, out=tmp_path / "api"
        )
    )
    for name in ("scores.csv", "_hidden/causes.csv"):
        assert (tmp_path / "cli" / name).read_bytes() == (tmp_path / "api" / name).read_bytes(), name
    s = r.summary
    assert f"mean score {s.mean_score:.3f}, success {s.success_rate:.1%}, {s.episodes} episodes" in out
    assert f"pass^k on dev: k=1 {r.pass_hat_k[1]:.3f}" in out and not r.all_errored and r.split == "dev"
    assert len(r.scores()) == s.episodes == 6


def test_the_diagnosis_json_is_the_typed_result(capsys, bench_dir, tmp_path):
    import json

    import ratchet
    from components.evolution.localization import diagnose_eval

    ev = tmp_path / "eval"
    ratchet.evaluate(
        ratchet.EvalRequest(package=PACKAGES / "seed", benchmark=bench_dir, split="train", seeds=1, out=ev)
    )
    loc = ratchet.diagnose(ratchet.DiagnoseRequest(eval_dir=ev, package=PACKAGES / "seed", benchmark=bench_dir))
    raw = diagnose_eval(ev, PACKAGES / "seed", bench_dir)
    code, out, _ = run_cli(
        capsys,
        "diagnose",
        "--eval",
        str(ev),
        "--package",
        str(PACKAGES / "seed"),
        "--benchmark",
        str(bench_dir),
        "--json",
    )
    from flows.api import DIAGNOSE_KEYS

    # the typed result holds every figure as diagnose_eval computed it, and the command prints the same JSON
    assert code == 0 and out.strip() == json.dumps({k: raw[k] for k in DIAGNOSE_KEYS}, sort_keys=True)
    assert loc.n == raw["n"] and loc.confusion == raw["confusion"] and loc.accuracy == raw["accuracy"]


def test_requests_are_frozen_and_refuse_unknown_fields():
    import ratchet

    r = ratchet.GateRequest(base="a.csv", cand="b.csv")
    with pytest.raises(ValidationError):
        r.alpha = 0.1  # type: ignore[misc]
    with pytest.raises(ValidationError, match="seeed"):
        ratchet.EvalRequest(package="p", seeed=1)  # type: ignore[call-arg]
    assert hash(r) == hash(ratchet.GateRequest(base="a.csv", cand="b.csv"))


def test_bad_input_is_one_line_naming_the_field(bench_dir, tmp_path):
    import ratchet

    with pytest.raises(InputError, match=r"^--seeds: 0: must be at least 1$"):
        ratchet.evaluate(
            ratchet.EvalRequest(package=PACKAGES / "seed", benchmark=bench_dir, seeds=0, out=tmp_path / "e")
        )
    with pytest.raises(InputError, match=r"^--items: unknown item ids: nope$"):
        ratchet.evaluate(
            ratchet.EvalRequest(package=PACKAGES / "seed", benchmark=bench_dir, items=("nope",), out=tmp_path / "e")
        )
    with pytest.raises(InputError, match=r"^--base-url: required with --model openai$"):
        ratchet.evaluate(
            ratchet.EvalRequest(package=PACKAGES / "seed", benchmark=bench_dir, model="openai", out=tmp_path / "e")
        )
    with pytest.raises(InputError, match=r"campaign\.seeds: Input should be greater than or equal to 1"):
        ratchet.campaign_params(overrides={"campaign.seeds": 0})
    with pytest.raises(InputError, match=r"summary\.json: -: no such file"):
        ratchet.export(ratchet.ExportRequest(campaign=tmp_path / "none", out=tmp_path / "x"))
    assert not (tmp_path / "x").exists()


def test_the_gate_refuses_too_many_errored_pairs_and_decides_otherwise(tmp_path):
    import ratchet

    rows = "item_id,seed,score\n" + "".join(f"i{i},0,{0.2 if i % 3 else 0.1}\n" for i in range(30))
    better = "item_id,seed,score\n" + "".join(f"i{i},0,0.9\n" for i in range(30))
    (tmp_path / "b.csv").write_text(rows)
    (tmp_path / "c.csv").write_text(better)
    v = ratchet.gate(ratchet.GateRequest(base=tmp_path / "b.csv", cand=tmp_path / "c.csv", n_boot=1000))
    assert v.accept and v.n_items == 30 and v.n_regressed == 0
    with pytest.raises(InputError, match=r"missing\.csv: -: no such file"):
        ratchet.gate(ratchet.GateRequest(base=tmp_path / "b.csv", cand=tmp_path / "missing.csv"))
    errored = "item_id,seed,score,error\n" + "".join(f"i{i},0,0.0,model: timeout\n" for i in range(30))
    (tmp_path / "e.csv").write_text(errored)
    with pytest.raises(InputError, match=r"b\.csv vs .*e\.csv: refused"):
        ratchet.gate(ratchet.GateRequest(base=tmp_path / "b.csv", cand=tmp_path / "e.csv"))


def test_import_ratchet_is_light():
    """`import ratchet` in a notebook costs pydantic and the params models, not the stack a job runs on."""
    heavy = ("pandas", "prefect", "mlflow", "dvc", "great_expectations", "scipy", "typer")
    code = f"import sys, ratchet\nprint(sorted(m for m in {heavy!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_the_api_reference_documents_every_job():
    import ratchet

    page = API_PAGE.read_text(encoding="utf-8")
    documented = set(re.findall(r"^::: flows\.api\.(\w+)$", page, re.M))
    assert set(JOBS) <= documented
    assert documented <= set(ratchet.__all__)  # every documented name is importable from `ratchet`
    assert all(callable(getattr(ratchet, j)) for j in JOBS)


@pytest.mark.slow  # a campaign (one round) in this process: ~15 s
def test_the_python_quick_start_runs_as_written(prefect_server, tmp_path, monkeypatch):
    """Every ```python block of docs/python.md, in order, in one namespace, from a directory laid out as the
    repository's root (its shipped packages), with its own RATCHET_HOME: offline, as a reader runs it."""
    blocks = re.findall(r"^```python\n(.*?)^```$", PAGE.read_text(encoding="utf-8"), re.M | re.S)
    assert len(blocks) >= 5
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "packages").symlink_to(ROOT / "data" / "packages")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RATCHET_HOME", str(tmp_path / "home"))
    namespace: dict = {}
    for i, code in enumerate(blocks):
        exec(compile(code, f"{PAGE}:block{i + 1}", "exec"), namespace)  # noqa: S102 - the page's own code
    assert namespace["again"].unchanged and namespace["export"].manifest.files
    assert (tmp_path / "runs" / "quickstart" / "campaign" / "summary.json").is_file()
