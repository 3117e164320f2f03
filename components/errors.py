"""Bad input: one clear message naming the file and the field. The CLI prints it and exits non-zero, no traceback."""


class InputError(Exception):
    """A malformed package, plan, benchmark, score table or parameter file."""


class StorageError(OSError):
    """The system refused a write (disk full, read-only, a vanished directory): one line naming the path, exit 1.
    An OSError, so the CLI reports it as every other refusal of the system; raised at Ratchet's write boundaries
    (atomic writes, the budget ledger, the evidence graph), where the path is known."""

    def __init__(self, path: str, what: str, errno_: int | None = None):
        super().__init__(errno_ or 0, what, str(path))


SQLITE_STORAGE = (
    "disk i/o error",
    "database or disk is full",
    "readonly database",
    "unable to open database file",
    "no space left",
)


def storage_problem(e: BaseException) -> str | None:
    """What a SQLite error says about the place it writes (None when it is about something else)."""
    text = str(getattr(e, "orig", None) or e).lower()
    return next((text for s in SQLITE_STORAGE if s in text), None)


class Unavailable(Exception):
    """A service a command needs did not come up or answer (Prefect's temporary server on a loaded machine): one
    line saying what to do, exit 1; nothing was run, so the same command can be run again."""


class ExternalFailure(Unavailable):
    """Something outside Ratchet failed while a command ran (a training command, a server that went away, a damaged
    store): one line naming it, exit 1, no traceback; what was committed before it is kept."""
