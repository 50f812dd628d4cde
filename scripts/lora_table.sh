#!/usr/bin/env bash
# The README's LoRA table: `headroom plan` for llava-1.5-7b and -13b, full fine-tune vs LoRA r=128 (LLaVA's
# finetune_lora.sh) vs LoRA over an 8-bit and a 4-bit (NF4, double quant) frozen base, per GPU. The recipe column
# is the config as written (8 GPUs, ZeRO-3, micro-batch 16); the others are one GPU, micro-batch 1, ZeRO 0.
# Usage: scripts/lora_table.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
HR="${1:-build}/train/headroom"
LORA=(--set lora.enable=true --set lora.r=128 --set lora.alpha=256)
echo "| model | training | 8 × a100-80g (recipe) | 1 × a100-80g | 1 × rtx4090-24g | 1 × l4-24g |"
echo "| --- | --- | --- | --- | --- | --- |"
for model in 7b 13b; do
  for training in full lora lora8 lora4; do
    case $training in
      full) sets=(); label="full fine-tune" ;;
      lora) sets=("${LORA[@]}"); label="LoRA r=128" ;;
      lora8) sets=("${LORA[@]}" --set lora.base_bits=8); label="LoRA r=128, 8-bit base" ;;
      lora4) sets=("${LORA[@]}" --set lora.base_bits=4); label="LoRA r=128, 4-bit NF4 base" ;;
    esac
    row=""
    trainable=""
    for where in recipe a100-80g rtx4090-24g l4-24g; do
      if [ "$where" = recipe ]; then
        args=(--device a100-80g --world-size 8)
      else
        args=(--device "$where" --world-size 1 --set train.micro_batch_size=1 --set train.global_batch_size=1
              --set memory.zero_stage=0)
      fi
      out=$("$HR" plan "configs/llava-1.5-$model.yaml" "${args[@]}" "${sets[@]}" 2>&1 || true)
      total=$(echo "$out" | sed -n 's/^  total *\([0-9.]* [KMG]iB\) .*: \(fits\|DOES NOT FIT\).*/\1, \2/p' | sed 's/DOES NOT FIT/no/')
      # A model whose parameters alone exceed the card is refused before any dry run.
      [ -n "$total" ] || ! grep -q "no plan can fit" <<< "$out" || total="no (its parameters alone exceed the card)"
      [ -n "$total" ] || { echo "$out" >&2; exit 1; }
      t=$(echo "$out" | sed -n 's/^parameters: .*, \([0-9,]*\) trainable/\1/p')
      [ -z "$t" ] || trainable=$t
      row="$row | $total"
    done
    echo "| ${model^^} | $label ($trainable trainable)$row |"
  done
done
