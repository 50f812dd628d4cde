#!/usr/bin/env bash
# Hugging Face model directories in and out (README "Hugging Face directories"), checked with transformers:
# headroom loads a directory transformers' save_pretrained wrote (model.name_or_path) and its loss, logits and
# gradients equal transformers'; headroom trains from it and saves a checkpoint, and transformers'
# from_pretrained opens that checkpoint with logits equal to headroom's. Usage: hf_dir.sh HEADROOM WORK_DIR
# [llama|qwen2|qwen2_tied|mistral [clip|siglip [MPIEXEC]]] (the decoder and the tower; llama and clip by default).
# With MPIEXEC the training runs on two ranks at ZeRO-3 (every step's peaks equal to its dry run), and transformers
# opens the consolidated checkpoint; then headroom's greedy answer about an image from it equals transformers'
# generate.
set -euo pipefail
bin=$1 work=$2 decoder=${3:-llama} tower=${4:-clip} mpiexec=${5:-}
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work"
mkdir -p "$work"
cd "$work"
python3 "$here/check_hf_dir.py" make . "$decoder" "$tower"
"$bin" debug grads --config model.yaml --weights hf --batch batch.safetensors --out in.safetensors --logits
python3 "$here/check_hf_dir.py" compare ref.safetensors in.safetensors
cat > train.yaml <<YAML
run: {output_dir: $work/run}
model: {name_or_path: $work/hf}
data:
  synthetic: {train: 32, eval: 8, image_size: 16}
  system_prompt: ""
  max_seq_len: 96
  num_workers: 1
train: {micro_batch_size: 4, max_steps: 3, learning_rate: 0.001, max_new_tokens: 2}
log: {progress_bar: false, logging_steps: 1}
YAML
if [[ -n $mpiexec ]]; then
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "$mpiexec" --oversubscribe -np 2 \
    "$bin" train train.yaml --set memory.zero_stage=3 > train.log
  # Every step's measured peaks on both ranks equal its dry run's.
  python3 - run/memory.rank0.jsonl run/memory.rank1.jsonl <<'PY'
import json
import sys
for path in sys.argv[1:]:
    steps = [json.loads(line) for line in open(path) if line.strip()]
    off = [s["step"] for s in steps
           if (s["peak_allocated"], s["peak_reserved"]) != (s["predicted_peak"], s["predicted_reserved"])]
    if len(steps) != 3 or off:
        sys.exit(f"hf_dir: FAIL: {path}: {len(steps)} steps; measured peaks differ from the dry run at steps {off}")
print("hf_dir: both ranks' 3 steps peaked as their dry runs predicted")
PY
  "$bin" ckpt consolidate run/checkpoint-3 --out "$work/consolidated/" > /dev/null
  printf 'model: {name_or_path: %s/consolidated}\n' "$work" > consolidated.yaml
  "$bin" debug grads --config consolidated.yaml --weights consolidated --batch batch.safetensors --out out.safetensors \
    --logits
  python3 "$here/check_hf_dir.py" load consolidated batch.safetensors out.safetensors hf
  "$bin" generate train.yaml --checkpoint consolidated --image run/data/images/eval-000000.png \
    --prompt "What color is the object?" --max-new-tokens 6 --json > generated.json
  python3 "$here/check_hf_dir.py" generate consolidated run/data/images/eval-000000.png generated.json
  exit 0
fi
"$bin" train train.yaml > train.log
printf 'model: {name_or_path: %s/run/checkpoint-3}\n' "$work" > checkpoint.yaml
"$bin" debug grads --config checkpoint.yaml --weights run/checkpoint-3 --batch batch.safetensors --out out.safetensors --logits
python3 "$here/check_hf_dir.py" load run/checkpoint-3 batch.safetensors out.safetensors hf
# `ckpt consolidate --out DIR/` writes the same as a Hugging Face directory of its own.
"$bin" ckpt consolidate run/checkpoint-3 --out "$work/consolidated/" > /dev/null
python3 "$here/check_hf_dir.py" load consolidated batch.safetensors out.safetensors hf
