#!/usr/bin/env bash
# Create .venv and install Ratchet (with test extras) into it; skipped when pyproject.toml has not changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-$(command -v python3.11 || command -v python3)}"
"$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Ratchet needs Python >= 3.11")'
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.ratchet-installed
want="$(sha256sum pyproject.toml | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "installing Ratchet and its pinned dependencies into .venv (about a minute, once)..." >&2
  log=.venv/install.log
  if ! { .venv/bin/python -m pip install --disable-pip-version-check --upgrade pip &&
         .venv/bin/python -m pip install --disable-pip-version-check -e ".[test]"; } >"$log" 2>&1; then
    tail -n 40 "$log" >&2
    echo "installation failed; the whole log is in $log" >&2
    exit 1
  fi
  echo "$want" > "$stamp"
fi
