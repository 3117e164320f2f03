"""The DVC pipeline in a temp copy of the project: repro, a no-op repro, a param change that re-runs only the
downstream stages, a forced repro that leaves dvc.lock as it was, an experiment, and reproducing a promotion after
checking an older commit back out. Every `dvc` and `ratchet` command is a real process, forked from one that
imported them (RatchetZygote below)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, run_cli

BIN = Path(sys.executable).parent
_SKIP = shutil.ignore_patterns(".git", ".venv", ".ratchet", "runs", "__pycache__", ".pytest_cache", "*.egg-info")


def SKIP(directory: str, names: list[str]) -> set[str]:
    """What a fresh clone would not have: local stores, caches, and the DVC outputs (the benchmark, the campaign)."""
    skip = set(_SKIP(directory, names))
    if Path(directory).as_posix().endswith("data/benchmarks"):
        skip |= {n for n in names if n != ".gitignore"}
    return skip


# The stages' `ratchet` commands, and the `dvc` commands, as real processes without an interpreter start and the
# imports each (at load ~8: ~9 CPU-s for `ratchet campaign`, ~5 for `ratchet bench`, ~2 for `ratchet report`, ~0.7
# for `dvc`): the `ratchet` and `dvc` on the project's PATH are stubs that hand their argv, cwd, environment and
# stdin/stdout/stderr to a fork server (the zygote below) and exit with the command's exit code. The zygote imports
# the CLIs and what the stages use once; for each command it forks a child that runs the real entry point in that cwd
# and environment, writing to the stub's own streams, so DVC sees what it would see of the console script (and the
# test what it would see of `dvc`). Prefect's settings, read once at import, are read again from the child's
# environment (as tests/zygote.py does). DVC runs each stage's command through the shell as always: the stub is what
# it finds. The zygote runs no command itself and exits when the fixture closes its stdin (or the test process dies).
PRELOAD = [
    "flows.campaign",
    "great_expectations",
    "mlflow.store.tracking.sqlalchemy_store",
    "components.worlds.retail",
    "components.worlds.retail.env",
    "components.models.simulated",
    "components.evolution.report",
    "matplotlib.pyplot",
    "prefect.flow_engine",
    "prefect.task_engine",
    "dvc.cli",
    "dvc.cli.parser",
    "dvc.repo",
    "dvc.repo.reproduce",
    "dvc.repo.experiments.show",
    "dvc.repo.experiments.queue.celery",
    "dvc.repo.plots",
    "pygit2",
    "networkx",
]

ZYGOTE = r"""
import atexit, gc, json, logging, os, select, socket, sys, threading, traceback
if sys.path[0] == "":  # as in a console script: the project's code through its install, never from the cwd
    del sys.path[0]
from components.env import quiet_offline
quiet_offline()  # as `ratchet` does before anything imports prefect or mlflow
from flows.cli import main
for name in sys.argv[2:]:
    __import__(name)
from prefect.context import SettingsContext, get_settings_context
from prefect.settings import Settings
gc.freeze()  # what the zygote imported is never collected: a child's collections do not walk (and copy) it
listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
listener.bind(sys.argv[1])
listener.listen(16)
sys.stderr.flush()
print("ready", flush=True)
while True:
    ready, _, _ = select.select([listener, sys.stdin], [], [])
    try:  # reap the handlers that are done
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass
    if sys.stdin in ready:  # the test closed it: done
        break
    conn, _ = listener.accept()
    if os.fork():
        conn.close()
        continue
    # a handler: receives one command, forks it, reports its exit code (a SIGKILLed command has no way to)
    listener.close()
    _, fds, _, _ = socket.recv_fds(conn, 1, 3)
    job = json.loads(b"".join(iter(lambda: conn.recv(1 << 16), b"")))
    pid = os.fork()
    if pid == 0:
        conn.close()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        os.chdir(job["cwd"])
        os.environ.clear()
        os.environ.update(job["env"])
        sys.argv = job["argv"]
        code = 0
        try:
            if job["argv"][0] == "dvc":  # the `dvc` console script: sys.exit(dvc.cli.main())
                from dvc.cli import main as dvc_main
                logging.root.handlers.clear()  # Prefect's, set at its import: a `dvc` process has none
                code = dvc_main(job["argv"][1:])
            else:
                with SettingsContext(profile=get_settings_context().profile, settings=Settings()):
                    main()
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if not isinstance(e.code, (int, type(None))):
                print(e.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
            code = 1
        # the end of an interpreter, less finalizing every module the zygote imported (~2 CPU-s a process, which a
        # fresh `ratchet` pays only for what it imported): its threads joined, its atexit hooks run, output flushed
        threading._shutdown()
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    for fd in fds:
        os.close(fd)
    _, status = os.waitpid(pid, 0)
    conn.sendall(str(os.waitstatus_to_exitcode(status)).encode())
    os._exit(0)
# this process only imported: nothing to tear down (a normal exit would finalize every imported module for nothing)
os._exit(0)
"""

STUB = """#!{python} -IS
import json, os, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect({sock!r})
socket.send_fds(s, [b"."], [0, 1, 2])
job = {{"argv": [os.path.basename(sys.argv[0]), *sys.argv[1:]], "cwd": os.getcwd(), "env": dict(os.environ)}}
s.sendall(json.dumps(job).encode())
s.shutdown(socket.SHUT_WR)
code = int(b"".join(iter(lambda: s.recv(64), b"")) or 1)
sys.exit(code if code >= 0 else 128 - code)
"""


class RatchetZygote:
    """`ratchet` on `env`'s PATH (a stub in `where`) runs each command as a child forked from one preloaded process."""

    def __init__(self, where: Path, env: dict[str, str]):
        where.mkdir(parents=True)
        sock = where / "z.sock"
        if len(str(sock)) > 100:  # a socket's path has a length limit (108 bytes on Linux, 104 on macOS)
            sock = Path(tempfile.mkdtemp(prefix="rz", dir="/tmp")) / "z.sock"
        for name in ("ratchet", "dvc"):
            stub = where / name
            stub.write_text(STUB.format(python=sys.executable, sock=str(sock)))
            stub.chmod(0o755)
        self.err = where / "zygote.err"
        with open(self.err, "wb") as errf:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", ZYGOTE, str(sock), *PRELOAD],
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=errf,
                text=True,
            )
        self.where = where

    def wait_ready(self) -> None:
        line = self.proc.stdout.readline()
        assert line == "ready\n", f"the zygote did not start (exit {self.proc.poll()}): {self.err.read_text()[-3000:]}"

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()


# The smallest pipeline that still shows every claim below: 8 tasks per family, one seed, the smallest n_boot, from
# the stateless package, whose first plan (render the ledger board) is promoted in round 1 on this benchmark
# (deterministically: the simulated agent and every seed are fixed), so the 1-round commit has a promotion to reproduce.
# (At 6 per family that plan is rejected; 8 instead of 12 costs a campaign a third less.) Explained receipts: that
# promotion is measured on them, whatever params.yaml defaults to.
TINY = {
    "benchmark": {"per_family": 8, "receipts": "explained"},
    "campaign": {"start": "none", "rounds": 1, "seeds": 1, "shard_size": 30},
    "gate": {"n_boot": 1000},
}


@pytest.fixture(scope="module")
def project(tmp_path_factory, prefect_server):
    root = tmp_path_factory.mktemp("dvcproj") / "ratchet"
    shutil.copytree(ROOT, root, ignore=SKIP)
    home = root.parent / "home"
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
        "RATCHET_HOME": str(home),
        "PREFECT_HOME": str(home / "prefect"),
        "PREFECT_LOCAL_STORAGE_PATH": str(home / "prefect" / "storage"),
        "MLFLOW_TRACKING_URI": f"sqlite:///{home / 'mlflow.db'}",
        "DVC_NO_ANALYTICS": "1",
        "DVC_SITE_CACHE_DIR": str(home / "dvc-site"),
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    # the stage commands use the session's Prefect server: each would otherwise start (and stop) its own
    env["PREFECT_API_URL"] = prefect_server
    zygote = RatchetZygote(root.parent / "zygote", env)  # it imports while the project is copied and committed
    env["PATH"] = f"{zygote.where}{os.pathsep}{env['PATH']}"

    def run(*cmd, check=True):
        r = subprocess.run(list(cmd), cwd=root, env=env, capture_output=True, text=True, timeout=900)
        if check and r.returncode != 0:
            raise AssertionError(f"{cmd} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
        return r

    def set_rounds(n: int) -> None:
        params = yaml.safe_load((root / "params.yaml").read_text())
        params["campaign"]["rounds"] = n
        (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))

    params = yaml.safe_load((root / "params.yaml").read_text())
    for section, values in TINY.items():
        params[section].update(values)
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    (root / "dvc.lock").unlink(missing_ok=True)
    try:
        run("git", "init", "-q", "-b", "main")
        run("git", "add", "-A")
        run("git", "commit", "-qm", "small params")
        # the history every test starts from: a 1-round campaign committed, then a 2-round one (one param changed;
        # its round 1 comes from the task cache the first campaign filled). Most of this module's time: the zygote's
        # imports (~8-10 CPU-s, once) and these five stages' work (the two campaigns ~5-7 CPU-s each)
        zygote.wait_ready()
        first = run("dvc", "repro").stdout
        run("git", "add", "-A")
        run("git", "commit", "-qm", "campaign with 1 round")
        set_rounds(2)
        changed = run("dvc", "repro").stdout
        run("git", "add", "-A")
        run("git", "commit", "-qm", "campaign with 2 rounds")
        yield Project(root, run, env, {"first": first, "changed": changed})
    finally:
        zygote.close()


class Project:
    def __init__(self, root: Path, run, env: dict[str, str], logs: dict[str, str]):
        self.root, self.run, self.env, self.logs = root, run, env, logs

    def commit(self, subject: str) -> str:
        log = self.run("git", "log", "main", "--format=%H %s").stdout.splitlines()
        return next(line.split()[0] for line in log if line.split(" ", 1)[1] == subject)

    def reset(self, rev: str = "main") -> None:
        """Every test starts from a clean checkout of `rev` with its DVC outputs, whatever ran before it."""
        self.run("git", "checkout", "-q", "-f", rev)
        self.run("git", "clean", "-qfd", "-e", "runs/", "-e", "data/benchmarks/")
        self.run("dvc", "checkout", "--force")


def stages_run(out: str) -> set[str]:
    return {line.split("'")[1] for line in out.splitlines() if line.startswith("Running stage '")}


def test_repro_then_nothing_then_only_downstream(project):
    root, run = project.root, project.run
    assert stages_run(project.logs["first"]) == {"benchmark", "campaign", "export", "report"}
    # one campaign param changed: only campaign and what reads it (export, report) ran again
    assert stages_run(project.logs["changed"]) == {"campaign", "export", "report"}
    assert "Stage 'benchmark' didn't change" in project.logs["changed"]
    project.reset()
    assert json.loads((root / "reports" / "metrics.json").read_text())["rounds"] == 2
    again = run("dvc", "repro")
    assert stages_run(again.stdout) == set()
    assert "Data and pipelines are up to date" in again.stdout
    # same inputs, same bytes: the campaign stage run again (its output removed, then its command) leaves every
    # output's hash in dvc.lock as it was (what CI checks on a clean checkout)
    lock = (root / "dvc.lock").read_text()
    forced = run("dvc", "repro", "--force", "--single-item", "campaign")
    assert stages_run(forced.stdout) == {"campaign"}
    assert (root / "dvc.lock").read_text() == lock
    status = run("dvc", "status")
    assert "Data and pipelines are up to date" in status.stdout, status.stdout
    metrics = run("dvc", "metrics", "show", "--json")
    assert "test_net" in metrics.stdout
    # the plots are data rendered by vega, and the page `dvc plots show` writes carries vega itself (.dvc/config:
    # plots.html_template): it loads no script from the network
    run("dvc", "plots", "show", "-o", "plots-page")
    page = (root / "plots-page" / "index.html").read_text()
    assert "<script src=" not in page and "cdn.jsdelivr" not in page and "vegaEmbed" in page
    plots = list(yaml.safe_load((root / "dvc.yaml").read_text())["plots"])
    assert len(plots) == 4 and all(f"vegaEmbed('#{_div_id(next(iter(p)))}', spec)" in page for p in plots)
    # `dvc plots diff` overlays two campaigns: this commit's 2 rounds and the first commit's 1, one page
    first = project.commit("campaign with 1 round")
    run("dvc", "plots", "diff", first, "-o", "diff-page")
    diff = (root / "diff-page" / "index.html").read_text()
    assert "<script src=" not in diff and f'"rev": "{first[:7]}' in diff and '"rev": "workspace"' in diff
    # the default page directory is git-ignored
    run("dvc", "plots", "show")
    assert (root / "dvc_plots" / "index.html").is_file()
    assert "dvc_plots" not in run("git", "status", "--porcelain").stdout


def _div_id(title: str) -> str:
    """The element id DVC's page gives a plot (dvc_render's `remove_special_chars`)."""
    from dvc_render.base import Renderer

    return Renderer.remove_special_chars(title)


def test_experiments_vary_a_param(project):
    run = project.run
    project.reset()
    # main runs 2 rounds; the experiment sets campaign.rounds back to 1. The campaign stage then has the signature of
    # the first commit's run, which DVC's run-cache restores instead of running it again (a campaign's work, ~5 CPU-s);
    # the report stage (cache: false outputs, so no run-cache) runs on the restored campaign
    exp = run("dvc", "exp", "run", "-S", "campaign.rounds=1")
    assert "campaign" in exp.stdout
    shown = json.loads(run("dvc", "exp", "show", "--json").stdout)
    base = next(row for row in shown if row["name"] == "main")
    assert varied(base["data"]) == (2, 2)
    experiments = [rev["data"] for e in base["experiments"] or [] for rev in e["revs"]]
    # the experiment's param and the metrics its outputs produced: 1 round, not main's 2
    assert (1, 1) in [varied(x) for x in experiments], experiments
    assert all("test_net" in x["metrics"]["reports/metrics.json"]["data"] for x in experiments)


def varied(data: dict) -> tuple[int, int]:
    """(campaign.rounds in params.yaml, rounds in reports/metrics.json) of one `dvc exp show --json` row."""
    return (
        data["params"]["params.yaml"]["data"]["campaign"]["rounds"],
        data["metrics"]["reports/metrics.json"]["data"]["rounds"],
    )


def test_reproduce_a_promotion_from_an_older_commit(project, capsys, monkeypatch):
    root = project.root
    project.reset(project.commit("campaign with 1 round"))  # every test starts with its own reset: none after it
    record = [json.loads(x) for x in (root / "runs/campaign/lineage/lineage.jsonl").read_text().splitlines()]
    assert max(r["round"] for r in record) == 1  # the older commit's bytes, not the newer campaign's
    promoted = [r["child"]["version"] for r in record if r["verdict"] == "accept"]
    assert promoted, "the 1-round campaign promoted nothing"
    # `ratchet reproduce` in the checked-out project, in-process through the real entry point: it reads only the
    # files DVC checked out (no store, no server), so a subprocess would prove nothing more
    monkeypatch.chdir(root)
    code, out, err = run_cli(capsys, "reproduce", "--version", promoted[-1], "--json")
    assert code == 0, out + err
    assert json.loads(out)["identical"] is True
