"""A forked DataLoader worker's evidence after the after-fork handler was made cheaper
(issue 13): the child takes its parent's memory sampler over, its ring's identity is
written once, its faulthandler registrations are re-pointed instead of re-made. What a
verdict needs of such a worker must still be there:

* a worker that crashes (SIGSEGV) after growing: its ring (start record naming the
  parent, the parent's rank hint, so it is that rank's helper), memory samples from its
  own sampler thread showing the growth, the memory cgroup in its metadata;
* a plain forked child that crashes: the fatal signal's stack file with its frames, and
  SIGTERM's stacks in its own file (the registrations re-pointed to the child's files);
* a worker stuck in its own code: alive, with the dump signal registered in its ring
  header, and that signal writes its stacks to its own dump file.

One traced process with RANK=0 (a rank as its helpers see it), a real
``DataLoader(num_workers=2)``.
"""

import os
import signal
import subprocess
import sys

from jobs import base_env, kill_all, wait_line, wait_until

JOB = r"""
import ctypes, os, sys, time
import torch
from torch.utils.data import DataLoader, Dataset

class DS(Dataset):
    def __len__(self):
        return 2

    def __getitem__(self, i):
        wid = torch.utils.data.get_worker_info().id
        if wid == 0:
            blob = bytearray(192 << 20)
            for k in range(0, len(blob), 4096):
                blob[k] = 1
            print("grown", os.getpid(), flush=True)
            time.sleep(2.5)  # the worker's own sampler ticks (1 s) and records the growth
            while not os.path.exists(sys.argv[1]):  # the test is done with the stuck worker
                time.sleep(0.05)
            ctypes.string_at(0)  # SIGSEGV
        print("stuck", os.getpid(), flush=True)
        time.sleep(60)
        return i

print("parent", os.getpid(), flush=True)
try:
    for _ in DataLoader(DS(), num_workers=2, batch_size=1):
        pass
except RuntimeError as e:
    print("caught", e, flush=True)
"""


def test_crashed_and_stuck_dataloader_workers_keep_their_evidence(tmp_path):
    from hangtrace.tracer.collect.ringprocs import load_rings
    from hangtrace.tracer.process_model import assign_roles
    from hangtrace.tracer.snapshot import Role

    script = tmp_path / "dl_crash.py"
    script.write_text(JOB)
    run = tmp_path / "run"
    go = tmp_path / "crash-now"
    p = subprocess.Popen(
        [sys.executable, str(script), str(go)],
        env=base_env(run, RANK=0, LOCAL_RANK=0, WORLD_SIZE=2),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        parent = int(wait_line(p, "parent", timeout=120).split()[1])
        stuck = grown = 0
        while not (stuck and grown):
            kind, pid = wait_line(p, "", timeout=120).split()[:2]
            if kind == "stuck":
                stuck = int(pid)
            elif kind == "grown":
                grown = int(pid)

        # the stuck worker: alive, its ring names the dump signal, which dumps its stacks.
        # (A forked helper's ring is written to its file at its memory sampler's first
        # tick, a sampling interval (1 s) after the fork, or sooner when it records
        # something that matters: hooks/record/ringsize.py, ``materialize``.)
        def stuck_ring():
            return [x for x in load_rings(str(run))[0] if x.pid == stuck]

        wait_until(lambda: stuck_ring(), timeout=30)
        (w,) = stuck_ring()
        assert w.meta["dump_signal"] == int(signal.SIGUSR2)
        os.kill(stuck, signal.SIGUSR2)
        dump = run / "stacks" / ("dump-%s-%d.txt" % (os.uname().nodename, stuck))
        wait_until(lambda: dump.exists() and "__getitem__" in dump.read_text(), timeout=60)
        go.write_text("")  # (only now: the rank's loader stops every worker once one died)
        wait_line(p, "caught", timeout=120)
        os.kill(stuck, signal.SIGKILL)
        p.wait(timeout=60)
    finally:
        kill_all([p])
    procs, _ = load_rings(str(run), str(run))
    by_pid = {x.pid: x for x in procs}
    crashed = by_pid[grown]
    starts = [e for e in crashed.events if e["event"] == "start"]
    assert starts and starts[0]["forked_from"] == parent, crashed.events
    assert crashed.rank == 0 and crashed.state == "killed", (crashed.rank, crashed.state)
    assert crashed.meta.get("mem_cgroup_version") in (1, 2), crashed.meta
    rss = [s["values"].get("rss", -1) for s in crashed.memory if s["what"] == "host"]
    assert len(rss) >= 2 and max(rss) >= 192 << 20, crashed.memory  # the start sample, then the growth
    # (no fatal-signal stacks here, before this change too: torch's DataLoader worker sets its
    # own SIGSEGV/SIGBUS/SIGFPE handler, ``_set_worker_signal_handlers``, over faulthandler's;
    # a plain forked child's are checked below)
    assert assign_roles(procs).role(crashed) == Role.RANK_HELPER


FORK_JOB = r"""
import ctypes, os, signal, sys, time
kid = os.fork()
if kid == 0:
    def crash_here():
        ctypes.string_at(0)
    crash_here()
term = os.fork()
if term == 0:
    def wait_for_term():
        os.write(1, b"waiting %d\n" % os.getpid())  # one write: the parent prints on the same pipe
        time.sleep(60)
    wait_for_term()
    os._exit(0)
os.waitpid(kid, 0)
os.write(1, b"pids %d %d\n" % (kid, term))
sys.stdin.readline()
"""


def test_forked_child_fatal_and_sigterm_stacks_are_its_own(tmp_path):
    script = tmp_path / "fork_crash.py"
    script.write_text(FORK_JOB)
    run = tmp_path / "run"
    p = subprocess.Popen(
        [sys.executable, str(script)],
        env=base_env(run),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        kid = term = waiting = 0
        while not (kid and waiting):  # ("waiting", from inside the child's function, comes in any order)
            line = wait_line(p, "", timeout=60).split()
            if line[0] == "pids":
                kid, term = int(line[1]), int(line[2])
            elif line[0] == "waiting":
                waiting = int(line[1])
        assert waiting == term
        host = os.uname().nodename
        fatal = run / "stacks" / ("fatal-%s-%d.txt" % (host, kid))
        assert "crash_here" in fatal.read_text()
        os.kill(term, signal.SIGTERM)
        sigterm = run / "stacks" / ("sigterm-%s-%d.txt" % (host, term))
        wait_until(lambda: sigterm.exists() and "wait_for_term" in sigterm.read_text(), timeout=20)
        p.stdin.write("\n")
        p.stdin.flush()
        assert p.wait(timeout=30) == 0
    finally:
        kill_all([p])
    parent_files = [n for n in os.listdir(run / "stacks") if n.endswith("-%d.txt" % p.pid)]
    assert all((run / "stacks" / n).read_text() == "" for n in parent_files), parent_files
