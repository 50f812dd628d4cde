#!/usr/bin/env bash
# The sanitizer pass: builds headroom with AddressSanitizer + UndefinedBehaviorSanitizer (CPU back-end, into
# ${HR_ASAN_BUILD_DIR:-build-asan}) and runs the unit, integration and mpi labels under it (not isa: the same
# binaries under lower oneDNN ISA levels). Any sanitizer report fails the pass. Extra arguments go to ctest.
# --quick (what scripts/test.sh runs by default): the unit label and the integration tests but the five long
# training runs (the planned allocator's over every strategy combination took 208 s under ASan on a Zen 3), no mpi
# label.
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
if [[ "${1:-}" == --quick ]]; then
  quick=1
  shift
fi
root=$PWD
build=${HR_ASAN_BUILD_DIR:-build-asan}
# -g1: line tables only, enough for the reports' file:line frames; full debug info doubles the build (4.5 GB
# against 2.2 GB) and its link time. -O1 (what the sanitizers' own documentation suggests) compiles the test,
# training and parsing code about 40% faster than -O2 under the sanitizers' instrumentation; hr_core, where the
# tests spend their time in kernels, keeps -O2 (core/CMakeLists.txt).
HR_BUILD_DIR=$build scripts/build.sh -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" \
  -DHR_ENABLE_CUDA=OFF -DHR_BUILD_BENCH=OFF -DHR_SANITIZE=ON

# Reports also go to files, one per process: a test that expects a child process (headroom, an MPI rank) to
# fail would not otherwise notice that it failed for a sanitizer's reason.
logs=$root/$build/sanitizer-logs
rm -rf "$logs"
mkdir -p "$logs"
asan="detect_leaks=1:halt_on_error=1:check_initialization_order=1:log_path=$logs/asan"
export ASAN_OPTIONS=$asan
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:log_path=$logs/ubsan"
export LSAN_OPTIONS="suppressions=$root/scripts/lsan.supp:print_suppressions=0"
# The tests' scratch directories (testing::TempDir) apart from those of a plain run in /tmp.
export TEST_TMPDIR=$root/$build/tmp
mkdir -p "$TEST_TMPDIR"
# mpirun passes its environment to the ranks it starts on this machine (another host would need -x).

cd "$build"
status=0
skip=()
((quick)) && skip=(-E 'Plan\.DryRunPeaks|Plan\.MaxMicroBatch|Plan\.ThePlannedAllocatorReserves|Train\.Bf16AndFp32|Train\.Fp16LossScaling')
ctest --output-on-failure -j 2 --timeout 1200 -L 'unit|integration' -LE 'gpu|isa|mpi' "${skip[@]}" "$@" || status=1
# OpenMPI's libraries have no frame pointers: the slow unwinder lets the suppressions see MPI_Init_thread.
if ((!quick)) && [[ -n $(ctest -N -L mpi -LE 'gpu|isa' "$@" | grep -m1 'Test *#') ]]; then
  ASAN_OPTIONS="$asan:fast_unwind_on_malloc=0" ctest --output-on-failure --timeout 1200 -L mpi -LE 'gpu|isa' "$@" ||
    status=1
fi
if compgen -G "$logs/*" > /dev/null; then
  for f in "$logs"/*; do
    echo "sanitize: report $f"
    cat "$f"
  done
  status=1
fi
if ((status)); then
  echo "sanitize: FAILED (reports, if any, above and in $logs)"
else
  rm -rf "$TEST_TMPDIR"  # green: its scratch directories go; a failure keeps them to look at
  echo "sanitize: clean (ASan, LSan, UBSan)"
fi
exit "$status"
