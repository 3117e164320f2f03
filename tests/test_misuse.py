"""Misuse, as a new user would try it: every case ends with the right exit code, one line saying what is wrong, and
nothing outside the command's own output changed.

Commands run in-process through typer's CliRunner (exceptions not caught, so a traceback fails the test); a process
of their own only where the process itself is the point (kill -9, what Prefect prints), forked from one that did the
imports (tests/zygote.py). serve-sim runs on a loopback port in a thread, so connection reuse and timeouts are real.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import socket
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from components.errors import InputError
from components.evolution.lineage import CommitError, Lineage, LineageLock
from components.evolution.record import RoundRecord
from components.io import MARK
from components.params import load_params
from flows.cli import app
from tests.conftest import EXPLAINED, PACKAGES
from tests.zygote import Zygote

SEED = PACKAGES / "seed"


def ratchet(*args) -> object:
    """Invoke the CLI in-process; an escaping exception (a traceback) fails the test."""
    return CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False)


def one_line(result, code: int, *fragments: str) -> str:
    lines = [x for x in result.stderr.splitlines() if x.strip()]
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for f in fragments:
        assert f in lines[0], (f, lines[0])
    return lines[0]


def snapshot(root: Path, *, skip: Path | None = None) -> dict[str, str]:
    """Every file and directory under root (but under `skip`) with a hash of its bytes."""
    out = {}
    for p in sorted(root.rglob("*")):
        if skip is not None and (p == skip or skip in p.parents):
            continue
        out[p.relative_to(root).as_posix()] = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
    return out


@pytest.fixture
def project(tmp_path, monkeypatch, bench_dir):
    """A user's working directory: a copy of the seed package, the session benchmark, and a folder of their own."""
    monkeypatch.chdir(tmp_path)
    shutil.copytree(SEED, tmp_path / "pkg")
    mine = tmp_path / "mine"
    (mine / ".git").mkdir(parents=True)
    (mine / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (mine / "src").mkdir()
    (mine / "src" / "app.py").write_text("print('hello')\n")
    (mine / "notes.txt").write_text("do not lose\n")
    return tmp_path


# -- outputs: a command writes only where it owns ----------------------------------------------------------------------


def test_eval_out_over_a_directory_with_git_is_refused_and_left_intact(project, bench_dir):
    before = snapshot(project)
    r = ratchet("eval", "--package", "pkg", "--benchmark", bench_dir, "--out", "mine", "--seeds", "1")
    one_line(r, 2, "mine: --out:", "non-empty directory that Ratchet did not write")
    assert snapshot(project) == before
    assert (project / "mine" / ".git" / "HEAD").read_text() == "ref: refs/heads/main\n"


def test_eval_out_onto_its_own_package_is_refused(project, bench_dir):
    before = snapshot(project)
    one_line(ratchet("eval", "--package", "pkg", "--benchmark", bench_dir, "--out", "pkg"), 2, "is the input package")
    one_line(
        ratchet("eval", "--package", "pkg", "--benchmark", bench_dir, "--out", "pkg/em"),
        2,
        "is inside the input package",
    )
    one_line(ratchet("eval", "--package", "pkg", "--benchmark", bench_dir, "--out", "."), 2, "holds the input package")
    assert snapshot(project) == before


def test_eval_reruns_over_its_own_output_and_marks_it(project, bench_dir):
    items = ",".join(json.loads((bench_dir / "splits.json").read_text())["dev"][:2])
    first = ratchet(
        "eval", "--package", "pkg", "--benchmark", bench_dir, "--items", items, "--seeds", "1", "--out", "ev"
    )
    assert first.exit_code == 0, first.stderr
    s = json.loads((project / "ev" / "meta.json").read_text())  # tokens labelled (was `tokens 2919185/47436`)
    assert f"tokens in {s['tokens_in']:,}, out {s['tokens_out']:,}" in first.stdout, first.stdout
    assert (project / "ev" / MARK).read_text().strip() == "eval"
    (project / "ev" / "scores.csv").write_text("stale\n")
    before = snapshot(project, skip=project / "ev")
    again = ratchet(
        "eval", "--package", "pkg", "--benchmark", bench_dir, "--items", items, "--seeds", "1", "--out", "ev"
    )
    assert again.exit_code == 0, again.stderr
    assert (project / "ev" / "scores.csv").read_text().startswith("item_id,")  # replaced: a rerun owns it
    assert snapshot(project, skip=project / "ev") == before


def test_materialize_over_a_file_is_refused(project):
    (project / "bench.txt").write_text("mine\n")
    before = snapshot(project)
    one_line(ratchet("bench", "materialize", "--out", "bench.txt", "--per-family", "3"), 2, "bench.txt", "is a file")
    assert snapshot(project) == before


def test_materialize_over_a_foreign_directory_is_refused(project):
    before = snapshot(project)
    one_line(ratchet("bench", "materialize", "--out", "mine", "--per-family", "3"), 2, "mine", "did not write")
    assert snapshot(project) == before


def test_materialize_replaces_its_own_benchmark(project):
    """What `dvc repro` and a rerun do: a benchmark directory (marked by its own files) is Ratchet's to replace."""
    assert ratchet("bench", "materialize", "--out", "b", "--per-family", "3").exit_code == 0
    (project / "b" / "policy.md").write_text("edited\n")
    before = snapshot(project, skip=project / "b")
    r = ratchet("bench", "materialize", "--out", "b", "--per-family", "3")
    assert r.exit_code == 0, r.stderr
    assert (project / "b" / "policy.md").read_text() != "edited\n"
    assert snapshot(project, skip=project / "b") == before


def test_report_out_onto_a_file_or_its_campaign_is_refused(project):
    camp = project / "camp"
    camp.mkdir()
    (camp / "summary.json").write_text("{}\n")
    (project / "r.txt").write_text("mine\n")
    before = snapshot(project)
    one_line(ratchet("report", "--campaign", "camp", "--out", "r.txt"), 2, "is a file")
    one_line(ratchet("report", "--campaign", "camp", "--out", "camp"), 2, "is the input campaign")
    one_line(ratchet("report", "--campaign", "camp", "--out", "mine"), 2, "did not write")
    assert snapshot(project) == before


def test_campaign_out_over_a_foreign_directory_or_its_start_is_refused(project, bench_dir):
    before = snapshot(project)
    common = ["--set", f"benchmark.out={bench_dir}", *EXPLAINED, "--set", "campaign.start=pkg"]
    one_line(ratchet("campaign", "run", "--out", "mine", *common), 2, "mine: campaign.out:", "did not write")
    one_line(ratchet("campaign", "run", "--out", "mine", "--force", *common), 2, "did not write")  # --force: never that
    one_line(ratchet("campaign", "run", "--out", "pkg", *common), 2, "is the input start package")
    one_line(ratchet("campaign", "run", "--out", str(bench_dir), *common), 2, "is the input benchmark")
    assert snapshot(project) == before


# -- campaign identity -------------------------------------------------------------------------------------------------


def _started(project, bench_dir, **over) -> Path:
    """A campaign output whose lineage has committed M0 with the identity of these params (no round run)."""
    from components.memory import digest

    p = load_params(
        None,
        {
            "campaign.out": "camp",
            "campaign.start": "pkg",
            "benchmark.out": str(bench_dir),
            "benchmark.receipts": "explained",
            **over,
        },
    )
    Lineage(project / "camp" / "lineage").start("pkg", digest(bench_dir), p.identity())
    (project / "camp" / MARK).write_text("campaign\n")
    return project / "camp"


def _rerun(bench_dir, *extra):
    return ratchet("campaign", "run", "--out", "camp", "--set", f"benchmark.out={bench_dir}", *EXPLAINED, *extra)


def test_rerun_with_another_start_package_is_refused(project, bench_dir):
    _started(project, bench_dir)
    shutil.copytree(PACKAGES / "reference", project / "other")
    before = snapshot(project)
    one_line(_rerun(bench_dir, "--set", "campaign.start=other"), 2, "camp: campaign.start:", "M0")
    assert snapshot(project) == before


def test_rerun_with_another_benchmark_is_refused(project, bench_dir):
    _started(project, bench_dir)
    other = project / "bench2"
    shutil.copytree(bench_dir, other)
    (other / "policy.md").write_text((other / "policy.md").read_text() + "\nOne more rule.\n")
    before = snapshot(project)
    one_line(
        ratchet(
            "campaign",
            "run",
            "--out",
            "camp",
            "--set",
            f"benchmark.out={other}",
            *EXPLAINED,
            "--set",
            "campaign.start=pkg",
        ),
        2,
        "camp: benchmark:",
        "digest",
    )
    assert snapshot(project) == before


@pytest.mark.parametrize(
    "field,value", [("campaign.seeds", "5"), ("gate.alpha", "0.1"), ("campaign.meta_agent_cfg", "{x: 1}")]
)
def test_rerun_with_other_evolution_params_is_refused_naming_the_field(project, bench_dir, field, value):
    _started(project, bench_dir)
    before = snapshot(project)
    one_line(
        _rerun(bench_dir, "--set", "campaign.start=pkg", "--set", f"{field}={value}"),
        2,
        f"camp: {field}:",
        "in this campaign's lineage",
    )
    assert snapshot(project) == before


def test_rerun_may_change_rounds_and_budget_and_force_starts_over(project, bench_dir):
    from flows.campaign import prepare

    camp = _started(project, bench_dir)
    ok = load_params(
        None,
        {
            "campaign.out": "camp",
            "campaign.start": "pkg",
            "benchmark.out": str(bench_dir),
            "benchmark.receipts": "explained",
            "campaign.rounds": 3,
            "budget.model_calls": 10,
            "campaign.workers": 1,
        },
    )
    prepare(ok)  # documented as changeable: no refusal
    assert (camp / "lineage" / "lineage.jsonl").exists()
    other = load_params(
        None,
        {
            "campaign.out": "camp",
            "campaign.start": "pkg",
            "benchmark.out": str(bench_dir),
            "benchmark.receipts": "explained",
            "campaign.seeds": 4,
        },
    )
    prepare(other, force=True)  # Ratchet's own campaign, replacing it meant: deleted, to start over
    assert not camp.exists() and (project / "mine" / "notes.txt").exists()


@pytest.fixture(scope="module")
def zygote(tmp_path_factory):
    """`ratchet` as a real process, forked from one that has done the imports a campaign command does (~8 CPU-s each
    otherwise; see tests/zygote.py). Imported without PREFECT_API_URL, as a user's `ratchet campaign run` is."""
    z = Zygote(
        tmp_path_factory.mktemp("zygote"),
        {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"},
        ["flows.campaign", "prefect.flow_engine", "prefect.task_engine"],
    )
    yield z
    z.close()


def test_a_running_campaign_is_refused_before_prefect_says_anything(project, bench_dir, zygote):
    """A real process: what a user sees on stderr is one line, no Prefect traceback first (and nothing printed by
    the imports, which the zygote did for it)."""
    _started(project, bench_dir)
    with LineageLock(project / "camp" / "lineage"):
        r = zygote(
            project,
            [
                "campaign",
                "run",
                "--out",
                "camp",
                "--set",
                f"benchmark.out={bench_dir}",
                *EXPLAINED,
                "--set",
                "campaign.start=pkg",
            ],
            env=dict(os.environ),
            timeout=120,
        )
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().count("\n") == 0 and "locked by another campaign" in r.stderr, r.stderr
    assert zygote.import_stderr.read_text() == ""


# -- params ------------------------------------------------------------------------------------------------------------


def test_a_missing_params_file_is_refused(project):
    one_line(ratchet("campaign", "run", "--params", "nope.yaml"), 2, "nope.yaml: -: no such file")
    one_line(ratchet("campaign", "run", "--params", "params.yaml"), 2, "params.yaml: -: no such file")
    assert not (project / "runs").exists()


def test_a_params_directory_or_non_utf8_file_is_refused(project):
    (project / "pdir").mkdir()
    (project / "latin1.yaml").write_bytes("campaign:\n  name: caf\xe9\n".encode("latin-1"))
    one_line(ratchet("campaign", "run", "--params", "pdir"), 2, "pdir: -: not a file")
    one_line(ratchet("campaign", "run", "--params", "latin1.yaml"), 2, "latin1.yaml: -: not UTF-8")
    assert not (project / "runs").exists()


def test_a_yaml_alias_bomb_is_refused_at_once(project):
    levels = "".join(f"  l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]\n" for i in range(1, 10))
    (project / "bomb.yaml").write_text(
        "campaign:\n  meta_agent_cfg:\n    l0: &l0 [x]\n" + levels.replace("  l", "    l")
    )
    assert len((project / "bomb.yaml").read_bytes()) < 1000
    t = time.monotonic()
    one_line(ratchet("campaign", "run", "--params", "bomb.yaml"), 2, "bomb.yaml: line", "alias")
    one_line(ratchet("campaign", "run", "--set", "campaign.meta_agent_cfg={a: &a [1], b: *a}"), 2, "--set", "alias")
    assert time.monotonic() - t < 10


def test_free_form_dicts_are_bounded(project):
    deep = "{a: " * 12 + "1" + "}" * 12
    one_line(ratchet("campaign", "run", "--set", f"campaign.model_cfg={deep}"), 2, "campaign.model_cfg", "deeper")
    wide = "[" + ", ".join(["1"] * 2000) + "]"
    one_line(ratchet("campaign", "run", "--set", f"campaign.meta_agent_cfg={{x: {wide}}}"), 2, "more than")


@pytest.mark.parametrize(
    "setting,field",
    [
        ("budget.money=.nan", "budget.money"),
        ("gate.material=.inf", "gate.material"),
        ("budget.tokens_in=-5", "budget.tokens_in"),
        ("budget.money=-1", "budget.money"),
        ("campaign.model_cfg={t: .nan}", "campaign.model_cfg"),
    ],
)
def test_numbers_are_finite_and_caps_not_negative(project, setting, field):
    one_line(ratchet("campaign", "run", "--set", setting), 2, f"params: {field}")
    assert not (project / "runs").exists()


def test_set_with_bad_yaml_or_into_a_scalar_is_one_line(project):
    one_line(
        ratchet("campaign", "run", "--set", "campaign.model_cfg={a: [1"), 2, "--set: campaign.model_cfg: malformed"
    )
    one_line(
        ratchet("campaign", "run", "--set", "campaign.rounds=3", "--set", "campaign.rounds.x=1"),
        2,
        "campaign.rounds.x: campaign.rounds is not a mapping",
    )
    one_line(ratchet("campaign", "run", "--set", "novalue"), 2, "expected key.path=value")


# -- nothing succeeds on nothing ---------------------------------------------------------------------------------------


def test_eval_with_zero_seeds_is_refused(project, bench_dir):
    before = snapshot(project)
    one_line(
        ratchet("eval", "--package", "pkg", "--benchmark", bench_dir, "--seeds", "0", "--out", "ev"),
        2,
        "--seeds: 0: must be at least 1",
    )
    one_line(
        ratchet("eval", "--package", "pkg", "--benchmark", bench_dir, "--items", ",", "--out", "ev"),
        2,
        "--items: no item ids",
    )
    assert snapshot(project) == before


def test_an_eval_where_every_episode_errored_fails(project, bench_dir, free_port, monkeypatch):
    dead = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    items = ",".join(json.loads((bench_dir / "splits.json").read_text())["dev"][:2])
    r = ratchet(
        "eval",
        "--package",
        "pkg",
        "--benchmark",
        bench_dir,
        "--items",
        items,
        "--seeds",
        "1",
        "--model",
        "openai",
        "--base-url",
        dead,
        "--max-retries",
        "0",
        "--timeout",
        "2",
        "--out",
        "ev",
    )
    line = one_line(r, 1, "every episode errored (2 of 2); the first: model:")
    assert "onnect" in line  # the first error names its cause


def test_shares_that_leave_an_empty_split_are_refused(project):
    before = snapshot(project)
    one_line(
        ratchet(
            "bench", "materialize", "--out", "b", "--per-family", "3", "--train-share", "0.6", "--dev-share", "0.4"
        ),
        2,
        "--dev-share",
        "test split",
    )
    one_line(
        ratchet(
            "bench", "materialize", "--out", "b", "--per-family", "3", "--train-share", "0.1", "--dev-share", "0.5"
        ),
        2,
        "the train split would be empty",
    )
    assert snapshot(project) == before


# -- one line, not a traceback -----------------------------------------------------------------------------------------


def test_badly_shaped_benchmark_json_is_one_line(project, bench_dir):
    bad = project / "badbench"
    shutil.copytree(bench_dir, bad)
    splits = json.loads((bad / "splits.json").read_text())
    (bad / "splits.json").write_text(json.dumps({**splits, "dev": 5}))
    one_line(
        ratchet("eval", "--package", "pkg", "--benchmark", bad, "--out", "ev"), 2, "splits.json: dev: must be a list"
    )
    (bad / "splits.json").write_text(json.dumps(splits))
    (bad / "tools.json").write_text('{"not": "a list"}')
    one_line(ratchet("eval", "--package", "pkg", "--benchmark", bad, "--out", "ev"), 2, "tools.json")
    assert not (project / "ev").exists()


def test_a_package_nested_thousands_deep_is_one_line(project):
    deep = project / "deep"
    shutil.copytree(SEED, deep)
    d = str(deep)
    try:
        for _ in range(1500):  # one level at a time: os.makedirs itself recurses
            d += "/d"
            os.mkdir(d)
        one_line(ratchet("package", "lint", deep), 2, f"{deep}: -: nested too deeply")
        one_line(ratchet("package", "digest", deep), 2, f"{deep}: -: nested too deeply")
    finally:  # bottom up, without recursion: pytest's own cleanup (shutil.rmtree) cannot delete this
        while d != str(deep):
            if os.path.isdir(d):
                os.rmdir(d)
            d = os.path.dirname(d)


def test_a_missing_or_non_directory_start_is_one_line(project, bench_dir):
    (project / "afile").write_text("x\n")
    common = ["--out", "camp", "--set", f"benchmark.out={bench_dir}", *EXPLAINED]
    one_line(ratchet("campaign", "run", *common, "--set", "campaign.start=nope"), 2, "nope: campaign.start: no such")
    one_line(
        ratchet("campaign", "run", *common, "--set", "campaign.start=afile"), 2, "afile: campaign.start: not a dir"
    )
    assert not (project / "camp").exists()


def test_an_unknown_world_is_one_line_naming_the_known_ones(project):
    # the message lists the registered worlds by name (sorting the registry's entries themselves raised a TypeError)
    one_line(
        ratchet("bench", "materialize", "--world", "nowhere", "--out", "b"),
        2,
        "--world",
        "unknown world 'nowhere' (one of airline, retail, tau2-airline, tau2-retail)",
    )
    one_line(
        ratchet("campaign", "run", "--out", "camp", "--set", "benchmark.world=nowhere"),
        2,
        "benchmark.world",
        "unknown world 'nowhere'",
    )
    assert not (project / "b").exists() and not (project / "camp").exists()


def test_per_family_zero_is_one_line(project):
    one_line(ratchet("bench", "materialize", "--out", "b", "--per-family", "0"), 2, "--per-family")
    assert not (project / "b").exists()


def test_a_torn_last_lineage_line_is_recovered_a_damaged_one_refused(project, bench_dir):
    camp = _started(project, bench_dir)
    log = camp / "lineage" / "lineage.jsonl"
    whole = log.read_bytes()
    log.write_bytes(whole + b'{"round": 1, "verdict": "acc')  # torn: never committed
    lineage = Lineage(camp / "lineage")
    assert [r["verdict"] for r in lineage.records()] == ["start"] and lineage.torn
    lineage.reject(1, {"reason": "x"})  # the next append drops the torn bytes
    assert log.read_bytes().startswith(whole) and log.read_bytes().endswith(b"\n")
    log.write_bytes(b"garbage\n" + whole)
    with pytest.raises(CommitError, match="line 1: not a JSON record"):
        Lineage(camp / "lineage").records()
    one_line(ratchet("reproduce", "--campaign", "camp", "--version", "M1"), 2, "lineage.jsonl: line 1")


def test_a_budget_stop_prints_no_prefect_traceback(prefect_server, capfd):
    """Prefect logs an InputError (a budget stop, a refused run) with its traceback; Ratchet reports it in one line."""
    from prefect import flow, task

    import flows.campaign  # noqa: F401 - installs the filter, as every campaign does
    from components.evidence.budget import BudgetExceeded

    @task
    def spend():
        raise BudgetExceeded("budget: model_calls cap 5 reached")

    @flow
    def round_():
        spend()

    with pytest.raises(BudgetExceeded):
        round_()
    err = capfd.readouterr().err
    assert "Traceback" not in err and "BudgetExceeded" not in err, err


# -- serve-sim ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    """serve-sim on a loopback port in a thread (header and body timeouts 1 s for the test)."""
    import uvicorn

    from components.models.server import _header_timeout_protocol, create_app

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(max_body=200_000, body_timeout=1.0),
            host="127.0.0.1",
            port=port,
            log_level="critical",
            http=_header_timeout_protocol(1.0),
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    for _ in range(100):
        if server.started:
            break
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)


def _conversation(bench_dir) -> dict:
    from components.worlds import load_benchmark, world

    b = load_benchmark(bench_dir)
    task = b.tasks[b.ids("dev")[0]]
    env = world("retail").make_env(b, task)
    return {
        "model": "sim",
        "seed": 0,
        "tools": env.tools,
        "messages": [
            {"role": "system", "content": env.system_prompt},
            {"role": "user", "content": env.first_message()},
        ],
    }


def _error_of(r: httpx.Response, status: int, param: str | None = None) -> dict:
    assert r.status_code == status, (r.status_code, r.text)
    e = r.json()["error"]
    assert set(e) == {"message", "type", "param", "code"} and e["message"], e
    if param is not None:
        assert e["param"] == param, e
    return e


def test_serve_sim_bad_json_is_a_400_and_the_connection_stays_usable(sim, bench_dir):
    good = _conversation(bench_dir)
    with httpx.Client(base_url=sim, timeout=10) as client:  # one keep-alive connection throughout
        _error_of(
            client.post(
                "/v1/chat/completions", content=b'{"messages": [', headers={"content-type": "application/json"}
            ),
            400,
        )
        ok = client.post("/v1/chat/completions", json=good)
        assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["role"] == "assistant"
        assert abs(ok.json()["created"] - time.time()) < 60  # a real timestamp


@pytest.mark.parametrize(
    "change,status,param",
    [
        (lambda b: b.pop("messages"), 400, "messages"),
        (lambda b: b.update(messages="hello"), 400, "messages"),
        (lambda b: b.update(seed="zero"), 400, "seed"),
        (lambda b: b.update(stream=True), 400, "stream"),
        (lambda b: b.update(n=2), 400, "n"),
        (lambda b: b.update(messages=b["messages"][1:]), 400, "messages"),  # a user-only conversation
        (
            lambda b: b.update(tool_choice={"type": "function", "function": {"name": "delete_everything"}}),
            400,
            "tool_choice",
        ),
    ],
    ids=[
        "no-messages",
        "messages-not-a-list",
        "seed-not-an-int",
        "stream",
        "n-2",
        "user-only",
        "tool-choice-not-offered",
    ],
)
def test_serve_sim_refuses_malformed_or_unsupported_requests(sim, bench_dir, change, status, param):
    body = _conversation(bench_dir)
    change(body)
    with httpx.Client(base_url=sim, timeout=10) as client:
        _error_of(client.post("/v1/chat/completions", json=body), status, param)
        assert client.post("/v1/chat/completions", json=_conversation(bench_dir)).status_code == 200


def test_serve_sim_reads_content_parts_as_text(sim, bench_dir):
    body = _conversation(bench_dir)
    plain = httpx.post(f"{sim}/v1/chat/completions", json=body, timeout=10).json()
    body["messages"][1]["content"] = [{"type": "text", "text": body["messages"][1]["content"]}]
    parts = httpx.post(f"{sim}/v1/chat/completions", json=body, timeout=10).json()
    assert parts["choices"] == plain["choices"]


def test_serve_sim_limits_the_body_and_idle_headers(sim):
    _error_of(httpx.post(f"{sim}/v1/chat/completions", content=b"x" * 300_000, timeout=10), 413)
    host, port = sim.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")  # headers never finished
        t = time.monotonic()
        assert s.recv(1024) == b""  # closed by the server
        assert time.monotonic() - t < 4


def test_serve_sim_calls_only_offered_tools_as_tool_choice_allows(sim, bench_dir):
    body = _conversation(bench_dir)
    first = httpx.post(f"{sim}/v1/chat/completions", json=body, timeout=10).json()["choices"][0]["message"]
    assert first.get("tool_calls"), "the test needs a first step that calls a tool"
    wanted = first["tool_calls"][0]["function"]["name"]
    none = httpx.post(f"{sim}/v1/chat/completions", json={**body, "tool_choice": "none"}, timeout=10).json()
    assert "tool_calls" not in none["choices"][0]["message"] and none["choices"][0]["message"]["content"]
    fewer = [t for t in body["tools"] if t["function"]["name"] != wanted]
    withheld = httpx.post(f"{sim}/v1/chat/completions", json={**body, "tools": fewer}, timeout=10).json()
    assert all(c["function"]["name"] != wanted for c in withheld["choices"][0]["message"].get("tool_calls") or [])
    other = fewer[0]["function"]["name"]
    forced = httpx.post(
        f"{sim}/v1/chat/completions",
        timeout=10,
        json={**body, "tool_choice": {"type": "function", "function": {"name": other}}},
    )
    _error_of(forced, 422, "tool_choice")


def test_serve_sim_validates_port_and_fault_rate():
    one_line(ratchet("serve-sim", "--port", "70000"), 2, "--port: 70000")
    one_line(ratchet("serve-sim", "--fault-rate", "5"), 2, "--fault-rate: 5.0: must be within [0, 1]")
    one_line(ratchet("serve-sim", "--fault-rate", "nan"), 2, "--fault-rate")


# -- no orphans --------------------------------------------------------------------------------------------------------


def _children(pid: int) -> list[int]:
    import psutil

    try:
        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _running(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_kill_9_of_a_campaign_leaves_no_prefect_server(tmp_path, bench_dir, zygote):
    """No PREFECT_API_URL: the campaign (a real process) starts Prefect's temporary server; kill -9 it once the server
    is up."""
    import psutil

    home = tmp_path / "home"
    env = {
        **os.environ,
        "RATCHET_HOME": str(home),
        "PREFECT_HOME": str(home / "prefect"),
        "PREFECT_LOCAL_STORAGE_PATH": str(home / "prefect" / "storage"),
        "MLFLOW_TRACKING_URI": f"sqlite:///{home / 'mlflow.db'}",
    }
    env.pop("PREFECT_API_URL", None)
    pid = zygote.start(
        tmp_path,
        [
            "campaign",
            "run",
            "--out",
            "camp",
            "--rounds",
            "3",
            "--set",
            f"benchmark.out={bench_dir}",
            *EXPLAINED,
            "--set",
            f"campaign.start={SEED}",
        ],
        env=env,
        unset=["PREFECT_API_URL"],
    )
    try:
        server = []
        deadline = time.monotonic() + 120
        while not server and time.monotonic() < deadline and _running(pid):
            time.sleep(0.1)
            server = [
                c
                for c in _children(pid)
                if "prefect.server.api.server:create_app" in " ".join(psutil.Process(c).cmdline())
            ]
        assert server, "the campaign never started its temporary Prefect server"
        os.kill(pid, signal.SIGKILL)
        zygote.wait(pid, timeout=10)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and any(_running(p) for p in server):
            time.sleep(0.1)
        alive = [p for p in server if _running(p)]
        assert not alive, f"orphaned Prefect server(s): {alive}"
    finally:
        if _running(pid):
            os.kill(pid, signal.SIGKILL)
            zygote.wait(pid)


# -- campaigns move ----------------------------------------------------------------------------------------------------


def test_a_moved_or_copied_campaign_resumes_and_reproduces_in_place(prefect_server, tmp_path, monkeypatch):
    """Run a one-round campaign that promotes, copy it, move the original away: the copy resumes in place (the
    original is untouched) and `ratchet reproduce` on it finds the promotion identical."""
    from components.params import BenchmarkParams
    from flows.campaign import run_campaign

    monkeypatch.chdir(tmp_path)
    # 6 tasks per family: the smallest benchmark on which this start package's first round commits (test_operations)
    bench = BenchmarkParams(out=str(tmp_path / "bench"), per_family=6, receipts="explained")
    bench.materialize()
    start = tmp_path / "start"  # the ledger fixes in place, so that round 1 commits (as in test_operations)
    shutil.copytree(SEED, start)
    manifest = start / "manifest.yaml"
    manifest.write_text(
        manifest.read_text().replace("max_entries: 2", "max_entries: 6").replace("bind_on: []", "bind_on: [order_id]")
    )
    # no MLflow traces: neither the resume nor `ratchet reproduce` reads them (two seeds: with one, round 1 rejects)
    p = load_params(
        None,
        {
            "benchmark.out": bench.out,
            "benchmark.per_family": 6,
            "benchmark.receipts": "explained",
            "campaign.out": str(tmp_path / "a"),
            "campaign.start": str(start),
            "campaign.rounds": 1,
            "campaign.seeds": 2,
            "gate.n_boot": 1000,
            "campaign.traces_per_round": 0,
        },
    )
    s = run_campaign(p)
    assert s["accepted"] == 1, "the test needs a round that promotes"
    shutil.copytree(tmp_path / "a", tmp_path / "copy")
    original = snapshot(tmp_path / "a")
    (tmp_path / "copy" / ".state" / "state.json").write_text(json.dumps({"round": 1, "stage": "gate"}))
    (tmp_path / "copy" / "summary.json").unlink()  # as if killed before the end
    r = ratchet("campaign", "resume", "--out", "copy")
    assert r.exit_code == 0, r.stderr
    assert (tmp_path / "copy" / "summary.json").exists() and snapshot(tmp_path / "a") == original
    os.rename(tmp_path / "a", tmp_path / "gone")  # nothing may resolve to the old place
    rec = next(x for x in Lineage(tmp_path / "copy" / "lineage").records() if x["verdict"] == "accept")
    assert not Path(rec["round_dir"]).is_absolute()
    r = ratchet("reproduce", "--campaign", "copy", "--version", "M1")
    assert r.exit_code == 0, r.stdout + r.stderr
    assert "per-item scores: identical" in r.stdout and "verdict: matches" in r.stdout
    from components.evolution.report import ci_level

    level = ci_level(RoundRecord.of(rec))  # the CI is printed with its level, the look's (issue 41)
    assert f" {100 * level:.4g}% CI [" in r.stdout, r.stdout


@pytest.mark.parametrize("where", ["file", "set"])
def test_a_control_character_in_params_is_one_line_naming_the_file(tmp_path, where):
    """PyYAML's ReaderError (a control character) has no `problem` and a two-line str(); the error stays one line."""
    from components.errors import InputError as Err
    from components.params import parse_set

    path = tmp_path / "params.yaml"
    path.write_text("gate:\n  alpha: 0.05\x07\n" if where == "file" else "gate: {}\n", encoding="utf-8")
    with pytest.raises(Err) as e:
        load_params(path) if where == "file" else parse_set(["gate.alpha=0.05\x07"])
    msg = str(e.value)
    assert "\n" not in msg
    assert (str(path) if where == "file" else "--set: gate.alpha") in msg


# -- session 7 sweep ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args,fragments",
    [
        (["eval", "--package", "pkg", "--seeds", "abc"], ["--seeds:", "integer", "eval --help`"]),
        (["eval", "--seeds", "1"], ["Missing option '--package'"]),
        (["eval", "--package", "pkg", "--max-turns", "0"], ["--max-turns:"]),
        (["nosuch"], ["No such command 'nosuch'"]),
        (["campaign", "runs", "--limit", "-1"], ["--limit:"]),  # was Prefect's 422 traceback
        (["worker", "--limit", "0"], ["--limit:"]),
        (["--bogus"], ["No such option: --bogus", "--help`)"]),  # before the command: parsed by the app itself
    ],
    ids=[
        "not-an-int",
        "missing-option",
        "out-of-range",
        "no-such-command",
        "runs-limit",
        "worker-limit",
        "option-before-the-command",
    ],
)
def test_an_option_typer_refuses_is_one_line_not_a_box(project, args, fragments):
    one_line(ratchet(*args), 2, *fragments)
    assert not (project / "runs").exists()


def test_a_group_alone_still_prints_its_help():
    r = ratchet("campaign")
    assert "Usage" in r.stdout and "error:" not in r.stderr


@pytest.mark.parametrize("args", [["ui"], ["server"], ["serve-local"]])
def test_a_server_port_out_of_range_is_refused_before_the_server_starts(args):
    one_line(ratchet(*args, "--port", "70000"), 2, "--port: 70000")  # was uvicorn's OverflowError traceback


def test_an_output_under_a_file_is_refused_and_nothing_is_written(project, bench_dir):
    (project / "afile").write_text("mine\n")
    before = snapshot(project)
    one_line(
        ratchet("eval", "--package", "pkg", "--benchmark", bench_dir, "--out", "afile/ev"),
        2,
        "afile/ev: --out:",
        "is not a directory",
    )  # was a FileExistsError traceback from mkdir
    one_line(ratchet("bench", "materialize", "--out", "afile/b", "--per-family", "3"), 2, "afile/b: benchmark.out:")
    assert snapshot(project) == before


def test_eval_refuses_repeated_items_huge_seeds_and_bad_endpoints_before_any_episode(project, bench_dir):
    item = json.loads((bench_dir / "splits.json").read_text())["dev"][0]
    common = ["eval", "--package", "pkg", "--benchmark", bench_dir, "--out", "ev"]
    one_line(
        ratchet(*common, "--items", f"{item}, {item} ", "--seeds", "1"),
        2,  # spaces after commas are not ids
        f"--items: given more than once: {item}",
    )
    one_line(ratchet(*common, "--items", item, "--seeds", "10000000000"), 2, "--seeds:", "at most")  # a MemoryError
    one_line(
        ratchet(*common, "--items", item, "--model", "openai", "--base-url", "localhost:8000"),
        2,
        "model.base_url:",
        "not an http(s) URL",
    )  # each episode spent its retries on it, then exit 1
    one_line(
        ratchet(
            *common,
            "--items",
            item,
            "--model",
            "openai",
            "--base-url",
            "http://127.0.0.1:9/v1",
            "--tool-choice",
            "always",
        ),
        2,
        "model.tool_choice:",
    )
    for option in ("--timeout", "--temperature"):  # inf: a socket OverflowError traceback; every episode errored
        one_line(
            ratchet(
                *common, "--items", item, "--model", "openai", "--base-url", "http://127.0.0.1:9/v1", option, "inf"
            ),
            2,
            f"{option}:",
        )
    assert not (project / "ev").exists()


def test_a_package_for_another_world_is_refused_naming_a_card(project, bench_dir):
    other = PACKAGES / "airline" / "reference"
    one_line(
        ratchet("eval", "--package", other, "--benchmark", bench_dir, "--seeds", "1", "--out", "ev"),
        2,
        "em/procedure/",
        "trigger.tool:",
        "is not a tool of the retail world",
    )  # ran with every card inert
    one_line(
        ratchet(
            "campaign",
            "run",
            "--out",
            "camp",
            "--set",
            f"benchmark.out={bench_dir}",
            *EXPLAINED,
            "--set",
            f"campaign.start={other}",
        ),
        2,
        "campaign.start: ",
        "is not a tool of the retail world",
    )
    assert not (project / "ev").exists() and not (project / "camp").exists()


def test_a_benchmark_naming_an_unknown_world_is_one_line_naming_meta_json(project, bench_dir):
    bad = project / "bench"
    shutil.copytree(bench_dir, bad)
    meta = json.loads((bad / "meta.json").read_text())
    (bad / "meta.json").write_text(json.dumps({**meta, "world": "mars"}))
    one_line(
        ratchet("eval", "--package", "pkg", "--benchmark", bad, "--out", "ev"),
        2,
        "bench/meta.json: world: unknown world 'mars'",
    )
    # another world's name on this benchmark: its episodes failed deep in that world's environment (a KeyError)
    (bad / "meta.json").write_text(json.dumps({**meta, "world": "airline"}))
    one_line(
        ratchet("eval", "--package", PACKAGES / "airline" / "seed", "--benchmark", bad, "--out", "ev"),
        2,
        "bench/meta.json: write_tools: ",
        "not a write tool of the 'airline' world",
    )
    assert not (project / "ev").exists()


def _scores(path: Path, rows: str) -> Path:
    path.write_text("item_id,seed,score\n" + rows)
    return path


@pytest.mark.parametrize(
    "cand,extra,fragments",
    [
        ("dir", [], ["cdir: -: is a directory"]),  # was exit 3, "internal error: IsADirectoryError"
        ("ragged", [], ["ragged.csv: -: not a readable CSV", "Expected 3 fields"]),  # was a second, empty error line
        ("ok", ["--seed", "-1"], ["gate: seed: -1"]),  # was exit 3 from numpy
        ("ok", ["--n-boot", "100000000000"], ["gate: n_boot:", "above"]),  # was exit 3, a MemoryError
    ],
)
def test_gate_bad_tables_and_options_are_bad_input(tmp_path, cand, extra, fragments):
    rows = "".join(f"i{k},0,0.5\n" for k in range(6))
    base = _scores(tmp_path / "base.csv", rows)
    paths = {"ok": _scores(tmp_path / "ok.csv", rows), "ragged": _scores(tmp_path / "ragged.csv", rows + "a,0,1,2,3\n")}
    (tmp_path / "cdir").mkdir()
    paths["dir"] = tmp_path / "cdir"
    one_line(ratchet("gate", "--base", base, "--cand", paths[cand], "--n-boot", "1000", *extra), 2, *fragments)


@pytest.mark.parametrize("setting", ["gate.seed=-1", "gate.n_boot=100000000000"])
def test_gate_params_that_would_crash_a_round_are_refused_before_it_starts(project, bench_dir, setting):
    # gate.seed=-1 ran the campaign into numpy's ValueError inside Prefect (hundreds of lines) and left `camp` behind
    one_line(
        ratchet(
            "campaign",
            "run",
            "--out",
            "camp",
            "--set",
            f"benchmark.out={bench_dir}",
            *EXPLAINED,
            "--set",
            "campaign.start=pkg",
            "--set",
            setting,
        ),
        2,
        f"params: {setting.split('=')[0]}:",
    )
    assert not (project / "camp").exists()


def test_params_nested_too_deeply_name_the_file(project):
    (project / "deep.yaml").write_text("a: " + "[" * 700 + "]" * 700 + "\n")
    one_line(ratchet("campaign", "run", "--params", "deep.yaml"), 2, "deep.yaml: -: nested too deeply")


def test_a_damaged_state_file_does_not_stop_a_resume(project, bench_dir, monkeypatch):
    """state.json only feeds the resume message (the lineage says what is done): damaged, it is named and ignored."""
    import flows.campaign

    camp = _started(project, bench_dir)
    p = load_params(
        None,
        {
            "campaign.out": "camp",
            "campaign.start": "pkg",
            "benchmark.out": str(bench_dir),
            "benchmark.receipts": "explained",
        },
    )
    (camp / ".state").mkdir()
    (camp / ".state" / "params.json").write_text(p.model_dump_json())
    (camp / ".state" / "state.json").write_text("[1, 2")  # was a JSONDecodeError (or AttributeError) traceback
    ran = []
    monkeypatch.setattr(
        flows.campaign,
        "run_campaign",
        lambda p: ran.append(p) or (_ for _ in ()).throw(InputError("stopped by the test")),
    )
    r = ratchet("campaign", "resume", "--out", "camp")
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert r.exit_code == 2 and len(ran) == 1, r.stderr
    assert "state.json is unreadable (ignored" in lines[0] and lines[1:] == ["error: stopped by the test"], lines


@pytest.mark.parametrize(
    "text,field",
    [
        ("{", "line 1: not valid JSON"),
        ("[]", "-: must be a JSON object"),
        ('{"campaign": "x"}', "champion: Field required"),
    ],
)
def test_report_on_a_damaged_summary_is_one_line_and_writes_nothing(project, text, field):
    (project / "camp").mkdir()
    (project / "camp" / "summary.json").write_text(text)
    one_line(ratchet("report", "--campaign", "camp", "--out", "rep"), 2, f"summary.json: {field}")  # was a traceback
    assert not (project / "rep").exists()


def _fake_eval(root: Path, bench_dir: Path, package_digest: str) -> Path:
    from components.worlds import load_benchmark

    ev = root / "ev"
    (ev / "_hidden").mkdir(parents=True)
    _scores(ev / "scores.csv", "a,0,0.5\n")
    (ev / "_hidden" / "causes.csv").write_text("item_id,seed,cause\n")
    (ev / "traces.parquet").write_bytes(b"not parquet")
    (ev / "meta.json").write_text(
        json.dumps(
            {
                "package": "pkg",
                "package_digest": package_digest,
                "benchmark": "b",
                "benchmark_digest": load_benchmark(bench_dir).digest,
            }
        )
    )
    return ev


def test_diagnose_refuses_another_package_and_damaged_eval_files(project, bench_dir):
    from components.memory import digest

    _fake_eval(project, bench_dir, "0" * 64)
    one_line(
        ratchet("diagnose", "--eval", "ev", "--package", "pkg", "--benchmark", bench_dir),
        2,
        "ev/meta.json: package_digest: the eval ran on another package",
    )  # was scored silently
    shutil.rmtree(project / "ev")
    _fake_eval(project, bench_dir, digest(project / "pkg"))
    one_line(
        ratchet("diagnose", "--eval", "ev", "--package", "pkg", "--benchmark", bench_dir),
        2,
        "ev: -: an unreadable eval file",
        "Parquet",
    )  # was pyarrow's ArrowInvalid traceback


def test_evidence_commands_never_write_into_a_file_that_is_not_a_graph(project):
    import sqlite3

    (project / "notes.db").write_text("x")  # SQLite took a 1-byte file for an empty database and made it a graph
    with contextlib.closing(sqlite3.connect(project / "mlflow.db")) as con:
        con.execute("CREATE TABLE runs (id TEXT)")
        con.commit()
    before = snapshot(project)
    for db in ("notes.db", "mlflow.db", f"sqlite:///{project / 'mlflow.db'}"):
        one_line(ratchet("evidence", "show", "--db", db), 2, "--db: not an evidence graph")
        one_line(ratchet("evidence", "revoke", "abc", "--reason", "x", "--db", db), 2, "--db: not an evidence graph")
    one_line(ratchet("evidence", "show", "--db", f"sqlite:///{project / 'new' / 'x.db'}"), 2, "no evidence graph here")
    assert snapshot(project) == before  # no tables added, no directory created


@pytest.mark.parametrize(
    "text,fragment",
    [
        ("just a body\n", "front matter: missing"),  # was three 'Field required' lines
        ("\ufeff---\nid: x\n---\nbody\n", "byte-order mark"),
        ("---\n- a\n- b\n---\nbody\n", "must be a mapping"),  # was three 'Field required' lines
        ("---\nid: cancel-reason\ntype: procedure\nbody\n", "no closing '---'"),
        (None, "duplicate key 'source'"),  # was the last one kept, silently
    ],
)
def test_card_front_matter_problems_are_one_line_each(package_copy, text, fragment):
    pkg = package_copy("reference")
    card = pkg / "em" / "procedure" / "cancel-reason.md"
    card.write_text(text if text is not None else card.read_text().replace("source:", "source: x\nsource:", 1))
    r = ratchet("package", "lint", pkg)
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert r.exit_code == 1 and len(lines) == 1 and "cancel-reason.md: front matter:" in lines[0], r.stderr
    assert fragment in lines[0], lines


def test_a_manifest_nested_too_deeply_is_named_not_taken_for_deep_directories(package_copy):
    pkg = package_copy("seed")
    (pkg / "manifest.yaml").write_text("name: x\ndescription: " + "[" * 700 + "]" * 700 + "\n")
    r = ratchet("package", "lint", pkg)
    assert r.exit_code == 1 and r.stderr.strip() == f"{pkg}/manifest.yaml: -: malformed YAML: nested too deeply to read"


def test_a_huge_per_family_is_refused(project):
    one_line(ratchet("bench", "materialize", "--out", "b", "--per-family", "100000000"), 2, "--per-family:", "1000")
    assert not (project / "b").exists()


def test_a_benchmark_file_behind_a_symlink_is_refused(project, bench_dir):
    """A campaign's lineage pins the benchmark's digest, which hashes a link, not the bytes read through it: the
    target could change under an unchanged digest (it loaded and ran)."""
    linked = project / "linked"
    shutil.copytree(bench_dir, linked)
    shutil.copy(linked / "policy.md", project / "policy.md")
    (linked / "policy.md").unlink()
    (linked / "policy.md").symlink_to(project / "policy.md")
    one_line(
        ratchet("eval", "--package", "pkg", "--benchmark", linked, "--out", "ev"), 2, "linked/policy.md: -: a symlink"
    )
    assert not (project / "ev").exists()


def test_a_campaign_evidence_db_that_is_something_else_is_refused_and_left_intact(tmp_path):
    """evidence.db in params.yaml pointing at a user's file or another program's SQLite database: refused when the
    campaign opens it (before any round), byte-identical; a new or empty file becomes a graph as before."""
    import sqlite3

    from components.evidence.graph import EvidenceGraph, GraphError

    (tmp_path / "notes.txt").write_text("x")
    with contextlib.closing(sqlite3.connect(tmp_path / "mlflow.db")) as con:
        con.execute("CREATE TABLE runs (id TEXT)")
        con.commit()
    before = snapshot(tmp_path)
    with pytest.raises(GraphError, match="notes.txt: evidence.db: not a SQLite database"):
        EvidenceGraph(tmp_path / "notes.txt")
    with pytest.raises(GraphError, match="mlflow.db: evidence.db: a database of something else"):
        EvidenceGraph(f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert snapshot(tmp_path) == before
    (tmp_path / "empty.db").write_bytes(b"")
    for name in ("empty.db", "new.db", "new.db"):  # created, then reopened
        EvidenceGraph(tmp_path / name).close()


def test_a_campaign_on_another_worlds_benchmark_is_refused(project, bench_dir):
    # benchmark.world=airline with the retail benchmark at benchmark.out: the airline start package ran on retail tasks
    one_line(
        ratchet(
            "campaign",
            "run",
            "--out",
            "camp",
            "--set",
            "benchmark.world=airline",
            "--set",
            f"benchmark.out={bench_dir}",
        ),
        2,
        "meta.json: world: 'retail', but benchmark.world is 'airline'",
    )
    assert not (project / "camp").exists()


def test_report_on_a_damaged_round_file_is_one_line_and_writes_nothing(project):
    # it was a pandas traceback after metrics.json had been written: a half-written report
    camp = project / "camp"
    (camp / "rounds" / "r01").mkdir(parents=True)
    (camp / "summary.json").write_text(
        json.dumps(
            {
                "campaign": "x",
                "champion": "M0",
                "champion_digest": "a" * 64,
                "accepted": 0,
                "rounds": 1,
                "test": None,
                "localization": {},
                "history": [{"round": 1, "verdict": "reject"}],
                "lineage": [{"version": "M0", "digest": "a" * 64}],
            }
        )
    )
    (camp / "rounds" / "r01" / "findings.csv").write_text("not,the,columns\n1,2,3\n")
    one_line(ratchet("report", "--campaign", "camp", "--out", "rep"), 2, "r01/findings.csv: -: not a readable table")
    assert not (project / "rep").exists()


@pytest.mark.parametrize(
    "setting,fragment",
    [
        ("campaign.tracking_uri=bogus://x", "not a store MLflow can use"),
        ("campaign.dask_address=notanaddress", "not a Dask scheduler address"),
    ],
)
def test_a_store_or_scheduler_address_that_cannot_work_is_refused_before_the_campaign(
    project, bench_dir, setting, fragment
):
    # both ran the campaign into a traceback of 150-300 lines inside its first round, its lineage already written
    one_line(
        ratchet(
            "campaign",
            "run",
            "--out",
            "camp",
            "--set",
            f"benchmark.out={bench_dir}",
            *EXPLAINED,
            "--set",
            "campaign.start=pkg",
            "--set",
            setting,
        ),
        2,
        f"params: {setting.split('=')[0]}: ",
        fragment,
    )
    assert not (project / "camp").exists()


@pytest.mark.parametrize("name", ["", "nightly/retail", "a%b"])
def test_a_deployment_name_prefect_refuses_is_one_line(name):
    one_line(ratchet("campaign", "schedule", "--cron", "0 3 * * *", "--name", name), 2, "--name:", "deployment name")


# -- session 8: the second red team ------------------------------------------------------------------------------------

from tests.test_openai_backend import MSGS, completion, fake  # noqa: E402,F401 - the scripted fake server fixture


def _reply(**change) -> dict:
    body = completion("hello")
    for path, value in change.items():
        *head, last = path.split("__")
        node = body
        for k in head:
            node = node[int(k)] if isinstance(node, list) else node[k]
        node[last] = value
    return {"body": body}


@pytest.mark.parametrize(
    "change",
    [
        {"choices__0__message": None},
        {"choices__0__message": "hello"},
        {"usage__prompt_tokens": "many"},
        {"usage__completion_tokens": -1000000},
        {"usage__prompt_tokens": 2.5},
        {"usage": "lots"},
    ],
    ids=["null-message", "string-message", "usage-string", "usage-negative", "usage-fraction", "usage-not-an-object"],
)
def test_a_reply_with_a_null_message_or_bad_usage_is_one_error_kind_never_credited(fake, change):
    from components.models import make_model
    from components.models.base import ModelError

    m = make_model("openai", {"base_url": fake.url, "max_retries": 0, "timeout": 5.0})
    fake.script = [_reply(**change)]
    with pytest.raises(ModelError) as e:
        m.complete(MSGS, tools=None, seed=0)
    assert e.value.kind == "malformed", str(e.value)
    u = e.value.usage
    if "usage" in next(iter(change)):  # counts that are not counts: the prompt by the meter, not the reply's
        assert u.calls == 1 and u.tokens_out == 0 and 0 < u.tokens_in < 100, u
    else:  # sound counts with an unusable message: what the server says it spent is counted
        assert (u.calls, u.tokens_in, u.tokens_out) == (1, 100, 10), u


def test_an_eval_on_replies_with_negative_usage_records_the_error_and_credits_nothing(project, bench_dir, fake):
    items = ",".join(json.loads((bench_dir / "splits.json").read_text())["dev"][:2])
    fake.script = [_reply(usage__prompt_tokens=-1000000, usage__completion_tokens=-1000000)] * 2
    r = ratchet(
        "eval",
        "--package",
        "pkg",
        "--benchmark",
        bench_dir,
        "--items",
        items,
        "--seeds",
        "1",
        "--model",
        "openai",
        "--base-url",
        fake.url,
        "--max-retries",
        "0",
        "--out",
        "ev",
    )
    one_line(r, 1, "every episode errored (2 of 2); the first: model: malformed: the reply's usage")
    assert "-1000000" not in r.stdout
    rows = (
        [json.loads(x) for x in (project / "ev" / "scores.jsonl").read_text().splitlines()]
        if (project / "ev" / "scores.jsonl").exists()
        else []
    )
    assert all(row.get("tokens_in", 0) >= 0 for row in rows)


@pytest.mark.parametrize(
    "raw,param",
    [
        ('"temperature": "hot"', "temperature"),
        ('"temperature": NaN', "temperature"),
        ('"temperature": 7', "temperature"),
        ('"max_tokens": -1', "max_tokens"),
        ('"max_tokens": true', "max_tokens"),
        ('"top_p": "0.5"', "top_p"),
    ],
)
def test_serve_sim_refuses_sampling_values_of_the_wrong_type_or_range(sim, bench_dir, raw, param):
    body = json.dumps(_conversation(bench_dir))
    bad = body[:-1] + ", " + raw + "}"
    with httpx.Client(base_url=sim, timeout=10) as client:
        _error_of(
            client.post("/v1/chat/completions", content=bad, headers={"content-type": "application/json"}), 400, param
        )
        ok = {**_conversation(bench_dir), "temperature": 0.7, "max_tokens": 64}
        assert client.post("/v1/chat/completions", json=ok).status_code == 200


def test_serve_sim_closes_a_connection_whose_body_stalls(sim):
    host, port = sim.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=8) as s:
        s.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Content-Length: 1000\r\n\r\n{"messages": ['
        )  # full headers, then the body stops
        t = time.monotonic()
        got = b""
        while chunk := s.recv(4096):
            got += chunk
        assert time.monotonic() - t < 5
    assert got.startswith(b"HTTP/1.1 408") and b"request_timeout" in got, got[:200]


@pytest.mark.parametrize(
    "setting,field",
    [
        ("campaign.seeds=true", "campaign.seeds"),
        ("gate.alpha=false", "gate.alpha"),
        ("budget.model_calls=yes", "budget.model_calls"),
    ],
)
def test_a_yes_no_value_is_not_taken_for_a_number(project, bench_dir, setting, field):
    before = snapshot(project)
    one_line(
        ratchet(
            "campaign",
            "run",
            "--out",
            "camp",
            "--set",
            f"benchmark.out={bench_dir}",
            *EXPLAINED,
            "--set",
            "campaign.start=pkg",
            "--set",
            setting,
        ),
        2,
        f"{field}:",
        "yes/no value",
    )
    assert snapshot(project) == before
    assert load_params(None, {"campaign.seeds": 2}).campaign.seeds == 2  # a number still is one


def test_report_refuses_a_campaign_with_a_round_directory_missing(project):
    camp = project / "camp"
    (camp / "rounds" / "r01").mkdir(parents=True)
    (camp / "summary.json").write_text(
        json.dumps(
            {
                "campaign": "x",
                "champion": "M0",
                "champion_digest": "a" * 64,
                "accepted": 0,
                "rounds": 2,
                "test": None,
                "localization": {},
                "history": [{"round": 1, "verdict": "reject"}, {"round": 2, "verdict": "reject"}],
                "lineage": [{"version": "M0", "digest": "a" * 64}],
            }
        )
    )
    one_line(
        ratchet("report", "--campaign", "camp", "--out", "rep"), 2, "rounds/r02: -: round 2", "directory is missing"
    )
    assert not (project / "rep").exists()


# the evidence graph: a claim behind promotion M1, its plan and gate verdict, recorded as a campaign records them
def _graph_with_m1(path: Path):
    from components.evidence.graph import EvidenceGraph

    h = "a" * 64
    g = EvidenceGraph(path, campaign="c1")
    c = g.add("claim", "c1", "refusals of a write quote a rule", author="meta_agent")
    g.cite(c.id, "e#0", 2, h)
    g.verify(c.id, lambda ep, step: h)
    plan = g.add("decision", "plan:p1", "E: add a card", {"type": "plan", "plan_key": "p1"}, author="meta_agent")
    g.link(c.id, "used_in", plan.id)
    v = g.add(
        "decision",
        "verdict:p1",
        "accepted",
        {
            "type": "gate_verdict",
            "accept": True,
            "plan_key": "p1",
            "stage": "gate",
            "net": 0.1,
            "ci_lo": 0.01,
            "ci_hi": 0.2,
        },
    )
    g.link(v.id, "derived_from", plan.id)
    promo = g.promote(
        "promotion:d1",
        "M1: E: add a card",
        v.id,
        [c.id],
        {"version": "M1", "digest": "d" * 64, "plan_key": "p1", "round": 1, "campaign": "c1"},
    )
    g.link(plan.id, "used_in", promo.id)
    return g, c, v, promo


def test_revoking_twice_is_idempotent_and_keeps_every_reason(tmp_path):
    db = tmp_path / "evidence.db"
    g, c, _, promo = _graph_with_m1(db)
    g.close()
    first = ratchet("evidence", "revoke", c.id, "--reason", "the rule changed", "--db", db)
    assert first.exit_code == 0 and f"flagged {promo.id}" in first.stdout, first.stdout
    second = ratchet("evidence", "revoke", c.id[:10], "--reason", "and the receipt was misread", "--db", db)
    assert second.exit_code == 0 and "already revoked" in second.stdout and "flagged " not in second.stdout, (
        second.stdout
    )
    from components.evidence.graph import EvidenceGraph

    with EvidenceGraph(db) as g:
        r = g.revoked()
        assert list(r) == [c.id] and r[c.id]["reasons"] == ["the rule changed", "and the receipt was misread"]
    why = ratchet("evidence", "why", "M1", "--db", db)
    assert "(REVOKED: the rule changed; and the receipt was misread)" in why.stdout, why.stdout  # every reason


def test_revocation_reaches_the_projection_and_evidence_why(tmp_path):
    from components.evidence.graph import Expiry
    from components.evidence.graph_record import project

    db = tmp_path / "evidence.db"
    g, c, v, promo = _graph_with_m1(db)
    now = Expiry(benchmark="b" * 64, model="sim")
    before = project(g, [], now, 100_000)
    assert [x["id"] for x in before["verdicts"]] == [v.id] and "flagged" not in before["verdicts"][0]
    g.revoke(c.id, "the rule changed")
    after = project(g, [], now, 100_000)
    assert after["verdicts"][0]["flagged"] == c.id  # the verdict derives from the revoked claim (claim -> plan -> it)
    assert after["promotions"][0]["flagged"] == c.id
    g.close()
    why = ratchet("evidence", "why", "M1", "--db", db)
    assert why.exit_code == 0, why.stderr
    claim_line = next(x for x in why.stdout.splitlines() if "packet claim" in x)
    verdict_line = next(x for x in why.stdout.splitlines() if "gate verdict" in x)
    assert "(REVOKED: the rule changed)" in claim_line and "(supported)" not in claim_line, claim_line
    assert f"FLAGGED: derived from revoked {c.id}" in verdict_line, verdict_line


def test_an_ambiguous_node_prefix_says_so(tmp_path):
    from components.evidence.graph import EvidenceGraph

    db = tmp_path / "evidence.db"
    with EvidenceGraph(db, campaign="c") as g:
        ids = [g.add("source", f"s{i}", f"source {i}").id for i in range(40)]
    ids = sorted(ids)
    common = max((os.path.commonprefix([x, y]) for x, y in zip(ids, ids[1:])), key=len)  # the longest shared one
    a, n = next(x for x in ids if x.startswith(common)), sum(x.startswith(common) for x in ids)
    assert n >= 2 and len(common) > len("source:")
    before = db.read_bytes()
    one_line(
        ratchet("evidence", "revoke", common, "--reason", "x", "--db", db),
        2,
        f"{common}: ambiguous: matches {n} nodes",
        "give more of the id",
    )
    assert db.read_bytes() == before
    assert ratchet("evidence", "revoke", a, "--reason", "x", "--db", db).exit_code == 0


@contextlib.contextmanager
def _read_only(directory: Path):
    """`directory` read-only for this process: a read-only bind mount when running as root (root writes through
    permission bits), else permission bits."""
    import subprocess

    if os.geteuid() == 0:
        ok = subprocess.run(["mount", "--bind", str(directory), str(directory)], capture_output=True).returncode == 0
        ok = (
            ok
            and subprocess.run(["mount", "-o", "remount,ro,bind", str(directory)], capture_output=True).returncode == 0
        )
        if not ok:
            subprocess.run(["umount", str(directory)], capture_output=True)
            pytest.skip("root without a read-only bind mount: a read-only graph cannot be made here")
        try:
            yield
        finally:
            subprocess.run(["umount", str(directory)], check=True)
    else:
        modes = {p: p.stat().st_mode for p in [directory, *directory.iterdir()]}
        for p in modes:
            p.chmod(0o555 if p.is_dir() else 0o444)
        try:
            yield
        finally:
            for p, m in modes.items():
                p.chmod(m)


def test_a_read_only_evidence_graph_is_read(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    db = ro / "evidence.db"
    g, c, _, _ = _graph_with_m1(db)
    g.revoke(c.id, "the rule changed")
    g.close()
    for side in ("-wal", "-shm"):  # what a finished campaign leaves: the WAL checkpointed, no shared-memory file
        Path(f"{db}{side}").unlink(missing_ok=True)
    before = snapshot(ro)
    with _read_only(ro):
        why = ratchet("evidence", "why", "M1", "--db", db)
        assert why.exit_code == 0 and "REVOKED: the rule changed" in why.stdout, (why.stdout, why.stderr)
        show = ratchet("evidence", "show", "--db", db)
        assert show.exit_code == 0 and "revoked" in show.stdout, show.stderr
        one_line(ratchet("evidence", "revoke", c.id, "--reason", "y", "--db", db), 2, "read-only")
    assert snapshot(ro) == before


@pytest.mark.parametrize("edit", ["verdict", "dropped"])
def test_reproduce_on_an_altered_record_says_the_record_was_altered(project, bench_dir, edit):
    from components.memory import digest

    camp = _started(project, bench_dir)
    lin = Lineage(camp / "lineage")
    shutil.copytree(project / "pkg", project / "cand")
    (project / "cand" / "manifest.yaml").write_text((project / "cand" / "manifest.yaml").read_text() + "\n")
    m1 = lin.commit(project / "cand", digest(project / "cand"), 1, {"plan_key": "p1"})
    (camp / "rounds" / "r01").mkdir(parents=True)
    (camp / "rounds" / "r01" / "round.json").write_text(
        json.dumps({"round": 1, "verdict": "accept", "child": {"version": m1.name, "digest": m1.digest}})
    )
    lines = lin.log.read_text().splitlines()
    rec = json.loads(lines[-1])
    if edit == "verdict":
        rec["verdict"] = "reject"  # a person edited the recorded verdict
    else:
        rec.update(verdict="reject", child=None)  # and the promoted version with it
    lin.log.write_text("\n".join([*lines[:-1], json.dumps(rec)]) + "\n")
    one_line(
        ratchet("reproduce", "--campaign", "camp", "--version", "M1"),
        2,
        "lineage.jsonl: round 1:",
        "the record was altered",
    )
    one_line(ratchet("reproduce", "--campaign", "camp", "--version", "M7"), 2, "'M7' was not promoted here")


# -- signals: Ctrl-C and SIGTERM stop a campaign at once, resumably, leaving no process ---------------------------------

# test_operations' fixtures and its `ratchet` commands as processes in homes of their own (a zygote); here the name
# `ratchet` is the in-process CLI helper, so that fixture is defined under another attribute (crash_setup asks for
# it by name) and the test takes it by name
from tests.test_operations import PRELOAD, Ratchet, contract_verdict, crash_setup, mlflow_db, small  # noqa: E402,F401


@pytest.fixture(scope="module", name="ratchet")
def _ops_processes(prefect_server, mlflow_db, tmp_path_factory):
    r = Ratchet(prefect_server, mlflow_db, tmp_path_factory.mktemp("zygote-ops"))
    yield r
    r.close()


# When: the temporary Prefect server is up (no PREFECT_API_URL: the campaign's own child process), the round's
# evaluation is done (diagnosis and planning under way), the repair screen is done (the gate's dev evaluations under
# way), the version is committed (the test certification under way). CI runs four cases that cover each moment,
# signal and target; RATCHET_SIGNAL_MATRIX=full runs all 16 (docs/operations.md, "Nothing stuck").
MOMENTS = {"server": None, "evaluated": "evaluate", "gating": "repair", "certifying": "commit"}
CI_CASES = [
    ("server", signal.SIGTERM, "group"),
    ("evaluated", signal.SIGINT, "group"),
    ("gating", signal.SIGTERM, "pid"),
    ("certifying", signal.SIGINT, "pid"),
]
CASES = (
    [(m, s, t) for m in MOMENTS for s in (signal.SIGINT, signal.SIGTERM) for t in ("pid", "group")]
    if os.environ.get("RATCHET_SIGNAL_MATRIX") == "full"
    else CI_CASES
)


def _descendants(pid: int) -> list[int]:
    import psutil

    try:
        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _reached(cwd: Path, pid: int, moment: str) -> bool:
    import psutil

    stage = MOMENTS[moment]
    if stage is None:
        for c in _descendants(pid):
            with contextlib.suppress(psutil.Error):
                if "prefect.server.api.server:create_app" in " ".join(psutil.Process(c).cmdline()):
                    return True
        return False
    state = cwd / "camp" / ".state" / "state.json"
    try:
        now = json.loads(state.read_text()).get("stage")
    except (OSError, ValueError):
        return False
    from tests.test_operations import STAGES

    # at or just past it (a short stage can end between two polls); "done" is too late and fails the case
    return now in STAGES and STAGES.index(now) >= STAGES.index(stage)


@pytest.mark.xdist_group("signals")  # minutes of campaigns: a unit of its own, not queued behind the rest of the module
def test_sigint_and_sigterm_stop_a_campaign_within_10_s_resumably_and_leave_no_process(request, crash_setup, tmp_path):
    """Each case: start the campaign in a process group of its own, wait for the moment, send the signal to the
    process or its group; it must exit 128+signal within 10 s with no descendant left, and `campaign resume` must
    finish it with the summary and lineage of an uninterrupted run, byte for byte."""
    ops = request.getfixturevalue("ratchet")
    bench, start, clean = crash_setup
    rows, problems = [], []
    for i, (moment, sig, target) in enumerate(CASES):
        cwd = tmp_path / f"case{i}"
        contract_verdict(clean, cwd)
        # a graph of its own: campaign memory would otherwise reuse what the previous case's campaign accepted
        env = ops._env(cwd, {"RATCHET_EVIDENCE_DB": str(cwd / "evidence.db")})
        unset = []
        if MOMENTS[moment] is None:  # Prefect's temporary server, the campaign's own child
            env.pop("PREFECT_API_URL")
            unset = ["PREFECT_API_URL"]
        pid = ops.zygote.start(cwd, ["campaign", "run", *small(bench, start=start)], env, unset, session=True)
        job = ops.zygote.n
        deadline = time.monotonic() + 300
        while not _reached(cwd, pid, moment) and _running(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _running(pid), f"{moment}: the campaign ended before the moment: {ops.zygote.log(job)[1][-2000:]}"
        time.sleep(0.3)  # into the next stage
        kids = _descendants(pid)
        t0 = time.monotonic()
        os.killpg(pid, sig) if target == "group" else os.kill(pid, sig)
        code = ops.zygote.wait(pid, timeout=30)
        took = time.monotonic() - t0
        time.sleep(0.5)
        left = [k for k in kids if _running(k)]
        err = ops.zygote.log(job)[1]
        # `campaign resume` once the campaign recorded its params; before that, the same command again
        started = (cwd / "camp" / ".state" / "params.json").is_file()
        how = "resume" if started else "rerun"
        resumed = ops.zygote(
            cwd,
            ["campaign", "resume", "--out", "camp"] if started else ["campaign", "run", *small(bench, start=start)],
            env,
            unset,
        )
        same = resumed.returncode == 0 and all(
            (cwd / "camp" / n).is_file() and (cwd / "camp" / n).read_bytes() == (clean / "camp" / n).read_bytes()
            for n in ("summary.json", "lineage/lineage.jsonl")
        )
        rows.append(
            f"| {moment} | {sig.name} | {target} | {code} | {took:.1f} | {len(kids)} / {len(left)} | "
            f"{how}: {'yes' if same else 'NO'} |"
        )
        if code != 128 + sig or took > 10 or left or not same or f"stopped by {sig.name}" not in err:
            problems.append(
                (
                    moment,
                    sig.name,
                    target,
                    code,
                    round(took, 1),
                    left,
                    resumed.returncode,
                    err[-600:],
                    resumed.stderr[-600:],
                )
            )
    table = "\n".join(
        [
            "| moment | signal | target | exit | seconds | children / left | continued: identical |",
            "|---|---|---|---|---|---|---|",
            *rows,
        ]
    )
    print(table)
    (Path(os.environ.get("RATCHET_SIGNAL_TABLE", tmp_path / "signals.md"))).write_text(table + "\n")
    assert not problems, problems


# -- a full disk, an unwritable place -----------------------------------------------------------------------------------


def test_a_full_disk_during_eval_names_the_output_and_leaves_nothing(project, bench_dir):
    """ENOSPC at the write boundary (pandas writing a table): write(2) names no file; the line names the output."""
    import errno

    import pandas as pd

    items = json.loads((bench_dir / "splits.json").read_text())["dev"][0]

    def full(*_a, **_k):
        raise OSError(errno.ENOSPC, "No space left on device")

    before = snapshot(project)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pd.DataFrame, "to_csv", full)
        one_line(
            ratchet(
                "eval", "--package", "pkg", "--benchmark", bench_dir, "--items", items, "--seeds", "1", "--out", "ev"
            ),
            1,
            "error: ev: -: No space left on device",
        )
    assert snapshot(project) == before  # no half-written output, no temp directory
    again = ratchet(
        "eval", "--package", "pkg", "--benchmark", bench_dir, "--items", items, "--seeds", "1", "--out", "ev"
    )
    assert again.exit_code == 0, again.stderr  # space again: the same command works


def test_a_ledger_on_a_failing_disk_is_one_line_naming_it(tmp_path, monkeypatch):
    """SQLite says "disk I/O error" and no more: the ledger's message names its file and what to do."""
    import sqlite3

    from components.errors import StorageError
    from components.evidence import budget

    ledger = budget.BudgetLedger(tmp_path / "budget.sqlite")
    wallet = ledger.open_wallet("w", {"model_calls": 10})
    real = sqlite3.connect

    class Failing:
        def __init__(self, *a, **k):
            self.db = real(*a, **k)

        def execute(self, sql, *args):
            if sql.startswith("BEGIN"):
                raise sqlite3.OperationalError("disk I/O error")
            return self.db.execute(sql, *args)

        def close(self):
            self.db.close()

    monkeypatch.setattr(budget.sqlite3, "connect", Failing)
    with pytest.raises(StorageError) as e:
        ledger.reserve(wallet, {"model_calls": 1})
    assert e.value.filename == str(tmp_path / "budget.sqlite") and "disk i/o error" in e.value.strerror
    assert "rerun the same command" in e.value.strerror


@pytest.fixture
def full_disk(tmp_path):
    """A directory on a 1 MiB tmpfs with no space left, and a function that frees it; skipped where this process
    cannot mount (not root): the two tests above simulate ENOSPC at the write boundaries instead."""
    import subprocess

    where = tmp_path / "full"
    where.mkdir()
    if (
        os.geteuid() != 0
        or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(where)], capture_output=True
        ).returncode
        != 0
    ):
        pytest.skip("cannot mount a small tmpfs here")
    filler = where / "filler"
    try:
        with open(filler, "wb") as f:
            with contextlib.suppress(OSError):
                while True:
                    f.write(b"x" * 65536)
                    f.flush()
        yield where, filler.unlink
    finally:
        subprocess.run(["umount", "-l", str(where)], check=True)


def test_a_campaign_on_a_full_disk_is_one_line_naming_the_path_and_resumes(prefect_server, project, full_disk):
    from components.params import BenchmarkParams

    where, free = full_disk
    # the smallest: 1 round, ~20 items
    BenchmarkParams(out=str(project / "b"), per_family=3, receipts="explained").materialize()
    camp = where / "camp"
    args = [
        "campaign",
        "run",
        "--out",
        camp,
        "--rounds",
        "1",
        "--set",
        f"benchmark.out={project / 'b'}",
        *EXPLAINED,
        "--set",
        "benchmark.per_family=3",
        "--set",
        "campaign.start=pkg",
        "--set",
        "campaign.seeds=1",
        "--set",
        "gate.n_boot=1000",
        "--set",
        "campaign.traces_per_round=0",
    ]
    r = ratchet(*args)
    line = one_line(r, 1, str(where))
    assert "No space left on device" in line or "disk" in line, line
    free()
    r = ratchet(*args)
    assert r.exit_code == 0, r.stderr
    assert (camp / "summary.json").is_file()


SERVER_PARENT = """
import sys
sys.path.insert(0, {root!r})
from flows.signals import obey_signals, run_server
obey_signals()
sys.exit(run_server([sys.executable, "-c", "import time; time.sleep(120)"], {{}}))
"""


@pytest.mark.parametrize("how", ["SIGTERM-pid", "SIGINT-group", "SIGKILL-pid"])
def test_a_server_a_command_started_stops_with_it(tmp_path, how):
    """`ratchet ui` and `ratchet server` run their server through flows.signals.run_server (checked below): here
    with a stand-in server, the command is stopped by a signal, or killed, and its server must go with it."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    parent = subprocess.Popen(
        [sys.executable, "-c", SERVER_PARENT.format(root=str(ROOT))], start_new_session=True, stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + 60
    while not (kids := _children(parent.pid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert kids, "the stand-in server never started"
    sig, target = how.split("-")
    t0 = time.monotonic()
    if target == "group":
        os.killpg(parent.pid, getattr(signal, sig))
    else:
        os.kill(parent.pid, getattr(signal, sig))
    code = parent.wait(timeout=30)
    while any(_running(k) for k in kids) and time.monotonic() - t0 < 10:
        time.sleep(0.05)
    assert not [k for k in kids if _running(k)], f"{how}: the server outlived its command"
    assert code == (-9 if sig == "SIGKILL" else 128 + getattr(signal, sig)), (code, parent.stderr.read())
    assert time.monotonic() - t0 < 10


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_a_server_whose_command_died_before_it_armed_the_death_signal_never_starts():
    """The race a parent-death signal leaves: the command dies between the fork and the child's prctl, so no signal
    ever comes. The child finds its parent gone once armed, and ends before its exec (it never reports back)."""
    from flows.signals import _parent_death_signal

    r, w = os.pipe()
    command = os.fork()
    if command == 0:  # the command: arms its server's fork, then dies before the server arms it
        arm = _parent_death_signal()
        if os.fork() == 0:  # the server, between fork and exec
            me = os.getppid()
            deadline = time.monotonic() + 10
            while os.getppid() == me and time.monotonic() < deadline:
                time.sleep(0.01)
            arm()
            os.write(w, b"exec")  # reached only when arming let it go on to its exec
            os._exit(0)
        os._exit(0)
    os.close(w)
    os.waitpid(command, 0)
    with os.fdopen(r, "rb") as got:
        assert got.read() == b""


@pytest.mark.parametrize(
    "args,program",
    [
        (["ui", "--port", "5999", "--tracking-uri", "sqlite:///m.db"], "mlflow"),
        (["server", "--port", "4299"], "prefect"),
    ],
)
def test_ui_and_server_run_their_server_so_that_it_stops_with_them(tmp_path, monkeypatch, args, program):
    import flows.signals

    seen, envs = [], []
    monkeypatch.delenv("PREFECT_UI_API_URL", raising=False)
    monkeypatch.setattr(flows.signals, "run_server", lambda cmd, env: seen.append(cmd) or envs.append(env) or 0)
    r = ratchet(*args)
    assert r.exit_code == 0 and len(seen) == 1 and program in seen[0], (r.stderr, seen)
    if program == "prefect":  # the dashboard is on, and its pages call this server's API, on this port
        assert envs[0]["PREFECT_UI_ENABLED"] == "true" and envs[0]["PREFECT_UI_API_URL"] == "http://127.0.0.1:4299/api"


def test_a_temporary_prefect_server_that_does_not_come_up_is_one_line_saying_what_to_do(project, bench_dir, zygote):
    """Under load Prefect's temporary server can miss its startup timeout: ~100 lines of Prefect traceback were
    printed. A timeout of 0 s reproduces that path in a real process (the zygote imported without PREFECT_API_URL)."""
    _started(project, bench_dir)
    home = project / "home"
    env = {
        **os.environ,
        "RATCHET_HOME": str(home),
        "PREFECT_HOME": str(home / "prefect"),
        "PREFECT_LOCAL_STORAGE_PATH": str(home / "prefect" / "storage"),
        "MLFLOW_TRACKING_URI": f"sqlite:///{home / 'mlflow.db'}",
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "0",
    }
    env.pop("PREFECT_API_URL", None)
    r = zygote(
        project,
        [
            "campaign",
            "run",
            "--out",
            "camp",
            "--set",
            f"benchmark.out={bench_dir}",
            *EXPLAINED,
            "--set",
            "campaign.start=pkg",
        ],
        env=env,
        unset=["PREFECT_API_URL"],
        timeout=300,
    )
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert r.returncode == 1 and len(lines) == 1, r.stderr[-3000:]
    assert (
        "did not answer within 0 s" in lines[0]
        and "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS" in lines[0]
        and "ratchet server" in lines[0]
    ), lines[0]


def test_the_entry_point_run_in_process_leaves_the_callers_signals_and_prefect_as_they_were(
    monkeypatch, capsys, tmp_path
):
    import sys

    import prefect.flow_engine

    from flows.cli import main

    before = (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM), prefect.flow_engine.capture_sigterm)
    monkeypatch.chdir(tmp_path)
    # refused by prepare, after the command has set up its flows' signal handling
    monkeypatch.setattr(sys, "argv", ["ratchet", "campaign", "run", "--out", "camp", "--set", "campaign.start=absent"])
    with pytest.raises(SystemExit) as e:
        main()
    assert e.value.code == 2 and "campaign.start: no such directory" in capsys.readouterr().err
    assert (
        signal.getsignal(signal.SIGINT),
        signal.getsignal(signal.SIGTERM),
        prefect.flow_engine.capture_sigterm,
    ) == before


# -- session 13: the third red team ------------------------------------------------------------------------------------
# score tables: one reader (components/evolution/gate_files.py::read_table), ids as text, seeds exact


def _table(path: Path, rows: list[tuple[str, str, str]]) -> Path:
    path.write_text("item_id,seed,score\n" + "".join(f"{i},{s},{v}\n" for i, s, v in rows))
    return path


def test_gate_keeps_an_item_named_na_or_empty_and_its_verdict(tmp_path):
    """pandas read `NA` and an empty id as missing values, and the items were lost: here five items improve and the
    two named `NA` and `` regress, so the gate rejects (reg_cap 0); without them it would accept."""
    names = ["a", "b", "c", "d", "e", "NA", ""]
    base = _table(tmp_path / "b.csv", [(n, str(s), "0.5") for n in names for s in range(2)])
    cand = _table(
        tmp_path / "c.csv", [(n, str(s), "0.0" if n in ("NA", "") else "0.6") for n in names for s in range(2)]
    )
    r = ratchet("gate", "--base", base, "--cand", cand, "--json", "--reg-cap", "0", "--n-boot", "1000")
    v = json.loads(r.stdout)
    assert r.exit_code == 1 and v["n_items"] == 7 and v["n_regressed"] == 2, r.stdout  # NA and "" are items


def test_gate_seeds_are_exact_integers_not_floats(tmp_path):
    """`1e300` and `2e300` were one seed to pandas (a float cast): refused, never paired as one."""
    rows = [(f"i{k}", "0", "0.5") for k in range(6)]
    ok = _table(tmp_path / "ok.csv", rows)
    big = _table(tmp_path / "big.csv", [(f"i{k}", "1e300" if k == 0 else "0", "0.5") for k in range(6)])
    one_line(
        ratchet("gate", "--base", ok, "--cand", big),
        2,
        "big.csv: seed: '1e300' on line 2",
        "not an integer written out",
    )


@pytest.mark.parametrize(
    "cell,fragment",
    [
        ("seed:inf", "seed: 'inf'"),
        ("seed:huge", "seed: '9999"),
        ("item:huge", "incomplete pairing"),
        ("score:huge", "score: '0.12"),
    ],
)
def test_gate_on_an_inf_seed_or_a_huge_cell_is_one_line_exit_2(tmp_path, cell, fragment):
    """Each was exit 3 (`internal error`: an OverflowError, the csv module's field limit)."""
    where, what = cell.split(":")
    value = {"inf": "inf", "huge": ("9" if where == "seed" else "0.12") * 100_000}[what]
    rows = [(f"i{k}", "0", "0.5") for k in range(6)]
    bad = [
        (
            value if where == "item" and k == 0 else f"i{k}",
            value if where == "seed" and k == 0 else "0",
            value if where == "score" and k == 0 else "0.5",
        )
        for k in range(6)
    ]
    one_line(
        ratchet("gate", "--base", _table(tmp_path / "b.csv", rows), "--cand", _table(tmp_path / "c.csv", bad)),
        2,
        fragment,
    )


def test_gate_reads_a_table_from_a_pipe(tmp_path):
    """`ratchet gate --base b.csv --cand <(cat c.csv)`: the table is read once (a pipe has no second reading)."""
    rows = [(f"i{k}", str(s), "0.5") for k in range(6) for s in range(2)]
    base = _table(tmp_path / "b.csv", rows)
    text = _table(tmp_path / "c.csv", [(i, s, "0.9") for i, s, _ in rows]).read_bytes()
    r_fd, w_fd = os.pipe()
    writer = threading.Thread(target=lambda: (os.write(w_fd, text), os.close(w_fd)))
    writer.start()
    try:
        r = ratchet("gate", "--base", base, "--cand", f"/dev/fd/{r_fd}", "--n-boot", "1000")
    finally:
        writer.join()
        os.close(r_fd)
    assert r.exit_code == 0 and r.stdout.startswith("ACCEPT"), (r.stdout, r.stderr)


# inputs a run did not use are refused, never recorded


@pytest.mark.parametrize(
    "setting,key",
    [("benchmark.per_family=8", "families"), ("benchmark.seed=1", "seed"), ("benchmark.dev_share=0.5", "splits")],
)
def test_a_benchmark_param_the_existing_benchmark_was_not_made_with_is_refused(project, setting, key):
    """`--set benchmark.per_family=8` over an existing benchmark reused it (only world and receipts were compared),
    and summary.json and MLflow recorded 8. Every key of meta.json is compared with what the params make."""
    from components.params import BenchmarkParams

    BenchmarkParams(out=str(project / "b"), per_family=6, receipts="explained").materialize()
    before = snapshot(project)
    r = ratchet(
        "campaign",
        "run",
        "--out",
        "camp",
        "--set",
        "benchmark.out=b",
        *EXPLAINED,
        "--set",
        "benchmark.per_family=6",
        "--set",
        setting,
        "--set",
        "campaign.start=pkg",
    )
    one_line(r, 2, f"b/meta.json: {key}:", "here, but the benchmark.* params make")
    assert snapshot(project) == before and not (project / "camp").exists()


# outer run: the training command, the output directory, the model's name


@pytest.fixture
def finished(project):
    (project / "camp").mkdir()
    (project / "camp" / "summary.json").write_text("{}\n")
    return project / "camp"


@pytest.mark.parametrize("train,fragment", [("", "--train: empty command"), ("'unclosed", "not a command line")])
def test_outer_run_with_an_empty_or_broken_training_command_is_refused(project, finished, train, fragment):
    """`--train ""` silently ran the offline learner."""
    before = snapshot(project)
    one_line(ratchet("outer", "run", "--campaign", "camp", "--out", "o", "--train", train), 2, fragment)
    assert snapshot(project) == before


@pytest.mark.parametrize(
    "out,fragment",
    [
        ("mine", "mine: --out: is a non-empty directory that Ratchet did not write"),
        ("notes.txt", "notes.txt: --out: is a file"),
    ],
)
def test_outer_run_over_a_users_directory_or_a_file_is_refused_and_left_intact(project, finished, out, fragment):
    """`outer run --out` over an existing directory deleted and overwrote the user's files there."""
    (project / "notes.txt").write_text("mine\n")
    before = snapshot(project)
    one_line(ratchet("outer", "run", "--campaign", "camp", "--out", out), 2, fragment)
    assert snapshot(project) == before


@pytest.mark.parametrize("name", ["../../escaped", "/tmp/escaped", "a/../../escaped"])
def test_a_trained_model_named_to_escape_is_refused_and_nothing_written_outside(tmp_path, name):
    """A trained model named `../../escaped` made `outer run --out a/mine` write `a/escaped.json`."""
    import sys

    from flows.outer import register_stage, train_stage

    out = tmp_path / "a" / "mine"
    (out / "export").mkdir(parents=True)
    spec = {"name": name, "model": "sim", "model_cfg": {}, "trained_on": "x"}
    write = f"import json,sys; json.dump({spec!r}, open(sys.argv[1], 'w'))"
    cmd = f"{sys.executable} -c {json.dumps(write)} {{out}}"
    before = snapshot(tmp_path)
    with pytest.raises(InputError, match=r"model\.json: name: .*must name a place inside|leads outside"):
        train_stage.fn(cmd, str(out / "export"), str(out / "model.json"))
    from components.outer.model import ModelSpec

    with pytest.raises(InputError, match="must name a place inside"):
        register_stage.fn(ModelSpec(**spec), str(out), str(tmp_path / "camp"), None)
    after = snapshot(tmp_path)
    assert {k for k in after if k not in before} <= {"a/mine/model.json"}  # what the command itself wrote


def test_a_failing_training_command_is_one_external_failure():
    import sys

    from components.errors import ExternalFailure
    from flows.outer import train_stage

    cmd = f"{sys.executable} -c \"import sys; print('CUDA out of memory', file=sys.stderr); sys.exit(3)\""
    with pytest.raises(
        ExternalFailure, match=r"--train: .*python.*: the training command exited 3: CUDA out of memory"
    ):
        train_stage.fn(cmd, "e", "m.json")
    with pytest.raises(ExternalFailure, match="could not start"):
        train_stage.fn("/no/such/trainer {out}", "e", "m.json")


@pytest.mark.parametrize(
    "field,value",
    [("parent", "../../../../../../../../usr"), ("parent", "/usr"), ("child", "../../../../../../../../usr")],
)
def test_reproduce_on_a_record_naming_a_place_outside_the_campaign_refuses_before_reading_it(
    project, bench_dir, field, value
):
    """A tampered lineage record's parent path made `reproduce` hash /usr (86 s) before refusing."""
    from components.memory import digest

    camp = _started(project, bench_dir)
    lin = Lineage(camp / "lineage")
    shutil.copytree(project / "pkg", project / "cand")
    (project / "cand" / "manifest.yaml").write_text((project / "cand" / "manifest.yaml").read_text() + "\n")
    lin.commit(project / "cand", digest(project / "cand"), 1, {"plan_key": "p1", "round_dir": "rounds/r01"})
    lines = lin.log.read_text().splitlines()
    rec = json.loads(lines[-1])
    rec[field]["version"] = value
    lin.log.write_text("\n".join([*lines[:-1], json.dumps(rec)]) + "\n")
    t0 = time.monotonic()
    r = ratchet("reproduce", "--campaign", "camp", "--version", value if field == "child" else "M1")
    one_line(r, 2, f"lineage.jsonl: round 1: {field}.version:", "must name a place inside")
    assert time.monotonic() - t0 < 30


@pytest.mark.parametrize("command", ["materialize", "eval"])
def test_a_read_only_out_is_named_as_given_not_as_a_temporary_name(project, bench_dir, command):
    ro = project / "ro"
    ro.mkdir()
    with _read_only(ro):
        if command == "materialize":
            r = ratchet("bench", "materialize", "--out", "ro/b", "--per-family", "3")
        else:
            r = ratchet(
                "eval",
                "--package",
                "pkg",
                "--benchmark",
                bench_dir,
                "--out",
                "ro/ev",
                "--seeds",
                "1",
                "--items",
                json.loads((bench_dir / "splits.json").read_text())["dev"][0],
            )
        line = one_line(r, 1, "Read-only file system")
    assert line.startswith(f"error: ro/{'b' if command == 'materialize' else 'ev'}: -:"), line
    assert ".tmp-" not in line and list(ro.iterdir()) == []


# external faults: one line naming the thing


def _damaged_graph(path: Path) -> None:
    """A graph whose pages past the schema are overwritten: sqlite_master reads, the node table does not."""
    g, *_ = _graph_with_m1(path)
    for i in range(200):
        g.add("claim", f"k{i}", "x" * 500)
    g.close()
    for side in ("-wal", "-shm"):
        Path(f"{path}{side}").unlink(missing_ok=True)
    data = bytearray(path.read_bytes())
    page = 4096
    for at in range(3 * page, len(data) - page, page):
        data[at : at + 100] = b"\xff" * 100
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("args", [["show"], ["why", "M1"], ["revoke", "abc", "--reason", "x"], ["show", "--open"]])
def test_evidence_on_a_damaged_graph_is_one_line_and_leaves_no_wal_beside_it(tmp_path, args):
    """SQLAlchemy's "malformed" traceback, and -wal/-shm files created beside the graph it refused."""
    db = tmp_path / "g" / "evidence.db"
    db.parent.mkdir()
    _damaged_graph(db)
    before = snapshot(tmp_path)
    one_line(ratchet("evidence", *args, "--db", db), 2, "evidence.db: evidence.db: the evidence graph is damaged")
    assert snapshot(tmp_path) == before  # byte-identical, and nothing beside it


def test_a_graph_damaged_after_it_was_opened_is_one_line_too(tmp_path):
    from components.evidence.graph import EvidenceGraph, GraphError

    db = tmp_path / "evidence.db"
    _damaged_graph(db)
    with EvidenceGraph(db) as g, pytest.raises(GraphError, match="the evidence graph is damaged"):
        g.nodes()


@pytest.mark.parametrize(
    "command",
    [
        ["package", "lint", "pkg"],
        ["package", "digest", "pkg"],
        ["eval", "--package", "pkg", "--out", "ev", "--seeds", "1"],
    ],
)
def test_a_package_holding_a_fifo_is_refused_not_read(project, bench_dir, command):
    """`package lint` said ok on a start package holding a FIFO (its files were listed as regular files only); a
    reader or a copy of it would block on the FIFO."""
    os.mkfifo(project / "pkg" / "pipe")
    before = snapshot(project, skip=project / "pkg")
    args = [*command, *(["--benchmark", bench_dir] if command[0] == "eval" else [])]
    r = ratchet(*args)
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert r.exit_code in (1, 2) and len(lines) == 1, (r.exit_code, r.stdout, r.stderr)
    assert "pkg/pipe" in lines[0] and "a FIFO, not a regular file" in lines[0], lines[0]
    assert snapshot(project, skip=project / "pkg") == before


# `ratchet server`: its note is its own


@pytest.fixture
def listening():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_a_second_server_on_a_taken_port_keeps_the_running_servers_note(tmp_path, monkeypatch, listening):
    """A failed second `ratchet server` deleted the running server's note (it had overwritten it with its own)."""
    import flows.signals
    from components.env import SERVER_NOTE

    monkeypatch.setenv("RATCHET_HOME", str(tmp_path))
    monkeypatch.setattr(flows.signals, "run_server", lambda cmd, env: pytest.fail("no server may start"))
    note = tmp_path / SERVER_NOTE
    first = json.dumps({"url": f"http://127.0.0.1:{listening}/api", "pid": os.getpid()})
    note.write_text(first)
    one_line(ratchet("server", "--port", listening), 2, "prefect-server.json: url: a Prefect server already runs")
    one_line(ratchet("server", "--port", str(free_port_number())), 2, "already runs")  # any port: one per home
    assert note.read_text() == first
    note.unlink()
    one_line(ratchet("server", "--port", listening), 2, f"--port: {listening}: in use on 127.0.0.1")
    assert not note.exists()


def free_port_number() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SERVER_COMMAND = """
import sys
sys.path.insert(0, {root!r})
import flows.signals
flows.signals.run_server = lambda cmd, env: __import__("time").sleep(120) or 0  # a stand-in for Prefect's server
sys.argv = ["ratchet", "server", "--port", {port!r}]
from flows.cli import main
main()
"""


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_the_server_note_goes_when_ratchet_server_is_stopped_by_a_signal(tmp_path, sig):
    """The docs say the note is removed on exit; SIGTERM and Ctrl-C left it (the stop is os._exit)."""
    import subprocess
    import sys

    from components.env import SERVER_NOTE
    from tests.conftest import ROOT

    env = {**os.environ, "RATCHET_HOME": str(tmp_path)}
    env.pop("PREFECT_API_URL", None)
    p = subprocess.Popen(
        [sys.executable, "-c", SERVER_COMMAND.format(root=str(ROOT), port=str(free_port_number()))],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not (tmp_path / SERVER_NOTE).exists() and time.monotonic() < deadline and p.poll() is None:
        time.sleep(0.05)
    assert (tmp_path / SERVER_NOTE).exists(), p.communicate(timeout=10)
    p.send_signal(getattr(signal, sig))
    _, err = p.communicate(timeout=30)
    assert p.returncode == 128 + getattr(signal, sig) and f"stopped by {sig}" in err, (p.returncode, err)
    assert not (tmp_path / SERVER_NOTE).exists()


# a persistent Prefect server that dies under a campaign


def _start_ratchet_server(home: Path, port: int):
    import subprocess
    import sys

    from tests.conftest import migrated_database

    (home / "prefect").mkdir(parents=True, exist_ok=True)
    if not (home / "prefect" / "prefect.db").exists():
        migrated_database(home / "prefect" / "prefect.db")
    env = {**os.environ, "RATCHET_HOME": str(home), "PREFECT_HOME": str(home / "prefect")}
    env.pop("PREFECT_API_URL", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "flows.entry", "server", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        assert proc.poll() is None, "ratchet server exited"
        try:
            if httpx.get(f"http://127.0.0.1:{port}/api/health", timeout=5).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise AssertionError("ratchet server did not come up")


@pytest.mark.xdist_group("server_dies")  # a server of its own and a campaign: a unit of its own
def test_a_campaign_whose_prefect_server_dies_stops_within_60_s_with_one_line_and_resumes(tmp_path):
    """kill -9 of `ratchet server` mid-campaign left the campaign running 11+ minutes, printing connection errors."""
    import subprocess
    import sys

    from components.params import BenchmarkParams

    home = tmp_path / "home"
    port = free_port_number()
    server = _start_ratchet_server(home, port)
    BenchmarkParams(out=str(tmp_path / "b"), per_family=3, receipts="explained").materialize()
    shutil.copytree(SEED, tmp_path / "pkg")
    env = {
        **os.environ,
        "RATCHET_HOME": str(home),
        "PREFECT_HOME": str(home / "prefect"),
        "PREFECT_LOCAL_STORAGE_PATH": str(home / "prefect" / "storage"),
        "MLFLOW_TRACKING_URI": f"sqlite:///{home / 'mlflow.db'}",
        "RATCHET_EVIDENCE_DB": str(tmp_path / "ev.db"),
    }
    env.pop("PREFECT_API_URL", None)  # the command finds the server through its note, as a user's would
    cmd = [
        sys.executable,
        "-m",
        "flows.entry",
        "campaign",
        "run",
        "--out",
        "camp",
        "--rounds",
        "2",
        "--set",
        "benchmark.out=b",
        "--set",
        "benchmark.per_family=3",
        "--set",
        "benchmark.receipts=explained",
        "--set",
        "campaign.start=pkg",
        "--set",
        "campaign.seeds=1",
        "--set",
        "gate.n_boot=1000",
        "--set",
        "campaign.traces_per_round=0",
    ]
    try:
        camp = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        state = tmp_path / "camp" / ".state" / "state.json"
        deadline = time.monotonic() + 600
        while not state.exists() and camp.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert state.exists(), camp.communicate(timeout=30)
        os.killpg(server.pid, signal.SIGKILL)  # the server and its Prefect child, at once
        server.wait(timeout=30)
        t0 = time.monotonic()
        _, err = camp.communicate(timeout=120)
        took = time.monotonic() - t0
        lines = [x for x in err.splitlines() if x.strip() and not x.startswith("round ")]
        assert camp.returncode == 1 and took < 60, (camp.returncode, took, err[-3000:])
        assert len(lines) == 1 and lines[0].startswith(
            f"error: http://127.0.0.1:{port}/api: -: the Prefect server stopped answering"
        ), err[-3000:]
        assert "same command continues" in lines[0]
        server = _start_ratchet_server(home, port)
        again = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
        assert again.returncode == 0, again.stderr[-3000:]
        assert json.loads((tmp_path / "camp" / "summary.json").read_text())["rounds"] == 2
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)


# leftovers: what a killed writer left, the next write of the same output removes


def test_a_killed_materialize_leaves_a_temporary_directory_that_the_rerun_removes(project):
    """SIGTERM during `bench materialize` left `.bm.tmp-*` beside it, which no rerun removed (the stop is os._exit,
    which skips atomic_dir's cleanup; kill -9 does the same)."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    code = (
        "import os, sys; sys.path.insert(0, sys.argv[1]); from components.io import atomic_dir\n"
        "with atomic_dir('bm') as tmp:\n    (tmp / 'half').write_text('x')\n    os._exit(143)\n"
    )
    assert subprocess.run([sys.executable, "-c", code, str(ROOT)], cwd=project).returncode == 143
    left = [p.name for p in project.iterdir() if p.name.startswith(".bm.")]
    assert len(left) == 1 and left[0].startswith(".bm.tmp-"), left
    r = ratchet("bench", "materialize", "--out", "bm", "--per-family", "3")
    assert r.exit_code == 0, r.stderr
    assert [p.name for p in project.iterdir() if p.name.startswith(".bm.")] == []
    # a live writer's temporary directory is never swept
    from components.io import _owner

    live = project / f".bm.tmp-{_owner()}-abc"
    live.mkdir()
    assert ratchet("bench", "materialize", "--out", "bm", "--per-family", "3").exit_code == 0
    assert live.is_dir()


def test_reproduce_names_the_one_edited_row_not_every_row_with_an_empty_cell():
    """One edited row of dev_base.csv was reported as 18 rows differing: the recorded table was read back by pandas,
    whose NaN for an empty `error` cell differs from the recomputed ""."""
    import pandas as pd

    from components.tracking.reproduce import _table_diff

    now = pd.DataFrame(
        {"item_id": [f"i{k}" for k in range(18)], "seed": 0, "score": 0.5, "success": False, "error": ""}
    )
    text = now.to_csv(index=False, lineterminator="\n").encode()
    edited = text.replace(b"i7,0,0.5,", b"i7,0,0.75,")
    assert edited != text
    assert _table_diff(edited, text, now) == "1 row(s) differ: i7#0"
    assert _table_diff(text[: text.rindex(b"i17")], text, now).startswith("shape differs (17 rows recorded, 18")


def test_a_campaign_holds_its_lineage_lock_before_prefect_starts(project, bench_dir, monkeypatch):
    """Two `campaign run` on one --out: the second was refused only after 77 s. The first took the lineage lock
    inside its flow, after its Prefect server had started, so a second one started meanwhile passed every check,
    started a server of its own, and met the lock only then. Now the lock is held from the moment the checks pass:
    here, when the flow would start, another process already finds it locked (and the flow takes it again)."""
    import subprocess
    import sys

    import flows.campaign
    from tests.conftest import ROOT

    probe = (
        "import sys; sys.path.insert(0, sys.argv[1]); from components.evolution.lineage import LineageLock\n"
        "try:\n    LineageLock(sys.argv[2]).probe()\nexcept Exception as e:\n    print(e)"
    )
    seen = []

    def flow_would_start(p):
        seen.append(
            subprocess.run(
                [sys.executable, "-c", probe, str(ROOT), "camp/lineage"], capture_output=True, text=True
            ).stdout
        )
        with LineageLock(Path(p.campaign.out) / "lineage", join=True):  # the flow joins this process's lock
            pass
        raise InputError("stopped here by the test")

    monkeypatch.setattr(flows.campaign, "run_campaign", flow_would_start)
    one_line(
        ratchet(
            "campaign",
            "run",
            "--out",
            "camp",
            "--set",
            f"benchmark.out={bench_dir}",
            *EXPLAINED,
            "--set",
            "campaign.start=pkg",
        ),
        2,
        "stopped here by the test",
    )
    assert len(seen) == 1 and "lineage is locked by another campaign" in seen[0], seen
    LineageLock(project / "camp" / "lineage").probe()  # released when the command ended


# papercuts


def _commands():
    import typer.main

    def walk(cmd, path):
        if hasattr(cmd, "commands"):
            for name, sub in sorted(cmd.commands.items()):
                yield from walk(sub, [*path, name])
        else:
            yield path, cmd

    return list(walk(typer.main.get_command(app), []))


def test_every_option_and_argument_has_help_text():
    """Several options had none (eval --split, --out of eval/report/export, serve-sim --port, ui/server --port...);
    the CLI reference is generated from these texts."""
    missing = [
        f"{' '.join(path)} {'/'.join(getattr(p, 'opts', None) or [p.name])}"
        for path, cmd in _commands()
        for p in cmd.params
        if not getattr(p, "help", None)
    ]
    assert missing == []


def test_a_flag_shows_no_value_placeholder():
    """`--force <bool>` in the help made `--force true` look right (it fails: the flag takes no value)."""
    for path, _ in _commands():
        r = ratchet(*path, "--help")
        assert r.exit_code == 0, path
        flags = [ln for ln in r.stdout.splitlines() if "<bool>" in ln]
        assert flags == [], (path, flags)
    help_text = ratchet("campaign", "run", "--help").stdout
    assert "--force " in help_text and "<key.path=value>" in help_text


def test_the_params_comment_states_each_worlds_families_and_tasks():
    """params.yaml said retail had 5 families and 180 tasks (6 and 216)."""
    import re
    import tempfile

    from components.worlds import world
    from tests.conftest import ROOT

    line = next(ln for ln in (ROOT / "params.yaml").read_text().splitlines() if ln.strip().startswith("per_family:"))
    per_family = int(line.split(":")[1].split("#")[0])
    stated = dict((w, (int(f), int(t))) for w, f, t in re.findall(r"(\w+): (\d+) families, (\d+) tasks", line))
    assert set(stated) == {"retail", "airline"}, line
    for name, (families, tasks) in stated.items():
        with tempfile.TemporaryDirectory() as tmp:
            meta = json.loads((world(name).materialize(Path(tmp) / "b", 0, per_family) / "meta.json").read_text())
        assert (len(meta["families"]), meta["n_tasks"]) == (families, tasks), name


def test_dvc_stages_run_without_the_environment_on_path(tmp_path):
    """`.venv/bin/dvc exp run` without the venv on PATH failed with `ratchet: command not found` (and left params.yaml
    modified by -S). The stages run scripts/ratchet: the `ratchet` on PATH, else the project's .venv."""
    import subprocess
    import sys

    import yaml

    from tests.conftest import ROOT

    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    assert all(s["cmd"].startswith("scripts/ratchet ") for s in stages.values()), stages
    bare = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root")}
    if Path(sys.executable).parent == ROOT / ".venv" / "bin":  # the suite's own environment: the fallback is found
        r = subprocess.run(
            ["scripts/ratchet", "package", "digest", "data/packages/seed"],
            cwd=ROOT,
            env=bare,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert r.returncode == 0 and len(r.stdout.strip()) == 64, r.stderr
    # a checkout without .venv and nothing on PATH: one line saying what to do
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "ratchet", tmp_path / "scripts" / "ratchet")
    r = subprocess.run([str(tmp_path / "scripts" / "ratchet"), "--help"], env=bare, capture_output=True, text=True)
    assert r.returncode == 127 and r.stderr.startswith("error: ratchet: -: not on PATH") and "./run.sh" in r.stderr
    assert r.stderr.count("\n") == 1


def test_learn_sim_never_writes_over_a_users_file(project):
    (project / "notes.txt").write_text("mine\n")
    before = snapshot(project)
    one_line(
        ratchet("outer", "learn-sim", "--export", "e", "--out", "notes.txt"),
        2,
        "notes.txt: --out: exists and is not a model.json",
    )
    one_line(ratchet("outer", "learn-sim", "--export", "e", "--out", "mine"), 2, "mine: --out: is a directory")
    assert snapshot(project) == before


def test_evidence_why_defaults_to_the_workspace_campaign_only_when_the_graph_holds_it(project, bench_dir):
    """Default `--campaign`: params.yaml's campaign.out when it holds a campaign; with `--db` of a graph that never
    recorded it, any campaign (as before), not "no promotion"."""
    _started(project, bench_dir)  # camp/: a lineage this graph knows nothing of
    (project / "params.yaml").write_text("campaign:\n  out: camp\n")
    db = project / "g.db"
    g, *_ = _graph_with_m1(db)
    g.close()
    r = ratchet("evidence", "why", "M1", "--db", db)
    assert r.exit_code == 0 and r.stdout.startswith("M1 (campaign c1, round 1)"), (r.stdout, r.stderr)
    one_line(ratchet("evidence", "why", "M1", "--db", db, "--campaign", "camp"), 2, "no promotion", "(campaign camp)")
