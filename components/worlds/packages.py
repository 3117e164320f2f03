"""The shipped `reference` and `all-skills` packages of a world whose rules are data: one card per write, stating
every rule on that write as the world's rules data has it (`Fact.statement`), routed to the write's intent
(`reference`) or delivered every turn (`all-skills`, by its manifest). `scripts/render_packages.py` writes the
world's own into data/packages/; a variant's benchmark carries its own under packages/ (`materializer`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from components.worlds.grammar import Fact

NAMES = ("reference", "all-skills")


def card(card_id: str, tool: str, facts: Mapping[str, Fact]) -> str:
    body = "\n".join(f.statement for f in facts.values() if f.tool == tool)
    return (
        f"---\nid: {card_id}\ntype: procedure\ntrigger:\n  event: intent_recorded\n  tool: {tool}\n"
        f"source: the world's rules (rules.yaml; a variant's meta.json)\n---\n{body}\n"
    )


def render(
    facts: Mapping[str, Fact], cards: Mapping[str, str], shipped: Path, prefix: str = "packages/"
) -> dict[str, str]:
    """Relative path -> text of each package (`cards`: card id -> the write it is about; `shipped`: where the
    world's own packages lie, whose manifests are kept)."""
    out = {}
    for name in NAMES:
        out[f"{prefix}{name}/manifest.yaml"] = (shipped / name / "manifest.yaml").read_text(encoding="utf-8")
        for card_id, tool in cards.items():
            out[f"{prefix}{name}/em/procedure/{card_id}.md"] = card(card_id, tool, facts)
    return out
