"""Queued DVC experiments record into the real repository's stores.

`dvc exp run --queue` + `dvc queue start -j 2` (here `dvc exp run --run-all -j 2`, the same Celery workers, waited
for) runs each variant's stages in a temporary copy under `.dvc/tmp/exps/` and deletes it afterwards. A campaign's
records (MLflow store, evidence graph, Prefect's home) default to `<project>/.ratchet`; had the project been the
working directory, a queued variant's records would have been written into the copy and deleted with it.
`components.env.project_root` resolves the project from `$DVC_ROOT`, which DVC sets to the real repository for a
queued run. Here a stage stands in for `ratchet campaign run`: it sets up the environment as the CLI does
(`quiet_offline`) and writes where its records went. The live campaign version of this (two queued campaign
variants, their MLflow experiments and registered models) is in the closing note of issue 26; a campaign each would
add minutes and prove nothing more about where the stores resolve."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

BIN = Path(sys.executable).parent
# what the test process's own environment (tests/conftest.py: quiet_offline(HOME)) set: a user's shell has none of it
STORES = (
    "RATCHET_HOME",
    "PREFECT_HOME",
    "PREFECT_LOCAL_STORAGE_PATH",
    "MLFLOW_TRACKING_URI",
    "RATCHET_EVIDENCE_DB",
    "DVC_ROOT",
    "DVC_EXP_NAME",
    "DVC_EXP_BASELINE_REV",
)

STAGE = r"""
import json, os, sys
from pathlib import Path
import yaml
from components.env import quiet_offline
from components.evidence.graph_record import default_db
home = quiet_offline()
v = yaml.safe_load(open("params.yaml"))["v"]
rec = {"v": v, "cwd": os.getcwd(), "home": str(home), "mlflow": os.environ["MLFLOW_TRACKING_URI"],
       "prefect": os.environ["PREFECT_HOME"], "evidence": default_db(None), "exp": os.environ.get("DVC_EXP_NAME")}
(home / "variants").mkdir(parents=True, exist_ok=True)
(home / "variants" / f"{v}.json").write_text(json.dumps(rec))
Path("out.txt").write_text(f"{v}\n")
"""


def _run(args: list[str], cwd: Path, env: dict) -> str:
    p = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    assert p.returncode == 0, f"{args}: {p.stdout[-2000:]}\n{p.stderr[-2000:]}"
    return p.stdout


def _run_all(
    dvc: list[str], repo: Path, env: dict, variants: int, grace: float = 90.0, deadline: float = 900.0
) -> None:
    """`dvc exp run --run-all -j 2`, waited for. Under load, DVC's temporary Celery worker sometimes stays up after
    the queue is empty (dvc-task's idle check misses it), and the command waits on it forever: once every variant
    has written its record and `grace` seconds have passed, the workers still alive get SIGTERM (Celery's warm
    shutdown), which lets the command finish what it does after them. Its output goes to a file, not a pipe, since
    the workers it daemonizes would hold a pipe open."""
    log = repo.parent / "run-all.log"
    with log.open("w") as out:
        p = subprocess.Popen(
            dvc + ["exp", "run", "--run-all", "-j", "2"],
            cwd=repo,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        start, done_at = time.monotonic(), None
        while p.poll() is None:
            assert time.monotonic() - start < deadline, f"dvc exp run --run-all: over {deadline} s: {log.read_text()}"
            # the baseline's record and one per variant
            if done_at is None and len(list((repo / ".ratchet" / "variants").glob("*.json"))) == 1 + variants:
                done_at = time.monotonic()
            if done_at is not None and time.monotonic() - done_at > grace:
                for pid in _queue_workers(repo):
                    try:
                        os.kill(pid, signal.SIGTERM)
                    except ProcessLookupError:  # it stopped on its own meanwhile
                        pass
                done_at = time.monotonic()  # another grace period before the next try
            time.sleep(1)
    assert p.returncode == 0, f"dvc exp run --run-all: exit {p.returncode}: {log.read_text()[-3000:]}"


def _queue_workers(repo: Path) -> list[int]:
    """The pids of this repository's DVC queue workers still running (a pid file's process, if it is one)."""
    pids = []
    for pid_file in (repo / ".dvc" / "tmp" / "exps" / "celery").glob("*.pid"):
        try:
            pid = int(pid_file.read_text().strip())
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (ValueError, OSError):  # gone, or no /proc: nothing to stop
            continue
        if b"queue-worker" in cmd:
            pids.append(pid)
    return pids


def test_queued_variants_record_into_the_real_repository(tmp_path):
    repo = (tmp_path / "repo").resolve()
    repo.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in STORES}
    env.update(
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
        GIT_AUTHOR_NAME="t",
        GIT_AUTHOR_EMAIL="t@t",
        GIT_COMMITTER_NAME="t",
        GIT_COMMITTER_EMAIL="t@t",
        DVC_NO_ANALYTICS="1",
    )
    dvc = [str(BIN / "dvc")]
    (repo / "stage.py").write_text(STAGE)
    (repo / "params.yaml").write_text("v: 1\n")
    (repo / "dvc.yaml").write_text(
        yaml.safe_dump(
            {
                "stages": {
                    "record": {
                        "cmd": f"{sys.executable} stage.py",
                        "deps": ["stage.py"],
                        "params": ["v"],
                        "outs": ["out.txt"],
                    }
                }
            }
        )
    )
    (repo / ".gitignore").write_text("/.ratchet/\n")
    _run(["git", "init", "-q", "-b", "main"], repo, env)
    _run(dvc + ["init", "-q"], repo, env)
    _run(dvc + ["config", "core.analytics", "false"], repo, env)
    _run(dvc + ["repro", "-q"], repo, env)  # the baseline, in the workspace
    _run(["git", "add", "-A"], repo, env)
    _run(["git", "commit", "-qm", "baseline"], repo, env)

    for v in (2, 3):
        _run(dvc + ["exp", "run", "--queue", "-S", f"v={v}", "-n", f"v{v}"], repo, env)
    _run_all(dvc, repo, env, variants=2)

    home = repo / ".ratchet"
    recs = {int(p.stem): json.loads(p.read_text()) for p in (home / "variants").glob("*.json")}
    assert sorted(recs) == [1, 2, 3]
    assert Path(recs[1]["cwd"]) == repo and recs[1]["exp"] is None
    for v in (2, 3):
        r = recs[v]
        # the variant ran in DVC's temporary copy ...
        assert Path(r["cwd"]).is_relative_to(repo / ".dvc" / "tmp" / "exps") and r["exp"] == f"v{v}", r
        assert not Path(r["cwd"]).exists()  # ... which DVC deleted afterwards
        # ... and every store it used is the real repository's
        assert Path(r["home"]) == home, r
        assert r["mlflow"] == f"sqlite:///{home / 'mlflow.db'}" and Path(r["prefect"]) == home / "prefect", r
        assert Path(r["evidence"]) == home / "evidence.db", r
    # both variants are DVC experiments of the baseline, with their outputs
    shown = json.loads(_run(dvc + ["exp", "show", "--json"], repo, env))
    exps = {e.get("name"): e for row in shown for e in (row.get("experiments") or []) for e in e.get("revs", [])}
    assert {"v2", "v3"} <= set(exps), list(exps)
    assert {exps[f"v{v}"]["data"]["params"]["params.yaml"]["data"]["v"] for v in (2, 3)} == {2, 3}
