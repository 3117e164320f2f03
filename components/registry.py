"""Strategies registered by name, each with typed keyword-only options.

A strategy is declared once: its name (what a manifest's `use:` says), the events it may bind to, and a factory whose
keyword-only parameters *are* its options. The options model is derived from that signature, so the name in a config
file, the options it accepts and their types are one declaration, and a misspelled or ill-typed option fails at load.

A registry may also take plug-ins: an installed package names a factory in the registry's entry-point group
(`Registry("model", entry_points="ratchet.models")`), and `declare` names a built-in whose module is imported only
when it is used. Either way the name is known at once (params validate against `names()`), and the factory is
imported on first `get`.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, create_model

from components.errors import InputError


F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Strategy:
    name: str
    kind: str
    events: frozenset[str]
    options: type[BaseModel]
    factory: Callable[..., Any]
    delivers_cards: bool = False  # can deliver E cards (used to tell whether a card is reachable)
    ignores_triggers: bool = False  # delivers cards regardless of their trigger (the all-skills baseline)
    doc: str = ""

    def build(self, cfg: dict[str, Any]) -> Any:
        """Validate `cfg` (raises pydantic.ValidationError) and return the strategy's runtime callable."""
        opts = self.options.model_validate(cfg)
        return self.factory(**opts.model_dump())


def options_model(name: str, factory: Callable[..., Any]) -> type[BaseModel]:
    fields: dict[str, Any] = {}
    for p in inspect.signature(factory, eval_str=True).parameters.values():
        if p.kind is not inspect.Parameter.KEYWORD_ONLY:
            raise TypeError(f"strategy {name!r}: option {p.name!r} must be keyword-only")
        fields[p.name] = (p.annotation, ... if p.default is inspect.Parameter.empty else p.default)
    config = ConfigDict(extra="forbid", strict=True, frozen=True)
    return create_model(f"{name}_options", __config__=config, **fields)


class Registry:
    def __init__(self, kind: str, entry_points: str | None = None):
        self.kind = kind
        self.group = entry_points  # the entry-point group plug-ins register in (None: built-ins only)
        self._strategies: dict[str, Strategy] = {}
        self._declared: dict[str, tuple[str, str]] = {}  # not loaded yet: name -> ("module:attr", where declared)
        self._origins: dict[str, str] = {}  # every declared name, loaded or not -> "module:attr"
        # a campaign's threads may ask for a plug-in not loaded yet at once: one of them loads and registers it
        self._loading = threading.RLock()

    def register(
        self,
        name: str,
        *,
        events: Iterable[str] = (),
        delivers_cards: bool = False,
        ignores_triggers: bool = False,
    ) -> Callable[[F], F]:
        def wrap(factory: F) -> F:
            if name in self._strategies:
                raise ValueError(f"{self.kind} {name!r} registered twice")
            self._declared.pop(
                name, None
            )  # a declared built-in's module, imported, registers it: the declaration holds
            self._strategies[name] = Strategy(
                name=name,
                kind=self.kind,
                events=frozenset(events),
                options=options_model(name, factory),
                factory=factory,
                delivers_cards=delivers_cards,
                ignores_triggers=ignores_triggers,
                doc=(inspect.getdoc(factory) or "").split("\n")[0],
            )
            return factory

        return wrap

    def declare(self, name: str, target: str, where: str = "a built-in") -> None:
        """`name` is the factory at `target` ("module:attr"), imported on first use: the name is known without
        importing a heavy module (a meta-agent's), and a plug-in's code runs only when it is asked for."""
        if self._origins.get(name) == target:  # declared before (and maybe loaded since): nothing new
            return
        if name in self._strategies or name in self._declared:
            have = self._declared.get(name)
            by = f"entry point {have[0]}" if have is not None and have[1] != "a built-in" else "a built-in"
            raise InputError(f"{where}: {name}: {target} names a {self.kind} already registered by {by}")
        self._declared[name] = (target, where)
        self._origins[name] = target

    def discover(self) -> None:
        """Declare every entry point of the registry's group not declared yet (again after an install: cheap)."""
        if self.group is None:
            return
        from importlib.metadata import entry_points

        for ep in entry_points(group=self.group):
            self.declare(ep.name, ep.value, where=self.group)

    def _load(self, name: str) -> None:
        """Import a declared factory and register it (its module may register it itself, by decorator)."""
        import importlib

        target, where = self._declared[name]
        module, _, attr = target.partition(":")
        try:
            factory = importlib.import_module(module)
            for part in attr.split(".") if attr else ():
                factory = getattr(factory, part)
        except Exception as e:  # noqa: BLE001 - a broken plug-in is bad input, named, not a traceback
            raise InputError(f"{where}: {name}: {target} failed to load: {type(e).__name__}: {e}") from None
        if name in self._strategies:  # registered by its module's decorator on import
            return
        if not callable(factory):
            raise InputError(
                f"{where}: {name}: {target} is not a factory (a callable whose keyword-only parameters are its options)"
            )
        try:
            self.register(name)(factory)
        except TypeError as e:  # a positional parameter: options are keyword-only
            raise InputError(f"{where}: {name}: {target}: {e}") from None

    def get(self, name: str) -> Strategy | None:
        if name not in self._strategies:
            with self._loading:
                if name not in self._strategies and name not in self._declared:
                    self.discover()
                if name not in self._strategies and name in self._declared:
                    self._load(name)
        return self._strategies.get(name)

    @contextmanager
    def scoped(self, name: str, factory: Callable[..., Any], **kw: Any) -> Iterator[None]:
        """`factory` registered as `name` for the block only: a benchmark's own strategies stay out of the registry
        that packages loaded elsewhere in the process (and the names a refusal lists) see."""
        self.register(name, **kw)(factory)
        try:
            yield
        finally:
            self._strategies.pop(name, None)

    def make(self, name: str, cfg: dict[str, Any] | None = None, where: str | None = None) -> Any:
        """Build the named strategy with validated options; a bad name or option is an InputError naming the field."""
        from pydantic import ValidationError

        where = where or self.kind
        strategy = self.get(name)
        if strategy is None:
            raise InputError(f"{where}: unknown {self.kind} {name!r} (one of {', '.join(self.names())})")
        try:
            return strategy.build(cfg or {})
        except ValidationError as e:
            err = e.errors()[0]
            raise InputError(f"{where}.{'.'.join(str(x) for x in err['loc'])}: {err['msg']}") from None

    def __contains__(self, name: str) -> bool:
        return name in self._strategies or name in self._declared

    def names(self) -> list[str]:
        """Every name this registry answers to: registered, declared, and the installed plug-ins'."""
        self.discover()
        return sorted({*self._strategies, *self._declared})

    def check(self, name: str) -> str:
        """`name` itself when it is registered (a plug-in's too), else a ValueError listing the names: what a
        params field validates with (the one-line error then names the file and field)."""
        if name not in self._strategies and name not in self._declared:
            self.discover()
        if name not in self._strategies and name not in self._declared:
            raise ValueError(f"unknown {self.kind} {name!r} (one of {', '.join(self.names())})")
        return name

    def __iter__(self) -> Iterator[Strategy]:
        return iter(self._strategies.values())
