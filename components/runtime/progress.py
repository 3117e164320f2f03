"""Episodes done and the time left, on a terminal: one bar per running evaluation shard, in one live display per
process (shards run on threads). Nothing is drawn when stderr is not a terminal (CI, logs, pipes)."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any

_lock = threading.Lock()
_live: dict[str, Any] = {"progress": None, "open": 0}


def _quiet(_r: Any) -> None:
    return None


def progress_bar(label: str, total: int, stream: Any = None) -> Callable[[Any], None]:
    """A callback to call once per finished episode of a shard of `total` episodes."""
    stream = stream if stream is not None else sys.stderr
    if total <= 0 or not getattr(stream, "isatty", lambda: False)():
        return _quiet
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    with _lock:
        if _live["progress"] is None:
            bar = _live["progress"] = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeRemainingColumn(),
                console=Console(file=stream),
                transient=True,
            )
            bar.start()
        progress = _live["progress"]
        _live["open"] += 1
        task = progress.add_task(f"episodes {label}".strip(), total=total)
    done = [0]

    def advance(_r: Any) -> None:
        with _lock:
            progress.advance(task)
            done[0] += 1
            if done[0] == total:  # the shard is finished: its bar goes, and the display with the last one
                progress.remove_task(task)
                _live["open"] -= 1
                if _live["open"] == 0:
                    progress.stop()
                    _live["progress"] = None

    return advance
