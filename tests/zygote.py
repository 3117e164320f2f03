"""`ratchet` commands as real processes without paying an interpreter start and the imports each (~8-14 CPU-s):
a zygote process imports the CLI and what its commands use once, then forks one child per command.

Each child is a real process running the real entry point from the top (exit through SystemExit and atexit, or
SIGKILL by a failpoint or a test); only the imports are shared, and they hold no command state (no thread, no
connection: the zygote never runs a command itself). Each command gets its own cwd, environment and output files;
Prefect's settings, which Prefect reads once at import, are read again from the child's environment (as Prefect
itself does for the flow-run subprocesses it starts). What the zygote printed while importing goes to a file of its
own (`import_stderr`), so a test can check that nothing at all was printed besides the command's own output.

Used by tests/test_operations.py and tests/test_misuse.py only."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
from pathlib import Path

ZYGOTE = r"""
import json, os, sys
from components.env import quiet_offline
quiet_offline()  # as `ratchet` does before anything imports prefect or mlflow
from flows.cli import main
for name in sys.argv[1:]:  # what the commands import lazily: imported once, here
    __import__(name)
from prefect.context import SettingsContext, get_settings_context
from prefect.settings import Settings
sys.stdout.flush()
sys.stderr.flush()
results = os.fdopen(os.dup(1), "w")
for line in sys.stdin:
    job = json.loads(line)
    if "wait" in job:  # reap a background command
        _, status = os.waitpid(job["wait"], 0)
        results.write(json.dumps(os.waitstatus_to_exitcode(status)) + "\n")
        results.flush()
        continue
    pid = os.fork()
    if pid == 0:
        results.close()
        if job.get("session"):  # a process group of its own, as a shell gives a command: signals to the group
            os.setsid()
        os.chdir(job["cwd"])
        for key in job["unset"]:
            os.environ.pop(key, None)
        os.environ.update(job["env"])
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        for fd, name in ((1, "stdout"), (2, "stderr")):
            f = os.open(job[name], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(f, fd)
            os.close(f)
        sys.argv = ["ratchet", *job["args"]]
        with SettingsContext(profile=get_settings_context().profile, settings=Settings()):
            main()
        sys.exit(0)
    if job["background"]:
        results.write(json.dumps(pid) + "\n")
    else:
        _, status = os.waitpid(pid, 0)
        results.write(json.dumps(os.waitstatus_to_exitcode(status)) + "\n")
    results.flush()
# stdin closed: done. This process ran no command (it only imported), so there is nothing to tear down; a normal exit
# would finalize every imported module (atexit hooks, GC of the heap: ~2 s idle, 8 s loaded) for nothing.
results.close()
os._exit(0)
"""


class Zygote:
    """`zygote(cwd, args, env)`: `ratchet <args>` run in `cwd` as a forked child with `env` (on top of the zygote's
    environment, less `unset`); a CompletedProcess (returncode -9 when SIGKILLed). `start(...)` runs one in the
    background and returns its pid; `wait(pid)` reaps it."""

    def __init__(self, where: Path, env: dict[str, str], preload: list[str]):
        where.mkdir(parents=True, exist_ok=True)
        self.where, self.n, self.import_stderr = where, 0, where / "zygote.err"
        with open(self.import_stderr, "wb") as errf:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", ZYGOTE, *preload],
                cwd=where,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=errf,
                text=True,
            )

    def _send(self, job: dict, timeout: float) -> object:
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()
        return self._result(timeout, job)

    def _result(self, timeout: float, job: dict) -> object:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)  # one result line per job
        assert ready, f"{job}: no result within {timeout} s"
        line = self.proc.stdout.readline()
        assert line, f"the zygote died (exit {self.proc.wait()}): {self.import_stderr.read_text()[-2000:]}"
        return json.loads(line)

    def _job(
        self, cwd: Path, args, env: dict, unset, background: bool, session: bool = False
    ) -> tuple[dict, Path, Path]:
        self.n += 1
        logs = self.where / "logs"
        logs.mkdir(exist_ok=True)
        out, err = logs / f"cmd{self.n}.out", logs / f"cmd{self.n}.err"
        return (
            {
                "args": [str(a) for a in args],
                "cwd": str(cwd),
                "env": env,
                "unset": list(unset),
                "stdout": str(out),
                "stderr": str(err),
                "background": background,
                "session": session,
            },
            out,
            err,
        )

    def __call__(
        self, cwd: Path, args, env: dict | None = None, unset=(), timeout: float = 900
    ) -> subprocess.CompletedProcess:
        job, out, err = self._job(cwd, args, env or {}, unset, False)
        code = self._send(job, timeout)
        return subprocess.CompletedProcess(job["args"], code, out.read_text(), err.read_text())

    def start(self, cwd: Path, args, env: dict | None = None, unset=(), session: bool = False) -> int:
        """`session`: the command leads a process group of its own (a signal to the group reaches only it and
        its children, as a terminal's Ctrl-C does)."""
        job, _, _ = self._job(cwd, args, env or {}, unset, True, session)
        return self._send(job, 60)

    def log(self, pid_job: int) -> tuple[str, str]:
        """(stdout, stderr) of the n-th command started."""
        logs = self.where / "logs"
        return (logs / f"cmd{pid_job}.out").read_text(), (logs / f"cmd{pid_job}.err").read_text()

    def wait(self, pid: int, timeout: float = 30) -> int:
        """Reap a background command; SIGKILL it if it has not ended within `timeout` (the test then fails)."""
        self.proc.stdin.write(json.dumps({"wait": pid}) + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            os.kill(pid, signal.SIGKILL)
        return self._result(60, {"wait": pid})

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            assert self.proc.wait(timeout=60) == 0, self.import_stderr.read_text()[-2000:]
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
