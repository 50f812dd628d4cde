#!/usr/bin/env bash
# The run command: installs the Debian packages, builds, and trains on the embedded default (the synthetic
# VQA set, generated on first use, on the CPU) with 2 MPI ranks. Extra arguments go to `headroom train`
# (e.g. --set ...); HR_RANKS=N changes the number of ranks.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# The main job runs on the CPU: its build leaves out the tests and the CUDA back-end (the test command builds
# both), in a build directory of its own so that neither command rebuilds the other's.
export HR_BUILD_DIR=${HR_BUILD_DIR:-build-cpu}
scripts/build.sh -DHR_BUILD_TESTS=OFF -DHR_ENABLE_CUDA=OFF
# Open MPI refuses root without these, and more ranks than cores without --oversubscribe.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
exec mpirun --oversubscribe -np "${HR_RANKS:-2}" "$HR_BUILD_DIR"/train/headroom train configs/quickstart.yaml "$@"
