#!/usr/bin/env bash
# The GPU bundle (scripts/gpu-bundle.sh) is self-contained and runs: packed from the CUDA build BUILD_DIR into
# WORK_DIR, unpacked from its archive, every program's and library's dependencies resolve either inside the
# bundle or to what a GPU machine provides (the CUDA driver and toolkit, the C/C++ runtime), and its headroom
# trains the CPU smoke run with a scrubbed environment, its libraries from the bundle alone.
# Usage: gpu_bundle.sh BUILD_DIR WORK_DIR
set -euo pipefail
build=$1 work=$2
root=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=../../scripts/gpu/provided.sh
source "$root/scripts/gpu/provided.sh"
rm -rf "$work"
mkdir -p "$work/unpacked"
HR_BUILD_DIR=$build HR_BUNDLE_NO_BUILD=1 bash "$root/scripts/gpu-bundle.sh" "$work/gpu-bundle"
tar -C "$work/unpacked" -xJf "$work/gpu-bundle.tar.xz"
b=$work/unpacked/gpu-bundle
for f in check.sh env.sh BUILD bin/headroom bin/test_ops_cuda configs/quickstart.yaml; do
  [[ -e $b/$f ]] || { echo "gpu_bundle: FAIL: the bundle has no $f"; exit 1; }
done
bad=0 checked=0
while read -r f; do
  checked=$((checked + 1))
  while read -r name arrow path _; do
    [[ $arrow == "=>" ]] || continue
    if [[ $path == "not" ]]; then  # "not found"
      hr_provided_library "$name" || { echo "gpu_bundle: FAIL: $f needs $name, which is neither bundled nor provided"; bad=1; }
    elif [[ $path != "$b/lib/"* ]] && ! hr_provided_library "$path"; then
      echo "gpu_bundle: FAIL: $f loads $path from outside the bundle"
      bad=1
    fi
  done < <(LD_LIBRARY_PATH=$b/lib ldd "$f" 2> /dev/null || true)
done < <(find "$b/bin" "$b/lib" -type f \( -perm -u+x -o -name '*.so*' \))
((bad == 0)) || exit 1
echo "gpu_bundle: $checked programs and libraries resolve inside the bundle or to the CUDA and C/C++ runtimes"
# The CPU smoke run from the bundle alone: no PATH but the system's, no LD_LIBRARY_PATH but the bundle's.
mkdir -p "$work/smoke"
env -i HOME="$work" PATH=/usr/bin:/bin bash -c "source '$b/env.sh' && cd '$work/smoke' && headroom train '$b/configs/quickstart.yaml' \
  --set run.output_dir='$work/smoke/run' --set data.synthetic.train=32 --set data.synthetic.eval=4 --set train.max_steps=3 \
  --set train.eval_steps=0 --set train.save_steps=0 --set log.progress_bar=false --set log.logging_steps=1" > "$work/smoke.log" 2>&1 ||
  { tail -20 "$work/smoke.log"; echo "gpu_bundle: FAIL: the bundle's headroom did not train"; exit 1; }
steps=$(wc -l < "$work/smoke/run/memory.jsonl")
[[ $steps == 3 ]] || { echo "gpu_bundle: FAIL: $steps lines in memory.jsonl, expected 3"; exit 1; }
echo "gpu_bundle: the bundle's headroom trained 3 CPU steps; $(du -m "$work/gpu-bundle.tar.xz" | cut -f1) MiB packed"
