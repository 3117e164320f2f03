"""The `ratchet` command line. Thin: every command maps its options to a request of the Python API (`flows.api`) or
calls components/, and prints the result. The commands live by group in this package's modules, registered on the
app (`flows.cli.app`) as they are imported here, in the order `ratchet --help` lists them."""

from __future__ import annotations

import sys

from components.env import quiet_offline
from components.errors import InputError

# isort: off
# each module registers its commands as it is imported: in this order, `ratchet --help` lists them
from flows.cli import packages, evaluate, campaigns, evidence  # noqa: F401

# isort: on
from flows.cli.app import app, fail, out
from flows.cli.campaigns import _print_summary
from flows.cli.evaluate import _headers, gate_cmd

__all__ = ["app", "main", "out", "_print_summary", "_headers", "gate_cmd"]


def main() -> None:
    quiet_offline()
    from components.heap import skip_exit_collections
    from flows.signals import signals_obeyed

    skip_exit_collections()

    with signals_obeyed():  # Ctrl-C and SIGTERM stop the command at once, with the processes it started
        try:
            app()
        except InputError as e:  # raised outside a command (the group catches those inside)
            fail(str(e))
            sys.exit(2)
