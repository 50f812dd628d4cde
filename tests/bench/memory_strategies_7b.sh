#!/usr/bin/env bash
# The README's table of memory strategies for LLaVA-1.5-7B's full fine-tune (configs/llava-1.5-7b.yaml: the
# projector and Vicuna-7B train, bf16, full checkpointing, micro-batch 16 of global 128, ZeRO-3): `headroom plan`
# on 1 and on 8 x a100-80g with f32 AdamW or 8-bit AdamW, the activations kept on the device or offloaded, each
# cell the peak per rank (fits or not) and the cost model's step time; then what `auto` picks (ZeRO stage,
# optimizer offload, checkpointing, activation offload and micro-batch on auto) with f32 AdamW and with
# train.optimizer: auto. HR_ONLY=auto prints the second table only.
#   tests/bench/memory_strategies_7b.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
HR="${1:-build}/train/headroom"
cfg=configs/llava-1.5-7b.yaml
cell() {
  local out total step
  out=${PLAN_OUT:-$("$HR" plan "$cfg" --device a100-80g "$@" 2>&1 || true)}
  total=$(sed -n 's/^  total *\([0-9.]* [KMG]iB\) .*: \(fits\|DOES NOT FIT\).*/\1, \2/p' <<< "$out" | sed 's/DOES NOT FIT/no/')
  step=$(sed -n 's/^step time (cost model): \([0-9.]*\) s = .*/\1/p' <<< "$out")
  [ -n "$total" ] && [ -n "$step" ] || { echo "$out" >&2; exit 1; }
  printf '%s; %.1f s' "$total" "$step"
}
decisions() {
  sed -n 's/^decisions: //p' <<< "$PLAN_OUT" | sed 's/; global batch.*//'
}
[ "${HR_ONLY:-}" = auto ] || echo "| optimizer | activations | 1 × a100-80g | 8 × a100-80g |"
[ "${HR_ONLY:-}" = auto ] || echo "| --- | --- | --- | --- |"
[ "${HR_ONLY:-}" = auto ] || for opt in adamw adamw_8bit; do
  name=$([ $opt = adamw ] && echo "AdamW (f32 states)" || echo "8-bit AdamW")
  for act in none cpu; do
    where=$([ $act = none ] && echo "on the device" || echo "offloaded")
    sets=(--set train.optimizer=$opt --set memory.offload_activations=$act)
    echo "| $name | $where | $(cell --world-size 1 "${sets[@]}") | $(cell --world-size 8 "${sets[@]}") |"
  done
done
AUTO=(--set memory.zero_stage=auto --set memory.offload_optimizer=auto --set memory.gradient_checkpointing=auto
      --set memory.offload_activations=auto --set train.micro_batch_size=auto)
echo
echo "| optimizer | GPUs | auto picks | peak; step |"
echo "| --- | --- | --- | --- |"
for opt in adamw auto; do
  for world in 1 8; do
    PLAN_OUT=$("$HR" plan "$cfg" --device a100-80g --world-size $world --set train.optimizer=$opt "${AUTO[@]}" 2>&1 ||
      true)
    echo "| $opt | $world | $(decisions) | $(cell) |"
  done
done
