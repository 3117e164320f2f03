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
    skip_exit_collections()  when a command's process exits, the objects left are frozen: the interpreter's shutdown
                        frees what reference counting frees and leaves the rest to the operating system, as it
                        leaves memory anyway (the command has closed its files and databases by then)

Nothing here changes what a command computes or writes: only when memory that is garbage anyway is walked.
"""

from __future__ import annotations

import atexit
import gc
import sys
from collections.abc import Iterator
from contextlib import contextmanager

_exit_hooked = False


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
    """The interpreter's shutdown walks none of the objects the process leaves: `gc.freeze` when it exits (an atexit
    hook, run after the command has written and closed what it writes; a caller that runs commands in-process, a
    test, freezes nothing until its own end). Once per process."""
    global _exit_hooked
    if not _exit_hooked:
        atexit.register(gc.freeze)
        _exit_hooked = True
