"""The files built with wider ISA flags than the baseline (AVX-512, AMX: core/CMakeLists.txt) may define no weak
code symbol. An inline function or template instantiated there is emitted as a weak symbol, and the linker may keep
that copy for every caller in the program, so a CPU without those instructions would run them wherever the
function is called. Reads the build's compile_commands.json and lists each such file's weak definitions (nm).
Usage: isa_objects.py BUILD_DIR"""
import json
import os
import subprocess
import sys

WIDE = ("-mavx512", "-mamx")

build = sys.argv[1]
commands = json.load(open(os.path.join(build, "compile_commands.json")))
checked, bad = 0, []
for entry in commands:
    args = entry.get("command", "").split() or entry.get("arguments", [])
    if not any(a.startswith(WIDE) for a in args) or "-o" not in args:
        continue
    obj = os.path.join(entry["directory"], args[args.index("-o") + 1])
    if not os.path.exists(obj):
        sys.exit(f"{obj}: not built (run the build first)")
    symbols = subprocess.run(["nm", "-C", "--defined-only", obj], check=True, capture_output=True, text=True).stdout
    weak = [line for line in symbols.splitlines() if line.split(" ", 2)[1:2] in (["W"], ["u"])]
    checked += 1
    for line in weak:
        bad.append(f"{entry['file']}: {line.split(' ', 2)[2]}")
if checked == 0:
    sys.exit("no file is built with AVX-512 or AMX flags: nothing checked (is this an x86-64 build?)")
if bad:
    print("weak definitions in files built with AVX-512/AMX flags (call a function defined elsewhere instead):")
    print("\n".join(bad))
    sys.exit(1)
print(f"{checked} files built with AVX-512/AMX flags define no weak symbol")
