"""A module imported on first use. For what a light command path reaches only through a module's constants or a
function it does not call: `components.params` reads the gate's limits, `ratchet campaign run` of a finished campaign
prints the report's round rows; neither needs pandas (~2 CPU-s of imports under load)."""

from __future__ import annotations

import importlib
from types import ModuleType


class LazyModule:
    def __init__(self, name: str):
        self._name = name
        self._module: ModuleType | None = None

    def __getattr__(self, attr: str):
        if self._module is None:
            self._module = importlib.import_module(self._name)
        return getattr(self._module, attr)
