#!/usr/bin/env python3
"""Renders an HTML report with headless Chromium and checks that it works offline, without a script error.

    python3 tests/py/check_report.py HTML [--png OUT.png] [--expect-series NAME]... [--no-cdp] [--timeout S]

Checks, each naming the file and what failed:
  1. static: the page refers to nothing on the network: no src / href / xlink:href / action / poster attribute,
     CSS url() or @import, script import / fetch to an http(s):// or protocol-relative (//host) address (the
     namespace URIs of xmlns attributes and createElementNS calls are not requests);
  2. Chromium (Debian's `chromium`, --headless=new --no-sandbox --disable-gpu, every host name resolving to
     nothing, background networking off, a fresh profile) takes a 1400x2000 screenshot (--screenshot); the PNG
     must decode and have more than 2 distinct colours (not blank);
  3. a second run dumps the DOM after the scripts ran (--dump-dom, with --enable-logging=stderr --v=0): the <body>
     must carry data-ready="1" (the page's script sets document.body.dataset.ready = "1" at its end, so a script
     error leaves it unset), every --expect-series NAME must appear as data-series="NAME", and the console lines
     Chromium logs must hold no "Uncaught" error;
  4. unless --no-cdp, a third run drives the page over the DevTools protocol (--remote-debugging-pipe): it fails
     on any uncaught exception, console.error / console.assert, browser log error (e.g. a resource that did not
     load) and any request for a URL that is not file:, data:, blob: or about:. Chromium's command-line logging
     cannot tell console.error from console.log; this can.
Exit 0 when all holds, 1 with one line per fault, 2 on a usage error or when Chromium or numpy is missing.
Each Chromium run's time is printed.
"""
import argparse
import fcntl
import json
import os
import re
import select
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _oracle_env  # noqa: E402

_oracle_env.require("numpy")

import numpy as np  # noqa: E402

PROG = "check_report"
WINDOW = (1400, 2000)
BASE_FLAGS = [
    "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--mute-audio",
    "--no-first-run", "--no-default-browser-check", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--disable-default-apps", "--disable-extensions",
    "--disable-breakpad", "--disable-domain-reliability", "--disable-client-side-phishing-detection",
    "--no-pings", "--metrics-recording-only", "--password-store=basic", "--use-mock-keychain",
    # Nothing the page (or Chromium itself) asks for can reach a host: every name resolves to nothing.
    "--host-resolver-rules=MAP * ~NOTFOUND",
]
NOISE = re.compile(r"dbus|D-Bus|vaapi|drmGetDevices|InitializeSandbox|unexpected operator|Fontconfig|"
                   r"gpu_init|viz_main|^\s*$|bytes written to file", re.I)

EXTERNAL_PATTERNS = [
    (re.compile(r"""\b(src|href|xlink:href|action|poster|data|formaction|background|srcset)\s*=\s*["']?\s*"""
                r"""(https?:)?//""", re.I), "attribute"),
    (re.compile(r"""url\(\s*["']?\s*(https?:)?//""", re.I), "CSS url()"),
    (re.compile(r"""@import\s+(url\()?\s*["']?\s*(https?:)?//""", re.I), "CSS @import"),
    (re.compile(r"""\bimport\s*(\(|[^;'"]*\bfrom\s*)\s*["'](https?:)?//""", re.I), "script import"),
    (re.compile(r"""\b(fetch|XMLHttpRequest|EventSource|WebSocket|sendBeacon)\s*\(\s*["'](https?:|wss?:)?//""",
                re.I), "script request"),
]


def static_refs(html):
    """[(line, kind, excerpt)] for every reference to a network address."""
    out = []
    for pat, kind in EXTERNAL_PATTERNS:
        for m in pat.finditer(html):
            line = html.count("\n", 0, m.start()) + 1
            out.append((line, kind, html[m.start():m.start() + 80].split("\n")[0]))
    return sorted(out)


def find_chromium():
    for name in (os.environ.get("HR_CHROMIUM"), "chromium", "chromium-browser", "google-chrome"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def run_chromium(chromium, flags, url, timeout, env):
    t0 = time.monotonic()
    try:
        p = subprocess.run([chromium, *BASE_FLAGS, *flags, url], capture_output=True, timeout=timeout, env=env)
        rc, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        rc, out, err = "timeout", e.stdout or b"", e.stderr or b""
    return rc, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"), time.monotonic() - t0


def console_lines(stderr):
    return [ln for ln in stderr.splitlines() if ":CONSOLE" in ln]


def decode_png(path):
    """(width, height, pixels as an (h, w, channels) uint8 array) of an 8-bit non-interlaced RGB(A)/grey PNG."""
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    pos, idat, ihdr = 8, [], None
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if zlib.crc32(kind + body) != struct.unpack(">I", data[pos + 8 + n:pos + 12 + n])[0]:
            raise ValueError(f"chunk {kind!r} fails its CRC")
        pos += 12 + n
        if kind == b"IHDR":
            ihdr = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
    if ihdr is None:
        raise ValueError("no IHDR")
    w, h, depth, ctype, _, _, interlace = ihdr
    channels = {0: 1, 2: 3, 4: 2, 6: 4}.get(ctype)
    if depth != 8 or channels is None or interlace:
        raise ValueError(f"unsupported PNG (bit depth {depth}, colour type {ctype}, interlace {interlace})")
    raw = np.frombuffer(zlib.decompress(b"".join(idat)), dtype=np.uint8)
    stride = w * channels
    if raw.size != h * (stride + 1):
        raise ValueError(f"image data is {raw.size} bytes, expected {h * (stride + 1)}")
    rows = raw.reshape(h, stride + 1)
    img = np.zeros((h, stride), dtype=np.uint8)
    prev = np.zeros(stride, dtype=np.uint8)
    for y in range(h):
        f, line = rows[y, 0], rows[y, 1:]
        if f == 0:
            cur = line.copy()
        elif f == 1:  # Sub: a running sum per channel
            cur = np.cumsum(line.reshape(w, channels), axis=0, dtype=np.uint8).reshape(stride)
        elif f == 2:  # Up
            cur = line + prev
        elif f in (3, 4):  # Average, Paeth: sequential, byte by byte
            out = bytearray(stride)
            ln, up = line.tobytes(), prev.tobytes()
            for i in range(stride):
                a = out[i - channels] if i >= channels else 0
                b = up[i]
                if f == 3:
                    out[i] = (ln[i] + ((a + b) >> 1)) & 0xFF
                else:
                    c = up[i - channels] if i >= channels else 0
                    p = a + b - c
                    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                    pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                    out[i] = (ln[i] + pred) & 0xFF
            cur = np.frombuffer(bytes(out), dtype=np.uint8)
        else:
            raise ValueError(f"row {y}: unknown filter {f}")
        img[y] = cur
        prev = cur
    return w, h, img.reshape(h, w, channels)


class CdpPipe:
    """The DevTools protocol over --remote-debugging-pipe: Chromium reads commands on fd 3 and writes on fd 4,
    each message JSON ended by a NUL byte."""

    def __init__(self, chromium, flags, env):
        to_child_r, self.to_child = os.pipe()
        self.from_child, from_child_w = os.pipe()
        hi_r = fcntl.fcntl(to_child_r, fcntl.F_DUPFD, 10)
        hi_w = fcntl.fcntl(from_child_w, fcntl.F_DUPFD, 10)
        os.close(to_child_r)
        os.close(from_child_w)

        def child_fds():
            os.dup2(hi_r, 3)
            os.dup2(hi_w, 4)

        self.proc = subprocess.Popen([chromium, *BASE_FLAGS, *flags, "--remote-debugging-pipe", "about:blank"],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     preexec_fn=child_fds, pass_fds=(3, 4, hi_r, hi_w), env=env)
        os.close(hi_r)
        os.close(hi_w)
        self.buf = b""
        self.next_id = 0
        self.events = []

    def send(self, method, params=None, session=None, timeout=20):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self.to_child, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            for m in self._read(deadline):
                if m.get("id") == self.next_id:
                    if "error" in m:
                        raise RuntimeError(f"{method}: {m['error']}")
                    return m.get("result", {})
                self.events.append(m)

    def wait_event(self, method, timeout):
        deadline = time.monotonic() + timeout
        while True:
            for i, m in enumerate(self.events):
                if m.get("method") == method:
                    return m
            try:
                self.events.extend(self._read(deadline))
            except TimeoutError:
                return None

    def pump(self, seconds):
        deadline = time.monotonic() + seconds
        try:
            while True:
                self.events.extend(self._read(deadline))
        except TimeoutError:
            pass

    def _read(self, deadline):
        while b"\0" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            r, _, _ = select.select([self.from_child], [], [], left)
            if not r:
                raise TimeoutError
            chunk = os.read(self.from_child, 1 << 20)
            if not chunk:
                raise EOFError("Chromium closed the DevTools pipe")
            self.buf += chunk
        msgs = []
        while b"\0" in self.buf:
            raw, self.buf = self.buf.split(b"\0", 1)
            msgs.append(json.loads(raw))
        return msgs

    def close(self):
        try:
            os.write(self.to_child, json.dumps({"id": 0, "method": "Browser.close"}).encode() + b"\0")
        except OSError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self.to_child, self.from_child):
            try:
                os.close(fd)
            except OSError:
                pass


def cdp_check(chromium, url, env, timeout, fault):
    """Loads url over the DevTools protocol; faults on exceptions, console errors, log errors and requests."""
    t0 = time.monotonic()
    cdp = CdpPipe(chromium, [f"--window-size={WINDOW[0]},{WINDOW[1]}"], env)
    try:
        target = cdp.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = cdp.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Runtime", "Log", "Network", "Page"):
            cdp.send(f"{domain}.enable", session=session)
        cdp.events.clear()
        cdp.send("Page.navigate", {"url": url}, session=session)
        if cdp.wait_event("Page.loadEventFired", timeout) is None:
            fault("cdp", f"no load event within {timeout} s")
        cdp.pump(0.3)  # late timers, promise rejections
        ready = cdp.send("Runtime.evaluate", {"expression": "document.body && document.body.dataset.ready",
                                              "returnByValue": True}, session=session)
        if ready.get("result", {}).get("value") != "1":
            fault("cdp", f"document.body.dataset.ready is {ready.get('result', {}).get('value')!r}, not \"1\"")
        n_requests = 0
        for ev in cdp.events:
            m, p = ev.get("method"), ev.get("params", {})
            if m == "Runtime.exceptionThrown":
                d = p.get("exceptionDetails", {})
                text = d.get("exception", {}).get("description") or d.get("text")
                fault("console", f"uncaught exception at line {d.get('lineNumber', -1) + 1}: {text}")
            elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                args = " ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", []))
                fault("console", f"console.{p['type']}: {args}")
            elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                e = p["entry"]
                fault("console", f"browser log error ({e.get('source')}): {e.get('text')} {e.get('url', '')}")
            elif m == "Network.requestWillBeSent":
                n_requests += 1
                req_url = p.get("request", {}).get("url", "")
                if not re.match(r"(file|data|blob|about):", req_url):
                    fault("network", f"the page requested {req_url[:200]}")
        return n_requests, time.monotonic() - t0
    finally:
        cdp.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("html")
    ap.add_argument("--png", help="where to keep the screenshot (default: a temporary file)")
    ap.add_argument("--expect-series", action="append", default=[], metavar="NAME")
    ap.add_argument("--no-cdp", action="store_true", help="skip the DevTools-protocol run")
    ap.add_argument("--timeout", type=float, default=60, help="seconds for each Chromium run (default 60)")
    args = ap.parse_args()
    faults = []
    path = os.path.abspath(args.html)

    def fault(where, msg):
        faults.append(f"{args.html}: {where}: {msg}")

    try:
        html = open(path, encoding="utf-8").read()
    except (OSError, UnicodeDecodeError) as e:
        print(f"{PROG}: FAIL: {args.html}: {e}", file=sys.stderr)
        return 1
    for line, kind, excerpt in static_refs(html):
        fault(f"line {line}", f"network reference ({kind}): {excerpt}")

    chromium = find_chromium()
    if chromium is None:
        print(f"{PROG}: FAIL: no chromium on PATH (scripts/setup.sh installs Debian's chromium)", file=sys.stderr)
        return 2
    url = "file://" + path
    timings, shot_info = [], "-"
    with tempfile.TemporaryDirectory(prefix="hr-chromium-") as tmp:
        env = dict(os.environ, HOME=tmp, XDG_CONFIG_HOME=os.path.join(tmp, "config"),
                   XDG_CACHE_HOME=os.path.join(tmp, "cache"))
        png = os.path.abspath(args.png) if args.png else os.path.join(tmp, "shot.png")
        if os.path.exists(png):
            os.remove(png)

        rc, out, err, dt = run_chromium(chromium, [f"--user-data-dir={tmp}/p1", f"--screenshot={png}",
                                                   f"--window-size={WINDOW[0]},{WINDOW[1]}"], url,
                                        args.timeout, env)
        timings.append(f"screenshot {dt:.2f} s")
        if rc != 0 or not os.path.exists(png):
            tail = [ln for ln in err.splitlines() if not NOISE.search(ln)][-5:]
            fault("screenshot", f"chromium exited {rc} without a PNG: {' | '.join(tail)}")
        else:
            try:
                w, h, img = decode_png(png)
                flat = img.reshape(-1, img.shape[2]).astype(np.uint32)
                packed = np.zeros(flat.shape[0], dtype=np.uint32)
                for c in range(flat.shape[1]):
                    packed = (packed << 8) | flat[:, c]
                colours, counts = np.unique(packed, return_counts=True)
                background = counts.max() / packed.size
                if (w, h) != WINDOW:
                    fault("screenshot", f"{w}x{h}, not {WINDOW[0]}x{WINDOW[1]}")
                if len(colours) <= 2:
                    fault("screenshot", f"blank: {len(colours)} distinct colour(s)")
                shot_info = f"{w}x{h}, {len(colours)} colours, {100 * (1 - background):.1f}% not background"
            except (ValueError, zlib.error) as e:
                fault("screenshot", f"the PNG does not decode: {e}")
                shot_info = "undecodable"

        rc, dom, err, dt = run_chromium(chromium, [f"--user-data-dir={tmp}/p2", "--enable-logging=stderr",
                                                   "--v=0", "--dump-dom"], url, args.timeout, env)
        timings.append(f"dump-dom {dt:.2f} s")
        if rc != 0 or not dom.strip():
            fault("dump-dom", f"chromium exited {rc} with {len(dom)} bytes of DOM")
        body = re.search(r"<body\b[^>]*>", dom, re.I)
        if not body or not re.search(r"""\bdata-ready\s*=\s*["']?1["']?""", body.group(0)):
            fault("dump-dom", f"<body> lacks data-ready=\"1\" after the scripts ran (a script error?): "
                              f"{body.group(0)[:200] if body else 'no <body>'}")
        have_series = set(re.findall(r"""\bdata-series\s*=\s*"([^"]*)\"""", dom))
        for name in args.expect_series:
            esc = name.replace("&", "&amp;").replace('"', "&quot;").replace("<", "&lt;").replace(">", "&gt;")
            if name not in have_series and esc not in have_series:
                fault("dump-dom", f"no data-series=\"{name}\" in the DOM (have: {sorted(have_series)[:20]})")
        console = console_lines(err)
        for ln in console:
            if "Uncaught" in ln:
                fault("console", ln.split("] ", 1)[-1])

        n_requests = None
        if not args.no_cdp:
            try:
                n_requests, dt = cdp_check(chromium, url, dict(env), args.timeout, fault)
                timings.append(f"devtools {dt:.2f} s")
            except (RuntimeError, EOFError, TimeoutError, OSError, ValueError) as e:
                fault("cdp", f"the DevTools-protocol run failed: {type(e).__name__}: {e}")

    print(f"{PROG}: {args.html}: chromium runs: {', '.join(timings)}; screenshot {shot_info}"
          f"{'' if args.png is None else ' -> ' + args.png}; {len(have_series)} data-series; "
          f"{len(console)} console line(s)"
          + ("" if n_requests is None else f"; {n_requests} request(s) seen over DevTools"))
    if _oracle_env.print_faults(PROG, faults):
        return 1
    print(f"{PROG}: OK: {args.html}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
