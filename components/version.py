"""The code version that stage cache keys include: a hash of every components/ source file (or of another source tree:
the whole-round cache key also hashes flows/, since the round's composition is code too).

Any change to a building block invalidates cached stage results; a change to flows/ or tests does not."""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path


@lru_cache(maxsize=4)
def code_version(root: Path | None = None) -> str:
    root = root or Path(__file__).resolve().parent
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]
