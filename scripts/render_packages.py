"""Write the built-in worlds' shipped `reference` and `all-skills` cards from their rules data (`rules.yaml`):
`python scripts/render_packages.py` (tests/test_rules_data.py checks that the shipped files are what this writes)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def shipped() -> dict[Path, str]:
    """Each shipped card's path and the text the world's own rules give it."""
    from components.worlds import PACKAGES, airline, retail
    from components.worlds.airline.facts import facts_of as airline_facts
    from components.worlds.retail.facts import facts_of as retail_facts

    out = {}
    for base, files in (
        (PACKAGES, retail.packages(retail_facts())),
        (PACKAGES / "airline", airline.packages(airline_facts())),
    ):
        for rel, text in files.items():
            if rel.endswith(".md"):
                out[base / rel.removeprefix("packages/")] = text
    return out


def main() -> None:
    for path, text in shipped().items():
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
