#!/usr/bin/env bash
# The run command: installs the Debian packages, builds, and trains on the embedded default (the synthetic
# VQA set, generated on first use, on the CPU). Extra arguments go to `headroom train` (e.g. --set ...).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh -DHR_BUILD_TESTS=OFF
"${HR_BUILD_DIR:-build}"/train/headroom train configs/quickstart.yaml "$@"
