#!/usr/bin/env bash
# Builds the libFuzzer targets (clang; every library under ASan and UBSan) into ${HR_FUZZ_BUILD_DIR:-build-fuzz}
# and runs one target, or only builds.
#   scripts/fuzz.sh TARGET SECONDS [libFuzzer flags]   e.g. scripts/fuzz.sh config 600, or image 0 -runs=1000000
#   scripts/fuzz.sh --build                            (scripts/test.sh then runs ctest -L fuzz in the build dir)
# TARGET is one of: safetensors safetensors_index dataset config image. A finding is written to
# build-fuzz/tests/fuzz/findings/TARGET-crash-* (or leak-, oom-, timeout-); rerun it with
# build-fuzz/tests/fuzz/fuzz_TARGET FILE.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${HR_FUZZ_BUILD_DIR:-build-fuzz}
if [[ $# -lt 1 || ($1 != --build && $# -lt 2) ]]; then
  sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
# -O1 as libFuzzer's docs advise: fast enough to fuzz, quick to build. No CUDA, MPI, tests or benchmarks.
CC=${HR_FUZZ_CC:-clang} CXX=${HR_FUZZ_CXX:-clang++} cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_FLAGS_RELEASE=-O1 -DHR_BUILD_FUZZ=ON -DHR_ENABLE_CUDA=OFF -DHR_BUILD_TESTS=OFF -DHR_BUILD_BENCH=OFF \
  -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON >/dev/null
cmake --build "$build" --target hr_fuzz -j "${HR_FUZZ_JOBS:-2}"
[[ $1 == --build ]] && exit 0

target=$1 seconds=$2
shift 2
dir=$build/tests/fuzz
[[ -x $dir/fuzz_$target ]] || { echo "fuzz: no target '$target'" >&2; exit 2; }
[[ -d $dir/corpus/seeds/$target ]] || "$dir/fuzz_make_seeds" "$dir/corpus/seeds" "$PWD"
mkdir -p "$dir/corpus/work/$target" "$dir/findings"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  "$dir/fuzz_$target" -max_total_time="$seconds" -max_len=65536 -malloc_limit_mb=1024 -rss_limit_mb=2048 \
  -timeout=20 -print_final_stats=1 -artifact_prefix="$dir/findings/$target-" "$@" \
  "$dir/corpus/work/$target" "$dir/corpus/seeds/$target"
