#!/usr/bin/env bash
# The three memory.allocator kinds side by side on one config: each trains the same steps, and the table shows
# rank 0's peak allocated and reserved over the run, their ratio, the largest per-step ratio, the steps whose
# measured peaks differ from their dry runs, and the median tokens/s (the first 5 steps left out).
#   tests/bench/allocators.sh [CONFIG] [STEPS] [RANKS]    (defaults: configs/quickstart.yaml, 60, 2)
# HEADROOM (default build/train/headroom) is the binary; extra --set arguments go in HR_SETS.
set -euo pipefail
cd "$(dirname "$0")/../.."
config=${1:-configs/quickstart.yaml}
steps=${2:-60}
ranks=${3:-2}
bin=${HEADROOM:-build/train/headroom}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
printf '%-11s %14s %14s %9s %12s %10s %9s\n' allocator peak_alloc peak_reserved ratio worst_step mismatches tokens/s
for kind in caching expandable planned; do
  # shellcheck disable=SC2086
  mpirun --oversubscribe -np "$ranks" "$bin" train "$config" --set run.output_dir="$out/$kind" \
    --set train.max_steps="$steps" --set log.progress_bar=false --set memory.allocator="$kind" ${HR_SETS:-} \
    > "$out/$kind.log" 2>&1 || { cat "$out/$kind.log"; exit 1; }
  log="$out/$kind/memory.rank0.jsonl"
  [ -f "$log" ] || log="$out/$kind/memory.jsonl"
  python3 - "$kind" "$log" <<'PY'
import json, statistics, sys
kind, path = sys.argv[1], sys.argv[2]
rows = [json.loads(l) for l in open(path)]
alloc = max(r["peak_allocated"] for r in rows)
res = max(r["peak_reserved"] for r in rows)
worst = max(r["peak_reserved"] / r["peak_allocated"] for r in rows)
bad = sum(r["peak_allocated"] != r["predicted_peak"] or r["peak_reserved"] != r["predicted_reserved"] for r in rows)
tps = statistics.median(r["tokens_per_s"] for r in rows[5:] or rows)
print(f"{kind:<11} {alloc:>14,} {res:>14,} {res / alloc:>9.4f} {worst:>12.4f} {bad:>10} {tps:>9.0f}")
PY
done
