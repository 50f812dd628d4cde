#!/usr/bin/env python3
"""Checks Chrome trace-event JSON files (the format chrome://tracing and Perfetto's UI open).

    python3 tests/py/check_trace.py FILE... [--expect-counter NAME]... [--expect-slice SUBSTRING]... [-q]

Each FILE must be the object form {"traceEvents": [...], ...} and:
  - strict JSON (no NaN / Infinity, which a browser's JSON.parse rejects);
  - every event an object with ph (one of the format's phases), ts (a number), pid and tid (integers, or the
    strings that both chrome://tracing and Perfetto also accept, as PyTorch's profiler writes them), metadata
    ("M") events included; name a string where present, args an object where present;
  - "M" events one of process_name / process_labels / process_sort_index / thread_name / thread_sort_index with
    the args key the viewer reads (name, labels or sort_index);
  - "X" events a dur >= 0; "B"/"E" events paired per (pid, tid), an "E" closing the latest open "B";
  - the slices ("X" and the B/E pairs) of each (pid, tid) properly nested: a slice that starts inside another
    ends inside it too (no partial overlap; 1 ns of slack for rounding);
  - "C" (counter) events: args a non-empty object of numbers, ts non-decreasing per (pid, name[, id]) track;
  - instant events ("i", "I") an "s" scope of g, p or t.
--expect-counter NAME: some counter track is named NAME (or NAME is "<track>.<args key>").
--expect-slice SUBSTRING: some slice name contains SUBSTRING.
Prints a summary per file (events per ph, counter tracks, the 10 commonest slice names); exit 0 when all holds,
1 with one line per fault (file, event index, what), 2 on a usage error.
"""
import argparse
import collections
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _oracle_env  # noqa: E402  (no oracle module needed: only the shared fault printing)

PROG = "check_trace"
PHASES = {
    "B", "E",            # duration begin / end
    "X",                 # complete
    "i", "I",            # instant (I: the older spelling)
    "C",                 # counter
    "b", "n", "e",       # nestable async
    "S", "T", "p", "F",  # legacy async
    "s", "t", "f",       # flow
    "P",                 # sample
    "N", "O", "D",       # object created / snapshot / destroyed
    "M",                 # metadata
    "V", "v",            # memory dumps
    "R",                 # mark
    "c",                 # clock sync
    "(", ")",            # context
}
METADATA_ARG = {"process_name": "name", "process_labels": "labels", "process_sort_index": "sort_index",
                "thread_name": "name", "thread_sort_index": "sort_index"}
EPS_US = 1e-3  # 1 ns


def is_num(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def is_int(x):
    return isinstance(x, int) and not isinstance(x, bool)


def _reject_constant(name):
    raise ValueError(f"{name} is not JSON")


def check_file(path, faults, stats):
    def fault(where, msg):
        faults.append(f"{path}: {where}: {msg}")

    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f, parse_constant=_reject_constant)
    except (OSError, ValueError) as e:
        fault("file", f"not valid JSON: {e}")
        return
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        fault("file", "not the object form {\"traceEvents\": [...]}")
        return
    if "displayTimeUnit" in doc and doc["displayTimeUnit"] not in ("ms", "ns"):
        fault("file", f"displayTimeUnit {doc['displayTimeUnit']!r} is neither 'ms' nor 'ns'")
    events = doc["traceEvents"]
    per_ph = collections.Counter()
    counter_last = {}      # (pid, name, id) -> last ts
    counter_keys = collections.defaultdict(set)
    slice_names = collections.Counter()
    slices = collections.defaultdict(list)    # (pid, tid) -> [(start, end, name, index)]
    open_b = collections.defaultdict(list)    # (pid, tid) -> [(ts, name, index)]
    b_e = collections.defaultdict(list)       # (pid, tid) -> [(ts, file index, ph, name)]

    for i, ev in enumerate(events):
        where = f"event {i}"
        if not isinstance(ev, dict):
            fault(where, "not an object")
            continue
        ph = ev.get("ph")
        if isinstance(ev.get("name"), str):
            where += f" ({ph} {ev['name']!r})"
        if ph not in PHASES:
            fault(where, f"ph {ph!r} is not a trace-event phase")
            continue
        per_ph[ph] += 1
        ok = True
        if not is_num(ev.get("ts")):
            fault(where, f"ts missing or not a number: {ev.get('ts')!r}")
            ok = False
        for k in ("pid", "tid"):
            if not (is_int(ev.get(k)) or (isinstance(ev.get(k), str) and ev[k])):
                fault(where, f"{k} missing or neither an integer nor a string: {ev.get(k)!r}")
                ok = False
        if "name" in ev and not isinstance(ev["name"], str):
            fault(where, f"name is not a string: {ev['name']!r}")
        if "args" in ev and not isinstance(ev["args"], dict):
            fault(where, "args is not an object")
            ok = False
        if not ok:
            continue
        ts, key, name = ev["ts"], (ev["pid"], ev["tid"]), ev.get("name")
        if ph == "M":
            arg = METADATA_ARG.get(name)
            if arg is None:
                fault(where, f"metadata name {name!r} is not one of {sorted(METADATA_ARG)}")
            elif arg not in ev.get("args", {}):
                fault(where, f"metadata {name} without args.{arg}")
        elif ph == "X":
            dur = ev.get("dur")
            if not is_num(dur) or dur < 0:
                fault(where, f"dur missing, not a number or negative: {dur!r}")
                continue
            if not isinstance(name, str):
                fault(where, "slice without a name")
            slices[key].append((ts, ts + dur, name, i))
            slice_names[name] += 1
        elif ph in ("B", "E"):
            if ph == "B" and not isinstance(name, str):
                fault(where, "B event without a name")
            b_e[key].append((ts, i, ph, name))
        elif ph == "C":
            args = ev.get("args")
            if not isinstance(args, dict) or not args:
                fault(where, "counter without args values")
                continue
            for k, v in args.items():
                if not is_num(v):
                    fault(where, f"counter value args.{k} is not a number: {v!r}")
            track = (ev["pid"], name, ev.get("id"))
            if track in counter_last and ts < counter_last[track]:
                fault(where, f"counter ts {ts} goes back (previous {counter_last[track]}) on track pid "
                             f"{ev['pid']} {name!r}")
            counter_last[track] = max(ts, counter_last.get(track, ts))
            counter_keys[track].update(args)
        elif ph in ("i", "I"):
            if ev.get("s") not in ("g", "p", "t"):
                fault(where, f"instant event scope s is {ev.get('s')!r}, not one of g, p, t")

    # B/E pairs, in time order (the file order among equal ts), per thread.
    for key, seq in b_e.items():
        stack = []
        for ts, i, ph, name in sorted(seq, key=lambda x: (x[0], x[1])):
            if ph == "B":
                stack.append((ts, name, i))
            elif not stack:
                fault(f"event {i} (E)", f"E at ts {ts} on pid {key[0]} tid {key[1]} closes no open B")
            else:
                bts, bname, bi = stack.pop()
                if name is not None and name != bname:
                    fault(f"event {i} (E {name!r})", f"closes B {bname!r} (event {bi})")
                slices[key].append((bts, ts, bname, bi))
                slice_names[bname] += 1
        for bts, bname, bi in stack:
            fault(f"event {bi} (B {bname!r})", f"never closed by an E on pid {key[0]} tid {key[1]}")

    # Nesting: sorted by start, longer first; each slice must end inside every slice it starts inside.
    for key, sl in slices.items():
        stack = []
        for start, end, name, i in sorted(sl, key=lambda s: (s[0], -s[1], s[3])):
            while stack and stack[-1][1] <= start + EPS_US:
                stack.pop()
            if stack and end > stack[-1][1] + EPS_US:
                ps, pe, pn, pi = stack[-1]
                fault(f"event {i} ({name!r} {start}..{end})",
                      f"overlaps event {pi} ({pn!r} {ps}..{pe}) partially on pid {key[0]} tid {key[1]}")
                continue
            stack.append((start, end, name, i))

    stats["per_ph"].update(per_ph)
    for track, keys in counter_keys.items():
        stats["counters"].add((track[1], track[2]))
        for k in keys:
            stats["counter_series"].add(f"{track[1]}.{k}")
    stats["slices"].update(slice_names)
    tracks = sorted({f"{n}{'' if tid is None else f'[{tid}]'} ({', '.join(sorted(counter_keys[(p, n, tid)]))})"
                     for (p, n, tid) in counter_keys})
    print(f"{PROG}: {path}: {len(events)} events; per ph: "
          + ", ".join(f"{k} {v}" for k, v in sorted(per_ph.items())))
    print(f"  counter tracks ({len(tracks)}): {'; '.join(tracks) if tracks else '-'}")
    top = slice_names.most_common(10)
    print(f"  slices ({sum(slice_names.values())}, {len(slice_names)} names), top 10: "
          + (", ".join(f"{n!r} x{c}" for n, c in top) if top else "-"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--expect-counter", action="append", default=[], metavar="NAME")
    ap.add_argument("--expect-slice", action="append", default=[], metavar="SUBSTRING")
    args = ap.parse_args()
    faults = []
    stats = {"per_ph": collections.Counter(), "counters": set(), "counter_series": set(),
             "slices": collections.Counter()}
    for path in args.files:
        check_file(path, faults, stats)
    names = {n for n, _ in stats["counters"]}
    for want in args.expect_counter:
        if want not in names and want not in stats["counter_series"]:
            faults.append(f"{', '.join(args.files)}: no counter track {want!r} (have: {sorted(names)})")
    for want in args.expect_slice:
        if not any(want in (n or "") for n in stats["slices"]):
            faults.append(f"{', '.join(args.files)}: no slice whose name contains {want!r}")
    if _oracle_env.print_faults(PROG, faults):
        return 1
    print(f"{PROG}: OK: {len(args.files)} file(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
