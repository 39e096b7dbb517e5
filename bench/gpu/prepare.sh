#!/usr/bin/env bash
# Download the wheels bench/gpu/run.sh needs on the device machine (bench/gpu/wheels.txt) into .whl/,
# for its Python (CPython 3.12, x86-64 manylinux), and keep .whl/ out of git. Run it here before the
# device call; the call carries .whl (docs/performance.md, "GPU (prepared)"). Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/../.."
exclude="$(git rev-parse --git-path info/exclude)"
mkdir -p "$(dirname "$exclude")"
grep -qx '/.whl/' "$exclude" 2>/dev/null || echo '/.whl/' >>"$exclude"
# Only this list: a wheel left from an older pin would be a second version, which stops the install there.
rm -rf .whl && mkdir .whl
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$p")
done
"${PYTHON:-python3}" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
  --python-version 3.12 --implementation cp "${platforms[@]}" -d .whl \
  -r <(grep -v '^\s*#' bench/gpu/wheels.txt | grep -v '^\s*$')
echo "prepare.sh: $(ls .whl/*.whl | wc -l) wheels, $(du -sm .whl | cut -f1) MiB in .whl/"
