"""How this project runs Prefect's own machinery: a temporary server that lives no longer than its process, and
no Prefect traceback for the failures Ratchet reports itself.

Prefect starts a temporary API server (`SubprocessASGIServer`) in a child process when no PREFECT_API_URL is set,
and stops it at exit; a `kill -9` of the campaign skips that, and the server (about 250 MB) would run on, reparented to
init. Here the child is started through this module's `__main__`, which watches its parent and shuts the server down
when the parent is gone, however it died. The command and environment are Prefect 3.9.1's
`SubprocessASGIServer._run_uvicorn_command`, with only that wrapper added. That method is private, and replacing it
is the only way in: Prefect 3.9.1 has no public setting or hook for the temporary server's command or its lifetime
(the public alternative, a `prefect server start` of our own with PREFECT_API_URL set, is what `ratchet server` is;
without one, Prefect starts this server itself). A Prefect whose class no longer has the method fails here at once
rather than leaving the server untied.

Bad input, a refused run and a budget stop are InputErrors that the CLI prints as one line; Prefect's flow and task
loggers would first print each with a 20-line traceback. `quiet_expected_failures` drops those records.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
POLL_SECONDS = 0.5


def _expected_names() -> set[str]:
    from components.errors import InputError, StorageError, Unavailable

    names, todo = set(), [InputError, StorageError, Unavailable]
    while todo:
        cls = todo.pop()
        names.add(cls.__name__)
        todo.extend(cls.__subclasses__())
    return names


class _ExpectedFailures(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        from components.errors import InputError, StorageError, Unavailable

        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, (InputError, StorageError, Unavailable)) or _refused_by_the_system(exc):  # one line each
            return False
        if (
            record.levelno >= logging.ERROR
            and isinstance(record.msg, str)
            and record.msg.startswith("Finished in state")
        ):
            text = record.getMessage()
            return not any(f"{name}:" in text or f"{name}(" in text for name in _expected_names())
        if record.levelno >= logging.ERROR and record.args:  # "... exception: %r" with the exception as an argument
            return not any(
                isinstance(a, (InputError, StorageError, Unavailable))
                for a in (record.args if isinstance(record.args, tuple) else ())
            )
        return True


REFUSED = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM})


def _refused_by_the_system(exc: BaseException | None) -> bool:
    """A write the system refused (disk full, read-only, no permission) naming its file: the CLI says it in one
    line, what to free or fix; Prefect's traceback before it would only bury that line."""
    return isinstance(exc, OSError) and exc.errno in REFUSED and exc.filename is not None


def quiet_expected_failures() -> None:
    f = _ExpectedFailures()
    for name in ("prefect.flow_runs", "prefect.task_runs"):
        logger = logging.getLogger(name)
        if not any(isinstance(x, _ExpectedFailures) for x in logger.filters):
            logger.addFilter(f)


def tie_temporary_server_to_this_process() -> None:
    """Make Prefect's temporary server exit when the process that started it dies (idempotent)."""
    import subprocess

    import prefect
    from prefect.settings import get_current_settings

    if get_current_settings().api.url:  # a configured server: Prefect starts no temporary one here, and importing
        return  # the server's code would cost ~2.5 CPU-s (half of `ratchet campaign`'s imports)
    from components.heap import long_lived

    with long_lived("prefect.server.api.server"):  # the server's code lives as long as the process
        from prefect.server.api import server as server_module

    cls = server_module.SubprocessASGIServer
    if getattr(cls, "_ratchet_tied", False):
        return
    if not callable(getattr(cls, "_run_uvicorn_command", None)):  # the private method replaced below (module doc)
        raise RuntimeError(
            f"prefect {prefect.__version__}: SubprocessASGIServer has no _run_uvicorn_command to tie "
            "the temporary server to this process (written for Prefect 3.9.1)"
        )

    def _run_uvicorn_command(self) -> subprocess.Popen:
        server_env = {"PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1"}
        env = {**os.environ, **server_env, **get_current_settings().to_environment_variables(exclude_unset=True)}
        env["PYTHONPATH"] = os.pathsep.join(x for x in (str(ROOT), env.get("PYTHONPATH", "")) if x)
        return subprocess.Popen(
            args=[
                sys.executable,
                "-m",
                "flows.prefect_setup",
                str(os.getpid()),
                "--app-dir",
                str(prefect.__module_path__.parent),
                "--factory",
                "prefect.server.api.server:create_app",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--log-level",
                "error",
                "--lifespan",
                "on",
            ],
            env=env,
        )

    cls._run_uvicorn_command = _run_uvicorn_command  # type: ignore[method-assign]  # Prefect's own, replaced here
    setattr(cls, "_ratchet_tied", True)


def atomic_local_results() -> None:
    """Make Prefect's local result storage write each file whole or not at all (idempotent).

    Prefect 3.9.1's `LocalFileSystem.write_path` opens the final path and writes into it, and a task's cache lookup
    takes the file's existence for a finished record. Campaigns that share a result store (one PREFECT_HOME, one
    server, N campaigns on the same bytes) compute the same cache keys: one could read another's half-written record
    and fail. Here the bytes go to a temporary file beside the final one, which `os.replace` then puts in place
    (POSIX: atomic); two writers of one key write the same bytes, and the last rename wins."""
    import tempfile

    from prefect._internal.compatibility.async_dispatch import async_dispatch
    from prefect.filesystems import LocalFileSystem

    if getattr(LocalFileSystem, "_ratchet_atomic", False):
        return

    def write(self, path: str, content: bytes) -> str:
        final: Path = self._resolve_path(path)
        final.parent.mkdir(exist_ok=True, parents=True)
        if final.exists() and not final.is_file():
            raise ValueError(f"Path {final} already exists and is not a file.")
        fd, tmp = tempfile.mkstemp(dir=final.parent, prefix=f".{final.name}.")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(content)
            os.chmod(tmp, 0o644)  # as open() would have made it (mkstemp's is 0600)
            os.replace(tmp, final)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return str(final)

    async def awrite(self, path: str, content: bytes) -> str:
        from prefect.utilities.asyncutils import run_sync_in_worker_thread

        return await run_sync_in_worker_thread(write, self, path, content)

    # Prefect's own methods, replaced here
    LocalFileSystem.awrite_path = awrite  # type: ignore[method-assign]
    LocalFileSystem.write_path = async_dispatch(awrite)(write)  # type: ignore[method-assign]
    setattr(LocalFileSystem, "_ratchet_atomic", True)


def server_for_a_script():
    """A context for a script that runs flows (the benchmarks): the Prefect server at $PREFECT_API_URL when one is set
    (the tests pass theirs), else a temporary one of its own, tied to the script's process like a campaign's."""
    import contextlib

    if os.environ.get("PREFECT_API_URL"):  # before the harness's import, which loads the server's code (CPU-seconds)
        return contextlib.nullcontext()
    from prefect.testing.utilities import prefect_test_harness

    tie_temporary_server_to_this_process()  # the harness's server, too, must not outlive a kill -9 of this process
    return prefect_test_harness(server_startup_timeout=180)


def _watch_parent(parent: int) -> None:
    """In the server's process: stop the server (SIGTERM: uvicorn shuts down cleanly) once the parent is gone."""
    import signal
    import threading
    import time

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(POLL_SECONDS)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(10)
        os._exit(1)  # shutdown hung: go anyway

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


if __name__ == "__main__":  # python -m flows.prefect_setup <parent pid> <uvicorn arguments...>
    import runpy

    _watch_parent(int(sys.argv[1]))
    sys.argv = ["uvicorn", *sys.argv[2:]]
    runpy.run_module("uvicorn", run_name="__main__", alter_sys=True)
