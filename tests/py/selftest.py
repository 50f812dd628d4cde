#!/usr/bin/env python3
"""Tests the checkers of tests/py against reference files made here with the real libraries, and broken copies.

    python3 tests/py/selftest.py [--keep DIR] [--no-report]

The reference files: TensorBoard event files written by torch.utils.tensorboard.SummaryWriter (Debian's torch 1.13
with the venv's tensorboard) beside the memory / eval JSON lines they were written from; a Chrome trace written
by hand to the trace-event format; an allocator snapshot pickle in the superset format that torch 1.13's and 2.x's
memory_viz readers both take (/tmp/memviz_format.md); an HTML page with an inline SVG and a script. Each checker
must accept the reference and reject every broken copy naming the fault. --keep DIR keeps the files there;
--no-report skips the Chromium cases. Ends with the line "selftest: N passed, N failed".
"""
import argparse
import copy
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _oracle_env  # noqa: E402

_oracle_env.require("torch", "tensorboard", "numpy")

HERE = os.path.dirname(os.path.abspath(__file__))
MiB = 1 << 20

# --------------------------------------------------------------------------------------------- tfevents

TRAIN = {"train/loss": "loss", "train/learning_rate": "lr", "train/grad_norm": "grad_norm",
         "train/loss_scale": "loss_scale", "train/tokens_per_s": "tokens_per_s",
         "train/samples_per_s": "samples_per_s", "train/comm_exposed_s": "comm_exposed_s",
         "memory/allocated": "allocated", "memory/reserved": "reserved",
         "memory/peak_allocated": "peak_allocated", "memory/peak_reserved": "peak_reserved",
         "memory/predicted_peak": "predicted_peak", "memory/predicted_reserved": "predicted_reserved",
         "memory/planned_peak": "planned_peak", "memory/fragmentation": "fragmentation",
         "memory/host_rss": "host_rss"}


def memory_rows(rank, steps):
    rows = []
    for step in steps:
        rows.append({
            "step": step, "loss": 2.0 / step + rank * 0.01, "lr": 1e-3 * step / 7, "grad_norm": 1.2345678 + step,
            "loss_scale": 65536.0, "tokens_per_s": 1234.5 + step / 3, "samples_per_s": 33.3,
            "comm_exposed_s": 0.0125 * step if rank else 0.0,
            "allocated": 123456789 + step, "reserved": 1 << 27, "peak_allocated": 150000001 + rank,
            "peak_reserved": 1 << 28, "predicted_peak": None if step == steps[0] else 150000001 + rank,
            "predicted_reserved": 1 << 28, "planned_peak": None, "fragmentation": 0.1234567,
            "by_category": {"params": 1000, "grads": 1000, "activations": 5000 + step},
            "host_rss": 987654321 + step, "host": {"allocated": 5555555}})
    return rows


EVAL = [{"step": 5, "loss": 0.5, "accuracy": 0.9, "samples": 300,
         "accuracy_by_type": {"color": 0.87, "count": 1.0}}]


def write_run(d, ranks=2, steps=(1, 2, 3, 4, 5), skip_tag=None, extra_tag=None, eval_rows=EVAL, start=True):
    """A run directory as headroom would leave it, the event file written by torch's SummaryWriter (with start, its
    purge_step at the first step: the SessionLog START every headroom run writes)."""
    from torch.utils.tensorboard import SummaryWriter
    os.makedirs(d, exist_ok=True)
    rows = {r: memory_rows(r, list(steps)) for r in range(ranks)}
    names = ["memory.jsonl"] if ranks == 1 else [f"memory.rank{r}.jsonl" for r in range(ranks)]
    for r, name in enumerate(names):
        with open(os.path.join(d, name), "w") as f:
            f.writelines(json.dumps(o) + "\n" for o in rows[r])
    if eval_rows is not None:
        with open(os.path.join(d, "eval.jsonl"), "w") as f:
            f.writelines(json.dumps(o) + "\n" for o in eval_rows)
    w = SummaryWriter(os.path.join(d, "runs"), purge_step=steps[0] if start else None)

    def put(tag, v, step):
        if v is not None and tag != skip_tag:
            w.add_scalar(tag, v, step)

    for i, o in enumerate(rows[0]):
        for tag, key in TRAIN.items():
            put(tag, o[key], o["step"])
        put("memory/host_allocated", o["host"]["allocated"], o["step"])
        for c, v in o["by_category"].items():
            put(f"memory/category/{c}", v, o["step"])
        if ranks > 1:
            for r in range(ranks):
                for k in ("peak_allocated", "peak_reserved", "predicted_peak", "host_rss"):
                    put(f"memory/rank{r}/{k}", rows[r][i][k], rows[r][i]["step"])
        if extra_tag:
            put(extra_tag, 1.0, o["step"])
    for e in eval_rows or []:
        put("eval/loss", e["loss"], e["step"])
        put("eval/accuracy", e["accuracy"], e["step"])
        for k, v in e["accuracy_by_type"].items():
            put(f"eval/accuracy/{k}", v, e["step"])
    w.close()
    return d


def event_file(d):
    runs = os.path.join(d, "runs")
    return os.path.join(runs, [f for f in os.listdir(runs) if f.startswith("events.out.tfevents")][0])


def tfevents_cases(root):
    good = write_run(os.path.join(root, "run_good"))
    cases = [("tfevents: reference run, 2 ranks", ["check_tfevents.py", good], 0, "OK"),
             ("tfevents: reference run, 1 process",
              ["check_tfevents.py", write_run(os.path.join(root, "run_single"), ranks=1)], 0, "OK")]

    d = os.path.join(root, "run_crc")
    shutil.copytree(good, d)
    p = event_file(d)
    b = bytearray(open(p, "rb").read())
    b[len(b) // 2] ^= 0xFF
    open(p, "wb").write(b)
    cases.append(("tfevents: a flipped byte", ["check_tfevents.py", d], 1, "crc32"))

    d = os.path.join(root, "run_nofv")  # drop the first two records (file_version, and purge_step's again)
    shutil.copytree(good, d)
    p = event_file(d)
    b = open(p, "rb").read()
    for _ in range(2):
        n = int.from_bytes(b[:8], "little")
        b = b[8 + 4 + n + 4:]
    open(p, "wb").write(b)
    cases.append(("tfevents: no file_version event", ["check_tfevents.py", d], 1, "brain.Event:2"))
    cases.append(("tfevents: no SessionLog START",
                  ["check_tfevents.py", write_run(os.path.join(root, "run_nostart"), start=False)], 1,
                  "no SessionLog START before the summaries"))

    cases.append(("tfevents: a tag missing",
                  ["check_tfevents.py", write_run(os.path.join(root, "run_missing"),
                                                  skip_tag="memory/category/grads")], 1,
                  "tag memory/category/grads missing"))
    cases.append(("tfevents: an unexpected tag",
                  ["check_tfevents.py", write_run(os.path.join(root, "run_extra"), extra_tag="memory/bogus")], 1,
                  "unexpected tag memory/bogus"))

    d = os.path.join(root, "run_value")  # the source says otherwise for one step
    shutil.copytree(good, d)
    rows = [json.loads(x) for x in open(os.path.join(d, "memory.rank0.jsonl"))]
    rows[2]["grad_norm"] += 1e-3
    with open(os.path.join(d, "memory.rank0.jsonl"), "w") as f:
        f.writelines(json.dumps(o) + "\n" for o in rows)
    cases.append(("tfevents: a value differs", ["check_tfevents.py", d], 1, "tag train/grad_norm step 3"))

    d = os.path.join(root, "run_steps")  # one more line in rank 1's file than was logged
    shutil.copytree(good, d)
    with open(os.path.join(d, "memory.rank1.jsonl"), "a") as f:
        f.write(json.dumps(memory_rows(1, [6])[0]) + "\n")
    cases.append(("tfevents: a step missing", ["check_tfevents.py", d], 1, "tag memory/rank1/host_rss: steps"))

    d = os.path.join(root, "run_f32")  # float32 rounding is what is compared: a float64-only change passes
    shutil.copytree(good, d)
    rows = [json.loads(x) for x in open(os.path.join(d, "memory.rank0.jsonl"))]
    rows[1]["loss"] = rows[1]["loss"] * (1 + 1e-12)
    with open(os.path.join(d, "memory.rank0.jsonl"), "w") as f:
        f.writelines(json.dumps(o) + "\n" for o in rows)
    cases.append(("tfevents: a change below float32 precision", ["check_tfevents.py", d], 0, "OK"))
    return cases


# --------------------------------------------------------------------------------------------- trace

def reference_trace():
    ev = [
        {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "ts": 0, "args": {"name": "rank 0"}},
        {"ph": "M", "name": "thread_name", "pid": 0, "tid": 1, "ts": 0, "args": {"name": "train"}},
        {"ph": "M", "name": "process_sort_index", "pid": 0, "tid": 0, "ts": 0, "args": {"sort_index": 0}},
    ]
    t = 0.0
    for step in range(1, 4):
        ev.append({"ph": "X", "name": f"step {step}", "cat": "step", "pid": 0, "tid": 1, "ts": t, "dur": 1000.0,
                   "args": {"step": step}})
        ev.append({"ph": "X", "name": "forward", "pid": 0, "tid": 1, "ts": t + 10, "dur": 400.5})
        ev.append({"ph": "B", "name": "language_model.model.layers.0.mlp", "pid": 0, "tid": 1, "ts": t + 20})
        ev.append({"ph": "E", "pid": 0, "tid": 1, "ts": t + 120})
        ev.append({"ph": "X", "name": "backward", "pid": 0, "tid": 1, "ts": t + 410.5, "dur": 500})
        ev.append({"ph": "X", "name": "optimizer", "pid": 0, "tid": 1, "ts": t + 910.5, "dur": 89.5})
        for k, dt in enumerate((0, 200, 600)):
            ev.append({"ph": "C", "name": "memory", "pid": 0, "tid": 0, "ts": t + dt,
                       "args": {"allocated": 1000 * step + k, "reserved": 4096}})
            ev.append({"ph": "C", "name": "memory.category", "pid": 0, "tid": 0, "ts": t + dt,
                       "args": {"activations": 10 * k, "params": 500}})
        t += 1000
    ev.append({"ph": "i", "name": "eval", "s": "g", "pid": 0, "tid": 1, "ts": t})
    return {"traceEvents": ev, "displayTimeUnit": "ms", "otherData": {"producer": "selftest"}}


def trace_cases(root):
    def write(name, doc, raw=None):
        p = os.path.join(root, name)
        with open(p, "w") as f:
            f.write(raw if raw is not None else json.dumps(doc))
        return p

    good = reference_trace()
    cases = [("trace: reference", ["check_trace.py", write("trace_good.json", good), "--expect-counter", "memory",
                                   "--expect-counter", "memory.category.activations", "--expect-slice", "mlp"],
              0, "OK")]

    def broken(label, name, mutate, expect):
        doc = copy.deepcopy(good)
        mutate(doc["traceEvents"])
        cases.append((f"trace: {label}", ["check_trace.py", write(name, doc)], 1, expect))

    broken("partial overlap", "trace_overlap.json",
           lambda ev: ev.append({"ph": "X", "name": "straddle", "pid": 0, "tid": 1, "ts": 900, "dur": 200}),
           "overlaps")
    broken("counter going back", "trace_counter.json",
           lambda ev: ev.append({"ph": "C", "name": "memory", "pid": 0, "tid": 0, "ts": 5, "args": {"allocated": 1}}),
           "goes back")
    broken("counter value a string", "trace_cstr.json",
           lambda ev: ev.append({"ph": "C", "name": "memory", "pid": 0, "tid": 0, "ts": 1e9,
                                 "args": {"allocated": "1"}}),
           "not a number")
    broken("metadata without ts", "trace_mts.json", lambda ev: ev[0].pop("ts"), "ts missing")
    broken("instant without s", "trace_inst.json", lambda ev: ev[-1].pop("s"), "scope")
    broken("unmatched B", "trace_b.json",
           lambda ev: ev.append({"ph": "B", "name": "open", "pid": 0, "tid": 2, "ts": 1}), "never closed")
    broken("unknown ph", "trace_ph.json", lambda ev: ev.append({"ph": "Q", "pid": 0, "tid": 0, "ts": 1}),
           "not a trace-event phase")
    broken("negative dur", "trace_dur.json", lambda ev: ev[3].update(dur=-1), "negative")
    cases.append(("trace: NaN", ["check_trace.py", write("trace_nan.json", None, json.dumps(good).replace(
        '"dur": 500', '"dur": NaN'))], 1, "not valid JSON"))
    cases.append(("trace: array form", ["check_trace.py", write("trace_arr.json", good["traceEvents"])], 1,
                  "object form"))
    cases.append(("trace: expected counter absent", ["check_trace.py", os.path.join(root, "trace_good.json"),
                                                     "--expect-counter", "host_rss"], 1, "no counter track"))
    return cases


# --------------------------------------------------------------------------------------------- snapshot

def frames(owner, category, line=0):
    """headroom's owner as the frame's function name, its category as the file name (no '/': 1.13 keeps only
    the last path component)."""
    return [{"filename": category, "line": line, "name": owner}]


def block(addr, size, requested, state, fr):
    b = {"address": addr, "size": size, "requested_size": requested, "state": state, "frames": fr}
    if state != "inactive":
        b["history"] = [{"addr": addr, "real_size": requested, "frames": fr}]
    return b


def reference_snapshot():
    base0, base1 = 0x7F3A00000000, 0x7F3B00000000
    mlp = frames("language_model.model.layers.7.mlp", "activations")
    seg0 = {"device": 0, "address": base0, "total_size": 2 * MiB, "allocated_size": MiB,
            "active_size": MiB + 512 * 1024, "requested_size": 1500000, "stream": 0, "segment_type": "large",
            "segment_pool_id": (0, 0), "is_expandable": False, "frames": mlp,
            "blocks": [block(base0, MiB, 1000000, "active_allocated", mlp),
                       block(base0 + MiB, 512 * 1024, 0, "inactive", []),
                       block(base0 + MiB + 512 * 1024, 512 * 1024, 500000, "active_pending_free",
                             frames("vision_tower.encoder.layers.0.self_attn", "workspace"))]}
    emb = frames("language_model.model.embed_tokens", "params")
    seg1 = {"device": 0, "address": base1, "total_size": 2 * MiB, "allocated_size": 2 * MiB,
            "active_size": 2 * MiB, "requested_size": 2 * MiB, "stream": 0, "segment_type": "large",
            "segment_pool_id": (0, 0), "is_expandable": False, "frames": emb,
            "blocks": [block(base1, 2 * MiB, 2 * MiB, "active_allocated", emb)]}
    trace = [
        {"action": "segment_alloc", "addr": base1, "size": 2 * MiB, "stream": 0, "time_us": 1, "frames": emb},
        {"action": "alloc", "addr": base1, "size": 2 * MiB, "stream": 0, "time_us": 2, "frames": emb},
        {"action": "segment_alloc", "addr": base0, "size": 2 * MiB, "stream": 0, "time_us": 3, "frames": mlp},
        {"action": "alloc", "addr": base0, "size": MiB, "stream": 0, "time_us": 4, "frames": mlp},
        {"action": "oom", "device_free": 3 * MiB, "size": 8 * MiB, "stream": 0, "time_us": 5, "frames": mlp},
    ]
    return {"segments": [seg0, seg1], "device_traces": [trace],
            "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1,
                                   "expandable_segments": False}}


def snapshot_cases(root):
    def write(name, obj, protocol=4, raw=None):
        p = os.path.join(root, name)
        with open(p, "wb") as f:
            f.write(raw if raw is not None else pickle.dumps(obj, protocol=protocol))
        return p

    good = reference_snapshot()
    owner = "language_model.model.layers.7.mlp"
    cases = [("snapshot: reference, protocol 4",
              ["check_snapshot.py", write("snapshot_good.pickle", good), "--expect-owner", owner,
               "--expect-owner", "activations"], 0, "OK"),
             ("snapshot: reference, protocol 2",
              ["check_snapshot.py", write("snapshot_p2.pickle", good, 2), "--expect-owner", owner], 0, "OK"),
             ("snapshot: torch 1.13's list form",
              ["check_snapshot.py", write("snapshot_list.pickle", good["segments"]), "--expect-owner", owner], 0,
              "OK"),
             ("snapshot: protocol 5", ["check_snapshot.py", write("snapshot_p5.pickle", good, 5)], 1,
              "protocol 5"),
             ("snapshot: owner absent", ["check_snapshot.py", os.path.join(root, "snapshot_good.pickle"),
                                         "--expect-owner", "no.such.module"], 1, "not in the rendered")]

    def broken(label, name, mutate, expect, *extra):
        s = copy.deepcopy(good)
        mutate(s)
        cases.append((f"snapshot: {label}", ["check_snapshot.py", write(name, s), *extra], 1, expect))

    broken("history without frames", "snapshot_hist.pickle",
           lambda s: s["segments"][0]["blocks"][0]["history"][0].pop("frames"), "KeyError")
    broken("sizes do not add up", "snapshot_size.pickle",
           lambda s: s["segments"][1].update(total_size=3 * MiB), "blocks add up to")
    broken("wrong allocated_size", "snapshot_alloc.pickle",
           lambda s: s["segments"][0].update(allocated_size=2 * MiB), "allocated_size")
    broken("bad state", "snapshot_state.pickle",
           lambda s: s["segments"][0]["blocks"][1].update(state="free"), "state 'free'")
    broken("block address off", "snapshot_addr.pickle",
           lambda s: s["segments"][0]["blocks"][2].update(address=0), "address")
    broken("owner only in 2.x frames", "snapshot_nohist.pickle",
           lambda s: [b.pop("history", None) for seg in s["segments"] for b in seg["blocks"]],
           "1.13 renders only", "--expect-owner", owner)
    broken("no trace list for device 0", "snapshot_traces.pickle",
           lambda s: s.update(device_traces=[]), "no list for device 0")
    broken("categories without 'unknown'", "snapshot_cat.pickle",
           lambda s: s["device_traces"][0][1].update(category="params"), "categores")
    broken("bad trace action", "snapshot_action.pickle",
           lambda s: s["device_traces"][0][0].update(action="malloc"), "action 'malloc'")
    cases.append(("snapshot: a class in the pickle",
                  ["check_snapshot.py", write("snapshot_class.pickle", {"segments": [], "device_traces": [[]],
                                                                       "x": OSError("x")})], 1,
                  "plain types only"))
    return cases


# --------------------------------------------------------------------------------------------- report

PAGE = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>headroom memory report</title>
<style>body{font-family:sans-serif;margin:20px} polyline{fill:none;stroke-width:2}</style></head>
<body>
<h1>Memory by category</h1>
<svg xmlns="http://www.w3.org/2000/svg" width="600" height="300" id="chart">
  <rect x="0" y="0" width="600" height="300" fill="#f4f4f4"/>
</svg>
<script>
const series = {params: [1, 2, 3, 4, 5, 6], activations: [5, 3, 6, 2, 7, 4]};
const colours = {params: "#4e79a7", activations: "#e15759"};
const svg = document.getElementById("chart");
Object.entries(series).forEach(([name, ys], k) => {
  const p = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
  p.setAttribute("points", ys.map((y, i) => `${50 + i * 100},${280 - y * 35}`).join(" "));
  p.setAttribute("stroke", colours[name]);
  p.dataset.series = name;
  svg.appendChild(p);
  const t = document.createElementNS("http://www.w3.org/2000/svg", "text");
  t.setAttribute("x", 10); t.setAttribute("y", 20 + 20 * k); t.textContent = name;
  svg.appendChild(t);
});
/*BREAK*/
document.body.dataset.ready = "1";
</script>
</body></html>
"""


def report_cases(root):
    def write(name, text):
        p = os.path.join(root, name)
        with open(p, "w") as f:
            f.write(text)
        return p

    series = ["--expect-series", "params", "--expect-series", "activations"]
    return [
        ("report: reference page", ["check_report.py", write("report_good.html", PAGE), "--png",
                                    os.path.join(root, "report_good.png"), *series], 0, "OK"),
        ("report: script error", ["check_report.py", write("report_error.html",
                                                           PAGE.replace("/*BREAK*/", "undefinedFunction();")),
                                  *series], 1, "Uncaught ReferenceError"),
        ("report: console.error", ["check_report.py", write("report_cerr.html",
                                                            PAGE.replace("/*BREAK*/", "console.error('bad');")),
                                   *series], 1, "console.error: bad"),
        ("report: external script", ["check_report.py", write("report_net.html", PAGE.replace(
            "<title>", '<script src="https://cdn.jsdelivr.net/npm/d3@7"></script><title>')), *series], 1,
         "network reference"),
        ("report: series missing", ["check_report.py", os.path.join(root, "report_good.html"),
                                    "--expect-series", "grads"], 1, 'no data-series="grads"'),
        ("report: blank page", ["check_report.py", write("report_blank.html",
                                                         "<!DOCTYPE html><html><body><script>"
                                                         "document.body.dataset.ready='1'</script></body></html>")],
         1, "blank"),
    ]


# --------------------------------------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--keep", help="write the files to this directory and keep them")
    ap.add_argument("--no-report", action="store_true", help="skip the Chromium cases")
    args = ap.parse_args()
    root = args.keep or tempfile.mkdtemp(prefix="hr-selftest-")
    os.makedirs(root, exist_ok=True)
    cases = tfevents_cases(root) + trace_cases(root) + snapshot_cases(root)
    if not args.no_report:
        cases += report_cases(root)
    passed = failed = 0
    for label, argv, want_rc, want_text in cases:
        p = subprocess.run([sys.executable, os.path.join(HERE, argv[0]), *argv[1:]], capture_output=True,
                           text=True, timeout=300)
        out = p.stdout + p.stderr
        ok = p.returncode == want_rc and want_text in out
        passed += ok
        failed += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {label} (exit {p.returncode})")
        if not ok:
            print(f"     expected exit {want_rc} and {want_text!r} in:\n" +
                  "\n".join("     | " + ln for ln in out.splitlines()[-15:]))
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    print(f"selftest: {passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
