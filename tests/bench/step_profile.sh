#!/usr/bin/env bash
# Where a training step's CPU time goes: `perf record` over `headroom bench CONFIG` (startup skipped by perf's delay),
# oneDNN's JIT code named (ONEDNN_JIT_PROFILE=2), and every sample put in one category: the GEMMs (oneDNN's JIT
# kernels and copies, headroom's packed GEMM), each fused kernel, the optimizer, OpenMP's waits, the kernel (page
# faults), libc's copies. Prints a markdown table of shares. Needs perf.
# Usage: tests/bench/step_profile.sh [BUILD_DIR] CONFIG [--set KEY=VALUE ...]   (from the repository root)
# PROFILE_STEPS timed steps (default 12), PROFILE_DELAY_MS the delay before sampling starts (default 4000),
# PROFILE_TOP=N also lists each category's N largest symbols.
set -euo pipefail
cd "$(dirname "$0")/../.."
build=build
if [ -d "${1:-}" ]; then build=$1; shift; fi
cfg=$1
shift
data=$(mktemp -d)
trap 'rm -rf "$data"' EXIT
ONEDNN_JIT_PROFILE=2 perf record -q -F 999 -D "${PROFILE_DELAY_MS:-4000}" -o "$data/perf.data" \
  "$build/train/headroom" bench "$cfg" --steps "${PROFILE_STEPS:-12}" --warmup 1 "$@" > "$data/bench.json" 2> /dev/null
perf report -i "$data/perf.data" --no-children --sort dso,sym --stdio -g none 2> /dev/null > "$data/report.txt"
python3 - "$data/report.txt" "$data/bench.json" <<'PY'
import json
import os
import re
import sys

categories = [  # (name, dso pattern, symbol pattern): the first match wins
    ("GEMM (oneDNN JIT kernels and copies)", r"^\[JIT\]|libdnnl", r""),
    # packed_gemm.cpp's loop over tiles (`run`) and its write-back (`write_tile`) too.
    ("GEMM (headroom's packed GEMM)", r"headroom",
     r"packed_gemm|pack_panels|pack_transposed_f32|microkernel|gemm|write_tile|cpu::\(anonymous namespace\)::run<"),
    # The 16-lane sigmoid lives beside the attention tiles (f32_tiles) but runs SwiGLU's and quick GELU's; the 8-lane
    # one (vector_math.cpp's `sigmoid`) the same where the CPU has no AVX-512.
    ("SwiGLU (and the sigmoid it shares with quick GELU)", r"headroom",
     r"swiglu|sigmoid_floats|load_sigmoid|::sigmoid(?:$|[ (])"),
    ("attention", r"headroom", r"attention|f32_tiles|f32x8_tiles|bf16_tiles|row_deltas|online_softmax|query_tile"
                               r"|forward_tiles"
                               r"|forward_columns|backward_tile"),
    ("residual + norm", r"headroom", r"norm_forward|norm_backward|sum_partials"),
    ("activations (GELU, SiLU)", r"headroom", r"unary_|activation"),
    ("RoPE", r"headroom", r"rope"),
    ("cross-entropy", r"headroom", r"cross_entropy|exp_floats|logsumexp"),
    ("optimizer", r"headroom", r"adamw|for_each_update|optimizer|clip|grad_norm"),
    ("bias sums, reductions (the gradient norm's too)", r"headroom", r"sum_leading|reduce|sum_fixed"),
    ("other element-wise (add, scale, fill, copy, embedding)", r"headroom", r"axpby|fill|copy|embedding|convert"),
    ("OpenMP waits", r"libgomp", r""),
    ("Linux kernel (page faults, syscalls)", r"kernel", r""),
    ("libc (memcpy, memset, malloc)", r"libc", r""),
]
shares = {name: 0.0 for name, _, _ in categories}
members = {name: [] for name, _, _ in categories + [("everything else", "", "")]}
other = 0.0
for line in open(sys.argv[1]):
    m = re.match(r"\s+([\d.]+)%\s+(\S+(?: tid \d+)?)\s+\[.\]\s+(.*)", line)
    if not m:
        continue
    pct, dso, sym = float(m.group(1)), m.group(2), m.group(3)
    for name, dso_re, sym_re in categories:
        if re.search(dso_re, dso) and re.search(sym_re, sym):
            shares[name] += pct
            members[name].append((pct, sym))
            break
    else:
        other += pct
        members["everything else"].append((pct, sym))
b = json.load(open(sys.argv[2]))
c = b.get("cpu_id", {})
ck = b["checkpointing"]
ck = ", ".join(f"{k} {v}" for k, v in ck.items()) if isinstance(ck, dict) else ck
print(f"{b['config']}, {b['precision']}, checkpointing {ck}: step median {b['step_ms']['median']:.0f} ms, "
      f"{b['threads_per_rank']} threads, {c.get('name', b['cpu'])} (family {c.get('family', '?')} model "
      f"{c.get('model', '?')}), oneDNN ISA {b['isa']}\n")
print("| where | share of samples |")
print("| --- | --- |")
for name, _, _ in categories:
    if shares[name] >= 0.05:
        print(f"| {name} | {shares[name]:.1f}% |")
print(f"| everything else | {other:.1f}% |")
top = int(os.environ.get("PROFILE_TOP", "0"))
for name, syms in members.items():
    if top and syms:
        print(f"\n{name}:")
        for pct, sym in sorted(syms, reverse=True)[:top]:
            print(f"  {pct:5.2f}%  {sym[:150]}")
PY
