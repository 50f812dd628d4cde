#!/usr/bin/env bash
# The test command: installs the Debian packages, builds, and runs every test except those labelled gpu.
# Extra arguments go to ctest (e.g. scripts/test.sh -L unit, or -R Attention). Without them the quick sanitizer
# pass follows (scripts/sanitize.sh --quick); --sanitize runs only the whole sanitizer pass.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
scripts/setup.sh
if [[ "${1:-}" == --sanitize ]]; then
  shift
  exec scripts/sanitize.sh "$@"
fi
scripts/build.sh
cd "${HR_BUILD_DIR:-build}"
if [[ -f isa_levels.txt ]]; then
  { read -r top; read -r reruns; } < isa_levels.txt
  echo "test: oneDNN ISA levels: the plain run at this CPU's ${top:-?}; the exactness tests (isa.* tests) again at: ${reruns:-none}"
fi
ctest --output-on-failure -LE gpu --timeout 1200 "$@" | tee ctest.log
if (($# == 0)); then
  "$root"/scripts/sanitize.sh --quick
  echo "test: main suite: $(grep -m1 'tests passed' ctest.log)"
fi
