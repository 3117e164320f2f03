"""Worlds by name (docs/worlds.md, "Adding a world"): how to materialize a benchmark, open an episode, and act in it.

Built-in worlds register here with `@WORLDS.register(name)`, the same registry as strategies (`components.registry`):
a name and a factory that returns a `WorldSpec`. An installed package adds a world through the `ratchet.worlds`
entry-point group; each entry point loads a callable returning a `WorldSpec`, or a `WorldSpec`:

    [project.entry-points."ratchet.worlds"]
    clinic = "my_package.world:spec"

A world's factory runs once; `world(name)` returns its spec. (A failure's hidden cause is found by counterfactual
replay, `components.models.counterfactual`, not by a world's rules.)
"""

from __future__ import annotations

import sys
from importlib.metadata import entry_points
from pathlib import Path

from components.registry import Registry
from components.worlds.base import Benchmark, BenchmarkError, Environment, ReceiptMode, Task, WorldSpec, load_benchmark
from components.worlds.competence import Competence

ENTRY_POINT_GROUP = "ratchet.worlds"
WORLDS = Registry("world")
PACKAGES = Path(__file__).resolve().parents[2] / "data" / "packages"  # the repository's shipped packages

_specs: dict[str, WorldSpec] = {}
_from_entry_points: dict[str, str] = {}  # world name -> the entry point's value, for error messages


@WORLDS.register("retail")
def _retail() -> WorldSpec:
    """The built-in retail customer-service world."""
    from components.worlds import retail
    from components.worlds.retail import rules
    from components.worlds.retail.competence import RetailCompetence
    from components.worlds.retail.env import RetailEnv, truth

    packages = {name: PACKAGES / name for name in ("none", "seed", "all-skills", "reference")}
    return WorldSpec(
        "retail",
        retail.materialize,
        RetailEnv,
        RetailCompetence(),
        packages,
        tuple(ReceiptMode),
        rules=rules,
        truth=truth,
    )


@WORLDS.register("airline")
def _airline() -> WorldSpec:
    """The built-in airline desk world (bookings, fares, changes, bags, compensation, tiers)."""
    from components.worlds import airline
    from components.worlds.airline import rules
    from components.worlds.airline.competence import AirlineCompetence
    from components.worlds.airline.env import AirlineEnv, truth

    packages = {name: PACKAGES / "airline" / name for name in ("none", "seed", "all-skills", "reference")}
    return WorldSpec(
        "airline",
        airline.materialize,
        AirlineEnv,
        AirlineCompetence(),
        packages,
        tuple(ReceiptMode),
        rules=rules,
        truth=truth,
    )


def discover() -> None:
    """Register every `ratchet.worlds` entry point not registered yet (safe to call again after an install)."""
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if _from_entry_points.get(ep.name) == ep.value:
            continue
        if ep.name in WORLDS:
            where = f"entry point {_from_entry_points[ep.name]}" if ep.name in _from_entry_points else "a built-in"
            raise BenchmarkError(
                f"{ENTRY_POINT_GROUP}: {ep.name}: entry point {ep.value} names a world already registered by {where}"
            )
        WORLDS.register(ep.name)(_loader(ep))
        _from_entry_points[ep.name] = ep.value


def _loader(ep):
    def factory() -> WorldSpec:
        try:
            obj = ep.load()
            return obj() if callable(obj) else obj
        except Exception as e:  # noqa: BLE001 - a broken plug-in is bad input, named, not a traceback
            raise BenchmarkError(
                f"{ENTRY_POINT_GROUP}: {ep.name}: entry point {ep.value} failed: {type(e).__name__}: {e}"
            ) from None

    return factory


_scanned: tuple | None = None  # the sys.path that `names()` last scanned for entry points


def _path_state() -> tuple:
    """sys.path and each entry's mtime: an install or uninstall adds or removes a dist-info directory in one."""
    import os

    state = []
    for entry in sys.path:
        try:
            state.append((entry, os.stat(entry or ".").st_mtime_ns))
        except OSError:
            state.append((entry, None))
    return tuple(state)


def names() -> list[str]:
    """Every registered world: the built-ins and the installed entry points. Scanning the entry points reads every
    installed distribution's metadata (~15 ms), and the simulated agent asks once per conversation, so a scan is
    skipped while sys.path and its directories are as they were at the last one; `discover()` always scans."""
    global _scanned
    state = _path_state()
    if state != _scanned:
        discover()
        _scanned = state
    return WORLDS.names()


def world(name: str) -> WorldSpec:
    if name in _specs:
        return _specs[name]
    if name not in WORLDS:
        discover()
    if name not in WORLDS:
        raise BenchmarkError(f"unknown world {name!r} (one of {', '.join(WORLDS.names())})")
    spec = WORLDS.make(name, {}, where="world")
    if not isinstance(spec, WorldSpec) or spec.name != name:
        raise BenchmarkError(f"world {name!r}: its factory must return a WorldSpec named {name!r} (got {spec!r:.80})")
    _check_receipts(spec)
    _check_protocols(spec)
    _specs[name] = spec
    return spec


def _check_protocols(spec: WorldSpec) -> None:
    """A world's declared protocols: `custom` and `standard` only, each once, with a `materialize` that takes
    `protocol` when there is more than Ratchet's own harness to choose from."""
    import inspect

    ps = spec.protocols
    if not isinstance(ps, tuple) or not ps or len(set(ps)) != len(ps) or not set(ps) <= {"standard", "custom"}:
        raise BenchmarkError(
            f"world {spec.name!r}: protocols: must be a tuple of standard and/or custom; got {ps!r:.80}"
        )
    if ps != ("custom",) and "protocol" not in inspect.signature(spec.materialize).parameters:
        raise BenchmarkError(
            f"world {spec.name!r}: protocols: declares {' | '.join(ps)}, but its materialize takes no "
            "`protocol` argument to write it"
        )


def party_model(settings: dict) -> bool:
    """Whether the settings name a model of the episode's other party (a setting that is a mapping of model options,
    a user simulator's): it spends tokens of its own, from the same budget."""
    return any(isinstance(v, dict) for v in settings.values())


def run_settings(name: str) -> dict:
    """The world's settings outside the benchmark that change its episodes (`WorldSpec.settings`: a user simulator's
    model), as read in this process; {} for a world that has none. A bad setting is an InputError naming it."""
    spec = world(name)
    return dict(spec.settings()) if spec.settings is not None else {}


def _check_receipts(spec: WorldSpec) -> None:
    """A world's declared receipt modes: a non-empty tuple of `ReceiptMode`s, and a `materialize` that takes
    `receipts` unless the world's one mode is the default a benchmark's meta.json leaves out (explained)."""
    import inspect

    modes = spec.receipts
    if not isinstance(modes, tuple) or not modes or not all(isinstance(m, ReceiptMode) for m in modes):
        raise BenchmarkError(
            f"world {spec.name!r}: receipts: must be a non-empty tuple of ReceiptMode "
            f"({', '.join(m.value for m in ReceiptMode)}); got {modes!r:.80}"
        )
    if modes != (ReceiptMode.explained,) and "receipts" not in inspect.signature(spec.materialize).parameters:
        raise BenchmarkError(
            f"world {spec.name!r}: receipts: declares {' | '.join(m.value for m in modes)}, but its "
            "materialize takes no `receipts` argument to write them"
        )


__all__ = [
    "Benchmark",
    "BenchmarkError",
    "Competence",
    "ENTRY_POINT_GROUP",
    "Environment",
    "Task",
    "WORLDS",
    "ReceiptMode",
    "WorldSpec",
    "discover",
    "load_benchmark",
    "names",
    "party_model",
    "run_settings",
    "world",
]
