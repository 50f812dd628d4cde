#!/usr/bin/env bash
# Installs every Debian package headroom needs to build, test and run. Idempotent.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  libdnnl-dev libeigen3-dev libyaml-cpp-dev nlohmann-json3-dev libstb-dev zlib1g-dev
  libopenmpi-dev openmpi-bin
  libgtest-dev libgmock-dev libbenchmark-dev
  clang libclang-rt-14-dev libomp-dev  # the fuzz build (tests/fuzz): libFuzzer, ASan, UBSan, OpenMP for clang
)
# python3-torch only generates golden files; the tests read the committed files.
if [[ "${HR_WITH_TORCH:-0}" == 1 ]]; then packages+=(python3-torch python3-numpy); fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo_cmd=""
  [[ $(id -u) -ne 0 ]] && sudo_cmd="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo_cmd apt-get update -qq
  $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
echo "setup: all packages present (${#packages[@]})"
