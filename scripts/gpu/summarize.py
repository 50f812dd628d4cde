#!/usr/bin/env python3
"""The summary of a GPU check (check.sh): what each step did, read back from the check's work directory.

    summarize.py WORK STEPS_JSONL           the summary as JSON (check.sh writes it as summary.json)
    summarize.py --table WORK STEPS_JSONL   a short table of the same, for the end of the call's output

Reads: STEPS_JSONL (one line per step: exit status, seconds, budget), the gtest reports (NAME.json, or the
log's [ OK ] / [ FAILED ] lines when a step was cut short before its report), the 20-step training's memory logs
(CPU and cuda:0), the bench and peer JSONs and nvidia-smi's line. Every figure here is read from a file the
check wrote; none is computed from assumptions, except MFU, which divides the bench's model FLOPs a step over its
median step time by the card's dense bf16 peak from its datasheet (named in the output).
"""
import glob
import json
import os
import re
import sys

# Dense (no sparsity) bf16 tensor-core peaks, TFLOP/s, from NVIDIA's datasheets.
BF16_PEAK_TFLOPS = {"H100 80GB HBM3": 989.4, "H100 SXM": 989.4, "H100 PCIe": 756.0, "H100 NVL": 835.0,
                    "H200": 989.4, "A100": 312.0}


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def jsonl(path):
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError):
        return []


def gtest_result(work, name):
    """Counts, the failing tests with the start of their messages, and the skipped ones."""
    report = load(os.path.join(work, name + ".json"))  # none where a run was cut short, or gtest wrote bad JSON
    if report:
        failed, skipped, passed = [], [], []
        for suite in report.get("testsuites", []):
            for t in suite.get("testsuite", []):
                full = suite["name"] + "." + t["name"]
                if t.get("failures"):
                    failed.append({"test": full, "message": "\n".join(f["failure"] for f in t["failures"])[:1200]})
                elif t.get("result") == "SKIPPED":
                    skipped.append(full)
                else:
                    passed.append(full)
        return {"tests": report.get("tests"), "passed": len(passed), "failed": failed, "skipped": skipped}
    try:
        log = open(os.path.join(work, name + ".log"), errors="replace").read()
    except OSError:
        return None
    ok = re.findall(r"^\[       OK \] (\S+)", log, re.M)
    bad = sorted(set(re.findall(r"^\[  FAILED  \] (\S+\.\S+)", log, re.M)))
    running = re.findall(r"^\[ RUN      \] (\S+)", log, re.M)
    cut = [t for t in running if t not in ok and t not in bad]
    # Failures outside a test (a global environment's SetUp) have no test name: their messages, as printed.
    messages = [m.strip()[:600] for m in re.findall(r"^\S+:\d+: Failure\n(?:(?!\[).*\n){1,6}", log, re.M)]
    return {"passed": len(ok), "failed": [{"test": t} for t in bad] or [{"test": "(outside a test)", "message": m}
                                                                       for m in messages[:3]],
            "skipped": sorted(set(re.findall(r"^\[  SKIPPED \] (\S+\.\S+)", log, re.M))), "cut_short_in": cut, "from": "log"}


def train_twenty(work):
    """The 20-step f32 training of test_cuda_train: losses against the CPU, every peak against its dry run."""
    gpu = glob.glob(os.path.join(work, "tmp", "**", "cuda_train", "gpu", "memory.jsonl"), recursive=True)
    if not gpu:
        return None
    cpu = jsonl(os.path.join(os.path.dirname(os.path.dirname(gpu[0])), "cpu", "memory.jsonl"))
    rows = []
    for i, g in enumerate(jsonl(gpu[0])):
        c = cpu[i] if i < len(cpu) else {}
        rows.append({k: g.get(k) for k in ("step", "loss", "predicted_peak", "peak_allocated", "predicted_reserved",
                                            "peak_reserved", "device_free", "device_total")} |
                    {"loss_cpu": c.get("loss")})
    diffs = [abs(r["loss"] - r["loss_cpu"]) for r in rows if r["loss"] is not None and r["loss_cpu"] is not None]
    return {
        "steps": len(rows),
        "peaks_equal_dry_run": sum(r["predicted_peak"] == r["peak_allocated"] for r in rows),
        "reserved_equal_dry_run": sum(r["predicted_reserved"] == r["peak_reserved"] for r in rows),
        "max_loss_diff_vs_cpu": max(diffs) if diffs else None,
        "rows": rows,
    }


def bench(work, name, gpu_name):
    b = load(os.path.join(work, name + ".json"))
    if not b:
        return None
    keep = ("device", "precision", "stage", "checkpointing", "micro_batch_size", "gradient_accumulation_steps",
            "global_batch_size", "max_seq_len", "steps", "step_ms", "tokens_per_step", "loss_tokens_per_step",
            "tokens_per_s", "model_gflop_per_step", "ran_gflop_per_step",
            "achieved_gflops", "peak_allocated_mib", "peak_reserved_mib", "steps_predicted_exactly", "peak_rss_mib")
    out = {k: b.get(k) for k in keep}
    peak = next((v for k, v in BF16_PEAK_TFLOPS.items() if gpu_name and k in gpu_name), None)
    step_s = (b.get("step_ms") or {}).get("median", 0) / 1e3
    if peak and b.get("model_gflop_per_step") and step_s > 0:
        # The model's FLOPs over the batch (not what the kernels ran: lm_head past the labelled rows is skipped).
        out["mfu"] = b["model_gflop_per_step"] / step_s / 1e3 / peak
        out["mfu_peak_tflops"] = peak
    return out


def gpu_line(work):
    try:
        lines = [line for line in open(os.path.join(work, "gpu.log")) if line.strip()]
        return lines[1].strip() if len(lines) > 1 else None
    except OSError:
        return None


def summary(work, steps_path):
    steps = jsonl(steps_path)
    gpu = gpu_line(work)
    gpu_name = gpu.split(",")[0] if gpu else None
    out = {"gpu": gpu, "steps": steps}
    try:
        out["build"] = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "BUILD")).read().strip()
    except OSError:
        pass
    try:
        names = sorted({line.strip() for line in open(os.path.join(work, "gtests.txt")) if line.strip()})
    except OSError:
        names = []
    out["gtests"] = {n: r for n in names if (r := gtest_result(work, n)) is not None}
    out["train_twenty"] = train_twenty(work)
    benches = ("bench_gpu", "bench_gpu_full_ckpt", "bench_gpu_no_ckpt", "bench_gpu_caching_no_ckpt",
               "bench_gpu_own_attention", "bench_gpu_profile", "bench_gpu_unfused")
    out["bench"] = {n: r for n in benches if (r := bench(work, n, gpu_name))}
    out["peer"] = {n: p for n in ("peer_gpu", "peer_gpu_full_ckpt", "peer_gpu_no_ckpt")
                   if (p := load(os.path.join(work, n + ".json")))}
    out["pairs"] = {n: r for n in ("gpu", "gpu_full_ckpt", "gpu_no_ckpt")
                    if (r := pair(out["bench"].get("bench_" + n), out["peer"].get("peer_" + n)))}
    profile = load(os.path.join(work, "op_profile.json"))
    if profile:
        out["op_profile"] = profile
    return out


def pair(b, p):
    """headroom's bench beside the peer on the same batch shape (global batch x max_seq_len positions, padded,
    one image each). tokens/s here counts every position, as the peer does; the bench's own tokens_per_s counts
    the tokens that are not padding."""
    if not b or not p or not b.get("step_ms") or not p.get("step_ms"):
        return None
    positions = b["global_batch_size"] * b["max_seq_len"]
    hr_ms, peer_ms = b["step_ms"]["median"], p["step_ms"]["median"]
    out = {"checkpointing": b.get("checkpointing"), "headroom_step_ms": hr_ms, "peer_step_ms": peer_ms,
           "headroom_positions_per_s": positions / hr_ms * 1e3, "peer_positions_per_s": positions / peer_ms * 1e3,
           "speed_headroom_over_peer (goal >= 1.2)": peer_ms / hr_ms, "mfu (goal >= 0.50)": b.get("mfu"),
           "headroom_peak_allocated_mib": b.get("peak_allocated_mib"), "headroom_peak_reserved_mib":
           b.get("peak_reserved_mib"), "peer_max_memory_allocated_mib": p.get("max_memory_allocated_mib"),
           "peer_max_memory_reserved_mib": p.get("max_memory_reserved_mib")}
    if b.get("peak_reserved_mib") and p.get("max_memory_reserved_mib"):
        out["reserved_headroom_over_peer (goal <= 0.8)"] = b["peak_reserved_mib"] / p["max_memory_reserved_mib"]
    return out
    return out


def table(s):
    lines = [f"gpu: {s.get('gpu')}"]
    for st in s["steps"]:
        if "skipped" in st:
            lines.append(f"  {st['step']:<26} skipped ({st['skipped']})")
            continue
        g = s["gtests"].get(st["step"])
        tests = f"  {g['passed']} passed, {len(g['failed'])} failed" if g else ""
        if g and g.get("skipped"):
            tests += f", {len(g['skipped'])} skipped"
        cut = "  TIMED OUT" if st.get("timed_out") else ""
        lines.append(f"  {st['step']:<26} exit {st['exit']:<3} {st['seconds']:>6} s / {st['limit']:<4}{cut}{tests}")
        for f in (g or {}).get("failed", [])[:6]:
            lines.append(f"      FAILED {f['test']}: {' | '.join(f.get('message', '').splitlines()[:3])[:300]}")
    t = s.get("train_twenty")
    if t:
        lines.append(f"train_twenty: {t['steps']} steps, peak == dry run on {t['peaks_equal_dry_run']}, reserved == dry run "
                     f"on {t['reserved_equal_dry_run']}, max |loss - cpu| {t['max_loss_diff_vs_cpu']}")
        for r in t["rows"][:2] + t["rows"][-1:]:
            lines.append(f"  step {r['step']}: peak {r['peak_allocated']} vs {r['predicted_peak']}, reserved "
                         f"{r['peak_reserved']} vs {r['predicted_reserved']}, loss {r['loss']} vs {r['loss_cpu']}")
    for n, b in s["bench"].items():
        lines.append(f"{n}: {b['step_ms']['median'] if b.get('step_ms') else None} ms/step, {b.get('tokens_per_s')} tok/s, "
                     f"mfu {b.get('mfu')}, peak alloc {b.get('peak_allocated_mib')} MiB, reserved "
                     f"{b.get('peak_reserved_mib')} MiB, exact {b.get('steps_predicted_exactly')}")
    for n, p in s.get("pairs", {}).items():
        lines.append(f"pair {n} ({p['checkpointing']}): headroom {p['headroom_step_ms']:.1f} ms vs peer "
                     f"{p['peer_step_ms']:.1f} ms = {p['speed_headroom_over_peer (goal >= 1.2)']:.3f}x; reserved "
                     f"{p['headroom_peak_reserved_mib']} vs {p['peer_max_memory_reserved_mib']} MiB = "
                     f"{p.get('reserved_headroom_over_peer (goal <= 0.8)')}; allocated {p['headroom_peak_allocated_mib']}"
                     f" vs {p['peer_max_memory_allocated_mib']}")
    prof = s.get("op_profile")
    if prof:
        steps = ", ".join(f"{st['gpu_ms']:.0f}/{st['wall_ms']:.0f}" for st in prof["steps"])
        lines.append(f"op profile, GPU/wall ms per step: {steps}; the last step by op:")
        for o in prof["last_step"]["ops"][:14]:
            lines.append(f"  {o['op']:<28} {o['calls']:>7} calls {o['ms']:>10.1f} ms {100 * o['share']:5.1f}%")
    return "\n".join(lines)


def main():
    args = sys.argv[1:]
    as_table = args[:1] == ["--table"]
    if as_table:
        args = args[1:]
    s = summary(*args)
    print(table(s) if as_table else json.dumps(s, indent=1))


if __name__ == "__main__":
    main()
