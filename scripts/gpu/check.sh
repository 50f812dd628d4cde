#!/usr/bin/env bash
# Everything a GPU machine can check of headroom in one call, from a bundle that scripts/gpu-bundle.sh packed:
# the GPU and library versions, whether every library resolves, `headroom info`, the gpu-labelled tests, a
# compute-sanitizer pass over the CUDA op table and over a short training run, a CPU smoke run, a training run on
# cuda:0 (its predicted and measured peaks), the benchmarks, and the GPU peer: `headroom bench` on a ~1.25B LLaVA
# (configs/bench/bench-1b-gpu.yaml) beside transformers' LlavaForConditionalGeneration on the same GPU
# (torch_twin.py --device cuda: bf16 autocast, SDPA attention, PyTorch's AdamW and caching allocator). Each step's output goes to OUTDIR/STEP.log (gtest and benchmark results
# also as JSON); OUTDIR/summary.json lists every step with its exit status and seconds. A failing step does not
# stop the others. Usage: check.sh OUTDIR
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: check.sh OUTDIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
# shellcheck source=/dev/null
source "$here/env.sh"
steps=()
step() {
  local name=$1
  shift
  local t0 t1 rc
  t0=$(date +%s.%N)
  (cd "$out" && "$@") > "$out/$name.log" 2>&1
  rc=$?
  t1=$(date +%s.%N)
  steps+=("{\"step\": \"$name\", \"exit\": $rc, \"seconds\": $(awk "BEGIN {printf \"%.2f\", $t1 - $t0}")}")
  echo "check: $name: exit $rc ($(tail -1 "$out/$name.log" | cut -c1-160))"
}
smoke() {  # a few steps of the quickstart model on a small synthetic set
  local dir=$1
  shift
  "$here/bin/headroom" train "$here/configs/quickstart.yaml" --set run.output_dir="$dir" --set data.synthetic.train=64 \
    --set data.synthetic.eval=8 --set train.max_steps=5 --set train.eval_steps=0 --set train.save_steps=0 \
    --set log.progress_bar=false --set log.logging_steps=1 "$@"
}
step gpu nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv
step versions bash -c "cat '$here/BUILD'; nvcc --version | tail -2; python3 -c 'import torch; print(\"torch\", torch.__version__, torch.version.cuda, \"cudnn\", torch.backends.cudnn.version())'"
step libraries bash -c "missing=0; for b in '$here'/bin/*; do ldd \"\$b\" | grep 'not found' | sed \"s|^|\$(basename \$b): |\" && missing=1; done; exit \$missing"
step info "$here/bin/headroom" info
step ops_cuda "$here/bin/test_ops_cuda" --gtest_output="json:$out/ops_cuda.json"
step ops_cuda_own_attention env HR_CUDNN_ATTENTION=0 "$here/bin/test_ops_cuda" \
  --gtest_output="json:$out/ops_cuda_own_attention.json"
[[ -x $here/bin/test_cuda_kernels ]] && step cuda_kernels "$here/bin/test_cuda_kernels" --gtest_output="json:$out/cuda_kernels.json"
[[ -x $here/bin/test_cuda_train ]] && step cuda_train env HR_HEADROOM="$here/bin/headroom" HR_MPIRUN="$here/bin/mpirun" "$here/bin/test_cuda_train" --gtest_output="json:$out/cuda_train.json"
[[ -x $here/bin/test_cuda_memory ]] && step cuda_memory "$here/bin/test_cuda_memory" --gtest_output="json:$out/cuda_memory.json"
[[ -x $here/bin/test_nccl ]] && step nccl "$here/bin/test_nccl" --gtest_output="json:$out/nccl.json"
if command -v compute-sanitizer > /dev/null; then
  step sanitizer compute-sanitizer --tool memcheck --error-exitcode 1 "$here/bin/test_ops_cuda"
  step sanitizer_train compute-sanitizer --tool memcheck --error-exitcode 1 "$here/bin/headroom" train \
    "$here/configs/quickstart.yaml" --set run.output_dir="$out/sanitizer_train" --set device.type=cuda \
    --set data.synthetic.train=16 --set data.synthetic.eval=0 --set train.max_steps=2 --set train.eval_steps=0 \
    --set train.save_steps=0 --set log.progress_bar=false
fi
step cpu_smoke smoke "$out/cpu_smoke"
step train_cuda smoke "$out/train_cuda" --set device.type=cuda
[[ -x $here/bin/bench_ops ]] && step bench_ops "$here/bin/bench_ops" --benchmark_min_time=0.05 \
  --benchmark_out="$out/bench_ops.json" --benchmark_out_format=json
[[ -x $here/bin/bench_generate ]] && step bench_generate "$here/bin/bench_generate" --benchmark_min_time=0.05 \
  --benchmark_out="$out/bench_generate.json" --benchmark_out_format=json
# The GPU peer: headroom's step on the ~1B model, then transformers' on the same config and batch shape.
step bench_gpu bash -c "'$here/bin/headroom' bench '$here/configs/bench/bench-1b-gpu.yaml' --steps 10 \
  --set run.output_dir='$out/bench_gpu_run' > '$out/bench_gpu.json'"
step bench_gpu_own_attention bash -c "HR_CUDNN_ATTENTION=0 '$here/bin/headroom' bench \
  '$here/configs/bench/bench-1b-gpu.yaml' --steps 5 --set run.output_dir='$out/bench_gpu_own_run' \
  > '$out/bench_gpu_own_attention.json'"
[[ -s $out/bench_gpu.json ]] && step peer_gpu bash -c "python3 '$here/torch_twin.py' '$out/bench_gpu.json' --device cuda \
  > '$out/peer_gpu.json'"
{
  echo "["
  for i in "${!steps[@]}"; do echo "  ${steps[$i]}$( ((i + 1 < ${#steps[@]})) && echo ,)"; done
  echo "]"
} > "$out/summary.json"
echo "check: wrote $out/summary.json"
