#!/usr/bin/env bash
# A LLaVA port end to end (README "Porting a LLaVA run"): a llava-hf directory with its SentencePiece tokenizer
# and CLIP processor, LLaVA-format data. headroom's batch (tokenizer, v1 template, images) equals LLaVA's
# pipeline and its loss transformers'; 20 training steps; transformers and AutoProcessor open the (sharded)
# checkpoint and its logits equal headroom's. Usage: llava_port.sh HEADROOM WORK_DIR.
set -euo pipefail
bin=$1 work=$2
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work"
mkdir -p "$work"
cd "$work"
python3 "$here/check_llava_port.py" make .
"$bin" debug batch port.yaml --out hbatch.safetensors --count 4
"$bin" debug grads --config port.yaml --weights hf --batch hbatch.safetensors --out hin.safetensors --logits
python3 "$here/check_llava_port.py" compare . hbatch.safetensors hin.safetensors
"$bin" train port.yaml > train.log
# LLaVA masks some multi-round samples whole with this (non-legacy) tokenizer: headroom names each one.
warned=$(grep -c '^warning: .*tokenization mismatch' train.log || true)
[[ $warned == "$(cat masked.txt)" ]] || { echo "llava_port: FAIL: $warned samples warned as masked, LLaVA masks $(cat masked.txt)"; exit 1; }
echo "llava_port: $warned samples masked whole, as LLaVA masks them"
printf 'model: {name_or_path: %s/run/checkpoint-20}\n' "$work" > checkpoint.yaml
"$bin" debug grads --config checkpoint.yaml --weights run/checkpoint-20 --batch hbatch.safetensors --out hout.safetensors --logits
python3 "$here/check_llava_port.py" load run/checkpoint-20 hbatch.safetensors hout.safetensors
# LoRA (finetune_lora.sh's flags): the checkpoint holds PEFT's adapter files; PEFT opens it over transformers'
# model and its logits (and merge_and_unload()'s) equal headroom's.
"$bin" train port.yaml --set run.output_dir="$work/lora" --set lora.enable=true --set lora.r=4 --set lora.alpha=8 \
  --set train.max_steps=10 --set train.save_steps=10 > lora.log
printf 'model: {name_or_path: %s/lora/checkpoint-10}\nlora: {enable: true, r: 4, alpha: 8}\n' "$work" > lora.yaml
"$bin" debug grads --config lora.yaml --weights lora/checkpoint-10 --batch hbatch.safetensors --out hlora.safetensors --logits
python3 "$here/check_llava_port.py" peft lora/checkpoint-10 hbatch.safetensors hlora.safetensors
"$bin" lora merge lora/checkpoint-10 --out lora/merged
python3 "$here/check_llava_port.py" merged lora/checkpoint-10 lora/merged hbatch.safetensors
# Asking the trained model about an image: headroom's greedy answer through the SentencePiece tokenizer equals
# transformers' generate on the same prompt and image.
"$bin" generate port.yaml --checkpoint run/checkpoint-20 --image data/images/001.png \
  --prompt "What color is the circle?" --max-new-tokens 8 --json > generated.json
python3 "$here/check_llava_port.py" generate run/checkpoint-20 data/images/001.png generated.json
# LLaVA's stage-1 start: a CLIP directory + a LlamaForCausalLM directory, projector pretraining (plain template).
python3 "$here/check_llava_port.py" stage1 .
"$bin" train stage1.yaml > stage1.log
python3 "$here/check_llava_port.py" stage1_check . run1/checkpoint-6
