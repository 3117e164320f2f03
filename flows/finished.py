"""A finished campaign, recognized before anything heavy happens: an unchanged rerun of `ratchet campaign run` is a
stat walk and a hash of the code, with no Prefect server started and neither Prefect, MLflow nor pandas imported.

When a campaign finishes (not stopped by its budget), `record()` writes `<out>/.state/finished.json`: the fingerprint
of everything its results and records depend on, with what the command printed. `unchanged()` computes the
fingerprint again: equal, a rerun would recompute nothing and write the same bytes, so the command prints the
recorded summary instead. The fingerprint covers the params (paths resolved), the code (components/ and flows/),
the stat of every file of the start package, of the benchmark and of the campaign's output (outside .state), where
the records go ($RATCHET_HOME, the MLflow store, the evidence graph) and whether their local files still exist. Any
change, or a missing or unreadable file, means the campaign runs as usual.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from components.io import atomic_write_json, tree_stats

FILE = "finished.json"
LOCK = os.path.join("lineage", "LOCK")


def _where(out: str | Path) -> Path:
    return Path(out) / ".state" / FILE


def _store_file(uri: str | None) -> str | None:
    """The local file of a store named by a path or a `sqlite:///` URL (None: a server, or nothing)."""
    if not uri:
        return None
    if uri.startswith("sqlite:///"):
        return uri.removeprefix("sqlite:///").partition("?")[0]
    return None if "://" in uri else uri


def fingerprint(p) -> str:
    """Everything a finished campaign's results and records depend on (`p`: resolved params)."""
    from components.env import default_db, project_home
    from components.version import code_version

    c = p.campaign
    out = Path(c.out)
    # not the lineage's LOCK: it names its holder, and the command's own hold on it ends (emptying it) after the
    # record is written, so that a rerun of `ratchet campaign run` saw a changed file and ran the campaign again
    outputs = tuple(
        x for x in tree_stats(out)[0] if not x[0].startswith(".state" + os.sep) and x[0] not in (".state", LOCK)
    )
    tracking = c.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    evidence = default_db(p.evidence.db)
    stores = {
        name: (where, None if (f := _store_file(where)) is None else os.path.exists(f))
        for name, where in (("mlflow", tracking), ("evidence", evidence))
    }
    here = Path(__file__).resolve().parent
    blob = {
        "params": p.model_dump(mode="json"),
        "code": [code_version(), code_version(here)],
        "start": tree_stats(Path(c.start))[0],
        "benchmark": tree_stats(Path(p.benchmark.out))[0],
        "outputs": outputs,
        "home": str(project_home()),
        "stores": stores,
    }
    return hashlib.sha256(json.dumps(blob, sort_keys=True, default=str).encode()).hexdigest()


def record(p, printed: dict[str, Any]) -> None:
    """After a finished campaign: its fingerprint and what the command printed from its result."""
    atomic_write_json(_where(p.campaign.out), {"fingerprint": fingerprint(p), "printed": printed})


def forget(out: str | Path) -> None:
    """Before a campaign runs at `out`: it is not known to be finished until it finishes again."""
    _where(out).unlink(missing_ok=True)


def unchanged(p) -> dict[str, Any] | None:
    """What a finished, unchanged campaign printed (None: it must run)."""
    f = _where(p.campaign.out)
    if not f.is_file():
        return None
    try:
        kept = json.loads(f.read_text(encoding="utf-8"))
        if kept["fingerprint"] != fingerprint(p):
            return None
        return kept["printed"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
