#!/usr/bin/env bash
# Everything a GPU machine can check of headroom, from a bundle that scripts/gpu-bundle.sh packed, ordered by
# value so that a call cut short still returns the most that can be learnt in its time.
#
# --quick (budgets of 7.5 minutes in all; it took 2 on an H100): the GPU, the versions and whether every library
#   resolves; `headroom info`; the CUDA op table (test_ops_cuda, which names the attention kernel each case
#   took); the 20-step training on cuda:0 against the CPU run and every step's dry run
#   (CudaTrain.TwentySteps...); the ~1.25B LLaVA bench (configs/bench/bench-1b-gpu.yaml) and its peer,
#   transformers' LlavaForConditionalGeneration on the same GPU (torch_twin.py --device cuda: bf16 autocast,
#   SDPA attention, PyTorch's AdamW and caching allocator).
# full (the default): the quick steps, then the rest of the gpu tests (the CUDA kernels, the allocators on the
#   GPU, NCCL, the training matrix with two ranks on one GPU over MPI), the bench with the fused kernels off, the
#   op table with the own attention kernels, compute-sanitizer over the op table and a short training run, and the
#   microbenchmarks.
#
# Every step runs under `timeout` with its own budget in seconds, cut to what is left of --deadline (seconds
# from the start; a step with under 10 s left is skipped). --only NAME,NAME,... runs those steps alone (a rerun
# of what failed). After every step OUTDIR/summary.json is rewritten
# (summarize.py: each step's exit status, seconds and budget, the gtest counts and failures, the training's
# predicted and measured peaks, the bench and peer figures) and every log is packed into OUTDIR/logs.tar.gz,
# so a call cut short still returns what ran; the working files stay in OUTDIR/work (or HR_CHECK_WORK).
# Usage: [HR_CHECK_WORK=DIR] check.sh [--quick] [--deadline SECONDS] [--only NAME,...] OUTDIR
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
quick=0 deadline=100000 only=""
while [[ $# -gt 1 ]]; do
  case $1 in
    --quick) quick=1 ;;
    --deadline) deadline=$2 && shift ;;
    --only) only=",$2," && shift ;;
    *) echo "check.sh: unknown option $1" >&2 && exit 2 ;;
  esac
  shift
done
out=${1:?usage: check.sh [--quick] [--deadline SECONDS] [--only NAME,...] OUTDIR}
# The working files: OUTDIR/work, or HR_CHECK_WORK (outside a folder that must hold few files, as a device call's).
mkdir -p "$out" "${HR_CHECK_WORK:-$out/work}"
out=$(cd "$out" && pwd)
work=$(cd "${HR_CHECK_WORK:-$out/work}" && pwd)
# shellcheck source=/dev/null
source "$here/env.sh"
# The tests keep their scratch directories (the training runs' memory logs) for summarize.py.
export TEST_TMPDIR=$work/tmp HR_KEEP_TEST_TMP=1 HR_HEADROOM="$here/bin/headroom" HR_MPIRUN="$here/bin/mpirun"
mkdir -p "$TEST_TMPDIR"
start=$(date +%s)
steps_file=$work/steps.jsonl
: > "$steps_file"

publish() {
  python3 "$here/summarize.py" "$work" "$steps_file" > "$out/summary.json.tmp" 2> "$work/summarize.log" &&
    mv "$out/summary.json.tmp" "$out/summary.json"
  tar -C "$work" -czf "$out/logs.tar.gz.tmp" --exclude='*.safetensors' --exclude='*.bin' --exclude='tmp/*/*/*/checkpoint*' \
    . 2> /dev/null && mv "$out/logs.tar.gz.tmp" "$out/logs.tar.gz"
}

# step NAME BUDGET COMMAND...: runs COMMAND in the work directory, its output in work/NAME.log.
step() {
  local name=$1 budget=$2
  shift 2
  [[ -z $only || $only == *",$name,"* ]] || return 0
  local left=$((deadline - ($(date +%s) - start)))
  if ((left < 10)); then
    echo "{\"step\": \"$name\", \"skipped\": \"no time left\", \"budget\": $budget}" >> "$steps_file"
    echo "check: $name: skipped (no time left)"
    return
  fi
  local limit=$((budget < left ? budget : left)) t0 t1 rc
  t0=$(date +%s.%N)
  (cd "$work" && timeout -k 10 "$limit" "$@") > "$work/$name.log" 2>&1
  rc=$?
  t1=$(date +%s.%N)
  echo "{\"step\": \"$name\", \"exit\": $rc, \"seconds\": $(awk "BEGIN {printf \"%.1f\", $t1 - $t0}"), \"budget\": $budget, \"limit\": $limit, \"timed_out\": $( ((rc == 124 || rc == 137)) && echo true || echo false)}" >> "$steps_file"
  echo "check: $name: exit $rc in $(awk "BEGIN {printf \"%.0f\", $t1 - $t0}") s ($(grep -v '^\s*$' "$work/$name.log" | tail -1 | cut -c1-140))"
  publish
}

gtest() {  # gtest NAME BUDGET BINARY [ARGS...]: a gtest binary with its JSON report as work/NAME.json
  local name=$1 budget=$2 bin=$3
  shift 3
  [[ -x $here/bin/$bin ]] || return 0
  [[ -z $only || $only == *",$name,"* ]] || return 0
  echo "$name" >> "$work/gtests.txt"
  step "$name" "$budget" "$here/bin/$bin" --gtest_output="json:$work/$name.json" "$@"
}

# bench_script NAME STEPS [ENV [SETS]]: the shell line of headroom bench on the ~1B model with the variables ENV
# ("VAR=value ...") and the overrides SETS ("--set key=value ..."), its JSON as work/NAME.json.
bench_script() {
  local name=$1 steps=$2 vars=${3:-} sets=${4:-}
  echo "env $vars '$here/bin/headroom' bench '$here/configs/bench/bench-1b-gpu.yaml' --steps $steps --warmup 2 \
--set run.output_dir='$work/${name}_run' $sets > '$work/$name.json'"
}
# peer NAME: transformers' twin of the bench work/NAME.json on the same GPU, its JSON as work/peer_NAME.json
# (peer_gpu.json for bench_gpu).
peer() {
  local name=$1 json=peer_${1#bench_}
  [[ -s $work/$name.json ]] && step "${json}" 150 bash -c "PYTHONUNBUFFERED=1 python3 '$here/torch_twin.py' \
'$work/$name.json' --device cuda --steps 5 --warmup 2 > '$work/$json.json'"
}

# --- quick: what the first minutes on a GPU should answer ---
step gpu 20 nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version,compute_cap,clocks.max.sm --format=csv
step versions 60 bash -c "cat '$here/BUILD'; nvcc --version | tail -2; python3 -c 'import torch, transformers; \
print(\"torch\", torch.__version__, torch.version.cuda, \"cudnn\", torch.backends.cudnn.version(), \"transformers\", transformers.__version__)'"
step libraries 20 bash -c "missing=0; for b in '$here'/bin/*; do if ldd \"\$b\" | grep -q 'not found'; then \
ldd \"\$b\" | grep 'not found' | sed \"s|^|\$(basename \$b): |\"; missing=1; fi; done; \
ldd '$here/bin/headroom' | grep -E 'cuda|cublas|cudnn|nccl'; libs=\$('$here/bin/headroom' info | grep -E '^  (cuBLAS|cuBLASLt|NVRTC):'); \
echo \"\$libs\"; [[ \$(grep -c ': lib[^ ]* (' <<< \"\$libs\") == 3 ]] || missing=1; exit \$missing"
step info 30 "$here/bin/headroom" info
gtest ops_cuda 90 test_ops_cuda
gtest train_twenty 150 test_cuda_train --gtest_filter='CudaTrain.TwentySteps*:CudaTrain.EveryAllocator*'
step bench_gpu 150 bash -c "$(bench_script bench_gpu 8)"
peer bench_gpu

# --- full: the rest, most valuable first ---
if ((!quick)); then
  gtest cuda_train 240 test_cuda_train --gtest_filter='-CudaTrain.TwentySteps*:CudaTrain.EveryAllocator*'
  gtest cuda_kernels 90 test_cuda_kernels
  gtest cuda_memory 60 test_cuda_memory
  gtest nccl 60 test_nccl
  # The bench with the fused kernels off (model.fused_kernels=off: RoPE per call, the residual add apart from the
  # norm), beside bench_gpu on the same GPU: what the fusion saves there.
  step bench_gpu_unfused 150 bash -c "$(bench_script bench_gpu_unfused 8 "" "--set model.fused_kernels=off")"
  # Where the bench's GPU time goes: every kernel-table call timed with CUDA events (HR_OP_PROFILE), by op.
  step bench_gpu_profile 120 bash -c "$(bench_script bench_gpu_profile 1 "HR_OP_PROFILE='$work/op_profile.json'")"
  # The peer can checkpoint whole layers or nothing (transformers has no selective checkpointing): headroom
  # with the same choice, beside it.
  step bench_gpu_full_ckpt 150 bash -c "$(bench_script bench_gpu_full_ckpt 8 "" "--set memory.gradient_checkpointing=full")"
  peer bench_gpu_full_ckpt
  step bench_gpu_no_ckpt 150 bash -c "$(bench_script bench_gpu_no_ckpt 8 "" "--set memory.gradient_checkpointing=none")"
  peer bench_gpu_no_ckpt
  # The caching allocator without checkpointing: from its second step on, its allocated peak depended on what the
  # cache held (a large block splits only when more than 1 MiB remains), which the trainer replays since.
  step bench_gpu_caching_no_ckpt 120 bash -c "$(bench_script bench_gpu_caching_no_ckpt 8 "" \
"--set memory.gradient_checkpointing=none --set memory.allocator=caching")"
  HR_CUDNN_ATTENTION=0 gtest ops_cuda_own_attention 90 test_ops_cuda
  step bench_gpu_own_attention 120 bash -c "$(bench_script bench_gpu_own_attention 4 HR_CUDNN_ATTENTION=0)"
  if command -v compute-sanitizer > /dev/null; then
    step sanitizer 240 compute-sanitizer --tool memcheck --error-exitcode 1 "$here/bin/test_ops_cuda"
    step sanitizer_train 180 compute-sanitizer --tool memcheck --error-exitcode 1 "$here/bin/headroom" train \
      "$here/configs/quickstart.yaml" --set run.output_dir="$work/sanitizer_train" --set device.type=cuda \
      --set data.synthetic.train=16 --set data.synthetic.eval=1 --set train.max_steps=2 --set train.eval_steps=0 \
      --set train.save_steps=0 --set log.progress_bar=false
  fi
  [[ -x $here/bin/bench_ops ]] && step bench_ops 120 "$here/bin/bench_ops" --benchmark_min_time=0.05 \
    --benchmark_out="$work/bench_ops.json" --benchmark_out_format=json
  [[ -x $here/bin/bench_generate ]] && step bench_generate 90 "$here/bin/bench_generate" --benchmark_min_time=0.05 \
    --benchmark_out="$work/bench_generate.json" --benchmark_out_format=json
fi
publish
python3 "$here/summarize.py" --table "$work" "$steps_file"
echo "check: wrote $out/summary.json and $out/logs.tar.gz in $(($(date +%s) - start)) s"
