"""Worlds by name: how to materialize a benchmark and open an episode. (A failure's hidden cause is found by
counterfactual replay, `components.models.counterfactual`, not by a world's rules.)"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from components.worlds.base import Benchmark, BenchmarkError, Environment, Task, load_benchmark
from components.worlds.competence import Competence


@dataclass(frozen=True)
class WorldSpec:
    name: str
    materialize: Callable[..., Path]  # (out, seed, per_family=None, fractions=(train, dev))
    make_env: Callable[[Benchmark, Task], Environment]
    competence: Competence  # what a careful agent does there: the simulated agent plays the world with it


def _retail() -> WorldSpec:
    from components.worlds import retail
    from components.worlds.retail.competence import RetailCompetence
    from components.worlds.retail.env import RetailEnv

    return WorldSpec("retail", retail.materialize, RetailEnv, RetailCompetence())


def _airline() -> WorldSpec:
    from components.worlds import airline
    from components.worlds.airline.competence import AirlineCompetence
    from components.worlds.airline.env import AirlineEnv

    return WorldSpec("airline", airline.materialize, AirlineEnv, AirlineCompetence())


WORLDS: dict[str, Callable[[], WorldSpec]] = {"retail": _retail, "airline": _airline}


def world(name: str) -> WorldSpec:
    if name not in WORLDS:
        raise BenchmarkError(f"unknown world {name!r} (one of {', '.join(sorted(WORLDS))})")
    return WORLDS[name]()


__all__ = ["Benchmark", "BenchmarkError", "Competence", "WORLDS", "WorldSpec", "load_benchmark", "world"]
