"""Strategies registered by name, each with typed keyword-only options.

A strategy is declared once: its name (what a manifest's `use:` says), the events it may bind to, and a factory whose
keyword-only parameters *are* its options. The options model is derived from that signature, so the name in a config
file, the options it accepts and their types are one declaration, and a misspelled or ill-typed option fails at load.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, create_model


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
    def __init__(self, kind: str):
        self.kind = kind
        self._strategies: dict[str, Strategy] = {}

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

    def get(self, name: str) -> Strategy | None:
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

        from components.errors import InputError

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
        return name in self._strategies

    def names(self) -> list[str]:
        return sorted(self._strategies)

    def __iter__(self) -> Iterator[Strategy]:
        return iter(self._strategies.values())
