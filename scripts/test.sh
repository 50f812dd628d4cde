#!/usr/bin/env bash
# The test command: installs the Debian packages, builds, and runs every test except those labelled gpu.
# Extra arguments go to ctest (e.g. scripts/test.sh -L unit, or -R Attention). Without them the quick sanitizer
# pass follows (scripts/sanitize.sh --quick); --sanitize runs only the whole sanitizer pass.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
scripts/setup.sh
# The tree is formatted as .clang-format says (scripts/format.sh fixes it): checked first, it takes a second.
scripts/format.sh --check
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
# The tests' scratch directories under the build directory, apart from any other run's.
export TEST_TMPDIR="$PWD/tmp"
mkdir -p "$TEST_TMPDIR"
ctest --output-on-failure -LE gpu --timeout 1200 "$@" | tee ctest.log
summary=$(grep -m1 'tests passed' ctest.log || true)
# Green: its scratch directories (checkpoints, runs) go before the next build needs the disk.
rm -rf "$TEST_TMPDIR"
if (($# == 0)); then
  "$root"/scripts/sanitize.sh --quick
fi

# The fuzz targets (tests/fuzz, README "Robustness"): a clang build under ASan and UBSan in build-fuzz, then a
# bounded run of each. Part of the whole suite (no ctest arguments); HR_FUZZ=0 skips it, HR_FUZZ=1 forces it.
if [[ ${HR_FUZZ:-$(($# == 0))} == 1 ]]; then
  cd "$root"
  scripts/fuzz.sh --build
  ctest --test-dir "${HR_FUZZ_BUILD_DIR:-build-fuzz}" --output-on-failure -L fuzz
fi
if (($# == 0)); then
  echo "test: main suite: $summary"
fi
