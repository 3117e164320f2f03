"""The `ratchet` app: its command groups, the one-line errors every command ends with, and the consoles."""

from __future__ import annotations

import sys
from pathlib import Path

import typer
from rich.console import Console

# The usage errors typer raises are its vendored click's (typer 0.26+), not the `click` package's. Typer 0.29 gives
# public names to BadParameter, Abort and Exit only: UsageError, MissingParameter and NoArgsIsHelpError have none
# (asked for in fastapi/typer#1867, closed), so they are read from the vendored module, here alone.
from typer._click import exceptions as click
from typer.core import TyperGroup, TyperOption

from components.errors import InputError, Unavailable

# Problem lines must stay one line each when piped; tables get a fixed width when not on a terminal.
out = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True, soft_wrap=True)


_DISPLAY_TYPE = TyperOption.display_type_rich


def _flag_takes_no_value(self, ctx):
    """A flag shows no value placeholder in help: typer 0.29 shows `--force <bool>`, and `--force true` then fails
    ("unexpected extra argument")."""
    return "" if self.is_flag and self.metavar is None else _DISPLAY_TYPE(self, ctx)


TyperOption.display_type_rich = _flag_takes_no_value  # type: ignore[method-assign]  # typer's own, replaced


def say(line: str) -> None:
    """A progress or notice line, on stderr (stdout keeps the result)."""
    err.print(line, highlight=False, markup=False)


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print `error: <line>` for each line of the message on stderr; return the Exit to raise."""
    for line in message.splitlines() or ["invalid input"]:
        err.print(f"error: {line}", markup=False, highlight=False)
    return typer.Exit(code)


class _OneLineErrors(TyperGroup):
    """Every command's bad input ends as one line per problem and exit 2, never a traceback; in-process too
    (tests invoke the app with typer's CliRunner)."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except InputError as e:
            raise fail(str(e)) from None
        except Unavailable as e:  # not bad input: what to do about a service that did not come up
            raise fail(str(e), 1) from None
        except RecursionError:
            raise fail("input nested too deeply to read (a directory or document thousands of levels deep)") from None
        except click.NoArgsIsHelpError:  # `ratchet campaign` alone: the help, as asked
            raise
        except click.UsageError as e:  # an option's value, a missing option, an unknown command: one line, not a box
            raise fail(_usage_line(e, ctx), e.exit_code) from None
        except OSError as e:  # the system refused (no such directory, read-only, disk full): a runtime failure
            raise fail(f"{e.filename or '-'}: -: {e.strerror or e}", 1) from None

    def parse_args(self, ctx, args):
        try:
            return super().parse_args(ctx, args)
        except click.NoArgsIsHelpError:  # `ratchet` alone: the help
            raise
        except click.UsageError as e:  # an option before the command (`ratchet --bogus`): one line, not a box
            raise fail(_usage_line(e, ctx), e.exit_code) from None


def _usage_line(e, ctx) -> str:
    """click's usage error as `--option: what` plus where the help is."""
    what = e.format_message().splitlines()[0].rstrip(".")
    if isinstance(e, typer.BadParameter) and not isinstance(e, click.MissingParameter) and e.param is not None:
        name = e.param_hint or "/".join(getattr(e.param, "opts", None) or [e.param.name or "-"])
        what = f"{str(name).strip(chr(39))}: {e.message.splitlines()[0] if e.message else 'invalid value'}"
    return f"{what} (see `{(e.ctx or ctx).command_path} --help`)"


def check_port(port: int) -> None:
    """Before a server starts: a bad port would otherwise end in the server's own traceback."""
    if not 1 <= port <= 65535:
        raise InputError(f"--port: {port}: must be between 1 and 65535")


def nested_too_deep(path: Path) -> InputError:
    return InputError(f"{path}: -: nested too deeply to read (thousands of directory levels)")


app = typer.Typer(
    cls=_OneLineErrors,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    help="Ratchet: evolve an agent's memory package under a frozen model, gated by paired held-out evidence.",
)
package_app = typer.Typer(no_args_is_help=True, help="Memory packages: lint and digest.")
bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks: materialize a world's tasks and splits.")
campaign_app = typer.Typer(no_args_is_help=True, help="Evolution campaigns: run, resume, schedule, list.")
app.add_typer(package_app, name="package")
app.add_typer(bench_app, name="bench")
app.add_typer(campaign_app, name="campaign")
evidence_app = typer.Typer(
    no_args_is_help=True, help="Campaign memory: why a change is there, what is contested, revoke."
)
app.add_typer(evidence_app, name="evidence")

outer_app = typer.Typer(
    no_args_is_help=True,
    help="The outer recursion: train the model on a campaign's export, then "
    "evolve the package again under the trained model.",
)
app.add_typer(outer_app, name="outer")

DEFAULT_BENCH = Path("data/benchmarks/retail")
