"""The cyclic garbage collector and what a command keeps to its end.

A campaign's process imports Prefect, pandas, great-expectations and MLflow: about a million objects (modules,
classes, functions) that live as long as the process. The collector walks them anyway: its full collections during
the imports (each time the objects created since the last one grow by a quarter), every full collection of the run
after them, and the collections of the interpreter's shutdown. Measured on a one-round campaign (load 6, 2 cores):
1.7-2.0 CPU-s of GC during those imports, 1.4 CPU-s in the run's full collections, 1.5-2.3 CPU-s at exit, of ~14.

    long_lived(module)  around the first import of a heavy stack: the collector paused while it runs, then what it
                        built frozen (`gc.freeze`: moved to the permanent generation no collection walks). The few
                        reference cycles an import leaves behind (~10,000 objects after the campaign's) are kept
                        frozen rather than found by a full collection that would cost 0.6 CPU-s
    skip_exit_collections()  at a command's end: the objects left are frozen, so the interpreter's shutdown frees
                        what reference counting frees and leaves the rest to the operating system, as it leaves
                        memory anyway. Files, databases and the records are closed and flushed before this is called

Nothing here changes what a command computes or writes: only when memory that is garbage anyway is walked.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def long_lived(module: str) -> Iterator[None]:
    """Around the first import of `module` (and what is made with it to last as long, a client): the collector
    paused while it runs, then everything it made frozen. Once `module` is imported this does nothing, so a process
    that comes here again (a test calling a command in-process many times) freezes nothing more: what is frozen is
    never collected, garbage included."""
    if module in sys.modules:
        yield
        return
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was:  # nested, or another thread's: only the outermost pause turns the collector back on
            gc.enable()


def skip_exit_collections() -> None:
    """At the end of a command: the interpreter's shutdown walks no object the command left (see the module's
    docstring)."""
    gc.freeze()
