"""Ctrl-C and SIGTERM: every `ratchet` command stops at once, with the shell's exit code (130, 143), and takes the
processes it started with it.

Left to Python and Prefect, a signal was a KeyboardInterrupt (or Prefect's TerminationSignal during a flow run) raised
wherever the main thread happened to be, free to be caught or held up on its way out (issue 27 saw exits after 3-16 s,
a hang, and a campaign that ran to the end). Here the signal ends the process itself: the children
(Prefect's temporary server, a local Dask cluster, the server `ratchet ui` or `ratchet server` runs) get SIGTERM, then
SIGKILL after a grace period, and the process leaves with `os._exit`. Stopping there is what a `kill -9` does, which a
campaign already survives: the lineage, round files and budget ledger are written atomically (or in transactions), so
the same command, or `ratchet campaign resume`, continues where the committed work ends.

A server command's child also gets the parent-death signal (Linux), so a `kill -9` of the command stops it too."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Iterator
from typing import Any

STOP = (signal.SIGINT, signal.SIGTERM)
GRACE_SECONDS = 4.0  # children's clean shutdown (uvicorn, Dask) before SIGKILL; well inside the 10 s a user waits
_hint: list[str] = []  # what the stop message adds (a campaign: how to resume it)
_cleanups: list[Any] = []  # what a stop does before it exits (os._exit skips `finally` blocks): `at_stop`
_installed: list[bool] = []
_PREFECT_BRIDGE: list[Any] = []  # Prefect's own capture_sigterm, put back when the command is done


def obey_signals() -> None:
    """Install the stop handler for SIGINT and SIGTERM (main thread only)."""
    for sig in STOP:
        signal.signal(sig, _stop)
    _installed[:] = [True]


@contextlib.contextmanager
def signals_obeyed() -> Iterator[None]:
    """`ratchet`'s entry point: the stop handler while the command runs, and afterwards everything as it was (a
    process that runs the entry point in-process, a test runner, keeps its own signals and an unpatched Prefect)."""
    import threading

    if threading.current_thread() is not threading.main_thread():  # signals are the main thread's
        yield
        return
    before = {sig: signal.getsignal(sig) for sig in STOP}
    obey_signals()
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
        _installed.clear()
        _hint.clear()
        _cleanups.clear()
        engine = sys.modules.get("prefect.flow_engine")
        if engine is not None and _PREFECT_BRIDGE:
            setattr(engine, "capture_sigterm", _PREFECT_BRIDGE[0])  # Prefect's own, put back


def flows_obey(hint: str | None = None) -> None:
    """Before a command runs Prefect flows in this process: keep the stop handler in force during them, and end the
    stop message with `hint` (a campaign: how to resume it). A no-op unless `obey_signals` ran.

    Prefect swaps SIGTERM for its own handler during each flow run (raising TerminationSignal wherever the main
    thread is, which a thread pool's shutdown or the engine can hold up); a flow run from this CLI is not a Prefect
    runner's subprocess, so that bridge is left out."""
    if not _installed:
        return
    if hint is not None:
        _hint[:] = [hint]
    import prefect.flow_engine

    if not _PREFECT_BRIDGE:
        _PREFECT_BRIDGE.append(prefect.flow_engine.capture_sigterm)
    setattr(prefect.flow_engine, "capture_sigterm", contextlib.nullcontext)  # Prefect's own, replaced


def at_stop(cleanup) -> None:
    """Run `cleanup()` when a signal stops the command (a `finally` block would not run: the stop is `os._exit`)."""
    _cleanups.append(cleanup)


def _run_cleanups() -> None:
    for cleanup in reversed(_cleanups):
        try:
            cleanup()
        except Exception:  # noqa: BLE001 - a cleanup that fails must not keep the process from stopping
            pass


def _stop(signum: int, _frame: Any) -> None:
    for sig in STOP:  # a second Ctrl-C (or the group's copy of the signal) must not interrupt the stop itself
        signal.signal(sig, signal.SIG_IGN)
    name = signal.Signals(signum).name
    try:
        sys.stdout.flush()
    except Exception:  # noqa: BLE001 - a closed or broken stdout must not keep the process alive
        pass
    try:
        os.write(2, f"stopped by {name}{'; ' + _hint[0] if _hint else ''}\n".encode())
    except OSError:
        pass
    stop_children()
    _run_cleanups()
    os._exit(128 + signum)


SERVER_GRACE = 10.0  # seconds without a connection to the configured Prefect server before a command stops


@contextlib.contextmanager
def server_watched(url: str | None, grace: float = SERVER_GRACE, every: float = 1.0) -> Iterator[None]:
    """While the block runs: stop this command, as a signal would (children, cleanups, `os._exit(1)`), once the
    configured Prefect server at `url` has refused connections for `grace` seconds, with one line naming it. Left
    alone, a campaign whose server was killed ran on for minutes, its client retrying every call and Prefect's
    background services printing connection errors; a campaign survives a stop at any moment, so the same command
    continues once the server is back. While the server does not answer, those services' connection errors are not
    printed (the line says it once). `url` None: nothing to watch (a temporary server lives with this process)."""
    import logging
    import threading
    import time

    from components.env import answers

    if not url:
        yield
        return
    watched: str = url

    class _Unreachable(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            services = record.name.startswith(("prefect.events", "prefect._internal", "prefect.client"))
            return not (services and record.levelno >= logging.WARNING and not answers(watched, timeout=0.5))

    quiet, covered = _Unreachable(), set()

    def cover() -> None:  # Prefect sets its handlers up when it first logs: covered as they appear
        for name in (None, "prefect", "prefect._internal"):
            for handler in logging.getLogger(name).handlers:
                if handler not in covered:
                    handler.addFilter(quiet)
                    covered.add(handler)

    cover()
    # Prefect's API log worker writes "--- Error logging to API ---" straight to stderr for every batch it cannot
    # send while `logging.raiseExceptions` is on; the watcher owns the one line a lost server gets (the stdlib's
    # advice for production is this setting off)
    raising, logging.raiseExceptions = logging.raiseExceptions, False
    done = threading.Event()

    def watch() -> None:
        down_since = None
        while not done.wait(every):
            cover()
            if answers(url, timeout=2.0):
                down_since = None
                continue
            down_since = down_since if down_since is not None else time.monotonic()
            if time.monotonic() - down_since >= grace:
                break
        if done.is_set():
            return
        hint = _hint[0] if _hint else "the committed work is kept: the same command continues"
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        with contextlib.suppress(OSError):
            os.write(
                2,
                f"error: {url}: -: the Prefect server stopped answering (no connection for {grace:.0f} s); "
                f"{hint} once it runs again (`ratchet server`)\n".encode(),
            )
        stop_children()
        _run_cleanups()
        os._exit(1)

    watcher = threading.Thread(target=watch, name="prefect-server-watch", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        logging.raiseExceptions = raising
        for handler in covered:
            handler.removeFilter(quiet)


def stop_children(grace: float = GRACE_SECONDS) -> None:
    """SIGTERM to every descendant of this process, SIGKILL to those still running after `grace` seconds."""
    try:
        import psutil  # a dependency of Dask's (prefect-dask), always installed with Ratchet
    except ImportError:  # pragma: no cover
        return
    try:
        kids = psutil.Process().children(recursive=True)
    except psutil.Error:
        return
    for k in kids:
        try:
            k.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(kids, timeout=grace)
    for k in alive:
        try:
            k.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=2)


def _parent_death_signal():
    """A function for a child to call between fork and exec: SIGTERM when the parent dies, however it died (Linux's
    PR_SET_PDEATHSIG); None elsewhere. prctl is looked up here, before the fork: the child only makes the call. A
    parent that died between the fork and that call sends nothing, so the child then checks it still has its parent
    and, if not, ends there, before the exec (the man page's advice)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def arm() -> None:
        prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG
        if os.getppid() != parent:
            os._exit(128 + signal.SIGTERM)

    return arm


def run_server(cmd: list[str], env: dict[str, str]) -> int:
    """Run a server command in the foreground: it stops with this process (a signal here stops it, and so does a
    kill -9 of this process, by the parent-death signal), and its exit code is returned."""
    import subprocess

    proc = subprocess.Popen(cmd, env=env, preexec_fn=_parent_death_signal())
    return proc.wait()
