"""`hangtrace run` of a Ray job whose actor dies prints one line per incident and the
verdict on the console; Ray's lifecycle chatter (pooled workers retired before any work,
quiet deaths held for a clean shutdown, deaths after the incident) goes to the watcher log
only (issue 41). A real local Ray (``scripts/ray_actor_kill.py``, 2 CPUs), about 25 s."""

import glob
import os
import signal
import subprocess
import sys
import time

import pytest

from jobs import REPO, base_env, reap_job

pytest.importorskip("ray")

SCRIPT = os.path.join(REPO, "tests", "integration", "scripts", "ray_actor_kill.py")
#: what the watcher says about processes that are no incident (watch/detector.py, shutdown.py)
CHATTER = (
    "vanished before it did any work",
    "ended quietly while",
    "clean shutdown",
    "stopped after the stall",
)


def test_a_ray_actor_death_is_one_console_line_and_a_verdict_the_chatter_in_the_watcher_log(tmp_path):
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "hangtrace", "run", "--stall-s", "20", "--dir", str(run_dir), "--"]
    cmd += [sys.executable, SCRIPT, "--hold-s", "8"]
    env = dict(base_env(traced=False), HANGTRACE_COLUMNS="80")
    t0 = time.monotonic()
    p = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = p.communicate(timeout=240)
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except OSError:
            pass
    why = "rc=%s %.0fs\nstdout:\n%s\nstderr:\n%s" % (
        p.returncode,
        time.monotonic() - t0,
        out[-2000:],
        err[-6000:],
    )
    reap_job(str(run_dir), 30, why)
    assert "driver: step failed" in out, why
    snaps = sorted(glob.glob(str(run_dir / "snapshots" / "*")))
    incidents = [ln for ln in err.splitlines() if ln.startswith("hangtrace: ") and " detected: " in ln]
    blocks = err.count("==== hangtrace verdict ====")
    # one line, one verdict per incident; a later part of it whose verdict differs replaces it
    # (issue 38: its own block, no line; the same verdict found again: neither, no snapshot)
    replaced = err.count("==== hangtrace verdict, replacing the one above")
    assert incidents and len(incidents) == blocks and blocks + replaced == len(snaps), why
    verdict = " ".join(err.split("==== hangtrace verdict ====", 1)[1].split())
    assert verdict.startswith("Dead rank") or "worker-0" in verdict, why
    for ln in err.splitlines():  # the console: no chatter, and lines that fit (paths aside)
        assert not any(c in ln for c in CHATTER), (ln, why)
        assert len(ln) <= 80 or ln.startswith("hangtrace: ") or "/" in ln, (ln, why)
    logs = glob.glob(str(run_dir / "watcher-*.log"))
    assert logs, why
    with open(logs[0]) as f:
        log = f.read()
    assert "death: " in log, log  # the incident's full lines
    assert any(c in log for c in CHATTER), log  # Ray's pooled workers came and went: logged there
