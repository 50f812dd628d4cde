#!/usr/bin/env bash
# Configures and builds headroom (with the CUDA back-end when nvcc is present) into ${HR_BUILD_DIR:-build}.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${HR_BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DHR_WERROR=ON "$@"
cmake --build "$build" -j "$(nproc)"
