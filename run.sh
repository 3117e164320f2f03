#!/usr/bin/env bash
# Quick start 1/2: set up (first time only) and run the default evolution campaign, offline.
# With no arguments it is `dvc repro` (benchmark -> campaign -> report): DVC runs the stages and keeps their outputs
# in its cache, so `dvc status` is clean afterwards and `git checkout ... && dvc checkout` can restore them. (Running
# `ratchet campaign run` by hand writes the same bytes but leaves them "not in cache".)
# Extra arguments go to `ratchet campaign run` instead (e.g. ./run.sh --rounds 3 --out runs/three): a run DVC does not
# track; prefer `dvc exp run -S campaign.rounds=3` for a variant of the default campaign.
set -euo pipefail
cd "$(dirname "$0")"
scripts/bootstrap.sh
export PATH="$PWD/.venv/bin:$PATH"
if [ "$#" -eq 0 ]; then
  exec dvc repro
fi
exec ratchet campaign run "$@"
