#!/usr/bin/env bash
# Take docs/screenshots/ again, in one command, on the campaign in runs/campaign (docs/records.md, "Screenshots"):
# run it whenever the default campaign's results change (a new champion, other rounds). It installs what it lacks
# (Debian's Chromium, Playwright's Python package into .venv: it drives that Chromium, no browser download), runs
# `dvc repro`, queues and runs the 3-round experiment `r3` when there is none, writes `dvc plots diff HEAD r3`, and
# takes every screenshot (scripts/screenshots.py). Extra arguments go to scripts/screenshots.py.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
export PATH="$PWD/.venv/bin:$PATH"
if [ ! -x /usr/bin/chromium ]; then
  apt-get install -y chromium >/dev/null
fi
if ! .venv/bin/python -c "import playwright" 2>/dev/null; then
  .venv/bin/pip install --quiet playwright==1.65.2
fi
dvc repro
if ! dvc exp show --json 2>/dev/null | grep -q '"r3"'; then
  dvc exp run --queue -S campaign.rounds=3 -n r3
  dvc exp run --run-all
fi
dvc plots diff HEAD r3 -o dvc_plots >/dev/null
exec .venv/bin/python scripts/screenshots.py docs/screenshots --plots-html dvc_plots/index.html "$@"
