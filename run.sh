#!/usr/bin/env bash
# Quick start 1/2: set up (first time only) and run the default evolution campaign, offline.
# Extra arguments go to `ratchet campaign run` (e.g. ./run.sh --rounds 3).
set -euo pipefail
cd "$(dirname "$0")"
scripts/bootstrap.sh
exec .venv/bin/ratchet campaign run "$@"
