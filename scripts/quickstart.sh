#!/usr/bin/env bash
# The run command: installs the Debian packages, builds, and runs headroom's main job on its defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh -DHR_BUILD_TESTS=OFF
hr=${HR_BUILD_DIR:-build}/train/headroom
"$hr" info
echo
"$hr" demo oom --capacity 64MiB
