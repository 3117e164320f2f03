"""The MLflow store a campaign writes to: a new SQLite store copied from a migrated template, and one trace writer
on SQLite."""

from __future__ import annotations

import os
import threading
from pathlib import Path


def new_store_from_template(uri: str | None) -> None:
    """Start a new local SQLite store as a copy of an empty, migrated one instead of migrating it afresh.

    Creating a store runs all of MLflow's schema migrations on the empty file: ~2.6 s of CPU each time, paid by every
    campaign with a new store (each test's own store, each fresh `RATCHET_HOME`). The template is made once per MLflow
    version (in `$XDG_CACHE_HOME/ratchet`, else `~/.cache/ratchet`) the way MLflow makes any store, and then emptied of
    its one row that names a place and a time: the Default experiment (artifact location under the current directory,
    creation time). MLflow adds that row itself when it first opens the copy, as it would on a new file, so the copy
    ends up with the same rows a migrated store has. Anything but a `sqlite:///<path>` URI, or an existing file, is
    left alone; the copy is linked into place, so a store another process created meanwhile is never replaced."""
    import sqlite3

    if not uri or not uri.startswith("sqlite:///") or "?" in uri:
        return
    path = Path(uri[len("sqlite:///") :])
    if path.exists() or str(path) in ("", ":memory:"):
        return
    try:
        _copy_template(path)
    except (OSError, sqlite3.Error):  # no cache to write (a read-only home): MLflow makes the store as before
        pass


def _copy_template(path: Path) -> None:
    import shutil
    import sqlite3

    import mlflow

    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ratchet"
    template = cache / f"mlflow-{mlflow.__version__}-empty-store.db"
    if not template.exists():
        from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

        cache.mkdir(parents=True, exist_ok=True)
        tmp = cache / f".{template.name}.{os.getpid()}-{threading.get_ident()}"
        tmp.unlink(missing_ok=True)
        SqlAlchemyStore(f"sqlite:///{tmp}", str(cache / "artifacts")).engine.dispose()
        with sqlite3.connect(tmp) as con:
            con.execute("DELETE FROM experiments")
        con.close()
        os.replace(tmp, template)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{threading.get_ident()}")
    shutil.copyfile(template, tmp)
    try:
        os.link(tmp, path)
    except FileExistsError:
        pass
    finally:
        tmp.unlink()


def one_trace_writer(uri: str | None) -> None:
    """On a SQLite store, have MLflow's process-wide trace exporter write from one thread. SQLite takes one writer
    at a time, and a transaction that reads and then writes while another connection writes fails at once with
    "database is locked" (no busy wait; MLflow retries only Postgres deadlocks); the async exporter runs `log_spans`
    and `start_trace` of the same traces on up to 10 threads at once. The tracker's own traces no longer go through
    that exporter (`TraceWriter.write` writes them itself, in sequence); this keeps any other tracing in
    the process (a `@mlflow.trace` of the caller's) from meeting the error on the same store."""
    from mlflow.environment_variables import MLFLOW_ASYNC_TRACE_LOGGING_MAX_WORKERS

    if str(uri or "").startswith("sqlite") and MLFLOW_ASYNC_TRACE_LOGGING_MAX_WORKERS.get() != 1:
        import mlflow

        MLFLOW_ASYNC_TRACE_LOGGING_MAX_WORKERS.set(1)
        mlflow.tracing.reset()  # the exporter reads the setting when it is built: build it again
