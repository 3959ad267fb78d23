"""A forked helper's ring is kept in memory until the helper records something that matters
(issue 13 item 2: "created lazily or not at all"): then it is written to its file with
every record since the fork - the start record naming the parent, the memory samples, the
rank hint - and the same evidence as a ring made at the fork. Real traced processes, real
fork(2), real signals."""

import os
import signal
import subprocess
import sys
import textwrap

from jobs import base_env, kill_all, wait_line, wait_until

from hangtrace.tracer.ring import layout as F
from hangtrace.tracer.ring.reader import read_ring

JOB = textwrap.dedent("""
    import os, sys, time
    kids = {}
    for mode in ("clean", "code3", "raise", "alive"):
        pid = os.fork()
        if pid == 0:
            if mode == "code3":
                os._exit(3)
            if mode == "raise":
                raise ValueError("helper failed")
            if mode == "alive":
                print("alive", os.getpid(), flush=True)
                time.sleep(60)
            os._exit(0)
        kids[mode] = pid
    for mode in ("clean", "code3", "raise"):
        os.waitpid(kids[mode], 0)
    print("kids", " ".join("%s=%d" % kv for kv in kids.items()), flush=True)
    sys.stdin.readline()
""")


def _rings(run):
    out = {}
    for f in os.listdir(run):
        if f.startswith("ring-") and f.endswith(".htr"):
            r = read_ring(os.path.join(run, f))
            out[r.header["pid"]] = r
    return out


def _memory(ring):
    return [x for x in ring.records if x["kind"] == "memory" and x["what"] == "host"]


def _start(ring):
    return [e for e in ring.events if e["event"] == "start"][0]


def test_helper_ring_appears_when_it_records_something_that_matters(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(JOB)
    run = tmp_path / "run"
    p = subprocess.Popen(
        [sys.executable, str(script)],
        env=base_env(run, RANK=1, LOCAL_RANK=1, WORLD_SIZE=2),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    alive = 0
    try:
        alive = int(wait_line(p, "alive", timeout=60).split()[1])
        kids = dict(kv.split("=") for kv in wait_line(p, "kids", timeout=60).split()[1:])
        kids = {k: int(v) for k, v in kids.items()}
        # the helper that lives on: no file before its sampler's first tick, then its ring
        # (the file appears first, renamed into place, and the tick's sample lands in it just
        # after: a kill in between found a ring without it once in a CI mimic)
        wait_until(lambda: alive in _rings(run) and _memory(_rings(run)[alive]), timeout=30)
        os.kill(alive, signal.SIGKILL)
        p.stdin.write("\n")
        p.stdin.flush()
        assert p.wait(timeout=60) == 0, p.stderr.read()
    finally:
        kill_all([p])
        if alive:
            try:
                os.kill(alive, signal.SIGKILL)
            except ProcessLookupError:
                pass
    rings = _rings(run)
    # a helper that exits cleanly before anything mattered leaves no ring (its stack files
    # were opened at the fork: a signal in its first second still dumps its stacks)
    assert kids["clean"] not in rings, sorted(rings)
    assert os.path.exists(run / "stacks" / ("sigterm-%s-%d.txt" % (os.uname().nodename, kids["clean"])))
    parent = rings[p.pid]
    for mode in ("code3", "raise", "alive"):
        r = rings[kids[mode]]
        h = r.header
        assert h["nslots"] == 256, (mode, h)  # a helper's small ring
        assert _start(r)["forked_from"] == p.pid and h["ppid"] == p.pid, (mode, r.events)
        assert h["rank"] == 1 and h["world_size"] == 2, (mode, h)  # the rank hint a verdict uses
        assert h["proc_start_ticks"] and h["dump_signal"] == int(signal.SIGUSR2), (mode, h)
        assert _memory(r), mode  # the sample taken when the ring went to its file
    assert (
        rings[kids["code3"]].header["exit_code"] == 3 and rings[kids["code3"]].header["state"] == F.ST_EXITED
    )
    exc = [e for e in rings[kids["raise"]].events if e["event"] == "exception"]
    assert exc and exc[0]["type"] == "ValueError" and "helper failed" in exc[0]["traceback"]
    assert rings[kids["raise"]].header["exit_code"] == 1
    a = rings[alive]
    assert a.header["state"] != F.ST_EXITED and len(_memory(a)) >= 1  # (its first: at the first tick)
    # the parent's ring holds only the parent's records
    assert [e["event"] for e in parent.events] == [
        "start",
        "exiting",
        "exit",
    ]  # (exiting: its program returned)


def test_without_the_sampler_a_helper_ring_is_written_at_the_fork(tmp_path):
    prog = "import os\npid = os.fork()\nif pid == 0:\n    os._exit(0)\nos.waitpid(pid, 0)\nprint(pid)\n"
    run = tmp_path / "run"
    out = subprocess.run(
        [sys.executable, "-c", prog],
        env=base_env(run, HANGTRACE_MEM="0"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    kid = int(out.stdout.split()[0])
    rings = _rings(run)
    assert kid in rings and rings[kid].header["exit_code"] == 0
    assert rings[kid].header["proc_start_ticks"] > 0
