#!/usr/bin/env bash
# Installs MemFit into ./.venv on a fresh Debian/Ubuntu machine (system libraries for
# offscreen/desktop Qt when run as root with apt), then the app with its dev tools.
set -euo pipefail
cd "$(dirname "$0")"

APT_PACKAGES=(libgl1 libegl1 libglib2.0-0 libfontconfig1 fontconfig-config fonts-dejavu-core
              libdbus-1-3 libxkbcommon0 libxkbcommon-x11-0 libxcb-cursor0 libxcb-icccm4
              libxcb-keysyms1 binutils python3-venv)
if command -v apt-get >/dev/null 2>&1 && command -v dpkg >/dev/null 2>&1; then
  missing=()
  for pkg in "${APT_PACKAGES[@]}"; do
    dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
  done
  if [ "${#missing[@]}" -gt 0 ]; then
    if [ "$(id -u)" -eq 0 ]; then
      echo "installing system packages: ${missing[*]}"
      apt-get update -qq
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    else
      echo "note: missing system packages (install them as root): ${missing[*]}" >&2
    fi
  fi
fi

PYTHON="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
# The checkout's engine/, gui/ and resources/ install as memfit.engine, memfit.gui and
# memfit.resources. "strict" links each file under build/__editable__.memfit-*/memfit/, a
# folder on sys.path that mypy and import-linter can read too (the default mode's import
# hook hides the packages from them); a module added later needs this script run again
# (the tests say so).
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[dev]" \
  --config-settings editable_mode=strict
# The modules' bytecode, written here as pip writes an installed package's: the first run
# then starts as fast as every later one.
.venv/bin/python -m compileall -q build/__editable__.memfit-*/memfit
echo "MemFit installed in .venv (start it with .venv/bin/memfit)"
