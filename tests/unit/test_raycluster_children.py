"""A node's part of a Ray snapshot (``hangtrace dump --ray``) keeps each stacked process's
live children and what the kernel says they wait in, as the local snapshot does: a real
traced process waiting for ``cat`` on a pipe, collected by ``raynode.collect_node`` (what
the pinned task runs on each node), written and read back as a snapshot."""

import glob
import os
import subprocess
import sys
import time

import pytest

from hangtrace.tracer.collect import kernelwait as K
from hangtrace.tracer.collect.ray import raycluster as RC
from hangtrace.tracer.collect.ray import raynode as RN
from hangtrace.tracer.collect import stacks as S

pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc"),
    pytest.mark.skipif(not S.pyspy_path(), reason="py-spy is not installed"),
]


def test_a_node_payload_keeps_the_children_of_a_stacked_process(tmp_path):
    run = tmp_path / "run"
    env = dict(os.environ, HANGTRACE="1", HANGTRACE_DIR=str(run), HANGTRACE_AUTO_WATCH="0")
    p = subprocess.Popen(
        [sys.executable, "-c", "import subprocess; subprocess.call(['cat'], stdin=subprocess.PIPE)"], env=env
    )
    try:
        t0 = time.monotonic()
        while time.monotonic() - t0 < 20:
            k = K.thread_wait(p.pid, p.pid)
            if glob.glob(str(run / "*")) and k is not None and k["syscall"] in ("wait4", "waitid"):
                break
            time.sleep(0.05)
        else:
            raise AssertionError("the traced process never waited for its child")
        r = RN.collect_node(str(run), node_id="n1", raylet_pid=os.getpid())
        mine = [name for name in r["stacks"] if name.endswith("-%d.json" % p.pid)]
        assert mine, r
        sdir = RC.write_ray_snapshot(str(tmp_path / "snap"), str(run), {"n1": r}, [], None)
        snap = RC.load_ray_snapshot(sdir)
        (proc,) = [q for q in snap.processes if q.pid == p.pid]
        assert [c["argv"] for c in proc.children] == [["cat"]], proc.children
        assert (proc.children[0].get("kernel") or {}).get("syscall") == "read", proc.children
    finally:
        p.kill()
        p.wait()
