"""Prepare the bytecode cache ./test.sh uses when PYTHONDONTWRITEBYTECODE is set: `seed_pycache.py <prefix>`.

With PYTHONPYCACHEPREFIX set, Python reads and writes .pyc files only in a mirror tree under the prefix, and no longer
reads the `__pycache__` directories that pip and the Python install already compiled: an empty prefix would make the
first run compile the standard library and every dependency (~10 CPU-s more per interpreter). So the mirror is seeded
with links to those installed files (about 35,000 symlinks, once per installed environment); Python checks each one
against its source as usual and replaces a stale one with a file of its own. Only the project's modules and pytest's
rewritten test modules are then compiled, once.

The mirror of the system temp directory is emptied on every run: the tests that copy the project into a temp directory
(tests/test_dvc_pipeline.py) would otherwise leave a copy's bytecode behind per run."""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import sysconfig
import tempfile
from pathlib import Path

TAG = f".{sys.implementation.cache_tag}.pyc"  # not the .opt-N. files: the tests run without -O


def installed_roots() -> list[Path]:
    paths = sysconfig.get_paths()
    roots = sorted({Path(paths[k]).resolve() for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths})
    return [r for r in roots if not any(o != r and r.is_relative_to(o) for o in roots)]  # each tree walked once


def seed(prefix: Path) -> int:
    n = 0
    for root in installed_roots():
        for d, dirs, files in os.walk(root):
            if os.path.basename(d) != "__pycache__":
                continue
            pycs = [f for f in files if f.endswith(TAG) and f.count(".") == 2]
            if not pycs:
                continue
            mirror = prefix / Path(d).parent.relative_to("/")
            mirror.mkdir(parents=True, exist_ok=True)
            for f in pycs:
                link = mirror / f
                if not os.path.lexists(link):
                    os.symlink(os.path.join(d, f), link)
                    n += 1
    return n


def main() -> None:
    prefix = Path(sys.argv[1]).resolve()
    prefix.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(prefix / Path(tempfile.gettempdir()).resolve().relative_to("/"), ignore_errors=True)
    # seeded for this interpreter and these installed files (the install stamp changes with every install)
    stamp = Path(sys.prefix) / ".ratchet-installed"
    key = hashlib.sha256(
        "\n".join([sys.version, *map(str, installed_roots()), stamp.read_text() if stamp.exists() else ""]).encode()
    ).hexdigest()
    marker = prefix / ".seeded"
    if marker.exists() and marker.read_text() == key:
        return
    seed(prefix)
    marker.write_text(key)


if __name__ == "__main__":
    main()
