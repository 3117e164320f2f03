"""The HarnessPort: the only thing the kernel knows of a world and a model.

Nine members (three attributes, six calls), plain data across. An adapter (see `chat.py`) implements it for any
world and any chat model; the kernel never sees a world's message classes or a model's API."""

from __future__ import annotations

from typing import Any, Protocol

from components.runtime.types import Draft, Proposal, Receipt, Turn


class HarnessPort(Protocol):
    write_tools: frozenset[str]  # calls that change the world: reviewed at pre_write, the only ones that ground W
    targets: dict[str, list[str]]  # write tool -> the args that identify its target (for confirmation)
    proposes: bool  # the model states its pending work each turn (`propose`); else the draft's tool is the intent

    def receipts(self) -> list[Receipt]:
        """Receipts of the actions committed since the last call (for grounding)."""

    def propose(self, memory: str) -> Proposal:
        """Ask the model for its pending state and its next intended tool."""

    def draft(self, memory: str, feedback: str | None = None) -> Draft:
        """Ask the model for this turn's action; `feedback` carries the reasons of a bounce."""

    def transcript(self) -> list[Turn]:
        """The conversation so far, as checkers read it."""

    def commit(self, draft: Draft, blocked: str | None = None) -> dict[str, Any]:
        """Execute the draft (or register it as blocked, with a synthetic result). Returns the observation."""

    @property
    def ended(self) -> bool:
        """The episode is over (finished, transferred, or the user left)."""
