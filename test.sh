#!/usr/bin/env bash
# Quick start 2/2: set up (first time only) and run the test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")"
scripts/bootstrap.sh
exec .venv/bin/python -m pytest "$@"
