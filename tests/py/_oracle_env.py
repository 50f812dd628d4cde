"""Finds the interpreter that has the reference libraries (the oracles) a checker needs.

`python3 tests/py/X.py` may start an interpreter that cannot see them (a pyenv `python3` earlier on PATH does
not see Debian's python3-torch). Then the checker re-executes itself, once, with the venv that
scripts/setup.sh makes (${HR_PYENV:-<repo>/.pyenv}, which also sees Debian's packages) or with Debian's
/usr/bin/python3, whichever has every module it needs.
"""
import importlib.util
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_GUARD = "HR_ORACLE_REEXEC"


def _missing(modules):
    return [m for m in modules if importlib.util.find_spec(m) is None]


def _candidates():
    out = []
    if os.environ.get("HR_PYENV"):
        out.append(os.path.join(os.environ["HR_PYENV"], "bin", "python3"))
    out.append(os.path.join(REPO, ".pyenv", "bin", "python3"))
    out.append("/usr/bin/python3")
    return [c for c in out if os.access(c, os.X_OK)]


def _has(python, modules):
    probe = "import importlib.util, sys; sys.exit(any(importlib.util.find_spec(m) is None for m in sys.argv[1:]))"
    try:
        return subprocess.run([python, "-c", probe, *modules], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, timeout=60).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def require(*modules):
    """Returns when every module can be imported here; otherwise re-executes this script under an interpreter
    that has them all, or exits 2 naming what is missing."""
    missing = _missing(modules)
    if not missing:
        return
    if not os.environ.get(_GUARD):
        for python in _candidates():
            if _has(python, modules):
                env = dict(os.environ, **{_GUARD: python})
                os.execve(python, [python, os.path.abspath(sys.argv[0]), *sys.argv[1:]], env)
    name = os.path.basename(sys.argv[0])
    sys.stderr.write(f"{name}: FAIL: cannot import {', '.join(missing)} (interpreter {sys.executable}); "
                     f"run scripts/setup.sh, which installs them (Debian packages and the venv "
                     f"{os.environ.get('HR_PYENV') or os.path.join(REPO, '.pyenv')})\n")
    sys.exit(2)


def print_faults(prog, faults, shown=50):
    """Prints one FAIL line per fault (the first `shown`, then how many more) to stderr; returns whether there
    were any, for `return 1` in a checker's main."""
    for line in faults[:shown]:
        print(f"{prog}: FAIL: {line}", file=sys.stderr)
    if len(faults) > shown:
        print(f"{prog}: FAIL: ... {len(faults) - shown} more", file=sys.stderr)
    return bool(faults)
