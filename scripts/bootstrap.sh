#!/usr/bin/env bash
# Create .venv and install Ratchet (with test extras) into it; skipped when pyproject.toml has not changed and the
# extras asked for are already installed.
# RATCHET_EXTRAS (default `test`) picks the extras, e.g. `test,postgres` in CI (.ci/run); the stamp records the
# extras installed with this pyproject.toml, so a run asking for extras not yet installed installs again.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-$(command -v python3.11 || command -v python3)}"
"$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Ratchet needs Python >= 3.11")'
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.ratchet-installed
extras="${RATCHET_EXTRAS:-test}"
want="$(sha256sum pyproject.toml | cut -d' ' -f1)"
have=""  # the extras installed with this very pyproject.toml (stamp: its hash, then the extras, one a line)
if [ -f "$stamp" ] && [ "$(head -n 1 "$stamp")" = "$want" ]; then
  have="$(tail -n +2 "$stamp")"
  have="${have:-test}"  # a stamp of the hash alone was written by an install of `.[test]`
fi
missing="$(tr ',' '\n' <<<"$extras" | grep -vxF -f <(printf '%s\n' "$have") || true)"
# an extra's requirements that install without their own dependencies (pyproject.toml [tool.ratchet.no-deps])
install_no_deps() {
  local reqs
  reqs="$(.venv/bin/python - "$extras" <<'PY'
import sys, tomllib
table = tomllib.load(open("pyproject.toml", "rb")).get("tool", {}).get("ratchet", {}).get("no-deps", {})
print(" ".join(r for extra in sys.argv[1].split(",") for r in table.get(extra, [])))
PY
)"
  if [ -n "$reqs" ]; then
    .venv/bin/python -m pip install --disable-pip-version-check --no-deps $reqs
  fi
}
if [ -z "$have" ] || [ -n "$missing" ]; then
  echo "installing Ratchet and its pinned dependencies into .venv (about two minutes, once)..." >&2
  log=.venv/install.log
  if ! { .venv/bin/python -m pip install --disable-pip-version-check --upgrade pip &&
         .venv/bin/python -m pip install --disable-pip-version-check -e ".[$extras]" &&
         install_no_deps; } >"$log" 2>&1; then
    tail -n 40 "$log" >&2
    echo "installation failed; the whole log is in $log" >&2
    exit 1
  fi
  printf '%s\n' "$want" $have $(tr ',' ' ' <<<"$extras") | awk '!seen[$0]++' > "$stamp"
fi
