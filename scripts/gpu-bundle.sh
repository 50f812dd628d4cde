#!/usr/bin/env bash
# Packs what a GPU machine needs to check headroom in one call (README "GPU bundle"): the binaries (headroom, the
# gpu-labelled test executables, the benchmarks) and every shared library they load that a bare CUDA machine
# lacks (oneDNN, yaml-cpp, SentencePiece, Open MPI with its plugins and help files, OpenMP, ...), plus
# check.sh, which runs everything there, and the configs. Not packed: the CUDA driver and toolkit libraries
# (libcuda, cudart, cuBLAS, NCCL, cuDNN: the machine's own, or its pip nvidia-* packages, are used) and the
# C/C++ runtime (glibc, libstdc++, libgcc_s).
# The directory is also packed as OUT_DIR.tar.xz, which is what travels (a device call carries at most 64 MiB;
# oneDNN alone is 40 MB unpacked): on the GPU machine, `tar -xJf gpu-bundle.tar.xz && gpu-bundle/check.sh OUT`.
# Usage: scripts/gpu-bundle.sh [OUT_DIR]   (default gpu-bundle; HR_BUILD_DIR names the CUDA build, default build;
#        HR_BUNDLE_NO_BUILD=1 packs what is built without building)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/gpu-bundle}
build=${HR_BUILD_DIR:-$root/build}
limit_mib=60

if [[ ${HR_BUNDLE_NO_BUILD:-0} != 1 ]]; then
  [[ -f $build/build.ninja ]] || "$root/scripts/build.sh"
  cmake --build "$build" -j "$(nproc)" --target headroom
  cmake --build "$build" -j "$(nproc)" --target test_ops_cuda test_cuda_kernels test_cuda_train test_cuda_memory test_nccl \
    bench_ops bench_generate 2>/dev/null ||
    cmake --build "$build" -j "$(nproc)" --target test_ops_cuda
fi
[[ -x $build/tests/test_ops_cuda ]] || {
  echo "gpu-bundle: $build has no CUDA build (tests/test_ops_cuda); configure with nvcc on the PATH" >&2
  exit 1
}

rm -rf "$out"
mkdir -p "$out/bin" "$out/lib" "$out/configs"
for b in train/headroom tests/test_ops_cuda tests/test_cuda_kernels tests/test_cuda_train tests/test_cuda_memory tests/test_nccl tests/bench/bench_ops tests/bench/bench_generate; do
  [[ -x $build/$b ]] && install -m 755 "$build/$b" "$out/bin/"
done
strip --strip-unneeded "$out"/bin/*
cp "$root"/configs/*.yaml "$out/configs/"
mkdir -p "$out/configs/bench"
cp "$root"/tests/bench/configs/*.yaml "$out/configs/bench/"
cp "$root/scripts/gpu/check.sh" "$root/scripts/gpu/summarize.py" "$root/scripts/gpu/env.sh" "$root/scripts/torch_twin.py" "$out/"

# shellcheck source=gpu/provided.sh
source "$root/scripts/gpu/provided.sh"
# Copies the libraries `$1` loads (and theirs, as ldd lists the whole closure) into lib/.
gather() {
  ldd "$1" | awk '/=> \// {print $3}' | while read -r lib; do
    hr_provided_library "$lib" && continue
    [[ -e $out/lib/$(basename "$lib") ]] || cp -L "$lib" "$out/lib/"
  done
}
for b in "$out"/bin/*; do gather "$b"; done
# Open MPI: its MCA plugins (loaded at MPI_Init, not linked), their libraries, mpirun/orted and the help texts.
ompi_plugins=$(dirname "$(readlink -f "$(ldconfig -p | awk '/libmpi.so.40 / {print $NF; exit}')")")/openmpi/lib/openmpi3
[[ -d $ompi_plugins ]] || ompi_plugins=/usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3
if [[ -d $ompi_plugins ]]; then
  mkdir -p "$out/lib/openmpi3"
  cp -L "$ompi_plugins"/*.so "$out/lib/openmpi3/" 2>/dev/null || true
  for p in "$out"/lib/openmpi3/*.so; do gather "$p"; done
  for t in mpirun orterun orted; do
    command -v $t > /dev/null && install -m 755 "$(readlink -f "$(command -v $t)")" "$out/bin/$t" && gather "$out/bin/$t"
  done
  [[ -d /usr/share/openmpi ]] && cp -r /usr/share/openmpi "$out/share-openmpi"
fi
strip --strip-unneeded "$out"/lib/*.so* "$out"/lib/openmpi3/*.so 2>/dev/null || true
{
  echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) from $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?')"
  echo "on $(uname -m), $(. /etc/os-release && echo "$PRETTY_NAME"), $(ldd --version | head -1)"
} > "$out/BUILD"
tar -C "$(dirname "$out")" -cf - "$(basename "$out")" | xz -T"$(nproc)" -6 > "$out.tar.xz"
mib=$(du -sm "$out" | cut -f1) packed=$(du -m "$out.tar.xz" | cut -f1)
echo "gpu-bundle: $out: $(ls "$out/bin" | wc -l) programs, $(find "$out/lib" -name '*.so*' | wc -l) libraries," \
  "$mib MiB; packed as $out.tar.xz, $packed MiB"
if ((packed > limit_mib)); then
  echo "gpu-bundle: $out.tar.xz is $packed MiB, above the $limit_mib MiB a device call carries" >&2
  exit 1
fi
