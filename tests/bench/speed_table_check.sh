#!/usr/bin/env bash
# tests/bench/speed_table.sh with SPEED_ROUNDS (no timing is asserted): one small row, three rounds against
# Debian's torch 1.13; each round keeps its own JSON, a cell is the median of the rounds' step times, the ratio is
# the median of the rounds' own ratios with their range, and the bench's run directory lies under OUT_DIR.
# Usage: speed_table_check.sh BUILD_DIR WORK_DIR
set -euo pipefail
build=$1 work=$2
root=$(cd "$(dirname "$0")/../.." && pwd)
py="${HR_PYENV:-$root/.pyenv}/bin/python3"
[ -x "$py" ] || py=/usr/bin/python3
rm -rf "$work"
mkdir -p "$work"
tag="2.0M (4 × 128)-fp32-none"
SPEED_ROWS='^2\.0M.*-fp32-none$' BENCH_STEPS=1 SPEED_ROUNDS=3 TORCH1_PYTHON="$py" TORCH2_PYTHON= \
  "$root/tests/bench/speed_table.sh" "$build" "$work/out" > "$work/table.md"
cat "$work/table.md"
python3 - "$work" "$tag" <<'PY'
import json
import os
import re
import statistics
import sys

work, tag = sys.argv[1], sys.argv[2]
out = os.path.join(work, "out")
rows = [l for l in open(os.path.join(work, "table.md")) if l.startswith("| 2.0M")]
assert len(rows) == 1, rows  # SPEED_ROWS picked one row
cells = [c.strip() for c in rows[0].strip().strip("|").split("|")]
assert cells[:3] == ["2.0M (4 × 128)", "fp32", "none"], cells


def medians(program):
    names = [f"{tag}.{program}.json"] + [f"{tag}.{program}.r{r}.json" for r in (2, 3)]
    return [json.load(open(os.path.join(out, n)))["step_ms"]["median"] for n in names]


h, t1 = medians("headroom"), medians("torch1")
assert cells[3] == f"{round(statistics.median(round(x) for x in h))} ms", (cells, h)
assert cells[4] == f"{round(statistics.median(round(x) for x in t1))} ms", (cells, t1)
assert cells[5] == cells[6] == "—", cells  # no PyTorch 2 named
ratios = [round(b) / round(a) for a, b in zip(h, t1)]
m = re.fullmatch(r"(\d+\.\d\d) \((\d+\.\d\d)–(\d+\.\d\d)\)", cells[7])
assert m, cells[7]
assert m.groups() == (f"{statistics.median(ratios):.2f}", f"{min(ratios):.2f}", f"{max(ratios):.2f}"), (m.groups(), ratios)
# Each round ran its own bench, whose run directory is under OUT_DIR.
assert os.path.isdir(os.path.join(out, "runs", tag)), os.listdir(out)
PY
# SPEED_ISA=avx2: headroom's bench ran on oneDNN's avx2 (so its packed GEMM), the twin under the same caps, and the
# table says it was an emulation.
SPEED_ISA=avx2 SPEED_ROWS='^2\.0M.*-fp32-none$' BENCH_STEPS=1 TORCH1_PYTHON="$py" TORCH2_PYTHON= \
  "$root/tests/bench/speed_table.sh" "$build" "$work/avx2" > "$work/avx2.md"
grep -q "^| 2.0M (4 × 128) | fp32 | none | [0-9]* ms | [0-9]* ms | — | — | " "$work/avx2.md"
grep -q "oneDNN ISA avx2;" "$work/avx2.md"
grep -q "^Emulated: SPEED_ISA=avx2" "$work/avx2.md"
python3 -c "import json,sys; assert json.load(open(sys.argv[1]))['isa'] == 'avx2'" "$work/avx2/$tag.headroom.json"
# A round count that is not a positive integer, or an ISA it cannot emulate, is refused by name.
if SPEED_ISA=avx512 "$root/tests/bench/speed_table.sh" "$build" "$work/out0" > /dev/null 2> "$work/err.txt"; then
  echo "SPEED_ISA=avx512 was accepted" >&2
  exit 1
fi
grep -q "SPEED_ISA is avx2 or unset, not 'avx512'" "$work/err.txt"
if SPEED_ROUNDS=0 "$root/tests/bench/speed_table.sh" "$build" "$work/out0" > /dev/null 2> "$work/err.txt"; then
  echo "SPEED_ROUNDS=0 was accepted" >&2
  exit 1
fi
grep -q "SPEED_ROUNDS must be a positive integer, not '0'" "$work/err.txt"
echo "speed table rounds and ISA: ok"
