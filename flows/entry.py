"""The `ratchet` console script. `ratchet gate ...` with options written plainly runs here, on numpy and the csv
module, without typer, rich or pandas (which cost several times numpy's import); every other command, and any gate
invocation this parser does not take exactly as typer would (`--help`, an unknown or repeated option, a value
typer would refuse, a missing option), goes to the typer app (`flows.cli`), which stays the documented definition.
Both paths run `components.evolution.gate_files.gate_command`, so options, output, exit codes and one-line errors
are the same; GateConfig holds the defaults for both."""

from __future__ import annotations

import sys
from dataclasses import fields
from typing import Any

# the gate command's value options: option -> GateConfig field (the typer command declares the same, with help)
GATE_OPTIONS = {
    "--base": "base",
    "--cand": "cand",
    "--reg-cap": "reg_cap",
    "--reg-share": "reg_share",
    "--material": "material",
    "--alpha": "alpha",
    "--n-boot": "n_boot",
    "--seed": "seed",
    "--min-items": "min_items",
}


def parse_gate(args: list[str]) -> dict | None:
    """`gate`'s arguments as {field: value} when they are plain (`--opt value`, `--opt=value`, `--json`), each option
    at most once, both tables given, numbers that int()/float() take (what click's INT and FLOAT types call);
    None for anything else, which the typer app parses and, if need be, refuses."""
    from components.evolution.gate import GateConfig

    kinds: dict[str, Any] = {f.name: type(f.default) for f in fields(GateConfig)}  # a field's type, from its default
    got: dict = {}
    k = 0
    while k < len(args):
        a = args[k]
        if a == "--json":
            if "as_json" in got:
                return None
            got["as_json"] = True
            k += 1
            continue
        name, eq, value = a.partition("=")
        if name not in GATE_OPTIONS:
            return None
        if not eq:
            if k + 1 >= len(args):
                return None
            value = args[k + 1]
            k += 1
        k += 1
        field = GATE_OPTIONS[name]
        if field in got or not value or value.startswith("--"):
            return None
        try:
            got[field] = value if field in ("base", "cand") else kinds[field](value)
        except ValueError:
            return None
    return got if "base" in got and "cand" in got else None


def gate_light(args: list[str]) -> int | None:
    """Run `ratchet gate` without typer; the exit code, or None when the typer app must take it."""
    opts = parse_gate(args)
    if opts is None:
        return None
    from components.errors import InputError
    from components.evolution.gate_files import gate_command

    try:
        code, line = gate_command(opts.pop("base"), opts.pop("cand"), **opts)
    except InputError as e:
        for msg in str(e).splitlines() or ["invalid input"]:
            print(f"error: {msg}", file=sys.stderr)
        return 2
    print(line, file=sys.stderr if code == 3 else sys.stdout)
    return code


def main() -> None:
    if sys.argv[1:2] == ["gate"]:
        from flows.signals import signals_obeyed

        with signals_obeyed():
            code = gate_light(sys.argv[2:])
        if code is not None:
            sys.stdout.flush()
            sys.exit(code)
    from flows.cli import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()
