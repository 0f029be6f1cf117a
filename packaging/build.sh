#!/usr/bin/env bash
# Builds the MemFit desktop bundle with PyInstaller: dist/memfit/ (run dist/memfit/memfit).
#
#   bash packaging/build.sh             one folder, dist/memfit/
#   bash packaging/build.sh --onefile   one executable, dist/onefile/memfit
#
# Uses ./.venv (made by install.sh); installs the "package" extra (PyInstaller) into it
# when missing. Check the result with: dist/memfit/memfit --selftest /tmp/memfit-selftest
set -euo pipefail
cd "$(dirname "$0")/.."

ONEFILE=0
for arg in "$@"; do
  case "$arg" in
    --onefile) ONEFILE=1 ;;
    -h|--help) sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "build.sh: unknown option $arg (use --onefile or nothing)" >&2; exit 2 ;;
  esac
done

PY=.venv/bin/python
if [ ! -x "$PY" ]; then
  echo "build.sh: no .venv here; run 'bash install.sh' first" >&2
  exit 2
fi

# the pinned PyInstaller of pyproject's "package" extra (the editable install refreshes
# the package metadata too, so the bundle's version is pyproject's; "strict" as install.sh)
want=$("$PY" - <<'EOF'
import re, tomllib
extra = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["package"]
print(next(re.sub(r"^pyinstaller==", "", r) for r in extra if r.startswith("pyinstaller==")))
EOF
)
have=$("$PY" -c 'from importlib.metadata import version; print(version("pyinstaller"))' 2>/dev/null || true)
if [ "$have" != "$want" ]; then
  echo "installing PyInstaller $want into .venv"
  "$PY" -m pip install -q --disable-pip-version-check -e ".[package]" \
    --config-settings editable_mode=strict
fi

start=$(date +%s)
if [ "$ONEFILE" = 1 ]; then
  "$PY" -m PyInstaller --noconfirm --clean --log-level WARN \
    --distpath dist/onefile --workpath build/pyinstaller-onefile packaging/memfit.spec -- --onefile
  target=dist/onefile/memfit
else
  "$PY" -m PyInstaller --noconfirm --clean --log-level WARN \
    --distpath dist --workpath build/pyinstaller packaging/memfit.spec
  target=dist/memfit
  # desktop integration travels with the bundle: dist/memfit/install-desktop.sh (the
  # desktop entry and the icons are the bundle's data)
  cp packaging/install-desktop.sh "$target/"
fi
seconds=$(( $(date +%s) - start ))

size=$(du -sh "$target" | cut -f1)
echo "built $target ($size) in ${seconds} s"
if [ "$ONEFILE" = 1 ]; then
  echo "run it: $target     check it: $target --selftest /tmp/memfit-selftest"
else
  echo "run it: $target/memfit     check it: $target/memfit --selftest /tmp/memfit-selftest"
  echo "add it to the desktop menu: bash $target/install-desktop.sh"
fi
