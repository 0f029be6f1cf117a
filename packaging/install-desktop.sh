#!/usr/bin/env bash
# Adds MemFit to the desktop's application menu for the current user: the desktop entry
# into ~/.local/share/applications and the icons into ~/.local/share/icons/hicolor
# ($XDG_DATA_HOME instead of ~/.local/share when it is set).
#
#   bash install-desktop.sh [--exec PROGRAM]   install (or update)
#   bash install-desktop.sh --uninstall         remove what install put there
#
# Which program the menu entry starts:
# * --exec PROGRAM, when given (e.g. --exec ~/apps/memfit/memfit);
# * else, run from a built bundle (dist/memfit/install-desktop.sh), that bundle's memfit;
# * else the entry keeps Exec=memfit, the console script on PATH (pip/pipx install).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"

EXEC=""
UNINSTALL=0
while [ $# -gt 0 ]; do
  case "$1" in
    --exec) EXEC="${2:?--exec needs a program}"; shift 2 ;;
    --uninstall) UNINSTALL=1; shift ;;
    -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "install-desktop.sh: unknown option $1" >&2; exit 2 ;;
  esac
done

# the files (resources/: the icons and the desktop entry), from a source checkout
# (packaging/) or from a bundle (its top folder, the data under _internal/)
if [ -f "$here/../resources/icons/memfit.svg" ]; then
  resources="$here/../resources"
elif [ -f "$here/_internal/memfit/resources/icons/memfit.svg" ]; then
  resources="$here/_internal/memfit/resources"
  [ -n "$EXEC" ] || { [ -x "$here/memfit" ] && EXEC="$here/memfit"; }
else
  echo "install-desktop.sh: cannot find MemFit's resources/icons next to $here" >&2
  exit 2
fi
icons="$resources/icons"
desktop_file="$resources/desktop/memfit.desktop"

data="${XDG_DATA_HOME:-$HOME/.local/share}"
apps="$data/applications"
theme="$data/icons/hicolor"
SIZES=(16 32 48 64 128 256 512)

refresh() {
  if command -v update-desktop-database >/dev/null 2>&1; then
    update-desktop-database -q "$apps" || true
  fi
  if command -v gtk-update-icon-cache >/dev/null 2>&1 && [ -f "$theme/index.theme" ]; then
    gtk-update-icon-cache -q -t "$theme" || true
  fi
}

if [ "$UNINSTALL" = 1 ]; then
  rm -f "$apps/memfit.desktop" "$theme/scalable/apps/memfit.svg"
  for n in "${SIZES[@]}"; do rm -f "$theme/${n}x${n}/apps/memfit.png"; done
  refresh
  echo "removed MemFit from $apps and $theme"
  exit 0
fi

mkdir -p "$apps" "$theme/scalable/apps"
for n in "${SIZES[@]}"; do
  install -D -m 644 "$icons/hicolor/${n}x${n}/apps/memfit.png" "$theme/${n}x${n}/apps/memfit.png"
done
install -m 644 "$icons/memfit.svg" "$theme/scalable/apps/memfit.svg"

if [ -n "$EXEC" ]; then
  [ -x "$EXEC" ] || { echo "install-desktop.sh: $EXEC is not an executable program" >&2; exit 2; }
  EXEC="$(cd "$(dirname "$EXEC")" && pwd)/$(basename "$EXEC")"
  case "$EXEC" in
    *[\"\`\$\\%]*) echo "install-desktop.sh: move $EXEC to a path without \" \` \$ \\ or %" >&2
                exit 2 ;;
  esac
  # the desktop entry specification quotes a program path with spaces in double quotes
  exec_line="Exec=$EXEC"
  [[ "$EXEC" == *[[:space:]]* ]] && exec_line="Exec=\"$EXEC\""
  while IFS= read -r line || [ -n "$line" ]; do
    case "$line" in
      Exec=*) printf '%s\n' "$exec_line" ;;
      *) printf '%s\n' "$line" ;;
    esac
  done < "$desktop_file" > "$apps/memfit.desktop.tmp"
else
  cp "$desktop_file" "$apps/memfit.desktop.tmp"
  command -v memfit >/dev/null 2>&1 ||
    echo "note: 'memfit' is not on PATH; give the program with --exec PROGRAM" >&2
fi
chmod 644 "$apps/memfit.desktop.tmp"
mv "$apps/memfit.desktop.tmp" "$apps/memfit.desktop"
refresh
echo "installed $apps/memfit.desktop ($(grep '^Exec=' "$apps/memfit.desktop"))"
echo "installed icons into $theme"
