"""The reading grammar the built-in worlds share: how a piece of text (a card, the policy, a receipt's rule) addresses
a rule and which value it instructs. Each world's `facts` module states its own value phrases on top of this;
what is common is the scope (a paragraph naming the write tool in backticks), the clauses and the negation:

  1. Scope. Only a paragraph or list item that names the fact's write tool in backticks addresses the fact.
  2. Clauses. The paragraph (whitespace folded) is split into clauses at `.`, `;`, `:`, `!`, `?` (followed by a
     space or the end) and at `, but` / `, while`.
  3. Negation. A clause is negated when `not`, `never`, `no`, `don't`/`do not`/`doesn't`, `cannot`, `avoid`,
     `instead of`, `rather than`, `other than` or `without` comes before the value phrase; a negated clause
     instructs the fact's opposite value.

The simulated agent reads its context with this grammar, so it is also part of what the simulated agent understands.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Callable

NEGATION = re.compile(
    r"\b(not|never|no|don't|do not|doesn't|does not|cannot|can't|avoid|instead of|rather than|"
    r"other than|without)\b",
    re.I,
)
CLAUSE_SPLIT = re.compile(r"[.;:!?](?:\s+|$)|,\s+(?=but\b|while\b)")


def paragraphs(text: str, tool: str) -> list[str]:
    """Paragraphs or list items that name `tool` in backticks (rule 1), whitespace folded."""
    parts = re.split(r"\n\s*\n|\n(?=\s*[-*] )", text)
    return [" ".join(p.split()) for p in parts if f"`{tool}`" in p]


def split(paragraph: str) -> list[str]:
    """A paragraph's clauses (rule 2); a backticked name holds no clause boundary: `a.b` is one token."""
    return [c for c in CLAUSE_SPLIT.split(paragraph) if c and c.strip()]


def clauses(text: str, tool: str) -> list[str]:
    return [c for p in paragraphs(text, tool) for c in split(p)]


def negated(clause: str, at: int) -> bool:
    """Whether a negation comes before position `at` of the clause (rule 3)."""
    return bool(NEGATION.search(clause[:at]))


def first(text: str, tool: str, phrases: dict[str, re.Pattern], opposite: dict[str, object]) -> object | None:
    """The value of the first clause that names one of the value phrases (rules 2-3)."""
    for clause in clauses(text, tool):
        hits = [(m.start(), value) for value, pat in phrases.items() if (m := pat.search(clause))]
        if hits:
            at, value = min(hits)
            return opposite[value] if negated(clause, at) else value
    return None


def keyed(text: str, tool: str, key: re.Pattern) -> Iterator[tuple[str, str, bool]]:
    """(clause, paragraph, negated) of each clause on `tool` that names `key`, in order."""
    for p in paragraphs(text, tool):
        for c in split(p):
            m = key.search(c)
            if m:
                yield c, p, negated(c, m.start())


@dataclass(frozen=True)
class Fact:
    """One rule of a world (the `components.worlds.competence.Fact` protocol): read with this grammar."""

    id: str
    tool: str  # the write whose arguments the fact governs (several facts may share one)
    statement: str  # the rule's text: in the written policy when `stated`, always in the receipts that cite it
    read: Callable[[str], object]
    stated: bool = True  # False: not in policy.md; learnable only from refusal receipts or successful episodes
    fields: tuple[str, ...] = ()  # the write's arguments the rule governs
    truth: object = None  # the rule's value from the world's rules data (None: what the statement instructs)

    @property
    def value(self) -> object:
        """The correct value: the world's rules data, else what the rule's own statement instructs."""
        return self.truth if self.truth is not None else self.read(self.statement)

    @property
    def rule(self) -> str:
        """The rule's text as a receipt carries it."""
        return self.statement.lstrip("- ")


def facts_read(facts: Iterable[Fact], text: str) -> dict[str, object]:
    """Every fact `text` addresses, with the value it instructs."""
    out = {}
    for f in facts:
        v = f.read(text)
        if v is not None:
            out[f.id] = v
    return out


def on_tool(facts: Iterable[Fact]) -> dict[str, tuple[Fact, ...]]:
    """Write tool -> the facts on it, in order."""
    out: dict[str, tuple[Fact, ...]] = {}
    for f in facts:
        out[f.tool] = out.get(f.tool, ()) + (f,)
    return out
