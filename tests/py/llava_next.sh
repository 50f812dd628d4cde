#!/usr/bin/env bash
# LLaVA-NeXT's AnyRes end to end, checked with transformers: headroom trains a tiny LlavaNextForConditionalGeneration
# directory (save_pretrained's) on synthetic images of mixed aspect ratios, on one process and on two ranks at ZeRO-3:
# every step's peaks equal its dry run's, the plan's worst case bounds every step, the two runs' losses agree, and
# `headroom plan --data-steps` predicts each rank's step peaks before the run (grouped by each image's tokens).
# transformers then opens the consolidated checkpoint as LlavaNextForConditionalGeneration with its
# LlavaNextImageProcessor, whose pixels and logits equal headroom's, and whose greedy generation about an image equals
# headroom's. Usage: llava_next.sh HEADROOM WORK_DIR MPIEXEC
set -euo pipefail
bin=$1 work=$2 mpiexec=$3
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work"
mkdir -p "$work"
cd "$work"
python3 "$here/check_llava_next.py" make . > /dev/null
cat > train.yaml <<YAML
model: {name_or_path: $work/hf}
data:
  synthetic: {train: 48, eval: 8, image_size: 12, aspect: mixed}
  system_prompt: ""
  max_seq_len: 192
  num_workers: 1
train: {micro_batch_size: 2, global_batch_size: 8, max_steps: 4, learning_rate: 0.001, max_new_tokens: 2}
log: {progress_bar: false, logging_steps: 1}
YAML
"$bin" train train.yaml --set run.output_dir="$work/single" > single.log
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "$mpiexec" --oversubscribe -np 2 \
  "$bin" train train.yaml --set run.output_dir="$work/z3" --set memory.zero_stage=3 > z3.log
python3 - single/memory.jsonl z3/memory.rank0.jsonl z3/memory.rank1.jsonl <<'PY'
import json
import sys
runs = {path: [json.loads(line) for line in open(path) if line.strip()] for path in sys.argv[1:]}
faults = []
for path, steps in runs.items():
    if len(steps) != 4:
        faults.append(f"{path}: {len(steps)} steps, not 4")
    for s in steps:
        if (s["peak_allocated"], s["peak_reserved"]) != (s["predicted_peak"], s["predicted_reserved"]):
            faults.append(f"{path} step {s['step']}: measured {s['peak_allocated']} / {s['peak_reserved']}, "
                          f"dry run {s['predicted_peak']} / {s['predicted_reserved']}")
        if s["peak_allocated"] > s["planned_peak"]:
            faults.append(f"{path} step {s['step']}: {s['peak_allocated']} above the plan's worst case {s['planned_peak']}")
single = [s["loss"] for s in runs[sys.argv[1]]]
for path in sys.argv[2:]:
    for a, b in zip(single, [s["loss"] for s in runs[path]]):
        if abs(a - b) > 1e-4:
            faults.append(f"{path}: loss {b} where one process has {a}")
peaks = sorted({s["peak_allocated"] for s in runs[sys.argv[1]]})
if len(peaks) < 2:
    faults.append(f"every step of mixed aspect ratios peaked at {peaks}: the images' layouts did not vary")
for f in faults:
    print("llava_next: FAIL:", f, file=sys.stderr)
if faults:
    sys.exit(1)
print(f"llava_next: 4 steps on 1 and 2 ranks, every peak its dry run's (one process: {peaks}), under the plan's "
      f"worst case {runs[sys.argv[1]][0]['planned_peak']}, the same losses")
PY
# `plan --data-steps` dry-runs the run's own data before it starts, here grouped by each image's tokens: every rank's
# step peaks those a run then measures.
grouped=(--set run.output_dir="$work/z3g" --set memory.zero_stage=3 --set data.group_by_modality_length=true)
"$bin" plan train.yaml "${grouped[@]}" --world-size 2 --data-steps 4 --json > data_steps.json
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "$mpiexec" --oversubscribe -np 2 \
  "$bin" train train.yaml "${grouped[@]}" > z3g.log
python3 - data_steps.json z3g/memory.rank0.jsonl z3g/memory.rank1.jsonl <<'PY'
import json
import sys
steps = json.load(open(sys.argv[1]))["data_steps"]
measured = [[json.loads(line)["peak_allocated"] for line in open(path) if line.strip()] for path in sys.argv[2:]]
if steps["peaks"] != measured:
    sys.exit(f"llava_next: FAIL: plan --data-steps dry-ran {steps['peaks']}, the run measured {measured}")
if steps["max"] > steps["planned_peak"]:
    sys.exit(f"llava_next: FAIL: a step's dry run {steps['max']} is above the plan's worst case {steps['planned_peak']}")
print(f"llava_next: plan --data-steps 4 on 2 ranks, grouped by length: {steps['peaks']}, what the run then measured")
PY
# Generation is asked about a tall image: its layout's placeholders in the prompt.
tall=$(python3 - z3/data <<'PY'
import json, struct, sys
for e in json.load(open(sys.argv[1] + "/eval.json")):
    width, height = struct.unpack(">II", open(f"{sys.argv[1]}/{e['image']}", "rb").read()[16:24])  # PNG's IHDR
    if height > width:
        print(e["image"])
        break
PY
)
# Consolidates RUN/CHECKPOINT into OUT/ and checks it with transformers: its image processor's pixels and its logits on
# the first samples of RUN's data as headroom's loader makes them, and the same greedy tokens about the tall image.
check_with_transformers() {  # CONFIG RUN CHECKPOINT OUT
  local config=$1 run=$2 ckpt=$3 out=$4
  "$bin" ckpt consolidate "$run/$ckpt" --out "$work/$out/" > /dev/null
  "$bin" debug batch "$config" --set data.train_json="$work/$run/data/train.json" \
    --set data.image_folder="$work/$run/data" --out "$out.batch.safetensors" --count 4 > /dev/null
  printf 'model: {name_or_path: %s/%s}\n' "$work" "$out" > "$out.yaml"
  "$bin" debug grads --config "$out.yaml" --weights "$out" --batch "$out.batch.safetensors" \
    --out "$out.ours.safetensors" --logits > /dev/null
  python3 "$here/check_llava_next.py" load "$out" "$out.batch.safetensors" "$out.ours.safetensors" \
    "$run/data/train.json" "$run/data"
  "$bin" generate "$config" --checkpoint "$out" --image "$run/data/$tall" --prompt "What color is the object?" \
    --max-new-tokens 6 --json > "$out.generated.json"
  python3 "$here/check_llava_next.py" generate "$out" "$run/data/$tall" "$out.generated.json"
}
check_with_transformers train.yaml z3 checkpoint-4 consolidated

# LLaVA-OneVision (SigLIP, Qwen2, anyres_max_1: the larger images pooled): its directory trains, every step its dry run,
# and transformers opens the checkpoint as LlavaOnevisionForConditionalGeneration with its LlavaOnevisionImageProcessor
# (the same pixels, logits and greedy answer).
sed "s|$work/hf|$work/onevision/hf|" train.yaml > onevision.yaml
"$bin" train onevision.yaml --set run.output_dir="$work/ov" --set train.max_steps=2 > ov.log
python3 - ov/memory.jsonl <<'PY'
import json
import sys
steps = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
bad = [s for s in steps if s["peak_allocated"] != s["predicted_peak"] or s["peak_allocated"] > s["planned_peak"]]
if len(steps) != 2 or bad:
    sys.exit(f"llava_next: FAIL: OneVision's steps {[(s['peak_allocated'], s['predicted_peak']) for s in steps]}")
print(f"llava_next: OneVision trained 2 steps, every peak its dry run's ({[s['peak_allocated'] for s in steps]})")
PY
check_with_transformers onevision.yaml ov checkpoint-2 ov_consolidated
