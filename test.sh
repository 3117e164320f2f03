#!/usr/bin/env bash
# Quick start 2/2: set up (first time only) and run the test suite. Extra arguments go to pytest.
# The fast tier by default (`-m "not slow"`: every test but those of tests/conftest.py::SLOW); `--all` runs every
# test (what CI runs: .ci/run), `--slow` the slow tier alone. A `-m` of your own replaces the tier's (pytest keeps the
# last one given). CONTRIBUTING.md, "The two tiers".
set -euo pipefail
cd "$(dirname "$0")"
tier=(-m "not slow")
args=()
for arg in "$@"; do
  case "$arg" in
    --all) tier=() ;;
    --slow) tier=(-m slow) ;;
    *) args+=("$arg") ;;
  esac
done
scripts/bootstrap.sh
# With PYTHONDONTWRITEBYTECODE set (this machine sets it for everything), each pytest worker and each Python process
# the tests start would compile the project's modules and redo pytest's assertion rewriting of every test module
# (~3 CPU-s per worker). The run keeps its bytecode in .venv/pycache instead, never next to the sources, seeded with
# the installed files' bytecode (scripts/seed_pycache.py). A PYTHONPYCACHEPREFIX of your own is left as it is.
# If the cache cannot be prepared, the run goes on without it.
if [ -n "${PYTHONDONTWRITEBYTECODE:-}" ] && [ -z "${PYTHONPYCACHEPREFIX:-}" ] &&
   .venv/bin/python scripts/seed_pycache.py .venv/pycache; then
  export PYTHONPYCACHEPREFIX="$PWD/.venv/pycache"
  unset PYTHONDONTWRITEBYTECODE
fi
exec .venv/bin/python -m pytest ${tier[@]+"${tier[@]}"} ${args[@]+"${args[@]}"}
