#!/usr/bin/env bash
# The test command: installs the Debian packages, builds, and runs every test except those labelled gpu.
# Extra arguments go to ctest (e.g. scripts/test.sh -L unit, or -R Attention).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
cd "${HR_BUILD_DIR:-build}"
ctest --output-on-failure -LE gpu --timeout 1200 "$@"
