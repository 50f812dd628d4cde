#!/usr/bin/env python3
"""Checks a run's TensorBoard event file(s) against the run's JSON lines, reading them with tensorboard itself.

    python3 tests/py/check_tfevents.py RUN_DIR [--verbose]

RUN_DIR/runs holds the events.out.tfevents.* file(s) (the TensorBoard logdir). They are read twice with
tensorboard's own code:
  - record by record with its TFRecord reader (tensorboard.compat.tensorflow_stub PyRecordReader_New), which checks
    every length and data CRC: EventAccumulator swallows a CRC or truncation error and silently stops reading, so
    a corrupt record would otherwise look like missing steps. The first event of each file must be the
    file_version "brain.Event:2" event, and one SessionLog START must come before every summary, at a step no
    later than theirs (the first step the file logs: TensorBoard drops what earlier files logged from that step
    on, as the JSON lines of a resumed run were cut; PyTorch's SummaryWriter(purge_step=...) writes it after a
    second file_version event, which is accepted there); every summary value must be a simple_value (float32).
  - with EventAccumulator (size_guidance 0: keep every scalar), which is what TensorBoard's UI shows.

The expected scalars come from RUN_DIR/memory.jsonl (one process) or RUN_DIR/memory.rank{r}.jsonl (several
ranks; rank 0's file gives the plain tags) and RUN_DIR/eval.jsonl (when present); see TAGS below. Every expected
tag must be present with exactly the steps of its source lines, in order, each value equal to the source value
rounded to float32 (relative tolerance 1e-6), and no other tag, scalar or not, may be there. A source value that
is null (or an optional key that is absent) is not written for that step.
Exit 0 when all holds; 1 with one line per fault (file, tag, step); 2 on a usage or input error.
"""
import argparse
import glob
import json
import math
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _oracle_env  # noqa: E402

_oracle_env.require("numpy", "tensorboard")

import numpy as np  # noqa: E402

# tensorboard logs a warning about TensorFlow not being installed; it reads event files without it.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
from tensorboard.backend.event_processing import event_accumulator  # noqa: E402
from tensorboard.compat.proto import event_pb2  # noqa: E402
from tensorboard.compat.tensorflow_stub import errors as tb_errors  # noqa: E402
from tensorboard.compat.tensorflow_stub import pywrap_tensorflow  # noqa: E402

PROG = "check_tfevents"

# tag <- key path in a memory.jsonl line; OPTIONAL ones are written only when not null (absent = null).
TRAIN_TAGS = {
    "train/loss": ("loss",),
    "train/learning_rate": ("lr",),
    "train/grad_norm": ("grad_norm",),
    "train/loss_scale": ("loss_scale",),
    "train/tokens_per_s": ("tokens_per_s",),
    "train/samples_per_s": ("samples_per_s",),
    "train/comm_exposed_s": ("comm_exposed_s",),
    "memory/allocated": ("allocated",),
    "memory/reserved": ("reserved",),
    "memory/peak_allocated": ("peak_allocated",),
    "memory/peak_reserved": ("peak_reserved",),
    "memory/predicted_peak": ("predicted_peak",),
    "memory/predicted_reserved": ("predicted_reserved",),
    "memory/planned_peak": ("planned_peak",),
    "memory/fragmentation": ("fragmentation",),
    "memory/host_rss": ("host_rss",),
    "memory/host_allocated": ("host", "allocated"),
}
OPTIONAL = {"predicted_peak", "predicted_reserved", "planned_peak"}
PER_RANK = {  # memory/rank<r>/<suffix> <- key, from rank r's own file, when there are several ranks
    "peak_allocated": "peak_allocated",
    "peak_reserved": "peak_reserved",
    "predicted_peak": "predicted_peak",
    "host_rss": "host_rss",
}


class Faults:
    def __init__(self):
        self.lines = []

    def add(self, where, msg):
        self.lines.append(f"{where}: {msg}")


def read_jsonl(path, faults):
    rows = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                faults.add(f"{path}:{n}", f"not JSON ({e})")
                continue
            if not isinstance(obj, dict):
                faults.add(f"{path}:{n}", "not a JSON object")
                continue
            if not isinstance(obj.get("step"), int) or isinstance(obj.get("step"), bool):
                faults.add(f"{path}:{n}", f"'step' missing or not an integer: {obj.get('step')!r}")
                continue
            rows.append((n, obj))
    return rows


def lookup(obj, path):
    cur = obj
    for k in path:
        if not isinstance(cur, dict) or k not in cur:
            return KeyError
        cur = cur[k]
    return cur


def add_point(expected, tag, step, value, where, faults):
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        faults.add(where, f"value for tag {tag} is not a number: {value!r}")
        return
    expected.setdefault(tag, []).append((step, value))


def expected_from_memory(path, rows, expected, faults):
    for n, obj in rows:
        where, step = f"{path}:{n}", obj["step"]
        for tag, keypath in TRAIN_TAGS.items():
            v = lookup(obj, keypath)
            if v is KeyError:
                if keypath[-1] not in OPTIONAL:
                    faults.add(where, f"key {'.'.join(keypath)} missing (source of tag {tag})")
                continue
            add_point(expected, tag, step, v, where, faults)
        cats = obj.get("by_category")
        if not isinstance(cats, dict):
            faults.add(where, "by_category missing or not an object (source of memory/category/<name>)")
        else:
            for name, v in cats.items():
                add_point(expected, f"memory/category/{name}", step, v, where, faults)


def expected_per_rank(rank, path, rows, expected, faults):
    for n, obj in rows:
        for suffix, key in PER_RANK.items():
            tag = f"memory/rank{rank}/{suffix}"
            if key not in obj:
                if key not in OPTIONAL:
                    faults.add(f"{path}:{n}", f"key {key} missing (source of tag {tag})")
                continue
            add_point(expected, tag, obj["step"], obj[key], f"{path}:{n}", faults)


def expected_from_eval(path, rows, expected, faults):
    for n, obj in rows:
        where, step = f"{path}:{n}", obj["step"]
        for tag, key in (("eval/loss", "loss"), ("eval/accuracy", "accuracy")):
            if key not in obj:
                faults.add(where, f"key {key} missing (source of tag {tag})")
                continue
            add_point(expected, tag, step, obj[key], where, faults)
        by_type = obj.get("accuracy_by_type", {})
        if not isinstance(by_type, dict):
            faults.add(where, "accuracy_by_type is not an object")
            continue
        for name, v in by_type.items():
            add_point(expected, f"eval/accuracy/{name}", step, v, where, faults)


def memory_files(run_dir):
    """[(rank or None, path)]: memory.jsonl alone, or memory.rank{r}.jsonl for r = 0..n-1."""
    single = os.path.join(run_dir, "memory.jsonl")
    ranked = {}
    for p in glob.glob(os.path.join(run_dir, "memory.rank*.jsonl")):
        m = re.fullmatch(r"memory\.rank(\d+)\.jsonl", os.path.basename(p))
        if m:
            ranked[int(m.group(1))] = p
    if ranked:
        if os.path.exists(single):
            raise SystemExit(f"{PROG}: FAIL: {run_dir} has both memory.jsonl and memory.rank*.jsonl")
        if sorted(ranked) != list(range(len(ranked))):
            raise SystemExit(f"{PROG}: FAIL: {run_dir}: rank files are not 0..n-1: ranks {sorted(ranked)}")
        return [(r, ranked[r]) for r in sorted(ranked)]
    if os.path.exists(single):
        return [(None, single)]
    raise SystemExit(f"{PROG}: FAIL: {run_dir} has neither memory.jsonl nor memory.rank0.jsonl")


def check_records(path, faults):
    """Reads every record with tensorboard's CRC-checking reader; returns the parsed events."""
    events = []
    reader = pywrap_tensorflow.PyRecordReader_New(path)
    while True:
        try:
            reader.GetNext()
        except tb_errors.OutOfRangeError:
            break
        except tb_errors.DataLossError as e:
            faults.add(path, f"record {len(events)}: {e.message if hasattr(e, 'message') else e}")
            break
        ev = event_pb2.Event()
        try:
            ev.ParseFromString(reader.record())
        except Exception as e:  # protobuf's DecodeError
            faults.add(path, f"record {len(events)}: not an Event protobuf ({e})")
            break
        events.append(ev)
    if not events:
        faults.add(path, "no events")
        return events
    first = events[0]
    if first.WhichOneof("what") != "file_version" or first.file_version != "brain.Event:2":
        faults.add(path, f"first event is not file_version 'brain.Event:2' "
                         f"(it has {first.WhichOneof('what')!r}: {getattr(first, 'file_version', '')!r})")
    start = None  # the SessionLog START's record
    for i, ev in enumerate(events):
        kind = ev.WhichOneof("what")
        if i == 1 and kind == "file_version":
            pass  # PyTorch's purge_step form: file_version again, then the START
        elif i > 0 and kind == "file_version":
            faults.add(path, f"record {i}: a second file_version event")
        if not (ev.wall_time > 0):
            faults.add(path, f"record {i}: wall_time {ev.wall_time} is not positive")
        if kind == "summary":
            for v in ev.summary.value:
                if v.WhichOneof("value") != "simple_value":
                    faults.add(path, f"record {i} tag {v.tag} step {ev.step}: value is "
                                     f"{v.WhichOneof('value')!r}, not simple_value")
        if kind == "session_log":
            if start is not None or ev.session_log.status != event_pb2.SessionLog.START or any(
                    e.WhichOneof("what") == "summary" for e in events[:i]):
                faults.add(path, f"record {i}: a session_log other than one START before the summaries")
            elif any(e.step < ev.step for e in events[i + 1:]):
                faults.add(path, f"record {i}: START at step {ev.step}, but the file logs steps before it")
            start = i
        elif kind not in ("file_version", "summary"):
            faults.add(path, f"record {i} step {ev.step}: unexpected event kind {kind!r}")
    if start is None:
        faults.add(path, "no SessionLog START before the summaries")
    return events


def same_f32(source, logged):
    want = float(np.float32(source))
    if math.isnan(want) or math.isnan(logged):
        return math.isnan(want) and math.isnan(logged)
    if want == logged:
        return True
    return abs(want - logged) <= 1e-6 * max(abs(want), abs(logged))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run_dir")
    ap.add_argument("--verbose", "-v", action="store_true")
    args = ap.parse_args()
    run_dir = args.run_dir.rstrip("/")
    logdir = os.path.join(run_dir, "runs")
    faults = Faults()

    files = sorted(glob.glob(os.path.join(logdir, "events.out.tfevents.*")))
    if not files:
        print(f"{PROG}: FAIL: no events.out.tfevents.* file in {logdir}", file=sys.stderr)
        return 1
    nested = glob.glob(os.path.join(logdir, "*", "**", "events.out.tfevents.*"), recursive=True)
    for p in nested:
        faults.add(p, "event file in a subdirectory of the logdir: TensorBoard shows it as another run")

    expected = {}
    mem = memory_files(run_dir)
    rows0 = None
    for rank, path in mem:
        rows = read_jsonl(path, faults)
        if not rows:
            faults.add(path, "no lines")
        if rank in (None, 0):
            rows0 = rows
            expected_from_memory(path, rows, expected, faults)
        if rank is not None and len(mem) > 1:
            expected_per_rank(rank, path, rows, expected, faults)
    eval_path = os.path.join(run_dir, "eval.jsonl")
    if os.path.exists(eval_path):
        expected_from_eval(eval_path, read_jsonl(eval_path, faults), expected, faults)

    n_records = 0
    for path in files:
        n_records += len(check_records(path, faults))

    at = files[0] if len(files) == 1 else logdir  # what the faults below name
    acc = event_accumulator.EventAccumulator(logdir, size_guidance={event_accumulator.SCALARS: 0,
                                                                  event_accumulator.TENSORS: 0})
    acc.Reload()
    tags = acc.Tags()
    for kind, present in tags.items():
        if kind == event_accumulator.SCALARS:
            continue
        if present:  # lists of tags, or True for graph / meta_graph
            faults.add(at, f"unexpected {kind} data: {present}")
    got_tags = set(tags[event_accumulator.SCALARS])
    for tag in sorted(got_tags - set(expected)):
        faults.add(at, f"unexpected tag {tag} ({len(acc.Scalars(tag))} points)")
    n_points = 0
    for tag in sorted(expected):
        want = expected[tag]
        if tag not in got_tags:
            faults.add(at, f"tag {tag} missing (expected {len(want)} points, first step {want[0][0]})")
            continue
        got = acc.Scalars(tag)
        n_points += len(got)
        want_steps, got_steps = [s for s, _ in want], [e.step for e in got]
        if want_steps != got_steps:
            i = next((i for i, (a, b) in enumerate(zip(want_steps, got_steps)) if a != b),
                     min(len(want_steps), len(got_steps)))
            faults.add(at, f"tag {tag}: steps differ from the source at index {i}: expected "
                               f"{want_steps[i:i + 5]} ({len(want_steps)} points), logged {got_steps[i:i + 5]} "
                               f"({len(got_steps)} points)")
            continue
        bad = 0
        for (step, v), e in zip(want, got):
            if not same_f32(v, e.value):
                bad += 1
                if bad <= 3:
                    faults.add(at, f"tag {tag} step {step}: logged {e.value!r}, source {v!r} "
                                       f"(float32 {float(np.float32(v))!r})")
        if bad > 3:
            faults.add(at, f"tag {tag}: {bad - 3} more values differ")

    if _oracle_env.print_faults(PROG, faults.lines):
        return 1
    steps = len(rows0 or [])
    print(f"{PROG}: OK: {run_dir}: {len(files)} event file(s), {n_records} records, {len(expected)} tags, "
          f"{n_points} scalars match {steps} step(s) of {len(mem)} memory file(s)"
          f"{' and eval.jsonl' if os.path.exists(eval_path) else ''}")
    if args.verbose:
        for tag in sorted(expected):
            print(f"  {tag}: {len(expected[tag])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
