"""The timeline of a real DDP job with torch's Flight Recorder entries (issue 41, item 1).

One job for the module: ``scripts/ddp_loader_train.py`` under torchrun, 3 gloo ranks with two
DataLoader workers each; at step 5 rank 1 waits in ``multiprocessing.Queue.get()`` while
ranks 0 and 2 go on into DDP's gradient all-reduce, issued from C++ (only torch's Flight
Recorder sees it). ``hangtrace dump`` takes the snapshot (with the ranks' Flight Recorder
dumps); ``hangtrace timeline`` draws it. Measured before the fix (2026-12-07): every C++
collective sat at minus the machine's uptime, "in flight"; the Perfetto UI dropped 208 of the
trace's events (``trace_sorter_negative_timestamp_dropped``) and showed no collective;
``--since -30`` failed with ``KeyError: 'state'``; each DataLoader worker of rank 1 had a
``CULPRIT rank 1`` track of its own.
"""

import json
import os
import subprocess
import sys

import pytest

from ddp_jobs import TORCHRUN, descendants, start_job, stop, wait_file
from jobs import base_env, blocked, wait_until
from viewer import check_in_browser

from hangtrace.tracer.collect.rings import load_snapshot

pytestmark = pytest.mark.skipif(TORCHRUN is None, reason="torchrun not on PATH")

HANG_STEP = 5
BUCKET = 2177  # the model's parameters: one gradient bucket


def _cli(*args, tmp):
    r = subprocess.run(
        [sys.executable, "-m", "hangtrace", *args],
        env=base_env(traced=False, TMPDIR=tmp),
        capture_output=True,
        timeout=180,
    )
    assert r.returncode == 0, r.stderr.decode()[-4000:]
    return r


@pytest.fixture(scope="module")
def hung_ddp(tmp_path_factory):
    """(snapshot dir, its verdict, the full trace's path, the trace dict) of the hung job."""
    tmp = tmp_path_factory.mktemp("ddp")
    job, out, run = start_job(tmp, traced=True, hang_rank=1, hang_step=HANG_STEP)
    try:
        wait_file(job, out / "hanging")
        wait_until(lambda: blocked(descendants(job.pid)), timeout=120, period=0.2)
        # the subject is the timeline, not the dump's window: a window that still saw a move
        # (the CI mimic of 13:13, once) says progressing, and a user takes another snapshot
        for _ in range(3):
            d = json.loads(_cli("dump", str(run), "--json", tmp=tmp).stdout)
            if d["kind"] != "progressing":
                break
    finally:
        stop(job)
    path = str(tmp / "t.json")
    _cli("timeline", d["snapshot"], "-o", path, tmp=tmp)
    with open(path) as f:
        return d["snapshot"], d, path, json.load(f)


def _tracks(t):
    return {
        e["pid"]: e["args"]["name"]
        for e in t["traceEvents"]
        if e["ph"] == "M" and e["name"] == "process_name"
    }


def _rank_pid(t, r):
    return [p for p, n in _tracks(t).items() if n.replace("CULPRIT ", "").startswith("rank %d " % r)][0]


def _cpp_allreduces(t, pid):
    return [
        e
        for e in t["traceEvents"]
        if e["ph"] == "X"
        and e["pid"] == pid
        and e["args"].get("source") == "flight-recorder"
        and e["args"]["op"] == "all_reduce"
        and e["args"]["numel"] == BUCKET
    ]


def test_ddp_timeline_places_cpp_allreduces_on_the_runs_clock(hung_ddp, tmp_path):
    snap_dir, d, _path, t = hung_ddp
    assert (d["kind"], d["culprit_ranks"]) == ("stuck-outside-collective", [1]), d["summary"]
    # tracks: a rank's DataLoader workers go under it; only rank 1's own track is the culprit
    names = sorted(_tracks(t).values())
    culprits = [n for n in names if n.startswith("CULPRIT")]
    assert len(culprits) == 1 and culprits[0].startswith("CULPRIT rank 1 ·"), names
    for r in range(3):
        assert _tracks(t)[_rank_pid(t, r)].endswith("(+2 helper processes)"), names
    # no event before the first process started or after the snapshot
    snap = load_snapshot(snap_dir)
    first = min(p.start_wall_ns for p in snap.processes if p.start_wall_ns)
    t0 = t["otherData"]["t0_wall_ns"]
    for e in t["traceEvents"]:
        if e["ph"] != "M":
            a, b = t0 + e["ts"] * 1000, t0 + (e["ts"] + e.get("dur", 0)) * 1000
            assert first - 10**9 <= a <= b <= snap.taken_wall_ns + 10**9, e
    # DDP's C++ gradient all-reduces, from the Flight Recorder: completed ones before the hang,
    # the one ranks 0 and 2 wait in open until the snapshot; rank 1 never issued it
    stall_end = max(e["ts"] + e.get("dur", 0) for e in t["traceEvents"] if e["ph"] != "M")
    seqs = {}
    for r in range(3):
        c = _cpp_allreduces(t, _rank_pid(t, r))
        done = [e for e in c if e["args"]["state"] == "completed"]
        live = [e for e in c if e["args"].get("open")]
        assert len(done) >= HANG_STEP - 1 and all(
            e["dur"] == 0.0 and "end_unknown" in e["args"] for e in done
        )
        assert len(live) == (0 if r == 1 else 1), [e["name"] for e in c]
        for e in live:
            assert e["args"]["state"] == "issued" and e["name"].endswith("[C++] (in flight)")
            assert abs(e["ts"] + e["dur"] - stall_end) < 1e6  # open until the snapshot (±1 s)
        seqs[r] = {e["args"]["seq"] for e in done}
    # arrows link the three ranks' launches of each completed all-reduce
    flows = {}
    for e in t["traceEvents"]:
        if e.get("cat") == "flow":
            flows.setdefault(e["name"], set()).add(e["pid"])
    for s in seqs[0] & seqs[1] & seqs[2]:
        assert flows["coll 0 #%d" % s] == {_rank_pid(t, r) for r in range(3)}
    # --since -30 (the README's example) to stdout; --until
    out = _cli("timeline", snap_dir, "--since", "-30", "-o", "-", tmp=tmp_path)
    w = json.loads(out.stdout)
    assert b"timeline: stdout" in out.stderr
    evs = [e for e in w["traceEvents"] if e["ph"] != "M"]
    assert evs and all(0 <= e["ts"] <= e["ts"] + e.get("dur", 0) <= 30e6 + 1 for e in evs)
    assert len(_cpp_allreduces(w, _rank_pid(w, 0))) >= 1
    _cli("timeline", snap_dir, "--until", "5", "-o", str(tmp_path / "u.json"), tmp=tmp_path)
    with open(tmp_path / "u.json") as f:
        u = json.load(f)
    assert all(e["ts"] + e.get("dur", 0) <= 5e6 + 1 for e in u["traceEvents"] if e["ph"] != "M")


def test_ddp_timeline_in_the_browser_shows_every_event(hung_ddp, tmp_path):
    """The Perfetto UI the docs document (``hangtrace timeline --open``) imports every event
    of the full trace, the C++ all-reduces with them; with HANGTRACE_LONG=1 also of
    ``--since -30`` (one more page load in the same browser)."""
    snap_dir, _d, path, t = hung_ddp
    traces = [path]
    if os.environ.get("HANGTRACE_LONG") == "1":
        traces.append(str(tmp_path / "since.json"))
        _cli("timeline", snap_dir, "--since", "-30", "-o", traces[-1], tmp=tmp_path)
    res = check_in_browser(*traces)
    for p, r in res.items():
        assert r["ok"], json.dumps(r, indent=1)
        assert r["viewer"]["slice"] > 0 and r["viewer"]["flow"] > 0
    assert res[path]["viewer"]["slice"] == sum(1 for e in t["traceEvents"] if e["ph"] in ("X", "i", "b"))
    assert any(n.startswith("CULPRIT rank 1 ") for n in res[path]["process_names"])
