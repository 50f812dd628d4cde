#!/usr/bin/env bash
# f32 AdamW and 8-bit AdamW side by side on one config (default: the quickstart, whole, 2 ranks): each trains the
# same steps from the same seed, and the table shows, per evaluation, the eval loss and accuracy of each, then the
# training loss (rank 0's, averaged over each 250 steps), rank 0's optimizer bytes and peak allocated, and the
# steps whose measured peaks differ from their dry runs.
#   tests/bench/optimizer_8bit.sh [CONFIG] [RANKS] [OUT]    (defaults: configs/quickstart.yaml, 2, a temporary dir)
# HEADROOM (default build/train/headroom) is the binary; extra --set arguments go in HR_SETS; HR_REUSE=1 with OUT
# tabulates runs already in OUT/adamw and OUT/adamw_8bit.
set -euo pipefail
cd "$(dirname "$0")/../.."
config=${1:-configs/quickstart.yaml}
ranks=${2:-2}
out=${3:-}
bin=${HEADROOM:-build/train/headroom}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
if [[ -z $out ]]; then
  out=$(mktemp -d)
  trap 'rm -rf "$out"' EXIT
fi
for opt in adamw adamw_8bit; do
  [[ ${HR_REUSE:-0} == 1 && -s $out/$opt/eval.jsonl ]] && continue
  # shellcheck disable=SC2086
  mpirun --oversubscribe -np "$ranks" "$bin" train "$config" --set run.output_dir="$out/$opt" \
    --set train.optimizer="$opt" --set log.progress_bar=false --set log.report_to=none ${HR_SETS:-} \
    > "$out/$opt.log" 2>&1 || { tail -20 "$out/$opt.log"; exit 1; }
done
python3 - "$out" <<'PY'
import json, os, sys
out = sys.argv[1]
def lines(path):
    return [json.loads(l) for l in open(path)] if os.path.exists(path) else []
def memory(opt):
    for name in ("memory.rank0.jsonl", "memory.jsonl"):
        rows = lines(os.path.join(out, opt, name))
        if rows:
            return rows
    return []
evals = {o: {e["step"]: e for e in lines(os.path.join(out, o, "eval.jsonl"))} for o in ("adamw", "adamw_8bit")}
print(f"{'step':>6} {'eval loss adamw':>16} {'8-bit':>10} {'accuracy adamw':>15} {'8-bit':>8}")
for step in sorted(evals["adamw"]):
    a, b = evals["adamw"][step], evals["adamw_8bit"].get(step)
    if b:
        print(f"{step:>6} {a['loss']:>16.4f} {b['loss']:>10.4f} {100 * a['accuracy']:>14.1f}% {100 * b['accuracy']:>7.1f}%")
mem = {o: memory(o) for o in ("adamw", "adamw_8bit")}
print(f"\n{'steps':>11} {'train loss adamw':>17} {'8-bit':>10}")
n = min(len(mem["adamw"]), len(mem["adamw_8bit"]))
for start in range(0, n, 250):
    mean = lambda rows: sum(r["loss"] for r in rows[start:start + 250]) / len(rows[start:start + 250])
    print(f"{start + 1:>5}-{min(start + 250, n):<5} {mean(mem['adamw']):>17.4f} {mean(mem['adamw_8bit']):>10.4f}")
for o in ("adamw", "adamw_8bit"):
    rows = mem[o]
    off = sum(r["peak_allocated"] != r["predicted_peak"] or r["peak_reserved"] != r["predicted_reserved"] for r in rows)
    print(f"{o}: optimizer {rows[-1]['by_category']['optimizer']:,} B, peak allocated "
          f"{max(r['peak_allocated'] for r in rows):,} B, steps off their dry run {off} of {len(rows)}")
PY
