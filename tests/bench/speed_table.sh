#!/usr/bin/env bash
# headroom against PyTorch on the same models and batches (the README's speed table): `headroom bench` per row,
# then scripts/torch_twin.py on its JSON with Debian's torch 1.13 (TORCH1_PYTHON, default the oracle venv's
# python3; `none` skips it: on a CPU without AVX512-BF16 its bf16 rows take many minutes a step) and, when TORCH2_PYTHON names a python with PyTorch 2 and transformers, eager and compiled.
# Prints a markdown table and the CPU it ran on (vendor, family, model, oneDNN ISA, what the bf16 rows run); each
# row's JSON stays in OUT_DIR. Run it on a quiet machine.
# BENCH_STEPS timed steps per run (default 10, after 2 warm-up steps); SPEED_ROWS, a regular expression, runs only
# the rows whose tag (name-precision-checkpointing, e.g. "19.2M (8 × 256)-bf16-none") it matches; SPEED_ROUNDS
# (below) alternates each row's programs several times.
# SPEED_ISA=avx2 runs every program on the AVX2 code paths of an AVX-512 CPU: an emulation of an AVX2 CPU's ISA, not
# of its caches or clocks. oneDNN (headroom's and PyTorch's) is capped by ONEDNN_MAX_CPU_ISA=AVX2, MKL by
# MKL_ENABLE_INSTRUCTIONS=AVX2, OpenBLAS by OPENBLAS_CORETYPE=Haswell, PyTorch's eager kernels by
# ATEN_CPU_CAPABILITY=avx2, and inductor's generated code by the twin's --simdlen 256. The compiled twin's eager
# kernels keep the CPU's capability: under ATEN_CPU_CAPABILITY=avx2 PyTorch 2.15's compiled graph fails
# transformers' image-token check (a count of 262,144 for 512), so the compiled peer keeps its AVX-512 eager ops.
# Usage: tests/bench/speed_table.sh [BUILD_DIR] [OUT_DIR]   (from the repository root)
set -euo pipefail
cd "$(dirname "$0")/../.."
HR="${1:-build}/train/headroom"
out="${2:-runs/speed}"
mkdir -p "$out"
t1="${TORCH1_PYTHON:-.pyenv/bin/python3}"
t2="${TORCH2_PYTHON:-}"
# Debian's torch 1.13 calls libblas.so.3: the reference BLAS unless OpenBLAS is installed; e.g.
# TORCH1_ENV="LD_LIBRARY_PATH=<openblas-pthread dir> OMP_WAIT_POLICY=PASSIVE" (the fastest setting found here).
t1env="${TORCH1_ENV:-}"
steps="${BENCH_STEPS:-10}"
isa="${SPEED_ISA:-}"
eager_env=() simd=()
case "$isa" in
  "") ;;
  avx2)
    export ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 OPENBLAS_CORETYPE=Haswell
    eager_env=(ATEN_CPU_CAPABILITY=avx2)
    simd=(--simdlen 256)
    ;;
  *) echo "speed_table.sh: SPEED_ISA is avx2 or unset, not '$isa'" >&2; exit 2 ;;
esac
cell() { if [ "$1" = — ]; then echo —; else echo "$1 ms"; fi; }
ms() { python3 -c "import json,sys; print(round(json.load(open(sys.argv[1]))['step_ms']['median']))" "$1"; }
# SPEED_ROUNDS=N (default 1) runs each row's programs N times in turn (headroom, torch 1.13, eager, compiled, then
# again), because these machines drift by ±20% within minutes: a program's cell is the median of its N step-time
# medians, and the ratio is the median of the N rounds' own ratios (each round's fastest peer over that round's
# headroom), with their range after it. Round r's JSON is TAG.PROGRAM.json for r = 1, TAG.PROGRAM.rR.json after.
rounds="${SPEED_ROUNDS:-1}"
[[ $rounds =~ ^[1-9][0-9]*$ ]] || { echo "speed_table.sh: SPEED_ROUNDS must be a positive integer, not '$rounds'" >&2; exit 2; }
median() { python3 -c "import statistics,sys; print(round(statistics.median(float(x) for x in sys.argv[1:])))" "$@"; }
echo "| model | precision | checkpointing | headroom | torch 1.13 | torch 2 eager | torch 2 compiled | fastest peer ÷ headroom |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
row() {  # name config precision checkpointing [extra --set ...]
  local name=$1 cfg=$2 prec=$3 ck=$4
  shift 4
  local tag="$name-$prec-$ck"
  [[ -z ${SPEED_ROWS:-} || $tag =~ $SPEED_ROWS ]] || return 0
  # The disk rows' PNGs, made once (the config reads them from runs/bench-disk-data).
  if [[ $cfg == *disk* && ! -f runs/bench-disk-data/train.json ]]; then
    "$HR" data synth --out runs/bench-disk-data --train 2048 --eval 8 --image-size 64 > /dev/null
  fi
  local r sfx hs=() e1s=() e2s=() c2s=() ratios=()
  for ((r = 1; r <= rounds; ++r)); do
    sfx=""
    ((r == 1)) || sfx=".r$r"
    local base="$out/$tag" h best=""
    "$HR" bench "$cfg" --steps "$steps" --warmup 2 --set memory.precision="$prec" \
      --set memory.gradient_checkpointing="$ck" --set run.output_dir="$out/runs/$tag" "$@" \
      > "$base.headroom$sfx.json" 2> "$base.headroom$sfx.log"
    h=$(ms "$base.headroom$sfx.json")
    hs+=("$h")
    if [ "$t1" != none ]; then
      env $t1env "${eager_env[@]}" "$t1" scripts/torch_twin.py "$base.headroom$sfx.json" > "$base.torch1$sfx.json" 2> /dev/null
      e1s+=("$(ms "$base.torch1$sfx.json")")
      best=${e1s[-1]}
    fi
    if [ -n "$t2" ]; then
      env "${eager_env[@]}" "$t2" scripts/torch_twin.py "$base.headroom$sfx.json" > "$base.torch2$sfx.json" 2> /dev/null
      "$t2" scripts/torch_twin.py "$base.headroom$sfx.json" --compile "${simd[@]}" > "$base.torch2c$sfx.json" \
        2> "$base.torch2c$sfx.log" || true
      e2s+=("$(ms "$base.torch2$sfx.json")")
      if [ -z "$best" ] || [ "${e2s[-1]}" -lt "$best" ]; then best=${e2s[-1]}; fi
      if [ -s "$base.torch2c$sfx.json" ]; then
        c2s+=("$(ms "$base.torch2c$sfx.json")")
        best=$((c2s[-1] < best ? c2s[-1] : best))
      fi
    fi
    [ -z "$best" ] || ratios+=("$(python3 -c "print($best / $h)")")
  done
  local h e1="—" e2="—" c2="—" ratio="—"
  h=$(median "${hs[@]}")
  ((${#e1s[@]} == 0)) || e1=$(median "${e1s[@]}")
  ((${#e2s[@]} == 0)) || e2=$(median "${e2s[@]}")
  ((${#c2s[@]} == 0)) || c2=$(median "${c2s[@]}")
  if ((${#ratios[@]} > 0)); then
    ratio=$(python3 -c "import statistics,sys
x = [float(v) for v in sys.argv[1:]]
print(f'{statistics.median(x):.2f}' + (f' ({min(x):.2f}–{max(x):.2f})' if len(x) > 1 else ''))" "${ratios[@]}")
  fi
  echo "| $name | $prec | $ck | $h ms | $(cell "$e1") | $(cell "$e2") | $(cell "$c2") | $ratio |"
}
for prec in fp32 bf16; do
  for ck in none full; do row "2.0M (4 × 128)" tests/bench/configs/bench-2m.yaml $prec $ck; done
done
for prec in fp32 bf16; do
  for ck in none full; do row "19.2M (8 × 256)" tests/bench/configs/bench-19m.yaml $prec $ck; done
done
for prec in bf16 fp32; do
  row "5.2M, 64-px PNG from disk (32 a step)" tests/bench/configs/bench-5m-disk.yaml $prec none
  row "5.2M, fixed-shape synthetic (32 a step)" tests/bench/configs/bench-5m-synth.yaml $prec none
done
# The machine the rows ran on: the CPU by vendor, family and model, oneDNN's ISA and what the bf16 GEMMs and attention
# tiles run on.
SPEED_ISA="$isa" python3 - "$out"/*.headroom.json <<'PY'
import json
import os
import sys
b = json.load(open(sys.argv[1]))
c = b.get("cpu_id", {})
print(f"\nCPU: {c.get('name', b['cpu'])} ({c.get('vendor', '?')} family {c.get('family', '?')} model "
      f"{c.get('model', '?')}), {b['threads_per_rank']} threads; oneDNN ISA {b['isa']}; bf16 GEMMs on {b.get('bf16_gemm', '?')}; "
      f"bf16 attention tiles on {b.get('bf16_attention', '?')}")
if os.environ.get("SPEED_ISA"):
    print(f"Emulated: SPEED_ISA={os.environ['SPEED_ISA']}, every program capped to that ISA's code paths on this CPU "
          "(the compiled peer's eager kernels excepted); not a CPU of that ISA")
if "padding_free" in b:
    print("headroom: train.padding_free " + ("on (its LLM runs only the positions the loss reads, its last layer "
          "only the rows from the first the loss reads; the peers run the whole padded batch)" if b["padding_free"]
          else "off (the whole padded batch, as the peers)"))
PY
