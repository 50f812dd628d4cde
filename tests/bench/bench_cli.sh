#!/usr/bin/env bash
# `headroom bench` and its PyTorch twin work together (no timing is asserted): bench prints one JSON object on
# stdout with a step time, tokens/s, the FLOPs a step and the achieved GFLOP/s and the Hugging Face config; scripts/torch_twin.py reads
# it, builds the same model in transformers, runs the same batch and prints its own step time and the ratio.
# Usage: bench_cli.sh HEADROOM WORK_DIR
set -euo pipefail
bin=$1 work=$2
root=$(cd "$(dirname "$0")/../.." && pwd)
# The twin needs torch and transformers: the oracle venv scripts/setup.sh makes, else Debian's python3.
py="${HR_PYENV:-$root/.pyenv}/bin/python3"
[ -x "$py" ] || py=/usr/bin/python3
rm -rf "$work"
mkdir -p "$work"
cd "$work"
"$bin" bench "$root/tests/bench/configs/bench-2m.yaml" --steps 2 --warmup 1 --set run.output_dir="$work/run" \
  > hr.json 2> hr.log
python3 - <<'PY'
import json
b = json.load(open("hr.json"))
assert b["steps"] == 2 and b["warmup_steps"] == 1, b
assert b["step_ms"]["median"] > 0 and b["tokens_per_s"] > 0 and b["achieved_gflops"] > 0, b
assert 0 < b["tokens_per_step"] <= 4 * 128, b  # the tokens of 4 conversations padded to 128 positions
assert 0 < b["loss_tokens_per_step"] < b["tokens_per_step"], b  # the answers' tokens
# 2 x parameters x tokens for the matmuls alone, forward and backward, is a floor for the model's FLOPs.
assert b["model_gflop_per_step"] * 1e9 > 6 * 1.5e6 * 4 * 128, b
# What the matrix products ran: padding-free keeps only the positions the loss reads and lm_head runs only the
# labelled rows, so less than the model's count over the padded batch; the achieved rate is theirs.
assert 0 < b["ran_gflop_per_step"] < b["model_gflop_per_step"], b
assert abs(b["achieved_gflops"] * b["step_ms"]["median"] / 1e3 - b["ran_gflop_per_step"]) < 1e-6 * b["ran_gflop_per_step"], b
assert b["hf_config"]["model_type"] == "llava", b
assert b["peak_rss_mib"] > 0 and b["isa"] and b["cpu"] and b["bf16_gemm"] and b["bf16_attention"], b
assert b["cpu_id"]["vendor"] and b["cpu_id"]["family"] is not None and b["cpu_id"]["model"] is not None, b["cpu_id"]
PY
# The run's own lines went to stderr; no checkpoint, no evaluation.
grep -q "step 3/3" hr.log
test ! -e run/bench/checkpoint-3
"$py" "$root/scripts/torch_twin.py" hr.json --steps 1 --warmup 0 > twin.json
python3 - <<'PY'
import json
t, b = json.load(open("twin.json")), json.load(open("hr.json"))
assert t["steps"] == 1 and t["step_ms"]["median"] > 0 and t["ratio_torch_over_headroom"] > 0, t
# As many labels per sequence as headroom's step had, over headroom's tokens a step.
want = max(1, round(b["loss_tokens_per_step"] / b["global_batch_size"]))
assert t["labelled_per_sequence"] == want, (t, b["loss_tokens_per_step"])
assert abs(t["tokens_per_s"] * t["step_ms"]["median"] / 1e3 - b["tokens_per_step"]) < 1e-6 * b["tokens_per_step"], t
assert t["positions_per_s"] >= t["tokens_per_s"], t
PY
echo "bench and twin: ok"
