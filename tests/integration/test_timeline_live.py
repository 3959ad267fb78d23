"""Timeline and deep trace (issue 11) on real processes.

* With ``HANGTRACE_DEEP`` unset a traced process never imports viztracer (constructing a
  VizTracer installs a profile hook, DESIGN.md); the same child with the variable set
  and its rank selected does (the check can fail).
* The demo's hang (``examples/train_faults.py --fault cp-extra-microbatch``, 4 gloo ranks,
  as ``scripts/demo.sh`` runs it) under ``hangtrace run --deep "rank=1,phase=train"``: the
  ``timeline.json`` written at the incident has the rank tracks, the culprit's open
  collective, flows, memory counters and the stall marker; ``hangtrace timeline`` merges
  rank 1's function-level events into rank 1's track.
"""

import glob
import json
import os
import re
import signal
import subprocess
import sys

from jobs import REPO, base_env

EXAMPLE = os.path.join(REPO, "examples", "train_faults.py")

CHILD = r"""
import sys
from hangtrace import tracer
with tracer.phase("train", step=1):
    sum(range(1000))
print("VIZ", "viztracer" in sys.modules, flush=True)
"""


def _child(tmp_path, **env):
    out = subprocess.run(
        [sys.executable, "-c", CHILD],
        env=base_env(tmp_path / "run", RANK=0, **env),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return re.search(r"VIZ (\w+)", out.stdout).group(1)


def test_deep_unset_does_not_import_viztracer(tmp_path):
    assert _child(tmp_path) == "False"
    assert _child(tmp_path, HANGTRACE_DEEP="rank=5,phase=train") == "False"  # rank not selected
    assert _child(tmp_path, HANGTRACE_DEEP="rank=0,phase=eval") == "False"  # phase never entered
    assert _child(tmp_path, HANGTRACE_DEEP="rank=0,phase=train") == "True"  # control
    # the selected run dumped its buffer at exit, with its clock file
    assert glob.glob(str(tmp_path / "run" / "deep" / "deep-*.clock.json"))


def _kill_group(pgid):
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass


def run_demo(tmp_path, extra=()):
    """``hangtrace run --stall-s 8 --stop-on-stall [extra] -- train_faults.py --fault
    cp-extra-microbatch --world-size 4``; returns (rc, stderr, run_dir)."""
    run_dir = str(tmp_path / "run")
    cmd = [sys.executable, "-m", "hangtrace", "run", "--stall-s", "8", "--stop-on-stall", "--dir", run_dir]
    cmd += list(extra) + [
        "--",
        sys.executable,
        EXAMPLE,
        "--fault",
        "cp-extra-microbatch",
        "--world-size",
        "4",
        "--timeout-s",
        "200",
    ]
    # import torch in 4 ranks on a shared 2-core machine can take minutes: no startup verdict
    env = base_env(traced=False, HANGTRACE_STARTUP_STALL_S=240)
    p = subprocess.Popen(
        cmd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        cwd=REPO,
    )
    out = err = ""
    try:
        out, err = p.communicate(timeout=400)
    except subprocess.TimeoutExpired:
        pass
    finally:
        if p.poll() is None:
            _kill_group(p.pid)
            o2, e2 = p.communicate()
            out, err = (out or "") + o2, (err or "") + e2
        for pid in re.findall(r"launcher pid (\d+)", out or ""):
            _kill_group(int(pid))
    return p.returncode, err, run_dir


def _tracks(t):
    return {
        e["pid"]: e["args"]["name"]
        for e in t["traceEvents"]
        if e["ph"] == "M" and e["name"] == "process_name"
    }


def _rank_pids(t):
    out = {}
    for pid, name in _tracks(t).items():
        m = re.match(r"(?:CULPRIT )?rank (\d+) · ", name)
        if m:
            out[int(m.group(1))] = pid
    return out


def check_demo_trace(t):
    """The demo's hang as the timeline shows it (see module doc)."""
    names = _tracks(t)
    ranks = _rank_pids(t)
    assert sorted(ranks) == [0, 1, 2, 3], names
    assert names[ranks[1]].startswith("CULPRIT rank 1 · ")
    assert not any(names[ranks[r]].startswith("CULPRIT") for r in (0, 2, 3))
    evs = [e for e in t["traceEvents"] if e["ph"] != "M"]
    stall = [e for e in evs if e["ph"] == "i" and e["name"] == "stall detected"]
    assert len(stall) == 1 and stall[0]["s"] == "g"
    # the culprit's open collective: rank 1's extra all_reduce on cp0, in flight until the stall
    v = [e for e in evs if e["ph"] == "X" and "verdict" in e.get("args", {})]
    assert len(v) == 1, v
    v = v[0]
    assert v["pid"] == ranks[1] and v["args"]["open"] and v["args"]["group_desc"] == "cp0"
    assert v["args"]["op"] == "all_reduce" and v["args"]["phase"] == "train" and v["args"]["step"] == 2
    assert abs(v["ts"] + v["dur"] - stall[0]["ts"]) < 1.0  # µs rounding
    # the waiting peers have open collectives too, none marked as the verdict
    open_other = {
        e["pid"]
        for e in evs
        if e["ph"] == "X" and e.get("args", {}).get("open") and e["cat"] != "phase" and e["pid"] != ranks[1]
    }
    assert open_other == {ranks[0], ranks[2], ranks[3]}
    # flows: cp0's earlier all_reduces link ranks 0 and 1; the world group's link all four
    flows = {}
    for e in evs:
        if e.get("cat") == "flow":
            flows.setdefault(e["id"], []).append(e)
    linked = [{e["pid"] for e in f} for f in flows.values()]
    assert {ranks[0], ranks[1]} in linked
    assert {ranks[0], ranks[1], ranks[2], ranks[3]} in linked
    for f in flows.values():
        assert [e["ph"] for e in f][0] == "s" and [e["ph"] for e in f][-1] == "f"
    # memory counters on every rank, in bytes
    for r, pid in ranks.items():
        c = [e for e in evs if e["ph"] == "C" and e["pid"] == pid and e["name"] == "memory [bytes]"]
        assert c and all(e["args"].get("rss", 0) > 10 << 20 for e in c), r
    # phases and steps
    assert {e["name"] for e in evs if e["ph"] == "X" and e["cat"] == "phase"} >= {"rollout", "train"}
    assert {e["name"] for e in evs if e["ph"] == "X" and e["cat"] == "step"} == {"step 1", "step 2"}
    return ranks


def test_demo_hang_timeline_with_deep_trace(tmp_path):
    rc, err, run_dir = run_demo(tmp_path, ["--deep", "rank=1,phase=train"])
    assert "==== hangtrace verdict ====" in err, err[-4000:]
    paths = sorted(glob.glob(os.path.join(run_dir, "snapshots", "*", "timeline.json")))
    assert paths, err[-4000:]
    assert "timeline: %s" % paths[-1] in err
    with open(paths[-1]) as f:
        check_demo_trace(json.load(f))
    # the CLI on the same snapshot, gzip, with rank 1's deep trace merged
    out = str(tmp_path / "t.json.gz")
    r = subprocess.run(
        [sys.executable, "-m", "hangtrace", "timeline", os.path.dirname(paths[-1]), "-o", out],
        env=base_env(traced=False),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    import gzip

    with gzip.open(out, "rt") as f:
        t = json.load(f)
    ranks = check_demo_trace(t)
    deep = [e for e in t["traceEvents"] if e.get("cat") == "deep" and e["ph"] == "X"]
    assert deep, "no deep events: %s" % os.listdir(os.path.join(run_dir, "deep"))
    assert {e["pid"] for e in deep} == {ranks[1]}
    assert any("train_faults.py" in e["name"] and "train" in e["name"] for e in deep), deep[:5]
    # only inside rank 1's 'train' phases (1 ms slack: two clock readings per conversion)
    trains = [
        (e["ts"], e["ts"] + e["dur"])
        for e in t["traceEvents"]
        if e["ph"] == "X" and e.get("cat") == "phase" and e["name"] == "train" and e["pid"] == ranks[1]
    ]
    for e in deep:
        assert any(a - 1000 <= e["ts"] <= b + 1000 for a, b in trains), (e, trains)


def test_sigkilled_rank_track_ends_at_its_last_record(tmp_path):
    """train_faults --fault kill-rank (rank 1 SIGKILLs itself mid-step): the incident's
    timeline.json, written from the rings alone, ends rank 1's track at its last record
    (not at the snapshot) and marks the death there; rank 0's track goes on."""
    from test_examples import run_example

    r = run_example(tmp_path, "kill-rank")
    paths = sorted(glob.glob(os.path.join(r.run_dir, "snapshots", "*", "timeline.json")))
    assert paths, r.why()
    with open(paths[0]) as f:
        t = json.load(f)
    pids = _rank_pids(t)
    assert set(pids) >= {0, 1}, _tracks(t)

    def last_end(pid):
        return max(
            e["ts"] + e.get("dur", 0) for e in t["traceEvents"] if e.get("pid") == pid and e["ph"] != "M"
        )

    deaths = [
        e for e in t["traceEvents"] if e.get("pid") == pids[1] and e["ph"] == "i" and e.get("cat") == "death"
    ]
    assert deaths, [e for e in t["traceEvents"] if e.get("pid") == pids[1] and e["ph"] == "i"]
    assert last_end(pids[1]) <= deaths[0]["ts"] + 1.0  # nothing drawn after its last record
    assert last_end(pids[0]) > deaths[0]["ts"]  # the survivor's track goes on
