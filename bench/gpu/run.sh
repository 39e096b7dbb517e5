#!/usr/bin/env bash
# The GPU check (issue 48): every part on one GPU in one run, one JSON and one markdown table.
#
#   bench/gpu/run.sh --out DIR             on the device (docs/performance.md, "GPU (prepared)")
#   bench/gpu/run.sh --dry-run --out DIR   the same parts on the CPU at toy size (tests/bench/test_bench_gpu.py)
#
# Needs only torch, transformers and peft where it runs: wheels in .whl/ (bench/gpu/prepare.sh) are
# installed into a scratch folder first (not on a dry run: they are built for the device's Python), and
# forge is imported from this checkout through a folder of links (the openforge.<folder> namespace
# that setup.py installs), so nothing is installed into the machine's environment.
# PYTHON: the interpreter (default python3).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
DRY=""
OUT=""
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY=1 ;;
    --out) OUT="$2"; shift ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "bench/gpu/run.sh: unknown option $1 (try --help)" >&2; exit 2 ;;
  esac
  shift
done
[ -n "$OUT" ] || { echo "bench/gpu/run.sh: --out DIR is required" >&2; exit 2; }
# Scratch (checkpoints: 3.4 GB + 15 GB on the GPU run): memory-backed /dev/shm when it has the room,
# so writing and reading the random checkpoints costs seconds, not the disk's minutes.
BASE="${TMPDIR:-/tmp}"
if [ -z "$DRY" ] && [ -z "${TMPDIR:-}" ] && [ "$(df --output=avail -BG /dev/shm 2>/dev/null | tail -1 | tr -dc 0-9)" -ge 40 ] 2>/dev/null; then
  BASE=/dev/shm
fi
WORK="$(mktemp -d "$BASE/forge-gpu.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
started=$(date +%s)

SITE=""
if [ -z "$DRY" ] && compgen -G ".whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --disable-pip-version-check \
    --target "$WORK/site" .whl/*.whl
  SITE="$WORK/site"
fi

# openforge.<folder> -> ./<folder>, as setup.py maps them (its FOLDERS list), plus openforge/ itself.
mkdir -p "$WORK/ns/openforge"
for f in openforge/*; do ln -s "$ROOT/$f" "$WORK/ns/openforge/"; done
for d in $(sed -n 's/^FOLDERS = \[\(.*\)\]/\1/p' setup.py | tr -d '",'); do ln -s "$ROOT/$d" "$WORK/ns/openforge/$d"; done
export PYTHONPATH="$WORK/ns:$ROOT${SITE:+:$SITE}${PYTHONPATH:+:$PYTHONPATH}"
# No current folder first on sys.path (Python >= 3.11), in this process and its children (torchrun's
# too): ./openforge would shadow the namespace, and only an editable install would paper over that.
export PYTHONSAFEPATH=1
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1

rc=0
"$PY" -m bench.gpu.main --out "$OUT" --work "$WORK/scratch" ${DRY:+--dry-run} || rc=$?
echo "bench/gpu/run.sh: done in $(( $(date +%s) - started )) s (exit $rc); $OUT/gpu.json, $OUT/gpu.md"
exit $rc
