#!/usr/bin/env python3
"""Checks an allocator snapshot pickle against what PyTorch's memory_viz reads, and renders it with PyTorch's own code.

    python3 tests/py/check_snapshot.py FILE [--expect-owner NAME]... [--print]

FILE is a pickle in the format of torch.cuda.memory._snapshot(): /tmp/memviz_format.md (and the summary below)
says what the readers use. The checks:
  - it unpickles with pickle.load restricted to plain types (no class or function is ever looked up), and uses
    only the pickle opcodes (protocol 2 to 4) that the JavaScript unpickler of PyTorch's MemoryViz.js (the
    pytorch.org/memory_viz page) implements;
  - the top level is torch 2.x's dict {"segments": [...], "device_traces": [[...], ...], ...} or torch 1.13's plain
    list of segments;
  - every segment has device, address, total_size, allocated_size, active_size, stream (integers), segment_type
    ("large" or "small") and blocks; its blocks' sizes add up to total_size, allocated_size is the size of its
    active_allocated blocks and active_size that of its active_allocated and active_pending_free blocks;
  - every block has size and state (active_allocated, active_pending_free or inactive); where present, address
    (the segment's address plus the sizes of the blocks before it), requested_size (<= size), frames (a list of
    {filename, line, name}), history (a list of {addr, real_size, frames}, whose real_size add up to at most the
    block's size; torch 1.13's reader needs "frames" in every history entry);
  - device_traces has a list for every device that has segments; its entries have action, addr (device_free for
    "oom"), size and stream; if any carries a "category", one carries "unknown" (else MemoryViz.js throws).
Then torch.cuda._memory_viz of Debian's torch 1.13 renders it: segments(), memory(), compare() (of the snapshot
with itself and with an empty one) and stats(), each given the segment list (1.13's functions iterate the
snapshot as a list of segments). Their flamegraph step would download flamegraph.pl, so the folded-stack text
that flamegraph.pl takes is captured instead and checked line by line ("stack count", counts >= 0).
--expect-owner NAME: NAME must appear in that rendered text (1.13 renders a block's history frames, as
"<last path part of filename>:<line>:<name>"), i.e. 1.13's flamegraphs show it.
Exit 0 when all holds, 1 with one line per fault, 2 on a usage error or when torch is missing.
"""
import argparse
import collections
import contextlib
import io
import os
import pickle
import pickletools
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _oracle_env  # noqa: E402

_oracle_env.require("torch")

PROG = "check_snapshot"
STATES = {"active_allocated", "active_pending_free", "inactive"}
ACTIONS = {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "segment_map",
           "segment_unmap", "snapshot", "oom"}
# The opcodes MemoryViz.js's unpickleData() handles (torch/utils/viz/MemoryViz.js); it accepts PROTO 2..4.
JS_OPCODES = {
    "APPENDS", "BINGET", "BININT", "BININT1", "BININT2", "EMPTY_DICT", "EMPTY_LIST", "FRAME", "LONG1",
    "LONG_BINGET", "MARK", "MEMOIZE", "PROTO", "SETITEMS", "SHORT_BINUNICODE", "STOP", "TUPLE2", "APPEND",
    "NEWFALSE", "BINPUT", "BINUNICODE", "EMPTY_TUPLE", "NEWTRUE", "NONE", "BINFLOAT", "TUPLE", "TUPLE1",
    "TUPLE3", "LONG_BINPUT", "LIST", "DICT", "SETITEM",
}


class PlainUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refers to {module}.{name}: a snapshot holds plain types only")


def is_int(x):
    return isinstance(x, int) and not isinstance(x, bool)


class Checker:
    def __init__(self, path):
        self.path = path
        self.faults = []
        self.protocol = None

    def fault(self, where, msg):
        self.faults.append(f"{self.path}: {where}: {msg}")

    def opcodes(self, data):
        used = collections.Counter()
        try:
            for op, arg, pos in pickletools.genops(data):
                used[op.name] += 1
                if op.name == "PROTO":
                    self.protocol = arg
                if op.name == "PROTO" and not 2 <= arg <= 4:
                    self.fault("pickle", f"protocol {arg}: MemoryViz.js reads protocols 2 to 4")
        except Exception as e:
            self.fault("pickle", f"cannot walk the opcodes: {e}")
        bad = sorted(set(used) - JS_OPCODES)
        if bad:
            self.fault("pickle", f"opcodes MemoryViz.js cannot read: {', '.join(bad)}")
        return used

    def frames(self, where, frames):
        if not isinstance(frames, list):
            self.fault(where, f"frames is not a list: {type(frames).__name__}")
            return
        for j, f in enumerate(frames):
            if not isinstance(f, dict):
                self.fault(f"{where} frame {j}", "not a dict")
                continue
            for k, typ in (("filename", str), ("name", str), ("line", int)):
                if not isinstance(f.get(k), typ) or isinstance(f.get(k), bool):
                    self.fault(f"{where} frame {j}", f"{k} missing or not {typ.__name__}: {f.get(k)!r}")

    def segment(self, i, seg):
        where = f"segment {i}"
        if not isinstance(seg, dict):
            self.fault(where, "not a dict")
            return
        for k in ("device", "address", "total_size", "allocated_size", "active_size", "stream"):
            if not is_int(seg.get(k)):
                self.fault(where, f"{k} missing or not an integer: {seg.get(k)!r}")
        if seg.get("segment_type") not in ("large", "small"):
            self.fault(where, f"segment_type {seg.get('segment_type')!r} is neither 'large' nor 'small'")
        for k in ("requested_size",):
            if k in seg and not is_int(seg[k]):
                self.fault(where, f"{k} not an integer: {seg[k]!r}")
        if "is_expandable" in seg and not isinstance(seg["is_expandable"], bool):
            self.fault(where, f"is_expandable not a bool: {seg['is_expandable']!r}")
        if "segment_pool_id" in seg:
            pid = seg["segment_pool_id"]
            if not (isinstance(pid, (tuple, list)) and len(pid) == 2 and all(is_int(x) for x in pid)):
                self.fault(where, f"segment_pool_id not a pair of integers: {pid!r}")
        if "frames" in seg:
            self.frames(where, seg["frames"])
        blocks = seg.get("blocks")
        if not isinstance(blocks, list) or not blocks:
            self.fault(where, "blocks missing, not a list or empty")
            return
        total = allocated = active = 0
        addr = seg.get("address") if is_int(seg.get("address")) else None
        for j, b in enumerate(blocks):
            bw = f"{where} block {j}"
            if not isinstance(b, dict):
                self.fault(bw, "not a dict")
                continue
            size, state = b.get("size"), b.get("state")
            if not is_int(size) or size <= 0:
                self.fault(bw, f"size missing or not a positive integer: {size!r}")
                continue
            if state not in STATES:
                self.fault(bw, f"state {state!r} is not one of {sorted(STATES)}")
            total += size
            allocated += size if state == "active_allocated" else 0
            active += size if state in ("active_allocated", "active_pending_free") else 0
            if "address" in b and addr is not None and b["address"] != addr:
                self.fault(bw, f"address {b['address']:#x} is not the segment address plus the sizes before it "
                               f"({addr:#x})")
            if addr is not None:
                addr += size
            if "requested_size" in b and (not is_int(b["requested_size"]) or not 0 <= b["requested_size"] <= size):
                self.fault(bw, f"requested_size {b['requested_size']!r} not an integer in [0, size {size}]")
            if "frames" in b:
                self.frames(bw, b["frames"])
            if "history" in b:
                hist = b["history"]
                if not isinstance(hist, list) or not hist:
                    self.fault(bw, "history not a non-empty list (1.13 and 2.x read history[0])")
                    continue
                real = 0
                for h_i, h in enumerate(hist):
                    hw = f"{bw} history {h_i}"
                    if not isinstance(h, dict):
                        self.fault(hw, "not a dict")
                        continue
                    for k in ("addr", "real_size"):
                        if not is_int(h.get(k)):
                            self.fault(hw, f"{k} missing or not an integer: {h.get(k)!r}")
                    real += h.get("real_size") if is_int(h.get("real_size")) else 0
                    if "frames" not in h:
                        self.fault(hw, "no frames: torch 1.13's _write_blocks reads h['frames'] (KeyError)")
                    else:
                        self.frames(hw, h["frames"])
                if real > size:
                    self.fault(bw, f"history real_size total {real} exceeds the block size {size}")
        if total != seg.get("total_size"):
            self.fault(where, f"blocks add up to {total}, total_size is {seg.get('total_size')}")
        if allocated != seg.get("allocated_size"):
            self.fault(where, f"active_allocated blocks add up to {allocated}, allocated_size is "
                              f"{seg.get('allocated_size')}")
        if active != seg.get("active_size"):
            self.fault(where, f"active blocks add up to {active}, active_size is {seg.get('active_size')}")

    def traces(self, traces):
        if not isinstance(traces, list):
            self.fault("device_traces", "not a list (one list of entries per device)")
            return 0
        n = 0
        for d, entries in enumerate(traces):
            if not isinstance(entries, list):
                self.fault(f"device_traces[{d}]", "not a list")
                continue
            for i, e in enumerate(entries):
                w = f"device_traces[{d}][{i}]"
                n += 1
                if not isinstance(e, dict):
                    self.fault(w, "not a dict")
                    continue
                if e.get("action") not in ACTIONS:
                    self.fault(w, f"action {e.get('action')!r} is not one of {sorted(ACTIONS)}")
                addr_key = "device_free" if e.get("action") == "oom" else "addr"
                for k in (addr_key, "size", "stream"):
                    if not is_int(e.get(k)):
                        self.fault(w, f"{k} missing or not an integer: {e.get(k)!r}")
                if "frames" in e:
                    self.frames(w, e["frames"])
                if "time_us" in e and not is_int(e["time_us"]):
                    self.fault(w, f"time_us not an integer: {e['time_us']!r}")
        return n


def check_folded(checker, what, text):
    for n, line in enumerate(text.splitlines(), 1):
        stack, _, count = line.rpartition(" ")
        if not stack or not count.lstrip("-").isdigit():
            checker.fault(f"memory_viz.{what} line {n}", f"not 'stack count': {line!r}")
        elif int(count) < 0:
            checker.fault(f"memory_viz.{what} line {n}", f"negative count (history larger than the block?): {line!r}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("file")
    ap.add_argument("--expect-owner", action="append", default=[], metavar="NAME")
    ap.add_argument("--print", action="store_true", help="print the rendered folded stacks")
    args = ap.parse_args()
    c = Checker(args.file)
    with open(args.file, "rb") as f:
        data = f.read()
    try:
        snap = PlainUnpickler(io.BytesIO(data)).load()
    except Exception as e:
        print(f"{PROG}: FAIL: {args.file}: pickle.load: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    used = c.opcodes(data)

    if isinstance(snap, dict):
        form = "torch 2.x dict"
        segs = snap.get("segments")
        if not isinstance(segs, list):
            c.fault("top level", "dict without a 'segments' list")
            segs = []
        if "device_traces" not in snap:
            c.fault("top level", "no 'device_traces' (torch 2.x readers and MemoryViz.js index it)")
        n_trace = c.traces(snap.get("device_traces", []))
        extra = sorted(set(snap) - {"segments", "device_traces", "allocator_settings"})
        if extra:
            c.fault("top level", f"unexpected keys {extra}")
    elif isinstance(snap, list):
        form = "torch 1.13 list of segments (torch 2.x readers need the dict form)"
        segs, n_trace = snap, 0
    else:
        print(f"{PROG}: FAIL: {args.file}: top level is a {type(snap).__name__}, neither a dict nor a list",
              file=sys.stderr)
        return 1
    for i, seg in enumerate(segs):
        c.segment(i, seg)
    if isinstance(snap, dict) and isinstance(snap.get("device_traces"), list):
        traces = snap["device_traces"]
        devices = {seg.get("device") for seg in segs if isinstance(seg, dict) and is_int(seg.get("device"))}
        for d in sorted(devices):
            if d >= len(traces):
                c.fault("device_traces", f"no list for device {d} (MemoryViz.js reads device_traces[device] "
                                         f"for every device that has segments)")
        cats = {e.get("category") for t in traces if isinstance(t, list) for e in t
                if isinstance(e, dict) and "category" in e}
        if cats and "unknown" not in cats:
            c.fault("device_traces", "entries carry a category but none is 'unknown': MemoryViz.js then throws "
                                     "(it pushes 'unknown' onto snapshot.categores, a misspelt property)")

    rendered = {}
    if not c.faults:
        import torch
        from torch.cuda import _memory_viz as mv
        folded = lambda lines: lines  # noqa: E731  (what flamegraph.pl would be given)
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out):
                rendered["segments"] = mv.segments(segs, format_flamegraph=folded)
                rendered["memory"] = mv.memory(segs, format_flamegraph=folded)
                rendered["compare_self"] = mv.compare(segs, segs, format_flamegraph=folded)
                rendered["compare_empty"] = mv.compare([], segs, format_flamegraph=folded)
                rendered["stats"] = repr(mv.stats(segs))
        except Exception as e:
            import traceback
            c.fault("torch.cuda._memory_viz", f"{type(e).__name__}: {e}\n{traceback.format_exc()}")
        else:
            for what in ("segments", "memory", "compare_self", "compare_empty"):
                check_folded(c, what, rendered[what])
            if rendered["compare_self"]:
                c.fault("memory_viz.compare", "the snapshot differs from itself")
            text = "\n".join(rendered.values())
            for owner in args.expect_owner:
                if owner not in text:
                    in_pickle = owner.encode() in data
                    c.fault("memory_viz", f"owner {owner!r} not in the rendered flamegraph stacks"
                            + (" (it is in the pickle: 1.13 renders only the frames of a block's 'history')"
                               if in_pickle else ""))
            if args.print:
                for what, t in rendered.items():
                    print(f"--- {what}\n{t}")
        print(f"{PROG}: torch {torch.__version__} _memory_viz: segments(), memory(), compare(), stats() rendered "
              f"{sum(len(rendered[w].splitlines()) for w in ('segments', 'memory'))} stack lines; "
              f"stats {rendered.get('stats', '-')}")

    if _oracle_env.print_faults(PROG, c.faults):
        return 1
    states = collections.Counter(b["state"] for s in segs for b in s["blocks"])
    names = collections.Counter(f["name"] for s in segs for b in s["blocks"]
                                for f in (b.get("frames") or (b.get("history") or [{}])[0].get("frames") or []))
    print(f"{PROG}: OK: {args.file}: {form}, pickle protocol {c.protocol}; {len(segs)} segments, "
          f"{sum(states.values())} blocks ({', '.join(f'{k} {v}' for k, v in sorted(states.items()))}), "
          f"{n_trace} trace entries; top frame names: "
          f"{', '.join(f'{n} x{k}' for n, k in names.most_common(5)) or '-'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
