#!/usr/bin/env bash
# Set up OpenForge in ./.venv. Safe to run again: it only installs what is missing or changed.
#   ./install.sh          the tool (runs `forge up --demo`)
#   ./install.sh --dev    the tool plus what the test suite needs
set -euo pipefail
cd "$(dirname "$0")"

PYTHON="${PYTHON:-python3}"
EXTRAS=""
for arg in "$@"; do
  case "$arg" in
    --dev) EXTRAS="[dev]" ;;
    -h|--help) sed -n '2,4p' "$0"; exit 0 ;;
    *) echo "install.sh: unknown option $arg (try --help)" >&2; exit 2 ;;
  esac
done

if ! "$PYTHON" -c 'import sys; sys.exit(0 if (3, 11) <= sys.version_info[:2] < (3, 13) else 1)'; then
  echo "install.sh: OpenForge needs Python 3.11 or 3.12 (found $("$PYTHON" --version 2>&1)); set PYTHON=..." >&2
  exit 1
fi

if [ ! -x .venv/bin/python ]; then
  echo "==> creating .venv"
  "$PYTHON" -m venv .venv
fi
PIP=(.venv/bin/python -m pip --disable-pip-version-check -q)

# torch first, pinned: an unpinned torch would pull a multi-GB CUDA build. 2.13.0 is the CPU wheel here.
if ! .venv/bin/python -c 'import torch, sys; sys.exit(0 if torch.__version__.startswith("2.13.0") else 1)' 2>/dev/null; then
  echo "==> installing torch 2.13.0 (CPU)"
  "${PIP[@]}" install "torch==2.13.0"
fi

# Local sandboxes refuse to run unisolated: bubblewrap is what isolates them.
if ! command -v bwrap >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "==> installing bubblewrap (isolates local sandboxes)"
    apt-get install -y -q bubblewrap >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q bubblewrap >/dev/null; } \
      || echo "install.sh: could not install bubblewrap; local rollouts will refuse to run (use Docker, or install it)" >&2
  else
    echo "install.sh: bubblewrap is missing: install it (e.g. sudo apt-get install bubblewrap, or dnf install bubblewrap);" >&2
    echo "            local rollouts refuse to run without it (or use sandbox.type = \"docker\")" >&2
  fi
fi

# GUI rollouts (browser and desktop tasks, builtin-web): a display, a browser, input, fonts. Optional:
# without them only GUI rollouts are refused (`forge doctor` says so).
GUI_PKGS="chromium xvfb xdotool fonts-dejavu-core"
if ! { command -v chromium && command -v Xvfb && command -v xdotool; } >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "==> installing $GUI_PKGS (GUI rollouts)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q $GUI_PKGS >/dev/null 2>&1 \
      || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $GUI_PKGS >/dev/null; } \
      || echo "install.sh: could not install $GUI_PKGS; GUI rollouts (builtin-web) will be refused" >&2
  else
    echo "install.sh: for GUI rollouts (builtin-web) install $GUI_PKGS (e.g. sudo apt-get install $GUI_PKGS);" >&2
    echo "            everything else works without them" >&2
  fi
fi

echo "==> installing openforge${EXTRAS}"
"${PIP[@]}" install -e ".${EXTRAS}"
# setuptools maps openforge.<folder> onto the top-level folders with an import hook, which static readers
# (Pyright, jedi, import graphs) cannot run: a tree of links in the venv shows them the installed layout.
.venv/bin/python install_links.py

cat <<MSG

OpenForge is installed in $(pwd)/.venv.
Next:
  .venv/bin/forge up --demo        # tiny model, built-in tasks, GRPO + LoRA, live dashboard
  .venv/bin/forge doctor           # what this machine can run (Docker, GPU, harnesses)
  source .venv/bin/activate        # to type plain \`forge\`
MSG

