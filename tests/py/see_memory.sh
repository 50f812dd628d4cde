#!/usr/bin/env bash
# The "see memory" outputs of short training runs, each read by the real reader or renderer (README "See
# memory"): TensorBoard's EventAccumulator, a trace-event schema check, PyTorch's memory_viz helpers, headless
# Chromium. Usage: see_memory.sh HEADROOM WORK_DIR [MPIEXEC]: one process, or with MPIEXEC two ranks.
set -euo pipefail
bin=$1 work=$2 mpiexec=${3:-}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
rm -rf "$work"
mkdir -p "$work"
run="$work/run"
common=(--set run.output_dir="$run" --set train.max_steps=4 --set log.logging_steps=1 --set train.eval_steps=2
        --set train.eval_samples=16 --set data.synthetic.train=200 --set data.synthetic.eval=32 --set data.num_workers=1
        --set log.report_to=tensorboard --set memory.trace_steps=[2] --set train.save_steps=0)
if [[ -n $mpiexec ]]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
  "$mpiexec" --oversubscribe -np 2 "$bin" train "$root/configs/quickstart.yaml" "${common[@]}" > "$work/train.log"
  traces=("$run/trace.rank0.step2.json" "$run/trace.rank1.step2.json")
else
  "$bin" train "$root/configs/quickstart.yaml" "${common[@]}" --set memory.gradient_checkpointing=full > "$work/train.log"
  traces=("$run/trace.rank0.step2.json")
fi
grep -q "memory timeline in" "$work/train.log"
grep -Eq "ETA [0-9]" "$work/train.log"
grep -Eq "^peak step [0-9]+: .* error 0 B \(exact\); the plan.s worst case" "$work/train.log"

python3 "$here/check_tfevents.py" "$run"
slices=(--expect-slice "forward language_model.model.layers.0" --expect-slice "backward language_model.model.layers.0"
        --expect-slice "optimizer step")
if [[ -n $mpiexec ]]; then slices+=(--expect-slice all_reduce); else slices+=(--expect-slice recompute); fi
python3 "$here/check_trace.py" "${traces[@]}" --expect-counter "device allocated" --expect-counter "device reserved" \
  --expect-counter "device activations" --expect-counter "host allocated" "${slices[@]}"

"$bin" plan "$root/configs/quickstart.yaml" --set run.output_dir="$run" --trace "$work/plan.trace.json" \
  --snapshot "$work/plan.pickle" > "$work/plan.log"
python3 "$here/check_trace.py" "$work/plan.trace.json" --expect-counter "device allocated" \
  --expect-slice "backward language_model.model.layers.3"
python3 "$here/check_snapshot.py" "$work/plan.pickle" --expect-owner language_model.model.layers.3

"$bin" report "$run" --out "$work/report.html" > /dev/null
series=(--expect-series "measured peak allocated" --expect-series "predicted peak allocated" --expect-series activations
        --expect-series "train loss" --expect-series "eval accuracy" --expect-series tokens/s)
if [[ -n $mpiexec ]]; then series+=(--expect-series "rank 1 peak allocated" --expect-series "rank 1 exposed communication"); fi
python3 "$here/check_report.py" "$work/report.html" --png "$work/report.png" "${series[@]}"

# An out-of-memory error with memory.snapshot_on_oom: the allocator at that moment, for memory_viz.
if [[ -z $mpiexec ]]; then
  oom="$work/oom"
  if "$bin" train "$root/configs/quickstart.yaml" --set run.output_dir="$oom" --set train.max_steps=2 \
      --set data.synthetic.train=64 --set data.synthetic.eval=8 --set device.memory_limit=40MiB \
      --set memory.preflight=false --set memory.snapshot_on_oom=true > "$work/oom.log" 2>&1; then
    echo "see_memory: the capped run did not run out of memory" >&2
    exit 1
  fi
  grep -q "open it in pytorch.org/memory_viz" "$work/oom.log"
  python3 "$here/check_snapshot.py" "$oom/oom_snapshot.rank0.step1.pickle" --expect-owner language_model.model.layers.0
  # A resumed run: the first logs steps 1 to 4 with evaluations at 2 and 4; resumed from checkpoint-2 with
  # max_steps 3, the second logs step 3 only. TensorBoard must show steps 1 to 3 and the evaluation at 2 alone, as
  # the cut JSON lines do: the second event file's SessionLog START at step 3 drops the first file's steps from 3
  # on (without it, EventAccumulator drops only the tags the second file logs again out of order).
  again="$work/resumed"
  resumed=(--set run.output_dir="$again" --set log.logging_steps=1 --set train.eval_steps=2 --set train.eval_samples=16
           --set data.synthetic.train=200 --set data.synthetic.eval=32 --set data.num_workers=1
           --set log.report_to=tensorboard --set train.save_steps=2)
  "$bin" train "$root/configs/quickstart.yaml" "${resumed[@]}" --set train.max_steps=4 > "$work/first.log"
  grep -q '"step": *4' "$again/eval.jsonl"
  rm -rf "$again/checkpoint-4"
  sleep 1  # event files are named by the second they start in: the resumed run's sorts after the first's
  "$bin" train "$root/configs/quickstart.yaml" "${resumed[@]}" --set train.max_steps=3 --resume > "$work/resumed.log"
  [[ $(ls "$again"/runs/events.out.tfevents.* | wc -l) == 2 ]]
  python3 "$here/check_tfevents.py" "$again"
fi
echo "see_memory: OK ($work)"
